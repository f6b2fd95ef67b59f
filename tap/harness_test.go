package tap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/wire"
)

// testStepsPerSec paces the decode instances a test starts (0: as fast as they go).
var testStepsPerSec float64

// decodeServer is a `kvtop serve` in the test: an engine, its runner and its HTTP server, on
// loopback.
type decodeServer struct {
	srv    *httptest.Server
	r      *runner.Runner
	ws     *wire.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func startDecode(t *testing.T, cfg engine.Config, ln net.Listener) *decodeServer {
	t.Helper()
	return startDecodeOn(t, cfg, ln)
}

func startDecodeTB(tb testing.TB, cfg engine.Config) *decodeServer {
	return startDecodeOn(tb, cfg, nil)
}

func startDecodeOn(t testing.TB, cfg engine.Config, ln net.Listener) *decodeServer {
	t.Helper()
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := runner.New(e, runner.Config{Clock: time.Now, StepsPerSec: testStepsPerSec})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	ws := wire.NewServer(r, wire.Options{Version: "kvtop test"})
	srv := httptest.NewUnstartedServer(ws)
	if ln != nil {
		srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	d := &decodeServer{srv: srv, r: r, ws: ws, cancel: cancel, done: done}
	t.Cleanup(d.stop)
	return d
}

func (d *decodeServer) stop() {
	if d.cancel == nil {
		return
	}
	d.srv.CloseClientConnections()
	d.srv.Close()
	d.ws.Close()
	d.cancel()
	<-d.done
	d.cancel = nil
}

func (d *decodeServer) addr() string { return strings.TrimPrefix(d.srv.URL, "http://") }

// snapshot reads D's own /v1/snapshot.
func (d *decodeServer) snapshot(t *testing.T) engine.Snapshot {
	t.Helper()
	return getSnapshot(t, d.srv.URL+"/v1/snapshot")
}

func getSnapshot(t *testing.T, u string) engine.Snapshot {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", u, resp.Status, b)
	}
	var s engine.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// prefillServer answers remote_send as MLC's P does: it writes the KV of [begin, end) into
// the slots kv_addr_info names, on the decode instance recv_rank names (straight to its
// /v1/kv, as NVSHMEM writes straight into D's memory: the tap does not see it), then
// answers {}. fail makes it answer 500 for the ids it names, having written nothing.
type prefillServer struct {
	srv   *httptest.Server
	ds    []*decodeServer
	fail  map[string]bool
	calls atomic.Int64 // remote_sends answered (the router's calls may race)
}

func startPrefill(t *testing.T, ds []*decodeServer) *prefillServer {
	p := &prefillServer{ds: ds, fail: map[string]bool{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/microserving/remote_send" {
			http.NotFound(w, r)
			return
		}
		p.calls.Add(1)
		var b struct {
			User       string `json:"user"`
			Begin, End int
			KVAddrInfo string `json:"kv_addr_info"`
			RecvRank   int    `json:"recv_rank"`
		}
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.RecvRank < 0 || b.RecvRank >= len(p.ds) {
			http.Error(w, "bad remote_send", http.StatusBadRequest)
			return
		}
		if p.fail[b.User] {
			http.Error(w, `{"error":"prefill failed"}`, http.StatusInternalServerError)
			return
		}
		req, _ := http.NewRequest(http.MethodPost, p.ds[b.RecvRank].srv.URL+"/v1/kv", nil)
		req.Header.Set("KV-Append-Metadata", b.KVAddrInfo)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			http.Error(w, "kv write: "+resp.Status, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// topology is the sim's router driving, through the tap as its HTTP proxy, decode
// instances and a prefill instance.
type topology struct {
	t      *testing.T
	tap    *Tap
	tapSrv *httptest.Server
	ds     []*decodeServer
	p      *prefillServer
	client *http.Client
	// What the router knows of each request in flight: its D, its matched length and end.
	at      map[string]int
	matched map[string]int
	ends    map[string]int
	running []int // requests started and not ended, per D
	rr      int
	pending []func(*sim.Driver, sim.Calls)
	// check runs after every call.
	check func(call string)
	// calls counts the calls made through the tap.
	calls int
}

func newTopology(t *testing.T, dcfgs []engine.Config, tcfg Config) *topology {
	t.Helper()
	tp := &topology{t: t, at: map[string]int{}, matched: map[string]int{}, ends: map[string]int{}}
	for _, c := range dcfgs {
		tp.ds = append(tp.ds, startDecode(t, c, nil))
	}
	tp.running = make([]int, len(tp.ds))
	tp.p = startPrefill(t, tp.ds)
	tp.tapSrv = httptest.NewUnstartedServer(nil)
	tcfg.Listen = tp.tapSrv.Listener.Addr().String()
	tp.tap = mustTap(t, tcfg)
	tp.tapSrv.Config.Handler = tp.tap
	tp.tapSrv.Start()
	proxy, _ := url.Parse(tp.tapSrv.URL)
	tp.client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 20 * time.Second}
	tp.check = tp.same
	return tp
}

func mustTap(t *testing.T, cfg Config) *Tap {
	t.Helper()
	tap, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tap.Close)
	return tap
}

// same checks that every D's shadow equals D, after the tap has applied what it saw.
func (tp *topology) same(after string) {
	tp.t.Helper()
	tp.flush()
	for i, d := range tp.ds {
		want := d.snapshot(tp.t)
		got := tp.shadowSnapshot(d.addr())
		if diff := engine.ShadowDiff(want, got); diff != nil {
			tp.t.Fatalf("after %s, the shadow of D%d differs from D:\n%s", after, i, strings.Join(diff, "\n"))
		}
		if got.Follow == nil || got.Follow.Divergences != 0 {
			tp.t.Fatalf("after %s, the shadow of D%d has standing %+v", after, i, got.Follow)
		}
	}
}

func (tp *topology) flush() {
	tp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tp.tap.Flush(ctx); err != nil {
		tp.t.Fatal(err)
	}
}

// shadowSnapshot reads the tap's snapshot of a decode instance ({} of engine.Snapshot when
// the tap has none yet: an empty engine of the tap's configuration).
func (tp *topology) shadowSnapshot(addr string) engine.Snapshot {
	tp.t.Helper()
	if tp.tap.existingShadow(addr) == nil {
		e, _ := engine.New(tp.tap.cfg.Engine)
		e.Follow()
		return e.Snapshot()
	}
	return getSnapshot(tp.t, tp.tapSrv.URL+"/v1/snapshot?instance="+url.QueryEscape(addr))
}

// post sends a call through the tap.
func (tp *topology) post(base, path string, body any) (*http.Response, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	tp.calls++
	return tp.client.Do(req)
}

// pick chooses the D with the fewest running requests, as MLC's router does (in turn among
// equals, so that both are used).
func (tp *topology) pick() int {
	best := -1
	for k := range tp.ds {
		i := (tp.rr + k) % len(tp.ds)
		if best < 0 || tp.running[i] < tp.running[best] {
			best = i
		}
	}
	tp.rr++
	return best
}

func (tp *topology) later(f func(*sim.Driver, sim.Calls)) { tp.pending = append(tp.pending, f) }

// PrepRecv is the router's first call.
func (tp *topology) PrepRecv(pr engine.PrepRecv) error {
	i := tp.pick()
	body := map[string]any{"user": pr.ID, "prompt": pr.Prompt, "end": pr.End}
	if pr.MaxTokens > 0 {
		body["max_tokens"] = pr.MaxTokens
	}
	resp, err := tp.post(tp.ds[i].srv.URL, "/microserving/prep_recv", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prep_recv %s: %s: %s", pr.ID, resp.Status, b)
	}
	var ans engine.Answer
	if err := json.Unmarshal(b, &ans); err != nil {
		return err
	}
	tp.at[pr.ID], tp.matched[pr.ID] = i, ans.Matched
	end := pr.End
	if end < 0 {
		end += len(pr.Prompt)
	}
	tp.ends[pr.ID] = end
	tp.check("prep_recv " + pr.ID)
	tp.later(func(d *sim.Driver, c sim.Calls) { d.Admitted(pr.ID, ans.Metadata, ans.PromptLength, ans.Matched, c) })
	return nil
}

// WriteKV is the router's remote_send to P (the whole window at once; the sim's later
// writes of the same request have nothing left to do).
func (tp *topology) WriteKV(id, metadata string, offset, n int) error {
	if offset > 0 {
		return nil
	}
	resp, err := tp.post(tp.p.srv.URL, "/microserving/remote_send", map[string]any{
		"user": id, "begin": tp.matched[id], "end": tp.ends[id], "kv_addr_info": metadata, "recv_rank": tp.at[id]})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	tp.check("remote_send " + id)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("remote_send %s: %s", id, resp.Status)
	}
	return nil
}

// StartGenerate streams the completion to its end.
func (tp *topology) StartGenerate(id string, begin int) error {
	i := tp.at[id]
	tp.running[i]++
	defer func() { tp.running[i]-- }()
	resp, err := tp.post(tp.ds[i].srv.URL, "/microserving/start_generate", map[string]any{"user": id, "begin": begin, "stream": true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("start_generate %s: %s: %s", id, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	var toks []int32
	reason := ""
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var c wire.Completion
		if err := json.Unmarshal([]byte(line), &c); err != nil || len(c.Choices) == 0 {
			continue
		}
		got, _ := wire.ParseTokenText(c.Choices[0].Text)
		toks = append(toks, got...)
		if fr := c.Choices[0].FinishReason; fr != nil {
			reason = *fr
		}
	}
	tp.check("start_generate " + id)
	tp.later(func(d *sim.Driver, c sim.Calls) {
		for _, tk := range toks {
			d.Token(id, tk)
		}
		d.Ended(id, reason, c)
	})
	return nil
}

// Abort is the client going away (kvtop serve's /debug/abort).
func (tp *topology) Abort(id string) error {
	resp, err := tp.post(tp.ds[tp.at[id]].srv.URL, "/debug/abort", map[string]string{"user": id})
	if err != nil {
		return err
	}
	resp.Body.Close()
	tp.check("abort " + id)
	return nil
}

// drive runs a scenario's workload through the router until it has made calls calls or the
// simulated time runs out.
func (tp *topology) drive(scenario string, seed uint64, calls int, span time.Duration) *sim.Driver {
	tp.t.Helper()
	sc, err := sim.Lookup(scenario)
	if err != nil {
		tp.t.Fatal(err)
	}
	w, err := sc.New(sim.Options{Seed: seed})
	if err != nil {
		tp.t.Fatal(err)
	}
	dc := sc.Driver
	dc.TransferRate = 1e9 // the whole window in one remote_send
	dc.StartDelay = 0
	d := sim.NewDriver(w, dc)
	for now := time.Duration(0); now < span && tp.calls < calls; now += 50 * time.Millisecond {
		d.Tick(now, tp)
		for len(tp.pending) > 0 {
			f := tp.pending[0]
			tp.pending = tp.pending[1:]
			f(d, tp)
		}
	}
	return d
}

func kvOf(t *testing.T, md string) int64 {
	arr, err := prepare.Decode(md)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := prepare.Split(arr)
	return m.Tokens()
}

var _ = strconv.Itoa
