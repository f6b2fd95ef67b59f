package wire_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// dialSmall opens a raw connection with a 4 KiB receive buffer: a client that reads slowly,
// or not at all, as far as the server can tell.
func dialSmall(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// rawPost writes a JSON POST on a raw connection and does not read the answer.
func rawPost(t *testing.T, conn net.Conn, path, body string) {
	t.Helper()
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, conn.RemoteAddr(), len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) waiters() runner.Waiters {
	h.t.Helper()
	w, err := h.r.Waiters(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return w
}

// Streaming completions whose clients never read hold nothing once the server lets them
// go: the SSE stream has a write deadline, the request is aborted, and no sink or queued
// token stays in the runner, whether the client then closes or not.
func TestSlowStreamingClientsLeaveNothingBehind(t *testing.T) {
	h := newHarness(t, setup{
		cfg:  func(c *engine.Config) { c.MaxTotalSequenceLength = 1 << 20 }, // room for every completion
		opts: func(o *wire.Options) { o.Limits.WriteTimeout = 100 * time.Millisecond },
	})
	const clients = 5
	var conns []net.Conn
	for i := range clients {
		id := fmt.Sprint("s", i)
		ans := h.prepRecv(id, prompt(40, int32(i)), -1, 60000)
		if status, b := h.writeKV(ans.KVAppendMetadata, -1, 0, nil); status != http.StatusOK {
			t.Fatalf("KV write = %d %s", status, b)
		}
		conn := dialSmall(t, h.ts.Listener.Addr().String())
		defer conn.Close()
		rawPost(t, conn, "/microserving/start_generate", fmt.Sprintf(`{"user":%q,"begin":-1,"stream":true}`, id))
		conns = append(conns, conn)
	}
	waitFor(t, "every stream to start", func() bool {
		for i := range clients {
			if h.request(fmt.Sprint("s", i)).State == engine.StateKVComplete {
				return false
			}
		}
		return true
	})
	// Connected and not reading: the write deadline lets each go.
	waitFor(t, "the server to let the slow readers go", func() bool { return h.waiters() == runner.Waiters{} })
	for i := range clients {
		if rv := h.request(fmt.Sprint("s", i)); !rv.State.Ended() {
			t.Errorf("s%d is %s after its reader was let go, want it ended (aborted, or finished meanwhile)", i, rv.State)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	if w := h.waiters(); w != (runner.Waiters{}) {
		t.Errorf("after the clients closed: %+v, want nothing held", w)
	}
}

// A client that closes a stream it never read leaves nothing behind either, even with a
// write timeout far away.
func TestClosedStreamingClientLeavesNothingBehind(t *testing.T) {
	h := newHarness(t, setup{})
	ans := h.prepRecv("A", prompt(40, 1), -1, 60000)
	h.writeKV(ans.KVAppendMetadata, -1, 0, nil)
	conn := dialSmall(t, h.ts.Listener.Addr().String())
	rawPost(t, conn, "/microserving/start_generate", `{"user":"A","begin":-1,"stream":true}`)
	waitFor(t, "tokens to queue for the reader", func() bool { return h.waiters().QueuedTokens > 0 })
	conn.Close()
	waitFor(t, "the sink to go", func() bool { return h.waiters() == runner.Waiters{} })
	waitFor(t, "A to end", func() bool { return h.request("A").State.Ended() })
}

// Beyond --max-waiting prep_recv calls waiting for admission, the next is answered 503 with
// Retry-After, and the engine never sees it.
func TestPrepRecvBeyondMaxWaitingIs503(t *testing.T) {
	h := newHarness(t, setup{
		cfg:    func(c *engine.Config) { c.MaxTotalSequenceLength = 4096 }, // the watermark admits nothing
		runner: func(c *runner.Config) { c.MaxWaiting = 2 },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		go h.call(ctx, http.MethodPost, "/microserving/prep_recv", jsonBody(t, map[string]any{"user": fmt.Sprint("w", i), "prompt": prompt(40, int32(i)), "end": -1}), nil)
	}
	waitFor(t, "two calls to wait", func() bool { return h.waiters().PrepRecv == 2 })
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/microserving/prep_recv", strings.NewReader(`{"user":"x","prompt":[1,2,3],"end":-1}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"busy"`) {
		t.Errorf("a third prep_recv = %d (Retry-After %q) %s, want 503 busy with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	var known bool
	h.engine(func(e *engine.Engine) { _, known = e.Request("x") })
	if known {
		t.Errorf("the refused request reached the engine")
	}
}

// A body over --max-body reaches a client that sends all of it before it reads (as
// Python's urllib does) as the 413, not as a reset connection: the server reads and
// discards the rest, within bounds, before it answers.
func TestOversizedBodyIsAnsweredNotReset(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Limits.MaxBodyBytes = 4 << 10 }})
	conn, err := net.Dial("tcp", h.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"user":"A","prompt":"` + strings.Repeat("x", 6<<20) + `","end":-1}`
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /microserving/prep_recv HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		h.ts.Listener.Addr(), len(body))
	// A slow uploader: about a second for the body, longer than a server that does not
	// read it waits before it resets the connection.
	for rest := body; rest != ""; {
		n := min(len(rest), 64<<10)
		if _, err := io.WriteString(conn, rest[:n]); err != nil {
			t.Fatalf("sending the 6 MB body: %v (the server closed before reading it)", err)
		}
		rest = rest[n:]
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v, want the 413", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"type":"too_large"`) {
		t.Errorf("a 6 MB prep_recv over a 4 KiB limit = %d %s, want 413 too_large", resp.StatusCode, b)
	}
}

// Ids up to 256 bytes, in any script, are taken as they are.
func TestLongAndUnicodeIDsAreAccepted(t *testing.T) {
	h := newHarness(t, setup{})
	for i, id := range []string{strings.Repeat("i", wire.MaxIDBytes), "naïve-✓-请求-🙂", "a b/c:d"} {
		h.prepRecv(id, prompt(40, int32(i)), -1, 2)
		if rv := h.request(id); rv.ID != id {
			t.Errorf("request %q is known as %q", id, rv.ID)
		}
	}
}

// While paused, kvtop_engine_steps_per_second is 0, even right after a burst of single
// steps (which once showed as a rate of a million).
func TestStepRateIsZeroWhilePaused(t *testing.T) {
	h := newHarness(t, setup{paused: true})
	var before uint64
	h.engine(func(e *engine.Engine) { before = e.StepNumber() })
	if err := h.r.Control(feed.Control{Op: feed.ControlStep, N: 20000}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the burst of steps", func() bool {
		var n uint64
		h.engine(func(e *engine.Engine) { n = e.StepNumber() })
		return n >= before+20000
	})
	if m := metrics(t, h); m["kvtop_engine_steps_per_second"] != 0 || m["kvtop_engine_paused"] != 1 {
		t.Errorf("after a burst of steps while paused: steps_per_second %v, paused %v; want 0, 1", m["kvtop_engine_steps_per_second"], m["kvtop_engine_paused"])
	}
}
