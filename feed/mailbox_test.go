package feed_test

import (
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// ev returns event number i: its step is i, so order and gaps can be read back.
func ev(i int) engine.Event {
	return engine.SeqPopped{Stamp: engine.Stamp{Step: uint64(i)}, Seq: 1, N: 1}
}

// evs returns events from..to-1.
func evs(from, to int) []engine.Event {
	var out []engine.Event
	for i := from; i < to; i++ {
		out = append(out, ev(i))
	}
	return out
}

// snap returns a snapshot that includes everything up to event i.
func snap(i int) *engine.Snapshot { return &engine.Snapshot{Stamp: engine.Stamp{Step: uint64(i)}} }

// signalled reports whether C holds a signal (or is closed), consuming it.
func signalled(mb *feed.Mailbox) bool {
	select {
	case <-mb.C():
		return true
	default:
		return false
	}
}

// Everything offered comes out of one Take in order: the snapshot, then the events of every
// offer, the latest status; and the mailbox is then empty.
func TestMailboxDeliversInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb := feed.NewMailbox(100)
		mb.Snapshot(snap(0))
		mb.SetStatus(feed.Status{Rate: 1})
		for _, batch := range [][]engine.Event{evs(1, 4), nil, evs(4, 5), evs(5, 9)} {
			if !mb.Offer(batch) {
				t.Fatalf("Offer(%d events) = false on a mailbox with room", len(batch))
			}
		}
		mb.SetStatus(feed.Status{Rate: 2, Paused: true})
		u := mb.Take()
		if u.Snapshot == nil || u.Snapshot.Stamp.Step != 0 {
			t.Errorf("Take().Snapshot = %v, want the snapshot offered first", u.Snapshot)
		}
		if want := evs(1, 9); !reflect.DeepEqual(u.Events, want) {
			t.Errorf("Take().Events = %v, want %v", u.Events, want)
		}
		if want := (feed.Status{Rate: 2, Paused: true}); u.Status == nil || *u.Status != want {
			t.Errorf("Take().Status = %v, want the latest, %+v", u.Status, want)
		}
		if u.Dropped != 0 {
			t.Errorf("Take().Dropped = %d, want 0", u.Dropped)
		}
		if again := mb.Take(); !reflect.DeepEqual(again, feed.Update{}) {
			t.Errorf("a second Take() = %+v, want an empty update", again)
		}
		// A snapshot starts over: it replaces the pending snapshot and events.
		mb.Offer(evs(9, 12))
		mb.Snapshot(snap(20))
		mb.Offer(evs(21, 22))
		u = mb.Take()
		if u.Snapshot == nil || u.Snapshot.Stamp.Step != 20 || !reflect.DeepEqual(u.Events, evs(21, 22)) {
			t.Errorf("after events, a snapshot and an event: Take() = %+v, want snapshot 20 then event 21", u)
		}
	})
}

// Up to the backlog, events are kept; past it, everything pending is dropped and counted, a
// snapshot is owed, and the events offered until it comes are refused and counted too.
// The snapshot clears the debt; the total stays in every Take.
func TestMailboxOverflowOwesASnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb := feed.NewMailbox(4)
		mb.Snapshot(snap(0))
		if !mb.Offer(evs(1, 4)) || !mb.Offer(evs(4, 5)) {
			t.Fatal("Offer refused events that fit a backlog of 4 exactly")
		}
		if mb.Owed() {
			t.Fatal("Owed() = true with the backlog full but not passed")
		}
		if mb.Offer(evs(5, 6)) {
			t.Fatal("Offer(the 5th event) = true, want false: the backlog is 4")
		}
		if !mb.Owed() || mb.Dropped() != 5 {
			t.Fatalf("after the overflow: Owed() = %v, Dropped() = %d; want true and 5 (the 4 pending and the one offered)", mb.Owed(), mb.Dropped())
		}
		if mb.Offer(evs(6, 8)) {
			t.Fatal("Offer while a snapshot is owed = true, want false")
		}
		if u := mb.Take(); u.Snapshot != nil || len(u.Events) != 0 || u.Dropped != 7 {
			t.Fatalf("Take() while owed = %+v, want no snapshot, no events, Dropped 7", u)
		}
		if !mb.Owed() {
			t.Fatal("Take() paid the snapshot; only Snapshot may")
		}
		mb.Snapshot(snap(7))
		if mb.Owed() {
			t.Fatal("Owed() = true after Snapshot")
		}
		if !mb.Offer(evs(8, 10)) {
			t.Fatal("Offer after the snapshot = false, want true")
		}
		u := mb.Take()
		if u.Snapshot == nil || u.Snapshot.Stamp.Step != 7 || !reflect.DeepEqual(u.Events, evs(8, 10)) || u.Dropped != 7 {
			t.Errorf("Take() after the snapshot = %+v, want snapshot 7, events 8 and 9, Dropped 7", u)
		}
		// One batch larger than the backlog overflows an empty mailbox by itself.
		if mb.Offer(evs(10, 15)) || !mb.Owed() || mb.Dropped() != 12 {
			t.Errorf("a batch of 5 into an empty backlog of 4: owed %v, dropped %d; want owed and 12", mb.Owed(), mb.Dropped())
		}
	})
}

// Resync throws away what is pending without counting it (the viewer asked) and owes a
// snapshot; statuses are kept through it and through an overflow, and coalesce.
func TestMailboxResyncAndStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb := feed.NewMailbox(2)
		mb.Snapshot(snap(0))
		mb.Offer(evs(1, 3))
		mb.SetStatus(feed.Status{Target: 1})
		mb.Resync()
		if !mb.Owed() || mb.Dropped() != 0 {
			t.Fatalf("after Resync: Owed() = %v, Dropped() = %d; want true, 0", mb.Owed(), mb.Dropped())
		}
		mb.SetStatus(feed.Status{Target: 2})
		u := mb.Take()
		if u.Snapshot != nil || len(u.Events) != 0 || u.Status == nil || u.Status.Target != 2 {
			t.Fatalf("Take() after Resync = %+v, want only the latest status (target 2)", u)
		}
		mb.Snapshot(snap(2))
		mb.SetStatus(feed.Status{Target: 3})
		mb.Offer(evs(3, 6)) // overflows
		if u := mb.Take(); u.Status == nil || u.Status.Target != 3 || u.Snapshot != nil {
			t.Errorf("Take() after an overflow = %+v, want the status kept and the snapshot dropped", u)
		}
	})
}

// C holds one signal however many changes come before the viewer looks; refused offers do
// not signal; Close closes C, after which the mailbox refuses everything but still hands
// over what was pending.
func TestMailboxSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb := feed.NewMailbox(3)
		if signalled(mb) {
			t.Fatal("a new mailbox is signalled")
		}
		mb.Snapshot(snap(0))
		mb.Offer(evs(1, 2))
		mb.SetStatus(feed.Status{})
		if !signalled(mb) {
			t.Fatal("not signalled after a snapshot, an offer and a status")
		}
		if signalled(mb) {
			t.Fatal("signalled twice for changes made before the viewer looked")
		}
		mb.Offer(evs(2, 10)) // overflow: the viewer must learn of the loss
		if !signalled(mb) {
			t.Fatal("not signalled after an overflow")
		}
		mb.Offer(evs(10, 11))
		if signalled(mb) {
			t.Fatal("signalled by an offer refused while a snapshot is owed")
		}
		mb.Notify()
		if !signalled(mb) {
			t.Fatal("Notify did not signal")
		}
		mb.Snapshot(snap(10))
		mb.Offer(evs(11, 12))
		mb.Close()
		mb.Close() // twice is fine
		if _, ok := <-mb.C(); ok {
			// The pending signal may come first; the next receive must see the close.
			if _, ok := <-mb.C(); ok {
				t.Fatal("C is not closed after Close")
			}
		}
		if mb.Offer(evs(12, 13)) || mb.Owed() {
			t.Error("a closed mailbox accepts events or owes a snapshot")
		}
		mb.Snapshot(snap(99))
		mb.SetStatus(feed.Status{Paused: true})
		mb.Resync()
		mb.Notify()
		u := mb.Take()
		if u.Snapshot == nil || u.Snapshot.Stamp.Step != 10 || !reflect.DeepEqual(u.Events, evs(11, 12)) || u.Status == nil || u.Status.Paused {
			t.Errorf("Take() after Close = %+v, want what was pending at Close: snapshot 10, event 11, the first status", u)
		}
	})
}

// A viewer slower than its producer loses events, never the producer's time: every event
// offered is either taken, in order and after the state it follows, or counted dropped;
// the producer resolves each owed snapshot at once, as the player does.
func TestMailboxSlowViewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const total = 10_000
		mb := feed.NewMailbox(64)
		mb.Snapshot(snap(0))
		start := time.Now()
		go func() {
			defer mb.Close()
			for i := 1; i <= total; i++ {
				time.Sleep(time.Millisecond)
				if !mb.Offer([]engine.Event{ev(i)}) && mb.Owed() {
					mb.Snapshot(snap(i)) // the state after event i
				}
			}
			if d := time.Since(start); d != total*time.Millisecond {
				t.Errorf("the producer took %v for %d offers a millisecond apart: it waited for the viewer", d, total)
			}
		}()
		var (
			last             = -1 // the last event the viewer's state includes
			taken, snapshots int
			dropped          uint64
		)
		apply := func(u feed.Update) {
			if u.Snapshot != nil {
				last = int(u.Snapshot.Stamp.Step)
				snapshots++
			}
			for _, e := range u.Events {
				if got := int(e.When().Step); got != last+1 {
					t.Fatalf("event %d follows event %d", got, last)
				}
				last++
				taken++
			}
			if u.Dropped < dropped {
				t.Fatalf("Dropped went down from %d to %d", dropped, u.Dropped)
			}
			dropped = u.Dropped
		}
		for range mb.C() {
			apply(mb.Take())
			time.Sleep(100 * time.Millisecond) // 100 events come meanwhile; 64 fit
		}
		apply(mb.Take())
		if last != total {
			t.Errorf("the viewer's state ends at event %d, want %d", last, total)
		}
		if snapshots < 2 || dropped == 0 {
			t.Errorf("%d snapshots, %d dropped: want the slow viewer to have lost events and been resynced", snapshots, dropped)
		}
		// Each snapshot the producer made covers the event that overflowed, which counts
		// as dropped too: taken + dropped = offered, exactly.
		if uint64(taken)+dropped != total {
			t.Errorf("taken %d + dropped %d = %d, want every one of the %d events accounted for", taken, dropped, uint64(taken)+dropped, total)
		}
	})
}

// Close may race with producers: they get refusals, never a panic (a send on a closed
// channel), and the viewer's loop on C ends. Run with -race.
func TestMailboxCloseWhileOffering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mb := feed.NewMailbox(8)
		var wg sync.WaitGroup
		for p := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					mb.SetStatus(feed.Status{Rate: float64(i)})
					mb.Notify()
					if !mb.Offer(evs(i, i+1)) && !mb.Owed() {
						return // closed (an overflow leaves a snapshot owed)
					}
					if mb.Owed() {
						mb.Snapshot(snap(i))
					}
					time.Sleep(time.Duration(p+1) * time.Microsecond)
				}
			})
		}
		viewer := make(chan struct{})
		go func() {
			defer close(viewer)
			for range mb.C() {
				mb.Take()
			}
		}()
		time.Sleep(time.Millisecond)
		wg.Go(mb.Close)
		wg.Go(mb.Close)
		wg.Wait()
		<-viewer
		if mb.Offer(evs(0, 1)) {
			t.Error("Offer after Close = true")
		}
	})
}

// A bound of zero or less means the default.
func TestMailboxDefaultBacklog(t *testing.T) {
	mb := feed.NewMailbox(0)
	if !mb.Offer(evs(0, feed.DefaultBacklog)) {
		t.Errorf("NewMailbox(0) refused %d events, want the default backlog", feed.DefaultBacklog)
	}
	if mb.Offer(evs(0, 1)) {
		t.Errorf("NewMailbox(0) took %d events, want at most the default backlog", feed.DefaultBacklog+1)
	}
}

// A new epoch begins with the next snapshot: what was pending, and events offered before
// that snapshot, keep the old epoch.
func TestMailboxEpochs(t *testing.T) {
	m := feed.NewMailbox(10)
	m.Snapshot(snap(0))
	if u := m.Take(); u.Epoch != 0 {
		t.Fatalf("first epoch = %d, want 0", u.Epoch)
	}
	m.Offer(evs(0, 1))
	m.NewEpoch()
	m.Offer(evs(1, 3))
	if u := m.Take(); u.Epoch != 0 || len(u.Events) != 3 {
		t.Errorf("events before the new epoch's snapshot: epoch %d, %d events; want 0, 3", u.Epoch, len(u.Events))
	}
	m.Snapshot(snap(0))
	m.Offer(evs(0, 1))
	if u := m.Take(); u.Epoch != 1 || u.Snapshot == nil || len(u.Events) != 1 {
		t.Errorf("after the new epoch's snapshot: epoch %d, snapshot %v; want 1 with the snapshot", u.Epoch, u.Snapshot != nil)
	}
	m.Snapshot(snap(0)) // a resync: the same epoch
	if u := m.Take(); u.Epoch != 1 {
		t.Errorf("a resync moved the epoch to %d, want 1", u.Epoch)
	}
}
