package engine_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/internal/lockstep"
	"github.com/kvtop/kvtop/sim"
)

// A View keeps its page map and its requests' statuses current from the events it applies,
// touching only what they touch; this is the differential check against deriving them from
// scratch. In every scenario, after every engine step, two Views (one fed from the start,
// one from a snapshot taken a third of the way in) agree page by page and request by
// request with a derivation of the same View from scratch and with the engine's own; a
// reader of the page map's changes keeps an exact copy of the page states; and a request
// whose status changed has a new version. A third View, read every 97 steps only, stops
// keeping its page map when too many events go unread (the limit lowered to 300 events, so
// that it does in every scenario) and builds it again, and agrees too.
func TestKeptDerivationIsTheOneFromScratch(t *testing.T) {
	steps := 1200
	if testing.Short() {
		steps = 300
	}
	defer engine.SetKeepLimit(func(int) int { return 300 })()
	for _, sc := range sim.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			var views []*keptReader
			var rare *keptReader
			rebuilt := 0
			n, changed := 0, 0
			_, err := lockstep.Run(sc.Name, 1, steps, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
				if t.Failed() {
					return
				}
				for _, kr := range append(views, rare) {
					if kr == nil {
						continue
					}
					for _, ev := range evs {
						if err := kr.v.Apply(ev); err != nil {
							t.Fatal(err)
						}
					}
				}
				if len(views) == 0 || len(views) == 1 && e.StepNumber() == uint64(steps/3) {
					v, err := engine.NewView(e.Snapshot())
					if err != nil {
						t.Fatal(err)
					}
					views = append(views, &keptReader{v: v, seen: map[string]seenStatus{}})
					if rare == nil {
						v, _ := engine.NewView(e.Snapshot())
						rare = &keptReader{v: v, seen: map[string]seenStatus{}}
					}
				}
				if len(evs) == 0 || !isStep(evs[len(evs)-1]) {
					return // after a call: checked with the step
				}
				if e.StepNumber()%97 == 0 {
					if !rare.v.KeepsPages() {
						rebuilt++
					}
					if err := rare.check(e); err != nil {
						t.Fatalf("step %d, the view read every 97 steps: %v", e.StepNumber(), err)
					}
				}
				for i, kr := range views {
					if err := kr.check(e); err != nil {
						t.Fatalf("step %d, view %d: %v", e.StepNumber(), i, err)
					}
					changed += kr.statusChanges
				}
				n++
			})
			if err != nil {
				t.Fatal(err)
			}
			if n < steps/2 || changed == 0 {
				t.Fatalf("%d steps checked, %d status changes seen", n, changed)
			}
			if rebuilt == 0 && sc.Name != "recycle-stall" {
				t.Errorf("the view read every 97 steps never stopped keeping its page map")
			}
			if kr := views[0]; kr.incremental < n/2 || kr.pagesChanged == 0 {
				t.Errorf("the page map's changes were read %d times in %d steps, %d pages changed: the journal is not exercised", kr.incremental, n, kr.pagesChanged)
			}
		})
	}
}

func isStep(ev engine.Event) bool {
	_, ok := ev.(engine.StepCompleted)
	return ok
}

// keptReader is a View and what a reader of it keeps: a copy of the page states, made
// from the page map's changes, and each request's status and version as last seen.
type keptReader struct {
	v            *engine.View
	mark         engine.PageMark
	states       []engine.PageState
	seen         map[string]seenStatus
	incremental  int // times the changes since the mark were read
	pagesChanged int
	// statusChanges counts the statuses that changed in the last check.
	statusChanges int
}

type seenStatus struct {
	st  engine.RequestStatus
	ver uint64
}

func (kr *keptReader) check(e *engine.Engine) error {
	v := kr.v
	if err := v.CheckKept(); err != nil {
		return err
	}
	pm := v.PageMap()
	want := engine.ScratchPageMap(e)
	if !slices.Equal(pm.States, want.States) || pm.Count != want.Count {
		for pg := range want.States {
			if pm.States[pg] != want.States[pg] {
				return errorf("page %d is %s in the view, %s in the engine", pg, pm.States[pg], want.States[pg])
			}
		}
		return errorf("the view counts %v, the engine %v", pm.Count, want.Count)
	}
	if got, want := v.Derived(), e.Derived(); got != want {
		return errorf("the view derives %+v, the engine %+v", got, want)
	}
	sts, wantSts := v.Statuses(), engine.ScratchStatuses(e)
	if !slices.Equal(sts, wantSts) {
		return errorf("the view's statuses are not the engine's")
	}
	// The reader's copy of the page states.
	pgs, next, ok := pm.Changes(kr.mark, nil)
	if ok {
		kr.incremental++
		kr.pagesChanged += len(pgs)
		for _, pg := range pgs {
			kr.states[pg] = pm.States[pg]
		}
	} else {
		kr.states = slices.Clone(pm.States)
	}
	kr.mark = next
	if !slices.Equal(kr.states, pm.States) {
		return errorf("a reader of the page map's changes has pages the map does not")
	}
	// A status that changed comes with a new version.
	vers := v.RequestVersions()
	kr.statusChanges = 0
	for i, r := range v.Requests() {
		if s, ok := kr.seen[r.ID]; ok && s.st != sts[i] {
			kr.statusChanges++
			if s.ver == vers[i] {
				return errorf("%s: status %+v became %+v at the same version %d", r.ID, s.st, sts[i], vers[i])
			}
		}
		kr.seen[r.ID] = seenStatus{sts[i], vers[i]}
	}
	for i, r := range v.Requests() {
		if pgs, ok := pm.SeqPages(r.Seq); sts[i].Pages >= 0 && (!ok || pgs != sts[i].Pages) {
			return errorf("%s holds %d pages, its sequence %d has %d (%v)", r.ID, sts[i].Pages, r.Seq, pgs, ok)
		}
	}
	return nil
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// BenchmarkKeptPageMap measures what keeping the page map costs a View an event: the chat
// scenario's events of 2,000 steps applied to a View from its first snapshot, its page map
// read after every step, so kept ("kept"), or never, so not ("not-kept"); "per-event"
// reports the difference, the cost keepLimit weighs against building the map again.
func BenchmarkKeptPageMap(b *testing.B) {
	var snap *engine.Snapshot
	var steps [][]engine.Event
	var step []engine.Event
	_, err := lockstep.Run("chat", 1, 2000, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		if snap == nil {
			s := e.Snapshot()
			snap = &s
			return
		}
		step = append(step, evs...)
		if len(evs) > 0 && isStep(evs[len(evs)-1]) {
			steps = append(steps, step)
			step = nil
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, s := range steps {
		n += len(s)
	}
	per := map[bool]float64{}
	for _, kept := range []bool{false, true} {
		name := "not-kept"
		if kept {
			name = "kept"
		}
		b.Run(name, func(b *testing.B) {
			if !kept {
				defer engine.SetKeepLimit(func(int) int { return 0 })()
			}
			for b.Loop() {
				v, err := engine.NewView(*snap)
				if err != nil {
					b.Fatal(err)
				}
				v.PageMap()
				for _, s := range steps {
					for _, ev := range s {
						if err := v.Apply(ev); err != nil {
							b.Fatal(err)
						}
					}
					if kept {
						v.PageMap()
					}
				}
			}
			per[kept] = float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(n)
			b.ReportMetric(per[kept], "ns/event")
			if kept {
				b.ReportMetric(per[true]-per[false], "per-event")
			}
		})
	}
}
