package tap

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/wire"
)

// Config configures a Tap.
type Config struct {
	// Engine is the decode instances' configuration (MLC's engine flags); Instances
	// overrides it for some, by host:port.
	Engine    engine.Config
	Instances map[string]engine.Config
	// Listen is the tap's own address (host:port): its API, and an address no proxied call
	// may target (a proxy loop).
	Listen string
	// Token, when set, is required on the tap's API (as kvtop serve requires it) and on
	// proxied calls, as Proxy-Authorization (Basic with the token as password, as
	// HTTP_PROXY=http://tap:TOKEN@host:port sends it, or Bearer).
	Token string
	// Hosts are the names besides loopback ones a call's Host may give without a token.
	Hosts []string
	// Version names the tap ("kvtop 0.1.0").
	Version string
	// Queue bounds each shadow's observations waiting to be applied (default 4096).
	Queue int
	// MaxObservedBody bounds the body of a call the tap reads to observe it (default 8 MiB);
	// a larger one is forwarded unobserved.
	MaxObservedBody int64
	// Transport forwards the calls (default: http.DefaultTransport's settings, never
	// through a proxy of its own).
	Transport http.RoundTripper
	// Clock stamps observations (default time.Now).
	Clock func() time.Time
	// Limits are the shadows' servers' limits (the stream's).
	Limits wire.Limits
	// Logf logs what a caller cannot see.
	Logf func(format string, args ...any)
	// Observe, when set, returns what else observes the shadow of the decode instance at
	// addr (host:port), such as its KV events, and the metrics that go with them: called
	// each time the shadow starts, or starts over with a fresh engine; the collectors join
	// the shadow's metrics, with its decode_instance label.
	Observe func(addr string) ([]runner.Observer, []prometheus.Collector)
}

// Roles of an instance, as the traffic shows them.
const (
	RoleUnknown = "unknown"
	RoleDecode  = "decode"  // answers prep_recv and start_generate
	RolePrefill = "prefill" // answers remote_send
)

// Tap is the proxy and its shadows.
type Tap struct {
	cfg Config
	rp  *httputil.ReverseProxy

	mu    sync.Mutex
	insts map[string]*instance
	order []string
	owner map[string]string // request id -> the decode instance its prep_recv went to
	self  []string          // the tap's own addresses

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	api    http.Handler
}

// instance is what the tap knows of one P or D.
type instance struct {
	addr        string
	role        string
	note        string
	calls       uint64
	failures    uint64 // calls answered 5xx or not at all
	unreachable bool
	resetDone   bool    // its shadow started over since it became unreachable
	sh          *shadow // decode instances only
}

// New returns a tap; Close stops its shadows.
func New(cfg Config) (*Tap, error) {
	if err := cfg.Engine.Validate(); err != nil {
		return nil, err
	}
	for addr, c := range cfg.Instances {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("tap: instance %s: %w", addr, err)
		}
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4096
	}
	if cfg.MaxObservedBody <= 0 {
		cfg.MaxObservedBody = 8 << 20
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Version == "" {
		cfg.Version = "kvtop"
	}
	if cfg.Transport == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil // the tap's own calls never go through a proxy (HTTP_PROXY may name the tap)
		tr.MaxIdleConnsPerHost = 256
		cfg.Transport = tr
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tap{cfg: cfg, insts: map[string]*instance{}, owner: map[string]string{}, ctx: ctx, cancel: cancel}
	if cfg.Listen != "" {
		t.self = append(t.self, cfg.Listen)
	}
	t.rp = &httputil.ReverseProxy{
		Rewrite:        t.rewrite,
		Transport:      cfg.Transport,
		FlushInterval:  -1, // every write goes on at once: server-sent events keep their timing
		ModifyResponse: t.modifyResponse,
		ErrorHandler:   t.proxyError,
		// What the proxy cannot tell a client (a body that broke off mid-copy) goes to Logf,
		// not to the standard logger.
		ErrorLog: log.New(logWriter{t}, "", 0),
	}
	t.api = wire.Guard(wire.Options{Token: cfg.Token, Hosts: cfg.Hosts}, http.HandlerFunc(t.serveAPI))
	return t, nil
}

// Close stops the shadows and their servers.
func (t *Tap) Close() {
	t.cancel()
	t.wg.Wait()
}

func (t *Tap) logf(format string, args ...any) {
	if t.cfg.Logf != nil {
		t.cfg.Logf(format, args...)
	}
}

// AddSelf adds an address the tap listens on (a reverse-proxy port): no call may target it.
func (t *Tap) AddSelf(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.self = append(t.self, addr)
}

// ServeHTTP serves a call on the tap's address: an absolute-form request (a client that
// uses the tap as its HTTP proxy) is forwarded to the host it names; an origin-form one is
// for the tap's own API.
func (t *Tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.IsAbs() && r.URL.Host != "" {
		if r.URL.Scheme != "http" {
			wire.WriteError(w, http.StatusBadRequest, "unsupported", "%s %s: the tap forwards plain http only (no CONNECT, no https)", r.Method, r.URL.Redacted())
			return
		}
		if !t.proxyAuthorized(r) {
			w.Header().Set("Proxy-Authenticate", `Basic realm="kvtop tap"`)
			wire.WriteError(w, http.StatusProxyAuthRequired, "unauthorized", "%s %s: the tap wants its token as the proxy password (HTTP_PROXY=http://tap:TOKEN@host:port)", r.Method, r.URL.Redacted())
			return
		}
		t.forward(w, r, r.URL.Host)
		return
	}
	if r.Method == http.MethodConnect {
		wire.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT %s: the tap forwards plain http only", r.Host)
		return
	}
	t.api.ServeHTTP(w, r)
}

// Reverse returns the handler of a reverse-proxy port: every call is forwarded to
// upstream (a decode instance's base URL, http://host:port).
func (t *Tap) Reverse(upstream string) (http.Handler, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("tap: upstream %q must be http://host:port", upstream)
	}
	if t.isSelf(u.Host) {
		return nil, fmt.Errorf("tap: upstream %s is the tap itself: a proxy loop", u.Host)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.IsAbs() {
			wire.WriteError(w, http.StatusBadRequest, "invalid_request", "%s %s: this port forwards to %s; send origin-form requests", r.Method, r.URL.Redacted(), u.Host)
			return
		}
		if !t.proxyAuthorized(r) && !wire.Authorized(t.cfg.Token, bearer(r.Header.Get("Authorization"))) {
			wire.WriteError(w, http.StatusUnauthorized, "unauthorized", "%s %s: the tap wants its token", r.Method, r.URL.Path)
			return
		}
		t.forward(w, r, u.Host)
	}), nil
}

func bearer(h string) string {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// proxyAuthorized checks Proxy-Authorization against the token.
func (t *Tap) proxyAuthorized(r *http.Request) bool {
	if t.cfg.Token == "" {
		return true
	}
	h := r.Header.Get("Proxy-Authorization")
	if tok := bearer(h); tok != "" {
		return wire.Authorized(t.cfg.Token, tok)
	}
	r2 := &http.Request{Header: http.Header{"Authorization": {h}}}
	_, pass, ok := r2.BasicAuth()
	return ok && wire.Authorized(t.cfg.Token, pass)
}

// isSelf reports whether host:port is one of the tap's own addresses, under any name that
// reaches this machine.
func (t *Tap) isSelf(hostport string) bool {
	t.mu.Lock()
	self := slices.Clone(t.self)
	t.mu.Unlock()
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, "80"
	}
	for _, s := range self {
		sh, sp, err := net.SplitHostPort(s)
		if err != nil || sp != port {
			continue
		}
		if strings.EqualFold(host, sh) || local(host) && (local(sh) || sh == "") {
			return true
		}
	}
	return false
}

// local reports whether a host names this machine: a loopback or unspecified address, a
// loopback name, or an address of one of its interfaces.
func local(host string) bool {
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") || host == "" {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// instanceOf returns the record of an instance, making it at first sight.
func (t *Tap) instanceOf(addr string) *instance {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.insts[addr]
	if in == nil {
		in = &instance{addr: addr, role: RoleUnknown}
		t.insts[addr] = in
		t.order = append(t.order, addr)
	}
	return in
}

// shadowOf returns the shadow of a decode instance, starting it at first use.
func (t *Tap) shadowOf(addr string) *shadow {
	in := t.instanceOf(addr)
	t.mu.Lock()
	defer t.mu.Unlock()
	if in.sh == nil && t.ctx.Err() == nil {
		cfg := t.cfg.Engine
		if c, ok := t.cfg.Instances[addr]; ok {
			cfg = c
		}
		sh, err := newShadow(t, addr, cfg)
		if err != nil {
			t.logf("%v", err)
			return nil
		}
		in.sh = sh
	}
	return in.sh
}

// setRole records what an answer showed an instance to be.
func (t *Tap) setRole(addr, role, note string) {
	in := t.instanceOf(addr)
	t.mu.Lock()
	defer t.mu.Unlock()
	if role != "" && (in.role == RoleUnknown || in.role == role) {
		in.role = role
		in.note = ""
	}
	if note != "" {
		in.note = note
	}
}

// Runner returns the runner of a decode instance's shadow (for a dashboard run in the
// tap's own process), or false.
func (t *Tap) Runner(addr string) (*runner.Runner, bool) {
	t.mu.Lock()
	in := t.insts[addr]
	t.mu.Unlock()
	if in == nil || in.sh == nil {
		return nil, false
	}
	r, _ := in.sh.current()
	return r, true
}

// logWriter writes the proxy's log lines through Config.Logf.
type logWriter struct{ t *Tap }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.logf("tap: %s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
