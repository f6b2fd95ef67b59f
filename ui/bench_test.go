package ui

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// big is a large instance: 65,536 pages and 10,000 requests in every state (prepared with
// KV arriving, running, finished and recycling, leaked, blocked on the watermark).
var big = sync.OnceValue(func() feed.Update {
	var tb testing.B
	s := newScript(&tb, func(c *engine.Config) {
		c.MaxTotalSequenceLength = 65535 * 16
		c.MaxSingleSequenceLength = 1 << 16
		c.MaxNumSequence = 256
		c.KeepFinished = 200
	})
	n := 0
	id := func() string { n++; return fmt.Sprintf("req-%05d", n) }
	for i := 0; i < 9000; i++ {
		s.prep(id(), 70+i%20, (i%4)*16, 4)
	}
	s.step(1)
	for i := 1; i <= 9000; i++ {
		rid := fmt.Sprintf("req-%05d", i)
		switch {
		case i <= 300:
			s.receive(rid, 1, 1).start(rid)
		case i <= 4000:
			s.receive(rid, i%4, 4)
		}
	}
	s.step(8) // decode: the first ones finish and recycle
	for i := 0; i < 1200; i++ {
		s.prep(id(), 1500, 0, 16)
	}
	s.step(1)
	s.abort("req-04001")
	return s.update()
})

func bigModel(b testing.TB, w, h int) *Model {
	m, _ := feedModel(b, nil, Options{Name: "bench", Control: true}, w, h)
	m.Update(updateMsg{big()})
	return m
}

// BenchmarkFrame measures building a 200×60 frame of the requests table with the page map
// beside it, on 10,000 requests and 65,536 pages: when the data changed (derive the page
// states and the rows again, then render), when only step summaries came (the rows again),
// when only the cursor moved (render), and when nothing changed (View); then the same for
// the page map alone.
func BenchmarkFrame(b *testing.B) {
	m := bigModel(b, 200, 60)
	if n := len(m.live.view.Requests()); n < 10000 {
		b.Fatalf("%d requests, want 10,000", n)
	}
	if n := m.live.view.Cache().NumPages(); n != 65536 {
		b.Fatalf("%d pages", n)
	}
	// What changed: events that touch the pages (the worst case: the page states are walked
	// again), or only step summaries (an idle engine's).
	changed := func(pages bool) {
		// An event that changes nothing but says it may have: the View derives again (the
		// page map too when pages), as after a real one.
		var ev engine.Event = engine.StepCompleted{Stamp: m.live.view.Stamp()}
		if pages {
			ev = engine.Decoded{Stamp: m.live.view.Stamp()}
		}
		if err := m.live.view.Apply(ev); err != nil {
			b.Fatal(err)
		}
		if pages {
			m.clock++
			m.live.pageVer, m.live.viewPages = m.clock, m.live.view.PagesVersion()
		}
		m.touch(m.live)
	}
	b.Run("data-changed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			changed(true)
			m.refresh()
			_ = m.View()
		}
	})
	b.Run("steps-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			changed(false)
			m.refresh()
			_ = m.View()
		}
	})
	b.Run("cursor-moved", func(b *testing.B) {
		b.ReportAllocs()
		k := []string{"j", "k"}
		i := 0
		for b.Loop() {
			m.Update(keyMsg(k[i%2]))
			i++
			_ = m.View()
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Update(linkTickMsg{})
			_ = m.View()
		}
	})
	m.Update(keyMsg("2"))
	b.Run("page-map-data-changed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			changed(true)
			m.refresh()
			_ = m.View()
		}
	})
	b.Run("page-map-cursor-moved", func(b *testing.B) {
		b.ReportAllocs()
		k := []string{"l", "h"}
		i := 0
		for b.Loop() {
			m.Update(keyMsg(k[i%2]))
			i++
			_ = m.View()
		}
	})
}

// steady is a steady workload's events after a snapshot: arrivals, admissions, metadata,
// KV writes, starts, decodes, finishes, recycling and step summaries.
var steady = sync.OnceValues(func() (engine.Snapshot, []engine.Event) {
	var tb testing.B
	s := newScript(&tb, func(c *engine.Config) {
		c.MaxTotalSequenceLength = 1 << 16
		c.MaxNumSequence = 64
	})
	n := 0
	var prepared []string
	round := func() {
		for range 4 {
			n++
			id := fmt.Sprintf("s-%05d", n)
			s.prep(id, 60+n%40, (n%3)*16, 8)
			prepared = append(prepared, id)
		}
		s.step(1)
		for len(prepared) > 8 {
			id := prepared[0]
			prepared = prepared[1:]
			s.receive(id, 1, 2).receive(id, 1, 1)
			s.start(id)
		}
		s.step(1)
	}
	for range 100 {
		round()
	}
	snap := s.e.Snapshot()
	mark := s.mark()
	for len(s.events)-mark < 20000 {
		round()
	}
	return snap, s.events[mark:]
})

// BenchmarkApplyEvents measures folding batches of 1,000 events of a steady workload into
// the model, without drawing: "fold" is all of it (the View's Apply, the event log, the
// dashboard's bookkeeping); "dashboard-only" leaves the View out, which is what ui adds.
func BenchmarkApplyEvents(b *testing.B) {
	snap, evs := steady()
	const batch = 1000
	for _, withView := range []bool{true, false} {
		name := "fold"
		if !withView {
			name = "dashboard-only"
		}
		b.Run(name, func(b *testing.B) {
			m, _ := feedModel(b, nil, Options{}, 200, 60)
			b.ReportAllocs()
			i := len(evs)
			var total int
			for b.Loop() {
				if i+batch > len(evs) {
					b.StopTimer()
					if withView {
						s := snap
						m.fold(feed.Update{Snapshot: &s})
					}
					i = 0
					b.StartTimer()
				}
				m.fold(feed.Update{Events: evs[i : i+batch]})
				if m.diverged != nil {
					b.Fatal(m.diverged)
				}
				i += batch
				total += batch
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(total), "ns/event")
		})
	}
}

// BenchmarkDetail measures the detail panel of one request of the big instance at 120×24
// (narrower than the page map beside it, so the panel's own cost shows): when the data
// changed (its lines are built again), when it scrolled (j and k), and when nothing changed.
func BenchmarkDetail(b *testing.B) {
	m := bigModel(b, 120, 24)
	m.Update(keyMsg("enter"))
	if m.active != panelDetail || m.detail.id == "" {
		b.Fatalf("enter: panel %s, detail %q; want a request's detail", panelNames[m.active], m.detail.id)
	}
	b.Run("data-changed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.touch(m.live)
			m.refresh()
			_ = m.View()
		}
	})
	b.Run("scrolled", func(b *testing.B) {
		b.ReportAllocs()
		k := []string{"j", "k"}
		i := 0
		for b.Loop() {
			m.Update(keyMsg(k[i%2]))
			i++
			_ = m.View()
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Update(linkTickMsg{})
			_ = m.View()
		}
	})
}
