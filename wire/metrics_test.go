package wire_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/kvtop/kvtop/engine"
)

// The fleet's gauges: stuck requests by reason, the oldest request of each stage, the pages
// eviction could free; and the prep_recv wait histogram, whose OpenMetrics exemplars carry
// the request id that labels never do (the last call's, in the bucket it fell in).
func TestFleetMetrics(t *testing.T) {
	h := newHarness(t, setup{cfg: func(c *engine.Config) { c.MaxTotalSequenceLength = 8192 }})
	a := prompt(40, 1)
	h.flow(t, "A", a, 2)                  // finished: 2 pages recycling
	h.prepRecv("B", prompt(40, 2), -1, 2) // prepared, awaiting KV
	h.prepRecv("C", prompt(40, 3), -1, 2)
	h.post("/debug/abort", map[string]any{"user": "C"}) // leaked
	h.pause()
	m := metrics(t, h)
	for key, want := range map[string]float64{
		`kvtop_stuck_requests{reason="leaked"}`:             1,
		`kvtop_stuck_requests{reason="blocked"}`:            0,
		`kvtop_stuck_requests{reason="awaiting_kv"}`:        0, // not past the age limit yet
		`kvtop_stuck_requests{reason="awaiting_start"}`:     0,
		`kvtop_kv_evictable_pages`:                          m[`kvtop_kv_pages{state="recycling"}`],
		`kvtop_oldest_request_age_seconds{state="waiting"}`: 0,
		`kvtop_oldest_request_age_seconds{state="running"}`: 0,
		`kvtop_prep_recv_wait_seconds_count`:                3,
	} {
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if m[`kvtop_kv_evictable_pages`] == 0 {
		t.Errorf("no evictable pages with A's sequence recycling")
	}
	if _, ok := m[`kvtop_oldest_request_age_seconds{state="awaiting_kv"}`]; !ok {
		t.Errorf("no age for awaiting_kv")
	}

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, h.ts.URL+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0; charset=utf-8")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	// A bucket keeps the exemplar of its latest observation: C's, all three being quick.
	for _, id := range []string{"C"} {
		re := regexp.MustCompile(`(?m)^kvtop_prep_recv_wait_seconds_bucket\{le="[^"]+"\} \d+ # \{request_id="` + id + `"\} [0-9.e-]+`)
		if !re.Match(body) {
			t.Errorf("no exemplar for %s in the OpenMetrics answer:\n%s", id, regexp.MustCompile(`(?m)^kvtop_prep_recv_wait.*$`).FindAll(body, -1))
		}
	}
}
