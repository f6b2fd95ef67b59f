package prefix

import (
	"bytes"
	"unsafe"
)

// pageCapacity is the number of tokens a radix page holds: MLC's kPageCapacity_.
const pageCapacity = 64

// indexAt is the child count above which a page indexes its children by first token;
// unindexAt is the count at or below which it drops the index again. Siblings never share a
// first token, so the index finds what MLC's scan of the child list finds.
const (
	indexAt   = 8
	unindexAt = 4
)

// tree is MLC's paged radix tree (cpp/serve/radix_tree.cc): which tokens each sequence
// holds, laid out in pages as MLC lays them out, so that MatchPrefix lists the candidates in
// MLC's order. It answers questions (match, candidates, the shortest recycling candidate, the
// first one that may be forked) and applies the changes the Cache decides (add, fork,
// extend, roll back, remove); it decides nothing.
//
// Layout, as MLC keeps it:
//   - A page holds at most cap tokens (the root none); a long edge is a chain of pages.
//   - Each page keeps the sequences that end exactly at its end, newest first (a sequence is
//     pushed to the front), and its children, newest first (a new page is pushed to the
//     front). A page keeps its place among its siblings for life.
//   - A split cuts a page in two: the upper part stays in place, the lower part becomes its
//     only child and takes its sequences and children.
//   - A page with no sequence and exactly one child that fits with it (lengths summed <= cap)
//     is merged with that child, the upper page absorbing the lower, at the points MLC checks:
//     after a split (the lower part, and the upper part's parent), after an extension (the
//     page the sequence left) and after a removal (the first page left standing). A roll-back
//     merges nothing.
//   - A leaf page with no sequence is extended in place, up to cap tokens, before new pages
//     are chained below it.
//
// Every page also counts the sequences in its subtree (all, recycling, without a sliding
// window), so that the searches can skip subtrees that cannot hold their answer.
type tree struct {
	root   *page
	cap    int
	nextID NodeID

	dirty   []*page  // pages created or modified since the last TakeChanges
	removed []NodeID // pages that existed at the last TakeChanges and were deleted since

	// Pages come from slabs, as MLC's come from blocks of 64: the pages of one extension then
	// sit together in memory, and a freed page is reused.
	slab  []page
	spare []*page
}

// slabPages is the number of pages allocated at once.
const slabPages = 64

// entry is a cached sequence. The tree owns page; the Cache owns the rest. The sequence's
// length is its page's depth.
type entry struct {
	id     int64
	page   *page
	state  State
	window Window
	// stamp is the recycle counter's value when the sequence was last recycled; 0 while it
	// is active.
	stamp      uint64
	prev, next *entry // the recycling list, least recently recycled first
}

// page is one radix page.
type page struct {
	// What a lookup reads comes first.

	// toks are the page's tokens. Their spare capacity, if any, belongs to this page alone
	// (pages cut from one copy are capped with full slice expressions), so a leaf may grow
	// by append.
	toks        []int32
	index       map[int32]*page // children by first token, when there are more than indexAt
	first, last *page           // children, newest first
	next, prev  *page           // siblings: next is the older one
	parent      *page
	seqs        []slot  // the sequences ending here, oldest first: MLC's list reversed
	inline      [1]slot // seqs' array while it holds one sequence: a leaf and its sequence sit together
	total       int32   // sequences in the subtree
	rec         int32   // recycling sequences in the subtree
	plain       int32   // sequences without a sliding window in the subtree
	// ownRec and ownPlain count the recycling sequences and those without a sliding window
	// ending here; kidRec and kidPlain sum them over the children, so that a search can skip
	// a whole child list whose pages hold none of what it looks for.
	ownRec, ownPlain int32
	kidRec, kidPlain int32
	kids             int32
	depth            int // tokens from the root to the end of this page
	id               NodeID
	hits             uint64
	dirtyAt          int32 // index in tree.dirty, or -1
	fresh            bool  // created since the last TakeChanges
}

// slot is a sequence at a page. The id sits beside the pointer so that listing candidates
// does not touch the entries.
type slot struct {
	id int64
	e  *entry
}

func newTree(capacity int) tree {
	t := tree{cap: capacity}
	t.root = t.newPage(nil, nil)
	return t
}

func (t *tree) newPage(parent *page, toks []int32) *page {
	var p *page
	if k := len(t.spare); k > 0 {
		p = t.spare[k-1]
		t.spare[k-1] = nil
		t.spare = t.spare[:k-1]
	} else {
		if len(t.slab) == 0 {
			t.slab = make([]page, slabPages)
		}
		p = &t.slab[0]
		t.slab = t.slab[1:]
	}
	*p = page{id: t.nextID, parent: parent, toks: toks, dirtyAt: -1, fresh: true}
	p.seqs = p.inline[:0]
	if parent != nil {
		p.depth = parent.depth + len(toks)
	}
	t.nextID++
	if t.nextID == 0 {
		panic("prefix: page ids exhausted")
	}
	t.touch(p)
	return p
}

// touch records that p changed, for TakeChanges.
func (t *tree) touch(p *page) {
	if p.dirtyAt < 0 {
		p.dirtyAt = int32(len(t.dirty))
		t.dirty = append(t.dirty, p)
	}
}

// free records that p left the tree.
func (t *tree) free(p *page) {
	if i := p.dirtyAt; i >= 0 {
		last := len(t.dirty) - 1
		t.dirty[i] = t.dirty[last]
		t.dirty[i].dirtyAt = i
		t.dirty[last] = nil
		t.dirty = t.dirty[:last]
		p.dirtyAt = -1
	}
	if !p.fresh {
		t.removed = append(t.removed, p.id)
	}
	*p = page{}
	t.spare = append(t.spare, p)
}

func (p *page) child(tok int32) *page {
	if p.index != nil {
		return p.index[tok]
	}
	for c := p.first; c != nil; c = c.next {
		if c.toks[0] == tok {
			return c
		}
	}
	return nil
}

// insertChild pushes c to the front of p's children.
func (p *page) insertChild(c *page) {
	c.parent, c.prev, c.next = p, nil, p.first
	if p.first != nil {
		p.first.prev = c
	} else {
		p.last = c
	}
	p.first = c
	p.kids++
	p.kidRec += c.ownRec
	p.kidPlain += c.ownPlain
	if p.index != nil {
		p.index[c.toks[0]] = c
	} else if p.kids > indexAt {
		p.index = make(map[int32]*page, p.kids)
		for x := p.first; x != nil; x = x.next {
			p.index[x.toks[0]] = x
		}
	}
}

func (p *page) removeChild(c *page) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		p.first = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		p.last = c.prev
	}
	c.prev, c.next, c.parent = nil, nil, nil
	p.kids--
	p.kidRec -= c.ownRec
	p.kidPlain -= c.ownPlain
	if p.index != nil {
		delete(p.index, c.toks[0])
		if p.kids <= unindexAt {
			p.index = nil
		}
	}
}

// takeChildren moves all of from's children under p, which has none, keeping their order.
func (t *tree) takeChildren(p, from *page) {
	p.first, p.last, p.kids, p.index, p.kidRec, p.kidPlain = from.first, from.last, from.kids, from.index, from.kidRec, from.kidPlain
	from.first, from.last, from.kids, from.index, from.kidRec, from.kidPlain = nil, nil, 0, nil, 0, 0
	for c := p.first; c != nil; c = c.next {
		c.parent = p
		t.touch(c) // its Node.Parent changed
	}
}

// takeSeqs moves all of from's sequences to p, which has none, keeping their order.
func (t *tree) takeSeqs(p, from *page) {
	if len(from.seqs) <= 1 {
		p.seqs = append(p.inline[:0], from.seqs...) // not from's inline array: from may be reused
	} else {
		p.seqs = from.seqs
	}
	from.seqs = from.inline[:0]
	for _, s := range p.seqs {
		s.e.page = p
	}
	rec, plain := from.ownRec, from.ownPlain
	t.setOwn(from, 0, 0)
	t.setOwn(p, rec, plain)
}

// setOwn sets p's own counts, keeping its parent's sums.
func (t *tree) setOwn(p *page, rec, plain int32) {
	if q := p.parent; q != nil {
		q.kidRec += rec - p.ownRec
		q.kidPlain += plain - p.ownPlain
	}
	p.ownRec, p.ownPlain = rec, plain
}

// mergeable is MLC's RadixPage::Mergeable: no sequence, exactly one child, and room for the
// child's tokens. The root, which holds no token, never is.
func (t *tree) mergeable(p *page) bool {
	return p != t.root && len(p.seqs) == 0 && p.kids == 1 && len(p.toks)+len(p.first.toks) <= t.cap
}

// match walks from p along q, child by first token, and stops in the page where the common
// prefix ends: it returns that page, the tokens of q matched, and how many of the page's
// tokens were (len(page.toks) when the match reaches the page's end).
func (t *tree) match(p *page, q []int32) (end *page, m, in int) {
	for m < len(q) {
		c := p.child(q[m])
		if c == nil {
			break
		}
		l := lcp(c.toks, q[m:])
		m += l
		if l < len(c.toks) {
			return c, m, l
		}
		p = c
	}
	return p, m, len(p.toks)
}

// push puts e at the front of p's sequences.
func (t *tree) push(p *page, e *entry) {
	e.page = p
	p.seqs = append(p.seqs, slot{e.id, e})
	t.count(p, 1, e)
	t.touch(p)
}

// pop takes e off its page.
func (t *tree) pop(e *entry) {
	p := e.page
	for i := len(p.seqs) - 1; i >= 0; i-- {
		if p.seqs[i].e == e {
			copy(p.seqs[i:], p.seqs[i+1:])
			p.seqs[len(p.seqs)-1] = slot{}
			p.seqs = p.seqs[:len(p.seqs)-1]
			break
		}
	}
	if len(p.seqs) == 0 && cap(p.seqs) > 4 {
		p.seqs = p.inline[:0] // a crowd has left
	}
	t.count(p, -1, e)
	t.touch(p)
	e.page = nil
}

// count adds d sequences like e, ending at p, to the counts of p and its ancestors.
func (t *tree) count(p *page, d int32, e *entry) {
	var r, pl int32
	if e.state == Recycling {
		r = d
	}
	if e.window.Size == -1 {
		pl = d
	}
	t.setOwn(p, p.ownRec+r, p.ownPlain+pl)
	for ; p != nil; p = p.parent {
		p.total += d
		p.rec += r
		p.plain += pl
	}
}

// setState changes e's state, keeping the subtree counts.
func (t *tree) setState(e *entry, st State) {
	if e.state == st {
		return
	}
	t.count(e.page, -1, e)
	e.state = st
	t.count(e.page, 1, e)
	t.touch(e.page)
}

// add holds e, holding no token, at the root (MLC's AddSequence).
func (t *tree) add(e *entry) { t.push(t.root, e) }

// fork holds e with the first off tokens of parent (0 < off <= parent's length), in the
// page where parent's off-th token lies, split there if it lies inside (MLC's ForkSequence).
func (t *tree) fork(e, parent *entry, off int) {
	for p := parent.page; p != nil; p = p.parent {
		if off > p.depth-len(p.toks) {
			if off < p.depth {
				p = t.split(p, off-(p.depth-len(p.toks)))
			}
			t.push(p, e)
			return
		}
	}
	panic("prefix: fork beyond the root")
}

// extend appends toks to e (MLC's ExtendSequence). toks is the cache's own copy; pages may
// keep slices of it. An empty extension moves e to the front of its page.
func (t *tree) extend(e *entry, toks []int32) {
	orig := e.page
	t.pop(e)
	p, off, in := t.match(orig, toks)
	if in < len(p.toks) {
		p = t.split(p, in)
	}
	if off < len(toks) && 2*(len(toks)-off) < len(toks) {
		// Do not keep a mostly matched copy alive for its tail.
		toks = append([]int32(nil), toks[off:]...)
		off = 0
	}
	if off < len(toks) && len(p.seqs) == 0 && p.kids == 0 && p != t.root && len(p.toks) < t.cap {
		k := min(t.cap-len(p.toks), len(toks)-off)
		p.toks = append(p.toks, toks[off:off+k]...)
		p.depth += k
		off += k
		t.touch(p)
	}
	for off < len(toks) {
		k := min(t.cap, len(toks)-off)
		chunk := toks[off : off+k : off+k]
		if off+k == len(toks) {
			chunk = toks[off:] // the copy's spare capacity is free for the last page to grow into
		}
		c := t.newPage(p, chunk)
		p.insertChild(c)
		p = c
		off += k
	}
	t.push(p, e)
	if t.mergeable(orig) {
		t.merge(orig)
	}
}

// rollBack drops the last n tokens of e (0 < n <= its length), as MLC's RollBackSequence
// does: pages left empty on the way up are freed, a leaf left with no sequence shrinks in
// place, and otherwise the page where e now ends is split. Nothing is merged.
func (t *tree) rollBack(e *entry, n int) {
	if n == e.page.depth {
		t.remove(e)
		t.add(e)
		return
	}
	p := e.page
	t.pop(e)
	for len(p.toks) <= n {
		n -= len(p.toks)
		parent := p.parent
		if len(p.seqs) == 0 && p.kids == 0 {
			parent.removeChild(p)
			t.touch(parent)
			t.free(p)
		}
		p = parent
	}
	if len(p.seqs) == 0 && p.kids == 0 {
		p.toks = p.toks[:len(p.toks)-n]
		p.depth -= n
		t.push(p, e)
		return
	}
	if n > 0 {
		p = t.split(p, len(p.toks)-n)
	}
	t.push(p, e)
}

// remove drops e from the tree (MLC's RemoveSequence): the pages it leaves empty go, and the
// first page left standing is merged with its child if it can be.
func (t *tree) remove(e *entry) {
	p := e.page
	t.pop(e)
	for p.parent != nil && len(p.seqs) == 0 && p.kids == 0 {
		parent := p.parent
		parent.removeChild(p)
		t.touch(parent)
		t.free(p)
		p = parent
	}
	if t.mergeable(p) {
		t.merge(p)
	}
}

// split cuts p after k tokens (0 < k < len(p.toks)), as MLC's SplitPage: p keeps the first k
// tokens and its place; a new page below it takes the rest, p's sequences and its children.
// It then merges the new page with its child, and p into its parent, where they can be, and
// returns the page that ends where p's first k tokens end.
func (t *tree) split(p *page, k int) *page {
	c := t.newPage(nil, p.toks[k:])
	c.depth = p.depth
	t.takeChildren(c, p)
	t.takeSeqs(c, p)
	c.total, c.rec, c.plain, c.hits = p.total, p.rec, p.plain, p.hits
	p.toks = p.toks[:k:k]
	p.depth -= len(c.toks)
	p.insertChild(c)
	t.touch(p)
	if t.mergeable(c) {
		t.merge(c)
	}
	if p.parent != nil && t.mergeable(p.parent) {
		p = p.parent
		t.merge(p)
	}
	return p
}

// merge folds p's only child into p (MLC's MergePage): p takes its tokens, sequences and
// children, and the child goes.
func (t *tree) merge(p *page) {
	c := p.first
	toks := make([]int32, len(p.toks)+len(c.toks))
	copy(toks, p.toks)
	copy(toks[len(p.toks):], c.toks)
	p.toks = toks
	p.depth = c.depth
	p.removeChild(c)
	t.takeChildren(p, c)
	t.takeSeqs(p, c)
	p.hits = max(p.hits, c.hits)
	t.free(c)
	t.touch(p)
}

// eachSeq calls f for p's sequences, newest first, until f returns false.
func eachSeq(p *page, f func(slot) bool) bool {
	for i := len(p.seqs) - 1; i >= 0; i-- {
		if !f(p.seqs[i]) {
			return false
		}
	}
	return true
}

// candidatesOf calls f for the sequences of x's subtree in MLC's MatchPrefix order, until f
// returns false: x's own, then below(x).
func candidatesOf(x *page, f func(slot) bool) bool {
	return eachSeq(x, f) && below(x, f)
}

// below is MLC's Iterate from p's first child, where Iterate(c) visits c, then Iterate of
// c's next sibling, then Iterate of c's first child: the sequences of all of p's children,
// in list order, then, for each child from the oldest to the newest, below(child).
func below(p *page, f func(slot) bool) bool {
	for c := p.first; c != nil; c = c.next {
		if !eachSeq(c, f) {
			return false
		}
	}
	for c := p.last; c != nil; c = c.prev {
		if c.kids > 0 && !below(c, f) {
			return false
		}
	}
	return true
}

// reusable is MLC's test for taking a recycling sequence of length l over for a match of m
// tokens, m > 0.9 * l, in double precision as MLC computes it.
func reusable(m, l int) bool { return float64(m) > float64(l)*0.9 }

// shortestRecycling returns the sequence InsertSequence takes over when no sliding window is
// in play: the shortest recycling sequence with window w among x's candidates (the first in
// candidate order among the shortest), provided it passes reusable(m, length); else nil.
//
// It walks the candidates in order but skips the pages and subtrees that cannot improve on
// the best so far: those with nothing recycling, and those whose sequences (as long as the
// page's depth, or longer below it) are no shorter than the best or too long to pass the
// test. Skipping those that fail the test changes nothing: the test is monotone in the
// length, so if the shortest fails, every candidate does.
func shortestRecycling(x *page, m int, w Window) *entry {
	var best *entry
	bestLen := 0
	useful := func(l int) bool { return reusable(m, l) && (best == nil || l < bestLen) }
	look := func(p *page) {
		if p.ownRec == 0 || !useful(p.depth) {
			return
		}
		for i := len(p.seqs) - 1; i >= 0; i-- {
			if e := p.seqs[i].e; e.state == Recycling && e.window == w {
				best, bestLen = e, p.depth
				return // the others here are as long, and later
			}
		}
	}
	var walk func(p *page)
	walk = func(p *page) {
		if p.kidRec > 0 {
			for c := p.first; c != nil; c = c.next {
				look(c)
			}
		}
		for c := p.last; c != nil; c = c.prev {
			if c.rec > c.ownRec && useful(c.depth+1) {
				walk(c)
			}
		}
	}
	if x.rec == 0 {
		return nil
	}
	look(x)
	if x.kids > 0 && useful(x.depth+1) {
		walk(x)
	}
	return best
}

// firstPlain returns the first sequence without a sliding window among x's candidates, in
// candidate order, or nil. It skips subtrees that hold none.
func firstPlain(x *page) *entry {
	var found *entry
	f := func(s slot) bool {
		if s.e.window.Size == -1 {
			found = s.e
			return false
		}
		return true
	}
	if x.plain == 0 || !eachSeq(x, f) {
		return found
	}
	var walk func(p *page) bool
	walk = func(p *page) bool {
		if p.kidPlain > 0 {
			for c := p.first; c != nil; c = c.next {
				if c.ownPlain > 0 && !eachSeq(c, f) {
					return false
				}
			}
		}
		for c := p.last; c != nil; c = c.prev {
			if c.plain > c.ownPlain && !walk(c) {
				return false
			}
		}
		return true
	}
	walk(x)
	return found
}

// lcp returns the length of the longest common prefix of a and b. It compares growing chunks
// with bytes.Equal (the runtime's vectorised memequal), then narrows a differing chunk down
// by halves.
func lcp(a, b []int32) int {
	n := min(len(a), len(b))
	if n == 0 || a[0] != b[0] {
		return 0
	}
	i, chunk, narrowing := 1, 16, false
	for i < n {
		k := min(chunk, n-i)
		if k <= 8 {
			for j := i; j < i+k; j++ {
				if a[j] != b[j] {
					return j
				}
			}
			i += k
			continue
		}
		if equal(a[i:i+k], b[i:i+k]) {
			i += k
			if !narrowing && chunk < 1024 {
				chunk *= 2
			}
			continue
		}
		narrowing = true
		chunk = k / 2
	}
	return n
}

func equal(a, b []int32) bool {
	return bytes.Equal(
		unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), 4*len(a)),
		unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 4*len(b)),
	)
}
