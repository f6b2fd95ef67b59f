package prefix

import (
	"bytes"
	"unsafe"
)

// indexAt is the child count above which a node indexes its children by first token;
// unindexAt is the count at or below which it drops the index again.
const (
	indexAt   = 8
	unindexAt = 4
)

// node is a node of the compressed radix tree. Every non-root node has a non-empty span, and
// holds a sequence or has at least two children; the root holds the sequences of length 0.
type node struct {
	// What a lookup reads comes first.

	// span is the edge into the node. Its spare capacity, if any, belongs to this node alone
	// (an upper half made by a split is capped with a full slice expression), so a leaf may
	// grow by append.
	span     []int32
	index    map[int32]*node // children by first token, when there are more than indexAt
	children []*node         // creation order
	seqs     []slot          // arrival order
	total    int32           // sequences in the subtree
	rec      int32           // recycling sequences in the subtree
	plain    int32           // sequences without a sliding window in the subtree
	id       NodeID
	depth    int
	parent   *node
	hits     uint64
	order    uint32 // sibling order; see Node.Order
	dirtyAt  int32  // index in Cache.dirty, or -1
	fresh    bool   // created since the last TakeChanges
}

// slot is a sequence at a node. The id sits beside the pointer so that listing candidates
// does not touch the entries.
type slot struct {
	id int64
	e  *entry
}

// nodeBox allocates a node with room for its first sequence, so that a leaf and the
// sequence it holds sit together: a lookup then touches one object fewer.
type nodeBox struct {
	node
	first [1]slot
}

func (c *Cache) newNode(parent *node, span []int32, depth int) *node {
	b := &nodeBox{node: node{id: c.nextID, order: uint32(c.nextID), parent: parent, span: span, depth: depth, dirtyAt: -1, fresh: true}}
	b.seqs = b.first[:0]
	n := &b.node
	c.nextID++
	if c.nextID == 0 {
		panic("prefix: node ids exhausted")
	}
	c.touch(n)
	return n
}

// touch records that n changed, for TakeChanges.
func (c *Cache) touch(n *node) {
	if n.dirtyAt < 0 {
		n.dirtyAt = int32(len(c.dirty))
		c.dirty = append(c.dirty, n)
	}
}

// kill records that n left the tree.
func (c *Cache) kill(n *node) {
	if i := n.dirtyAt; i >= 0 {
		last := len(c.dirty) - 1
		c.dirty[i] = c.dirty[last]
		c.dirty[i].dirtyAt = i
		c.dirty[last] = nil
		c.dirty = c.dirty[:last]
		n.dirtyAt = -1
	}
	if !n.fresh {
		c.removed = append(c.removed, n.id)
	}
	n.parent, n.children, n.index, n.span = nil, nil, nil, nil
}

func (n *node) child(tok int32) *node {
	if n.index != nil {
		return n.index[tok]
	}
	for _, ch := range n.children {
		if ch.span[0] == tok {
			return ch
		}
	}
	return nil
}

func (n *node) addChild(ch *node) {
	n.children = append(n.children, ch)
	if n.index != nil {
		n.index[ch.span[0]] = ch
	} else if len(n.children) > indexAt {
		n.index = make(map[int32]*node, len(n.children))
		for _, x := range n.children {
			n.index[x.span[0]] = x
		}
	}
}

// replaceChild puts nw in old's place; both start with the same token.
func (n *node) replaceChild(old, nw *node) {
	for i, ch := range n.children {
		if ch == old {
			n.children[i] = nw
			if n.index != nil {
				n.index[nw.span[0]] = nw
			}
			return
		}
	}
	panic("prefix: replaceChild: not a child")
}

func (n *node) removeChild(old *node) {
	for i, ch := range n.children {
		if ch == old {
			copy(n.children[i:], n.children[i+1:])
			n.children[len(n.children)-1] = nil
			n.children = n.children[:len(n.children)-1]
			if len(n.children) == 0 {
				n.children = nil
			}
			if n.index != nil {
				delete(n.index, old.span[0])
				if len(n.children) <= unindexAt {
					n.index = nil
				}
			}
			return
		}
	}
	panic("prefix: removeChild: not a child")
}

// match finds the longest common prefix m of q with the tree, and the node x holding the
// m-th token (the root when m is 0).
func (c *Cache) match(q []int32) (x *node, m int) {
	n := c.root
	for m < len(q) {
		ch := n.child(q[m])
		if ch == nil {
			break
		}
		l := lcp(ch.span, q[m:])
		m += l
		if l < len(ch.span) {
			return ch, m
		}
		n = ch
	}
	return n, m
}

// nodeAt returns the node ending at depth d on the path to x, splitting a node when d falls
// inside its span. 0 <= d <= x.depth.
func (c *Cache) nodeAt(x *node, d int) *node {
	for x.parent != nil && x.parent.depth >= d {
		x = x.parent
	}
	if x.depth == d {
		return x
	}
	return c.split(x, d-x.parent.depth)
}

// split cuts n's span after k tokens (0 < k < len(n.span)) and returns the new upper node,
// which takes n's place (and order) under n's parent; n keeps its id, its sequences and its
// children.
func (c *Cache) split(n *node, k int) *node {
	p := n.parent
	u := c.newNode(p, n.span[:k:k], p.depth+k)
	u.order = n.order
	u.total, u.rec, u.plain, u.hits = n.total, n.rec, n.plain, n.hits
	u.children = []*node{n}
	p.replaceChild(n, u)
	n.span = n.span[k:]
	n.parent = u
	c.touch(n)
	return u
}

// merge folds n, which holds no sequence and has one child, into that child.
func (c *Cache) merge(n *node) {
	ch := n.children[0]
	span := make([]int32, len(n.span)+len(ch.span))
	copy(span, n.span)
	copy(span[len(n.span):], ch.span)
	ch.span = span
	ch.parent = n.parent
	ch.order = n.order
	ch.hits = max(ch.hits, n.hits)
	n.parent.replaceChild(n, ch)
	c.kill(n)
	c.touch(ch)
}

// prune restores the tree's shape after a sequence left n: it deletes empty leaves upward and
// merges a node left with no sequence and one child.
func (c *Cache) prune(n *node) {
	for n != c.root && len(n.seqs) == 0 {
		switch len(n.children) {
		case 0:
			p := n.parent
			p.removeChild(n)
			c.kill(n)
			n = p
		case 1:
			c.merge(n)
			return
		default:
			return
		}
	}
}

// attach puts e at n, the last to arrive there.
func (c *Cache) attach(e *entry, n *node) {
	e.node = n
	n.seqs = append(n.seqs, slot{e.id, e})
	c.count(n, 1, e)
	c.touch(n)
}

// detach takes e off its node (the caller prunes).
func (c *Cache) detach(e *entry) {
	n := e.node
	for i, x := range n.seqs {
		if x.e == e {
			copy(n.seqs[i:], n.seqs[i+1:])
			n.seqs[len(n.seqs)-1] = slot{}
			n.seqs = n.seqs[:len(n.seqs)-1]
			break
		}
	}
	if len(n.seqs) == 0 && cap(n.seqs) > 4 {
		n.seqs = nil // a crowd has left; a small array stays for the next arrival
	}
	c.count(n, -1, e)
	c.touch(n)
	e.node = nil
}

// count adds d sequences like e to the subtree counts of n and its ancestors.
func (c *Cache) count(n *node, d int32, e *entry) {
	var r, p int32
	if e.state == Recycling {
		r = d
	}
	if e.window.Size == -1 {
		p = d
	}
	for ; n != nil; n = n.parent {
		n.total += d
		n.rec += r
		n.plain += p
	}
}

// extend appends t to e's tokens. t is the cache's own copy; it may become a node's span.
func (c *Cache) extend(e *entry, t []int32) {
	a := e.node
	if a != c.root && len(a.children) == 0 && len(a.seqs) == 1 {
		// e alone at a leaf: the leaf grows.
		a.span = append(a.span, t...)
		a.depth += len(t)
		c.touch(a)
		return
	}
	n, i := a, 0
	for i < len(t) {
		ch := n.child(t[i])
		if ch == nil {
			rest := t[i:] // the copy's capacity past its end is free for this node to grow into
			if 2*len(rest) < len(t) {
				// Do not keep a mostly matched copy alive for its tail.
				rest = append([]int32(nil), rest...)
			}
			ch = c.newNode(n, rest, n.depth+len(rest))
			n.addChild(ch)
			n = ch
			break
		}
		l := lcp(ch.span, t[i:])
		if l < len(ch.span) {
			ch = c.split(ch, l)
		}
		n, i = ch, i+l
	}
	c.detach(e)
	c.attach(e, n)
	c.prune(a)
}

// rollBack drops the last k tokens of e (0 <= k <= its length).
func (c *Cache) rollBack(e *entry, k int) {
	if k == 0 {
		return
	}
	a := e.node
	t := c.nodeAt(a, a.depth-k)
	c.detach(e)
	c.attach(e, t)
	c.prune(a)
}

// appendIDs appends the sequences of x's subtree in candidate order: depth first, children
// in creation order, and within a node the most recently arrived first.
func appendIDs(dst []int64, x *node) []int64 {
	for i := len(x.seqs) - 1; i >= 0; i-- {
		dst = append(dst, x.seqs[i].id)
	}
	for _, ch := range x.children {
		dst = appendIDs(dst, ch)
	}
	return dst
}

// findReuse returns the sequence InsertSequence takes over when no sliding window is in play:
// the shortest recycling sequence with window w in x's subtree (the first in candidate order
// among the shortest), provided m > 0.9 * its length; else nil. It visits only subtrees that
// hold a recycling sequence short enough to pass the test and shorter than the best so far.
func (c *Cache) findReuse(x *node, m int, w Window) *entry {
	var best *entry
	var visit func(n *node)
	visit = func(n *node) {
		if n.rec == 0 || 9*n.depth >= 10*m || (best != nil && n.depth >= best.node.depth) {
			return
		}
		for i := len(n.seqs) - 1; i >= 0; i-- {
			if e := n.seqs[i].e; e.state == Recycling && e.window == w {
				best = e
				return // every sequence below is longer
			}
		}
		for _, ch := range n.children {
			visit(ch)
		}
	}
	visit(x)
	return best
}

// firstPlain returns the first sequence without a sliding window in x's subtree, in candidate
// order, or nil.
func firstPlain(x *node) *entry {
	for x.plain > 0 {
		for i := len(x.seqs) - 1; i >= 0; i-- {
			if e := x.seqs[i].e; e.window.Size == -1 {
				return e
			}
		}
		next := x
		for _, ch := range x.children {
			if ch.plain > 0 {
				next = ch
				break
			}
		}
		if next == x {
			panic("prefix: plain count out of step")
		}
		x = next
	}
	return nil
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
