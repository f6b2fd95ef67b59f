package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os/signal"
	"strings"
	"time"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
	"github.com/kvtop/kvtop/ui"
)

// replayBounds are the ranges of replay's numeric flags; -1 is --step's "not given".
var replayBounds = map[string]bound{
	"speed": floats(0, 1000, true),
	"step":  ints(-1, math.MaxInt64),
}

// replayOptions is what `kvtop replay` was asked to do.
type replayOptions struct {
	path           string
	speed          float64
	paused         bool
	step           int // -1: from the start
	noColor, light bool
}

// parseReplay reads replay's flags; every error is a usage error.
func parseReplay(args []string, stderr io.Writer) (replayOptions, error) {
	fs, o := replayFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return *o, err
	}
	if fs.NArg() != 1 {
		return *o, errors.New("want one recording file (kvtop replay FILE)")
	}
	o.path = fs.Arg(0)
	return *o, checkBounds(fs, replayBounds)
}

// replayFlags registers replay's flags into the options they set.
func replayFlags(stderr io.Writer) (*flag.FlagSet, *replayOptions) {
	fs := flag.NewFlagSet("kvtop replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: kvtop replay [flags] FILE

Plays a recording made with --record back in the dashboard. p pauses and resumes, space
or n plays one engine step, + and - change the speed, g goes to a step.

Flags:
`)
		fs.PrintDefaults()
	}
	o := &replayOptions{}
	fs.Float64Var(&o.speed, "speed", 1, "playback speed, a multiple of the recorded pace")
	fs.BoolVar(&o.paused, "paused", false, "start paused at the first snapshot")
	fs.IntVar(&o.step, "step", -1, "start at this engine step (paused)")
	fs.BoolVar(&o.noColor, "no-color", false, "draw without colour")
	fs.BoolVar(&o.light, "light", false, "styles for a light terminal background")
	return fs, o
}

// runReplay is `kvtop replay FILE`: a recording played back in the dashboard.
func runReplay(args []string, stdout, stderr io.Writer) int {
	o, err := parseReplay(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil && strings.Contains(err.Error(), "flag"):
		return 2 // the flag package has said why
	case err != nil:
		fmt.Fprintf(stderr, "kvtop replay: %v\n", err)
		return 2
	}
	rec, err := record.Open(o.path)
	if err != nil {
		fmt.Fprintf(stderr, "kvtop replay: %v\n", err)
		return 1
	}
	if rec.Truncated != "" {
		fmt.Fprintf(stderr, "kvtop replay: %s: %s\n", o.path, rec.Truncated)
	}
	if _, ok := rec.Find(uint64(o.step), -1); o.step >= 0 && !ok {
		var spans []string
		for _, e := range rec.Epochs() {
			spans = append(spans, fmt.Sprintf("%d-%d", e.First, e.Last))
		}
		fmt.Fprintf(stderr, "kvtop replay: --step %d is outside the recording's steps %s\n", o.step, strings.Join(spans, ", "))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	p := record.NewPlayer(rec, shortPath(o.path), record.PlayerOptions{Speed: o.speed, Paused: o.paused || o.step >= 0})
	go p.Run(ctx)
	if o.step >= 0 {
		_ = p.Control(feed.Control{Op: feed.ControlSeek, N: o.step})
	}
	opts := ui.Options{Control: true, NoColor: o.noColor, Light: o.light, Record: recordIn(".", time.Now)}
	if err := ui.Run(ctx, p, opts); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "kvtop replay: %v\n", err)
		return 1
	}
	return 0
}
