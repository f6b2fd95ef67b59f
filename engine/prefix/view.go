package prefix

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvtop/kvtop/internal/invariants"
)

func (c *Cache) snapshot(n *node) Node {
	s := Node{ID: n.id, Order: n.order, Depth: n.depth, Span: len(n.span), Hits: n.hits}
	if n.parent != nil {
		s.Parent = n.parent.id
	}
	if len(n.seqs) > 0 {
		s.Seqs = make([]SeqRef, len(n.seqs))
		for i, x := range n.seqs {
			s.Seqs[i] = SeqRef{x.id, x.e.state}
		}
	}
	return s
}

// Nodes returns the whole tree, depth first in pre-order, children in creation order, the
// root first.
func (c *Cache) Nodes() []Node {
	var out []Node
	var visit func(n *node)
	visit = func(n *node) {
		out = append(out, c.snapshot(n))
		for _, ch := range n.children {
			visit(ch)
		}
	}
	visit(c.root)
	return out
}

// TakeChanges returns the nodes created or modified since the last call (as they are now)
// and the nodes deleted since, both in ascending id order; a node both created and deleted
// since the last call is in neither list. The first call returns the root among the
// upserted. Applying the two lists, by ID, to a Nodes() taken at any time since the last call
// gives the current Nodes(); sorting each node's children by Order gives its order.
//
// The cache keeps the changes until they are taken: at most one entry per live node, plus
// one per node that existed at the last call.
func (c *Cache) TakeChanges() (upserted []Node, removed []NodeID) {
	if len(c.dirty) > 0 {
		upserted = make([]Node, len(c.dirty))
		for i, n := range c.dirty {
			upserted[i] = c.snapshot(n)
			n.dirtyAt, n.fresh = -1, false
		}
		clear(c.dirty)
		c.dirty = c.dirty[:0]
		slices.SortFunc(upserted, func(a, b Node) int { return cmpID(a.ID, b.ID) })
	}
	if len(c.removed) > 0 {
		removed = c.removed
		c.removed = nil
		slices.Sort(removed)
	}
	return upserted, removed
}

func cmpID(a, b NodeID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Describe returns the tree as text, one node a line, indented by depth in the tree:
//
//	#id +span =depth [seq:state ...] hits=n
//
// with the sequences in arrival order. Tests and debugging use it.
func (c *Cache) Describe() string {
	var b strings.Builder
	var visit func(n *node, indent int)
	visit = func(n *node, indent int) {
		fmt.Fprintf(&b, "%s#%d +%d =%d [", strings.Repeat("  ", indent), n.id, len(n.span), n.depth)
		for i, x := range n.seqs {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d:%s", x.id, x.e.state)
		}
		fmt.Fprintf(&b, "] hits=%d\n", n.hits)
		for _, ch := range n.children {
			visit(ch, indent+1)
		}
	}
	visit(c.root, 0)
	return b.String()
}

func (c *Cache) check() {
	if invariants.Enabled {
		if err := c.Check(); err != nil {
			panic(err)
		}
	}
}

// Check verifies the cache's invariants and returns the first violation: the tree is
// compressed (every non-root node has a span and holds a sequence or has two children or
// more), depths add up, siblings start with distinct tokens and are in Order, the child
// indexes and the subtree counts are right, every sequence sits in exactly one node, and the
// recycling list holds exactly the recycling sequences.
func (c *Cache) Check() error {
	if c.root.id != 0 || c.root.parent != nil || c.root.depth != 0 || len(c.root.span) != 0 {
		return fmt.Errorf("prefix: check: bad root")
	}
	seen := 0
	var visit func(n *node) error
	visit = func(n *node) error {
		if n.id >= c.nextID {
			return fmt.Errorf("prefix: check: node %d: id beyond %d", n.id, c.nextID)
		}
		if n != c.root {
			switch {
			case len(n.span) == 0:
				return fmt.Errorf("prefix: check: node %d: empty span", n.id)
			case n.depth != n.parent.depth+len(n.span):
				return fmt.Errorf("prefix: check: node %d: depth %d, parent depth %d + span %d", n.id, n.depth, n.parent.depth, len(n.span))
			case len(n.seqs) == 0 && len(n.children) == 0:
				return fmt.Errorf("prefix: check: node %d: empty leaf", n.id)
			case len(n.seqs) == 0 && len(n.children) == 1:
				return fmt.Errorf("prefix: check: node %d: no sequence and one child", n.id)
			}
		}
		if n.dirtyAt >= 0 && (int(n.dirtyAt) >= len(c.dirty) || c.dirty[n.dirtyAt] != n) {
			return fmt.Errorf("prefix: check: node %d: dirty index %d out of step", n.id, n.dirtyAt)
		}
		if n.fresh && n.dirtyAt < 0 {
			return fmt.Errorf("prefix: check: node %d: created but not recorded", n.id)
		}
		var total, rec, plain int32
		for _, x := range n.seqs {
			e := x.e
			if e.node != n || c.seqs[e.id] != e || x.id != e.id {
				return fmt.Errorf("prefix: check: node %d: sequence %d out of step", n.id, e.id)
			}
			seen++
			total++
			if e.state == Recycling {
				rec++
			}
			if e.window.Size == -1 {
				plain++
			}
		}
		if len(n.children) > indexAt && n.index == nil {
			return fmt.Errorf("prefix: check: node %d: %d children, no index", n.id, len(n.children))
		}
		if n.index != nil && len(n.index) != len(n.children) {
			return fmt.Errorf("prefix: check: node %d: index of %d for %d children", n.id, len(n.index), len(n.children))
		}
		firsts := make(map[int32]bool, len(n.children))
		for i, ch := range n.children {
			if ch.parent != n {
				return fmt.Errorf("prefix: check: node %d: child %d has parent %v", n.id, ch.id, ch.parent)
			}
			if len(ch.span) > 0 {
				if firsts[ch.span[0]] {
					return fmt.Errorf("prefix: check: node %d: two children start with %d", n.id, ch.span[0])
				}
				firsts[ch.span[0]] = true
				if n.index != nil && n.index[ch.span[0]] != ch {
					return fmt.Errorf("prefix: check: node %d: index out of step for %d", n.id, ch.span[0])
				}
			}
			if i > 0 && n.children[i-1].order >= ch.order {
				return fmt.Errorf("prefix: check: node %d: children %d and %d out of order", n.id, n.children[i-1].id, ch.id)
			}
			if err := visit(ch); err != nil {
				return err
			}
			total += ch.total
			rec += ch.rec
			plain += ch.plain
		}
		if total != n.total || rec != n.rec || plain != n.plain {
			return fmt.Errorf("prefix: check: node %d: counts %d/%d/%d, want %d/%d/%d", n.id, n.total, n.rec, n.plain, total, rec, plain)
		}
		return nil
	}
	if err := visit(c.root); err != nil {
		return err
	}
	if seen != len(c.seqs) {
		return fmt.Errorf("prefix: check: %d sequences in the tree, %d held", seen, len(c.seqs))
	}
	n := 0
	for e := c.recHead; e != nil; e = e.next {
		if e.state != Recycling || c.seqs[e.id] != e || (e.next == nil) != (e == c.recTail) || (e.next != nil && e.next.prev != e) {
			return fmt.Errorf("prefix: check: recycling list broken at %d", e.id)
		}
		n++
	}
	if n != c.numRec || int32(n) != c.root.rec {
		return fmt.Errorf("prefix: check: %d in the recycling list, count %d, root %d", n, c.numRec, c.root.rec)
	}
	for _, n := range c.dirty {
		if n.span == nil && n != c.root {
			return fmt.Errorf("prefix: check: dead node %d recorded as changed", n.id)
		}
	}
	return nil
}
