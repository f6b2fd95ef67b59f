package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
)

// Follow mode drives an engine by what a tap saw pass between a router and a real decode
// instance (D), instead of letting it decide on its own: a prep_recv arrived, D answered it,
// P finished sending the KV, start_generate began, tokens streamed, the stream ended. The
// engine is then a shadow of D. It predicts what D answers with the same code that decides
// in the embedded engine, and checks the prediction against D's answer: a difference is a
// Divergence event, after which the shadow makes its pages agree with the slots D named.
//
// Every Follow call is one step of the shadow (a StepCompleted closes it), so a viewer
// folds a shadow's events as it folds an engine's. Like the rest of the engine the calls do
// no I/O and read no clock: the tap stamps each observation with its own time.

// DivergenceKind says what differed between D and the shadow.
type DivergenceKind uint8

// The divergence kinds.
const (
	// DivergedBlocked: D admitted a request the shadow holds blocked.
	DivergedBlocked DivergenceKind = iota
	// DivergedOrder: D admitted a request that is not at the head of the shadow's line.
	DivergedOrder
	// DivergedMatched: D matched a different prefix length.
	DivergedMatched
	// DivergedMetadata: D reserved other slots (kv_append_metadata differs).
	DivergedMetadata
	// DivergedUnknown: D answered for a request the shadow never saw arrive.
	DivergedUnknown
	// DivergedFinish: D's stream ended otherwise than the shadow predicted.
	DivergedFinish
	// DivergedRoom: the shadow has no room for what D did (pages it cannot find).
	DivergedRoom
	// DivergedLost: observations were lost; the shadow starts over.
	DivergedLost
	numDivergenceKinds
)

var divergenceNames = [numDivergenceKinds]string{"blocked", "order", "matched", "metadata", "unknown-request", "finish", "room", "lost"}

func (k DivergenceKind) String() string {
	if k < numDivergenceKinds {
		return divergenceNames[k]
	}
	return fmt.Sprintf("divergence(%d)", uint8(k))
}

// MarshalText writes the kind's name.
func (k DivergenceKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *DivergenceKind) UnmarshalText(b []byte) error {
	for i, n := range divergenceNames {
		if n == string(b) {
			*k = DivergenceKind(i)
			return nil
		}
	}
	return fmt.Errorf("engine: unknown divergence %q", b)
}

// DivergenceKinds lists every divergence kind.
func DivergenceKinds() []DivergenceKind {
	out := make([]DivergenceKind, numDivergenceKinds)
	for i := range out {
		out[i] = DivergenceKind(i)
	}
	return out
}

// DivergenceCounts counts divergences by kind; its JSON is an object by kind name.
type DivergenceCounts [numDivergenceKinds]uint64

// MarshalJSON writes {"blocked": n, …}, every kind.
func (c DivergenceCounts) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range c {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%d", divergenceNames[i], n)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes; an unknown kind is an error.
func (c *DivergenceCounts) UnmarshalJSON(b []byte) error {
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*c = DivergenceCounts{}
	for name, n := range m {
		var k DivergenceKind
		if err := k.UnmarshalText([]byte(name)); err != nil {
			return err
		}
		c[k] = n
	}
	return nil
}

// PageSwap exchanges two page ids everywhere the cache holds them (pages.Cache.SwapPages).
type PageSwap struct {
	A int32 `json:"a"`
	B int32 `json:"b"`
}

// Answer is D's answer to prep_recv, as the router received it.
type Answer struct {
	PromptLength int    `json:"prompt_length"`
	Matched      int    `json:"prefix_matched_length"`
	Metadata     string `json:"kv_append_metadata"`
}

// Standing is how far a shadow can be trusted: exact since a step, or how often and how it
// diverged, and what it does not know (requests admitted before the tap, pages of unknown
// use).
type Standing struct {
	Divergences uint64           `json:"divergences"`
	ByKind      DivergenceCounts `json:"by_kind"`
	// ExactSince is the step from which every answer of D was predicted (0: from the start).
	ExactSince uint64 `json:"exact_since"`
	// Last is the last divergence, if any.
	Last *Divergence `json:"last,omitempty"`
	// BeforeTap lists requests first seen at start_generate or later: admitted before the
	// tap started (or their prep_recv was lost); the shadow holds no pages for them.
	BeforeTap []string `json:"before_tap,omitempty"`
	// UnknownPages counts pages D holds for what the shadow cannot explain: those of
	// UnknownPageIDs the shadow has free (the page map's PageUnknown).
	UnknownPages   int     `json:"unknown_pages"`
	UnknownPageIDs []int32 `json:"unknown_page_ids,omitempty"`
}

// Exact reports whether the shadow has predicted every answer so far, knows every request
// and every page.
func (s Standing) Exact() bool {
	return s.Divergences == 0 && len(s.BeforeTap) == 0 && s.UnknownPages == 0
}

// Describe says the standing in words, as the header and /v1/instances show it; now (engine
// time, Unix milliseconds) dates the last divergence.
func (s Standing) Describe(now int64) string {
	var parts []string
	switch {
	case s.Divergences == 0:
		parts = append(parts, fmt.Sprintf("exact since step %d", s.ExactSince))
	default:
		last := ""
		if s.Last != nil {
			last = fmt.Sprintf(" (last: %s, %s)", s.Last.What, agoText(now-s.Last.At))
		}
		parts = append(parts, fmt.Sprintf("diverged %d %s%s, exact since step %d", s.Divergences, plural(int(s.Divergences), "time", "times"), last, s.ExactSince))
	}
	if len(s.BeforeTap) > 0 || s.UnknownPages > 0 {
		parts = append(parts, fmt.Sprintf("warming: %d %s admitted before the tap, %d %s of unknown use",
			len(s.BeforeTap), plural(len(s.BeforeTap), "request", "requests"), s.UnknownPages, plural(s.UnknownPages, "page", "pages")))
	}
	return strings.Join(parts, "; ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func agoText(ms int64) string {
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	}
	return fmt.Sprintf("%.1f h ago", d.Hours())
}

// maxBeforeTap bounds the requests a standing lists as admitted before the tap.
const maxBeforeTap = 64

func (d Divergence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "divergence %s", d.What)
	if d.ID != "" {
		fmt.Fprintf(&b, " %s", d.ID)
	}
	switch d.What {
	case DivergedMatched, DivergedMetadata, DivergedBlocked, DivergedOrder:
		fmt.Fprintf(&b, ": D matched %d, metadata %s; the shadow matched %d, metadata %s", d.DMatched, d.DMetadata, d.ShadowMatched, orDash(d.ShadowMetadata))
	}
	if d.Cause != "" {
		fmt.Fprintf(&b, "; %s", d.Cause)
	}
	if len(d.Swaps) > 0 {
		fmt.Fprintf(&b, "; resynced %d %s", len(d.Swaps), plural(len(d.Swaps), "page", "pages"))
	}
	if d.Reset {
		b.WriteString("; the shadow starts over")
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// followState is what a shadow keeps about its own standing.
type followState struct {
	standing Standing
	// beforeTap holds the requests admitted before the tap, with the tokens seen of each.
	beforeTap map[string]int
	// unknown holds the pages the shadow has free that D holds for what it does not know.
	unknown map[int32]bool
}

// Follow turns follow mode on: the engine is a shadow and keeps its Standing. Call it once,
// on a fresh engine.
func (e *Engine) Follow() {
	if e.follow == nil {
		e.follow = &followState{beforeTap: make(map[string]int), unknown: make(map[int32]bool)}
	}
}

// Standing returns the shadow's standing (the zero Standing when not following).
func (e *Engine) Standing() Standing {
	if e.follow == nil {
		return Standing{}
	}
	e.follow.standing.UnknownPages = e.unknownPages()
	st := e.follow.standing.clone()
	st.UnknownPageIDs = unknownIDs(e.follow.unknown)
	return st
}

// followStep runs fn as one step of the shadow and closes it as Step does.
func (e *Engine) followStep(now time.Time, fn func(sc *StepCompleted)) {
	// D evaluates the head of its line every step: so does the shadow, after every change,
	// so that a waiting request shows why it waits, with today's numbers.
	e.runStep(now, fn, e.evaluateHead)
	if f := e.follow; f != nil {
		pruneUnknown(f.unknown, e.caches[0])
	}
}

// diverge records a divergence.
func (e *Engine) diverge(d Divergence) Divergence {
	d.Stamp = e.mark()
	if e.follow != nil {
		e.follow.standing.note(d)
	}
	e.emit(d)
	return d
}

// note counts a divergence into the standing; the engine and a View both do.
func (s *Standing) note(d Divergence) {
	s.Divergences++
	if d.What < numDivergenceKinds {
		s.ByKind[d.What]++
	}
	s.ExactSince = d.Step + 1
	l := d
	l.Swaps = nil
	s.Last = &l
}

// clone copies a standing's lists.
func (s Standing) clone() Standing {
	s.BeforeTap = slices.Clone(s.BeforeTap)
	s.UnknownPageIDs = slices.Clone(s.UnknownPageIDs)
	if s.Last != nil {
		l := *s.Last
		s.Last = &l
	}
	return s
}

// Follow returns a shadow's standing as the view knows it, and false for an engine that
// is not a shadow.
func (v *View) Follow() (Standing, bool) {
	if v.follow == nil {
		return Standing{}, false
	}
	return v.standing(), true
}

// Shadow reports whether the view is of a tap's shadow (Follow's ok, without its copy).
func (v *View) Shadow() bool { return v.follow != nil }

// standing is the view's standing, its pages of unknown use counted as the engine counts
// them.
func (v *View) standing() Standing {
	st := v.follow.clone()
	st.UnknownPages = countUnknown(v.unknown, v.cache)
	st.UnknownPageIDs = unknownIDs(v.unknown)
	return st
}

// applySwaps is the engine's applySwaps for a view: its replica of the cache, its requests'
// reservations and KV progress, and the recent metadata.
func (v *View) applySwaps(swaps []PageSwap) error {
	if len(swaps) == 0 {
		return nil
	}
	for _, s := range swaps {
		if err := v.cache.SwapPages(s.A, s.B); err != nil {
			return err
		}
	}
	perm := swapPerm(swaps)
	ps := v.cfg.PageSize
	for _, r := range v.order {
		if len(r.Runs) == 0 || !touches(r.Runs, perm, ps) {
			continue
		}
		r.Runs, r.Encoded = remapRuns(r.Runs, perm, ps)
		if old := v.kv[r.ID]; old != nil {
			kp := newKVProgress(r.Runs[0], ps)
			for _, t := range old.got {
				kp.add(t.lo, t.hi)
			}
			if len(old.got) == 0 && len(kp.runRecv) == len(old.runRecv) {
				copy(kp.runRecv, old.runRecv)
				kp.received = old.received
			}
			v.kv[r.ID] = &kp
			r.Received = kp.received
			r.RunReceived = slices.Clone(kp.runRecv)
		}
	}
	for i, m := range v.metadata {
		if touches(m.Runs, perm, ps) {
			m.Runs, m.Encoded = remapRuns(m.Runs, perm, ps)
			v.metadata[i] = m
		}
	}
	return nil
}

// FollowArrived records a prep_recv call the tap saw go to D: the request joins the waiting
// queue, and the head of the line is evaluated as D evaluates it, so a blocked request shows
// why. A request with the id of one still alive ends that one first (D would refuse the
// duplicate; a router resends an id only after the first ended, so the shadow missed its
// end). A bad request changes nothing.
func (e *Engine) FollowArrived(now time.Time, pr PrepRecv) error {
	if old := e.reqs[pr.ID]; old != nil && !old.state.Ended() {
		e.followStep(now, func(*StepCompleted) { e.forceEnd(old, AbortByClient) })
	}
	if err := e.PrepRecv(now, pr); err != nil {
		return err
	}
	e.followStep(now, func(*StepCompleted) { e.evaluateHead() })
	return nil
}

// evaluateHead evaluates the head of the line without evicting, recording a blocked verdict.
func (e *Engine) evaluateHead() {
	head := e.headPrep()
	if head == nil {
		return
	}
	ev := e.act.Evaluate(e.numRunning(), head.prepareRequest())
	if ev.Blocked() {
		e.block(head, ev)
	}
}

// FollowAdmitted records D's answer to a request's prep_recv: the shadow admits the request
// now, compares its own answer with D's and, when they differ, returns the divergence (and
// true) after making its pages agree with the slots D named. An answer for a request the
// shadow does not hold waiting is a divergence of its own, and changes nothing else.
func (e *Engine) FollowAdmitted(now time.Time, id string, d Answer) (Divergence, bool) {
	var out Divergence
	diverged := false
	e.followStep(now, func(sc *StepCompleted) {
		out, diverged = e.followAdmit(sc, id, d)
	})
	if !diverged {
		e.followStep(now, func(*StepCompleted) { e.evaluateHead() })
	}
	return out, diverged
}

func (e *Engine) followAdmit(sc *StepCompleted, id string, d Answer) (Divergence, bool) {
	r := e.reqs[id]
	if r == nil || (r.state != StateWaiting && !r.awaitAnswer) {
		state := "never seen"
		if r != nil {
			state = r.state.String()
		}
		return e.diverge(Divergence{ID: id, What: DivergedUnknown, DMatched: d.Matched, DMetadata: d.Metadata,
			Cause: fmt.Sprintf("D answered prep_recv for a request the shadow holds %s: its prep_recv came before the tap, or was lost", state)}), true
	}
	var notes []Divergence
	if r.state == StateWaiting {
		// D answers from its prepare-receive step, which admits from the head of the line for
		// as long as admission passes: the requests before this one were admitted in the same
		// step (their answers are on their way), and so are those after it that pass.
		running := e.numRunning()
		reached := false
		for {
			head := e.headPrep()
			if head == nil {
				break
			}
			p, ev := e.act.Admit(running, head.prepareRequest())
			if ev.Blocked() {
				e.block(head, ev)
				if reached {
					break
				}
				if head != r {
					notes = append(notes, Divergence{ID: id, What: DivergedOrder,
						Cause: fmt.Sprintf("D admitted %s while %s, ahead of it in the shadow's line, is blocked (%s): the calls reached D in another order than the tap forwarded them, or D's configuration is larger", id, head.id, ev.Short())})
					if p, ev = e.act.Admit(running, r.prepareRequest()); !ev.Blocked() {
						e.admit(r, p)
						r.awaitAnswer = true
						sc.Admitted++
						break
					}
				}
				notes = append(notes, Divergence{ID: id, What: DivergedBlocked,
					Cause: fmt.Sprintf("D admitted a request the shadow holds blocked (%s): D's configuration is larger than the shadow's (pages, watermark, batch), or D holds fewer pages than the shadow thinks", ev.String())})
				p, err := e.act.Force(r.prepareRequest(), ev)
				if err != nil {
					// No room even after evicting: the shadow cannot hold what D reserved.
					for _, n := range notes {
						e.diverge(n)
					}
					e.forceEnd(r, "untracked")
					return e.diverge(Divergence{ID: id, What: DivergedRoom, DMatched: d.Matched, DMetadata: d.Metadata,
						Cause: fmt.Sprintf("the shadow has no room for D's reservation (%v): it stops following %s", err, id)}), true
				}
				e.admit(r, p)
				r.awaitAnswer = true
				sc.Admitted++
				break
			}
			e.admit(head, p)
			head.awaitAnswer = true
			sc.Admitted++
			reached = reached || head == r
		}
		sc.Action = ActionPrepareReceive
	}
	r.awaitAnswer = false
	var last Divergence
	for _, n := range notes {
		n.ShadowMatched, n.ShadowMetadata, n.DMatched, n.DMetadata = r.matched, r.encoded, d.Matched, d.Metadata
		last = e.diverge(n)
	}
	if r.matched == d.Matched && r.encoded == d.Metadata {
		return last, len(notes) > 0
	}
	div := Divergence{ID: id, ShadowMatched: r.matched, DMatched: d.Matched, ShadowMetadata: r.encoded, DMetadata: d.Metadata}
	if r.matched != d.Matched {
		div.What = DivergedMatched
		if r.matched > d.Matched {
			div.Cause = fmt.Sprintf("the shadow's prefix cache holds %d tokens of the prompt that D did not match: D evicted other sequences (eviction order), admitted requests in another step than predicted, or its cache differs from before the tap", r.matched)
		} else {
			div.Cause = fmt.Sprintf("D matched %d tokens the shadow's prefix cache does not hold: requests from before the tap, or the shadow evicted what D kept (eviction order, recycling limit)", d.Matched)
		}
		return e.diverge(div), true
	}
	div.What = DivergedMetadata
	div.Cause = "D reserved other pages than the shadow predicted: the eviction order, or pages whose use the shadow does not know (before the tap, or pages added during decode)"
	swaps, evicted, unknown, explained, err := e.resyncPages(r, d.Metadata)
	switch {
	case err != nil:
		div.Cause += fmt.Sprintf("; the pages could not be resynced: %v", err)
	case len(evicted) > 0:
		div.Cause += fmt.Sprintf("; D reused the pages of recycling seq %v, which it must have evicted", evicted)
	}
	div.Swaps, div.Unknown, div.Explained = swaps, unknown, explained
	if e.follow != nil {
		e.follow.standing.UnknownPages = e.unknownPages()
	}
	return e.diverge(div), true
}

// resyncPages makes the pages of r's reservation those D named in metadata: for each page
// of D's slots the shadow does not give r, a recycling sequence holding it in the shadow is
// removed (D reused its page, so D evicted it), and then the page and the one the shadow
// gave r are swapped. It returns the swaps, the sequences removed, the pages whose use became
// unknown and those whose use it now knows (D reserved them for r).
func (e *Engine) resyncPages(r *request, metadata string) (swaps []PageSwap, evicted []int64, unknown, explained []int32, err error) {
	arr, err := prepare.Decode(metadata)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	md, err := prepare.Split(arr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if len(md) != len(r.runs) {
		return nil, nil, nil, nil, fmt.Errorf("D's metadata has %d models, the shadow's %d", len(md), len(r.runs))
	}
	ps := int64(e.cfg.PageSize)
	limit := int64(e.caches[0].NumPages()) * ps
	theirs, ours := slotsOf(md[0]), slotsOf(r.runs[0])
	if len(theirs) != len(ours) {
		return nil, nil, nil, nil, fmt.Errorf("D reserved %d slots, the shadow %d", len(theirs), len(ours))
	}
	// The pages, in order, each with the in-page offset of its first slot: both sides must
	// lay the same tokens out on the same offsets, only on other pages.
	type pg struct {
		page int32
		off  int64
	}
	pagesOf := func(slots []int64) []pg {
		var out []pg
		for _, s := range slots {
			p := int32(s / ps)
			if len(out) == 0 || out[len(out)-1].page != p {
				out = append(out, pg{p, s % ps})
			}
		}
		return out
	}
	for _, s := range theirs {
		if s < 0 || s >= limit {
			return nil, nil, nil, nil, fmt.Errorf("D's slot %d is beyond the shadow's %d pages: D has more pages than the shadow's configuration", s, e.caches[0].NumPages())
		}
	}
	tp, op := pagesOf(theirs), pagesOf(ours)
	if len(tp) != len(op) {
		return nil, nil, nil, nil, fmt.Errorf("D's slots lie on %d pages, the shadow's on %d", len(tp), len(op))
	}
	for i := range tp {
		if tp[i].off != op[i].off {
			return nil, nil, nil, nil, fmt.Errorf("D's slots on page %d start at offset %d, the shadow's at %d", tp[i].page, tp[i].off, op[i].off)
		}
	}
	// A page of D's that a recycling sequence holds in the shadow: D evicted that sequence.
	mine := map[int32]bool{}
	for _, p := range op {
		mine[p.page] = true
	}
	for _, p := range tp {
		if mine[p.page] || !e.caches[0].PageOwned(p.page) {
			continue
		}
		for _, seq := range e.prefix.Recycling() {
			pgs, _ := e.caches[0].SequencePages(seq, nil)
			if slices.Contains(pgs, p.page) && !slices.Contains(evicted, seq) {
				evicted = append(evicted, seq)
			}
		}
	}
	for _, seq := range evicted {
		if err := e.prefix.RemoveSequence(seq); err != nil {
			panic(fmt.Sprintf("engine: resync: remove recycling seq %d: %v", seq, err))
		}
		e.removeSeq(seq)
	}
	// D took pages from deeper in its free list than the shadow's predicted ones: the pages
	// above them in the shadow's list (as it was before this request) are held on D for
	// what the shadow does not know. Their use is unknown; they go to the bottom.
	theirPages := make([]int32, len(tp))
	for i, p := range tp {
		theirPages[i] = p.page
	}
	unknown = e.unknownAbove(theirPages, e.newPages(r.runs[0]))
	// Swap page by page: op[i] is where the shadow put r's i-th page; swaps made earlier
	// may have moved it.
	where := func(p int32) int32 {
		for _, s := range swaps {
			switch p {
			case s.A:
				p = s.B
			case s.B:
				p = s.A
			}
		}
		return p
	}
	for i := range tp {
		cur := where(op[i].page)
		if cur != tp[i].page {
			swaps = append(swaps, PageSwap{A: cur, B: tp[i].page})
		}
	}
	e.applySwaps(swaps)
	e.caches[0].SinkFree(unknown)
	for _, c := range e.caches[1:] {
		c.SinkFree(unknown)
	}
	if f := e.follow; f != nil {
		for _, p := range tp {
			if f.unknown[p.page] {
				delete(f.unknown, p.page) // explained: D reserved it for this request
				explained = append(explained, p.page)
			}
		}
		for _, p := range unknown {
			f.unknown[p] = true
		}
	}
	return swaps, evicted, unknown, explained, nil
}

// unknownAbove returns the pages the shadow takes for free that D holds for what the shadow
// does not know: those above the deepest of D's pages in the shadow's free list (D would
// have handed them out first, had they been free), and the fresh pages the shadow took for
// the request and D did not. fresh are the shadow's; theirs D's, in order.
//
// D's pages that were of unknown use already say nothing of the others: they are what D
// held them for (sunk to the bottom of the shadow's free list, they would make every page
// above them unknown). When D took only such pages, the shadow's fresh ones were free on D
// too: two requests D admitted in the other order than the shadow, each given the other's
// pages, mark the first's predicted pages unknown and the second's explain them.
func (e *Engine) unknownAbove(theirs []int32, fresh []int32) []int32 {
	var known map[int32]bool
	if e.follow != nil {
		known = e.follow.unknown
	}
	free := e.caches[0].FreeList()
	pos := make(map[int32]int, len(free))
	for i, p := range free {
		pos[p] = i
	}
	deepest, counted := -1, 0
	for _, p := range theirs {
		if known[p] {
			continue
		}
		counted++
		if i, ok := pos[p]; ok && (deepest < 0 || i < deepest) {
			deepest = i
		}
	}
	if counted == 0 && len(theirs) > 0 {
		return nil
	}
	// The pages above are held on D for what the shadow does not know as the shadow warms
	// up, at its first such divergence: D's free list is then the shadow's with what D held
	// before the tap out. Later, the two lists' orders have drifted apart (pages freed in
	// another order, by requests whose calls raced), and the pages above D's say nothing: 6
	// clients at once through the tap once made nearly every free page unknown so.
	var out []int32
	if deepest >= 0 && e.follow != nil && e.follow.standing.ByKind[DivergedMetadata] == 0 {
		for _, p := range free[deepest+1:] {
			if !slices.Contains(theirs, p) {
				out = append(out, p)
			}
		}
	}
	for _, p := range fresh {
		if !slices.Contains(theirs, p) {
			out = append(out, p)
		}
	}
	return out
}

// slotsOf writes runs out slot by slot.
func slotsOf(runs []pages.Run) []int64 {
	var out []int64
	for _, r := range runs {
		for s := r.Start; s < r.End(); s++ {
			out = append(out, s)
		}
	}
	return out
}

// applySwaps exchanges page ids in every model's cache and in every record that names a
// page or a slot: the requests' reservations (their runs, metadata and KV progress), the
// KV map and the recent metadata answers.
func (e *Engine) applySwaps(swaps []PageSwap) {
	if len(swaps) == 0 {
		return
	}
	for _, s := range swaps {
		for _, c := range e.caches {
			if err := c.SwapPages(s.A, s.B); err != nil {
				panic(fmt.Sprintf("engine: resync: %v", err))
			}
		}
		e.pageKV[s.A], e.pageKV[s.B] = e.pageKV[s.B], e.pageKV[s.A]
	}
	perm := swapPerm(swaps)
	for _, r := range e.order {
		if len(r.runs) == 0 || !touches(r.runs, perm, e.cfg.PageSize) {
			continue
		}
		wasIssued := e.issued[r.encoded] == r
		if wasIssued {
			delete(e.issued, r.encoded)
		}
		r.runs, r.encoded = remapRuns(r.runs, perm, e.cfg.PageSize)
		got := r.kv.got
		kp := newKVProgress(r.runs[0], e.cfg.PageSize)
		for _, t := range got {
			kp.add(t.lo, t.hi)
		}
		r.kv = kp
		if wasIssued {
			e.issued[r.encoded] = r
		}
	}
	for i, m := range e.metadata {
		if touches(m.Runs, perm, e.cfg.PageSize) {
			m.Runs, m.Encoded = remapRuns(m.Runs, perm, e.cfg.PageSize)
			e.metadata[i] = m
		}
	}
}

// swapPerm returns the page permutation a list of swaps makes, applied in order.
func swapPerm(swaps []PageSwap) map[int32]int32 {
	perm := map[int32]int32{} // old page -> new page
	inv := map[int32]int32{}  // new page -> old page
	at := func(p int32) int32 {
		if o, ok := inv[p]; ok {
			return o
		}
		return p
	}
	for _, s := range swaps {
		oa, ob := at(s.A), at(s.B)
		perm[oa], perm[ob] = s.B, s.A
		inv[s.B], inv[s.A] = oa, ob
	}
	return perm
}

func touches(runs [][]pages.Run, perm map[int32]int32, pageSize int) bool {
	ps := int64(pageSize)
	for _, m := range runs {
		for _, r := range m {
			for p := r.Start / ps; p <= (r.End()-1)/ps; p++ {
				if _, ok := perm[int32(p)]; ok {
					return true
				}
			}
		}
	}
	return false
}

// remapRuns moves slots onto their pages' new ids and encodes the result.
func remapRuns(runs [][]pages.Run, perm map[int32]int32, pageSize int) ([][]pages.Run, string) {
	ps := int64(pageSize)
	out := make([][]pages.Run, len(runs))
	var flat []int64
	for i, m := range runs {
		slots := slotsOf(m)
		for j, s := range slots {
			if np, ok := perm[int32(s/ps)]; ok {
				slots[j] = int64(np)*ps + s%ps
			}
		}
		if len(slots) == 0 {
			flat = append(flat, 0)
			continue
		}
		out[i] = appendRuns(nil, slots)
		flat = pages.Compress(flat, slots)
	}
	return out, prepare.Encode(flat)
}

// unknownPages counts the pages of unknown use the shadow has free (one the shadow
// has handed out since was free on D after all, or is D's now for a request it knows).
func (e *Engine) unknownPages() int {
	f := e.follow
	if f == nil {
		return 0
	}
	return countUnknown(f.unknown, e.caches[0])
}

// pruneUnknown forgets, at the end of each of a shadow's steps (and a View's of it, at its
// step_completed), the pages of unknown use the shadow handed out in the step: taken from
// the bottom of its free list, where they were sunk, they were free on D after all (or are
// D's now for a request the shadow knows), as far as the shadow can tell. A page the
// shadow took shows its use until then, in the page map, and none after.
func pruneUnknown(unknown map[int32]bool, c *pages.Cache) {
	for p := range unknown {
		if c.PageOwned(p) {
			delete(unknown, p)
		}
	}
}

// countUnknown counts the pages of unknown use that c has free (all of them, but within a
// step).
func countUnknown(unknown map[int32]bool, c *pages.Cache) int {
	n := 0
	for p := range unknown {
		if !c.PageOwned(p) {
			n++
		}
	}
	return n
}

// unknownIDs returns the pages of unknown use, in order.
func unknownIDs(unknown map[int32]bool) []int32 {
	if len(unknown) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(unknown))
}

// FollowKVReceived records that P finished sending a request's KV (remote_send answered):
// every slot of its reservation not written yet is now written.
func (e *Engine) FollowKVReceived(now time.Time, id string) error {
	r := e.reqs[id]
	if r == nil {
		return fmt.Errorf("kv of %s: %w", id, ErrUnknownRequest)
	}
	if r.state != StatePrepared {
		return nil // nothing reserved, or already complete
	}
	var err error
	e.followStep(now, func(*StepCompleted) {
		lo := 0
		for _, t := range append(slices.Clone(r.kv.got), tokens{r.kv.reserved, r.kv.reserved}) {
			if t.lo > lo {
				if _, err = e.WriteKV(now, KVWrite{Metadata: r.encoded, Offset: lo, Tokens: t.lo - lo}); err != nil {
					return
				}
			}
			lo = t.hi
		}
	})
	return err
}

// FollowStarted records a start_generate that D accepted. A request the shadow never saw
// admitted was admitted before the tap: it is listed in the standing, and its tokens are
// counted there.
func (e *Engine) FollowStarted(now time.Time, id string, begin int) error {
	r := e.reqs[id]
	if r == nil || (r.state != StatePrepared && r.state != StateKVComplete) {
		if r == nil && e.follow != nil {
			e.noteBeforeTap(id)
			return nil
		}
		return fmt.Errorf("start_generate %s: %w", id, ErrNotPrepared)
	}
	var err error
	e.followStep(now, func(*StepCompleted) { err = e.StartGenerate(now, id, begin) })
	return err
}

func (e *Engine) noteBeforeTap(id string) {
	f := e.follow
	if _, ok := f.beforeTap[id]; ok {
		return
	}
	f.beforeTap[id] = 0
	f.standing.BeforeTap = appendBounded(f.standing.BeforeTap, id, maxBeforeTap)
}

// FollowTokens records tokens D streamed for a running request: each is one step of the
// request as D made it (the prefill of its tail, then a decode each), taking pages as D
// takes them. tokens are the token ids when the stream shows them (nil: the shadow's own
// stand-ins). A token for a request the shadow has finished is a divergence.
func (e *Engine) FollowTokens(now time.Time, id string, n int, tokens []int32) (Divergence, bool) {
	r := e.reqs[id]
	if r == nil {
		if e.follow != nil {
			if _, ok := e.follow.beforeTap[id]; ok {
				e.follow.beforeTap[id] += n
				return Divergence{}, false
			}
		}
		return Divergence{}, false
	}
	var out Divergence
	diverged := false
	// The tokens are D's steps of this request; they are applied in one step of the shadow
	// (a step's cost is the engine's; D's steps are not the shadow's to count).
	e.followStep(now, func(sc *StepCompleted) {
		for i := 0; i < n && !diverged; i++ {
			tok := int32(-1)
			if i < len(tokens) {
				tok = tokens[i]
			}
			out, diverged = e.followToken(sc, r, tok)
		}
	})
	return out, diverged
}

func (e *Engine) followToken(sc *StepCompleted, r *request, tok int32) (Divergence, bool) {
	if r.state != StateRunning {
		return e.diverge(Divergence{ID: r.id, What: DivergedFinish,
			Cause: fmt.Sprintf("D streamed a token for %s, which the shadow holds %s after %d tokens: max_tokens or the stop rule differ", r.id, r.state, r.streamed)}), true
	}
	if r.pending > 0 {
		// The tail's prefill, chunk by chunk as D's steps run it, then the first token.
		for r.pending > 0 {
			chunk := min(r.pending, e.cfg.PrefillChunkSize)
			need := e.pagesNeeded(r.seq, chunk)
			for need > e.caches[0].NumAvailablePages() && e.prefix.TryFreeMemory() {
			}
			if need > e.caches[0].NumAvailablePages() {
				return e.diverge(Divergence{ID: r.id, What: DivergedRoom,
					Cause: fmt.Sprintf("D prefilled %d tokens of %s's tail; the shadow has %d free pages for the %d it needs", chunk, r.id, e.caches[0].NumAvailablePages(), need)}), true
			}
			newPages := e.reserve(r.seq, chunk)
			if e.prefix.HasSequence(r.seq) {
				e.prefix.ExtendSequence(r.seq, r.prompt[r.tailPos:r.tailPos+chunk])
			}
			e.alt.extend(r, r.prompt[r.tailPos:r.tailPos+chunk])
			r.tailPos += chunk
			r.pending -= chunk
			sc.Prefilled = 1
			e.emit(PagesReserved{Stamp: e.mark(), Seq: r.seq, ID: r.id, N: chunk, NewPages: newPages})
			e.emit(Prefilled{Stamp: e.mark(), ID: r.id, Tokens: chunk, Remaining: r.pending})
		}
		sc.Action = ActionPrefill
		e.waiting.remove(r)
		e.sample(r)
	} else {
		for e.caches[0].NumAvailablePages() < e.numRunning() && e.prefix.TryFreeMemory() {
		}
		if e.pagesNeeded(r.seq, 1) > e.caches[0].NumAvailablePages() {
			return e.diverge(Divergence{ID: r.id, What: DivergedRoom,
				Cause: fmt.Sprintf("D decoded a token of %s; the shadow has no free page for it and nothing to evict", r.id)}), true
		}
		e.decodeOne(r)
		if sc.Action != ActionPrefill {
			sc.Action = ActionDecode
		}
		sc.Decoded = 1
		e.emit(Decoded{Stamp: e.mark(), IDs: []string{r.id}})
	}
	if tok >= 0 {
		r.lastToken = tok
	}
	if r.generated >= r.maxTokens {
		e.finish(r)
	}
	return Divergence{}, false
}

// FollowEnded records how D's stream of a request ended: "length" (finished; the shadow
// finished it at its max_tokens, or ends it now, a divergence), "preempt" (D preempted it:
// its KV is freed), or anything else (aborted: the client went away, or the stream broke).
func (e *Engine) FollowEnded(now time.Time, id, reason string) (Divergence, bool) {
	if e.follow != nil {
		if _, ok := e.follow.beforeTap[id]; ok {
			delete(e.follow.beforeTap, id)
			e.follow.standing.BeforeTap = slices.DeleteFunc(e.follow.standing.BeforeTap, func(s string) bool { return s == id })
			return Divergence{}, false
		}
	}
	r := e.reqs[id]
	if r == nil || r.state.Ended() {
		return Divergence{}, false
	}
	var out Divergence
	diverged := false
	e.followStep(now, func(sc *StepCompleted) {
		switch reason {
		case "length":
			if r.state == StateRunning {
				out, diverged = e.diverge(Divergence{ID: id, What: DivergedFinish,
					Cause: fmt.Sprintf("D finished %s after %d tokens; the shadow expected %d (max_tokens)", id, r.streamed, r.maxTokens-(r.generated-r.streamed))}), true
				r.pending = 0
				e.waiting.remove(r)
				e.finish(r)
				return
			}
			e.forceEnd(r, AbortByClient)
		case AbortPreempt:
			if r.state == StateRunning {
				e.waiting.remove(r)
				e.preempt(r)
				sc.Preempted = 1
				return
			}
			e.forceEnd(r, AbortByClient)
		default:
			e.forceEnd(r, AbortByClient)
		}
	})
	return out, diverged
}

// FollowAborted records a request D aborted because its client went away (or was told to
// abort it), in whatever state it was: a waiting one leaves the queue, a prepared one leaks
// its KV as in MLC, a running one is recycled.
func (e *Engine) FollowAborted(now time.Time, id string) {
	if e.follow != nil {
		if _, ok := e.follow.beforeTap[id]; ok {
			e.FollowEnded(now, id, AbortByClient)
			return
		}
	}
	r := e.reqs[id]
	if r == nil || r.state.Ended() {
		return
	}
	e.followStep(now, func(*StepCompleted) { e.forceEnd(r, AbortByClient) })
	e.followStep(now, func(*StepCompleted) { e.evaluateHead() })
}

// forceEnd aborts a request whatever its state, within a step.
func (e *Engine) forceEnd(r *request, reason string) {
	if r.state.Ended() {
		return
	}
	if reason != AbortByClient {
		// Not D's doing: the shadow lets go of the request and its pages.
		switch r.state {
		case StatePrepared, StateKVComplete:
			e.leavePrepared(r)
		}
		e.waiting.remove(r)
		e.running.remove(r)
		held := r.seq >= 0 && e.caches[0].HasSequence(r.seq) && e.seqOwner[r.seq] == r
		e.end(r, StateAborted, reason)
		e.emit(RequestAborted{Stamp: e.mark(), ID: r.id, Reason: reason})
		if held {
			e.release(r, false)
		}
		return
	}
	if err := e.Abort(time.UnixMilli(e.now), r.id); err != nil {
		panic(fmt.Sprintf("engine: follow abort %s: %v", r.id, err))
	}
}

// FollowReset marks a shadow that starts over (observations were lost, or D restarted):
// the caller replaces the engine with a fresh one; the event tells viewers of this one.
func (e *Engine) FollowReset(now time.Time, cause string) Divergence {
	var out Divergence
	e.followStep(now, func(*StepCompleted) {
		out = e.diverge(Divergence{What: DivergedLost, Cause: cause, Reset: true})
	})
	return out
}

// ShadowDiff lists where a shadow's snapshot differs from its decode instance's: the
// request table (what each request is, holds and has received, not when), the queues,
// the paged KV cache, the prefix tree, the recycling sequences and their owners. Steps and
// times differ by nature and are left out. No difference: nil.
func ShadowDiff(d, shadow Snapshot) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	type key struct {
		ID                           string
		State                        RequestState
		PromptLength, End, MaxTokens int
		Seq                          int64
		Matched                      int
		Match                        prefix.Kind
		Parent                       int64
		Runs                         string
		Encoded                      string
		Reserved, Received, Pending  int
		Generated                    int
		Leaked                       bool
		FinishReason                 string
	}
	keyOf := func(r RequestView) key {
		return key{r.ID, r.State, r.PromptLength, r.End, r.MaxTokens, r.Seq, r.Matched, r.Match, r.Parent,
			fmt.Sprint(r.Runs), r.Encoded, r.Reserved, r.Received, r.Pending, r.Generated, r.Leaked, r.FinishReason}
	}
	if len(d.Requests) != len(shadow.Requests) {
		add("requests: D has %d, the shadow %d", len(d.Requests), len(shadow.Requests))
	}
	for i := range min(len(d.Requests), len(shadow.Requests)) {
		if a, b := keyOf(d.Requests[i]), keyOf(shadow.Requests[i]); a != b {
			add("request %d: D %+v, the shadow %+v", i, a, b)
		}
	}
	if !slices.Equal(d.Waiting, shadow.Waiting) {
		add("waiting: D %v, the shadow %v", d.Waiting, shadow.Waiting)
	}
	if !slices.Equal(d.Running, shadow.Running) {
		add("running: D %v, the shadow %v", d.Running, shadow.Running)
	}
	if a, b := fmt.Sprintf("%+v", d.Pages), fmt.Sprintf("%+v", shadow.Pages); a != b {
		add("pages: D %s, the shadow %s", a, b)
	}
	if a, b := fmt.Sprintf("%+v", d.Prefix), fmt.Sprintf("%+v", shadow.Prefix); a != b {
		add("prefix tree: D %s, the shadow %s", a, b)
	}
	if !slices.Equal(d.Recycling, shadow.Recycling) {
		add("recycling: D %v, the shadow %v", d.Recycling, shadow.Recycling)
	}
	if !slices.Equal(d.Owners, shadow.Owners) {
		add("owners: D %v, the shadow %v", d.Owners, shadow.Owners)
	}
	return out
}

// PageMapDiff lists the pages whose use differs between a decode instance's snapshot and
// its shadow's: free in one and not the other, or held for different requests. Which block
// or sequence id holds a page, and the free list's order, are left out: after a resync the
// shadow holds the same pages for the same requests, under ids of its own.
func PageMapDiff(d, shadow Snapshot) []string {
	use := func(s Snapshot) map[int32]string {
		out := map[int32]string{}
		for p, o := range pageHolders(s) {
			out[p] = strings.Join(o, "+")
		}
		return out
	}
	a, b := use(d), use(shadow)
	var out []string
	n := max(d.Pages.NumPages, shadow.Pages.NumPages)
	for p := range int32(n) {
		ua, oka := a[p]
		ub, okb := b[p]
		switch {
		case oka != okb:
			out = append(out, fmt.Sprintf("page %d: D %s, the shadow %s", p, pageUse(ua, oka), pageUse(ub, okb)))
		case oka && ua != ub:
			out = append(out, fmt.Sprintf("page %d: D holds it for %s, the shadow for %s", p, ua, ub))
		}
	}
	return out
}

// RequestPages returns, for each request of a snapshot whose sequence holds pages, the
// pages it holds (shared ones included), in ascending order.
func RequestPages(s Snapshot) map[string][]int32 {
	out := map[string][]int32{}
	for p, holders := range pageHolders(s) {
		for _, id := range holders {
			out[id] = append(out[id], p)
		}
	}
	for _, pgs := range out {
		slices.Sort(pgs)
	}
	return out
}

// pageHolders returns, by page, the requests whose sequences hold it, sorted.
func pageHolders(s Snapshot) map[int32][]string {
	owners := map[int64]string{}
	for _, o := range s.Owners {
		owners[o.Seq] = o.ID
	}
	blockOf := map[int32]pages.BlockState{}
	for _, b := range s.Pages.Blocks {
		blockOf[b.ID] = b
	}
	sets := map[int32][]string{}
	for _, sq := range s.Pages.Seqs {
		for b := sq.Last; b >= 0; {
			blk, ok := blockOf[b]
			if !ok {
				break
			}
			for _, p := range blk.Pages {
				if o := owners[sq.ID]; !slices.Contains(sets[p], o) {
					sets[p] = append(sets[p], o)
				}
			}
			b = blk.Parent
		}
	}
	for _, o := range sets {
		slices.Sort(o)
	}
	return sets
}

func pageUse(owner string, used bool) string {
	if !used {
		return "free"
	}
	return "held for " + owner
}

// Head returns the request at the head of the line of prepare-receive requests and its
// last admission evaluation (ok false when none waits; ev.Reason is ReasonNone when it was
// not found blocked).
func (e *Engine) Head() (id string, ev prepare.Evaluation, ok bool) {
	r := e.headPrep()
	if r == nil {
		return "", prepare.Evaluation{}, false
	}
	if r.eval != nil {
		ev = *r.eval
	}
	return r.id, ev, true
}

// FollowRefused records that D refused a prep_recv the shadow saw arrive (a 4xx answer):
// D never queued it, so the shadow forgets it.
func (e *Engine) FollowRefused(now time.Time, id string) {
	r := e.reqs[id]
	if r == nil || r.state != StateWaiting {
		return
	}
	e.followStep(now, func(*StepCompleted) {
		e.forceEnd(r, "refused")
		e.retire(r)
		e.evaluateHead()
	})
}
