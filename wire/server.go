package wire

import (
	"bufio"
	"context"
	"crypto/sha256"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
)

// Limits bound what a client can make the server hold or wait for.
type Limits struct {
	// MaxBodyBytes bounds a JSON call's body (413 beyond).
	MaxBodyBytes int64
	// MaxKVBytes bounds a KV write's body; a larger transfer comes in several writes with
	// KV-Offset.
	MaxKVBytes int64
	// MaxMessageBytes bounds a websocket message from a stream client; beyond it the
	// connection is closed (1009).
	MaxMessageBytes int64
	// HeaderTimeout is how long a connection may take to send its request headers.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds the request headers (the KV metadata travels in one).
	MaxHeaderBytes int
	// MaxTokens bounds a request's max_tokens. The runner buffers every token a started
	// request can make, so this also bounds that buffer.
	MaxTokens int
	// PingInterval is how often a stream client is pinged; one silent for two intervals is
	// closed.
	PingInterval time.Duration
	// WriteTimeout bounds one write to a stream client; a client that does not read for
	// that long is closed.
	WriteTimeout time.Duration
	// FrameEvents bounds the events in one events frame.
	FrameEvents int
	// ResyncInterval spaces the snapshots one stream client may ask for: requests within it
	// are coalesced and answered, with the latest state, once it has passed.
	ResyncInterval time.Duration
	// MaxConnectsPerSec caps the stream's connection attempts a second (with as many in a
	// burst); more are answered 503 with Retry-After.
	MaxConnectsPerSec int
	// SnapshotInterval spaces the snapshots the stream builds for its clients (new ones,
	// ones that fell behind or asked): one serves every client that needs one at the time.
	SnapshotInterval time.Duration
}

// DefaultLimits returns the limits kvtop serve starts with.
func DefaultLimits() Limits {
	return Limits{
		MaxBodyBytes:    1 << 20,
		MaxKVBytes:      64 << 20,
		MaxMessageBytes: 4 << 10,
		HeaderTimeout:   10 * time.Second,
		MaxHeaderBytes:  1 << 20,
		MaxTokens:       1 << 16,
		PingInterval:    20 * time.Second,
		WriteTimeout:    10 * time.Second,
		FrameEvents:     4096,
		ResyncInterval:  time.Second,
		// Enough for every dashboard of a team coming back after a restart (the client
		// backs off and retries), few enough that connection churn costs nothing.
		MaxConnectsPerSec: 20,
		SnapshotInterval:  50 * time.Millisecond,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	set := func(v *int64, def int64) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.MaxBodyBytes, d.MaxBodyBytes)
	set(&l.MaxKVBytes, d.MaxKVBytes)
	set(&l.MaxMessageBytes, d.MaxMessageBytes)
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = d.HeaderTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = d.MaxTokens
	}
	if l.PingInterval <= 0 {
		l.PingInterval = d.PingInterval
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	if l.FrameEvents <= 0 {
		l.FrameEvents = d.FrameEvents
	}
	if l.ResyncInterval <= 0 {
		l.ResyncInterval = d.ResyncInterval
	}
	if l.MaxConnectsPerSec <= 0 {
		l.MaxConnectsPerSec = d.MaxConnectsPerSec
	}
	if l.SnapshotInterval <= 0 {
		l.SnapshotInterval = d.SnapshotInterval
	}
	return l
}

// Options configure a Server.
type Options struct {
	// Token, when set, is required on every call and on the stream's handshake, as
	// "Authorization: Bearer TOKEN".
	Token string
	// Hosts are the names besides loopback ones that a call's Host header may give when the
	// server has no token: the listen address's host (guard.go).
	Hosts []string
	// Control lets stream clients pause, resume and step the engine.
	Control bool
	// Version names the server in the stream's hello ("kvtop 0.1.0").
	Version string
	Limits  Limits
	// TraceRequests is how many recent requests /debug/dump_event_trace keeps (default
	// 1024).
	TraceRequests int
	// PrepRecvTrace, when set, is given each prep_recv call's request id and headers
	// before the call goes to the engine (a tracer takes the W3C traceparent there), and
	// the function it returns is called with the call's error.
	PrepRecvTrace func(id string, h http.Header) func(error)
	// NoTrace keeps no trace: /debug/dump_event_trace answers an empty one, and the server
	// does not follow the engine for it (a tap's shadows, which serve no such call).
	NoTrace bool
	// Clock stamps completions (default time.Now).
	Clock func() time.Time
	// Logf, when set, logs what a caller cannot see: stream clients that went away, answers
	// that could not be written.
	Logf func(format string, args ...any)
}

// Server is kvtop serve's HTTP handler over a runner: the microserving calls, the KV
// arrival, the debugging and metrics endpoints, and the websocket stream.
type Server struct {
	r     *runner.Runner
	opts  Options
	lim   Limits
	token [sha256.Size]byte
	mux   map[string]route

	cfgOnce sync.Mutex
	cfg     *engine.Config

	metrics  *metrics
	registry *prometheus.Registry
	trace    *tracer

	connects *limiter // the stream's connection attempts
	// hub fans the engine's stream out to the stream connections (nil while none is
	// connected); backlog is the events it keeps for them, a subscription's worth.
	hubMu   sync.Mutex
	hub     *hub
	backlog int

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	conns  sync.WaitGroup // stream connections and the tracer
	mu     sync.Mutex
	closed bool

	// subscribe makes the stream's source; tests swap it.
	subscribe func() source
}

// source is what a stream connection reads: a runner.Subscription.
type source interface {
	C() <-chan struct{}
	Take() feed.Update
	Resync()
	Close()
}

type route struct {
	method  string
	name    string // the metrics label
	handler func(http.ResponseWriter, *http.Request) error
	json    bool // the body is JSON: Content-Type application/json required
}

// NewServer returns a server for r. It does not wait for r to run, but its tracer subscribes
// to r, so Close (which stops the stream connections and the tracer, and waits for them)
// needs r to have run: start r before closing the server.
func NewServer(r *runner.Runner, opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Version == "" {
		opts.Version = "kvtop"
	}
	if opts.TraceRequests <= 0 {
		opts.TraceRequests = 1024
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{r: r, opts: opts, lim: opts.Limits.withDefaults(), ctx: ctx, cancel: cancel}
	s.connects = newLimiter(float64(s.lim.MaxConnectsPerSec), opts.Clock)
	if opts.Token != "" {
		s.token = sha256.Sum256([]byte(opts.Token))
	}
	s.subscribe = func() source { return r.Subscribe() }
	s.backlog = r.Backlog()
	s.mux = map[string]route{
		"/microserving/prep_recv":      {http.MethodPost, "prep_recv", s.prepRecv, true},
		"/microserving/start_generate": {http.MethodPost, "start_generate", s.startGenerate, true},
		"/microserving/remote_send":    {http.MethodPost, "remote_send", s.remoteSend, false},
		"/v1/kv":                       {http.MethodPost, "kv", s.kv, false},
		"/v1/snapshot":                 {http.MethodGet, "snapshot", s.snapshot, false},
		"/v1/stream":                   {http.MethodGet, "stream", s.stream, false},
		"/debug/abort":                 {http.MethodPost, "abort", s.abort, true},
		"/debug/dump_event_trace":      {http.MethodPost, "dump_event_trace", s.dumpTrace, false},
		"/healthz":                     {http.MethodGet, "healthz", s.healthz, false},
		"/metrics":                     {http.MethodGet, "metrics", nil, false}, // set by newMetrics
	}
	s.trace = newTracer(opts.TraceRequests)
	s.registry, s.metrics = newMetrics(s)
	m := s.mux["/metrics"]
	m.handler = s.metricsHandler()
	s.mux["/metrics"] = m
	if !opts.NoTrace {
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			s.trace.run(s.ctx, r)
		}()
	}
	return s
}

// Registry returns the server's Prometheus registry, to add collectors to.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// ServeHTTP routes a call, after checking its token.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, ok := s.mux[r.URL.Path]
	name := rt.name
	if !ok {
		name = "other"
	}
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	defer func() { s.metrics.request(name, rec.status) }()
	if err := s.checkHost(r); err != nil {
		writeError(rec, err)
		return
	}
	if !s.authorized(r) {
		writeError(rec, errorf(http.StatusUnauthorized, errUnauthorized,
			"%s %s: missing or wrong token: send the header \"Authorization: Bearer TOKEN\" with the server's --token", r.Method, r.URL.Path))
		return
	}
	if !ok {
		writeError(rec, errorf(http.StatusNotFound, errNotFound, "%s: no such endpoint", r.URL.Path))
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		rec.Header().Set("Allow", rt.method)
		writeError(rec, errorf(http.StatusMethodNotAllowed, errMethod, "%s %s: use %s", r.Method, r.URL.Path, rt.method))
		return
	}
	if err := s.checkCall(r, rt); err != nil {
		writeError(rec, err)
		return
	}
	if err := rt.handler(rec, r); err != nil {
		if r.Context().Err() != nil && !rec.wrote {
			// The client went away; nobody reads the answer.
			s.logf("%s %s: client gone: %v", r.Method, r.URL.Path, err)
			rec.status = 499
			return
		}
		if rec.wrote {
			s.logf("%s %s: after the answer started: %v", r.Method, r.URL.Path, err)
			return
		}
		writeError(rec, err)
	}
}

// Close ends every stream connection and the tracer, and waits for them. Calls in flight
// are the http.Server's to end (Shutdown).
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.conns.Wait()
	s.metrics.close()
}

// config returns the engine's configuration, asked of the runner once.
func (s *Server) config(ctx context.Context) (engine.Config, error) {
	s.cfgOnce.Lock()
	defer s.cfgOnce.Unlock()
	if s.cfg != nil {
		return *s.cfg, nil
	}
	var cfg engine.Config
	if err := s.r.Do(ctx, func(e *engine.Engine, _ time.Time) error { cfg = e.Config(); return nil }); err != nil {
		return cfg, err
	}
	s.cfg = &cfg
	return cfg, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// NewHTTPServer returns an http.Server for h with the limits an HTTP server holds: the time
// to read headers and their size. It sets no read or write timeout: a prep_recv waits for
// admission and a completion streams for as long as it takes.
func NewHTTPServer(h http.Handler, l Limits) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.HeaderTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
	}
}

// statusRecorder notes the status of an answer, for metrics, and whether it started.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status = code
		r.wrote = true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, hijack).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Hijack hands the connection to the websocket upgrade.
func (r *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(r.ResponseWriter).Hijack()
	if err == nil {
		r.status = http.StatusSwitchingProtocols
		r.wrote = true
	}
	return c, rw, err
}
