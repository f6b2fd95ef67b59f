package prefix

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine/prefix/stdmap"
)

// refCache is a deliberately simple model of the Cache: MLC's PrefixCache and PagedRadixTree
// written out as plainly as possible, with none of the Cache's indexes, counts, pruning or
// shared token slices. Pages keep their children and their sequences in plain slices,
// newest first, and every walk is a scan. Each sequence also keeps its tokens as a plain
// list: the model checks its own tree against them and against a brute-force match after
// every operation, so that its layout cannot drift from the tokens it stands for.
//
// The eviction order is MLC's (the libstdc++ map that package stdmap emulates; its own tests
// check it against the recorded orders) or the least recently recycled.
type refCache struct {
	radix   bool
	maxRec  int
	order   EvictOrder
	cap     int
	root    *refPage
	seqs    map[int64]*refSeq
	pending []refExtension // looked up when committed, as MLC does
	counter uint64
	mlc     stdmap.Map
	evicted []Eviction
	stats   Stats
}

type refSeq struct {
	id     int64
	toks   []int32
	state  State
	window Window
	stamp  uint64
	page   *refPage
}

// refPage is MLC's RadixPage.
type refPage struct {
	toks   []int32
	parent *refPage
	kids   []*refPage // newest first
	seqs   []int64    // newest first
}

func newRef(cfg Config, capacity int) *refCache {
	r := &refCache{
		radix:  cfg.Mode == Radix,
		maxRec: cfg.MaxRecycling,
		order:  cfg.Evict,
		cap:    capacity,
		root:   &refPage{},
		seqs:   map[int64]*refSeq{},
	}
	if r.maxRec < 0 {
		r.maxRec = -1
	}
	return r
}

func refLCP(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// The tree, as radix_tree.cc has it.

func (r *refCache) length(p *refPage) int {
	n := 0
	for ; p != nil; p = p.parent {
		n += len(p.toks)
	}
	return n
}

func (r *refCache) mergeable(p *refPage) bool {
	return p != r.root && len(p.seqs) == 0 && len(p.kids) == 1 && len(p.toks)+len(p.kids[0].toks) <= r.cap
}

func (r *refCache) findChild(p *refPage, tok int32) *refPage {
	for _, c := range p.kids {
		if c.toks[0] == tok {
			return c
		}
	}
	return nil
}

func (r *refCache) insertChild(p, c *refPage) {
	c.parent = p
	p.kids = slices.Insert(p.kids, 0, c)
}

func (r *refCache) removeChild(p, c *refPage) {
	p.kids = slices.DeleteFunc(p.kids, func(x *refPage) bool { return x == c })
}

func (r *refCache) pushSeq(p *refPage, s *refSeq) {
	p.seqs = slices.Insert(p.seqs, 0, s.id)
	s.page = p
}

func (r *refCache) popSeq(s *refSeq) *refPage {
	p := s.page
	p.seqs = slices.DeleteFunc(p.seqs, func(id int64) bool { return id == s.id })
	s.page = nil
	return p
}

func (r *refCache) moveSeqs(from, to *refPage) {
	to.seqs, from.seqs = from.seqs, nil
	for _, id := range to.seqs {
		r.seqs[id].page = to
	}
}

func (r *refCache) merge(p *refPage) {
	c := p.kids[0]
	p.toks = append(slices.Clone(p.toks), c.toks...)
	p.kids = c.kids
	for _, k := range p.kids {
		k.parent = p
	}
	r.moveSeqs(c, p)
}

func (r *refCache) split(p *refPage, k int) *refPage {
	c := &refPage{toks: slices.Clone(p.toks[k:]), parent: p, kids: p.kids}
	for _, x := range c.kids {
		x.parent = c
	}
	p.kids = []*refPage{c}
	p.toks = slices.Clone(p.toks[:k])
	r.moveSeqs(p, c)
	if r.mergeable(c) {
		r.merge(c)
	}
	if p.parent != nil && r.mergeable(p.parent) {
		p = p.parent
		r.merge(p)
	}
	return p
}

// matchFrom is MLC's MatchSequence.
func (r *refCache) matchFrom(p *refPage, q []int32) (*refPage, int, int) {
	off := 0
	for off < len(q) {
		c := r.findChild(p, q[off])
		if c == nil {
			return p, off, len(p.toks)
		}
		l := refLCP(c.toks, q[off:])
		off += l
		if l < len(c.toks) {
			return c, off, l
		}
		p = c
	}
	return p, len(q), len(p.toks)
}

// iterate is MLC's RadixPage::Iterate over the sibling list kids from i on.
func iterate(kids []*refPage, i int, f func(*refPage)) {
	if i >= len(kids) {
		return
	}
	f(kids[i])
	iterate(kids, i+1, f)
	iterate(kids[i].kids, 0, f)
}

// matchPrefix is MLC's MatchPrefix: m and the sequences FindAllChildSequence lists.
func (r *refCache) matchPrefix(q []int32) (int, []*refSeq) {
	p, m, _ := r.matchFrom(r.root, q)
	if m == 0 {
		return 0, nil
	}
	var out []*refSeq
	add := func(p *refPage) {
		for _, id := range p.seqs {
			out = append(out, r.seqs[id])
		}
	}
	add(p)
	iterate(p.kids, 0, add)
	return m, out
}

func (r *refCache) treeAdd(s *refSeq) { r.pushSeq(r.root, s) }

func (r *refCache) treeFork(s, parent *refSeq, off int) {
	length := len(parent.toks)
	for p := parent.page; p != nil; p = p.parent {
		if off > length-len(p.toks) {
			if off < length {
				p = r.split(p, off+len(p.toks)-length)
			}
			r.pushSeq(p, s)
			return
		}
		length -= len(p.toks)
	}
	panic("ref: fork beyond the root")
}

func (r *refCache) treeExtend(s *refSeq, toks []int32) {
	orig := r.popSeq(s)
	p, off, in := r.matchFrom(orig, toks)
	if in < len(p.toks) {
		p = r.split(p, in)
	}
	if off < len(toks) && len(p.seqs) == 0 && len(p.kids) == 0 && p != r.root && len(p.toks) < r.cap {
		k := min(r.cap-len(p.toks), len(toks)-off)
		p.toks = append(slices.Clone(p.toks), toks[off:off+k]...)
		off += k
	}
	for off < len(toks) {
		k := min(r.cap, len(toks)-off)
		c := &refPage{toks: slices.Clone(toks[off : off+k])}
		r.insertChild(p, c)
		p = c
		off += k
	}
	r.pushSeq(p, s)
	if r.mergeable(orig) {
		r.merge(orig)
	}
}

func (r *refCache) treeRollBack(s *refSeq, n int) {
	if n == r.length(s.page) {
		r.treeRemove(s)
		r.treeAdd(s)
		return
	}
	p := r.popSeq(s)
	for len(p.toks) <= n {
		n -= len(p.toks)
		parent := p.parent
		if len(p.seqs) == 0 && len(p.kids) == 0 {
			r.removeChild(parent, p)
		}
		p = parent
	}
	if len(p.seqs) == 0 && len(p.kids) == 0 {
		p.toks = slices.Clone(p.toks[:len(p.toks)-n])
		r.pushSeq(p, s)
		return
	}
	if n > 0 {
		p = r.split(p, len(p.toks)-n)
	}
	r.pushSeq(p, s)
}

func (r *refCache) treeRemove(s *refSeq) {
	p := r.popSeq(s)
	for p.parent != nil && len(p.seqs) == 0 && len(p.kids) == 0 {
		r.removeChild(p.parent, p)
		p = p.parent
	}
	if r.mergeable(p) {
		r.merge(p)
	}
}

// shape writes the tree as nested text: each page's tokens, its sequences newest first, then
// its children newest first.
func (r *refCache) shape() string {
	var b strings.Builder
	var visit func(p *refPage)
	visit = func(p *refPage) {
		fmt.Fprintf(&b, "(%v %v", p.toks, p.seqs)
		for _, c := range p.kids {
			visit(c)
		}
		b.WriteString(")")
	}
	visit(r.root)
	return b.String()
}

// verify checks the model against itself: every sequence's page spells its tokens and
// holds it, and pages are not empty leaves.
func (r *refCache) verify() {
	for _, id := range slices.Sorted(maps.Keys(r.seqs)) {
		s := r.seqs[id]
		var spans [][]int32
		for p := s.page; p != nil; p = p.parent {
			spans = append(spans, p.toks)
		}
		var got []int32
		for i := len(spans) - 1; i >= 0; i-- {
			got = append(got, spans[i]...)
		}
		if !slices.Equal(got, s.toks) || !slices.Contains(s.page.seqs, id) {
			panic(fmt.Sprintf("ref: sequence %d spells %v, holds %v", id, got, s.toks))
		}
	}
}

// The policy, as prefix_cache.cc has it.

func (r *refCache) held(id int64) *refSeq {
	if !r.radix {
		return nil
	}
	return r.seqs[id]
}

func (r *refCache) recyclingSeqs() []*refSeq {
	var rs []*refSeq
	for _, s := range r.seqs {
		if s.state == Recycling {
			rs = append(rs, s)
		}
	}
	slices.SortFunc(rs, func(a, b *refSeq) int { return int(a.stamp) - int(b.stamp) })
	return rs
}

// recycling lists the recycling sequences in eviction order.
func (r *refCache) recycling() []int64 {
	var out []int64
	if r.order == EvictMLC {
		for _, id := range r.mlc.All() {
			out = append(out, id)
		}
		return out
	}
	for _, s := range r.recyclingSeqs() {
		out = append(out, s.id)
	}
	return out
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

// match is matchPrefix, checked against a brute-force scan of the sequences' tokens.
func (r *refCache) match(q []int32) (int, []*refSeq) {
	m, S := r.matchPrefix(q)
	bm := 0
	for _, s := range r.seqs {
		bm = max(bm, refLCP(s.toks, q))
	}
	var want []int64
	for _, s := range r.seqs {
		if bm > 0 && refLCP(s.toks, q) >= bm {
			want = append(want, s.id)
		}
	}
	var got []int64
	for _, s := range S {
		got = append(got, s.id)
	}
	slices.Sort(got)
	slices.Sort(want)
	if m != bm || !slices.Equal(got, want) {
		panic(fmt.Sprintf("ref: MatchPrefix(%v) = %d %v, brute force %d %v", q, m, got, bm, want))
	}
	return m, S
}

type refExtension struct {
	id     int64
	tokens []int32
}

func (r *refCache) commit() {
	for _, p := range r.pending {
		if s := r.seqs[p.id]; s != nil {
			r.treeExtend(s, p.tokens)
			s.toks = append(slices.Clone(s.toks), p.tokens...)
		}
	}
	r.pending = nil
}

func (r *refCache) addSeq(id int64, toks []int32, w Window) *refSeq {
	s := &refSeq{id: id, toks: slices.Clone(toks), window: w}
	r.seqs[id] = s
	return s
}

func (r *refCache) reuse(s *refSeq) {
	if r.order == EvictMLC {
		r.mlc.Erase(s.stamp)
	}
	s.state, s.stamp = Active, 0
	r.stats.Reuses++
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
		r.treeAdd(r.addSeq(id, nil, w))
		return res, nil
	}
	if w.Size != -1 {
		for _, s := range S {
			if s.state == Recycling && s.window == w && len(s.toks) == m {
				res.Kind, res.Offset, res.Parent = Reuse, m, s.id
				r.reuse(s)
				return res, nil
			}
		}
	} else {
		var best *refSeq
		for _, s := range S {
			if s.state == Recycling && s.window == w && (best == nil || len(s.toks) < len(best.toks)) {
				best = s
			}
		}
		if best != nil && float64(m) > float64(len(best.toks))*0.9 {
			res.Kind, res.Offset, res.Parent, res.Pop = Reuse, m, best.id, len(best.toks)-m
			r.reuse(best)
			if res.Pop > 0 {
				r.treeRollBack(best, res.Pop)
				best.toks = slices.Clone(best.toks[:m])
			}
			return res, nil
		}
		for _, s := range S {
			if s.window.Size == -1 {
				res.Kind, res.Offset, res.Parent = Fork, m, s.id
				r.stats.Forks++
				n := r.addSeq(id, q[:m], w)
				r.treeFork(n, s, m)
				return res, nil
			}
		}
	}
	r.treeAdd(r.addSeq(id, nil, w))
	return res, nil
}

func (r *refCache) ExtendSequence(id int64, t []int32) {
	if r.radix {
		r.pending = append(r.pending, refExtension{id, slices.Clone(t)})
	}
}

func (r *refCache) evict(s *refSeq) {
	stamp := s.stamp
	if r.order == EvictMLC {
		r.mlc.Erase(stamp)
	}
	r.treeRemove(s)
	delete(r.seqs, s.id)
	ev := Eviction{Seq: s.id, Recycled: stamp, Oldest: -1}
	if rs := r.recyclingSeqs(); len(rs) > 0 {
		ev.Oldest, ev.OldestRecycled = rs[0].id, rs[0].stamp
	}
	r.evicted = append(r.evicted, ev)
	r.stats.Evictions++
}

func (r *refCache) tryFree() bool {
	rs := r.recyclingSeqs()
	if len(rs) == 0 {
		return false
	}
	v := rs[0]
	if r.order == EvictMLC {
		_, id, _ := r.mlc.Front()
		v = r.seqs[id]
	}
	r.evict(v)
	return true
}

func (r *refCache) TryFreeMemory() bool { return r.tryFree() }

func (r *refCache) RecycleSequence(id int64) error {
	s := r.held(id)
	if s == nil {
		return ErrUnknownSequence
	}
	if s.state != Active {
		return ErrNotActive
	}
	r.commit()
	if r.maxRec == 0 {
		r.treeRemove(s)
		delete(r.seqs, id)
		r.evicted = append(r.evicted, Eviction{Seq: id, Oldest: -1})
		r.stats.Evictions++
		return nil
	}
	if r.maxRec > 0 && len(r.recyclingSeqs()) >= r.maxRec {
		r.tryFree()
	}
	r.counter++
	s.state, s.stamp = Recycling, r.counter
	if r.order == EvictMLC {
		r.mlc.Insert(s.stamp, id)
	}
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
	if n > 0 {
		r.treeRollBack(s, n)
		s.toks = slices.Clone(s.toks[:len(s.toks)-n])
	}
	return nil
}

func (r *refCache) RemoveSequence(id int64) error {
	s := r.held(id)
	if s == nil {
		return ErrUnknownSequence
	}
	r.commit()
	if s.state == Recycling && r.order == EvictMLC {
		r.mlc.Erase(s.stamp)
	}
	r.treeRemove(s)
	delete(r.seqs, id)
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
	data     []byte
	pos      int
	alphabet byte // tokens are 0 … alphabet-1
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

// tokens returns a short token list over a small alphabet (3 tokens, or 12 so that nodes
// have enough children to be indexed): random, or a prefix of a held
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
		out = append(out, int32(r.next()%r.alphabet))
	}
	return out
}

// harness runs the same operations on a Cache and on the reference and compares them after
// every one.
type harness struct {
	t       testing.TB
	c       *Cache
	ref     *refCache
	evicted []Eviction
	nodes   map[NodeID]Node // what TakeChanges has said so far
	log     []string
}

func newHarness(t testing.TB, cfg Config, capacity int) *harness {
	h := &harness{t: t, ref: newRef(cfg, capacity), nodes: map[NodeID]Node{}}
	cfg.OnEvict = func(ev Eviction) { h.evicted = append(h.evicted, ev) }
	h.c = newCache(cfg, capacity)
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

// capacities are the page sizes the differential test runs: MLC's 64, and small ones under
// which the short sequences it makes fill chains of pages, so that the capacity checks of
// extensions and merges matter.
var capacities = [...]int{64, 2, 3, 4, 5, 8}

// runOps decodes data into a configuration and operations and runs them.
func runOps(t testing.TB, data []byte) {
	r := &opReader{data: data, alphabet: 3}
	b, b2 := r.next(), r.next()
	if b2/12%4 == 3 {
		r.alphabet = 12
	}
	cfg := Config{Mode: Radix, MaxRecycling: int(b/8%5) - 1, Evict: EvictOrder(b2 % 2)}
	if b%8 == 7 {
		cfg.Mode = Disabled
	}
	capacity := capacities[int(b2/2)%len(capacities)]
	h := newHarness(t, cfg, capacity)
	h.log = append(h.log, fmt.Sprintf("New(%+v) with pages of %d, %d tokens", cfg, capacity, r.alphabet))
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
	var visit func(p *node)
	visit = func(p *node) {
		nodes[p.id] = p
		for _, k := range p.kids {
			visit(k)
		}
	}
	visit(h.c.t.root)
	prev := h.c.t.root
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
	// Every sequence sits at the page that spells its tokens, and the pages are laid out as
	// the model lays them out, page by page, sequences and children in MLC's list order.
	for id, s := range ref.seqs {
		e := c.seqs[id]
		if e == nil {
			h.fail("sequence %d missing", id)
		}
		if got := pathTokens(e.node); !slices.Equal(got, s.toks) {
			h.fail("sequence %d spells %v, want %v", id, got, s.toks)
		}
	}
	ref.verify()
	if got, want := shape(c.t.root), ref.shape(); got != want {
		h.fail("tree shape\n  %s\nwant\n  %s", got, want)
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

// shape writes the Cache's tree as refCache.shape does, page by page: a node's pages but the
// last hold no sequence and have the next as their only child.
func shape(root *node) string {
	var b strings.Builder
	var visit func(n *node)
	visit = func(n *node) {
		var seqs []int64
		eachSeq(n, func(s slot) bool { seqs = append(seqs, s.id); return true })
		if n == root {
			fmt.Fprintf(&b, "(%v %v", []int32{}, seqs)
		}
		for i := range n.pages() {
			var here []int64
			if i == n.lastPage() {
				here = seqs
			}
			fmt.Fprintf(&b, "(%v %v", n.toks[n.start(i):n.end(i)], here)
		}
		for i := len(n.kids) - 1; i >= 0; i-- {
			visit(n.kids[i])
		}
		b.WriteString(strings.Repeat(")", max(n.pages(), 1)))
	}
	visit(root)
	return b.String()
}

func pathTokens(p *node) []int32 {
	var spans [][]int32
	for ; p != nil; p = p.parent {
		spans = append(spans, p.toks)
	}
	var out []int32
	for i := len(spans) - 1; i >= 0; i-- {
		out = append(out, spans[i]...)
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
