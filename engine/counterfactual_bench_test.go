package engine_test

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
)

// BenchmarkCounterfactual is the cost of the counterfactual prefix cache: 3,000 steps of the
// chat scenario (prefix hits, forks, recycling and reuse, 20 ms a step) with the
// counterfactual off and on, the two run alternately within one benchmark so that the ratio
// compares like with like. It reports each run's time a step and on/off.
func BenchmarkCounterfactual(b *testing.B) {
	sc, err := sim.Lookup("chat")
	if err != nil {
		b.Fatal(err)
	}
	run := func(on bool) time.Duration {
		cfg := engine.DefaultConfig()
		sc.Configure(&cfg)
		cfg.Counterfactual = on
		e, err := engine.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		w, err := sc.New(sim.Options{Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		l := sim.Lockstep{E: e, D: sim.NewDriver(w, sc.Driver)}
		start := time.Now()
		l.Run(3000)
		return time.Since(start)
	}
	var off, on time.Duration
	for b.Loop() {
		off += run(false)
		on += run(true)
	}
	steps := float64(b.N * 3000)
	b.ReportMetric(float64(off.Nanoseconds())/steps, "ns/step-off")
	b.ReportMetric(float64(on.Nanoseconds())/steps, "ns/step-on")
	b.ReportMetric(float64(on)/float64(off), "on/off")
}
