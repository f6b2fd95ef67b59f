package runner

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/internal/stepbench"
)

// steadyRunner is a runner whose engine keeps n requests decoding, driven by hand: before
// each step it tops the load up with prep_recv calls (200-token prompts of their own,
// finishing after 64 tokens), after it it writes each admitted request's KV and starts it,
// and publishes everything as Run would.
type steadyRunner struct {
	r             *Runner
	e             *engine.Engine
	n, live, next int
	now           time.Time
}

func newSteadyRunner(b *testing.B, n, subs int) *steadyRunner {
	b.Helper()
	e, err := engine.New(stepbench.Config())
	if err != nil {
		b.Fatal(err)
	}
	r := New(e, Config{Clock: time.Now, Backlog: 4096})
	for range subs {
		s := &Subscription{r: r, mb: feed.NewMailbox(r.cfg.Backlog)}
		r.subs[s] = struct{}{}
	}
	s := &steadyRunner{r: r, e: e, n: n, now: time.UnixMilli(0)}
	for range 500 {
		s.step()
	}
	if c := e.Snapshot().Last.Counts; c.Running+c.Prepared < n*9/10 {
		b.Fatalf("%d running, %d prepared, want about %d", c.Running, c.Prepared, n)
	}
	return s
}

func (s *steadyRunner) step() {
	p := make([]int32, 200)
	for ; s.live < s.n; s.live++ {
		for i := range p {
			p[i] = int32(s.next*1000 + i)
		}
		if err := s.e.PrepRecv(s.now, engine.PrepRecv{ID: fmt.Sprint("r", s.next), Prompt: p, End: -1, HasEnd: true, MaxTokens: 64}); err != nil {
			panic(err)
		}
		s.next++
	}
	s.now = s.now.Add(time.Millisecond)
	rd := s.e.Step(s.now)
	s.r.publish(rd.Events, rd.Tokens)
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
	s.r.publish(s.e.TakeEvents(), s.e.TakeTokens())
}

// BenchmarkSteps is one engine step with 256 requests decoding (steadyRunner), published to
// no subscription and to 8 that are never read, the two runners stepped in turns of 16
// steps within one benchmark so that both see the same machine. It reports each one's time
// a step and their ratio.
func BenchmarkSteps(b *testing.B) {
	none, subs := newSteadyRunner(b, 256, 0), newSteadyRunner(b, 256, 8)
	var tNone, tSubs time.Duration
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		for range 16 {
			none.step()
		}
		t1 := time.Now()
		for range 16 {
			subs.step()
		}
		tNone += t1.Sub(t0)
		tSubs += time.Since(t1)
	}
	steps := float64(16 * b.N)
	b.ReportMetric(float64(tNone.Microseconds())/steps, "µs/step-none")
	b.ReportMetric(float64(tSubs.Microseconds())/steps, "µs/step-8subs")
	b.ReportMetric(float64(tSubs)/float64(tNone), "8subs/none")
	b.ReportMetric(0, "ns/op")
}
