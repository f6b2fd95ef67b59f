// Package prefix is the prefix cache of a decode instance: a radix tree over int32 token ids
// that records which token sequence every cached KV sequence holds, whether that sequence is
// active (its request is alive) or recycling (finished, kept for reuse), and how a new prompt
// should start: as a new sequence, as a fork of a cached one, or by taking a recycling one over.
//
// It reproduces MLC LLM's PrefixCache (cpp/serve/prefix_cache.cc) over its paged radix tree,
// with the differences docs/mlc-differences.md names: eviction is least recently recycled
// first. Matching is token-granular; MLC's 64-token tree pages are not modelled.
//
// # Usage
//
//	c := prefix.New(prefix.Config{Mode: prefix.Radix, MaxRecycling: 4,
//		OnEvict: func(id int64) { kv.RemoveSequence(id) }})
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
//     w, take the shortest (the first in S's order among equals). If 10*m > 9*len (MLC's
//     m > 0.9*len, in exact arithmetic), Reuse it: it becomes active, its last len-m tokens
//     are rolled back, and id is not added. Otherwise Fork from the first sequence of S with
//     no sliding window, active or recycling: id is added holding the first m tokens. If S has
//     none, id is added as Fresh with Offset 0.
//   - with a sliding window: Reuse a recycling sequence of S whose Window equals w and whose
//     length is exactly m (Pop 0), the first in S's order; never Fork; else Fresh, Offset 0.
//
// The order of S: let X be the node where the match stopped (the node holding the m-th
// matched token; it may end below m, inside its edge). First the sequences that end exactly
// at X, the most recently arrived first; then the sequences below X, depth first, children
// in the order their branches were created (a node made by a split or a merge takes the place
// of the node it replaces), and within each node the most recently arrived first. A sequence
// arrives at a node when it is added there or its length changes (an extension, a roll-back).
// Without a tree: two sequences with a longest common prefix of l tokens compare as follows.
// If both end there, the later arrival comes first; if one does, it comes first; else the
// branch at l that has existed longer without a break comes first.
//
// The walk of S is pruned: every node counts the sequences, the recycling sequences and the
// sequences without a sliding window in its subtree, so the reuse search skips subtrees with
// nothing recycling, or whose sequences are all too long to pass the 0.9 test (a sequence
// ending in a node is as long as the node's depth) or no shorter than the best so far, and
// the fork candidate is found in O(depth).
//
// RecycleSequence marks an active sequence recycling; with MaxRecycling 0 it removes it at
// once and calls OnEvict, and at the cap it first evicts one (TryFreeMemory).
// TryFreeMemory evicts the least recently recycled sequence and calls OnEvict.
// RemoveSequence and RollBackSequence commit first; RemoveSequence does not call OnEvict.
// In Disabled mode InsertSequence always answers Fresh and records nothing, HasSequence is
// false, and the calls that name a sequence return ErrUnknownSequence.
//
// Bad calls return an error wrapping one of the package's sentinels and change nothing.
//
// For a viewer, Nodes returns the tree (Node, SeqRef), TakeChanges the nodes created, changed
// and deleted since its last call, and Describe a text form. Check verifies the invariants;
// with -tags invariants every mutating call runs it and panics on a violation.
//
// # Imports
//
// prefix imports nothing of kvtop but internal/invariants. It never touches pages: when it
// evicts a sequence it says so through the OnEvict callback and the caller frees the KV.
//
// # Concurrency
//
// A Cache is not safe for concurrent use. It starts no goroutine, reads no clock and does no
// I/O; its results never depend on map iteration order.
package prefix
