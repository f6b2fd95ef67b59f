package wire_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
)

// The worked examples of the spec (section 9), through the HTTP API, with the metadata
// strings byte for byte.

func wantAnswer(t *testing.T, call string, got wire.PrepRecvAnswer, promptLen, matched int, md string) {
	t.Helper()
	want := wire.PrepRecvAnswer{PromptLength: promptLen, PrefixMatchedLength: matched, KVAppendMetadata: md}
	if got != want {
		t.Fatalf("%s = %+v, want %+v", call, got, want)
	}
}

// Example 1: a fresh engine, a 40-token prompt, end -1: 39 slots on pages 0-2, and
// start_generate commits the last prompt token.
func TestExample1FreshEngine(t *testing.T) {
	h := newHarness(t, setup{})
	ans := h.prepRecv("A", prompt(40, 1), -1, 4)
	wantAnswer(t, "prep_recv(A, 40 tokens, end -1)", ans, 40, 0, "CAAAAAAAAABbMSwwLDM5XQ==")
	var free, total int
	h.engine(func(e *engine.Engine) { free, total = e.Cache().NumAvailablePages(), e.Cache().TotalSequenceLength() })
	if free != 510 || total != 39 {
		t.Errorf("after prep_recv: %d free pages, total length %d; want 510, 39", free, total)
	}
	if status, b := h.writeKV(ans.KVAppendMetadata, -1, 0, nil); status != http.StatusOK {
		t.Fatalf("KV write = %d %s", status, b)
	}
	c := h.startGenerate("A", 39)
	if got := c.Usage; got == nil || got.CompletionTokens != 4 || got.PromptTokens != 40 {
		t.Errorf("completion usage = %+v, want 40 prompt and 4 completion tokens", got)
	}
	var started engine.RequestView = h.request("A")
	if started.MaxTokens != 5 || started.Generated != 5 {
		t.Errorf("A after the committed last token: max_tokens %d, generated %d; want 5, 5 (4 + the committed one)", started.MaxTokens, started.Generated)
	}
}

// Examples 2 and 3: B forks from the prepared A at a page boundary (16) or mid-page (20).
func TestExample2And3Forks(t *testing.T) {
	for _, tc := range []struct {
		shared  int
		md      string
		matched int
	}{
		{16, "CQAAAAAAAABbMSw0OCwyM10=", 16}, // [1,48,23]
		{20, "CQAAAAAAAABbMSw1MiwxOV0=", 20}, // [1,52,19]: page 3 gets a copy of 4 slots
	} {
		t.Run(fmt.Sprintf("shared=%d", tc.shared), func(t *testing.T) {
			h := newHarness(t, setup{})
			a := prompt(40, 1)
			wantAnswer(t, "prep_recv(A)", h.prepRecv("A", a, -1, 4), 40, 0, "CAAAAAAAAABbMSwwLDM5XQ==")
			b := prompt(40, 2)
			copy(b, a[:tc.shared])
			wantAnswer(t, "prep_recv(B)", h.prepRecv("B", b, -1, 4), 40, tc.matched, tc.md)
		})
	}
}

// Example 4: with the prefix cache disabled, A's pages come back last-freed-first, so B's
// reservation is three runs.
func TestExample4LastFreedFirst(t *testing.T) {
	h := newHarness(t, setup{cfg: func(c *engine.Config) { c.PrefixCache = "disable" }})
	ans := h.prepRecv("A", prompt(21, 1), -1, 1)
	wantAnswer(t, "prep_recv(A, 21 tokens)", ans, 21, 0, prepare.Encode([]int64{1, 0, 20}))
	h.writeKV(ans.KVAppendMetadata, -1, 0, nil)
	h.startGenerate("A", 20) // A finishes and its sequence is removed: pages 0, then 1, freed
	wantAnswer(t, "prep_recv(B, 41 tokens)", h.prepRecv("B", prompt(41, 2), -1, 1), 41, 0, "EwAAAAAAAABbMywxNiwxNiwwLDE2LDMyLDhd")
}

// Example 5: the whole three-call flow for A (KV arrival, a completion of 2 tokens), then B
// with the same prompt reuses A's recycling sequence and pops 3 tokens.
func TestExample5ReuseWithPop(t *testing.T) {
	h := newHarness(t, setup{})
	p := prompt(40, 1)
	ans := h.prepRecv("A", p, -1, 2)
	wantAnswer(t, "prep_recv(A)", ans, 40, 0, "CAAAAAAAAABbMSwwLDM5XQ==")
	if status, b := h.writeKV(ans.KVAppendMetadata, 0, 39, nil); status != http.StatusOK {
		t.Fatalf("KV write of A = %d %s", status, b)
	}
	if st := h.request("A").State; st != engine.StateKVComplete {
		t.Fatalf("A after its KV = %s, want kv-complete", st)
	}
	c := h.startGenerate("A", 39)
	if c.Usage.CompletionTokens != 2 || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("A's completion = %+v, want 2 tokens, finish reason length", c)
	}
	wantAnswer(t, "prep_recv(B, same prompt)", h.prepRecv("B", p, -1, 2), 40, 38, "CAAAAAAAAABbMSwzOCwxXQ==")
	b := h.request("B")
	if b.Match.String() != "reuse" {
		t.Errorf("B's match = %s, want reuse", b.Match)
	}
}

// Example 8: 513 pages and 40-token prompts: 37 prepare-receive requests are admitted in one
// step and the 38th blocks on the watermark (3 + 400 > 402 free).
func TestExample8Capacity(t *testing.T) {
	h := newHarness(t, setup{paused: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		i      int
		status int
		body   []byte
	}
	results := make(chan result, 38)
	for i := range 38 {
		body := jsonBody(t, map[string]any{"user": fmt.Sprint("r", i), "prompt": prompt(40, int32(i+1)), "end": -1})
		go func() {
			status, b := h.call(ctx, http.MethodPost, "/microserving/prep_recv", body, nil)
			results <- result{i, status, b}
		}()
		// One at a time, so the waiting queue is in order.
		waitFor(t, fmt.Sprintf("r%d to arrive", i), func() bool {
			var n uint64
			h.engine(func(e *engine.Engine) { n = e.Totals().Arrived })
			return n == uint64(i+1)
		})
	}
	if err := h.r.Control(feed.Control{Op: feed.ControlStep, N: 1}); err != nil {
		t.Fatal(err)
	}
	for range 37 {
		res := <-results
		if res.status != http.StatusOK {
			t.Fatalf("prep_recv r%d = %d %s, want 200", res.i, res.status, res.body)
		}
		var ans wire.PrepRecvAnswer
		decode(t, res.body, &ans)
		wantAnswer(t, fmt.Sprintf("prep_recv(r%d)", res.i), ans, 40, 0, prepare.Encode([]int64{1, int64(48 * res.i), 39}))
	}
	var steps uint64
	h.engine(func(e *engine.Engine) { steps = e.StepNumber() })
	if steps != 1 {
		t.Errorf("steps = %d, want the 37 admitted in one", steps)
	}
	r37 := h.request("r37")
	if r37.State != engine.StateWaiting || r37.Eval == nil || r37.Eval.Reason != prepare.ReasonWatermark || r37.Eval.FreePages != 402 {
		t.Fatalf("r37 = %s %+v, want waiting, blocked by the watermark with 402 free", r37.State, r37.Eval)
	}
	cancel() // r37's client goes away: the request is aborted
	if res := <-results; res.i != 37 {
		t.Fatalf("the call that ended last is r%d's, want r37's", res.i)
	}
	waitFor(t, "r37 to be aborted", func() bool { return h.request("r37").State == engine.StateAborted })
}

// Example 9: end 0 reserves nothing ([0]); start_generate(begin 0) prefills the whole prompt
// on the decode instance.
func TestExample9EndZero(t *testing.T) {
	h := newHarness(t, setup{})
	wantAnswer(t, "prep_recv(end 0)", h.prepRecv("A", prompt(40, 1), 0, 3), 40, 0, "AwAAAAAAAABbMF0=")
	c := h.startGenerate("A", 0)
	if c.Usage.CompletionTokens != 3 {
		t.Fatalf("completion = %+v, want 3 tokens", c)
	}
	if a := h.request("A"); a.State != engine.StateFinished || a.Generated != 3 {
		t.Errorf("A = %s with %d generated, want finished with 3", a.State, a.Generated)
	}
}

// The three calls with a KV payload: two models, 32 bytes a token each; the KV comes in
// two writes (the second with no KV-Tokens header: the body says how many), lands in the
// arena, and the completion comes as JSON, and as server-sent events with the same text.
func TestThreeCallFlowWithKVPayload(t *testing.T) {
	geom := pages.Geometry{Layers: 2, KVHeads: 1, HeadDim: 4} // 32 bytes a token
	cfg := func(c *engine.Config) { c.Arena = geom; c.Models = 2 }
	per := 2 * geom.TokenBytes()
	payload := func(from, n int) []byte {
		b := make([]byte, n*per)
		for i := range b {
			b[i] = byte(from*per + i)
		}
		return b
	}
	run := func(t *testing.T, stream bool) (text string, h *harness) {
		h = newHarness(t, setup{cfg: cfg})
		ans := h.prepRecv("A", prompt(40, 1), -1, 6)
		wantAnswer(t, "prep_recv(A)", ans, 40, 0, prepare.Encode([]int64{1, 0, 39, 1, 0, 39}))
		status, b := h.writeKV(ans.KVAppendMetadata, 0, 20, payload(0, 20))
		var kv wire.KVAnswer
		decode(t, b, &kv)
		if status != http.StatusOK || kv.Tokens != 20 || len(kv.Complete) != 0 || kv.Requests[0] != "A" {
			t.Fatalf("first KV write = %d %s, want 20 tokens of A, not complete", status, b)
		}
		status, b = h.writeKV(ans.KVAppendMetadata, 20, 0, payload(20, 19))
		decode(t, b, &kv)
		if status != http.StatusOK || kv.Tokens != 19 || len(kv.Complete) != 1 {
			t.Fatalf("second KV write = %d %s, want 19 tokens completing A", status, b)
		}
		var got []byte
		h.engine(func(e *engine.Engine) { got = e.Cache().Store().(*pages.Arena).ReadSlot(25, nil) })
		if want := payload(25, 1)[:geom.TokenBytes()]; !bytes.Equal(got, want) {
			t.Fatalf("slot 25 of model 0 holds %v, want %v", got, want)
		}
		if !stream {
			c := h.startGenerate("A", 39)
			if c.Object != "text_completion" || c.ID != "cmpl-A" || len(c.Choices) != 1 || c.Usage.TotalTokens != 46 {
				t.Fatalf("completion = %+v, want one choice, 40 + 6 tokens", c)
			}
			return c.Choices[0].Text, h
		}
		chunks := h.sse(t, map[string]any{"user": "A", "begin": 39, "stream": true, "stream_options": map[string]any{"include_usage": true}})
		if n := len(chunks); n != 6+1 {
			t.Fatalf("%d chunks, want 6 tokens and a usage chunk", n)
		}
		for i, c := range chunks[:6] {
			text += c.Choices[0].Text
			final := c.Choices[0].FinishReason != nil
			if final != (i == 5) {
				t.Errorf("chunk %d has finish_reason %v", i, c.Choices[0].FinishReason)
			}
		}
		if u := chunks[6].Usage; u == nil || u.CompletionTokens != 6 || len(chunks[6].Choices) != 0 {
			t.Errorf("last chunk = %+v, want usage with 6 completion tokens", chunks[6])
		}
		return text, h
	}
	jsonText, _ := run(t, false)
	sseText, _ := run(t, true)
	if jsonText == "" || jsonText != sseText {
		t.Errorf("completion text: JSON %q, SSE %q; want the same simulated tokens", jsonText, sseText)
	}
}

// sse makes a streaming start_generate and returns its chunks, checking the framing: each
// "data: {...}" followed by a blank line, the last "data: [DONE]".
func (h *harness) sse(t *testing.T, body any) []wire.Completion {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.ts.URL+"/microserving/start_generate", bytes.NewReader(jsonBody(t, body)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("streaming start_generate = %d %s, want 200 text/event-stream", resp.StatusCode, ct)
	}
	var chunks []wire.Completion
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || done {
			t.Fatalf("SSE line %q (after [DONE]: %v)", line, done)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c wire.Completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("SSE chunk %q: %v", data, err)
		}
		chunks = append(chunks, c)
	}
	if !done {
		t.Fatalf("the stream did not end with data: [DONE]")
	}
	return chunks
}

// Text prompts are tokenized a token a byte; equal text prefixes share the prefix cache.
func TestTextPromptsShareAPrefix(t *testing.T) {
	h := newHarness(t, setup{})
	base := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 2) // 90 bytes
	status, b := h.post("/microserving/prep_recv", map[string]any{"user": "A", "prompt": base + "One", "end": -1})
	if status != http.StatusOK {
		t.Fatalf("prep_recv with text = %d %s", status, b)
	}
	status, b = h.post("/microserving/prep_recv", map[string]any{"user": "B", "prompt": base + "Two", "end": -1})
	var ans wire.PrepRecvAnswer
	decode(t, b, &ans)
	if status != http.StatusOK || ans.PromptLength != 93 || ans.PrefixMatchedLength != 90 {
		t.Fatalf("prep_recv(B) = %d %+v, want 93 tokens with 90 matched", status, ans)
	}
}

func TestTokenizeAndTokenText(t *testing.T) {
	if got := wire.Tokenize("Hé"); fmt.Sprint(got) != "[72 195 169]" {
		t.Errorf("Tokenize(%q) = %v, want [72 195 169]", "Hé", got)
	}
	for _, tc := range []struct {
		tok  int32
		want string
	}{{0, " ka"}, {17, " lolo"}, {255, " jojo"}, {31999, " tofijojo"}, {-1, ""}} {
		if got := wire.TokenText(tc.tok); got != tc.want {
			t.Errorf("TokenText(%d) = %q, want %q", tc.tok, got, tc.want)
		}
	}
}

// A client that goes away during a completion aborts its request, as MLC does.
func TestClientGoneAbortsTheCompletion(t *testing.T) {
	h := newHarness(t, setup{runner: nil})
	h.prepRecv("A", prompt(40, 1), -1, 1<<16)
	h.pause()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.call(ctx, http.MethodPost, "/microserving/start_generate", jsonBody(t, map[string]any{"user": "A", "begin": 39}), nil)
	}()
	waitFor(t, "A to start", func() bool { return h.request("A").State == engine.StateRunning })
	cancel()
	<-done
	waitFor(t, "A to be aborted", func() bool { return h.request("A").State == engine.StateAborted })
}

func TestHealthzAndDebugEndpoints(t *testing.T) {
	h := newHarness(t, setup{})
	status, b := h.call(context.Background(), http.MethodGet, "/healthz", nil, nil)
	var hz wire.Health
	decode(t, b, &hz)
	if status != http.StatusOK || hz.Status != "ok" || hz.Version != "kvtop test" {
		t.Errorf("GET /healthz = %d %s", status, b)
	}
	ans := h.prepRecv("A", prompt(40, 1), -1, 2)
	status, b = h.post("/debug/abort", map[string]any{"user": "A"})
	var ab wire.AbortAnswer
	decode(t, b, &ab)
	if status != http.StatusOK || ab.State != engine.StateAborted || !ab.Leaked {
		t.Errorf("abort of prepared A = %d %s, want aborted, leaked (as in MLC)", status, b)
	}
	if status, b := h.writeKV(ans.KVAppendMetadata, -1, 0, nil); status != http.StatusConflict || !strings.Contains(string(b), `"type":"stale_kv_write"`) {
		t.Errorf("KV for aborted A = %d %s, want 409 stale_kv_write", status, b)
	}
}
