package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/tracing"
	"github.com/kvtop/kvtop/ui"
	"github.com/kvtop/kvtop/wire"
)

// demoStepsPerSec paces the demo's engine so a person can follow it.
const demoStepsPerSec = 20

// dashboardBounds are the ranges of the dashboard command's own numeric flags.
var dashboardBounds = map[string]bound{
	"speed": floats(0, maxRate, true),
}

// dashboardConfig is what the dashboard command was asked to do.
type dashboardConfig struct {
	attach   string
	token    string
	scenario sim.Scenario
	opts     sim.Options
	engine   engine.Config
	rate     float64
	record   string
	ui       ui.Options
	otlp     string // the demo's request traces go here over OTLP/HTTP; empty: none
}

// parseDashboard reads the dashboard command's flags: the demo's (a scenario and the engine
// settings) or --attach's.
func parseDashboard(args []string, stderr io.Writer) (dashboardConfig, error) {
	fs, build := dashboardFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return dashboardConfig{}, err
	}
	if fs.NArg() > 0 {
		return dashboardConfig{}, fmt.Errorf("unexpected argument %q (commands: serve, replay, help)", fs.Arg(0))
	}
	return build()
}

// dashboardFlags registers the dashboard command's flags and returns the function that
// checks them once parsed.
func dashboardFlags(stderr io.Writer) (*flag.FlagSet, func() (dashboardConfig, error)) {
	fs := flag.NewFlagSet("kvtop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage:
  kvtop [--scenario NAME] [engine flags]   the demo: an embedded engine under a built-in workload
  kvtop --attach HOST:PORT [--token T]     the dashboard on a running 'kvtop serve'

The demo's scenarios (--scenario):
`)
		for _, s := range sim.Scenarios() {
			fmt.Fprintf(stderr, "  %-14s %s\n", s.Name, s.Summary)
		}
		fmt.Fprint(stderr, "\nFlags:\n")
		fs.PrintDefaults()
	}
	attach := fs.String("attach", "", "attach to a running 'kvtop serve' at HOST:PORT (or a ws://, wss://, http:// URL)")
	token := fs.String("token", "", "bearer token for --attach (default $KVTOP_TOKEN)")
	scenario := fs.String("scenario", "chat", "the demo's workload (see above)")
	tracePath := fs.String("trace", "", "the trace scenario's Mooncake-format JSONL file")
	speed := fs.Float64("speed", 1, "the trace scenario's time scale (2 replays twice as fast)")
	rec := fs.String("record", "", "write what the dashboard receives to FILE (play it back with 'kvtop replay FILE')")
	noColor := fs.Bool("no-color", false, "draw without colour (NO_COLOR in the environment does too)")
	light := fs.Bool("light", false, "styles for a light terminal background")
	mouse := fs.Bool("mouse", false, "use the mouse: click panels, rows, pages and the charts (to rewind); the wheel scrolls")
	otlp := fs.String("otlp-endpoint", "", "the demo: export a trace of every request's lifecycle over OTLP/HTTP to this URL, http(s)://HOST:PORT[/PATH] (as 'kvtop serve --otlp-endpoint'); off by default")
	buildEngine := engineFlags(fs)
	return fs, func() (dashboardConfig, error) {
		var dc dashboardConfig
		if err := checkBounds(fs, engineBounds, dashboardBounds); err != nil {
			return dc, err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		dc.attach, dc.token, dc.record = *attach, *token, *rec
		if dc.token == "" {
			dc.token = os.Getenv("KVTOP_TOKEN")
		}
		dc.ui = ui.Options{NoColor: *noColor, Light: *light, Mouse: *mouse}
		if dc.attach != "" {
			for name := range set {
				if name != "attach" && name != "token" && name != "record" && name != "no-color" && name != "light" && name != "mouse" {
					return dc, fmt.Errorf("--%s is for the demo; with --attach the server's settings apply", name)
				}
			}
			if _, err := wire.StreamURL(dc.attach); err != nil {
				return dc, err
			}
			return dc, nil
		}
		if set["token"] {
			return dc, errors.New("--token is for --attach")
		}
		if dc.otlp = *otlp; dc.otlp != "" {
			if _, err := tracing.ParseEndpoint(dc.otlp); err != nil {
				return dc, fmt.Errorf("--otlp-endpoint: %w", err)
			}
		}
		sc, err := sim.Lookup(*scenario)
		if err != nil {
			return dc, err
		}
		if *tracePath != "" && sc.Name != "trace" {
			return dc, fmt.Errorf("--trace is for --scenario trace")
		}
		base := engine.DefaultConfig()
		sc.Configure(&base)
		cfg, rate, err := buildEngine(base)
		if err != nil {
			return dc, err
		}
		if !set["steps-per-sec"] {
			rate = demoStepsPerSec
		}
		dc.scenario, dc.engine, dc.rate = sc, cfg, rate
		dc.opts = sim.Options{Seed: cfg.Seed, TracePath: *tracePath, Speed: *speed}
		return dc, nil
	}
}

// runDashboard is `kvtop` (the demo) and `kvtop --attach`.
func runDashboard(args []string, stdout, stderr io.Writer) int {
	dc, err := parseDashboard(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtop: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	if dc.attach != "" {
		if fleet, ok := attachedTap(ctx, dc.attach, dc.token); ok {
			// A kvtop tap: the instance picker, each instance's dashboard under it.
			if err := ui.RunPicker(ctx, fleet, dc.ui); err != nil && !errors.Is(err, context.Canceled) {
				fmt.Fprintf(stderr, "kvtop: %v\n", err)
				return 1
			}
			return 0
		}
	}
	src, name, control, after, err := dashboardSource(ctx, dc, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvtop: %v\n", err)
		return 1
	}
	defer func() {
		stop() // the engine stops with ctx
		after()
	}()
	opts := dc.ui
	opts.Name, opts.Control = name, control
	opts.Record = recordIn(".", time.Now)
	if dc.record != "" {
		rec, closeRec, err := startRecording(ctx, dc.record)
		if err != nil {
			src.Close()
			fmt.Fprintf(stderr, "kvtop: %v\n", err)
			return 1
		}
		defer func() {
			if err := closeRec(); err != nil {
				fmt.Fprintf(stderr, "kvtop: %v\n", err)
			}
		}()
		opts.OnUpdate = func(u feed.Update) { _ = rec.Write(u) }
	}
	if err := ui.Run(ctx, src, opts); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "kvtop: %v\n", err)
		return 1
	}
	return 0
}

// stopSignals are the signals that end the dashboard cleanly, its recording flushed: every
// one kvtop can catch that means "stop" (SIGHUP: the terminal closed, the ssh session
// dropped), rather than dying on its default action with the recording in a buffer.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// startRecording creates a recording and flushes it the moment ctx ends (a signal), before
// the dashboard winds down; the returned function closes it. The recorder itself flushes
// within record.FlushEvery, which is what a kill -9 leaves.
func startRecording(ctx context.Context, path string) (*record.Recorder, func() error, error) {
	rec, err := record.Create(path)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = rec.Flush()
		case <-done:
		}
	}()
	return rec, func() error { close(done); return rec.Close() }, nil
}

// dashboardSource starts what the dashboard draws: the demo's engine and workload, or the
// client attached to a server. after is to be called once ctx is done: it waits for the
// demo's engine to stop and sends its last request traces, if any, saying on stderr what
// became of them (the dashboard has the terminal while it runs, so the tracer logs nothing).
func dashboardSource(ctx context.Context, dc dashboardConfig, stderr io.Writer) (src ui.Source, name string, control bool, after func(), err error) {
	after = func() {}
	if dc.attach != "" {
		opts := wire.ClientOptions{Token: dc.token}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := wire.Dial(dctx, dc.attach, opts)
		switch {
		case err == nil:
			// The server's status says whether this client may control it.
			return c, "", true, after, nil
		case errors.Is(err, wire.ErrUnauthorized):
			return nil, "", false, after, fmt.Errorf("attach %s: the server refused the token (pass the one 'kvtop serve --token' was given, with --token or $KVTOP_TOKEN)", dc.attach)
		case errors.Is(err, wire.ErrVersion), errors.Is(err, wire.ErrForbidden):
			return nil, "", false, after, fmt.Errorf("attach %s: %w", dc.attach, err)
		}
		// Not reachable yet: say so, and keep trying in the dashboard, which shows it.
		fmt.Fprintf(stderr, "kvtop: cannot reach %s yet (%v); retrying in the dashboard\n", dc.attach, err)
		c, err = wire.Attach(dc.attach, opts)
		if err != nil {
			return nil, "", false, after, err
		}
		return c, "", true, after, nil
	}
	e, err := engine.New(dc.engine)
	if err != nil {
		return nil, "", false, after, err
	}
	w, err := dc.scenario.New(dc.opts)
	if err != nil {
		return nil, "", false, after, err
	}
	var observers []runner.Observer
	var tr *tracing.Tracer
	if dc.otlp != "" {
		if tr, err = tracing.Start(tracing.Config{Endpoint: dc.otlp, Version: version}); err != nil {
			return nil, "", false, after, err
		}
		observers = append(observers, tr)
	}
	drv := sim.NewDriver(w, dc.scenario.Driver)
	r := runner.New(e, runner.Config{StepsPerSec: dc.rate, Clock: time.Now, Hook: sim.NewHook(drv), Observers: observers})
	go r.Run(ctx)
	if tr != nil {
		after = func() {
			<-r.Done()
			err := tr.Close()
			st := tr.Stats()
			fmt.Fprintf(stderr, "kvtop: request traces: %d of %d spans exported, %d exports failed, %d events dropped\n",
				st.Exported, st.Spans, st.ExportFailures, st.DroppedEvents)
			if err != nil {
				fmt.Fprintf(stderr, "kvtop: request traces: %v\n", err)
			}
		}
	}
	name = "embedded · " + dc.scenario.Name
	if dc.scenario.Name == "trace" {
		name += " " + shortPath(dc.opts.TracePath)
	}
	return r.Local(), name, true, after, nil
}

func shortPath(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
