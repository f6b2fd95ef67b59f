package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// steadyLoad keeps n requests decoding on an engine sized for n: each request has a
// 200-token prompt of its own, gets its KV in one write as soon as it is admitted, starts at
// once and finishes after 64 tokens, when a new one replaces it. Every step then does the
// same work per request whatever n is: n/64 admissions and finishes, and a decode of n
// tokens, on a cache and a prefix cache that grow with n. (The prompts share nothing: with
// a common system prompt, every admission's search for a recycling sequence to reuse walks
// all the recycling sequences below it, a cost of the prefix cache's, not of the step.)
type steadyLoad struct {
	e             *engine.Engine
	n, live, next int
	now           time.Time
	prompt        []int32
}

func newSteadyLoad(b *testing.B, n int, prefixCache bool) *steadyLoad {
	b.Helper()
	cfg := engine.DefaultConfig()
	if !prefixCache {
		cfg.PrefixCache, cfg.Counterfactual = "disable", false
	}
	cfg.MaxNumSequence = n + n/4
	cfg.PrefillChunkSize = 2 * n // the batch test admits while running+1 ≤ the chunk
	cfg.MaxTotalSequenceLength = 1024 * n
	cfg.MaxSingleSequenceLength = 4096
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	s := &steadyLoad{e: e, n: n, now: time.UnixMilli(1_700_000_000_000), prompt: make([]int32, 200)}
	for range 20 * 64 {
		s.step()
	}
	if c := e.Snapshot().Last.Counts; c.Running+c.Prepared < n*9/10 {
		b.Fatalf("steady load of %d: %d running, %d prepared after warming up", n, c.Running, c.Prepared)
	}
	return s
}

// step tops the load up to n requests, steps, and makes the calls the step's answers call
// for: the KV of each admitted request, its start_generate.
func (s *steadyLoad) step() {
	for ; s.live < s.n; s.live++ {
		for i := range s.prompt {
			s.prompt[i] = int32(s.next*200 + i)
		}
		id := fmt.Sprint("r", s.next)
		s.next++
		if err := s.e.PrepRecv(s.now, engine.PrepRecv{ID: id, Prompt: s.prompt, End: -1, HasEnd: true, MaxTokens: 64}); err != nil {
			panic(err)
		}
	}
	s.now = s.now.Add(time.Millisecond)
	rd := s.e.Step(s.now)
	for _, ev := range rd.Events {
		switch ev := ev.(type) {
		case engine.MetadataEmitted:
			if n := ev.PromptLength - 1 - ev.Matched; n > 0 {
				if _, err := s.e.WriteKV(s.now, engine.KVWrite{Metadata: ev.Encoded, Tokens: n}); err != nil {
					panic(err)
				}
			}
			if err := s.e.StartGenerate(s.now, ev.ID, -1); err != nil {
				panic(err)
			}
		case engine.RequestFinished, engine.RequestAborted:
			s.live--
		}
	}
	s.e.TakeEvents()
	s.e.TakeTokens()
}

// BenchmarkStepScale is the engine's cost a running request a step at 256 and at 4,096
// running requests (steadyLoad), the two loads stepped alternately within one benchmark, 16
// steps of the small one for each of the large, so that both see the same machine. It
// reports each one's time a request a step and their ratio; a step whose cost is linear in
// the running requests gives a ratio of 1. prefix=radix is the default configuration;
// prefix=off turns the prefix cache and the counterfactual off, leaving the engine's own
// bookkeeping (queues, KV, events, counts) and the paged cache.
func BenchmarkStepScale(b *testing.B) {
	for _, prefix := range []bool{true, false} {
		name := "prefix=radix"
		if !prefix {
			name = "prefix=off"
		}
		b.Run(name, func(b *testing.B) {
			small, large := newSteadyLoad(b, 256, prefix), newSteadyLoad(b, 4096, prefix)
			var ts, tl time.Duration
			for b.Loop() {
				t0 := time.Now()
				for range 16 {
					small.step()
				}
				t1 := time.Now()
				large.step()
				ts += t1.Sub(t0)
				tl += time.Since(t1)
			}
			perSmall := float64(ts.Nanoseconds()) / float64(b.N*16*small.n)
			perLarge := float64(tl.Nanoseconds()) / float64(b.N*large.n)
			b.ReportMetric(perSmall, "ns/request-step@256")
			b.ReportMetric(perLarge, "ns/request-step@4096")
			b.ReportMetric(perLarge/perSmall, "4096/256")
			b.ReportMetric(0, "ns/op")
		})
	}
}
