package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// ErrUnauthorized is returned by Dial when the server refuses the token (HTTP 401).
var ErrUnauthorized = errors.New("wire: unauthorized: the server wants a different token (--token)")

// apiError is an answer that went wrong: the HTTP status, the stable error type and the
// cause.
type apiError struct {
	status int
	typ    string
	err    error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

func errorf(status int, typ, format string, args ...any) *apiError {
	return &apiError{status: status, typ: typ, err: fmt.Errorf(format, args...)}
}

// The error types, as they appear in {"error": {"type": …}}.
const (
	errInvalidJSON    = "invalid_json"
	errInvalidType    = "invalid_type"
	errInvalidRequest = "invalid_request"
	errTooLarge       = "too_large"
	errUnauthorized   = "unauthorized"
	errForbidden      = "forbidden_origin"
	errForbiddenHost  = "forbidden_host"
	errMediaType      = "unsupported_media_type"
	errBadID          = "bad_id"
	errNotFound       = "not_found"
	errMethod         = "method_not_allowed"
	errUnsupported    = "unsupported"
	errUnavailable    = "unavailable"
	errBusy           = "busy"
	errInternal       = "internal_error"
)

// engineErrors maps the engine's and the runner's sentinels to an HTTP status and a type.
var engineErrors = []struct {
	err    error
	status int
	typ    string
}{
	{engine.ErrDuplicateID, http.StatusConflict, "duplicate_id"},
	{engine.ErrUnknownRequest, http.StatusNotFound, "unknown_request"},
	{engine.ErrNotPrepared, http.StatusConflict, "not_prepared"},
	{engine.ErrEnded, http.StatusConflict, "request_ended"},
	{engine.ErrBadBegin, http.StatusBadRequest, "bad_begin"},
	{engine.ErrBadKVWrite, http.StatusBadRequest, "bad_kv_write"},
	{engine.ErrStaleKVWrite, http.StatusConflict, "stale_kv_write"},
	{engine.ErrBadRequest, http.StatusBadRequest, errInvalidRequest},
	{feed.ErrReadOnly, http.StatusForbidden, "read_only"},
	{prepare.ErrBadWindow, http.StatusBadRequest, "bad_window"},
	{prepare.ErrEmptyPrompt, http.StatusBadRequest, "empty_prompt"},
	{prepare.ErrPromptLong, http.StatusBadRequest, "prompt_too_long"},
	{prepare.ErrBadToken, http.StatusBadRequest, "bad_token"},
	{prepare.ErrMultipleN, http.StatusBadRequest, "unsupported_n"},
	{prepare.ErrBadMetadata, http.StatusBadRequest, "bad_metadata"},
	{runner.ErrAborted, http.StatusConflict, "request_aborted"},
	{runner.ErrStopped, http.StatusServiceUnavailable, errUnavailable},
	{runner.ErrBusy, http.StatusServiceUnavailable, errBusy},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, errUnavailable},
}

// classify turns any error into an apiError.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	for _, m := range engineErrors {
		if errors.Is(err, m.err) {
			return &apiError{status: m.status, typ: m.typ, err: err}
		}
	}
	return &apiError{status: http.StatusInternalServerError, typ: errInternal, err: err}
}

// writeError answers {"error": {"message", "type"}} with the error's status.
func writeError(w http.ResponseWriter, err error) {
	ae := classify(err)
	switch {
	case ae.status == http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="kvtop"`)
	case ae.typ == errBusy:
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, ae.status, struct {
		Error protocol.ErrorBody `json:"error"`
	}{protocol.ErrorBody{Message: ae.err.Error(), Type: ae.typ}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"wire: encoding the answer failed","type":"internal_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// jsonError explains a JSON decoding failure of a call's body, naming the field.
func jsonError(call string, err error) *apiError {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return errorf(http.StatusBadRequest, errInvalidJSON, "%s: malformed JSON at byte %d: %v", call, syn.Offset, err)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "the body"
		}
		return errorf(http.StatusBadRequest, errInvalidType, "%s: %s: want %s, got a JSON %s", call, field, typeName(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, errTrailing):
		return errorf(http.StatusBadRequest, errInvalidJSON, "%s: %v", call, err)
	}
	return errorf(http.StatusBadRequest, errInvalidJSON, "%s: malformed JSON: %v", call, err)
}

var errTrailing = errors.New("data after the JSON object")

func typeName(kind string) string {
	switch kind {
	case "int", "int32", "int64", "uint64", "uint32":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return kind
}

// intRange checks an int read from JSON against bounds the engine can take.
func intRange(call, field string, v, lo, hi int64) *apiError {
	if v < lo || v > hi {
		return errorf(http.StatusBadRequest, errInvalidRequest, "%s: %s %d is out of range [%d, %d]", call, field, v, lo, hi)
	}
	return nil
}

const maxInt32 = math.MaxInt32
