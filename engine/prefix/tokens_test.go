package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// AppendTokens gives back exactly the tokens each sequence was built from, from any
// position, through forks, splits, reuses with roll-backs and removals, with small radix
// pages so that paths cross many nodes.
func TestAppendTokensFollowsEverySequence(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	c := newCache(Config{Mode: Radix, MaxRecycling: -1}, 5)
	want := map[int64][]int32{} // what each held sequence holds
	prompt := func() []int32 {
		base := []int32{1, 2, 3, 4, 5, 6, 7, 8}[:rng.IntN(9)]
		return cat(base, seqOf(int32(100*rng.IntN(4)), 1+rng.IntN(30)))
	}
	next := int64(0)
	for step := range 400 {
		switch op := rng.IntN(4); {
		case op < 2 || len(want) == 0:
			p := prompt()
			res, id := start(t, c, next, p, NoWindow)
			next++
			if res.Kind == Reuse {
				delete(want, id)
			}
			want[id] = p
		case op == 2:
			id := anyKey(rng, want)
			ext := seqOf(int32(1000+step), rng.IntN(7))
			c.ExtendSequence(id, ext)
			c.CommitSequenceExtension()
			want[id] = cat(want[id], ext)
		default:
			id := anyKey(rng, want)
			if _, st, _ := c.Sequence(id); st == Active && rng.IntN(2) == 0 {
				if err := c.RecycleSequence(id); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := c.RemoveSequence(id); err != nil {
					t.Fatal(err)
				}
				delete(want, id)
			}
		}
		for id, toks := range want {
			if l, _, ok := c.Sequence(id); !ok || l != len(toks) {
				t.Fatalf("step %d: Sequence(%d) = %d, %v, want %d tokens", step, id, l, ok, len(toks))
			}
			for _, from := range []int{0, len(toks) / 3, len(toks)} {
				got, ok := c.AppendTokens([]int32{-1}, id, from)
				if !ok || !slices.Equal(got[1:], toks[from:]) || got[0] != -1 {
					t.Fatalf("step %d: AppendTokens(seq %d, from %d) = %v, %v, want [-1 %v]", step, id, from, got, ok, toks[from:])
				}
			}
		}
	}
	if _, ok := c.AppendTokens(nil, next+1, 0); ok {
		t.Errorf("AppendTokens(unknown) = ok, want false")
	}
	for id, toks := range want {
		if got, ok := c.AppendTokens(nil, id, len(toks)+1); ok {
			t.Errorf("AppendTokens(seq %d, from past its end) = %v, ok; want false", id, got)
		}
		break
	}
}

func anyKey(rng *rand.Rand, m map[int64][]int32) int64 {
	keys := make([]int64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[rng.IntN(len(keys))]
}
