package ui

import (
	"testing"

	"github.com/kvtop/kvtop/engine"
)

// referencePages is the page map's states computed the obvious way, from the cache's own
// Blocks: a differential check of buildPages' chain walk.
func referencePages(v *engine.View) []pageState {
	c := v.Cache()
	st := make([]pageState, c.NumPages())
	rec := map[int64]bool{}
	for _, s := range v.Recycling() {
		rec[s] = true
	}
	for _, b := range c.Blocks() {
		s := pgActive
		all := true
		for _, q := range b.Seqs {
			all = all && rec[q]
		}
		switch {
		case all:
			s = pgRecycling
		case len(b.Seqs) > 1:
			s = pgShared
		default:
			if r, ok := ownerOf(v, b.Seqs[0]); ok && r.Leaked && r.Seq == b.Seqs[0] {
				s = pgLeaked
			}
		}
		for _, pg := range b.Pages {
			st[pg] = s
		}
	}
	ps := int64(c.PageSize())
	for _, r := range v.Requests() {
		if r.State != engine.StatePrepared || len(r.Runs) == 0 {
			continue
		}
		for i, run := range r.Runs[0] {
			s := pgAwaiting
			switch got := r.RunReceived[i]; {
			case int64(got) == run.Len:
				continue
			case got > 0:
				s = pgPartial
			}
			for pg := run.Start / ps; pg <= (run.End()-1)/ps; pg++ {
				if cur := st[pg]; cur != pgFree && cur != pgLeaked && (cur < pgAwaiting || s > cur) {
					st[pg] = s
				}
			}
		}
	}
	return st
}

func TestPageStatesAgainstBlocks(t *testing.T) {
	models := map[string]*Model{}
	for name, s := range map[string]*script{"busy": busy(t), "watermark": watermark(t)} {
		models[name], _ = feed(t, s, Options{}, 120, 40)
	}
	if !testing.Short() {
		models["big"] = bigModel(t, 200, 60)
	}
	for name, m := range models {
		v := m.live.view
		pd := m.live.pages()
		if pd.fellBack {
			t.Errorf("%s: the requests and the recycling list did not account for every sequence", name)
		}
		want := referencePages(v)
		for pg := range want {
			if pd.state[pg] != want[pg] {
				t.Errorf("%s: page %d is %s, want %s", name, pg, pd.state[pg], want[pg])
			}
		}
		for j, r := range v.Requests() {
			got, ok := pd.requestPages(j)
			pgs, err := v.Cache().SequencePages(r.Seq, nil)
			id, _ := v.Owner(r.Seq)
			wantOK := err == nil && id == r.ID
			if ok != wantOK || (ok && got != len(pgs)) {
				t.Errorf("%s: %s holds %d pages (%v), want %d (%v)", name, r.ID, got, ok, len(pgs), wantOK)
			}
		}
	}
}

func BenchmarkPageStates(b *testing.B) {
	m := bigModel(b, 200, 60)
	v := m.live.view
	if m.live.pages().fellBack {
		b.Fatal("fell back to the cache's sequence list")
	}
	b.Run("chains", func(b *testing.B) {
		var pd pageData
		b.ReportAllocs()
		for b.Loop() {
			buildPages(&pd, v)
		}
	})
	b.Run("cache-blocks", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			referencePages(v)
		}
	})
}

// TestIdleStepsKeepPages checks that step summaries alone (an idle engine's) do not walk
// the pages again, and that a KV write does.
func TestIdleStepsKeepPages(t *testing.T) {
	s := watermark(t)
	m, _ := feed(t, s, Options{}, 120, 40)
	m.live.pages()
	built := m.live.pgVer
	mark := s.mark()
	s.step(3) // nothing to do: the head stays blocked
	m.Update(updateMsg{s.delta(mark)})
	m.live.pages()
	if m.live.pgVer != built {
		t.Errorf("idle steps rebuilt the page states: %v", s.events[mark:])
	}
	mark = s.mark()
	s.receive("r-00", 1, 2)
	m.Update(updateMsg{s.delta(mark)})
	if pd := m.live.pages(); m.live.pgVer == built || pd.count[pgPartial] == 0 {
		t.Errorf("a KV write did not rebuild the page states (%d partly received)", pd.count[pgPartial])
	}
}
