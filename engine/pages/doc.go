// Package pages models the paged KV cache of one model on a decode instance, as TVM's
// PagedAttentionKVCache manages it: a pool of pages handed out from a free-list stack,
// sequences as chains of reference-counted blocks, forks that share whole blocks, and the
// reserve-append that prepare-receive uses to tell a prefill instance where KV must land.
//
// The page payload (the KV bytes themselves) lives behind the small Store interface. Arena,
// the host-memory store, lays the bytes out as a GPU cache would; it may be zero-sized, in
// which case only the bookkeeping runs.
//
// # Imports
//
// pages is a leaf: it imports nothing of kvtop. engine/prefix does not know it exists;
// engine/prepare and engine drive it.
//
// # Concurrency
//
// A Cache is not safe for concurrent use. The engine owns it on one goroutine.
package pages
