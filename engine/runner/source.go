package runner

import (
	"github.com/kvtop/kvtop/feed"
)

// Local is an in-process viewer's source: a subscription plus control of the runner. It
// satisfies the dashboard's Source interface.
type Local struct {
	*Subscription
	// ReadOnly refuses pause, resume and step.
	ReadOnly bool
}

// Local returns a new in-process source on the runner.
func (r *Runner) Local() *Local { return &Local{Subscription: r.Subscribe()} }

// Take returns what is pending; a read-only source says so in the status it passes on.
func (l *Local) Take() feed.Update {
	u := l.Subscription.Take()
	if u.Status != nil && l.ReadOnly {
		st := *u.Status
		st.Controllable = false
		u.Status = &st
	}
	return u
}

// Control pauses, resumes or steps the engine, or resyncs this subscription.
func (l *Local) Control(c feed.Control) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Op == feed.ControlSnapshot {
		l.Resync()
		return nil
	}
	if l.ReadOnly {
		return feed.ErrReadOnly
	}
	return l.r.Control(c)
}

// Link reports the embedded engine, always up while the runner runs.
func (l *Local) Link() feed.Link {
	select {
	case <-l.r.Done():
		return feed.Link{Name: "embedded", State: feed.LinkClosed}
	default:
		return feed.Link{Name: "embedded", State: feed.LinkUp}
	}
}
