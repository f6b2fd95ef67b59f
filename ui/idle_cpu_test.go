//go:build unix

package ui

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
)

// BenchmarkIdleCPU measures the CPU time the dashboard's process spends while it has nothing
// to draw: the dashboard, paused, nothing arriving from its source, over KVTOP_IDLE (60s for
// the figure in BENCHMARKS.md); the process's user and system time by getrusage, as a share
// of one core over that wall time. Without KVTOP_IDLE it is skipped (it takes minutes):
//
//	KVTOP_IDLE=60s go test ./ui -run '^$' -bench IdleCPU -benchtime 1x
//
// Beside the dashboard it measures a bare Bubble Tea program (a view that never changes, no
// commands: what the library costs by itself), at its default frame rate and at 1 FPS: the
// difference is the renderer's ticker, which Bubble Tea v2 runs at the frame rate for as long
// as the program runs (tea.go, startRenderer), whether or not there is anything to draw.
func BenchmarkIdleCPU(b *testing.B) {
	d, err := time.ParseDuration(os.Getenv("KVTOP_IDLE"))
	if err != nil {
		b.Skip("KVTOP_IDLE (a duration) is not set: nothing measured")
	}
	s := longRun(b)
	dashboard := func() tea.Model {
		src := newFakeSource()
		src.push(s.update())
		return New(src, Options{Name: "idle", Control: true, Profile: colorprofile.ANSI256})
	}
	run := programOptions(context.Background(), Options{Profile: colorprofile.ANSI256})
	for _, c := range []struct {
		name  string
		model func() tea.Model
		opts  []tea.ProgramOption
		pause bool
	}{
		// As Run runs it: the renderer at the dashboard's frame rate, 25 FPS.
		{"dashboard-paused", dashboard, run, true},
		// At Bubble Tea's default frame rate, 60 FPS, as before; and at 1 FPS, which no
		// one would run (keys would take up to a second to show) but which leaves the
		// dashboard's own cost: the link's poll, once a second.
		{"dashboard-paused-60fps", dashboard, append(run[:len(run):len(run)], tea.WithFPS(60)), true},
		{"dashboard-paused-1fps", dashboard, append(run[:len(run):len(run)], tea.WithFPS(1)), true},
		{"bubbletea-bare", func() tea.Model { return staticModel{} }, nil, false},
		{"bubbletea-bare-1fps", func() tea.Model { return staticModel{} }, []tea.ProgramOption{tea.WithFPS(1)}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var out countingWriter
				opts := append(c.opts, tea.WithInput(nil), tea.WithOutput(&out), tea.WithWindowSize(200, 60), tea.WithoutSignals())
				p := tea.NewProgram(c.model(), opts...)
				done := make(chan error, 1)
				go func() { _, err := p.Run(); done <- err }()
				// Drawn: the output has stopped growing.
				for last := -1; ; {
					time.Sleep(500 * time.Millisecond)
					if n := out.written(); n == last && n > 0 {
						break
					} else {
						last = n
					}
				}
				if c.pause {
					p.Send(tea.KeyPressMsg{Code: 'p', Text: "p"})
					time.Sleep(2 * time.Second)
				}
				written := out.written()
				cpu0, t0 := processCPU(b), time.Now()
				time.Sleep(d)
				cpu, wall := processCPU(b)-cpu0, time.Since(t0)
				written = out.written() - written
				p.Quit()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%-of-a-core")
				b.ReportMetric(float64(written)/wall.Seconds(), "bytes/s")
			}
		})
	}
}

// processCPU returns the user and system time the process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// staticModel is a Bubble Tea program that draws one view and never changes it.
type staticModel struct{}

func (staticModel) Init() tea.Cmd { return nil }

func (m staticModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) { return m, nil }

func (staticModel) View() tea.View {
	v := tea.NewView("nothing changes here")
	v.AltScreen = true
	return v
}
