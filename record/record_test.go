package record

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/sim"
)

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// live runs the chat scenario for a while, recording what a dashboard would receive (a
// snapshot, then every step's events, with a resync in the middle), and returns the
// recording and the engine's snapshot after each step.
func live(t *testing.T, steps int) ([]byte, map[uint64]engine.Snapshot) {
	t.Helper()
	var buf bytes.Buffer
	rec := NewRecorder(nopCloser{&buf})
	snaps := liveInto(t, rec, 0, 3, steps)
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), snaps
}

// liveInto records a run of the chat scenario with a seed into rec, as epoch epoch (a
// dashboard's connection to one server run), and returns the engine's snapshot after each
// step.
func liveInto(t *testing.T, rec *Recorder, epoch, seed uint64, steps int) map[uint64]engine.Snapshot {
	t.Helper()
	sc, _ := sim.Lookup("chat")
	cfg := engine.DefaultConfig()
	sc.Configure(&cfg)
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := sc.New(sim.Options{Seed: seed})
	s0 := e.Snapshot()
	if err := rec.Write(feed.Update{Snapshot: &s0, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	snaps := map[uint64]engine.Snapshot{}
	ls := &sim.Lockstep{E: e, D: sim.NewDriver(w, sc.Driver), StepTime: 50 * time.Millisecond}
	ls.OnReady = func(rd engine.Ready) {
		if err := rec.Write(feed.Update{Events: rd.Events, Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
	}
	// Events are stamped with the last step taken, so the calls between steps N and N+1
	// belong to step N: the state "at step N" is the engine's just before step N+1.
	ls.BeforeStep = func() {
		if evs := e.TakeEvents(); len(evs) > 0 {
			if err := rec.Write(feed.Update{Events: evs, Epoch: epoch}); err != nil {
				t.Fatal(err)
			}
		}
		n := e.StepNumber()
		snaps[n] = e.Snapshot()
		if n == uint64(steps/2) {
			s := e.Snapshot()
			if err := rec.Write(feed.Update{Snapshot: &s, Dropped: 7, Epoch: epoch}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ls.Run(steps + 1)
	return snaps
}

// Recording then replaying gives the same sequence of snapshots: at every step, the state
// the recording rebuilds equals the engine's own snapshot at that step.
func TestRecordThenReplayGivesTheSameSnapshots(t *testing.T) {
	data, snaps := live(t, 400)
	rec, err := Load(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Dropped != 7 {
		t.Errorf("Dropped = %d, want the 7 recorded", rec.Dropped)
	}
	first, last := rec.Steps()
	if first != 0 || last != 401 {
		t.Errorf("Steps() = %d, %d, want 0, 401", first, last)
	}
	for _, step := range []uint64{1, 57, 199, 200, 201, 333, 400} {
		v, _, err := rec.StateAt(step)
		if err != nil {
			t.Fatalf("StateAt(%d): %v", step, err)
		}
		if got, want := v.Snapshot(), snaps[step]; !reflect.DeepEqual(got, want) {
			t.Errorf("StateAt(%d) differs from the engine's snapshot at that step", step)
		}
	}
}

// The player steps through the recording one engine step at a time, and seeks.
func TestPlayerStepsAndSeeks(t *testing.T) {
	data, snaps := live(t, 120)
	rec, err := Load(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		p := NewPlayer(rec, "test.jsonl", PlayerOptions{Speed: 1, Paused: true})
		go p.Run(t.Context())
		defer p.Close()
		var view *engine.View
		take := func() {
			synctest.Wait()
			u := p.Take()
			if u.Snapshot != nil {
				v, err := engine.NewView(*u.Snapshot)
				if err != nil {
					t.Fatal(err)
				}
				view = v
			}
			for _, ev := range u.Events {
				if err := view.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
		}
		take()
		if got := view.Last().Step; got != 0 {
			t.Fatalf("paused at the start: step %d, want 0", got)
		}
		for want := uint64(1); want <= 5; want++ {
			if err := p.Control(feed.Control{Op: feed.ControlStep, N: 1}); err != nil {
				t.Fatal(err)
			}
			take()
			if got := view.Last().Step; got != want {
				t.Fatalf("after %d single steps: at step %d", want, got)
			}
			if !reflect.DeepEqual(view.Snapshot(), snaps[want]) {
				t.Fatalf("step %d: the played state differs from the engine's", want)
			}
		}
		if err := p.Control(feed.Control{Op: feed.ControlSeek, N: 90}); err != nil {
			t.Fatal(err)
		}
		take()
		if !reflect.DeepEqual(view.Snapshot(), snaps[90]) {
			t.Fatalf("after seeking to step 90: the state differs from the engine's at 90")
		}
		// Playing on at 10x runs to the end.
		_ = p.Control(feed.Control{Op: feed.ControlSpeed, N: 1000})
		_ = p.Control(feed.Control{Op: feed.ControlResume})
		time.Sleep(time.Minute)
		take()
		if got := view.Last().Step; got != 121 {
			t.Fatalf("played to step %d, want the end, 121", got)
		}
		if l := p.Link(); !strings.Contains(l.Err, "end of the recording") {
			t.Errorf("Link() at the end = %+v", l)
		}
		if err := p.Control(feed.Control{Op: feed.ControlSeek, N: -1}); err == nil {
			t.Errorf("seek to -1 = nil, want an error")
		}
	})
}

// A dashboard that does not keep up with the player loses events, never the player's pace:
// past the backlog the pending events are dropped, counted on top of those the recorded
// dashboard lost, and replaced by the state the player has reached, from which what
// follows applies.
func TestPlayerBacklogOverflows(t *testing.T) {
	data, _ := live(t, 120)
	rec, err := Load(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	_, last := rec.Steps()
	end, _, err := rec.StateAt(last)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		const backlog = 32
		p := NewPlayer(rec, "test.jsonl", PlayerOptions{Speed: 1000, Backlog: backlog})
		go p.Run(t.Context())
		defer p.Close()
		time.Sleep(time.Minute) // plays to the end; nobody takes
		synctest.Wait()
		u := p.Take()
		if u.Dropped <= rec.Dropped {
			t.Errorf("Take().Dropped = %d after the whole recording went untaken, want more than the %d recorded", u.Dropped, rec.Dropped)
		}
		if u.Snapshot == nil || len(u.Events) > backlog {
			t.Fatalf("Take() = a snapshot %v and %d events, want a snapshot and at most the backlog of %d", u.Snapshot != nil, len(u.Events), backlog)
		}
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range u.Events {
			if err := v.Apply(ev); err != nil {
				t.Fatalf("Apply(%s) after the player's snapshot: %v", ev, err)
			}
		}
		if !reflect.DeepEqual(v.Snapshot(), end.Snapshot()) {
			t.Errorf("the state taken after the overflow differs from the recording's at its end, step %d", last)
		}
	})
}

func TestLoadRefusesBrokenRecordings(t *testing.T) {
	data, _ := live(t, 20)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for name, in := range map[string]string{
		"empty":              "",
		"garbage":            "{",
		"events first":       strings.Join(lines[2:], "\n"), // lines[0] is the hello, lines[1] the snapshot
		"an event missing":   strings.Join(lines[:2], "\n") + "\n" + strings.Join(lines[3:], "\n"),
		"a broken line":      strings.Join(lines[:3], "\n") + "\n{\n" + strings.Join(lines[3:], "\n"),
		"unknown frame type": `{"type":"nope"}`,
	} {
		if _, err := Load(strings.NewReader(in)); err == nil {
			t.Errorf("Load(%s) = nil error", name)
		}
	}
}
