package engine

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
)

// Event is one state change of the engine, a past-tense fact. The set is closed: the
// concrete types are those in this file. Events are plain values with no pointers into the
// engine; applying them in order to a View built from a Snapshot gives the engine's next
// Snapshot.
type Event interface {
	// String describes the event in one line, deterministically.
	String() string
	// When returns when the event happened.
	When() Stamp
	isEvent()
}

// Stamp says when an event happened: during step Step (or, for the calls that come between
// steps, after it), at At milliseconds since the Unix epoch, engine time.
type Stamp struct {
	Step uint64 `json:"step"`
	At   int64  `json:"at"`
}

// When returns the stamp; every event embeds one.
func (s Stamp) When() Stamp { return s }
func (Stamp) isEvent()      {}

// RequestArrived fires when a prep_recv request is accepted into the waiting queue.
type RequestArrived struct {
	Stamp
	ID           string `json:"id"`
	PromptLength int    `json:"prompt_length"`
	End          int    `json:"end"` // resolved kv_window_end
	MaxTokens    int    `json:"max_tokens"`
}

// PrepareBlocked fires when a waiting prepare-receive request's evaluation changes: a new
// reason, or new numbers behind the same reason. It does not fire again while nothing
// changes.
type PrepareBlocked struct {
	Stamp
	ID   string             `json:"id"`
	Eval prepare.Evaluation `json:"eval"`
}

// PrepareAdmitted fires when prepare-receive admits a request. The request is then prepared:
// alive, holding Seq, in neither queue.
type PrepareAdmitted struct {
	Stamp
	ID         string `json:"id"`
	Seq        int64  `json:"seq"`
	End        int    `json:"end"`
	Matched    int    `json:"matched"`
	PagesTaken int    `json:"pages_taken"`
	Evicted    int    `json:"evicted"` // recycling sequences the admission evicted
}

// PrefixMatched fires when prepare-receive matches a request's prompt against the prefix
// cache: a new sequence, a fork of Parent at Matched, or the reuse of recycling Parent with
// Pop tokens rolled back.
type PrefixMatched struct {
	Stamp
	ID         string          `json:"id"`
	Seq        int64           `json:"seq"`
	Match      prefix.Kind     `json:"match"`
	Matched    int             `json:"matched"`
	Parent     int64           `json:"parent"`
	Pop        int             `json:"pop"`
	Path       []prefix.NodeID `json:"path"`
	Candidates int             `json:"candidates"`
}

// SeqAdded fires when a new, empty KV sequence is added for request ID.
type SeqAdded struct {
	Stamp
	Seq int64  `json:"seq"`
	ID  string `json:"id"`
}

// SeqForked fires when request ID's sequence Child is forked from Parent at Pos. A mid-page
// fork copies Pos mod page_size slots into CopiedPage (else -1).
type SeqForked struct {
	Stamp
	Parent     int64  `json:"parent"`
	Child      int64  `json:"child"`
	Pos        int    `json:"pos"`
	CopiedPage int32  `json:"copied_page"`
	ID         string `json:"id"`
}

// SeqPopped fires when N tokens are popped from a sequence (a reuse rolling back).
type SeqPopped struct {
	Stamp
	Seq int64 `json:"seq"`
	N   int   `json:"n"`
}

// PagesReserved fires when a sequence grows by N slots outside a decode step: a
// prepare-receive reservation or a prefill chunk. NewPages are the pages it took.
type PagesReserved struct {
	Stamp
	Seq      int64   `json:"seq"`
	ID       string  `json:"id"`
	N        int     `json:"n"`
	NewPages []int32 `json:"new_pages"`
}

// SeqRemoved fires when a KV sequence is removed other than by eviction (a preemption, a
// finish without the prefix cache, a reclaim); Freed pages went back to the free list.
type SeqRemoved struct {
	Stamp
	Seq   int64 `json:"seq"`
	Freed int   `json:"freed"`
}

// SeqRecycled fires when a finished request's sequence becomes recycling in the prefix cache.
type SeqRecycled struct {
	Stamp
	Seq int64  `json:"seq"`
	ID  string `json:"id"`
}

// SeqEvicted fires when the prefix cache evicts a recycling sequence (in the configured order:
// MLC's, usually the most recently recycled, or the least recently recycled) and its KV
// sequence is removed; Freed pages went back to the free list. ID is the request that last
// held it; Recycled is its recycle stamp (the prefix cache's count of recycles when it was
// recycled; 0 for one removed as it was recycled, with no recycling kept). Oldest is the
// least recently recycled sequence still held, -1 if none, and OldestRecycled its stamp: when
// it is older than the victim, MLC's order evicted newer KV and kept older.
type SeqEvicted struct {
	Stamp
	Seq            int64  `json:"seq"`
	ID             string `json:"id,omitempty"`
	Freed          int    `json:"freed"`
	Recycled       uint64 `json:"recycled"`
	Oldest         int64  `json:"oldest"`
	OldestRecycled uint64 `json:"oldest_recycled"`
}

// OlderKept reports whether a sequence recycled before the evicted one stayed.
func (e SeqEvicted) OlderKept() bool { return e.Oldest >= 0 && e.OldestRecycled < e.Recycled }

// MetadataEmitted fires with a prepare-receive answer: the reserved slots of each model as
// runs, and the kv_append_metadata string.
type MetadataEmitted struct {
	Stamp
	ID           string        `json:"id"`
	Seq          int64         `json:"seq"`
	PromptLength int           `json:"prompt_length"`
	Matched      int           `json:"matched"`
	Runs         [][]pages.Run `json:"runs"`
	Encoded      string        `json:"encoded"`
}

// KVReceived fires when a prefill instance's write lands: Runs are the slots written,
// Received and Reserved the request's totals after it.
type KVReceived struct {
	Stamp
	ID       string      `json:"id"`
	Runs     []pages.Run `json:"runs"`
	Received int         `json:"received"`
	Reserved int         `json:"reserved"`
}

// RequestStarted fires on start_generate. With a one-token tail the last prompt token is
// committed as if sampled (Committed) and MaxTokens grew by one; otherwise Tail tokens wait
// at the front of the waiting queue for prefill. Either way the request joins the running
// queue.
type RequestStarted struct {
	Stamp
	ID        string `json:"id"`
	Begin     int    `json:"begin"`
	Tail      int    `json:"tail"`
	Committed bool   `json:"committed"`
	MaxTokens int    `json:"max_tokens"`
}

// Prefilled fires when new-request prefill runs a chunk of a request's pending input. When
// Remaining is 0 the first token was sampled and the request leaves the waiting queue.
type Prefilled struct {
	Stamp
	ID        string `json:"id"`
	Tokens    int    `json:"tokens"`
	Remaining int    `json:"remaining"`
}

// Decoded fires when batch decode appends one token to each listed request.
type Decoded struct {
	Stamp
	IDs []string `json:"ids"`
}

// RequestFinished fires when a request has generated its tokens. Its sequence is recycled or
// removed (separate events).
type RequestFinished struct {
	Stamp
	ID        string `json:"id"`
	Generated int    `json:"generated"`
	Reason    string `json:"reason"` // "length"
}

// Abort reasons.
const (
	AbortByClient = "abort"
	AbortPreempt  = "preempt"
	AbortReclaim  = "reclaim"
)

// RequestAborted fires when a request is aborted: by its client, by preemption, or by
// kvtop's reclaim option. An aborted prepared request leaks its KV as MLC's does (Leaked,
// with its pages) unless reclaimed.
type RequestAborted struct {
	Stamp
	ID          string `json:"id"`
	Reason      string `json:"reason"`
	Leaked      bool   `json:"leaked"`
	LeakedPages int    `json:"leaked_pages"`
}

// RequestRetired fires when the engine forgets a finished or aborted request to keep its
// table bounded.
type RequestRetired struct {
	Stamp
	ID string `json:"id"`
}

// PrefixChanged fires at the end of a step or call that changed the prefix tree: the nodes
// created or modified (as they are now) and those deleted, the cache's counters, and the
// recycling sequences in the order the cache will evict them (the next victim first; under
// MLC's order a recycle may put a sequence anywhere in it, which only the cache knows).
type PrefixChanged struct {
	Stamp
	Upserts   []prefix.Node   `json:"upserts"`
	Removed   []prefix.NodeID `json:"removed"`
	Stats     prefix.Stats    `json:"stats"`
	Recycling []int64         `json:"recycling"`
	// Counterfactual is what the counterfactual prefix cache (the other eviction order) has
	// matched so far; nil when it is off.
	Counterfactual *Counterfactual `json:"counterfactual,omitempty"`
}

// Divergence fires when D's answer differs from the shadow's prediction: both answers, what
// differed, the likeliest cause the shadow can tell, and the page swaps by which it made
// its pages agree with the slots D named (applied with the event). Reset marks a shadow
// that starts over: viewers need a fresh snapshot.
type Divergence struct {
	Stamp
	ID             string         `json:"id"`
	What           DivergenceKind `json:"what"`
	Cause          string         `json:"cause"`
	ShadowMatched  int            `json:"shadow_matched"`
	DMatched       int            `json:"d_matched"`
	ShadowMetadata string         `json:"shadow_metadata,omitempty"`
	DMetadata      string         `json:"d_metadata,omitempty"`
	Swaps          []PageSwap     `json:"swaps,omitempty"`
	// Unknown are pages the shadow had free that D holds for something the shadow does not
	// know (it handed out pages below them): they go to the bottom of the free list (applied
	// with the event, after the swaps) and are counted as of unknown use.
	Unknown []int32 `json:"unknown,omitempty"`
	// Explained are pages of unknown use that D reserved for this request: their use is
	// known again.
	Explained []int32 `json:"explained,omitempty"`
	Reset     bool    `json:"reset,omitempty"`
}

// HazardDetected fires when the engine sees something that MLC lets happen silently and that
// usually means a bug in the router or the prefill instance (docs/lifecycle.md).
type HazardDetected struct {
	Stamp
	Hazard Hazard `json:"hazard"`
}

// StepCompleted closes every step with what it did and the counts after it.
type StepCompleted struct {
	Stamp
	Action    Action `json:"action"`
	Admitted  int    `json:"admitted"`
	Prefilled int    `json:"prefilled"`
	Decoded   int    `json:"decoded"`
	Preempted int    `json:"preempted"`
	Counts    Counts `json:"counts"`
}

// Counts are the engine's gauges after a step.
type Counts struct {
	Waiting     int `json:"waiting"` // prepare-receive requests waiting
	Blocked     int `json:"blocked"` // of which with a blocked reason
	Prepared    int `json:"prepared"`
	AwaitingKV  int `json:"awaiting_kv"` // prepared with KV still to arrive
	Running     int `json:"running"`
	Prefilling  int `json:"prefilling"` // started, with a tail waiting for prefill
	FreePages   int `json:"free_pages"`
	TotalSeqLen int `json:"total_seq_len"`
	Recycling   int `json:"recycling"`
}

// Action is what a step did: the first action that processed a request ends the step.
type Action uint8

// The actions, in the order a step tries them.
const (
	ActionIdle Action = iota
	ActionPrepareReceive
	ActionPrefill
	ActionDecode
)

var actionNames = [...]string{"idle", "prepare-receive", "prefill", "decode"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// MarshalText writes the action's name.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads an action's name.
func (a *Action) UnmarshalText(b []byte) error {
	for i, n := range actionNames {
		if n == string(b) {
			*a = Action(i)
			return nil
		}
	}
	return fmt.Errorf("engine: unknown action %q", b)
}

// The event registry: every kind of event, once, with its stable name (as used on the wire),
// the request it concerns, how it shows on that request's timeline and whether it can change
// the page map. Kind names, decoding, the list of kinds, the timelines and the page map's
// cache all read it.
var registry = [...]kindInfo{
	kind("request_arrived", func(e RequestArrived) string { return e.ID }, onTimeline),
	kind("prepare_blocked", func(e PrepareBlocked) string { return e.ID }, coalesced),
	kind("prepare_admitted", func(e PrepareAdmitted) string { return e.ID }, onTimeline|movesPages),
	kind("prefix_matched", func(e PrefixMatched) string { return e.ID }, onTimeline|movesPages),
	kind("seq_added", func(e SeqAdded) string { return e.ID }, movesPages),
	kind("seq_forked", func(e SeqForked) string { return e.ID }, movesPages),
	kind[SeqPopped]("seq_popped", nil, movesPages),
	kind("pages_reserved", func(e PagesReserved) string { return e.ID }, movesPages),
	kind[SeqRemoved]("seq_removed", nil, movesPages),
	kind("seq_recycled", func(e SeqRecycled) string { return e.ID }, movesPages),
	kind[SeqEvicted]("seq_evicted", nil, movesPages),
	kind("metadata_emitted", func(e MetadataEmitted) string { return e.ID }, onTimeline|movesPages),
	kind("kv_received", func(e KVReceived) string { return e.ID }, coalesced|movesPages),
	kind("request_started", func(e RequestStarted) string { return e.ID }, onTimeline|movesPages),
	kind("prefilled", func(e Prefilled) string { return e.ID }, coalesced),
	kind[Decoded]("decoded", nil, movesPages),
	kind("request_finished", func(e RequestFinished) string { return e.ID }, onTimeline|movesPages),
	kind("request_aborted", func(e RequestAborted) string { return e.ID }, onTimeline|movesPages),
	kind("request_retired", func(e RequestRetired) string { return e.ID }, movesPages),
	kind[PrefixChanged]("prefix_changed", nil, leavesRequests),
	kind("hazard_detected", func(e HazardDetected) string { return e.Hazard.ID }, onTimeline),
	kind[StepCompleted]("step_completed", nil, leavesRequests),
	// Follow mode's (follow.go), last so that the kinds before keep their codes.
	kind("divergence", func(e Divergence) string { return e.ID }, onTimeline|movesPages),
}

// kindFlags say how the events of a kind are treated.
type kindFlags uint8

const (
	// onTimeline puts the event on its request's timeline (page operations and retirement
	// are not a person's concern there).
	onTimeline kindFlags = 1 << iota
	// coalesced puts it on the timeline, a run of marks of the kind kept as the last one
	// (KV writes, progress, re-evaluations).
	coalesced
	// movesPages marks the kinds that can change what the page map derives (the cache, the
	// recycling list, a request's sequence, state or KV): the others leave it be.
	movesPages
	// leavesRequests marks the kinds that change nothing derivation reads of the requests
	// (their table, states, evaluations, hazards, tails): after them only the clock has
	// moved for the requests' statuses.
	leavesRequests
)

// kindInfo is one row of the registry.
type kindInfo struct {
	name    string
	typ     reflect.Type
	request func(Event) (string, bool)
	flags   kindFlags
	newPtr  func() Event
	deref   func(Event) (Event, bool)
}

// kind makes the registry row of event type T. request, when not nil, names the request an
// event of the kind concerns.
func kind[T Event](name string, request func(T) string, flags kindFlags) kindInfo {
	k := kindInfo{
		name:    name,
		typ:     reflect.TypeFor[T](),
		flags:   flags,
		request: func(Event) (string, bool) { return "", false },
		newPtr:  func() Event { return any(new(T)).(Event) },
		deref: func(ev Event) (Event, bool) {
			p, ok := any(ev).(*T)
			if !ok {
				return nil, false
			}
			return *p, true
		},
	}
	if request != nil {
		k.request = func(ev Event) (string, bool) { return request(ev.(T)), true }
	}
	return k
}

var (
	kindByName = map[string]*kindInfo{}
	kindByType = map[reflect.Type]*kindInfo{}
)

func init() {
	for i := range registry {
		k := &registry[i]
		kindByName[k.name] = k
		kindByType[k.typ] = k
		kindByType[reflect.PointerTo(k.typ)] = k
	}
}

func infoOf(ev Event) *kindInfo { return kindByType[reflect.TypeOf(ev)] }

// KindOf returns an event's stable name, as used on the wire ("request_arrived"); a pointer
// made by NewEvent has its value's kind.
func KindOf(ev Event) string {
	if k := infoOf(ev); k != nil {
		return k.name
	}
	return fmt.Sprintf("%T", ev)
}

// EventKinds lists every event kind, for decoders and metrics.
func EventKinds() []string {
	out := make([]string, len(registry))
	for i := range registry {
		out[i] = registry[i].name
	}
	return out
}

// RequestOf returns the request an event concerns, if it concerns one.
func RequestOf(ev Event) (string, bool) {
	if k := infoOf(ev); k != nil {
		return k.request(ev)
	}
	return "", false
}

// NewEvent returns a pointer to a zero event of the given kind, for decoders; Deref returns
// the event value behind it.
func NewEvent(kind string) (Event, bool) {
	k := kindByName[kind]
	if k == nil {
		return nil, false
	}
	return k.newPtr(), true
}

// Deref returns the event value behind a pointer made by NewEvent, and any other event as it
// is.
func Deref(ev Event) Event {
	if k := infoOf(ev); k != nil {
		if v, ok := k.deref(ev); ok {
			return v
		}
	}
	return ev
}

func (e RequestArrived) String() string {
	return fmt.Sprintf("arrived %s: prompt %d, end %d, max_tokens %d", e.ID, e.PromptLength, e.End, e.MaxTokens)
}

func (e PrepareBlocked) String() string {
	return fmt.Sprintf("blocked %s: %s", e.ID, e.Eval.String())
}

func (e PrepareAdmitted) String() string {
	s := fmt.Sprintf("admitted %s: seq %d, end %d, matched %d, %d pages taken", e.ID, e.Seq, e.End, e.Matched, e.PagesTaken)
	if e.Evicted > 0 {
		s += fmt.Sprintf(", %d evicted", e.Evicted)
	}
	return s
}

func (e PrefixMatched) String() string {
	switch e.Match {
	case prefix.Fork:
		return fmt.Sprintf("prefix %s: fork seq %d from %d at %d (%d candidates)", e.ID, e.Seq, e.Parent, e.Matched, e.Candidates)
	case prefix.Reuse:
		return fmt.Sprintf("prefix %s: reuse seq %d, matched %d, pop %d (%d candidates)", e.ID, e.Seq, e.Matched, e.Pop, e.Candidates)
	}
	return fmt.Sprintf("prefix %s: new seq %d", e.ID, e.Seq)
}

func (e SeqAdded) String() string { return fmt.Sprintf("seq %d added for %s", e.Seq, e.ID) }

func (e SeqForked) String() string {
	s := fmt.Sprintf("seq %d forked from %d at %d for %s", e.Child, e.Parent, e.Pos, e.ID)
	if e.CopiedPage >= 0 {
		s += fmt.Sprintf(", page %d copied", e.CopiedPage)
	}
	return s
}

func (e SeqPopped) String() string { return fmt.Sprintf("seq %d popped %d", e.Seq, e.N) }

func (e PagesReserved) String() string {
	return fmt.Sprintf("seq %d reserved %d slots for %s, new pages [%s]", e.Seq, e.N, e.ID, PageList(e.NewPages))
}

// PageList writes page ids compactly: ascending runs as "a-b", the rest one by one.
func PageList(pgs []int32) string {
	var b strings.Builder
	for i := 0; i < len(pgs); {
		j := i + 1
		for j < len(pgs) && pgs[j] == pgs[j-1]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		if j-i > 2 {
			fmt.Fprintf(&b, "%d-%d", pgs[i], pgs[j-1])
		} else {
			for k := i; k < j; k++ {
				if k > i {
					b.WriteByte(' ')
				}
				fmt.Fprint(&b, pgs[k])
			}
		}
		i = j
	}
	return b.String()
}

func (e SeqRemoved) String() string {
	return fmt.Sprintf("seq %d removed, %d pages freed", e.Seq, e.Freed)
}

func (e SeqRecycled) String() string { return fmt.Sprintf("seq %d of %s recycled", e.Seq, e.ID) }

func (e SeqEvicted) String() string {
	s := fmt.Sprintf("seq %d evicted", e.Seq)
	if e.ID != "" {
		s += " (" + e.ID + "'s)"
	}
	s += fmt.Sprintf(", %d pages freed", e.Freed)
	if e.Recycled > 0 {
		s += fmt.Sprintf("; recycled #%d", e.Recycled)
	}
	if e.OlderKept() {
		s += fmt.Sprintf(", seq %d recycled earlier (#%d) stays", e.Oldest, e.OldestRecycled)
	}
	return s
}

func (e MetadataEmitted) String() string {
	return fmt.Sprintf("metadata %s: %s %s", e.ID, runsText(e.Runs), e.Encoded)
}

func runsText(runs [][]pages.Run) string {
	var b strings.Builder
	for i, model := range runs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('[')
		for j, r := range model {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d+%d", r.Start, r.Len)
		}
		b.WriteByte(']')
	}
	return b.String()
}

func (e KVReceived) String() string {
	return fmt.Sprintf("kv %s: %s, %d/%d received", e.ID, runsText([][]pages.Run{e.Runs}), e.Received, e.Reserved)
}

func (e RequestStarted) String() string {
	if e.Committed {
		return fmt.Sprintf("started %s: begin %d, last token committed, max_tokens %d", e.ID, e.Begin, e.MaxTokens)
	}
	return fmt.Sprintf("started %s: begin %d, %d tokens to prefill", e.ID, e.Begin, e.Tail)
}

func (e Prefilled) String() string {
	return fmt.Sprintf("prefilled %s: %d tokens, %d left", e.ID, e.Tokens, e.Remaining)
}

func (e Decoded) String() string {
	return fmt.Sprintf("decoded %d: %s", len(e.IDs), strings.Join(e.IDs, " "))
}

func (e RequestFinished) String() string {
	return fmt.Sprintf("finished %s: %d tokens (%s)", e.ID, e.Generated, e.Reason)
}

func (e RequestAborted) String() string {
	s := fmt.Sprintf("aborted %s (%s)", e.ID, e.Reason)
	if e.Leaked {
		s += fmt.Sprintf(", %d pages leaked", e.LeakedPages)
	}
	return s
}

func (e RequestRetired) String() string { return "retired " + e.ID }

func (e PrefixChanged) String() string {
	ids := make([]string, 0, len(e.Upserts))
	for _, n := range e.Upserts {
		ids = append(ids, fmt.Sprint(n.ID))
	}
	s := fmt.Sprintf("prefix tree: %d nodes changed [%s], %d removed %v; hit %d/%d tokens",
		len(e.Upserts), strings.Join(ids, " "), len(e.Removed), e.Removed, e.Stats.HitTokens, e.Stats.QueryTokens)
	if len(e.Recycling) > 0 {
		s += fmt.Sprintf("; recycling %v, next evicted first", e.Recycling)
	}
	return s
}

func (e HazardDetected) String() string { return "hazard " + e.Hazard.String() }

func (e StepCompleted) String() string {
	c := e.Counts
	return fmt.Sprintf("step %d %s: admitted %d prefilled %d decoded %d preempted %d | waiting %d blocked %d prepared %d awaiting-kv %d running %d prefilling %d | free %d total %d recycling %d",
		e.Step, e.Action, e.Admitted, e.Prefilled, e.Decoded, e.Preempted,
		c.Waiting, c.Blocked, c.Prepared, c.AwaitingKV, c.Running, c.Prefilling, c.FreePages, c.TotalSeqLen, c.Recycling)
}
