package engine

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// This file is the one place where the engine's state is interpreted for people: what each
// page is doing, what each request's condition is and whether it is stuck, and the counts
// the dashboard's header, /metrics and the snapshot show. The engine and a View derive
// through the same code, each reading its own records through source, so what the dashboard
// shows, what /metrics says and what the engine knows cannot disagree.

// PageState is what a page of the KV cache is doing. Every page is in exactly one state.
// The order goes from idle to alarming; a group of pages drawn as one cell shows its most
// alarming state from PageAwaiting on.
type PageState uint8

// The page states.
const (
	// PageFree: on the free list.
	PageFree PageState = iota
	// PageActive: used by the sequence of one running request alone.
	PageActive
	// PageShared: in a block several sequences share, at least one of them live: a prefix.
	PageShared
	// PageRecycling: used by recycling sequences only: cached for reuse, evictable.
	PageRecycling
	// PagePrepared: held by a prepared request whose KV for the page is in: the request
	// awaits start_generate.
	PagePrepared
	// PageAwaiting: reserved for a prepared request; no slot of its run has been written.
	PageAwaiting
	// PagePartial: reserved for a prepared request; its run is partly written.
	PagePartial
	// PageLeaked: held by the sequence of a prepared request that was aborted (as in MLC).
	PageLeaked
	// PageUnknown: free in a tap's shadow, held on the decode instance it follows for what
	// the shadow does not know (follow.go): D took pages past the ones the shadow predicted.
	PageUnknown
	NumPageStates
)

var pageStateNames = [NumPageStates]string{"free", "active", "shared", "recycling", "prepared", "awaiting-kv", "partly-received", "leaked", "unknown"}

// String returns the state's stable name, as used in metrics labels.
func (s PageState) String() string {
	if s < NumPageStates {
		return pageStateNames[s]
	}
	return fmt.Sprintf("page-state(%d)", uint8(s))
}

// PageStates lists every page state, in order.
func PageStates() []PageState {
	out := make([]PageState, NumPageStates)
	for i := range out {
		out[i] = PageState(i)
	}
	return out
}

// Condition is a request's state as a person reads it: the lifecycle state refined by what
// derivation knows (a waiting request is blocked or not yet, a running one prefills or
// decodes, an aborted one leaked its sequence or not). The order ranks requests for
// attention, most urgent first.
type Condition uint8

// The conditions.
const (
	CondBlocked    Condition = iota // waiting, with a blocked reason
	CondWaiting                     // waiting, not evaluated yet
	CondPrepared                    // prepared, KV arriving
	CondKVComplete                  // prepared, KV in, awaiting start_generate
	CondPrefilling                  // started, its tail waiting for prefill
	CondRunning                     // decoding
	CondLeaked                      // aborted while prepared: its sequence is still held
	CondAborted
	CondPreempted
	CondFinished
	NumConditions
)

var conditionNames = [NumConditions]string{"blocked", "waiting", "prepared", "kv-complete", "prefilling", "running", "leaked", "aborted", "preempted", "finished"}

func (c Condition) String() string {
	if c < NumConditions {
		return conditionNames[c]
	}
	return fmt.Sprintf("condition(%d)", uint8(c))
}

// RequestStatus is what derivation says of one request.
type RequestStatus struct {
	// Pages is how many pages the request's sequence uses; -1 when it holds none.
	Pages     int
	State     RequestState
	Condition Condition
	// Blocked is why a waiting request is not admitted: its own reason at the head of the
	// line, head-of-line behind it; ReasonNone otherwise.
	Blocked prepare.Reason
	// Stuck says the request needs a person's attention: blocked from admission, prepared
	// for longer than the prepared-age limit (its KV or its start_generate never came), or
	// leaked.
	Stuck bool
	// Hazardous says a hazard was flagged on the request.
	Hazardous bool
}

// Derived holds the counts derived from the engine's state: the dashboard's header, the
// page map's legend, /metrics and the snapshot all show these.
type Derived struct {
	Counts
	// Requests counts the request table (ended requests until retired) by lifecycle state,
	// Conditions by condition.
	Requests   [numStates]int     `json:"requests"`
	Conditions [NumConditions]int `json:"conditions"`
	// BlockedBy counts the waiting prepare-receive requests by why they wait.
	BlockedBy [prepare.NumReasons]int `json:"blocked_by"`
	Stuck     int                     `json:"stuck"`
	Hazardous int                     `json:"hazardous"` // requests with a hazard flagged
	// Pages counts the KV cache's pages (model 0's; every model is alike) by state.
	Pages [NumPageStates]int `json:"pages"`
}

// facts is what derivation reads of one request.
type facts struct {
	state     RequestState
	leaked    bool
	evaluated bool // has an admission evaluation (only the head of the line does)
	hazardous bool
	// held says the request still holds seq, its sequence (an ended one may have lost it to
	// a reuse); the page map says how many pages that is.
	held     bool
	reason   prepare.Reason // the evaluation's verdict
	pending  int            // tail tokens left to prefill
	admitted int64          // when, engine time
	seq      int64
}

// source is what derivation reads; the engine and a View each provide it over their own
// records (engineSource, viewSource).
type source interface {
	config() Config
	now() int64 // engine time of the last event, Unix milliseconds
	cache() *pages.Cache
	recycling() []int64 // the recycling sequences
	numRecycling() int
	// reserved returns the i-th request's reserved runs of model 0 and the slots received
	// in each.
	reserved(i int) ([]pages.Run, []int)
	// unknown returns a shadow's pages of unknown use (nil for an engine that decides
	// alone): those of them that are free show as PageUnknown.
	unknown() map[int32]bool
	// stamps returns when the i-th request arrived, was admitted and started (engine time;
	// zero for what has not happened).
	stamps(i int) (arrived, admitted, started int64)
}

// engineSource and viewSource read the engine's records and a View's for derivation.
type (
	engineSource struct{ e *Engine }
	viewSource   struct{ v *View }
)

func (e engineSource) config() Config      { return e.e.cfg }
func (e engineSource) now() int64          { return e.e.stamp.At }
func (e engineSource) cache() *pages.Cache { return e.e.caches[0] }
func (e engineSource) recycling() []int64  { return e.e.prefix.Recycling() }
func (e engineSource) numRecycling() int   { return e.e.prefix.NumRecycling() }
func (e engineSource) unknown() map[int32]bool {
	if e.e.follow == nil {
		return nil
	}
	return e.e.follow.unknown
}

// facts appends the facts of every request of the table, in arrival order, to dst.
func (e engineSource) facts(dst []facts) []facts {
	n := len(dst)
	dst = slices.Grow(dst, len(e.e.order))[:n+len(e.e.order)]
	for i, r := range e.e.order {
		f := &dst[n+i]
		engineFacts(r, f)
		// A live request always holds its own sequence (only a recycling one, an ended
		// request's, is ever taken over), so only an ended one's is looked up.
		f.seq = r.seq
		f.held = r.seq >= 0 && (!r.state.Ended() || e.e.seqOwner[r.seq] == r)
	}
	return dst
}

// engineFacts reads a request's facts into f, field by field (see classifier.status), all
// but which sequence it holds (counts needs no pages).
func engineFacts(r *request, f *facts) {
	f.state, f.leaked, f.evaluated, f.hazardous = r.state, r.leaked, r.eval != nil, len(r.hazards) > 0
	f.pending, f.admitted, f.reason = r.pending, r.admitted.At, prepare.ReasonNone
	if r.eval != nil {
		f.reason = r.eval.Reason
	}
}

func (e engineSource) reserved(i int) ([]pages.Run, []int) {
	r := e.e.order[i]
	if len(r.runs) == 0 {
		return nil, nil
	}
	return r.runs[0], r.kv.runRecv
}

func (v viewSource) config() Config      { return v.v.cfg }
func (v viewSource) now() int64          { return v.v.stamp.At }
func (v viewSource) cache() *pages.Cache { return v.v.cache }
func (v viewSource) recycling() []int64  { return v.v.recycling }
func (v viewSource) numRecycling() int   { return len(v.v.recycling) }
func (v viewSource) unknown() map[int32]bool {
	return v.v.unknown
}

// viewFacts reads a View's request's facts into f, as engineSource.facts reads the engine's.
func (v *View) viewFacts(r *RequestView, f *facts) {
	f.state, f.leaked, f.evaluated, f.hazardous = r.State, r.Leaked, r.Eval != nil, len(r.Hazards) > 0
	f.pending, f.admitted, f.reason = r.Pending, r.Admitted.At, prepare.ReasonNone
	if r.Eval != nil {
		f.reason = r.Eval.Reason
	}
	f.seq, f.held = r.Seq, false
	if r.Seq >= 0 {
		id, ok := v.owners[r.Seq]
		f.held = !r.State.Ended() || ok && id == r.ID
	}
}

func (v viewSource) reserved(i int) ([]pages.Run, []int) {
	r := v.v.order[i]
	if len(r.Runs) == 0 {
		return nil, nil
	}
	return r.Runs[0], r.RunReceived
}

// classifier derives request statuses from facts, in table order: it remembers whether the
// head of the line (the first waiting prepare-receive request: requests arrive in table order
// and wait in it, the started ones the waiting queue also holds are running) is blocked,
// which blocks every waiting request after it.
type classifier struct {
	limit, now            int64
	headSeen, headBlocked bool
}

func newClassifier(cfg Config, now int64) classifier {
	return classifier{limit: cfg.PreparedAgeLimit.Milliseconds(), now: now}
}

// status derives the status of the next request of the table into st. (It assigns the
// fields one by one, in registers: building the value whole and returning it makes the
// compiler store it at once and read it back by fields, which stalls.)
func (c *classifier) status(f *facts, st *RequestStatus) {
	cond, blocked, stuck := CondFinished, prepare.ReasonNone, false
	switch f.state {
	case StateWaiting:
		if !c.headSeen {
			c.headSeen, c.headBlocked = true, f.evaluated
		}
		cond = CondWaiting
		switch {
		case f.evaluated:
			blocked = f.reason
		case c.headBlocked:
			blocked = prepare.ReasonHeadOfLine
		}
		if blocked != prepare.ReasonNone {
			cond, stuck = CondBlocked, true
		}
	case StatePrepared:
		cond, stuck = CondPrepared, c.preparedStuck(f)
	case StateKVComplete:
		cond, stuck = CondKVComplete, c.preparedStuck(f)
	case StateRunning:
		cond = CondRunning
		if f.pending > 0 {
			cond = CondPrefilling
		}
	case StatePreempted:
		cond = CondPreempted
	case StateAborted:
		cond = CondAborted
	}
	if f.leaked {
		cond, stuck = CondLeaked, true
	}
	st.Pages = -1
	st.State, st.Condition, st.Blocked, st.Stuck, st.Hazardous = f.state, cond, blocked, stuck, f.hazardous
}

// pages completes a status with the pages of the request's sequence, from pm.
func (pm *PageMap) pages(f *facts, st *RequestStatus) {
	if f.held {
		if n, ok := pm.SeqPages(f.seq); ok {
			st.Pages = n
		}
	}
}

// preparedStuck says whether a prepared request has been prepared for too long: its KV or
// its start_generate never came.
func (c *classifier) preparedStuck(f *facts) bool {
	return c.limit > 0 && c.now-f.admitted >= c.limit
}

// statuses derives every request's status from its facts, in table order, into dst, and
// tallies them into t. Pages come from pm when it is given.
func statuses(cfg Config, now int64, fs []facts, pm *PageMap, dst []RequestStatus, t *tally) []RequestStatus {
	dst = slices.Grow(dst[:0], len(fs))[:len(fs)]
	c := newClassifier(cfg, now)
	for i := range fs {
		st := &dst[i]
		c.status(&fs[i], st)
		if pm != nil {
			pm.pages(&fs[i], st)
		}
		t.add(st)
	}
	return dst
}

// tally counts statuses into a Derived.
type tally struct{ d Derived }

func (t *tally) add(st *RequestStatus) { t.count(st, 1) }
func (t *tally) sub(st *RequestStatus) { t.count(st, -1) }

func (t *tally) count(st *RequestStatus, d int) {
	t.d.Requests[st.State] += d
	t.d.Conditions[st.Condition] += d
	t.d.BlockedBy[st.Blocked] += d
	if st.Stuck {
		t.d.Stuck += d
	}
	if st.Hazardous {
		t.d.Hazardous += d
	}
}

// done completes the counts with the cache's: the derived counts of everything tallied.
func (t *tally) done(src source, pm *PageMap) Derived {
	d := t.d
	c := src.cache()
	d.FreePages = c.NumAvailablePages()
	d.TotalSeqLen = c.TotalSequenceLength()
	d.Recycling = src.numRecycling()
	d.BlockedBy[prepare.ReasonNone] = 0
	d.Waiting = d.Requests[StateWaiting]
	d.Blocked = d.Conditions[CondBlocked]
	d.Prepared = d.Requests[StatePrepared] + d.Requests[StateKVComplete]
	d.AwaitingKV = d.Requests[StatePrepared]
	d.Running = d.Conditions[CondRunning]
	d.Prefilling = d.Conditions[CondPrefilling]
	if pm != nil {
		d.Pages = pm.Count
	}
	return d
}

// all derives everything of an engine, the page map included.
func (e *Engine) derive() Derived {
	src := engineSource{e}
	fs := src.facts(nil)
	var pm PageMap
	pm.build(src, fs)
	var t tally
	statuses(e.cfg, src.now(), fs, &pm, nil, &t)
	return t.done(src, &pm)
}

// counts derives the gauges a step closes with: the same classification and tally as
// derive, in one pass over the table, with no page map and nothing stored.
func (e *Engine) counts() Counts {
	c := newClassifier(e.cfg, e.stamp.At)
	var t tally
	var (
		f  facts
		st RequestStatus
	)
	for _, r := range e.order {
		engineFacts(r, &f)
		c.status(&f, &st)
		t.add(&st)
	}
	return t.done(engineSource{e}, nil).Counts
}

// seqRole is who holds a sequence, as far as its pages are concerned.
type seqRole uint8

const (
	roleLive      seqRole = iota // a running request, or one that holds it for no other reason
	rolePrepared                 // a prepared request
	roleRecycling                // the prefix cache, for reuse
	roleLeaked                   // an aborted prepared request, as MLC leaks it
	numRoles
)

// users counts the sequences that use a block or a page, by role.
type users [numRoles]int32

// pageState is the state of a page in use by u (none: free), before reservations: the one
// place that decides it, for the page map built from scratch and the one a View keeps.
func pageState(u *users) PageState {
	rec := u[roleRecycling]
	n := u[roleLive] + u[rolePrepared] + rec + u[roleLeaked]
	switch {
	case n == 0:
		return PageFree
	case n == rec:
		return PageRecycling
	case n > 1:
		return PageShared
	case u[roleLeaked] == 1:
		return PageLeaked
	case u[rolePrepared] == 1:
		return PagePrepared
	}
	return PageActive
}

// reserved is the state of a page in state cur that lies in a prepared request's reserved
// run, the run awaiting its KV or partly received (st): the run shows over a page in use, the
// more alarming of two over one another, and never over a free or leaked page. Applied for
// every such run, in any order, it gives the page's state.
func reserved(cur, st PageState) PageState {
	switch {
	case cur == PageFree || cur == PageLeaked || cur == PageUnknown:
		return cur
	case cur < PageAwaiting || st > cur:
		return st
	}
	return cur
}

// runState says how a reserved run of length n with got slots received shows on its pages:
// awaiting KV, partly received, or (false) not at all, all of it in.
func runState(got int, n int64) (PageState, bool) {
	switch {
	case int64(got) >= n:
		return PageFree, false
	case got > 0:
		return PagePartial, true
	}
	return PageAwaiting, true
}

// runPages returns the pages a run of slots lies on, [lo, hi], of a cache of n pages of ps
// slots; lo > hi when none.
func runPages(run pages.Run, ps, n int64) (lo, hi int64) {
	return run.Start / ps, min((run.End()-1)/ps, n-1)
}

// PageMap is what every page of the KV cache is doing, and how many pages each sequence
// uses. The engine builds it from scratch (build: one pass over the sequences' block chains
// and one over the pages); a View builds it once and then keeps it current from the events
// it applies, page by page (pagekeep.go). Both decide a page's state with pageState and
// reserved, the one place that does; a test holds the two to the same result at every step.
type PageMap struct {
	// States is each page's state, by page id; Count the pages in each state.
	States []PageState
	Count  [NumPageStates]int

	cache   *pages.Cache
	unknown map[int32]bool // a shadow's pages of unknown use (source.unknown)
	// seqPages is how many pages each sequence uses, by sequence id (sequence ids are small:
	// the engine hands freed ones out again); -1 for one the cache does not hold.
	seqPages []int32

	// What build works with, kept for the next build. seqs are the cache's sequences; the
	// chain of seqs[i] (block ids, root first) is chains[chainAt[i]:chainAt[i+1]]. By block
	// id: the sequences that use the block by role, and its pages.
	seqs       []int64
	chainAt    []int32
	chains     []int32
	roles      []seqRole // by index in seqs
	blockUsers []users
	blockPages []int32
	// listed is the index in seqs by sequence id, -1 when not listed.
	listed []int32

	// epoch names this map's states since they were last built from scratch; journal is
	// a ring of the pages whose state changed since, changes of them in all (Changes).
	epoch   uint64
	journal []int32
	changes uint64

	// kept is set while a View keeps the map current (pagekeep.go): then each page's users
	// and the reservations on it are counted, and each sequence's role is known.
	kept     bool
	pgUsers  []users
	pgRuns   [][2]int32 // by page: reserved runs on it awaiting KV, and partly received
	seqRoles []seqRole  // by sequence id, for those the cache holds
	recN     []int32    // by sequence id: how often the recycling list names it
}

// pageMapEpochs numbers the page maps' epochs, so that a mark of one map never passes for
// another's.
var pageMapEpochs atomic.Uint64

// PageMark is where a reader of a page map's changes got to: the zero mark has read
// nothing.
type PageMark struct{ epoch, n uint64 }

// Changes appends to dst the pages whose state has changed since mark, a mark an earlier
// call returned, and returns the mark to read from next time. A page that changed twice may
// be listed twice. ok is false when the map cannot tell (the mark is the zero mark, or from
// another map or from before the map was built again, or too many pages have changed
// since): the reader reads every page again. A map the engine builds from scratch is built
// again for every change, so reading its changes always says so.
func (pm *PageMap) Changes(mark PageMark, dst []int32) (_ []int32, next PageMark, ok bool) {
	next = PageMark{pm.epoch, pm.changes}
	ring := uint64(len(pm.journal))
	if mark.epoch != pm.epoch || mark.n > pm.changes || pm.changes-mark.n > ring {
		return dst, next, false
	}
	for i := mark.n; i < pm.changes; i++ {
		dst = append(dst, pm.journal[i%ring])
	}
	return dst, next, true
}

// SeqPages returns how many pages a sequence uses, if the cache holds it.
func (pm *PageMap) SeqPages(seq int64) (int, bool) {
	if seq < 0 || seq >= int64(len(pm.seqPages)) || pm.seqPages[seq] < 0 {
		return 0, false
	}
	return int(pm.seqPages[seq]), true
}

// BlockUsers returns the sequences whose chain holds a block, ascending.
func (pm *PageMap) BlockUsers(b int32) []int64 {
	if pm.cache == nil {
		return nil
	}
	return pm.cache.BlockSequences(b, nil)
}

// grow returns s with room for index i, zeroing what it adds.
func grow[T any](s []T, i int) []T {
	if i < len(s) {
		return s
	}
	return append(s, make([]T, i+1-len(s))...)
}

// build derives the page map from src and its requests' facts, reusing pm's buffers. The
// map is then not kept: a View that keeps it says so after (View.keepPages).
func (pm *PageMap) build(src source, fs []facts) {
	c := src.cache()
	n := c.NumPages()
	pm.cache = c
	pm.unknown = src.unknown()
	if len(pm.unknown) == 0 {
		pm.unknown = nil // no lookup a free page, in a loop over every page
	}
	pm.kept = false
	pm.epoch, pm.changes = pageMapEpochs.Add(1), 0
	pm.States = slices.Grow(pm.States[:0], n)[:n]
	pm.Count = [NumPageStates]int{}
	clear(pm.blockUsers)
	clear(pm.blockPages)
	for i := range pm.seqPages {
		pm.seqPages[i] = -1
	}
	pm.listSeqs(src, fs)
	for i := range pm.seqs {
		role := pm.roles[i]
		for _, b := range pm.chains[pm.chainAt[i]:pm.chainAt[i+1]] {
			pm.blockUsers = grow(pm.blockUsers, int(b))
			pm.blockUsers[b][role]++
		}
	}
	var none users
	for pg := range n {
		b := c.PageBlock(int32(pg))
		u := &none
		if b >= 0 && int(b) < len(pm.blockUsers) {
			u = &pm.blockUsers[b]
		}
		if pm.States[pg] = pageState(u); pm.States[pg] != PageFree {
			pm.blockPages = grow(pm.blockPages, int(b))
			pm.blockPages[b]++
		} else if pm.unknown != nil && pm.unknown[int32(pg)] {
			pm.States[pg] = PageUnknown
		}
	}
	for _, s := range pm.seqs {
		pm.seqPages[s] = 0
	}
	for i, s := range pm.seqs {
		for _, b := range pm.chains[pm.chainAt[i]:pm.chainAt[i+1]] {
			if int(b) < len(pm.blockPages) {
				pm.seqPages[s] += pm.blockPages[b]
			}
		}
	}
	// A prepared request's reserved runs: awaiting or partly received by the count of its
	// run's slots received (a View knows how many per run, not which).
	ps := int64(c.PageSize())
	for j, f := range fs {
		if f.state != StatePrepared {
			continue
		}
		runs, recv := src.reserved(j)
		for i, run := range runs {
			got := 0
			if i < len(recv) {
				got = recv[i]
			}
			st, shows := runState(got, run.Len)
			if !shows {
				continue
			}
			lo, hi := runPages(run, ps, int64(n))
			for pg := lo; pg <= hi; pg++ {
				pm.States[pg] = reserved(pm.States[pg], st)
			}
		}
	}
	for _, s := range pm.States {
		pm.Count[s]++
	}
}

// index returns the index in seqs of a listed sequence, or -1.
func (pm *PageMap) index(seq int64) int32 {
	if seq < 0 || seq >= int64(len(pm.listed)) {
		return -1
	}
	return pm.listed[seq]
}

// unlist forgets which sequences are listed.
func (pm *PageMap) unlist() {
	for _, s := range pm.seqs {
		pm.listed[s] = -1
	}
}

// listSeqs lists the cache's sequences, their block chains and roles, from the table's
// requests and the recycling list, which hold them all (the engine keeps a leaked request
// while its sequence lives). A sequence the recycling list names is recycling; another is
// in the role of the first request that holds it. Should the list ever miss one, it falls
// back to the cache's own list, which costs a sort.
func (pm *PageMap) listSeqs(src source, fs []facts) {
	c := src.cache()
	pm.unlist()
	pm.seqs, pm.roles = pm.seqs[:0], pm.roles[:0]
	pm.chainAt, pm.chains = pm.chainAt[:0], pm.chains[:0]
	add := func(seq int64, role seqRole) {
		if seq < 0 || pm.index(seq) >= 0 {
			return
		}
		at := len(pm.chains)
		var err error
		if pm.chains, err = c.SequenceBlocks(seq, pm.chains); err != nil {
			pm.chains = pm.chains[:at]
			return
		}
		for int64(len(pm.listed)) <= seq {
			pm.listed = append(pm.listed, -1)
			pm.seqPages = append(pm.seqPages, -1)
		}
		pm.listed[seq] = int32(len(pm.seqs))
		pm.chainAt = append(pm.chainAt, int32(at))
		pm.seqs = append(pm.seqs, seq)
		pm.roles = append(pm.roles, role)
	}
	for _, s := range src.recycling() {
		add(s, roleRecycling)
	}
	for j := range fs {
		if f := &fs[j]; f.held {
			add(f.seq, holderRole(f.state, f.leaked))
		}
	}
	if len(pm.seqs) != c.NumSequences() {
		// Some sequence has no record: list the cache's own, with what is known of each.
		roles := make(map[int64]seqRole, len(pm.seqs))
		for i, s := range pm.seqs {
			roles[s] = pm.roles[i]
		}
		pm.unlist()
		pm.seqs, pm.roles, pm.chainAt, pm.chains = pm.seqs[:0], pm.roles[:0], pm.chainAt[:0], pm.chains[:0]
		for _, s := range c.SequenceIDs() {
			add(s, roles[s])
		}
	}
	pm.chainAt = append(pm.chainAt, int32(len(pm.chains)))
}

// holderRole is the role of a sequence held by a request in state st.
func holderRole(st RequestState, leaked bool) seqRole {
	switch {
	case leaked:
		return roleLeaked
	case st == StatePrepared || st == StateKVComplete:
		return rolePrepared
	}
	return roleLive
}

// AgeState is a stage a request can wait in, as a fleet's alerts read it: each has the age
// of its oldest request (Fleet.OldestAge).
type AgeState uint8

// The stages, each aged from when the request entered it.
const (
	AgeWaiting    AgeState = iota // waiting for admission, since it arrived
	AgePrepared                   // admitted and not started (KV arriving or in), since admission
	AgeAwaitingKV                 // admitted with KV still to arrive, since admission
	AgeRunning                    // started, since start_generate
	NumAgeStates
)

var ageStateNames = [NumAgeStates]string{"waiting", "prepared", "awaiting_kv", "running"}

func (s AgeState) String() string {
	if s < NumAgeStates {
		return ageStateNames[s]
	}
	return fmt.Sprintf("age-state(%d)", uint8(s))
}

// StuckReason says why a stuck request (RequestStatus.Stuck) is stuck.
type StuckReason uint8

// The reasons.
const (
	// StuckBlocked: waiting, with a blocked reason (its own or head-of-line).
	StuckBlocked StuckReason = iota
	// StuckAwaitingKV: prepared past the age limit with KV still missing: the prefill
	// instance never wrote it.
	StuckAwaitingKV
	// StuckAwaitingStart: prepared past the age limit with its KV in: the router never
	// called start_generate.
	StuckAwaitingStart
	// StuckLeaked: aborted while prepared; its sequence is still held (as in MLC).
	StuckLeaked
	NumStuckReasons
)

var stuckReasonNames = [NumStuckReasons]string{"blocked", "awaiting_kv", "awaiting_start", "leaked"}

func (r StuckReason) String() string {
	if r < NumStuckReasons {
		return stuckReasonNames[r]
	}
	return fmt.Sprintf("stuck-reason(%d)", uint8(r))
}

// Fleet is what a fleet's dashboards and alerts read of an instance beyond Derived: how
// long the oldest request of each stage has waited, the stuck requests by why, and the
// pages eviction could free. It is derived on demand (for /metrics), not kept in snapshots.
type Fleet struct {
	// OldestAge is, by stage, the age in milliseconds of engine time of its oldest
	// request; 0 when the stage is empty.
	OldestAge [NumAgeStates]int64
	// StuckBy counts the stuck requests by reason; they sum to Derived.Stuck.
	StuckBy [NumStuckReasons]int
	// Evictable is the pages that evicting every recycling sequence would give back: what
	// a request blocked by the watermark waits for while MLC never evicts for it.
	Evictable int
}

// fleet derives the Fleet of src from its requests' facts and statuses (in table order).
func fleet(src source, fs []facts, sts []RequestStatus) Fleet {
	var f Fleet
	now := src.now()
	age := func(s AgeState, since int64) {
		if a := max(now-since, 0); a > f.OldestAge[s] {
			f.OldestAge[s] = a
		}
	}
	for i := range fs {
		st := &sts[i]
		arrived, admitted, started := src.stamps(i)
		switch fs[i].state {
		case StateWaiting:
			age(AgeWaiting, arrived)
		case StatePrepared:
			age(AgePrepared, admitted)
			age(AgeAwaitingKV, admitted)
		case StateKVComplete:
			age(AgePrepared, admitted)
		case StateRunning:
			age(AgeRunning, started)
		}
		if !st.Stuck {
			continue
		}
		switch st.Condition {
		case CondBlocked:
			f.StuckBy[StuckBlocked]++
		case CondPrepared:
			f.StuckBy[StuckAwaitingKV]++
		case CondKVComplete:
			f.StuckBy[StuckAwaitingStart]++
		case CondLeaked:
			f.StuckBy[StuckLeaked]++
		}
	}
	f.Evictable = src.cache().PagesFreedByRemoving(src.recycling())
	return f
}

// Fleet derives the engine's Fleet.
func (e *Engine) Fleet() Fleet {
	src := engineSource{e}
	fs := src.facts(nil)
	var t tally
	sts := statuses(e.cfg, src.now(), fs, nil, nil, &t)
	return fleet(src, fs, sts)
}

// Fleet derives the view's Fleet: the same numbers as the engine's.
func (v *View) Fleet() Fleet {
	v.refreshDerived()
	return fleet(viewSource{v}, v.facts(), v.sts)
}

func (e engineSource) stamps(i int) (arrived, admitted, started int64) {
	r := e.e.order[i]
	return r.arrived.At, r.admitted.At, r.started.At
}

func (v viewSource) stamps(i int) (arrived, admitted, started int64) {
	r := v.v.order[i]
	return r.Arrived.At, r.Admitted.At, r.Started.At
}
