// Package blocks derives the KV blocks that the prefix cache holds, in the sense of vLLM's
// KV events (the contract KV-aware routers such as NVIDIA Dynamo and llm-d index), and how
// they change from one engine call or step to the next.
//
// A block is one full page of a cached sequence: the tokens [k·P, (k+1)·P) of a sequence the
// prefix cache holds, for a page size P and every k with (k+1)·P no greater than the
// sequence's committed length. A block is named by its hash, chained over its parent's hash
// (the block before it on the sequence; none for k = 0) and its tokens:
//
//	hash(parent, tokens) = XXH64(seed 0) over parent as 8 bytes little-endian, then each
//	                       token id as 4 bytes little-endian (two's complement)
//
// with parent 0 for the first block. A hash so names the whole prefix [0, (k+1)·P), so two
// sequences that share a page-aligned prefix share its blocks, and a block is held while any
// cached sequence (active or recycling) holds its prefix. Dynamo and llm-d hash token_ids
// with their own functions, so what matters here is that hashes are unique, parents right
// and tokens right; the tests check all three against the prefix cache itself.
//
// # Usage
//
//	t := blocks.NewTracker(cfg.PageSize)
//	// after every engine call and step, on the engine's goroutine:
//	changes := t.Track(e.Prefix(), events)
//	// the block set from scratch, for a resync or a test:
//	all := blocks.Of(e.Prefix(), cfg.PageSize)
//
// or, to keep the hashing off the engine's goroutine, a Reader there and a Tracker on a
// goroutine of its own:
//
//	rd := blocks.NewReader(cfg.PageSize) // on the engine's goroutine
//	var o blocks.Ops
//	rd.Read(e.Prefix(), events, &o)      // or rd.Sync(e.Prefix(), &o) to start over
//	// hand o over; then, elsewhere, every Ops in the order they were read:
//	changes := t.Apply(&o)
//
// Read looks at the prefix cache only for the sequences whose committed length the events
// say changed (a PrefixChanged event lists the nodes touched and the sequences ending at
// each), and copies out only the tokens of the pages that became full: a decode step costs
// it a comparison per running sequence and a copy of each page filled, and no allocation
// once its Ops has grown. Apply hashes those pages, one hash a page; forks share their
// parent's blocks without hashing them again.
//
// # Concurrency
//
// Readers and Trackers are not safe for concurrent use. A Reader reads the prefix cache, so
// it runs on the engine's goroutine (a runner.Observer); an Ops it wrote owns its memory and
// may be handed to another goroutine, whose Tracker applies it. Track and Sync read too, so
// they run on the engine's goroutine. Changes own their slices.
package blocks
