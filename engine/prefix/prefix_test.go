package prefix

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// seqOf returns n tokens base, base+1, ….
func seqOf(base int32, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// start inserts id with tokens as the engine does at prepare-receive, then queues and
// commits the extension that makes the adopted sequence hold all of tokens. It returns the
// result and the adopted id.
func start(t *testing.T, c *Cache, id int64, tokens []int32, w Window) (Result, int64) {
	t.Helper()
	res, err := c.InsertSequence(id, tokens, w)
	if err != nil {
		t.Fatalf("InsertSequence(%d, %v) = %v", id, tokens, err)
	}
	if res.Kind == Reuse {
		id = res.Parent
	}
	c.ExtendSequence(id, tokens[res.Offset:])
	c.CommitSequenceExtension()
	return res, id
}

func mustRecycle(t *testing.T, c *Cache, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		if err := c.RecycleSequence(id); err != nil {
			t.Fatalf("RecycleSequence(%d) = %v", id, err)
		}
	}
}

func mustCheck(t *testing.T, c *Cache) {
	t.Helper()
	if err := c.Check(); err != nil {
		t.Fatalf("Check() = %v\n%s", err, c.Describe())
	}
}

// brief drops the fields a test does not pin.
func brief(r Result) string {
	return fmt.Sprintf("%v offset=%d parent=%d pop=%d matched=%d candidates=%d", r.Kind, r.Offset, r.Parent, r.Pop, r.Matched, r.Candidates)
}

// TestSpecExample5 is the prefix-cache side of ENGINE.md 9.5: A ran on prompt P (40 tokens)
// with max_tokens 2, so it holds P and its first generated token (41) and is recycling. B has
// the same prompt and end = 39: the match sees P[0:38].
func TestSpecExample5(t *testing.T) {
	P := seqOf(100, 40)
	for _, tc := range []struct {
		name      string
		generated int // tokens A fed back after P
		want      string
		wantA     int   // A's length afterwards
		wantState State // A's state afterwards
	}{
		{"reuse", 1, "reuse offset=38 parent=1 pop=3 matched=38 candidates=1", 38, Active},
		{"fork", 4, "fork offset=38 parent=1 pop=0 matched=38 candidates=1", 44, Recycling},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{MaxRecycling: 4})
			start(t, c, 1, P[:39], NoWindow)                  // prep_recv, end = 39
			c.ExtendSequence(1, P[39:])                       // start_generate commits P[39]
			c.ExtendSequence(1, seqOf(900, tc.generated))     // decode feeds generated tokens
			mustRecycle(t, c, 1)                              // finished
			res, err := c.InsertSequence(2, P[:39], NoWindow) // B's prep_recv
			if err != nil || brief(res) != tc.want {
				t.Fatalf("InsertSequence(2, P[:39]) = %s, %v, want %s", brief(res), err, tc.want)
			}
			if l, st, _ := c.Sequence(1); l != tc.wantA || st != tc.wantState {
				t.Errorf("Sequence(1) = %d, %v, want %d, %v", l, st, tc.wantA, tc.wantState)
			}
			if got, want := c.HasSequence(2), res.Kind == Fork; got != want {
				t.Errorf("HasSequence(2) = %v, want %v", got, want)
			}
			mustCheck(t, c)
		})
	}
}

func TestInsertRules(t *testing.T) {
	P := seqOf(1, 20) // a shared prefix
	w4 := Window{Size: 4}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *Cache)
		id    int64
		toks  []int32
		w     Window
		want  string
	}{
		{
			name: "empty tree: new",
			id:   1, toks: P, w: NoWindow,
			want: "new offset=0 parent=-1 pop=0 matched=0 candidates=0",
		},
		{
			name: "one token: nothing to match",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, NoWindow)
			},
			id: 2, toks: P[:1], w: NoWindow,
			want: "new offset=0 parent=-1 pop=0 matched=0 candidates=0",
		},
		{
			name: "the last token is never matched",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, NoWindow)
			},
			id: 2, toks: P, w: NoWindow,
			want: "fork offset=19 parent=1 pop=0 matched=19 candidates=1",
		},
		{
			name: "fork from an active sequence",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, cat(P, seqOf(500, 10)), NoWindow)
			},
			id: 2, toks: cat(P, seqOf(600, 5)), w: NoWindow,
			want: "fork offset=20 parent=1 pop=0 matched=20 candidates=1",
		},
		{
			name: "reuse the shortest recycling sequence",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, cat(P, seqOf(500, 2)), NoWindow) // 22
				start(t, c, 2, cat(P, seqOf(600, 1)), NoWindow) // 21
				start(t, c, 3, cat(P, seqOf(700, 3)), NoWindow) // 23
				mustRecycle(t, c, 1, 2, 3)
			},
			id: 4, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "reuse offset=20 parent=2 pop=1 matched=20 candidates=3",
		},
		{
			name: "ties among the shortest: the first in candidate order, the newest page",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, cat(P, seqOf(500, 1)), NoWindow)
				start(t, c, 2, cat(P, seqOf(600, 1)), NoWindow)
				mustRecycle(t, c, 1, 2)
			},
			id: 4, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "reuse offset=20 parent=2 pop=1 matched=20 candidates=2",
		},
		{
			name: "reuse needs m > 0.9 len, strictly: 10*9 > 9*10 fails",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P[:10], NoWindow)
				mustRecycle(t, c, 1)
			},
			id: 2, toks: P[:10], w: NoWindow,
			want: "fork offset=9 parent=1 pop=0 matched=9 candidates=1",
		},
		{
			name: "reuse when 10*m > 9*len: 10*10 > 9*11",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P[:11], NoWindow)
				mustRecycle(t, c, 1)
			},
			id: 2, toks: P[:11], w: NoWindow,
			want: "reuse offset=10 parent=1 pop=1 matched=10 candidates=1",
		},
		{
			name: "the shortest fails the test: fork from the first candidate, although a longer one exists",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, cat(P, seqOf(500, 10)), NoWindow) // 30 recycling
				start(t, c, 2, cat(P, seqOf(600, 20)), NoWindow) // 40 recycling
				start(t, c, 3, cat(P, seqOf(700, 1)), NoWindow)  // 21 active
				mustRecycle(t, c, 1, 2)
			},
			id: 4, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "fork offset=20 parent=3 pop=0 matched=20 candidates=3",
		},
		{
			name: "an active sequence is never reused",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, NoWindow)
			},
			id: 2, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "fork offset=20 parent=1 pop=0 matched=20 candidates=1",
		},
		{
			name: "reuse needs the same window: {-1 1} is not NoWindow, but may be forked",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, Window{Size: -1, Sink: 1})
				mustRecycle(t, c, 1)
			},
			id: 2, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "fork offset=20 parent=1 pop=0 matched=20 candidates=1",
		},
		{
			name: "the fork skips sequences with a sliding window",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, NoWindow)
				start(t, c, 2, P, w4)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "fork offset=20 parent=1 pop=0 matched=20 candidates=2",
		},
		{
			name: "every candidate has a sliding window: new, offset 0",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, w4)
				mustRecycle(t, c, 1)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: NoWindow,
			want: "new offset=0 parent=-1 pop=0 matched=20 candidates=1",
		},
		{
			name: "sliding window: reuse of length exactly m",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, w4)
				mustRecycle(t, c, 1)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: w4,
			want: "reuse offset=20 parent=1 pop=0 matched=20 candidates=1",
		},
		{
			name: "sliding window: no reuse of a longer sequence, no fork",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, cat(P, seqOf(500, 1)), w4)
				mustRecycle(t, c, 1)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: w4,
			want: "new offset=0 parent=-1 pop=0 matched=20 candidates=1",
		},
		{
			name: "sliding window: the window must be equal",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, Window{Size: 4, Sink: 1})
				mustRecycle(t, c, 1)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: w4,
			want: "new offset=0 parent=-1 pop=0 matched=20 candidates=1",
		},
		{
			name: "sliding window: never fork from an active sequence",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, NoWindow)
			},
			id: 3, toks: cat(P, seqOf(800, 1)), w: w4,
			want: "new offset=0 parent=-1 pop=0 matched=20 candidates=1",
		},
		{
			name: "sliding window: the first recycling one at the match node",
			setup: func(t *testing.T, c *Cache) {
				start(t, c, 1, P, w4)
				start(t, c, 2, P, w4)
				start(t, c, 3, P, w4)
				mustRecycle(t, c, 1, 2)
			},
			id: 4, toks: cat(P, seqOf(800, 1)), w: w4,
			want: "reuse offset=20 parent=2 pop=0 matched=20 candidates=3",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{MaxRecycling: -1})
			if tc.setup != nil {
				tc.setup(t, c)
			}
			res, err := c.InsertSequence(tc.id, tc.toks, tc.w)
			if err != nil || brief(res) != tc.want {
				t.Fatalf("InsertSequence(%d, %d tokens, %v) = %s, %v, want %s\n%s", tc.id, len(tc.toks), tc.w, brief(res), err, tc.want, c.Describe())
			}
			adopted := tc.id
			if res.Kind == Reuse {
				adopted = res.Parent
				if c.HasSequence(tc.id) {
					t.Errorf("HasSequence(%d) = true after a reuse, want false", tc.id)
				}
			}
			if l, st, ok := c.Sequence(adopted); !ok || l != res.Offset || st != Active {
				t.Errorf("Sequence(%d) = %d, %v, %v, want %d, active, true", adopted, l, st, ok, res.Offset)
			}
			mustCheck(t, c)
		})
	}
}

// TestCandidateOrder pins the order of S as MLC's MatchPrefix gives it: in the page X where
// the match stops, X's sequences newest first; then the sequences of X's children, newest
// child first; then, from the oldest child to the newest, the same walk below each child.
func TestCandidateOrder(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 10, []int32{1, 2, 3, 4, 5}, NoWindow)       // [1 2 3 4 5]
	start(t, c, 11, []int32{1, 2, 3}, NoWindow)             // splits it: [1 2 3] → [4 5]
	start(t, c, 12, []int32{1, 2, 3}, NoWindow)             // newer than 11 at [1 2 3]
	start(t, c, 13, []int32{1, 2, 3, 7, 8}, NoWindow)       // a newer child [7 8]
	start(t, c, 14, []int32{1, 2}, NoWindow)                // splits [1 2 3] at [1 2]
	start(t, c, 15, []int32{1, 2, 3, 0, 1}, NoWindow)       // the newest child [0 1]
	start(t, c, 16, []int32{1, 2, 3, 0, 1, 5, 5}, NoWindow) // below [0 1]
	start(t, c, 17, []int32{1, 2, 3, 7, 8, 9, 9}, NoWindow) // below [7 8]
	// [1 2]{14} → [3]{12 11} → [0 1]{15} → [5 5]{16}
	//                        → [7 8]{13} → [9 9]{17}
	//                        → [4 5]{10}
	for _, tc := range []struct {
		q     []int32
		m     int
		cands []int64
	}{
		{[]int32{1, 2, 3, 6}, 3, []int64{12, 11, 15, 13, 10, 17, 16}},
		{[]int32{1, 2, 6}, 2, []int64{14, 12, 11, 15, 13, 10, 17, 16}},
		{[]int32{1, 6}, 1, []int64{14, 12, 11, 15, 13, 10, 17, 16}},
		{[]int32{1, 2, 3, 4, 6}, 4, []int64{10}}, // stops inside [4 5]
		{[]int32{1, 2, 3, 0, 1, 5}, 6, []int64{16}},
		{[]int32{1, 2, 3, 0, 6}, 4, []int64{15, 16}},
		{[]int32{2}, 0, nil},
	} {
		m, cands := c.Match(tc.q)
		if m != tc.m || !slices.Equal(cands, tc.cands) {
			t.Errorf("Match(%v) = %d, %v, want %d, %v\n%s", tc.q, m, cands, tc.m, tc.cands, c.Describe())
		}
	}
	// A roll-back pushes the sequence to the front of its new page: 10 leaves [4 5], which
	// goes, and comes first at [3].
	if err := c.RollBackSequence(10, 2); err != nil {
		t.Fatal(err)
	}
	if m, cands := c.Match([]int32{1, 2, 3, 6}); m != 3 || !slices.Equal(cands, []int64{10, 12, 11, 15, 13, 17, 16}) {
		t.Errorf("after RollBackSequence(10, 2): Match([1 2 3 6]) = %d, %v, want 3, [10 12 11 15 13 17 16]\n%s", m, cands, c.Describe())
	}
	// So does an extension, even an empty one.
	c.ExtendSequence(12, nil)
	c.CommitSequenceExtension()
	if m, cands := c.Match([]int32{1, 2, 3, 6}); m != 3 || !slices.Equal(cands, []int64{12, 10, 11, 15, 13, 17, 16}) {
		t.Errorf("after an empty ExtendSequence(12): Match([1 2 3 6]) = %d, %v, want 3, [12 10 11 15 13 17 16]", m, cands)
	}
	// The fork candidate is the first in that order.
	res, err := c.InsertSequence(20, []int32{1, 2, 3, 6, 6}, NoWindow)
	if err != nil || res.Kind != Fork || res.Parent != 12 || res.Candidates != 7 {
		t.Errorf("InsertSequence(20, [1 2 3 6 6]) = %s, %v, want fork from 12 of 7", brief(res), err)
	}
	mustCheck(t, c)
}

// TestRadixPages follows MLC's page layout (Describe gives a node's pages after its span):
// pages of at most 64 tokens, a long sequence a chain of them; a split followed by the merges
// that fit; a sequence-less page with one child kept apart when the two do not fit in one
// page; a sequence-less leaf page extended in place.
func TestRadixPages(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 1, seqOf(1, 150), NoWindow)
	want := "" +
		"#0 +0 =0 [] hits=1\n" +
		"  #1 +150/64,64,22 =150 [1:active] hits=0\n"
	if got := c.Describe(); got != want {
		t.Fatalf("one sequence of 150 tokens: Describe() =\n%s\nwant\n%s", got, want)
	}
	// The fork at 100 splits the second page after 36 tokens; its lower part (28 tokens, no
	// sequence, one child) merges with the third (22): 50 tokens. The first two (64 and 36)
	// do not fit in one page.
	start(t, c, 2, cat(seqOf(1, 100), []int32{999}), NoWindow)
	want = "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +100/64,36 =100 [] hits=1\n" +
		"    #3 +1 =101 [2:active] hits=0\n" +
		"    #2 +50 =150 [1:active] hits=0\n"
	if got := c.Describe(); got != want {
		t.Fatalf("after forking at 100: Describe() =\n%s\nwant\n%s", got, want)
	}
	// 2 goes: the page of 36 is left with no sequence and one child, but 36 + 50 > 64: the
	// pages stay apart (in one node again).
	if err := c.RemoveSequence(2); err != nil {
		t.Fatal(err)
	}
	want = "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +150/64,36,50 =150 [1:active] hits=1\n"
	if got := c.Describe(); got != want {
		t.Fatalf("after removing 2: Describe() =\n%s\nwant\n%s", got, want)
	}
	// 1 grows by 20: its last page, a leaf with no sequence once 1 leaves it, fills up to 64
	// in place; the other 6 tokens take a new page.
	c.ExtendSequence(1, seqOf(151, 20))
	c.CommitSequenceExtension()
	want = "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +170/64,36,64,6 =170 [1:active] hits=1\n"
	if got := c.Describe(); got != want {
		t.Fatalf("after extending 1: Describe() =\n%s\nwant\n%s", got, want)
	}
	if m, cands := c.Match(seqOf(1, 170)); m != 170 || !slices.Equal(cands, []int64{1}) {
		t.Errorf("Match(1…170) = %d, %v, want 170, [1]", m, cands)
	}
	mustCheck(t, c)
}

// A child node of several pages lists its sequences after those of its one-page siblings:
// MatchPrefix meets them only when it walks below the child's first page.
func TestCandidateOrderOverPages(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	P := seqOf(1, 10)
	start(t, c, 1, cat(P, seqOf(100, 70)), NoWindow) // below P: 70 tokens, two pages
	start(t, c, 2, cat(P, seqOf(200, 5)), NoWindow)  // below P: one page, newer
	start(t, c, 3, cat(P, seqOf(300, 80)), NoWindow) // below P: two pages, the newest
	if m, cands := c.Match(cat(P, []int32{7})); m != 10 || !slices.Equal(cands, []int64{2, 1, 3}) {
		t.Errorf("Match(P+[7]) = %d, %v, want 10, [2 1 3]\n%s", m, cands, c.Describe())
	}
	mustCheck(t, c)
}

func TestRecycleCap(t *testing.T) {
	for _, tc := range []struct {
		order     EvictOrder
		max       int
		recycle   []int64
		recycling []int64
		evicted   []int64
	}{
		{EvictMLC, 0, []int64{1, 2, 3}, []int64{}, []int64{1, 2, 3}},
		{EvictMLC, 1, []int64{1, 2, 3}, []int64{3}, []int64{1, 2}},
		// Stamps 1 (3), 2 (1): the map's front is stamp 2, so 1 goes, not 3.
		{EvictMLC, 2, []int64{3, 1, 2}, []int64{2, 3}, []int64{1}},
		{EvictMLC, -1, []int64{3, 1, 2}, []int64{2, 1, 3}, nil},
		{EvictLRU, 0, []int64{1, 2, 3}, []int64{}, []int64{1, 2, 3}},
		{EvictLRU, 1, []int64{1, 2, 3}, []int64{3}, []int64{1, 2}},
		{EvictLRU, 2, []int64{3, 1, 2}, []int64{1, 2}, []int64{3}},
		{EvictLRU, -1, []int64{3, 1, 2}, []int64{3, 1, 2}, nil},
	} {
		var evicted []int64
		c := New(Config{MaxRecycling: tc.max, Evict: tc.order, OnEvict: func(ev Eviction) { evicted = append(evicted, ev.Seq) }})
		for id := int64(1); id <= 3; id++ {
			start(t, c, id, seqOf(int32(100*id), 10), NoWindow)
		}
		mustRecycle(t, c, tc.recycle...)
		if got := c.Recycling(); !slices.Equal(got, tc.recycling) || c.NumRecycling() != len(tc.recycling) {
			t.Errorf("%v, MaxRecycling %d: Recycling() = %v, want %v", tc.order, tc.max, got, tc.recycling)
		}
		if !slices.Equal(evicted, tc.evicted) {
			t.Errorf("%v, MaxRecycling %d: OnEvict calls = %v, want %v", tc.order, tc.max, evicted, tc.evicted)
		}
		for _, id := range tc.evicted {
			if c.HasSequence(id) {
				t.Errorf("%v, MaxRecycling %d: HasSequence(%d) = true after eviction, want false", tc.order, tc.max, id)
			}
		}
		if got := c.Stats().Evictions; got != uint64(len(tc.evicted)) {
			t.Errorf("%v, MaxRecycling %d: Stats().Evictions = %d, want %d", tc.order, tc.max, got, len(tc.evicted))
		}
		mustCheck(t, c)
	}
}

// TestEvictionOrder: every recycle stamps the sequence with the next counter value; a
// sequence taken over loses its stamp and gets a new one when recycled again. EvictMLC
// evicts in the order of libstdc++'s map of the stamps (below 13 entries: the most recently
// recycled first), EvictLRU the least recently recycled first, and Recycling lists the
// sequences in that order. Each eviction says what it passed over.
func TestEvictionOrder(t *testing.T) {
	for _, tc := range []struct {
		order EvictOrder
		want  []Eviction
	}{
		{EvictMLC, []Eviction{
			{Seq: 2, Recycled: 5, Oldest: 4, OldestRecycled: 2},
			{Seq: 3, Recycled: 4, Oldest: 4, OldestRecycled: 2},
			{Seq: 1, Recycled: 3, Oldest: 4, OldestRecycled: 2},
			{Seq: 4, Recycled: 2, Oldest: -1},
		}},
		{EvictLRU, []Eviction{
			{Seq: 4, Recycled: 2, Oldest: 1, OldestRecycled: 3},
			{Seq: 1, Recycled: 3, Oldest: 3, OldestRecycled: 4},
			{Seq: 3, Recycled: 4, Oldest: 2, OldestRecycled: 5},
			{Seq: 2, Recycled: 5, Oldest: -1},
		}},
	} {
		var evicted []Eviction
		c := New(Config{MaxRecycling: -1, Evict: tc.order, OnEvict: func(ev Eviction) { evicted = append(evicted, ev) }})
		P := seqOf(1, 30)
		for id := int64(1); id <= 4; id++ {
			start(t, c, id, cat(P, seqOf(int32(100*id), 2)), NoWindow)
		}
		mustRecycle(t, c, 2, 4, 1, 3) // stamps 1, 2, 3, 4
		// 2 is the only candidate: it is taken over and recycled again, stamp 5.
		res, adopted := start(t, c, 5, cat(P, seqOf(200, 2), []int32{7}), NoWindow)
		if res.Kind != Reuse || adopted != 2 {
			t.Fatalf("%v: InsertSequence(5, P+[200 201 7]) = %s, want reuse of 2", tc.order, brief(res))
		}
		mustRecycle(t, c, 2)
		var order []int64
		for _, ev := range tc.want {
			order = append(order, ev.Seq)
		}
		if got := c.Recycling(); !slices.Equal(got, order) {
			t.Fatalf("%v: Recycling() = %v, want %v", tc.order, got, order)
		}
		for range 4 {
			if !c.TryFreeMemory() {
				t.Fatalf("%v: TryFreeMemory() = false, want true", tc.order)
			}
		}
		if c.TryFreeMemory() {
			t.Errorf("%v: TryFreeMemory() on nothing recycling = true, want false", tc.order)
		}
		if !slices.Equal(evicted, tc.want) {
			t.Errorf("%v: OnEvict calls = %+v, want %+v", tc.order, evicted, tc.want)
		}
		for i, ev := range evicted {
			if want := ev.Oldest >= 0 && ev.OldestRecycled < ev.Recycled; ev.OlderKept() != want {
				t.Errorf("%v: eviction %d (%v): OlderKept() = %v, want %v", tc.order, i, ev, ev.OlderKept(), want)
			}
		}
		if got := len(c.Nodes()); got != 1 {
			t.Errorf("%v: len(Nodes()) = %d after evicting everything, want 1 (the root)\n%s", tc.order, got, c.Describe())
		}
		mustCheck(t, c)
	}
}

func TestDisabled(t *testing.T) {
	evictions := 0
	c := New(Config{Mode: Disabled, MaxRecycling: -1, OnEvict: func(Eviction) { evictions++ }})
	for i := range 2 {
		res, err := c.InsertSequence(1, seqOf(1, 10), NoWindow)
		if err != nil || brief(res) != "new offset=0 parent=-1 pop=0 matched=0 candidates=0" {
			t.Fatalf("call %d: InsertSequence(1, …) = %s, %v, want new", i, brief(res), err)
		}
	}
	c.ExtendSequence(1, seqOf(1, 10))
	c.CommitSequenceExtension()
	if c.HasSequence(1) {
		t.Errorf("HasSequence(1) = true, want false")
	}
	for name, err := range map[string]error{
		"RecycleSequence(1)":     c.RecycleSequence(1),
		"RollBackSequence(1, 0)": c.RollBackSequence(1, 0),
		"RemoveSequence(1)":      c.RemoveSequence(1),
	} {
		if !errors.Is(err, ErrUnknownSequence) {
			t.Errorf("%s = %v, want %v", name, err, ErrUnknownSequence)
		}
	}
	if c.TryFreeMemory() {
		t.Errorf("TryFreeMemory() = true, want false")
	}
	if got := c.Recycling(); len(got) != 0 || c.NumRecycling() != 0 {
		t.Errorf("Recycling() = %v, NumRecycling() = %d, want none", got, c.NumRecycling())
	}
	if m, cands := c.Match(seqOf(1, 10)); m != 0 || cands != nil {
		t.Errorf("Match(…) = %d, %v, want 0, nil", m, cands)
	}
	if st := c.Stats(); st != (Stats{}) || evictions != 0 {
		t.Errorf("Stats() = %+v, evictions %d, want zero", st, evictions)
	}
	if _, err := c.InsertSequence(1, nil, NoWindow); !errors.Is(err, ErrEmptyTokens) {
		t.Errorf("InsertSequence(1, nil) = %v, want %v", err, ErrEmptyTokens)
	}
}

// TestBadCallsChangeNothing: every bad call returns its error and leaves the cache as it was,
// pending extensions included.
func TestBadCallsChangeNothing(t *testing.T) {
	c := New(Config{MaxRecycling: 2})
	start(t, c, 1, seqOf(1, 10), NoWindow)
	start(t, c, 2, seqOf(1, 5), NoWindow)
	mustRecycle(t, c, 2)
	c.ExtendSequence(1, []int32{77, 78}) // pending: a bad call must not commit it
	before, stats := c.Describe(), c.Stats()
	for _, tc := range []struct {
		call string
		err  error
		want error
	}{
		{"InsertSequence(1, …)", second(c.InsertSequence(1, seqOf(1, 3), NoWindow)), ErrSequenceExists},
		{"InsertSequence(2, …)", second(c.InsertSequence(2, seqOf(1, 3), NoWindow)), ErrSequenceExists},
		{"InsertSequence(3, nil)", second(c.InsertSequence(3, nil, NoWindow)), ErrEmptyTokens},
		{"InsertSequence(-1, …)", second(c.InsertSequence(-1, seqOf(1, 3), NoWindow)), ErrBadID},
		{"InsertSequence(3, …, {0 0})", second(c.InsertSequence(3, seqOf(1, 3), Window{})), ErrBadWindow},
		{"InsertSequence(3, …, {4 -1})", second(c.InsertSequence(3, seqOf(1, 3), Window{4, -1})), ErrBadWindow},
		{"RecycleSequence(2)", c.RecycleSequence(2), ErrNotActive},
		{"RecycleSequence(9)", c.RecycleSequence(9), ErrUnknownSequence},
		{"RollBackSequence(9, 1)", c.RollBackSequence(9, 1), ErrUnknownSequence},
		{"RollBackSequence(1, 13)", c.RollBackSequence(1, 13), ErrBadLength}, // 10 + 2 pending
		{"RollBackSequence(1, -1)", c.RollBackSequence(1, -1), ErrBadLength},
		{"RemoveSequence(9)", c.RemoveSequence(9), ErrUnknownSequence},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s = %v, want %v", tc.call, tc.err, tc.want)
		}
	}
	if after := c.Describe(); after != before || c.Stats() != stats {
		t.Errorf("bad calls changed the cache:\n%s\nwant\n%s", after, before)
	}
	if l, _, _ := c.Sequence(1); l != 10 {
		t.Errorf("Sequence(1) = %d before the commit, want 10", l)
	}
	// Rolling back all of it, pending tokens included, is allowed.
	if err := c.RollBackSequence(1, 12); err != nil {
		t.Errorf("RollBackSequence(1, 12) = %v, want nil", err)
	}
	if l, _, _ := c.Sequence(1); l != 0 {
		t.Errorf("Sequence(1) = %d after rolling back 12 of 12, want 0", l)
	}
	mustCheck(t, c)
}

func second(_ Result, err error) error { return err }

func TestExtendIsLazy(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 1, seqOf(1, 4), NoWindow)
	toks := []int32{50, 51}
	c.ExtendSequence(1, toks)
	toks[0] = 99 // the cache copied them
	c.ExtendSequence(1, nil)
	c.ExtendSequence(7, []int32{1}) // not held: skipped at the commit
	if l, _, _ := c.Sequence(1); l != 4 {
		t.Errorf("Sequence(1) = %d before the commit, want 4", l)
	}
	if m, _ := c.Match([]int32{1, 2, 3, 4, 50}); m != 4 {
		t.Errorf("Match(…50) = %d before the commit, want 4", m)
	}
	c.CommitSequenceExtension()
	if m, _ := c.Match([]int32{1, 2, 3, 4, 50, 51}); m != 6 {
		t.Errorf("Match(…50 51) = %d after the commit, want 6", m)
	}
	// A removed sequence's extension is skipped; RemoveSequence commits first.
	c.ExtendSequence(1, []int32{52})
	if err := c.RemoveSequence(1); err != nil {
		t.Fatal(err)
	}
	c.CommitSequenceExtension()
	if c.HasSequence(1) || c.HasSequence(7) || len(c.Nodes()) != 1 {
		t.Errorf("after removing 1: HasSequence(1) = %v, HasSequence(7) = %v, %d nodes, want false, false, 1", c.HasSequence(1), c.HasSequence(7), len(c.Nodes()))
	}
	// InsertSequence commits first.
	start(t, c, 2, seqOf(1, 4), NoWindow)
	c.ExtendSequence(2, []int32{60, 61})
	res, _ := c.InsertSequence(3, []int32{1, 2, 3, 4, 60, 61, 62}, NoWindow)
	if res.Kind != Fork || res.Offset != 6 {
		t.Errorf("InsertSequence(3, …60 61 62) = %s, want fork at 6", brief(res))
	}
	mustCheck(t, c)
}

// TestTreeShape follows the pages through splits, roll-backs and merges.
// ExtendSequence copies the tokens, however long: the caller may reuse its slice at once.
func TestExtendCopies(t *testing.T) {
	for _, n := range []int{1, 3, 64, 65, 500} {
		c := New(Config{MaxRecycling: -1})
		// 1 is alone at a leaf, 2 empty at the root.
		start(t, c, 1, seqOf(1, 4), NoWindow)
		if _, err := c.InsertSequence(2, []int32{9}, NoWindow); err != nil {
			t.Fatal(err)
		}
		toks := seqOf(100, n)
		c.ExtendSequence(1, toks)
		c.ExtendSequence(2, toks)
		for i := range toks {
			toks[i] = -1
		}
		c.CommitSequenceExtension()
		for _, q := range [][]int32{cat(seqOf(1, 4), seqOf(100, n)), seqOf(100, n)} {
			if m, _ := c.Match(q); m != len(q) {
				t.Errorf("%d tokens: Match(%v…) = %d, want %d", n, q[0], m, len(q))
			}
		}
		mustCheck(t, c)
	}
}

// An extension queued for a sequence that is then evicted (TryFreeMemory does not commit)
// is skipped, even when the id is inserted again: InsertSequence commits before it adds id.
func TestEvictedSequenceLosesItsExtension(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 1, seqOf(100, 8), NoWindow)
	mustRecycle(t, c, 1)
	c.ExtendSequence(1, []int32{7, 8, 9})
	if !c.TryFreeMemory() {
		t.Fatal("TryFreeMemory() = false, want 1 evicted")
	}
	res, err := c.InsertSequence(1, seqOf(200, 4), NoWindow)
	if err != nil || res.Kind != Fresh {
		t.Fatalf("InsertSequence(1, …) = %s, %v, want new", brief(res), err)
	}
	c.CommitSequenceExtension()
	if l, _, _ := c.Sequence(1); l != 0 {
		t.Errorf("Sequence(1) = %d tokens, want 0: the old 1's extension is not the new 1's", l)
	}
	if m, _ := c.Match([]int32{7, 8, 9}); m != 0 {
		t.Errorf("Match(7 8 9) = %d, want 0", m)
	}
	mustCheck(t, c)
}

func TestTreeShape(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 1, []int32{1, 2, 3, 4, 5, 6}, NoWindow)
	start(t, c, 2, []int32{1, 2, 3, 7, 8}, NoWindow)
	// The fork splits #1 at 3: #1 keeps [1 2 3], #2 takes [4 5 6] and 1; 2's tokens go to
	// a new child, the newest, listed first.
	want := "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +3 =3 [] hits=1\n" +
		"    #3 +2 =5 [2:active] hits=0\n" +
		"    #2 +3 =6 [1:active] hits=0\n"
	if got := c.Describe(); got != want {
		t.Fatalf("Describe() =\n%s\nwant\n%s", got, want)
	}
	// 1 moves up to [1 2]: #2 is left empty and goes; #1 splits into #1 [1 2] and #4 [3],
	// which holds nothing and has one child, so it absorbs #3.
	if err := c.RollBackSequence(1, 4); err != nil {
		t.Fatal(err)
	}
	want = "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +2 =2 [1:active] hits=1\n" +
		"    #4 +3 =5 [2:active] hits=1\n"
	if got := c.Describe(); got != want {
		t.Fatalf("after RollBackSequence(1, 4): Describe() =\n%s\nwant\n%s", got, want)
	}
	// 1 follows 2's path and stops inside it: #4 splits into #4 [3 7] and #5 [8]; #1, left
	// with nothing and one child, absorbs #4.
	c.ExtendSequence(1, []int32{3, 7})
	c.CommitSequenceExtension()
	want = "" +
		"#0 +0 =0 [] hits=2\n" +
		"  #1 +4 =4 [1:active] hits=1\n" +
		"    #5 +1 =5 [2:active] hits=1\n"
	if got := c.Describe(); got != want {
		t.Fatalf("after extending 1 by [3 7]: Describe() =\n%s\nwant\n%s", got, want)
	}
	up, rm := c.TakeChanges()
	if !slices.Equal(nodeIDs(up), []NodeID{0, 1, 5}) || !slices.Equal(rm, nil) {
		t.Errorf("TakeChanges() = %v, %v, want [0 1 5], [] (2, 3 and 4 came and went)", nodeIDs(up), rm)
	}
	if err := c.RemoveSequence(1); err != nil {
		t.Fatal(err)
	}
	up, rm = c.TakeChanges()
	if !slices.Equal(nodeIDs(up), []NodeID{1}) || !slices.Equal(rm, []NodeID{5}) {
		t.Errorf("after RemoveSequence(1): TakeChanges() = %v, %v, want [1], [5]", nodeIDs(up), rm)
	}
	if got, want := c.Nodes()[1], (Node{ID: 1, Parent: 0, Order: order(1), Depth: 5, Span: 5, Seqs: []SeqRef{{2, Active}}, Hits: 1}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Nodes()[1] = %+v, want %+v", got, want)
	}
	mustCheck(t, c)
}

func TestResultPathAndHits(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	start(t, c, 1, []int32{1, 2, 3, 4, 5, 6}, NoWindow)
	res, _ := start(t, c, 2, []int32{1, 2, 3, 9, 9}, NoWindow) // splits #1 at 3: #1 [1 2 3], #2 [4 5 6]
	if !slices.Equal(res.Path, []NodeID{1}) {
		t.Errorf("InsertSequence(2, [1 2 3 9 9]).Path = %v, want [1]", res.Path)
	}
	res, _ = start(t, c, 3, []int32{1, 2, 3, 4, 5, 7}, NoWindow) // splits #2 at 5: #2 [4 5], #4 [6]
	if !slices.Equal(res.Path, []NodeID{1, 2}) {
		t.Errorf("InsertSequence(3, [1 2 3 4 5 7]).Path = %v, want [1 2]", res.Path)
	}
	hits := map[NodeID]uint64{}
	for _, n := range c.Nodes() {
		hits[n.ID] = n.Hits
	}
	if want := map[NodeID]uint64{0: 3, 1: 2, 2: 1, 3: 0, 4: 0, 5: 0}; fmt.Sprint(hits) != fmt.Sprint(want) {
		t.Errorf("hits = %v, want %v\n%s", hits, want, c.Describe())
	}
	st := c.Stats()
	if want := (Stats{QueryTokens: 17, HitTokens: 8, Inserts: 3, Forks: 2}); st != want {
		t.Errorf("Stats() = %+v, want %+v", st, want)
	}
}

func TestNodeIDsNotReused(t *testing.T) {
	c := New(Config{MaxRecycling: 0})
	seen := map[NodeID]bool{}
	for id := range int64(20) {
		start(t, c, id, seqOf(int32(id%3), 5), NoWindow)
		for _, n := range c.Nodes() {
			seen[n.ID] = true
		}
		if id%2 == 1 {
			mustRecycle(t, c, id, id-1)
		}
	}
	up, rm := c.TakeChanges()
	for _, n := range up {
		if n.ID != 0 && seen[n.ID] && slices.Contains(rm, n.ID) {
			t.Errorf("node %d both upserted and removed", n.ID)
		}
	}
	if int(c.t.nextID) < len(seen) {
		t.Errorf("nextID = %d, but %d ids seen", c.t.nextID, len(seen))
	}
}

// TestReuseChoiceMatchesNaiveScan builds large trees with many recycling sequences, so that
// the pruned walk of findReuse has subtrees to skip, and compares every choice with a naive
// scan of the candidates in the documented order.
func TestReuseChoiceMatchesNaiveScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := range 20 {
		c := New(Config{MaxRecycling: -1})
		prompts := make([][]int32, 4)
		for i := range prompts {
			prompts[i] = seqOf(int32(1000*i), 20+rng.IntN(40))
		}
		id := int64(0)
		for range 300 {
			p := prompts[rng.IntN(len(prompts))]
			toks := cat(p[:rng.IntN(len(p)+1)], randTokens(rng, 1+rng.IntN(12)))
			_, adopted := start(t, c, id, toks, NoWindow)
			id++
			if rng.IntN(3) > 0 {
				mustRecycle(t, c, adopted)
			}
		}
		for range 100 {
			p := prompts[rng.IntN(len(prompts))]
			toks := cat(p[:rng.IntN(len(p)+1)], randTokens(rng, 1+rng.IntN(4)))
			m, cands := c.Match(toks[:len(toks)-1])
			var best int64 = -1
			bestLen := 0
			for _, cid := range cands {
				l, st, _ := c.Sequence(cid)
				if st == Recycling && (best < 0 || l < bestLen) {
					best, bestLen = cid, l
				}
			}
			wantKind, wantParent := Fork, int64(-1)
			if m == 0 {
				wantKind = Fresh
			} else if best >= 0 && float64(m) > 0.9*float64(bestLen) {
				wantKind, wantParent = Reuse, best
			} else {
				wantParent = cands[0]
			}
			res, err := c.InsertSequence(id, toks, NoWindow)
			if err != nil || res.Kind != wantKind || res.Parent != wantParent || res.Matched != m || res.Candidates != len(cands) {
				t.Fatalf("round %d: InsertSequence(%d, %v) = %s, %v, want %v from %d (m %d, %d candidates)", round, id, toks, brief(res), err, wantKind, wantParent, m, len(cands))
			}
			id++
		}
		mustCheck(t, c)
	}
}

// longestReusable(m) is the bound the reuse search prunes with: the longest sequence that
// passes MLC's test for a match of m tokens, in double precision.
func TestLongestReusable(t *testing.T) {
	for m := 1; m <= 100_000; m++ {
		l := longestReusable(m)
		if !reusable(m, l) || reusable(m, l+1) {
			t.Fatalf("longestReusable(%d) = %d: reusable there %v, one longer %v", m, l, reusable(m, l), reusable(m, l+1))
		}
	}
	// 9 > 0.9*10 fails in double precision (0.9*10 rounds to 9), so 9 tokens reuse 9 but
	// not 10; 10 tokens reuse 11 (9.9).
	for _, c := range []struct{ m, want int }{{1, 1}, {9, 9}, {10, 11}, {90, 99}, {100, 111}} {
		if got := longestReusable(c.m); got != c.want {
			t.Errorf("longestReusable(%d) = %d, want %d", c.m, got, c.want)
		}
	}
}

func randTokens(rng *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(5))
	}
	return out
}

func TestLCP(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		n := rng.IntN(3000)
		a := randTokens(rng, n)
		b := slices.Clone(a)
		cut := rng.IntN(n + 1)
		if cut < n {
			b[cut]++
		}
		b = b[:rng.IntN(n+1)]
		if got, want := lcp(a, b), refLCP(a, b); got != want {
			t.Fatalf("lcp(%d tokens, %d tokens differing at %d) = %d, want %d", len(a), len(b), cut, got, want)
		}
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Active.String(), "active"}, {Recycling.String(), "recycling"},
		{Fresh.String(), "new"}, {Fork.String(), "fork"}, {Reuse.String(), "reuse"},
		{Radix.String(), "radix"}, {Disabled.String(), "disabled"},
		{State(9).String(), "State(9)"}, {Kind(9).String(), "Kind(9)"}, {Mode(9).String(), "Mode(9)"},
		{EvictMLC.String(), "mlc"}, {EvictLRU.String(), "lru"}, {EvictOrder(9).String(), "EvictOrder(9)"},
		{Eviction{Seq: 5, Recycled: 3, Oldest: 2, OldestRecycled: 1}.String(), "evicted 5 (recycled #3), 2 recycled earlier (#1) stays"},
		{Eviction{Seq: 2, Recycled: 1, Oldest: 5, OldestRecycled: 3}.String(), "evicted 2 (recycled #1)"},
	} {
		if tc.got != tc.want {
			t.Errorf("String() = %q, want %q", tc.got, tc.want)
		}
	}
}

// TestOnEvictSeesAConsistentCache: OnEvict runs once the cache is consistent (the sequence
// is gone, the invariants hold), and RemoveSequence does not call it.
func TestOnEvictSeesAConsistentCache(t *testing.T) {
	var c *Cache
	var calls []string
	c = New(Config{MaxRecycling: 1, OnEvict: func(ev Eviction) {
		calls = append(calls, fmt.Sprintf("%d held=%v check=%v recycling=%v", ev.Seq, c.HasSequence(ev.Seq), c.Check(), c.Recycling()))
	}})
	start(t, c, 1, seqOf(10, 5), NoWindow)
	start(t, c, 2, seqOf(20, 5), NoWindow)
	start(t, c, 3, seqOf(30, 5), NoWindow)
	mustRecycle(t, c, 1, 2) // 2 evicts 1
	if err := c.RemoveSequence(3); err != nil {
		t.Fatal(err)
	}
	if want := []string{"1 held=false check=<nil> recycling=[2]"}; !slices.Equal(calls, want) {
		t.Errorf("OnEvict calls = %q, want %q", calls, want)
	}
}

func TestNodeJSONRoundTrip(t *testing.T) {
	in := Node{ID: 3, Parent: 1, Order: 2, Depth: 9, Span: 4, Seqs: []SeqRef{{7, Active}, {8, Recycling}}, Hits: 5}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":3,"parent":1,"order":2,"depth":9,"span":4,"seqs":[{"id":7,"state":"active"},{"id":8,"state":"recycling"}],"hits":5}`
	if string(b) != want {
		t.Errorf("json.Marshal(%+v) = %s, want %s", in, b, want)
	}
	var out Node
	if err := json.Unmarshal(b, &out); err != nil || fmt.Sprint(out) != fmt.Sprint(in) {
		t.Errorf("json.Unmarshal(%s) = %+v, %v, want %+v", b, out, err, in)
	}
	for _, o := range []EvictOrder{EvictMLC, EvictLRU} {
		var got EvictOrder
		if text, _ := o.MarshalText(); got.UnmarshalText(text) != nil || got != o {
			t.Errorf("EvictOrder %v does not round-trip through its text: %v", o, got)
		}
	}
	var o EvictOrder
	if err := o.UnmarshalText([]byte("fifo")); err == nil {
		t.Errorf("EvictOrder.UnmarshalText(fifo) = nil error, want an error")
	}
	var k Kind
	if err := k.UnmarshalText([]byte("fork")); err != nil || k != Fork {
		t.Errorf("Kind.UnmarshalText(fork) = %v, %v, want fork", k, err)
	}
	if err := k.UnmarshalText([]byte("spoon")); err == nil {
		t.Errorf("Kind.UnmarshalText(spoon) = nil error, want an error")
	}
}

// A node with many children indexes them by first token; the index follows insertions,
// removals, cuts and joins, and finds what a scan of MLC's child list finds.
func TestManyChildren(t *testing.T) {
	c := New(Config{MaxRecycling: -1})
	P := seqOf(1, 70) // two pages: the children hang below the second
	alive := map[int64]bool{}
	for i := range int64(40) {
		start(t, c, i, cat(P, []int32{int32(1000 + i), 5, 5}), NoWindow)
		alive[i] = true
	}
	mustCheck(t, c)
	for i := int64(0); i < 40; i += 3 {
		if err := c.RemoveSequence(i); err != nil {
			t.Fatal(err)
		}
		delete(alive, i)
	}
	mustCheck(t, c)
	// A fork inside P cuts the node holding the children: they move below the cut.
	start(t, c, 100, cat(seqOf(1, 30), []int32{7}), NoWindow)
	mustCheck(t, c)
	for i := range int64(40) {
		if alive[i] {
			if m, cands := c.Match(cat(P, []int32{int32(1000 + i), 5})); m != 72 || !slices.Equal(cands, []int64{i}) {
				t.Errorf("Match(P+[%d 5]) = %d, %v, want 72, [%d]", 1000+i, m, cands, i)
			}
			continue
		}
		m, cands := c.Match(cat(P, []int32{int32(1000 + i)}))
		if got := slices.Sorted(slices.Values(cands)); m != 70 || !slices.Equal(got, slices.Sorted(maps.Keys(alive))) {
			t.Errorf("Match(P+[%d]) = %d, %v, want 70 and the %d sequences below P", 1000+i, m, cands, len(alive))
		}
	}
	// Removing all but one child leaves a node with no sequence and one child: it joins it.
	for i := range alive {
		if i != 38 {
			if err := c.RemoveSequence(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustCheck(t, c)
	if m, cands := c.Match(cat(P, []int32{1038, 5, 5})); m != 73 || !slices.Equal(cands, []int64{38}) {
		t.Errorf("Match(P+[1038 5 5]) = %d, %v, want 73, [38]\n%s", m, cands, c.Describe())
	}
	if got := len(c.Nodes()); got != 4 {
		t.Errorf("len(Nodes()) = %d, want 4: the root, [1…30], [31…70 1038 5 5] and [7]\n%s", got, c.Describe())
	}
}
