package ui

import (
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
)

// pagesPanel is the page map: every page of the KV cache as a cell, several pages a cell
// when they do not fit. The cursor selects a cell and the lines under the map say what its
// pages are and who holds them; the selected request's pages are marked.
type pagesPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap
	sel      string // the selected request, whose pages are marked

	width, height int
	cursor        int // a page; the cursor is on the cell holding it

	// cells are the pre-rendered cell strings: [state][plain, marked, cursor]. A row of
	// cells is joined by hand from their parts, opening a style only where it changes: a
	// run of like cells costs its glyphs, not an escape sequence each.
	cells    [numPageStates][3]string
	parts    [numPageStates][3]cellParts
	cellsGen int

	// What the cells show, kept current from the page map's changes (PageMap.Changes):
	// each cell's pages by state and the state it shows, and each page's state as counted.
	// A new page map, or another group size, counts every page again.
	cellCount [][numPageStates]int32
	cellState []pageState
	counted   []pageState
	group     int
	mark      engine.PageMark
	changed   []int32 // the pages changed, reused
	// countedVer is the world's pageVer when the cells were brought up to date: the page
	// map's changes move it.
	countedVer uint64
	// The selected request's pages, marked per (page map version, group size, selection).
	marked  []bool
	markKey struct {
		ver   uint64
		group int
		sel   string
	}
	markCount int

	out string
	key renderKey
}

// pageLayout is where the grid goes for the panel's size.
type pageLayout struct {
	labelW     int
	cols, rows int // of cells
	group      int // pages a cell
	cells      int
	legend     int // lines
}

const pageInfoLines = 3

func (p pagesPanel) with(w *world, st *Styles, gen int, sel string) pagesPanel {
	p.w, p.st, p.styleGen, p.sel = w, st, gen, sel
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
	}
	return p
}

// SetSize sets the panel's size.
func (p pagesPanel) SetSize(w, h int) pagesPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered map.
func (p pagesPanel) View() string { return p.out }

func (p pagesPanel) numPages() int {
	if p.w == nil || p.w.view == nil {
		return 0
	}
	return p.w.view.Cache().NumPages()
}

func (p pagesPanel) layout() pageLayout {
	n := p.numPages()
	l := pageLayout{labelW: 7, legend: legendLines(p.width, n, p.w.legendStates())}
	if p.width < 40 {
		l.labelW = 0
	}
	gw := max(p.width-l.labelW, 1)
	gh := max(p.height-1-l.legend-pageInfoLines, 1)
	switch {
	case gw >= 64:
		gw -= gw % 16
	case gw >= 16:
		gw -= gw % 8
	}
	l.group = max((n+gw*gh-1)/max(gw*gh, 1), 1)
	l.cells = (n + l.group - 1) / l.group
	l.cols = gw
	l.rows = (l.cells + gw - 1) / gw
	return l
}

// legendLines is how many lines the legend takes at a width: items wrap as render lays them
// out, each with room for the largest count.
func legendLines(width, pages int, states []pageState) int {
	digits := len(humanize.Comma(int64(pages)))
	lines, lw := 1, 0
	for _, s := range states {
		w := 1 + len([]rune(pageStateNames[s])) + digits + 4
		if lw+w > width && lw > 0 {
			lines++
			lw = 0
		}
		lw += w
	}
	return lines
}

// Update moves the cursor over the cells.
func (p pagesPanel) Update(msg tea.Msg) (pagesPanel, tea.Cmd) {
	k, ok := msg.(tea.KeyPressMsg)
	n := p.numPages()
	if !ok || n == 0 {
		return p, nil
	}
	l := p.layout()
	step := l.group
	switch {
	case key.Matches(k, p.keys.Left):
		p.cursor -= step
	case key.Matches(k, p.keys.Right):
		p.cursor += step
	case key.Matches(k, p.keys.Up):
		p.cursor -= step * l.cols
	case key.Matches(k, p.keys.Down):
		p.cursor += step * l.cols
	case key.Matches(k, p.keys.PageUp):
		p.cursor -= step * l.cols * max(l.rows/2, 1)
	case key.Matches(k, p.keys.PageDown):
		p.cursor += step * l.cols * max(l.rows/2, 1)
	case key.Matches(k, p.keys.Home):
		p.cursor = 0
	case key.Matches(k, p.keys.End):
		p.cursor = n - 1
	}
	p.cursor = min(max(p.cursor, 0), n-1)
	return p, nil
}

// Refresh re-derives the cells when the data changed and renders when anything drawn did.
func (p pagesPanel) Refresh() pagesPanel {
	if p.w == nil {
		return p
	}
	if p.cellsGen != p.styleGen || p.cells[0][0] == "" {
		p.cellsGen = p.styleGen
		for s := range numPageStates {
			g := p.st.Glyph[s]
			p.cells[s] = [3]string{p.st.Cell[s].Render(g), p.st.CellMark[s].Render(g), p.st.CellCursor[s].Render(g)}
			for v, st := range [3]lipgloss.Style{p.st.Cell[s], p.st.CellMark[s], p.st.CellCursor[s]} {
				p.parts[s][v] = splitStyle(st, g)
			}
		}
	}
	n := p.numPages()
	p.cursor = min(max(p.cursor, 0), max(n-1, 0))
	l := p.layout()
	if p.w.view != nil {
		if p.w.pageVer != p.countedVer || l.group != p.group || len(p.cellState) != l.cells {
			p.countCells(l)
			p.countedVer = p.w.pageVer
		}
		mk := p.markKey
		mk.ver, mk.group, mk.sel = p.w.pageVer, l.group, p.sel
		if mk != p.markKey || len(p.marked) != l.cells {
			p.markKey = mk
			p.markPages(l)
		}
	}
	// What the panel draws (the cells, the legend, the pages under the cursor and who
	// holds them) moves with the page map's version.
	k := renderKey{ver: p.w.pageVer, width: p.width, height: p.height, pos: p.cursor, styleGen: p.styleGen, extra: p.sel}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render(l)
	}
	return p
}

// countCells brings the cells up to date with the page map: the pages that changed since
// the last time are counted again in their cells, or, for a new map or group size, every
// page.
func (p *pagesPanel) countCells(l pageLayout) {
	pd := p.w.pages()
	var ok bool
	p.changed, p.mark, ok = pd.Changes(p.mark, p.changed[:0])
	if !ok || l.group != p.group || len(p.cellState) != l.cells || len(p.counted) != len(pd.States) {
		p.countAll(pd, l)
		return
	}
	g := int32(l.group)
	for _, pg := range p.changed {
		st, was := pd.States[pg], p.counted[pg]
		if st == was {
			continue
		}
		p.counted[pg] = st
		c := pg / g
		cnt := &p.cellCount[c]
		cnt[was]--
		cnt[st]++
		p.cellState[c] = groupState(cnt)
	}
}

// countAll counts every page in its cell.
func (p *pagesPanel) countAll(pd *engine.PageMap, l pageLayout) {
	p.group = l.group
	p.counted = append(p.counted[:0], pd.States...)
	p.cellCount = slices.Grow(p.cellCount[:0], l.cells)[:l.cells]
	p.cellState = slices.Grow(p.cellState[:0], l.cells)[:l.cells]
	clear(p.cellCount)
	for pg, st := range pd.States {
		p.cellCount[pg/l.group][st]++
	}
	for c := range p.cellCount {
		p.cellState[c] = groupState(&p.cellCount[c])
	}
}

// groupState is the state a cell shows: the most alarming one (alarming) when present, else
// the most common (a cell of one page shows its state).
func groupState(count *[numPageStates]int32) pageState {
	for _, s := range alarming {
		if count[s] > 0 {
			return s
		}
	}
	best := pgFree
	for s := pgFree; s < pgAwaiting; s++ {
		if count[s] > count[best] {
			best = s
		}
	}
	return best
}

// markPages marks the cells of the selected request's pages.
func (p *pagesPanel) markPages(l pageLayout) {
	p.marked = slices.Grow(p.marked[:0], l.cells)[:l.cells]
	clear(p.marked)
	p.markCount = 0
	v := p.w.view
	if r, ok := v.Request(p.sel); ok && r.Seq >= 0 {
		if id, ok := v.Owner(r.Seq); ok && id == r.ID {
			pgs, _ := v.Cache().SequencePages(r.Seq, nil)
			p.markCount = len(pgs)
			for _, pg := range pgs {
				p.marked[int(pg)/l.group] = true
			}
		}
	}
}

func (p pagesPanel) render(l pageLayout) string {
	st := p.st
	var b strings.Builder
	v := p.w.view
	if v == nil {
		return st.Dim.Render("waiting for the first snapshot…")
	}
	pd := p.w.pages()
	c := v.Cache()
	n := c.NumPages()
	title := fmt.Sprintf(" %s pages of %d slots · %s used", humanize.Comma(int64(n)), c.PageSize(), humanize.Comma(int64(n-c.NumAvailablePages())))
	if l.group > 1 {
		title += fmt.Sprintf(" · 1 cell = %d pages", l.group)
	}
	if p.sel != "" && p.markCount > 0 {
		title += fmt.Sprintf(" · %s's %d pages marked", p.sel, p.markCount)
	}
	b.WriteString(st.Heading.Render("Pages"))
	b.WriteString(fit(title, p.width-5))
	b.WriteByte('\n')

	// Legend with counts: glyph, name, pages.
	var lg strings.Builder
	lines := 1
	lw := 0
	for _, s := range p.w.legendStates() {
		item := fmt.Sprintf(" %s %s  ", pageStateNames[s], humanize.Comma(int64(pd.Count[s])))
		w := 1 + len([]rune(item))
		if lw+w > p.width && lw > 0 && lines < l.legend {
			lg.WriteByte('\n')
			lines++
			lw = 0
		}
		lg.WriteString(p.cells[s][0])
		lg.WriteString(item)
		lw += w
	}
	for ; lines < l.legend; lines++ {
		lg.WriteByte('\n')
	}
	b.WriteString(lg.String())

	curCell := p.cursor / l.group
	b.Grow(l.rows * (l.labelW + l.cols*4 + 64))
	for row := range l.rows {
		b.WriteByte('\n')
		if l.labelW > 0 {
			fmt.Fprintf(&b, "%6d ", row*l.cols*l.group)
		}
		var open *cellParts
		for col := range l.cols {
			cell := row*l.cols + col
			if cell >= l.cells {
				break
			}
			v := 0
			switch {
			case cell == curCell:
				v = 2
			case p.marked[cell]:
				v = 1
			}
			cp := &p.parts[p.cellState[cell]][v]
			if open == nil || cp.open != open.open {
				if open != nil {
					b.WriteString(open.close)
				}
				b.WriteString(cp.open)
				open = cp
			}
			b.WriteString(cp.glyph)
		}
		if open != nil {
			b.WriteString(open.close)
		}
	}
	gh := max(p.height-1-l.legend-pageInfoLines, 1)
	for i := l.rows; i < gh; i++ {
		b.WriteByte('\n')
	}
	for _, line := range p.info(l) {
		b.WriteByte('\n')
		b.WriteString(fit(line, p.width))
	}
	return b.String()
}

// info describes the cell under the cursor: the mix of a group, then the page's block,
// its sequences and their requests, and the reserved run it lies in.
func (p pagesPanel) info(l pageLayout) []string {
	v := p.w.view
	pd := p.w.pages()
	c := v.Cache()
	ps := c.PageSize()
	var out []string
	first := p.cursor / l.group * l.group
	last := min(first+l.group, c.NumPages()) - 1
	page := int32(p.cursor)
	if l.group > 1 {
		var count [numPageStates]int
		for pg := first; pg <= last; pg++ {
			count[pd.States[pg]]++
		}
		var mix []string
		for s := range numPageStates {
			if count[s] > 0 {
				mix = append(mix, fmt.Sprintf("%d %s", count[s], pageStateNames[s]))
			}
		}
		out = append(out, fmt.Sprintf("pages %d–%d: %s", first, last, strings.Join(mix, ", ")))
		// Describe the first page of the group that is in use, if any.
		for pg := first; pg <= last; pg++ {
			if pd.States[pg] != pgFree {
				page = int32(pg)
				break
			}
		}
	}
	s := pd.States[page]
	head := fmt.Sprintf("page %d · slots %d–%d · %s", page, int(page)*ps, int(page)*ps+ps-1, pageStateNames[s])
	block := c.PageBlock(page)
	if block < 0 {
		return append(out, head)
	}
	users := pd.BlockUsers(block)
	head += fmt.Sprintf(" · block %d", block)
	if len(users) > 0 {
		// Blocks start on page boundaries, so a page's place in a user's page list gives
		// its tokens.
		pgs, _ := c.SequencePages(users[0], nil)
		n, _ := c.SequenceLength(users[0])
		if i := slices.Index(pgs, page); i >= 0 {
			head += fmt.Sprintf(", tokens %d–%d of its sequences", i*ps, min(n, i*ps+ps)-1)
		}
	}
	out = append(out, head)
	var owners []string
	rec := make(map[int64]bool)
	for _, s := range v.Recycling() {
		rec[s] = true
	}
	for i, seq := range users {
		if i == 4 {
			owners = append(owners, fmt.Sprintf("+%d more", len(users)-4))
			break
		}
		o := fmt.Sprintf("seq %d", seq)
		if id, ok := v.Owner(seq); ok {
			o += " " + id
			if r, ok := v.Request(id); ok && r.Seq == seq {
				o += " (" + r.State.String()
				if r.Leaked {
					o += ", leaked"
				}
				o += ")"
			}
		}
		if rec[seq] {
			o += " recycling"
		}
		owners = append(owners, o)
	}
	line := "used by " + strings.Join(owners, ", ")
	// The reserved run the page lies in, for a prepared owner.
	for _, seq := range users {
		r, ok := ownerOf(v, seq)
		if !ok || len(r.Runs) == 0 || r.Seq != seq {
			continue
		}
		for i, run := range r.Runs[0] {
			if int64(page) >= run.Start/int64(ps) && int64(page) <= (run.End()-1)/int64(ps) {
				got := 0
				if i < len(r.RunReceived) {
					got = r.RunReceived[i]
				}
				line += fmt.Sprintf(" · %s's run %d+%d: %d/%d received", r.ID, run.Start, run.Len, got, run.Len)
			}
		}
	}
	return append(out, line)
}

// ownerAtCursor returns the request holding the page under the cursor.
func (p pagesPanel) ownerAtCursor() string {
	if p.w == nil || p.w.view == nil {
		return ""
	}
	v := p.w.view
	b := v.Cache().PageBlock(int32(p.cursor))
	if b < 0 {
		return ""
	}
	for _, seq := range p.w.pages().BlockUsers(b) {
		if r, ok := ownerOf(v, seq); ok {
			return r.ID
		}
	}
	return ""
}

// cellParts is a styled cell cut in three: the escape sequence that opens its style, its
// glyph, and the one that closes it.
type cellParts struct{ open, glyph, close string }

// splitStyle renders a glyph and cuts the result around it.
func splitStyle(st lipgloss.Style, glyph string) cellParts {
	r := st.Render(glyph)
	i := strings.Index(r, glyph)
	if i < 0 {
		return cellParts{glyph: r}
	}
	return cellParts{open: r[:i], glyph: glyph, close: r[i+len(glyph):]}
}
