package runner

import (
	"context"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Subscription is a viewer's mailbox on the runner (a feed.Mailbox of Config.Backlog
// events). The runner offers every step's events and never waits; Take returns everything
// pending as one update, so a viewer's cost follows its own pace. A snapshot owed after an
// overflow is taken on the engine's goroutine when the viewer next takes.
type Subscription struct {
	r  *Runner
	mb *feed.Mailbox
}

// Subscribe returns a new subscription whose first update is a snapshot of the engine.
func (r *Runner) Subscribe() *Subscription {
	s := &Subscription{r: r, mb: feed.NewMailbox(r.cfg.Backlog)}
	// The snapshot and the registration happen on the engine's goroutine, so that the
	// first event offered is the first after the snapshot.
	err := r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
		snap := e.Snapshot()
		s.mb.Snapshot(&snap)
		s.mb.SetStatus(r.Status())
		r.mu.Lock()
		r.subs[s] = struct{}{}
		r.mu.Unlock()
		return nil
	})
	if err != nil {
		s.mb.Close()
	}
	return s
}

// C is signalled when updates are pending; it is closed when the subscription ends.
func (s *Subscription) C() <-chan struct{} { return s.mb.C() }

// Take returns everything pending. When a snapshot is owed it first has the runner take
// one (waiting for the engine's goroutine, never the other way round).
func (s *Subscription) Take() feed.Update {
	if s.mb.Owed() {
		_ = s.r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
			if s.mb.Owed() { // not paid meanwhile by another Take
				snap := e.Snapshot()
				s.mb.Snapshot(&snap)
			}
			return nil
		})
	}
	return s.mb.Take()
}

// Resync throws away what is pending and asks for a fresh snapshot.
func (s *Subscription) Resync() { s.mb.Resync() }

// Dropped returns how many events this subscription has lost.
func (s *Subscription) Dropped() uint64 { return s.mb.Dropped() }

// Close ends the subscription.
func (s *Subscription) Close() {
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
	s.mb.Close()
}
