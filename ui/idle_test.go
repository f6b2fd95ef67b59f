package ui

import (
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
)

// countingWriter counts what the program writes to the terminal.
type countingWriter struct {
	mu sync.Mutex
	n  int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += len(p)
	return len(p), nil
}

func (c *countingWriter) written() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// An idle dashboard writes nothing: once the frame is drawn, with nothing arriving from the
// source, the terminal gets no byte for two of the link's polls (the once-a-second timer and
// Bubble Tea's renderer, which finds the frame unchanged, are all that wake the program
// then: BenchmarkIdleCPU measures what that costs), overview, charts and all.
func TestIdleWritesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits two seconds")
	}
	s := longRun(t)
	src := newFakeSource()
	m := New(src, Options{Name: "idle", Control: true})
	var out countingWriter
	p := tea.NewProgram(m, tea.WithInput(nil), tea.WithOutput(&out), tea.WithWindowSize(200, 60),
		tea.WithColorProfile(colorprofile.ANSI256), tea.WithoutSignals())
	errc := make(chan error, 1)
	go func() { _, err := p.Run(); errc <- err }()
	defer src.Close()
	src.push(s.update())
	// The first frame, drawn: wait until the output stops growing.
	for last := -1; ; {
		time.Sleep(200 * time.Millisecond)
		if n := out.written(); n == last && n > 0 {
			break
		} else {
			last = n
		}
	}
	before := out.written()
	time.Sleep(2100 * time.Millisecond)
	idle := out.written() - before
	p.Quit()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("first frame %d bytes; idle for 2.1 s: %d bytes (%.0f bytes/s)", before, idle, float64(idle)/2.1)
	if idle != 0 {
		t.Errorf("the idle dashboard wrote %d bytes in 2.1 s, want none", idle)
	}
}
