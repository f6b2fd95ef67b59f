package ui

import (
	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
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
	events    *eventLog
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

// pageData is the page map's state of every page, derived from the View's cache replica.
type pageData struct {
	state []pageState
	count [numPageStates]int
	// blocks are the live blocks; blockAt maps a block id to its index there (-1: none).
	blocks  []pages.BlockInfo
	blockAt []int32
	// seqPages counts the pages each sequence uses (shared ones included).
	seqPages map[int64]int
}

// pages returns the page data, rebuilding it when the world has changed.
func (w *world) pages() *pageData {
	if w.view == nil {
		return &w.pg
	}
	if w.pgVer == w.ver && w.pg.state != nil {
		return &w.pg
	}
	w.pgVer = w.ver
	buildPages(&w.pg, w.view)
	return &w.pg
}

func buildPages(pd *pageData, v *engine.View) {
	c := v.Cache()
	n := c.NumPages()
	if cap(pd.state) < n {
		pd.state = make([]pageState, n)
	}
	pd.state = pd.state[:n]
	clear(pd.state)
	pd.count = [numPageStates]int{}
	pd.blocks = c.Blocks()
	if pd.seqPages == nil {
		pd.seqPages = make(map[int64]int)
	}
	clear(pd.seqPages)
	maxID := int32(-1)
	for _, b := range pd.blocks {
		maxID = max(maxID, b.ID)
	}
	if cap(pd.blockAt) < int(maxID+1) {
		pd.blockAt = make([]int32, maxID+1)
	}
	pd.blockAt = pd.blockAt[:maxID+1]
	for i := range pd.blockAt {
		pd.blockAt[i] = -1
	}
	rec := make(map[int64]bool, len(v.Recycling()))
	for _, s := range v.Recycling() {
		rec[s] = true
	}
	for i, b := range pd.blocks {
		pd.blockAt[b.ID] = int32(i)
		st := pgActive
		allRec := len(b.Seqs) > 0
		for _, s := range b.Seqs {
			pd.seqPages[s] += len(b.Pages)
			if !rec[s] {
				allRec = false
			}
		}
		switch {
		case allRec:
			st = pgRecycling
		case len(b.Seqs) > 1:
			st = pgShared
		case len(b.Seqs) == 1:
			if id, ok := v.Owner(b.Seqs[0]); ok {
				if r, ok := v.Request(id); ok && r.Leaked && r.Seq == b.Seqs[0] {
					st = pgLeaked
				}
			}
		}
		for _, pg := range b.Pages {
			pd.state[pg] = st
		}
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

// block returns the live block owning a page.
func (pd *pageData) block(page int32, c *pages.Cache) (pages.BlockInfo, bool) {
	b := c.PageBlock(page)
	if b < 0 || int(b) >= len(pd.blockAt) || pd.blockAt[b] < 0 {
		return pages.BlockInfo{}, false
	}
	return pd.blocks[pd.blockAt[b]], true
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
