package ui

import (
	"math"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"
)

// chartsPanel draws the history series as braille charts with their axis and their value
// now, in a grid that fits the panel, and under them the scrubber: the steps the charts
// span, those the rewind history still holds, and where the view is. While the dashboard
// is rewound the charts mark the step drawn and give their values there; ← and → (h, l)
// move that step a chart column at a time.
type chartsPanel struct {
	s        *series
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	// mark is the step drawn while rewound, -1 when live; held the first step the rewind
	// history holds.
	mark int64
	held uint64

	geo chartGeo // where the last render put the plots and the scrubber, for the mouse
	out string
	key struct {
		ver           uint64
		width, height int
		mark          int64
		held          uint64
		styleGen      int
	}
}

// chartGeo is where a render put things, in the panel's cells.
type chartGeo struct {
	n      int    // samples the charts span
	plots  []rect // each chart's plot
	cols   int    // cells across a plot
	scrub  rect   // the scrubber's bar
	bucket int    // samples a braille column
}

// rect is a rectangle of cells.
type rect struct{ x, y, w, h int }

func (r rect) has(x, y int) bool { return x >= r.x && x < r.x+r.w && y >= r.y && y < r.y+r.h }

// seekMsg asks the dashboard to show the state at a step: the charts' keys and a click on
// them send it.
type seekMsg struct{ step uint64 }

// chartDef is one chart: a series drawn as an area, another as a line through it (or a
// constant level, the watermark), the axis top, and the values now in its title.
type chartDef struct {
	area, line chartSeries
	lineFirst  bool // the title names the line first (the area is part of it)
	level      func(s *series) float64
	top        func(s *series, seen float64) float64
	tone       chartTone
}

// chartSeries is one series of a chart: its name, the metric a braille column plots, and
// its value at a sample, written for the title. A gauge's column is read off the buckets'
// worst gauges (series.worst), which a render takes once for every chart; m says the same
// of any stretch.
type chartSeries struct {
	name  string
	m     metric
	now   func(s *series, k int) string
	gauge func(*gauges) int32
}

// chartTone is a chart's colour.
type chartTone int

const (
	toneGood chartTone = iota
	toneWarn
	toneInfo
	toneCalm
	toneHazard
	toneBad
	numTones
)

// Glyphs that tell, in a title, the series drawn as an area from the one drawn as a line.
const (
	areaGlyph = "⣿"
	lineGlyph = "⠒"
)

func field(f func(*sample) int32) func(s *series, k int) string {
	return func(s *series, k int) string { return humanize.Comma(int64(f(s.at(k)))) }
}

// rateNow is a counter's rate over the second of engine time up to sample k.
func rateNow(m metric) func(s *series, k int) string {
	return func(s *series, k int) string {
		i := k
		for i > 0 && s.at(k).at-s.at(i).at < 1000 {
			i--
		}
		v := m(s, i+1, k+1)
		if math.IsNaN(v) {
			return "-"
		}
		return rate(v) + "/s"
	}
}

// ratioNow is a ratio of counters since the engine started, as the header gives it.
func ratioNow(part, whole func(*sample) uint64) func(s *series, k int) string {
	return func(s *series, k int) string { return ratio(part(s.at(k)), whole(s.at(k)), 1) }
}

var (
	free     = func(x *sample) int32 { return x.free }
	waiting  = func(x *sample) int32 { return x.waiting }
	blocked  = func(x *sample) int32 { return x.blocked }
	prepared = func(x *sample) int32 { return x.prepared }
	awaiting = func(x *sample) int32 { return x.awaiting }
	running  = func(x *sample) int32 { return x.running }
	admitted = func(x *sample) uint64 { return x.admitted }
	finished = func(x *sample) uint64 { return x.finished }
	hazards  = func(x *sample) uint64 { return x.hazards }
	hits     = func(x *sample) uint64 { return x.hit }
	queries  = func(x *sample) uint64 { return x.query }
	cfHits   = func(x *sample) uint64 { return x.cfHit }
	cfQuery  = func(x *sample) uint64 { return x.cfQuery }
	steps    = func(x *sample) uint64 { return x.step }
)

func niceOf(_ *series, seen float64) float64 { return niceTop(seen) }

// charts are the dashboard's charts, in the order the grid lays them out.
var charts = []chartDef{
	{
		area:  chartSeries{"free pages", gaugeMin(free), field(free), func(g *gauges) int32 { return g.free }},
		level: func(s *series) float64 { return float64(s.watermark) },
		top:   func(s *series, _ float64) float64 { return float64(max(s.pages, 1)) },
		tone:  toneGood,
	},
	{
		line: chartSeries{"waiting", gaugeMax(waiting), field(waiting), func(g *gauges) int32 { return g.waiting }},
		area: chartSeries{"blocked", gaugeMax(blocked), field(blocked), func(g *gauges) int32 { return g.blocked }},
		top:  niceOf, tone: toneWarn, lineFirst: true,
	},
	{
		line: chartSeries{"prepared", gaugeMax(prepared), field(prepared), func(g *gauges) int32 { return g.prepared }},
		area: chartSeries{"awaiting KV", gaugeMax(awaiting), field(awaiting), func(g *gauges) int32 { return g.awaiting }},
		top:  niceOf, tone: toneInfo, lineFirst: true,
	},
	{
		area: chartSeries{"running", gaugeMax(running), field(running), func(g *gauges) int32 { return g.running }},
		top:  niceOf, tone: toneGood,
	},
	{
		area: chartSeries{"admitted", perSecond(admitted), rateNow(perSecond(admitted)), nil},
		line: chartSeries{"finished", perSecond(finished), rateNow(perSecond(finished)), nil},
		top:  niceOf, tone: toneCalm,
	},
	{
		area: chartSeries{"prefix hit", percent(hits, queries), ratioNow(hits, queries), nil},
		line: chartSeries{"other order", percent(cfHits, cfQuery), ratioNow(cfHits, cfQuery), nil},
		top:  func(*series, float64) float64 { return 100 }, tone: toneInfo,
	},
	{
		area: chartSeries{"steps", perSecond(steps), rateNow(perSecond(steps)), nil},
		top:  niceOf, tone: toneCalm,
	},
	{
		area: chartSeries{"hazards", delta(hazards), func(s *series, k int) string { return humanize.Comma(int64(s.at(k).hazards)) }, nil},
		top:  niceOf, tone: toneHazard,
	},
}

// Chart geometry: the axis labels' width, and the narrowest chart worth drawing.
const (
	axisW     = 5
	minChartW = 36
	maxPlotH  = 12
)

func (p chartsPanel) with(s *series, st *Styles, gen int, mark int64, held uint64) chartsPanel {
	p.s, p.st, p.styleGen, p.mark, p.held = s, st, gen, mark, held
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
	}
	return p
}

// SetSize sets the panel's size.
func (p chartsPanel) SetSize(w, h int) chartsPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered charts.
func (p chartsPanel) View() string { return p.out }

// Update moves the step drawn a chart column back or on (← and →), from the live end when
// the view is live.
func (p chartsPanel) Update(msg tea.Msg) (chartsPanel, tea.Cmd) {
	k, ok := msg.(tea.KeyPressMsg)
	if !ok || p.s == nil || p.s.len() == 0 {
		return p, nil
	}
	n := p.s.len()
	cur := n - 1
	if p.mark >= 0 {
		cur = max(p.s.index(uint64(p.mark)), 0)
	}
	b := max(p.geo.bucket, 1)
	switch {
	case key.Matches(k, p.keys.Left):
		cur = max(cur-b, 0)
	case key.Matches(k, p.keys.Right):
		cur = min(cur+b, n-1)
	default:
		return p, nil
	}
	step := p.s.at(cur).step
	return p, func() tea.Msg { return seekMsg{step} }
}

// stepAt returns the step under a cell of the panel: on a plot, the last step of the
// column; on the scrubber, the step at that place of it.
func (p chartsPanel) stepAt(x, y int) (uint64, bool) {
	g := p.geo
	if p.s == nil || g.n == 0 {
		return 0, false
	}
	idx := -1
	for _, r := range g.plots {
		if r.has(x, y) {
			idx = g.sampleOfColumn(x - r.x)
		}
	}
	if g.scrub.has(x, y) && g.scrub.w > 0 {
		idx = (x - g.scrub.x) * g.n / g.scrub.w
	}
	if idx < 0 {
		return 0, false
	}
	return p.s.at(min(idx, g.n-1)).step, true
}

// sampleOfColumn returns the last sample a plot's cell column draws (the charts are
// right-aligned: the newest sample is at the right edge).
func (g chartGeo) sampleOfColumn(c int) int {
	dots := 2 * g.cols
	used := (g.n + g.bucket - 1) / g.bucket
	x := 2*c + 1 - (dots - used) // the right dot of the cell
	if x < 0 {
		return 0
	}
	return min((x+1)*g.bucket, g.n) - 1
}

// column returns the cell column a sample is drawn in.
func (g chartGeo) column(i int) int {
	dots := 2 * g.cols
	used := (g.n + g.bucket - 1) / g.bucket
	return (dots - used + i/g.bucket) / 2
}

// Refresh renders when the series, the size, the mark or the styles changed.
func (p chartsPanel) Refresh() chartsPanel {
	if p.s == nil {
		return p
	}
	k := p.key
	k.ver, k.width, k.height, k.mark, k.held, k.styleGen = p.s.ver, p.width, p.height, p.mark, p.held, p.styleGen
	if k != p.key || p.out == "" {
		p.key = k
		p.out, p.geo = p.render()
	}
	return p
}

// chartGrid returns how many charts go across and down in a width: as many across as fit,
// the rows balanced.
func chartGrid(width int) (cols, rows int) {
	cols = min(max(width/minChartW, 1), len(charts))
	rows = (len(charts) + cols - 1) / cols
	return (len(charts) + rows - 1) / rows, rows
}

// grid returns how many charts go across and down in the panel, and each one's plot
// height.
func (p chartsPanel) grid() (cols, rows, plotH int) {
	cols, rows = chartGrid(p.width)
	plotH = (p.height-1)/rows - 1
	for plotH < 1 && rows > 1 {
		rows-- // not every chart fits: the first ones are drawn
		plotH = (p.height-1)/rows - 1
	}
	return cols, rows, min(max(plotH, 1), maxPlotH)
}

func (p chartsPanel) render() (string, chartGeo) {
	st := p.st
	s := p.s
	n := s.len()
	if n == 0 {
		return st.Dim.Render("no step has completed yet: the charts start with the first"), chartGeo{}
	}
	cols, rows, plotH := p.grid()
	gap := 1
	cw := (p.width - (cols-1)*gap) / cols
	pw := max(cw-axisW-1, 2)
	bucket := max((n+2*pw-1)/(2*pw), 1)
	g := chartGeo{n: n, cols: pw, bucket: bucket}
	markCol := -1
	markIdx := n - 1
	if p.mark >= 0 {
		markIdx = s.index(uint64(p.mark))
		markCol = g.column(max(markIdx, 0))
	}
	aggs := s.worst(bucket, nil)
	var b strings.Builder
	for row := range rows {
		blocks := make([][]string, 0, cols)
		for c := range cols {
			i := row*cols + c
			if i >= len(charts) {
				break
			}
			x := c * (cw + gap)
			y := row * (1 + plotH)
			g.plots = append(g.plots, rect{x: x + axisW + 1, y: y + 1, w: pw, h: plotH})
			blocks = append(blocks, p.chart(charts[i], aggs, cw, pw, plotH, bucket, markIdx, markCol))
		}
		for line := range 1 + plotH {
			for c, bl := range blocks {
				if c > 0 {
					b.WriteString(strings.Repeat(" ", gap))
				}
				b.WriteString(bl[line])
			}
			b.WriteByte('\n')
		}
	}
	g.scrub = rect{y: rows * (1 + plotH)}
	b.WriteString(p.scrubber(&g, markIdx))
	return b.String(), g
}

// hasLine says whether a chart draws its line: the counterfactual's only when the engine
// runs it.
func (d chartDef) hasLine(s *series) bool {
	return d.line.m != nil && (d.line.name != "other order" || s.cf)
}

// title is a chart's title: its series' values at sample k, each with its glyph when
// there are two, and the level's.
func (p chartsPanel) title(d chartDef, k int) string {
	s := p.s
	two := d.hasLine(s)
	var t strings.Builder
	name := func(c chartSeries, glyph string) {
		n := c.name
		if n == "other order" {
			n = s.cfOrder + " order"
		}
		t.WriteString(n)
		if two {
			t.WriteString(" " + glyph)
		}
		t.WriteByte(' ')
		v := "-" // the step drawn is before the first sample
		if k >= 0 {
			v = c.now(s, k)
		}
		paint(&t, p.st.cut.value, v)
	}
	switch {
	case !two:
		name(d.area, areaGlyph)
	case d.lineFirst:
		name(d.line, lineGlyph)
		t.WriteString(" · ")
		name(d.area, areaGlyph)
	default:
		name(d.area, areaGlyph)
		t.WriteString(" · ")
		name(d.line, lineGlyph)
	}
	if d.level != nil {
		t.WriteString(" · watermark " + humanize.Comma(int64(d.level(s))))
	}
	return t.String()
}

// chart draws one chart cw wide: its title, then plotH rows of axis label and plot.
func (p chartsPanel) chart(d chartDef, aggs []gauges, cw, pw, plotH, bucket, markIdx, markCol int) []string {
	s := p.s
	n := s.len()
	used := (n + bucket - 1) / bucket
	off := 2*pw - used
	pl := plot{w: pw, h: plotH, level: none, from: off}
	seen := 0.0
	values := func(c chartSeries) []float64 {
		out := make([]float64, 2*pw)
		for x := range out {
			out[x] = none
		}
		for k := range used {
			var v float64
			if c.gauge != nil {
				v = float64(c.gauge(&aggs[k]))
			} else {
				v = c.m(s, k*bucket, min((k+1)*bucket, n))
			}
			out[off+k] = v
			if !math.IsNaN(v) {
				seen = max(seen, v)
			}
		}
		return out
	}
	pl.area = values(d.area)
	if d.hasLine(s) {
		pl.line = values(d.line)
	}
	if d.level != nil {
		pl.level = d.level(s)
	}
	pl.top = d.top(s, seen)

	out := []string{pad(fit(p.title(d, markIdx), cw), cw)}

	tone := p.st.cut.chart[d.tone]
	var line strings.Builder
	for r, cells := range pl.cells() {
		label := ""
		switch r {
		case 0:
			label = shortNum(pl.top)
		case plotH - 1:
			label = "0"
		}
		line.Reset()
		paint(&line, p.st.cut.dim, padLeft(label, axisW))
		line.WriteByte(' ')
		if markCol >= 0 && markCol < len(cells) {
			paint(&line, tone, string(cells[:markCol]))
			paint(&line, p.st.cut.marker, string(cells[markCol]))
			paint(&line, tone, string(cells[markCol+1:]))
		} else {
			paint(&line, tone, string(cells))
		}
		out = append(out, line.String())
	}
	return out
}

// scrubber draws the steps the charts span as a bar: ─ where the rewind history holds
// them, ┄ where it no longer does, the step drawn marked ◆ (● at the end when live).
func (p chartsPanel) scrubber(g *chartGeo, markIdx int) string {
	s := p.s
	first, last := s.at(0).step, s.at(g.n-1).step
	left := "step " + humanize.Comma(int64(first)) + " "
	right := " " + humanize.Comma(int64(last))
	if p.mark >= 0 {
		right += " · rewound to " + humanize.Comma(p.mark)
	} else {
		right += " · live"
	}
	bw := p.width - width(left) - width(right)
	if bw < 4 {
		return fit(left+right, p.width)
	}
	g.scrub.x, g.scrub.w, g.scrub.h = width(left), bw, 1
	heldFrom := 0 // the bar's cells before it show steps the rewind history no longer holds
	if p.held > first {
		heldFrom = min((max(s.index(p.held), 0)*bw+g.n-1)/g.n, bw)
	}
	markX := bw - 1
	if p.mark >= 0 {
		markX = min(max(markIdx, 0)*bw/g.n, bw-1)
	}
	var bar strings.Builder
	heldFrom = min(heldFrom, markX)
	paint(&bar, p.st.cut.dim, strings.Repeat("┄", heldFrom))
	bar.WriteString(strings.Repeat("─", markX-heldFrom))
	if p.mark >= 0 {
		paint(&bar, p.st.cut.marker, "◆")
	} else {
		paint(&bar, p.st.cut.good, "●")
	}
	bar.WriteString(strings.Repeat("─", bw-markX-1))
	var out strings.Builder
	paint(&out, p.st.cut.dim, left)
	out.WriteString(bar.String())
	out.WriteString(right)
	return out.String()
}
