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
// overflow is the next shared one (Config.SnapshotInterval), which Take waits for.
type Subscription struct {
	r  *Runner
	mb *feed.Mailbox
}

// Subscribe returns a new subscription whose first update is a snapshot of the engine,
// shared with the others that need one at the time.
func (r *Runner) Subscribe() *Subscription {
	s := &Subscription{r: r, mb: feed.NewMailbox(r.cfg.Backlog)}
	if !r.awaitSnapshot(s, true) {
		s.mb.Close()
	}
	return s
}

// Backlog returns how many events a subscription may have pending before it loses them
// (Config.Backlog).
func (r *Runner) Backlog() int { return r.cfg.Backlog }

// C is signalled when updates are pending; it is closed when the subscription ends.
func (s *Subscription) C() <-chan struct{} { return s.mb.C() }

// Take returns everything pending. When a snapshot is owed it first waits for the next
// shared one (the viewer waits for the engine's goroutine, never the other way round).
func (s *Subscription) Take() feed.Update {
	if s.mb.Owed() {
		s.r.awaitSnapshot(s, false)
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

// snapRound is the subscriptions that wait for the next shared snapshot: new ones, to be
// registered with it, and ones that owe one. done is closed once it is delivered (ok) or
// cannot be (the runner stopped).
type snapRound struct {
	joining, owed []*Subscription
	done          chan struct{}
	ok            bool
}

// awaitSnapshot puts s on the next round and waits for its snapshot; false means the
// runner stopped first.
func (r *Runner) awaitSnapshot(s *Subscription, joining bool) bool {
	r.snapMu.Lock()
	if r.round == nil {
		r.round = &snapRound{done: make(chan struct{})}
		select {
		case r.snapWake <- struct{}{}:
		default:
		}
	}
	rd := r.round
	if joining {
		rd.joining = append(rd.joining, s)
	} else {
		rd.owed = append(rd.owed, s)
	}
	r.snapMu.Unlock()
	select {
	case <-rd.done:
		return rd.ok
	case <-r.done:
		return false
	}
}

// snapshots delivers the rounds until ctx ends. A round of resyncs (subscriptions that owe
// a snapshot) waits until Config.SnapshotInterval has passed since the last, so that viewers
// asking for snapshots cost the engine one an interval however many they are. A round with
// a new subscription goes at once: a subscriber must not miss the events of the calls made
// just after it subscribed (connection attempts are the server's to bound), and it builds
// nothing when the engine has not changed since the last snapshot.
func (r *Runner) snapshots(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.snapWake:
		}
		r.snapMu.Lock()
		joining := r.round != nil && len(r.round.joining) > 0
		r.snapMu.Unlock()
		if wait := r.cfg.SnapshotInterval - r.cfg.Clock().Sub(last); wait > 0 && !joining {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		r.snapMu.Lock()
		rd := r.round
		r.round = nil
		r.snapMu.Unlock()
		if rd == nil {
			continue
		}
		err := r.Do(ctx, func(e *engine.Engine, _ time.Time) error {
			r.deliver(e, rd)
			return nil
		})
		last = r.cfg.Clock()
		rd.ok = err == nil
		close(rd.done)
	}
}

// deliver gives a round its snapshot, on the engine's goroutine between calls, so that the
// first events a new subscription is offered are the first after it. All share one
// snapshot, built only if the engine has published events since the last one: consumers
// must treat it as read-only.
func (r *Runner) deliver(e *engine.Engine, rd *snapRound) {
	if r.cached == nil || r.cachedAt != r.version {
		snap := e.Snapshot()
		r.cached, r.cachedAt = &snap, r.version
	}
	for _, s := range rd.owed {
		if s.mb.Owed() { // not paid meanwhile
			s.mb.Snapshot(r.cached)
		}
	}
	if len(rd.joining) == 0 {
		return
	}
	st := r.Status()
	r.mu.Lock()
	for _, s := range rd.joining {
		r.subs[s] = struct{}{}
	}
	r.mu.Unlock()
	for _, s := range rd.joining {
		s.mb.Snapshot(r.cached)
		s.mb.SetStatus(st)
	}
}
