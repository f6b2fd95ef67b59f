// Package prefix is the prefix cache of a decode instance: a radix tree over int32 token ids
// that records which token sequence every cached KV sequence holds, whether that sequence is
// active (its request is alive) or recycling (finished, kept for reuse), and how a new prompt
// should start: as a new sequence, as a fork of a cached one, or by taking a recycling one over.
//
// It reproduces MLC LLM's PrefixCache (cpp/serve/prefix_cache.cc) over its PagedRadixTree
// (cpp/serve/radix_tree.cc), with the same seam: the tree (tree.go) knows pages, matching,
// splits, merges and the order of candidates, and answers questions; the Cache (prefix.go,
// evict.go) knows which sequences are active or recycling, and decides what a new request
// reuses or forks and what is evicted. The tree is laid out in MLC's radix pages, because
// the order in which MLC lists candidates, and so which sequence it forks from or takes over,
// depends on that layout. Eviction follows MLC's order by default, and the least recently
// recycled first as an option (Config.Evict).
//
// # Usage
//
//	c := prefix.New(prefix.Config{Mode: prefix.Radix, MaxRecycling: 4,
//		OnEvict: func(ev prefix.Eviction) { kv.RemoveSequence(ev.Seq) }})
//
//	// prepare-receive: tokens is prompt[0:end).
//	res, err := c.InsertSequence(id, tokens, prefix.NoWindow)
//	seq := id
//	switch res.Kind {
//	case prefix.Fresh: // add a new, empty KV sequence id
//	case prefix.Fork: // fork KV sequence res.Parent into id at res.Offset
//	case prefix.Reuse: // adopt res.Parent in place of id; pop res.Pop tokens from its KV
//		seq = res.Parent
//	}
//	c.ExtendSequence(seq, tokens[res.Offset:]) // after the step; applied at the next commit
//
//	c.RecycleSequence(seq) // the request finished
//	c.TryFreeMemory()      // the engine needs pages: evicts one recycling sequence
//
// InsertSequence(id, tokens, w) commits pending extensions, drops the last token of tokens
// (it is never matched), finds the longest common prefix m of the rest with the tree and the
// set S of cached sequences that contain it, then:
//
//   - m == 0: id is added, active, holding nothing: Fresh, Offset 0.
//   - no sliding window (w.Size == -1): among the recycling sequences of S whose Window equals
//     w, take the shortest (the first in S's order among equals). If m > 0.9*len (computed
//     in double precision, as MLC does), Reuse it: it becomes active, its last len-m tokens
//     are rolled back, and id is not added. Otherwise Fork from the first sequence of S with
//     no sliding window, active or recycling: id is added holding the first m tokens. If S has
//     none, id is added as Fresh with Offset 0.
//   - with a sliding window: Reuse a recycling sequence of S whose Window equals w and whose
//     length is exactly m (Pop 0), the first in S's order; never Fork; else Fresh, Offset 0.
//
// # Radix pages and the order of S
//
// The order of S is the order of MLC's PagedRadixTree::MatchPrefix, which follows from how
// MLC lays its tree out; the Cache lays it out the same way:
//
//   - The tree is made of radix pages of at most 64 tokens (the root holds none); a long
//     edge is a chain of pages. A page keeps the sequences that end exactly at its end as a
//     list, newest first, and its children as a list, newest first: a sequence, or a new
//     page, is pushed to the front. A page keeps its place in its parent's list for life.
//   - A sequence arrives at a page, and so goes to the front of its list, when it is added
//     there (a fresh sequence at the root, a fork at the page where the fork point lies),
//     when it is extended (ExtendSequence takes it off its page and pushes it onto the page
//     where its new end lies; an empty extension pushes it back onto the same page), and when
//     it is rolled back.
//   - A page is split where new tokens diverge inside it, or where a fork or a roll-back ends
//     inside it: the upper part stays in place and the lower part, its only child, takes the
//     page's sequences and children. A page with no sequence and exactly one child, when the
//     two fit in one page, is merged with it, the upper page absorbing the child; MLC checks
//     for that after a split (the lower part, and the upper part's parent), after an
//     extension (the page the sequence left) and after a removal (the first page left
//     standing), not after a roll-back. A leaf page with no sequence is extended in place, up
//     to 64 tokens, before new pages are chained below it.
//
// The Cache keeps MLC's pages but stores a maximal chain of them (every page but the last
// holding no sequence and having the next as its only child) as one node, so that its tree
// has the shape of a compressed radix tree; Nodes and TakeChanges report those nodes, and
// Describe shows where their pages end.
//
// Matching walks from the root, child by first token, and stops in the page X where the
// common prefix ends (inside it, or at its end when no child continues). S is X's own
// sequences, in list order, then visit(X's first child), where visit(p) is p's sequences,
// then visit(p's next sibling), then visit(p's first child). So for children c1, c2, c3 of
// X, newest first: the sequences of c1, c2, c3, then, below c3, below c2, below c1, each by
// the same rule. In nodes: a child node of one page has its sequences listed with its
// siblings', a child node of several pages only when the walk goes below its first page.
// Without a tree this order has no simple description: it depends on which pages exist,
// which is why the Cache reproduces the layout and not just the matching.
//
// The searches are pruned: every node counts the sequences, the recycling sequences and the
// sequences without a sliding window in its subtree and among its one-page children, so the
// reuse search skips subtrees with nothing recycling, or whose sequences are all too long to
// pass the 0.9 test (a sequence ending in a node is as long as the node's depth) or no
// shorter than the best so far, and the fork search skips subtrees holding no sequence it may
// fork from; neither lists the candidates, as MLC does on every insertion.
//
// # Eviction
//
// Every RecycleSequence stamps the sequence with the next value of a counter (1, 2, 3, …).
// TryFreeMemory evicts one recycling sequence, in the order Config.Evict names:
//
//   - EvictMLC (the default): MLC stores stamp → sequence in a libstdc++
//     std::unordered_map<size_t, int64_t> and evicts the entry at its begin(). Package
//     stdmap reproduces that map's iteration order. It is not the stamps' order: while the
//     stamps held fall in distinct buckets (stamp mod 13 at first), each new one goes to the
//     front, so the most recently recycled sequence is evicted first.
//   - EvictLRU: the least recently recycled first, what MLC's comment promises.
//
// Reusing a recycling sequence removes its stamp; recycling it again gives it a new one.
// Recycling lists the recycling sequences in eviction order, the next victim first.
//
// RecycleSequence commits pending extensions and marks an active sequence recycling; with
// MaxRecycling 0 it removes it at once and calls OnEvict, and at the cap it first evicts one
// (TryFreeMemory). TryFreeMemory evicts one and calls OnEvict with an Eviction: the sequence,
// its stamp, and the least recently recycled sequence still held, so that a caller can tell
// whether an older one stayed. Like MLC's, TryFreeMemory does not commit pending extensions.
// RemoveSequence and RollBackSequence commit first; RemoveSequence does not call OnEvict.
// In Disabled mode InsertSequence always answers Fresh with Offset 0 and records nothing,
// ExtendSequence and CommitSequenceExtension do nothing, HasSequence is false, TryFreeMemory
// false, Recycling empty, and the calls that name a sequence return ErrUnknownSequence.
//
// Bad calls return an error wrapping one of the package's sentinels and change nothing.
//
// For a viewer, Nodes returns the tree (Node, SeqRef), TakeChanges the nodes created, changed
// and deleted since its last call, and Describe a text form. Check verifies the invariants;
// with -tags invariants every mutating call runs it and panics on a violation.
//
// # Imports
//
// prefix imports nothing of kvtop but internal/invariants and its own stdmap. It never touches
// pages: when it evicts a sequence it says so through the OnEvict callback and the caller
// frees the KV.
//
// # Concurrency
//
// A Cache is not safe for concurrent use. It starts no goroutine, reads no clock and does no
// I/O; its results never depend on map iteration order.
package prefix
