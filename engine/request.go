package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
)

// RequestState is where a request is in its life on the decode instance (docs/lifecycle.md).
type RequestState uint8

// The states, in lifecycle order.
const (
	// StateWaiting: prep_recv queued, not admitted yet (possibly blocked).
	StateWaiting RequestState = iota
	// StatePrepared: admitted; slots reserved; awaiting KV from the prefill instance.
	StatePrepared
	// StateKVComplete: prepared and every reserved slot written; awaiting start_generate.
	StateKVComplete
	// StateRunning: start_generate came; prefilling its tail or decoding.
	StateRunning
	StateFinished
	StateAborted
	// StatePreempted: aborted by batch decode for want of pages; the router starts over.
	StatePreempted
	numStates
)

var stateNames = [numStates]string{"waiting", "prepared", "kv-complete", "running", "finished", "aborted", "preempted"}

func (s RequestState) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// MarshalText writes the state's name.
func (s RequestState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state's name.
func (s *RequestState) UnmarshalText(b []byte) error {
	for i, n := range stateNames {
		if n == string(b) {
			*s = RequestState(i)
			return nil
		}
	}
	return fmt.Errorf("engine: unknown request state %q", b)
}

// States lists every request state.
func States() []RequestState {
	out := make([]RequestState, numStates)
	for i := range out {
		out[i] = RequestState(i)
	}
	return out
}

// Ended reports whether the request is over.
func (s RequestState) Ended() bool { return s >= StateFinished }

// request is the engine's record of one request. The fields derivation reads on every step
// (derive.go) come first, so that they share a cache line.
type request struct {
	state     RequestState
	leaked    bool
	pending   int // tail tokens left to prefill
	eval      *prepare.Evaluation
	hazards   []HazardKind
	admitted  Stamp
	id        string
	prompt    []int32
	end       int
	maxTokens int

	seq     int64 // -1 until admitted
	matched int
	match   prefix.Kind
	parent  int64

	runs    [][]pages.Run // reserved slots per model
	encoded string
	kv      kvProgress

	extQueued bool // the prompt's prefix-cache extension has been queued

	// alt is the request's sequence in the counterfactual prefix cache (-1: none) and
	// altMatched what that cache matched of its window.
	alt        int64
	altMatched int

	tailPos   int // next prompt position the tail prefill covers
	generated int // tokens generated (the committed last prompt token counts)
	streamed  int // tokens handed to the client (the committed one is not)
	lastToken int32

	arrived, started, ended Stamp
	finishReason            string
	ageFlagged              bool
	history                 []Mark
}

// Mark is one line of a request's timeline.
type Mark struct {
	Stamp
	Kind string `json:"kind"` // the event kind
	Text string `json:"text"`
	// ev is the event, kept so that Text is formatted only when someone reads it: folding
	// events into a view then costs no formatting.
	ev Event
}

// Line returns the mark's text.
func (m Mark) Line() string {
	if m.ev != nil {
		return m.ev.String()
	}
	return m.Text
}

// newMark returns the mark of an event.
func newMark(ev Event) Mark { return Mark{Stamp: ev.When(), Kind: markKind(ev), ev: ev} }

// materialize formats the marks' text, for a snapshot.
func materialize(h []Mark) []Mark {
	out := make([]Mark, len(h))
	for i, m := range h {
		out[i] = Mark{Stamp: m.Stamp, Kind: m.Kind, Text: m.Line()}
	}
	return out
}

// Bounds of the per-request lists a snapshot carries.
const (
	maxHistory = 32
	maxHazards = 8
	// MaxRecentHazards is how many recent hazards a snapshot carries.
	MaxRecentHazards = 64
)

// addMark appends to a bounded timeline. Consecutive marks of a kind that changes often
// (KV writes, blocked evaluations of one reason) replace each other.
func addMark(h []Mark, m Mark, coalesce bool) []Mark {
	if coalesce && len(h) > 0 && h[len(h)-1].Kind == m.Kind {
		h[len(h)-1] = m
		return h
	}
	if len(h) == maxHistory {
		copy(h, h[1:])
		h = h[:maxHistory-1]
	}
	return append(h, m)
}

// markOf returns the request an event belongs on the timeline of, and whether it replaces a
// previous mark of its kind (the registry says which kinds go on timelines, and how). Both
// the engine and View use it, so their timelines agree.
func markOf(ev Event) (id string, coalesce, ok bool) {
	k := infoOf(ev)
	if k == nil || k.flags&(onTimeline|coalesced) == 0 {
		return "", false, false
	}
	id, ok = k.request(ev)
	return id, k.flags&coalesced != 0, ok
}

// blockedKinds are the mark kinds of blocked evaluations, one per reason, so that blocked
// marks of different reasons stay distinct on a timeline.
var blockedKinds = func() [prepare.NumReasons]string {
	var k [prepare.NumReasons]string
	for r := range k {
		k[r] = "prepare_blocked:" + prepare.Reason(r).String()
	}
	return k
}()

func markKind(ev Event) string {
	if b, ok := ev.(PrepareBlocked); ok && int(b.Eval.Reason) < len(blockedKinds) {
		return blockedKinds[b.Eval.Reason]
	}
	return KindOf(ev)
}

// kvProgress tracks which reserved slots of a prepared request have been written.
type kvProgress struct {
	reserved int
	received int
	bits     []uint64 // by token index in the reservation
	// spans cut model 0's reserved slots by page, sorted by page, so a slot finds its token
	// index with a binary search.
	spans []kvSpan
	// runStart[i] is the token index of the first slot of run i (model 0), for attributing
	// writes to runs.
	runStart []int
	runRecv  []int
}

type kvSpan struct {
	page  int32
	off   int // first in-page offset reserved
	n     int
	index int // token index of the first slot
}

func newKVProgress(runs []pages.Run, pageSize int) kvProgress {
	var kp kvProgress
	for _, r := range runs {
		kp.runStart = append(kp.runStart, kp.reserved)
		for s := r.Start; s < r.End(); {
			page := int32(s / int64(pageSize))
			off := int(s % int64(pageSize))
			n := min(int(r.End()-s), pageSize-off)
			kp.spans = append(kp.spans, kvSpan{page: page, off: off, n: n, index: kp.reserved})
			kp.reserved += n
			s += int64(n)
		}
	}
	byPage := func(a, b kvSpan) int { return cmp.Compare(a.page, b.page) }
	if !slices.IsSortedFunc(kp.spans, byPage) {
		slices.SortFunc(kp.spans, byPage)
	}
	kp.bits = make([]uint64, (kp.reserved+63)/64)
	kp.runRecv = make([]int, len(runs))
	return kp
}

// index returns the token index of a slot in the reservation.
func (kp *kvProgress) index(slot int64, pageSize int) (int, bool) {
	page := int32(slot / int64(pageSize))
	off := int(slot % int64(pageSize))
	i := sort.Search(len(kp.spans), func(i int) bool { return kp.spans[i].page >= page })
	if i == len(kp.spans) || kp.spans[i].page != page {
		return 0, false
	}
	sp := kp.spans[i]
	if off < sp.off || off >= sp.off+sp.n {
		return 0, false
	}
	return sp.index + off - sp.off, true
}

func (kp *kvProgress) has(i int) bool { return kp.bits[i/64]&(1<<(i%64)) != 0 }

// set marks token index i received and returns the run it belongs to.
func (kp *kvProgress) set(i int) int {
	kp.bits[i/64] |= 1 << (i % 64)
	kp.received++
	run := sort.Search(len(kp.runStart), func(r int) bool { return kp.runStart[r] > i }) - 1
	kp.runRecv[run]++
	return run
}

// missing counts the unreceived token indexes in [0, n).
func (kp *kvProgress) missing(n int) int {
	n = min(n, kp.reserved)
	got := 0
	for i := range n {
		if kp.has(i) {
			got++
		}
	}
	return n - got
}

func (kp *kvProgress) complete() bool { return kp.received == kp.reserved }
