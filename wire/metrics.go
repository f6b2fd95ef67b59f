package wire

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
)

// metrics are the server's own counters, and the engine's state as /metrics reads it: a
// View folded from a subscription of its own, so a scrape says what the dashboard would.
//
// Labels are per instance, never per request. A tap watching several decode instances
// (issue 12) is to serve the same collector once per instance through
// prometheus.WrapRegistererWith(prometheus.Labels{"decode_instance": addr}, reg), which
// adds the label to every series without changing this file, and to register its own
// kvtop_tap_divergences_total{decode_instance, cause} beside them; the dashboard and the
// alerts in deploy/ already aggregate by decode_instance, which is empty here.
// The subscription is read only when scraped: between scrapes it costs the engine an append
// to its mailbox (until its backlog fills; then the next scrape starts from a snapshot).
type metrics struct {
	clients       atomic.Int64
	droppedEvents atomic.Int64
	sentEvents    atomic.Int64
	resyncs       atomic.Int64
	http          *prometheus.CounterVec
	// wait is how long admitted prep_recv calls waited, with the request id as exemplar.
	wait prometheus.Histogram

	mu     sync.Mutex
	sub    *runner.Subscription // made at the first scrape
	closed bool
	view   *engine.View // nil until the first snapshot, and after an event that did not fit
}

// close ends the metrics' subscription.
func (m *metrics) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.sub != nil {
		m.sub.Close()
		m.sub = nil
	}
}

// catchUp folds what the subscription has pending, subscribing at the first call. An event
// that does not fit the View drops it and asks for a fresh snapshot. m.mu is held.
func (m *metrics) catchUp(r *runner.Runner) {
	if m.closed {
		return
	}
	if m.sub == nil {
		m.sub = r.Subscribe()
	}
	if !m.fold(m.sub.Take()) {
		m.sub.Resync()
		m.fold(m.sub.Take())
	}
}

// fold applies an update; false means the View broke and a snapshot is needed.
func (m *metrics) fold(u feed.Update) bool {
	if u.Snapshot != nil {
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			m.view = nil
			return false
		}
		m.view = v
	}
	if m.view == nil {
		return len(u.Events) == 0
	}
	for _, ev := range u.Events {
		if err := m.view.Apply(ev); err != nil {
			m.view = nil
			return false
		}
	}
	return true
}

// prepWait observes how long an admitted prep_recv call waited for its answer. The request
// id goes in the exemplar (labels never carry ids), cut to the 128 characters OpenMetrics
// allows an exemplar's labels.
func (m *metrics) prepWait(id string, d time.Duration) {
	const room = 128 - len("request_id")
	if utf8.RuneCountInString(id) > room {
		id = string([]rune(id)[:room])
	}
	m.wait.(prometheus.ExemplarObserver).ObserveWithExemplar(d.Seconds(), prometheus.Labels{"request_id": id})
}

func (m *metrics) request(route string, status int) {
	m.http.WithLabelValues(route, strconv.Itoa(status)).Inc()
}

func newMetrics(s *Server) (*prometheus.Registry, *metrics) {
	m := &metrics{
		http: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvtop_http_requests_total",
			Help: "HTTP calls answered, by endpoint and status code.",
		}, []string{"route", "code"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvtop_prep_recv_wait_seconds",
			Help:    "How long admitted prep_recv calls waited for their answer (admission), with the request id as exemplar.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.http, m.wait, &collector{s: s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, m
}

func (s *Server) metricsHandler() func(http.ResponseWriter, *http.Request) error {
	// OpenMetrics when the scraper asks for it: the format that carries exemplars.
	h := promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true})
	return func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	}
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descUp           = desc("kvtop_up", "1 when the engine answered this scrape and the metrics follow its state, else 0.")
	descPages        = desc("kvtop_kv_pages", "KV cache pages by state (model 0; every model is alike): free, active, shared, recycling, prepared (KV in, awaiting start_generate), awaiting-kv, partly-received, leaked.", "state")
	descSeqLen       = desc("kvtop_kv_sequence_length_tokens", "TotalSequenceLength: tokens held by all sequences, a shared prefix once per sharer.")
	descCapacity     = desc("kvtop_kv_capacity_tokens", "max_total_sequence_length.")
	descWatermark    = desc("kvtop_kv_watermark_pages", "The prepare-receive watermark: free pages an admission must leave (400 in MLC).")
	descRequests     = desc("kvtop_requests", "Requests in the engine's table by state (ended ones until retired).", "state")
	descBlocked      = desc("kvtop_blocked_requests", "Waiting prepare-receive requests by the reason they are not admitted.", "reason")
	descStuck        = desc("kvtop_stuck_requests", "Requests that need attention, by reason: blocked (from admission), awaiting_kv (prepared past the age limit, KV missing), awaiting_start (prepared past it with the KV in), leaked.", "reason")
	descOldest       = desc("kvtop_oldest_request_age_seconds", "Age of the oldest request in each stage, engine time: waiting (since arrival), prepared and awaiting_kv (since admission), running (since start_generate); 0 when none.", "state")
	descEvictable    = desc("kvtop_kv_evictable_pages", "Pages that evicting every recycling sequence would free: what a request blocked by the watermark waits for while nothing evicts for it.")
	descBlockedTotal = desc("kvtop_prepare_blocked_total", "Prepare-receive blocked evaluations (a new reason or new numbers) by reason.", "reason")
	descHitTokens    = desc("kvtop_prefix_hit_tokens_total", "Prompt tokens matched by the prefix cache.")
	descAltHitTokens = desc("kvtop_prefix_counterfactual_hit_tokens_total", "Prompt tokens the counterfactual prefix cache matched: the same requests under the other eviction order (policy), tokens only.", "policy")
	descQueryTokens  = desc("kvtop_prefix_query_tokens_total", "Prompt tokens looked up in the prefix cache.")
	descSteps        = desc("kvtop_steps_total", "Engine steps by the action that did the work.", "action")
	descHazards      = desc("kvtop_hazards_total", "Hazards detected by kind.", "kind")
	descArrived      = desc("kvtop_requests_arrived_total", "prep_recv requests accepted into the waiting queue.")
	descAdmitted     = desc("kvtop_requests_admitted_total", "Requests admitted by prepare-receive.")
	descStarted      = desc("kvtop_requests_started_total", "start_generate calls accepted.")
	descFinished     = desc("kvtop_requests_finished_total", "Requests that generated all their tokens.")
	descAborted      = desc("kvtop_requests_aborted_total", "Requests aborted, preemptions included.")
	descPreempted    = desc("kvtop_requests_preempted_total", "Requests preempted for want of pages.")
	descKVTokens     = desc("kvtop_kv_received_tokens_total", "Tokens of KV written by prefill instances.")
	descGenerated    = desc("kvtop_generated_tokens_total", "Tokens generated.")
	descRecycled     = desc("kvtop_sequences_recycled_total", "Finished sequences kept for reuse.")
	descEvicted      = desc("kvtop_sequences_evicted_total", "Recycling sequences evicted.")
	descPaused       = desc("kvtop_engine_paused", "1 while the engine is paused.")
	descRate         = desc("kvtop_engine_steps_per_second", "Measured engine steps per second.")
	descClients      = desc("kvtop_stream_clients", "Stream clients connected.")
	descDropped      = desc("kvtop_stream_dropped_events_total", "Events dropped for stream clients that fell behind (each drop is followed by a snapshot).")
	descSent         = desc("kvtop_stream_sent_events_total", "Events sent to stream clients.")
	descResyncs      = desc("kvtop_stream_resyncs_total", "Snapshots sent to stream clients after the first: drops and client resyncs.")
)

// collector reads the metrics' View at scrape time.
type collector struct{ s *Server }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descPages, descSeqLen, descCapacity, descWatermark, descRequests, descBlocked,
		descStuck, descOldest, descEvictable, descBlockedTotal, descHitTokens, descAltHitTokens, descQueryTokens, descSteps, descHazards, descArrived, descAdmitted,
		descStarted, descFinished, descAborted, descPreempted, descKVTokens, descGenerated, descRecycled,
		descEvicted, descPaused, descRate, descClients, descDropped, descSent, descResyncs} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(descClients, float64(s.metrics.clients.Load()))
	counter(descDropped, float64(s.metrics.droppedEvents.Load()))
	counter(descSent, float64(s.metrics.sentEvents.Load()))
	counter(descResyncs, float64(s.metrics.resyncs.Load()))
	st := s.r.Status()
	gauge(descPaused, b2f(st.Paused))
	gauge(descRate, st.Rate)

	// A call on the engine's goroutine that does nothing: once it has run, the events of
	// every call before this scrape have been published, and the View below folds them.
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	answered := s.r.Do(ctx, func(*engine.Engine, time.Time) error { return nil }) == nil
	s.metrics.mu.Lock()
	defer s.metrics.mu.Unlock()
	if answered {
		s.metrics.catchUp(s.r)
	}
	v := s.metrics.view
	if v == nil || !answered {
		gauge(descUp, 0)
	} else {
		gauge(descUp, 1)
	}
	if v == nil {
		return
	}
	d := v.Derived()
	for _, st := range engine.PageStates() {
		gauge(descPages, float64(d.Pages[st]), st.String())
	}
	gauge(descSeqLen, float64(d.TotalSeqLen))
	gauge(descCapacity, float64(v.Config().MaxTotalSequenceLength))
	gauge(descWatermark, float64(v.Config().Watermark))
	for _, st := range engine.States() {
		gauge(descRequests, float64(d.Requests[st]), st.String())
	}
	t := v.Totals()
	for _, r := range prepare.Reasons() {
		gauge(descBlocked, float64(d.BlockedBy[r]), r.String())
		counter(descBlockedTotal, float64(t.Blocked[r]), r.String())
	}
	f := v.Fleet()
	for r, n := range f.StuckBy {
		gauge(descStuck, float64(n), engine.StuckReason(r).String())
	}
	for st, ms := range f.OldestAge {
		gauge(descOldest, float64(ms)/1000, engine.AgeState(st).String())
	}
	gauge(descEvictable, float64(f.Evictable))
	ps := v.PrefixStats()
	counter(descHitTokens, float64(ps.HitTokens))
	counter(descQueryTokens, float64(ps.QueryTokens))
	if cf, ok := v.Counterfactual(); ok {
		counter(descAltHitTokens, float64(cf.Stats.HitTokens), cf.Order.String())
	}
	for a := range t.Actions {
		counter(descSteps, float64(t.Actions[a]), engine.Action(a).String())
	}
	for _, k := range engine.HazardKinds() {
		counter(descHazards, float64(t.Hazards[k]), k.String())
	}
	counter(descArrived, float64(t.Arrived))
	counter(descAdmitted, float64(t.Admitted))
	counter(descStarted, float64(t.Started))
	counter(descFinished, float64(t.Finished))
	counter(descAborted, float64(t.Aborted))
	counter(descPreempted, float64(t.Preempted))
	counter(descKVTokens, float64(t.KVTokens))
	counter(descGenerated, float64(t.Generated))
	counter(descRecycled, float64(t.Recycled))
	counter(descEvicted, float64(t.Evicted))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
