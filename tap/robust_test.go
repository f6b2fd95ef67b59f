package tap

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// flow runs one request's three calls through the tap, as MLC's router does.
func (tp *topology) flow(i int, id string, prompt []int32, maxTokens int) {
	tp.t.Helper()
	tp.rr = i // pick D i
	if err := tp.PrepRecv(engine.PrepRecv{ID: id, Prompt: prompt, End: -1, MaxTokens: maxTokens}); err != nil {
		tp.t.Fatal(err)
	}
	tp.pending = nil
	r := requestOf(tp.ds[i].snapshot(tp.t), id)
	if r.Reserved > 0 {
		if err := tp.WriteKV(id, r.Encoded, 0, r.Reserved); err != nil {
			tp.t.Fatal(err)
		}
	}
	if err := tp.StartGenerate(id, r.End); err != nil {
		tp.t.Fatal(err)
	}
	tp.pending = nil
}

func prompt(seed, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*31) % 30000)
	}
	return out
}

func smallConfig() engine.Config {
	c := engine.DefaultConfig()
	c.MaxTotalSequenceLength = 8192
	c.MaxRecycling = 4
	return c
}

// waitFor polls until cond holds (D's own goroutines settle after a client leaves).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: never happened", what)
}

// A tap started while D already holds requests: a request admitted before the tap shows as
// such while it streams, answers that name pages the shadow has free are divergences it
// resyncs from, and nothing fails.
func TestTapStartedMidFlight(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxTotalSequenceLength = 65536
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	tp.check = func(string) {}
	d := tp.ds[0]
	// Before the tap: prep_recv and the KV straight to D.
	direct := &http.Client{}
	body, _ := json.Marshal(map[string]any{"user": "pre", "prompt": prompt(1, 200), "end": -1, "max_tokens": 20000})
	req, _ := http.NewRequest(http.MethodPost, d.srv.URL+"/microserving/prep_recv", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := direct.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ans engine.Answer
	json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	tp.at["pre"] = 0

	// Through the tap: its start_generate, read a chunk at a time.
	resp, err = tp.post(d.srv.URL, "/microserving/start_generate", map[string]any{"user": "pre", "begin": 199, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	tp.flush()
	if st := tp.standing(d.addr()); len(st.BeforeTap) != 1 || st.BeforeTap[0] != "pre" || !strings.Contains(st.Describe(0), "1 request admitted before the tap") {
		t.Errorf("standing while pre streams = %+v, want it admitted before the tap", st)
	}
	io.Copy(io.Discard, br)
	resp.Body.Close()
	tp.flush()
	if st := tp.standing(d.addr()); len(st.BeforeTap) != 0 {
		t.Errorf("standing after pre's end = %+v", st)
	}
	// A new request: D's pages are not the fresh shadow's (pre's sequence is recycling there).
	tp.flow(0, "new", prompt(2, 100), 4)
	tp.flush()
	ds, ss := d.snapshot(t), tp.shadowSnapshot(d.addr())
	if dr, sr := requestOf(ds, "new"), requestOf(ss, "new"); fmt.Sprint(dr.Runs) != fmt.Sprint(sr.Runs) || dr.State != sr.State {
		t.Errorf("after the resync, new: D %v %s, the shadow %v %s", dr.Runs, dr.State, sr.Runs, sr.State)
	}
	st := tp.standing(d.addr())
	if st.Divergences != 1 || st.Last == nil || st.Last.What != engine.DivergedMetadata {
		t.Fatalf("standing %+v: want one metadata divergence for the pages of before the tap", st)
	}
	// The pages pre holds on D are of unknown use to the shadow, which hands them out last:
	// the next request's pages are predicted.
	if st.UnknownPages == 0 || !strings.Contains(st.Describe(0), "pages of unknown use") {
		t.Errorf("standing %q: want the pages of before the tap counted as of unknown use", st.Describe(0))
	}
	// The page map shows them so, not as free: the shadow's snapshot, and a viewer's View
	// of it, kept as events apply and built from scratch alike.
	if n := ss.Derived.Pages[engine.PageUnknown]; n != st.UnknownPages || len(ss.Follow.UnknownPageIDs) < n {
		t.Errorf("the snapshot counts %d pages of unknown use (ids %v), the standing %d", n, ss.Follow.UnknownPageIDs, st.UnknownPages)
	}
	v, err := engine.NewView(ss)
	if err != nil {
		t.Fatal(err)
	}
	pm := v.PageMap()
	for _, pg := range ss.Follow.UnknownPageIDs {
		if got := pm.States[pg]; got == engine.PageFree {
			t.Errorf("page %d, of unknown use and free in the shadow, shows %s", pg, got)
		}
	}
	if vs, _ := v.Follow(); pm.Count[engine.PageUnknown] != st.UnknownPages || vs.UnknownPages != st.UnknownPages {
		t.Errorf("a viewer's page map shows %d pages of unknown use, its standing %d; the shadow's %d", pm.Count[engine.PageUnknown], vs.UnknownPages, st.UnknownPages)
	}
	tp.flow(0, "next", prompt(3, 100), 4)
	if st := tp.standing(d.addr()); st.Divergences != 1 {
		t.Errorf("after the resync, the next request diverged too: %+v", st.Last)
	}
}

// A decode instance restarted under the tap: calls to it fail while it is down (the tap
// answers 502), and when it answers again the shadow starts over, then follows the new D
// exactly.
func TestTapFollowsARestartedDecodeInstance(t *testing.T) {
	cfg := smallConfig()
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	tp.flow(0, "a", prompt(3, 120), 5)
	addr := tp.ds[0].addr()
	tp.ds[0].stop()
	tp.check = func(string) {}
	if err := tp.PrepRecv(engine.PrepRecv{ID: "lost", Prompt: prompt(4, 50), End: -1}); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("prep_recv to a stopped D = %v, want the tap's 502", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	tp.ds[0] = startDecode(t, cfg, ln)
	tp.check = tp.same
	tp.flow(0, "b", prompt(5, 140), 5)
	tp.flow(0, "c", prompt(5, 160), 5)
	var inst Instance
	for _, in := range tp.tap.Instances(t.Context()) {
		if in.Address == addr {
			inst = in
		}
	}
	if inst.Resets != 1 || inst.Failures == 0 {
		t.Errorf("instance %+v: want one reset and the failed call counted", inst)
	}
}

// Clients that leave: one whose prep_recv waits (D cannot admit it), one that stops reading
// its completion. D aborts both, and so does the shadow; nothing else breaks.
func TestTapFollowsClientsThatLeave(t *testing.T) {
	testStepsPerSec = 200
	defer func() { testStepsPerSec = 0 }()
	cfg := smallConfig()
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	d := tp.ds[0]
	// Too long to be admitted under the watermark: it waits.
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"user": "waits", "prompt": prompt(6, 2000), "end": -1})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.srv.URL+"/microserving/prep_recv", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := tp.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, "the request waits on D", func() bool { return len(d.snapshot(t).Waiting) == 1 })
	tp.flush()
	if s := tp.shadowSnapshot(d.addr()); len(s.Waiting) != 1 || requestOf(s, "waits").Eval == nil {
		t.Errorf("the shadow's waiting queue %v, eval %v: want the request blocked, with why", s.Waiting, requestOf(s, "waits").Eval)
	}
	cancel()
	<-errc
	waitFor(t, "D aborts it", func() bool { return requestOf(d.snapshot(t), "waits").State == engine.StateAborted })
	tp.same("the waiting client leaving")

	// A completion whose reader leaves after the first token (D paced, so that it is still
	// decoding when the reader goes).
	tp.check = func(string) {}
	tp.rr = 0
	if err := tp.PrepRecv(engine.PrepRecv{ID: "reader", Prompt: prompt(7, 100), End: -1, MaxTokens: 2000}); err != nil {
		t.Fatal(err)
	}
	r := requestOf(d.snapshot(t), "reader")
	if err := tp.WriteKV("reader", r.Encoded, 0, r.Reserved); err != nil {
		t.Fatal(err)
	}
	resp, err := tp.post(d.srv.URL, "/microserving/start_generate", map[string]any{"user": "reader", "begin": r.End, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n')
	resp.Body.Close()
	waitFor(t, "D aborts the reader's request", func() bool { return requestOf(d.snapshot(t), "reader").State == engine.StateAborted })
	tp.flush()
	if got := requestOf(tp.shadowSnapshot(d.addr()), "reader").State; got != engine.StateAborted {
		t.Errorf("the shadow's reader request is %s, want aborted", got)
	}
}

// A prefill instance that fails remote_send: the request's KV stays missing on D and in the
// shadow, the P's failure is shown, and the router's retry goes through.
func TestTapShowsAFailedRemoteSend(t *testing.T) {
	cfg := smallConfig()
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	tp.rr = 0
	if err := tp.PrepRecv(engine.PrepRecv{ID: "x", Prompt: prompt(8, 90), End: -1, MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	r := requestOf(tp.ds[0].snapshot(t), "x")
	tp.p.fail["x"] = true
	if err := tp.WriteKV("x", r.Encoded, 0, r.Reserved); err == nil {
		t.Fatal("remote_send succeeded, want P's failure")
	}
	if s := requestOf(tp.shadowSnapshot(tp.ds[0].addr()), "x"); s.State != engine.StatePrepared || s.Received != 0 {
		t.Errorf("the shadow's x: %s with %d received, want prepared awaiting KV", s.State, s.Received)
	}
	var p Instance
	for _, in := range tp.tap.Instances(t.Context()) {
		if in.Address == strings.TrimPrefix(tp.p.srv.URL, "http://") {
			p = in
		}
	}
	if !strings.Contains(p.Note, "remote_send of x answered 500") || p.Failures != 1 {
		t.Errorf("P's instance %+v: want the failure shown", p)
	}
	delete(tp.p.fail, "x")
	if err := tp.WriteKV("x", r.Encoded, 0, r.Reserved); err != nil {
		t.Fatal(err)
	}
	if err := tp.StartGenerate("x", r.End); err != nil {
		t.Fatal(err)
	}
}

// A stream cut mid-way by the instance, and an instance that is not MLC at all (404 to
// everything): each shown, neither fatal to the tap or to the shadow of a real D.
func TestTapSurvivesCutStreamsAndStrangers(t *testing.T) {
	cfg := smallConfig()
	// A decode instance whose answers are a fresh engine's, and whose stream breaks after two
	// tokens.
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case pathPrepRecv:
			io.WriteString(w, `{"prompt_length":40,"prefix_matched_length":0,"kv_append_metadata":"CAAAAAAAAABbMSwwLDM5XQ=="}`)
		case pathStartGenerate:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"text\":\" lo\"}]}\n\ndata: {\"choices\":[{\"text\":\" mi\"}]}\n\n")
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		}
	}))
	defer cut.Close()
	stranger := httptest.NewServer(http.NotFoundHandler())
	defer stranger.Close()
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg})
	tp.check = func(string) {}

	call := func(base, path string, body any) (int, string) {
		resp, err := tp.post(base, path, body)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := call(cut.URL, pathPrepRecv, map[string]any{"user": "c", "prompt": prompt(9, 40), "end": -1}); code != 200 {
		t.Fatalf("prep_recv to the cutting D: %d", code)
	}
	code, got := call(cut.URL, pathStartGenerate, map[string]any{"user": "c", "begin": 39, "stream": true})
	if code != 200 || !strings.Contains(got, " mi") {
		t.Errorf("the cut stream through the tap: %d %q, want both chunks before the cut", code, got)
	}
	if code, _ := call(stranger.URL, pathPrepRecv, map[string]any{"user": "s", "prompt": prompt(9, 40), "end": -1}); code != 404 {
		t.Errorf("prep_recv to a stranger = %d, want its 404 passed on", code)
	}
	tp.flush()
	if r := requestOf(tp.shadowSnapshot(strings.TrimPrefix(cut.URL, "http://")), "c"); r.State != engine.StateAborted {
		t.Errorf("the cut request in the shadow: %s, want aborted", r.State)
	}
	for _, in := range tp.tap.Instances(t.Context()) {
		if in.Address == strings.TrimPrefix(stranger.URL, "http://") && (in.Role != RoleUnknown || !strings.Contains(in.Note, "not an MLC")) {
			t.Errorf("the stranger: %+v", in)
		}
	}
	// A real D through the same tap is followed as before.
	tp.check = tp.same
	tp.flow(0, "ok", prompt(10, 80), 4)
}

// A shadow whose queue overflows never holds a call back: the calls go through whole, the
// lost observations are counted, and the shadow starts over.
func TestTapQueueOverflowStartsTheShadowOver(t *testing.T) {
	cfg := smallConfig()
	// Room for the few observations of one call at a time (so that the flow after the storm
	// fits however slowly the shadow applies it), not for a held shadow's 200-token streams.
	tp := newTopology(t, []engine.Config{cfg}, Config{Engine: cfg, Queue: 16})
	tp.check = func(string) {}
	tp.flow(0, "first", prompt(19, 60), 3)
	// Hold the shadow's engine, as a shadow far behind its traffic is held.
	r, ok := tp.tap.Runner(tp.ds[0].addr())
	if !ok {
		t.Fatal("no shadow")
	}
	release, held := make(chan struct{}), make(chan struct{})
	go r.Do(context.Background(), func(*engine.Engine, time.Time) error { close(held); <-release; return nil })
	<-held
	for i := range 3 {
		tp.rr = 0
		id := fmt.Sprintf("q%d", i)
		if err := tp.PrepRecv(engine.PrepRecv{ID: id, Prompt: prompt(20+i, 60), End: -1, MaxTokens: 200}); err != nil {
			t.Fatal(err)
		}
		r := requestOf(tp.ds[0].snapshot(t), id)
		if err := tp.WriteKV(id, r.Encoded, 0, r.Reserved); err != nil {
			t.Fatal(err)
		}
		if err := tp.StartGenerate(id, r.End); err != nil {
			t.Fatal(err)
		}
		tp.pending = nil
	}
	if got := requestOf(tp.ds[0].snapshot(t), "q2"); got.State != engine.StateFinished || got.Generated != 201 { // 200 streamed and the committed last prompt token
		t.Fatalf("D's q2 = %s after %d tokens: the calls did not go through whole", got.State, got.Generated)
	}
	close(release)
	tp.flush()
	var in Instance
	for _, i := range tp.tap.Instances(t.Context()) {
		if i.Address == tp.ds[0].addr() {
			in = i
		}
	}
	if in.Dropped == 0 || in.Resets == 0 {
		t.Errorf("instance %+v: want observations dropped and the shadow started over", in)
	}
	// A new request after the storm: the shadow follows it (its pages may first diverge:
	// the shadow starts over knowing nothing of what D holds).
	tp.flow(0, "after", prompt(30, 60), 3)
	tp.flush()
	if s := requestOf(tp.shadowSnapshot(tp.ds[0].addr()), "after"); s.State != engine.StateFinished {
		t.Errorf("the shadow's request after the overflow: %s, want finished", s.State)
	}
}
