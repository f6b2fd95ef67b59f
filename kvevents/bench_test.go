package kvevents

import (
	"fmt"
	"testing"

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
