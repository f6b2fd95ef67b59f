package wire

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// The states a page is counted in by kvtop_kv_pages. Every page is in exactly one.
var pageStates = [...]string{
	"free",      // on the free list
	"active",    // held by one sequence of a running (or just finished) request
	"reserved",  // held by one sequence of a prepared request: KV arriving or awaiting start_generate
	"shared",    // in a block two or more sequences share (a forked prefix)
	"recycling", // held by a finished sequence kept for reuse by the prefix cache
	"leaked",    // held by the sequence of a prepared request that was aborted (as in MLC)
}

// Indexes of pageStates.
const (
	pageFree = iota
	pageActive
	pageReserved
	pageShared
	pageRecycling
	pageLeaked
)

// metrics are the server's own counters; the engine's are read at scrape time.
type metrics struct {
	clients       atomic.Int64
	droppedEvents atomic.Int64
	sentEvents    atomic.Int64
	resyncs       atomic.Int64
	http          *prometheus.CounterVec
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
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.http, &collector{s: s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, m
}

func (s *Server) metricsHandler() func(http.ResponseWriter, *http.Request) error {
	h := promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	}
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descUp           = desc("kvtop_up", "1 when the engine answered this scrape, else 0.")
	descPages        = desc("kvtop_kv_pages", "KV cache pages by state (model 0; every model is alike).", "state")
	descSeqLen       = desc("kvtop_kv_sequence_length_tokens", "TotalSequenceLength: tokens held by all sequences, a shared prefix once per sharer.")
	descCapacity     = desc("kvtop_kv_capacity_tokens", "max_total_sequence_length.")
	descRequests     = desc("kvtop_requests", "Requests in the engine's table by state (ended ones until retired).", "state")
	descBlocked      = desc("kvtop_blocked_requests", "Waiting prepare-receive requests by the reason they are not admitted.", "reason")
	descBlockedTotal = desc("kvtop_prepare_blocked_total", "Prepare-receive blocked evaluations (a new reason or new numbers) by reason.", "reason")
	descHitTokens    = desc("kvtop_prefix_hit_tokens_total", "Prompt tokens matched by the prefix cache.")
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

// collector reads the engine's state at scrape time, through one call on its goroutine.
type collector struct{ s *Server }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descPages, descSeqLen, descCapacity, descRequests, descBlocked,
		descBlockedTotal, descHitTokens, descQueryTokens, descSteps, descHazards, descArrived, descAdmitted,
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

	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	var snap engine.Snapshot
	var blocks []pages.BlockInfo
	err := s.r.Do(ctx, func(e *engine.Engine, _ time.Time) error {
		snap = e.Snapshot()
		blocks = e.Cache().Blocks()
		return nil
	})
	if err != nil {
		gauge(descUp, 0)
		return
	}
	gauge(descUp, 1)
	for state, n := range pageCounts(snap, blocks) {
		gauge(descPages, float64(n), pageStates[state])
	}
	gauge(descSeqLen, float64(snap.Last.Counts.TotalSeqLen))
	gauge(descCapacity, float64(snap.Config.MaxTotalSequenceLength))

	byState := make(map[engine.RequestState]int)
	for _, r := range snap.Requests {
		byState[r.State]++
	}
	for _, st := range engine.States() {
		gauge(descRequests, float64(byState[st]), st.String())
	}
	blocked := blockedCounts(snap)
	for _, r := range prepare.Reasons() {
		gauge(descBlocked, float64(blocked[r]), r.String())
		counter(descBlockedTotal, float64(snap.Totals.Blocked[r]), r.String())
	}
	t := snap.Totals
	counter(descHitTokens, float64(snap.PrefixStats.HitTokens))
	counter(descQueryTokens, float64(snap.PrefixStats.QueryTokens))
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

// pageCounts counts pages by state (indexes of pageStates) from the engine's own records:
// the free list, and for each block the sequences that use it, their owners and states.
func pageCounts(snap engine.Snapshot, blocks []pages.BlockInfo) []int {
	counts := make([]int, len(pageStates))
	counts[pageFree] = len(snap.Pages.Free)
	recycling := make(map[int64]bool, len(snap.Recycling))
	for _, seq := range snap.Recycling {
		recycling[seq] = true
	}
	owner := make(map[int64]string, len(snap.Owners))
	for _, o := range snap.Owners {
		owner[o.Seq] = o.ID
	}
	reqs := make(map[string]*engine.RequestView, len(snap.Requests))
	for i := range snap.Requests {
		reqs[snap.Requests[i].ID] = &snap.Requests[i]
	}
	for _, b := range blocks {
		state := pageActive
		switch {
		case len(b.Seqs) > 1:
			state = pageShared
		case len(b.Seqs) == 1 && recycling[b.Seqs[0]]:
			state = pageRecycling
		case len(b.Seqs) == 1:
			r := reqs[owner[b.Seqs[0]]]
			switch {
			case r == nil || r.Seq != b.Seqs[0]:
			case r.State == engine.StatePrepared || r.State == engine.StateKVComplete:
				state = pageReserved
			case r.Leaked:
				state = pageLeaked
			}
		}
		counts[state] += len(b.Pages)
	}
	return counts
}

// blockedCounts counts the waiting prepare-receive requests by why they wait: the head's
// own reason, and head-of-line for everyone behind a blocked head (as engine.View.Blocked
// says).
func blockedCounts(snap engine.Snapshot) map[prepare.Reason]int {
	out := make(map[prepare.Reason]int)
	reqs := make(map[string]*engine.RequestView, len(snap.Requests))
	for i := range snap.Requests {
		reqs[snap.Requests[i].ID] = &snap.Requests[i]
	}
	var head *engine.RequestView
	for _, id := range snap.Waiting {
		r := reqs[id]
		if r == nil || r.State != engine.StateWaiting {
			continue
		}
		if head == nil {
			head = r
			if r.Eval == nil {
				return out // not evaluated yet: nothing is known to block
			}
			out[r.Eval.Reason]++
			continue
		}
		out[prepare.ReasonHeadOfLine]++
	}
	return out
}
