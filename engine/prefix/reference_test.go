package prefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// refCache is a deliberately simple model of the Cache: every sequence is a plain token list,
// the match is a brute-force scan, and the candidate order comes from a tree-free definition.
//
// Candidate order without a tree: the tree's pre-order compares two sequences a and b by their
// longest common prefix l. If both end there they sit in the same node and the later arrival
// comes first; if one ends there it is the ancestor and comes first; else they branch at l and
// the branch born first comes first. A branch (p, t) is the token string p+t; it is born when
// some held sequence first has it as a prefix and dies when none has. Each sequence
// remembers when it last changed length (its arrival at its node).
type refCache struct {
	radix   bool
	maxRec  int
	seqs    map[int64]*refSeq
	pending []extension
	clock   int
	births  map[string]int // branch -> birth
	sharers map[string]int // branch -> held sequences that have it as a prefix
	evicted []int64
	stats   Stats
}

type refSeq struct {
	id       int64
	toks     []int32
	state    State
	window   Window
	arrive   int
	recycled int
}

func newRef(cfg Config) *refCache {
	r := &refCache{
		radix:   cfg.Mode == Radix,
		maxRec:  cfg.MaxRecycling,
		seqs:    map[int64]*refSeq{},
		births:  map[string]int{},
		sharers: map[string]int{},
	}
	if r.maxRec < 0 {
		r.maxRec = -1
	}
	return r
}

func key(toks []int32) string {
	b := make([]byte, 4*len(toks))
	for i, t := range toks {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
	}
	return string(b)
}

func refLCP(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func (r *refCache) tick() int {
	r.clock++
	return r.clock
}

// share counts s's prefixes of lengths (from, to] as held (d = 1) or released (d = -1).
func (r *refCache) share(toks []int32, from, to, d int) {
	for i := from + 1; i <= to; i++ {
		k := key(toks[:i])
		r.sharers[k] += d
		switch r.sharers[k] {
		case 0:
			delete(r.sharers, k)
			delete(r.births, k)
		case 1:
			if d > 0 {
				r.births[k] = r.clock
			}
		}
	}
}

func (r *refCache) addSeq(id int64, toks []int32, w Window) {
	s := &refSeq{id: id, toks: slices.Clone(toks), window: w, arrive: r.tick()}
	r.seqs[id] = s
	r.share(s.toks, 0, len(s.toks), 1)
}

func (r *refCache) grow(s *refSeq, t []int32) {
	s.arrive = r.tick()
	old := len(s.toks)
	s.toks = append(slices.Clone(s.toks), t...)
	r.share(s.toks, old, len(s.toks), 1)
}

func (r *refCache) shrink(s *refSeq, l int) {
	if l == len(s.toks) {
		return
	}
	s.arrive = r.tick()
	r.share(s.toks, l, len(s.toks), -1)
	s.toks = slices.Clone(s.toks[:l])
}

func (r *refCache) removeSeq(s *refSeq) {
	r.tick()
	r.share(s.toks, 0, len(s.toks), -1)
	delete(r.seqs, s.id)
}

func (r *refCache) held(id int64) *refSeq {
	if !r.radix {
		return nil
	}
	return r.seqs[id]
}

func (r *refCache) numRec() int {
	n := 0
	for _, s := range r.seqs {
		if s.state == Recycling {
			n++
		}
	}
	return n
}

func (r *refCache) recycling() []int64 {
	var rs []*refSeq
	for _, s := range r.seqs {
		if s.state == Recycling {
			rs = append(rs, s)
		}
	}
	slices.SortFunc(rs, func(a, b *refSeq) int { return a.recycled - b.recycled })
	out := make([]int64, len(rs))
	for i, s := range rs {
		out[i] = s.id
	}
	return out
}

// order compares two candidates by the tree-free definition above.
func (r *refCache) order(a, b *refSeq) int {
	l := refLCP(a.toks, b.toks)
	switch {
	case l == len(a.toks) && l == len(b.toks):
		return b.arrive - a.arrive
	case l == len(a.toks):
		return -1
	case l == len(b.toks):
		return 1
	}
	ba, ok1 := r.births[key(a.toks[:l+1])]
	bb, ok2 := r.births[key(b.toks[:l+1])]
	if !ok1 || !ok2 || ba == bb {
		panic(fmt.Sprintf("ref: branches at %d without distinct births", l))
	}
	return ba - bb
}

// match returns m and S in candidate order, by brute force.
func (r *refCache) match(q []int32) (int, []*refSeq) {
	m := 0
	for _, s := range r.seqs {
		m = max(m, refLCP(s.toks, q))
	}
	if m == 0 {
		return 0, nil
	}
	var S []*refSeq
	for _, s := range r.seqs {
		if refLCP(s.toks, q) >= m {
			S = append(S, s)
		}
	}
	slices.SortFunc(S, r.order)
	return m, S
}

func (r *refCache) Match(q []int32) (int, []int64) {
	if !r.radix {
		return 0, nil
	}
	m, S := r.match(q)
	if m == 0 {
		return 0, nil
	}
	ids := make([]int64, len(S))
	for i, s := range S {
		ids[i] = s.id
	}
	return m, ids
}

func (r *refCache) commit() {
	for _, p := range r.pending {
		if s := r.seqs[p.id]; s != nil {
			r.grow(s, p.tokens)
		}
	}
	r.pending = nil
}

func (r *refCache) InsertSequence(id int64, tokens []int32, w Window) (Result, error) {
	switch {
	case id < 0:
		return Result{}, ErrBadID
	case len(tokens) == 0:
		return Result{}, ErrEmptyTokens
	case !w.valid():
		return Result{}, ErrBadWindow
	}
	if !r.radix {
		return Result{Kind: Fresh, Parent: -1}, nil
	}
	if r.seqs[id] != nil {
		return Result{}, ErrSequenceExists
	}
	r.commit()
	q := tokens[:len(tokens)-1]
	m, S := r.match(q)
	res := Result{Kind: Fresh, Parent: -1, Matched: m, Candidates: len(S)}
	r.stats.Inserts++
	r.stats.QueryTokens += uint64(len(tokens))
	defer func() { r.stats.HitTokens += uint64(res.Offset) }()
	if m == 0 {
		r.addSeq(id, nil, w)
		return res, nil
	}
	if w.Size == -1 {
		var best *refSeq
		for _, s := range S {
			if s.state == Recycling && s.window == w && (best == nil || len(s.toks) < len(best.toks)) {
				best = s
			}
		}
		if best != nil && 10*m > 9*len(best.toks) {
			res.Kind, res.Offset, res.Parent, res.Pop = Reuse, m, best.id, len(best.toks)-m
			r.stats.Reuses++
			best.state = Active
			r.shrink(best, m)
			return res, nil
		}
		for _, s := range S {
			if s.window.Size == -1 {
				res.Kind, res.Offset, res.Parent = Fork, m, s.id
				r.stats.Forks++
				r.addSeq(id, q[:m], w)
				return res, nil
			}
		}
	} else {
		for _, s := range S {
			if s.state == Recycling && s.window == w && len(s.toks) == m {
				res.Kind, res.Offset, res.Parent = Reuse, m, s.id
				r.stats.Reuses++
				s.state = Active
				return res, nil
			}
		}
	}
	r.addSeq(id, nil, w)
	return res, nil
}

func (r *refCache) ExtendSequence(id int64, t []int32) {
	if r.radix && len(t) > 0 {
		r.pending = append(r.pending, extension{id, slices.Clone(t)})
	}
}

func (r *refCache) evictLRU() {
	r.commit()
	var v *refSeq
	for _, s := range r.seqs {
		if s.state == Recycling && (v == nil || s.recycled < v.recycled) {
			v = s
		}
	}
	r.removeSeq(v)
	r.evicted = append(r.evicted, v.id)
	r.stats.Evictions++
}

func (r *refCache) TryFreeMemory() bool {
	if r.numRec() == 0 {
		return false
	}
	r.evictLRU()
	return true
}

func (r *refCache) RecycleSequence(id int64) error {
	s := r.held(id)
	if s == nil {
		return ErrUnknownSequence
	}
	if s.state != Active {
		return ErrNotActive
	}
	if r.maxRec == 0 {
		r.commit()
		r.removeSeq(s)
		r.evicted = append(r.evicted, id)
		r.stats.Evictions++
		return nil
	}
	if r.maxRec > 0 && r.numRec() >= r.maxRec {
		r.evictLRU()
	}
	s.state = Recycling
	s.recycled = r.tick()
	return nil
}

func (r *refCache) RollBackSequence(id int64, n int) error {
	s := r.held(id)
	if s == nil {
		return ErrUnknownSequence
	}
	l := len(s.toks)
	for _, p := range r.pending {
		if p.id == id {
			l += len(p.tokens)
		}
	}
	if n < 0 || n > l {
		return ErrBadLength
	}
	r.commit()
	r.shrink(s, len(s.toks)-n)
	return nil
}

func (r *refCache) RemoveSequence(id int64) error {
	s := r.held(id)
	if s == nil {
		return ErrUnknownSequence
	}
	r.commit()
	r.removeSeq(s)
	return nil
}

// sentinel names the package error err wraps, or "" for nil.
func sentinel(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range []error{ErrUnknownSequence, ErrSequenceExists, ErrEmptyTokens, ErrNotActive, ErrBadID, ErrBadWindow, ErrBadLength} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "unexpected: " + err.Error()
}

// opReader decodes a byte string into operations; past the end it reads zeros.
type opReader struct {
	data []byte
	pos  int
}

func (r *opReader) more() bool { return r.pos < len(r.data) }

func (r *opReader) next() byte {
	if r.pos >= len(r.data) {
		r.pos++
		return 0
	}
	b := r.data[r.pos]
	r.pos++
	return b
}

func (r *opReader) id() int64 {
	b := r.next()
	if b == 255 {
		return -1
	}
	return int64(b % 10)
}

// freeID mostly returns an id the reference does not hold, sometimes any id.
func (r *opReader) freeID(ref *refCache) int64 {
	id := r.id()
	if id < 0 || r.next()%4 == 0 {
		return id
	}
	for range 10 {
		if ref.seqs[id] == nil {
			break
		}
		id = (id + 1) % 10
	}
	return id
}

// activeID mostly returns an id the reference holds as active, sometimes any id.
func (r *opReader) activeID(ref *refCache) int64 {
	id := r.id()
	if id < 0 || r.next()%4 == 0 {
		return id
	}
	for range 10 {
		if s := ref.seqs[id]; s != nil && s.state == Active {
			break
		}
		id = (id + 1) % 10
	}
	return id
}

func (r *opReader) window() Window {
	switch r.next() % 12 {
	case 7:
		return Window{Size: 4}
	case 8:
		return Window{Size: 4, Sink: 1}
	case 9:
		return Window{Size: -1, Sink: 1}
	case 10:
		return Window{} // invalid
	}
	return NoWindow
}

// tokens returns a short token list over a 3-token alphabet: random, or a prefix of a held
// sequence and a random tail (so that matches are long and the tree branches), or a whole
// recycling sequence and a token or two (a returning conversation, so that reuse happens).
func (r *opReader) tokens(ref *refCache) []int32 {
	n := int(r.next() % 13)
	mode, pick := r.next()%8, int(r.next())
	var src []int32
	if ids := slices.Sorted(maps.Keys(ref.seqs)); mode >= 2 && len(ids) > 0 {
		src = ref.seqs[ids[pick%len(ids)]].toks
		if rec := ref.recycling(); mode >= 5 && len(rec) > 0 {
			src = ref.seqs[rec[pick%len(rec)]].toks
		}
		if mode >= 5 && len(src) < 24 {
			n = len(src) + 1 + pick/128
		} else {
			src = src[:min(int(r.next())%(len(src)+1), n)]
		}
	}
	out := slices.Clone(src)
	for len(out) < n {
		out = append(out, int32(r.next()%3))
	}
	return out
}

// harness runs the same operations on a Cache and on the reference and compares them after
// every one.
type harness struct {
	t       testing.TB
	c       *Cache
	ref     *refCache
	evicted []int64
	nodes   map[NodeID]Node // what TakeChanges has said so far
	log     []string
}

func newHarness(t testing.TB, cfg Config) *harness {
	h := &harness{t: t, ref: newRef(cfg), nodes: map[NodeID]Node{}}
	cfg.OnEvict = func(id int64) { h.evicted = append(h.evicted, id) }
	h.c = New(cfg)
	h.takeChanges()
	return h
}

func (h *harness) fail(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\nafter:\n  %s\ntree:\n%s", fmt.Sprintf(format, args...), joinLines(h.log), h.c.Describe())
}

func joinLines(s []string) string {
	out := ""
	for i, l := range s {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// runOps decodes data into a configuration and operations and runs them.
func runOps(t testing.TB, data []byte) {
	r := &opReader{data: data}
	b := r.next()
	cfg := Config{Mode: Radix, MaxRecycling: int(b/8%5) - 1}
	if b%8 == 7 {
		cfg.Mode = Disabled
	}
	h := newHarness(t, cfg)
	h.log = append(h.log, fmt.Sprintf("New(%+v)", cfg))
	for r.more() {
		h.step(r)
	}
}

func (h *harness) step(r *opReader) {
	h.t.Helper()
	c, ref := h.c, h.ref
	var call string
	var err, werr error
	switch r.next() % 16 {
	case 0, 1, 2, 3, 4:
		id, w := r.freeID(ref), r.window()
		toks := r.tokens(ref)
		call = fmt.Sprintf("InsertSequence(%d, %v, %v)", id, toks, w)
		got, gerr := c.InsertSequence(id, toks, w)
		want, wantErr := ref.InsertSequence(id, toks, w)
		err, werr = gerr, wantErr
		if gerr == nil {
			h.checkPath(got)
			got.Path = nil
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			h.fail("%s = %+v, want %+v", call, got, want)
		}
		if f := r.next(); gerr == nil && f%4 != 0 {
			// As the engine does: the sequence will hold the whole prompt.
			seq := id
			if got.Kind == Reuse {
				seq = got.Parent
			}
			call += fmt.Sprintf("; ExtendSequence(%d, %v)", seq, toks[got.Offset:])
			c.ExtendSequence(seq, toks[got.Offset:])
			ref.ExtendSequence(seq, toks[got.Offset:])
			if f%4 != 1 {
				call += "; CommitSequenceExtension()"
				c.CommitSequenceExtension()
				ref.commit()
			}
		}
	case 5, 6:
		id := r.id()
		toks := r.tokens(ref)
		if len(toks) > 4 {
			toks = toks[len(toks)-4:]
		}
		if s := ref.seqs[id]; s != nil && len(s.toks) > 48 {
			toks = nil // keep the model's quadratic bookkeeping cheap
		}
		call = fmt.Sprintf("ExtendSequence(%d, %v)", id, toks)
		c.ExtendSequence(id, toks)
		ref.ExtendSequence(id, toks)
		if r.next()%2 == 0 {
			call += "; CommitSequenceExtension()"
			c.CommitSequenceExtension()
			ref.commit()
		}
	case 7, 8, 9:
		id := r.activeID(ref)
		call = fmt.Sprintf("RecycleSequence(%d)", id)
		err, werr = c.RecycleSequence(id), ref.RecycleSequence(id)
	case 10:
		call = "TryFreeMemory()"
		if got, want := c.TryFreeMemory(), ref.TryFreeMemory(); got != want {
			h.fail("%s = %v, want %v", call, got, want)
		}
	case 11:
		id, n := r.id(), int(r.next()%8)-1
		call = fmt.Sprintf("RollBackSequence(%d, %d)", id, n)
		err, werr = c.RollBackSequence(id, n), ref.RollBackSequence(id, n)
	case 12:
		id := r.id()
		call = fmt.Sprintf("RemoveSequence(%d)", id)
		err, werr = c.RemoveSequence(id), ref.RemoveSequence(id)
	case 13, 14:
		q := r.tokens(ref)
		call = fmt.Sprintf("Match(%v)", q)
		gm, gc := c.Match(q)
		wm, wc := ref.Match(q)
		if gm != wm || !slices.Equal(gc, wc) {
			h.fail("%s = %d, %v, want %d, %v", call, gm, gc, wm, wc)
		}
	case 15:
		call = "CommitSequenceExtension()"
		c.CommitSequenceExtension()
		ref.commit()
	}
	h.log = append(h.log, call)
	if sentinel(err) != sentinel(werr) {
		h.fail("%s: error %v, want %v", call, err, werr)
	}
	h.compare()
}

// checkPath checks Result.Path against the tree as it now stands.
func (h *harness) checkPath(res Result) {
	h.t.Helper()
	if res.Matched == 0 {
		if len(res.Path) != 0 {
			h.fail("Path = %v for Matched 0", res.Path)
		}
		return
	}
	nodes := map[NodeID]*node{}
	var visit func(n *node)
	visit = func(n *node) {
		nodes[n.id] = n
		for _, ch := range n.children {
			visit(ch)
		}
	}
	visit(h.c.root)
	prev := h.c.root
	for _, id := range res.Path {
		n := nodes[id]
		if n == nil || n.parent != prev {
			h.fail("Path = %v: node %d is not a child of %d", res.Path, id, prev.id)
		}
		prev = n
	}
	if prev.depth < res.Matched || prev.parent.depth >= res.Matched {
		h.fail("Path = %v ends at depth %d (parent %d), want the node holding token %d", res.Path, prev.depth, prev.parent.depth, res.Matched)
	}
}

func (h *harness) takeChanges() {
	h.t.Helper()
	up, rm := h.c.TakeChanges()
	for i := range up {
		if i > 0 && up[i-1].ID >= up[i].ID {
			h.fail("TakeChanges upserted not in ascending id order: %v", up)
		}
		h.nodes[up[i].ID] = up[i]
	}
	for i, id := range rm {
		if i > 0 && rm[i-1] >= id {
			h.fail("TakeChanges removed not in ascending order: %v", rm)
		}
		if _, ok := h.nodes[id]; !ok {
			h.fail("TakeChanges removed %d, which it never reported", id)
		}
		delete(h.nodes, id)
	}
}

func (h *harness) compare() {
	h.t.Helper()
	c, ref := h.c, h.ref
	if err := c.Check(); err != nil {
		h.fail("Check() = %v", err)
	}
	for id := int64(-1); id < 10; id++ {
		s := ref.held(id)
		l, st, ok := c.Sequence(id)
		if ok != (s != nil) || c.HasSequence(id) != ok {
			h.fail("Sequence(%d) ok = %v, want %v", id, ok, s != nil)
		}
		if s != nil && (l != len(s.toks) || st != s.state) {
			h.fail("Sequence(%d) = %d, %v, want %d, %v", id, l, st, len(s.toks), s.state)
		}
	}
	if len(ref.seqs) != len(c.seqs) {
		h.fail("%d sequences held, want %d", len(c.seqs), len(ref.seqs))
	}
	if got, want := c.Recycling(), ref.recycling(); !slices.Equal(got, want) || c.NumRecycling() != len(want) {
		h.fail("Recycling() = %v (%d), want %v", got, c.NumRecycling(), want)
	}
	if got, want := c.Stats(), ref.stats; got != want {
		h.fail("Stats() = %+v, want %+v", got, want)
	}
	if !slices.Equal(h.evicted, ref.evicted) {
		h.fail("OnEvict calls %v, want %v", h.evicted, ref.evicted)
	}
	// Every sequence sits at the node that spells its tokens, in arrival order there.
	at := map[*node][]*refSeq{}
	for id, s := range ref.seqs {
		e := c.seqs[id]
		if e == nil {
			h.fail("sequence %d missing", id)
		}
		if got := pathTokens(e.node); !slices.Equal(got, s.toks) {
			h.fail("sequence %d spells %v, want %v", id, got, s.toks)
		}
		at[e.node] = append(at[e.node], s)
	}
	for n, ss := range at {
		slices.SortFunc(ss, func(a, b *refSeq) int { return a.arrive - b.arrive })
		for i, s := range ss {
			if n.seqs[i].id != s.id {
				h.fail("node %d holds %v in an order other than arrival", n.id, seqIDs(n))
			}
		}
	}
	// Deltas applied to what we had give the tree; Order gives the children's order.
	h.takeChanges()
	all := c.Nodes()
	if len(all) != len(h.nodes) {
		h.fail("Nodes() has %d nodes, the changes %d", len(all), len(h.nodes))
	}
	kids := map[NodeID][]Node{}
	for i, n := range all {
		if fmt.Sprint(h.nodes[n.ID]) != fmt.Sprint(n) {
			h.fail("node %d is %+v, the changes say %+v", n.ID, n, h.nodes[n.ID])
		}
		if i > 0 {
			kids[n.Parent] = append(kids[n.Parent], n)
		}
	}
	var order []NodeID
	var visit func(id NodeID)
	visit = func(id NodeID) {
		order = append(order, id)
		ks := kids[id]
		slices.SortFunc(ks, func(a, b Node) int { return int(a.Order) - int(b.Order) })
		for _, k := range ks {
			visit(k.ID)
		}
	}
	visit(0)
	for i, n := range all {
		if order[i] != n.ID {
			h.fail("Nodes() order %v differs from the order by Order %v", nodeIDs(all), order)
		}
	}
}

func pathTokens(n *node) []int32 {
	var spans [][]int32
	for ; n != nil; n = n.parent {
		spans = append(spans, n.span)
	}
	var out []int32
	for i := len(spans) - 1; i >= 0; i-- {
		out = append(out, spans[i]...)
	}
	return out
}

func seqIDs(n *node) []int64 {
	var out []int64
	for _, e := range n.seqs {
		out = append(out, e.id)
	}
	return out
}

func nodeIDs(ns []Node) []NodeID {
	var out []NodeID
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}
