package engine

import (
	"fmt"
	"slices"

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
	NumPageStates
)

var pageStateNames = [NumPageStates]string{"free", "active", "shared", "recycling", "prepared", "awaiting-kv", "partly-received", "leaked"}

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
	reason    prepare.Reason // the evaluation's verdict
	pending   int            // tail tokens left to prefill
	admitted  int64          // when, engine time
}

// source is what derivation reads; the engine and a View each provide it over their own
// records (engineSource, viewSource).
type source interface {
	config() Config
	now() int64 // engine time of the last event, Unix milliseconds
	cache() *pages.Cache
	recycling() []int64 // the recycling sequences
	numRecycling() int
	// facts appends the facts of every request of the table, in arrival order, to dst.
	facts(dst []facts) []facts
	// holds returns the sequence the i-th request holds, if it still does (an ended one may
	// have lost it to a reuse).
	holds(i int) (int64, bool)
	// reserved returns the i-th request's reserved runs of model 0 and the slots received
	// in each.
	reserved(i int) ([]pages.Run, []int)
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

func (e engineSource) facts(dst []facts) []facts {
	n := len(dst)
	dst = slices.Grow(dst, len(e.e.order))[:n+len(e.e.order)]
	for i, r := range e.e.order {
		engineFacts(r, &dst[n+i])
	}
	return dst
}

// engineFacts reads a request's facts into f, field by field (see classifier.status).
func engineFacts(r *request, f *facts) {
	f.state, f.leaked, f.evaluated, f.hazardous = r.state, r.leaked, r.eval != nil, len(r.hazards) > 0
	f.pending, f.admitted, f.reason = r.pending, r.admitted.At, prepare.ReasonNone
	if r.eval != nil {
		f.reason = r.eval.Reason
	}
}

// holds: a live request always holds its own sequence (only a recycling one, an ended
// request's, is ever taken over), so only an ended one's is looked up.
func (e engineSource) holds(i int) (int64, bool) {
	r := e.e.order[i]
	if r.seq < 0 {
		return r.seq, false
	}
	return r.seq, !r.state.Ended() || e.e.seqOwner[r.seq] == r
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

func (v viewSource) facts(dst []facts) []facts {
	n := len(dst)
	dst = slices.Grow(dst, len(v.v.order))[:n+len(v.v.order)]
	for i, r := range v.v.order {
		f := &dst[n+i]
		f.state, f.leaked, f.evaluated, f.hazardous = r.State, r.Leaked, r.Eval != nil, len(r.Hazards) > 0
		f.pending, f.admitted, f.reason = r.Pending, r.Admitted.At, prepare.ReasonNone
		if r.Eval != nil {
			f.reason = r.Eval.Reason
		}
	}
	return dst
}

func (v viewSource) holds(i int) (int64, bool) {
	r := v.v.order[i]
	if r.Seq < 0 {
		return r.Seq, false
	}
	if !r.State.Ended() {
		return r.Seq, true
	}
	id, ok := v.v.owners[r.Seq]
	return r.Seq, ok && id == r.ID
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

// preparedStuck says whether a prepared request has been prepared for too long: its KV or
// its start_generate never came.
func (c *classifier) preparedStuck(f *facts) bool {
	return c.limit > 0 && c.now-f.admitted >= c.limit
}

// retime updates statuses derived earlier from the same facts for a later time: only a
// prepared request's stuckness depends on the clock. It returns the change in the stuck
// count.
func retime(cfg Config, now int64, fs []facts, sts []RequestStatus) int {
	c := newClassifier(cfg, now)
	delta := 0
	for i := range sts {
		st := &sts[i]
		if st.Condition != CondPrepared && st.Condition != CondKVComplete {
			continue
		}
		if stuck := c.preparedStuck(&fs[i]); stuck != st.Stuck {
			st.Stuck = stuck
			if stuck {
				delta++
			} else {
				delta--
			}
		}
	}
	return delta
}

// statuses derives every request's status from its facts, in table order, into dst, and
// tallies them into t. Pages come from pm when it is given.
func statuses(cfg Config, now int64, fs []facts, pm *PageMap, dst []RequestStatus, t *tally) []RequestStatus {
	dst = slices.Grow(dst[:0], len(fs))[:len(fs)]
	c := newClassifier(cfg, now)
	for i := range fs {
		st := &dst[i]
		c.status(&fs[i], st)
		if pm != nil && i < len(pm.reqSeq) && pm.reqSeq[i] >= 0 {
			st.Pages = int(pm.seqPages[pm.reqSeq[i]])
		}
		t.add(st)
	}
	return dst
}

// tally counts statuses into a Derived.
type tally struct{ d Derived }

func (t *tally) add(st *RequestStatus) {
	t.d.Requests[st.State]++
	t.d.Conditions[st.Condition]++
	t.d.BlockedBy[st.Blocked]++
	if st.Stuck {
		t.d.Stuck++
	}
	if st.Hazardous {
		t.d.Hazardous++
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

// PageMap is what every page of the KV cache is doing, and which sequences use which
// blocks. It is built in one pass over the sequences' block chains and one over the pages.
type PageMap struct {
	// States is each page's state, by page id; Count the pages in each state.
	States []PageState
	Count  [NumPageStates]int

	// seqs are the cache's sequences; the chain of seqs[i] (block ids, root first) is
	// chains[chainAt[i]:chainAt[i+1]], and it uses seqPages[i] pages. reqSeq[j] is the index
	// in seqs of the sequence the j-th request of the table holds, or -1.
	seqs     []int64
	reqSeq   []int32
	chainAt  []int32
	chains   []int32
	seqPages []int32
	// By block id: how many sequences use the block, how many of them are not recycling,
	// the role of the last one seen, and the block's pages.
	users, nonRec, blockPages []int32
	lastRole                  []seqRole
	roles                     []seqRole // by index in seqs
	// listed is the index in seqs by sequence id, -1 when not listed (sequence ids are
	// small: the engine hands freed ones out again).
	listed []int32
}

// seqRole is who holds a sequence, as far as its pages are concerned.
type seqRole uint8

const (
	roleLive      seqRole = iota // a running request, or one that holds it for no other reason
	rolePrepared                 // a prepared request
	roleRecycling                // the prefix cache, for reuse
	roleLeaked                   // an aborted prepared request, as MLC leaks it
)

// RequestPages returns how many pages the j-th request of the table holds.
func (pm *PageMap) RequestPages(j int) (int, bool) {
	if j >= len(pm.reqSeq) || pm.reqSeq[j] < 0 {
		return 0, false
	}
	return int(pm.seqPages[pm.reqSeq[j]]), true
}

// BlockUsers returns the sequences whose chain holds a block, in the order the page map
// lists them (the recycling ones first, then those of the table's requests).
func (pm *PageMap) BlockUsers(b int32) []int64 {
	var out []int64
	for i, id := range pm.seqs {
		if slices.Contains(pm.chains[pm.chainAt[i]:pm.chainAt[i+1]], b) {
			out = append(out, id)
		}
	}
	return out
}

// grow returns s with room for index i, zeroing what it adds.
func grow[T any](s []T, i int) []T {
	if i < len(s) {
		return s
	}
	return append(s, make([]T, i+1-len(s))...)
}

// build derives the page map from src and its requests' facts, reusing pm's buffers.
func (pm *PageMap) build(src source, fs []facts) {
	c := src.cache()
	n := c.NumPages()
	pm.States = slices.Grow(pm.States[:0], n)[:n]
	pm.Count = [NumPageStates]int{}
	clear(pm.users)
	clear(pm.nonRec)
	clear(pm.blockPages)
	pm.listSeqs(src, fs)
	for i := range pm.seqs {
		role := pm.roles[i]
		for _, b := range pm.chains[pm.chainAt[i]:pm.chainAt[i+1]] {
			pm.users = grow(pm.users, int(b))
			pm.nonRec = grow(pm.nonRec, int(b))
			pm.lastRole = grow(pm.lastRole, int(b))
			pm.users[b]++
			if role != roleRecycling {
				pm.nonRec[b]++
			}
			pm.lastRole[b] = role
		}
	}
	for pg := range n {
		b := c.PageBlock(int32(pg))
		if b < 0 || int(b) >= len(pm.users) || pm.users[b] == 0 {
			pm.States[pg] = PageFree
			continue
		}
		pm.blockPages = grow(pm.blockPages, int(b))
		pm.blockPages[b]++
		switch {
		case pm.nonRec[b] == 0:
			pm.States[pg] = PageRecycling
		case pm.users[b] > 1:
			pm.States[pg] = PageShared
		case pm.lastRole[b] == roleLeaked:
			pm.States[pg] = PageLeaked
		case pm.lastRole[b] == rolePrepared:
			pm.States[pg] = PagePrepared
		default:
			pm.States[pg] = PageActive
		}
	}
	pm.seqPages = pm.seqPages[:0]
	for i := range pm.seqs {
		sum := int32(0)
		for _, b := range pm.chains[pm.chainAt[i]:pm.chainAt[i+1]] {
			if int(b) < len(pm.blockPages) {
				sum += pm.blockPages[b]
			}
		}
		pm.seqPages = append(pm.seqPages, sum)
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
			st := PageAwaiting
			switch {
			case int64(got) >= run.Len:
				continue
			case got > 0:
				st = PagePartial
			}
			for pg := run.Start / ps; pg <= (run.End()-1)/ps && pg < int64(n); pg++ {
				cur := pm.States[pg]
				if cur == PageFree || cur == PageLeaked {
					continue
				}
				if cur < PageAwaiting || st > cur {
					pm.States[pg] = st
				}
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
// while its sequence lives), noting which request holds which. Should the list ever miss
// one, it falls back to the cache's own list, which costs a sort.
func (pm *PageMap) listSeqs(src source, fs []facts) {
	c := src.cache()
	pm.unlist()
	pm.seqs, pm.reqSeq, pm.roles = pm.seqs[:0], pm.reqSeq[:0], pm.roles[:0]
	pm.chainAt, pm.chains = pm.chainAt[:0], pm.chains[:0]
	add := func(seq int64, role seqRole) int32 {
		if seq < 0 {
			return -1
		}
		if i := pm.index(seq); i >= 0 {
			return i
		}
		at := len(pm.chains)
		var err error
		if pm.chains, err = c.SequenceBlocks(seq, pm.chains); err != nil {
			pm.chains = pm.chains[:at]
			return -1
		}
		i := int32(len(pm.seqs))
		for int64(len(pm.listed)) <= seq {
			pm.listed = append(pm.listed, -1)
		}
		pm.listed[seq] = i
		pm.chainAt = append(pm.chainAt, int32(at))
		pm.seqs = append(pm.seqs, seq)
		pm.roles = append(pm.roles, role)
		return i
	}
	rec := src.recycling()
	for _, s := range rec {
		add(s, roleRecycling)
	}
	for j, f := range fs {
		i := int32(-1)
		if seq, ok := src.holds(j); ok {
			role := roleLive
			switch {
			case f.leaked:
				role = roleLeaked
			case f.state == StatePrepared || f.state == StateKVComplete:
				role = rolePrepared
			}
			i = add(seq, role)
		}
		pm.reqSeq = append(pm.reqSeq, i)
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
		for j := range fs {
			pm.reqSeq[j] = -1
			if seq, ok := src.holds(j); ok {
				pm.reqSeq[j] = pm.index(seq)
			}
		}
	}
	pm.chainAt = append(pm.chainAt, int32(len(pm.chains)))
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
