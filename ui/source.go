package ui

import "github.com/kvtop/kvtop/feed"

// Source is where the dashboard's data comes from: an in-process engine subscription, a
// websocket client attached to `kvtop serve`, or a recording played back. The dashboard
// cannot tell them apart.
type Source interface {
	// C is signalled when updates are pending, and closed when the source ends for good.
	C() <-chan struct{}
	// Take returns everything pending as one update: a snapshot to start over from (when
	// set), then events in order.
	Take() feed.Update
	// Control asks whatever runs the engine to pause, resume, step or resend a snapshot.
	// It returns feed.ErrReadOnly when this source may not control the engine.
	Control(feed.Control) error
	// Link says where the updates come from and how the connection stands.
	Link() feed.Link
	// Close ends the source.
	Close()
}
