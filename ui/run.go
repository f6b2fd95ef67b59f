package ui

import (
	"context"
	"errors"
	"os"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/kvtop/kvtop/feed"
)

// Options configure the dashboard.
type Options struct {
	// Name is the instance shown in the header; empty: the source's Link().Name.
	Name string
	// Control says the dashboard may pause, resume and step the engine (embedded, or
	// attached to a --control server). Without it, pause only freezes the dashboard's own
	// view and single steps are refused with a message. A Status from the source saying
	// the viewer may not control the engine overrides it.
	Control bool
	// Profile forces a colour profile. Unknown (the zero value) detects it from the
	// terminal and the environment, NO_COLOR included. colorprofile.ASCII or NoTTY draws
	// without colour; colorprofile.ANSI with the 16 colours.
	Profile colorprofile.Profile
	// NoColor draws without colour whatever the terminal can do.
	NoColor bool
	// Light selects the styles for a light background before the terminal has told its
	// colour (and where it never does).
	Light bool
	// Mouse turns the mouse on: clicks focus panels, select rows and pages, and seek on the
	// charts; the wheel scrolls (mouse.go).
	Mouse bool
	// FPS caps how often data changes are drawn, and how often the terminal is written
	// (default 25).
	FPS int
	// EventLog bounds the event log (default 2048 events).
	EventLog int
	// History bounds what the dashboard keeps to rewind through, and the history charts'
	// span (the zero value: feed.DefaultHistoryLimits, the last 10,000 steps or 64 MB).
	History feed.HistoryLimits
	// OnUpdate, when set, is called with every update taken from the source, before it is
	// folded into the view (for --record). It runs on the dashboard's goroutine: it must
	// not block.
	OnUpdate func(feed.Update)
	// Record, when set, opens a recording when R is pressed, and names it for the header:
	// the dashboard writes to it the history it holds, then every update it folds, until R
	// again or the end. (The command opens a record.Recorder.)
	Record func() (Recorder, string, error)
	// Back, when set, is what esc does when the dashboard has nothing of its own to close:
	// the instance picker (picker.go) takes the dashboard away with it.
	Back tea.Cmd
}

// Run runs the dashboard on the terminal (alternate screen) until the user quits, ctx is
// done or the program fails. It closes src when it returns.
func Run(ctx context.Context, src Source, opts Options) error {
	defer src.Close()
	switch {
	case opts.NoColor:
		opts.Profile = colorprofile.ASCII
	case opts.Profile == colorprofile.Unknown:
		opts.Profile = colorprofile.Detect(os.Stdout, os.Environ())
	}
	m := New(src, opts)
	_, err := tea.NewProgram(m, programOptions(ctx, opts)...).Run()
	if rerr := m.finishRecording(); err == nil {
		err = rerr
	}
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// programOptions are the Bubble Tea program's options for the dashboard. The renderer
// runs at the dashboard's frame rate, not at Bubble Tea's 60: its ticker wakes the program
// at that rate for as long as it runs, with or without anything to draw (Bubble Tea v2.1;
// BENCHMARKS.md has the cost), and data is drawn at most FPS times a second anyway.
func programOptions(ctx context.Context, opts Options) []tea.ProgramOption {
	fps := opts.FPS
	if fps <= 0 {
		fps = defaultFPS
	}
	return []tea.ProgramOption{tea.WithContext(ctx), tea.WithColorProfile(opts.Profile), tea.WithFPS(fps)}
}
