package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine/prefix"
)

// shadowPair is a decode instance (an engine that decides) and its shadow (an engine that
// follows what a tap would see of it), driven call by call as a router drives D.
type shadowPair struct {
	t    *testing.T
	d, s *Engine
	v    *View // a viewer of the shadow, folding its events
	now  time.Time
	divs []Divergence
}

func newShadowPair(t *testing.T, dcfg, scfg Config) *shadowPair {
	t.Helper()
	d, err := New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Follow()
	v, err := NewView(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	return &shadowPair{t: t, d: d, s: s, v: v, now: time.UnixMilli(1_700_000_000_000)}
}

func (p *shadowPair) tick() time.Time { p.now = p.now.Add(10 * time.Millisecond); return p.now }

// fold applies the shadow's pending events to the viewer, and checks the viewer agrees.
func (p *shadowPair) fold() {
	p.t.Helper()
	for _, ev := range p.s.TakeEvents() {
		if dv, ok := ev.(Divergence); ok {
			p.divs = append(p.divs, dv)
		}
		if err := p.v.Apply(ev); err != nil {
			p.t.Fatalf("viewer of the shadow: %v", err)
		}
	}
	p.s.TakeTokens()
	if diff := ShadowDiff(p.s.Snapshot(), p.v.Snapshot()); diff != nil {
		p.t.Fatalf("the shadow's viewer differs from the shadow:\n%s", strings.Join(diff, "\n"))
	}
	// The viewer's page map, kept from the events (swaps and sunk pages included), is the
	// one built from scratch from the shadow.
	if got, want := p.v.PageMap(), ScratchPageMap(p.s); !slices.Equal(got.States, want.States) {
		p.t.Fatalf("the viewer's page map differs from the shadow's: %v, want %v", got.Count, want.Count)
	}
}

// same checks that the shadow equals D.
func (p *shadowPair) same(after string) {
	p.t.Helper()
	p.fold()
	if diff := ShadowDiff(p.d.Snapshot(), p.s.Snapshot()); diff != nil {
		p.t.Fatalf("after %s, the shadow differs from D:\n%s", after, strings.Join(diff, "\n"))
	}
}

func (p *shadowPair) prep(id string, prompt []int32, maxTokens int) {
	p.t.Helper()
	pr := PrepRecv{ID: id, Prompt: prompt, End: -1, HasEnd: true, MaxTokens: maxTokens}
	now := p.tick()
	if err := p.d.PrepRecv(now, pr); err != nil {
		p.t.Fatal(err)
	}
	if err := p.s.FollowArrived(now, pr); err != nil {
		p.t.Fatal(err)
	}
}

// admit steps D until it admits, and tells the shadow each answer.
func (p *shadowPair) admit() []string {
	p.t.Helper()
	var ids []string
	for range 100 {
		rd := p.d.Step(p.tick())
		for _, ev := range rd.Events {
			if m, ok := ev.(MetadataEmitted); ok {
				ids = append(ids, m.ID)
				p.s.FollowAdmitted(p.now, m.ID, Answer{PromptLength: m.PromptLength, Matched: m.Matched, Metadata: m.Encoded})
			}
		}
		if len(ids) > 0 {
			return ids
		}
	}
	p.t.Fatal("D admitted nothing in 100 steps")
	return nil
}

func (p *shadowPair) kv(id string) {
	p.t.Helper()
	r, _ := p.d.Request(id)
	if r.Reserved > 0 {
		if _, err := p.d.WriteKV(p.tick(), KVWrite{Metadata: r.Encoded, Tokens: r.Reserved}); err != nil {
			p.t.Fatal(err)
		}
	}
	if err := p.s.FollowKVReceived(p.now, id); err != nil {
		p.t.Fatal(err)
	}
}

func (p *shadowPair) start(id string) {
	p.t.Helper()
	r, _ := p.d.Request(id)
	if err := p.d.StartGenerate(p.tick(), id, r.End); err != nil {
		p.t.Fatal(err)
	}
	if err := p.s.FollowStarted(p.now, id, r.End); err != nil {
		p.t.Fatal(err)
	}
}

// run steps D until nothing runs, handing the shadow every token as a stream would.
func (p *shadowPair) run() {
	p.t.Helper()
	for range 10000 {
		rd := p.d.Step(p.tick())
		for _, tk := range rd.Tokens {
			if tk.Token >= 0 {
				p.s.FollowTokens(p.now, tk.ID, 1, []int32{tk.Token})
			}
			if tk.Final {
				p.s.FollowEnded(p.now, tk.ID, tk.FinishReason)
			}
		}
		if len(p.d.Snapshot().Running) == 0 {
			return
		}
	}
	p.t.Fatal("D still runs after 10000 steps")
}

// flow runs one request's three calls.
func (p *shadowPair) flow(id string, prompt []int32, maxTokens int) {
	p.t.Helper()
	p.prep(id, prompt, maxTokens)
	p.same("prep_recv " + id)
	p.admit()
	p.same("the answer of " + id)
	p.kv(id)
	p.same("remote_send " + id)
	p.start(id)
	p.same("start_generate " + id)
	p.run()
	p.same("the stream of " + id)
}

func tokensFrom(seed, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*31) % 30000)
	}
	return out
}

func followConfig() Config {
	c := DefaultConfig()
	c.MaxTotalSequenceLength = 8192
	c.MaxRecycling = 4
	return c
}

// A shadow fed what a tap sees predicts every answer of D, and holds D's state after every
// call: the same requests, queues, pages and prefix tree, with no divergence.
func TestShadowFollowsExactly(t *testing.T) {
	p := newShadowPair(t, followConfig(), followConfig())
	system := tokensFrom(1, 300)
	for i := range 12 {
		prompt := append(append([]int32{}, system[:100+20*(i%5)]...), tokensFrom(100+i, 20+i*7)...)
		p.flow(fmt.Sprintf("r%d", i), prompt, 5+i%4)
	}
	// Two at once: admitted in one step, decoded in one batch.
	p.prep("a", append(append([]int32{}, system...), tokensFrom(200, 30)...), 20)
	p.prep("b", append(append([]int32{}, system...), tokensFrom(201, 40)...), 24)
	p.admit()
	p.same("two answers")
	p.kv("a")
	p.kv("b")
	p.start("a")
	p.start("b")
	p.same("two starts")
	p.run()
	p.same("two streams")
	if len(p.divs) > 0 {
		t.Fatalf("divergences: %v", p.divs)
	}
	if st := p.s.Standing(); !st.Exact() || !strings.HasPrefix(st.Describe(p.now.UnixMilli()), "exact since step 0") {
		t.Errorf("standing = %+v (%s), want exact", st, st.Describe(p.now.UnixMilli()))
	}
}

// A tail prefilled by D (a balance factor: end well before the prompt's end), a client that
// leaves while prepared (the KV leaks, as in MLC), and one that leaves while waiting.
func TestShadowFollowsTailsAndAborts(t *testing.T) {
	p := newShadowPair(t, followConfig(), followConfig())
	pr := PrepRecv{ID: "tail", Prompt: tokensFrom(3, 200), End: 120, HasEnd: true, MaxTokens: 6}
	if err := p.d.PrepRecv(p.tick(), pr); err != nil {
		t.Fatal(err)
	}
	if err := p.s.FollowArrived(p.now, pr); err != nil {
		t.Fatal(err)
	}
	p.admit()
	p.kv("tail")
	p.start("tail")
	p.same("start of the tail")
	p.run()
	p.same("the tail's stream")

	p.prep("gone", tokensFrom(4, 80), 4)
	p.admit()
	if err := p.d.Abort(p.tick(), "gone"); err != nil {
		t.Fatal(err)
	}
	p.s.FollowAborted(p.now, "gone")
	p.same("a prepared request's client leaving")
	if len(p.divs) > 0 {
		t.Fatalf("divergences: %v", p.divs)
	}
}

// A shadow with a configuration smaller than D's (a higher watermark) finds a request
// blocked that D admits: a divergence that names the watermark and the likely cause, after
// which it follows on with D's pages.
func TestShadowDivergesOnASmallerConfiguration(t *testing.T) {
	scfg := followConfig()
	scfg.Watermark = 480
	p := newShadowPair(t, followConfig(), scfg)
	for i := range 4 {
		p.prep(fmt.Sprintf("r%d", i), tokensFrom(10+i, 400), 4)
		p.admit()
		p.kv(fmt.Sprintf("r%d", i))
		p.start(fmt.Sprintf("r%d", i))
		p.run()
		p.fold()
	}
	if len(p.divs) == 0 {
		t.Fatal("no divergence")
	}
	d := p.divs[0]
	if d.What != DivergedBlocked || !strings.Contains(d.Cause, "watermark") || !strings.Contains(d.Cause, "configuration is larger") {
		t.Errorf("divergence = %v, want blocked by the watermark, D's configuration larger", d)
	}
	if diff := PageMapDiff(p.d.Snapshot(), p.s.Snapshot()); diff != nil {
		t.Errorf("page map after the divergence:\n%s", strings.Join(diff, "\n"))
	}
	if st := p.s.Standing(); st.Divergences == 0 || !strings.Contains(st.Describe(p.now.UnixMilli()), "diverged") {
		t.Errorf("standing = %s", st.Describe(p.now.UnixMilli()))
	}
}

// A shadow under the other eviction order evicts another recycling sequence than D: D's
// next answer names pages the shadow gave to a sequence D evicted. The divergence says so,
// and the resync makes the pages of every live request D's.
func TestShadowResyncsPagesAfterAnotherEviction(t *testing.T) {
	dcfg := followConfig()
	dcfg.MaxRecycling = 2
	scfg := dcfg
	scfg.EvictOrder = prefix.EvictLRU
	p := newShadowPair(t, dcfg, scfg)
	for i := range 3 {
		p.flow0(fmt.Sprintf("r%d", i), tokensFrom(20+i, 70+i*16), 3)
	}
	p.prep("x", tokensFrom(40, 100), 3)
	p.admit()
	p.fold()
	var found *Divergence
	for i := range p.divs {
		if p.divs[i].What == DivergedMetadata {
			found = &p.divs[i]
		}
	}
	if found == nil {
		t.Fatalf("no metadata divergence; divergences %v", p.divs)
	}
	if !strings.Contains(found.Cause, "eviction order") || len(found.Swaps) == 0 {
		t.Errorf("divergence = %v, want the eviction order named and pages swapped", found)
	}
	if r, _ := p.s.Request("x"); r.Encoded != found.DMetadata {
		t.Errorf("after the resync the shadow's metadata of x = %s, want D's %s", r.Encoded, found.DMetadata)
	}
	dx, _ := p.d.Request("x")
	sx, _ := p.s.Request("x")
	if fmt.Sprint(dx.Runs) != fmt.Sprint(sx.Runs) {
		t.Errorf("x's runs: D %v, shadow %v", dx.Runs, sx.Runs)
	}
	// The request goes on with D's slots: its KV and its stream follow without more.
	n := len(p.divs)
	p.kv("x")
	p.start("x")
	p.run()
	p.fold()
	if len(p.divs) != n {
		t.Errorf("more divergences after the resync: %v", p.divs[n:])
	}
}

// flow0 is flow without the checks of equality (for configurations meant to differ).
func (p *shadowPair) flow0(id string, prompt []int32, maxTokens int) {
	p.t.Helper()
	p.prep(id, prompt, maxTokens)
	p.admit()
	p.kv(id)
	p.start(id)
	p.run()
	p.fold()
}

// What a tap started mid-flight sees: a start_generate and tokens for a request it never saw
// arrive. The shadow lists it as admitted before the tap, holds nothing for it, and drops it
// when its stream ends; an answer for a request it never saw is a divergence, not a crash.
func TestShadowStartedMidFlight(t *testing.T) {
	s, err := New(followConfig())
	if err != nil {
		t.Fatal(err)
	}
	s.Follow()
	now := time.UnixMilli(1_700_000_000_000)
	if err := s.FollowStarted(now, "old", 39); err != nil {
		t.Fatal(err)
	}
	s.FollowTokens(now, "old", 3, nil)
	st := s.Standing()
	if len(st.BeforeTap) != 1 || !strings.Contains(st.Describe(now.UnixMilli()), "1 request admitted before the tap") {
		t.Errorf("standing = %s", st.Describe(now.UnixMilli()))
	}
	s.FollowEnded(now, "old", "length")
	if st := s.Standing(); len(st.BeforeTap) != 0 {
		t.Errorf("after its end, before tap = %v", st.BeforeTap)
	}
	d, ok := s.FollowAdmitted(now, "ghost", Answer{PromptLength: 40, Matched: 0, Metadata: "CAAAAAAAAABbMSwwLDM5XQ=="})
	if !ok || d.What != DivergedUnknown {
		t.Errorf("an answer for an unknown request = %v, %v; want an unknown-request divergence", d, ok)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// Whatever a tap reports, in whatever order, with whatever answers (a D that is not what
// the shadow thinks, garbage metadata, calls for requests never seen), the shadow neither
// panics nor breaks an invariant, and a viewer folding its events agrees with it.
func TestShadowSurvivesAnyObservations(t *testing.T) {
	for seed := range shadowSeeds {
		s, err := New(followConfig())
		if err != nil {
			t.Fatal(err)
		}
		s.Follow()
		v, _ := NewView(s.Snapshot())
		rng := uint64(seed)*0x9e3779b97f4a7c15 + 1
		next := func(n int) int {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			return int(rng % uint64(n))
		}
		now := time.UnixMilli(1_700_000_000_000)
		mds := []string{"CAAAAAAAAABbMSwwLDM5XQ==", "garbage", "CwAAAAAAAABbMSw2MDQsMTk5XQ==", "AwAAAAAAAABbMF0="}
		for op := range 400 {
			now = now.Add(time.Millisecond)
			id := fmt.Sprintf("r%d", next(12))
			switch next(8) {
			case 0, 1:
				n := 2 + next(300)
				s.FollowArrived(now, PrepRecv{ID: id, Prompt: tokensFrom(next(5), n), End: -1 - next(3), HasEnd: true, MaxTokens: 1 + next(20)})
			case 2:
				if r, ok := s.Request(id); ok && next(3) > 0 {
					// D's answer, as D would give it to the shadow's own prediction, or not.
					md := mds[next(len(mds))]
					s.FollowAdmitted(now, id, Answer{PromptLength: r.PromptLength, Matched: next(40), Metadata: md})
				} else {
					s.FollowAdmitted(now, id, Answer{PromptLength: 40, Metadata: mds[next(len(mds))]})
				}
			case 3:
				s.FollowKVReceived(now, id)
			case 4:
				s.FollowStarted(now, id, next(300)-1)
			case 5:
				s.FollowTokens(now, id, 1+next(4), nil)
			case 6:
				s.FollowEnded(now, id, []string{"length", "preempt", "abort"}[next(3)])
			case 7:
				s.FollowAborted(now, id)
			}
			if err := s.Check(); err != nil {
				t.Fatalf("seed %d, op %d: %v", seed, op, err)
			}
			for _, ev := range s.TakeEvents() {
				if err := v.Apply(ev); err != nil {
					t.Fatalf("seed %d, op %d: the viewer: %v", seed, op, err)
				}
			}
			s.TakeTokens()
		}
		if diff := ShadowDiff(s.Snapshot(), v.Snapshot()); diff != nil {
			t.Fatalf("seed %d: the viewer differs:\n%s", seed, strings.Join(diff, "\n"))
		}
	}
}

// shadowSeeds is how many random histories TestShadowSurvivesAnyObservations tries.
var shadowSeeds = 20

// Two requests whose calls raced: D took b's prep_recv first, the tap saw a's call and its
// answer before b's. a's answer names pages below those the shadow predicted, which it
// marks of unknown use and sinks to the bottom of its free list; b's answer names those
// very pages, which explains them. No page is left of unknown use: sunk to the bottom,
// they once made every free page above them unknown for b.
func TestShadowOfCallsSeenInTheOtherOrder(t *testing.T) {
	p := newShadowPair(t, followConfig(), followConfig())
	a := PrepRecv{ID: "a", Prompt: tokensFrom(1, 100), End: -1, HasEnd: true, MaxTokens: 3}
	b := PrepRecv{ID: "b", Prompt: tokensFrom(2, 100), End: -1, HasEnd: true, MaxTokens: 3}
	now := p.tick()
	for _, pr := range []PrepRecv{b, a} {
		if err := p.d.PrepRecv(now, pr); err != nil {
			t.Fatal(err)
		}
	}
	answers := map[string]Answer{}
	for _, ev := range p.d.Step(p.tick()).Events {
		if m, ok := ev.(MetadataEmitted); ok {
			answers[m.ID] = Answer{PromptLength: m.PromptLength, Matched: m.Matched, Metadata: m.Encoded}
		}
	}
	if len(answers) != 2 {
		t.Fatalf("D admitted %v, want a and b in one step", answers)
	}
	for _, pr := range []PrepRecv{a, b} {
		if err := p.s.FollowArrived(p.now, pr); err != nil {
			t.Fatal(err)
		}
		p.s.FollowAdmitted(p.now, pr.ID, answers[pr.ID])
		p.fold()
	}
	for _, id := range []string{"a", "b"} {
		dr, _ := p.d.Request(id)
		sr, _ := p.s.Request(id)
		if fmt.Sprint(dr.Runs) != fmt.Sprint(sr.Runs) {
			t.Errorf("%s's runs: D %v, the shadow %v", id, dr.Runs, sr.Runs)
		}
	}
	if len(p.divs) == 0 {
		t.Errorf("no divergence: want a's pages named as not predicted")
	}
	if st := p.s.Standing(); st.UnknownPages != 0 {
		t.Errorf("%d pages of unknown use after both answers, want none: D's pages are all explained", st.UnknownPages)
	}
}
