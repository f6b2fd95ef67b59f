// Package stepbench is the engine step that exporters measure their cost to the engine on
// (KV events, request traces): 256 requests decoding and one prepare-receive request a step,
// which gets its KV, starts and finishes after 4 tokens (the shape of engine/runner's
// BenchmarkSteps), with an observer called on every call's and step's events as the runner
// calls its Observers.
package stepbench

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
)

// Run runs b's loop of steps, each with a prepare-receive request's call before it and the
// KV and start_generate calls it makes, passing the events of every call and step to observe
// (none when nil). One op is a step.
func Run(b *testing.B, observe func(e *engine.Engine, evs []engine.Event)) {
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 1 << 20
	cfg.MaxSingleSequenceLength = 4096
	cfg.MaxNumSequence = 1024
	cfg.KeepFinished = 64
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if observe == nil {
		observe = func(*engine.Engine, []engine.Event) {}
	}
	now := time.UnixMilli(0)
	next := 0
	submit := func(maxTokens int) {
		pr := make([]int32, 200)
		for i := range pr {
			pr[i] = int32(i)
			if i >= 100 {
				pr[i] = int32(next*1000 + i)
			}
		}
		if err := e.PrepRecv(now, engine.PrepRecv{ID: fmt.Sprint("r", next), Prompt: pr, End: -1, HasEnd: true, MaxTokens: maxTokens}); err != nil {
			b.Fatal(err)
		}
		next++
		observe(e, e.TakeEvents())
	}
	step := func() {
		now = now.Add(time.Millisecond)
		rd := e.Step(now)
		observe(e, rd.Events)
		for _, ev := range rd.Events {
			if m, ok := ev.(engine.MetadataEmitted); ok {
				if _, err := e.ReceiveKV(now, pages.Expand(nil, m.Runs[0]), nil); err != nil {
					b.Fatal(err)
				}
				if err := e.StartGenerate(now, m.ID, -1); err != nil {
					b.Fatal(err)
				}
			}
		}
		observe(e, e.TakeEvents())
	}
	for range 256 {
		submit(1 << 30)
	}
	for range 8 {
		step()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		submit(4)
		step()
	}
	b.StopTimer()
}
