package prepare

import (
	"errors"
	"fmt"
)

// Errors for requests refused before they are queued. MLC fails a CHECK (and kills its
// process) on several of these; kvtop answers with the reason and changes nothing.
var (
	ErrBadWindow   = errors.New("prepare: bad kv window")
	ErrEmptyPrompt = errors.New("prepare: empty prompt")
	ErrPromptLong  = errors.New("prepare: prompt too long")
	ErrBadToken    = errors.New("prepare: bad token id")
	ErrMultipleN   = errors.New("prepare: n > 1 is not supported")
)

// Request is a prepare-receive request as the action sees it: the prompt and the KV window
// the router asked for.
type Request struct {
	ID     string
	Prompt []int32
	// Begin is kv_window_begin; it must be 0.
	Begin int
	// End is kv_window_end: absent means the prompt length, negative counts from the end.
	End    int
	HasEnd bool
	// N is the number of completions; kvtop supports 1 (0 means 1).
	N int
}

// ResolveEnd resolves the window's end against the prompt: absent is L, negative is L + end.
// The result must satisfy 0 <= end < L: prefilling the whole input on the remote machine is
// not supported.
func (r Request) ResolveEnd() (int, error) {
	l := len(r.Prompt)
	end := l
	if r.HasEnd {
		end = r.End
		if end < 0 {
			end += l
		}
	}
	if r.Begin != 0 {
		return end, fmt.Errorf("kv window begin %d must be 0: %w", r.Begin, ErrBadWindow)
	}
	if end < 0 || end >= l {
		return end, fmt.Errorf("kv window end %d (resolved from %s) must be in [0, %d): prefilling the whole prompt remotely is not supported: %w",
			end, r.endText(), l, ErrBadWindow)
	}
	return end, nil
}

func (r Request) endText() string {
	if !r.HasEnd {
		return "absent"
	}
	return fmt.Sprint(r.End)
}

// Validate checks what can be checked before a request is queued: a non-empty prompt no
// longer than maxLen (MLC's max_single_sequence_length), token ids that are not negative,
// n == 1, and a window that resolves. The engine refuses an invalid request and changes
// nothing.
func (r Request) Validate(maxLen int) error {
	if len(r.Prompt) == 0 {
		return fmt.Errorf("prep_recv %s: %w", r.ID, ErrEmptyPrompt)
	}
	if maxLen > 0 && len(r.Prompt) > maxLen {
		return fmt.Errorf("prep_recv %s: prompt of %d tokens is over max_single_sequence_length %d: %w", r.ID, len(r.Prompt), maxLen, ErrPromptLong)
	}
	for i, t := range r.Prompt {
		if t < 0 {
			return fmt.Errorf("prep_recv %s: token %d at position %d is negative: %w", r.ID, t, i, ErrBadToken)
		}
	}
	if r.N < 0 {
		return fmt.Errorf("prep_recv %s: n = %d must be 1: %w", r.ID, r.N, ErrMultipleN)
	}
	if r.N > 1 {
		return fmt.Errorf("prep_recv %s: n = %d (a prefill instance forces n = 1): %w", r.ID, r.N, ErrMultipleN)
	}
	if _, err := r.ResolveEnd(); err != nil {
		return fmt.Errorf("prep_recv %s: %w", r.ID, err)
	}
	return nil
}
