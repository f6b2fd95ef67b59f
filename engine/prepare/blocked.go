package prepare

import (
	"fmt"
	"strings"
)

// Reason names the admission predicate that stopped a prepare-receive request (spec 5.2).
type Reason uint8

// The reasons, in the order admission tests them.
const (
	ReasonNone Reason = iota
	// ReasonDecodeGuard: more running requests than free pages; nothing is admitted.
	ReasonDecodeGuard
	// ReasonHeadOfLine: an earlier prepare-receive request is blocked, and admission is FIFO.
	ReasonHeadOfLine
	// ReasonWindow: the window does not resolve to 0 <= end < L.
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

// Check is one admission predicate with its two sides: OK when LHS <= RHS.
type Check struct {
	Name string
	Text string // the predicate with its numbers
	LHS  int
	RHS  int
}

// OK reports whether the predicate holds.
func (c Check) OK() bool { return c.LHS <= c.RHS }

// sides returns the two sides of each admission predicate, in the order of Checks.
func (ev Evaluation) sides() [6][2]int {
	batch := ev.Running + 1
	return [6][2]int{
		{ev.Running, ev.FreePages},
		{ev.End + 1, ev.PromptLength},
		{batch * ev.SpecFactor, min(ev.MaxNumSequence, ev.PrefillChunkSize)},
		{ev.Required + ev.Watermark, ev.FreePages},
		{ev.Required + batch, ev.FreePages},
		{ev.TotalSequenceLength + ev.End + 8*batch, ev.MaxTotalSequenceLength},
	}
}

// checkReasons are the reasons of the predicates of sides, in order.
var checkReasons = [6]Reason{ReasonDecodeGuard, ReasonWindow, ReasonBatch, ReasonWatermark, ReasonPrefillPages, ReasonPrefillTokens}

// firstFailure returns the reason of the first predicate that fails, or ReasonNone.
func (ev Evaluation) firstFailure() Reason {
	for i, s := range ev.sides() {
		if s[0] > s[1] {
			return checkReasons[i]
		}
	}
	return ReasonNone
}

// Checks returns the admission predicates in the order admission tests them, with the
// evaluation's numbers. For a head-of-line request they are its own numbers, as if it were
// first.
func (ev Evaluation) Checks() []Check {
	batch := ev.Running + 1
	texts := [6]string{
		fmt.Sprintf("%d running <= %d free pages", ev.Running, ev.FreePages),
		fmt.Sprintf("end %d < prompt %d", ev.End, ev.PromptLength),
		fmt.Sprintf("(%d running + 1) × %d <= min(max_num_sequence %d, prefill_chunk %d)", ev.Running, ev.SpecFactor, ev.MaxNumSequence, ev.PrefillChunkSize),
		fmt.Sprintf("%d + %d pages <= %d free", ev.Required, ev.Watermark, ev.FreePages),
		fmt.Sprintf("%d + %d pages <= %d free", ev.Required, batch, ev.FreePages),
		fmt.Sprintf("%d + %d + 8 × %d tokens <= %d", ev.TotalSequenceLength, ev.End, batch, ev.MaxTotalSequenceLength),
	}
	out := make([]Check, 0, len(texts))
	for i, s := range ev.sides() {
		out = append(out, Check{Name: checkReasons[i].String(), Text: texts[i], LHS: s[0], RHS: s[1]})
	}
	return out
}

// Blocked reports whether the request was not admitted.
func (ev Evaluation) Blocked() bool { return ev.Reason != ReasonNone }

// Short is the reason in a few words, for a table cell: "watermark 403 > 388 free".
func (ev Evaluation) Short() string {
	batch := ev.Running + 1
	switch ev.Reason {
	case ReasonNone:
		return ""
	case ReasonDecodeGuard:
		return fmt.Sprintf("decode guard %d > %d free", ev.Running, ev.FreePages)
	case ReasonHeadOfLine:
		return "behind " + ev.Behind
	case ReasonWindow:
		return fmt.Sprintf("window end %d >= %d", ev.End, ev.PromptLength)
	case ReasonBatch:
		return fmt.Sprintf("batch %d > %d", batch*ev.SpecFactor, min(ev.MaxNumSequence, ev.PrefillChunkSize))
	case ReasonWatermark:
		return fmt.Sprintf("watermark %d > %d free", ev.Required+ev.Watermark, ev.FreePages)
	case ReasonPrefillPages:
		return fmt.Sprintf("pages %d > %d free", ev.Required+batch, ev.FreePages)
	case ReasonPrefillTokens:
		return fmt.Sprintf("tokens %d > %d", ev.TotalSequenceLength+ev.End+8*batch, ev.MaxTotalSequenceLength)
	}
	return ev.Reason.String()
}

// String explains the reason with its numbers, in the words of spec 5.2, and says what
// eviction could still free.
func (ev Evaluation) String() string {
	batch := ev.Running + 1
	var b strings.Builder
	switch ev.Reason {
	case ReasonNone:
		return "admitted"
	case ReasonDecodeGuard:
		fmt.Fprintf(&b, "decode guard: %d running > %d free pages", ev.Running, ev.FreePages)
	case ReasonHeadOfLine:
		fmt.Fprintf(&b, "head-of-line: behind %s", ev.Behind)
	case ReasonWindow:
		fmt.Fprintf(&b, "window: end %d must be < prompt %d", ev.End, ev.PromptLength)
	case ReasonBatch:
		fmt.Fprintf(&b, "batch: %d running + 1", ev.Running)
		if ev.SpecFactor > 1 {
			fmt.Fprintf(&b, " (× spec factor %d)", ev.SpecFactor)
		}
		fmt.Fprintf(&b, " > min(max_num_sequence %d, prefill_chunk %d)", ev.MaxNumSequence, ev.PrefillChunkSize)
	case ReasonWatermark:
		fmt.Fprintf(&b, "watermark: needs %d + %d pages, %d free", ev.Required, ev.Watermark, ev.FreePages)
		if ev.TotalPages > 0 && ev.Required+ev.Watermark > ev.TotalPages {
			fmt.Fprintf(&b, "; the whole cache has %d pages, so this request can never be admitted (raise max_total_sequence_length or lower the watermark)", ev.TotalPages)
			return b.String()
		}
	case ReasonPrefillPages:
		fmt.Fprintf(&b, "prefill space: needs %d + %d pages, %d free", ev.Required, batch, ev.FreePages)
	case ReasonPrefillTokens:
		fmt.Fprintf(&b, "prefill space: %d + %d + 8 × %d tokens > max_total_sequence_length %d",
			ev.TotalSequenceLength, ev.End, batch, ev.MaxTotalSequenceLength)
	}
	switch ev.Reason {
	case ReasonHeadOfLine, ReasonBatch, ReasonWindow:
		// Eviction cannot change these.
	case ReasonWatermark, ReasonDecodeGuard:
		if ev.Recycling > 0 {
			fmt.Fprintf(&b, "; %d recycling sequences hold %d evictable pages, but the %s does not trigger eviction",
				ev.Recycling, ev.Evictable, ev.Reason.prose())
		} else {
			b.WriteString("; nothing is recycling, eviction cannot help")
		}
	default:
		if ev.Recycling > 0 {
			fmt.Fprintf(&b, "; %d recycling sequences hold %d evictable pages", ev.Recycling, ev.Evictable)
		} else {
			b.WriteString("; nothing is recycling, eviction cannot help")
		}
	}
	return b.String()
}

// prose names a reason in a sentence.
func (r Reason) prose() string {
	if r == ReasonDecodeGuard {
		return "decode guard"
	}
	return r.String()
}
