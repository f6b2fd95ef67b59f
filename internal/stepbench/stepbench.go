// Package stepbench is the engine step that exporters measure their cost to the engine on
// (KV events, request traces): an engine kept at Live requests decoding, each a 200-token
// prompt whose first half it shares with the others (a prefix match, a fork), whose KV is
// written by its metadata as a prefill instance writes it, and which finishes after Tokens
// tokens, a new request arriving for each that finishes (one every other step in the steady
// state: a step that admits a request decodes nothing).
// An observer sees every call's and step's events, as engine/runner calls its Observers.
package stepbench

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// The steady state: Live requests alive, each generating Tokens tokens.
const (
	Live   = 256
	Tokens = 256
)

// Observe is what an exporter does with the events of one engine call or step.
type Observe func(e *engine.Engine, evs []engine.Event)

// Steady is an engine in the steady state, stepped by hand.
type Steady struct {
	e          *engine.Engine
	observe    Observe
	now        time.Time
	live, next int
	prompt     []int32
}

// Config is the steady state's engine configuration: room for a thousand requests of a few
// hundred tokens, without their pages ever running out. The engine and wire benchmarks
// that keep an engine busy use it too.
func Config() engine.Config {
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 1 << 20
	cfg.MaxSingleSequenceLength = 4096
	cfg.MaxNumSequence = 1024
	cfg.KeepFinished = 64
	return cfg
}

// New returns an engine in the steady state, its events passed to observe (none when nil).
// The first requests' lengths are spread, so that as many finish each step from the start.
func New(tb testing.TB, observe Observe) *Steady {
	tb.Helper()
	e, err := engine.New(Config())
	if err != nil {
		tb.Fatal(err)
	}
	if observe == nil {
		observe = func(*engine.Engine, []engine.Event) {}
	}
	s := &Steady{e: e, observe: observe, now: time.UnixMilli(0), prompt: make([]int32, 200)}
	for i := range Live {
		s.submit(1 + i*Tokens/Live)
	}
	for range 2 * Tokens {
		s.Step()
	}
	if c := e.Snapshot().Last.Counts; c.Running+c.Prepared < Live*9/10 {
		tb.Fatalf("stepbench: %d running, %d prepared, want about %d", c.Running, c.Prepared, Live)
	}
	return s
}

// Engine returns the engine.
func (s *Steady) Engine() *engine.Engine { return s.e }

// submit makes a prep_recv call for a new request of maxTokens tokens.
func (s *Steady) submit(maxTokens int) {
	for i := range s.prompt {
		s.prompt[i] = int32(i)
		if i >= len(s.prompt)/2 {
			s.prompt[i] = int32(s.next*1000 + i)
		}
	}
	if err := s.e.PrepRecv(s.now, engine.PrepRecv{ID: fmt.Sprint("r", s.next), Prompt: s.prompt, End: -1, HasEnd: true, MaxTokens: maxTokens}); err != nil {
		panic(fmt.Sprintf("stepbench: prep_recv: %v", err))
	}
	s.next++
	s.live++
	s.observe(s.e, s.e.TakeEvents())
}

// Step tops the requests up to Live, steps the engine, and writes the KV of the requests
// it admitted and starts them, each call's events and the step's observed.
func (s *Steady) Step() {
	for s.live < Live {
		s.submit(Tokens)
	}
	s.now = s.now.Add(time.Millisecond)
	rd := s.e.Step(s.now)
	s.observe(s.e, rd.Events)
	for _, ev := range rd.Events {
		switch ev := ev.(type) {
		case engine.MetadataEmitted:
			if n := ev.PromptLength - 1 - ev.Matched; n > 0 {
				if _, err := s.e.WriteKV(s.now, engine.KVWrite{Metadata: ev.Encoded, Tokens: n}); err != nil {
					panic(fmt.Sprintf("stepbench: kv write for %s: %v", ev.ID, err))
				}
				s.observe(s.e, s.e.TakeEvents())
			}
			if err := s.e.StartGenerate(s.now, ev.ID, -1); err != nil {
				panic(fmt.Sprintf("stepbench: start_generate %s: %v", ev.ID, err))
			}
			s.observe(s.e, s.e.TakeEvents())
		case engine.RequestFinished, engine.RequestAborted:
			s.live--
		}
	}
}

// Run runs b's loop, one op a step of an engine in the steady state (New).
func Run(b *testing.B, observe Observe) {
	s := New(b, observe)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s.Step()
	}
	b.StopTimer()
}
