// Package tap is kvtop tap: an HTTP proxy between MLC LLM's router and its prefill (P) and
// decode (D) instances that forwards every call unchanged and runs, for each decode
// instance, a shadow engine in follow mode (engine/follow.go) fed with what it saw: the
// prep_recv calls and their answers, remote_send's answers, start_generate and its
// streamed tokens. The shadow makes D's decisions with the code the embedded engine makes
// them with, so it shows D's queues, pages, prefix tree and the reason each waiting
// request waits, and checks every answer of D against its own: a difference is a
// divergence, after which the shadow puts its pages right from the slots D named.
//
// # Usage
//
//	t, err := tap.New(tap.Config{Engine: cfg, Listen: "127.0.0.1:7071"})
//	defer t.Close()
//	http.Serve(ln, t) // absolute-form calls (HTTP_PROXY) are forwarded; origin-form ones are the API
//
//	h, err := t.Reverse("http://d0:8000") // a reverse-proxy port for one decode instance
//	http.Serve(ln2, h)
//
// The API, on the tap's own address: GET /healthz, GET /v1/instances, GET
// /v1/snapshot?instance=HOST:PORT and GET /v1/stream?instance=HOST:PORT (what kvtop serve
// serves for its engine, for that instance's shadow), GET /metrics (kvtop serve's metrics
// with a decode_instance label, and the tap's own: kvtop_tap_divergences_total, …). The
// same rules as kvtop serve's guard it (wire.Guard): loopback by default, a token
// otherwise; with a token, proxied calls carry it as Proxy-Authorization.
//
// # What a tap can see
//
// Arrival, admission (the answer), the matched length and the slots of every reservation
// (so its pages), when P finished sending, the start, every token, preemptions and aborts.
// Not the KV bytes, not evictions or the pages decode adds (predicted), not D's
// configuration (given with the engine flags), not what happened before the tap started:
// requests first seen at start_generate are listed as admitted before the tap.
//
// # Concurrency
//
// A Tap is safe for concurrent use. A forwarded call never waits for a shadow: it offers
// its observations to the shadow's bounded queue without blocking; what does not fit is
// counted and makes the shadow start over (a fresh engine, its viewers told by a reset
// divergence). Each shadow applies its queue on a goroutine of its own, through its
// runner, which never steps on its own (runner.Config.Manual).
package tap
