package engine

import (
	"fmt"
	"strings"
	"time"
)

// HazardKind names a hazard: something MLC lets happen silently that usually means a bug in
// the router or the prefill instance (docs/lifecycle.md).
type HazardKind uint8

// The hazards.
const (
	// HazardForkUnreceived: a request forked from, or reused, a sequence whose KV had not
	// fully arrived; its shared prefix may read KV that P has not written (and a mid-page
	// fork copies unwritten slots for good).
	HazardForkUnreceived HazardKind = iota
	// HazardStartBeforeKV: start_generate came before the request's KV had fully arrived.
	HazardStartBeforeKV
	// HazardBeginMismatch: start_generate's begin is not the prep_recv end.
	HazardBeginMismatch
	// HazardPreparedAge: a request has stayed prepared longer than the configured age.
	HazardPreparedAge
	// HazardAbortLeak: a prepared request was aborted and its KV sequence leaked.
	HazardAbortLeak
	// HazardStaleKVWrite: a KV write came with metadata that no prepared request holds (its
	// request finished, was aborted or never existed); it was refused. A real decode
	// instance would have written it into whatever now holds those slots.
	HazardStaleKVWrite
	numHazards
)

var hazardNames = [numHazards]string{"fork-unreceived", "start-before-kv", "begin-mismatch", "prepared-age", "abort-leak", "stale-kv-write"}

func (k HazardKind) String() string {
	if k < numHazards {
		return hazardNames[k]
	}
	return fmt.Sprintf("hazard(%d)", uint8(k))
}

// MarshalText writes the hazard's name.
func (k HazardKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a hazard's name.
func (k *HazardKind) UnmarshalText(b []byte) error {
	for i, n := range hazardNames {
		if n == string(b) {
			*k = HazardKind(i)
			return nil
		}
	}
	return fmt.Errorf("engine: unknown hazard %q", b)
}

// HazardKinds lists every hazard kind.
func HazardKinds() []HazardKind {
	out := make([]HazardKind, numHazards)
	for i := range out {
		out[i] = HazardKind(i)
	}
	return out
}

// Hazard is one detected hazard with the numbers behind it.
type Hazard struct {
	Kind HazardKind `json:"kind"`
	ID   string     `json:"id"` // the request concerned
	Seq  int64      `json:"seq"`
	// Fork-unreceived: the request whose sequence was forked or reused, its sequence, the
	// fork position and how many of the shared tokens had not arrived.
	Parent     string `json:"parent,omitempty"`
	ParentSeq  int64  `json:"parent_seq,omitempty"`
	Pos        int    `json:"pos,omitempty"`
	Unreceived int    `json:"unreceived,omitempty"`
	// Start-before-KV and prepared-age: KV received of reserved.
	Received int `json:"received,omitempty"`
	Reserved int `json:"reserved,omitempty"`
	// Begin-mismatch.
	Begin int `json:"begin,omitempty"`
	End   int `json:"end,omitempty"`
	// Prepared-age: how long the request has been prepared, in milliseconds.
	AgeMs int64 `json:"age_ms,omitempty"`
	// Abort-leak: the pages the leaked sequence holds.
	Pages int `json:"pages,omitempty"`
	// Stale-kv-write: where the write began in the metadata's slot list, its tokens, and
	// the prepared request that holds its first slot now (empty when none does). ID is the
	// request the metadata was issued to, when the engine still knows it.
	Offset int    `json:"offset,omitempty"`
	Tokens int    `json:"tokens,omitempty"`
	Holder string `json:"holder,omitempty"`
}

func (h Hazard) String() string {
	switch h.Kind {
	case HazardForkUnreceived:
		return fmt.Sprintf("%s %s: shares %d tokens of seq %d (%s), %d of them not yet received",
			h.Kind, h.ID, h.Pos, h.ParentSeq, h.Parent, h.Unreceived)
	case HazardStartBeforeKV:
		return fmt.Sprintf("%s %s: start_generate with %d of %d KV tokens received", h.Kind, h.ID, h.Received, h.Reserved)
	case HazardBeginMismatch:
		return fmt.Sprintf("%s %s: start_generate begin %d, prep_recv end %d", h.Kind, h.ID, h.Begin, h.End)
	case HazardPreparedAge:
		return fmt.Sprintf("%s %s: prepared for %v, %d of %d KV tokens received, no start_generate (likely leak)",
			h.Kind, h.ID, time.Duration(h.AgeMs)*time.Millisecond, h.Received, h.Reserved)
	case HazardAbortLeak:
		return fmt.Sprintf("%s %s: aborted while prepared, seq %d and its %d pages leak", h.Kind, h.ID, h.Seq, h.Pages)
	case HazardStaleKVWrite:
		whose := "metadata no request holds"
		if h.ID != "" {
			whose = "the metadata of " + h.ID + ", which is no longer prepared"
		}
		now := "free or not awaiting KV"
		if h.Holder != "" {
			now = h.Holder + "'s"
		}
		return fmt.Sprintf("%s: a KV write of %d tokens at offset %d with %s, refused; its slots are now %s",
			strings.TrimSpace(h.Kind.String()+" "+h.ID), h.Tokens, h.Offset, whose, now)
	}
	return h.Kind.String() + " " + h.ID
}
