// Package prepare is MLC LLM's DisaggPrepareReceive action: admit waiting prepare-receive
// requests in FIFO order while the paged KV cache has room (spec section 5.1), match each
// against the prefix cache, reserve the slots a prefill instance will write, and answer with
// the kv_append_metadata that says where (section 5.3, encoded as in section 8).
//
// It also explains a request that cannot be admitted: Blocked names the first predicate that
// failed, with the numbers behind it (section 5.2).
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
