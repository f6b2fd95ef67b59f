// Package engine is the decode instance that kvtop inspects: requests and their lifecycle, the
// waiting and running queues, and the step loop (prepare-receive, new-request prefill, batch
// decode) over the paged KV cache and the prefix cache.
//
// Engine is a deterministic core in the manner of etcd's raft: no goroutines, no clock reads,
// no I/O. Time enters as input. Runner is the thin goroutine wrapper that owns an Engine,
// paces it, and hands its output to subscribers without ever waiting for them.
//
// # Imports
//
// engine imports engine/prepare, engine/prefix and engine/pages. It must never import ui,
// wire, net or charm.land packages (a test holds this).
package engine
