package kvevents

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/internal/stepbench"
)

// BenchmarkEngineSteps is stepbench's engine step in its steady state (256 requests
// decoding, one arriving every other step), with KV events off and on (a publisher on
// loopback, no subscriber). Each case runs alone, to profile one (-cpuprofile,
// -memprofile); internal/stepbench's BenchmarkEngineSteps interleaves them with tracing, for
// the comparison.
func BenchmarkEngineSteps(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("kv-events=%v", on), func(b *testing.B) {
			if !on {
				stepbench.Run(b, nil)
				return
			}
			p, err := Start(Config{Endpoint: "tcp://127.0.0.1:0"})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			stepbench.Run(b, func(e *engine.Engine, evs []engine.Event) { p.Observe(e, evs) })
			if p.Stats().Dropped > 0 {
				b.Logf("%d batches dropped", p.Stats().Dropped)
			}
		})
	}
}

// BenchmarkObserve is what publishing costs the engine's goroutine itself: the time spent in
// Publisher.Observe a step of stepbench's steady state, timed around each call (the step's
// other work is not counted), reported as ns/observe-step. The sender's goroutine, which
// hashes, encodes and sends, is not in it; internal/stepbench's BenchmarkEngineSteps
// measures the whole.
func BenchmarkObserve(b *testing.B) {
	p, err := Start(Config{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var in time.Duration
	steps := 0
	s := stepbench.New(b, func(e *engine.Engine, evs []engine.Event) {
		t0 := time.Now()
		p.Observe(e, evs)
		in += time.Since(t0)
	})
	in = 0
	b.ReportAllocs()
	for b.Loop() {
		s.Step()
		steps++
	}
	b.ReportMetric(float64(in.Nanoseconds())/float64(steps), "ns/observe-step")
	if p.Stats().Dropped > 0 {
		b.Logf("%d batches dropped", p.Stats().Dropped)
	}
}
