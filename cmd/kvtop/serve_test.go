package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// serve refuses bad flags with a clear message and status 2, before it listens.
func TestServeBadFlags(t *testing.T) {
	t.Setenv("KVTOP_TOKEN", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:7070"}, "--listen 0.0.0.0:7070 is not a loopback address"},
		{[]string{"--listen", ":7070"}, "(every interface)"},
		{[]string{"--listen", "10.1.2.3:7070"}, "pass --token"},
		{[]string{"--listen", "example.com:7070"}, "not a loopback address"},
		{[]string{"--listen", "7070"}, `--listen "7070": want HOST:PORT`},
		{[]string{"--prefix-cache", "lru"}, `prefix cache mode "lru"`},
		{[]string{"--steps-per-sec", "-2"}, "--steps-per-sec -2"},
		{[]string{"--ping", "soon"}, `invalid value "soon" for flag -ping`},
		{[]string{"now"}, `unexpected argument "now"`},
		{[]string{"--drive", "nope"}, `--drive: sim: unknown scenario "nope"`},
		{[]string{"--trace", "x.jsonl"}, "--trace is for --drive trace"},
		{[]string{"--drive", "trace"}, "needs --trace FILE"},
		{[]string{"--drive", "trace", "--trace", "/no/such/file.jsonl"}, "no such file"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"serve"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("kvtop serve %s = %d, %q; want 2 and a message containing %q", strings.Join(tc.args, " "), code, errb.String(), tc.want)
		}
	}
	// A token makes any address acceptable; so does $KVTOP_TOKEN.
	if o, err := parseServe([]string{"--listen", "0.0.0.0:7070", "--token", "t"}, io.Discard); err != nil || o.token != "t" {
		t.Errorf("parseServe(--listen 0.0.0.0:7070 --token t) = %+v, %v", o, err)
	}
	t.Setenv("KVTOP_TOKEN", "from-env")
	if o, err := parseServe([]string{"--listen", ":7070"}, io.Discard); err != nil || o.token != "from-env" {
		t.Errorf("parseServe(--listen :7070) with $KVTOP_TOKEN = %+v, %v", o, err)
	}
}

// serve --help documents every flag and every endpoint.
func TestServeHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("kvtop serve --help = %d", code)
	}
	help := errb.String()
	fs, _ := serveFlags(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help, "-"+f.Name+" ") && !strings.Contains(help, "-"+f.Name+"\n") {
			t.Errorf("--help does not document -%s", f.Name)
		}
	})
	for _, path := range []string{"/microserving/prep_recv", "/microserving/start_generate", "/microserving/remote_send",
		"/v1/kv", "/debug/abort", "/debug/dump_event_trace", "/v1/snapshot", "/healthz", "/metrics", "/v1/stream", "--token"} {
		if !strings.Contains(help, path) {
			t.Errorf("--help does not mention %s", path)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// `kvtop serve` in-process on a free port, with a token and control, and a driver; the
// dashboard's client attaches to it, sees the driver's request, and pauses the engine.
func TestServeAndAttach(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	drove := make(chan wire.PrepRecvAnswer, 1)
	code := make(chan int, 1)
	go func() {
		o, err := parseServe([]string{"--listen", "127.0.0.1:0", "--token", "s3cret", "--control", "--max-total-seq-len", "8192"}, &errb)
		if err != nil {
			t.Error(err)
			code <- 2
			return
		}
		o.drivers = append(o.drivers, func(ctx context.Context, base, token string) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/microserving/prep_recv",
				strings.NewReader(`{"user":"A","prompt":[1,2,3,4],"end":-1}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var ans wire.PrepRecvAnswer
			err = json.NewDecoder(resp.Body).Decode(&ans)
			drove <- ans
			return err
		})
		s, err := startServer(ctx, o, &errb)
		if err != nil {
			t.Error(err)
			code <- 1
			return
		}
		out.Write([]byte("listening " + s.Addr() + "\n"))
		if err := s.Wait(); err != nil {
			t.Error(err)
		}
		code <- 0
	}()
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	for addr == "" {
		if m := regexp.MustCompile(`listening (\S+)`).FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not listen: %s", errb.String())
		}
		time.Sleep(time.Millisecond)
	}
	if ans := <-drove; ans.KVAppendMetadata != "BwAAAAAAAABbMSwwLDNd" || ans.PromptLength != 4 {
		t.Errorf("the driver's prep_recv = %+v, want [1,0,3]", ans)
	}
	c, err := wire.Dial(ctx, addr, wire.ClientOptions{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var view *engine.View
	var status *feed.Status
	take := func(what string, cond func() bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for !cond() {
			select {
			case <-c.C():
			case <-timeout:
				t.Fatalf("timed out waiting for %s", what)
			}
			u := c.Take()
			if u.Snapshot != nil {
				if view, err = engine.NewView(*u.Snapshot); err != nil {
					t.Fatal(err)
				}
			}
			for _, ev := range u.Events {
				if err := view.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
			if u.Status != nil {
				status = u.Status
			}
		}
	}
	take("request A", func() bool {
		if view == nil {
			return false
		}
		r, ok := view.Request("A")
		return ok && r.State == engine.StatePrepared
	})
	if err := c.Control(feed.Control{Op: feed.ControlPause}); err != nil {
		t.Fatal(err)
	}
	take("the engine to pause", func() bool { return status != nil && status.Paused && status.Controllable })
	cancel()
	if got := <-code; got != 0 {
		t.Errorf("serve returned %d after its context ended, want 0", got)
	}
	for range c.C() {
		if l := c.Link(); l.State == feed.LinkReconnecting {
			break
		}
	}
}

// The command itself: flags, the listening line, a call, and a clean exit.
func TestServeCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	code := make(chan int, 1)
	go func() { code <- serveCommand(ctx, []string{"--listen", "127.0.0.1:0", "--verbose"}, &out, &errb) }()
	re := regexp.MustCompile(`listening on (http://\S+)`)
	var base string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening line: %q %q", out.String(), errb.String())
		}
		time.Sleep(time.Millisecond)
	}
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"version":"kvtop `+version+`"`) {
		t.Errorf("GET /healthz = %d %s", resp.StatusCode, b)
	}
	if !strings.Contains(out.String(), "read-only") {
		t.Errorf("the listening line does not say the server is read-only: %q", out.String())
	}
	cancel()
	if got := <-code; got != 0 {
		t.Errorf("serve = %d after its context ended, want 0 (stderr %q)", got, errb.String())
	}
	// A port that is taken is a failure to start (1), not a usage error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var errb2 bytes.Buffer
	if got := serveCommand(context.Background(), []string{"--listen", ln.Addr().String()}, io.Discard, &errb2); got != 1 || !strings.Contains(errb2.String(), "address already in use") {
		t.Errorf("serve on a taken port = %d %q, want 1 and the reason", got, errb2.String())
	}
}

// kvtop serve --drive chat drives itself over HTTP, and a client attached to it sees the
// requests finish, with prefix hits: the README's two-terminal live system, in one test.
func TestServeDriveChatAndAttach(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb syncBuffer
	o, err := parseServe([]string{"--listen", "127.0.0.1:0", "--drive", "chat", "--steps-per-sec", "200"}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if o.engine.MaxRecycling != 16 {
		t.Errorf("--drive chat: max recycling %d, want the scenario's 16", o.engine.MaxRecycling)
	}
	s, err := startServer(ctx, o, &errb)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	c, err := wire.Dial(ctx, s.Addr(), wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var view *engine.View
	timeout := time.After(30 * time.Second)
	for view == nil || view.Totals().Finished < 5 {
		select {
		case <-c.C():
		case <-timeout:
			t.Fatalf("no requests finished in 30s: %s", errb.String())
		}
		u := c.Take()
		if u.Snapshot != nil {
			if view, err = engine.NewView(*u.Snapshot); err != nil {
				t.Fatal(err)
			}
		}
		for _, ev := range u.Events {
			if err := view.Apply(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := view.PrefixStats(); st.HitTokens == 0 {
		t.Errorf("the driven chat had no prefix hits: %+v", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Wait = %v", err)
	}
	if strings.Contains(errb.String(), "driver:") {
		t.Errorf("the driver failed: %s", errb.String())
	}
}
