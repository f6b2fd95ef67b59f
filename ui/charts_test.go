package ui

import (
	"math"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// The charts record what the engine derived, never their own reading of the state: after
// every step, the sample taken is the View's derived counts at that moment.
func TestSeriesSampleTheDerivedCounts(t *testing.T) {
	s := longRun(t)
	m, _ := feedModel(t, nil, Options{}, 120, 40)
	snap := s.snap
	m.Update(updateMsg{feed.Update{Snapshot: &snap}})
	checked := map[string]bool{}
	for _, ev := range s.events {
		m.fold(feed.Update{Events: []engine.Event{ev}})
		sc, ok := ev.(engine.StepCompleted)
		if !ok {
			continue
		}
		x := m.series.at(m.series.len() - 1)
		d := m.live.view.Derived()
		t0 := m.live.view.Totals()
		if x.step != sc.Step {
			t.Fatalf("the last sample is of step %d after step %d completed", x.step, sc.Step)
		}
		for name, got := range map[string][2]int{
			"free":     {int(x.free), d.FreePages},
			"waiting":  {int(x.waiting), d.Waiting},
			"blocked":  {int(x.blocked), d.Blocked},
			"prepared": {int(x.prepared), d.Prepared},
			"awaiting": {int(x.awaiting), d.AwaitingKV},
			"running":  {int(x.running), d.Running},
			"admitted": {int(x.admitted), int(t0.Admitted)},
			"finished": {int(x.finished), int(t0.Finished)},
		} {
			if got[0] != got[1] {
				t.Fatalf("step %d: the sample's %s is %d, the View derives %d", sc.Step, name, got[0], got[1])
			}
			if got[0] > 0 {
				checked[name] = true
			}
		}
	}
	if len(checked) < 8 {
		t.Errorf("the run never showed some series above zero: %v", checked)
	}
}

// The series is a ring: past its capacity it keeps the newest samples, oldest first; a
// step that goes back (another engine) starts it over.
func TestSeriesRing(t *testing.T) {
	s := newSeries(5)
	for i := uint64(1); i <= 12; i++ {
		s.add(sample{step: i})
	}
	if s.len() != 5 {
		t.Fatalf("len() = %d after 12 samples in a ring of 5", s.len())
	}
	for i := range 5 {
		if got := s.at(i).step; got != uint64(8+i) {
			t.Errorf("at(%d) = step %d, want %d", i, got, 8+i)
		}
	}
	if i := s.index(9); i != 1 {
		t.Errorf("index(9) = %d, want 1", i)
	}
	if i := s.index(3); i != -1 {
		t.Errorf("index(3) = %d, want -1 (before the first)", i)
	}
	e, _ := engine.New(engine.DefaultConfig())
	v, _ := engine.NewView(e.Snapshot())
	s.push(v, engine.StepCompleted{Stamp: engine.Stamp{Step: 4}})
	if s.len() != 1 || s.at(0).step != 4 {
		t.Errorf("after a step that went back: %d samples, first step %d; want 1, 4", s.len(), s.at(0).step)
	}
}

// The metrics over a stretch: a gauge's worst, a counter's rate per second and growth, a
// ratio of growths (none where nothing grew).
func TestSeriesMetrics(t *testing.T) {
	s := newSeries(10)
	for i, x := range []sample{
		{step: 1, at: 0, free: 10, waiting: 1, admitted: 0, query: 0},
		{step: 2, at: 500, free: 7, waiting: 4, admitted: 5, hit: 30, query: 100},
		{step: 3, at: 1000, free: 9, waiting: 2, admitted: 10, hit: 30, query: 100},
	} {
		_ = i
		s.add(x)
	}
	for _, tc := range []struct {
		name string
		m    metric
		i, j int
		want float64
	}{
		{"min free", gaugeMin(free), 0, 3, 7},
		{"max waiting", gaugeMax(waiting), 1, 3, 4},
		{"admitted/s over steps 2–3", perSecond(admitted), 1, 3, 10},
		{"admitted/s at step 3", perSecond(admitted), 2, 3, 10},
		{"admitted grew", delta(admitted), 1, 3, 10},
		{"hit % at step 2", percent(hits, queries), 1, 2, 30},
	} {
		if got := tc.m(s, tc.i, tc.j); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := percent(hits, queries)(s, 2, 3); !math.IsNaN(got) {
		t.Errorf("hit %% with no query in the stretch = %v, want none", got)
	}
}

// A plot in braille: the area fills from the bottom, a line through it clears its dots
// there (a notch) and sets them above it, the level is a dashed line from the first value.
func TestPlotCells(t *testing.T) {
	p := plot{w: 2, h: 1, top: 4, level: none,
		area: []float64{4, 2, 0, none},
		line: []float64{none, 1, 3, none}}
	got := string(p.cells()[0])
	// x0: the four dots of the left column; x1: the lower two of the right, but the line
	// at its bottom dot clears that one (inside the area, below its top); x2: no area, the
	// line's dot on the third row from the bottom.
	want := string([]rune{0x2800 | 0x01 | 0x02 | 0x04 | 0x40 | 0x20, 0x2800 | 0x02})
	if got != want {
		t.Errorf("cells = %q (%U), want %q (%U)", got, []rune(got), want, []rune(want))
	}
	lv := plot{w: 3, h: 1, top: 4, level: 1, from: 2, area: []float64{none, none, 0, 0, 0, 0}}
	if got, want := string(lv.cells()[0]), string([]rune{0x2800, 0x2840, 0x2840}); got != want {
		t.Errorf("level from x 2 = %U, want %U", []rune(got), []rune(want))
	}
}

func TestAxisNumbers(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 7: "7", 512: "512", 1234: "1.2k", 65536: "66k", 1_300_000: "1.3M", 25_000_000: "25M", 0.5: "0.5"} {
		if got := shortNum(v); got != want {
			t.Errorf("shortNum(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]float64{0: 1, 3: 5, 10: 10, 11: 20, 401: 500, 1025: 2000, 0.3: 0.5} {
		if got := niceTop(v); got != want {
			t.Errorf("niceTop(%v) = %v, want %v", v, got, want)
		}
	}
}

// A plot's columns and the samples they draw agree both ways, right-aligned: the newest
// sample is in the last column, and each column's last sample is drawn in it.
func TestChartColumns(t *testing.T) {
	for _, g := range []chartGeo{{n: 300, cols: 42, bucket: 4}, {n: 10, cols: 42, bucket: 1}, {n: 10_000, cols: 80, bucket: 63}} {
		if c := g.column(g.n - 1); c != g.cols-1 {
			t.Errorf("%+v: the newest sample is in column %d, want %d", g, c, g.cols-1)
		}
		for c := range g.cols {
			if i := g.sampleOfColumn(c); i > 0 && g.column(i) != c && g.column(i) > c {
				t.Errorf("%+v: column %d draws sample %d, which is in column %d", g, c, i, g.column(i))
			}
		}
	}
}

// Without colour the charts lose nothing but colour: each series has its glyph in the
// title, the rewound step is in reverse video, and no colour code is written.
func TestChartsWithoutColour(t *testing.T) {
	m, _ := feedModel(t, longRun(t), Options{NoColor: true}, 120, 40)
	press(m, "7", "{")
	out := m.View().Content
	if bad := colourCodes(out); len(bad) > 0 {
		t.Errorf("colour codes without colour: %q", bad[:min(len(bad), 5)])
	}
	plain := ansi.Strip(out)
	for _, want := range []string{"waiting " + lineGlyph, "blocked " + areaGlyph, "watermark 400", "◆", "rewound to 200"} {
		if !strings.Contains(plain, want) {
			t.Errorf("the charts lack %q:\n%s", want, plain)
		}
	}
	if !strings.Contains(out, "\x1b[1;7m") && !strings.Contains(out, "\x1b[7;1m") {
		t.Error("the rewound step is not marked in reverse video")
	}
}

// ← and → in the charts move the step drawn a column at a time, from the live end.
func TestChartsKeysSeek(t *testing.T) {
	m, _ := feedModel(t, longRun(t), Options{}, 120, 40)
	press(m, "7", "h")
	if m.rw == nil {
		t.Fatal("← in the charts did not rewind")
	}
	b := uint64(m.charts.geo.bucket)
	if m.rw.step != 300-b {
		t.Errorf("← rewound to %d, want one column (%d steps) back from 300", m.rw.step, b)
	}
	press(m, "h", "l")
	if m.rw.step != 300-b {
		t.Errorf("← → at %d, want %d", m.rw.step, 300-b)
	}
	press(m, "l")
	if m.rw != nil {
		t.Errorf("→ to the live end left the view rewound at %d", m.rw.step)
	}
}

// A cut style paints a line exactly as its Render does.
func TestCutStylesPaintAsRender(t *testing.T) {
	for _, st := range []Styles{DefaultStyles(true), DefaultStyles(false), PlainStyles()} {
		for name, pair := range map[string]struct {
			c     cellParts
			style interface{ Render(...string) string }
		}{
			"cursor": {st.cut.cursor, st.Cursor}, "stuck": {st.cut.stuck, st.Stuck}, "hazardous": {st.cut.hazardous, st.Hazardous},
			"dim": {st.cut.dim, st.Dim}, "warn": {st.cut.warn, st.Warn}, "bad": {st.cut.bad, st.Bad}, "hazard": {st.cut.hazard, st.Hazard},
			"error": {st.cut.err, st.Error}, "value": {st.cut.value, st.Value},
			"good": {st.cut.good, st.Good}, "marker": {st.cut.marker, st.Marker}, "border": {st.cut.border, st.Border},
			"focus": {st.cut.focus, st.Focus}, "chart": {st.cut.chart[toneWarn], st.Chart[toneWarn]},
		} {
			for _, text := range []string{"x", " r-37 blocked   watermark 403 > 402 ", "⣿⣷⠒ 1,024", "╭─ 1 requests ─╮"} {
				var b strings.Builder
				paint(&b, pair.c, text)
				if got, want := b.String(), pair.style.Render(text); got != want {
					t.Errorf("%s: paint(%q) = %q, Render = %q", name, text, got, want)
				}
			}
		}
	}
}
