package engine_test

import (
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/internal/lockstep"
)

// A View derives the engine's Fleet, after every call and step of every scenario; the
// stuck requests by reason add up to the stuck count; the evictable pages, computed by
// removing the recycling sequences from the cache, are the pages the page map calls
// recycling; and every oldest age is that of a request in its stage.
func TestFleetIsDerivedAlikeEverywhere(t *testing.T) {
	for _, sc := range []string{"chat", "recycle-stall", "leak", "fork-race", "preempt", "watermark"} {
		t.Run(sc, func(t *testing.T) {
			var v *engine.View
			seen := engine.Fleet{}
			_, err := lockstep.Run(sc, 1, 700, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
				if t.Failed() {
					return
				}
				if v == nil {
					var err error
					if v, err = engine.NewView(e.Snapshot()); err != nil {
						t.Fatal(err)
					}
				} else {
					for _, ev := range evs {
						if err := v.Apply(ev); err != nil {
							t.Fatal(err)
						}
					}
				}
				want, got := e.Fleet(), v.Fleet()
				if got != want {
					t.Fatalf("step %d: View.Fleet() = %+v, Engine.Fleet() = %+v", e.StepNumber(), got, want)
				}
				d := v.Derived()
				sum := 0
				for _, n := range got.StuckBy {
					sum += n
				}
				if sum != d.Stuck {
					t.Fatalf("step %d: stuck by reason %v adds to %d, stuck %d", e.StepNumber(), got.StuckBy, sum, d.Stuck)
				}
				if got.Evictable != d.Pages[engine.PageRecycling] {
					t.Fatalf("step %d: %d evictable pages, %d recycling in the page map", e.StepNumber(), got.Evictable, d.Pages[engine.PageRecycling])
				}
				if (got.OldestAge[engine.AgeWaiting] > 0) && d.Waiting == 0 || got.OldestAge[engine.AgeAwaitingKV] > got.OldestAge[engine.AgePrepared] {
					t.Fatalf("step %d: ages %v with %d waiting", e.StepNumber(), got.OldestAge, d.Waiting)
				}
				for i := range seen.StuckBy {
					seen.StuckBy[i] = max(seen.StuckBy[i], got.StuckBy[i])
				}
				for i := range seen.OldestAge {
					seen.OldestAge[i] = max(seen.OldestAge[i], got.OldestAge[i])
				}
				seen.Evictable = max(seen.Evictable, got.Evictable)
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: the most seen: %+v", sc, seen)
			switch sc {
			case "recycle-stall":
				if seen.StuckBy[engine.StuckBlocked] == 0 || seen.Evictable == 0 || seen.OldestAge[engine.AgeWaiting] < 10_000 {
					t.Errorf("recycle-stall: %+v; want requests blocked for over 10s while pages are evictable", seen)
				}
			case "leak":
				if seen.StuckBy[engine.StuckLeaked] == 0 {
					t.Errorf("leak: %+v; want leaked requests", seen)
				}
			}
		})
	}
}
