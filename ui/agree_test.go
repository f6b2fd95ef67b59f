package ui

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/wire"
)

// One source of truth: in every scenario, after every engine step, the numbers the
// dashboard draws (its header's request counts, the page map's legend), the values /metrics
// serves and the snapshot the server answers with are the same numbers. The dashboard and
// /metrics each fold their own subscription of the engine's events into a View; the snapshot
// is the engine's own.
func TestDashboardMetricsAndSnapshotAgree(t *testing.T) {
	steps := 160
	if testing.Short() {
		steps = 40
	}
	for _, sc := range sim.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			a := newAgreement(t, sc)
			checked := map[string]bool{}
			for step := 1; step <= steps; step++ {
				a.step(uint64(step))
				want := a.snapshotDerived()
				got := a.dashboard()
				for name, n := range a.metrics() {
					if got[name] != n {
						t.Fatalf("step %d: %s: the dashboard shows %d, /metrics says %d", step, name, got[name], n)
					}
				}
				for name, n := range want {
					if got[name] != n {
						t.Fatalf("step %d: %s: the dashboard shows %d, the snapshot says %d", step, name, got[name], n)
					}
					if n > 0 {
						checked[name] = true
					}
				}
			}
			// The scenario must have shown something for the agreement to mean anything.
			if !checked["pages active"] && !checked["pages prepared"] && !checked["requests blocked"] {
				t.Errorf("nothing but free pages in %d steps: %v", steps, checked)
			}
		})
	}
}

// agreement is a scenario's engine, paused on a runner with the simulator as its hook and
// a fake clock, with kvtop serve's handler over it and a dashboard folding a subscription.
type agreement struct {
	t     *testing.T
	r     *runner.Runner
	srv   *wire.Server
	sub   *runner.Local
	m     *Model
	clock *fakeClock
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newAgreement(t *testing.T, sc sim.Scenario) *agreement {
	cfg := engine.DefaultConfig()
	sc.Configure(&cfg)
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := sc.New(sim.Options{Seed: 3, TracePath: "../sim/testdata/small_trace.jsonl", Speed: 4})
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: time.UnixMilli(1_700_000_000_000)}
	r := runner.New(e, runner.Config{Clock: clock.Now, StartPaused: true, Hook: sim.NewHook(sim.NewDriver(w, sc.Driver))})
	ctx, cancel := context.WithCancel(context.Background())
	go r.Run(ctx)
	srv := wire.NewServer(r, wire.Options{Version: "kvtop test"})
	sub := r.Local()
	m := New(sub, Options{Name: sc.Name})
	m.Update(sizeMsg(200, 60))
	m.Update(keyMsg("2")) // the pages panel, with its legend, zoomed from the overview
	m.Update(keyMsg("z"))
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-r.Done()
	})
	return &agreement{t: t, r: r, srv: srv, sub: sub, m: m, clock: clock}
}

// step runs engine step n and folds everything up to its end into the dashboard.
func (a *agreement) step(n uint64) {
	a.clock.advance(100 * time.Millisecond)
	if err := a.r.Control(feed.Control{Op: feed.ControlStep, N: 1}); err != nil {
		a.t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-a.sub.C():
		case <-deadline:
			a.t.Fatalf("step %d did not come", n)
		}
		u := a.sub.Take()
		a.m.Update(updateMsg{u})
		if v := a.m.live.view; v != nil && v.Last().Step == n && a.m.diverged == nil {
			return
		}
	}
}

func (a *agreement) get(path string) []byte {
	rec := httptest.NewRecorder()
	// A loopback Host, as kvtop serve without a token requires.
	a.srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil))
	if rec.Code != http.StatusOK {
		a.t.Fatalf("GET %s = %d %s", path, rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

// snapshotDerived reads the server's snapshot and names its derived counts as the other
// two name theirs.
func (a *agreement) snapshotDerived() map[string]int {
	var s engine.Snapshot
	if err := json.Unmarshal(a.get("/v1/snapshot"), &s); err != nil {
		a.t.Fatal(err)
	}
	d := s.Derived
	out := map[string]int{
		"waiting": d.Waiting, "blocked": d.Blocked, "prepared": d.Prepared, "awaiting KV": d.AwaitingKV,
		"running": d.Running, "prefilling": d.Prefilling, "stuck": d.Stuck,
	}
	for _, st := range engine.PageStates() {
		out["pages "+st.String()] = d.Pages[st]
	}
	for _, st := range engine.States() {
		out["requests "+st.String()] = d.Requests[st]
	}
	for _, r := range prepare.Reasons() {
		out["blocked by "+r.String()] = d.BlockedBy[r]
	}
	return out
}

var metricLine = regexp.MustCompile(`^(kvtop_kv_pages|kvtop_requests|kvtop_blocked_requests|kvtop_stuck_requests)(?:\{(?:state|reason)="([^"]+)"\})? (\S+)$`)

// metrics reads /metrics, named as snapshotDerived names them.
func (a *agreement) metrics() map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(string(a.get("/metrics")), "\n") {
		m := metricLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			a.t.Fatal(err)
		}
		if m[1] == "kvtop_stuck_requests" {
			out["stuck"] += int(n) // by reason: they add up to the stuck count
			continue
		}
		name := map[string]string{"kvtop_kv_pages": "pages ", "kvtop_requests": "requests ",
			"kvtop_blocked_requests": "blocked by "}[m[1]] + m[2]
		out[name] = int(n)
	}
	if len(out) < 10 {
		a.t.Fatalf("/metrics has %d of the derived series", len(out))
	}
	return out
}

var (
	headerCounts = regexp.MustCompile(`waiting ([\d,]+) \(blocked ([\d,]+)\) · prepared ([\d,]+) \(awaiting KV ([\d,]+)\) · running ([\d,]+) \+([\d,]+) prefilling(?: · ! stuck ([\d,]+))?`)
	legendItem   = regexp.MustCompile(`\S ([a-zA-Z ]+?) ([\d,]+)  `)
)

// dashboard reads the numbers off the dashboard's frame: the header's request counts and
// the page map legend's pages by state (the other counts it does not draw are taken from
// its View's derivation, which the header and the legend come from).
func (a *agreement) dashboard() map[string]int {
	frame := ansi.Strip(a.m.frame)
	num := func(s string) int {
		n, _ := strconv.Atoi(strings.ReplaceAll(s, ",", ""))
		return n
	}
	h := headerCounts.FindStringSubmatch(frame)
	if h == nil {
		a.t.Fatalf("no request counts in the header:\n%s", frame)
	}
	out := map[string]int{
		"waiting": num(h[1]), "blocked": num(h[2]), "prepared": num(h[3]), "awaiting KV": num(h[4]),
		"running": num(h[5]), "prefilling": num(h[6]), "stuck": num(h[7]),
	}
	names := map[string]engine.PageState{}
	for _, st := range engine.PageStates() {
		names[pageStateNames[st]] = st
	}
	lines := strings.Split(frame, "\n")
	legend := strings.Join(lines[5:5+legendLines(200, a.m.live.view.Cache().NumPages(), a.m.live.legendStates())], "  ") + "  "
	seen := 0
	for _, it := range legendItem.FindAllStringSubmatch(legend, -1) {
		if st, ok := names[it[1]]; ok {
			out["pages "+st.String()] = num(it[2])
			seen++
		}
	}
	shown := a.m.live.legendStates()
	if seen != len(shown) {
		a.t.Fatalf("the legend shows %d of %d page states:\n%s", seen, len(shown), legend)
	}
	// A state the legend leaves out (a shadow's pages of unknown use, outside a shadow) has
	// no page.
	for _, st := range engine.PageStates() {
		if !slices.Contains(shown, st) {
			if n := a.m.live.pages().Count[st]; n != 0 {
				a.t.Fatalf("the legend leaves %s out, and %d pages are %s", st, n, st)
			}
			out["pages "+st.String()] = 0
		}
	}
	d := a.m.live.view.Derived()
	for _, st := range engine.States() {
		out["requests "+st.String()] = d.Requests[st]
	}
	for _, r := range prepare.Reasons() {
		out["blocked by "+r.String()] = d.BlockedBy[r]
	}
	return out
}
