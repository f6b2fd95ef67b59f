// Package prepare is MLC LLM's DisaggPrepareReceive action: admit waiting prepare-receive
// requests in FIFO order while the paged KV cache has room (docs/admission.md), match each
// against the prefix cache, reserve the slots a prefill instance will write, and answer with
// the kv_append_metadata that says where (encoded as docs/kv-cache.md says).
//
// It also explains a request that cannot be admitted: Blocked names the first predicate that
// failed, with the numbers behind it, from one table of predicates.
//
// # Imports
//
// prepare imports engine/prefix and engine/pages, and nothing else of kvtop. The engine
// package drives it; it knows nothing of steps, events or viewers.
//
// # Concurrency
//
// Nothing here is safe for concurrent use; the engine calls it from one goroutine.
package prepare
