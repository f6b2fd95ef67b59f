package prepare

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
)

// TestInvariantsUnderRandomTraffic drives the action with random prompts that share
// prefixes, random windows, and random finishing and eviction, and checks the invariants of
// spec section 10 after every step.
func TestInvariantsUnderRandomTraffic(t *testing.T) {
	runs := 300
	if testing.Short() {
		runs = 30
	}
	for run := range runs {
		r := rand.New(rand.NewPCG(uint64(run), 11))
		fc := fixtureConfig{maxTotal: 1024 + r.IntN(4096), watermark: 1 + r.IntN(40), maxRecycling: []int{-1, 1, 3}[r.IntN(3)], models: 1 + r.IntN(2), disabled: r.IntN(5) == 0}
		f := newFixture(t, fc)
		var prepared []Prepared
		prompts := map[string][]int32{}
		next := 0
		for step := range 40 {
			// A few new requests, built from shared stems so that matches, forks and reuses
			// happen.
			var queue []Request
			for range r.IntN(4) {
				stem := r.IntN(3)
				n := 2 + r.IntN(120)
				prompt := make([]int32, n)
				for i := range prompt {
					prompt[i] = int32(stem*1000 + i)
					if i > 10+r.IntN(100) {
						prompt[i] = int32(r.IntN(5))
					}
				}
				id := fmt.Sprint("r-", next)
				next++
				end := r.IntN(n) // 0 <= end < n
				queue = append(queue, Request{ID: id, Prompt: prompt, End: end, HasEnd: true})
				prompts[id] = prompt
			}
			free := f.free()
			running := r.IntN(3)
			out := f.step(running, queue)
			taken := 0
			for i, p := range out.Admitted {
				if p.Request != queue[i].ID {
					t.Fatalf("run %d step %d: admitted[%d] = %s, want %s (FIFO, invariant 6)", run, step, i, p.Request, queue[i].ID)
				}
				checkInvariants(t, f, p, fc.models)
				taken += p.PagesTaken
				prepared = append(prepared, p)
			}
			if out.Blocked == nil && len(out.Admitted) != len(queue) {
				t.Fatalf("run %d step %d: %d of %d admitted and nothing blocked", run, step, len(out.Admitted), len(queue))
			}
			evicted := 0
			for _, p := range out.Admitted {
				evicted += p.Evaluation.Evicted
			}
			if out.Blocked != nil {
				evicted += out.Blocked.Evicted
			}
			if evicted == 0 && f.free() != free-taken {
				t.Fatalf("run %d step %d: free pages %d -> %d, admissions took %d (invariant 4): %+v", run, step, free, f.free(), taken, out.Admitted)
			}
			for _, c := range f.caches {
				if err := c.Check(); err != nil {
					t.Fatalf("run %d step %d: %v", run, step, err)
				}
			}
			// Finish some prepared requests; their sequences recycle.
			for len(prepared) > 0 && r.IntN(3) > 0 {
				k := r.IntN(len(prepared))
				p := prepared[k]
				prepared = slices.Delete(prepared, k, k+1)
				if !f.caches[0].HasSequence(p.Seq) {
					continue // evicted after a reuse took it over and finished again
				}
				f.finish(p, prompts[p.Request][:p.End+1], 1+r.IntN(4))
			}
			if r.IntN(4) == 0 {
				f.pc.TryFreeMemory()
			}
		}
	}
}

func checkInvariants(t *testing.T, f *fixture, p Prepared, models int) {
	t.Helper()
	md, err := Split(p.Metadata)
	if err != nil || len(md) != models {
		t.Fatalf("%s: Split(%v) = %d groups, %v (invariant 1)", p.Request, p.Metadata, len(md), err)
	}
	for _, runs := range md {
		sum := int64(0)
		for i, r := range runs {
			sum += r.Len
			if i > 0 && runs[i-1].End() == r.Start {
				t.Fatalf("%s: runs %v are not maximal (invariant 1)", p.Request, runs)
			}
			if r.Start < 0 || r.End() > int64(f.caches[0].NumPages()*16) {
				t.Fatalf("%s: run %v outside the pool (invariant 2)", p.Request, r)
			}
		}
		if sum != int64(p.End-p.Matched) {
			t.Fatalf("%s: runs sum to %d, want end %d - matched %d (invariant 1)", p.Request, sum, p.End, p.Matched)
		}
	}
	pgs, _ := f.caches[0].SequencePages(p.Seq, nil)
	for _, s := range pages.Expand(nil, md[0]) {
		if !slices.Contains(pgs, int32(s/16)) {
			t.Fatalf("%s: slot %d is on page %d, not one of its sequence's %v (invariant 2)", p.Request, s, s/16, pgs)
		}
	}
	if p.End >= 1 && p.Matched > p.End-1 || p.End <= 1 && p.Matched != 0 {
		t.Fatalf("%s: matched %d with end %d (invariant 3)", p.Request, p.Matched, p.End)
	}
	if got, _ := f.caches[0].SequenceLength(p.Seq); got != p.End {
		t.Fatalf("%s: sequence length %d, want end %d (invariant 4)", p.Request, got, p.End)
	}
	if p.Match.Kind == prefix.Reuse {
		l := p.Match.Offset + p.Match.Pop
		if 10*p.Match.Offset <= 9*l {
			t.Fatalf("%s: reused a sequence of %d tokens for a match of %d (invariant 7)", p.Request, l, p.Match.Offset)
		}
	}
	if back, err := Decode(p.Encoded); err != nil || !slices.Equal(back, p.Metadata) {
		t.Fatalf("%s: Decode(Encode) = %v, %v (invariant 8)", p.Request, back, err)
	}
}
