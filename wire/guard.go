package wire

import (
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// The checks every call passes before its handler, against what a web page can make a
// browser send: a page of any site can POST a "simple" request (text/plain, no custom
// header) to 127.0.0.1, and under DNS rebinding its own name resolves to 127.0.0.1, so that
// its requests carry its Host and its Origin. The bearer token stops both (a browser never
// adds it on its own); without one:
//
//   - the Host must name this machine (a loopback name or address) or the listen host
//     (Options.Hosts): a rebound name is refused (403 forbidden_host);
//   - a call that changes state (every POST) and the stream's handshake must come from no
//     Origin (not a browser) or from this server's own origin, and that origin's host must
//     pass the Host test too: the Origin is never trusted because it equals the Host, which
//     the page chose (403 forbidden_origin);
//   - a JSON call must say Content-Type: application/json, which a page cannot send without
//     a CORS preflight that kvtop never answers (415 unsupported_media_type).
//
// With a token the Host may be anything (a proxy's name, say); the Origin and Content-Type
// rules hold either way.

// checkHost refuses a call whose Host is not this server's, when it has no token.
func (s *Server) checkHost(r *http.Request) error {
	if s.opts.Token != "" || s.hostAllowed(r.Host) {
		return nil
	}
	return errorf(http.StatusForbidden, errForbiddenHost,
		"%s %s: Host %q is not this server's: without --token only loopback names (localhost, 127.0.0.1, [::1]) and the listen host are accepted, so that a web page cannot reach the API by DNS rebinding",
		r.Method, r.URL.Path, r.Host)
}

// checkCall refuses a call to a route from a foreign origin, or a JSON call whose body is
// not declared JSON.
func (s *Server) checkCall(r *http.Request, rt route) error {
	if (r.Method == http.MethodPost || rt.name == "stream") && !s.originAllowed(r) {
		return errorf(http.StatusForbidden, errForbidden, "%s %s: cross-origin call from %q refused (this server is %q); browser pages of other origins may not drive the engine",
			r.Method, r.URL.Path, r.Header.Get("Origin"), r.Host)
	}
	if rt.json && !isJSON(r.Header.Get("Content-Type")) {
		return errorf(http.StatusUnsupportedMediaType, errMediaType, "%s %s: Content-Type %q: the body must be sent as application/json",
			r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	return nil
}

// hostAllowed reports whether a Host header (host or host:port) names this machine or one
// of the configured hosts. An absent Host (HTTP/1.0) is no browser's.
func (s *Server) hostAllowed(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, h := range s.opts.Hosts {
		if strings.EqualFold(host, strings.Trim(h, "[]")) {
			return true
		}
	}
	return false
}

// originAllowed accepts a call with no Origin (not from a browser page) or one from this
// server's own origin: the Origin's host:port is the Host's, and the Host is one this
// server answers to.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	if !strings.EqualFold(u.Host, r.Host) {
		return false
	}
	return s.opts.Token != "" || s.hostAllowed(u.Host)
}

// isJSON reports whether a Content-Type is JSON: application/json or application/*+json,
// with any parameters.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// authorized compares the bearer token in constant time (hashes of equal length, so not
// even the length leaks). The scheme is case-insensitive, as HTTP's auth schemes are.
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimLeft(got, " ")))
	return subtle.ConstantTimeCompare(h[:], s.token[:]) == 1
}
