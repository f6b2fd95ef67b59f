package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// Options are what a scenario takes from the command line.
type Options struct {
	Seed      uint64
	TracePath string  // trace: the Mooncake-format JSONL file
	Speed     float64 // trace: time scale (2 replays twice as fast)
}

// Scenario is a named workload with the engine settings and router behaviour it needs.
type Scenario struct {
	Name    string
	Summary string
	// Configure adjusts the engine configuration (the command line's explicit flags are
	// applied after it, so a user can still override).
	Configure func(*engine.Config)
	Driver    DriverConfig
	New       func(Options) (Workload, error)
}

// Scenarios returns the built-in scenarios, the default (chat) first.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name:    "chat",
			Summary: "multi-turn conversations over a handful of shared system prompts: prefix hits, forks, recycling and reuse",
			Configure: func(c *engine.Config) {
				c.MaxRecycling = 16
			},
			Driver: DriverConfig{TransferRate: 20_000, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				return NewChat(ChatParams{
					Systems: 4, SystemLen: [2]int{200, 700}, FirstUser: [2]int{20, 250}, FollowUser: [2]int{10, 120},
					MaxTokens: [2]int{16, 120}, Turns: [2]int{1, 6}, NewConvEvery: 1500 * time.Millisecond,
					Think: [2]time.Duration{500 * time.Millisecond, 3 * time.Second}, MaxContext: 4000,
				}, o.Seed), nil
			},
		},
		{
			Name:    "watermark",
			Summary: "a cache just too small: requests pile up behind the 400-page prepare-receive watermark",
			Configure: func(c *engine.Config) {
				c.MaxTotalSequenceLength = 8192
				// Nothing is kept for reuse, so what holds requests back is the watermark
				// alone (with recycling, the first finished request stalls the cache for
				// good: see recycle-stall).
				c.MaxRecycling = 0
			},
			Driver: DriverConfig{TransferRate: 20_000, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				return NewStream(StreamParams{Every: 400 * time.Millisecond, Prompt: [2]int{700, 1500}, MaxTokens: [2]int{60, 200}}, o.Seed), nil
			},
		},
		{
			Name:    "recycle-stall",
			Summary: "unbounded recycling fills the cache until the watermark stops admission for good, with recyclable pages idle",
			Configure: func(c *engine.Config) {
				c.MaxTotalSequenceLength = 16384
				c.MaxRecycling = -1
			},
			Driver: DriverConfig{TransferRate: 20_000, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				return NewStream(StreamParams{Every: 500 * time.Millisecond, Prompt: [2]int{400, 1100}, MaxTokens: [2]int{8, 40}}, o.Seed), nil
			},
		},
		{
			Name:    "leak",
			Summary: "some prefill instances die after prep_recv and some clients leave: prepared requests hold their pages for good",
			Configure: func(c *engine.Config) {
				c.PreparedAgeLimit = 10 * time.Second
				c.MaxRecycling = 16
			},
			Driver: DriverConfig{TransferRate: 20_000, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				return NewChat(ChatParams{
					Systems: 3, SystemLen: [2]int{200, 500}, FirstUser: [2]int{20, 200}, FollowUser: [2]int{10, 100},
					MaxTokens: [2]int{16, 80}, Turns: [2]int{1, 4}, NewConvEvery: 1200 * time.Millisecond,
					Think: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}, MaxContext: 3000,
					LostRate: 0.15, AbortRate: 0.08,
				}, o.Seed), nil
			},
		},
		{
			Name:    "fork-race",
			Summary: "a growing document re-sent faster than a slow prefill instance writes its KV: each request forks from KV not yet received",
			Configure: func(c *engine.Config) {
				c.MaxRecycling = 8
			},
			Driver: DriverConfig{TransferRate: 150, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				return NewGrowing(GrowingParams{Start: 300, Grow: [2]int{30, 80}, Every: 300 * time.Millisecond, Max: 3000, MaxTokens: [2]int{4, 16}}, o.Seed), nil
			},
		},
		{
			Name:    "preempt",
			Summary: "long completions on a small cache: decode runs out of pages, preempts, and the router retries from prep_recv",
			Configure: func(c *engine.Config) {
				c.MaxTotalSequenceLength = 8192
				c.Watermark = 8
				c.MaxRecycling = 0
			},
			Driver: DriverConfig{TransferRate: 20_000, StartDelay: 20 * time.Millisecond, RetryPreempted: true},
			New: func(o Options) (Workload, error) {
				return NewStream(StreamParams{Every: 900 * time.Millisecond, Prompt: [2]int{100, 300}, MaxTokens: [2]int{200, 500}}, o.Seed), nil
			},
		},
		{
			Name:    "trace",
			Summary: "replay a Mooncake-format JSONL trace (--trace FILE), time scaled by --speed, on a cache sized for 12k-token prompts",
			Configure: func(c *engine.Config) {
				c.MaxTotalSequenceLength = 1 << 19
				c.MaxSingleSequenceLength = 1 << 17
				c.MaxNumSequence = 64
				c.MaxRecycling = 256
			},
			Driver: DriverConfig{TransferRate: 200_000, StartDelay: 20 * time.Millisecond},
			New: func(o Options) (Workload, error) {
				if o.TracePath == "" {
					return nil, errors.New("sim: the trace scenario needs --trace FILE (a Mooncake-format JSONL trace)")
				}
				f, err := os.Open(o.TracePath)
				if err != nil {
					return nil, fmt.Errorf("sim: trace: %w", err)
				}
				defer f.Close()
				recs, err := ReadTrace(f)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", o.TracePath, err)
				}
				return NewTrace(recs, o.Speed), nil
			},
		},
	}
}

// Lookup returns the scenario with the given name.
func Lookup(name string) (Scenario, error) {
	var names []string
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("sim: unknown scenario %q (one of %s)", name, strings.Join(names, ", "))
}

// GrowingParams shapes a document that grows and is sent again and again.
type GrowingParams struct {
	Start     int           // the first prompt's length
	Grow      [2]int        // tokens added each time
	Every     time.Duration // time between requests
	Max       int           // past this length a new document starts
	MaxTokens [2]int
}

// growing re-sends a growing document: each prompt is the last one plus a few tokens, the
// pattern of an agent loop or a streaming transcript.
type growing struct {
	p    GrowingParams
	r    *rand.Rand
	doc  []int32
	next time.Duration
	n    int
}

// NewGrowing returns a growing-document workload.
func NewGrowing(p GrowingParams, seed uint64) Workload {
	r := rand.New(rand.NewPCG(seed, 0x67726f77696e6700))
	return &growing{p: p, r: r}
}

func (w *growing) Due(now time.Duration) []Arrival {
	var out []Arrival
	for w.next <= now {
		if len(w.doc) == 0 || len(w.doc) > w.p.Max {
			w.doc = randTokens(w.r, w.p.Start)
		} else {
			w.doc = append(w.doc, randTokens(w.r, between(w.r, w.p.Grow[0], w.p.Grow[1]))...)
		}
		out = append(out, Arrival{At: w.next, ID: fmt.Sprintf("d%d", w.n), Prompt: slices.Clone(w.doc),
			MaxTokens: between(w.r, w.p.MaxTokens[0], w.p.MaxTokens[1]), Conv: -1})
		w.n++
		w.next += w.p.Every
	}
	return out
}

func (w *growing) Finished(Arrival, []int32, string, time.Duration) {}
