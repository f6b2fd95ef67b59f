package feed

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
)

// History is what a viewer has received, in order: snapshots to start over from and the
// events after each, from which the state at any step it holds is rebuilt (StateAt). A
// recording played back is a History loaded from a file, unbounded; the dashboard keeps a
// bounded one of what it receives, to rewind a live engine. Both seek through StateAt, the
// one implementation of "the state at step N".
//
// The state at step N is that after every event stamped N or earlier: the step's own
// events, then the calls that came after it and before step N+1 (they carry N).
//
// # Bounds
//
// When the steps held span more than HistoryLimits.Steps, or their estimated memory passes
// HistoryLimits.Bytes, the oldest entries go, up to the next snapshot (a state must start
// from one). A viewer keeps snapshots coming: after each update it asks Due and, when it
// is, adds a snapshot of its own state with AddSnapshot. Due is spaced so that StateAt
// replays at most a tenth of the steps bound, and 128 events a request of the state (a
// snapshot costs a few microseconds a request, applying an event half a microsecond: the
// checkpoints cost the viewer some 25 ns an event, a seek a few milliseconds); and so that
// a history over a bound gets the snapshot it needs to shed its oldest part. What is held
// is then within both bounds after every update and its checkpoint.
//
// Memory is estimated from the entries' contents (their structs, slices and strings, with
// a little for the allocator), not measured: the estimate errs high.
//
// A History is not safe for concurrent use.
type History struct {
	lim     HistoryLimits
	entries []Entry
	start   int   // entries[start:] are held; those before are zero
	snaps   []int // indexes in entries of the snapshots held, ascending
	bytes   int64
	events  int // events held
	since   int // events since the last snapshot
	every   int // events between checkpoints, set by the last snapshot's size
}

// HistoryLimits bound a History; zero means no bound.
type HistoryLimits struct {
	// Steps is the most engine steps held: the last step minus the first.
	Steps uint64
	// Bytes is the most memory held, estimated.
	Bytes int64
}

// DefaultHistoryLimits are the dashboard's: the last 10,000 steps or 64 MB, whichever
// comes first.
var DefaultHistoryLimits = HistoryLimits{Steps: 10_000, Bytes: 64 << 20}

// Entry is one thing a viewer received: a snapshot, or an event.
type Entry struct {
	Snapshot *engine.Snapshot // a snapshot to start over from, or
	Event    engine.Event     // an event that applies to the state before it
	Stamp    engine.Stamp     // the snapshot's or the event's
	size     int64
}

// ErrNoState is returned by StateAt when the history holds no snapshot yet.
var ErrNoState = errors.New("feed: the history holds no snapshot")

// Checkpoints: at least minEvery events apart, perRequest events a request of the last
// snapshot, and no more than a tenth of the steps bound.
const (
	minEvery   = 4096
	perRequest = 128
)

// NewHistory returns an empty history within lim.
func NewHistory(lim HistoryLimits) *History {
	return &History{lim: lim, every: minEvery}
}

// Limits returns the history's bounds.
func (h *History) Limits() HistoryLimits { return h.lim }

// Add appends what an update brought: its snapshot, then its events. Events that come
// before any snapshot are dropped: there is no state for them to apply to.
func (h *History) Add(u Update) {
	if u.Snapshot != nil {
		h.AddSnapshot(u.Snapshot)
	}
	h.AddEvents(u.Events)
}

// AddSnapshot appends a snapshot: one the source sent, or the viewer's own checkpoint when
// Due. The history keeps the pointer: the snapshot must not change afterwards.
func (h *History) AddSnapshot(s *engine.Snapshot) {
	e := Entry{Snapshot: s, Stamp: s.Stamp, size: SnapshotBytes(s)}
	h.snaps = append(h.snaps, len(h.entries))
	h.push(e)
	h.since = 0
	h.every = max(minEvery, perRequest*len(s.Requests))
	h.trim()
}

// AddEvents appends events.
func (h *History) AddEvents(evs []engine.Event) {
	if len(h.snaps) == 0 {
		return
	}
	for _, ev := range evs {
		h.push(Entry{Event: ev, Stamp: ev.When(), size: EventBytes(ev)})
	}
	h.since += len(evs)
	h.events += len(evs)
	h.trim()
}

func (h *History) push(e Entry) {
	if h.start > 0 && h.start >= len(h.entries)/2 && len(h.entries) == cap(h.entries) {
		// Slide what is held to the front rather than grow: the array stays about twice
		// what is held.
		n := copy(h.entries, h.entries[h.start:])
		clear(h.entries[n:])
		h.entries = h.entries[:n]
		for i := range h.snaps {
			h.snaps[i] -= h.start
		}
		h.start = 0
	}
	h.entries = append(h.entries, e)
	h.bytes += e.size
}

// Due says whether the viewer should add a snapshot of its state now.
func (h *History) Due() bool {
	switch {
	case len(h.snaps) == 0 || h.since == 0:
		return false
	case h.since >= h.every:
		return true
	case h.lim.Steps > 0 && h.last().Step-h.entries[h.snaps[len(h.snaps)-1]].Stamp.Step >= max(h.lim.Steps/10, 1):
		return true
	}
	return len(h.snaps) == 1 && h.over()
}

func (h *History) last() engine.Stamp { return h.entries[len(h.entries)-1].Stamp }

// over says whether what is held passes a bound.
func (h *History) over() bool {
	if len(h.snaps) == 0 {
		return false
	}
	first := h.entries[h.start].Stamp.Step
	return (h.lim.Steps > 0 && h.last().Step-first > h.lim.Steps) || (h.lim.Bytes > 0 && h.bytes > h.lim.Bytes)
}

// trim drops the oldest part, a snapshot and its events at a time, while a bound is passed
// and a later snapshot can take over.
func (h *History) trim() {
	for len(h.snaps) >= 2 && h.over() {
		next := h.snaps[1]
		for i := h.start; i < next; i++ {
			h.bytes -= h.entries[i].size
			if h.entries[i].Event != nil {
				h.events--
			}
			h.entries[i] = Entry{} // let the events go
		}
		h.start = next
		h.snaps = h.snaps[1:]
	}
}

// Reset empties the history, for a source that starts over from an earlier step (a new
// engine): steps must not go backwards within a history.
func (h *History) Reset() {
	*h = History{lim: h.lim, every: minEvery, entries: h.entries[:0], snaps: h.snaps[:0]}
	clear(h.entries[:cap(h.entries)])
}

// Len returns how many entries are held.
func (h *History) Len() int { return len(h.entries) - h.start }

// At returns entry i, oldest first.
func (h *History) At(i int) Entry { return h.entries[h.start+i] }

// Events returns how many of the entries held are events.
func (h *History) Events() int { return h.events }

// Bytes returns the estimated memory of what is held.
func (h *History) Bytes() int64 { return h.bytes }

// Snapshots returns how many snapshots are held.
func (h *History) Snapshots() int { return len(h.snaps) }

// Steps returns the first and last steps held; ok is false while no snapshot is.
func (h *History) Steps() (first, last uint64, ok bool) {
	if len(h.snaps) == 0 {
		return 0, 0, false
	}
	return h.entries[h.start].Stamp.Step, h.last().Step, true
}

// StateAt returns the state after everything held up to and including step: the last
// snapshot at or before it (the first one, for a step before it) with the events after it
// applied; and the index of the first entry after that state, from which Advance goes on.
func (h *History) StateAt(step uint64) (*engine.View, int, error) {
	if len(h.snaps) == 0 {
		return nil, 0, ErrNoState
	}
	from := h.snaps[0]
	for k := len(h.snaps) - 1; k >= 0; k-- {
		if h.entries[h.snaps[k]].Stamp.Step <= step {
			from = h.snaps[k]
			break
		}
	}
	v, err := engine.NewView(*h.entries[from].Snapshot)
	if err != nil {
		return nil, 0, fmt.Errorf("feed: the snapshot of step %d: %w", h.entries[from].Stamp.Step, err)
	}
	return h.Advance(v, from+1-h.start, step)
}

// Advance applies to v, a state StateAt or Advance returned with next, the entries from
// next on that are stamped step or earlier. A snapshot among them replaces v.
func (h *History) Advance(v *engine.View, next int, step uint64) (*engine.View, int, error) {
	i := h.start + next
	for ; i < len(h.entries) && h.entries[i].Stamp.Step <= step; i++ {
		e := &h.entries[i]
		if e.Snapshot != nil {
			nv, err := engine.NewView(*e.Snapshot)
			if err != nil {
				return nil, 0, fmt.Errorf("feed: the snapshot of step %d: %w", e.Stamp.Step, err)
			}
			v = nv
			continue
		}
		if err := v.Apply(e.Event); err != nil {
			return nil, 0, err
		}
	}
	return v, i - h.start, nil
}

// The memory estimates. Each heap object costs its size rounded up by the allocator, and a
// word or two of bookkeeping: allocOverhead stands for both.
const (
	allocOverhead = 16
	// entryBytes is an entry's slot, twice: the array of entries is up to twice what is
	// held before it slides (push).
	entryBytes = 2 * int64(unsafe.Sizeof(Entry{}))
)

func strBytes(s string) int64 {
	if s == "" {
		return 0
	}
	return int64(len(s)) + allocOverhead
}

func sliceBytes[T any](s []T) int64 {
	if len(s) == 0 {
		return 0
	}
	var zero T
	return int64(cap(s))*int64(unsafe.Sizeof(zero)) + allocOverhead
}

func runsBytes(runs [][]pages.Run) int64 {
	n := sliceBytes(runs)
	for _, r := range runs {
		n += sliceBytes(r)
	}
	return n
}

// EventBytes estimates the memory an event holds in a history: its entry, its value on
// the heap and what its slices and strings point to.
func EventBytes(ev engine.Event) int64 {
	n := entryBytes + allocOverhead
	switch e := ev.(type) {
	case engine.RequestArrived:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.PrepareBlocked:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + strBytes(e.Eval.Behind)
	case engine.PrepareAdmitted:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.PrefixMatched:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + sliceBytes(e.Path)
	case engine.SeqAdded:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.SeqForked:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.SeqPopped:
		n += int64(unsafe.Sizeof(e))
	case engine.PagesReserved:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + sliceBytes(e.NewPages)
	case engine.SeqRemoved:
		n += int64(unsafe.Sizeof(e))
	case engine.SeqRecycled:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.SeqEvicted:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.MetadataEmitted:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + runsBytes(e.Runs) + strBytes(e.Encoded)
	case engine.KVReceived:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + sliceBytes(e.Runs)
	case engine.RequestStarted:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.Prefilled:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.Decoded:
		n += int64(unsafe.Sizeof(e)) + sliceBytes(e.IDs)
		for _, id := range e.IDs {
			n += strBytes(id)
		}
	case engine.RequestFinished:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + strBytes(e.Reason)
	case engine.RequestAborted:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID) + strBytes(e.Reason)
	case engine.RequestRetired:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.ID)
	case engine.PrefixChanged:
		n += int64(unsafe.Sizeof(e)) + sliceBytes(e.Removed) + sliceBytes(e.Recycling)
		n += nodesBytes(e.Upserts)
		if e.Counterfactual != nil {
			n += int64(unsafe.Sizeof(*e.Counterfactual)) + allocOverhead
		}
	case engine.HazardDetected:
		n += int64(unsafe.Sizeof(e)) + strBytes(e.Hazard.ID) + strBytes(e.Hazard.Parent)
	case engine.StepCompleted:
		n += int64(unsafe.Sizeof(e))
	default:
		n += 256 // a kind this estimate does not know: a generous guess
	}
	return n
}

func nodesBytes(ns []prefix.Node) int64 {
	n := sliceBytes(ns)
	for _, nd := range ns {
		n += sliceBytes(nd.Seqs)
	}
	return n
}

// SnapshotBytes estimates the memory a snapshot holds in a history.
func SnapshotBytes(s *engine.Snapshot) int64 {
	n := entryBytes + int64(unsafe.Sizeof(*s)) + allocOverhead
	n += sliceBytes(s.Requests)
	for i := range s.Requests {
		r := &s.Requests[i]
		n += strBytes(r.ID) + runsBytes(r.Runs) + strBytes(r.Encoded) + sliceBytes(r.RunReceived) +
			sliceBytes(r.Hazards) + strBytes(r.FinishReason) + sliceBytes(r.History)
		for _, m := range r.History {
			n += strBytes(m.Text)
		}
		if r.Eval != nil {
			n += int64(unsafe.Sizeof(*r.Eval)) + allocOverhead
		}
	}
	n += sliceBytes(s.Waiting) + sliceBytes(s.Running)
	for _, id := range s.Waiting {
		n += strBytes(id)
	}
	for _, id := range s.Running {
		n += strBytes(id)
	}
	p := &s.Pages
	n += sliceBytes(p.Free) + sliceBytes(p.FreeBlocks) + sliceBytes(p.Blocks) + sliceBytes(p.Seqs)
	for i := range p.Blocks {
		n += sliceBytes(p.Blocks[i].Pages)
	}
	n += nodesBytes(s.Prefix) + sliceBytes(s.Recycling) + sliceBytes(s.Owners)
	for _, o := range s.Owners {
		n += strBytes(o.ID)
	}
	n += sliceBytes(s.Metadata)
	for i := range s.Metadata {
		n += runsBytes(s.Metadata[i].Runs) + strBytes(s.Metadata[i].Encoded)
	}
	n += sliceBytes(s.Hazards)
	if s.LastMatch != nil {
		n += int64(unsafe.Sizeof(*s.LastMatch)) + sliceBytes(s.LastMatch.Path) + allocOverhead
	}
	if s.Counterfactual != nil {
		n += int64(unsafe.Sizeof(*s.Counterfactual)) + allocOverhead
	}
	return n
}
