package ui

import (
	"fmt"
	"os"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

func sizeMsg(w, h int) tea.WindowSizeMsg { return tea.WindowSizeMsg{Width: w, Height: h} }

func TestDump(t *testing.T) {
	if os.Getenv("DUMP") == "" {
		t.Skip()
	}
	for _, tc := range []struct {
		name string
		s    *script
		w, h int
		keys []string
	}{
		{"busy", busy(t), 120, 40, nil},
		{"busy-pages", busy(t), 120, 40, []string{"2"}},
		{"busy-prefix", busy(t), 120, 40, []string{"3"}},
		{"busy-seg", busy(t), 120, 40, []string{"4"}},
		{"busy-ev", busy(t), 120, 40, []string{"5"}},
		{"wm", watermark(t), 80, 24, nil},
		{"wm-detail", watermark(t), 100, 50, []string{"G", "k", "k", "enter"}},
		{"busy-wide", busy(t), 200, 50, nil},
	} {
		m, _ := feed(t, tc.s, Options{Name: "embedded", Control: true}, tc.w, tc.h)
		for _, k := range tc.keys {
			m.Update(keyMsg(k))
		}
		fmt.Printf("===== %s\n%s\n", tc.name, ansi.Strip(m.View().Content))
	}
}

func keyMsg(s string) tea.KeyPressMsg {
	switch s {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	}
	r := []rune(s)
	return tea.KeyPressMsg{Code: r[0], Text: s}
}
