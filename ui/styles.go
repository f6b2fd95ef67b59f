package ui

import (
	"image/color"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
)

// Styles is every style the dashboard draws with. Views only use these (never
// lipgloss.NewStyle), and the page map pre-renders its few cell strings from them once per
// Styles, so a frame of thousands of cells costs string joins, not Style.Render calls.
//
// Colour is never the only signal: every state that a colour tells apart also has its own
// glyph or marker, so PlainStyles (NO_COLOR) loses nothing but the colour.
type Styles struct {
	Title     lipgloss.Style // the app name in the header
	Label     lipgloss.Style // "pages", "requests" …
	Value     lipgloss.Style // numbers
	Dim       lipgloss.Style
	Good      lipgloss.Style
	Warn      lipgloss.Style
	Bad       lipgloss.Style
	Paused    lipgloss.Style // the PAUSED badge
	Frozen    lipgloss.Style // the dashboard's own frozen-view badge
	Hazard    lipgloss.Style // hazard counts and rows in the event log
	TabActive lipgloss.Style
	Tab       lipgloss.Style
	Heading   lipgloss.Style // table headings
	Cursor    lipgloss.Style // the selected row
	Stuck     lipgloss.Style // a stuck request's row
	Hazardous lipgloss.Style // a request with hazards
	Path      lipgloss.Style // the last prefix match path
	BarUsed   lipgloss.Style
	BarFree   lipgloss.Style
	Pass      lipgloss.Style // an admission predicate that holds
	Fail      lipgloss.Style // the one that failed
	Footer    lipgloss.Style
	Error     lipgloss.Style
	// Chart colours each chart's plot (by chartTone); Marker the step a rewound view draws,
	// on the charts and the scrubber.
	Chart  [numTones]lipgloss.Style
	Marker lipgloss.Style
	// Border draws the overview's boxes; Focus the focused one's, which is also drawn in
	// heavy lines, so that it shows without colour.
	Border lipgloss.Style
	Focus  lipgloss.Style
	// Cell styles a page of each state; CellMark a page of the selected request; CellCursor
	// the page map's cursor.
	Cell       [numPageStates]lipgloss.Style
	CellMark   [numPageStates]lipgloss.Style
	CellCursor [numPageStates]lipgloss.Style
	// Glyph tells the page states apart without colour.
	Glyph  [numPageStates]string
	Help   help.Styles
	Prompt textinput.Styles // the filter and go-to-step prompts in the footer

	// cut holds the styles the hottest loops paint with, cut around their text once
	// (splitStyle): a frame paints a few hundred rows and chart lines, and Style.Render
	// costs microseconds each. (Not Heading: Render underlines a text's words one by one.)
	cut cutStyles
}

// cutStyles are styles cut by splitStyle, for paint.
type cutStyles struct {
	cursor, stuck, hazardous, dim, warn, bad, hazard, err, value, good, marker, border, focus cellParts
	chart                                                                                     [numTones]cellParts
}

// cutAll cuts the styles the hot loops paint with.
func (s *Styles) cutAll() {
	c := func(st lipgloss.Style) cellParts { return splitStyle(st, "x") }
	s.cut = cutStyles{
		cursor: c(s.Cursor), stuck: c(s.Stuck), hazardous: c(s.Hazardous), dim: c(s.Dim), warn: c(s.Warn), bad: c(s.Bad),
		hazard: c(s.Hazard), err: c(s.Error), value: c(s.Value), good: c(s.Good), marker: c(s.Marker),
		border: c(s.Border), focus: c(s.Focus),
	}
	for i := range s.Chart {
		s.cut.chart[i] = c(s.Chart[i])
	}
}

// paint writes text of one line in a style cut by splitStyle: what the style's Render
// writes, without its cost.
func paint(b *strings.Builder, c cellParts, text string) {
	if text == "" {
		return
	}
	b.WriteString(c.open)
	b.WriteString(text)
	b.WriteString(c.close)
}

// glyphs are the page map's cells: distinct shapes, so the map reads without colour.
var glyphs = [numPageStates]string{
	pgFree:      "·",
	pgActive:    "█",
	pgShared:    "▓",
	pgRecycling: "○",
	pgPrepared:  "■",
	pgAwaiting:  "□",
	pgPartial:   "◧",
	pgLeaked:    "!",
	pgUnknown:   "?",
}

// DefaultStyles returns the coloured styles for a dark or light background. The colours
// are the 16 ANSI ones and a few of the 256, which the renderer degrades to what the
// terminal has.
func DefaultStyles(isDark bool) Styles {
	ld := lipgloss.LightDark(isDark)
	c := func(s string) color.Color { return lipgloss.Color(s) }
	dim := ld(c("244"), c("245"))
	cursorBG := ld(c("253"), c("237"))
	base := lipgloss.NewStyle()
	s := Styles{
		Title:     base.Bold(true).Foreground(ld(c("5"), c("13"))),
		Label:     base.Foreground(dim),
		Value:     base.Bold(true),
		Dim:       base.Foreground(dim),
		Good:      base.Foreground(ld(c("2"), c("10"))),
		Warn:      base.Foreground(ld(c("3"), c("11"))),
		Bad:       base.Bold(true).Foreground(ld(c("1"), c("9"))),
		Paused:    base.Bold(true).Reverse(true).Foreground(ld(c("3"), c("11"))),
		Frozen:    base.Bold(true).Reverse(true).Foreground(ld(c("6"), c("14"))),
		Hazard:    base.Bold(true).Foreground(ld(c("5"), c("13"))),
		TabActive: base.Bold(true).Reverse(true),
		Tab:       base.Foreground(dim),
		Heading:   base.Bold(true).Underline(true),
		Cursor:    base.Background(cursorBG).Bold(true),
		Stuck:     base.Foreground(ld(c("1"), c("9"))),
		Hazardous: base.Foreground(ld(c("5"), c("13"))),
		Path:      base.Bold(true).Foreground(ld(c("3"), c("11"))),
		BarUsed:   base.Foreground(ld(c("2"), c("10"))),
		BarFree:   base.Foreground(dim),
		Pass:      base.Foreground(ld(c("2"), c("10"))),
		Fail:      base.Bold(true).Foreground(ld(c("1"), c("9"))),
		Footer:    base.Foreground(dim),
		Error:     base.Bold(true).Foreground(ld(c("1"), c("9"))),
		Glyph:     glyphs,
		Help:      help.DefaultStyles(isDark),
		Prompt:    promptStyles(base, base.Foreground(dim)),
	}
	for i, fg := range [numTones]color.Color{
		toneGood:   ld(c("2"), c("10")),
		toneWarn:   ld(c("3"), c("11")),
		toneInfo:   ld(c("6"), c("14")),
		toneCalm:   ld(c("4"), c("12")),
		toneHazard: ld(c("5"), c("13")),
		toneBad:    ld(c("1"), c("9")),
	} {
		s.Chart[i] = base.Foreground(fg)
	}
	s.Marker = base.Reverse(true).Bold(true)
	s.Border = base.Foreground(dim)
	s.Focus = base.Bold(true).Foreground(ld(c("5"), c("13")))
	cell := [numPageStates]color.Color{
		pgFree:      dim,
		pgActive:    ld(c("2"), c("10")),
		pgShared:    ld(c("6"), c("14")),
		pgRecycling: ld(c("4"), c("12")),
		pgPrepared:  ld(c("28"), c("114")),
		pgAwaiting:  ld(c("3"), c("11")),
		pgPartial:   ld(c("208"), c("214")),
		pgLeaked:    ld(c("1"), c("9")),
		pgUnknown:   ld(c("94"), c("180")),
	}
	for i, fg := range cell {
		s.Cell[i] = base.Foreground(fg)
		s.CellMark[i] = base.Foreground(fg).Reverse(true)
		s.CellCursor[i] = base.Foreground(ld(c("0"), c("0"))).Background(ld(c("5"), c("13"))).Bold(true)
	}
	s.cutAll()
	return s
}

// PlainStyles returns styles without colour, for NO_COLOR and terminals without colour:
// bold, underline and reverse video only. Page states stay apart by their glyphs.
func PlainStyles() Styles {
	base := lipgloss.NewStyle()
	s := Styles{
		Title:     base.Bold(true),
		Label:     base,
		Value:     base.Bold(true),
		Dim:       base,
		Good:      base,
		Warn:      base.Bold(true),
		Bad:       base.Bold(true),
		Paused:    base.Bold(true).Reverse(true),
		Frozen:    base.Bold(true).Reverse(true),
		Hazard:    base.Bold(true),
		TabActive: base.Bold(true).Reverse(true),
		Tab:       base,
		Heading:   base.Bold(true).Underline(true),
		Cursor:    base.Reverse(true),
		Stuck:     base.Bold(true),
		Hazardous: base.Bold(true),
		Path:      base.Bold(true).Underline(true),
		BarUsed:   base,
		BarFree:   base,
		Pass:      base,
		Fail:      base.Bold(true),
		Footer:    base,
		Error:     base.Bold(true),
		Glyph:     glyphs,
		Prompt:    promptStyles(base, base),
	}
	for i := range s.Chart {
		s.Chart[i] = base
	}
	s.Marker = base.Reverse(true).Bold(true)
	s.Border = base
	s.Focus = base.Bold(true)
	for i := range s.Cell {
		s.Cell[i] = base
		s.CellMark[i] = base.Reverse(true)
		s.CellCursor[i] = base.Reverse(true).Underline(true).Bold(true)
	}
	s.Help = help.Styles{
		Ellipsis: base, ShortKey: base.Bold(true), ShortDesc: base, ShortSeparator: base,
		FullKey: base.Bold(true), FullDesc: base, FullSeparator: base,
	}
	s.cutAll()
	return s
}

// promptStyles styles a footer prompt like the footer's plain text. The cursor is a block
// in reverse video of the terminal's own colours, so it shows on any background and
// without colour, and it does not blink: a blinking cursor is a tick every half second,
// and a new frame with it, for as long as the prompt is open.
func promptStyles(text, dim lipgloss.Style) textinput.Styles {
	st := textinput.StyleState{Text: text, Prompt: text, Placeholder: dim, Suggestion: dim}
	return textinput.Styles{
		Focused: st,
		Blurred: st,
		Cursor:  textinput.CursorStyle{Color: lipgloss.NoColor{}, Shape: tea.CursorBlock},
	}
}
