package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/internal/invariants"
)

// Errors the engine's calls return. They are wrapped with the request and the numbers;
// match them with errors.Is. A call that returns an error changes nothing.
var (
	ErrDuplicateID    = errors.New("engine: duplicate request id")
	ErrUnknownRequest = errors.New("engine: unknown request")
	ErrNotPrepared    = errors.New("engine: request is not prepared")
	ErrBadBegin       = errors.New("engine: bad begin")
	ErrBadKVWrite     = errors.New("engine: bad KV write")
	ErrEnded          = errors.New("engine: request already ended")
	ErrBadRequest     = errors.New("engine: bad request")
)

// DefaultMaxTokens is the max_tokens of a request that does not say (OpenAI's default).
const DefaultMaxTokens = 16

// Engine is the decode instance: requests, queues and the step loop over the paged KV cache
// and the prefix cache. It is deterministic (the same calls with the same times give the
// same events, byte for byte) and it is not safe for concurrent use: a Runner owns it on one
// goroutine.
type Engine struct {
	cfg    Config
	caches []*pages.Cache
	// stores hold the KV payload of each model's cache; KV writes go through them.
	stores []pages.Store
	// prefix is the prefix cache; a disabled one is a no-op (it matches and holds nothing),
	// so nothing here asks which mode it is in.
	prefix *prefix.Cache
	// alt is the counterfactual prefix cache (the other eviction order), nil when off.
	alt *counterfactual
	// recycling is set while the real cache recycles: an eviction then is its cap's, which
	// the counterfactual applies by itself.
	recycling bool
	ids       prepare.IDs
	act       *prepare.Action

	step  uint64
	now   int64 // engine time of the current call, Unix milliseconds
	stamp Stamp // of the last event

	reqs     map[string]*request
	order    []*request // the request table, in arrival order
	waiting  queue
	running  queue
	prepared queue              // admitted and not started, in admission order
	leaks    []*request         // aborted while prepared; their sequences are still held
	seqOwner map[int64]*request // the request holding (or that last held) each KV sequence
	// pageKV is, by page, the prepared request waiting for KV on the page (nil: none).
	pageKV []*request
	// issued finds a prepared request by its kv_append_metadata string (KV writes name
	// their request by it).
	issued    map[string]*request
	ended     []*request        // finished or aborted, oldest first, for retirement
	metadata  []MetadataEmitted // recent prepare-receive answers
	hazards   []HazardDetected  // recent hazards
	lastMatch *PrefixMatched    // the most recent prefix match
	totals    Totals
	last      StepCompleted

	out      []Event
	tokens   []Token
	extQueue []*request // prompt extensions to queue after the step
	scratch  []int64
	batch    []*request // decode's batch, reused from step to step
	// KV writes' scratch, reused from write to write.
	kvRuns           []pages.Run
	kvSegs, kvSorted []kvSeg

	// follow is set in follow mode (follow.go): the engine shadows a real decode instance.
	follow *followState
}

// Totals are the engine's counters since it started.
type Totals struct {
	Steps     uint64                     `json:"steps"`
	Arrived   uint64                     `json:"arrived"`
	Admitted  uint64                     `json:"admitted"`
	Started   uint64                     `json:"started"`
	Finished  uint64                     `json:"finished"`
	Aborted   uint64                     `json:"aborted"`
	Preempted uint64                     `json:"preempted"`
	Recycled  uint64                     `json:"recycled"`
	Evicted   uint64                     `json:"evicted"`
	KVTokens  uint64                     `json:"kv_tokens"`
	Generated uint64                     `json:"generated"`
	Hazards   [numHazards]uint64         `json:"hazards"`
	Blocked   [prepare.NumReasons]uint64 `json:"blocked"` // PrepareBlocked events by reason
	Actions   [len(actionNames)]uint64   `json:"actions"`
}

// Token is one generated token of a request, for the API layer that streams completions. It
// is not a viewer event.
type Token struct {
	ID    string `json:"id"`
	Index int    `json:"index"` // 0-based among the streamed tokens
	Token int32  `json:"token"`
	// Final marks the request's last output: its last token, or (with Token -1) the end of
	// an aborted or preempted request.
	Final        bool   `json:"final,omitempty"`
	FinishReason string `json:"finish_reason,omitempty"`
}

// Ready is the output of one step: the events since the previous Ready (those of calls made
// between steps first), and the tokens generated.
type Ready struct {
	Step   uint64
	Now    int64
	Action Action
	Events []Event
	Tokens []Token
}

// New returns an engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:      cfg,
		reqs:     make(map[string]*request),
		waiting:  queue{id: qWaiting},
		running:  queue{id: qRunning},
		prepared: queue{id: qPrepared},
		seqOwner: make(map[int64]*request),
		pageKV:   make([]*request, cfg.NumPages()),
		issued:   make(map[string]*request),
	}
	for range cfg.Models {
		arena, err := pages.NewArena(cfg.Arena, cfg.NumPages(), cfg.PageSize, cfg.ArenaLimit)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		c, err := pages.New(pages.Config{PageSize: cfg.PageSize, NumPages: cfg.NumPages(), Store: arena})
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.stores = append(e.stores, arena)
		e.caches = append(e.caches, c)
	}
	mode := prefix.Disabled
	if cfg.PrefixCache == "radix" {
		mode = prefix.Radix
	}
	e.prefix = prefix.New(prefix.Config{Mode: mode, MaxRecycling: cfg.Recycling(), Evict: cfg.EvictOrder, OnEvict: e.onEvict})
	e.alt = newCounterfactual(cfg)
	act, err := prepare.New(prepare.Config{
		PageSize:               cfg.PageSize,
		MaxNumSequence:         cfg.MaxNumSequence,
		MaxTotalSequenceLength: cfg.MaxTotalSequenceLength,
		PrefillChunkSize:       cfg.PrefillChunkSize,
		Watermark:              cfg.Watermark,
		SpecFactor:             cfg.SpecFactor(),
	}, e.caches, e.prefix, &e.ids)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e.act = act
	return e, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// StepNumber returns the number of steps taken.
func (e *Engine) StepNumber() uint64 { return e.step }

// Cache returns model 0's paged KV cache, read-only by convention.
func (e *Engine) Cache() *pages.Cache { return e.caches[0] }

// Prefix returns the prefix cache, read-only by convention.
func (e *Engine) Prefix() *prefix.Cache { return e.prefix }

// Totals returns the counters.
func (e *Engine) Totals() Totals { return e.totals }

func (e *Engine) setNow(now time.Time) {
	if ms := now.UnixMilli(); ms > e.now {
		e.now = ms
	}
}

func (e *Engine) mark() Stamp { return Stamp{Step: e.step, At: e.now} }

// emit records an event: it goes out with the next Ready, and onto its request's timeline.
func (e *Engine) emit(ev Event) {
	e.out = append(e.out, ev)
	e.stamp = ev.When()
	k := infoOf(ev)
	if id, coalesce, ok := k.markOf(ev); ok {
		if r := e.reqs[id]; r != nil {
			r.history = addMark(r.history, k.newMark(ev), coalesce)
		}
	}
}

// TakeEvents returns the events of calls made since the last Step or TakeEvents.
func (e *Engine) TakeEvents() []Event {
	e.flushPrefix()
	out := e.out
	e.out = nil
	return out
}

// TakeTokens returns the tokens generated since the last Step or TakeTokens.
func (e *Engine) TakeTokens() []Token {
	out := e.tokens
	e.tokens = nil
	return out
}

// PrepRecv is a prep_recv call: the request id (MLC's user field), the prompt, the KV window
// and the generation settings that start_generate will use.
type PrepRecv struct {
	ID        string
	Prompt    []int32
	End       int
	HasEnd    bool
	Begin     int
	MaxTokens int
	N         int
}

// PrepRecv queues a prepare-receive request. It is admitted by a later Step (a
// MetadataEmitted event carries the answer). A bad request is refused with the reason and
// changes nothing.
func (e *Engine) PrepRecv(now time.Time, pr PrepRecv) error {
	req := prepare.Request{ID: pr.ID, Prompt: pr.Prompt, Begin: pr.Begin, End: pr.End, HasEnd: pr.HasEnd, N: pr.N}
	if pr.ID == "" {
		return fmt.Errorf("prep_recv: the request id (user) is empty: %w", ErrBadRequest)
	}
	if old := e.reqs[pr.ID]; old != nil && !old.state.Ended() {
		return fmt.Errorf("prep_recv %s: a request with this id is %s: %w", pr.ID, old.state, ErrDuplicateID)
	}
	if pr.MaxTokens < 0 {
		return fmt.Errorf("prep_recv %s: max_tokens %d is negative: %w", pr.ID, pr.MaxTokens, ErrBadRequest)
	}
	if err := req.Validate(min(e.cfg.MaxSingleSequenceLength, e.cfg.MaxTotalSequenceLength)); err != nil {
		return err
	}
	end, _ := req.ResolveEnd()
	e.setNow(now)
	if old := e.reqs[pr.ID]; old != nil {
		e.retire(old)
	}
	maxTokens := pr.MaxTokens
	if maxTokens == 0 {
		maxTokens = DefaultMaxTokens
	}
	r := &request{
		id: pr.ID, prompt: slices.Clone(pr.Prompt), end: end, maxTokens: maxTokens,
		seq: -1, parent: -1, alt: -1, arrived: e.mark(),
		// Room for the marks of a request's usual life (arrival to finish), and the answer
		// of a write of its KV: its calls then grow no list.
		history: make([]Mark, 0, 8), self: []string{pr.ID},
	}
	e.reqs[r.id] = r
	e.order = append(e.order, r)
	e.waiting.pushBack(r)
	e.totals.Arrived++
	e.emit(RequestArrived{Stamp: e.mark(), ID: r.id, PromptLength: len(r.prompt), End: end, MaxTokens: maxTokens})
	return nil
}

// StartGenerate is a start_generate call for a prepared request. begin may be negative
// (counted from the end of the prompt) and must resolve into [0, L). The generation
// settings are those of the prep_recv. A start before the KV is complete, or with begin not
// at the prep_recv end, is done as MLC does it, and flagged.
func (e *Engine) StartGenerate(now time.Time, id string, begin int) error {
	r := e.reqs[id]
	if r == nil {
		return fmt.Errorf("start_generate %s: %w", id, ErrUnknownRequest)
	}
	if r.state != StatePrepared && r.state != StateKVComplete {
		return fmt.Errorf("start_generate %s: the request is %s: %w", id, r.state, ErrNotPrepared)
	}
	l := len(r.prompt)
	b := begin
	if b < 0 {
		b += l
	}
	if b < 0 || b >= l {
		return fmt.Errorf("start_generate %s: begin %d must resolve into [0, %d): %w", id, begin, l, ErrBadBegin)
	}
	e.setNow(now)
	e.leavePrepared(r)
	if !r.kv.complete() {
		e.hazard(Hazard{Kind: HazardStartBeforeKV, ID: id, Seq: r.seq, Received: r.kv.received, Reserved: r.kv.reserved})
	}
	if b != r.end {
		e.hazard(Hazard{Kind: HazardBeginMismatch, ID: id, Seq: r.seq, Begin: b, End: r.end})
	}
	if !r.extQueued {
		e.queueExtension(r)
	}
	r.state = StateRunning
	r.started = e.mark()
	e.totals.Started++
	ev := RequestStarted{Stamp: e.mark(), ID: id, Begin: b, Tail: l - b}
	if l-b == 1 {
		// The last prompt token is committed as if sampled: not streamed, and max_tokens
		// grows by one to make up for it.
		r.generated = 1
		r.maxTokens++
		r.lastToken = r.prompt[l-1]
		ev.Committed = true
		ev.Tail = 0
		e.running.pushBack(r)
	} else {
		r.pending = l - b
		r.tailPos = b
		e.waiting.pushFront(r)
		e.running.pushBack(r)
	}
	ev.MaxTokens = r.maxTokens
	e.emit(ev)
	return nil
}

// Abort aborts a request. A waiting one leaves the queue; a running one ends and its
// sequence is recycled as a finished one would be; a prepared one is dropped but its KV
// sequence, prefix entry and id leak, as in MLC, and the leak is flagged.
func (e *Engine) Abort(now time.Time, id string) error {
	r := e.reqs[id]
	if r == nil {
		return fmt.Errorf("abort %s: %w", id, ErrUnknownRequest)
	}
	if r.state.Ended() {
		return fmt.Errorf("abort %s: the request is %s: %w", id, r.state, ErrEnded)
	}
	e.setNow(now)
	switch r.state {
	case StateWaiting:
		e.waiting.remove(r)
		e.end(r, StateAborted, AbortByClient)
		e.emit(RequestAborted{Stamp: e.mark(), ID: id, Reason: AbortByClient})
	case StatePrepared, StateKVComplete:
		e.leavePrepared(r)
		r.leaked = true
		e.leaks = append(e.leaks, r)
		n := e.seqPages(r.seq)
		e.end(r, StateAborted, AbortByClient)
		e.emit(RequestAborted{Stamp: e.mark(), ID: id, Reason: AbortByClient, Leaked: true, LeakedPages: n})
		e.hazard(Hazard{Kind: HazardAbortLeak, ID: id, Seq: r.seq, Pages: n})
	case StateRunning:
		e.waiting.remove(r)
		e.running.remove(r)
		e.end(r, StateAborted, AbortByClient)
		e.emit(RequestAborted{Stamp: e.mark(), ID: id, Reason: AbortByClient})
		e.release(r, true)
	}
	e.tokens = append(e.tokens, Token{ID: id, Index: -1, Token: -1, Final: true, FinishReason: AbortByClient})
	return nil
}

// decodeOne decodes one token of a running request, for the batch's decode and a shadow's
// alike: a slot in every cache, its last token into the prefix caches, the next token
// sampled.
func (e *Engine) decodeOne(r *request) {
	for _, c := range e.caches {
		if _, err := c.ReserveAppend(r.seq, 1, e.scratch[:0]); err != nil {
			panic(fmt.Sprintf("engine: decode %s: %v", r.id, err))
		}
	}
	if e.prefix.HasSequence(r.seq) {
		e.prefix.ExtendSequence(r.seq, []int32{r.lastToken})
	}
	e.alt.extend(r, []int32{r.lastToken})
	e.sample(r)
}

// seqPages is the number of pages a sequence uses.
func (e *Engine) seqPages(seq int64) int {
	pgs, _ := e.caches[0].SequencePages(seq, nil)
	return len(pgs)
}

// Step runs one scheduler turn: prepare-receive, then new-request prefill, then batch
// decode; the first action that processes a request ends the step (docs/lifecycle.md).
func (e *Engine) Step(now time.Time) Ready {
	sc := e.runStep(now, func(sc *StepCompleted) {
		switch {
		case e.prepareReceive(sc):
			sc.Action = ActionPrepareReceive
		case e.prefill(sc):
			sc.Action = ActionPrefill
		case e.decode(sc):
			sc.Action = ActionDecode
		}
	}, nil)
	rd := Ready{Step: e.step, Now: e.now, Action: sc.Action, Events: e.out, Tokens: e.tokens}
	e.out, e.tokens = nil, nil
	return rd
}

// runStep is one step, the scheduler's (Step) or a shadow's (followStep): act does the
// step's work, then the extensions it queued reach the prefix cache, afterExtensions (if
// any) runs, and the step closes: timeouts, retirement, the prefix cache's changes, the
// totals and the StepCompleted event.
func (e *Engine) runStep(now time.Time, act func(sc *StepCompleted), afterExtensions func()) StepCompleted {
	e.setNow(now)
	e.step++
	sc := StepCompleted{}
	act(&sc)
	for _, r := range e.extQueue {
		e.queueExtension(r)
	}
	e.extQueue = e.extQueue[:0]
	if afterExtensions != nil {
		afterExtensions()
	}
	e.timeouts()
	e.retireOld()
	e.flushPrefix()
	e.totals.Steps++
	e.totals.Actions[sc.Action]++
	sc.Stamp = e.mark()
	sc.Counts = e.counts()
	e.last = sc
	e.emit(sc)
	e.checkInvariants()
	return sc
}

// prepareReceive runs the action over the waiting prepare-receive requests, one admission at
// a time so that requests queued behind the blocked one cost nothing.
func (e *Engine) prepareReceive(sc *StepCompleted) bool {
	running := e.numRunning()
	admitted := 0
	for {
		head := e.headPrep()
		if head == nil {
			break
		}
		p, ev := e.act.Admit(running, head.prepareRequest())
		if ev.Blocked() {
			e.block(head, ev)
			break
		}
		e.admit(head, p)
		admitted++
	}
	sc.Admitted = admitted
	return admitted > 0
}

func (r *request) prepareRequest() prepare.Request {
	return prepare.Request{ID: r.id, Prompt: r.prompt, End: r.end, HasEnd: true}
}

// headPrep returns the first prepare-receive request in the waiting queue.
func (e *Engine) headPrep() *request {
	for r := range e.waiting.all() {
		if r.state == StateWaiting {
			return r
		}
	}
	return nil
}

// numRunning counts running requests with nothing left to prefill.
func (e *Engine) numRunning() int {
	n := 0
	for r := range e.running.all() {
		if r.pending == 0 {
			n++
		}
	}
	return n
}

func (e *Engine) block(r *request, ev prepare.Evaluation) {
	if r.eval != nil && *r.eval == ev {
		return
	}
	r.eval = &ev
	e.totals.Blocked[ev.Reason]++
	e.emit(PrepareBlocked{Stamp: e.mark(), ID: r.id, Eval: ev})
}

// admit turns an admission into the request's new state and its events.
func (e *Engine) admit(r *request, p prepare.Prepared) {
	e.waiting.remove(r)
	r.eval = nil
	r.seq = p.Seq
	r.matched = p.Matched
	r.match = p.Match.Kind
	r.parent = p.Match.Parent
	r.admitted = e.mark()
	e.alt.insert(r)
	r.state = StatePrepared
	md, err := prepare.Split(p.Metadata)
	if err != nil {
		panic(fmt.Sprintf("engine: admission of %s produced bad metadata %v: %v", r.id, p.Metadata, err))
	}
	r.runs = md
	r.encoded = p.Encoded
	r.kv = newKVProgress(md[0], e.cfg.PageSize)
	e.totals.Admitted++
	st := e.mark()
	pm := PrefixMatched{Stamp: st, ID: r.id, Seq: p.Seq, Match: p.Match.Kind, Matched: p.Matched,
		Parent: p.Match.Parent, Pop: p.Match.Pop, Path: p.Match.Path, Candidates: p.Match.Candidates}
	e.lastMatch = &pm
	e.emit(pm)
	switch p.Match.Kind {
	case prefix.Fork:
		e.emit(SeqForked{Stamp: st, Parent: p.Match.Parent, Child: p.Seq, Pos: p.Matched, CopiedPage: p.CopiedPage, ID: r.id})
	case prefix.Reuse:
		if p.Match.Pop > 0 {
			e.emit(SeqPopped{Stamp: st, Seq: p.Seq, N: p.Match.Pop})
		}
	default:
		e.emit(SeqAdded{Stamp: st, Seq: p.Seq, ID: r.id})
	}
	if p.Match.Kind != prefix.Fresh {
		e.checkForkRace(r, p)
	}
	e.seqOwner[p.Seq] = r
	if n := r.end - r.matched; n > 0 {
		e.emit(PagesReserved{Stamp: st, Seq: p.Seq, ID: r.id, N: n, NewPages: e.newPages(md[0])})
	}
	e.emit(PrepareAdmitted{Stamp: st, ID: r.id, Seq: p.Seq, End: r.end, Matched: p.Matched, PagesTaken: p.PagesTaken, Evicted: p.Evaluation.Evicted})
	e.emit(MetadataEmitted{Stamp: st, ID: r.id, Seq: p.Seq, PromptLength: len(r.prompt), Matched: p.Matched, Runs: md, Encoded: p.Encoded})
	e.metadata = appendBounded(e.metadata, MetadataEmitted{Stamp: st, ID: r.id, Seq: p.Seq, PromptLength: len(r.prompt), Matched: p.Matched, Runs: md, Encoded: p.Encoded}, e.cfg.KeepMetadata)
	if r.kv.complete() {
		r.state = StateKVComplete
	} else {
		for _, sp := range r.kv.spans {
			e.pageKV[sp.page] = r
		}
	}
	e.prepared.pushBack(r)
	if _, dup := e.issued[r.encoded]; !dup {
		e.issued[r.encoded] = r
	}
	if !e.cfg.ExcludeUnreceived || r.kv.complete() {
		e.extQueue = append(e.extQueue, r)
	}
}

// newPages lists the pages of a reservation's runs that no slot before the reservation
// used: the pages it took off the free list, in order.
func (e *Engine) newPages(runs []pages.Run) []int32 {
	ps := int64(e.cfg.PageSize)
	var out []int32
	for _, r := range runs {
		// Blocks start on page boundaries, so a page is new exactly when the reservation
		// writes its first slot.
		for s := (r.Start + ps - 1) / ps * ps; s < r.End(); s += ps {
			out = append(out, int32(s/ps))
		}
	}
	return out
}

// checkForkRace flags a fork or reuse from a sequence whose KV has not all arrived.
func (e *Engine) checkForkRace(r *request, p prepare.Prepared) {
	owner := e.seqOwner[p.Match.Parent]
	if owner == nil || owner.kv.reserved == 0 {
		return
	}
	shared := min(p.Matched, owner.end) - owner.matched
	if shared <= 0 {
		return
	}
	if miss := owner.kv.missing(shared); miss > 0 {
		e.hazard(Hazard{Kind: HazardForkUnreceived, ID: r.id, Seq: p.Seq, Parent: owner.id, ParentSeq: p.Match.Parent, Pos: p.Matched, Unreceived: miss})
	}
}

// queueExtension tells the prefix cache (lazily) that the request's sequence holds its
// prompt up to end.
func (e *Engine) queueExtension(r *request) {
	r.extQueued = true
	if r.end > r.matched && e.prefix.HasSequence(r.seq) {
		e.prefix.ExtendSequence(r.seq, r.prompt[r.matched:r.end])
	}
	e.alt.extend(r, r.prompt[r.altMatched:r.end])
}

// leavePrepared takes a request off the prepared list and its pages off the KV map.
func (e *Engine) leavePrepared(r *request) {
	e.prepared.remove(r)
	if e.issued[r.encoded] == r {
		delete(e.issued, r.encoded)
		if r.kv.reserved == 0 {
			// Only a reservation of no slots has metadata another can share: the next
			// prepared request with it is the one it names now.
			for o := range e.prepared.all() {
				if o.encoded == r.encoded {
					e.issued[o.encoded] = o
					break
				}
			}
		}
	}
	e.unmapKV(r)
}

func (e *Engine) unmapKV(r *request) {
	for _, sp := range r.kv.spans {
		if e.pageKV[sp.page] == r {
			e.pageKV[sp.page] = nil
		}
	}
}

// prefill runs new-request prefill over the started requests with a tail, front of the
// waiting queue first, within the prefill chunk budget.
func (e *Engine) prefill(sc *StepCompleted) bool {
	budget := e.cfg.PrefillChunkSize
	var done []*request
	for r := range e.waiting.all() {
		if r.state != StateRunning || r.pending == 0 || budget == 0 {
			continue
		}
		chunk := min(r.pending, budget)
		need := e.pagesNeeded(r.seq, chunk)
		for need > e.caches[0].NumAvailablePages() && e.prefix.TryFreeMemory() {
		}
		if need > e.caches[0].NumAvailablePages() {
			break
		}
		newPages := e.reserve(r.seq, chunk)
		if e.prefix.HasSequence(r.seq) {
			e.prefix.ExtendSequence(r.seq, r.prompt[r.tailPos:r.tailPos+chunk])
		}
		e.alt.extend(r, r.prompt[r.tailPos:r.tailPos+chunk])
		r.tailPos += chunk
		r.pending -= chunk
		budget -= chunk
		sc.Prefilled++
		e.emit(PagesReserved{Stamp: e.mark(), Seq: r.seq, ID: r.id, N: chunk, NewPages: newPages})
		e.emit(Prefilled{Stamp: e.mark(), ID: r.id, Tokens: chunk, Remaining: r.pending})
		if r.pending == 0 {
			done = append(done, r)
		}
	}
	for _, r := range done {
		e.waiting.remove(r)
		e.sample(r)
	}
	for _, r := range done {
		if r.generated >= r.maxTokens {
			e.finish(r)
		}
	}
	return sc.Prefilled > 0
}

// pagesNeeded returns how many pages appending n tokens to a sequence takes.
func (e *Engine) pagesNeeded(seq int64, n int) int {
	length, _ := e.caches[0].SequenceLength(seq)
	ps := e.cfg.PageSize
	// Every block starts on a page boundary, so a sequence's last page is partly filled
	// exactly when its length is not a multiple of the page size.
	room := (ps - length%ps) % ps
	if n <= room {
		return 0
	}
	return (n - room + ps - 1) / ps
}

// reserve appends n slots to a sequence in every model's cache and returns the pages taken.
func (e *Engine) reserve(seq int64, n int) []int32 {
	var slots []int64
	for _, c := range e.caches {
		var err error
		slots, err = c.ReserveAppend(seq, n, e.scratch[:0])
		if err != nil {
			panic(fmt.Sprintf("engine: reserve %d in seq %d after checking for pages: %v", n, seq, err))
		}
		e.scratch = slots
	}
	return e.newPages(toRuns(slots))
}

// toRuns compresses slots into runs.
func toRuns(slots []int64) []pages.Run {
	flat := pages.Compress(nil, slots)
	runs := make([]pages.Run, 0, flat[0])
	for i := 1; i < len(flat); i += 2 {
		runs = append(runs, pages.Run{Start: flat[i], Len: flat[i+1]})
	}
	return runs
}

// decode runs batch decode: one token for every running request with nothing to prefill,
// preempting the last ones when pages run short and eviction frees nothing.
func (e *Engine) decode(sc *StepCompleted) bool {
	batch := e.batch[:0]
	for r := range e.running.all() {
		if r.pending == 0 {
			batch = append(batch, r)
		}
	}
	defer func() { clear(batch); e.batch = batch[:0] }()
	if len(batch) == 0 {
		return false
	}
	for len(batch) > 0 && e.caches[0].NumAvailablePages() < len(batch) {
		if e.prefix.TryFreeMemory() {
			continue
		}
		victim := batch[len(batch)-1]
		batch = batch[:len(batch)-1]
		e.preempt(victim)
		sc.Preempted++
	}
	if len(batch) == 0 {
		return sc.Preempted > 0
	}
	ids := make([]string, len(batch))
	for i, r := range batch {
		ids[i] = r.id
		e.decodeOne(r)
	}
	sc.Decoded = len(batch)
	e.emit(Decoded{Stamp: e.mark(), IDs: ids})
	for _, r := range batch {
		if r.generated >= r.maxTokens {
			e.finish(r)
		}
	}
	return true
}

// sample generates a request's next token.
func (e *Engine) sample(r *request) {
	tok := simToken(e.cfg.Seed, r.id, r.generated, e.cfg.VocabSize)
	r.generated++
	r.lastToken = tok
	e.totals.Generated++
	t := Token{ID: r.id, Index: r.streamed, Token: tok}
	r.streamed++
	if r.generated >= r.maxTokens {
		t.Final = true
		t.FinishReason = "length"
	}
	e.tokens = append(e.tokens, t)
}

// simToken is the deterministic stand-in for sampling.
func simToken(seed uint64, id string, i, vocab int) int32 {
	h := seed ^ 0x9e3779b97f4a7c15
	for _, c := range []byte(id) {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	h ^= uint64(i) * 0xbf58476d1ce4e5b9
	h ^= h >> 31
	h *= 0x94d049bb133111eb
	h ^= h >> 29
	return int32(h % uint64(vocab))
}

// finish ends a request that generated its tokens and recycles its sequence.
func (e *Engine) finish(r *request) {
	e.running.remove(r)
	e.end(r, StateFinished, "length")
	e.totals.Finished++
	e.emit(RequestFinished{Stamp: e.mark(), ID: r.id, Generated: r.generated, Reason: "length"})
	e.release(r, true)
}

// release gives up a request's KV sequence: recycled into the prefix cache when recycle is
// set and the cache holds it, else removed.
func (e *Engine) release(r *request, recycle bool) {
	e.alt.release(r, recycle)
	if recycle && e.prefix.HasSequence(r.seq) {
		e.recycling = true
		err := e.prefix.RecycleSequence(r.seq)
		e.recycling = false
		if err != nil {
			panic(fmt.Sprintf("engine: recycle %s seq %d: %v", r.id, r.seq, err))
		}
		if e.prefix.HasSequence(r.seq) {
			e.totals.Recycled++
			e.emit(SeqRecycled{Stamp: e.mark(), Seq: r.seq, ID: r.id})
		}
		return
	}
	if e.prefix.HasSequence(r.seq) {
		if err := e.prefix.RemoveSequence(r.seq); err != nil {
			panic(fmt.Sprintf("engine: remove %s seq %d from the prefix cache: %v", r.id, r.seq, err))
		}
	}
	e.removeSeq(r.seq)
}

// removeSeq removes a KV sequence from every model's cache, other than by eviction.
func (e *Engine) removeSeq(seq int64) {
	e.emit(SeqRemoved{Stamp: e.mark(), Seq: seq, Freed: e.dropSeq(seq)})
}

// onEvict is the prefix cache's eviction callback: the KV sequence goes too.
func (e *Engine) onEvict(ev prefix.Eviction) {
	e.totals.Evicted++
	if !e.recycling {
		e.alt.evict() // an eviction for memory; the cap's, the counterfactual makes itself
	}
	owner := ""
	if r := e.seqOwner[ev.Seq]; r != nil {
		owner = r.id
	}
	e.emit(SeqEvicted{Stamp: e.mark(), Seq: ev.Seq, ID: owner, Freed: e.dropSeq(ev.Seq),
		Recycled: ev.Recycled, Oldest: ev.Oldest, OldestRecycled: ev.OldestRecycled})
}

// dropSeq removes a KV sequence from every model's cache, frees its id and returns the
// pages freed.
func (e *Engine) dropSeq(seq int64) int {
	before := e.caches[0].NumAvailablePages()
	for _, c := range e.caches {
		if err := c.RemoveSequence(seq); err != nil {
			panic(fmt.Sprintf("engine: remove seq %d: %v", seq, err))
		}
	}
	delete(e.seqOwner, seq)
	e.ids.Recycle(seq)
	return e.caches[0].NumAvailablePages() - before
}

// preempt aborts a running request for want of pages and frees its KV; the router starts
// its three calls again.
func (e *Engine) preempt(r *request) {
	e.running.remove(r)
	e.end(r, StatePreempted, AbortPreempt)
	e.totals.Preempted++
	e.emit(RequestAborted{Stamp: e.mark(), ID: r.id, Reason: AbortPreempt})
	e.release(r, false)
	e.tokens = append(e.tokens, Token{ID: r.id, Index: -1, Token: -1, Final: true, FinishReason: AbortPreempt})
}

// end marks a request over and queues it for retirement.
func (e *Engine) end(r *request, st RequestState, reason string) {
	r.state = st
	r.finishReason = reason
	r.ended = e.mark()
	r.pending = 0
	r.eval = nil
	if st == StateAborted || st == StatePreempted {
		e.totals.Aborted++
	}
	e.ended = append(e.ended, r)
}

// timeouts flags requests prepared for too long and, with ReclaimAfter set, frees them and
// the sequences of aborted prepared requests.
func (e *Engine) timeouts() {
	if e.cfg.PreparedAgeLimit > 0 {
		limit := e.cfg.PreparedAgeLimit.Milliseconds()
		for r := range e.prepared.all() {
			if age := e.now - r.admitted.At; !r.ageFlagged && age >= limit {
				r.ageFlagged = true
				e.hazard(Hazard{Kind: HazardPreparedAge, ID: r.id, Seq: r.seq, AgeMs: age, Received: r.kv.received, Reserved: r.kv.reserved})
			}
		}
	}
	if e.cfg.ReclaimAfter <= 0 {
		return
	}
	limit := e.cfg.ReclaimAfter.Milliseconds()
	for _, r := range e.prepared.appendTo(nil) {
		if e.now-r.admitted.At >= limit {
			e.leavePrepared(r)
			e.end(r, StateAborted, AbortReclaim)
			e.emit(RequestAborted{Stamp: e.mark(), ID: r.id, Reason: AbortReclaim})
			e.release(r, false)
			e.tokens = append(e.tokens, Token{ID: r.id, Index: -1, Token: -1, Final: true, FinishReason: AbortReclaim})
		}
	}
	for _, r := range slices.Clone(e.leaks) {
		if e.now-r.admitted.At >= limit {
			e.leaks = remove(e.leaks, r)
			r.leaked = false
			e.release(r, false)
		}
	}
}

// retireOld forgets the oldest ended requests beyond KeepFinished; a leaked one is kept
// while its sequence is held. The table and the ended list are compacted once for all of
// them, so that retiring costs a pass a step, not one per request retired.
func (e *Engine) retireOld() {
	n := 0
	for _, r := range e.ended {
		if !r.leaked {
			n++
		}
	}
	excess := n - e.cfg.KeepFinished
	if excess <= 0 {
		return
	}
	kept := e.ended[:0]
	for _, r := range e.ended {
		if excess > 0 && !r.leaked {
			excess--
			r.retired = true
			e.forget(r)
			continue
		}
		kept = append(kept, r)
	}
	clear(e.ended[len(kept):])
	e.ended = kept
	e.order = slices.DeleteFunc(e.order, func(r *request) bool { return r.retired })
}

// retire forgets one ended request.
func (e *Engine) retire(r *request) {
	e.forget(r)
	e.order = remove(e.order, r)
	e.ended = remove(e.ended, r)
}

// forget takes a request out of the id table and says so; the caller takes it off the
// table's order and the ended list.
func (e *Engine) forget(r *request) {
	delete(e.reqs, r.id)
	e.emit(RequestRetired{Stamp: e.mark(), ID: r.id})
}

func (e *Engine) hazard(h Hazard) {
	e.totals.Hazards[h.Kind]++
	ev := HazardDetected{Stamp: e.mark(), Hazard: h}
	if r := e.reqs[h.ID]; r != nil && len(r.hazards) < maxHazards {
		r.hazards = append(r.hazards, h.Kind)
	}
	e.hazards = appendBounded(e.hazards, ev, MaxRecentHazards)
	e.emit(ev)
}

// flushPrefix emits the prefix tree's changes since the last flush.
func (e *Engine) flushPrefix() {
	up, rm := e.prefix.TakeChanges()
	if len(up) == 0 && len(rm) == 0 {
		return
	}
	e.emit(PrefixChanged{Stamp: e.mark(), Upserts: up, Removed: rm, Stats: e.prefix.Stats(), Recycling: e.prefix.Recycling(),
		Counterfactual: e.alt.state(e.cfg)})
}

func remove[T comparable](s []T, v T) []T {
	if i := slices.Index(s, v); i >= 0 {
		return slices.Delete(s, i, i+1)
	}
	return s
}

// appendBounded appends v to a list that keeps its last limit elements, oldest first. A
// full list is a window that slides along its array, copied to a new array only when it
// reaches the end of its own: an append costs O(1), not the whole list, and a list handed
// out earlier never sees its elements change.
func appendBounded[T any](s []T, v T, limit int) []T {
	switch {
	case limit == 0:
		return s[:0]
	case len(s) < limit:
		return append(s, v)
	case len(s) < cap(s):
		return append(s, v)[len(s)-limit+1:]
	}
	n := make([]T, limit-1, 2*limit)
	copy(n, s[len(s)-limit+1:])
	return append(n, v)
}

// Check verifies the engine's invariants (docs/kv-cache.md and the queue rules): every
// model's cache is sound and alike, the prefix cache is sound and holds only sequences the
// caches hold, every sequence has an owner, prepared requests are in neither queue and hold
// exactly end tokens, and the queues hold what they should. It returns the first violation.
func (e *Engine) Check() error {
	st := e.caches[0].State()
	for i, c := range e.caches {
		if err := c.Check(); err != nil {
			return fmt.Errorf("model %d: %w", i, err)
		}
		if i > 0 && !sameState(st, c.State()) {
			return fmt.Errorf("model %d's cache differs from model 0's", i)
		}
	}
	if err := e.prefix.Check(); err != nil {
		return err
	}
	if e.alt != nil {
		if err := e.alt.c.Check(); err != nil {
			return fmt.Errorf("counterfactual: %w", err)
		}
		if got, want := e.alt.c.Stats().QueryTokens, e.prefix.Stats().QueryTokens; got != want {
			return fmt.Errorf("counterfactual looked up %d tokens, the prefix cache %d", got, want)
		}
	}
	for _, id := range e.caches[0].SequenceIDs() {
		if e.seqOwner[id] == nil {
			return fmt.Errorf("seq %d has no owner", id)
		}
	}
	for seq, r := range e.seqOwner {
		if !e.caches[0].HasSequence(seq) {
			return fmt.Errorf("seq %d of %s is not in the cache", seq, r.id)
		}
	}
	for _, seq := range e.prefix.Recycling() {
		if !e.caches[0].HasSequence(seq) {
			return fmt.Errorf("recycling seq %d is not in the cache", seq)
		}
	}
	for _, q := range []*queue{&e.waiting, &e.running, &e.prepared} {
		if err := q.check(); err != nil {
			return err
		}
	}
	seen := map[string]*request{}
	for r := range e.prepared.all() {
		if r.state != StatePrepared && r.state != StateKVComplete {
			return fmt.Errorf("%s is on the prepared list but %s", r.id, r.state)
		}
		if e.waiting.has(r) || e.running.has(r) {
			return fmt.Errorf("prepared %s is in a queue", r.id)
		}
		if first := seen[r.encoded]; first == nil {
			seen[r.encoded] = r
			if e.issued[r.encoded] != r {
				return fmt.Errorf("prepared %s is not found by its metadata %s", r.id, r.encoded)
			}
		}
		if l, _ := e.caches[0].SequenceLength(r.seq); l != r.end {
			return fmt.Errorf("prepared %s: seq %d holds %d tokens, want end %d", r.id, r.seq, l, r.end)
		}
	}
	for _, r := range e.issued {
		if !e.prepared.has(r) {
			return fmt.Errorf("%s is found by its metadata but not prepared", r.id)
		}
	}
	for r := range e.waiting.all() {
		if r.state != StateWaiting && !(r.state == StateRunning && r.pending > 0) {
			return fmt.Errorf("%s is in the waiting queue but %s with %d pending", r.id, r.state, r.pending)
		}
	}
	for r := range e.running.all() {
		if r.state != StateRunning {
			return fmt.Errorf("%s is in the running queue but %s", r.id, r.state)
		}
	}
	for _, r := range e.order {
		if r.state == StateWaiting {
			if r != e.headPrep() {
				return fmt.Errorf("%s is the first waiting request of the table but %v heads the line", r.id, e.headPrep())
			}
			break
		}
	}
	for page, r := range e.pageKV {
		if r != nil && r.state != StatePrepared {
			return fmt.Errorf("page %d waits for KV of %s, which is %s", page, r.id, r.state)
		}
	}
	return nil
}

func sameState(a, b pages.State) bool {
	if !slices.Equal(a.Free, b.Free) || !slices.Equal(a.Seqs, b.Seqs) || len(a.Blocks) != len(b.Blocks) {
		return false
	}
	for i := range a.Blocks {
		if a.Blocks[i].ID != b.Blocks[i].ID || a.Blocks[i].Length != b.Blocks[i].Length || !slices.Equal(a.Blocks[i].Pages, b.Blocks[i].Pages) {
			return false
		}
	}
	return true
}

func (e *Engine) checkInvariants() {
	if invariants.Enabled {
		if err := e.Check(); err != nil {
			panic(fmt.Sprintf("engine: after step %d: %v", e.step, err))
		}
	}
}
