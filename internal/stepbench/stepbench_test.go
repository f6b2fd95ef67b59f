package stepbench

import (
	"testing"

	"github.com/kvtop/kvtop/engine"
)

// The benchmark's engine stays in its steady state: about Live requests alive at every
// step, and one arriving every other step (a step that admits a request decodes nothing, so
// a request of Tokens tokens lives about 2 × Tokens steps), every one that arrives admitted,
// given its KV and started.
func TestTheStateIsSteady(t *testing.T) {
	counts := map[string]int{}
	var last engine.Counts // after the latest step
	s := New(t, func(_ *engine.Engine, evs []engine.Event) {
		for _, ev := range evs {
			switch ev := ev.(type) {
			case engine.StepCompleted:
				last = ev.Counts
			case engine.RequestArrived:
				counts["arrived"]++
			case engine.KVReceived:
				counts["kv"]++
			case engine.RequestStarted:
				counts["started"]++
			}
		}
	})
	clear(counts)
	const steps = 4 * Tokens
	for range steps {
		s.Step()
		if last.Running+last.Prepared < Live*9/10 {
			t.Fatalf("step %d: %d running, %d prepared; want about %d", s.Engine().StepNumber(), last.Running, last.Prepared, Live)
		}
	}
	if a := counts["arrived"]; a < steps/2*9/10 || a > steps/2*11/10 || counts["kv"] < a*9/10 || counts["started"] < a*9/10 {
		t.Fatalf("over %d steps: %v; want about one arrival every other step, each given its KV and started", steps, counts)
	}
}
