package engine

import (
	"fmt"
	"slices"

	"github.com/kvtop/kvtop/internal/invariants"
)

// This file keeps a View's page map current as events apply, touching only the pages an
// event touches: the pages of the sequences it adds, grows, pops or removes, those of the
// sequences whose role it changes, and those of the reserved runs whose state it changes.
//
// A page's state depends on which sequences use it, in which role, and on the prepared
// requests' runs that lie on it (pageState, reserved). Built from scratch, the map counts
// users by block; kept, it counts them by page: a fork that splits a block moves pages
// between blocks but changes no page's users, so each cache operation changes the users of
// exactly the pages of the sequence it operates on. The View calls, around the operations
// it applies:
//
//   - seqAdded after a sequence appears (or is popped), seqLeaving before it goes (or is
//     popped), seqGrew after it is extended by the slots it was given;
//   - roleMayChange after anything a sequence's role depends on may have changed: who holds
//     it, that request's state, the recycling list;
//   - runsMayChange after a request's state, runs or received counts may have changed,
//     runsGone when it leaves the table.
//
// Each page whose counts change is settled again (settle): its state computed from them, and
// journaled when it changes. A differential test holds the kept map to one built from
// scratch at every step of every scenario; with -tags invariants, PageMap checks it too.

// keepLimit is how many events may apply to a View before its page map is read again for
// keeping it to pay, on a cache of n pages: keeping it costs 150–250 ns an event, building
// it from scratch and starting to keep it about 20–25 ns a page (BenchmarkKeptPageMap,
// BenchmarkPageMap), so the two cost alike at about n/8 events a read. A View read less
// often than that (a rewind's, a /metrics scrape's, one folding a flood of events between
// frames) stops keeping it and builds it again when it is next read, which costs at most
// about twice what the better of the two would.
var keepLimit = func(n int) int { return max(1024, n/8) }

// pageRun is a reserved run a prepared request shows on the page map: pages lo to hi, in
// state st.
type pageRun struct {
	lo, hi int32
	st     PageState
}

// keepPages starts keeping the page map, just built, current: it counts each page's users
// and reservations, and notes each sequence's role and the recycling list.
func (v *View) keepPages() {
	pm := &v.pm
	n := len(pm.States)
	pm.journal = slices.Grow(pm.journal[:0], max(4096, n/8))[:max(4096, n/8)]
	pm.pgUsers = slices.Grow(pm.pgUsers[:0], n)[:n]
	pm.pgRuns = slices.Grow(pm.pgRuns[:0], n)[:n]
	clear(pm.pgRuns)
	for pg := range n {
		b := v.cache.PageBlock(int32(pg))
		if b >= 0 && int(b) < len(pm.blockUsers) {
			pm.pgUsers[pg] = pm.blockUsers[b]
		} else {
			pm.pgUsers[pg] = users{}
		}
	}
	clear(pm.seqRoles)
	for i, s := range pm.seqs {
		pm.seqRoles = grow(pm.seqRoles, int(s))
		pm.seqRoles[s] = pm.roles[i]
	}
	clear(pm.recN)
	for _, s := range v.recycling {
		if s >= 0 {
			pm.recN = grow(pm.recN, int(s))
			pm.recN[s]++
		}
	}
	for _, r := range v.reqs {
		// The states built show the runs already: they are only counted.
		r.runs = v.runsOf(r, r.runs[:0])
		for _, run := range r.runs {
			k := 0
			if run.st == PagePartial {
				k = 1
			}
			for pg := run.lo; pg <= run.hi; pg++ {
				pm.pgRuns[pg][k]++
			}
		}
	}
	pm.kept = true
}

// settle derives page pg's state again from its counts.
func (pm *PageMap) settle(pg int32) {
	st := pageState(&pm.pgUsers[pg])
	if st == PageFree && pm.unknown[pg] {
		st = PageUnknown
	}
	switch r := &pm.pgRuns[pg]; {
	case r[1] > 0:
		st = reserved(st, PagePartial)
	case r[0] > 0:
		st = reserved(st, PageAwaiting)
	}
	if old := pm.States[pg]; st != old {
		pm.States[pg] = st
		pm.Count[old]--
		pm.Count[st]++
		pm.journal[pm.changes%uint64(len(pm.journal))] = pg
		pm.changes++
	}
}

// seqPagesOf returns a sequence's pages, in the View's buffer.
func (v *View) seqPagesOf(seq int64) ([]int32, bool) {
	pgs, err := v.cache.SequencePages(seq, v.pgBuf[:0])
	v.pgBuf = pgs
	return pgs, err == nil
}

// seqAdded counts the pages of a sequence that has just appeared in the cache (or been
// popped), in the role it has.
func (v *View) seqAdded(seq int64) {
	pm := &v.pm
	if !pm.kept || seq < 0 {
		return
	}
	pgs, ok := v.seqPagesOf(seq)
	if !ok {
		return
	}
	role := v.roleOf(seq)
	for _, pg := range pgs {
		pm.pgUsers[pg][role]++
		pm.settle(pg)
	}
	for int64(len(pm.seqPages)) <= seq {
		pm.seqPages = append(pm.seqPages, -1) // not in the cache
	}
	pm.seqRoles = grow(pm.seqRoles, int(seq))
	pm.seqPages[seq], pm.seqRoles[seq] = int32(len(pgs)), role
	v.ownerChanges(seq)
}

// seqLeaving stops counting the pages of a sequence about to leave the cache (or be
// popped).
func (v *View) seqLeaving(seq int64) {
	pm := &v.pm
	if _, counted := pm.SeqPages(seq); !pm.kept || !counted {
		return
	}
	pgs, _ := v.seqPagesOf(seq)
	role := pm.seqRoles[seq]
	for _, pg := range pgs {
		pm.pgUsers[pg][role]--
		pm.settle(pg)
	}
	pm.seqPages[seq] = -1
	v.ownerChanges(seq)
}

// seqGrew counts the pages a sequence took as it was extended by slots: those whose first
// slot it was given (a block starts on a page boundary, so a page is new to the sequence
// exactly when its first slot is).
func (v *View) seqGrew(seq int64, slots []int64) {
	pm := &v.pm
	if !pm.kept {
		return
	}
	ps := int64(v.cache.PageSize())
	if len(slots) == 1 && slots[0]%ps != 0 {
		return // a token decoded into a page it had: most of them
	}
	if _, counted := pm.SeqPages(seq); !counted {
		return
	}
	role := pm.seqRoles[seq]
	grew := false
	for _, sl := range slots {
		if sl%ps == 0 {
			pg := int32(sl / ps)
			pm.pgUsers[pg][role]++
			pm.settle(pg)
			pm.seqPages[seq]++
			grew = true
		}
	}
	if grew {
		v.ownerChanges(seq)
	}
}

// roleOf is the role a sequence's pages are counted in: recycling when the recycling list
// names it, else that of the request holding it (the page map built from scratch gives the
// same: listSeqs).
func (v *View) roleOf(seq int64) seqRole {
	if seq < int64(len(v.pm.recN)) && v.pm.recN[seq] > 0 {
		return roleRecycling
	}
	if r := v.holder(seq); r != nil {
		return holderRole(r.State, r.Leaked)
	}
	return roleLive
}

// roleMayChange counts a sequence's pages again in its role, if that changed.
func (v *View) roleMayChange(seq int64) {
	pm := &v.pm
	if _, counted := pm.SeqPages(seq); !pm.kept || !counted {
		return
	}
	role, was := v.roleOf(seq), pm.seqRoles[seq]
	if role == was {
		return
	}
	pgs, _ := v.seqPagesOf(seq)
	for _, pg := range pgs {
		u := &pm.pgUsers[pg]
		u[was]--
		u[role]++
		pm.settle(pg)
	}
	pm.seqRoles[seq] = role
}

// recycles notes that the recycling list names a sequence once more (d = 1) or once less
// (-1).
func (v *View) recycles(seq int64, d int32) {
	if pm := &v.pm; pm.kept && seq >= 0 {
		pm.recN = grow(pm.recN, int(seq))
		pm.recN[seq] += d
	}
}

// recyclingIs replaces the recycling list (a PrefixChanged event), counting again the pages
// of the sequences it now names or no longer does.
func (v *View) recyclingIs(list []int64) {
	if !v.pm.kept || slices.Equal(v.recycling, list) {
		v.recycling = append(v.recycling[:0], list...)
		return
	}
	old, pm := v.recycling, &v.pm
	if invariants.Enabled {
		if c := slices.Clone(list); len(slices.Compact(slices.Sorted(slices.Values(c)))) != len(list) {
			panic(fmt.Sprintf("engine: a recycling list names a sequence twice: %v", list))
		}
	}
	// The old list is read below: the new one goes to the other array.
	v.recycling, v.recyclingWas = append(v.recyclingWas[:0], list...), old
	// A recycling list names a sequence once: as many sequences, all of them named
	// already, are the same ones in another order (the usual prefix change).
	same := len(list) == len(old)
	for i := 0; i < len(list) && same; i++ {
		s := list[i]
		same = s >= 0 && s < int64(len(pm.recN)) && pm.recN[s] > 0
	}
	if same {
		return
	}
	for _, s := range old {
		v.recycles(s, -1)
	}
	for _, s := range list {
		v.recycles(s, 1)
	}
	for _, s := range old {
		v.roleMayChange(s)
	}
	for _, s := range list {
		v.roleMayChange(s)
	}
	// The page map's readers say which sequences recycle, whether or not a page's state
	// changed.
	v.pagesVersion++
}

// runsOf appends to dst the reserved runs a request shows on the page map: those of a
// prepared request's model-0 reservation not wholly received (build does the same).
func (v *View) runsOf(r *viewRequest, dst []pageRun) []pageRun {
	if r.State != StatePrepared || len(r.Runs) == 0 {
		return dst
	}
	ps, n := int64(v.cache.PageSize()), int64(v.cache.NumPages())
	for i, run := range r.Runs[0] {
		got := 0
		if i < len(r.RunReceived) {
			got = r.RunReceived[i]
		}
		st, shows := runState(got, run.Len)
		if !shows {
			continue
		}
		if lo, hi := runPages(run, ps, n); lo <= hi {
			dst = append(dst, pageRun{int32(lo), int32(hi), st})
		}
	}
	return dst
}

// runsMayChange shows a request's reserved runs on the page map as they are now.
func (v *View) runsMayChange(r *viewRequest) {
	pm := &v.pm
	if !pm.kept {
		return
	}
	want := v.runsOf(r, v.runBuf[:0])
	v.runBuf = want
	if slices.Equal(want, r.runs) {
		return
	}
	if len(want) == len(r.runs) {
		// Typically one run went from awaiting to partly received, or to none.
		for i := range want {
			if want[i] != r.runs[i] {
				pm.reserve(r.runs[i], -1)
				pm.reserve(want[i], 1)
			}
		}
	} else {
		for _, run := range r.runs {
			pm.reserve(run, -1)
		}
		for _, run := range want {
			pm.reserve(run, 1)
		}
	}
	r.runs = append(r.runs[:0], want...)
}

// runsGone takes the runs of a request that left the table off the page map.
func (v *View) runsGone(r *viewRequest) {
	if v.pm.kept {
		for _, run := range r.runs {
			v.pm.reserve(run, -1)
		}
	}
	r.runs = r.runs[:0]
}

// reserve counts a reserved run on its pages (d = 1), or stops counting it (-1).
func (pm *PageMap) reserve(run pageRun, d int32) {
	k := 0
	if run.st == PagePartial {
		k = 1
	}
	for pg := run.lo; pg <= run.hi; pg++ {
		pm.pgRuns[pg][k] += d
		pm.settle(pg)
	}
}

// checkPages compares the kept page map with one built from scratch.
func (v *View) checkPages() error {
	var want PageMap
	want.build(viewSource{v}, v.facts())
	pm := &v.pm
	if want.Count != pm.Count {
		return fmt.Errorf("engine: the kept page map counts %v, built from scratch %v", pm.Count, want.Count)
	}
	for pg, st := range want.States {
		if pm.States[pg] != st {
			return fmt.Errorf("engine: page %d is %s in the kept page map, %s built from scratch", pg, pm.States[pg], st)
		}
	}
	for s := range max(len(want.seqPages), len(pm.seqPages)) {
		w, wok := want.SeqPages(int64(s))
		g, gok := pm.SeqPages(int64(s))
		if w != g || wok != gok {
			return fmt.Errorf("engine: seq %d has %d pages (%v) in the kept page map, %d (%v) built from scratch", s, g, gok, w, wok)
		}
	}
	return nil
}
