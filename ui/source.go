package ui

import "github.com/kvtop/kvtop/engine"

// Source is where the dashboard's data comes from: an in-process engine subscription, a
// websocket client attached to `kvtop serve`, or a recording played back. The dashboard
// cannot tell them apart.
type Source interface {
	// C is signalled when updates are pending, and closed when the source ends for good.
	C() <-chan struct{}
	// Take returns everything pending as one update: a snapshot to start over from (when
	// set), then events in order.
	Take() engine.Update
	// Control asks whatever runs the engine to pause, resume, step or resend a snapshot.
	// It returns engine.ErrReadOnly when this source may not control the engine.
	Control(engine.Control) error
	// Link says where the updates come from and how the connection stands.
	Link() engine.Link
	// Close ends the source.
	Close()
}
