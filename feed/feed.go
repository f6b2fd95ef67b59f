package feed

import (
	"errors"
	"fmt"

	"github.com/kvtop/kvtop/engine"
)

// Update is what a viewer receives: when Snapshot is set, its state starts over from it;
// then Events apply in order. Dropped counts the events this viewer has lost so far because
// it fell behind (each loss is followed by a snapshot).
type Update struct {
	Snapshot *engine.Snapshot
	Events   []engine.Event
	Status   *Status // set when the runner's status changed
	Dropped  uint64
	// Epoch counts the times the source started over on a new connection (0 for the
	// first): the snapshot that starts an epoch may belong to another run of the engine
	// (a restarted server), whose steps start again. It is the epoch of the state the
	// update's snapshot and events belong to.
	Epoch uint64
}

// Status is the state of whatever runs the engine: the runner in-process, or the server a
// dashboard is attached to.
type Status struct {
	Paused bool `json:"paused"`
	// Rate is the measured steps per second; Target the configured one (0: as fast as
	// possible).
	Rate   float64 `json:"rate"`
	Target float64 `json:"target"`
	// Controllable says whether this viewer may pause, resume and step the engine.
	Controllable bool `json:"controllable"`
}

// ControlOp is something a viewer asks of whatever runs the engine.
type ControlOp string

// The controls.
const (
	ControlPause    ControlOp = "pause"
	ControlResume   ControlOp = "resume"
	ControlStep     ControlOp = "step"     // run N steps, paused or not
	ControlSnapshot ControlOp = "snapshot" // resync: send a fresh snapshot
	// ControlSpeed and ControlSeek are for a recording played back: N is the speed in
	// percent of real time, or the step to go to. A live engine refuses them.
	ControlSpeed ControlOp = "speed"
	ControlSeek  ControlOp = "seek"
)

// Control is a viewer's request.
type Control struct {
	Op ControlOp `json:"op"`
	N  int       `json:"n,omitempty"`
}

// ErrReadOnly is returned for a control that this viewer may not use.
var ErrReadOnly = errors.New("feed: read-only: this viewer may not control the engine")

// Validate checks a control's fields.
func (c Control) Validate() error {
	switch c.Op {
	case ControlPause, ControlResume, ControlSnapshot:
		return nil
	case ControlStep:
		if c.N < 1 || c.N > 1_000_000 {
			return fmt.Errorf("feed: step %d: n must be in [1, 1000000]", c.N)
		}
		return nil
	case ControlSpeed:
		if c.N < 1 || c.N > 100_000 {
			return fmt.Errorf("feed: speed %d%%: must be in [1, 100000]", c.N)
		}
		return nil
	case ControlSeek:
		if c.N < 0 {
			return fmt.Errorf("feed: seek to step %d: must not be negative", c.N)
		}
		return nil
	}
	return fmt.Errorf("feed: unknown control %q", c.Op)
}

// Link says where a viewer's updates come from and how that connection stands. The
// in-process subscription is always up; an attached client reports its connection.
type Link struct {
	Name  string    `json:"name"` // "embedded", "host:port", "replay FILE"
	State LinkState `json:"state"`
	// Err is the last connection error, while connecting or reconnecting.
	Err string `json:"err,omitempty"`
	// Attempts counts reconnection attempts since the link was last up.
	Attempts int `json:"attempts,omitempty"`
	// LagMs is how far behind the engine the viewer is, in milliseconds, when known.
	LagMs int64 `json:"lag_ms,omitempty"`
}

// LinkState is the state of a viewer's connection.
type LinkState string

// The link states.
const (
	LinkUp           LinkState = "connected"
	LinkConnecting   LinkState = "connecting"
	LinkReconnecting LinkState = "reconnecting"
	LinkClosed       LinkState = "closed"
)
