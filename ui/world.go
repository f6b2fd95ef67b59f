package ui

import (
	"slices"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
)

// world is what the panels draw: one engine.View (the live one, or a frozen copy while the
// dashboard is paused), its event log, and what is derived from them. Derived data is
// computed when a panel asks for it and the data has changed since, never in View: with
// 65,536 pages and 10,000 requests it costs milliseconds, so it follows the frame rate,
// not the event rate.
type world struct {
	view *engine.View
	// ver changes whenever anything drawn from the world changes; prefixVer only when the
	// prefix tree or the last match does.
	ver       uint64
	prefixVer uint64
	// pageVer changes only with the events that change what pageData holds, so a
	// steady trickle of step summaries (an idle engine steps four times a second) does not
	// walk 65,536 pages again.
	pageVer uint64
	events  *eventLog
	// lastMatch is the most recent PrefixMatched seen (the View keeps only its effects).
	lastMatch    engine.PrefixMatched
	hasLastMatch bool

	pg    pageData
	pgVer uint64
	sum   summary
	sumV  uint64
}

// touch records that the world changed.
func (w *world) touch() { w.ver++ }

// pageState is what a page of the KV cache is doing, as the page map shows it.
type pageState uint8

// The page states, from idle to alarming. The order matters twice: a group of pages drawn
// as one cell shows its most alarming state from pgAwaiting on, and the legend follows it.
const (
	pgFree      pageState = iota // on the free list
	pgActive                     // used by one live sequence only
	pgShared                     // in a block that several sequences share (a prefix)
	pgRecycling                  // used only by recycling sequences (cached, evictable)
	pgAwaiting                   // reserved for a prepared request; none of its run received
	pgPartial                    // reserved; its run partly received
	pgLeaked                     // held by an aborted request's leaked sequence
	numPageStates
)

var pageStateNames = [numPageStates]string{"free", "active", "shared prefix", "recycling", "awaiting KV", "partly received", "leaked"}

func (s pageState) String() string { return pageStateNames[s] }

// pageData is the page map's state of every page, derived from the View's cache replica
// in one pass over the sequences' block chains and one over the pages (the cache's own
// Blocks would allocate a map and a page list per block: 9 ms at 65,536 pages).
type pageData struct {
	state []pageState
	count [numPageStates]int
	// ids are the cache's sequences; the chain of ids[i] (block ids, root first) is
	// chains[chainAt[i]:chainAt[i+1]], and it uses seqPages[i] pages. reqSeq[j] is the
	// index in ids of the sequence the j-th request (in the View's order) holds, or -1.
	ids      []int64
	reqSeq   []int32
	chainAt  []int32
	chains   []int32
	seqPages []int32
	// By block id: how many sequences use the block, how many of them are not recycling,
	// whether the last one seen is leaked, and the block's pages.
	users, nonRec, blockPages []int32
	lastLeaked                []bool
	// fellBack says the View's requests did not account for every sequence.
	fellBack bool
}

// pages returns the page data, rebuilding it when the world has changed.
func (w *world) pages() *pageData {
	if w.view == nil {
		return &w.pg
	}
	if w.pgVer == w.pageVer && w.pg.state != nil {
		return &w.pg
	}
	w.pgVer = w.pageVer
	buildPages(&w.pg, w.view)
	return &w.pg
}

// touchesPages says whether an event can change pageData. Those that cannot leave the
// request order alone too, or (an arrival) only append to it.
func touchesPages(ev engine.Event) bool {
	switch ev.(type) {
	case engine.StepCompleted, engine.PrepareBlocked, engine.RequestArrived, engine.HazardDetected,
		engine.PrefixChanged, engine.Prefilled:
		return false
	}
	return true
}

// grow returns s with room for index i, zeroing what it adds.
func grow[T any](s []T, i int) []T {
	if i < len(s) {
		return s
	}
	return append(s, make([]T, i+1-len(s))...)
}

func buildPages(pd *pageData, v *engine.View) {
	c := v.Cache()
	n := c.NumPages()
	if cap(pd.state) < n {
		pd.state = make([]pageState, n)
	}
	pd.state = pd.state[:n]
	pd.count = [numPageStates]int{}
	rec := make(map[int64]bool, len(v.Recycling()))
	for _, s := range v.Recycling() {
		rec[s] = true
	}
	leaked := make(map[int64]bool)
	for _, r := range v.Requests() {
		if r.Leaked && r.Seq >= 0 {
			leaked[r.Seq] = true
		}
	}
	clear(pd.users)
	clear(pd.nonRec)
	clear(pd.blockPages)
	pd.chainAt = pd.chainAt[:0]
	pd.chains = pd.chains[:0]
	seqsOf(v, pd)
	for i, id := range pd.ids {
		isRec, isLeaked := rec[id], leaked[id]
		for _, b := range pd.chains[pd.chainAt[i]:pd.chainAt[i+1]] {
			pd.users = grow(pd.users, int(b))
			pd.nonRec = grow(pd.nonRec, int(b))
			pd.lastLeaked = grow(pd.lastLeaked, int(b))
			pd.users[b]++
			if !isRec {
				pd.nonRec[b]++
			}
			pd.lastLeaked[b] = isLeaked
		}
	}
	for pg := range n {
		b := c.PageBlock(int32(pg))
		if b < 0 || int(b) >= len(pd.users) || pd.users[b] == 0 {
			pd.state[pg] = pgFree
			continue
		}
		pd.blockPages = grow(pd.blockPages, int(b))
		pd.blockPages[b]++
		switch {
		case pd.nonRec[b] == 0:
			pd.state[pg] = pgRecycling
		case pd.users[b] > 1:
			pd.state[pg] = pgShared
		case pd.lastLeaked[b]:
			pd.state[pg] = pgLeaked
		default:
			pd.state[pg] = pgActive
		}
	}
	pd.seqPages = pd.seqPages[:0]
	for i := range pd.ids {
		sum := int32(0)
		for _, b := range pd.chains[pd.chainAt[i]:pd.chainAt[i+1]] {
			if int(b) < len(pd.blockPages) {
				sum += pd.blockPages[b]
			}
		}
		pd.seqPages = append(pd.seqPages, sum)
	}
	// A prepared request's reserved runs: awaiting or partly received by the count of its
	// run's slots received (the View knows how many per run, not which).
	ps := int64(c.PageSize())
	for _, r := range v.Requests() {
		if r.State != engine.StatePrepared || len(r.Runs) == 0 {
			continue
		}
		for i, run := range r.Runs[0] {
			got := 0
			if i < len(r.RunReceived) {
				got = r.RunReceived[i]
			}
			st := pgAwaiting
			switch {
			case int64(got) >= run.Len:
				continue
			case got > 0:
				st = pgPartial
			}
			for pg := run.Start / ps; pg <= (run.End()-1)/ps && pg < int64(n); pg++ {
				cur := pd.state[pg]
				if cur == pgFree || cur == pgLeaked {
					continue
				}
				if cur < pgAwaiting || st > cur {
					pd.state[pg] = st
				}
			}
		}
	}
	for _, s := range pd.state {
		pd.count[s]++
	}
}

// seqsOf lists the cache's sequences and their block chains into pd, from the View's
// requests and recycling list, which hold them all (the engine keeps a leaked request while
// its sequence lives), noting which request holds which. A live request always holds its
// own sequence (only a recycling one is ever taken over); an ended one may have lost it to
// a reuse, so the owner is checked. Should the list ever miss one, it falls back to the
// cache's own list, which costs a map walk and a sort.
func seqsOf(v *engine.View, pd *pageData) {
	c := v.Cache()
	pd.ids, pd.reqSeq = pd.ids[:0], pd.reqSeq[:0]
	add := func(seq int64) bool {
		at := len(pd.chains)
		var err error
		if pd.chains, err = c.SequenceBlocks(seq, pd.chains); err != nil {
			pd.chains = pd.chains[:at]
			return false
		}
		pd.chainAt = append(pd.chainAt, int32(at))
		pd.ids = append(pd.ids, seq)
		return true
	}
	for _, r := range v.Requests() {
		held := r.Seq >= 0
		if held && r.State.Ended() {
			id, ok := v.Owner(r.Seq)
			held = ok && id == r.ID
		}
		if held && add(r.Seq) {
			pd.reqSeq = append(pd.reqSeq, int32(len(pd.ids)-1))
			continue
		}
		pd.reqSeq = append(pd.reqSeq, -1)
	}
	for _, s := range v.Recycling() {
		if r, ok := ownerOf(v, s); ok && r.Seq == s {
			continue // listed with its request
		}
		add(s)
	}
	pd.fellBack = len(pd.ids) != c.NumSequences()
	if pd.fellBack {
		pd.ids, pd.chainAt, pd.chains = pd.ids[:0], pd.chainAt[:0], pd.chains[:0]
		for _, s := range c.SequenceIDs() {
			add(s)
		}
		for j, r := range v.Requests() {
			pd.reqSeq[j] = -1
			if i, ok := slices.BinarySearch(pd.ids, r.Seq); ok {
				if id, ok := v.Owner(r.Seq); ok && id == r.ID {
					pd.reqSeq[j] = int32(i)
				}
			}
		}
	}
	pd.chainAt = append(pd.chainAt, int32(len(pd.chains)))
}

// requestPages returns how many pages the j-th request (in the View's order) holds.
func (pd *pageData) requestPages(j int) (int, bool) {
	if j >= len(pd.reqSeq) || pd.reqSeq[j] < 0 {
		return 0, false
	}
	return int(pd.seqPages[pd.reqSeq[j]]), true
}

// usersOf returns the sequences whose chain holds a block, ascending.
func (pd *pageData) usersOf(b int32) []int64 {
	var out []int64
	for i, id := range pd.ids {
		if slices.Contains(pd.chains[pd.chainAt[i]:pd.chainAt[i+1]], b) {
			out = append(out, id)
		}
	}
	return out
}

// summary counts the requests by state as the header shows them, in the engine's terms
// (engine.Counts), computed from the View so that it agrees with the table.
type summary struct {
	waiting, blocked, prepared, awaitingKV, running, prefilling int
	finished, aborted, leaked                                   int
	stuck, hazardous                                            int
}

func (w *world) summary() summary {
	if w.view == nil || w.sumV == w.ver {
		return w.sum
	}
	w.sumV = w.ver
	v := w.view
	var s summary
	now := v.Stamp().At
	limit := v.Config().PreparedAgeLimit.Milliseconds()
	headBlocked := false
	if h := v.Head(); h != nil && h.Eval != nil {
		headBlocked = true
	}
	for _, r := range v.Requests() {
		switch r.State {
		case engine.StateWaiting:
			s.waiting++
		case engine.StatePrepared:
			s.prepared++
			s.awaitingKV++
		case engine.StateKVComplete:
			s.prepared++
		case engine.StateFinished:
			s.finished++
		case engine.StateAborted, engine.StatePreempted:
			s.aborted++
		}
		if r.Leaked {
			s.leaked++
		}
		if isStuck(v, r, now, limit) {
			s.stuck++
		}
		if len(r.Hazards) > 0 {
			s.hazardous++
		}
	}
	if headBlocked {
		s.blocked = s.waiting
	}
	for _, id := range v.Running() {
		if r, ok := v.Request(id); ok {
			if r.Pending > 0 {
				s.prefilling++
			} else {
				s.running++
			}
		}
	}
	w.sum = s
	return s
}

// isStuck says whether a request needs a person's attention: blocked from admission,
// prepared for longer than the engine's age limit (its KV or its start_generate never
// came), or leaked.
func isStuck(v *engine.View, r *engine.RequestView, now, limitMs int64) bool {
	switch {
	case r.Leaked:
		return true
	case r.State == engine.StateWaiting:
		_, blocked := v.Blocked(r)
		return blocked
	case r.State == engine.StatePrepared || r.State == engine.StateKVComplete:
		return limitMs > 0 && now-r.Admitted.At >= limitMs
	}
	return false
}

// ownerOf returns the request that holds a sequence, when it still does.
func ownerOf(v *engine.View, seq int64) (*engine.RequestView, bool) {
	id, ok := v.Owner(seq)
	if !ok {
		return nil, false
	}
	return v.Request(id)
}

// seqState says whether the prefix cache holds a sequence as active or recycling.
func seqState(v *engine.View, seq int64) (prefix.State, bool) {
	for _, s := range v.Recycling() {
		if s == seq {
			return prefix.Recycling, true
		}
	}
	if v.Cache().HasSequence(seq) {
		return prefix.Active, true
	}
	return 0, false
}
