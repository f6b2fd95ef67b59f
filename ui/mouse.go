package ui

import (
	tea "charm.land/bubbletea/v2"
)

// The mouse (Options.Mouse, kvtop --mouse): a click on a tab or on one of the overview's
// boxes focuses that panel; in a panel it acts where it lands: a request's row is selected
// (clicked again, its detail opens), a page cell is put under the page map's cursor, a log
// line or a metadata answer is put under theirs, and a chart or the scrubber shows the
// state at that step. The wheel scrolls the panel under the pointer.

// region is a panel and where it is on the screen.
type region struct {
	id panelID
	r  rect // the panel's own cells, inside any border
}

// regions returns where the panels are on the screen now.
func (m *Model) regions() []region {
	if m.showHelp {
		return nil
	}
	if m.overview() {
		var out []region
		for _, b := range m.overviewBoxes() {
			out = append(out, region{b.id, b.r.inner()})
		}
		return out
	}
	body := m.body()
	mainW, sideW := m.split()
	out := []region{{m.active, rect{body.x, body.y, mainW, body.h}}}
	if sideW > 0 {
		out = append(out, region{panelPages, rect{body.x + mainW + 1, body.y, sideW, body.h}})
	}
	return out
}

// regionAt returns the panel under a cell, with the cell in the panel's coordinates.
func (m *Model) regionAt(x, y int) (panelID, int, int, bool) {
	for _, g := range m.regions() {
		// A click on a box's border counts as the box's: its focus is what it asks for.
		outer := rect{g.r.x - 1, g.r.y - 1, g.r.w + 2, g.r.h + 2}
		if g.r.has(x, y) || (m.overview() && outer.has(x, y)) {
			return g.id, x - g.r.x, y - g.r.y, true
		}
	}
	return 0, 0, 0, false
}

// tabAt returns the panel whose tab is under column x of the tab bar.
func (m *Model) tabAt(x int) (panelID, bool) {
	at := 0
	for i := range numPanels {
		w := len(" 1 ") + len(panelNames[i]) + 1
		if x >= at && x < at+w {
			return panelID(i), true
		}
		at += w
	}
	return 0, false
}

func (m *Model) onClick(c tea.MouseClickMsg) tea.Cmd {
	if c.Button != tea.MouseLeft || m.filterInput.Focused() || m.seekInput.Focused() {
		return nil
	}
	if m.showHelp {
		m.showHelp = false
		return nil
	}
	if c.Y == m.body().y-1 {
		if id, ok := m.tabAt(c.X); ok {
			m.setActive(id)
		}
		return nil
	}
	id, x, y, ok := m.regionAt(c.X, c.Y)
	if !ok {
		return nil
	}
	if id != m.active && id != panelPages || m.overview() {
		m.setActive(id)
	}
	switch id {
	case panelRequests:
		var open bool
		m.requests, open = m.requests.click(x, y)
		if open {
			return m.enter(tea.KeyPressMsg{})
		}
	case panelPages:
		m.pagemap = m.pagemap.click(x, y)
	case panelEvents:
		m.events = m.events.click(y)
	case panelSegments:
		m.segments = m.segments.click(y)
	case panelCharts:
		if step, ok := m.charts.stepAt(x, y); ok {
			m.rewindTo(step)
		}
	}
	return nil
}

// onWheel scrolls the panel under the pointer, as the arrow keys would.
func (m *Model) onWheel(w tea.MouseWheelMsg) tea.Cmd {
	k := tea.KeyPressMsg{Code: tea.KeyDown}
	if w.Button == tea.MouseWheelUp {
		k = tea.KeyPressMsg{Code: tea.KeyUp}
	}
	if id, _, _, ok := m.regionAt(w.X, w.Y); ok && m.overview() {
		m.setActive(id)
	}
	return m.toPanel(k)
}

// click selects the row under line y; it reports whether that row was selected already,
// which opens its detail.
func (p requestsPanel) click(_, y int) (requestsPanel, bool) {
	i := p.cur.top + y - 2 // the title and the column headings
	if y < 2 || i >= len(p.rows) {
		return p, false
	}
	again := p.chosen && p.row(i).r.ID == p.sel
	p = p.selectRow(i)
	p.cur.pos, p.chosen = i, true
	return p, again
}

// click puts the cell under (x, y) under the cursor.
func (p pagesPanel) click(x, y int) pagesPanel {
	if p.numPages() == 0 {
		return p
	}
	l := p.layout()
	row, col := y-1-l.legend, x-l.labelW
	if row < 0 || row >= l.rows || col < 0 || col >= l.cols {
		return p
	}
	if cell := row*l.cols + col; cell < l.cells {
		p.cursor = cell * l.group
	}
	return p
}

// click puts the line under y under the cursor, and stops following the log.
func (p eventsPanel) click(y int) eventsPanel {
	if i := p.cur.top + y - 1; y >= 1 && i < len(p.rows) {
		p.cur.pos, p.follow = i, false
	}
	return p
}

// click puts the answer under line y under the cursor.
func (p segmentsPanel) click(y int) segmentsPanel {
	if i := p.cur.top + (y-1)/segLines; y >= 1 && i < p.n {
		p.cur.pos = i
	}
	return p
}
