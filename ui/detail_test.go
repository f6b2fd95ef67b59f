package ui

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// TestDetailScroll scrolls r-37's detail (32 lines) at 80×16 (11 lines of body) with the
// keys and the wheel, through Update, and checks the scroll and that View draws the lines
// from there.
func TestDetailScroll(t *testing.T) {
	const w, h, body = 80, 16, 11
	wheel := func(b tea.MouseButton) tea.Msg { return tea.MouseWheelMsg{Button: b} }
	keys := func(ks ...string) []tea.Msg {
		var out []tea.Msg
		for _, k := range ks {
			out = append(out, keyMsg(k))
		}
		return out
	}
	pgdown, pgup := tea.KeyPressMsg{Code: tea.KeyPgDown}, tea.KeyPressMsg{Code: tea.KeyPgUp}
	home := tea.KeyPressMsg{Code: tea.KeyHome}
	// bottom is the last scroll position: the last line on the panel's last row.
	for _, tc := range []struct {
		name string
		msgs []tea.Msg
		top  func(bottom int) int
	}{
		{"opens at the top", nil, func(int) int { return 0 }},
		{"j", keys("j"), func(int) int { return 1 }},
		{"down", keys("down", "down"), func(int) int { return 2 }},
		{"j j k", keys("j", "j", "k"), func(int) int { return 1 }},
		{"k at the top stays", keys("k", "up"), func(int) int { return 0 }},
		{"G", keys("G"), func(b int) int { return b }},
		{"end", keys("end"), func(b int) int { return b }},
		{"j past the end stops", keys(strings.Split(strings.Repeat("j", 200), "")...), func(b int) int { return b }},
		{"G then g", keys("G", "g"), func(int) int { return 0 }},
		{"G then home", append(keys("G"), home), func(int) int { return 0 }},
		{"pgdown", []tea.Msg{pgdown}, func(b int) int { return min(body, b) }},
		{"ctrl+d", []tea.Msg{tea.KeyPressMsg{Code: 'd', Mod: tea.ModCtrl}}, func(b int) int { return min(body, b) }},
		{"the viewport's own keys are not bound", keys("f", "d", "space", "l"), func(int) int { return 0 }},
		{"pgdown to the end", []tea.Msg{pgdown, pgdown, pgdown, pgdown}, func(b int) int { return b }},
		{"G then pgup", append(keys("G"), pgup), func(b int) int { return max(b-body, 0) }},
		{"wheel", []tea.Msg{wheel(tea.MouseWheelDown), wheel(tea.MouseWheelDown), wheel(tea.MouseWheelUp)}, func(int) int { return 1 }},
		{"back and in again keeps the scroll", keys("G", "esc", "enter"), func(b int) int { return b }},
		{"another request opens at its top", keys("G", "esc", "j", "enter"), func(int) int { return 0 }},
		{"taller shows it all", append(keys("G"), sizeMsg(w, 200)), func(int) int { return 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := feedModel(t, watermark(t), Options{}, w, h)
			m.Update(keyMsg("enter"))
			for _, msg := range tc.msgs {
				m.Update(msg)
			}
			if m.active != panelDetail {
				t.Fatalf("panel %s, want detail", panelNames[m.active])
			}
			lines := m.detail.lines
			_, bh := m.bodySize()
			bottom := max(len(lines)-bh, 0)
			if len(lines) < 2*body {
				t.Fatalf("r-37's detail has %d lines: too few to scroll two pages of %d", len(lines), body)
			}
			want := tc.top(bottom)
			if got := m.detail.vp.YOffset(); got != want {
				t.Errorf("scrolled to line %d, want %d (of %d, bottom %d)", got, want, len(lines), bottom)
			}
			// The panel draws from that line: the body starts below the header and tabs.
			screenLines := strings.Split(screen(m), "\n")
			for i := 0; i < bh && want+i < len(lines); i++ {
				if got, line := screenLines[headerLines+1+i], ansi.Strip(lines[want+i]); got != line {
					t.Fatalf("screen line %d = %q, want detail line %d %q", headerLines+1+i, got, want+i, line)
				}
			}
		})
	}
}
