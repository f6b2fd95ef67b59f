// Package tracing traces the lifecycle of every request on the decode instance as
// OpenTelemetry spans, sent to a tracing backend (Jaeger, Tempo, an OpenTelemetry Collector)
// over OTLP/HTTP: the request's wait in prep_recv, for its KV, for start_generate, its
// prefill and its decode, as the engine's events tell them.
//
// # The spans
//
// Each request is one trace, or one span of the caller's trace when its prep_recv carried a
// W3C traceparent header: a span "request" (kind server) from prep_recv's acceptance to the
// request's end, and inside it one child span a phase, back to back:
//
//	prep_recv.wait        accepted, waiting for prepare-receive to admit it; each run of
//	                      blocked evaluations of one reason is an event "blocked" (its
//	                      first numbers, its last and how many: the engine re-evaluates a
//	                      waiting request whenever its numbers change, up to once a step)
//	kv.await              admitted, its slots reserved, the prefill instance's KV arriving;
//	                      every write is an event "kv_received"
//	start_generate.wait   all its KV in, waiting for start_generate
//	prefill               started with a tail of more than one token to prefill
//	decode                generating
//
// A phase that does not happen has no span (a request whose whole prompt matched the prefix
// cache goes from prep_recv.wait to start_generate.wait). The request's span carries the
// attributes of Attr* (id, prompt length, end, max_tokens, the prefix match, pages taken,
// segments and kv_append_metadata, tokens generated, outcome), and the events "preempted",
// "leaked" and "hazard" (one a hazard the engine detects about the request). A request
// preempted, or aborted with its KV leaked, ends with status Error. Times are the engine's,
// in milliseconds: a phase shorter than a millisecond lasts zero. A span keeps the SDK's
// limit of events (128, OTEL_SPAN_EVENT_COUNT_LIMIT) and counts the rest as dropped, as
// OTLP carries them: a request's memory is bounded however long it is open.
//
// # Usage
//
//	t, err := tracing.Start(tracing.Config{Endpoint: "http://127.0.0.1:4318"})
//	r := runner.New(e, runner.Config{Observers: []runner.Observer{t}, ...})
//	srv := wire.NewServer(r, wire.Options{PrepRecvTrace: t.Remote, ...})
//	...
//	t.Close() // after the runner has stopped: ends what is open and sends what is left
//
// # Concurrency
//
// Observe runs on the engine's goroutine and never waits: it picks the events that concern
// spans out of each call's and step's and appends them to a bounded queue (Config.Queue
// events) under a mutex; an observation that does not fit is dropped whole and counted, and
// where the loss falls every span still open is ended, marked with AttrOutcome "lost" (its
// end is no longer known), so none stays open for good. The spans are built on a goroutine
// of the tracer's own, which once it has emptied the queue lingers (Config.Linger) before
// it waits again, so a busy engine wakes it at most once a linger. The SDK's batch span
// processor exports them in batches; it blocks that goroutine rather than drop spans, so
// the one place a span is lost is the queue, where it is counted. Remote, Stats, Flush and
// Close are safe for concurrent use.
package tracing
