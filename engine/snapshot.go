package engine

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/internal/invariants"
)

// Snapshot is the whole state a viewer needs to draw the engine from scratch. Applying the
// engine's later events to it (through a View) gives the engine's later snapshots.
type Snapshot struct {
	Config Config `json:"config"`
	// Stamp is that of the last event the snapshot includes.
	Stamp    Stamp         `json:"stamp"`
	Requests []RequestView `json:"requests"` // the request table, in arrival order
	// Waiting is the waiting queue: prepare-receive requests, and started requests whose
	// tail waits for prefill (at the front).
	Waiting []string `json:"waiting"`
	Running []string `json:"running"`
	// Pages is model 0's paged KV cache (every model's is alike).
	Pages       pages.State   `json:"pages"`
	Prefix      []prefix.Node `json:"prefix"` // the radix tree, depth first, root first
	PrefixStats prefix.Stats  `json:"prefix_stats"`
	// Counterfactual is what the prefix cache would have matched under the other eviction
	// order; nil when that is off.
	Counterfactual *Counterfactual `json:"counterfactual,omitempty"`
	// Recycling lists the recycling sequences in the order the prefix cache will evict
	// them, the next victim first.
	Recycling []int64 `json:"recycling"`
	// Owners names the request holding, or that last held, each KV sequence.
	Owners   []SeqOwner        `json:"owners"`
	Metadata []MetadataEmitted `json:"metadata"` // recent prepare-receive answers, oldest first
	// LastMatch is the most recent prefix match, for the dashboard's "last match" path.
	LastMatch *PrefixMatched   `json:"last_match,omitempty"`
	Hazards   []HazardDetected `json:"hazards"` // recent hazards, oldest first
	Totals    Totals           `json:"totals"`
	Last      StepCompleted    `json:"last"` // the last step's summary
	// Derived is what the state means in counts (derive.go): the same numbers the dashboard
	// and /metrics show.
	Derived Derived `json:"derived"`
	// Follow is a shadow's standing (follow.go); nil for an engine that decides alone.
	Follow *Standing `json:"follow,omitempty"`
}

// SeqOwner names the request of a KV sequence.
type SeqOwner struct {
	Seq int64  `json:"seq"`
	ID  string `json:"id"`
}

// RequestView is one request as a viewer sees it.
type RequestView struct {
	ID           string       `json:"id"`
	State        RequestState `json:"state"`
	PromptLength int          `json:"prompt_length"`
	End          int          `json:"end"`
	MaxTokens    int          `json:"max_tokens"`
	Seq          int64        `json:"seq"` // -1 until admitted
	Matched      int          `json:"matched"`
	Match        prefix.Kind  `json:"match"`
	Parent       int64        `json:"parent"`
	// Runs are the reserved slots of each model; Encoded the kv_append_metadata answer.
	Runs    [][]pages.Run `json:"runs,omitempty"`
	Encoded string        `json:"encoded,omitempty"`
	// Reserved and Received count model 0's reserved slots and those written; RunReceived
	// counts the written ones per run of model 0.
	Reserved    int   `json:"reserved"`
	Received    int   `json:"received"`
	RunReceived []int `json:"run_received,omitempty"`
	Pending     int   `json:"pending"` // tail tokens left to prefill
	Generated   int   `json:"generated"`

	Arrived  Stamp `json:"arrived"`
	Admitted Stamp `json:"admitted"`
	Started  Stamp `json:"started"`
	Ended    Stamp `json:"ended"`

	// Eval is the admission evaluation of a waiting request at the head of the line, as of
	// its last change; nil for one that has not been evaluated or is not waiting. A waiting
	// request behind a blocked head is blocked head-of-line (see View.Blocked).
	Eval         *prepare.Evaluation `json:"eval,omitempty"`
	Leaked       bool                `json:"leaked,omitempty"`
	FinishReason string              `json:"finish_reason,omitempty"`
	Hazards      []HazardKind        `json:"hazards,omitempty"`
	History      []Mark              `json:"history"`
}

// Snapshot returns the engine's state. Take it when no events are pending (after Step or
// TakeEvents): the snapshot includes their effects.
func (e *Engine) Snapshot() Snapshot {
	p := snapshotParts{
		cfg: e.cfg, stamp: e.stamp, cache: e.caches[0], prefix: e.prefix.Nodes(), stats: e.prefix.Stats(), cf: e.alt.state(e.cfg),
		recycling: e.prefix.Recycling(), metadata: e.metadata, hazards: e.hazards, lastMatch: e.lastMatch,
		totals: e.totals, last: e.last, derived: e.Derived(),
	}
	if e.follow != nil {
		st := e.Standing()
		p.follow = &st
	}
	for _, r := range e.order {
		p.requests = append(p.requests, r.view())
	}
	for r := range e.waiting.all() {
		p.waiting = append(p.waiting, r.id)
	}
	for r := range e.running.all() {
		p.running = append(p.running, r.id)
	}
	for seq, r := range e.seqOwner {
		p.owners = append(p.owners, SeqOwner{Seq: seq, ID: r.id})
	}
	return p.build()
}

// Derived returns what the engine's state means in counts, pages included (derive.go).
func (e *Engine) Derived() Derived { return e.derive() }

// snapshotParts are what a snapshot is made of. The engine and a View each fill them from
// their own records; build makes the one Snapshot form of both, copying what they share.
type snapshotParts struct {
	cfg              Config
	stamp            Stamp
	cache            *pages.Cache
	prefix           []prefix.Node
	stats            prefix.Stats
	cf               *Counterfactual
	recycling        []int64
	metadata         []MetadataEmitted
	hazards          []HazardDetected
	lastMatch        *PrefixMatched
	totals           Totals
	last             StepCompleted
	requests         []RequestView // owned by the snapshot
	waiting, running []string      // owned by the snapshot
	owners           []SeqOwner    // owned by the snapshot, in any order
	derived          Derived
	follow           *Standing // owned by the snapshot
}

func (p snapshotParts) build() Snapshot {
	s := Snapshot{
		Config:         p.cfg,
		Stamp:          p.stamp,
		Requests:       p.requests,
		Waiting:        p.waiting,
		Running:        p.running,
		Pages:          p.cache.State(),
		Prefix:         p.prefix,
		PrefixStats:    p.stats,
		Recycling:      slices.Clone(p.recycling),
		Counterfactual: p.cf.clone(),
		Owners:         p.owners,
		Metadata:       slices.Clone(p.metadata),
		Hazards:        slices.Clone(p.hazards),
		Totals:         p.totals,
		Last:           p.last,
		Derived:        p.derived,
		Follow:         p.follow,
	}
	if p.lastMatch != nil {
		m := *p.lastMatch
		s.LastMatch = &m
	}
	slices.SortFunc(s.Owners, func(a, b SeqOwner) int { return cmp.Compare(a.Seq, b.Seq) })
	s.normalize()
	return s
}

func (r *request) view() RequestView {
	v := RequestView{
		ID: r.id, State: r.state, PromptLength: len(r.prompt), End: r.end, MaxTokens: r.maxTokens,
		Seq: r.seq, Matched: r.matched, Match: r.match, Parent: r.parent,
		Runs: r.runs, Encoded: r.encoded, Reserved: r.kv.reserved, Received: r.kv.received,
		RunReceived: slices.Clone(r.kv.runRecv), Pending: r.pending, Generated: r.generated,
		Arrived: r.arrived, Admitted: r.admitted, Started: r.started, Ended: r.ended,
		Leaked: r.leaked, FinishReason: r.finishReason,
		Hazards: slices.Clone(r.hazards), History: materialize(r.history),
	}
	if r.eval != nil {
		ev := *r.eval
		v.Eval = &ev
	}
	return v
}

// normalize makes empty lists nil so that equal states compare equal however they were
// built.
func (s *Snapshot) normalize() {
	nilIfEmpty(&s.Requests)
	nilIfEmpty(&s.Waiting)
	nilIfEmpty(&s.Running)
	nilIfEmpty(&s.Prefix)
	nilIfEmpty(&s.Recycling)
	nilIfEmpty(&s.Owners)
	nilIfEmpty(&s.Metadata)
	nilIfEmpty(&s.Hazards)
	nilIfEmpty(&s.Pages.Free)
	nilIfEmpty(&s.Pages.FreeBlocks)
	nilIfEmpty(&s.Pages.Blocks)
	nilIfEmpty(&s.Pages.Seqs)
	for i := range s.Pages.Blocks {
		nilIfEmpty(&s.Pages.Blocks[i].Pages)
	}
	for i := range s.Prefix {
		nilIfEmpty(&s.Prefix[i].Seqs)
	}
	for i := range s.Requests {
		r := &s.Requests[i]
		nilIfEmpty(&r.Runs)
		nilIfEmpty(&r.RunReceived)
		nilIfEmpty(&r.Hazards)
		nilIfEmpty(&r.History)
		for j := range r.Runs {
			nilIfEmpty(&r.Runs[j])
		}
	}
}

func nilIfEmpty[S ~[]T, T any](s *S) {
	if len(*s) == 0 {
		*s = nil
	}
}

// ErrDiverged is returned by View.Apply when an event does not fit the view's state: the
// view missed something and needs a fresh snapshot.
var ErrDiverged = errors.New("engine: view diverged from the engine")

// View is a viewer's live copy of the engine's state: a Snapshot kept current by applying
// the engine's events in order. It keeps a replica of model 0's paged KV cache, so the page
// map is exact. A View is not safe for concurrent use.
type View struct {
	cfg   Config
	stamp Stamp
	reqs  map[string]*viewRequest
	order []*RequestView
	// serials are the requests' serial numbers, in table order (ascending): a request's
	// place in the table is found by its serial.
	serials   []uint64
	serial    uint64 // the last one given
	holes     int    // places of retired requests, nil in order until compact
	waiting   []string
	running   []string
	cache     *pages.Cache
	nodes     map[prefix.NodeID]prefix.Node
	stats     prefix.Stats
	cf        *Counterfactual
	recycling []int64
	// recyclingWas is the array of the list before the last prefix change, for the next.
	recyclingWas []int64
	owners       map[int64]string
	holders      []*viewRequest // by sequence id: the request owners names, while in the table
	kv           map[string]*kvProgress
	metadata     []MetadataEmitted
	hazards      []HazardDetected
	lastMatch    *PrefixMatched
	totals       Totals
	last         StepCompleted
	version      uint64
	follow       *Standing      // a shadow's standing, nil otherwise
	unknown      map[int32]bool // a shadow's pages of unknown use (Standing.UnknownPageIDs)

	// What is derived from the view (derive.go). The page map is built once, when first
	// asked for, and then kept current by the events as they apply (pagekeep.go);
	// pagesVersion changes whenever it may have changed. The requests' facts and statuses
	// are kept in table order for the first len(fs) requests (the others arrived since
	// they were last derived); dirty lists the serials of the requests the events changed
	// since, whose facts are read again and whose statuses are derived again (all of them
	// when the line's head changes from blocked to not or back, or the page map was built
	// again).
	pagesVersion uint64
	pm           PageMap
	fs           []facts
	sts          []RequestStatus
	// changed is, for each of them, the view's version when its record or its status last
	// changed (RequestVersions); flags mark those to derive again, and those not tallied
	// yet.
	changed      []uint64
	flags        []uint8
	rederive     []uint64 // the serials of those marked to derive again
	dirty        []uint64
	dirtyGen     uint64 // a request is listed in dirty once a generation
	t            tally  // of sts
	waitingFacts int    // of fs, those of waiting requests
	headBlocked  bool   // the line's head was blocked when sts were derived
	headAt       int    // and its place in the table (len(fs): none waited)
	derivedAt    int64  // the time sts were derived for
	nextStuck    int64  // no later than the first time a prepared request becomes stuck
	pmEpoch      uint64 // the page map's epoch they were derived with
	derived      Derived
	dVersion     uint64
	slots        []int64 // the cache's reservations, reused
	pgBuf        []int32 // a sequence's pages, reused
	unread       int     // events applied since the page map was last read
	runBuf       []pageRun
}

// viewRequest is a View's record of one request: what the engine's snapshot says of it,
// and what the View keeps of it.
type viewRequest struct {
	RequestView
	serial   uint64
	dirtyGen uint64    // the generation of dirty it was last listed in
	runs     []pageRun // the reserved runs it shows on the page map (pagekeep.go)
}

// NewView builds a view from a snapshot.
func NewView(s Snapshot) (*View, error) {
	c, err := pages.FromState(s.Pages, nil)
	if err != nil {
		return nil, fmt.Errorf("engine: view from snapshot: %w", err)
	}
	v := &View{
		cfg: s.Config, stamp: s.Stamp, cache: c,
		reqs:      make(map[string]*viewRequest, len(s.Requests)),
		waiting:   slices.Clone(s.Waiting),
		running:   slices.Clone(s.Running),
		nodes:     make(map[prefix.NodeID]prefix.Node, len(s.Prefix)),
		stats:     s.PrefixStats,
		cf:        s.Counterfactual.clone(),
		recycling: slices.Clone(s.Recycling),
		owners:    make(map[int64]string, len(s.Owners)),
		kv:        make(map[string]*kvProgress),
		metadata:  slices.Clone(s.Metadata),
		hazards:   slices.Clone(s.Hazards),
		totals:    s.Totals,
		last:      s.Last,
		version:   1,

		pagesVersion: 1,
	}
	if s.LastMatch != nil {
		m := *s.LastMatch
		v.lastMatch = &m
	}
	if s.Follow != nil {
		f := s.Follow.clone()
		v.follow = &f
		v.unknown = make(map[int32]bool, len(f.UnknownPageIDs))
		for _, p := range f.UnknownPageIDs {
			v.unknown[p] = true
		}
	}
	for i := range s.Requests {
		vr := &viewRequest{RequestView: s.Requests[i]}
		r := &vr.RequestView
		r.History = slices.Clone(r.History)
		r.Hazards = slices.Clone(r.Hazards)
		r.RunReceived = slices.Clone(r.RunReceived)
		if _, dup := v.reqs[r.ID]; dup {
			return nil, fmt.Errorf("engine: view from snapshot: request %s twice: %w", r.ID, ErrDiverged)
		}
		v.add(vr)
		if len(r.Runs) > 0 && r.Reserved > 0 {
			kp := newKVProgress(r.Runs[0], s.Config.PageSize)
			if kp.reserved != r.Reserved || len(kp.runRecv) != len(r.RunReceived) {
				return nil, fmt.Errorf("engine: view from snapshot: request %s reserves %d slots, runs hold %d: %w", r.ID, r.Reserved, kp.reserved, ErrDiverged)
			}
			// Which slots were written is not in the snapshot, only how many per run. A
			// viewer needs no more: later writes are counted by the runs they land in.
			copy(kp.runRecv, r.RunReceived)
			kp.received = r.Received
			v.kv[r.ID] = &kp
		}
	}
	for _, n := range s.Prefix {
		v.nodes[n.ID] = n
	}
	for _, o := range s.Owners {
		v.setOwner(o.Seq, o.ID)
	}
	return v, nil
}

// Version changes whenever the view changes; panels cache what they render by it.
func (v *View) Version() uint64 { return v.version }

// Config returns the engine's configuration.
func (v *View) Config() Config { return v.cfg }

// Stamp returns the stamp of the last event applied.
func (v *View) Stamp() Stamp { return v.stamp }

// Cache returns the replica of model 0's paged KV cache. Read it; do not change it.
func (v *View) Cache() *pages.Cache { return v.cache }

// Request returns a request by id.
func (v *View) Request(id string) (*RequestView, bool) {
	if r := v.reqs[id]; r != nil {
		return &r.RequestView, true
	}
	return nil, false
}

// add puts a request at the end of the table.
func (v *View) add(r *viewRequest) {
	v.serial++
	r.serial = v.serial
	v.reqs[r.ID] = r
	v.order = append(v.order, &r.RequestView)
	v.serials = append(v.serials, r.serial)
}

// place returns a request's place in the table (retired requests leave theirs empty until
// compact).
func (v *View) place(r *viewRequest) (int, bool) {
	i, ok := slices.BinarySearch(v.serials, r.serial)
	return i, ok && v.order[i] != nil
}

// touch notes that a request's record changed (or, for its status, what it holds): its
// facts are read again and its status derived again.
func (v *View) touch(r *viewRequest) {
	if len(v.fs) == 0 {
		return // nothing derived yet: it all will be
	}
	if r.dirtyGen != v.dirtyGen {
		r.dirtyGen = v.dirtyGen
		v.dirty = append(v.dirty, r.serial)
	}
}

// retire takes a request out of the table, and out of what is derived of it. Its place is
// left empty until the table is next read (compact), so that the retirements of a batch of
// events close up the table once.
func (v *View) retire(r *viewRequest) {
	i, ok := v.place(r)
	if !ok {
		return
	}
	v.order[i] = nil
	v.holes++
	if r.Seq >= 0 && r.Seq < int64(len(v.holders)) && v.holders[r.Seq] == r {
		v.holders[r.Seq] = nil
	}
	if i < len(v.fs) {
		if v.flags[i]&untallied == 0 {
			v.t.sub(&v.sts[i])
		}
		v.waitingFacts -= waiting(&v.fs[i])
	}
	delete(v.reqs, r.ID)
}

// compact closes up the places retire left empty.
func (v *View) compact() {
	if v.holes == 0 {
		return
	}
	k, derived, before := 0, 0, 0
	for i, r := range v.order {
		if r == nil {
			if i < v.headAt {
				before++
			}
			continue
		}
		v.order[k], v.serials[k] = r, v.serials[i]
		if i < len(v.fs) {
			v.fs[k], v.sts[k], v.changed[k], v.flags[k] = v.fs[i], v.sts[i], v.changed[i], v.flags[i]
			derived = k + 1
		}
		k++
	}
	clear(v.order[k:])
	v.order, v.serials = v.order[:k], v.serials[:k]
	v.fs, v.sts, v.changed, v.flags = v.fs[:derived], v.sts[:derived], v.changed[:derived], v.flags[:derived]
	v.headAt -= before
	v.holes = 0
}

// Requests returns the request table in arrival order. Read it; do not change it.
func (v *View) Requests() []*RequestView {
	v.compact()
	return v.order
}

// Waiting and Running return the queues.
func (v *View) Waiting() []string { return v.waiting }
func (v *View) Running() []string { return v.running }

// Owner returns the request holding, or that last held, a KV sequence.
func (v *View) Owner(seq int64) (string, bool) {
	id, ok := v.owners[seq]
	return id, ok
}

// Recycling returns the recycling sequences, next evicted first.
func (v *View) Recycling() []int64 { return v.recycling }

// Counterfactual returns what the prefix cache would have matched under the other eviction
// order, if the engine runs the counterfactual.
func (v *View) Counterfactual() (Counterfactual, bool) {
	if v.cf == nil {
		return Counterfactual{}, false
	}
	return *v.cf, true
}

// PrefixStats returns the prefix cache's counters.
func (v *View) PrefixStats() prefix.Stats { return v.stats }

// Node returns a prefix tree node.
func (v *View) Node(id prefix.NodeID) (prefix.Node, bool) {
	n, ok := v.nodes[id]
	return n, ok
}

// Metadata returns the recent prepare-receive answers, oldest first.
func (v *View) Metadata() []MetadataEmitted { return v.metadata }

// Hazards returns the recent hazards, oldest first.
func (v *View) Hazards() []HazardDetected { return v.hazards }

// Totals returns the counters.
func (v *View) Totals() Totals { return v.totals }

// LastMatch returns the most recent prefix match, if any.
func (v *View) LastMatch() (PrefixMatched, bool) {
	if v.lastMatch == nil {
		return PrefixMatched{}, false
	}
	return *v.lastMatch, true
}

// Last returns the last step's summary.
func (v *View) Last() StepCompleted { return v.last }

// Head returns the waiting prepare-receive request at the head of the line, if any.
func (v *View) Head() *RequestView {
	for _, id := range v.waiting {
		if r := v.reqs[id]; r != nil && r.State == StateWaiting {
			return &r.RequestView
		}
	}
	return nil
}

// Blocked returns why a waiting request is not admitted: its own evaluation when it is at the
// head of the line, head-of-line behind the head when the head is blocked, and false when it
// is not waiting or has not been evaluated yet. Statuses says the same in a word.
func (v *View) Blocked(r *RequestView) (prepare.Evaluation, bool) {
	if r.State != StateWaiting {
		return prepare.Evaluation{}, false
	}
	if r.Eval != nil {
		return *r.Eval, true
	}
	head := v.Head()
	if head == nil || head == r || head.Eval == nil {
		return prepare.Evaluation{}, false
	}
	return prepare.Evaluation{Request: r.ID, Reason: prepare.ReasonHeadOfLine, Behind: head.ID,
		PromptLength: r.PromptLength, End: r.End}, true
}

// PagesVersion changes whenever the page map may have changed: panels that draw pages cache
// by it, so that a trickle of step summaries does not redraw 65,536 pages.
func (v *View) PagesVersion() uint64 { return v.pagesVersion }

// PageMap returns what every page is doing. It is built when first asked for and then kept
// current as events apply, page by page (pagekeep.go), for as long as it is read often
// enough for that to pay (keepLimit); PageMap.Changes says which pages changed. Read it; do
// not change it.
func (v *View) PageMap() *PageMap {
	if !v.pm.kept {
		v.pm.build(viewSource{v}, v.facts())
		v.keepPages()
	}
	v.unread = 0
	if invariants.Enabled {
		if err := v.checkPages(); err != nil {
			panic(err)
		}
	}
	return &v.pm
}

// facts returns the requests' facts, in table order, reading again those of the requests
// the events changed.
func (v *View) facts() []facts {
	v.gather()
	return v.fs
}

// The flags of a derived request.
const (
	again     uint8 = 1 << iota // its status is to derive again
	untallied                   // its status is not in the tally yet
)

// waiting is 1 for a waiting request's facts, else 0.
func waiting(f *facts) int {
	if f.state == StateWaiting {
		return 1
	}
	return 0
}

// gather reads again the facts of the requests the events changed, and those of the ones
// that arrived since the last time, marking their statuses to derive again.
func (v *View) gather() {
	v.compact()
	for _, serial := range v.dirty {
		i, ok := slices.BinarySearch(v.serials, serial)
		if !ok || i >= len(v.fs) {
			continue // retired, or arrived since: read below
		}
		f := &v.fs[i]
		v.waitingFacts -= waiting(f)
		v.viewFacts(v.order[i], f)
		v.waitingFacts += waiting(f)
		if v.flags[i]&again == 0 {
			v.flags[i] |= again
			v.rederive = append(v.rederive, serial)
		}
		v.changed[i] = v.version
	}
	v.dirty = v.dirty[:0]
	v.dirtyGen++
	for i := len(v.fs); i < len(v.order); i++ {
		v.fs = append(v.fs, facts{})
		v.viewFacts(v.order[i], &v.fs[i])
		v.waitingFacts += waiting(&v.fs[i])
		v.sts = append(v.sts, RequestStatus{})
		v.changed = append(v.changed, v.version)
		v.flags = append(v.flags, again|untallied)
		v.rederive = append(v.rederive, v.serials[i])
	}
}

// Statuses returns each request's status, in the order of Requests. Read it; do not change
// it.
func (v *View) Statuses() []RequestStatus {
	v.refreshDerived()
	return v.sts
}

// RequestVersions returns, for each request of Requests, the view's Version when its record
// or its status last changed: a reader that makes something of a request keeps it until
// then. Read it; do not change it.
func (v *View) RequestVersions() []uint64 {
	v.refreshDerived()
	return v.changed
}

// StatusOf returns one request's status.
func (v *View) StatusOf(id string) (RequestStatus, bool) {
	r := v.reqs[id]
	if r == nil {
		return RequestStatus{}, false
	}
	v.refreshDerived()
	i, ok := v.place(r)
	if !ok {
		return RequestStatus{}, false
	}
	return v.sts[i], true
}

// Derived returns what the view's state means in counts: the numbers the engine's snapshot
// and /metrics show.
func (v *View) Derived() Derived {
	v.refreshDerived()
	return v.derived
}

// refreshDerived derives again what the events since the last time may have changed: the
// statuses of the requests they changed (all of them when the head of the line went from
// blocked to not or back, or the page map was built again), and, when the clock moved,
// whether each prepared request is stuck. What it derives is what statuses derives from
// scratch; a test holds the two to the same result at every step.
func (v *View) refreshDerived() {
	if v.dVersion == v.version {
		return
	}
	pm := v.PageMap()
	v.gather()
	// The head of the line: the first waiting request of the table (classifier). No
	// request waits again once it has stopped, so it is not before the last one.
	head, headBlocked := len(v.fs), false
	if v.waitingFacts > 0 {
		for i := v.headAt; i < len(v.fs); i++ {
			if v.fs[i].state == StateWaiting {
				head, headBlocked = i, v.fs[i].evaluated
				break
			}
		}
	}
	if invariants.Enabled && slices.ContainsFunc(v.fs[:head], func(f facts) bool { return f.state == StateWaiting }) {
		panic(fmt.Sprintf("engine: a request waits before the head of the line, %d", head))
	}
	v.headAt = head
	now := v.stamp.At
	all := headBlocked != v.headBlocked || pm.epoch != v.pmEpoch
	v.headBlocked, v.pmEpoch = headBlocked, pm.epoch
	if all {
		v.t = tally{}
		v.nextStuck = math.MaxInt64
		c := newClassifier(v.cfg, now)
		for i := range v.fs {
			old := v.sts[i]
			c.status(&v.fs[i], &v.sts[i])
			pm.pages(&v.fs[i], &v.sts[i])
			v.settle(i, &old, false)
		}
	} else {
		for _, serial := range v.rederive {
			i, ok := slices.BinarySearch(v.serials, serial)
			if !ok || v.flags[i]&again == 0 {
				continue // retired since
			}
			// Past the head, a waiting request is blocked behind it if it is blocked
			// (before it, none is waiting): the classifier has seen the head.
			c := newClassifier(v.cfg, now)
			c.headSeen, c.headBlocked = i > head, headBlocked
			old := v.sts[i]
			c.status(&v.fs[i], &v.sts[i])
			pm.pages(&v.fs[i], &v.sts[i])
			v.settle(i, &old, v.flags[i]&untallied == 0)
		}
		if now < v.derivedAt || now >= v.nextStuck {
			// Only a prepared request's stuckness depends on the clock: it may have
			// changed once the clock reaches the first time one of them becomes stuck
			// (or went back).
			v.nextStuck = math.MaxInt64
			c := newClassifier(v.cfg, now)
			for i := range v.sts {
				sp := &v.sts[i]
				if sp.Condition != CondPrepared && sp.Condition != CondKVComplete {
					continue
				}
				if stuck := c.preparedStuck(&v.fs[i]); stuck != sp.Stuck {
					v.t.sub(sp)
					sp.Stuck = stuck
					v.t.add(sp)
					v.changed[i] = v.version
				}
				v.mayBecomeStuck(i)
			}
		}
	}
	v.rederive = v.rederive[:0]
	v.derivedAt = now
	v.derived = v.t.done(viewSource{v}, pm)
	v.dVersion = v.version
}

// settle adds the i-th request's status, just derived into sts, to the tally, taking the
// one it replaced, old, out of it first when untally says so. (It compares the two field
// by field: the classifier has just stored the new one so, and reading it whole would
// stall on those stores.)
func (v *View) settle(i int, old *RequestStatus, untally bool) {
	st := &v.sts[i]
	if st.Pages != old.Pages || st.State != old.State || st.Condition != old.Condition ||
		st.Blocked != old.Blocked || st.Stuck != old.Stuck || st.Hazardous != old.Hazardous {
		v.changed[i] = v.version
	}
	if untally {
		v.t.sub(old)
	}
	v.t.add(st)
	v.flags[i] = 0
	v.mayBecomeStuck(i)
}

// mayBecomeStuck notes when the i-th request, if it is prepared and not stuck yet, becomes
// stuck with time: nextStuck is never later than the first such time, so that until then
// the clock changes no status.
func (v *View) mayBecomeStuck(i int) {
	st := &v.sts[i]
	if limit := v.cfg.PreparedAgeLimit.Milliseconds(); limit > 0 && !st.Stuck &&
		(st.Condition == CondPrepared || st.Condition == CondKVComplete) {
		v.nextStuck = min(v.nextStuck, v.fs[i].admitted+limit)
	}
}

// Snapshot returns the view's state in the engine's Snapshot form.
func (v *View) Snapshot() Snapshot {
	p := snapshotParts{
		cfg: v.cfg, stamp: v.stamp, cache: v.cache, prefix: v.prefixNodes(), stats: v.stats, cf: v.cf,
		recycling: v.recycling, metadata: v.metadata, hazards: v.hazards, lastMatch: v.lastMatch,
		totals: v.totals, last: v.last, derived: v.Derived(),
		waiting: slices.Clone(v.waiting), running: slices.Clone(v.running),
	}
	if v.follow != nil {
		f := v.standing()
		p.follow = &f
	}
	for _, r := range v.Requests() {
		c := *r
		c.History = materialize(r.History)
		c.Hazards = slices.Clone(r.Hazards)
		c.RunReceived = slices.Clone(r.RunReceived)
		if r.Eval != nil {
			ev := *r.Eval
			c.Eval = &ev
		}
		p.requests = append(p.requests, c)
	}
	for seq, id := range v.owners {
		p.owners = append(p.owners, SeqOwner{Seq: seq, ID: id})
	}
	return p.build()
}

// PrefixNodes returns the prefix tree depth first, root first, children in creation order.
func (v *View) PrefixNodes() []prefix.Node { return v.prefixNodes() }

func (v *View) prefixNodes() []prefix.Node {
	children := make(map[prefix.NodeID][]prefix.Node, len(v.nodes))
	for id, n := range v.nodes {
		if id != 0 {
			children[n.Parent] = append(children[n.Parent], n)
		}
	}
	for _, c := range children {
		slices.SortFunc(c, func(a, b prefix.Node) int { return cmp.Compare(a.Order, b.Order) })
	}
	root, ok := v.nodes[0]
	if !ok {
		return nil
	}
	out := make([]prefix.Node, 0, len(v.nodes))
	var walk func(n prefix.Node)
	walk = func(n prefix.Node) {
		out = append(out, n)
		for _, c := range children[n.ID] {
			walk(c)
		}
	}
	walk(root)
	return out
}

// Apply applies one event. An error means the event does not fit the view (it missed
// events): the view is then unreliable and the viewer must start again from a snapshot.
func (v *View) Apply(ev Event) error {
	if v.pm.kept {
		if v.unread++; v.unread > keepLimit(v.cache.NumPages()) {
			v.pm.kept = false // built again when next read
		}
	}
	changes := v.pm.changes
	if err := v.apply(ev); err != nil {
		v.forget()
		return fmt.Errorf("%w: %s: %v", ErrDiverged, KindOf(ev), err)
	}
	v.stamp = ev.When()
	v.version++
	k := infoOf(ev) // once: the registry's flags say what else the event moves
	if k == nil || k.flags&movesPages != 0 || v.pm.changes != changes {
		v.pagesVersion++
	}
	if id, coalesce, ok := k.markOf(ev); ok {
		if r := v.reqs[id]; r != nil {
			r.History = addMark(r.History, k.newMark(ev), coalesce)
			v.touch(r)
		}
	}
	return nil
}

// forget drops what is derived, after an event that did not fit: it is derived again from
// scratch if asked for.
func (v *View) forget() {
	v.pm.kept = false
	v.fs, v.sts, v.changed, v.flags, v.rederive = v.fs[:0], v.sts[:0], v.changed[:0], v.flags[:0], v.rederive[:0]
	v.compact()
	v.t, v.waitingFacts, v.pmEpoch, v.headAt = tally{}, 0, 0, 0
	v.version++
	v.pagesVersion++
}

// req returns a request the event names, noting that it changes.
func (v *View) req(id string) (*viewRequest, error) {
	r := v.reqs[id]
	if r == nil {
		return nil, fmt.Errorf("unknown request %s", id)
	}
	v.touch(r)
	return r, nil
}

// setOwner records who holds a sequence now; the request that held it before no longer
// does.
func (v *View) setOwner(seq int64, id string) {
	v.ownerChanges(seq)
	v.owners[seq] = id
	if seq >= 0 && seq < maxDenseSeq {
		v.holders = grow(v.holders, int(seq))
		v.holders[seq] = v.reqs[id]
	}
}

// dropOwner forgets who held a sequence that is gone.
func (v *View) dropOwner(seq int64) {
	v.ownerChanges(seq)
	delete(v.owners, seq)
	if seq >= 0 && seq < int64(len(v.holders)) {
		v.holders[seq] = nil
	}
}

// maxDenseSeq bounds the sequence ids the View keeps the holder of by id, in a slice
// (the engine's are small: it hands freed ones out again); beyond, holder asks the maps.
const maxDenseSeq = 1 << 24

// ownerChanges notes that the request holding a sequence changes: what it holds does.
func (v *View) ownerChanges(seq int64) {
	if len(v.fs) == 0 {
		return
	}
	if r := v.holder(seq); r != nil {
		v.touch(r)
	}
}

// holder returns the request that holds a sequence, if one does: the one owners names for
// it, if it is in the table and its sequence is that one.
func (v *View) holder(seq int64) *viewRequest {
	if seq >= 0 && seq < maxDenseSeq {
		if seq < int64(len(v.holders)) {
			if r := v.holders[seq]; r != nil && r.Seq == seq {
				return r
			}
		}
		return nil
	}
	if id, ok := v.owners[seq]; ok {
		if r := v.reqs[id]; r != nil && r.Seq == seq {
			return r
		}
	}
	return nil
}

func (v *View) apply(ev Event) error {
	switch e := ev.(type) {
	case RequestArrived:
		if _, dup := v.reqs[e.ID]; dup {
			return fmt.Errorf("request %s arrived twice", e.ID)
		}
		v.add(&viewRequest{RequestView: RequestView{ID: e.ID, State: StateWaiting, PromptLength: e.PromptLength, End: e.End,
			MaxTokens: e.MaxTokens, Seq: -1, Parent: -1, Arrived: e.Stamp}})
		v.waiting = append(v.waiting, e.ID)
		v.totals.Arrived++
	case PrepareBlocked:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		ev := e.Eval
		r.Eval = &ev
		v.totals.Blocked[e.Eval.Reason]++
	case PrefixMatched:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		was := r.Seq
		r.Seq, r.Matched, r.Match, r.Parent = e.Seq, e.Matched, e.Match, e.Parent
		m := e
		v.lastMatch = &m
		if e.Match == prefix.Reuse {
			v.unrecycle(e.Seq)
			v.setOwner(e.Seq, e.ID)
		}
		v.roleMayChange(was)
		v.roleMayChange(e.Seq)
	case SeqAdded:
		if err := v.cache.AddSequence(e.Seq); err != nil {
			return err
		}
		v.setOwner(e.Seq, e.ID)
		v.seqAdded(e.Seq)
	case SeqForked:
		if err := v.cache.ForkSequence(e.Parent, e.Child, e.Pos); err != nil {
			return err
		}
		v.setOwner(e.Child, e.ID)
		v.seqAdded(e.Child)
	case SeqPopped:
		v.seqLeaving(e.Seq)
		if err := v.cache.PopN(e.Seq, e.N); err != nil {
			return err
		}
		v.seqAdded(e.Seq)
	case PagesReserved:
		before := v.cache.NumAvailablePages()
		var err error
		if v.slots, err = v.cache.ReserveAppend(e.Seq, e.N, v.slots[:0]); err != nil {
			return err
		}
		if got := before - v.cache.NumAvailablePages(); got != len(e.NewPages) {
			return fmt.Errorf("seq %d took %d pages, the engine says %v", e.Seq, got, e.NewPages)
		}
		v.seqGrew(e.Seq, v.slots)
	case PrepareAdmitted:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		was := r.Seq
		v.waiting = remove(v.waiting, e.ID)
		r.Eval = nil
		r.Seq, r.End, r.Matched, r.Admitted = e.Seq, e.End, e.Matched, e.Stamp
		r.State = StatePrepared
		if e.End == e.Matched {
			r.State = StateKVComplete
		}
		v.totals.Admitted++
		v.roleMayChange(was)
		v.roleMayChange(r.Seq)
		v.runsMayChange(r)
	case MetadataEmitted:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		if len(e.Runs) == 0 {
			return fmt.Errorf("metadata of %s has no model", e.ID)
		}
		r.Runs, r.Encoded = e.Runs, e.Encoded
		kp := newKVProgress(e.Runs[0], v.cfg.PageSize)
		r.Reserved, r.Received, r.RunReceived = kp.reserved, 0, slices.Clone(kp.runRecv)
		if kp.reserved > 0 {
			v.kv[e.ID] = &kp
		}
		v.metadata = appendBounded(v.metadata, e, v.cfg.KeepMetadata)
		v.runsMayChange(r)
	case KVReceived:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		kp := v.kv[e.ID]
		if kp == nil {
			return fmt.Errorf("KV for %s, which reserved nothing", e.ID)
		}
		n := 0
		hint := -1
		for _, run := range e.Runs {
			for s := run.Start; s < run.End(); {
				lo, k, sp, ok := kp.locate(s, run.End()-s, v.cfg.PageSize, hint)
				if !ok {
					return fmt.Errorf("slot %d is not reserved by %s", s, e.ID)
				}
				if i, twice := kp.firstGot(lo, lo+k); twice {
					return fmt.Errorf("slot %d of %s arrived twice", s+int64(i-lo), e.ID)
				}
				kp.add(lo, lo+k)
				hint = sp
				n += k
				s += int64(k)
			}
		}
		if kp.received != e.Received || kp.reserved != e.Reserved {
			return fmt.Errorf("%s has %d/%d received, the engine says %d/%d", e.ID, kp.received, kp.reserved, e.Received, e.Reserved)
		}
		r.Received = kp.received
		copy(r.RunReceived, kp.runRecv)
		v.totals.KVTokens += uint64(n)
		if kp.complete() {
			r.State = StateKVComplete
		}
		v.runsMayChange(r)
	case RequestStarted:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		r.State = StateRunning
		r.Started = e.Stamp
		r.MaxTokens = e.MaxTokens
		if e.Committed {
			r.Generated = 1
		} else {
			r.Pending = e.Tail
			v.waiting = slices.Insert(v.waiting, 0, e.ID)
		}
		v.running = append(v.running, e.ID)
		v.totals.Started++
		v.roleMayChange(r.Seq)
		v.runsMayChange(r)
	case Prefilled:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		r.Pending = e.Remaining
		if e.Remaining == 0 {
			v.waiting = remove(v.waiting, e.ID)
			r.Generated++
			v.totals.Generated++
		}
	case Decoded:
		for _, id := range e.IDs {
			r, err := v.req(id)
			if err != nil {
				return err
			}
			if v.slots, err = v.cache.ReserveAppend(r.Seq, 1, v.slots[:0]); err != nil {
				return err
			}
			v.seqGrew(r.Seq, v.slots)
			r.Generated++
		}
		v.totals.Generated += uint64(len(e.IDs))
	case RequestFinished:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		v.running = remove(v.running, e.ID)
		if r.Pending > 0 {
			// A shadow's request D finished before its tail was seen prefilled (follow.go).
			v.waiting = remove(v.waiting, e.ID)
		}
		v.endRequest(r, StateFinished, e.Reason, e.Stamp)
		v.totals.Finished++
	case RequestAborted:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		v.waiting = remove(v.waiting, e.ID)
		v.running = remove(v.running, e.ID)
		st := StateAborted
		if e.Reason == AbortPreempt {
			st = StatePreempted
			v.totals.Preempted++
		}
		r.Leaked = e.Leaked
		v.endRequest(r, st, e.Reason, e.Stamp)
		v.totals.Aborted++
	case SeqRecycled:
		v.recycling = append(v.recycling, e.Seq)
		v.recycles(e.Seq, 1)
		v.roleMayChange(e.Seq)
		v.totals.Recycled++
	case SeqEvicted:
		v.seqLeaving(e.Seq)
		if err := v.cache.RemoveSequence(e.Seq); err != nil {
			return err
		}
		v.unrecycle(e.Seq)
		v.dropOwner(e.Seq)
		v.totals.Evicted++
	case SeqRemoved:
		v.seqLeaving(e.Seq)
		if err := v.cache.RemoveSequence(e.Seq); err != nil {
			return err
		}
		if r := v.holder(e.Seq); r != nil {
			r.Leaked = false
		}
		v.dropOwner(e.Seq)
	case RequestRetired:
		r, err := v.req(e.ID)
		if err != nil {
			return err
		}
		delete(v.kv, e.ID)
		v.retire(r)
		v.runsGone(r)
		v.roleMayChange(r.Seq)
	case PrefixChanged:
		for _, n := range e.Upserts {
			v.nodes[n.ID] = n
		}
		for _, id := range e.Removed {
			delete(v.nodes, id)
		}
		v.stats = e.Stats
		v.recyclingIs(e.Recycling)
		v.cf = e.Counterfactual.clone()
	case HazardDetected:
		v.totals.Hazards[e.Hazard.Kind]++
		if r := v.reqs[e.Hazard.ID]; r != nil && len(r.Hazards) < maxHazards {
			r.Hazards = append(r.Hazards, e.Hazard.Kind)
			v.touch(r)
		}
		v.hazards = appendBounded(v.hazards, e, MaxRecentHazards)
	case StepCompleted:
		v.last = e
		v.totals.Steps++
		v.totals.Actions[e.Action]++
		if len(v.unknown) > 0 {
			pruneUnknown(v.unknown, v.cache)
		}
	case Divergence:
		if e.Reset {
			return fmt.Errorf("the shadow starts over: %s", e.Cause)
		}
		if err := v.applySwaps(e.Swaps); err != nil {
			return err
		}
		v.cache.SinkFree(e.Unknown)
		if len(e.Unknown)+len(e.Explained) > 0 && v.unknown == nil {
			v.unknown = map[int32]bool{}
		}
		for _, p := range e.Explained {
			delete(v.unknown, p)
		}
		for _, p := range e.Unknown {
			v.unknown[p] = true
		}
		if len(e.Swaps) > 0 || len(e.Unknown) > 0 || len(e.Explained) > 0 {
			// Pages changed hands outside the cache's operations, which the kept page map
			// follows (pagekeep.go): it is built again when next read.
			v.forget()
		}
		if v.follow == nil {
			v.follow = &Standing{}
		}
		v.follow.note(e)
	default:
		return fmt.Errorf("unknown event %T", ev)
	}
	return nil
}

// unrecycle takes a sequence off the recycling list, if it is on it.
func (v *View) unrecycle(seq int64) {
	if i := slices.Index(v.recycling, seq); i >= 0 {
		v.recycling = slices.Delete(v.recycling, i, i+1)
		v.recycles(seq, -1)
		v.roleMayChange(seq)
	}
}

func (v *View) endRequest(r *viewRequest, st RequestState, reason string, at Stamp) {
	r.State = st
	r.FinishReason = reason
	r.Ended = at
	r.Pending = 0
	r.Eval = nil
	v.roleMayChange(r.Seq)
	v.runsMayChange(r)
}

// Request returns one request's view, as a snapshot would show it.
func (e *Engine) Request(id string) (RequestView, bool) {
	r := e.reqs[id]
	if r == nil {
		return RequestView{}, false
	}
	return r.view(), true
}
