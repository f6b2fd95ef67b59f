package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
)

// The counterfactual cache runs the other eviction order over the same requests. With a cap
// of two recycling sequences, three finished conversations and then the second one's
// follow-up: MLC's order evicted the second (the newest stamp but one sits at begin()), so
// the real cache misses; the LRU order evicted the first and would have hit. Under
// --evict-order lru the two swap.
func TestCounterfactualShowsWhatTheOtherOrderWouldHit(t *testing.T) {
	for _, tc := range []struct {
		order               prefix.EvictOrder
		realHits, otherHits bool
		otherName           string
	}{
		{prefix.EvictMLC, false, true, "lru"},
		{prefix.EvictLRU, true, false, "mlc"},
	} {
		cfg := DefaultConfig()
		cfg.MaxTotalSequenceLength = 16384
		cfg.MaxNumSequence = 8
		cfg.MaxRecycling = 2
		cfg.EvictOrder = tc.order
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := time.UnixMilli(1_000_000)
		conv := func(c, n int) []int32 {
			p := make([]int32, n)
			for i := range p {
				p[i] = int32(c*10000 + i)
			}
			return p
		}
		run := func(id string, prompt []int32) {
			if err := e.PrepRecv(now, PrepRecv{ID: id, Prompt: prompt, End: -1, HasEnd: true, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			e.Step(now)
			r := e.reqs[id]
			if _, err := e.ReceiveKV(now, pages.Expand(nil, r.runs[0]), nil); err != nil {
				t.Fatal(err)
			}
			if err := e.StartGenerate(now, id, -1); err != nil {
				t.Fatal(err)
			}
			for !r.state.Ended() {
				e.Step(now)
			}
		}
		for c := range 3 {
			run(fmt.Sprint("c", c), conv(c, 300))
		}
		before, alt := e.prefix.Stats(), e.alt.c.Stats()
		run("c1-followup", conv(1, 400)) // the second conversation's next turn
		real := e.prefix.Stats().HitTokens - before.HitTokens
		other := e.alt.c.Stats().HitTokens - alt.HitTokens
		if (real > 0) != tc.realHits || (other > 0) != tc.otherHits {
			t.Errorf("%v: the follow-up matched %d tokens, the counterfactual (%s) %d; want hits %v, %v",
				tc.order, real, tc.otherName, other, tc.realHits, tc.otherHits)
		}
		cf := e.Snapshot().Counterfactual
		if cf == nil || cf.Order.String() != tc.otherName || cf.Stats.QueryTokens != e.prefix.Stats().QueryTokens {
			t.Errorf("%v: snapshot's counterfactual = %+v, want the %s order over the same %d query tokens",
				tc.order, cf, tc.otherName, e.prefix.Stats().QueryTokens)
		}
	}
}

// Off, or with the prefix cache disabled, there is no counterfactual.
func TestCounterfactualOff(t *testing.T) {
	for _, tweak := range []func(*Config){
		func(c *Config) { c.Counterfactual = false },
		func(c *Config) { c.PrefixCache = "disable" },
	} {
		cfg := DefaultConfig()
		tweak(&cfg)
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if cf := e.Snapshot().Counterfactual; cf != nil {
			t.Errorf("counterfactual %+v with %+v", cf, cfg)
		}
	}
}
