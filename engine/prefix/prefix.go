package prefix

import (
	"errors"
	"fmt"
)

// Errors returned by the Cache, always wrapped with the call and the sequence they concern.
var (
	ErrUnknownSequence = errors.New("prefix: unknown sequence")
	ErrSequenceExists  = errors.New("prefix: sequence exists")
	ErrEmptyTokens     = errors.New("prefix: empty tokens")
	ErrNotActive       = errors.New("prefix: not active")
	ErrBadID           = errors.New("prefix: negative sequence id")
	ErrBadWindow       = errors.New("prefix: bad window")
	ErrBadLength       = errors.New("prefix: bad roll-back length")
)

// Mode is MLC's prefix_cache_mode.
type Mode uint8

const (
	// Radix keeps finished sequences in a radix tree for reuse (MLC's default).
	Radix Mode = iota
	// Disabled matches nothing and holds nothing.
	Disabled
)

func (m Mode) String() string {
	switch m {
	case Radix:
		return "radix"
	case Disabled:
		return "disabled"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// State is the state of a cached sequence.
type State uint8

const (
	// Active: the sequence's request is alive. It may be forked from, never taken over.
	Active State = iota
	// Recycling: the request finished; the sequence is kept for reuse and may be evicted.
	Recycling
)

func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Recycling:
		return "recycling"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state's name.
func (s *State) UnmarshalText(b []byte) error {
	for _, c := range []State{Active, Recycling} {
		if c.String() == string(b) {
			*s = c
			return nil
		}
	}
	return fmt.Errorf("prefix: unknown state %q", b)
}

// Kind says how InsertSequence told the caller to start its KV sequence.
type Kind uint8

const (
	// Fresh: add a new, empty KV sequence (MLC's AddSequence). Its String is "new"; the
	// constant cannot be called New because New is the constructor.
	Fresh Kind = iota
	// Fork: fork the KV sequence Result.Parent at Result.Offset.
	Fork
	// Reuse: take the recycling KV sequence Result.Parent over and pop Result.Pop tokens.
	Reuse
)

func (k Kind) String() string {
	switch k {
	case Fresh:
		return "new"
	case Fork:
		return "fork"
	case Reuse:
		return "reuse"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for _, c := range []Kind{Fresh, Fork, Reuse} {
		if c.String() == string(b) {
			*k = c
			return nil
		}
	}
	return fmt.Errorf("prefix: unknown match kind %q", b)
}

// NodeID names a tree node. The root is 0; ids are never reused during a Cache's life.
type NodeID uint32

// Window is a sequence's sliding-window setting (MLC's sliding_window_size and
// attention_sink_size). Size -1 means no sliding window; otherwise Size >= 1. Sink >= 0.
type Window struct{ Size, Sink int }

// NoWindow is the setting of a model without a sliding window.
var NoWindow = Window{Size: -1}

func (w Window) valid() bool { return (w.Size == -1 || w.Size >= 1) && w.Sink >= 0 }

// Config configures a Cache.
type Config struct {
	Mode Mode
	// MaxRecycling is MLC's prefix_cache_max_num_recycling_seqs: -1 (or any negative)
	// unbounded, 0 none (a recycled sequence is removed at once), else the cap.
	MaxRecycling int
	// Evict is the order in which recycling sequences are evicted; the zero value is MLC's.
	Evict EvictOrder
	// OnEvict is called whenever the cache drops a sequence whose KV the caller must free:
	// TryFreeMemory, a RecycleSequence that evicts to stay under the cap, a RecycleSequence
	// with MaxRecycling 0. It is not called by RemoveSequence. It runs synchronously, at the
	// end of the call that evicted, once the Cache is consistent; it must not call the
	// Cache's mutating methods. Nil is allowed.
	OnEvict func(Eviction)
}

// Result is what InsertSequence tells the caller to do.
type Result struct {
	Kind Kind
	// Offset is the number of tokens the caller's KV sequence starts with (MLC's
	// prefix_matched_length): Matched for Fork and Reuse, 0 for Fresh.
	Offset int
	// Parent is, for Fork, the sequence forked from; for Reuse, the sequence taken over;
	// -1 for Fresh.
	Parent int64
	// Pop is, for Reuse, the number of tokens rolled back (len - Offset); else 0.
	Pop int
	// Matched is the longest common prefix m found in the tree. It differs from Offset only
	// when the result is Fresh although m > 0 (every candidate has a sliding window, or the
	// caller's own sliding window allows no reuse).
	Matched int
	// Path lists the nodes from the root's child down to the node that holds the Matched-th
	// token, as the tree stands after the call (empty when Matched is 0).
	Path []NodeID
	// Candidates is |S|: how many cached sequences contained the matched prefix (0 when
	// Matched is 0).
	Candidates int
}

// Stats are counters over the Cache's life. They do not move in Disabled mode.
type Stats struct {
	QueryTokens uint64 `json:"query_tokens"` // sum of len(tokens) over InsertSequence calls
	HitTokens   uint64 `json:"hit_tokens"`   // sum of Result.Offset over InsertSequence calls
	Inserts     uint64 `json:"inserts"`      // InsertSequence calls that succeeded (Fresh, Fork and Reuse alike)
	Forks       uint64 `json:"forks"`        // of which Fork
	Reuses      uint64 `json:"reuses"`       // of which Reuse
	Evictions   uint64 `json:"evictions"`    // sequences handed to OnEvict
}

// Node is a read-only snapshot of one tree node. A node is a maximal chain of MLC's radix
// pages: every page but its last holds no sequence and has the next as its only child, so a
// node holds a sequence or has two children or more, as in a compressed radix tree.
type Node struct {
	ID     NodeID `json:"id"`
	Parent NodeID `json:"parent"` // root: ID 0, Parent 0
	// Order sorts siblings as MLC lists them: by ascending Order, the newest first. A node
	// keeps its place among its siblings, and its Order, for life: a node cut in two keeps
	// its place as the upper part, the lower part being its only child until a newer
	// sibling comes; a node joined with its only child keeps its place.
	Order uint32   `json:"order"`
	Depth int      `json:"depth"` // tokens from the root to the end of this node
	Span  int      `json:"span"`  // tokens on the edge into this node, over one radix page or more
	Seqs  []SeqRef `json:"seqs"`  // sequences whose tokens end exactly here, in the order they arrived here
	// Hits counts InsertSequence matches whose path passed through or stopped in this node
	// (the root counts every InsertSequence). The lower part of a node cut in two starts with
	// the count of the node it was cut from; a node joined with its child keeps the larger.
	Hits uint64 `json:"hits"`
}

// SeqRef names a sequence held by a node.
type SeqRef struct {
	ID    int64 `json:"id"`
	State State `json:"state"`
}

// Cache is the prefix cache: the policy of MLC's PrefixCache (cpp/serve/prefix_cache.cc:
// which sequences are active or recycling, what a new request reuses or forks, what is
// evicted) over the radix tree. The zero value is not usable; call New.
type Cache struct {
	radix   bool
	maxRec  int
	onEvict func(Eviction)

	t    tree
	seqs map[int64]*entry
	// recent holds entries by id modulo its length (a power of two, growing with seqs), in
	// front of seqs: the engine's sequence ids are consecutive, so the live ones mostly
	// have slots of their own and a lookup costs a load; and it asks HasSequence before it
	// extends, recycles or removes a sequence, so the second lookup of the id hits.
	recent []*entry

	pending []extension
	toks    []int32   // the tokens of the pending extensions that are not own, end to end
	owned   [][]int32 // the tokens of those that are, in order
	rec     recycling

	stats Stats

	evicted []Eviction // OnEvict calls owed at the end of the current call
}

// extension is a pending ExtendSequence of n tokens: the next n of Cache.toks, or, if own,
// the next copy in Cache.owned. It is small and holds one pointer: a decode step queues one
// for every running sequence.
type extension struct {
	e   *entry
	n   int
	own bool
}

// ownCopyAt is the length above which an extension may get a copy of its own.
const ownCopyAt = 64

// maxPendingToks is the capacity of Cache.toks above which a commit lets it go, so that a
// burst of long prompts does not pin its size.
const maxPendingToks = 1 << 16

// New returns an empty Cache. A Mode other than Radix gives a disabled cache.
func New(cfg Config) *Cache {
	return newCache(cfg, pageCapacity)
}

// newCache is New with radix pages of capacity tokens; tests use small pages to exercise
// the chains and merges that 64-token pages make rare.
func newCache(cfg Config, capacity int) *Cache {
	c := &Cache{
		radix:   cfg.Mode == Radix,
		maxRec:  cfg.MaxRecycling,
		onEvict: cfg.OnEvict,
		seqs:    make(map[int64]*entry),
		t:       newTree(capacity),
		rec:     recycling{order: cfg.Evict},
	}
	if c.maxRec < 0 {
		c.maxRec = -1
	}
	return c
}

// InsertSequence starts the prefix-cache entry of a new request (MLC's InsertSequence): it
// commits pending extensions, matches tokens without their last token against the tree, and
// adds id as a new sequence, forks it from a cached one, or hands a recycling sequence over
// in its place (then id itself is not added). The package doc gives the rules.
func (c *Cache) InsertSequence(id int64, tokens []int32, w Window) (Result, error) {
	switch {
	case id < 0:
		return Result{}, fmt.Errorf("prefix: insert %d: %w", id, ErrBadID)
	case len(tokens) == 0:
		return Result{}, fmt.Errorf("prefix: insert %d: %w", id, ErrEmptyTokens)
	case !w.valid():
		return Result{}, fmt.Errorf("prefix: insert %d: window {%d %d}: %w", id, w.Size, w.Sink, ErrBadWindow)
	}
	if !c.radix {
		return Result{Kind: Fresh, Parent: -1}, nil
	}
	if c.seqs[id] != nil {
		return Result{}, fmt.Errorf("prefix: insert %d: %w", id, ErrSequenceExists)
	}
	c.commit()
	res := c.insert(id, tokens[:len(tokens)-1], w)
	c.stats.Inserts++
	c.stats.QueryTokens += uint64(len(tokens))
	c.stats.HitTokens += uint64(res.Offset)
	switch res.Kind {
	case Fork:
		c.stats.Forks++
	case Reuse:
		c.stats.Reuses++
	}
	c.done()
	return res, nil
}

// insert asks the tree for the match and its candidates, and decides.
func (c *Cache) insert(id int64, q []int32, w Window) Result {
	t := &c.t
	x, m, _ := t.match(t.root, q) // the candidates are the sequences of x's subtree
	t.root.hits++
	t.touch(t.root)
	res := Result{Kind: Fresh, Parent: -1, Matched: m}
	if m == 0 {
		t.add(c.newEntry(id, w))
		return res
	}
	res.Candidates = int(x.total)
	end := x // the node holding the m-th token once the call is done
	var r *entry
	if w.Size == -1 {
		r = shortestRecycling(x, m, w)
	} else if x.depth == m {
		// With a sliding window only a sequence of exactly m tokens is taken over, and none
		// is forked. Only x's own sequences can be that long.
		for i := len(x.seqs) - 1; i >= 0; i-- {
			if e := x.seqs[i].e; e.state == Recycling && e.window == w {
				r = e
				break
			}
		}
	}
	var p *entry // the fork's parent
	if r == nil && w.Size == -1 {
		p = firstPlain(x)
	}
	switch {
	case r != nil:
		res.Kind, res.Offset, res.Parent, res.Pop = Reuse, m, r.id, r.node.depth-m
		c.rec.drop(r)
		t.setState(r, Active)
		if res.Pop > 0 {
			t.rollBack(r, res.Pop)
		}
		end = r.node
	case p != nil:
		res.Kind, res.Offset, res.Parent = Fork, m, p.id
		e := c.newEntry(id, w)
		t.fork(e, p, m)
		end = e.node
	default:
		t.add(c.newEntry(id, w))
	}
	n := 0
	for y := end; y != t.root; y = y.parent {
		y.hits++
		t.touch(y)
		n++
	}
	res.Path = make([]NodeID, n)
	for y := end; y != t.root; y = y.parent {
		n--
		res.Path[n] = y.id
	}
	return res
}

func (c *Cache) newEntry(id int64, w Window) *entry {
	e := &entry{id: id, state: Active, window: w}
	c.seqs[id] = e
	if n := len(c.recent); len(c.seqs) > n/2 && n < maxRecent {
		c.recent = make([]*entry, max(16, 2*n)) // it refills as lookups miss
	}
	c.recent[c.slot(id)] = e
	return e
}

// ExtendSequence queues tokens to append to sequence id at the next commit
// (CommitSequenceExtension, or any call that commits first). It copies tokens. An extension
// of a sequence that is no longer held when it is committed is skipped. An empty one still
// counts: as in MLC, committing it moves the sequence to the front of its page's list.
func (c *Cache) ExtendSequence(id int64, tokens []int32) {
	// A sequence not held now is not held at the commit either: every call that adds one
	// commits first. So the extension is skipped now, and the commit need not look id up.
	e := c.lookup(id)
	if e == nil {
		return
	}
	// Long extensions of a sequence that is not alone at a leaf (which grows in place) most
	// likely become a new leaf's tokens: they get a copy of their own, which the leaf takes,
	// so that they are copied once. The others (a decode step's token, whatever the
	// sequence's place: its earlier extensions may be pending) go into a buffer that the
	// commit reuses, and cost no allocation.
	own := len(tokens) > ownCopyAt && !c.t.alone(e)
	if own {
		// append, not make and copy: the copy is not zeroed first. Its spare capacity, if
		// the allocator rounds up, lets the leaf it may become grow in place.
		c.owned = append(c.owned, append([]int32(nil), tokens...))
	} else {
		c.toks = append(c.toks, tokens...)
	}
	c.pending = append(c.pending, extension{e, len(tokens), own})
}

// CommitSequenceExtension applies the queued extensions in the order they were queued.
func (c *Cache) CommitSequenceExtension() {
	if !c.radix {
		return
	}
	c.commit()
	c.done()
}

func (c *Cache) commit() {
	from, k := 0, 0
	for _, p := range c.pending {
		var toks []int32
		if p.own {
			toks = c.owned[k]
			k++
		} else {
			toks = c.toks[from : from+p.n : from+p.n]
			from += p.n
		}
		if p.e.node != nil { // still held: a dropped sequence has left the tree
			c.t.extend(p.e, toks, p.own)
		}
	}
	clear(c.pending)
	c.pending = c.pending[:0]
	clear(c.owned)
	c.owned = c.owned[:0]
	c.toks = c.toks[:0]
	if cap(c.toks) > maxPendingToks {
		c.toks = nil
	}
}

// RecycleSequence commits pending extensions and marks the active sequence id recycling,
// stamping it with the next value of the recycle counter. With MaxRecycling 0 it removes the
// sequence instead (calling OnEvict); at the cap it first evicts one (TryFreeMemory).
func (c *Cache) RecycleSequence(id int64) error {
	e := c.lookup(id)
	if e == nil {
		return fmt.Errorf("prefix: recycle %d: %w", id, ErrUnknownSequence)
	}
	if e.state != Active {
		return fmt.Errorf("prefix: recycle %d: %w", id, ErrNotActive)
	}
	c.commit()
	if c.maxRec == 0 {
		c.drop(e)
		c.evict(Eviction{Seq: id}) // never kept, so never stamped
	} else {
		if c.maxRec > 0 && c.rec.n >= c.maxRec {
			c.tryFree()
		}
		c.rec.add(e)
		c.t.setState(e, Recycling)
	}
	c.done()
	return nil
}

// TryFreeMemory evicts one recycling sequence, the next in the configured order, and calls
// OnEvict. It reports false, and does nothing, when no sequence is recycling. Like MLC's, it
// does not commit pending extensions.
func (c *Cache) TryFreeMemory() bool {
	if c.rec.n == 0 {
		return false
	}
	c.tryFree()
	c.done()
	return true
}

func (c *Cache) tryFree() {
	e := c.seqs[c.rec.victim()]
	stamp := e.stamp
	c.rec.drop(e)
	c.drop(e)
	c.evict(Eviction{Seq: e.id, Recycled: stamp})
}

// evict owes OnEvict the eviction ev, completed with the oldest recycling sequence left.
func (c *Cache) evict(ev Eviction) {
	ev.Oldest, ev.OldestRecycled = c.rec.oldest()
	c.stats.Evictions++
	c.evicted = append(c.evicted, ev)
}

// RollBackSequence commits pending extensions and drops the last n tokens of sequence id
// (active or recycling), 0 <= n <= its length after the commit.
func (c *Cache) RollBackSequence(id int64, n int) error {
	e := c.lookup(id)
	if e == nil {
		return fmt.Errorf("prefix: roll back %d: %w", id, ErrUnknownSequence)
	}
	l := e.node.depth
	for _, p := range c.pending {
		if p.e == e {
			l += p.n
		}
	}
	if n < 0 || n > l {
		return fmt.Errorf("prefix: roll back %d by %d of %d tokens: %w", id, n, l, ErrBadLength)
	}
	c.commit()
	if n > 0 {
		c.t.rollBack(e, n)
	}
	c.done()
	return nil
}

// RemoveSequence commits pending extensions and removes sequence id, active or recycling.
// It does not call OnEvict: the caller is removing the KV itself.
func (c *Cache) RemoveSequence(id int64) error {
	e := c.lookup(id)
	if e == nil {
		return fmt.Errorf("prefix: remove %d: %w", id, ErrUnknownSequence)
	}
	c.commit()
	if e.state == Recycling {
		c.rec.drop(e)
	}
	c.drop(e)
	c.done()
	return nil
}

// drop removes e from the tree and the cache; it is no longer recycling.
func (c *Cache) drop(e *entry) {
	if e.state == Recycling {
		c.t.setState(e, Active)
	}
	c.t.remove(e)
	delete(c.seqs, e.id)
	if i := c.slot(e.id); i >= 0 && c.recent[i] == e {
		c.recent[i] = nil
	}
}

// HasSequence reports whether the cache holds sequence id, active or recycling.
func (c *Cache) HasSequence(id int64) bool { return c.lookup(id) != nil }

// Sequence returns the committed length and the state of sequence id; ok is false when the
// cache does not hold it. Pending extensions are not counted.
func (c *Cache) Sequence(id int64) (length int, st State, ok bool) {
	e := c.lookup(id)
	if e == nil {
		return 0, 0, false
	}
	return e.node.depth, e.state, true
}

// NumRecycling returns the number of recycling sequences.
func (c *Cache) NumRecycling() int { return c.rec.n }

// Recycling returns the recycling sequences in the order the configured policy evicts them,
// the next victim first: under EvictMLC the emulated map's iteration order, under EvictLRU
// the least recently recycled first. (Under EvictMLC a later recycle may put its sequence
// anywhere in that order; the list is the order of the evictions that would follow if no
// other call came between them.)
func (c *Cache) Recycling() []int64 {
	if c.rec.n == 0 {
		return []int64{}
	}
	return c.rec.appendIDs(make([]int64, 0, c.rec.n))
}

// Match returns the longest common prefix m of tokens (all of them: unlike InsertSequence it
// drops nothing) with the committed tree, and the cached sequences that contain it, in the
// candidate order of the package doc (none when m is 0). It changes nothing: no commit, no
// hit counting.
func (c *Cache) Match(tokens []int32) (m int, candidates []int64) {
	if !c.radix {
		return 0, nil
	}
	x, m, _ := c.t.match(c.t.root, tokens)
	if m == 0 {
		return 0, nil
	}
	return m, appendCandidates(make([]int64, 0, x.total), x)
}

// Stats returns the counters.
func (c *Cache) Stats() Stats { return c.stats }

func (c *Cache) lookup(id int64) *entry {
	if !c.radix {
		return nil
	}
	i := c.slot(id)
	if i >= 0 {
		if e := c.recent[i]; e != nil && e.id == id {
			return e
		}
	}
	e := c.seqs[id]
	if e != nil && i >= 0 {
		c.recent[i] = e
	}
	return e
}

// maxRecent is the most slots Cache.recent grows to.
const maxRecent = 1 << 12

// slot returns id's slot in c.recent, or -1 while it has none.
func (c *Cache) slot(id int64) int {
	if len(c.recent) == 0 {
		return -1
	}
	return int(uint64(id) & uint64(len(c.recent)-1))
}

// done ends every public call that may have changed the cache: it checks the invariants when
// they are switched on, then makes the OnEvict calls owed.
func (c *Cache) done() {
	c.check()
	if len(c.evicted) == 0 {
		return
	}
	ev := c.evicted
	c.evicted = nil
	if c.onEvict != nil {
		for _, e := range ev {
			c.onEvict(e)
		}
	}
}
