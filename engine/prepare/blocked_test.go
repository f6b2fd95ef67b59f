package prepare

import (
	"strings"
	"testing"
)

// passing is an evaluation every predicate passes: 2 running, 1,000 free pages of 1,025,
// a 40-token prompt with end 39 (3 pages), nothing near any limit.
func passing() Evaluation {
	return Evaluation{
		Request: "r", PromptLength: 40, End: 39, Running: 2, FreePages: 1000, TotalPages: 1025,
		Required: 3, Watermark: 400, MaxNumSequence: 32, PrefillChunkSize: 1024, SpecFactor: 1,
		TotalSequenceLength: 500, MaxTotalSequenceLength: 16384,
	}
}

// Each predicate of the table, made to fail: the first failure names it, the checks before it
// pass and its own fails, and the short and long texts carry its numbers.
func TestPredicateTableFailingOneAtATime(t *testing.T) {
	for _, tc := range []struct {
		reason      Reason
		break_      func(ev *Evaluation)
		short, long string
	}{
		{ReasonDecodeGuard, func(ev *Evaluation) { ev.Running, ev.MaxNumSequence, ev.FreePages = 990, 4096, 980 },
			"decode guard 990 > 980 free", "decode guard: 990 running > 980 free pages"},
		{ReasonWindow, func(ev *Evaluation) { ev.End = 40 },
			"window end 40 ≥ 40", "window: end 40 must be < prompt 40"},
		{ReasonBatch, func(ev *Evaluation) { ev.Running = 32 },
			"batch 33 > 32", "batch: 32 running + 1 > min(max_num_sequence 32, prefill_chunk 1024)"},
		{ReasonWatermark, func(ev *Evaluation) { ev.FreePages = 402 },
			"watermark 403 > 402 free", "watermark: needs 3 + 400 pages, 402 free"},
		{ReasonPrefillPages, func(ev *Evaluation) { ev.Watermark, ev.FreePages = 0, 5 },
			"pages 6 > 5 free", "prefill space: needs 3 + 3 pages, 5 free"},
		{ReasonPrefillTokens, func(ev *Evaluation) { ev.TotalSequenceLength = 16330 },
			"tokens 16393 > 16384", "prefill space: 16330 + 39 + 8 × 3 tokens > max_total_sequence_length 16384"},
	} {
		ev := passing()
		if r := ev.firstFailure(); r != ReasonNone {
			t.Fatalf("the passing evaluation fails %v", r)
		}
		tc.break_(&ev)
		if got := ev.firstFailure(); got != tc.reason {
			t.Errorf("%v: first failure = %v", tc.reason, got)
			continue
		}
		ev.Reason = tc.reason
		before := true // the checks before the failing one pass; it fails
		for _, c := range ev.Checks() {
			fails := c.Name == tc.reason.String()
			if (before || fails) && c.OK() == fails {
				t.Errorf("%v: check %s (%d ≤ %d) OK = %v", tc.reason, c.Name, c.LHS, c.RHS, c.OK())
			}
			before = before && !fails
			if !strings.Contains(c.Text, Le) && c.Name != "window" {
				t.Errorf("%v: check %s text %q does not use %s", tc.reason, c.Name, c.Text, Le)
			}
		}
		if got := ev.Short(); got != tc.short {
			t.Errorf("%v: Short = %q, want %q", tc.reason, got, tc.short)
		}
		if got := ev.String(); !strings.HasPrefix(got, tc.long) {
			t.Errorf("%v: String = %q, want it to start with %q", tc.reason, got, tc.long)
		}
	}
}

// HasPrefillSpace is the two prefill predicates of the table at the batch the caller names:
// the eviction loop tests the running batch alone, admission the batch with the request.
func TestHasPrefillSpaceIsThePrefillPredicates(t *testing.T) {
	ev := passing()
	ev.Watermark, ev.FreePages = 0, 5 // 3 pages + a batch of 2 fits 5, a batch of 3 does not
	if !ev.hasPrefillSpace(ev.Running) {
		t.Errorf("3 + 2 pages ≤ 5 free: no prefill space")
	}
	if ev.hasPrefillSpace(ev.batch()) {
		t.Errorf("3 + 3 pages > 5 free: prefill space")
	}
	ev = passing()
	ev.TotalSequenceLength = 16384 - 39 - 8*2
	if !ev.hasPrefillSpace(2) || ev.hasPrefillSpace(3) {
		t.Errorf("tokens at the limit for a batch of 2: space(2), space(3) = %v, %v, want true, false", ev.hasPrefillSpace(2), ev.hasPrefillSpace(3))
	}
}

// What eviction could free is said per predicate: the watermark and the decode guard never
// trigger it, the prefill ones do, the batch and the window cannot be helped by it.
func TestEvictionNoteFollowsThePredicate(t *testing.T) {
	for _, tc := range []struct {
		reason Reason
		want   string
	}{
		{ReasonWatermark, "; 5 recycling sequences hold 120 evictable pages, but the watermark does not trigger eviction"},
		{ReasonDecodeGuard, "; 5 recycling sequences hold 120 evictable pages, but the decode guard does not trigger eviction"},
		{ReasonPrefillPages, "; 5 recycling sequences hold 120 evictable pages"},
		{ReasonBatch, "min(max_num_sequence 32, prefill_chunk 1024)"},
	} {
		ev := passing()
		ev.Reason, ev.Recycling, ev.Evictable = tc.reason, 5, 120
		if got := ev.String(); !strings.HasSuffix(got, tc.want) {
			t.Errorf("%v: String = %q, want it to end %q", tc.reason, got, tc.want)
		}
	}
	ev := passing()
	ev.Reason, ev.TotalPages = ReasonWatermark, 257
	if got := ev.String(); !strings.Contains(got, "the whole cache has 257 pages, so this request can never be admitted") {
		t.Errorf("never admissible: String = %q", got)
	}
	hol := Evaluation{Reason: ReasonHeadOfLine, Behind: "r-17"}
	if got, want := hol.String()+" / "+hol.Short(), "head-of-line: behind r-17 / behind r-17"; got != want {
		t.Errorf("head-of-line: %q, want %q", got, want)
	}
}
