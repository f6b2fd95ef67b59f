package ui

import (
	"testing"

	tea "charm.land/bubbletea/v2"

	"github.com/kvtop/kvtop/engine"
)

// The replay keys: + and - double and halve the speed the source reports; : then a number
// and enter seeks there.
func TestReplayKeysSendSpeedAndSeek(t *testing.T) {
	src := newFakeSource()
	m := New(src, Options{Control: true})
	m.status = engine.Status{Target: 1, Controllable: true}
	var got []engine.Control
	press := func(s string) {
		for _, r := range s {
			if cmd := m.onKey(tea.KeyPressMsg{Code: r, Text: string(r)}); cmd != nil {
				cmd()
				got = append(got, <-src.controls)
			}
		}
	}
	press("+")
	press("-")
	m.status.Target = 0.5
	press("-")
	press(":42")
	if cmd := m.onKey(tea.KeyPressMsg{Code: tea.KeyEnter}); cmd != nil {
		cmd()
		got = append(got, <-src.controls)
	}
	want := []engine.Control{{Op: engine.ControlSpeed, N: 200}, {Op: engine.ControlSpeed, N: 50}, {Op: engine.ControlSpeed, N: 25}, {Op: engine.ControlSeek, N: 42}}
	if len(got) != len(want) {
		t.Fatalf("controls = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("control %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
