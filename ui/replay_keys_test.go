package ui

import (
	"testing"

	tea "charm.land/bubbletea/v2"

	"github.com/kvtop/kvtop/feed"
)

// The replay keys: + and - double and halve the speed the source reports; : then a number
// and enter seeks there.
func TestReplayKeysSendSpeedAndSeek(t *testing.T) {
	src := newFakeSource()
	m := New(src, Options{Control: true})
	m.status = feed.Status{Target: 1, Controllable: true}
	var got []feed.Control
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
	want := []feed.Control{{Op: feed.ControlSpeed, N: 200}, {Op: feed.ControlSpeed, N: 50}, {Op: feed.ControlSpeed, N: 25}, {Op: feed.ControlSeek, N: 42}}
	if len(got) != len(want) {
		t.Fatalf("controls = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("control %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// With the engine paused already (a replay started at a step, a server started paused), p
// resumes it instead of pausing it a second time.
func TestPauseKeyResumesAPausedEngine(t *testing.T) {
	src := newFakeSource()
	m := New(src, Options{Control: true})
	m.status, m.haveStatus = feed.Status{Paused: true, Controllable: true}, true
	cmd := m.onKey(tea.KeyPressMsg{Code: 'p', Text: "p"})
	if cmd == nil {
		t.Fatal("p sent nothing")
	}
	cmd()
	if c := <-src.controls; c.Op != feed.ControlResume {
		t.Errorf("p on a paused engine sent %v, want resume", c)
	}
	if m.frozen != nil {
		t.Errorf("p on a paused engine froze the view")
	}
	// Running again, p pauses and freezes.
	m.status.Paused = false
	m.onKey(tea.KeyPressMsg{Code: 'p', Text: "p"})()
	if c := <-src.controls; c.Op != feed.ControlPause || m.frozen == nil {
		t.Errorf("p on a running engine sent %v, frozen %v; want pause and a frozen view", c, m.frozen != nil)
	}
}
