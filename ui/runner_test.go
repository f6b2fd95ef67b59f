package ui

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
)

var _ Source = (*runner.Local)(nil)

// TestRunnerEndToEnd runs the dashboard on a real runner that starts paused: two
// prep_recv calls wait until the dashboard's single step (n) admits them, and the
// dashboard's view shows them prepared. The program draws in 16 colours, and only in them.
func TestRunnerEndToEnd(t *testing.T) {
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 8192
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := runner.New(e, runner.Config{Clock: time.Now, StartPaused: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	src := r.Local()

	folded := make(chan feed.Update, 64)
	m := New(src, Options{Control: true, OnUpdate: func(u feed.Update) {
		select {
		case folded <- u:
		default:
		}
	}})
	var out syncBuffer
	p := tea.NewProgram(m, tea.WithInput(nil), tea.WithOutput(&out), tea.WithWindowSize(100, 30),
		tea.WithColorProfile(colorprofile.ANSI), tea.WithoutSignals())
	done := make(chan error, 1)
	go func() { _, err := p.Run(); done <- err }()
	within(t, folded, "the first snapshot")

	answers := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := r.PrepRecv(ctx, engine.PrepRecv{ID: fmt.Sprintf("e-%d", i), Prompt: prompt(fmt.Sprint(i), 40, 0), End: -1, HasEnd: true})
			answers <- err
		}()
	}
	// Both arrive while paused; then one step admits both.
	for n := 0; n < 2; {
		u := within(t, folded, "the arrivals")
		for _, ev := range u.Events {
			if _, ok := ev.(engine.RequestArrived); ok {
				n++
			}
		}
	}
	p.Send(keyMsg("n"))
	for range 2 {
		if err := within(t, answers, "the prep_recv answers"); err != nil {
			t.Fatal(err)
		}
	}
	for {
		u := within(t, folded, "the step")
		if stepped(u) {
			break
		}
	}
	p.Quit()
	if err := within(t, done, "the program to end"); err != nil {
		t.Fatal(err)
	}
	src.Close()
	v := m.live.view
	for i := range 2 {
		rv, ok := v.Request(fmt.Sprintf("e-%d", i))
		if !ok || rv.State != engine.StatePrepared {
			t.Errorf("e-%d: %v %v, want prepared", i, ok, rv.State)
		}
	}
	if !m.status.Paused {
		t.Error("the engine's paused status is not known to the dashboard")
	}
	o := out.String()
	for _, c := range sgr.FindAllStringSubmatch(o, -1) {
		for _, bad := range []string{";38;5;", ";38;2;", ";48;5;", ";48;2;"} {
			if strings.Contains(";"+c[1]+";", bad) {
				t.Fatalf("16-colour output has %q", c[0])
			}
		}
	}
	if len(colourCodes(o)) == 0 {
		t.Error("no colour at all in 16-colour output")
	}
}

func stepped(u feed.Update) bool {
	for _, ev := range u.Events {
		if _, ok := ev.(engine.StepCompleted); ok {
			return true
		}
	}
	return false
}
