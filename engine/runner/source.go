package runner

import "github.com/kvtop/kvtop/engine"

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
func (l *Local) Take() engine.Update {
	u := l.Subscription.Take()
	if u.Status != nil && l.ReadOnly {
		st := *u.Status
		st.Controllable = false
		u.Status = &st
	}
	return u
}

// Control pauses, resumes or steps the engine, or resyncs this subscription.
func (l *Local) Control(c engine.Control) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Op == engine.ControlSnapshot {
		l.Resync()
		return nil
	}
	if l.ReadOnly {
		return engine.ErrReadOnly
	}
	return l.r.Control(c)
}

// Link reports the embedded engine, always up while the runner runs.
func (l *Local) Link() engine.Link {
	select {
	case <-l.r.Done():
		return engine.Link{Name: "embedded", State: engine.LinkClosed}
	default:
		return engine.Link{Name: "embedded", State: engine.LinkUp}
	}
}
