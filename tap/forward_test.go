package tap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// recorder is an upstream that keeps the bytes of every request it got and answers each
// path with fixed headers and a fixed body.
type recorder struct {
	srv  *httptest.Server
	got  [][]byte
	resp map[string]func(http.ResponseWriter)
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{resp: map[string]func(http.ResponseWriter){
		pathPrepRecv: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Upstream", "d")
			io.WriteString(w, `{"prompt_length":40,"prefix_matched_length":0,"kv_append_metadata":"CAAAAAAAAABbMSwwLDM5XQ=="}`)
		},
		pathRemoteSend: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "{}")
		},
		pathStartGenerate: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			for _, tok := range []string{" lo", " mi", " nu"} {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q}]}\n\n", tok)
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
		},
		"/v1/kv": func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated); io.WriteString(w, `{"tokens":39}`) },
		"/metrics": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			io.WriteString(w, "# HELP x y\nx 1\n")
		},
		"/teapot": func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) },
	}}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := httputil.DumpRequest(r, true)
		rec.got = append(rec.got, b)
		if f := rec.resp[r.URL.Path]; f != nil {
			f(w)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

// dumpResponse is a response's status, headers (but the date, which differs by nature)
// and body.
func dumpResponse(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range resp.Header {
		if k != "Date" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out strings.Builder
	fmt.Fprintf(&out, "%s %v\n", resp.Status, resp.TransferEncoding)
	for _, k := range keys {
		fmt.Fprintf(&out, "%s: %s\n", k, strings.Join(resp.Header[k], ", "))
	}
	out.WriteString("\n")
	out.Write(b)
	return out.String()
}

// startTap serves a tap on loopback; it returns the tap and a client that uses it as its
// HTTP proxy.
func serveTap(t *testing.T, cfg Config) (*Tap, *httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	cfg.Listen = srv.Listener.Addr().String()
	if cfg.Engine.PageSize == 0 {
		cfg.Engine = smallConfig()
	}
	tp := mustTap(t, cfg)
	srv.Config.Handler = tp
	srv.Start()
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return tp, srv, &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}, Timeout: 20 * time.Second}
}

// Every call goes through the tap byte for byte: what the instance receives, and what the
// client gets back, are what they are without the tap.
func TestForwardingIsByteForByte(t *testing.T) {
	rec := newRecorder(t)
	_, _, proxied := serveTap(t, Config{})
	direct := &http.Client{}
	calls := []struct {
		method, path, ctype, body string
		hdr                       map[string]string
	}{
		{"POST", pathPrepRecv, "application/json", `{"user":"r-1","prompt":[` + strings.Repeat("7,", 39) + `7],"end":-1,"max_tokens":4}`, map[string]string{"X-Request-Id": "abc", "Authorization": "Bearer t"}},
		{"POST", pathRemoteSend, "application/json", `{"user":"r-1","begin":0,"end":39,"kv_addr_info":"CAAAAAAAAABbMSwwLDM5XQ==","recv_rank":0}`, nil},
		{"POST", pathStartGenerate, "application/json", `{"user":"r-1","begin":39,"stream":true}`, map[string]string{"Accept": "text/event-stream"}},
		{"POST", "/v1/kv", "application/octet-stream", strings.Repeat("\x00\x01", 500), map[string]string{"KV-Append-Metadata": "CAAAAAAAAABbMSwwLDM5XQ==", "KV-Offset": "0"}},
		{"GET", "/metrics", "", "", nil},
		{"PUT", "/teapot?x=1&y=%20", "text/plain", "short and stout", map[string]string{"X-Forwarded-For": "10.0.0.1"}},
		{"GET", "/nowhere", "", "", nil},
	}
	for _, c := range calls {
		var answers []string
		before := len(rec.got)
		for _, cl := range []*http.Client{direct, proxied} {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, _ := http.NewRequest(c.method, rec.srv.URL+c.path, body)
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", c.method, c.path, err)
			}
			answers = append(answers, dumpResponse(t, resp))
		}
		if len(rec.got) != before+2 {
			t.Fatalf("%s %s: the upstream got %d requests, want 2", c.method, c.path, len(rec.got)-before)
		}
		if d, p := rec.got[before], rec.got[before+1]; !bytes.Equal(d, p) {
			t.Errorf("%s %s: the upstream got\n%s\nthrough the tap, and without it\n%s", c.method, c.path, p, d)
		}
		if answers[0] != answers[1] {
			t.Errorf("%s %s: the client got\n%s\nthrough the tap, and without it\n%s", c.method, c.path, answers[1], answers[0])
		}
	}
}

// Server-sent events pass as they come: the client reads a chunk while the instance has not
// written the next (the instance waits for the test to let it go on).
func TestForwardingStreamsEventsAsTheyCome(t *testing.T) {
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\" lo\"}]}\n\n")
			w.(http.Flusher).Flush()
			if i < 2 {
				<-next
			}
		}
	}))
	defer up.Close()
	_, _, cl := serveTap(t, Config{})
	resp, err := cl.Post(up.URL+pathStartGenerate, "application/json", strings.NewReader(`{"user":"s","begin":1,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	for i := range 3 {
		got := make(chan int, 1)
		go func() { n, _ := io.ReadAtLeast(resp.Body, buf, len("data: {}")); got <- n }()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("chunk %d did not arrive while the instance waited: the tap holds it back", i)
		}
		if i < 2 {
			next <- struct{}{}
		}
	}
}

// Large bodies stream both ways: the instance reads the first megabyte of a request while
// the client has not sent the rest, and a 64 MiB answer arrives whole.
func TestForwardingStreamsLargeBodies(t *testing.T) {
	const size = 64 << 20
	started := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		if r.Method == http.MethodPost {
			if _, err := io.CopyN(h, r.Body, 1<<20); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			close(started)
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(w, "%d %s", n+1<<20, hex.EncodeToString(h.Sum(nil)))
			return
		}
		chunk := bytes.Repeat([]byte("kv"), 1<<19)
		for range size / len(chunk) {
			w.Write(chunk)
		}
	}))
	defer up.Close()
	_, _, cl := serveTap(t, Config{})
	pr, pw := io.Pipe()
	want := sha256.New()
	go func() {
		block := bytes.Repeat([]byte{7}, 1<<20)
		pw.Write(block)
		want.Write(block)
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			pw.CloseWithError(fmt.Errorf("the instance did not see the first megabyte: the tap holds the body back"))
			return
		}
		for range size/len(block) - 1 {
			pw.Write(block)
			want.Write(block)
		}
		pw.Close()
	}()
	resp, err := cl.Post(up.URL+"/v1/kv", "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got, wantS := string(b), fmt.Sprintf("%d %s", size, hex.EncodeToString(want.Sum(nil))); got != wantS {
		t.Errorf("the instance got %q, want %q", got, wantS)
	}
	resp, err = cl.Get(up.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n != size {
		t.Errorf("the answer came with %d bytes, want %d", n, size)
	}
}

// A call the tap would forward to itself is refused, as is an upstream that is the tap.
func TestProxyLoopIsRefused(t *testing.T) {
	tp, srv, cl := serveTap(t, Config{})
	for _, target := range []string{srv.URL, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)} {
		resp, err := cl.Post(target+pathPrepRecv, "application/json", strings.NewReader(`{"user":"l","prompt":[1,2],"end":-1}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(string(b), "proxy loop") {
			t.Errorf("a call to %s through the tap = %d %s, want 508 proxy loop", target, resp.StatusCode, b)
		}
	}
	if _, err := tp.Reverse(srv.URL); err == nil || !strings.Contains(err.Error(), "loop") {
		t.Errorf("Reverse(the tap) = %v, want a loop refused", err)
	}
	if _, err := tp.Reverse("https://x:1"); err == nil {
		t.Error("Reverse(https) accepted")
	}
}

// Reverse-proxy mode: a port that forwards origin-form calls to its upstream, whose shadow
// follows it as in forward-proxy mode.
func TestReverseProxyPort(t *testing.T) {
	cfg := smallConfig()
	d := startDecode(t, cfg, nil)
	tp, api, _ := serveTap(t, Config{Engine: cfg})
	h, err := tp.Reverse(d.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	port := httptest.NewServer(h)
	defer port.Close()
	tp.AddSelf(strings.TrimPrefix(port.URL, "http://"))
	resp, err := http.Post(port.URL+pathPrepRecv, "application/json", strings.NewReader(`{"user":"rv","prompt":[`+strings.Repeat("3,", 49)+`3],"end":-1,"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("prep_recv through the reverse port: %s", resp.Status)
	}
	ctx := t.Context()
	if err := tp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s := getSnapshot(t, api.URL+"/v1/snapshot?instance="+url.QueryEscape(d.addr()))
	if diff := engine.ShadowDiff(d.snapshot(t), s); diff != nil {
		t.Errorf("the shadow of the reverse port's upstream differs:\n%s", strings.Join(diff, "\n"))
	}
}
