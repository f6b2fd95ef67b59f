package wire_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// harness is a kvtop serve in a test: an engine, its runner, the wire server and an
// httptest server in front of it.
type harness struct {
	t      *testing.T
	r      *runner.Runner
	srv    *wire.Server
	ts     *httptest.Server
	token  string
	cancel context.CancelFunc
	once   sync.Once
	mu     sync.Mutex // for tests' own state shared between goroutines
}

type setup struct {
	cfg    func(*engine.Config)
	opts   func(*wire.Options)
	runner func(*runner.Config)
	paused bool
}

// testConfig is the engine the worked examples assume: 8192 tokens, 513 pages.
func testConfig() engine.Config {
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 8192
	cfg.MaxSingleSequenceLength = 8192
	cfg.MaxNumSequence = 64
	return cfg
}

func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	cfg := testConfig()
	if s.cfg != nil {
		s.cfg(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc := runner.Config{Clock: time.Now, StartPaused: s.paused}
	if s.runner != nil {
		s.runner(&rc)
	}
	r := runner.New(e, rc)
	ctx, cancel := context.WithCancel(context.Background())
	go r.Run(ctx)
	opts := wire.Options{Version: "kvtop test"}
	if s.opts != nil {
		s.opts(&opts)
	}
	srv := wire.NewServer(r, opts)
	ts := httptest.NewServer(srv)
	h := &harness{t: t, r: r, srv: srv, ts: ts, token: opts.Token, cancel: cancel}
	t.Cleanup(h.close)
	return h
}

// close stops everything, the runner first so that calls waiting on it return.
func (h *harness) close() {
	h.once.Do(func() {
		h.srv.Close()
		h.cancel()
		<-h.r.Done()
		h.ts.Close()
	})
}

// call makes an HTTP call with the harness's token and returns the status and body.
func (h *harness) call(ctx context.Context, method, path string, body []byte, hdr map[string]string) (int, []byte) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, h.ts.URL+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	if method == http.MethodPost && path != "/v1/kv" {
		req.Header.Set("Content-Type", "application/json") // as a router sends its calls
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return resp.StatusCode, b
}

func (h *harness) post(path string, body any) (int, []byte) {
	h.t.Helper()
	return h.call(context.Background(), http.MethodPost, path, jsonBody(h.t, body), nil)
}

func jsonBody(t *testing.T, body any) []byte {
	t.Helper()
	switch b := body.(type) {
	case string:
		return []byte(b)
	case []byte:
		return b
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prepRecv makes a prep_recv call that must be answered with 200.
func (h *harness) prepRecv(id string, prompt []int32, end int, maxTokens int) wire.PrepRecvAnswer {
	h.t.Helper()
	status, b := h.post("/microserving/prep_recv", map[string]any{"user": id, "prompt": prompt, "end": end, "max_tokens": maxTokens})
	if status != http.StatusOK {
		h.t.Fatalf("prep_recv %s = %d %s, want 200", id, status, b)
	}
	var ans wire.PrepRecvAnswer
	decode(h.t, b, &ans)
	return ans
}

// writeKV writes KV for slots of a metadata string, from offset, with a body.
func (h *harness) writeKV(md string, offset, tokens int, body []byte) (int, []byte) {
	h.t.Helper()
	hdr := map[string]string{wire.HeaderKVMetadata: md}
	if offset >= 0 {
		hdr[wire.HeaderKVOffset] = fmt.Sprint(offset)
	}
	if tokens > 0 {
		hdr[wire.HeaderKVTokens] = fmt.Sprint(tokens)
	}
	return h.call(context.Background(), http.MethodPost, "/v1/kv", body, hdr)
}

// startGenerate makes a non-streaming start_generate call that must succeed.
func (h *harness) startGenerate(id string, begin int) wire.Completion {
	h.t.Helper()
	status, b := h.post("/microserving/start_generate", map[string]any{"user": id, "begin": begin})
	if status != http.StatusOK {
		h.t.Fatalf("start_generate %s = %d %s, want 200", id, status, b)
	}
	var c wire.Completion
	decode(h.t, b, &c)
	return c
}

func (h *harness) snapshotJSON() []byte {
	h.t.Helper()
	status, b := h.call(context.Background(), http.MethodGet, "/v1/snapshot", nil, nil)
	if status != http.StatusOK {
		h.t.Fatalf("GET /v1/snapshot = %d %s", status, b)
	}
	return b
}

func (h *harness) snapshot() engine.Snapshot {
	h.t.Helper()
	var s engine.Snapshot
	decode(h.t, h.snapshotJSON(), &s)
	return s
}

// engine runs fn on the engine's goroutine.
func (h *harness) engine(fn func(e *engine.Engine)) {
	h.t.Helper()
	if err := h.r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error { fn(e); return nil }); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) request(id string) engine.RequestView {
	h.t.Helper()
	var rv engine.RequestView
	var ok bool
	h.engine(func(e *engine.Engine) { rv, ok = e.Request(id) })
	if !ok {
		h.t.Fatalf("request %s is not in the engine", id)
	}
	return rv
}

// pause pauses the runner and waits until it will take no more steps.
func (h *harness) pause() {
	h.t.Helper()
	if err := h.r.Control(feed.Control{Op: feed.ControlPause}); err != nil {
		h.t.Fatal(err)
	}
	waitFor(h.t, "the runner to pause", func() bool { return h.r.Status().Paused })
	h.engine(func(*engine.Engine) {})
}

func (h *harness) wsURL() string {
	return "ws" + strings.TrimPrefix(h.ts.URL, "http") + wire.StreamPath
}

func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// waitFor polls cond until it holds; it fails the test after 10 seconds. Nothing asserts a
// time: the deadline only keeps a broken test from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// prompt returns n distinct tokens; prompts of different salts share nothing.
func prompt(n int, salt int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = salt*1000 + int32(i)
	}
	return p
}

// viewer builds a View from a source's updates, as the dashboard does.
type viewer struct {
	view      *engine.View
	snapshots int
	events    int
	dropped   uint64
	status    *feed.Status
	epoch     uint64
}

func (v *viewer) apply(t *testing.T, u feed.Update) {
	t.Helper()
	if u.Snapshot != nil {
		nv, err := engine.NewView(*u.Snapshot)
		if err != nil {
			t.Fatalf("NewView: %v", err)
		}
		v.view = nv
		v.snapshots++
	}
	for _, ev := range u.Events {
		if v.view == nil {
			t.Fatalf("event %s before any snapshot", engine.KindOf(ev))
		}
		if err := v.view.Apply(ev); err != nil {
			t.Fatalf("Apply(%s): %v", ev, err)
		}
		v.events++
	}
	if u.Status != nil {
		st := *u.Status
		v.status = &st
	}
	v.dropped = u.Dropped
	v.epoch = u.Epoch
}

// sameState compares a view's snapshot with the engine's, as JSON (what travels), and
// reports the first difference.
func sameState(t *testing.T, got, want engine.Snapshot) {
	t.Helper()
	gb, _ := json.MarshalIndent(got, "", " ")
	wb, _ := json.MarshalIndent(want, "", " ")
	if bytes.Equal(gb, wb) {
		return
	}
	gl, wl := strings.Split(string(gb), "\n"), strings.Split(string(wb), "\n")
	for i := range min(len(gl), len(wl)) {
		if gl[i] != wl[i] {
			t.Fatalf("view.Snapshot() differs from GET /v1/snapshot at line %d:\n got %s\nwant %s", i+1, gl[i], wl[i])
		}
	}
	t.Fatalf("view.Snapshot() differs from GET /v1/snapshot (%d lines, want %d)", len(gl), len(wl))
}
