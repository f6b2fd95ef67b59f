package tap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/wire"
)

// The calls the tap understands, by path; every other call is forwarded and only counted.
const (
	pathPrepRecv      = "/microserving/prep_recv"
	pathStartGenerate = "/microserving/start_generate"
	pathRemoteSend    = "/microserving/remote_send"
	pathAbort         = "/debug/abort" // kvtop serve's
)

// call is one forwarded call, as the proxy's hooks see it.
type call struct {
	target string // host:port
	path   string
	id     string
	begin  int
	stream bool
	d      string // for remote_send: the decode instance of the request
}

type callKey struct{}

// forward sends a call on to target and its answer back, observing what it understands.
func (t *Tap) forward(w http.ResponseWriter, r *http.Request, target string) {
	if t.isSelf(target) {
		wire.WriteError(w, http.StatusLoopDetected, "proxy_loop", "%s %s: %s is the tap itself: a proxy loop (is the tap's HTTP_PROXY set to itself?)", r.Method, r.URL.Path, target)
		return
	}
	c := &call{target: target, path: r.URL.Path}
	in := t.instanceOf(target)
	t.mu.Lock()
	in.calls++
	restart := in.unreachable && !in.resetDone
	if restart {
		in.resetDone = true
	}
	sh := in.sh
	t.mu.Unlock()
	if restart && sh != nil {
		// It was unreachable: whatever answers now knows nothing of what it held (a restart,
		// or another process). The shadow starts over before this call's observations.
		sh.offer(obs{kind: obsReset, at: t.cfg.Clock(), reason: target + " was unreachable: assumed restarted, the shadow starts over"})
	}
	if r.Method == http.MethodPost && isObserved(c.path) && r.Body != nil && r.ContentLength <= t.cfg.MaxObservedBody {
		// The body is read here, then sent on as it came: these bodies are small JSON, and
		// the prep_recv must reach the shadow before its answer can.
		body, err := io.ReadAll(io.LimitReader(r.Body, t.cfg.MaxObservedBody+1))
		if err != nil {
			wire.WriteError(w, http.StatusBadRequest, "invalid_request", "%s %s: reading the body: %v", r.Method, r.URL.Path, err)
			return
		}
		rest := r.Body
		if int64(len(body)) > t.cfg.MaxObservedBody {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), rest), rest}
		} else {
			r.Body = io.NopCloser(bytes.NewReader(body))
			t.observeRequest(c, body)
		}
	}
	t.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
}

func isObserved(path string) bool {
	switch path {
	case pathPrepRecv, pathStartGenerate, pathRemoteSend, pathAbort:
		return true
	}
	return false
}

// rewrite points the outgoing call at its target and keeps what the client sent: the
// ReverseProxy has already taken off the hop-by-hop headers.
func (t *Tap) rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(callKey{}).(*call)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = c.target
	pr.Out.Host = pr.In.Host
	if pr.Out.Host == "" {
		pr.Out.Host = c.target
	}
	// The ReverseProxy drops the X-Forwarded headers before Rewrite; the client's go on.
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		if v, ok := pr.In.Header[h]; ok {
			pr.Out.Header[h] = v
		}
	}
}

// observeRequest reads what a call says before it is sent.
func (t *Tap) observeRequest(c *call, body []byte) {
	now := t.cfg.Clock()
	switch c.path {
	case pathPrepRecv:
		pr, err := wire.DecodePrepRecv(body, 1<<31-1) // D bounds max_tokens; the tap takes what D takes
		if err != nil {
			return // D refuses it too; nothing arrives
		}
		c.id = pr.ID
		if sh := t.shadowOf(c.target); sh != nil {
			t.mu.Lock()
			t.owner[pr.ID] = c.target
			t.mu.Unlock()
			sh.offer(obs{kind: obsArrived, at: now, id: pr.ID, pr: pr})
		}
	case pathStartGenerate:
		var b struct {
			User   string `json:"user"`
			Begin  *int   `json:"begin"`
			Stream bool   `json:"stream"`
		}
		if json.Unmarshal(body, &b) == nil && b.Begin != nil {
			c.id, c.begin, c.stream = b.User, *b.Begin, b.Stream
		}
	case pathRemoteSend:
		var b struct {
			User string `json:"user"`
		}
		if json.Unmarshal(body, &b) == nil {
			c.id = b.User
			t.mu.Lock()
			c.d = t.owner[b.User]
			t.mu.Unlock()
		}
	case pathAbort:
		var b struct {
			User string `json:"user"`
		}
		if json.Unmarshal(body, &b) == nil {
			c.id = b.User
		}
	}
}

// modifyResponse observes an answer as it passes: its status at once, its body as it streams
// (the body the client reads is the same bytes, read through the observer).
func (t *Tap) modifyResponse(resp *http.Response) error {
	c, _ := resp.Request.Context().Value(callKey{}).(*call)
	if c == nil {
		return nil
	}
	in := t.instanceOf(c.target)
	t.mu.Lock()
	if in.unreachable {
		in.unreachable, in.resetDone = false, false
		if strings.HasPrefix(in.note, "unreachable") {
			in.note = ""
		}
	}
	if resp.StatusCode >= 500 {
		in.failures++
	}
	t.mu.Unlock()
	if c.id == "" {
		if resp.StatusCode == http.StatusNotFound && isObserved(c.path) {
			t.setRole(c.target, "", "answers 404 to "+c.path+": not an MLC microserving instance?")
		}
		return nil
	}
	ok := resp.StatusCode == http.StatusOK
	switch c.path {
	case pathPrepRecv:
		sh := t.existingShadow(c.target)
		if sh == nil {
			return nil
		}
		if !ok {
			if resp.StatusCode == http.StatusNotFound {
				t.setRole(c.target, "", "answers 404 to prep_recv: not an MLC microserving instance?")
			}
			sh.offer(obs{kind: obsRefused, at: t.cfg.Clock(), id: c.id})
			return nil
		}
		t.setRole(c.target, RoleDecode, "")
		resp.Body = &captured{ReadCloser: resp.Body, limit: 1 << 20, done: func(b []byte, err error) {
			var ans engine.Answer
			if err == nil && json.Unmarshal(b, &ans) == nil {
				sh.offer(obs{kind: obsAdmitted, at: t.cfg.Clock(), id: c.id, ans: ans})
				return
			}
			// The answer broke off: D admitted the request, the router never learned where its
			// KV goes. MLC's router gives up on it; it leaks on D as an aborted prepared request.
			sh.offer(obs{kind: obsAborted, at: t.cfg.Clock(), id: c.id})
		}}
	case pathStartGenerate:
		if !ok {
			if resp.StatusCode == http.StatusNotFound {
				t.setRole(c.target, "", "answers 404 to start_generate: not an MLC microserving instance?")
			}
			return nil
		}
		t.setRole(c.target, RoleDecode, "")
		sh := t.shadowOf(c.target)
		if sh == nil {
			return nil
		}
		now := t.cfg.Clock()
		sh.offer(obs{kind: obsStarted, at: now, id: c.id, begin: c.begin})
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			resp.Body = &sseObserver{ReadCloser: resp.Body, t: t, sh: sh, id: c.id}
		} else {
			resp.Body = &captured{ReadCloser: resp.Body, limit: 8 << 20, done: func(b []byte, err error) {
				if err != nil {
					sh.offer(obs{kind: obsEnded, at: t.cfg.Clock(), id: c.id, reason: engine.AbortByClient})
					return
				}
				t.completion(sh, c.id, b)
			}}
		}
	case pathRemoteSend:
		if ok {
			t.setRole(c.target, RolePrefill, "")
		}
		if c.d == "" {
			return nil
		}
		sh := t.existingShadow(c.d)
		if sh == nil || !ok {
			if !ok {
				t.setRole(c.target, "", "remote_send of "+c.id+" answered "+resp.Status)
			}
			return nil
		}
		// P answers once it has sent the KV: read the answer through, then the KV is in.
		resp.Body = &captured{ReadCloser: resp.Body, limit: 1 << 16, done: func(_ []byte, err error) {
			if err == nil {
				sh.offer(obs{kind: obsKV, at: t.cfg.Clock(), id: c.id})
			}
		}}
	case pathAbort:
		if sh := t.existingShadow(c.target); sh != nil && ok {
			sh.offer(obs{kind: obsAborted, at: t.cfg.Clock(), id: c.id})
		}
	}
	return nil
}

// completion observes a start_generate answered in one piece.
func (t *Tap) completion(sh *shadow, id string, b []byte) {
	var c wire.Completion
	if json.Unmarshal(b, &c) != nil || len(c.Choices) == 0 {
		return
	}
	ch := c.Choices[0]
	toks, n := tokensOf(ch.Text)
	if c.Usage != nil && toks == nil {
		n = c.Usage.CompletionTokens
	}
	now := t.cfg.Clock()
	if n > 0 {
		sh.offer(obs{kind: obsTokens, at: now, id: id, n: n, tokens: toks})
	}
	if ch.FinishReason != nil {
		sh.offer(obs{kind: obsEnded, at: now, id: id, reason: *ch.FinishReason})
	}
}

// tokensOf reads a chunk's text: kvtop serve's tokens when it is theirs, else one token of
// unknown id for text that is not empty.
func tokensOf(text string) ([]int32, int) {
	if text == "" {
		return nil, 0
	}
	if toks, err := wire.ParseTokenText(text); err == nil {
		return toks, len(toks)
	}
	return nil, 1
}

// proxyError answers a call that could not be forwarded, or whose client went away.
func (t *Tap) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c, _ := r.Context().Value(callKey{}).(*call)
	gone := r.Context().Err() != nil
	if c != nil {
		in := t.instanceOf(c.target)
		t.mu.Lock()
		if !gone {
			// No answer at all: the instance is down, or gone and maybe back later as
			// another process.
			in.failures++
			in.unreachable = true
			in.note = "unreachable: " + err.Error()
		}
		t.mu.Unlock()
		if c.id != "" && (c.path == pathPrepRecv || c.path == pathStartGenerate) {
			if sh := t.existingShadow(c.target); sh != nil {
				// A client that leaves aborts its request on D; a call that never reached D
				// did nothing there (the shadow drops the request too).
				kind := obsAborted
				if !gone && c.path == pathPrepRecv {
					kind = obsRefused
				}
				sh.offer(obs{kind: kind, at: t.cfg.Clock(), id: c.id})
			}
		}
	}
	if gone {
		return
	}
	wire.WriteError(w, http.StatusBadGateway, "bad_gateway", "%s %s: the tap could not reach %s: %v", r.Method, r.URL.Path, r.URL.Host, err)
}

// existingShadow returns a decode instance's shadow if it has one.
func (t *Tap) existingShadow(addr string) *shadow {
	t.mu.Lock()
	defer t.mu.Unlock()
	if in := t.insts[addr]; in != nil {
		return in.sh
	}
	return nil
}

// captured passes a body through and hands what it read (up to limit) to done at its end:
// err is nil when it ended cleanly.
type captured struct {
	io.ReadCloser
	limit int
	buf   []byte
	done  func([]byte, error)
	fired bool
}

func (c *captured) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if len(c.buf)+n <= c.limit {
		c.buf = append(c.buf, p[:n]...)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			c.fire(nil)
		} else {
			c.fire(err)
		}
	}
	return n, err
}

func (c *captured) Close() error {
	c.fire(io.ErrUnexpectedEOF)
	return c.ReadCloser.Close()
}

func (c *captured) fire(err error) {
	if !c.fired {
		c.fired = true
		c.done(c.buf, err)
	}
}

// sseObserver passes a server-sent event stream through, observing each data line as it
// goes by: the tokens, the finish reason, and a stream that breaks off.
type sseObserver struct {
	io.ReadCloser
	t     *Tap
	sh    *shadow
	id    string
	line  []byte
	batch []byte // the payloads of the chunks of this read, a line each
	ended bool
}

// maxSSELine bounds a line the observer keeps; a longer one is passed on unobserved.
const maxSSELine = 1 << 20

func (s *sseObserver) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	b := p[:n]
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(s.line)+len(b) <= maxSSELine {
				s.line = append(s.line, b...)
			}
			break
		}
		if len(s.line)+i <= maxSSELine {
			s.line = append(s.line, b[:i]...)
		}
		s.data(bytes.TrimRight(s.line, "\r"))
		s.line = s.line[:0]
		b = b[i+1:]
	}
	// One observation a read, whatever chunks it brought: the stream pays a copy and one
	// offer, and the chunks are read on the shadow's goroutine.
	if len(s.batch) > 0 {
		s.sh.offer(obs{kind: obsChunk, at: s.t.cfg.Clock(), id: s.id, raw: s.batch})
		s.batch = nil
	}
	if err != nil {
		s.end()
	}
	return n, err
}

func (s *sseObserver) Close() error {
	s.end()
	return s.ReadCloser.Close()
}

// end observes a stream that ended without a finish reason: the call broke off, and D
// aborts a request whose client went away.
func (s *sseObserver) end() {
	if !s.ended {
		s.ended = true
		s.sh.offer(obs{kind: obsEnded, at: s.t.cfg.Clock(), id: s.id, reason: engine.AbortByClient})
	}
}

func (s *sseObserver) data(line []byte) {
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || s.ended {
		return
	}
	payload = bytes.TrimSpace(payload)
	if string(payload) == "[DONE]" {
		return
	}
	if bytes.Contains(payload, []byte(`"finish_reason":"`)) {
		s.ended = true // the stream's end is the chunk's to say; none is inferred after it
	}
	if len(s.batch) > 0 {
		s.batch = append(s.batch, '\n')
	}
	s.batch = append(s.batch, payload...)
}

// parseChunk reads the completion chunks of one observation (on the shadow's goroutine):
// their tokens, and the finish reason.
func (sh *shadow) parseChunk(o obs) ([]int32, int, string) {
	var toks []int32
	n, unknown := 0, false
	for line := range bytes.SplitSeq(o.raw, []byte("\n")) {
		var c wire.Completion
		if json.Unmarshal(line, &c) != nil || len(c.Choices) == 0 {
			continue
		}
		ch := c.Choices[0]
		t, k := tokensOf(ch.Text)
		unknown = unknown || (k > 0 && t == nil)
		toks, n = append(toks, t...), n+k
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			return known(toks, unknown), n, *ch.FinishReason
		}
	}
	return known(toks, unknown), n, ""
}

// known is toks, or nil when some of their ids were not shown (the shadow's stand-ins then
// stand for all of them).
func known(toks []int32, unknown bool) []int32 {
	if unknown {
		return nil
	}
	return toks
}
