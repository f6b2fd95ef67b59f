// Package wire carries a decode instance's snapshot and step events to dashboards: the HTTP
// server of `kvtop serve` (MLC microserving API and the websocket stream), and the Go client
// the dashboard uses to attach. The versioned frames and their JSON encoding are package
// wire/protocol.
//
// # Usage
//
// Serving an engine:
//
//	r := runner.New(e, runner.Config{Clock: time.Now})
//	go r.Run(ctx)
//	srv := wire.NewServer(r, wire.Options{Token: token, Control: true, Version: "kvtop 0.1.0"})
//	defer srv.Close()
//	hs := wire.NewHTTPServer(srv, wire.DefaultLimits())
//	go hs.Serve(listener)
//
// Attaching to one (the client has the dashboard's Source method set):
//
//	c, err := wire.Dial(ctx, "127.0.0.1:7070", wire.ClientOptions{Token: token})
//	for range c.C() {
//		u := c.Take() // a feed.Update: u.Snapshot (start over), then u.Events in order
//	}
//
// # HTTP API
//
// Every call carries "Authorization: Bearer TOKEN" when the server has a token (compared in
// constant time, the scheme in any case; 401 otherwise). Without a token, a call's Host must
// be a loopback name or address or the listen host (403 forbidden_host: no DNS rebinding).
// Every POST and the stream's handshake must come without an Origin header or from this
// server's own origin (403 forbidden_origin), and prep_recv, start_generate and abort must
// send Content-Type: application/json (415 unsupported_media_type): a web page can make a
// browser send neither without a CORS preflight, which kvtop never answers (guard.go).
//
// Every bad input is answered with a 4xx and {"error": {"message": "...", "type": "..."}},
// and leaves the engine as it was (a stale KV write also raises a hazard). The types:
// invalid_json, invalid_type, invalid_request, too_large (413), unauthorized (401),
// forbidden_origin (403), forbidden_host (403), unsupported_media_type (415), not_found (404),
// method_not_allowed (405), unsupported, bad_id, duplicate_id (409), unknown_request (404),
// not_prepared (409), request_ended (409), request_aborted (409), bad_begin, bad_window,
// empty_prompt, prompt_too_long, bad_token, unsupported_n, bad_metadata, bad_kv_write,
// stale_kv_write (409), read_only (403), unavailable (503), busy (503, with Retry-After:
// more prep_recv calls waiting for admission than --max-waiting, or more stream connection
// attempts a second than Limits.MaxConnectsPerSec). A body over its limit is read and
// discarded (up to 8 MiB, within 2s) before the 413, so that a client that sends its whole
// body before it reads gets the answer.
//
// POST /microserving/prep_recv takes an OpenAI completion request with MLC's extra field:
//
//	{"user": "r-1", "prompt": [1, 2, 3] or "text", "end": -1, "max_tokens": 16, "n": 1}
//
// user is the request id: at most 256 bytes of UTF-8 with no control characters, line
// separators or bidirectional controls (400 bad_id); end is kv_window_end (negative counts
// from the prompt's end; absent means the prompt length, which is refused, as in MLC);
// max_tokens is at least 1 (absent: 16); other OpenAI fields are ignored. A text prompt is tokenized a token a byte (Tokenize). The call waits until the
// request is admitted and answers
//
//	{"prompt_length": 40, "prefix_matched_length": 0, "kv_append_metadata": "CAAAAAAAAABbMSwwLDM5XQ=="}
//
// If the caller goes away first, the request is aborted as MLC aborts it (a request already
// prepared then leaks its KV, flagged as a hazard). Beyond --max-waiting calls waiting at
// once, prep_recv is answered 503 busy with Retry-After and the engine never sees it.
//
// POST /microserving/start_generate takes {"user": "r-1", "begin": 39, "stream": false}
// (begin is required; end, when present, must be the prompt length; the generation settings
// are the prep_recv's, as in MLC). It answers one completion object in the OpenAI
// completions shape
//
//	{"id": "cmpl-r-1", "object": "text_completion", "created": 1700000000, "model": "kvtop-sim",
//	 "choices": [{"index": 0, "text": " kalo mi", "logprobs": null, "finish_reason": "length"}],
//	 "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}}
//
// or, with "stream": true, server-sent events: a "data: {chunk}" a token (finish_reason null
// until the last), a usage chunk when "stream_options": {"include_usage": true}, and
// "data: [DONE]". The tokens are simulated; TokenText renders them. The finish reason is
// "length", or "abort", "preempt" or "reclaim" for a request that ended otherwise. A client
// that goes away mid-completion, or whose stream write blocks for Limits.WriteTimeout, or
// that leaves while its start_generate waits for the engine, aborts its request; the tokens
// queued for it are dropped.
//
// POST /microserving/remote_send is the prefill instance's call; a decode instance answers
// 400 (unsupported).
//
// POST /v1/kv is kvtop's own KV arrival, what a prefill instance writes into the decode
// instance's slots. The request:
//
//	KV-Append-Metadata: <the kv_append_metadata string prep_recv answered, untouched>
//	KV-Offset: <index in the metadata's expanded slot list of the first token written; default 0>
//	KV-Tokens: <tokens written; default: all from the offset on with a zero-sized arena,
//	            else body length / (models × token bytes)>
//	Content-Type: application/octet-stream
//
//	<tokens × models × token_bytes raw bytes: token by token in slot order, and within a
//	 token each model's KV in model order; one model's token is layers × {K, V} × kv_heads
//	 × head_dim fp16 values, token_bytes = layers × 2 × kv_heads × head_dim × 2>
//
// The expanded slot list is model 0's runs of the metadata written out slot by slot (every
// model's runs must be the same). With the default zero-sized arena (--arena unset) the body
// is empty and the slots are only marked received. The headers are checked before the body
// is read (a write they refuse costs no body). The metadata must be the one issued to a
// request that is still prepared: one whose request finished, was aborted or never existed
// is refused with 409 stale_kv_write and raises the stale-kv-write hazard, since its slots
// may belong to another request now. Every slot must be reserved and not yet written, or
// nothing is written (400 bad_kv_write). The answer is {"tokens": 39, "requests": ["r-1"],
// "complete": ["r-1"]}. A transfer larger than the body limit comes in several writes with
// increasing KV-Offset.
//
// POST /debug/abort {"user": "r-1"} aborts a request and answers {"user", "state",
// "leaked"}. GET /v1/snapshot answers the engine's engine.Snapshot as JSON. GET /healthz
// answers {"status": "ok", "version", "step", "paused"}. GET /metrics is Prometheus text
// (names prefixed kvtop_; see metrics.go). POST /debug/dump_event_trace answers the recent
// requests' lifecycles in the Chrome trace event format, as a JSON array (MLC's form; open
// it in ui.perfetto.dev): one track a request, its phases as spans, blocks, metadata and
// hazards as instants.
//
// # Stream
//
// GET /v1/stream upgrades to a websocket (the token in the handshake's Authorization
// header; a browser handshake from another origin is refused; beyond
// Limits.MaxConnectsPerSec attempts a second, 503 busy with Retry-After). The server sends
// JSON text frames, each {"type": ..., ...}:
//
//	{"type":"hello","hello":{"protocol":7,"server":"kvtop 0.1.0","config":{...},"control":false,"ping_interval_ms":20000,"max_message_bytes":4096,"events":"json"}}
//	{"type":"snapshot","seq":1,"snapshot":{...engine.Snapshot...}}
//	{"type":"events","seq":2,"events":[{"kind":"request_arrived","step":3,"at":1700000000000,"id":"r-1",...},...]}
//	{"type":"status","status":{"paused":false,"rate":50,"target":50,"controllable":false}}
//	{"type":"dropped","dropped":{"count":1200,"total":1200}}
//	{"type":"error","error":{"message":"...","type":"read_only"}}
//
// hello comes first, then a snapshot; snapshot and events frames carry a seq that grows by
// exactly one from frame to frame on a connection. Events are batched: all that are pending
// when the connection is ready to write, up to Limits.FrameEvents a frame. A client that
// sends the handshake header Kvtop-Events: binary (HeaderEvents) gets "events":"binary" in
// the hello and its events frames as binary messages (protocol/binary.go: the same events,
// a seventh of the bytes); every other frame stays JSON, and JSON is the default. A client
// that falls behind (more than the runner's backlog of events) is sent dropped, then a fresh
// snapshot. The client sends {"type":"snapshot"} to resync (at most one is answered a
// Limits.ResyncInterval, with the latest state; those between are coalesced), and, when the
// server runs with control on, {"type":"pause"}, {"type":"resume"} and {"type":"step","n":3}
// (no n: one step); otherwise it is answered with an error frame. The server pings every
// PingInterval and closes a client that stops answering. protocol.Version is the protocol's
// version, with its history.
//
// Viewers cannot slow the engine (hub.go): the engine's goroutine offers its events to one
// subscription, the stream's, however many clients watch. The stream encodes each event
// once an encoding for all of them and keeps the recent ones in a log every connection reads
// at its own pace; it folds the same events into a View, from which it builds the snapshots
// clients need (new, resyncing, fallen behind) on its own goroutine, one for every client
// that needs one at a time, at most one a Limits.SnapshotInterval, each encoded once.
//
// # Concurrency
//
// Server and Client are safe for concurrent use. The server never touches the engine but
// through the runner (Do, PrepRecv, StartGenerate, Control), and the stream reads one
// runner.Subscription, which never blocks the engine, on a goroutine of its own (the hub,
// started with the first connection); a slow client costs only itself. Each stream
// connection has one writing goroutine (its handler) and one reading goroutine. The client has one goroutine that reads the connection and reconnects, and
// delivers through a feed.Mailbox (bounded by ClientOptions.Backlog); Take, Link and
// Control may be called from any goroutine.
//
// # Imports
//
// wire imports engine and below, feed and wire/protocol; it never imports ui, and neither ui
// nor record imports wire (record reads frames through wire/protocol alone).
package wire
