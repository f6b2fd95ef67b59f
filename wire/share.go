package wire

import (
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/wire/protocol"
)

// What keeps many viewers from costing the engine: the runner builds one snapshot for every
// subscription that needs one at the time, none while the engine has not changed, and for
// resyncs at most one an interval (runner.Config.SnapshotInterval); the server encodes each
// once for every stream client that sends it (encodedSnapshot), spaces each client's
// resyncs (Limits.ResyncInterval) and caps connection attempts, which are what new
// subscriptions cost (Limits.MaxConnectsPerSec). The encoding happens on the clients'
// goroutines, never the engine's.

// encodedSnapshot is a snapshot and its encoding, made by the first client to send it.
type encodedSnapshot struct {
	snap *engine.Snapshot
	once sync.Once
	enc  *protocol.SharedSnapshot
	err  error
}

// encoded returns the shared encoding of a snapshot the runner handed to subscribers. The
// runner hands the same snapshot to every subscription of a round, so one entry serves
// them all.
func (s *Server) encoded(snap *engine.Snapshot) (*protocol.SharedSnapshot, error) {
	s.snapMu.Lock()
	e := s.lastSnap
	if e == nil || e.snap != snap {
		e = &encodedSnapshot{snap: snap}
		s.lastSnap = e
	}
	s.snapMu.Unlock()
	e.once.Do(func() { e.enc, e.err = protocol.EncodeSnapshot(snap) })
	return e.enc, e.err
}

// limiter is a token bucket: rate tokens a second, as many in a burst.
type limiter struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

func newLimiter(rate float64, now func() time.Time) *limiter {
	return &limiter{rate: rate, tokens: rate, last: now(), now: now}
}

// allow takes a token if there is one.
func (l *limiter) allow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.tokens = min(l.rate, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}
