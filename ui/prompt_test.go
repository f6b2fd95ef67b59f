package ui

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"

	"github.com/kvtop/kvtop/feed"
)

var (
	ctrlC = tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl}
	left  = tea.KeyPressMsg{Code: tea.KeyLeft}
)

func msgs(ks ...any) []tea.Msg {
	var out []tea.Msg
	for _, k := range ks {
		switch k := k.(type) {
		case string:
			out = append(out, keyMsg(k))
		case tea.Msg:
			out = append(out, k)
		}
	}
	return out
}

// footerLine is the last line of the screen.
func footerLine(m *Model) string {
	s := screen(m)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// run sends msgs to the model through Update and reports whether one of them quit.
func run(m *Model, ms []tea.Msg) (quit bool) {
	for _, msg := range ms {
		if _, cmd := m.Update(msg); cmd != nil {
			if _, ok := cmd().(tea.QuitMsg); ok {
				quit = true
			}
		}
	}
	return quit
}

// TestFilterPrompt types into the filter prompt of the requests panel through Update and
// checks the prompt, the filter it applies as it is typed, the footer, and quitting.
func TestFilterPrompt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		msgs   []tea.Msg
		open   bool
		value  string // the prompt's, while open
		filter string // the requests panel's
		footer string // the footer starts with this
		quit   bool
	}{
		{name: "opens", msgs: msgs("/"), open: true, footer: "/   enter keeps · esc clears"},
		{name: "typing applies as typed", msgs: msgs("/", "r", "-", "3"), open: true, value: "r-3", filter: "r-3", footer: "/r-3   enter keeps"},
		{name: "backspace", msgs: msgs("/", "r", "-", "3", "backspace"), open: true, value: "r-", filter: "r-", footer: "/r-   enter keeps"},
		{name: "backspace on nothing", msgs: msgs("/", "backspace"), open: true, footer: "/   enter keeps"},
		{name: "the cursor moves", msgs: msgs("/", "r", "3", left, "-"), open: true, value: "r-3", filter: "r-3", footer: "/r-3  enter keeps"}, // on the 3
		{name: "enter keeps the filter", msgs: msgs("/", "r", "-", "3", "6", "enter"), filter: "r-36", footer: "? help"},
		{name: "esc clears", msgs: msgs("/", "r", "-", "esc"), footer: "? help"},
		{name: "esc clears a kept filter", msgs: msgs("/", "r", "enter", "/", "esc"), footer: "? help"},
		{name: "opens on the kept filter", msgs: msgs("/", "r", "-", "enter", "/", "3"), open: true, value: "r-3", filter: "r-3", footer: "/r-3"},
		{name: "a leading ! inverts", msgs: msgs("/", "!", "r", "-", "3", "enter"), filter: "!r-3"},
		{name: "keys are text in the prompt", msgs: msgs("/", "q", "p", "?", "2", "tab"), open: true, value: "qp?2", filter: "qp?2"},
		{name: "a bad expression keeps the last good filter", msgs: msgs("/", "r", "(", "enter"), filter: "r", footer: "bad filter: "},
		{name: "a paste", msgs: msgs("/", tea.PasteMsg{Content: "r-3\n"}), open: true, value: "r-3 ", filter: "r-3 "},
		{name: "ctrl+c quits from the prompt", msgs: msgs("/", "r", ctrlC), open: true, value: "r", filter: "r", quit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := feedModel(t, watermark(t), Options{}, 100, 30)
			quit := run(m, tc.msgs)
			if got := m.filterInput.Focused(); got != tc.open {
				t.Errorf("prompt open = %v, want %v", got, tc.open)
			}
			if tc.open {
				if got := m.filterInput.Value(); got != tc.value {
					t.Errorf("prompt value = %q, want %q", got, tc.value)
				}
			}
			if got := m.requests.filter.text; got != tc.filter {
				t.Errorf("filter = %q, want %q", got, tc.filter)
			}
			if got := footerLine(m); !strings.HasPrefix(got, tc.footer) {
				t.Errorf("footer = %q, want it to start with %q", got, tc.footer)
			}
			if quit != tc.quit {
				t.Errorf("quit = %v, want %v", quit, tc.quit)
			}
		})
	}
}

// TestFilterPromptEvents filters the event log: the prompt opens on the panel's own
// filter and applies to it.
func TestFilterPromptEvents(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 120, 60)
	run(m, msgs("5", "/", "hazard", "_", "detected", "enter"))
	if got, n := m.events.filter.text, len(m.events.idx); got != "hazard_detected" || n != 3 {
		t.Errorf("events filter %q with %d rows, want hazard_detected with 3", got, n)
	}
	if m.requests.filter.text != "" {
		t.Errorf("the requests panel was filtered too: %q", m.requests.filter.text)
	}
	run(m, msgs("/"))
	if got := m.filterInput.Value(); got != "hazard_detected" {
		t.Errorf("the prompt reopened on %q, want the events filter", got)
	}
}

// TestSeekPrompt types a step to go to through Update: digits only, at most 12; enter asks
// the source to seek there, esc asks nothing.
func TestSeekPrompt(t *testing.T) {
	seek := func(n int) []feed.Control { return []feed.Control{{Op: feed.ControlSeek, N: n}} }
	for _, tc := range []struct {
		name    string
		msgs    []tea.Msg
		open    bool
		value   string
		footer  string
		control []feed.Control
		quit    bool
	}{
		{name: "opens", msgs: msgs(":"), open: true, footer: "go to step:    enter goes · esc cancels"},
		{name: "typing", msgs: msgs(":", "4", "2"), open: true, value: "42", footer: "go to step: 42   enter goes"},
		{name: "digits only", msgs: msgs(":", "4", "x", " ", "-", "2", "space"), open: true, value: "42"},
		{name: "at most 12 digits", msgs: msgs(":", "1", "2", "3", "4", "5", "6", "7", "8", "9", "0", "1", "2", "3", "4"), open: true, value: "123456789012"},
		{name: "backspace", msgs: msgs(":", "4", "2", "backspace", "7"), open: true, value: "47"},
		{name: "a paste keeps the digits", msgs: msgs(":", tea.PasteMsg{Content: "step 1,024"}), open: true, value: "1024"},
		{name: "enter goes", msgs: msgs(":", "4", "2", "enter"), footer: "going to step 42", control: seek(42)},
		{name: "enter on nothing", msgs: msgs(":", "enter"), footer: `go to step: "" is not a step number`},
		{name: "esc cancels", msgs: msgs(":", "4", "esc"), footer: "? help"},
		{name: "opens empty", msgs: msgs(":", "4", "esc", ":", "7", "enter"), control: seek(7)},
		{name: "ctrl+c quits from the prompt", msgs: msgs(":", "4", ctrlC), open: true, value: "4", quit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, src := feedModel(t, watermark(t), Options{Control: true}, 100, 30)
			quit := false
			for _, msg := range tc.msgs {
				_, cmd := m.Update(msg)
				if cmd == nil {
					continue
				}
				switch msg := cmd().(type) {
				case tea.QuitMsg:
					quit = true
				case controlDoneMsg:
					m.Update(msg)
				}
			}
			if got := m.seekInput.Focused(); got != tc.open {
				t.Errorf("prompt open = %v, want %v", got, tc.open)
			}
			if got := m.seekInput.Value(); tc.open && got != tc.value {
				t.Errorf("prompt value = %q, want %q", got, tc.value)
			}
			if got := footerLine(m); !strings.HasPrefix(got, tc.footer) {
				t.Errorf("footer = %q, want it to start with %q", got, tc.footer)
			}
			got := controls(src)
			if len(got) != len(tc.control) || (len(got) > 0 && got[0] != tc.control[0]) {
				t.Errorf("controls = %+v, want %+v", got, tc.control)
			}
			if quit != tc.quit {
				t.Errorf("quit = %v, want %v", quit, tc.quit)
			}
		})
	}
}

// TestPromptCtrlVReadsNoClipboard: ctrl+v would run xclip or pbpaste where kvtop runs,
// not where the terminal is; a terminal's paste comes as tea.PasteMsg instead.
func TestPromptCtrlVReadsNoClipboard(t *testing.T) {
	m, _ := feedModel(t, watermark(t), Options{}, 100, 30)
	for _, open := range []string{"/", ":"} {
		run(m, msgs(open))
		if _, cmd := m.Update(tea.KeyPressMsg{Code: 'v', Mod: tea.ModCtrl}); cmd != nil {
			t.Errorf("%s then ctrl+v returned a command (%T): the clipboard would be read", open, cmd())
		}
		run(m, msgs("esc"))
	}
}
