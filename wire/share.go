package wire

import (
	"sync"
	"time"
)

// What keeps many viewers from costing the engine: the engine's goroutine offers its events
// to one subscription, the hub's (hub.go), however many clients watch; the hub encodes each
// event once an encoding and each snapshot once, for every client that sends it, and builds
// the snapshots clients need from its own view of the engine, at most one an interval; each
// client's resyncs are spaced (Limits.ResyncInterval) and connection attempts capped
// (Limits.MaxConnectsPerSec).

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
