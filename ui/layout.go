package ui

import (
	"strings"
	"unsafe"

	"github.com/dustin/go-humanize"
)

// The screen: a three-line header, the tab bar, the body and the footer. From
// overviewWidth×overviewHeight the body is the overview, several panels at once in boxes
// (requests and the page map on top, the charts across the middle, events and segments
// below), the focused one drawn in heavy lines; tab moves the focus and z zooms the
// focused panel to the whole body and back. Below that size, and for the panels the
// overview has no box for (prefix, detail), the body is one panel, with the page map beside
// the requests and the detail from wideWidth.

const (
	headerLines = 3
	// wideWidth is the width from which the requests and detail panels show the page map
	// beside them.
	wideWidth      = 150
	overviewWidth  = 160
	overviewHeight = 45
)

// overviewPanels are the panels the overview shows, in the order tab moves the focus.
var overviewPanels = [...]panelID{panelRequests, panelPages, panelCharts, panelEvents, panelSegments}

func inOverview(p panelID) bool {
	for _, q := range overviewPanels {
		if q == p {
			return true
		}
	}
	return false
}

// fitsOverview says whether the terminal is large enough for the overview.
func (m *Model) fitsOverview() bool { return m.width >= overviewWidth && m.height >= overviewHeight }

// overview says whether the body is the overview now.
func (m *Model) overview() bool {
	return m.fitsOverview() && !m.zoomed && !m.showHelp && inOverview(m.active)
}

// body returns where the body goes: below the header, the banner and the tabs, above the
// footer.
func (m *Model) body() rect {
	y := headerLines + 1
	if m.diverged != nil {
		y++
	}
	return rect{x: 0, y: y, w: max(m.width, 20), h: max(m.height-y-1, 1)}
}

// bodySize returns the body's width and height.
func (m *Model) bodySize() (int, int) {
	b := m.body()
	return b.w, b.h
}

// split returns the widths of the main panel and the page map beside it (0: none).
func (m *Model) split() (int, int) {
	w, _ := m.bodySize()
	if w < wideWidth || (m.active != panelRequests && m.active != panelDetail) || m.showHelp {
		return w, 0
	}
	side := w * 2 / 5
	return w - side - 1, side
}

// box is one panel of the overview and where it goes, border included.
type box struct {
	id panelID
	r  rect
}

// inner is the part of a box inside its border.
func (r rect) inner() rect { return rect{x: r.x + 1, y: r.y + 1, w: max(r.w-2, 1), h: max(r.h-2, 1)} }

// overviewBoxes lays the overview out in the body: the charts get what their grid needs
// (two to eight rows a chart), the rest is shared by the rows above and below; the left
// column takes 55% of the width.
func (m *Model) overviewBoxes() []box {
	b := m.body()
	_, rows := chartGrid(b.w - 2)
	plotH := min(max((b.h*2/9)/rows-1, 2), 8)
	chartsH := rows*(1+plotH) + 1 + 2
	top := (b.h - chartsH) / 2
	bottom := b.h - chartsH - top
	lw := b.w * 11 / 20
	rw := b.w - lw
	y1, y2 := b.y+top, b.y+top+chartsH
	return []box{
		{panelRequests, rect{0, b.y, lw, top}},
		{panelPages, rect{lw, b.y, rw, top}},
		{panelCharts, rect{0, y1, b.w, chartsH}},
		{panelEvents, rect{0, y2, lw, bottom}},
		{panelSegments, rect{lw, y2, rw, bottom}},
	}
}

// boxCache keeps a box's lines while the panel's text, the box and its focus are the same:
// a frame redraws only the boxes whose panels changed.
type boxCache struct {
	text     *byte
	textLen  int
	r        rect
	focused  bool
	styleGen int
	title    string
	lines    []string
}

// boxed draws a panel's text in a box: its name in the top border, every line padded or
// cut to the inside, heavy lines and the Focus style when focused.
func (m *Model) boxed(c *boxCache, id panelID, text, title string, r rect, focused bool) []string {
	if c.lines != nil && c.text == unsafe.StringData(text) && c.textLen == len(text) && c.r == r &&
		c.focused == focused && c.styleGen == m.styleGen && c.title == title {
		return c.lines
	}
	*c = boxCache{text: unsafe.StringData(text), textLen: len(text), r: r, focused: focused, styleGen: m.styleGen, title: title}
	st := m.st.cut.border
	h, v, tl, tr, bl, br := "─", "│", "╭", "╮", "╰", "╯"
	if focused {
		st = m.st.cut.focus
		h, v, tl, tr, bl, br = "━", "┃", "┏", "┓", "┗", "┛"
	}
	render := func(s string) string { return st.open + s + st.close }
	in := r.inner()
	label := " " + title + " "
	if width(label) > in.w-2 {
		label = fit(label, max(in.w-2, 0))
	}
	lines := make([]string, 0, r.h)
	lines = append(lines, render(tl+h+label+strings.Repeat(h, max(in.w-1-width(label), 0))+tr))
	left, right := render(v), render(v)
	n := 0
	for line := range strings.SplitSeq(text, "\n") {
		if n == in.h {
			break
		}
		lines = append(lines, left+pad(line, in.w)+right)
		n++
	}
	blank := left + strings.Repeat(" ", in.w) + right
	for ; n < in.h; n++ {
		lines = append(lines, blank)
	}
	lines = append(lines, render(bl+strings.Repeat(h, in.w)+br))
	c.lines = lines
	return lines
}

// boxTitle is a box's name in its border: the panel's number and name, and for the charts
// what they span.
func (m *Model) boxTitle(id panelID) string {
	t := string(rune('1'+id)) + " " + panelNames[id]
	if id == panelCharts && m.series.len() > 0 {
		t += " · last " + humanize.Comma(int64(m.series.len())) + " steps"
	}
	return t
}

// composeOverview writes the overview's body: the boxes row by row, side by side.
func (m *Model) composeOverview(b *strings.Builder, boxes []box, views []string) {
	for i := 0; i < len(boxes); {
		// The boxes of a row share their top.
		j := i + 1
		for j < len(boxes) && boxes[j].r.y == boxes[i].r.y {
			j++
		}
		cols := make([][]string, 0, j-i)
		for k := i; k < j; k++ {
			bx := boxes[k]
			cols = append(cols, m.boxed(&m.boxes[bx.id], bx.id, views[k], m.boxTitle(bx.id), bx.r, bx.id == m.active))
		}
		for line := range boxes[i].r.h {
			for _, c := range cols {
				if line < len(c) {
					b.WriteString(c[line])
				}
			}
			b.WriteByte('\n')
		}
		i = j
	}
}
