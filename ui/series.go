package ui

import (
	"math"
	"sort"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// sample is the engine at the end of one step, as the history charts plot it. The gauges
// are the step summary's counts, which the engine derives where the View, the snapshot and
// /metrics do (engine/derive.go); the counters are the View's totals and prefix statistics
// after the step, from which the charts take rates and ratios over any stretch of steps.
type sample struct {
	step uint64
	at   int64 // engine time, ms

	free, waiting, blocked, prepared, awaiting, running int32

	admitted, finished, hazards uint64
	hit, query                  uint64
	cfHit, cfQuery              uint64
}

// series is the history of samples, one a step: a ring of fixed capacity, oldest first.
// It is the live dashboard's, whatever is drawn: a rewound view marks its step on it.
type series struct {
	buf   []sample
	limit int // the ring's capacity; buf grows up to it
	start int
	n     int
	ver   uint64 // moves with every sample

	// What the engine's configuration and the counterfactual say of every sample.
	pages, watermark int
	cf               bool
	cfOrder          string
}

// maxSeries caps the samples kept when the rewind history has no bound of steps.
const maxSeries = 100_000

// seriesCap is how many samples the charts keep: as many steps as the rewind history.
func seriesCap(l feed.HistoryLimits) int {
	if l.Steps == 0 || l.Steps > maxSeries {
		return maxSeries
	}
	return int(l.Steps) + 1
}

// newSeries returns a series of at most capacity samples.
func newSeries(capacity int) *series {
	return &series{buf: make([]sample, 0, min(capacity, 1024)), limit: max(capacity, 1)}
}

// push adds the sample of a step just completed; a step at or before the last one (a new
// engine) starts the series over.
func (s *series) push(v *engine.View, sc engine.StepCompleted) {
	if s.n > 0 && sc.Step <= s.at(s.n-1).step {
		s.reset()
	}
	c := sc.Counts
	t := v.Totals()
	ps := v.PrefixStats()
	x := sample{
		step: sc.Step, at: sc.At,
		free: int32(c.FreePages), waiting: int32(c.Waiting), blocked: int32(c.Blocked),
		prepared: int32(c.Prepared), awaiting: int32(c.AwaitingKV), running: int32(c.Running),
		admitted: t.Admitted, finished: t.Finished,
		hit: ps.HitTokens, query: ps.QueryTokens,
	}
	for _, h := range t.Hazards {
		x.hazards += h
	}
	cfg := v.Config()
	s.pages, s.watermark = v.Cache().NumPages(), cfg.Watermark
	if cf, ok := v.Counterfactual(); ok {
		x.cfHit, x.cfQuery = cf.Stats.HitTokens, cf.Stats.QueryTokens
		s.cf, s.cfOrder = true, cf.Order.String()
	}
	s.add(x)
}

func (s *series) add(x sample) {
	s.ver++
	if len(s.buf) < s.limit {
		// Growing to the bound: the ring has not wrapped yet, start is 0.
		s.buf = append(s.buf, x)
		s.n++
		return
	}
	s.buf[(s.start+s.n)%len(s.buf)] = x
	if s.n < len(s.buf) {
		s.n++
		return
	}
	s.start = (s.start + 1) % len(s.buf)
}

func (s *series) reset() {
	s.buf, s.start, s.n = s.buf[:0], 0, 0
	s.ver++
}

// at returns sample i, oldest first.
func (s *series) at(i int) *sample { return &s.buf[(s.start+i)%len(s.buf)] }

// len returns how many samples are held.
func (s *series) len() int { return s.n }

// index returns the last sample at or before step, or -1 when every sample is later.
func (s *series) index(step uint64) int {
	return sort.Search(s.n, func(i int) bool { return s.at(i).step > step }) - 1
}

// gauges are the worst gauges of a stretch of samples: the fewest free pages, the most of
// the rest.
type gauges struct{ free, waiting, blocked, prepared, awaiting, running int32 }

// worst returns the worst gauges of each bucket of the samples, bucket samples a bucket
// from the oldest, in one pass: what the gauge charts plot, a column each.
func (s *series) worst(bucket int, dst []gauges) []gauges {
	dst = dst[:0]
	if s.n == 0 {
		return dst
	}
	p := s.start
	var g gauges
	in := 0 // samples in the bucket so far
	for i := range s.n {
		x := &s.buf[p]
		if p++; p == len(s.buf) {
			p = 0
		}
		if in == 0 {
			g = gauges{x.free, x.waiting, x.blocked, x.prepared, x.awaiting, x.running}
		} else {
			g.free = min(g.free, x.free)
			g.waiting = max(g.waiting, x.waiting)
			g.blocked = max(g.blocked, x.blocked)
			g.prepared = max(g.prepared, x.prepared)
			g.awaiting = max(g.awaiting, x.awaiting)
			g.running = max(g.running, x.running)
		}
		if in++; in == bucket || i == s.n-1 {
			dst = append(dst, g)
			in = 0
		}
	}
	return dst
}

// A metric reads one number off a stretch of samples [i, j): a gauge's worst value in it,
// or a counter's rate or ratio over it (from the sample before it, when held).
type metric func(s *series, i, j int) float64

// none is a metric's "no value here" (a ratio with nothing to divide).
var none = math.NaN()

func gaugeMax(f func(*sample) int32) metric {
	return func(s *series, i, j int) float64 {
		m := f(s.at(i))
		for k := i + 1; k < j; k++ {
			m = max(m, f(s.at(k)))
		}
		return float64(m)
	}
}

func gaugeMin(f func(*sample) int32) metric {
	return func(s *series, i, j int) float64 {
		m := f(s.at(i))
		for k := i + 1; k < j; k++ {
			m = min(m, f(s.at(k)))
		}
		return float64(m)
	}
}

// span returns the samples a counter's change over [i, j) is measured between.
func span(s *series, i, j int) (*sample, *sample) {
	if i > 0 {
		return s.at(i - 1), s.at(j - 1)
	}
	return s.at(0), s.at(j - 1)
}

// perSecond is a counter's rate over the stretch, per second of engine time.
func perSecond(f func(*sample) uint64) metric {
	return func(s *series, i, j int) float64 {
		a, b := span(s, i, j)
		if b.at <= a.at {
			return none
		}
		return float64(f(b)-f(a)) * 1000 / float64(b.at-a.at)
	}
}

// delta is how much a counter grew over the stretch.
func delta(f func(*sample) uint64) metric {
	return func(s *series, i, j int) float64 {
		a, b := span(s, i, j)
		return float64(f(b) - f(a))
	}
}

// percent is the ratio of two counters' growth over the stretch: the prefix hit ratio of
// the queries in it.
func percent(part, whole func(*sample) uint64) metric {
	return func(s *series, i, j int) float64 {
		a, b := span(s, i, j)
		if w := whole(b) - whole(a); w > 0 {
			return 100 * float64(part(b)-part(a)) / float64(w)
		}
		return none
	}
}
