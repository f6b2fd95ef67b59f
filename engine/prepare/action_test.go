package prepare

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
)

// fixture is a decode instance reduced to what the action touches: one or more paged KV
// caches, the prefix cache and the id manager.
type fixture struct {
	t      *testing.T
	caches []*pages.Cache
	pc     *prefix.Cache
	ids    IDs
	act    *Action
}

type fixtureConfig struct {
	maxTotal     int
	maxNumSeq    int
	watermark    int
	models       int
	disabled     bool
	maxRecycling int
	evict        prefix.EvictOrder
}

func newFixture(t *testing.T, fc fixtureConfig) *fixture {
	t.Helper()
	if fc.maxNumSeq == 0 {
		fc.maxNumSeq = 4
	}
	if fc.models == 0 {
		fc.models = 1
	}
	if fc.watermark == 0 {
		fc.watermark = DefaultWatermark
	}
	if fc.maxRecycling == 0 {
		fc.maxRecycling = -1
	}
	f := &fixture{t: t}
	for range fc.models {
		c, err := pages.New(pages.Config{PageSize: 16, NumPages: pages.NumPagesFor(fc.maxTotal, 16, fc.maxNumSeq, false)})
		if err != nil {
			t.Fatal(err)
		}
		f.caches = append(f.caches, c)
	}
	mode := prefix.Radix
	if fc.disabled {
		mode = prefix.Disabled
	}
	f.pc = prefix.New(prefix.Config{Mode: mode, MaxRecycling: fc.maxRecycling, Evict: fc.evict, OnEvict: func(ev prefix.Eviction) {
		for _, c := range f.caches {
			if err := c.RemoveSequence(ev.Seq); err != nil {
				t.Fatalf("evict %d: %v", ev.Seq, err)
			}
		}
	}})
	var err error
	f.act, err = New(Config{
		PageSize: 16, MaxNumSequence: fc.maxNumSeq, MaxTotalSequenceLength: fc.maxTotal,
		PrefillChunkSize: 1024, Watermark: fc.watermark, SpecFactor: 1,
	}, f.caches, f.pc, &f.ids)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// outcome is what one step of the action did with a queue.
type outcome struct {
	Admitted []Prepared
	Blocked  *Evaluation
}

// step is one step's prepare-receive over a FIFO queue, as the engine runs it: admit from the
// head until one request is blocked, then queue the admitted requests' prefix-cache
// extensions (after the step, as MLC does).
func (f *fixture) step(running int, queue []Request) outcome {
	var out outcome
	for _, req := range queue {
		p, ev := f.act.Admit(running, req)
		if ev.Blocked() {
			out.Blocked = &ev
			break
		}
		out.Admitted = append(out.Admitted, p)
	}
	for _, p := range out.Admitted {
		if len(p.Extension) > 0 && f.pc.HasSequence(p.Seq) {
			f.pc.ExtendSequence(p.Seq, p.Extension)
		}
	}
	return out
}

// tokens returns n token ids: the first shared of them are 1000+i (a prefix other prompts
// made with the same call share), the rest distinct per salt.
func tokens(n, shared, salt int) []int32 {
	out := make([]int32, n)
	for i := range out {
		if i < shared {
			out[i] = int32(1000 + i)
		} else {
			out[i] = int32(100000*salt + i)
		}
	}
	return out
}

// prep admits one request that must be admitted.
func (f *fixture) prep(id string, prompt []int32, end int) Prepared {
	f.t.Helper()
	out := f.step(0, []Request{{ID: id, Prompt: prompt, End: end, HasEnd: true}})
	if len(out.Admitted) != 1 {
		f.t.Fatalf("prep %s: not admitted: %v", id, out.Blocked)
	}
	return out.Admitted[0]
}

// finish plays the rest of a request whose tail is one token: start_generate commits the
// last prompt token, and maxTokens decode steps feed it and the generated tokens but the
// last; then the sequence is recycled (or removed when the prefix cache does not hold it).
func (f *fixture) finish(p Prepared, prompt []int32, maxTokens int) {
	f.t.Helper()
	fed := []int32{prompt[len(prompt)-1]}
	for i := 1; i < maxTokens; i++ {
		fed = append(fed, int32(900000+i))
	}
	for _, tok := range fed {
		for _, c := range f.caches {
			if _, err := c.ReserveAppend(p.Seq, 1, nil); err != nil {
				f.t.Fatal(err)
			}
		}
		if f.pc.HasSequence(p.Seq) {
			f.pc.ExtendSequence(p.Seq, []int32{tok})
		}
	}
	if f.pc.HasSequence(p.Seq) {
		if err := f.pc.RecycleSequence(p.Seq); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	for _, c := range f.caches {
		if err := c.RemoveSequence(p.Seq); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fixture) free() int { return f.caches[0].NumAvailablePages() }

func checkPrepared(t *testing.T, name string, p Prepared, wantMeta []int64, wantB64 string, wantMatched int) {
	t.Helper()
	if !slices.Equal(p.Metadata, wantMeta) {
		t.Errorf("%s: metadata = %v, want %v", name, p.Metadata, wantMeta)
	}
	if p.Encoded != wantB64 {
		t.Errorf("%s: kv_append_metadata = %q, want %q", name, p.Encoded, wantB64)
	}
	if p.Matched != wantMatched {
		t.Errorf("%s: prefix_matched_length = %d, want %d", name, p.Matched, wantMatched)
	}
}

// Spec section 9, examples 1-5 and 7-9, through the action.
func TestWorkedExample1FreshEngine(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192})
	if got := f.free(); got != 513 {
		t.Fatalf("free pages on a fresh 8192-token cache = %d, want 513", got)
	}
	p := f.prep("A", tokens(40, 0, 1), -1)
	checkPrepared(t, "example 1", p, []int64{1, 0, 39}, "CAAAAAAAAABbMSwwLDM5XQ==", 0)
	if p.PromptLength != 40 || p.End != 39 {
		t.Errorf("example 1: prompt_length, end = %d, %d, want 40, 39", p.PromptLength, p.End)
	}
	if got := f.free(); got != 510 {
		t.Errorf("example 1: free pages = %d, want 510", got)
	}
	if got := f.caches[0].TotalSequenceLength(); got != 39 {
		t.Errorf("example 1: total sequence length = %d, want 39", got)
	}
	if p.PagesTaken != 3 || p.Match.Kind != prefix.Fresh {
		t.Errorf("example 1: pages taken %d, match %v, want 3, new", p.PagesTaken, p.Match.Kind)
	}
}

func TestWorkedExamples2And3Fork(t *testing.T) {
	for _, tc := range []struct {
		shared   int
		meta     []int64
		b64      string
		copied   int32
		pagesNew int
	}{
		{16, []int64{1, 48, 23}, "CQAAAAAAAABbMSw0OCwyM10=", -1, 2},
		{20, []int64{1, 52, 19}, "CQAAAAAAAABbMSw1MiwxOV0=", 3, 2},
	} {
		f := newFixture(t, fixtureConfig{maxTotal: 8192})
		a := f.prep("A", tokens(40, 40, 0), -1)
		b := f.prep("B", tokens(40, tc.shared, 2), -1)
		name := fmt.Sprintf("fork sharing %d", tc.shared)
		checkPrepared(t, name, b, tc.meta, tc.b64, tc.shared)
		if b.Match.Kind != prefix.Fork || b.Match.Parent != a.Seq {
			t.Errorf("%s: match = %v from %d, want fork from %d", name, b.Match.Kind, b.Match.Parent, a.Seq)
		}
		if b.CopiedPage != tc.copied {
			t.Errorf("%s: copied page = %d, want %d", name, b.CopiedPage, tc.copied)
		}
		if got := f.free(); got != 513-3-tc.pagesNew {
			t.Errorf("%s: free pages = %d, want %d", name, got, 513-3-tc.pagesNew)
		}
	}
}

func TestWorkedExample4SegmentsFromReuse(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192, disabled: true})
	a := f.prep("A", tokens(21, 0, 1), -1)
	checkPrepared(t, "example 4 A", a, []int64{1, 0, 20}, Encode([]int64{1, 0, 20}), 0)
	if err := f.caches[0].RemoveSequence(a.Seq); err != nil {
		t.Fatal(err)
	}
	b := f.prep("B", tokens(41, 0, 2), -1)
	checkPrepared(t, "example 4 B", b, []int64{3, 16, 16, 0, 16, 32, 8}, "EwAAAAAAAABbMywxNiwxNiwwLDE2LDMyLDhd", 0)
}

func TestWorkedExample5Reuse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxTokens int
		kind      prefix.Kind
		meta      []int64
		b64       string
	}{
		{"A finished at 41 tokens", 2, prefix.Reuse, []int64{1, 38, 1}, "CAAAAAAAAABbMSwzOCwxXQ=="},
		{"A finished at 44 tokens", 5, prefix.Fork, []int64{1, 54, 1}, Encode([]int64{1, 54, 1})},
	} {
		f := newFixture(t, fixtureConfig{maxTotal: 8192})
		prompt := tokens(40, 40, 0)
		a := f.prep("A", prompt, -1)
		f.finish(a, prompt, tc.maxTokens)
		b := f.prep("B", prompt, -1)
		checkPrepared(t, tc.name, b, tc.meta, tc.b64, 38)
		if b.Match.Kind != tc.kind || b.Match.Parent != a.Seq {
			t.Errorf("%s: match = %v of %d, want %v of %d", tc.name, b.Match.Kind, b.Match.Parent, tc.kind, a.Seq)
		}
		if tc.kind == prefix.Reuse {
			if b.Seq != a.Seq || b.Match.Pop != 3 {
				t.Errorf("%s: seq %d pop %d, want A's seq %d, pop 3", tc.name, b.Seq, b.Match.Pop, a.Seq)
			}
			if got := f.ids.New(); got != 1 {
				t.Errorf("%s: next id = %d, want 1 (B's own id recycled)", tc.name, got)
			}
		}
		if got, _ := f.caches[0].SequenceLength(b.Seq); got != 39 {
			t.Errorf("%s: B's sequence length = %d, want 39", tc.name, got)
		}
	}
}

func TestWorkedExample7ForkAtFullAlignedLength(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192})
	prompt := tokens(33, 33, 0)
	a := f.prep("A", prompt, -1) // 32 tokens on pages 0, 1
	// B extends A's prompt: the match covers all 32 of A's tokens.
	b := f.prep("B", tokens(38, 33, 0), -1)
	checkPrepared(t, "example 7 child", b, []int64{1, 32, 5}, Encode([]int64{1, 32, 5}), 32)
	slots, err := f.caches[0].ReserveAppend(a.Seq, 1, nil)
	if err != nil || !slices.Equal(pages.Compress(nil, slots), []int64{1, 48, 1}) {
		t.Errorf("example 7: parent appends 1 = %v, %v, want [1 48 1]", pages.Compress(nil, slots), err)
	}
}

func TestWorkedExample8Capacity(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192})
	var queue []Request
	for i := range 40 {
		queue = append(queue, Request{ID: fmt.Sprintf("r-%d", i), Prompt: tokens(40, 0, i+1), End: -1, HasEnd: true})
	}
	out := f.step(0, queue)
	if len(out.Admitted) != 37 {
		t.Fatalf("admitted %d in one step, want 37", len(out.Admitted))
	}
	for i, p := range out.Admitted {
		if p.Request != queue[i].ID {
			t.Errorf("admitted[%d] = %s, want %s (FIFO)", i, p.Request, queue[i].ID)
		}
	}
	if out.Blocked == nil || out.Blocked.Request != "r-37" || out.Blocked.Reason != ReasonWatermark {
		t.Fatalf("blocked = %+v, want r-37 by the watermark", out.Blocked)
	}
	if got, want := out.Blocked.String(), "watermark: needs 3 + 400 pages, 402 free; nothing is recycling, eviction cannot help"; got != want {
		t.Errorf("blocked reason = %q, want %q", got, want)
	}
	// With MLC's defaults, nothing is ever admitted.
	g := newFixture(t, fixtureConfig{maxTotal: 4096})
	out = g.step(0, queue[:1])
	if len(out.Admitted) != 0 || out.Blocked == nil || out.Blocked.Reason != ReasonWatermark {
		t.Errorf("MLC defaults: admitted %d, blocked %v, want none, watermark", len(out.Admitted), out.Blocked)
	}
	if got, want := out.Blocked.Short(), "watermark 403 > 257 free"; got != want {
		t.Errorf("MLC defaults: short reason = %q, want %q", got, want)
	}
}

func TestWorkedExample9EndZero(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192})
	p := f.prep("A", tokens(40, 0, 1), 0)
	checkPrepared(t, "example 9", p, []int64{0}, "AwAAAAAAAABbMF0=", 0)
	if got, _ := f.caches[0].SequenceLength(p.Seq); got != 0 || p.PagesTaken != 0 {
		t.Errorf("example 9: sequence length %d, pages taken %d, want 0, 0", got, p.PagesTaken)
	}
	if f.pc.HasSequence(p.Seq) {
		t.Errorf("example 9: the prefix cache holds the sequence of an empty match")
	}
}

func TestDraftModelArraysConcatenate(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192, models: 2})
	p := f.prep("A", tokens(40, 0, 1), -1)
	if want := []int64{1, 0, 39, 1, 0, 39}; !slices.Equal(p.Metadata, want) {
		t.Errorf("two models: metadata = %v, want %v", p.Metadata, want)
	}
	md, err := Split(p.Metadata)
	if err != nil || len(md) != 2 || md.Tokens() != 39 {
		t.Errorf("Split = %v, %v, want two groups of 39 tokens", md, err)
	}
}

// The blocked reasons of spec 5.2, with their numbers.
func TestBlockedReasons(t *testing.T) {
	t.Run("watermark", func(t *testing.T) {
		f := newFixture(t, fixtureConfig{maxTotal: 8192})
		var first Prepared
		for i := range 37 { // 37 × 3 = 111 pages: 402 free
			p := f.prep(fmt.Sprint("f-", i), tokens(40, 0, i+1), -1)
			if i == 0 {
				first = p
			}
		}
		// Decoding takes 14 more pages.
		if _, err := f.caches[0].ReserveAppend(first.Seq, 14*16, nil); err != nil {
			t.Fatal(err)
		}
		ev := f.act.Evaluate(0, Request{ID: "x", Prompt: tokens(40, 0, 99), End: -1, HasEnd: true})
		if got, want := ev.String(), "watermark: needs 3 + 400 pages, 388 free; nothing is recycling, eviction cannot help"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
	t.Run("batch", func(t *testing.T) {
		f := newFixture(t, fixtureConfig{maxTotal: 8192})
		out := f.step(4, []Request{{ID: "x", Prompt: tokens(40, 0, 1), End: -1, HasEnd: true}})
		if out.Blocked == nil || out.Blocked.Reason != ReasonBatch {
			t.Fatalf("blocked = %+v, want batch", out.Blocked)
		}
		if got, want := out.Blocked.String(), "batch: 4 running + 1 > min(max_num_sequence 4, prefill_chunk 1024)"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
	t.Run("decode guard", func(t *testing.T) {
		f := newFixture(t, fixtureConfig{maxTotal: 8192, maxNumSeq: 1024})
		out := f.step(600, []Request{{ID: "x", Prompt: tokens(40, 0, 1), End: -1, HasEnd: true}})
		if out.Blocked == nil || out.Blocked.Reason != ReasonDecodeGuard {
			t.Fatalf("blocked = %+v, want decode guard", out.Blocked)
		}
		if got, want := out.Blocked.String(), "decode guard: 600 running > 513 free pages; nothing is recycling, eviction cannot help"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
	t.Run("window", func(t *testing.T) {
		f := newFixture(t, fixtureConfig{maxTotal: 8192})
		out := f.step(0, []Request{{ID: "x", Prompt: tokens(40, 0, 1), End: 40, HasEnd: true}, {ID: "y", Prompt: tokens(40, 0, 2)}})
		if len(out.Admitted) != 0 || out.Blocked == nil || out.Blocked.Reason != ReasonWindow {
			t.Fatalf("admitted %d, blocked %+v, want none, window", len(out.Admitted), out.Blocked)
		}
		if got, want := out.Blocked.String(), "window: end 40 must be < prompt 40"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
	t.Run("prefill tokens", func(t *testing.T) {
		// Two sequences sharing 3998 tokens count them twice but hold their pages once.
		f := newFixture(t, fixtureConfig{maxTotal: 8192, watermark: 1})
		f.prep("a", tokens(4000, 4000, 0), -1)
		f.prep("b", tokens(4000, 4000, 0), -1)
		out := f.step(0, []Request{{ID: "x", Prompt: tokens(200, 0, 2), End: -1, HasEnd: true}})
		if out.Blocked == nil || out.Blocked.Reason != ReasonPrefillTokens {
			t.Fatalf("blocked = %+v, want prefill-tokens", out.Blocked)
		}
		if got, want := out.Blocked.String(), "prefill space: 7998 + 199 + 8 × 1 tokens > max_total_sequence_length 8192; nothing is recycling, eviction cannot help"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
}

// Spec 5.1, "a stall that follows from these rules": recycled sequences fill the cache past
// the watermark while the token test still passes, so nothing triggers eviction.
func TestWatermarkStallWithIdleRecyclablePages(t *testing.T) {
	f := newFixture(t, fixtureConfig{maxTotal: 8192})
	for i := range 37 {
		prompt := tokens(40, 0, i+1)
		f.finish(f.prep(fmt.Sprint("done-", i), prompt, -1), prompt, 2)
	}
	out := f.step(0, []Request{{ID: "x", Prompt: tokens(40, 0, 99), End: -1, HasEnd: true}})
	if out.Blocked == nil || out.Blocked.Reason != ReasonWatermark {
		t.Fatalf("blocked = %+v, want watermark", out.Blocked)
	}
	want := "watermark: needs 3 + 400 pages, 402 free; 37 recycling sequences hold 111 evictable pages, but the watermark does not trigger eviction"
	if got := out.Blocked.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if out.Blocked.Evicted != 0 || f.pc.NumRecycling() != 37 {
		t.Errorf("evicted %d, recycling %d, want 0, 37", out.Blocked.Evicted, f.pc.NumRecycling())
	}
}

// When the token test fails, the action evicts recycling sequences until it passes: in MLC's
// order the most recently recycled goes first (libstdc++'s hash map puts the newest stamp at
// begin()), in the LRU order the least recently recycled.
func TestEvictionUntilPrefillSpace(t *testing.T) {
	for _, tc := range []struct {
		order  prefix.EvictOrder
		victim int // which of the four, in recycle order
	}{
		{prefix.EvictMLC, 3},
		{prefix.EvictLRU, 0},
	} {
		f := newFixture(t, fixtureConfig{maxTotal: 8192, watermark: 1, evict: tc.order})
		var seqs []int64
		for i := range 4 {
			prompt := tokens(2000, 0, i+1)
			p := f.prep(fmt.Sprint("done-", i), prompt, -1)
			f.finish(p, prompt, 2)
			seqs = append(seqs, p.Seq)
		}
		// Four recycling sequences of 2001 tokens hold 4 × 126 pages: 9 free, until one goes.
		out := f.step(0, []Request{{ID: "x", Prompt: tokens(1000, 0, 99), End: -1, HasEnd: true}})
		if len(out.Admitted) != 1 {
			t.Fatalf("%v: not admitted: %+v", tc.order, out.Blocked)
		}
		if got := out.Admitted[0].Evaluation.Evicted; got != 1 {
			t.Errorf("%v: evicted %d sequences, want 1", tc.order, got)
		}
		for i, seq := range seqs {
			if held := f.pc.HasSequence(seq); held == (i == tc.victim) {
				t.Errorf("%v: the %d-th recycled (seq %d) held %v; want only the %d-th evicted", tc.order, i, seq, held, tc.victim)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	long := tokens(5000, 0, 1)
	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"ok", Request{ID: "a", Prompt: tokens(4, 0, 1), End: -1, HasEnd: true}, nil},
		{"end 0", Request{ID: "a", Prompt: tokens(4, 0, 1), End: 0, HasEnd: true}, nil},
		{"empty", Request{ID: "a"}, ErrEmptyPrompt},
		{"too long", Request{ID: "a", Prompt: long}, ErrPromptLong},
		{"negative token", Request{ID: "a", Prompt: []int32{1, -2, 3}, End: -1, HasEnd: true}, ErrBadToken},
		{"n 2", Request{ID: "a", Prompt: tokens(4, 0, 1), End: -1, HasEnd: true, N: 2}, ErrMultipleN},
		{"end absent", Request{ID: "a", Prompt: tokens(4, 0, 1)}, ErrBadWindow},
		{"end = L", Request{ID: "a", Prompt: tokens(4, 0, 1), End: 4, HasEnd: true}, ErrBadWindow},
		{"end < -L", Request{ID: "a", Prompt: tokens(4, 0, 1), End: -5, HasEnd: true}, ErrBadWindow},
		{"begin 1", Request{ID: "a", Prompt: tokens(4, 0, 1), End: -1, HasEnd: true, Begin: 1}, ErrBadWindow},
	} {
		err := tc.req.Validate(4096)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: Validate = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestIDsRecycleLastFirst(t *testing.T) {
	var ids IDs
	got := []int64{ids.New(), ids.New(), ids.New()}
	ids.Recycle(0)
	ids.Recycle(2)
	got = append(got, ids.New(), ids.New(), ids.New())
	if want := []int64{0, 1, 2, 2, 0, 3}; !slices.Equal(got, want) {
		t.Errorf("ids = %v, want %v", got, want)
	}
}
