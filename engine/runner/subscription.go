package runner

import (
	"context"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Subscription is a viewer's mailbox: a signal channel of capacity one and the updates
// pending behind it. The runner offers every step's events and never waits; Take returns
// everything pending as one update, so a viewer's cost follows its own pace.
type Subscription struct {
	r      *Runner
	signal chan struct{}

	mu      sync.Mutex
	pending feed.Update
	n       int  // events pending
	lost    bool // events were dropped; a snapshot is owed before any more events
	dropped uint64
	closed  bool
}

// Subscribe returns a new subscription whose first update is a snapshot of the engine.
func (r *Runner) Subscribe() *Subscription {
	s := &Subscription{r: r, signal: make(chan struct{}, 1)}
	// The snapshot and the registration happen on the engine's goroutine, so that the
	// first event offered is the first after the snapshot.
	err := r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
		snap := e.Snapshot()
		st := r.Status()
		s.pending = feed.Update{Snapshot: &snap, Status: &st}
		r.mu.Lock()
		r.subs[s] = struct{}{}
		r.mu.Unlock()
		s.notify()
		return nil
	})
	if err != nil {
		s.closed = true
		close(s.signal)
	}
	return s
}

// C is signalled when updates are pending; it is closed when the subscription ends.
func (s *Subscription) C() <-chan struct{} { return s.signal }

// Take returns everything pending. After a loss it first fetches a fresh snapshot from the
// runner (waiting for the engine's goroutine, never the other way round).
func (s *Subscription) Take() feed.Update {
	s.mu.Lock()
	if s.lost && !s.closed {
		s.mu.Unlock()
		s.fetchSnapshot()
		s.mu.Lock()
	}
	u := s.pending
	u.Dropped = s.dropped
	s.pending = feed.Update{}
	s.n = 0
	s.mu.Unlock()
	return u
}

// Resync throws away what is pending and asks for a fresh snapshot.
func (s *Subscription) Resync() {
	s.mu.Lock()
	if !s.closed {
		s.lost = true
		s.pending.Events = nil
		s.pending.Snapshot = nil
		s.n = 0
	}
	s.mu.Unlock()
	s.notify()
}

// Dropped returns how many events this subscription has lost.
func (s *Subscription) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
	s.close()
}

func (s *Subscription) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.signal)
	}
}

func (s *Subscription) notify() {
	defer func() { _ = recover() }() // a closed signal: nothing to tell
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// offer adds events (and a status) to the pending update. It runs on the engine's
// goroutine and never blocks: past the backlog, the pending events are dropped and counted,
// and a snapshot is owed.
func (s *Subscription) offer(evs []engine.Event, st *feed.Status) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if st != nil {
		c := *st
		s.pending.Status = &c
	}
	switch {
	case s.lost:
		// The snapshot still to come covers these.
		s.dropped += uint64(len(evs))
	case s.n+len(evs) > s.r.cfg.Backlog:
		s.dropped += uint64(s.n + len(evs))
		s.lost = true
		s.pending.Events = nil
		s.pending.Snapshot = nil
		s.n = 0
	default:
		s.pending.Events = append(s.pending.Events, evs...)
		s.n += len(evs)
	}
	s.mu.Unlock()
	s.notify()
}

// fetchSnapshot has the runner replace the pending update with a fresh snapshot.
func (s *Subscription) fetchSnapshot() {
	_ = s.r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
		snap := e.Snapshot()
		s.mu.Lock()
		if s.lost {
			s.lost = false
			s.pending.Snapshot = &snap
			s.pending.Events = nil
			s.n = 0
		}
		s.mu.Unlock()
		return nil
	})
}
