package wire

import (
	"crypto/sha256"
	"net/http"
)

// Guard applies a server's rules for calls (guard.go) to another handler: the token, the
// Host (without a token) and, for a POST or a websocket handshake, the Origin. A refused
// call is answered as the server answers one. kvtop tap serves its own API behind it, with
// the same rules as kvtop serve.
func Guard(opts Options, h http.Handler) http.Handler {
	s := &Server{opts: opts}
	if opts.Token != "" {
		s.token = sha256.Sum256([]byte(opts.Token))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.checkHost(r); err != nil {
			writeError(w, err)
			return
		}
		if !s.authorized(r) {
			writeError(w, errorf(http.StatusUnauthorized, errUnauthorized,
				"%s %s: missing or wrong token: send the header \"Authorization: Bearer TOKEN\" with the server's --token", r.Method, r.URL.Path))
			return
		}
		if (r.Method == http.MethodPost || r.Header.Get("Upgrade") != "") && !s.originAllowed(r) {
			writeError(w, errorf(http.StatusForbidden, errForbidden, "%s %s: cross-origin call from %q refused", r.Method, r.URL.Path, r.Header.Get("Origin")))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Authorized reports whether a token matches the server's, compared in constant time (as
// every call's is). An empty want accepts anything.
func Authorized(want, got string) bool {
	if want == "" {
		return true
	}
	s := &Server{opts: Options{Token: want}, token: sha256.Sum256([]byte(want))}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+got)
	return s.authorized(r)
}

// WriteError answers a call with {"error": {"message", "type"}} and the status, as every
// refused call of the server is answered.
func WriteError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	writeError(w, errorf(status, typ, format, args...))
}

// WriteJSON answers a call with a JSON value.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }
