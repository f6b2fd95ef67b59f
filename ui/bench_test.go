package ui

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// big is a large instance: 65,536 pages and 10,000 requests in every state (prepared with
// KV arriving, running, finished and recycling, leaked, blocked on the watermark).
func big() feed.Update { return bigWith(65536) }

// bigs are the large instance on caches of 65,536 and 1,048,576 pages.
var bigs = map[int]func() feed.Update{
	65536:   sync.OnceValue(func() feed.Update { return bigInstance(65536) }),
	1 << 20: sync.OnceValue(func() feed.Update { return bigInstance(1 << 20) }),
}

func bigWith(pages int) feed.Update { return bigs[pages]() }

// bigInstance is the large instance on a cache of the given pages: 10,000 requests in every
// state, 64 of them running. A larger cache has the same requests in the same states on the
// same pages, its watermark raised by the pages it adds so that the same requests wait for
// it: only the free pages differ.
func bigInstance(pages int) feed.Update {
	var tb testing.B
	s := newScript(&tb, func(c *engine.Config) {
		c.MaxTotalSequenceLength = (pages - 1) * 16
		c.MaxSingleSequenceLength = 1 << 16
		c.MaxNumSequence = 256
		c.KeepFinished = 200
		c.Watermark += pages - 65536
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
	for i := 4001; i < 4001+4*64; i += 4 {
		// 64 more get their KV and start: they decode from here on.
		rid := fmt.Sprintf("req-%05d", i+3)
		s.receive(rid, 1, 1).start(rid)
	}
	for i := 0; i < 1200; i++ {
		s.prep(id(), 1500, 0, 16)
	}
	s.step(1)
	s.abort("req-04001")
	return s.update()
}

func bigModel(b testing.TB, w, h int) *Model { return bigModelWith(b, w, h, 65536) }

func bigModelWith(b testing.TB, w, h, pages int) *Model {
	m, _ := feedModel(b, nil, Options{Name: "bench", Control: true}, w, h)
	m.Update(updateMsg{bigWith(pages)})
	return m
}

// BenchmarkFrame measures building a 200×60 frame of the requests table with the page map
// beside it (the overview's requests zoomed), on 10,000 requests and a cache of 65,536 or
// 1,048,576 pages (the same requests on the same pages, the larger cache's other pages free):
// after an engine step that moved pages (64 requests decoding a token, or giving one back:
// about four pages and 64 rows change), after one that moved nothing but the clock (a step
// summary), when only the cursor moved (drawing only), and when nothing changed (View);
// then the same for the page map alone.
func BenchmarkFrame(b *testing.B) {
	// The two instances differ in their free pages only.
	var derived []engine.Derived
	for _, pages := range []int{65536, 1 << 20} {
		u := bigWith(pages)
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range u.Events {
			if err := v.Apply(ev); err != nil {
				b.Fatal(err)
			}
		}
		d := v.Derived()
		d.FreePages, d.Pages[engine.PageFree] = 0, 0
		derived = append(derived, d)
	}
	if derived[0] != derived[1] {
		b.Fatalf("the instances differ: %+v and %+v", derived[0], derived[1])
	}
	for _, pages := range []int{65536, 1 << 20} {
		b.Run(fmt.Sprintf("pages=%d", pages), func(b *testing.B) {
			m := bigModelWith(b, 200, 60, pages)
			m.Update(keyMsg("z"))
			if n := len(m.live.view.Requests()); n < 10000 {
				b.Fatalf("%d requests, want 10,000", n)
			}
			if n := m.live.view.Cache().NumPages(); n != pages {
				b.Fatalf("%d pages", n)
			}
			if n := len(m.live.view.Running()); n != 64 {
				b.Fatalf("%d running, want 64", n)
			}
			frames(b, m, "", "j", "k", true)
			m.Update(keyMsg("2"))
			frames(b, m, "page-map-", "l", "h", false)
		})
	}
}

// frames runs the frame benchmarks on m, named after prefix: a step that moved pages, with
// all ("data-changed", "steps-only", "cursor-moved" by the keys back and forth,
// "unchanged"), or that one and the cursor.
func frames(b *testing.B, m *Model, prefix, fwd, back string, all bool) {
	redraw := func(pages bool) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				changeBig(b, m, pages)
				m.refresh()
				_ = m.View()
			}
		}
	}
	b.Run(prefix+"data-changed", redraw(true))
	if all {
		b.Run(prefix+"steps-only", redraw(false))
	}
	b.Run(prefix+"cursor-moved", func(b *testing.B) {
		b.ReportAllocs()
		k := []string{fwd, back}
		i := 0
		for b.Loop() {
			m.Update(keyMsg(k[i%2]))
			i++
			_ = m.View()
		}
	})
	if all {
		b.Run(prefix+"unchanged", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m.Update(linkTickMsg{})
				_ = m.View()
			}
		})
	}
}

// changeBig makes the big instance's data change as an engine step does: with pages, the
// running requests decode a token each for 16 steps, then give one back each for 16 (a
// sequence popped, as a reuse rolls one back), so that the cache neither fills nor empties;
// then, or without pages, a step summary. The model sees them as the dashboard's fold does:
// the View applies them, the page map's version moves, the charts get a sample.
func changeBig(b *testing.B, m *Model, pages bool) {
	v := m.live.view
	at := v.Stamp()
	at.Step++
	at.At += 50
	var evs []engine.Event
	if pages {
		ids := v.Running()
		if phase := at.Step % 32; phase < 16 {
			evs = append(evs, engine.Decoded{Stamp: at, IDs: ids})
		} else {
			for _, id := range ids {
				r, _ := v.Request(id)
				evs = append(evs, engine.SeqPopped{Stamp: at, Seq: r.Seq, N: 1})
			}
		}
	}
	sc := engine.StepCompleted{Stamp: at, Action: engine.ActionDecode, Counts: v.Last().Counts}
	evs = append(evs, sc)
	before := v.PagesVersion()
	for _, ev := range evs {
		if err := v.Apply(ev); err != nil {
			b.Fatal(err)
		}
	}
	if v.PagesVersion() != before {
		m.clock++
		m.live.pageVer, m.live.viewPages = m.clock, v.PagesVersion()
	}
	m.series.push(v, sc)
	m.touch(m.live)
}

// fillSeries gives the charts n steps of history before the model's last one, varying.
func fillSeries(m *Model, n int) {
	last := m.live.view.Stamp()
	m.series.reset()
	for i := range n {
		step := last.Step - uint64(n) + uint64(i)
		m.series.add(sample{step: step, at: last.At - int64(n-i)*50,
			free: int32(30000 + i%5000), waiting: int32(i % 300), blocked: int32(i % 200), prepared: int32(i % 700),
			awaiting: int32(i % 500), running: int32(i % 256), admitted: uint64(i * 3), finished: uint64(i * 3),
			hazards: uint64(i / 1000), hit: uint64(i * 500), query: uint64(i * 1000), cfHit: uint64(i * 400), cfQuery: uint64(i * 1000)})
	}
}

// BenchmarkOverview measures building the 200×60 overview (requests, the page map, the
// charts full of 10,000 steps, events and segments) on 10,000 requests and 65,536 pages:
// when a step changed the pages (the page states and rows derived again, the charts drawn
// again with a new sample), when only a step summary came, when the cursor moved, and when
// nothing changed.
func BenchmarkOverview(b *testing.B) {
	m := bigModel(b, 200, 60)
	if !m.overview() {
		b.Fatal("no overview at 200×60")
	}
	fillSeries(m, 10_000)
	m.Update(linkTickMsg{})
	frames(b, m, "", "j", "k", true)
	// The charts alone, drawn again for a new sample: their share of a data frame.
	b.Run("charts-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			changeBig(b, m, false)
			m.charts.key.ver = 0
			m.charts = m.charts.Refresh()
		}
	})
}

// steady is a steady workload's events after a snapshot: arrivals, admissions, metadata,
// KV writes, starts, decodes, finishes, recycling and step summaries.
var steady = sync.OnceValues(func() (engine.Snapshot, []engine.Event) {
	return steadyRun(func(s *script, mark int) bool { return len(s.events)-mark < 20000 })
})

// busyHistory is the same workload for 10,000 steps after its warm-up: what a dashboard's
// rewind history holds of a busy engine.
var busyHistory = sync.OnceValues(func() (engine.Snapshot, []engine.Event) {
	var start uint64
	return steadyRun(func(s *script, _ int) bool {
		if start == 0 {
			start = s.e.StepNumber()
		}
		return s.e.StepNumber()-start < 10_000
	})
})

// steadyRun runs the steady workload: 100 rounds to warm up, a snapshot, then rounds while
// more says so; it returns the snapshot and the events after it. A round is two steps:
// four requests arrive (some sharing a prefix), and those admitted a round before get
// their KV and start; requests decode 8 tokens and finish.
func steadyRun(more func(s *script, mark int) bool) (engine.Snapshot, []engine.Event) {
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
	for more(s, mark) {
		round()
	}
	return snap, s.events[mark:]
}

// historyModel is a 200×60 dashboard that received the busy workload's events in batches
// of 1,000, as a runner delivers them, with a rewind history within lim.
func historyModel(b *testing.B, snap engine.Snapshot, evs []engine.Event, lim feed.HistoryLimits) *Model {
	m, _ := feedModel(b, nil, Options{Name: "bench", History: lim}, 200, 60)
	m.fold(feed.Update{Snapshot: &snap})
	for i := 0; i < len(evs); i += 1000 {
		m.fold(feed.Update{Events: evs[i:min(i+1000, len(evs))]})
	}
	m.refresh()
	return m
}

// BenchmarkRewind measures showing the state 5,000 steps back in a 10,000-step history of
// a busy engine (rebuilding it from the history and building its world), the same and
// drawing the overview there, and a step back and forth from there. The history's byte
// bound is lifted for it: the default one, 64 MB, holds about 6,000 of these steps
// (BenchmarkHistoryMemory).
func BenchmarkRewind(b *testing.B) {
	snap, evs := busyHistory()
	m := historyModel(b, snap, evs, feed.HistoryLimits{Steps: 10_000, Bytes: 1 << 40})
	first, last, _ := m.hist.Steps()
	if last-first != 10_000 {
		b.Fatalf("the history holds steps %d–%d, want 10,000 of them", first, last)
	}
	target := last - 5000
	b.Run("5000-steps-back", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.rw = nil
			m.rewindTo(target)
		}
		if m.rw == nil || m.rw.step != target {
			b.Fatalf("rewound to %v, want %d", m.rw, target)
		}
		b.ReportMetric(float64(m.hist.Snapshots()), "snapshots")
	})
	b.Run("5000-steps-back-and-draw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.rw = nil
			m.rewindTo(target)
			m.refresh()
		}
	})
	b.Run("a-step-back-and-forth", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.rewindTo(target - 1)
			m.rewindTo(target)
		}
	})
}

// BenchmarkHistoryMemory reports what the default rewind history holds of the busy
// workload's 10,000 steps: the steps, its estimate of its bytes (which the 64 MB bound is
// held to), the heap it alone keeps alive (measured by dropping it; the events the live
// view's timelines and the event log keep too are not counted), and its snapshots. The
// events are made afresh, so that only the dashboard holds them.
func BenchmarkHistoryMemory(b *testing.B) {
	for b.Loop() {
		var start uint64
		snap, evs := steadyRun(func(s *script, _ int) bool {
			if start == 0 {
				start = s.e.StepNumber()
			}
			return s.e.StepNumber()-start < 10_000
		})
		m := historyModel(b, snap, evs, feed.HistoryLimits{})
		evs = nil
		first, last, _ := m.hist.Steps()
		est, snaps := m.hist.Bytes(), m.hist.Snapshots()
		heap := func() uint64 {
			runtime.GC()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		with := heap()
		m.hist = nil
		without := heap()
		runtime.KeepAlive(m)
		b.ReportMetric(float64(last-first), "steps-held")
		b.ReportMetric(float64(est)/(1<<20), "est-MiB")
		b.ReportMetric(float64(int64(with)-int64(without))/(1<<20), "heap-MiB")
		b.ReportMetric(float64(snaps), "snapshots")
	}
}

// BenchmarkApplyEvents measures folding batches of 1,000 events of a steady workload into
// the model, without drawing: "fold" is all of it (the View's Apply, the event log, the
// rewind history and the charts' samples, the dashboard's bookkeeping) over 20,000 events
// from a snapshot, again and again; "fold-long" the same over the busy workload's 10,000
// steps (half a million events), long enough for the history to checkpoint, reach its
// 64 MB and shed its oldest part as a live dashboard's does; "dashboard-only" leaves the
// View out, which is what ui adds.
func BenchmarkApplyEvents(b *testing.B) {
	const batch = 1000
	for _, bc := range []struct {
		name     string
		withView bool
		events   func() (engine.Snapshot, []engine.Event)
	}{{"fold", true, steady}, {"fold-long", true, busyHistory}, {"dashboard-only", false, steady}} {
		snap, evs := bc.events()
		b.Run(bc.name, func(b *testing.B) {
			m, _ := feedModel(b, nil, Options{}, 200, 60)
			b.ReportAllocs()
			i := len(evs)
			var total int
			for b.Loop() {
				if i+batch > len(evs) {
					b.StopTimer()
					if bc.withView {
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
