package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/wire"
)

// serveOptions is what `kvtop serve` was asked to do.
type serveOptions struct {
	listen  string
	token   string
	control bool
	paused  bool
	verbose bool
	engine  engine.Config
	rate    float64
	limits  wire.Limits
	trace   int
	// maxWaiting bounds the prep_recv calls waiting for admission (503 beyond).
	maxWaiting int
	// drivers run once the server listens, each on its own goroutine, with the server's
	// base URL ("http://127.0.0.1:7070") and token, until ctx ends. This is the hook for
	// `--drive SCENARIO`: a simulated router and prefill instance driving the server over
	// HTTP as real ones would. An error is logged; the server goes on.
	drivers []func(ctx context.Context, baseURL, token string) error
	// eco is what the ecosystem flags ask for (ecosystem.go): KV events, request traces.
	eco ecoOptions
}

const serveUsage = `Usage: kvtop serve [flags]

Runs the engine headless as the decode instance (D) of disaggregated serving, with MLC's
microserving API, and streams its step events to dashboards ('kvtop --attach HOST:PORT').

  POST /microserving/prep_recv       {"user", "prompt", "end", "max_tokens", "n"}: answers
                                     {prompt_length, prefix_matched_length, kv_append_metadata}
                                     once admitted
  POST /microserving/start_generate  {"user", "begin", "stream"}: an OpenAI completion, or SSE
  POST /microserving/remote_send     refused: that is the prefill instance's call
  POST /v1/kv                        KV arrival: headers KV-Append-Metadata, KV-Offset, KV-Tokens;
                                     body the raw KV bytes (empty with no --arena)
  POST /debug/abort                  {"user"}
  POST /debug/dump_event_trace       recent request lifecycles, Chrome trace JSON (Perfetto)
  GET  /v1/snapshot  /healthz  /metrics (Prometheus)
  GET  /v1/stream                    the websocket the dashboard attaches to

Security: the server listens on loopback by default. Any other address needs --token; then
every call and the stream's handshake must send "Authorization: Bearer TOKEN". Without a
token a call must name this machine (or the --listen host) in its Host header. Browser pages
from other origins can neither open the stream nor make calls that change state, and JSON
calls must be sent as Content-Type: application/json (curl -H 'Content-Type: application/json').

Flags:
`

// parseServe reads serve's flags. Every bad value is an error here, before anything starts.
func parseServe(args []string, stderr io.Writer) (serveOptions, error) {
	fs, build := serveFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return serveOptions{}, err
	}
	if fs.NArg() > 0 {
		return serveOptions{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return build()
}

// defaultMaxWaiting is --max-waiting's default: a queue far longer than a decode instance
// admits from in a while, yet a bounded amount of memory (the prompts, the calls' goroutines).
const defaultMaxWaiting = 512

// serveBounds are the ranges of serve's own numeric flags.
var serveBounds = map[string]bound{
	"max-body":       ints(1, 1<<30),
	"max-kv-body":    ints(1, 1<<32),
	"max-ws-message": ints(1, 1<<26),
	"max-tokens":     ints(1, 1<<20),
	"max-waiting":    ints(1, 1<<20),
	"header-timeout": durations(time.Millisecond, maxDay),
	"ping":           durations(10*time.Millisecond, maxDay),
	"write-timeout":  durations(time.Millisecond, maxDay),
	"frame-events":   ints(1, 1<<20),
	"trace-requests": ints(1, 1<<20),
	"speed":          floats(0, maxRate, true),
}

// serveFlags registers serve's flags and returns the function that checks them once parsed.
func serveFlags(stderr io.Writer) (*flag.FlagSet, func() (serveOptions, error)) {
	fs := flag.NewFlagSet("kvtop serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, serveUsage)
		fs.PrintDefaults()
	}
	d := wire.DefaultLimits()
	listen := fs.String("listen", "127.0.0.1:7070", "address to listen on, HOST:PORT; a non-loopback HOST requires --token")
	token := fs.String("token", "", "bearer token required on every call and on the stream (default $KVTOP_TOKEN)")
	control := fs.Bool("control", false, "let dashboards pause, resume and step the engine (read-only otherwise)")
	paused := fs.Bool("paused", false, "start with the engine paused (with --control, a dashboard steps it)")
	verbose := fs.Bool("verbose", false, "log stream clients that fail and answers that could not be delivered")
	maxBody := fs.Int64("max-body", d.MaxBodyBytes, "largest JSON request body, in bytes (413 beyond)")
	maxKV := fs.Int64("max-kv-body", d.MaxKVBytes, "largest KV write body, in bytes; larger transfers come in several writes with KV-Offset")
	maxMsg := fs.Int64("max-ws-message", d.MaxMessageBytes, "largest websocket message a dashboard may send, in bytes")
	maxTokens := fs.Int("max-tokens", d.MaxTokens, "largest max_tokens a request may ask for")
	headerTimeout := fs.Duration("header-timeout", d.HeaderTimeout, "time a connection has to send its request headers")
	ping := fs.Duration("ping", d.PingInterval, "keep-alive ping interval of the stream; a dashboard silent for two is closed")
	writeTimeout := fs.Duration("write-timeout", d.WriteTimeout, "time one write to a dashboard may take before it is closed")
	frameEvents := fs.Int("frame-events", d.FrameEvents, "most events in one stream frame")
	trace := fs.Int("trace-requests", 1024, "recent requests kept for /debug/dump_event_trace")
	maxWaiting := fs.Int("max-waiting", defaultMaxWaiting, "most prep_recv calls waiting for admission at once; more are answered 503 with Retry-After")
	drive := fs.String("drive", "", "drive the server with a built-in scenario's simulated router and prefill instance, over HTTP: "+scenarioNames())
	tracePath := fs.String("trace", "", "with --drive trace: the Mooncake-format JSONL file")
	speed := fs.Float64("speed", 1, "with --drive trace: the time scale (2 replays twice as fast)")
	buildEngine := engineFlags(fs)
	buildEco := ecoFlags(fs, ecoServe)
	return fs, func() (serveOptions, error) {
		if err := checkBounds(fs, engineBounds, serveBounds, ecoBounds); err != nil {
			return serveOptions{}, err
		}
		eco, err := buildEco()
		if err != nil {
			return serveOptions{}, err
		}
		base := engine.DefaultConfig()
		var drivers []func(context.Context, string, string) error
		if *drive != "" {
			sc, err := sim.Lookup(*drive)
			if err != nil {
				return serveOptions{}, fmt.Errorf("--drive: %w", err)
			}
			// The scenario's engine settings apply unless a flag overrides them.
			sc.Configure(&base)
			drivers = append(drivers, func(ctx context.Context, url, token string) error {
				return driveHTTP(ctx, url, token, sc, sim.Options{Seed: base.Seed, TracePath: *tracePath, Speed: *speed})
			})
			if sc.Name == "trace" {
				// Read the trace now, so that a bad file is an error before anything starts.
				if _, err := sc.New(sim.Options{TracePath: *tracePath, Speed: *speed}); err != nil {
					return serveOptions{}, err
				}
			}
		} else if *tracePath != "" {
			return serveOptions{}, errors.New("--trace is for --drive trace")
		}
		o, err := checkServe(serveOptions{listen: *listen, token: *token, control: *control, paused: *paused, verbose: *verbose, trace: *trace, maxWaiting: *maxWaiting,
			limits: wire.Limits{MaxBodyBytes: *maxBody, MaxKVBytes: *maxKV, MaxMessageBytes: *maxMsg, MaxTokens: *maxTokens,
				HeaderTimeout: *headerTimeout, PingInterval: *ping, WriteTimeout: *writeTimeout, FrameEvents: *frameEvents}},
			func() (engine.Config, float64, error) { return buildEngine(base) })
		o.drivers = append(o.drivers, drivers...)
		o.eco = eco
		rateSet := false
		fs.Visit(func(f *flag.Flag) { rateSet = rateSet || f.Name == "steps-per-sec" })
		if len(drivers) > 0 && !rateSet {
			// A simulated workload at full speed is over before anyone can watch it.
			o.rate = demoStepsPerSec
		}
		return o, err
	}
}

// scenarioNames lists the built-in scenarios for --help.
func scenarioNames() string {
	var names []string
	for _, s := range sim.Scenarios() {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// checkServe validates the options and builds the engine's configuration.
func checkServe(o serveOptions, buildEngine func() (engine.Config, float64, error)) (serveOptions, error) {
	var err error
	if o.engine, o.rate, err = buildEngine(); err != nil {
		return o, err
	}
	if o.token == "" {
		o.token = os.Getenv("KVTOP_TOKEN")
	}
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return o, fmt.Errorf("--listen %q: want HOST:PORT: %v", o.listen, err)
	}
	if !loopback(host) && o.token == "" {
		where := host
		if where == "" {
			where = "every interface"
		}
		return o, fmt.Errorf("--listen %s is not a loopback address (%s): anyone who can reach it could drive the engine; pass --token (or set $KVTOP_TOKEN), or listen on 127.0.0.1", o.listen, where)
	}
	return o, nil
}

// loopback reports whether a listen host is this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveCommand parses the flags and serves until ctx ends; it returns the exit status.
func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseServe(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtop serve: %v\n", err)
		return 2
	}
	s, err := startServer(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvtop serve: %v\n", err)
		return 1
	}
	mode := "read-only (--control lets dashboards pause, resume and step)"
	if o.control {
		mode = "dashboards may pause, resume and step"
	}
	fmt.Fprintf(stdout, "kvtop serve: decode instance listening on %s\n  dashboards: kvtop --attach %s (%s)\n",
		s.URL(), s.Addr(), mode)
	s.eco.describe(stdout)
	if err := s.Wait(); err != nil {
		fmt.Fprintf(stderr, "kvtop serve: %v\n", err)
		return 1
	}
	return 0
}

// server is a running `kvtop serve`: the runner, the wire server, the HTTP server, and the
// drivers.
type server struct {
	ln      net.Listener
	hs      *http.Server
	ws      *wire.Server
	r       *runner.Runner
	stopRun context.CancelFunc
	served  chan error
	drivers sync.WaitGroup
	ctx     context.Context
	stopDrv context.CancelFunc
	eco     *ecosystem
}

// startServer starts the engine and listens; it returns once the address is bound, and the
// server runs until ctx ends.
func startServer(ctx context.Context, o serveOptions, stderr io.Writer) (*server, error) {
	e, err := engine.New(o.engine)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, err
	}
	eco := &ecosystem{}
	if err := eco.start(o.eco, stderr, o.verbose); err != nil {
		ln.Close()
		return nil, err
	}
	r := runner.New(e, runner.Config{StepsPerSec: o.rate, Clock: time.Now, StartPaused: o.paused, MaxWaiting: o.maxWaiting, Observers: eco.observers})
	rctx, stopRun := context.WithCancel(context.Background())
	go r.Run(rctx)
	opts := wire.Options{Token: o.token, Control: o.control, Version: "kvtop " + version, Limits: o.limits, TraceRequests: o.trace}
	if host, _, err := net.SplitHostPort(o.listen); err == nil && host != "" {
		opts.Hosts = []string{host} // the name dashboards and routers were told to use
	}
	if o.verbose {
		opts.Logf = log.New(stderr, "kvtop serve: ", log.LstdFlags).Printf
	}
	eco.wire(&opts)
	ws := wire.NewServer(r, opts)
	ws.Registry().MustRegister(eco.collectors...)
	dctx, stopDrv := context.WithCancel(ctx)
	s := &server{ln: ln, hs: wire.NewHTTPServer(ws, o.limits), ws: ws, r: r, stopRun: stopRun,
		served: make(chan error, 1), ctx: ctx, stopDrv: stopDrv, eco: eco}
	go func() { s.served <- s.hs.Serve(ln) }()
	for _, d := range o.drivers {
		s.drivers.Add(1)
		go func() {
			defer s.drivers.Done()
			if err := d(dctx, s.URL(), o.token); err != nil && dctx.Err() == nil {
				fmt.Fprintf(stderr, "kvtop serve: driver: %v\n", err)
			}
		}()
	}
	return s, nil
}

// Addr is the bound address, HOST:PORT.
func (s *server) Addr() string { return s.ln.Addr().String() }

// URL is the base URL of the HTTP API.
func (s *server) URL() string { return "http://" + s.Addr() }

// Wait serves until ctx ends (nil) or the listener fails, then shuts down: the stream
// connections first, then the engine (so that calls waiting for it return), then the HTTP
// server, giving calls in flight a few seconds.
func (s *server) Wait() error {
	var err error
	select {
	case <-s.ctx.Done():
	case err = <-s.served:
		err = fmt.Errorf("serving: %w", err)
	}
	s.stopDrv()
	s.ws.Close()
	s.stopRun()
	<-s.r.Done()
	if eerr := s.eco.close(); eerr != nil && err == nil {
		err = eerr
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := s.hs.Shutdown(sctx); serr != nil {
		s.hs.Close()
	}
	s.drivers.Wait()
	if err != nil && !strings.Contains(err.Error(), http.ErrServerClosed.Error()) {
		return err
	}
	return nil
}
