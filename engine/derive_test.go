package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
)

// referencePages classifies the pages the obvious way, from the cache's own Blocks (which
// allocates a map and a page list per block): the differential check of PageMap's walk of
// the block chains.
func referencePages(e *Engine) []PageState {
	c := e.Cache()
	st := make([]PageState, c.NumPages())
	rec := map[int64]bool{}
	for _, s := range e.prefix.Recycling() {
		rec[s] = true
	}
	for _, b := range c.Blocks() {
		s := PageActive
		all := true
		for _, q := range b.Seqs {
			all = all && rec[q]
		}
		switch {
		case all:
			s = PageRecycling
		case len(b.Seqs) > 1:
			s = PageShared
		default:
			r := e.seqOwner[b.Seqs[0]]
			switch {
			case r != nil && r.leaked:
				s = PageLeaked
			case r != nil && (r.state == StatePrepared || r.state == StateKVComplete):
				s = PagePrepared
			}
		}
		for _, pg := range b.Pages {
			st[pg] = s
		}
	}
	ps := int64(c.PageSize())
	for _, r := range e.order {
		if r.state != StatePrepared {
			continue
		}
		for i, run := range r.runs[0] {
			s := PageAwaiting
			switch got := r.kv.runRecv[i]; {
			case int64(got) == run.Len:
				continue
			case got > 0:
				s = PagePartial
			}
			for pg := run.Start / ps; pg <= (run.End()-1)/ps; pg++ {
				if cur := st[pg]; cur != PageFree && cur != PageLeaked && (cur < PageAwaiting || s > cur) {
					st[pg] = s
				}
			}
		}
	}
	return st
}

// traffic drives an engine the way a router and prefill instances would, at random: prompts
// sharing stems (so forks and reuses happen), KV written in parts, starts before the KV is
// in, aborts of waiting, prepared and running requests, and steps. after runs after the
// calls between two steps and after every step, with their events.
func traffic(t testing.TB, cfg Config, seed uint64, steps int, after func(e *Engine, evs []Event)) {
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	now := time.UnixMilli(1_000_000)
	next := 0
	ids := func(st ...RequestState) []string {
		var out []string
		for _, q := range e.order {
			for _, s := range st {
				if q.state == s {
					out = append(out, q.id)
				}
			}
		}
		return out
	}
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	for range steps {
		for range r.IntN(4) {
			stem := r.IntN(4)
			n := 2 + r.IntN(200)
			prompt := make([]int32, n)
			for i := range prompt {
				prompt[i] = int32(stem*10000 + i)
				if i > 20+r.IntN(150) {
					prompt[i] = int32(50000 + r.IntN(7))
				}
			}
			next++
			_ = e.PrepRecv(now, PrepRecv{ID: fmt.Sprint("r", next), Prompt: prompt, End: -1 - r.IntN(3), HasEnd: true, MaxTokens: 1 + r.IntN(12)})
		}
		if p := ids(StatePrepared); len(p) > 0 {
			q := e.reqs[pick(p)]
			all := pages.Expand(nil, q.runs[0])
			from := r.IntN(len(all))
			var slots []int64
			for i := from; i < min(len(all), from+1+r.IntN(40)); i++ {
				if _, got := q.kv.firstGot(i, i+1); !got { // token i is slot all[i]
					slots = append(slots, all[i])
				}
			}
			if len(slots) > 0 {
				if _, err := e.ReceiveKV(now, slots, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		if p := ids(StatePrepared, StateKVComplete); len(p) > 0 && r.IntN(2) == 0 {
			id := pick(p)
			if err := e.StartGenerate(now, id, e.reqs[id].end); err != nil {
				t.Fatal(err)
			}
		}
		if p := ids(StateWaiting, StatePrepared, StateRunning); len(p) > 0 && r.IntN(8) == 0 {
			if err := e.Abort(now, pick(p)); err != nil {
				t.Fatal(err)
			}
		}
		after(e, e.TakeEvents())
		now = now.Add(time.Duration(r.IntN(400)) * time.Millisecond)
		after(e, e.Step(now).Events)
	}
}

// The page map agrees with the cache's own Blocks on every page, for every request's pages,
// and a View fed the engine's events derives exactly what the engine does, after every call
// and step of random traffic.
func TestPageMapAgreesWithTheCacheBlocks(t *testing.T) {
	for i, tweak := range []func(*Config){
		func(c *Config) {},
		func(c *Config) { c.MaxRecycling = 0 },
		func(c *Config) { c.MaxRecycling = -1; c.MaxTotalSequenceLength = 8192 },
		func(c *Config) { c.PrefixCache = "disable" },
		func(c *Config) { c.ExcludeUnreceived = true; c.ReclaimAfter = 2 * time.Second },
	} {
		cfg := DefaultConfig()
		cfg.MaxTotalSequenceLength = 12000
		cfg.MaxSingleSequenceLength = 12000
		cfg.MaxNumSequence = 16
		cfg.Watermark = 100
		cfg.KeepFinished = 20
		tweak(&cfg)
		checked := 0
		traffic(t, cfg, uint64(i), 150, func(e *Engine, _ []Event) {
			var pm PageMap
			pm.build(engineSource{e}, engineSource{e}.facts(nil))
			want := referencePages(e)
			for pg := range want {
				if pm.States[pg] != want[pg] {
					t.Fatalf("config %d: page %d is %s, want %s", i, pg, pm.States[pg], want[pg])
				}
			}
			for _, r := range e.order {
				if r.seq < 0 || e.seqOwner[r.seq] != r {
					continue
				}
				got, ok := pm.SeqPages(r.seq)
				pgs, err := e.Cache().SequencePages(r.seq, nil)
				if ok != (err == nil) || (ok && got != len(pgs)) {
					t.Fatalf("config %d: %s's seq %d has %d pages (%v), want %d (%v)", i, r.id, r.seq, got, ok, len(pgs), err == nil)
				}
			}
			checked++
		})
		if checked == 0 {
			t.Fatalf("config %d: nothing checked", i)
		}
	}
}

// A View fed the engine's events derives what the engine derives, statuses included, after
// the calls between steps and after every step.
func TestViewDerivesWhatTheEngineDoes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTotalSequenceLength = 6000
	cfg.MaxSingleSequenceLength = 6000
	cfg.MaxNumSequence = 8
	cfg.Watermark = 50
	cfg.MaxRecycling = -1
	cfg.PreparedAgeLimit = 3 * time.Second
	var v *View
	stuck := 0
	traffic(t, cfg, 42, 300, func(e *Engine, evs []Event) {
		if v == nil {
			snap := e.Snapshot()
			var err error
			if v, err = NewView(snap); err != nil {
				t.Fatal(err)
			}
			return
		}
		for _, ev := range evs {
			if err := v.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := v.Derived(), e.Derived(); got != want {
			t.Fatalf("step %d: the view derives %+v, the engine %+v", e.StepNumber(), got, want)
		}
		src := engineSource{e}
		fs := src.facts(nil)
		var pm PageMap
		pm.build(src, fs)
		want := statuses(cfg, src.now(), fs, &pm, nil, &tally{})
		for i, st := range v.Statuses() {
			if st != want[i] {
				t.Fatalf("step %d: %s: the view says %+v, the engine %+v", e.StepNumber(), e.order[i].id, st, want[i])
			}
			if st.Stuck {
				stuck++
			}
		}
	})
	if stuck == 0 {
		t.Errorf("no request was ever stuck: the traffic does not exercise stuckness")
	}
}

// bigEngine is a large instance: 65,536 pages and 10,000 requests in every state.
func bigEngine(tb testing.TB) *Engine {
	cfg := DefaultConfig()
	cfg.MaxTotalSequenceLength = 65535 * 16
	cfg.MaxSingleSequenceLength = 1 << 16
	cfg.MaxNumSequence = 256
	cfg.KeepFinished = 200
	e, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.UnixMilli(1_000_000)
	prompt := func(n, shared, salt int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(1000 + i)
			if i >= shared {
				p[i] = int32(100000*salt + i)
			}
		}
		return p
	}
	for i := range 9000 {
		if err := e.PrepRecv(now, PrepRecv{ID: fmt.Sprintf("req-%05d", i), Prompt: prompt(70+i%20, (i%4)*16, i+1), End: -1, HasEnd: true, MaxTokens: 4}); err != nil {
			tb.Fatal(err)
		}
	}
	e.Step(now)
	for i := range 4000 {
		r := e.reqs[fmt.Sprintf("req-%05d", i)]
		all := pages.Expand(nil, r.runs[0])
		n := len(all)
		if i >= 300 {
			n = len(all) * (i % 4) / 4
		}
		if n > 0 {
			if _, err := e.ReceiveKV(now, all[:n], nil); err != nil {
				tb.Fatal(err)
			}
		}
		if i < 300 {
			if err := e.StartGenerate(now, r.id, r.end); err != nil {
				tb.Fatal(err)
			}
		}
	}
	for range 8 {
		e.Step(now)
	}
	for i := range 1200 {
		if err := e.PrepRecv(now, PrepRecv{ID: fmt.Sprintf("long-%04d", i), Prompt: prompt(1500, 0, 20000+i), End: -1, HasEnd: true}); err != nil {
			tb.Fatal(err)
		}
	}
	e.Step(now)
	if err := e.Abort(now, "req-04001"); err != nil {
		tb.Fatal(err)
	}
	e.TakeEvents()
	return e
}

// BenchmarkPageMap derives every page's state of the 65,536-page instance: by the block
// chains (what PageMap does) and from the cache's Blocks (the reference).
func BenchmarkPageMap(b *testing.B) {
	e := bigEngine(b)
	src := engineSource{e}
	fs := src.facts(nil)
	b.Run("chains", func(b *testing.B) {
		var pm PageMap
		b.ReportAllocs()
		for b.Loop() {
			pm.build(src, fs)
		}
	})
	b.Run("cache-blocks", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			referencePages(e)
		}
	})
}

// BenchmarkStatuses derives the requests' statuses and the counts of the 10,000-request
// instance as a View does (the page map aside): every one of them ("all": what it does when
// the head of the line goes from blocked to not), and after an event that changed one
// request.
func BenchmarkStatuses(b *testing.B) {
	e := bigEngine(b)
	v, err := NewView(e.Snapshot())
	if err != nil {
		b.Fatal(err)
	}
	v.PageMap()
	b.Run("all", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v.version++
			v.pmEpoch = 0
			v.refreshDerived()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(v.order)), "ns/request")
	})
	b.Run("one-changed", func(b *testing.B) {
		r := v.reqs[v.order[len(v.order)/2].ID]
		b.ReportAllocs()
		for b.Loop() {
			v.version++
			v.touch(r)
			v.refreshDerived()
		}
	})
}

// A prepared request becomes stuck with time. A View that then sees only step summaries
// derives again only what the clock can change, and still says what the engine says, step
// after step.
func TestStuckWithTime(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PreparedAgeLimit = time.Second
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_000_000)
	if err := e.PrepRecv(now, PrepRecv{ID: "p", Prompt: make([]int32, 40), End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	e.TakeEvents()
	v, err := NewView(e.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	became, clockOnly := 0, 0
	for i := range 30 {
		now = now.Add(100 * time.Millisecond)
		v.Derived()
		for _, ev := range e.Step(now).Events {
			if err := v.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
		untouched := len(v.dirty) == 0
		if got, want := v.Derived(), e.Derived(); got != want {
			t.Fatalf("step %d: the view derives %+v, the engine %+v", i+1, got, want)
		}
		if untouched {
			clockOnly++
		}
		if st, _ := v.StatusOf("p"); st.Stuck && became == 0 {
			became = i + 1
		}
	}
	if became == 0 || clockOnly < 15 {
		t.Fatalf("stuck from step %d, %d steps moved only the clock; want both", became, clockOnly)
	}
}

// A prepared request becomes stuck when the clock alone says so: a View that sees nothing
// but step summaries (no hazard, no event about the request) flips it at the step its age
// reaches the limit, as a derivation from scratch does, and only then.
func TestStuckWithTheClockAlone(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PreparedAgeLimit = time.Second
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_000_000)
	for _, id := range []string{"p", "q"} {
		if err := e.PrepRecv(now, PrepRecv{ID: id, Prompt: make([]int32, 40), End: -1, HasEnd: true}); err != nil {
			t.Fatal(err)
		}
		e.Step(now)
		now = now.Add(300 * time.Millisecond)
	}
	e.TakeEvents()
	v, err := NewView(e.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	stamp := v.Stamp()
	became := map[string]int64{}
	for range 30 {
		stamp.Step++
		stamp.At += 100
		if err := v.Apply(StepCompleted{Stamp: stamp}); err != nil {
			t.Fatal(err)
		}
		if err := v.CheckKept(); err != nil {
			t.Fatalf("at %d: %v", stamp.At, err)
		}
		for _, id := range []string{"p", "q"} {
			if st, _ := v.StatusOf(id); st.Stuck && became[id] == 0 {
				became[id] = stamp.At
			}
		}
	}
	for _, id := range []string{"p", "q"} {
		r, _ := v.Request(id)
		if got, want := became[id], r.Admitted.At+1000; got != want {
			t.Errorf("%s became stuck at %d, want %d (admitted at %d)", id, got, want, r.Admitted.At)
		}
	}
}
