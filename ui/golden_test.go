package ui

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"
)

// TestGolden draws the dashboard from scripted engines and compares the text (escape
// codes stripped) with testdata/TestGolden/*.golden; `go test ./ui -update` rewrites them.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      func(testing.TB) *script
		w, h   int
		keys   []string
		noColr bool
	}{
		{name: "empty", s: func(tb testing.TB) *script { return newScript(tb, nil) }, w: 80, h: 24},
		{name: "empty_pages", s: func(tb testing.TB) *script { return newScript(tb, nil) }, w: 80, h: 24, keys: []string{"2"}},
		{name: "busy_requests", s: busy, w: 120, h: 40},
		{name: "busy_pages", s: busy, w: 120, h: 40, keys: []string{"2", "l", "l", "l", "l", "l", "l", "l", "l", "l", "l", "l", "l"}},
		{name: "busy_prefix", s: busy, w: 120, h: 30, keys: []string{"3", "j"}},
		{name: "busy_segments", s: busy, w: 120, h: 30, keys: []string{"4"}},
		{name: "busy_events", s: busy, w: 120, h: 30, keys: []string{"5"}},
		{name: "busy_wide", s: busy, w: 200, h: 50},
		{name: "busy_leaked_detail", s: busy, w: 100, h: 45, keys: []string{"/", "a-4", "enter", "enter"}},
		{name: "busy_prepared_detail", s: busy, w: 100, h: 45, keys: []string{"/", "b-03", "enter", "enter"}},
		{name: "busy_headofline_detail", s: busy, w: 100, h: 45, keys: []string{"/", "b-25", "enter", "enter"}},
		{name: "watermark_detail", s: watermark, w: 100, h: 45, keys: []string{"enter"}},
		{name: "never_admitted_detail", s: neverAdmitted, w: 100, h: 30, keys: []string{"enter"}},
		{name: "narrow_80x24", s: watermark, w: 80, h: 24},
		{name: "narrow_80x24_detail", s: watermark, w: 80, h: 24, keys: []string{"enter", "j", "j", "j"}},
		{name: "narrow_80x24_help", s: watermark, w: 80, h: 24, keys: []string{"?"}},
		{name: "nocolor_pages", s: busy, w: 80, h: 24, keys: []string{"2"}, noColr: true},
		{name: "nocolor_requests", s: busy, w: 80, h: 24, noColr: true},
		{name: "filter_prompt", s: watermark, w: 80, h: 24, keys: []string{"/", "r", "-", "3"}},
		{name: "nocolor_seek_prompt", s: watermark, w: 80, h: 24, keys: []string{":", "4", "2"}, noColr: true},
		// The overview from 160×45; below it, the tab layout.
		{name: "overview_80x24", s: longRun, w: 80, h: 24},
		{name: "overview_120x40", s: longRun, w: 120, h: 40},
		{name: "overview_200x60", s: longRun, w: 200, h: 60},
		{name: "overview_300x80", s: longRun, w: 300, h: 80},
		{name: "overview_160x45_focus_events", s: longRun, w: 160, h: 45, keys: []string{"tab", "tab", "tab"}},
		{name: "overview_200x60_zoomed_pages", s: longRun, w: 200, h: 60, keys: []string{"tab", "z"}},
		{name: "overview_200x60_rewound", s: longRun, w: 200, h: 60, keys: []string{":", "1", "7", "5", "enter"}},
		{name: "nocolor_overview_200x60", s: longRun, w: 200, h: 60, noColr: true},
		// The charts alone.
		{name: "charts_80x24", s: longRun, w: 80, h: 24, keys: []string{"7"}},
		{name: "charts_120x40", s: longRun, w: 120, h: 40, keys: []string{"7"}},
		{name: "charts_200x60", s: longRun, w: 200, h: 60, keys: []string{"7"}},
		{name: "charts_300x80", s: longRun, w: 300, h: 80, keys: []string{"7"}},
		{name: "charts_120x40_rewound", s: longRun, w: 120, h: 40, keys: []string{"7", "{", "[", "["}},
		{name: "nocolor_charts_80x24", s: longRun, w: 80, h: 24, keys: []string{"7"}, noColr: true},
		// The event log folded, all of it, by request.
		{name: "events_folded", s: longRun, w: 120, h: 30, keys: []string{"5"}},
		{name: "events_all", s: longRun, w: 120, h: 30, keys: []string{"5", "a"}},
		{name: "events_by_request", s: busy, w: 120, h: 30, keys: []string{"5", "i"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := feedModel(t, tc.s(t), Options{Name: "embedded", Control: true, NoColor: tc.noColr}, tc.w, tc.h)
			for _, k := range tc.keys {
				m.Update(keyMsg(k))
			}
			out := m.View().Content
			if tc.noColr {
				if bad := colourCodes(out); len(bad) > 0 {
					t.Errorf("NO_COLOR output has colour codes: %q", bad[:min(len(bad), 5)])
				}
			}
			checkSize(t, ansi.Strip(out), tc.w, tc.h)
			golden.RequireEqual(t, ansi.Strip(out))
		})
	}
}

// TestNoColorGlyphs checks that without colour the page states still read apart: each
// state present in the map draws its own glyph, and no two states share one.
func TestNoColorGlyphs(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{NoColor: true}, 200, 60)
	m.Update(keyMsg("2"))
	m.Update(keyMsg("z"))
	out := ansi.Strip(m.View().Content)
	seen := map[string]bool{}
	for s := range numPageStates {
		g := m.st.Glyph[s]
		if seen[g] {
			t.Errorf("glyph %q is used by two states", g)
		}
		seen[g] = true
	}
	pd := m.live.pages()
	grid := out[strings.Index(out, "\n     0 "):]
	for s := range numPageStates {
		if pd.Count[s] > 0 && !strings.Contains(grid, m.st.Glyph[s]) {
			t.Errorf("state %s has %d pages but its glyph %q is not in the map", pageStateNames[s], pd.Count[s], m.st.Glyph[s])
		}
	}
	for _, want := range []pageState{pgFree, pgShared, pgRecycling, pgAwaiting, pgPartial, pgLeaked, pgActive} {
		if pd.Count[want] == 0 {
			t.Errorf("the busy script has no %s page: the test would not show the glyphs apart", pageStateNames[want])
		}
	}
}

var sgr = regexp.MustCompile(`\x1b\[([0-9;:]*)m`)

// colourCodes returns the SGR sequences of s that set a colour.
func colourCodes(s string) []string {
	var bad []string
	for _, m := range sgr.FindAllStringSubmatch(s, -1) {
		for _, p := range strings.FieldsFunc(m[1], func(r rune) bool { return r == ';' || r == ':' }) {
			n, _ := strconv.Atoi(p)
			if (n >= 30 && n <= 38) || (n >= 40 && n <= 48) || (n >= 90 && n <= 97) || (n >= 100 && n <= 107) {
				bad = append(bad, m[0])
				break
			}
		}
	}
	return bad
}

// checkSize checks that a frame fits the terminal: h lines, none wider than w.
func checkSize(t *testing.T, s string, w, h int) {
	t.Helper()
	lines := strings.Split(s, "\n")
	if len(lines) != h {
		t.Errorf("frame has %d lines, want %d", len(lines), h)
	}
	for i, l := range lines {
		if lw := ansi.StringWidth(l); lw > w {
			t.Errorf("line %d is %d wide, want <= %d: %q", i, lw, w, l)
		}
	}
}
