package runner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// recorder is an observer that keeps what it saw, on the engine's goroutine.
type recorder struct {
	kinds []string
	steps []uint64 // the engine's step number at each observation
}

func (o *recorder) Observe(e *engine.Engine, evs []engine.Event) {
	for _, ev := range evs {
		o.kinds = append(o.kinds, engine.KindOf(ev))
	}
	o.steps = append(o.steps, e.StepNumber())
}

// An observer sees the events of every call and every step, with the engine right after
// it, before any subscriber does; a publish with no event is not observed.
func TestObserversSeeEveryCallAndStep(t *testing.T) {
	e, err := engine.New(engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	o := &recorder{}
	r := New(e, Config{Clock: time.Now, StartPaused: true, Observers: []Observer{o}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	sub := r.Subscribe()
	defer sub.Close()
	sub.Take() // the first snapshot
	if err := r.Do(ctx, func(e *engine.Engine, now time.Time) error {
		return e.PrepRecv(now, engine.PrepRecv{ID: "a", Prompt: []int32{1, 2, 3}, End: -1, HasEnd: true, MaxTokens: 2})
	}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	if err := r.Do(ctx, func(*engine.Engine, time.Time) error {
		seen = slices.Clone(o.kinds)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(seen, "request_arrived") {
		t.Fatalf("after prep_recv the observer saw %v, want request_arrived among them", seen)
	}
	var got []string
	for _, ev := range sub.Take().Events {
		got = append(got, engine.KindOf(ev))
	}
	// The observer has seen everything since the engine started; the subscriber what
	// followed its snapshot.
	if len(got) == 0 || len(got) > len(seen) || !slices.Equal(got, seen[len(seen)-len(got):]) {
		t.Fatalf("the subscriber got %v, the observer saw %v: want the observer's last events", got, seen)
	}
	if err := r.Control(feed.Control{Op: feed.ControlStep, N: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var steps []uint64
		_ = r.Do(ctx, func(*engine.Engine, time.Time) error { steps = slices.Clone(o.steps); return nil })
		if len(steps) > 0 && steps[len(steps)-1] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("observations %v: the step was never observed", steps)
		}
		time.Sleep(time.Millisecond)
	}
}
