package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
	"github.com/kvtop/kvtop/ui"
)

// runReplay is `kvtop replay FILE`: a recording played back in the dashboard.
func runReplay(args []string, stdout, stderr io.Writer) int {
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
	speed := fs.Float64("speed", 1, "playback speed, a multiple of the recorded pace")
	paused := fs.Bool("paused", false, "start paused at the first snapshot")
	seek := fs.Int("step", -1, "start at this engine step (paused)")
	noColor := fs.Bool("no-color", false, "draw without colour")
	light := fs.Bool("light", false, "styles for a light terminal background")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "kvtop replay: want one recording file (kvtop replay FILE)")
		return 2
	}
	if *speed <= 0 || *speed > 1000 {
		fmt.Fprintf(stderr, "kvtop replay: --speed %v must be in (0, 1000]\n", *speed)
		return 2
	}
	rec, err := record.Open(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "kvtop replay: %v\n", err)
		return 1
	}
	if first, last := rec.Steps(); *seek >= 0 && (uint64(*seek) < first || uint64(*seek) > last) {
		fmt.Fprintf(stderr, "kvtop replay: --step %d is outside the recording's steps %d-%d\n", *seek, first, last)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := record.NewPlayer(rec, shortPath(fs.Arg(0)), record.PlayerOptions{Speed: *speed, Paused: *paused || *seek >= 0})
	go p.Run(ctx)
	if *seek >= 0 {
		_ = p.Control(feed.Control{Op: feed.ControlSeek, N: *seek})
	}
	opts := ui.Options{Control: true, NoColor: *noColor, Light: *light, Record: recordIn(".", time.Now)}
	if err := ui.Run(ctx, p, opts); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "kvtop replay: %v\n", err)
		return 1
	}
	return 0
}
