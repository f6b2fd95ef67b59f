package tap

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/wire"
)

// Instance is one P or D as /v1/instances shows it.
type Instance struct {
	Address string `json:"address"`
	Role    string `json:"role"`
	// Note says what is odd about it: not MLC (404s), unreachable, a failed remote_send.
	Note     string `json:"note,omitempty"`
	Calls    uint64 `json:"calls"`
	Failures uint64 `json:"failures"`
	// The rest is a decode instance's, from its shadow.
	Requests  map[string]int `json:"requests,omitempty"` // by state
	Stuck     int            `json:"stuck"`
	PagesUsed int            `json:"pages_used"`
	PagesFree int            `json:"pages_free"`
	Pages     int            `json:"pages"`
	// OldestWaitingMs is the age of the oldest waiting request; Head the request at the
	// head of the line and Why why it waits ("" when it is not blocked).
	OldestWaitingMs int64  `json:"oldest_waiting_ms"`
	Head            string `json:"head,omitempty"`
	Why             string `json:"why,omitempty"`
	Step            uint64 `json:"step"`
	// Divergences counts every divergence of its shadow, LastDivergence the last's kind and
	// cause; Standing says it in words ("exact since step N", "diverged 3 times …").
	Divergences    uint64          `json:"divergences"`
	LastDivergence string          `json:"last_divergence,omitempty"`
	Standing       string          `json:"standing,omitempty"`
	Follow         engine.Standing `json:"follow"`
	Dropped        uint64          `json:"dropped"` // observations lost to a full queue
	Resets         uint64          `json:"resets"`  // times the shadow started over
}

// Instances lists every instance the tap has seen, in the order it saw them.
func (t *Tap) Instances(ctx context.Context) []Instance {
	t.mu.Lock()
	out := make([]Instance, 0, len(t.order)) // an empty list, not null, before any traffic
	var shs []*shadow
	for _, addr := range t.order {
		in := t.insts[addr]
		out = append(out, Instance{Address: addr, Role: in.role, Note: in.note, Calls: in.calls, Failures: in.failures})
		shs = append(shs, in.sh)
	}
	t.mu.Unlock()
	for i, sh := range shs {
		if sh == nil {
			continue
		}
		o := &out[i]
		o.Divergences, o.Dropped = sh.divergences.Load(), sh.dropped.Load()
		if c, ok := sh.lastCause.Load().(string); ok {
			o.LastDivergence = c
		}
		sh.mu.Lock()
		o.Resets = sh.resets
		sh.mu.Unlock()
		r, _ := sh.current()
		// A shadow that is far behind answers when it can; the list does not wait for it
		// (what the engine's goroutine fills in is its own copy, handed over when done).
		got := make(chan Instance, 1)
		go r.Do(t.ctx, func(e *engine.Engine, _ time.Time) error {
			var x Instance
			d := e.Derived()
			f := e.Fleet()
			x.Requests = map[string]int{}
			for _, st := range engine.States() {
				if n := d.Requests[st]; n > 0 {
					x.Requests[st.String()] = n
				}
			}
			x.Stuck = d.Stuck
			x.Pages = e.Cache().NumPages()
			x.PagesFree = d.FreePages
			x.PagesUsed = x.Pages - x.PagesFree
			x.OldestWaitingMs = f.OldestAge[engine.AgeWaiting]
			if id, ev, ok := e.Head(); ok {
				x.Head = id
				if ev.Blocked() {
					x.Why = ev.Short()
				}
			}
			x.Step = e.StepNumber()
			x.Follow = e.Standing()
			x.Standing = x.Follow.Describe(t.cfg.Clock().UnixMilli())
			got <- x
			return nil
		})
		select {
		case x := <-got:
			o.Requests, o.Stuck, o.Pages, o.PagesFree, o.PagesUsed = x.Requests, x.Stuck, x.Pages, x.PagesFree, x.PagesUsed
			o.OldestWaitingMs, o.Head, o.Why, o.Step, o.Follow, o.Standing = x.OldestWaitingMs, x.Head, x.Why, x.Step, x.Follow, x.Standing
		case <-time.After(2 * time.Second):
			if o.Note == "" {
				o.Note = "its shadow is busy: no numbers yet"
			}
		case <-ctx.Done():
		}
	}
	return out
}

// serveAPI serves the tap's own calls (behind wire.Guard).
func (t *Tap) serveAPI(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", http.MethodGet)
		wire.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "%s %s: the tap's API is read-only; use GET", r.Method, r.URL.Path)
		return
	}
	switch r.URL.Path {
	case "/healthz":
		t.mu.Lock()
		n := len(t.order)
		t.mu.Unlock()
		wire.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "version": t.cfg.Version, "tap": true, "instances": n})
	case "/v1/instances":
		wire.WriteJSON(w, http.StatusOK, map[string]any{"instances": t.Instances(r.Context())})
	case "/v1/snapshot", "/v1/stream":
		addr := r.URL.Query().Get("instance")
		if addr == "" {
			wire.WriteError(w, http.StatusBadRequest, "invalid_request", "%s: say which decode instance: ?instance=HOST:PORT (GET /v1/instances lists them)", r.URL.Path)
			return
		}
		sh := t.existingShadow(addr)
		if sh == nil {
			wire.WriteError(w, http.StatusNotFound, "unknown_instance", "%s: the tap has seen no decode instance %s (GET /v1/instances lists them)", r.URL.Path, addr)
			return
		}
		_, srv := sh.current()
		srv.ServeHTTP(w, r)
	case "/metrics":
		promhttp.HandlerFor(t.gatherer(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
	default:
		wire.WriteError(w, http.StatusNotFound, "not_found", "%s: no such endpoint of the tap (GET /healthz, /v1/instances, /v1/snapshot?instance=, /v1/stream?instance=, /metrics)", r.URL.Path)
	}
}

// shadows returns the instances' shadows, in the order the instances were seen.
func (t *Tap) shadows() []*shadow {
	t.mu.Lock()
	defer t.mu.Unlock()
	var shs []*shadow
	for _, addr := range t.order {
		if sh := t.insts[addr].sh; sh != nil {
			shs = append(shs, sh)
		}
	}
	return shs
}

// gatherer gathers every shadow's kvtop_ metrics with a decode_instance label, the tap's
// own counters, and the process's.
func (t *Tap) gatherer() prometheus.Gatherer {
	own := prometheus.NewRegistry()
	own.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), tapCollector{t})
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := own.Gather()
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		for _, sh := range t.shadows() {
			_, srv := sh.current()
			got, gerr := srv.Registry().Gather()
			if gerr != nil && err == nil {
				err = gerr
			}
			label := "decode_instance"
			for _, f := range got {
				name := f.GetName()
				if len(name) < 6 || name[:6] != "kvtop_" {
					continue // the process's metrics come once, from the tap's own registry
				}
				for _, m := range f.Metric {
					addr := sh.addr
					m.Label = append(m.Label, &dto.LabelPair{Name: &label, Value: &addr})
					sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
				}
				if have := byName[name]; have != nil {
					have.Metric = append(have.Metric, f.Metric...)
				} else {
					byName[name] = f
					fams = append(fams, f)
				}
			}
		}
		sort.Slice(fams, func(i, j int) bool { return fams[i].GetName() < fams[j].GetName() })
		return fams, err
	})
}

// tapCollector exports the tap's own counters.
type tapCollector struct{ t *Tap }

var (
	descDivergences = prometheus.NewDesc("kvtop_tap_divergences_total", "Answers of a decode instance its shadow did not predict, by kind.", []string{"decode_instance", "kind"}, nil)
	descDropped     = prometheus.NewDesc("kvtop_tap_observations_dropped_total", "Observations lost to a full shadow queue (each forces the shadow to start over).", []string{"decode_instance"}, nil)
	descResets      = prometheus.NewDesc("kvtop_tap_shadow_resets_total", "Times a shadow started over (observations lost, instance restarted).", []string{"decode_instance"}, nil)
	descCalls       = prometheus.NewDesc("kvtop_tap_calls_total", "Calls forwarded, by instance and role.", []string{"instance", "role"}, nil)
	descFailures    = prometheus.NewDesc("kvtop_tap_call_failures_total", "Calls forwarded that failed (5xx or no answer), by instance and role.", []string{"instance", "role"}, nil)
)

func (c tapCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDivergences, descDropped, descResets, descCalls, descFailures} {
		ch <- d
	}
}

func (c tapCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.t
	t.mu.Lock()
	type row struct {
		addr, role      string
		calls, failures uint64
		sh              *shadow
	}
	var rows []row
	for _, addr := range t.order {
		in := t.insts[addr]
		rows = append(rows, row{addr, in.role, in.calls, in.failures, in.sh})
	}
	t.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(descCalls, prometheus.CounterValue, float64(r.calls), r.addr, r.role)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(r.failures), r.addr, r.role)
		if r.sh == nil {
			continue
		}
		for _, k := range engine.DivergenceKinds() {
			if int(k) < len(r.sh.byKind) {
				ch <- prometheus.MustNewConstMetric(descDivergences, prometheus.CounterValue, float64(r.sh.byKind[k].Load()), r.addr, k.String())
			}
		}
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(r.sh.dropped.Load()), r.addr)
		r.sh.mu.Lock()
		resets := r.sh.resets
		r.sh.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(descResets, prometheus.CounterValue, float64(resets), r.addr)
	}
}

// Flush waits until every shadow has applied what the tap has seen so far (for tests, and
// for a caller that wants to read a settled state).
func (t *Tap) Flush(ctx context.Context) error {
	for _, sh := range t.shadows() {
		done := make(chan struct{})
		select {
		case sh.q <- obs{kind: obsSync, done: done}:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("tap: flush %s: %w", sh.addr, ctx.Err())
		}
	}
	return nil
}
