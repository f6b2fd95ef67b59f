package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/wire"
	"github.com/kvtop/kvtop/wire/protocol"
)

// httpDrive runs a scenario's router and prefill instance against a decode instance over
// its HTTP API, as real ones would: prep_recv and start_generate calls that wait for their
// answers on their own goroutines, and KV writes to /v1/kv. The driver itself stays on one
// goroutine: answers come back to it through a channel it drains at every tick.
//
// The prep_recv calls waiting for admission are bounded (maxDrivePrepRecv): a workload that
// arrives faster than the engine admits has the rest refused at once, as an overloaded
// router would, instead of piling up goroutines.
type httpDrive struct {
	base, token string
	client      *http.Client
	obs         chan func(*sim.Driver, sim.Calls)
	ctx         context.Context
	wg          sync.WaitGroup
	preps       chan struct{} // a token per prep_recv call in flight
}

// maxDrivePrepRecv bounds the driver's prep_recv calls in flight; it stays under
// --max-waiting's default, so the driver alone does not meet the server's 503.
const maxDrivePrepRecv = 256

// errDriveBusy refuses a request the driver has no room to send.
var errDriveBusy = errors.New("driver: too many prep_recv calls waiting for admission; the request is dropped")

// driveHTTP runs the scenario against the server at base until ctx ends.
func driveHTTP(ctx context.Context, base, token string, sc sim.Scenario, opts sim.Options) error {
	w, err := sc.New(opts)
	if err != nil {
		return err
	}
	d := sim.NewDriver(w, sc.Driver)
	h := &httpDrive{base: strings.TrimRight(base, "/"), token: token, client: &http.Client{}, obs: make(chan func(*sim.Driver, sim.Calls), 4096), ctx: ctx,
		preps: make(chan struct{}, maxDrivePrepRecv)}
	defer h.wg.Wait()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for len(h.obs) > 0 {
			(<-h.obs)(d, h)
		}
		d.Tick(time.Since(start), h)
	}
}

// post sends a JSON body (or raw bytes with headers) and decodes a 200 answer into out; any
// other status is an error carrying the server's message.
func (h *httpDrive) post(path string, body []byte, hdr map[string]string, out any) (*http.Response, error) {
	req, err := http.NewRequestWithContext(h.ctx, http.MethodPost, h.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct {
			Error protocol.ErrorBody `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			return nil, fmt.Errorf("%s: %d %s: %s", path, resp.StatusCode, e.Error.Type, e.Error.Message)
		}
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	if out != nil {
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return resp, nil
}

func (h *httpDrive) send(f func(*sim.Driver, sim.Calls)) {
	select {
	case h.obs <- f:
	case <-h.ctx.Done():
	}
}

// PrepRecv sends prep_recv and waits for the answer on its own goroutine.
func (h *httpDrive) PrepRecv(pr engine.PrepRecv) error {
	call := map[string]any{"user": pr.ID, "prompt": pr.Prompt, "end": pr.End}
	if pr.MaxTokens > 0 { // 0 is "not said" (a trace's output length may be 0); the server refuses an explicit 0
		call["max_tokens"] = pr.MaxTokens
	}
	body, err := json.Marshal(call)
	if err != nil {
		return err
	}
	select {
	case h.preps <- struct{}{}:
	default:
		return fmt.Errorf("prep_recv %s: %w", pr.ID, errDriveBusy)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer func() { <-h.preps }()
		var ans struct {
			PromptLength        int    `json:"prompt_length"`
			PrefixMatchedLength int    `json:"prefix_matched_length"`
			KVAppendMetadata    string `json:"kv_append_metadata"`
		}
		if _, err := h.post("/microserving/prep_recv", body, nil, &ans); err != nil {
			h.send(func(d *sim.Driver, _ sim.Calls) { d.Failed(pr.ID, err) })
			return
		}
		h.send(func(d *sim.Driver, c sim.Calls) {
			d.Admitted(pr.ID, ans.KVAppendMetadata, ans.PromptLength, ans.PrefixMatchedLength, c)
		})
	}()
	return nil
}

// WriteKV writes the KV of n tokens from offset, as a prefill instance would. The server
// keeps no payload unless it runs with --arena; the simulator then sends zeros.
func (h *httpDrive) WriteKV(id, metadata string, offset, n int) error {
	hdr := map[string]string{
		"KV-Append-Metadata": metadata,
		"KV-Offset":          strconv.Itoa(offset),
		"KV-Tokens":          strconv.Itoa(n),
		"Content-Type":       "application/octet-stream",
	}
	_, err := h.post("/v1/kv", h.payload(n), hdr, &struct{}{})
	return err
}

// payload is the body of a KV write: empty for a server without an arena.
func (h *httpDrive) payload(n int) []byte { return nil }

// StartGenerate calls start_generate with a streamed answer and reads the tokens on its own
// goroutine.
func (h *httpDrive) StartGenerate(id string, begin int) error {
	body, err := json.Marshal(map[string]any{"user": id, "begin": begin, "stream": true})
	if err != nil {
		return err
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		resp, err := h.post("/microserving/start_generate", body, nil, nil)
		if err != nil {
			h.send(func(d *sim.Driver, _ sim.Calls) { d.Failed(id, err) })
			return
		}
		defer resp.Body.Close()
		if err := h.readStream(id, resp.Body); err != nil {
			h.send(func(d *sim.Driver, _ sim.Calls) { d.Failed(id, err) })
		}
	}()
	return nil
}

// readStream reads a completion's server-sent events: each chunk's text is a token,
// rendered by wire.TokenText; the last carries the finish reason.
func (h *httpDrive) readStream(id string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return nil
		}
		var chunk wire.Completion
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			return fmt.Errorf("start_generate %s: chunk: %w", id, err)
		}
		if len(chunk.Choices) == 0 {
			continue
		}
		ch := chunk.Choices[0]
		toks, err := wire.ParseTokenText(ch.Text)
		if err != nil {
			return fmt.Errorf("start_generate %s: %w", id, err)
		}
		reason := ""
		if ch.FinishReason != nil {
			reason = *ch.FinishReason
		}
		h.send(func(d *sim.Driver, c sim.Calls) {
			for _, t := range toks {
				d.Token(id, t)
			}
			if reason != "" {
				d.Ended(id, reason, c)
			}
		})
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("start_generate " + id + ": the stream ended without [DONE]")
}

// Abort aborts a request, as a client going away does.
func (h *httpDrive) Abort(id string) error {
	body, _ := json.Marshal(map[string]string{"user": id})
	_, err := h.post("/debug/abort", body, nil, &struct{}{})
	return err
}
