package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/wire/protocol"
)

// readBody reads a call's body up to limit bytes; beyond, 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, call string) ([]byte, error) {
	tooLarge := func() error {
		drain(w, r)
		return errorf(http.StatusRequestEntityTooLarge, errTooLarge, "%s: the body is over the limit of %d bytes", call, limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, errorf(http.StatusBadRequest, errInvalidRequest, "%s: reading the body: %v", call, err)
	}
	if int64(len(b)) > limit {
		return nil, tooLarge()
	}
	return b, nil
}

// What drain reads of a refused body at most, and for how long.
const (
	drainBytes = 8 << 20
	drainTime  = 2 * time.Second
)

// drain reads and discards the rest of a body that is refused for its size, up to a bound,
// so that a client that sends its whole body before it reads the answer (most do) gets the
// 413 rather than a connection reset. A body too large to drain is not read at all: the
// connection closes after the answer.
func drain(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > drainBytes {
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(drainTime))
	_, _ = io.CopyN(io.Discard, r.Body, drainBytes)
	_ = rc.SetReadDeadline(time.Time{})
}

// PrepRecvAnswer is prep_recv's answer. MLC drops prompt_length at its HTTP layer; kvtop
// keeps it.
type PrepRecvAnswer struct {
	PromptLength        int    `json:"prompt_length"`
	PrefixMatchedLength int    `json:"prefix_matched_length"`
	KVAppendMetadata    string `json:"kv_append_metadata"`
}

func (s *Server) prepRecv(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(w, r, s.lim.MaxBodyBytes, "prep_recv")
	if err != nil {
		return err
	}
	pr, err := DecodePrepRecv(b, s.lim.MaxTokens)
	if err != nil {
		return err
	}
	start := s.opts.Clock()
	traced := func(error) {}
	if s.opts.PrepRecvTrace != nil {
		traced = s.opts.PrepRecvTrace(pr.ID, r.Header)
	}
	ans, err := s.r.PrepRecv(r.Context(), pr)
	traced(err)
	if err != nil {
		return err
	}
	s.metrics.prepWait(pr.ID, s.opts.Clock().Sub(start))
	writeJSON(w, http.StatusOK, PrepRecvAnswer{
		PromptLength:        ans.PromptLength,
		PrefixMatchedLength: ans.PrefixMatchedLength,
		KVAppendMetadata:    ans.KVAppendMetadata,
	})
	return nil
}

func (s *Server) remoteSend(http.ResponseWriter, *http.Request) error {
	return errorf(http.StatusBadRequest, errUnsupported,
		"remote_send: this is a decode instance (kvtop serve); remote_send is the prefill instance's call. "+
			"Send it to the prefill instance, which writes the KV here with POST /v1/kv")
}

// Completion is a completion in the OpenAI completions shape: the whole answer of a
// start_generate, or one chunk of its stream.
type Completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"` // "text_completion"
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
}

// Choice is the one choice of a completion (kvtop supports n = 1).
type Choice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// Usage counts a completion's tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (s *Server) startGenerate(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(w, r, s.lim.MaxBodyBytes, "start_generate")
	if err != nil {
		return err
	}
	sg, err := decodeStartGenerate(b)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var rv engine.RequestView
	var found bool
	// Asked even if the client goes away meanwhile: StartGenerate then ends the request
	// rather than leave it prepared.
	if err := s.r.Do(context.WithoutCancel(ctx), func(e *engine.Engine, _ time.Time) error {
		rv, found = e.Request(sg.ID)
		return nil
	}); err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("start_generate %s: %w", sg.ID, engine.ErrUnknownRequest)
	}
	if sg.HasEnd {
		end := sg.End
		if end < 0 {
			end += rv.PromptLength
		}
		if end != rv.PromptLength {
			return errorf(http.StatusBadRequest, "bad_window", "start_generate %s: end %d must be absent or the prompt length %d", sg.ID, sg.End, rv.PromptLength)
		}
	}
	toks, err := s.r.StartGenerate(ctx, sg.ID, sg.Begin)
	if err != nil {
		return err
	}
	model := sg.Model
	if model == "" {
		model = "kvtop-sim"
	}
	c := Completion{ID: "cmpl-" + sg.ID, Object: "text_completion", Created: s.opts.Clock().Unix(), Model: model}
	usage := Usage{PromptTokens: rv.PromptLength}
	if sg.Stream {
		return s.streamCompletion(ctx, w, sg, toks, c, usage)
	}
	var text strings.Builder
	for {
		select {
		case t, ok := <-toks:
			if !ok {
				return errorf(http.StatusServiceUnavailable, errUnavailable, "start_generate %s: the engine stopped", sg.ID)
			}
			if t.Token >= 0 {
				text.WriteString(TokenText(t.Token))
				usage.CompletionTokens++
			}
			if t.Final {
				reason := t.FinishReason
				usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
				c.Choices = []Choice{{Text: text.String(), FinishReason: &reason}}
				c.Usage = &usage
				writeJSON(w, http.StatusOK, c)
				return nil
			}
		case <-ctx.Done():
			s.abortGone(sg.ID)
			return ctx.Err()
		}
	}
}

// streamCompletion writes a completion as server-sent events: a chunk a token, the last
// with its finish reason, a usage chunk when asked for, then [DONE].
func (s *Server) streamCompletion(ctx context.Context, w http.ResponseWriter, sg startGenerate, toks <-chan engine.Token, c Completion, usage Usage) error {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) error {
		// A reader that stops reading is let go after the write timeout, and its request
		// aborted, instead of holding the handler and its tokens.
		_ = rc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
		if _, err := fmt.Fprintf(w, "data: %s\n\n", mustJSON(v)); err != nil {
			return err
		}
		return rc.Flush()
	}
	for {
		select {
		case t, ok := <-toks:
			if !ok {
				return send(struct {
					Error protocol.ErrorBody `json:"error"`
				}{protocol.ErrorBody{Message: fmt.Sprintf("start_generate %s: the engine stopped", sg.ID), Type: errUnavailable}})
			}
			ch := c
			ch.Choices = []Choice{{Text: TokenText(t.Token)}}
			if t.Token >= 0 {
				usage.CompletionTokens++
			}
			if t.Final {
				reason := t.FinishReason
				ch.Choices[0].FinishReason = &reason
			}
			if err := send(ch); err != nil {
				s.abortGone(sg.ID)
				return err
			}
			if !t.Final {
				continue
			}
			if sg.IncludeUsage {
				usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
				u := c
				u.Choices = []Choice{}
				u.Usage = &usage
				if err := send(u); err != nil {
					return err
				}
			}
			_ = rc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
			if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
				return err
			}
			return rc.Flush()
		case <-ctx.Done():
			s.abortGone(sg.ID)
			return ctx.Err()
		}
	}
}

// abortGone aborts a request whose client went away mid-completion, as MLC does.
func (s *Server) abortGone(id string) {
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	err := s.r.Do(ctx, func(e *engine.Engine, now time.Time) error { return e.Abort(now, id) })
	if err != nil && !errors.Is(err, engine.ErrEnded) {
		s.logf("abort %s after its client went away: %v", id, err)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"error":{"message":"wire: encoding failed","type":"internal_error"}}`)
	}
	return b
}

// KVAnswer is the answer to a KV write.
type KVAnswer struct {
	Tokens   int      `json:"tokens"`   // slots written
	Requests []string `json:"requests"` // the requests they belong to
	Complete []string `json:"complete"` // of which now have all their KV
}

func (s *Server) kv(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	cfg, err := s.config(ctx)
	if err != nil {
		return err
	}
	g := KVGeometry{Models: cfg.Models, TokenBytes: cfg.Arena.TokenBytes(), Slots: int64(cfg.NumPages()) * int64(cfg.PageSize)}
	md, off, tokens := r.Header.Get(HeaderKVMetadata), r.Header.Get(HeaderKVOffset), r.Header.Get(HeaderKVTokens)
	// The headers first: a write they refuse costs no body (read whole, a body is memory).
	limit, err := kvBodyLimit(md, off, tokens, r.ContentLength, g)
	if err != nil {
		return err
	}
	var body []byte
	if limit > 0 {
		body, err = readBody(w, r, min(limit, s.lim.MaxKVBytes), "kv write")
	} else if n, _ := r.Body.Read(make([]byte, 1)); n > 0 {
		// No arena and a body of unknown length: one byte says it is not empty.
		err = errorf(http.StatusBadRequest, "bad_kv_write", "kv write: the engine keeps no KV payload (zero-sized arena), so the body must be empty")
	}
	if err != nil {
		return err
	}
	_, first, n, err := parseKVRange(md, off, tokens, int64(len(body)), g)
	if err != nil {
		return err
	}
	var res engine.KVResult
	if err := s.r.Do(ctx, func(e *engine.Engine, now time.Time) error {
		var err error
		res, err = e.WriteKV(now, engine.KVWrite{Metadata: md, Offset: int(first), Tokens: int(n), Payload: body})
		return err
	}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, KVAnswer{Tokens: int(n), Requests: nonNil(res.Requests), Complete: nonNil(res.Complete)})
	return nil
}

// kvBodyLimit checks a KV write's headers before its body is read, and returns the most
// body they allow. With the body's length known (Content-Length) every check is made on
// it; without, the metadata and the range are checked on the length the headers imply.
func kvBodyLimit(md, off, tokens string, contentLength int64, g KVGeometry) (int64, error) {
	if contentLength >= 0 {
		_, _, _, err := parseKVRange(md, off, tokens, contentLength, g)
		return contentLength, err
	}
	per := int64(g.Models) * int64(g.TokenBytes)
	if per == 0 {
		_, _, _, err := parseKVRange(md, off, tokens, 0, g)
		return 0, err
	}
	if tokens == "" {
		// One token's worth checks the metadata and the offset; the body says how many.
		_, _, _, err := parseKVRange(md, off, "1", per, g)
		return math.MaxInt64, err
	}
	t, _ := strconv.ParseInt(tokens, 10, 64)
	if t < 1 || t > g.Slots {
		t = 0 // parseKVRange names what is wrong with the header
	}
	_, _, n, err := parseKVRange(md, off, tokens, t*per, g)
	return n * per, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// AbortAnswer is the answer to /debug/abort: the request's state after it.
type AbortAnswer struct {
	User   string              `json:"user"`
	State  engine.RequestState `json:"state"`
	Leaked bool                `json:"leaked"`
}

func (s *Server) abort(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(w, r, s.lim.MaxBodyBytes, "abort")
	if err != nil {
		return err
	}
	id, err := decodeAbort(b)
	if err != nil {
		return err
	}
	var ans AbortAnswer
	if err := s.r.Do(r.Context(), func(e *engine.Engine, now time.Time) error {
		if err := e.Abort(now, id); err != nil {
			return err
		}
		rv, _ := e.Request(id)
		ans = AbortAnswer{User: id, State: rv.State, Leaked: rv.Leaked}
		return nil
	}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ans)
	return nil
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) error {
	var snap engine.Snapshot
	if err := s.r.Do(r.Context(), func(e *engine.Engine, _ time.Time) error {
		snap = e.Snapshot()
		return nil
	}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &snap) // encoded off the engine's goroutine
	return nil
}

// Health is the answer of /healthz.
type Health struct {
	Status  string `json:"status"` // "ok"
	Version string `json:"version"`
	Step    uint64 `json:"step"`
	Paused  bool   `json:"paused"`
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	var step uint64
	if err := s.r.Do(ctx, func(e *engine.Engine, _ time.Time) error { step = e.StepNumber(); return nil }); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, Health{Status: "ok", Version: s.opts.Version, Step: step, Paused: s.r.Status().Paused})
	return nil
}

func (s *Server) dumpTrace(w http.ResponseWriter, r *http.Request) error {
	if _, err := readBody(w, r, s.lim.MaxBodyBytes, "dump_event_trace"); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(s.trace.dump())
	return err
}
