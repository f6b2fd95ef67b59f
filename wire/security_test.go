package wire_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/engine"
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

// raw makes a call with exactly the headers given (a "Host" entry sets the Host), as a web
// page or curl would send it, and the harness's token if it has one.
func (h *harness) raw(method, path, body string, hdr map[string]string) (int, string) {
	h.t.Helper()
	req, _ := http.NewRequest(method, h.ts.URL+path, strings.NewReader(body))
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// getWithHost makes a GET with a Host header of its choice.
func (h *harness) getWithHost(path, host string) (int, string) {
	h.t.Helper()
	return h.raw(http.MethodGet, path, "", map[string]string{"Host": host})
}

// Without a token, only a Host that names this machine, or the listen host, is served: a
// page whose name was rebound to 127.0.0.1 cannot read the snapshot or open the stream,
// even sending an Origin that matches the Host it chose. With a token any Host will do.
func TestForeignHostIsRefusedWithoutAToken(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Control = true; o.Hosts = []string{"kvtop.internal"} }})
	port := h.ts.Listener.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		host string
		want int
	}{
		{fmt.Sprintf("127.0.0.1:%d", port), http.StatusOK},
		{fmt.Sprintf("localhost:%d", port), http.StatusOK},
		{fmt.Sprintf("LOCALHOST:%d", port), http.StatusOK},
		{fmt.Sprintf("[::1]:%d", port), http.StatusOK},
		{fmt.Sprintf("127.0.0.2:%d", port), http.StatusOK},
		{fmt.Sprintf("kvtop.internal:%d", port), http.StatusOK},
		{fmt.Sprintf("evil.example:%d", port), http.StatusForbidden},
		{"evil.example", http.StatusForbidden},
		{fmt.Sprintf("127.0.0.1.evil.example:%d", port), http.StatusForbidden},
		{fmt.Sprintf("localhost.evil.example:%d", port), http.StatusForbidden},
	} {
		if status, b := h.getWithHost("/v1/snapshot", tc.host); status != tc.want || status == http.StatusForbidden && !strings.Contains(b, `"type":"forbidden_host"`) {
			t.Errorf("GET /v1/snapshot with Host %q = %d %.120s, want %d", tc.host, status, b, tc.want)
		}
	}
	// The rebinding page's websocket: Host and Origin both its own, and equal.
	evil := fmt.Sprintf("evil.example:%d", port)
	hdr := http.Header{"Host": {evil}, "Origin": {"http://" + evil}}
	conn, resp, err := websocket.DefaultDialer.Dial(h.wsURL(), hdr)
	if conn != nil {
		conn.Close()
	}
	if resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("websocket handshake with Host and Origin %s on a --control server: %v (err %v), want 403", evil, resp, err)
	}
	// With a token, the Host is not what protects the server.
	ht := newHarness(t, setup{opts: func(o *wire.Options) { o.Token = "s3cret" }})
	if status, b := ht.getWithHost("/v1/snapshot", "kvtop.example.com"); status != http.StatusOK {
		t.Errorf("with a token, GET /v1/snapshot with Host kvtop.example.com = %d %.120s, want 200", status, b)
	}
}

// rawCall makes a POST with the headers a web page (or curl) would send.
func (h *harness) rawCall(path, body string, hdr map[string]string) (int, string) {
	h.t.Helper()
	return h.raw(http.MethodPost, path, body, hdr)
}

// The request a page of any site can make a browser send without asking (a "simple"
// request: text/plain, or a form) is refused: a JSON call must say it is JSON (415), and a
// call that changes state from a foreign Origin is refused (403). Nothing is aborted. A
// curl-style caller that says application/json, with or without a charset, is served.
func TestCrossSiteCallsAreRefused(t *testing.T) {
	h := newHarness(t, setup{})
	h.prepRecv("r", prompt(40, 1), -1, 2)
	host := strings.TrimPrefix(h.ts.URL, "http://")
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
		typ  string
	}{
		{"text/plain from a foreign page", map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403, "forbidden_origin"},
		{"JSON from a foreign page", map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, 403, "forbidden_origin"},
		{"from another local port", map[string]string{"Content-Type": "application/json", "Origin": "http://localhost:3000"}, 403, "forbidden_origin"},
		{"from an opaque origin", map[string]string{"Content-Type": "application/json", "Origin": "null"}, 403, "forbidden_origin"},
		{"text/plain", map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"a form", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"multipart", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"},
		{"no Content-Type", nil, 415, "unsupported_media_type"},
	} {
		status, b := h.rawCall("/debug/abort", `{"user":"r"}`, tc.hdr)
		if status != tc.want || !strings.Contains(b, `"type":"`+tc.typ+`"`) {
			t.Errorf("POST /debug/abort %s = %d %s, want %d %s", tc.name, status, b, tc.want, tc.typ)
		}
	}
	if st := h.request("r").State; st != engine.StatePrepared {
		t.Fatalf("after the refused calls r is %s, want prepared", st)
	}
	for _, path := range []string{"/microserving/prep_recv", "/microserving/start_generate"} {
		if status, b := h.rawCall(path, `{"user":"r","begin":39}`, map[string]string{"Content-Type": "text/plain"}); status != 415 {
			t.Errorf("POST %s as text/plain = %d %s, want 415", path, status, b)
		}
	}
	// A page served by this server's own origin, and curl-style callers.
	if status, b := h.rawCall("/microserving/prep_recv", `{"user":"c1","prompt":[1,2,3],"end":-1}`,
		map[string]string{"Content-Type": "application/json; charset=utf-8", "User-Agent": "curl/8.5.0"}); status != 200 {
		t.Errorf("curl-style prep_recv = %d %s, want 200", status, b)
	}
	if status, b := h.rawCall("/debug/abort", `{"user":"r"}`, map[string]string{"Content-Type": "application/json", "Origin": "http://" + host}); status != 200 {
		t.Errorf("abort from this server's own origin = %d %s, want 200", status, b)
	}
}

// The bearer scheme is case-insensitive, as HTTP's auth schemes are.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Token = "s3cret" }})
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR  s3cret"} {
		req, _ := http.NewRequest(http.MethodGet, h.ts.URL+"/healthz", nil)
		req.Header.Set("Authorization", auth)
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz with Authorization %q = %d, want 200", auth, resp.StatusCode)
		}
		conn, resp, err := websocket.DefaultDialer.Dial(h.wsURL(), http.Header{"Authorization": {auth}})
		if err != nil {
			t.Errorf("stream handshake with Authorization %q: %v", auth, err)
			continue
		}
		resp.Body.Close()
		conn.Close()
	}
}
