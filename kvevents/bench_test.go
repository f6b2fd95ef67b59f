package kvevents

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
)

// BenchmarkEngineSteps is the engine's step with 256 requests decoding and one
// prepare-receive request a step (runner's BenchmarkSteps), with KV events off and on (a
// publisher on loopback, no subscriber): the cost the publisher puts on the engine's
// goroutine.
func BenchmarkEngineSteps(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("kv-events=%v", on), func(b *testing.B) {
			cfg := engine.DefaultConfig()
			cfg.MaxTotalSequenceLength = 1 << 20
			cfg.MaxSingleSequenceLength = 4096
			cfg.MaxNumSequence = 1024
			cfg.KeepFinished = 64
			e, err := engine.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			var p *Publisher
			if on {
				if p, err = Start(Config{Endpoint: "tcp://127.0.0.1:0"}); err != nil {
					b.Fatal(err)
				}
				defer p.Close()
			}
			observe := func(evs []engine.Event) {
				if p != nil {
					p.Observe(e, evs)
				}
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
				observe(e.TakeEvents())
			}
			step := func() {
				now = now.Add(time.Millisecond)
				rd := e.Step(now)
				observe(rd.Events)
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
				observe(e.TakeEvents())
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
			if p != nil && p.Stats().Dropped > 0 {
				b.Logf("%d batches dropped", p.Stats().Dropped)
			}
		})
	}
}
