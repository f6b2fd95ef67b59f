package prefix

import (
	"bytes"
	"slices"
	"unsafe"
)

// pageCapacity is the number of tokens a radix page holds: MLC's kPageCapacity_.
const pageCapacity = 64

// indexAt is the child count above which a node indexes its children by first token;
// unindexAt is the count at or below which it drops the index again. Siblings never share a
// first token, so the index finds what MLC's scan of the child list finds.
const (
	indexAt   = 8
	unindexAt = 4
)

// tree is MLC's paged radix tree (cpp/serve/radix_tree.cc): which tokens each sequence
// holds, laid out in radix pages exactly as MLC lays them out, so that its MatchPrefix order
// can be followed. It answers questions (match, the candidates in order, the shortest
// recycling candidate, the first one that may be forked) and applies the changes the Cache
// decides (add, fork, extend, roll back, remove); it decides nothing.
//
// MLC's layout:
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
// The representation is coarser than MLC's: a node is a maximal chain of pages, each page
// but the last holding no sequence and having the next as its only child. A node then holds
// a sequence or has two children or more (the root excepted), as in a compressed radix tree,
// and records where its pages end, unless they are regular (all full but the last, as new
// tokens are cut into pages): then their number says it. The operations below are MLC's,
// page by page; a page is named by a pageRef, and a chain that an operation leaves
// unmaximal (a node that lost its last sequence or its second child) is joined with its
// child when the operation is done. Joining changes no page.
//
// Every node also counts the sequences in its subtree (all, recycling, without a sliding
// window), so that the searches can skip subtrees that cannot hold their answer.
type tree struct {
	root   *node
	cap    int
	nextID NodeID

	dirty   []*node  // nodes created or modified since the last TakeChanges
	removed []NodeID // nodes that existed at the last TakeChanges and were deleted since

	suspects []*node // nodes an operation may have left unmaximal; see normalize

	spare []*node // freed nodes, for reuse
}

// entry is a cached sequence. The tree owns node; the Cache owns the rest. The sequence
// ends at its node's last page: its length is the node's depth. Once the sequence is
// dropped, node is nil.
type entry struct {
	id     int64
	node   *node
	state  State
	window Window
	// stamp is the recycle counter's value when the sequence was last recycled; 0 while it
	// is active.
	stamp      uint64
	prev, next *entry // the recycling list, least recently recycled first
}

// node is a maximal chain of radix pages.
type node struct {
	// What a match reads comes first (toks, index, kids), then what listing the candidates
	// reads (the length of kids, npages, seqs and inline), close together.

	// toks are the node's tokens, its pages' end to end. Their spare capacity, if any,
	// belongs to this node alone (nodes cut from one copy are capped with full slice
	// expressions), so a leaf may grow by append.
	toks  []int32
	index map[int32]*node // children by first token, when there are more than indexAt
	// kids are the children, oldest first: MLC's list reversed. A new child is appended; a
	// child keeps its index among the others but for removals before it.
	kids    []*node
	npages  int32   // the number of pages: len(ends), or for regular pages as many as toks fill
	dirtyAt int32   // index in tree.dirty, or -1
	seqs    []slot  // the sequences ending here, oldest first: MLC's list reversed
	inline  [1]slot // seqs' array while it holds one sequence: a leaf and its sequence sit together
	// ends are where the pages end in toks, ascending; the last is len(toks). nil when the
	// pages are regular: every page but the last holds pageCap tokens, as a node made of new
	// tokens has them, so that most nodes need no array. The root has no tokens and no pages
	// of its own: it is MLC's root page.
	ends   []int32
	parent *node
	total  int32 // sequences in the subtree
	rec    int32 // recycling sequences in the subtree
	plain  int32 // sequences without a sliding window in the subtree
	// own counts the sequences ending here; kid1 sums own over the children of one page,
	// whose sequences MatchPrefix meets first below a page, so that a walk can skip that
	// pass when it would find nothing.
	own, kid1 counts
	pageCap   int32 // the tree's cap, for regular pages
	depth     int   // tokens from the root to the end of this node
	id        NodeID
	fresh     bool // created since the last TakeChanges
	hits      uint64
}

// slot is a sequence at a node. The id sits beside the pointer so that listing candidates
// does not touch the entries.
type slot struct {
	id int64
	e  *entry
}

// counts counts sequences: all, recycling, without a sliding window.
type counts struct{ seqs, rec, plain int32 }

func (a counts) plus(b counts) counts {
	return counts{a.seqs + b.seqs, a.rec + b.rec, a.plain + b.plain}
}
func (a counts) minus(b counts) counts {
	return counts{a.seqs - b.seqs, a.rec - b.rec, a.plain - b.plain}
}

// pageRef names page i of node n; the root's page is i == -1.
type pageRef struct {
	n *node
	i int
}

func newTree(capacity int) tree {
	t := tree{cap: capacity}
	t.root = t.newNode(nil, nil, nil)
	return t
}

func (t *tree) newNode(parent *node, toks []int32, ends []int32) *node {
	var n *node
	if k := len(t.spare); k > 0 {
		n = t.spare[k-1] // zeroed by free
		t.spare[k-1] = nil
		t.spare = t.spare[:k-1]
	} else {
		n = new(node)
	}
	// Field by field, not *n = node{…}: that builds the node on the stack with narrow
	// stores and copies it with wide loads, which cannot take their data from the stores
	// still in flight, and stall.
	n.id, n.parent, n.dirtyAt, n.fresh, n.pageCap = t.nextID, parent, -1, true, int32(t.cap)
	n.toks, n.ends, n.npages = toks, ends, countPages(toks, ends, t.cap)
	n.seqs = n.inline[:0]
	if parent != nil {
		n.depth = parent.depth + len(toks)
	}
	t.nextID++
	if t.nextID == 0 {
		panic("prefix: node ids exhausted")
	}
	t.touch(n)
	return n
}

// touch records that n changed, for TakeChanges.
func (t *tree) touch(n *node) {
	if n.dirtyAt < 0 {
		n.dirtyAt = int32(len(t.dirty))
		t.dirty = append(t.dirty, n)
	}
}

// free records that n left the tree, and keeps it for reuse.
func (t *tree) free(n *node) {
	if i := n.dirtyAt; i >= 0 {
		last := len(t.dirty) - 1
		t.dirty[i] = t.dirty[last]
		t.dirty[i].dirtyAt = i
		t.dirty[last] = nil
		t.dirty = t.dirty[:last]
	}
	if !n.fresh {
		t.removed = append(t.removed, n.id)
	}
	*n = node{dirtyAt: -1}
	t.spare = append(t.spare, n)
}

// Pages.

// countPages returns the number of pages of toks with the page ends ends (nil for regular
// pages of capacity tokens).
func countPages(toks, ends []int32, capacity int) int32 {
	if ends != nil {
		return int32(len(ends))
	}
	return int32((len(toks) + capacity - 1) / capacity)
}

// pages returns the number of n's pages (0 for the root).
func (n *node) pages() int { return int(n.npages) }

func (n *node) lastPage() int { return int(n.npages) - 1 }

// onePage reports whether n has a single page.
func (n *node) onePage() bool { return n.npages == 1 }

// start and end are where page i begins and ends in n.toks.
func (n *node) start(i int) int {
	switch {
	case i <= 0:
		return 0
	case n.ends != nil:
		return int(n.ends[i-1])
	}
	return i * int(n.pageCap)
}

func (n *node) end(i int) int {
	switch {
	case i < 0:
		return 0
	case n.ends != nil:
		return int(n.ends[i])
	}
	return min((i+1)*int(n.pageCap), len(n.toks))
}

// endsOf returns n's page ends in a new array.
func (n *node) endsOf() []int32 {
	ends := make([]int32, n.pages())
	for i := range ends {
		ends[i] = int32(n.end(i))
	}
	return ends
}

func (r pageRef) len() int      { return r.n.end(r.i) - r.n.start(r.i) }
func (r pageRef) isLast() bool  { return r.i == r.n.lastPage() }
func (r pageRef) hasSeqs() bool { return r.isLast() && len(r.n.seqs) > 0 }

// kids is the number of the page's children: the next page, or the node's children.
func (r pageRef) kids() int {
	if !r.isLast() {
		return 1
	}
	return len(r.n.kids)
}

func (r pageRef) firstChild() pageRef {
	if !r.isLast() {
		return pageRef{r.n, r.i + 1}
	}
	return pageRef{r.n.newest(), 0}
}

// parentPage returns the page above r; ok is false for the root's.
func (r pageRef) parentPage() (p pageRef, ok bool) {
	switch {
	case r.i > 0:
		return pageRef{r.n, r.i - 1}, true
	case r.n.parent == nil:
		return pageRef{}, false
	}
	return pageRef{r.n.parent, r.n.parent.lastPage()}, true
}

// lastOf returns the page a node's sequences end in.
func lastOf(n *node) pageRef { return pageRef{n, n.lastPage()} }

// pageAt returns the page of n where the node's off-th token lies (0 < off <= len(n.toks)).
func pageAt(n *node, off int) pageRef {
	if n.ends == nil {
		return pageRef{n, (off - 1) / int(n.pageCap)}
	}
	i, _ := slices.BinarySearch(n.ends, int32(off))
	return pageRef{n, i}
}

// mergeable is MLC's RadixPage::Mergeable: no sequence, exactly one child, and room for the
// child's tokens. The root's page, which holds no token, never is.
func (t *tree) mergeable(r pageRef) bool {
	return r.n != t.root && !r.hasSeqs() && r.kids() == 1 && r.len()+r.firstChild().len() <= t.cap
}

// Children.

// newest returns the first child in MLC's list.
func (n *node) newest() *node { return n.kids[len(n.kids)-1] }

func (n *node) child(tok int32) *node {
	if n.index != nil {
		return n.index[tok]
	}
	for i := len(n.kids) - 1; i >= 0; i-- {
		if c := n.kids[i]; c.toks[0] == tok {
			return c
		}
	}
	return nil
}

// insertChild pushes c to the front of n's children in MLC's list.
func (n *node) insertChild(c *node) {
	c.parent = n
	n.kids = append(n.kids, c)
	if c.onePage() {
		n.kid1 = n.kid1.plus(c.own)
	}
	if n.index != nil {
		n.index[c.toks[0]] = c
	} else if len(n.kids) > indexAt {
		n.index = make(map[int32]*node, len(n.kids))
		for _, x := range n.kids {
			n.index[x.toks[0]] = x
		}
	}
}

// removeChild takes c out of n's children, keeping the others' order.
func (t *tree) removeChild(n, c *node) {
	// Look for c from both ends at once and close the gap from the nearer one: the victims
	// of eviction are mostly among the oldest children (the least recently recycled) or the
	// newest (MLC's order), and a shared prompt may have a thousand children.
	kids := n.kids
	i, j := 0, len(kids)-1
	for kids[i] != c && kids[j] != c {
		i++
		j--
	}
	if kids[i] == c {
		copy(kids[1:i+1], kids[:i])
		kids[0] = nil
		n.kids = kids[1:]
	} else {
		copy(kids[j:], kids[j+1:])
		kids[len(kids)-1] = nil
		n.kids = kids[:len(kids)-1]
	}
	if len(n.kids) == 0 {
		n.kids = nil
	}
	c.parent = nil
	if c.onePage() {
		n.kid1 = n.kid1.minus(c.own)
	}
	if n.index != nil {
		delete(n.index, c.toks[0])
		if len(n.kids) <= unindexAt {
			n.index = nil
		}
	}
	t.touch(n)
	t.suspects = append(t.suspects, n)
}

// takeChildren moves all of from's children under n, which has none, keeping their order.
func (t *tree) takeChildren(n, from *node) {
	n.kids, n.index, n.kid1 = from.kids, from.index, from.kid1
	from.kids, from.index, from.kid1 = nil, nil, counts{}
	for _, c := range n.kids {
		c.parent = n
		t.touch(c) // its Node.Parent changed
	}
}

// takeSeqs moves all of from's sequences to n, which has none, keeping their order.
func (t *tree) takeSeqs(n, from *node) {
	if len(from.seqs) <= 1 {
		n.seqs = append(n.inline[:0], from.seqs...) // not from's inline array: from may be reused
	} else {
		n.seqs = from.seqs
	}
	from.seqs = from.inline[:0]
	for _, s := range n.seqs {
		s.e.node = n
	}
	own := from.own
	t.setOwn(from, counts{})
	t.setOwn(n, own)
}

// setOwn sets n's own counts, keeping its parent's sums.
func (t *tree) setOwn(n *node, own counts) {
	if p := n.parent; p != nil && n.onePage() {
		p.kid1 = p.kid1.plus(own.minus(n.own))
	}
	n.own = own
}

// setPages gives n the tokens toks and the page ends ends (nil for regular pages), keeping
// its parent's sums.
func (t *tree) setPages(n *node, toks, ends []int32) {
	was := n.onePage()
	n.toks, n.ends, n.npages = toks, ends, countPages(toks, ends, t.cap)
	t.pagesChanged(n, was)
}

// appendToks appends toks to n's tokens: its last page fills up to cap tokens, then new
// pages follow in its chain (MLC's extension of a leaf page in place). Regular pages stay
// regular.
func (t *tree) appendToks(n *node, toks []int32) {
	was := n.onePage()
	from := len(n.toks)
	n.toks = append(n.toks, toks...)
	n.depth += len(toks)
	if n.ends != nil {
		n.ends = t.appendPages(n.ends, from, len(n.toks))
		n.npages = int32(len(n.ends))
	} else if len(n.toks) > int(n.npages)*t.cap {
		n.npages = countPages(n.toks, nil, t.cap)
	}
	t.pagesChanged(n, was)
	t.touch(n)
}

// pagesChanged keeps n's parent's sums after n's pages changed; was is whether n had one
// page before.
func (t *tree) pagesChanged(n *node, was bool) {
	if p := n.parent; p != nil && was != n.onePage() {
		if was {
			p.kid1 = p.kid1.minus(n.own)
		} else {
			p.kid1 = p.kid1.plus(n.own)
		}
	}
}

// Sequences.

// push puts e at the front of the sequences of page r, making r its node's last page.
func (t *tree) push(r pageRef, e *entry) {
	n := t.materialize(r)
	e.node = n
	n.seqs = append(n.seqs, slot{e.id, e})
	t.count(n, 1, e)
	t.touch(n)
}

// pop takes e off its page and returns the page.
func (t *tree) pop(e *entry) pageRef {
	n := e.node
	for i := len(n.seqs) - 1; i >= 0; i-- {
		if n.seqs[i].e == e {
			copy(n.seqs[i:], n.seqs[i+1:])
			n.seqs[len(n.seqs)-1] = slot{}
			n.seqs = n.seqs[:len(n.seqs)-1]
			break
		}
	}
	if len(n.seqs) == 0 && cap(n.seqs) > 4 {
		n.seqs = n.inline[:0] // a crowd has left
	}
	t.count(n, -1, e)
	t.touch(n)
	t.suspects = append(t.suspects, n)
	e.node = nil
	return lastOf(n)
}

// count adds d sequences like e, ending at n, to the counts of n and its ancestors.
func (t *tree) count(n *node, d int32, e *entry) {
	var r, pl int32
	if e.state == Recycling {
		r = d
	}
	if e.window.Size == -1 {
		pl = d
	}
	t.setOwn(n, n.own.plus(counts{d, r, pl}))
	for ; n != nil; n = n.parent {
		n.total += d
		n.rec += r
		n.plain += pl
	}
}

// setState changes e's state, keeping the counts.
func (t *tree) setState(e *entry, st State) {
	if e.state == st {
		return
	}
	t.count(e.node, -1, e)
	e.state = st
	t.count(e.node, 1, e)
	t.touch(e.node)
}

// Structure. None of these changes a page but as MLC's operations do.

// materialize makes page r the last page of its node, cutting the node after it: the pages
// below go to a new node, with the node's sequences and children. It returns r's node. The
// caller gives r a sequence or a second child at once.
func (t *tree) materialize(r pageRef) *node {
	n := r.n
	if r.isLast() {
		return n
	}
	e := n.end(r.i)
	// Regular pages above and below the cut stay regular: those above are full.
	var upper, lower []int32
	if n.ends != nil {
		lower = make([]int32, len(n.ends)-r.i-1)
		for j := range lower {
			lower[j] = n.ends[r.i+1+j] - int32(e)
		}
		upper = n.ends[: r.i+1 : r.i+1]
	}
	l := t.newNode(nil, n.toks[e:], lower)
	l.depth = n.depth
	t.takeChildren(l, n)
	t.takeSeqs(l, n)
	l.total, l.rec, l.plain, l.hits = n.total, n.rec, n.plain, n.hits
	t.setPages(n, n.toks[:e:e], upper)
	n.depth -= len(l.toks)
	n.insertChild(l)
	t.touch(n)
	t.suspects = append(t.suspects, l) // the pages below may hold nothing now
	return n
}

// join folds n's only child c into n, n holding no sequence: n's pages are followed by c's.
// No page changes.
func (t *tree) join(n *node) {
	c := n.kids[0]
	toks := make([]int32, len(n.toks)+len(c.toks))
	copy(toks, n.toks)
	copy(toks[len(n.toks):], c.toks)
	var ends []int32 // regular pages followed by regular pages, all full, stay regular
	if n.ends != nil || c.ends != nil || len(n.toks)%t.cap != 0 {
		ends = append(n.endsOf(), c.endsOf()...)
		for j := n.pages(); j < len(ends); j++ {
			ends[j] += int32(len(n.toks))
		}
	}
	t.setPages(n, toks, ends)
	n.depth = c.depth
	t.removeChild(n, c)
	t.takeChildren(n, c)
	t.takeSeqs(n, c)
	n.hits = max(n.hits, c.hits)
	t.free(c)
	t.touch(n)
}

// normalize joins the nodes an operation left with no sequence and one child to that child.
func (t *tree) normalize() {
	for _, n := range t.suspects {
		// A suspect may have been freed (its parent is then nil) or reused since; joining any
		// node that needs it is right.
		for n.parent != nil && len(n.seqs) == 0 && len(n.kids) == 1 {
			t.join(n)
		}
	}
	clear(t.suspects)
	t.suspects = t.suspects[:0]
}

// mergePage is MLC's MergePage: page r, mergeable, absorbs its only child page.
func (t *tree) mergePage(r pageRef) {
	n := r.n
	if r.isLast() {
		t.join(n)
	}
	t.setPages(n, n.toks, slices.Delete(n.endsOf(), r.i, r.i+1))
	t.touch(n)
}

// splitPage is MLC's SplitPage: it cuts page r after k tokens (0 < k < r.len()), the lower
// part taking the page's sequences and children; then it merges the lower part with its
// child, and the upper part into its parent, where they can be. It returns the page that
// ends where r's first k tokens end.
func (t *tree) splitPage(r pageRef, k int) pageRef {
	n := r.n
	t.setPages(n, n.toks, slices.Insert(n.endsOf(), r.i, int32(n.start(r.i)+k)))
	t.touch(n)
	if lower := (pageRef{n, r.i + 1}); t.mergeable(lower) {
		t.mergePage(lower)
	}
	up := pageRef{n, r.i}
	if p, ok := up.parentPage(); ok && t.mergeable(p) {
		t.mergePage(p) // p keeps its index, in n or in the parent node that absorbed n
		return p
	}
	return up
}

// removeLeafPage drops page r, which holds no sequence and has no child: it is its node's
// last page. A node left without pages leaves the tree.
func (t *tree) removeLeafPage(r pageRef) {
	n := r.n
	if r.i == 0 {
		t.removeChild(n.parent, n)
		t.free(n)
		return
	}
	n.depth -= r.len()
	var ends []int32 // the pages left of regular ones are full: regular
	if n.ends != nil {
		ends = n.ends[:r.i]
	}
	t.setPages(n, n.toks[:n.start(r.i)], ends)
	t.touch(n)
}

// match walks from the end of node n along q, child by first token, and stops in the node
// where the common prefix ends: it returns that node, the tokens of q matched, and how many
// of the node's tokens were (all of them when the match reaches its end). matchPage says in
// which of its pages the match stopped.
func (t *tree) match(n *node, q []int32) (end *node, m, in int) {
	for m < len(q) {
		c := n.child(q[m])
		if c == nil {
			break
		}
		l := lcp(c.toks, q[m:])
		m += l
		if l < len(c.toks) {
			return c, m, l
		}
		n = c
	}
	return n, m, len(n.toks)
}

// matchPage returns the page of n in which a match of its first in tokens stopped, and how
// many of the page's tokens it matched (its length when the match reaches the page's end).
func matchPage(n *node, in int) (pageRef, int) {
	if in == len(n.toks) {
		p := lastOf(n)
		return p, p.len()
	}
	p := pageAt(n, in)
	return p, in - n.start(p.i)
}

// The operations.

// add holds e, holding no token, at the root (MLC's AddSequence).
func (t *tree) add(e *entry) {
	t.push(lastOf(t.root), e)
	t.normalize()
}

// fork holds e with the first off tokens of parent (0 < off <= parent's length), in the
// page where parent's off-th token lies, split there if it lies inside (MLC's ForkSequence).
func (t *tree) fork(e, parent *entry, off int) {
	n := parent.node
	for n.depth-len(n.toks) >= off {
		n = n.parent
	}
	r := pageAt(n, off-(n.depth-len(n.toks)))
	if d := n.depth - len(n.toks) + n.end(r.i); off < d {
		r = t.splitPage(r, r.len()-(d-off))
	}
	t.push(r, e)
	t.normalize()
}

// alone reports whether e is alone at a leaf: extending it appends to its node's tokens.
func (t *tree) alone(e *entry) bool {
	n := e.node
	return len(n.seqs) == 1 && len(n.kids) == 0 && n != t.root
}

// extend appends toks to e (MLC's ExtendSequence). If own, toks is the cache's own copy and
// a new node may keep a slice of it; otherwise the node takes a copy. An empty extension
// moves e to the front of its page.
func (t *tree) extend(e *entry, toks []int32, own bool) {
	if t.alone(e) {
		n := e.node
		// e alone at a leaf, the decode case. MLC's steps come to this: e leaves its page,
		// which is then a leaf page with no sequence; no child continues toks, so that page
		// fills up in place and new pages follow in its chain; e goes onto the last of them;
		// the page it left is not mergeable (it holds e again, or it is full and has a
		// child), and neither is anything else touched.
		t.appendToks(n, toks)
		return
	}
	orig := t.pop(e)
	// orig keeps its node and index through what follows: everything that changes happens
	// below it, and nothing above it merges with it.
	x, off, l := t.match(orig.n, toks)
	p, in := matchPage(x, l)
	if in < p.len() {
		p = t.splitPage(p, in)
	}
	if off < len(toks) {
		rest := toks[off:]
		if p.n != t.root && !p.hasSeqs() && p.kids() == 0 {
			// A leaf page with no sequence: it fills up in place, and the pages that follow
			// continue its chain.
			t.appendToks(p.n, rest)
			p = lastOf(p.n)
		} else {
			if !own || 2*len(rest) < len(toks) {
				// Copy what is borrowed, and do not keep a mostly matched copy alive for its
				// tail. (append, not make and copy: see ExtendSequence.)
				rest = append([]int32(nil), rest...)
			}
			parent := t.materialize(p)
			c := t.newNode(parent, rest, nil) // regular pages
			parent.insertChild(c)
			p = lastOf(c)
		}
	}
	t.push(p, e)
	if t.mergeable(orig) {
		t.mergePage(orig)
	}
	t.normalize()
}

// appendPages cuts the tokens [from, to) of a node into pages and appends their ends to
// ends, the node's explicit page ends: the node's last page, which ends at from, first fills
// up to cap tokens, then full pages follow, and a last shorter one.
func (t *tree) appendPages(ends []int32, from, to int) []int32 {
	s := 0
	if len(ends) > 1 {
		s = int(ends[len(ends)-2])
	}
	fill := min(s+t.cap, to)
	ends[len(ends)-1] = int32(fill)
	from = fill
	ends = slices.Grow(ends, (to-from+t.cap-1)/t.cap)
	for from < to {
		from = min(from+t.cap, to)
		ends = append(ends, int32(from))
	}
	return ends
}

// rollBack drops the last n tokens of e (0 < n <= its length), as MLC's RollBackSequence
// does: pages left empty on the way up are freed, a leaf left with no sequence shrinks in
// place, and otherwise the page where e now ends is split. Nothing is merged.
func (t *tree) rollBack(e *entry, n int) {
	if n == e.node.depth {
		t.remove(e)
		t.add(e)
		return
	}
	r := t.pop(e)
	for r.len() <= n {
		n -= r.len()
		up, _ := r.parentPage()
		if !r.hasSeqs() && r.kids() == 0 {
			t.removeLeafPage(r)
		}
		r = up
	}
	if !r.hasSeqs() && r.kids() == 0 {
		m := r.n
		if m.ends != nil {
			m.ends[len(m.ends)-1] -= int32(n)
		}
		t.setPages(m, m.toks[:len(m.toks)-n], m.ends)
		m.depth -= n
		t.touch(m)
	} else if n > 0 {
		r = t.splitPage(r, r.len()-n)
	}
	t.push(r, e)
	t.normalize()
}

// remove drops e from the tree (MLC's RemoveSequence): the pages it leaves empty go, and the
// first page left standing is merged with its child if it can be.
func (t *tree) remove(e *entry) {
	r := t.pop(e)
	for r.n != t.root && !r.hasSeqs() && r.kids() == 0 {
		up, _ := r.parentPage()
		t.removeLeafPage(r)
		r = up
	}
	if t.mergeable(r) {
		t.mergePage(r)
	}
	t.normalize()
}

// Questions.

// eachSeq calls f for n's sequences, newest first, until f returns false.
func eachSeq(n *node, f func(slot) bool) bool {
	for i := len(n.seqs) - 1; i >= 0; i-- {
		if !f(n.seqs[i]) {
			return false
		}
	}
	return true
}

// appendCandidates appends the ids of the sequences of x's subtree in MLC's MatchPrefix
// order, for a match that stopped in any page of x: x's own, newest first, then below x.
func appendCandidates(dst []int64, x *node) []int64 {
	return appendBelow(appendSeqs(dst, x), x)
}

// appendSeqs appends the ids of n's sequences, newest first.
func appendSeqs(dst []int64, n *node) []int64 {
	for i := len(n.seqs) - 1; i >= 0; i-- {
		dst = append(dst, n.seqs[i].id)
	}
	return dst
}

// appendBelow is MLC's Iterate from the first child of x's last page, where Iterate(c)
// visits c, then Iterate of c's next sibling, then Iterate of c's first child. Page by page
// that is: the sequences of all the children, in list order, then, for each child from the
// oldest to the newest, the same below it. A child node of several pages has no sequence on
// its first page: its own come first in its turn below, followed by what is below its last
// page.
func appendBelow(dst []int64, x *node) []int64 {
	if x.kid1.seqs > 0 {
		for i := len(x.kids) - 1; i >= 0; i-- {
			if c := x.kids[i]; c.onePage() {
				dst = appendSeqs(dst, c)
			}
		}
	}
	for _, c := range x.kids {
		if !c.onePage() {
			dst = appendSeqs(dst, c)
		}
		if len(c.kids) > 0 {
			dst = appendBelow(dst, c)
		}
	}
	return dst
}

// reusable is MLC's test for taking a recycling sequence of length l over for a match of m
// tokens, m > 0.9 * l, in double precision as MLC computes it.
func reusable(m, l int) bool { return float64(m) > float64(l)*0.9 }

// shortestRecycling returns the sequence InsertSequence takes over when no sliding window is
// in play: the shortest recycling sequence with window w among the candidates of x (the
// first in candidate order among the shortest), provided it passes reusable(m, length); else
// nil.
//
// It walks the candidates in order but skips the nodes and subtrees that cannot improve on
// the best so far: those with nothing recycling, and those whose sequences (as long as the
// node's depth, or longer below it) are no shorter than the best or too long to pass the
// test. Skipping those that fail the test changes nothing: the test is monotone in the
// length, so if the shortest fails, every candidate does.
func shortestRecycling(x *node, m int, w Window) *entry {
	if x.rec == 0 {
		return nil
	}
	s := reuseSearch{w: w, limit: longestReusable(m)}
	s.look(x)
	if len(x.kids) > 0 && x.depth < s.limit { // a sequence below x is longer than x.depth
		s.walk(x)
	}
	return s.best
}

// longestReusable returns the greatest length l that passes reusable(m, l); m > 0. The test
// is monotone in l, so a length passes it exactly when it is at most that.
func longestReusable(m int) int {
	l := int(float64(m) / 0.9)
	for reusable(m, l+1) {
		l++
	}
	for !reusable(m, l) {
		l--
	}
	return l
}

// reuseSearch is the walk of shortestRecycling.
type reuseSearch struct {
	w     Window
	best  *entry
	limit int // the longest length that can still improve on best: it passes the test and is shorter
}

// look takes the first recycling sequence with window w at n if it improves on the best.
func (s *reuseSearch) look(n *node) {
	if n.own.rec == 0 || n.depth > s.limit {
		return
	}
	for i := len(n.seqs) - 1; i >= 0; i-- {
		if e := n.seqs[i].e; e.state == Recycling && e.window == s.w {
			s.best, s.limit = e, n.depth-1
			return // the others here are as long, and later
		}
	}
}

// walk looks below n in candidate order (see appendBelow), skipping the subtrees that hold
// nothing recycling or only sequences too long: those in c's subtree are c.depth long or
// longer.
func (s *reuseSearch) walk(n *node) {
	if n.kid1.rec > 0 {
		for i := len(n.kids) - 1; i >= 0; i-- {
			if c := n.kids[i]; c.onePage() {
				s.look(c)
			}
		}
	}
	for _, c := range n.kids {
		if c.rec == 0 || c.depth > s.limit {
			continue
		}
		if !c.onePage() {
			s.look(c)
		}
		if c.rec > c.own.rec && c.depth < s.limit {
			s.walk(c)
		}
	}
}

// firstPlain returns the first sequence without a sliding window among the candidates of x,
// in candidate order, or nil. It skips subtrees that hold none.
func firstPlain(x *node) *entry {
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
	var walk func(n *node) bool
	walk = func(n *node) bool {
		if n.kid1.plain > 0 {
			for i := len(n.kids) - 1; i >= 0; i-- {
				if c := n.kids[i]; c.onePage() && c.own.plain > 0 && !eachSeq(c, f) {
					return false
				}
			}
		}
		for _, c := range n.kids {
			if !c.onePage() && c.own.plain > 0 && !eachSeq(c, f) {
				return false
			}
			if c.plain > c.own.plain && !walk(c) {
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
