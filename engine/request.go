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
	// awaitAnswer marks a request a shadow admitted (follow.go) whose answer from the real
	// decode instance has not come yet.
	awaitAnswer bool

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
	retired                 bool     // forgotten, about to leave the table
	self                    []string // {id}, the answer of a KV write of its slots alone
	history                 []Mark

	links [numQueues]link // its places in the waiting, running and prepared queues
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
func newMark(ev Event) Mark { return infoOf(ev).newMark(ev) }

// newMark returns the mark of an event of kind k.
func (k *kindInfo) newMark(ev Event) Mark {
	name := k.name
	if b, ok := ev.(PrepareBlocked); ok && int(b.Eval.Reason) < len(blockedKinds) {
		name = blockedKinds[b.Eval.Reason]
	}
	return Mark{Stamp: ev.When(), Kind: name, ev: ev}
}

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
func markOf(ev Event) (id string, coalesce, ok bool) { return infoOf(ev).markOf(ev) }

// markOf is markOf for an event of kind k (nil: not an event of the registry).
func (k *kindInfo) markOf(ev Event) (id string, coalesce, ok bool) {
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

// kvProgress tracks which reserved slots of a prepared request have been written. The
// reservation's slots, model 0's runs written out in order, are its token indexes [0,
// reserved); what has arrived is kept as ranges of token indexes, so that a write costs the
// pages it touches, not the slots.
type kvProgress struct {
	reserved int
	received int
	// got is what has arrived: ranges of token indexes, in order, neither overlapping nor
	// touching.
	got []tokens
	// spans cut model 0's reserved slots by page, sorted by page, so a slot finds its token
	// index with a binary search.
	spans []kvSpan
	// runStart[i] is the token index of the first slot of run i (model 0), for attributing
	// writes to runs.
	runStart []int
	runRecv  []int
}

// tokens is the token indexes [lo, hi) of a reservation.
type tokens struct{ lo, hi int }

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
	kp.runRecv = make([]int, len(runs))
	kp.got = make([]tokens, 0, 2) // room for what arrives, in order or not
	return kp
}

// locate returns the token index of a slot in the reservation and how many slots from it
// on, up to n, follow it in the reservation on the same page; false if the slot is not
// reserved. hint is the span the previous call found (a write walks its pages in order),
// and the span found is returned for the next.
func (kp *kvProgress) locate(slot int64, n int64, pageSize int, hint int) (index, run, span int, ok bool) {
	page := int32(slot / int64(pageSize))
	off := int(slot % int64(pageSize))
	i := hint
	if i < 0 || i >= len(kp.spans) || kp.spans[i].page != page {
		i++ // the next page of a run is usually the next span
	}
	if i < 0 || i >= len(kp.spans) || kp.spans[i].page != page {
		i = sort.Search(len(kp.spans), func(i int) bool { return kp.spans[i].page >= page })
		if i == len(kp.spans) || kp.spans[i].page != page {
			return 0, 0, i, false
		}
	}
	sp := kp.spans[i]
	if off < sp.off || off >= sp.off+sp.n {
		return 0, 0, i, false
	}
	return sp.index + off - sp.off, int(min(n, int64(sp.off+sp.n-off))), i, true
}

// firstGot returns the first token index in [lo, hi) that has arrived.
func (kp *kvProgress) firstGot(lo, hi int) (int, bool) {
	// The first range that ends after lo.
	i := sort.Search(len(kp.got), func(i int) bool { return kp.got[i].hi > lo })
	if i < len(kp.got) && kp.got[i].lo < hi {
		return max(lo, kp.got[i].lo), true
	}
	return 0, false
}

// add records the token indexes [lo, hi), none of which has arrived, and counts them into
// the runs they belong to.
func (kp *kvProgress) add(lo, hi int) {
	kp.received += hi - lo
	for r := sort.Search(len(kp.runStart), func(r int) bool { return kp.runStart[r] > lo }) - 1; r < len(kp.runStart); r++ {
		end := kp.reserved
		if r+1 < len(kp.runStart) {
			end = kp.runStart[r+1]
		}
		kp.runRecv[r] += min(hi, end) - max(lo, kp.runStart[r])
		if hi <= end {
			break
		}
	}
	// Where [lo, hi) goes: after the ranges that end before it, merged with those it
	// touches.
	i := sort.Search(len(kp.got), func(i int) bool { return kp.got[i].hi >= lo })
	j := i
	for j < len(kp.got) && kp.got[j].lo <= hi {
		j++
	}
	if i < j { // touches got[i:j], with no overlap: merge them
		kp.got[i] = tokens{min(lo, kp.got[i].lo), max(hi, kp.got[j-1].hi)}
		kp.got = slices.Delete(kp.got, i+1, j)
		return
	}
	kp.got = slices.Insert(kp.got, i, tokens{lo, hi})
}

// missing counts the unreceived token indexes in [0, n).
func (kp *kvProgress) missing(n int) int {
	n = min(n, kp.reserved)
	got := 0
	for _, t := range kp.got {
		if t.lo >= n {
			break
		}
		got += min(t.hi, n) - t.lo
	}
	return n - got
}

func (kp *kvProgress) complete() bool { return kp.received == kp.reserved }

// runsOf appends to dst model 0's slots of the token indexes [lo, hi) of a reservation of
// runs, as runs.
func runsOf(dst, runs []pages.Run, lo, hi int) []pages.Run {
	at := 0
	for _, r := range runs {
		n := int(r.Len)
		if at+n > lo && at < hi {
			from, to := max(lo, at), min(hi, at+n)
			dst = append(dst, pages.Run{Start: r.Start + int64(from-at), Len: int64(to - from)})
		}
		if at += n; at >= hi {
			break
		}
	}
	return dst
}
