// Package deploy holds the Grafana dashboard and the Prometheus alerts that ship with
// kvtop; its tests keep them true to what kvtop serves.
package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/internal/lockstep"
)

var update = flag.Bool("update", false, "rewrite prometheus/alerts_test.yml from the recycle-stall scenario")

// tapOnly are the series only kvtop tap serves (package tap checks it serves them); the
// dashboard and the alerts name them.
var tapOnly = map[string]bool{"kvtop_tap_divergences_total": true}

// exprs returns every PromQL expression of the dashboard and the alerts.
func exprs(t *testing.T) []string {
	t.Helper()
	var out []string
	raw, err := os.ReadFile("grafana/kvtop.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana/kvtop.json: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	rules, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	// expr: one line, or a folded block (>) of indented lines.
	lines := strings.Split(string(rules), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		e, ok := strings.CutPrefix(l, "expr:")
		if !ok {
			continue
		}
		e = strings.TrimSpace(e)
		if e == ">" || e == "|" {
			e = ""
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "          ") {
				i++
				e += " " + strings.TrimSpace(lines[i])
			}
		}
		out = append(out, e)
	}
	if len(out) < 10 {
		t.Fatalf("found %d expressions, want the dashboard's and the alerts'", len(out))
	}
	return out
}

// scrape runs `kvtop serve --drive recycle-stall --kv-events …` for a few seconds and
// returns its /metrics: sample name → label sets.
func scrape(t *testing.T) map[string][]map[string]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "kvtop")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/kvtop").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--drive", "recycle-stall", "--steps-per-sec", "400",
		"--kv-events", "tcp://127.0.0.1:0")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var url string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if url == "" {
		t.Fatal("serve did not say where it listens")
	}
	time.Sleep(4 * time.Second) // the stall sets in
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string][]map[string]string{}
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	for _, l := range strings.Split(string(body), "\n") {
		m := sample.FindStringSubmatch(l)
		if m == nil || strings.HasPrefix(l, "#") {
			continue
		}
		ls := map[string]string{}
		for _, kv := range label.FindAllStringSubmatch(m[2], -1) {
			ls[kv[1]] = kv[2]
		}
		out[m[1]] = append(out[m[1]], ls)
	}
	return out
}

// Every metric the dashboard and the alerts name is in the /metrics of a running scenario,
// with every label they match on, and every value they match exactly.
func TestEveryMetricUsedIsServed(t *testing.T) {
	served := scrape(t)
	if got := served["kvtop_blocked_requests"]; len(got) == 0 {
		t.Fatalf("the scrape has no kvtop_blocked_requests: %d names", len(served))
	}
	selector := regexp.MustCompile(`(kvtop_[a-z0-9_]+)(\{([^}]*)\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
	for _, e := range exprs(t) {
		for _, m := range selector.FindAllStringSubmatch(e, -1) {
			name := m[1]
			if tapOnly[name] {
				continue
			}
			sets, ok := served[name]
			if !ok {
				t.Errorf("%s: %s is not served", e, name)
				continue
			}
			for _, mm := range matcher.FindAllStringSubmatch(m[3], -1) {
				lname, op, value := mm[1], mm[2], mm[3]
				if lname == "instance" {
					continue // Prometheus's own
				}
				has, hasValue := false, false
				for _, ls := range sets {
					v, ok := ls[lname]
					has = has || ok
					hasValue = hasValue || v == value
				}
				switch {
				case !has:
					t.Errorf("%s: %s has no label %s", e, name, lname)
				case op == "=" && !hasValue:
					t.Errorf("%s: %s has no series with %s=%q", e, name, lname, value)
				case op == "=~":
					for _, alt := range strings.Split(value, "|") {
						found := false
						for _, ls := range sets {
							found = found || ls[lname] == alt
						}
						if !found {
							t.Errorf("%s: %s has no series with %s=%q", e, name, lname, alt)
						}
					}
				}
			}
		}
	}
}

// The series the rule test replays are recorded from the recycle-stall scenario: the
// engine in lockstep, its state read through a View, as /metrics reads it, every 15s of
// simulated time for 6 minutes.
func TestAlertTestSeriesAreRecordedFromTheScenario(t *testing.T) {
	const every, span = 15 * time.Second, 6 * time.Minute
	series := map[string][]string{}
	var v *engine.View
	next := lockstep.Start
	record := func() {
		d, f := v.Derived(), v.Fleet()
		put := func(key string, x float64) { series[key] = append(series[key], fmt.Sprint(x)) }
		put(`kvtop_blocked_requests{reason="watermark"}`, float64(d.BlockedBy[prepare.ReasonWatermark]))
		put(`kvtop_kv_evictable_pages`, float64(f.Evictable))
		put(`kvtop_oldest_request_age_seconds{state="waiting"}`, float64(f.OldestAge[engine.AgeWaiting])/1000)
		put(`kvtop_oldest_request_age_seconds{state="prepared"}`, float64(f.OldestAge[engine.AgePrepared])/1000)
		for r := range engine.NumStuckReasons {
			put(`kvtop_stuck_requests{reason="`+r.String()+`"}`, float64(f.StuckBy[r]))
		}
	}
	steps := int(span / (50 * time.Millisecond))
	_, err := lockstep.Run("recycle-stall", 1, steps, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		if v == nil {
			var err error
			if v, err = engine.NewView(e.Snapshot()); err != nil {
				t.Fatal(err)
			}
			return
		}
		for _, ev := range evs {
			if err := v.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		for now := time.UnixMilli(v.Stamp().At); !now.Before(next); next = next.Add(every) {
			record()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(header)
	for _, k := range keys {
		name, labels, _ := strings.Cut(strings.TrimSuffix(k, "}"), "{")
		sel := `instance="d0", job="kvtop"`
		if labels != "" {
			sel = labels + ", " + sel
		}
		fmt.Fprintf(&b, "      - series: '%s{%s}'\n        values: '%s'\n", name, sel, strings.Join(series[k], " "))
	}
	b.WriteString(footer)
	const path = "prometheus/alerts_test.yml"
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != b.String() {
		t.Errorf("%s is not what the recycle-stall scenario records now; run go test ./deploy -update", path)
	}
}

const header = `# Generated by TestAlertTestSeriesAreRecordedFromTheScenario (go test ./deploy -update):
# the recycle-stall scenario, sampled every 15s of engine time. Run with
#   promtool test rules deploy/prometheus/alerts_test.yml
rule_files:
  - alerts.yml
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
`

const footer = `    alert_rule_test:
      # The stall: blocked by the watermark while recycling pages sit evictable, for good.
      - eval_time: 5m
        alertname: KvtopWatermarkStall
        exp_alerts:
          - exp_labels:
              severity: page
              instance: d0
            exp_annotations:
              summary: "d0: admission stalled by the watermark while pages are evictable"
              description: "Requests are blocked by the prepare-receive watermark while recycling sequences hold pages that eviction would free; MLC's watermark never evicts, so this waits for good (docs/admission.md, the watermark stall). Bound --max-recycling."
      # Not at the start: the cache is filling, nothing is blocked yet.
      - eval_time: 15s
        alertname: KvtopWatermarkStall
        exp_alerts: []
      - eval_time: 15s
        alertname: KvtopPreparedLeak
        exp_alerts: []
`
