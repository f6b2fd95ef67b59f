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
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/kvevents"
	"github.com/kvtop/kvtop/tap"
	"github.com/kvtop/kvtop/wire"
)

const tapUsage = `Usage: kvtop tap --listen HOST:PORT [--upstream [LISTEN=]URL ...] [engine flags]

Watches a real MLC deployment: an HTTP proxy between MLC's router and its prefill (P) and
decode (D) instances that forwards every call unchanged and runs a shadow engine per D, fed
with what it sees, so the dashboard shows D's queues, pages, prefix tree and why each
waiting request waits. The engine flags describe D's configuration (MLC's names; one for
every D, --instance-config for the odd one).

Forward-proxy mode (the default): start MLC's router with HTTP_PROXY=http://HOST:PORT
(with --token: http://tap:TOKEN@HOST:PORT); the tap learns the instances from the traffic.

Reverse-proxy mode: --upstream http://d0:8000 (repeatable) serves one port per upstream and
forwards every call to it; point the router at those ports instead. LISTEN=URL names the
port; without it the ports follow --listen's: 7072, 7073, … for --listen :7071.

KV events (--kv-events tcp://HOST:PORT): each D's blocks, as its shadow holds them, in
vLLM's KV-event format for llm-d's or Dynamo's indexer, a topic an instance.

The tap's own API, on --listen: GET /healthz, /v1/instances, /v1/snapshot?instance=HOST:PORT,
/v1/stream?instance=HOST:PORT, /metrics. Dashboards: kvtop --attach HOST:PORT (an instance
picker). Security as kvtop serve's: loopback by default; any other address needs --token.

Flags:
`

// tapOptions is what `kvtop tap` was asked to do.
type tapOptions struct {
	listen    string
	token     string
	upstreams []upstream
	engine    engine.Config
	instances map[string]engine.Config
	queue     int
	verbose   bool
	ui        bool
	eco       ecoOptions // KV events
}

// upstream is one reverse-proxy port.
type upstream struct {
	listen string
	url    string
}

// repeated is a flag that may be given more than once.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

var tapBounds = map[string]bound{
	"queue": ints(1, 1<<24),
}

// parseTap reads tap's flags; every bad value is an error here, before anything starts.
func parseTap(args []string, stderr io.Writer) (tapOptions, error) {
	fs := flag.NewFlagSet("kvtop tap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, tapUsage)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:7071", "the tap's address, HOST:PORT: the proxy (HTTP_PROXY) and its API; a non-loopback HOST requires --token")
	token := fs.String("token", "", "token required on the API (Authorization: Bearer) and on proxied calls (the proxy password) (default $KVTOP_TOKEN)")
	var ups, insts repeated
	fs.Var(&ups, "upstream", "reverse-proxy mode: [LISTEN=]URL of a decode instance (repeatable)")
	fs.Var(&insts, "instance-config", "HOST:PORT=FLAGS: engine flags for one instance over the shared ones, e.g. 'd1:8000=--max-total-seq-len 65536' (repeatable)")
	queue := fs.Int("queue", 4096, "observations each shadow may have waiting; beyond, they are dropped and the shadow starts over")
	verbose := fs.Bool("verbose", false, "log what callers cannot see (shadows that could not apply an observation, stream clients that failed)")
	withUI := fs.Bool("ui", false, "open the dashboard (the instance picker) in this terminal as well")
	buildEngine := engineFlags(fs)
	buildEco := ecoFlags(fs, ecoTap)
	if err := fs.Parse(args); err != nil {
		return tapOptions{}, err
	}
	if fs.NArg() > 0 {
		return tapOptions{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := checkBounds(fs, engineBounds, tapBounds, ecoBounds); err != nil {
		return tapOptions{}, err
	}
	o := tapOptions{listen: *listen, token: *token, queue: *queue, verbose: *verbose, ui: *withUI, instances: map[string]engine.Config{}}
	var err error
	if o.eco, err = buildEco(); err != nil {
		return o, err
	}
	if o.engine, _, err = buildEngine(engine.DefaultConfig()); err != nil {
		return o, err
	}
	if o.token == "" {
		o.token = os.Getenv("KVTOP_TOKEN")
	}
	host, port, err := net.SplitHostPort(o.listen)
	if err != nil {
		return o, fmt.Errorf("--listen %q: want HOST:PORT: %v", o.listen, err)
	}
	if !loopback(host) && o.token == "" {
		return o, fmt.Errorf("--listen %s is not a loopback address: anyone who can reach it could use the tap as a proxy and read its shadows; pass --token (or set $KVTOP_TOKEN), or listen on 127.0.0.1", o.listen)
	}
	for i, u := range ups {
		up := upstream{url: u}
		if l, rest, ok := strings.Cut(u, "="); ok && !strings.Contains(l, "://") {
			up.listen, up.url = l, rest
		} else {
			p, err := strconv.Atoi(port)
			if err != nil || p == 0 {
				return o, fmt.Errorf("--upstream %s: give its port (LISTEN=URL) when --listen has port %q", u, port)
			}
			up.listen = net.JoinHostPort(host, strconv.Itoa(p+1+i))
		}
		if pu, err := url.Parse(up.url); err != nil || pu.Scheme != "http" || pu.Host == "" || (pu.Path != "" && pu.Path != "/") {
			return o, fmt.Errorf("--upstream %s: want [LISTEN=]http://HOST:PORT (plain http)", u)
		}
		if h, _, err := net.SplitHostPort(up.listen); err != nil {
			return o, fmt.Errorf("--upstream %s: the port %q: want HOST:PORT: %v", u, up.listen, err)
		} else if !loopback(h) && o.token == "" {
			return o, fmt.Errorf("--upstream %s: %s is not a loopback address; pass --token", u, up.listen)
		}
		o.upstreams = append(o.upstreams, up)
	}
	for _, ic := range insts {
		addr, flags, ok := strings.Cut(ic, "=")
		if !ok || addr == "" {
			return o, fmt.Errorf("--instance-config %q: want HOST:PORT=FLAGS", ic)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return o, fmt.Errorf("--instance-config %q: %q is not HOST:PORT", ic, addr)
		}
		ifs := flag.NewFlagSet("--instance-config "+addr, flag.ContinueOnError)
		ifs.SetOutput(io.Discard)
		build := engineFlags(ifs)
		if err := ifs.Parse(strings.Fields(flags)); err != nil {
			return o, fmt.Errorf("--instance-config %s: %v", addr, err)
		}
		if ifs.NArg() > 0 {
			return o, fmt.Errorf("--instance-config %s: unexpected %q", addr, ifs.Arg(0))
		}
		if err := checkBounds(ifs, engineBounds); err != nil {
			return o, fmt.Errorf("--instance-config %s: %v", addr, err)
		}
		c, _, err := build(o.engine)
		if err != nil {
			return o, fmt.Errorf("--instance-config %s: %v", addr, err)
		}
		o.instances[addr] = c
	}
	return o, nil
}

// tapCommand parses the flags and runs the tap until ctx ends; it returns the exit status.
func tapCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseTap(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtop tap: %v\n", err)
		return 2
	}
	t, servers, err := startTap(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvtop tap: %v\n", err)
		return 1
	}
	defer t.Close()
	fmt.Fprintf(stdout, "kvtop tap: listening on http://%s\n  MLC's router: HTTP_PROXY=http://%s\n  dashboards: kvtop --attach %s\n", servers[0].addr, servers[0].addr, servers[0].addr)
	for _, s := range servers[1:] {
		fmt.Fprintf(stdout, "  %s forwards to %s\n", s.addr, s.upstream)
	}
	if p := t.kv; p != nil {
		where := "sent to the subscriber"
		if a := p.Addr(); a != nil {
			where = "tcp://" + a.String()
		}
		fmt.Fprintf(stdout, "  kv events: %s, topic %s", where, o.eco.kvTopic)
		if a := p.ReplayAddr(); a != nil {
			fmt.Fprintf(stdout, " (replay tcp://%s, with the topic)", a)
		}
		fmt.Fprintln(stdout)
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.hs.Serve(s.ln) }()
	}
	if o.ui {
		go func() {
			code := runDashboard([]string{"--attach", servers[0].addr, "--token", o.token}, stdout, stderr)
			errc <- fmt.Errorf("dashboard exited (%d)", code)
		}()
	}
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
		if o.ui && strings.HasPrefix(err.Error(), "dashboard exited") {
			err = nil
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, s := range servers {
		if serr := s.hs.Shutdown(sctx); serr != nil {
			s.hs.Close()
		}
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "kvtop tap: %v\n", err)
		return 1
	}
	return 0
}

// tapServer is one listening port of the tap.
type tapServer struct {
	addr, upstream string
	ln             net.Listener
	hs             *http.Server
}

// tapRun is a tap and what it publishes: Close closes both.
type tapRun struct {
	*tap.Tap
	kv *kvevents.Publisher // nil without --kv-events
}

// Close stops the tap, then its KV events (which its shadows observed).
func (r *tapRun) Close() {
	r.Tap.Close()
	if r.kv != nil {
		r.kv.Close()
	}
}

// tapStreams gives each decode instance's shadow its stream of KV events, under the topic
// --kv-events-topic makes of its address, made the first time its shadow starts and kept
// when it starts over (the stream then starts its subscribers over).
func tapStreams(p *kvevents.Publisher, topic string) func(addr string) ([]runner.Observer, []prometheus.Collector) {
	var mu sync.Mutex
	streams := map[string]*kvevents.Stream{}
	return func(addr string) ([]runner.Observer, []prometheus.Collector) {
		mu.Lock()
		defer mu.Unlock()
		s := streams[addr]
		if s == nil {
			var err error
			if s, err = p.NewStream(strings.ReplaceAll(topic, "{instance}", addr)); err != nil {
				return nil, nil // the publisher is closed: the tap is closing
			}
			streams[addr] = s
		}
		return []runner.Observer{s}, kvCollectors(s.Stats)
	}
}

// startTap makes the tap and binds its ports; nothing is served yet.
func startTap(o tapOptions, stderr io.Writer) (*tapRun, []tapServer, error) {
	cfg := tap.Config{Engine: o.engine, Instances: o.instances, Token: o.token, Version: "kvtop " + version, Queue: o.queue}
	if host, _, err := net.SplitHostPort(o.listen); err == nil && host != "" {
		cfg.Hosts = []string{host}
	}
	if o.verbose {
		cfg.Logf = log.New(stderr, "kvtop tap: ", log.LstdFlags).Printf
	}
	run := &tapRun{}
	if o.eco.kvEvents != "" {
		p, err := kvevents.Start(kvevents.Config{Endpoint: o.eco.kvEvents, Dial: o.eco.kvDial, ReplayEndpoint: o.eco.kvReplay,
			Buffer: o.eco.kvBuffer, Encoding: o.eco.kvEncoding, Logf: cfg.Logf})
		if err != nil {
			return nil, nil, err
		}
		run.kv = p
		cfg.Observe = tapStreams(p, o.eco.kvTopic)
	}
	var servers []tapServer
	closeAll := func() {
		for _, s := range servers {
			s.ln.Close()
		}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		run.Close()
		return nil, nil, err
	}
	cfg.Listen = ln.Addr().String()
	t, err := tap.New(cfg)
	if err != nil {
		ln.Close()
		run.Close()
		return nil, nil, err
	}
	run.Tap = t
	servers = append(servers, tapServer{addr: cfg.Listen, ln: ln, hs: wire.NewHTTPServer(t, wire.Limits{})})
	for _, u := range o.upstreams {
		ln, err := net.Listen("tcp", u.listen)
		if err != nil {
			closeAll()
			run.Close()
			return nil, nil, fmt.Errorf("--upstream %s: %w", u.url, err)
		}
		t.AddSelf(ln.Addr().String())
		h, err := t.Reverse(u.url)
		if err != nil {
			ln.Close()
			closeAll()
			run.Close()
			return nil, nil, err
		}
		servers = append(servers, tapServer{addr: ln.Addr().String(), upstream: u.url, ln: ln, hs: wire.NewHTTPServer(h, wire.Limits{})})
	}
	return run, servers, nil
}
