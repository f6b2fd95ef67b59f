package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/kvtop/kvtop/engine"
)

// decodeJSON decodes a call's body, a single JSON object, into v.
func decodeJSON(call string, b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errorf(http.StatusBadRequest, errInvalidJSON, "%s: the body is empty; want a JSON object", call)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return jsonError(call, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return jsonError(call, errTrailing)
	}
	return nil
}

// prepRecvBody is the body of prep_recv: an OpenAI completion request plus end. Fields a
// router forwards that kvtop does not use (temperature, stop, …) are ignored.
type prepRecvBody struct {
	Model     string          `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	End       *int64          `json:"end"`
	User      string          `json:"user"`
	MaxTokens *int64          `json:"max_tokens"`
	N         *int64          `json:"n"`
}

// DecodePrepRecv parses a prep_recv body into the engine's call. maxTokens bounds
// max_tokens. It checks what JSON decoding can (types, ranges, the prompt's form); the
// engine checks the rest (window, prompt length, token ids, n, duplicates).
//
// A body in the usual form (an object of distinct keys whose prompt is an array of
// integers) is read by hand, the prompt's ids straight into the engine's int32s
// (fastPrepRecv); any other body, and every body with something wrong in it, goes through
// encoding/json, which gives the same answer (FuzzFastPrepRecv) and the errors.
func DecodePrepRecv(b []byte, maxTokens int) (engine.PrepRecv, error) {
	if body, prompt, ok := fastPrepRecv(b); ok && checkID("prep_recv", body.User) == nil {
		return prepRecvCall(body, prompt, maxTokens)
	}
	return slowPrepRecv(b, maxTokens)
}

// slowPrepRecv is DecodePrepRecv by encoding/json alone.
func slowPrepRecv(b []byte, maxTokens int) (engine.PrepRecv, error) {
	const call = "prep_recv"
	var body prepRecvBody
	if err := decodeJSON(call, b, &body); err != nil {
		return engine.PrepRecv{}, err
	}
	if err := checkID(call, body.User); err != nil {
		return engine.PrepRecv{}, err
	}
	prompt, err := parsePrompt(call, body.Prompt)
	if err != nil {
		return engine.PrepRecv{}, err
	}
	return prepRecvCall(body, prompt, maxTokens)
}

// prepRecvCall checks a decoded body's numbers and makes the engine's call of it.
func prepRecvCall(body prepRecvBody, prompt []int32, maxTokens int) (engine.PrepRecv, error) {
	const call = "prep_recv"
	pr := engine.PrepRecv{ID: body.User, Prompt: prompt}
	if body.End != nil {
		if err := intRange(call, "end", *body.End, -maxInt32, maxInt32); err != nil {
			return engine.PrepRecv{}, err
		}
		pr.End, pr.HasEnd = int(*body.End), true
	}
	if body.MaxTokens != nil {
		// 0 is refused, not taken for the default: a router that asks for no tokens has a bug.
		if err := intRange(call, "max_tokens", *body.MaxTokens, 1, int64(maxTokens)); err != nil {
			return engine.PrepRecv{}, err
		}
		pr.MaxTokens = int(*body.MaxTokens)
	}
	if body.N != nil {
		if err := intRange(call, "n", *body.N, 1, maxInt32); err != nil {
			return engine.PrepRecv{}, err
		}
		pr.N = int(*body.N)
	}
	return pr, nil
}

// parsePrompt reads an OpenAI prompt: an array of token ids, or text, which is tokenized
// byte by byte (Tokenize). A missing prompt is empty, and the engine refuses it.
func parsePrompt(call string, raw json.RawMessage) ([]int32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, errorf(http.StatusBadRequest, errInvalidType, "%s: prompt: malformed string: %v", call, err)
		}
		return Tokenize(s), nil
	case '[':
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, errorf(http.StatusBadRequest, errInvalidType,
				"%s: prompt: want token ids (an array of integers) or text (a string): %v", call, err)
		}
		out := make([]int32, len(ids))
		for i, id := range ids {
			if id > maxInt32 || id < -maxInt32-1 {
				return nil, errorf(http.StatusBadRequest, "bad_token", "%s: prompt: token %d at position %d is outside the int32 range", call, id, i)
			}
			out[i] = int32(id) // negative ids go on to the engine, which names them
		}
		return out, nil
	}
	return nil, errorf(http.StatusBadRequest, errInvalidType,
		"%s: prompt: want token ids (an array of integers) or text (a string), got %s", call, jsonKind(raw))
}

func jsonKind(raw []byte) string {
	switch raw[0] {
	case '{':
		return "an object"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// Tokenize is kvtop's deterministic tokenizer for text prompts: one token per byte of the
// UTF-8 text, its id the byte's value (0–255). No model runs, so any fixed mapping does;
// this one makes equal text prefixes equal token prefixes, which is what the prefix cache
// cares about.
func Tokenize(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i])
	}
	return out
}

// syllables spell token ids as words: TokenText is a space and the id's base-16 digits as
// syllables, most significant first.
var syllables = [16]string{"ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "bo", "da", "fi", "gu", "he", "jo"}

// TokenText renders a simulated token as text, deterministically: " " followed by the id
// written in base 16 with one syllable a digit (0 is " ka", 17 is " loka"). Negative ids
// (the end marker of an aborted request) render as nothing.
func TokenText(tok int32) string {
	if tok < 0 {
		return ""
	}
	var digits [8]string
	n := 0
	for {
		digits[n] = syllables[tok%16]
		n++
		tok /= 16
		if tok == 0 {
			break
		}
	}
	var b strings.Builder
	b.WriteByte(' ')
	for i := n - 1; i >= 0; i-- {
		b.WriteString(digits[i])
	}
	return b.String()
}

// startGenerateBody is the body of start_generate: the same completion request the router
// sent to prep_recv, with begin. The generation settings are those of the prep_recv, as in
// MLC; those here are ignored.
type startGenerateBody struct {
	Model         string          `json:"model"`
	User          string          `json:"user"`
	Begin         *int64          `json:"begin"`
	End           *int64          `json:"end"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Prompt        json.RawMessage `json:"prompt"` // not used; MLC's router sends it along
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// startGenerate is a decoded start_generate call.
type startGenerate struct {
	ID           string
	Begin        int
	End          int
	HasEnd       bool
	Stream       bool
	IncludeUsage bool
	Model        string
}

// decodeStartGenerate parses a start_generate body.
func decodeStartGenerate(b []byte) (startGenerate, error) {
	const call = "start_generate"
	var body startGenerateBody
	if err := decodeJSON(call, b, &body); err != nil {
		return startGenerate{}, err
	}
	if body.User == "" {
		return startGenerate{}, errorf(http.StatusBadRequest, errInvalidRequest, "%s: the request id (user) is empty", call)
	}
	if err := checkID(call, body.User); err != nil {
		return startGenerate{}, err
	}
	if body.Begin == nil {
		return startGenerate{}, errorf(http.StatusBadRequest, errInvalidRequest,
			"start_generate %s: begin is required (the end the prep_recv used)", body.User)
	}
	sg := startGenerate{ID: body.User, Stream: body.Stream, Model: body.Model}
	if err := intRange(call, "begin", *body.Begin, -maxInt32, maxInt32); err != nil {
		return startGenerate{}, err
	}
	sg.Begin = int(*body.Begin)
	if body.End != nil {
		if err := intRange(call, "end", *body.End, -maxInt32, maxInt32); err != nil {
			return startGenerate{}, err
		}
		sg.End, sg.HasEnd = int(*body.End), true
	}
	if body.StreamOptions != nil {
		sg.IncludeUsage = body.StreamOptions.IncludeUsage
	}
	return sg, nil
}

// decodeAbort parses a /debug/abort body: {"user": id}.
func decodeAbort(b []byte) (string, error) {
	var body struct {
		User string `json:"user"`
	}
	if err := decodeJSON("abort", b, &body); err != nil {
		return "", err
	}
	if body.User == "" {
		return "", errorf(http.StatusBadRequest, errInvalidRequest, "abort: the request id (user) is empty")
	}
	return body.User, checkID("abort", body.User)
}

// MaxIDBytes bounds a request id (the user field).
const MaxIDBytes = 256

// checkID refuses a request id that would break what shows it: longer than MaxIDBytes,
// not UTF-8, or holding a control character (a newline breaks the table and the logs), a
// line or paragraph separator, or a bidirectional control (it can make one id read as
// another).
func checkID(call, id string) error {
	bad := func(why string) error {
		return errorf(http.StatusBadRequest, errBadID, "%s: the request id (user) %q %s", call, truncate(id, 64), why)
	}
	if len(id) > MaxIDBytes {
		return bad(fmt.Sprintf("is %d bytes, over the limit of %d", len(id), MaxIDBytes))
	}
	if !utf8.ValidString(id) {
		return bad("is not valid UTF-8")
	}
	for i, r := range id {
		switch {
		case unicode.IsControl(r):
			return bad(fmt.Sprintf("has the control character %U at byte %d", r, i))
		case unicode.In(r, unicode.Zl, unicode.Zp):
			return bad(fmt.Sprintf("has the line separator %U at byte %d", r, i))
		case unicode.Is(unicode.Bidi_Control, r):
			return bad(fmt.Sprintf("has the bidirectional control %U at byte %d", r, i))
		}
	}
	return nil
}

// truncate shortens s to at most n bytes for a message, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
