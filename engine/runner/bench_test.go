package runner

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/feed"
)

// BenchmarkSteps is one engine step with 256 running requests and a steady stream of
// prepare-receive requests (one a step, each getting its KV, starting and finishing after
// 4 tokens), published to 0 or 8 subscriptions that are never read. The runner's loop is
// driven by hand so that only the step and its publication are measured.
func BenchmarkSteps(b *testing.B) {
	for _, subs := range []int{0, 8} {
		b.Run(fmt.Sprintf("subscribers=%d", subs), func(b *testing.B) {
			cfg := engine.DefaultConfig()
			cfg.MaxTotalSequenceLength = 1 << 20
			cfg.MaxSingleSequenceLength = 4096
			cfg.MaxNumSequence = 1024
			cfg.KeepFinished = 64
			e, err := engine.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			r := New(e, Config{Clock: time.Now, Backlog: 4096})
			for range subs {
				s := &Subscription{r: r, mb: feed.NewMailbox(r.cfg.Backlog)}
				r.subs[s] = struct{}{}
			}
			now := time.UnixMilli(0)
			next := 0
			submit := func(maxTokens int) {
				p := make([]int32, 200)
				for i := range p {
					p[i] = int32(i)
					if i >= 100 {
						p[i] = int32(next*1000 + i)
					}
				}
				if err := e.PrepRecv(now, engine.PrepRecv{ID: fmt.Sprint("r", next), Prompt: p, End: -1, HasEnd: true, MaxTokens: maxTokens}); err != nil {
					b.Fatal(err)
				}
				next++
			}
			step := func() {
				now = now.Add(time.Millisecond)
				rd := e.Step(now)
				r.publish(rd.Events, rd.Tokens)
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
				r.publish(e.TakeEvents(), e.TakeTokens())
			}
			// 256 long-running requests.
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
			if c := e.Snapshot().Last.Counts; c.Running < 256 {
				b.Fatalf("%d running, want at least 256", c.Running)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}
