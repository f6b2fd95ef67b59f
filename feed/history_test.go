package feed_test

import (
	"errors"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/sim"
)

// viewer is what a dashboard does with a history: it folds every update into its view,
// adds the update to the history, and checkpoints its view when the history says so.
type viewer struct {
	t    testing.TB
	v    *engine.View
	h    *feed.History
	each func() // after every update and its checkpoint
}

func (vw *viewer) take(u feed.Update) {
	if u.Snapshot != nil {
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			vw.t.Fatal(err)
		}
		vw.v = v
	}
	for _, ev := range u.Events {
		if err := vw.v.Apply(ev); err != nil {
			vw.t.Fatal(err)
		}
	}
	vw.h.Add(u)
	if vw.h.Due() {
		s := vw.v.Snapshot()
		vw.h.AddSnapshot(&s)
	}
	if vw.each != nil {
		vw.each()
	}
}

// chat runs the chat scenario for steps steps, handing what a dashboard would receive (a
// snapshot, then the events of each step and of the calls after it) to take, and returns
// the engine's snapshot at each step from keep on: the state once the calls after the step
// are in, just before the next one.
func chat(t testing.TB, steps int, keep uint64, take func(feed.Update)) map[uint64]engine.Snapshot {
	t.Helper()
	sc, _ := sim.Lookup("chat")
	cfg := engine.DefaultConfig()
	sc.Configure(&cfg)
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := sc.New(sim.Options{Seed: 5})
	s0 := e.Snapshot()
	take(feed.Update{Snapshot: &s0})
	snaps := map[uint64]engine.Snapshot{}
	ls := &sim.Lockstep{E: e, D: sim.NewDriver(w, sc.Driver), StepTime: 50 * time.Millisecond}
	ls.OnReady = func(rd engine.Ready) { take(feed.Update{Events: rd.Events}) }
	ls.BeforeStep = func() {
		if evs := e.TakeEvents(); len(evs) > 0 {
			take(feed.Update{Events: evs})
		}
		if n := e.StepNumber(); n >= keep {
			snaps[n] = e.Snapshot()
		}
	}
	ls.Run(steps + 1)
	return snaps
}

// At every step it holds, the history rebuilds the engine's own snapshot at that step,
// whether it starts from the source's snapshot or from one of its checkpoints.
func TestHistoryStateAtIsTheEnginesSnapshot(t *testing.T) {
	// A bound of 1,000 steps checkpoints every 100; none is reached.
	vw := &viewer{t: t, h: feed.NewHistory(feed.HistoryLimits{Steps: 1000})}
	snaps := chat(t, 600, 0, vw.take)
	h := vw.h
	if h.Snapshots() < 6 {
		t.Fatalf("%d snapshots held after 600 steps: the checkpoints were never due", h.Snapshots())
	}
	first, last, ok := h.Steps()
	if !ok || first != 0 || last != 601 {
		t.Fatalf("Steps() = %d, %d, %v; want 0, 601, true", first, last, ok)
	}
	for step := uint64(0); step <= 600; step++ {
		v, next, err := h.StateAt(step)
		if err != nil {
			t.Fatalf("StateAt(%d): %v", step, err)
		}
		if got, want := v.Snapshot(), snaps[step]; !reflect.DeepEqual(got, want) {
			t.Fatalf("StateAt(%d) is not the engine's snapshot at that step", step)
		}
		if next < h.Len() && h.At(next).Stamp.Step <= step {
			t.Fatalf("StateAt(%d) stops at entry %d, stamped step %d", step, next, h.At(next).Stamp.Step)
		}
	}
}

// Advance goes on from a state to a later step: the same state StateAt gives there.
func TestHistoryAdvance(t *testing.T) {
	vw := &viewer{t: t, h: feed.NewHistory(feed.HistoryLimits{})}
	snaps := chat(t, 300, 0, vw.take)
	v, next, err := vw.h.StateAt(40)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []uint64{41, 42, 100, 299} {
		if v, next, err = vw.h.Advance(v, next, step); err != nil {
			t.Fatalf("Advance to %d: %v", step, err)
		}
		if !reflect.DeepEqual(v.Snapshot(), snaps[step]) {
			t.Fatalf("Advance to %d is not the engine's snapshot at that step", step)
		}
	}
}

// Held within the bounds after every update, and not far short of them: the oldest part
// goes a checkpoint at a time.
func TestHistoryBounds(t *testing.T) {
	for _, lim := range []feed.HistoryLimits{{Steps: 200}, {Bytes: 1 << 20}, {Steps: 300, Bytes: 1 << 20}} {
		vw := &viewer{t: t, h: feed.NewHistory(lim)}
		var maxSpan uint64
		var maxBytes int64
		trimmed := false
		updates := 0
		vw.each = func() {
			first, last, _ := vw.h.Steps()
			span := last - first
			if lim.Steps > 0 && span > lim.Steps {
				t.Fatalf("%+v: steps %d–%d held, a span of %d", lim, first, last, span)
			}
			if lim.Bytes > 0 && vw.h.Bytes() > lim.Bytes {
				t.Fatalf("%+v: %d bytes held", lim, vw.h.Bytes())
			}
			if updates++; updates%64 == 0 {
				n := 0
				for i := range vw.h.Len() {
					if vw.h.At(i).Event != nil {
						n++
					}
				}
				if n != vw.h.Events() {
					t.Fatalf("%+v: Events() = %d, %d held", lim, vw.h.Events(), n)
				}
			}
			trimmed = trimmed || first > 0
			maxSpan, maxBytes = max(maxSpan, span), max(maxBytes, vw.h.Bytes())
		}
		snaps := chat(t, 1500, 1000, vw.take)
		if !trimmed {
			t.Fatalf("%+v: nothing was ever trimmed in 1,500 steps", lim)
		}
		if lim.Steps > 0 && lim.Bytes == 0 && maxSpan < lim.Steps*9/10 {
			t.Errorf("%+v: at most %d steps held, want close to the bound", lim, maxSpan)
		}
		if lim.Bytes > 0 && lim.Steps == 0 && maxBytes < lim.Bytes/2 {
			t.Errorf("%+v: at most %d bytes held, want close to the bound", lim, maxBytes)
		}
		// What is held still rebuilds exactly.
		first, last, _ := vw.h.Steps()
		for _, step := range []uint64{first, (first + last) / 2, last - 1} {
			v, _, err := vw.h.StateAt(step)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v.Snapshot(), snaps[step]) {
				t.Errorf("%+v: StateAt(%d) after trimming is not the engine's snapshot", lim, step)
			}
		}
	}
}

// Nothing to rebuild from before the first snapshot: events before it are dropped, and
// StateAt says so. Reset starts over.
func TestHistoryNeedsASnapshot(t *testing.T) {
	h := feed.NewHistory(feed.HistoryLimits{})
	h.Add(feed.Update{Events: []engine.Event{engine.StepCompleted{Stamp: engine.Stamp{Step: 1}}}})
	if h.Len() != 0 {
		t.Errorf("Len() = %d after events with no snapshot, want 0", h.Len())
	}
	if _, _, err := h.StateAt(1); !errors.Is(err, feed.ErrNoState) {
		t.Errorf("StateAt on an empty history: %v, want ErrNoState", err)
	}
	if _, _, ok := h.Steps(); ok || h.Due() {
		t.Error("an empty history has steps, or wants a checkpoint")
	}
	e, _ := engine.New(engine.DefaultConfig())
	s := e.Snapshot()
	h.Add(feed.Update{Snapshot: &s, Events: []engine.Event{engine.StepCompleted{Stamp: engine.Stamp{Step: 1}}}})
	if h.Len() != 2 || h.Events() != 1 || h.Bytes() <= 0 {
		t.Errorf("Len() = %d, Events() = %d, Bytes() = %d after a snapshot and an event; want 2, 1 and some", h.Len(), h.Events(), h.Bytes())
	}
	h.Reset()
	if h.Len() != 0 || h.Events() != 0 || h.Bytes() != 0 || h.Snapshots() != 0 {
		t.Errorf("after Reset: Len %d, Events %d, Bytes %d, Snapshots %d; want all 0", h.Len(), h.Events(), h.Bytes(), h.Snapshots())
	}
}

// The memory estimate errs high, but not wildly: measured as the heap a history alone
// keeps alive (what the viewer's own view shares with it is not counted), it is at most
// the estimate and at least a third of it.
func TestHistoryBytesErrHigh(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	vw := &viewer{t: t, h: feed.NewHistory(feed.HistoryLimits{})}
	chat(t, 1000, 1<<62, vw.take)
	estimate := vw.h.Bytes()
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	with := heap()
	vw.h = nil
	without := heap()
	runtime.KeepAlive(vw.v)
	measured := int64(with) - int64(without)
	t.Logf("history of 1,000 steps: estimated %d bytes, measured %d", estimate, measured)
	if measured > estimate {
		t.Errorf("the history holds %d bytes, more than its estimate %d", measured, estimate)
	}
	if measured < estimate/3 {
		t.Errorf("the history holds %d bytes, its estimate %d is over three times that", measured, estimate)
	}
}
