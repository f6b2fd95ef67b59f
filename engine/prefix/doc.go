// Package prefix is the prefix cache of a decode instance: a radix tree over int32 token ids
// that records which token sequence every cached KV sequence holds, whether that sequence is
// active (its request is alive) or recycling (finished, kept for reuse), and how a new prompt
// should start: as a new sequence, as a fork of a cached one, or by taking a recycling one over.
//
// It reproduces MLC LLM's PrefixCache (cpp/serve/prefix_cache.cc) over its paged radix tree,
// with the differences named in the spec (section 11): eviction is least recently recycled
// first.
//
// # Imports
//
// prefix imports nothing of kvtop. It never touches pages: when it evicts a sequence it says
// so through the OnEvict callback and the caller frees the KV.
//
// # Concurrency
//
// A Cache is not safe for concurrent use.
package prefix
