package sim

import (
	"fmt"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// engineCalls makes the router's calls directly on an engine, at a given engine time. It
// must be used on the engine's goroutine.
type engineCalls struct {
	e   *engine.Engine
	now time.Time
	buf []byte
}

func (c *engineCalls) PrepRecv(pr engine.PrepRecv) error { return c.e.PrepRecv(c.now, pr) }

func (c *engineCalls) StartGenerate(id string, begin int) error {
	return c.e.StartGenerate(c.now, id, begin)
}

func (c *engineCalls) Abort(id string) error { return c.e.Abort(c.now, id) }

func (c *engineCalls) WriteKV(id, metadata string, offset, n int) error {
	cfg := c.e.Config()
	size := n * cfg.Arena.TokenBytes() * cfg.Models
	if cap(c.buf) < size {
		c.buf = make([]byte, size)
	}
	payload := c.buf[:size]
	for i := range payload {
		payload[i] = byte(i)
	}
	// The engine finds the request by its metadata and the slots in its own reservation:
	// nothing here decodes the metadata or writes the slots out.
	if _, err := c.e.WriteKV(c.now, engine.KVWrite{Metadata: metadata, Offset: offset, Tokens: n, Payload: payload}); err != nil {
		return fmt.Errorf("sim: kv for %s: %w", id, err)
	}
	return nil
}

// Hook runs a driver in step with a runner's engine: before each step it makes the calls
// that are due, after it it reads the answers. The driver's clock advances with the steps,
// at most MaxTick a step, so a paused engine pauses the workload too.
type Hook struct {
	D       *Driver
	MaxTick time.Duration
	calls   engineCalls
	vnow    time.Duration
	last    time.Time
}

// NewHook returns a hook for the runner.
func NewHook(d *Driver) *Hook { return &Hook{D: d, MaxTick: 250 * time.Millisecond} }

// BeforeStep advances the simulated clock and makes the calls that are due.
func (h *Hook) BeforeStep(e *engine.Engine, now time.Time) {
	if !h.last.IsZero() {
		h.vnow += min(max(now.Sub(h.last), 0), h.MaxTick)
	}
	h.last = now
	h.calls.e, h.calls.now = e, now
	h.D.Tick(h.vnow, &h.calls)
}

// AfterStep feeds the driver the step's answers.
func (h *Hook) AfterStep(e *engine.Engine, rd engine.Ready) {
	h.calls.e, h.calls.now = e, time.UnixMilli(rd.Now)
	h.D.Observe(rd.Events, rd.Tokens, &h.calls)
}

// Lockstep runs a driver against an engine in simulated time: each step advances the clock
// by StepTime, the driver makes its calls, the engine steps, and the driver reads the
// answers. It is deterministic.
type Lockstep struct {
	E        *engine.Engine
	D        *Driver
	Start    time.Time
	StepTime time.Duration
	// OnReady, when set, sees every step's output (and the events of the calls after it,
	// which come with the next step's).
	OnReady func(rd engine.Ready)
	// BeforeStep, when set, runs after the driver's calls and before each step.
	BeforeStep func()
	calls      engineCalls
	vnow       time.Duration
}

// Run takes n steps.
func (l *Lockstep) Run(n int) {
	if l.StepTime == 0 {
		l.StepTime = 20 * time.Millisecond
	}
	if l.Start.IsZero() {
		l.Start = time.UnixMilli(1_700_000_000_000)
	}
	for range n {
		l.vnow += l.StepTime
		now := l.Start.Add(l.vnow)
		l.calls.e, l.calls.now = l.E, now
		l.D.Tick(l.vnow, &l.calls)
		if l.BeforeStep != nil {
			l.BeforeStep()
		}
		rd := l.E.Step(now)
		l.D.Observe(rd.Events, rd.Tokens, &l.calls)
		if l.OnReady != nil {
			l.OnReady(rd)
		}
	}
}

// Now returns the simulated time since the start.
func (l *Lockstep) Now() time.Duration { return l.vnow }
