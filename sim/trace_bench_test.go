package sim

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// tracePath is the full Mooncake conversation trace, which is not in the repository (it is
// not ours to copy): KVTOP_TRACE names the file; without it the benchmark is skipped.
func tracePath() string { return os.Getenv("KVTOP_TRACE") }

// BenchmarkTraceReplay replays the whole trace (run with -benchtime=1x) in lockstep at 20
// ms a step, on the trace scenario's engine settings, and reports the engine's prefix hit
// ratio next to the trace's own upper bound (the share of 512-token blocks seen before), and
// how much faster than real time the replay runs.
func BenchmarkTraceReplay(b *testing.B) {
	if tracePath() == "" {
		b.Skip("no trace: set KVTOP_TRACE to the Mooncake conversation trace's path")
	}
	f, err := os.Open(tracePath())
	if err != nil {
		b.Fatalf("KVTOP_TRACE: %v", err)
	}
	recs, err := ReadTrace(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	sc, _ := Lookup("trace")
	for b.Loop() {
		cfg := engine.DefaultConfig()
		sc.Configure(&cfg)
		// Knobs for exploring by hand: the eviction order, the counterfactual, the cache size
		// and the recycling cap.
		if v := os.Getenv("KVTOP_TRACE_EVICT"); v != "" {
			if err := cfg.EvictOrder.UnmarshalText([]byte(v)); err != nil {
				b.Fatal(err)
			}
		}
		if os.Getenv("KVTOP_TRACE_COUNTERFACTUAL") == "off" {
			cfg.Counterfactual = false
		}
		if v := os.Getenv("KVTOP_TRACE_RECYCLING"); v != "" {
			fmt.Sscan(v, &cfg.MaxRecycling)
		}
		if v := os.Getenv("KVTOP_TRACE_TOTAL"); v != "" {
			fmt.Sscan(v, &cfg.MaxTotalSequenceLength)
		}
		e, err := engine.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		w := NewTrace(recs, 1)
		d := NewDriver(w, sc.Driver)
		// A stall is the head of the line blocked by the watermark for a simulated minute:
		// stallAt is how many requests had been admitted when the first one began.
		stallAt, blockedSince, blockedAdmitted := -1.0, time.Duration(-1), 0
		ls := &Lockstep{E: e, D: d, StepTime: 20 * time.Millisecond}
		ls.OnReady = func(rd engine.Ready) {
			sc := rd.Events[len(rd.Events)-1].(engine.StepCompleted)
			if sc.Counts.Blocked == 0 || sc.Admitted > 0 {
				blockedSince = -1
				return
			}
			if blockedSince < 0 {
				blockedSince, blockedAdmitted = ls.Now(), int(e.Totals().Admitted)
			}
			if stallAt < 0 && ls.Now()-blockedSince > time.Minute {
				stallAt = float64(blockedAdmitted)
			}
		}
		start := time.Now()
		last := time.Duration(recs[len(recs)-1].Timestamp) * time.Millisecond
		for w.(*trace).Remaining() > 0 || (d.Stats().InFlight > 0 && ls.Now() < last+10*time.Minute) {
			ls.Run(500)
		}
		wall := time.Since(start)
		ps := e.Prefix().Stats()
		tot := e.Totals()
		b.ReportMetric(float64(ps.HitTokens)/float64(ps.QueryTokens)*100, "hit%")
		if cf := e.Snapshot().Counterfactual; cf != nil {
			b.ReportMetric(float64(cf.Stats.HitTokens)/float64(cf.Stats.QueryTokens)*100, "other-order-hit%")
		}
		b.ReportMetric(ReuseBound(recs)*100, "bound%")
		b.ReportMetric(ls.Now().Seconds()/wall.Seconds(), "x-realtime")
		b.ReportMetric(float64(tot.Finished), "finished")
		b.ReportMetric(float64(d.Stats().InFlight), "stuck")
		b.ReportMetric(float64(tot.Steps)/wall.Seconds(), "steps/s")
		b.ReportMetric(stallAt, "stall-at-request")
	}
}
