package prefix

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvtop/kvtop/internal/invariants"
)

// order is a node's Node.Order. Siblings are listed newest first and a node never moves
// among its siblings, so the newer node (the larger id) sorts first.
func order(id NodeID) uint32 { return math.MaxUint32 - uint32(id) }

func snapshot(p *node) Node {
	s := Node{ID: p.id, Order: order(p.id), Depth: p.depth, Span: len(p.toks), Hits: p.hits}
	if p.parent != nil {
		s.Parent = p.parent.id
	}
	if len(p.seqs) > 0 {
		s.Seqs = make([]SeqRef, len(p.seqs))
		for i, x := range p.seqs {
			s.Seqs[i] = SeqRef{x.id, x.e.state}
		}
	}
	return s
}

// Nodes returns the whole tree, depth first in pre-order, children newest first (MLC's list
// order), the root first.
func (c *Cache) Nodes() []Node {
	var out []Node
	var visit func(p *node)
	visit = func(p *node) {
		out = append(out, snapshot(p))
		for i := len(p.kids) - 1; i >= 0; i-- {
			visit(p.kids[i])
		}
	}
	visit(c.t.root)
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
	t := &c.t
	if len(t.dirty) > 0 {
		upserted = make([]Node, len(t.dirty))
		for i, p := range t.dirty {
			upserted[i] = snapshot(p)
			p.dirtyAt, p.fresh = -1, false
		}
		clear(t.dirty)
		t.dirty = t.dirty[:0]
		slices.SortFunc(upserted, func(a, b Node) int { return cmpID(a.ID, b.ID) })
	}
	if len(t.removed) > 0 {
		removed = t.removed
		t.removed = nil
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

// Describe returns the tree as text, one node a line, indented by depth in the tree,
// children newest first:
//
//	#id +span =depth [seq:state ...] hits=n
//
// with the sequences in arrival order, and, for a node of several radix pages, their
// lengths after the span (+150/64,64,22). Tests and debugging use it.
func (c *Cache) Describe() string {
	var b strings.Builder
	var visit func(p *node, indent int)
	visit = func(p *node, indent int) {
		fmt.Fprintf(&b, "%s#%d +%d", strings.Repeat("  ", indent), p.id, len(p.toks))
		if p.pages() > 1 {
			for i := range p.pages() {
				sep := ","
				if i == 0 {
					sep = "/"
				}
				fmt.Fprintf(&b, "%s%d", sep, p.end(i)-p.start(i))
			}
		}
		fmt.Fprintf(&b, " =%d [", p.depth)
		for i, x := range p.seqs {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d:%s", x.id, x.e.state)
		}
		fmt.Fprintf(&b, "] hits=%d\n", p.hits)
		for i := len(p.kids) - 1; i >= 0; i-- {
			visit(p.kids[i], indent+1)
		}
	}
	visit(c.t.root, 0)
	return b.String()
}

func (c *Cache) check() {
	if invariants.Enabled {
		if err := c.Check(); err != nil {
			panic(err)
		}
	}
}

// Check verifies the cache's invariants and returns the first violation: every node but the
// root is a maximal chain of pages of 1 to 64 tokens (it holds a sequence or has two children
// or more), depths add up, the children are in order (the newest last), with distinct first
// tokens and a right index, the counts are right, every sequence sits in exactly one node,
// the sequences in the lookup table are held and in their slots, so is one with a pending
// extension unless it has left the tree, and the recycling bookkeeping (stamps, the
// least-recently-recycled list, the emulated map) holds exactly the recycling sequences.
func (c *Cache) Check() error {
	t := &c.t
	if t.root.id != 0 || t.root.parent != nil || t.root.depth != 0 || len(t.root.toks) != 0 {
		return fmt.Errorf("prefix: check: bad root")
	}
	seen := 0
	var visit func(p *node) error
	visit = func(p *node) error {
		if p.id >= t.nextID {
			return fmt.Errorf("prefix: check: node %d: id beyond %d", p.id, t.nextID)
		}
		if p != t.root {
			switch {
			case len(p.toks) == 0 || p.ends != nil && (len(p.ends) == 0 || int(p.ends[len(p.ends)-1]) != len(p.toks)):
				return fmt.Errorf("prefix: check: node %d: %d tokens, pages ending at %v", p.id, len(p.toks), p.ends)
			case int(p.pageCap) != t.cap || p.npages != countPages(p.toks, p.ends, t.cap):
				return fmt.Errorf("prefix: check: node %d: %d pages of %d, the tree's of %d", p.id, p.npages, p.pageCap, t.cap)
			case p.depth != p.parent.depth+len(p.toks):
				return fmt.Errorf("prefix: check: node %d: depth %d, parent depth %d + %d tokens", p.id, p.depth, p.parent.depth, len(p.toks))
			case len(p.seqs) == 0 && len(p.kids) < 2:
				return fmt.Errorf("prefix: check: node %d: %d children and no sequence", p.id, len(p.kids))
			}
			for i := range p.pages() {
				if l := p.end(i) - p.start(i); l < 1 || l > t.cap {
					return fmt.Errorf("prefix: check: node %d: node %d of %d tokens", p.id, i, l)
				}
			}
		} else if len(p.toks) != 0 || p.ends != nil || p.npages != 0 {
			return fmt.Errorf("prefix: check: the root holds tokens")
		}
		if p.dirtyAt >= 0 && (int(p.dirtyAt) >= len(t.dirty) || t.dirty[p.dirtyAt] != p) {
			return fmt.Errorf("prefix: check: node %d: dirty index %d out of step", p.id, p.dirtyAt)
		}
		if p.fresh && p.dirtyAt < 0 {
			return fmt.Errorf("prefix: check: node %d: created but not recorded", p.id)
		}
		var total, rec, plain int32
		for _, x := range p.seqs {
			e := x.e
			if e.node != p || c.seqs[e.id] != e || x.id != e.id {
				return fmt.Errorf("prefix: check: node %d: sequence %d out of step", p.id, e.id)
			}
			if (e.state == Active) != (e.stamp == 0) {
				return fmt.Errorf("prefix: check: node %d: %d %v with stamp %d", p.id, e.id, e.state, e.stamp)
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
		if len(p.kids) > indexAt && p.index == nil {
			return fmt.Errorf("prefix: check: node %d: %d children, no index", p.id, len(p.kids))
		}
		if p.index != nil && len(p.index) != len(p.kids) {
			return fmt.Errorf("prefix: check: node %d: index of %d for %d children", p.id, len(p.index), len(p.kids))
		}
		firsts := make(map[int32]bool, len(p.kids))
		for i, k := range p.kids {
			if k.parent != p {
				return fmt.Errorf("prefix: check: node %d: child %d has parent %v", p.id, k.id, k.parent)
			}
			if i > 0 && p.kids[i-1].id >= k.id {
				return fmt.Errorf("prefix: check: node %d: children %d and %d not oldest first", p.id, p.kids[i-1].id, k.id)
			}
			if len(k.toks) > 0 {
				if firsts[k.toks[0]] {
					return fmt.Errorf("prefix: check: node %d: two children start with %d", p.id, k.toks[0])
				}
				firsts[k.toks[0]] = true
				if p.index != nil && p.index[k.toks[0]] != k {
					return fmt.Errorf("prefix: check: node %d: index out of step for %d", p.id, k.toks[0])
				}
			}
			if err := visit(k); err != nil {
				return err
			}
			total += k.total
			rec += k.rec
			plain += k.plain
		}
		var own, kid1 counts
		for _, x := range p.seqs {
			own.seqs++
			if x.e.state == Recycling {
				own.rec++
			}
			if x.e.window.Size == -1 {
				own.plain++
			}
		}
		for _, k := range p.kids {
			if k.onePage() {
				kid1 = kid1.plus(k.own)
			}
		}
		if own != p.own || kid1 != p.kid1 {
			return fmt.Errorf("prefix: check: node %d: own counts %+v, one-page children's %+v, want %+v, %+v", p.id, p.own, p.kid1, own, kid1)
		}
		if len(p.seqs) <= 1 && cap(p.seqs) == 1 && &p.seqs[:1][0] != &p.inline[0] {
			return fmt.Errorf("prefix: check: node %d: holds another page's array", p.id)
		}
		if total != p.total || rec != p.rec || plain != p.plain {
			return fmt.Errorf("prefix: check: node %d: counts %d/%d/%d, want %d/%d/%d", p.id, p.total, p.rec, p.plain, total, rec, plain)
		}
		return nil
	}
	if err := visit(t.root); err != nil {
		return err
	}
	if seen != len(c.seqs) {
		return fmt.Errorf("prefix: check: %d sequences in the tree, %d held", seen, len(c.seqs))
	}
	for i, e := range c.recent {
		if e != nil && (c.seqs[e.id] != e || c.slot(e.id) != i) {
			return fmt.Errorf("prefix: check: slot %d of the lookup table holds %d, not held there", i, e.id)
		}
	}
	for _, p := range c.pending {
		if p.e.node != nil && c.seqs[p.e.id] != p.e {
			return fmt.Errorf("prefix: check: pending extension of %d, in the tree but not held", p.e.id)
		}
	}
	if err := c.checkRecycling(); err != nil {
		return err
	}
	for _, p := range t.dirty {
		if p.toks == nil && p != t.root {
			return fmt.Errorf("prefix: check: dead node %d recorded as changed", p.id)
		}
	}
	return nil
}

func (c *Cache) checkRecycling() error {
	r := &c.rec
	n := 0
	var last uint64
	for e := r.head; e != nil; e = e.next {
		if e.state != Recycling || c.seqs[e.id] != e || (e.next == nil) != (e == r.tail) || (e.next != nil && e.next.prev != e) {
			return fmt.Errorf("prefix: check: recycling list broken at %d", e.id)
		}
		if e.stamp <= last || e.stamp > r.counter {
			return fmt.Errorf("prefix: check: recycling list: %d stamped %d after %d (counter %d)", e.id, e.stamp, last, r.counter)
		}
		if r.order == EvictMLC {
			if id, ok := r.mlc.Get(e.stamp); !ok || id != e.id {
				return fmt.Errorf("prefix: check: %d stamped %d is not in the eviction map", e.id, e.stamp)
			}
		}
		last = e.stamp
		n++
	}
	if n != r.n || int32(n) != c.t.root.rec {
		return fmt.Errorf("prefix: check: %d in the recycling list, count %d, tree %d", n, r.n, c.t.root.rec)
	}
	if m := r.mlc.Len(); (r.order == EvictMLC && m != n) || (r.order != EvictMLC && m != 0) {
		return fmt.Errorf("prefix: check: eviction map of %d for %d recycling", m, n)
	}
	return nil
}
