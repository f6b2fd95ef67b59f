package ui

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
)

// From 160×45 the body is the overview: tab moves the focus through its five boxes, the
// keys act on the focused one, z shows it alone and back; a panel with no box (prefix,
// detail) is shown alone, and esc comes back. Below that size, the tab layout.
func TestOverviewFocusAndZoom(t *testing.T) {
	m, _ := feedModel(t, longRun(t), Options{}, 200, 60)
	if !m.overview() {
		t.Fatal("no overview at 200×60")
	}
	var order []panelID
	for range overviewPanels {
		order = append(order, m.active)
		press(m, "tab")
	}
	if want := overviewPanels[:]; !equalPanels(order, want) {
		t.Errorf("tab focuses %v, want %v", order, want)
	}
	if m.active != panelRequests {
		t.Errorf("tab after the last box: %s, want requests again", panelNames[m.active])
	}
	press(m, "shift+tab")
	if m.active != panelSegments {
		t.Errorf("shift+tab from requests: %s, want segments", panelNames[m.active])
	}
	// The keys act on the focused box: j in the events moves its cursor, not the requests'.
	press(m, "tab", "tab", "tab", "tab") // events
	before := m.requests.cur.pos
	press(m, "k")
	if m.events.follow || m.requests.cur.pos != before {
		t.Errorf("k with the events focused: events follow %v, requests cursor %d→%d", m.events.follow, before, m.requests.cur.pos)
	}
	// The focused box is drawn in heavy lines, the others light.
	s := screen(m)
	if !strings.Contains(s, "┏━ 5 events") || !strings.Contains(s, "╭─ 1 requests") {
		t.Errorf("the focused box is not the only heavy one:\n%s", s)
	}
	press(m, "z")
	if m.overview() || m.active != panelEvents || !strings.Contains(screen(m), "zoomed · z for the overview") {
		t.Errorf("z: overview %v, panel %s; want the events alone", m.overview(), panelNames[m.active])
	}
	press(m, "z")
	if !m.overview() {
		t.Error("z again: no overview")
	}
	press(m, "3")
	if m.overview() || m.active != panelPrefix {
		t.Errorf("3: overview %v, panel %s; want the prefix tree alone", m.overview(), panelNames[m.active])
	}
	press(m, "esc")
	if !m.overview() || m.active != panelEvents {
		t.Errorf("esc from the prefix tree: overview %v, panel %s; want the overview, focus back on events", m.overview(), panelNames[m.active])
	}
	press(m, "1", "enter")
	if m.active != panelDetail || m.overview() {
		t.Fatalf("enter on a request: panel %s, overview %v; want its detail alone", panelNames[m.active], m.overview())
	}
	press(m, "esc")
	if !m.overview() || m.active != panelRequests {
		t.Errorf("esc from the detail: panel %s, overview %v", panelNames[m.active], m.overview())
	}
	// Smaller: the tab layout, and z says why it does nothing.
	m.Update(sizeMsg(159, 60))
	if m.overview() {
		t.Error("an overview at 159 columns")
	}
	press(m, "z")
	if !strings.Contains(m.message, "needs 160×45") {
		t.Errorf("z at 159×60: message %q", m.message)
	}
	m.Update(sizeMsg(200, 44))
	if m.overview() {
		t.Error("an overview at 44 lines")
	}
}

func equalPanels(a, b []panelID) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func click(m *Model, x, y int) {
	_, cmd := m.Update(tea.MouseClickMsg{X: x, Y: y, Button: tea.MouseLeft})
	if cmd != nil {
		if msg, ok := cmd().(seekMsg); ok {
			m.Update(msg)
		}
	}
}

// The mouse: a click focuses the box it lands in and acts there: a request row is
// selected (clicked again, its detail opens), a page cell goes under the cursor, a chart
// shows the state at the step under the pointer, a tab selects its panel.
func TestMouse(t *testing.T) {
	m, _ := feedModel(t, longRun(t), Options{Mouse: true}, 200, 60)
	if v := m.View(); v.MouseMode != tea.MouseModeCellMotion {
		t.Errorf("--mouse: mouse mode %v", v.MouseMode)
	}
	boxes := map[panelID]rect{}
	for _, b := range m.overviewBoxes() {
		boxes[b.id] = b.r.inner()
	}
	// The events box: focused by a click on its border.
	ev := boxes[panelEvents]
	click(m, ev.x-1, ev.y+3)
	if m.active != panelEvents {
		t.Errorf("a click on the events box's border: focus %s", panelNames[m.active])
	}
	// The third request row (below the title and the headings).
	rq := boxes[panelRequests]
	click(m, rq.x+5, rq.y+2+2)
	want := m.requests.row(2).r.ID
	if m.active != panelRequests || m.requests.selected() != want {
		t.Fatalf("a click on the third row: focus %s, selected %q; want requests, %q", panelNames[m.active], m.requests.selected(), want)
	}
	click(m, rq.x+5, rq.y+2+2)
	if m.active != panelDetail || m.detail.id != want {
		t.Fatalf("a second click on %s: panel %s of %q, want its detail", want, panelNames[m.active], m.detail.id)
	}
	press(m, "esc")
	// A page cell: the map's fourth cell of its second row.
	pg := boxes[panelPages]
	l := m.pagemap.layout()
	click(m, pg.x+l.labelW+3, pg.y+1+l.legend+1)
	if wantPage := (l.cols + 3) * l.group; m.active != panelPages || m.pagemap.cursor != wantPage {
		t.Errorf("a click on a page cell: focus %s, cursor %d; want pages, %d", panelNames[m.active], m.pagemap.cursor, wantPage)
	}
	// A chart: the step under the pointer, half-way across the first plot.
	ch := boxes[panelCharts]
	plot := m.charts.geo.plots[0]
	x, y := ch.x+plot.x+plot.w/2, ch.y+plot.y+1
	step, ok := m.charts.stepAt(plot.x+plot.w/2, plot.y+1)
	if !ok {
		t.Fatal("no step under the middle of the first chart")
	}
	click(m, x, y)
	if m.rw == nil || m.rw.step != step || step < 100 || step > 200 {
		t.Errorf("a click half-way across the chart: rewound %v; want step %d (mid-way through 300)", m.rw, step)
	}
	// The scrubber too: its left end is the first step held.
	click(m, ch.x+m.charts.geo.scrub.x, ch.y+m.charts.geo.scrub.y)
	if m.rw == nil || m.rw.step != 1 {
		t.Errorf("a click on the scrubber's left end: rewound to %v, want step 1", m.rw)
	}
	// A tab: the tab bar is the line above the body.
	tabs := strings.Split(screen(m), "\n")[m.body().y-1]
	click(m, strings.Index(tabs, " 3 prefix")+1, m.body().y-1)
	if m.active != panelPrefix {
		t.Errorf("a click on the prefix tab: %s", panelNames[m.active])
	}
}
