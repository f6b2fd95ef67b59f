package tap

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine"
)

func get(t *testing.T, u string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The tap's API: its health, the instances it has seen with their numbers and standing,
// a shadow's snapshot, and the metrics of every shadow labelled by instance; a bad call
// gets a 4xx with the reason.
func TestTapAPI(t *testing.T) {
	cfg := smallConfig()
	tp := newTopology(t, []engine.Config{cfg, cfg}, Config{Engine: cfg})
	tp.flow(0, "a", prompt(1, 100), 3)
	tp.flow(1, "b", prompt(2, 100), 3)
	base := tp.tapSrv.URL
	if code, body := get(t, base+"/healthz", nil); code != 200 || !strings.Contains(body, `"tap":true`) {
		t.Errorf("/healthz = %d %s", code, body)
	}
	code, body := get(t, base+"/v1/instances", nil)
	var got struct{ Instances []Instance }
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil {
		t.Fatalf("/v1/instances = %d %s (%v)", code, body, err)
	}
	roles := map[string]string{}
	for _, in := range got.Instances {
		roles[in.Address] = in.Role
		if in.Role == RoleDecode && (in.Requests["finished"] != 1 || in.Pages != 513 || !strings.HasPrefix(in.Standing, "exact since step")) {
			t.Errorf("decode instance %+v", in)
		}
	}
	if roles[tp.ds[0].addr()] != RoleDecode || roles[tp.ds[1].addr()] != RoleDecode || roles[strings.TrimPrefix(tp.p.srv.URL, "http://")] != RolePrefill {
		t.Errorf("roles = %v", roles)
	}
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/v1/snapshot", 400, "instance=HOST:PORT"},
		{"/v1/snapshot?instance=nowhere:1", 404, "no decode instance nowhere:1"},
		{"/v1/nothing", 404, "no such endpoint"},
	} {
		if code, body := get(t, base+c.path, nil); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("GET %s = %d %s, want %d with %q", c.path, code, body, c.code, c.want)
		}
	}
	if code, body := get(t, base+"/v1/snapshot?instance="+url.QueryEscape(tp.ds[0].addr()), map[string]string{"Host": "evil.example:7071"}); code != 403 || !strings.Contains(body, "forbidden_host") {
		t.Errorf("a rebound Host = %d %s, want 403 forbidden_host", code, body)
	}
	code, body = get(t, base+"/metrics", nil)
	for _, want := range []string{
		`kvtop_requests{decode_instance="` + tp.ds[0].addr(),
		`kvtop_tap_divergences_total{decode_instance="` + tp.ds[1].addr() + `",kind="metadata"} 0`,
		`kvtop_tap_calls_total{instance="` + strings.TrimPrefix(tp.p.srv.URL, "http://") + `",role="prefill"} 2`,
		"go_goroutines",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/instances", nil)
	if resp, _ := http.DefaultClient.Do(req); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/instances = %s, want 405", resp.Status)
	}
}

// With a token, the API wants it as a bearer token and proxied calls want it as the proxy
// password (HTTP_PROXY=http://tap:TOKEN@host:port).
func TestTapToken(t *testing.T) {
	rec := newRecorder(t)
	_, srv, _ := serveTap(t, Config{Token: "s3cret"})
	if code, _ := get(t, srv.URL+"/healthz", nil); code != 401 {
		t.Errorf("/healthz without the token = %d, want 401", code)
	}
	if code, _ := get(t, srv.URL+"/healthz", map[string]string{"Authorization": "Bearer s3cret"}); code != 200 {
		t.Errorf("/healthz with the token = %d, want 200", code)
	}
	for _, c := range []struct {
		proxy string
		code  int
	}{
		{srv.URL, http.StatusProxyAuthRequired},
		{strings.Replace(srv.URL, "http://", "http://tap:wrong@", 1), http.StatusProxyAuthRequired},
		{strings.Replace(srv.URL, "http://", "http://tap:s3cret@", 1), 200},
	} {
		u, _ := url.Parse(c.proxy)
		cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}}
		resp, err := cl.Get(rec.srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("through %s: %s, want %d", u.Redacted(), resp.Status, c.code)
		}
	}
}

// Before any traffic the tap lists no instance: an empty list, which a client can range
// over, not null.
func TestTapWithNoTrafficListsNoInstances(t *testing.T) {
	tp := mustTap(t, Config{Engine: smallConfig()})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/v1/instances", nil) // origin form: the tap's own API
	req.Host = "127.0.0.1:7071"
	tp.ServeHTTP(rec, req)
	if got := strings.TrimSpace(rec.Body.String()); rec.Code != 200 || got != `{"instances":[]}` {
		t.Errorf("/v1/instances = %d %s, want 200 {\"instances\":[]}", rec.Code, got)
	}
}
