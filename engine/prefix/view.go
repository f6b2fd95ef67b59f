package prefix

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvtop/kvtop/internal/invariants"
)

// order is a page's Node.Order. Siblings are listed newest first and a page never moves
// among its siblings, so the newer page (the larger id) sorts first.
func order(id NodeID) uint32 { return math.MaxUint32 - uint32(id) }

func snapshot(p *page) Node {
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
	var visit func(p *page)
	visit = func(p *page) {
		out = append(out, snapshot(p))
		for k := p.first; k != nil; k = k.next {
			visit(k)
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

// Describe returns the tree as text, one page a line, indented by depth in the tree,
// children newest first:
//
//	#id +span =depth [seq:state ...] hits=n
//
// with the sequences in arrival order. Tests and debugging use it.
func (c *Cache) Describe() string {
	var b strings.Builder
	var visit func(p *page, indent int)
	visit = func(p *page, indent int) {
		fmt.Fprintf(&b, "%s#%d +%d =%d [", strings.Repeat("  ", indent), p.id, len(p.toks), p.depth)
		for i, x := range p.seqs {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d:%s", x.id, x.e.state)
		}
		fmt.Fprintf(&b, "] hits=%d\n", p.hits)
		for k := p.first; k != nil; k = k.next {
			visit(k, indent+1)
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

// Check verifies the cache's invariants and returns the first violation: every page but the
// root holds 1 to 64 tokens and a sequence or a child, depths add up, the child lists are
// well linked, newest first, with distinct first tokens and a right index, the subtree
// counts are right, every sequence sits in exactly one page, and the recycling bookkeeping
// (stamps, the least-recently-recycled list, the emulated map) holds exactly the recycling
// sequences.
func (c *Cache) Check() error {
	t := &c.t
	if t.root.id != 0 || t.root.parent != nil || t.root.depth != 0 || len(t.root.toks) != 0 {
		return fmt.Errorf("prefix: check: bad root")
	}
	seen := 0
	var visit func(p *page) error
	visit = func(p *page) error {
		if p.id >= t.nextID {
			return fmt.Errorf("prefix: check: page %d: id beyond %d", p.id, t.nextID)
		}
		if p != t.root {
			switch {
			case len(p.toks) == 0 || len(p.toks) > t.cap:
				return fmt.Errorf("prefix: check: page %d: %d tokens", p.id, len(p.toks))
			case p.depth != p.parent.depth+len(p.toks):
				return fmt.Errorf("prefix: check: page %d: depth %d, parent depth %d + %d tokens", p.id, p.depth, p.parent.depth, len(p.toks))
			case len(p.seqs) == 0 && p.kids == 0:
				return fmt.Errorf("prefix: check: page %d: empty leaf", p.id)
			}
		}
		if p.dirtyAt >= 0 && (int(p.dirtyAt) >= len(t.dirty) || t.dirty[p.dirtyAt] != p) {
			return fmt.Errorf("prefix: check: page %d: dirty index %d out of step", p.id, p.dirtyAt)
		}
		if p.fresh && p.dirtyAt < 0 {
			return fmt.Errorf("prefix: check: page %d: created but not recorded", p.id)
		}
		var total, rec, plain int32
		for _, x := range p.seqs {
			e := x.e
			if e.page != p || c.seqs[e.id] != e || x.id != e.id {
				return fmt.Errorf("prefix: check: page %d: sequence %d out of step", p.id, e.id)
			}
			if (e.state == Active) != (e.stamp == 0) {
				return fmt.Errorf("prefix: check: page %d: %d %v with stamp %d", p.id, e.id, e.state, e.stamp)
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
		if p.kids > indexAt && p.index == nil {
			return fmt.Errorf("prefix: check: page %d: %d children, no index", p.id, p.kids)
		}
		if p.index != nil && len(p.index) != int(p.kids) {
			return fmt.Errorf("prefix: check: page %d: index of %d for %d children", p.id, len(p.index), p.kids)
		}
		firsts := make(map[int32]bool, p.kids)
		n := int32(0)
		var prev *page
		for k := p.first; k != nil; prev, k = k, k.next {
			n++
			if k.parent != p || k.prev != prev {
				return fmt.Errorf("prefix: check: page %d: child %d badly linked", p.id, k.id)
			}
			if prev != nil && prev.id <= k.id {
				return fmt.Errorf("prefix: check: page %d: children %d and %d not newest first", p.id, prev.id, k.id)
			}
			if len(k.toks) > 0 {
				if firsts[k.toks[0]] {
					return fmt.Errorf("prefix: check: page %d: two children start with %d", p.id, k.toks[0])
				}
				firsts[k.toks[0]] = true
				if p.index != nil && p.index[k.toks[0]] != k {
					return fmt.Errorf("prefix: check: page %d: index out of step for %d", p.id, k.toks[0])
				}
			}
			if err := visit(k); err != nil {
				return err
			}
			total += k.total
			rec += k.rec
			plain += k.plain
		}
		if n != p.kids || p.last != prev {
			return fmt.Errorf("prefix: check: page %d: %d children listed, count %d, last %v", p.id, n, p.kids, p.last)
		}
		var ownRec, ownPlain, kidRec, kidPlain int32
		for _, x := range p.seqs {
			if x.e.state == Recycling {
				ownRec++
			}
			if x.e.window.Size == -1 {
				ownPlain++
			}
		}
		for k := p.first; k != nil; k = k.next {
			kidRec += k.ownRec
			kidPlain += k.ownPlain
		}
		if ownRec != p.ownRec || ownPlain != p.ownPlain || kidRec != p.kidRec || kidPlain != p.kidPlain {
			return fmt.Errorf("prefix: check: page %d: own counts %d/%d, children's %d/%d, want %d/%d, %d/%d", p.id, p.ownRec, p.ownPlain, p.kidRec, p.kidPlain, ownRec, ownPlain, kidRec, kidPlain)
		}
		if len(p.seqs) <= 1 && cap(p.seqs) == 1 && &p.seqs[:1][0] != &p.inline[0] {
			return fmt.Errorf("prefix: check: page %d: holds another page's array", p.id)
		}
		if total != p.total || rec != p.rec || plain != p.plain {
			return fmt.Errorf("prefix: check: page %d: counts %d/%d/%d, want %d/%d/%d", p.id, p.total, p.rec, p.plain, total, rec, plain)
		}
		return nil
	}
	if err := visit(t.root); err != nil {
		return err
	}
	if seen != len(c.seqs) {
		return fmt.Errorf("prefix: check: %d sequences in the tree, %d held", seen, len(c.seqs))
	}
	if err := c.checkRecycling(); err != nil {
		return err
	}
	for _, p := range t.dirty {
		if p.toks == nil && p != t.root {
			return fmt.Errorf("prefix: check: dead page %d recorded as changed", p.id)
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
