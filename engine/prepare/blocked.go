package prepare

import (
	"fmt"
	"strings"
)

// Reason names the admission predicate that stopped a prepare-receive request
// (docs/admission.md).
type Reason uint8

// The reasons, in the order admission tests them.
const (
	ReasonNone Reason = iota
	// ReasonDecodeGuard: more running requests than free pages; nothing is admitted.
	ReasonDecodeGuard
	// ReasonHeadOfLine: an earlier prepare-receive request is blocked, and admission is FIFO.
	ReasonHeadOfLine
	// ReasonWindow: the window does not resolve to 0 ≤ end < L.
	ReasonWindow
	// ReasonBatch: (running + 1) × spec_factor > min(max_num_sequence, prefill_chunk_size).
	ReasonBatch
	// ReasonWatermark: required + watermark > free pages.
	ReasonWatermark
	// ReasonPrefillPages: required + batch > free pages (HasPrefillSpace, pages).
	ReasonPrefillPages
	// ReasonPrefillTokens: total sequence length + end + 8 × batch > max_total_sequence_length
	// (HasPrefillSpace, tokens).
	ReasonPrefillTokens
	numReasons
)

// NumReasons is the number of reasons, ReasonNone included: counters can be arrays indexed
// by Reason.
const NumReasons = int(numReasons)

var reasonNames = [numReasons]string{"none", "decode-guard", "head-of-line", "window", "batch", "watermark", "prefill-pages", "prefill-tokens"}

// String returns the reason's stable name, as used in events and metrics labels.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// MarshalText writes the reason's name.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a reason's name.
func (r *Reason) UnmarshalText(b []byte) error {
	v, ok := ParseReason(string(b))
	if !ok {
		return fmt.Errorf("prepare: unknown blocked reason %q", b)
	}
	*r = v
	return nil
}

// Reasons returns every reason except ReasonNone, in admission order.
func Reasons() []Reason {
	out := make([]Reason, 0, numReasons-1)
	for r := ReasonDecodeGuard; r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// ParseReason returns the reason with the given name.
func ParseReason(s string) (Reason, bool) {
	for r, n := range reasonNames {
		if n == s {
			return Reason(r), true
		}
	}
	return ReasonNone, false
}

// Evaluation is the admission test of one prepare-receive request with every number it
// used. It is what the dashboard shows under "why is it stuck".
type Evaluation struct {
	Request      string `json:"request"`
	Reason       Reason `json:"reason"`           // the first predicate that failed; ReasonNone if admitted
	Behind       string `json:"behind,omitempty"` // head-of-line: the request in front
	PromptLength int    `json:"prompt_length"`
	End          int    `json:"end"` // resolved kv_window_end

	Running    int `json:"running"`     // running requests (decode guard, batch)
	FreePages  int `json:"free_pages"`  // free pages when the test ran (after eviction)
	TotalPages int `json:"total_pages"` // the cache's size
	Required   int `json:"required"`    // ceil(end / page_size)
	Watermark  int `json:"watermark"`

	MaxNumSequence   int `json:"max_num_sequence"`
	PrefillChunkSize int `json:"prefill_chunk_size"`
	SpecFactor       int `json:"spec_factor"`

	TotalSequenceLength    int `json:"total_sequence_length"`
	MaxTotalSequenceLength int `json:"max_total_sequence_length"`

	// Evicted is how many recycling sequences the TryFreeMemory loop evicted for this test.
	Evicted int `json:"evicted"`
	// Recycling and Evictable say what eviction could still free: the recycling sequences
	// left and the pages evicting all of them would give back. The watermark never triggers
	// eviction, so a request blocked by it can wait for good while these sit idle.
	Recycling int `json:"recycling"`
	Evictable int `json:"evictable_pages"`
}

// Check is one admission predicate with its two sides: OK when LHS ≤ RHS.
type Check struct {
	Name string
	Text string // the predicate with its numbers: "3 + 400 pages ≤ 388 free"
	LHS  int
	RHS  int
}

// OK reports whether the predicate holds.
func (c Check) OK() bool { return c.LHS <= c.RHS }

// Le is the glyph kvtop writes for "less than or equal" wherever a predicate is shown.
const Le = "≤"

// evictionNote is what a blocked reason says about the recycling sequences eviction could
// still free.
type evictionNote uint8

const (
	// noteNone: eviction cannot change the predicate; say nothing.
	noteNone evictionNote = iota
	// noteNotTriggered: eviction would help, but this predicate never triggers it.
	noteNotTriggered
	// noteHolds: say what the recycling sequences hold.
	noteHolds
)

// predicate is one admission test, which holds when lhs ≤ rhs. Every place that tests,
// lists or explains admission reads this table: the first failure, the checks with their
// numbers, the short and the long texts, and HasPrefillSpace.
type predicate struct {
	reason Reason
	// sides returns the two sides for a batch of batch requests (the running ones, plus the
	// one being admitted when admission proper tests it).
	sides func(ev *Evaluation, batch int) (lhs, rhs int)
	// check writes the predicate with its numbers, as it holds: "3 + 400 pages ≤ 388 free".
	check func(ev *Evaluation, batch int) string
	// short says in a few words how it fails, for a table cell: "watermark 403 > 388 free".
	short func(ev *Evaluation, lhs, rhs int) string
	// long explains the failure in a sentence: "watermark: needs 3 + 400 pages, 388 free".
	long func(b *strings.Builder, ev *Evaluation, batch int)
	// prefillSpace marks the two halves of MLC's HasPrefillSpace, which the eviction loop
	// tests with the running batch alone.
	prefillSpace bool
	note         evictionNote
}

// predicates are the admission tests in the order admission runs them (head-of-line is not
// one: it is the verdict on everyone behind a blocked head).
var predicates = [...]predicate{
	{
		reason: ReasonDecodeGuard,
		sides:  func(ev *Evaluation, _ int) (int, int) { return ev.Running, ev.FreePages },
		check: func(ev *Evaluation, _ int) string {
			return fmt.Sprintf("%d running %s %d free pages", ev.Running, Le, ev.FreePages)
		},
		short: func(_ *Evaluation, l, r int) string { return fmt.Sprintf("decode guard %d > %d free", l, r) },
		long: func(b *strings.Builder, ev *Evaluation, _ int) {
			fmt.Fprintf(b, "decode guard: %d running > %d free pages", ev.Running, ev.FreePages)
		},
		note: noteNotTriggered,
	},
	{
		reason: ReasonWindow,
		sides:  func(ev *Evaluation, _ int) (int, int) { return ev.End + 1, ev.PromptLength },
		check: func(ev *Evaluation, _ int) string {
			return fmt.Sprintf("end %d < prompt %d", ev.End, ev.PromptLength)
		},
		short: func(ev *Evaluation, _, _ int) string {
			return fmt.Sprintf("window end %d ≥ %d", ev.End, ev.PromptLength)
		},
		long: func(b *strings.Builder, ev *Evaluation, _ int) {
			fmt.Fprintf(b, "window: end %d must be < prompt %d", ev.End, ev.PromptLength)
		},
	},
	{
		reason: ReasonBatch,
		sides: func(ev *Evaluation, batch int) (int, int) {
			return batch * ev.SpecFactor, min(ev.MaxNumSequence, ev.PrefillChunkSize)
		},
		check: func(ev *Evaluation, _ int) string {
			return fmt.Sprintf("(%d running + 1) × %d %s min(max_num_sequence %d, prefill_chunk %d)",
				ev.Running, ev.SpecFactor, Le, ev.MaxNumSequence, ev.PrefillChunkSize)
		},
		short: func(_ *Evaluation, l, r int) string { return fmt.Sprintf("batch %d > %d", l, r) },
		long: func(b *strings.Builder, ev *Evaluation, _ int) {
			fmt.Fprintf(b, "batch: %d running + 1", ev.Running)
			if ev.SpecFactor > 1 {
				fmt.Fprintf(b, " (× spec factor %d)", ev.SpecFactor)
			}
			fmt.Fprintf(b, " > min(max_num_sequence %d, prefill_chunk %d)", ev.MaxNumSequence, ev.PrefillChunkSize)
		},
	},
	{
		reason: ReasonWatermark,
		sides:  func(ev *Evaluation, _ int) (int, int) { return ev.Required + ev.Watermark, ev.FreePages },
		check: func(ev *Evaluation, _ int) string {
			return fmt.Sprintf("%d + %d pages %s %d free", ev.Required, ev.Watermark, Le, ev.FreePages)
		},
		short: func(_ *Evaluation, l, r int) string { return fmt.Sprintf("watermark %d > %d free", l, r) },
		long: func(b *strings.Builder, ev *Evaluation, _ int) {
			fmt.Fprintf(b, "watermark: needs %d + %d pages, %d free", ev.Required, ev.Watermark, ev.FreePages)
		},
		note: noteNotTriggered,
	},
	{
		reason: ReasonPrefillPages,
		sides:  func(ev *Evaluation, batch int) (int, int) { return ev.Required + batch, ev.FreePages },
		check: func(ev *Evaluation, batch int) string {
			return fmt.Sprintf("%d + %d pages %s %d free", ev.Required, batch, Le, ev.FreePages)
		},
		short: func(_ *Evaluation, l, r int) string { return fmt.Sprintf("pages %d > %d free", l, r) },
		long: func(b *strings.Builder, ev *Evaluation, batch int) {
			fmt.Fprintf(b, "prefill space: needs %d + %d pages, %d free", ev.Required, batch, ev.FreePages)
		},
		prefillSpace: true,
		note:         noteHolds,
	},
	{
		reason: ReasonPrefillTokens,
		sides: func(ev *Evaluation, batch int) (int, int) {
			return ev.TotalSequenceLength + ev.End + 8*batch, ev.MaxTotalSequenceLength
		},
		check: func(ev *Evaluation, batch int) string {
			return fmt.Sprintf("%d + %d + 8 × %d tokens %s %d", ev.TotalSequenceLength, ev.End, batch, Le, ev.MaxTotalSequenceLength)
		},
		short: func(_ *Evaluation, l, r int) string { return fmt.Sprintf("tokens %d > %d", l, r) },
		long: func(b *strings.Builder, ev *Evaluation, batch int) {
			fmt.Fprintf(b, "prefill space: %d + %d + 8 × %d tokens > max_total_sequence_length %d",
				ev.TotalSequenceLength, ev.End, batch, ev.MaxTotalSequenceLength)
		},
		prefillSpace: true,
		note:         noteHolds,
	},
}

// predicateOf returns the table entry of a reason, or nil for head-of-line and none.
func predicateOf(r Reason) *predicate {
	for i := range predicates {
		if predicates[i].reason == r {
			return &predicates[i]
		}
	}
	return nil
}

// batch is the batch admission proper tests: the running requests and this one.
func (ev *Evaluation) batch() int { return ev.Running + 1 }

// firstFailure returns the reason of the first predicate that fails, or ReasonNone.
func (ev *Evaluation) firstFailure() Reason {
	for i := range predicates {
		if l, r := predicates[i].sides(ev, ev.batch()); l > r {
			return predicates[i].reason
		}
	}
	return ReasonNone
}

// hasPrefillSpace is MLC's HasPrefillSpace (without a sliding window) on the evaluation's
// numbers, for a batch of batch requests.
func (ev *Evaluation) hasPrefillSpace(batch int) bool {
	for i := range predicates {
		if p := &predicates[i]; p.prefillSpace {
			if l, r := p.sides(ev, batch); l > r {
				return false
			}
		}
	}
	return true
}

// Checks returns the admission predicates in the order admission tests them, with the
// evaluation's numbers. For a head-of-line request they are its own numbers, as if it were
// first.
func (ev Evaluation) Checks() []Check {
	out := make([]Check, 0, len(predicates))
	for i := range predicates {
		p := &predicates[i]
		l, r := p.sides(&ev, ev.batch())
		out = append(out, Check{Name: p.reason.String(), Text: p.check(&ev, ev.batch()), LHS: l, RHS: r})
	}
	return out
}

// Blocked reports whether the request was not admitted.
func (ev Evaluation) Blocked() bool { return ev.Reason != ReasonNone }

// Short is the reason in a few words, for a table cell: "watermark 403 > 388 free".
func (ev Evaluation) Short() string {
	switch ev.Reason {
	case ReasonNone:
		return ""
	case ReasonHeadOfLine:
		return "behind " + ev.Behind
	}
	if p := predicateOf(ev.Reason); p != nil {
		l, r := p.sides(&ev, ev.batch())
		return p.short(&ev, l, r)
	}
	return ev.Reason.String()
}

// String explains the reason with its numbers and says what eviction could still free.
func (ev Evaluation) String() string {
	switch ev.Reason {
	case ReasonNone:
		return "admitted"
	case ReasonHeadOfLine:
		return "head-of-line: behind " + ev.Behind
	}
	p := predicateOf(ev.Reason)
	if p == nil {
		return ev.Reason.String()
	}
	var b strings.Builder
	p.long(&b, &ev, ev.batch())
	if ev.Reason == ReasonWatermark && ev.TotalPages > 0 && ev.Required+ev.Watermark > ev.TotalPages {
		fmt.Fprintf(&b, "; the whole cache has %d pages, so this request can never be admitted (raise max_total_sequence_length or lower the watermark)", ev.TotalPages)
		return b.String()
	}
	switch {
	case p.note == noteNone:
	case ev.Recycling == 0:
		b.WriteString("; nothing is recycling, eviction cannot help")
	case p.note == noteNotTriggered:
		fmt.Fprintf(&b, "; %d recycling sequences hold %d evictable pages, but the %s does not trigger eviction",
			ev.Recycling, ev.Evictable, strings.ReplaceAll(ev.Reason.String(), "-", " "))
	default:
		fmt.Fprintf(&b, "; %d recycling sequences hold %d evictable pages", ev.Recycling, ev.Evictable)
	}
	return b.String()
}
