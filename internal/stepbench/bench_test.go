package stepbench_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvtop/kvtop/internal/stepbench"
	"github.com/kvtop/kvtop/kvevents"
	"github.com/kvtop/kvtop/tracing"
)

// exporter is one way of running the engine: with nothing watching it, or with one of the
// exporters observing its events.
type exporter struct {
	name  string
	start func(b *testing.B) (stepbench.Observe, func())
}

// exporters are the cases BenchmarkEngineSteps compares: KV events to a publisher on
// loopback with no subscriber; request traces to an exporter that discards the spans (what
// tracing costs kvtop), and over OTLP/HTTP to a receiver on loopback that reads and
// discards them (the whole pipeline, the receiver's reading included, on the same cores).
var exporters = []exporter{
	{"off", func(*testing.B) (stepbench.Observe, func()) { return nil, func() {} }},
	// A second engine with nothing watching it: what it measures against off is the
	// benchmark's own resolution on this machine.
	{"off-again", func(*testing.B) (stepbench.Observe, func()) { return nil, func() {} }},
	{"kv-events", func(b *testing.B) (stepbench.Observe, func()) {
		p, err := kvevents.Start(kvevents.Config{Endpoint: "tcp://127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if st := p.Stats(); st.Dropped > 0 {
				b.Errorf("kv-events: %+v: batches dropped, the comparison is off", st)
			}
			p.Close()
		})
		return p.Observe, func() {}
	}},
	{"tracing", func(b *testing.B) (stepbench.Observe, func()) {
		return startTracer(b, tracing.Config{Exporter: tracetest.NewNoopExporter()})
	}},
	{"tracing-otlp", func(b *testing.B) (stepbench.Observe, func()) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		b.Cleanup(srv.Close)
		return startTracer(b, tracing.Config{Endpoint: srv.URL})
	}},
}

// startTracer starts a tracer, and returns its Observe and a drain that waits for the spans
// of what it observed.
func startTracer(b *testing.B, cfg tracing.Config) (stepbench.Observe, func()) {
	t, err := tracing.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		t.Close()
		if st := t.Stats(); st.DroppedEvents > 0 || st.ExportFailures > 0 {
			b.Errorf("tracing: %+v: events dropped or exports failed, the comparison is off", st)
		}
	})
	return t.Observe, func() {
		if err := t.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// block is how many steps an engine takes in its turn; gap is the pause after each turn,
// in which its exporter's goroutines finish what the turn gave them (its drain waits for
// them where it can), so that none of it falls in the next engine's turn. A turn (about
// 15 ms) is long against the exporters' lingers (1 ms), so that the tail of their work the
// drain takes out of the turn's time is small, and short enough that a round of turns
// sees one machine.
const (
	block = 256
	gap   = 2 * time.Millisecond
)

// BenchmarkEngineSteps is the engine's step in the steady state of stepbench (256 requests
// decoding, one arriving every other step) with each exporter of exporters, every engine
// taking block steps in turn within one benchmark, so that all see the same machine, the
// turns' order rotating. For each exporter it reports the time and the allocations a step
// (its goroutines' included), and its time against off's: the median, over the rounds of
// turns, of the ratio of its turn's time to off's turn's in the same round, which the
// bursts of a shared machine move less than a ratio of totals.
func BenchmarkEngineSteps(b *testing.B) {
	type engineRun struct {
		exporter
		s             *stepbench.Steady
		drain         func()
		t, cpu        []time.Duration // by round
		others        time.Duration   // the process's CPU time but the engine's thread's
		allocs, bytes uint64
		gc            [len(gcMetrics)]float64
	}
	runs := make([]*engineRun, len(exporters))
	for i, x := range exporters {
		observe, drain := x.start(b)
		runs[i] = &engineRun{exporter: x, s: stepbench.New(b, observe), drain: drain}
		drain()
	}
	// The engines' steps run on this goroutine, locked to its thread, whose CPU time is then
	// the engines' own: what another process or an exporter's goroutine takes of the cores
	// shows in the time a step, not in its CPU time. The process's other threads' CPU time
	// in a turn (its drain and pause included) is what its exporter's goroutines and the
	// collector's workers used.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ms runtime.MemStats
	gc0, gc1 := gcSamples(), gcSamples()
	round := 0
	for b.Loop() {
		for k := range runs {
			r := runs[(round+k)%len(runs)]
			runtime.ReadMemStats(&ms)
			m0, b0 := ms.Mallocs, ms.TotalAlloc
			metrics.Read(gc0)
			p0 := processCPU()
			t0, c0 := time.Now(), threadCPU()
			for range block {
				r.s.Step()
			}
			c1 := threadCPU()
			r.t = append(r.t, time.Since(t0))
			r.cpu = append(r.cpu, c1-c0)
			r.drain()
			time.Sleep(gap)
			r.others += processCPU() - p0 - (threadCPU() - c0)
			runtime.ReadMemStats(&ms)
			r.allocs += ms.Mallocs - m0
			r.bytes += ms.TotalAlloc - b0
			metrics.Read(gc1)
			for i := range gcMetrics {
				r.gc[i] += value(gc1[i]) - value(gc0[i])
			}
		}
		round++
	}
	steps := float64(block * b.N)
	off := runs[0]
	for _, r := range runs {
		b.ReportMetric(float64(sum(r.t).Nanoseconds())/1e3/steps, "µs/step-"+r.name)
		b.ReportMetric(float64(r.allocs)/steps, "allocs/step-"+r.name)
		b.ReportMetric(float64(r.bytes)/steps, "B/step-"+r.name)
		for i, m := range gcMetrics {
			b.ReportMetric(r.gc[i]*m.scale/steps, m.unit+"-"+r.name)
		}
		if r != off {
			b.ReportMetric(medianRatio(r.t, off.t), r.name+"/off")
		}
		if sum(r.cpu) > 0 {
			b.ReportMetric(float64(sum(r.cpu).Nanoseconds())/1e3/steps, "cpu-µs/step-"+r.name)
			b.ReportMetric(float64(r.others.Nanoseconds())/1e3/steps, "others-cpu-µs/step-"+r.name)
			if r != off {
				b.ReportMetric(medianRatio(r.cpu, off.cpu), "cpu-"+r.name+"/off")
			}
		}
	}
	b.ReportMetric(0, "ns/op")
}

// gcMetrics are the collector's work a turn caused, read before and after it (its drain
// and pause included): cycles, and the CPU time of assists (taken from the goroutines
// that allocate, the engine's among them) and of the background mark workers.
var gcMetrics = [...]struct {
	name, unit string
	scale      float64
}{
	{"/gc/cycles/total:gc-cycles", "gc-cycles/kstep", 1e3},
	{"/cpu/classes/gc/mark/assist:cpu-seconds", "gc-assist-µs/step", 1e6},
	{"/cpu/classes/gc/mark/dedicated:cpu-seconds", "gc-dedicated-µs/step", 1e6},
	{"/cpu/classes/gc/mark/idle:cpu-seconds", "gc-idle-µs/step", 1e6},
}

func gcSamples() []metrics.Sample {
	s := make([]metrics.Sample, len(gcMetrics))
	for i, m := range gcMetrics {
		s[i].Name = m.name
	}
	return s
}

func value(s metrics.Sample) float64 {
	switch s.Value.Kind() {
	case metrics.KindUint64:
		return float64(s.Value.Uint64())
	case metrics.KindFloat64:
		return s.Value.Float64()
	}
	return 0
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// medianRatio returns the median of a[i]/b[i].
func medianRatio(a, b []time.Duration) float64 {
	rs := make([]float64, len(a))
	for i := range a {
		rs[i] = float64(a[i]) / float64(b[i])
	}
	slices.Sort(rs)
	if n := len(rs); n%2 == 0 {
		return (rs[n/2-1] + rs[n/2]) / 2
	}
	return rs[len(rs)/2]
}
