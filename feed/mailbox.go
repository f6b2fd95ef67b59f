package feed

import (
	"sync"

	"github.com/kvtop/kvtop/engine"
)

// DefaultBacklog is the backlog NewMailbox uses for a bound of zero or less.
const DefaultBacklog = 65536

// Mailbox is a viewer's mailbox: a signal channel of capacity one and the update pending
// behind it. A producer (the engine's runner, the stream client, the replay player) offers
// events, snapshots and statuses and never waits; the viewer takes everything pending as
// one update at its own pace.
//
// The pending events are bounded by the backlog. An offer that would pass it drops every
// pending event (and the pending snapshot they followed), counts them, and leaves a
// snapshot owed: until the producer resolves it with Snapshot, every event offered is
// refused and counted too, because the snapshot to come covers it. A viewer that falls
// behind thus loses data for itself only, and the loss is counted in every Take.
//
// The zero Mailbox is not usable; call NewMailbox.
type Mailbox struct {
	backlog int
	signal  chan struct{}

	mu      sync.Mutex
	pending Update
	n       int // events pending
	owed    bool
	dropped uint64
	closed  bool
	// epoch is that of the pending state; next that of the next snapshot (NewEpoch).
	epoch, next uint64
}

// NewMailbox returns an empty mailbox holding at most backlog pending events
// (DefaultBacklog when backlog is zero or less).
func NewMailbox(backlog int) *Mailbox {
	if backlog <= 0 {
		backlog = DefaultBacklog
	}
	return &Mailbox{backlog: backlog, signal: make(chan struct{}, 1)}
}

// C is signalled after anything is added, and closed by Close. A wake-up may find nothing
// new (the signal of a change already taken); signals never pile up.
func (m *Mailbox) C() <-chan struct{} { return m.signal }

// Offer appends events to the pending update and reports whether they were accepted. It
// refuses them, and counts them dropped, when a snapshot is owed or when they would pass
// the backlog (which drops what is pending and owes a snapshot); it refuses them uncounted
// once the mailbox is closed. Offering no events accepts them unless a snapshot is owed
// or the mailbox is closed.
func (m *Mailbox) Offer(evs []engine.Event) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return false
	case m.owed:
		m.dropped += uint64(len(evs))
		return false
	case len(evs) == 0:
		return true
	case m.n+len(evs) > m.backlog:
		m.dropped += uint64(m.n + len(evs))
		m.owe()
		m.notify()
		return false
	}
	m.pending.Events = append(m.pending.Events, evs...)
	m.n += len(evs)
	m.notify()
	return true
}

// Snapshot makes s the state the viewer starts over from: it replaces the pending snapshot
// and events, and resolves an owed snapshot. The events offered after it follow it.
func (m *Mailbox) Snapshot(s *engine.Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.pending.Snapshot, m.pending.Events, m.n = s, nil, 0
	m.owed = false
	m.epoch = m.next
	m.notify()
}

// NewEpoch says that the next snapshot starts a new epoch (Update.Epoch): the producer
// reconnected, and what follows may be another run of the engine. What is pending, and
// what is offered before that snapshot, stays in the epoch it belongs to.
func (m *Mailbox) NewEpoch() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
}

// SetStatus records the latest status; statuses not yet taken are replaced, not queued.
func (m *Mailbox) SetStatus(st Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.pending.Status = &st
	m.notify()
}

// Resync throws away the pending snapshot and events, uncounted (the viewer asked), and
// owes a snapshot.
func (m *Mailbox) Resync() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.owe()
	m.notify()
}

// Owed reports whether a snapshot is owed: after an overflow or a Resync, until Snapshot.
// The producer resolves it; a closed mailbox owes nothing.
func (m *Mailbox) Owed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owed && !m.closed
}

// AddDropped counts n events lost before they reached the mailbox: those a server says it
// dropped for this viewer, or those a recorded dashboard lost. They show in every Take's
// Dropped.
func (m *Mailbox) AddDropped(n uint64) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropped += n
	m.notify()
}

// Dropped returns the events lost so far.
func (m *Mailbox) Dropped() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dropped
}

// Take returns everything pending, with the events lost so far in Dropped, and empties the
// mailbox. After Close it still returns what was pending when the mailbox closed.
func (m *Mailbox) Take() Update {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.pending
	u.Dropped, u.Epoch = m.dropped, m.epoch
	m.pending, m.n = Update{}, 0
	return u
}

// Notify signals the viewer without adding anything: for what the viewer reads besides the
// update, such as the link.
func (m *Mailbox) Notify() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.notify()
}

// Close closes C and refuses everything offered after it. It may be called more than once,
// and concurrently with the producer's calls.
func (m *Mailbox) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.signal)
	}
}

// owe drops what is pending and owes a snapshot. m.mu is held.
func (m *Mailbox) owe() {
	m.pending.Snapshot, m.pending.Events, m.n = nil, nil, 0
	m.owed = true
}

// notify signals C without waiting. m.mu is held, so Close cannot close the channel in
// between: no send on a closed channel.
func (m *Mailbox) notify() {
	if m.closed {
		return
	}
	select {
	case m.signal <- struct{}{}:
	default:
	}
}
