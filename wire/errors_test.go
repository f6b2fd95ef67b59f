package wire_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/wire"
	"github.com/kvtop/kvtop/wire/protocol"
)

// badCall is a call that must be refused: its status, error type, and a phrase of the
// message naming the problem.
type badCall struct {
	name   string
	method string
	path   string
	body   string
	hdr    map[string]string
	status int
	typ    string
	msg    string
}

// check makes the call and checks the refusal, and that the engine is as it was: its
// snapshot, as JSON, is the same byte for byte before and after (the runner is paused, so
// nothing else moves it).
func (h *harness) check(t *testing.T, c badCall) {
	t.Helper()
	before := h.snapshotJSON()
	method := c.method
	if method == "" {
		method = http.MethodPost
	}
	status, b := h.call(context.Background(), method, c.path, []byte(c.body), c.hdr)
	var got struct {
		Error *protocol.ErrorBody `json:"error"`
	}
	decode(t, b, &got)
	if status != c.status || got.Error == nil || got.Error.Type != c.typ || !strings.Contains(got.Error.Message, c.msg) {
		t.Errorf("%s %s (%s) = %d %s, want %d type %s with %q", method, c.path, c.name, status, b, c.status, c.typ, c.msg)
	}
	if after := h.snapshotJSON(); !bytes.Equal(before, after) {
		t.Errorf("%s %s (%s) changed the engine", method, c.path, c.name)
	}
}

// metadata returns a kv_append_metadata string with any JSON payload and length prefix.
func metadata(payload string, length int) string {
	b := make([]byte, 8, 8+len(payload))
	binary.LittleEndian.PutUint64(b, uint64(length))
	return base64.StdEncoding.EncodeToString(append(b, payload...))
}

func TestBadInputsAreRefusedAndChangeNothing(t *testing.T) {
	h := newHarness(t, setup{
		paused: true,
		cfg:    func(c *engine.Config) { c.MaxSingleSequenceLength = 100 },
		opts: func(o *wire.Options) {
			o.Limits.MaxBodyBytes = 4 << 10
			o.Limits.MaxKVBytes = 8 << 10
			o.Limits.MaxTokens = 1000
		},
	})
	const pr = "/microserving/prep_recv"
	const sg = "/microserving/start_generate"
	ok := `"user": "A", "prompt": [1, 2, 3], "end": -1`
	tooLong := fmt.Sprint(prompt(101, 1))
	huge := `{"user": "A", "prompt": "` + strings.Repeat("x", 5<<10) + `"}`
	kv := func(md string, extra ...string) map[string]string {
		m := map[string]string{wire.HeaderKVMetadata: md}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	reserved := prepare.Encode([]int64{1, 0, 39})
	for _, c := range []badCall{
		// prep_recv: JSON.
		{name: "malformed JSON", path: pr, body: `{"user": "A", "prompt": [1, 2`, status: 400, typ: "invalid_json", msg: "malformed JSON"},
		{name: "empty body", path: pr, body: ``, status: 400, typ: "invalid_json", msg: "empty"},
		{name: "trailing data", path: pr, body: `{` + ok + `} {}`, status: 400, typ: "invalid_json", msg: "after the JSON object"},
		{name: "an array", path: pr, body: `[1, 2]`, status: 400, typ: "invalid_type", msg: "want an object"},
		{name: "user a number", path: pr, body: `{"user": 7, "prompt": [1, 2], "end": -1}`, status: 400, typ: "invalid_type", msg: "user: want a string"},
		{name: "max_tokens a string", path: pr, body: `{` + ok + `, "max_tokens": "ten"}`, status: 400, typ: "invalid_type", msg: "max_tokens: want an integer"},
		{name: "end a fraction", path: pr, body: `{"user": "A", "prompt": [1, 2, 3], "end": 1.5}`, status: 400, typ: "invalid_type", msg: "end: want an integer"},
		{name: "prompt a number", path: pr, body: `{"user": "A", "prompt": 5, "end": -1}`, status: 400, typ: "invalid_type", msg: "prompt: want token ids"},
		{name: "prompt of fractions", path: pr, body: `{"user": "A", "prompt": [1.5, 2], "end": -1}`, status: 400, typ: "invalid_type", msg: "prompt: want token ids"},
		{name: "prompt of strings", path: pr, body: `{"user": "A", "prompt": ["a", "b"], "end": -1}`, status: 400, typ: "invalid_type", msg: "prompt: want token ids"},
		{name: "oversized body", path: pr, body: huge, status: 413, typ: "too_large", msg: "over the limit of 4096 bytes"},
		// prep_recv: what the engine refuses.
		{name: "no user", path: pr, body: `{"prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "invalid_request", msg: "request id (user) is empty"},
		{name: "empty prompt", path: pr, body: `{"user": "A", "prompt": [], "end": -1}`, status: 400, typ: "empty_prompt", msg: "empty prompt"},
		{name: "empty text", path: pr, body: `{"user": "A", "prompt": "", "end": -1}`, status: 400, typ: "empty_prompt", msg: "empty prompt"},
		{name: "no prompt", path: pr, body: `{"user": "A", "end": -1}`, status: 400, typ: "empty_prompt", msg: "empty prompt"},
		{name: "prompt too long", path: pr, body: `{"user": "A", "end": -1, "prompt": ` + strings.ReplaceAll(tooLong, " ", ",") + `}`, status: 400, typ: "prompt_too_long", msg: "101 tokens is over max_single_sequence_length 100"},
		{name: "negative token", path: pr, body: `{"user": "A", "prompt": [1, -2, 3], "end": -1}`, status: 400, typ: "bad_token", msg: "token -2 at position 1 is negative"},
		{name: "token over int32", path: pr, body: `{"user": "A", "prompt": [1, 4294967296], "end": -1}`, status: 400, typ: "bad_token", msg: "outside the int32 range"},
		{name: "end = L", path: pr, body: `{"user": "A", "prompt": [1, 2, 3], "end": 3}`, status: 400, typ: "bad_window", msg: "must be in [0, 3)"},
		{name: "end before the start", path: pr, body: `{"user": "A", "prompt": [1, 2, 3], "end": -4}`, status: 400, typ: "bad_window", msg: "must be in [0, 3)"},
		{name: "no end", path: pr, body: `{"user": "A", "prompt": [1, 2, 3]}`, status: 400, typ: "bad_window", msg: "absent"},
		{name: "n = 2", path: pr, body: `{` + ok + `, "n": 2}`, status: 400, typ: "unsupported_n", msg: "n = 2"},
		{name: "n = 0", path: pr, body: `{` + ok + `, "n": 0}`, status: 400, typ: "invalid_request", msg: "n 0 is out of range"},
		{name: "negative max_tokens", path: pr, body: `{` + ok + `, "max_tokens": -1}`, status: 400, typ: "invalid_request", msg: "max_tokens -1"},
		{name: "max_tokens 0", path: pr, body: `{` + ok + `, "max_tokens": 0}`, status: 400, typ: "invalid_request", msg: "max_tokens 0 is out of range [1, 1000]"},
		// Request ids that break what shows them.
		{name: "id with a newline", path: pr, body: `{"user": "a\nb", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "control character U+000A at byte 1"},
		{name: "id with a tab", path: pr, body: `{"user": "a\tb", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "control character U+0009"},
		{name: "id with NUL", path: pr, body: `{"user": "a\u0000", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "control character U+0000"},
		{name: "id with a C1 control", path: pr, body: `{"user": "a\u0085", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "control character U+0085"},
		{name: "id with DEL", path: pr, body: `{"user": "a\u007f", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "control character U+007F"},
		{name: "id with a bidi override", path: pr, body: `{"user": "r-\u202egnp.exe", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "bidirectional control U+202E"},
		{name: "id with a bidi isolate", path: pr, body: `{"user": "r\u2066", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "bidirectional control U+2066"},
		{name: "id with a line separator", path: pr, body: `{"user": "a\u2028b", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "line separator U+2028"},
		{name: "id of 257 bytes", path: pr, body: `{"user": "` + strings.Repeat("i", 257) + `", "prompt": [1, 2, 3], "end": -1}`, status: 400, typ: "bad_id", msg: "is 257 bytes, over the limit of 256"},
		{name: "start_generate of a bad id", path: sg, body: `{"user": "a\nb", "begin": 3}`, status: 400, typ: "bad_id", msg: "control character"},
		{name: "abort of a bad id", path: "/debug/abort", body: `{"user": "a\rb"}`, status: 400, typ: "bad_id", msg: "control character U+000D"},
		{name: "max_tokens over the limit", path: pr, body: `{` + ok + `, "max_tokens": 1001}`, status: 400, typ: "invalid_request", msg: "max_tokens 1001 is out of range [1, 1000]"},
		// start_generate.
		{name: "unknown request", path: sg, body: `{"user": "nobody", "begin": 3}`, status: 404, typ: "unknown_request", msg: "start_generate nobody: engine: unknown request"},
		{name: "no begin", path: sg, body: `{"user": "A"}`, status: 400, typ: "invalid_request", msg: "begin is required"},
		{name: "begin a string", path: sg, body: `{"user": "A", "begin": "3"}`, status: 400, typ: "invalid_type", msg: "begin: want an integer"},
		{name: "malformed", path: sg, body: `{"user": `, status: 400, typ: "invalid_json", msg: "malformed JSON"},
		{name: "no user", path: sg, body: `{"begin": 3}`, status: 400, typ: "invalid_request", msg: "user"},
		// remote_send.
		{name: "a decode instance", path: "/microserving/remote_send", body: `{"user": "A", "begin": 0, "end": 39}`, status: 400, typ: "unsupported", msg: "this is a decode instance"},
		// KV writes.
		{name: "no metadata", path: "/v1/kv", status: 400, typ: "bad_metadata", msg: "KV-Append-Metadata header is required"},
		{name: "bad base64", path: "/v1/kv", hdr: kv("!!!not base64"), status: 400, typ: "bad_metadata", msg: "base64"},
		{name: "truncated", path: "/v1/kv", hdr: kv("CAAAAAAAAABbMSww"), status: 400, typ: "bad_metadata", msg: "length prefix says 8 bytes, payload has 4"},
		{name: "shorter than its prefix", path: "/v1/kv", hdr: kv("CAAA"), status: 400, typ: "bad_metadata", msg: "shorter than the 8-byte length prefix"},
		{name: "length prefix off", path: "/v1/kv", hdr: kv(metadata("[1,0,39]", 9)), status: 400, typ: "bad_metadata", msg: "length prefix says 9"},
		{name: "not integers", path: "/v1/kv", hdr: kv(metadata(`[1,0,"x"]`, 9)), status: 400, typ: "bad_metadata", msg: "not an integer"},
		{name: "groups do not split", path: "/v1/kv", hdr: kv(prepare.Encode([]int64{2, 0, 1})), status: 400, typ: "bad_metadata", msg: "says 2 runs"},
		{name: "two models for one", path: "/v1/kv", hdr: kv(prepare.Encode([]int64{1, 0, 3, 1, 0, 3})), status: 400, typ: "bad_metadata", msg: "2 model groups; the engine has 1"},
		{name: "more slots than the pool", path: "/v1/kv", hdr: kv(prepare.Encode([]int64{1, 0, 1 << 40})), status: 400, typ: "bad_kv_write", msg: "more tokens than the pool's 8208 slots"},
		{name: "offset past the end", path: "/v1/kv", hdr: kv(reserved, wire.HeaderKVOffset, "39"), status: 400, typ: "bad_kv_write", msg: "KV-Offset 39 must be in [0, 39)"},
		{name: "offset not a number", path: "/v1/kv", hdr: kv(reserved, wire.HeaderKVOffset, "one"), status: 400, typ: "bad_kv_write", msg: `KV-Offset "one" is not an integer`},
		{name: "too many tokens", path: "/v1/kv", hdr: kv(reserved, wire.HeaderKVOffset, "30", wire.HeaderKVTokens, "10"), status: 400, typ: "bad_kv_write", msg: "KV-Tokens 10 must be in [1, 9]"},
		{name: "a body without an arena", path: "/v1/kv", hdr: kv(reserved), body: "kv", status: 400, typ: "bad_kv_write", msg: "must be empty"},
		{name: "a large body without an arena", path: "/v1/kv", hdr: kv(reserved), body: strings.Repeat("k", 9<<10), status: 400, typ: "bad_kv_write", msg: "must be empty; it has 9216 bytes"},
		// abort.
		{name: "unknown request", path: "/debug/abort", body: `{"user": "nobody"}`, status: 404, typ: "unknown_request", msg: "abort nobody"},
		{name: "no user", path: "/debug/abort", body: `{}`, status: 400, typ: "invalid_request", msg: "user"},
		{name: "malformed", path: "/debug/abort", body: `{"user"`, status: 400, typ: "invalid_json", msg: "malformed"},
		// Routing.
		{name: "wrong method", method: http.MethodGet, path: pr, status: 405, typ: "method_not_allowed", msg: "use POST"},
		{name: "wrong method", method: http.MethodPost, path: "/v1/snapshot", status: 405, typ: "method_not_allowed", msg: "use GET"},
		{name: "no such endpoint", path: "/v1/nothing", status: 404, typ: "not_found", msg: "no such endpoint"},
		{name: "not a websocket", method: http.MethodGet, path: wire.StreamPath, status: 400, typ: "invalid_request", msg: "is a websocket"},
	} {
		h.check(t, c)
	}
}

// The refusals that need a request in a given state: a duplicate id, KV written twice,
// start_generate of a waiting request or with a bad window, an abort of an ended request.
func TestBadInputsAgainstLiveRequests(t *testing.T) {
	h := newHarness(t, setup{})
	a := h.prepRecv("A", prompt(40, 1), -1, 2)
	if status, b := h.writeKV(a.KVAppendMetadata, 0, 10, nil); status != http.StatusOK {
		t.Fatalf("KV write = %d %s", status, b)
	}
	h.prepRecv("F", prompt(40, 3), -1, 2)
	h.startGenerate("F", 39) // F finishes
	h.pause()
	// B waits: the runner is paused, so it is never admitted while this test runs.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.call(ctx, http.MethodPost, "/microserving/prep_recv", jsonBody(t, map[string]any{"user": "B", "prompt": prompt(40, 2), "end": -1}), nil)
	}()
	waitFor(t, "B to arrive", func() bool {
		var n uint64
		h.engine(func(e *engine.Engine) { n = e.Totals().Arrived })
		return n == 3
	})
	kv := func(extra ...string) map[string]string {
		m := map[string]string{wire.HeaderKVMetadata: a.KVAppendMetadata}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	for _, c := range []badCall{
		{name: "duplicate of a prepared request", path: "/microserving/prep_recv", body: `{"user": "A", "prompt": [1, 2, 3], "end": -1}`, status: 409, typ: "duplicate_id", msg: "a request with this id is prepared"},
		{name: "duplicate of a waiting request", path: "/microserving/prep_recv", body: `{"user": "B", "prompt": [1, 2, 3], "end": -1}`, status: 409, typ: "duplicate_id", msg: "is waiting"},
		{name: "KV written twice", path: "/v1/kv", hdr: kv(wire.HeaderKVOffset, "5"), status: 400, typ: "bad_kv_write", msg: "slot 5 of A (token 5) was already written"},
		{name: "waiting, not prepared", path: "/microserving/start_generate", body: `{"user": "B", "begin": 39}`, status: 409, typ: "not_prepared", msg: "the request is waiting"},
		{name: "begin = L", path: "/microserving/start_generate", body: `{"user": "A", "begin": 40}`, status: 400, typ: "bad_begin", msg: "begin 40 must resolve into [0, 40)"},
		{name: "end not L", path: "/microserving/start_generate", body: `{"user": "A", "begin": 39, "end": 39}`, status: 400, typ: "bad_window", msg: "end 39 must be absent or the prompt length 40"},
		{name: "finished", path: "/microserving/start_generate", body: `{"user": "F", "begin": 39}`, status: 409, typ: "not_prepared", msg: "the request is finished"},
		{name: "abort of a finished request", path: "/debug/abort", body: `{"user": "F"}`, status: 409, typ: "request_ended", msg: "finished"},
	} {
		h.check(t, c)
	}
	cancel()
	<-done
}
