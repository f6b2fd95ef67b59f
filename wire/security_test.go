package wire_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// With a token, every call and the stream's handshake must carry it.
func TestTokenIsRequiredEverywhere(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Token = "s3cret" }})
	for _, path := range []string{"/healthz", "/metrics", "/v1/snapshot", wire.StreamPath} {
		for _, auth := range []string{"", "Bearer wrong", "Bearer s3cret2", "s3cret", "Basic czNjcmV0"} {
			req, _ := http.NewRequest(http.MethodGet, h.ts.URL+path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := h.ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"type":"unauthorized"`) || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s with Authorization %q = %d %s, want 401 unauthorized with WWW-Authenticate", path, auth, resp.StatusCode, b)
			}
		}
	}
	if status, b := h.call(context.Background(), http.MethodGet, "/healthz", nil, nil); status != http.StatusOK {
		t.Errorf("GET /healthz with the token = %d %s, want 200", status, b)
	}
	// The stream: the raw handshake, then the client.
	_, resp, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("websocket handshake without the token: err %v, want 401", err)
	}
	if _, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{Token: "wrong"}); !errors.Is(err, wire.ErrUnauthorized) {
		t.Errorf("Dial with a wrong token = %v, want ErrUnauthorized", err)
	}
	c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{Token: "s3cret"})
	if err != nil {
		t.Fatalf("Dial with the token = %v", err)
	}
	c.Close()
	// Attach keeps trying in the background, but not with a token the server refused.
	a, err := wire.Attach(h.ts.URL, wire.ClientOptions{Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for range a.C() {
	}
	if l := a.Link(); l.State != feed.LinkClosed || !strings.Contains(l.Err, "unauthorized") || l.Attempts != 1 {
		t.Errorf("Attach with a wrong token: Link() = %+v, want closed after 1 attempt, saying unauthorized", l)
	}
}

// A browser page from another origin cannot open the stream; one served by this host, or a
// client that is not a browser (no Origin), can.
func TestCrossOriginHandshakeIsRefused(t *testing.T) {
	h := newHarness(t, setup{})
	host := strings.TrimPrefix(h.ts.URL, "http://")
	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"", http.StatusSwitchingProtocols},
		{"http://" + host, http.StatusSwitchingProtocols},
		{"http://evil.example", http.StatusForbidden},
		{"http://" + host + ".evil.example", http.StatusForbidden},
		{"null", http.StatusForbidden},
	} {
		hdr := http.Header{}
		if tc.origin != "" {
			hdr.Set("Origin", tc.origin)
		}
		conn, resp, err := websocket.DefaultDialer.Dial(h.wsURL(), hdr)
		if conn != nil {
			conn.Close()
		}
		if resp == nil || resp.StatusCode != tc.want {
			t.Errorf("handshake with Origin %q: %v (err %v), want %d", tc.origin, resp, err, tc.want)
		}
	}
}

// A stream client's message over the limit closes its connection with 1009.
func TestStreamMessageSizeIsLimited(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Limits.MaxMessageBytes = 256 }})
	conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"snapshot","pad":"`+strings.Repeat("x", 300)+`"}`)); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := conn.ReadMessage()
		if err == nil {
			continue
		}
		if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
			t.Fatalf("after a 300-byte message with a limit of 256: %v, want close 1009", err)
		}
		return
	}
}

// A connection that does not finish its headers in time is closed.
func TestHeaderReadTimeout(t *testing.T) {
	hs := wire.NewHTTPServer(http.NotFoundHandler(), wire.Limits{HeaderTimeout: 50 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	defer hs.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a connection stuck in its headers was not closed (read %q)", b)
	}
	if hs.ReadHeaderTimeout != 50*time.Millisecond {
		t.Errorf("ReadHeaderTimeout = %v, want 50ms", hs.ReadHeaderTimeout)
	}
}
