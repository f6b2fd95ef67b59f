package ui

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/kvtop/kvtop/feed"
)

// syncBuffer is the program's output, read by the test once the program is done.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// within waits for a channel; the deadline only keeps a broken test from hanging.
func within[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// TestProgram runs the dashboard as a real tea.Program without a terminal (output to a
// buffer, a fixed window size, no colour) on a scripted engine, and drives it with keys:
// panel switching, filter, sort, pause (freezing the view and pausing the engine), single
// step, detail and back, quit.
func TestProgram(t *testing.T) {
	s := watermark(t)
	src := newFakeSource()
	folded := make(chan feed.Update, 16)
	m := New(src, Options{Name: "test", Control: true, OnUpdate: func(u feed.Update) { folded <- u }})
	var out syncBuffer
	p := tea.NewProgram(m, tea.WithInput(nil), tea.WithOutput(&out), tea.WithWindowSize(100, 30),
		tea.WithColorProfile(colorprofile.ASCII), tea.WithoutSignals())
	done := make(chan *Model, 1)
	errc := make(chan error, 1)
	go func() {
		final, err := p.Run()
		errc <- err
		fm, _ := final.(*Model)
		done <- fm
	}()
	defer src.Close()

	src.push(s.update())
	within(t, folded, "the first update")

	send := func(keys ...string) {
		for _, k := range keys {
			p.Send(keyMsg(k))
		}
	}
	send("2", "3", "tab", "1")                                 // panels
	send("/", "^", "r", "-", "3", "[", "6", "7", "]", "enter") // filter: r-36, r-37
	send("j", "k")                                             // choose the top row, r-37
	send("s")                                                  // sort: arrival
	send("p")                                                  // pause
	if c := within(t, src.controls, "the pause control"); c.Op != feed.ControlPause {
		t.Fatalf("control %v, want pause", c)
	}
	mark := s.mark()
	s.receive("r-00", 1, 1)
	src.push(s.delta(mark))
	within(t, folded, "an update while paused")
	send("n")
	if c := within(t, src.controls, "the step control"); c != (feed.Control{Op: feed.ControlStep, N: 1}) {
		t.Fatalf("control %v, want step 1", c)
	}
	send("enter", "esc", "enter") // detail of the selected request, back, and in again
	p.Quit()
	if err := within(t, errc, "the program to end"); err != nil {
		t.Fatal(err)
	}
	fm := within(t, done, "the final model")

	if fm.active != panelDetail || fm.back != panelRequests {
		t.Errorf("panel %s (back %s), want detail from requests", panelNames[fm.active], panelNames[fm.back])
	}
	if fm.requests.filter.text != "^r-3[67]" || len(fm.requests.rows) != 2 {
		t.Errorf("filter %q with %d rows, want ^r-3[67] with 2", fm.requests.filter.text, len(fm.requests.rows))
	}
	if fm.requests.sort != sortArrival || fm.requests.row(0).r.ID != "r-36" {
		t.Errorf("sort %s, first %s; want arrival, r-36", sortNames[fm.requests.sort], fm.requests.row(0).r.ID)
	}
	if fm.detail.id != "r-37" {
		t.Errorf("detail of %q, want r-37 (the selection follows its request through the re-sort)", fm.detail.id)
	}
	if fm.frozen == nil || fm.behind == 0 {
		t.Errorf("frozen %v with %d events behind; want frozen with the KV write behind", fm.frozen != nil, fm.behind)
	}
	if r, _ := fm.frozen.view.Request("r-00"); r.Received != 0 {
		t.Errorf("the frozen view shows r-00 with %d received, want 0", r.Received)
	}
	if !fm.refreeze {
		t.Error("a step asked while frozen should refresh the frozen view when it arrives")
	}
	o := out.String()
	if bad := colourCodes(o); len(bad) > 0 {
		t.Errorf("ASCII profile output has colour codes: %q", bad[:min(len(bad), 5)])
	}
	for _, want := range []string{"PAUSED", "r-37", "watermark"} {
		if !strings.Contains(o, want) {
			t.Errorf("the terminal never showed %q", want)
		}
	}
}
