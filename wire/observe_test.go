package wire_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/ui"
	"github.com/kvtop/kvtop/wire"
)

// The dashboard cannot tell an attached engine from an embedded one.
var _ ui.Source = (*wire.Client)(nil)

// metrics scrapes /metrics into name{labels} → value.
func metrics(t *testing.T, h *harness) map[string]float64 {
	t.Helper()
	status, b := h.call(context.Background(), http.MethodGet, "/metrics", nil, nil)
	if status != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", status, b)
	}
	out := make(map[string]float64)
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// The metrics follow Prometheus's conventions (promlint), carry no request ids, and count
// what the engine holds: pages by state add up to the pool, requests by state, blocked
// requests by reason, prefix tokens, steps, hazards.
func TestMetrics(t *testing.T) {
	h := newHarness(t, setup{cfg: func(c *engine.Config) { c.MaxTotalSequenceLength = 8192 }})
	a := prompt(40, 1)
	h.flow(t, "A", a, 2) // finished: its 41 tokens (3 pages) recycling
	b := prompt(40, 2)
	copy(b, a[:20])
	h.prepRecv("B", b, -1, 2) // forks A at 20: 1 shared page, and 2 of its own awaiting KV
	h.prepRecv("C", prompt(40, 3), -1, 2)
	h.post("/debug/abort", map[string]any{"user": "C"}) // C's 3 pages leak
	h.pause()
	problems, err := testutil.GatherAndLint(h.srv.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	m := metrics(t, h)
	var snap engine.Snapshot
	decode(t, h.snapshotJSON(), &snap)
	total := 0.0
	for _, st := range engine.PageStates() {
		total += m[`kvtop_kv_pages{state="`+st.String()+`"}`]
	}
	if int(total) != snap.Pages.NumPages {
		t.Errorf("pages by state add up to %v, want %d", total, snap.Pages.NumPages)
	}
	for key, want := range map[string]float64{
		`kvtop_kv_pages{state="free"}`:                               float64(len(snap.Pages.Free)),
		`kvtop_kv_pages{state="shared"}`:                             1,
		`kvtop_kv_pages{state="recycling"}`:                          2,
		`kvtop_kv_pages{state="awaiting-kv"}`:                        2,
		`kvtop_kv_pages{state="leaked"}`:                             3,
		`kvtop_requests{state="finished"}`:                           1,
		`kvtop_requests{state="prepared"}`:                           1,
		`kvtop_requests{state="aborted"}`:                            1,
		`kvtop_hazards_total{kind="abort-leak"}`:                     1,
		`kvtop_prefix_hit_tokens_total`:                              20,
		`kvtop_prefix_counterfactual_hit_tokens_total{policy="lru"}`: 20, // nothing evicted: the same
		`kvtop_requests_arrived_total`:                               3,
		`kvtop_requests_finished_total`:                              1,
		`kvtop_blocked_requests{reason="watermark"}`:                 0,
		`kvtop_stream_clients`:                                       0,
		`kvtop_up`:                                                   1,
		`kvtop_engine_paused`:                                        1,
		`kvtop_kv_capacity_tokens`:                                   8192,
		`kvtop_http_requests_total{code="200",route="prep_recv"}`:    3,
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if m[`kvtop_steps_total{action="decode"}`] < 2 || m[`kvtop_prefix_query_tokens_total`] < 114 {
		t.Errorf("steps and prefix queries: %v, %v", m[`kvtop_steps_total{action="decode"}`], m[`kvtop_prefix_query_tokens_total`])
	}
	for key := range m {
		for _, id := range []string{`"A"`, `"B"`, `"C"`} {
			if strings.Contains(key, id) {
				t.Errorf("metric %s carries a request id", key)
			}
		}
	}
}

// Waiting requests are counted by the reason they wait: the head's own, head-of-line
// behind it.
func TestMetricsBlockedByReason(t *testing.T) {
	h := newHarness(t, setup{cfg: func(c *engine.Config) { c.MaxTotalSequenceLength = 4096 }}) // the watermark admits nothing
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	for i, id := range []string{"A", "B", "C"} {
		go func() {
			h.call(ctx, http.MethodPost, "/microserving/prep_recv", jsonBody(t, map[string]any{"user": id, "prompt": prompt(40, 1), "end": -1}), nil)
			done <- struct{}{}
		}()
		waitFor(t, id+" to arrive", func() bool {
			var n uint64
			h.engine(func(e *engine.Engine) { n = e.Totals().Arrived })
			return n == uint64(i+1)
		})
	}
	waitFor(t, "A to be evaluated", func() bool { return h.request("A").Eval != nil })
	m := metrics(t, h)
	if m[`kvtop_blocked_requests{reason="watermark"}`] != 1 || m[`kvtop_blocked_requests{reason="head-of-line"}`] != 2 {
		t.Errorf("blocked: watermark %v, head-of-line %v; want 1 and 2", m[`kvtop_blocked_requests{reason="watermark"}`], m[`kvtop_blocked_requests{reason="head-of-line"}`])
	}
	cancel()
	for range 3 {
		<-done
	}
}

// The event trace is Chrome's trace event format: a JSON array with a track per request,
// its phases as complete spans inside the request's span, and instants.
func TestDumpEventTrace(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.TraceRequests = 2 }})
	for _, id := range []string{"A", "B", "C"} {
		h.flow(t, id, prompt(40, int32(id[0])), 2)
	}
	h.prepRecv("D", prompt(40, 9), -1, 2) // still prepared
	var evs []map[string]any
	var tracks map[string]float64
	var spans map[string][]string
	read := func() {
		status, b := h.post("/debug/dump_event_trace", `{"model": "x"}`)
		if status != http.StatusOK {
			t.Fatalf("dump_event_trace = %d %s", status, b)
		}
		evs = nil
		decode(t, b, &evs)
		tracks, spans = map[string]float64{}, map[string][]string{}
		for _, ev := range evs {
			name, _ := ev["name"].(string)
			tid, _ := ev["tid"].(float64)
			switch ev["ph"] {
			case "M":
				if name == "thread_name" {
					tracks[ev["args"].(map[string]any)["name"].(string)] = tid
				}
			case "X", "B":
				for id, t := range tracks {
					if t == tid {
						spans[id] = append(spans[id], name+"/"+ev["ph"].(string))
					}
				}
			}
		}
	}
	// The trace follows the engine's events as they come: D's admission (its awaiting-KV
	// span) may reach it after D's arrival does.
	waitFor(t, "the trace to hold D's admission", func() bool {
		read()
		return slices.Contains(spans["D"], "awaiting KV/B")
	})
	if _, ok := tracks["A"]; ok || len(tracks) != 3 {
		t.Errorf("tracks %v: want B and C (the ring keeps 2 finished) and D", tracks)
	}
	if got, want := strings.Join(spans["C"], " "), "request C/X waiting/X awaiting KV/X KV complete/X decode/X"; got != want {
		t.Errorf("C's spans = %s, want %s", got, want)
	}
	if got, want := strings.Join(spans["D"], " "), "request D/B waiting/X awaiting KV/B"; got != want {
		t.Errorf("D's spans = %s, want %s", got, want)
	}
	b, _ := json.Marshal(evs)
	if !strings.Contains(string(b), `"name":"metadata"`) {
		t.Errorf("no metadata instant in %s", b)
	}
}
