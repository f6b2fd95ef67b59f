package ui

import (
	"strings"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
)

// The footer's two prompts, the filter (/) and the replay's go to step (:), are each a
// textinput.Model: focused while open, its value read as it changes. The model keeps the
// keys that close them (KeyMap.AcceptPrompt, KeyMap.CancelPrompt) and ForceQuit; the
// textinput has the rest (typing, backspace, the cursor keys, ctrl+w and ctrl+u, and a
// terminal's paste).

// newPrompt returns a closed prompt showing prompt before what is typed, of at most limit
// characters (0: no limit).
func newPrompt(prompt string, limit int) textinput.Model {
	in := textinput.New()
	in.Prompt = prompt
	in.CharLimit = limit
	// ctrl+v would run xclip or pbpaste on the machine kvtop runs on, often not the one
	// the terminal is on: a terminal's own paste arrives as tea.PasteMsg and works.
	in.KeyMap.Paste.SetEnabled(false)
	return in
}

// openPrompt opens a prompt holding value, the cursor at its end.
func openPrompt(in *textinput.Model, value string) tea.Cmd {
	in.SetValue(value)
	in.CursorEnd()
	return in.Focus()
}

// closePrompt closes a prompt and empties it.
func closePrompt(in *textinput.Model) {
	in.Blur()
	in.Reset()
}

// seekLimit is the most digits the go-to-step prompt takes.
const seekLimit = 12

// digits keeps the ASCII digits of s: the go-to-step prompt takes nothing else.
func digits(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}
