// Package lockstep plays a built-in scenario on an engine in simulated time, for tests of
// what is derived from the engine's events: it hands over the events of every call and of
// every step as soon as each is made, with the engine as it is right after it.
//
// sim.Lockstep hands a step's events over with the calls made before it, after the calls
// that follow it have changed the engine; an exporter that reads the engine beside the
// events (the prefix cache's tokens) needs each call's events on their own.
package lockstep

import (
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
)

// Start is the engine time the runs start at.
var Start = time.UnixMilli(1_700_000_000_000)

// Run plays scenario name (sim.Lookup; trace replays the repository's excerpt) with seed for steps steps of stepTime, the engine
// configured by the scenario and then by configure (when not nil), and calls f after every
// call and every step with the events it produced. It returns the engine.
func Run(name string, seed uint64, steps int, stepTime time.Duration, configure func(*engine.Config), f func(e *engine.Engine, evs []engine.Event)) (*engine.Engine, error) {
	sc, err := sim.Lookup(name)
	if err != nil {
		return nil, err
	}
	cfg := engine.DefaultConfig()
	cfg.Seed = seed
	sc.Configure(&cfg)
	if configure != nil {
		configure(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	w, err := sc.New(sim.Options{Seed: seed, Speed: 1, TracePath: smallTrace()})
	if err != nil {
		return nil, err
	}
	d := sim.NewDriver(w, sc.Driver)
	c := &calls{e: e, f: f}
	var vnow time.Duration
	for range steps {
		vnow += stepTime
		c.now = Start.Add(vnow)
		d.Tick(vnow, c)
		rd := e.Step(c.now)
		f(e, rd.Events)
		d.Observe(rd.Events, rd.Tokens, c)
	}
	return e, nil
}

// smallTrace is the repository's excerpt of the Mooncake trace, which the trace scenario
// replays.
func smallTrace() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "sim", "testdata", "small_trace.jsonl")
}

// calls makes the driver's calls on the engine and hands each call's events over.
type calls struct {
	e   *engine.Engine
	now time.Time
	f   func(*engine.Engine, []engine.Event)
}

func (c *calls) done(err error) error {
	if evs := c.e.TakeEvents(); len(evs) > 0 {
		c.f(c.e, evs)
	}
	return err
}

func (c *calls) PrepRecv(pr engine.PrepRecv) error { return c.done(c.e.PrepRecv(c.now, pr)) }

func (c *calls) StartGenerate(id string, begin int) error {
	return c.done(c.e.StartGenerate(c.now, id, begin))
}

func (c *calls) Abort(id string) error { return c.done(c.e.Abort(c.now, id)) }

func (c *calls) WriteKV(id, metadata string, offset, n int) error {
	cfg := c.e.Config()
	payload := make([]byte, n*cfg.Arena.TokenBytes()*cfg.Models)
	if _, err := c.e.WriteKV(c.now, engine.KVWrite{Metadata: metadata, Offset: offset, Tokens: n, Payload: payload}); err != nil {
		return c.done(fmt.Errorf("lockstep: kv for %s: %w", id, err))
	}
	return c.done(nil)
}
