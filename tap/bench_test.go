package tap

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
)

// BenchmarkRoundTrip measures, in one run and interleaved, the round trip of prep_recv and
// of a 256-token streamed start_generate against a kvtop serve on loopback, straight and
// through the tap (as the router's HTTP proxy, its shadow following). It reports the p50
// and p99 of each and what the tap adds: prep_recv's p99 difference in microseconds, and
// the stream's time through the tap over its time straight (mean, in percent).
//
//	go test ./tap -run '^$' -bench RoundTrip -benchtime 400x

func BenchmarkRoundTrip(b *testing.B) {
	// As fast as D steps: the worst case for a proxy, whose cost per chunk is then the
	// whole difference; and at 1,000 steps a second, a millisecond a token (a real D takes
	// several).
	for _, rate := range []float64{0, 1000} {
		name := "D-unpaced"
		if rate > 0 {
			name = fmt.Sprintf("D-%g-steps-per-sec", rate)
		}
		b.Run(name, func(b *testing.B) { benchRoundTrip(b, rate) })
	}
}

func benchRoundTrip(b *testing.B, rate float64) {
	cfg := engine.DefaultConfig()
	cfg.MaxRecycling = 8
	testStepsPerSec = rate
	// Two decode instances alike: the tap's shadow follows the one the tapped calls go to,
	// which no other call reaches (its shadow stays exact, as in a real deployment).
	dOwn, dTapped := startDecodeB(b, cfg), startDecodeB(b, cfg)
	testStepsPerSec = 0
	tp, err := New(Config{Engine: cfg})
	if err != nil {
		b.Fatal(err)
	}
	defer tp.Close()
	tsrv := httptest.NewUnstartedServer(nil)
	tp.cfg.Listen = tsrv.Listener.Addr().String()
	tp.self = []string{tp.cfg.Listen}
	tsrv.Config.Handler = tp
	tsrv.Start()
	defer tsrv.Close()
	proxy, _ := url.Parse(tsrv.URL)
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	tapped := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), MaxIdleConnsPerHost: 8}}
	// A plain forward proxy (the standard library's, no shadow): what the hop alone costs.
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", pr.In.URL.Host, pr.In.Host
		},
		FlushInterval: -1,
		Transport:     plainTransport(),
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body read first, as the tap reads a call's (small) body before it forwards it.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	defer plain.Close()
	plainURL, _ := url.Parse(plain.URL)
	plained := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(plainURL), MaxIdleConnsPerHost: 8}}
	var prep, stream [3][]time.Duration // [direct, tap, plain proxy]
	n := 0
	flow := func(which int, cl *http.Client) {
		d := dOwn
		if which == 1 {
			d = dTapped
		}
		n++
		id := fmt.Sprintf("b%d", n)
		prompt := make([]string, 64)
		for i := range prompt {
			prompt[i] = fmt.Sprint((n*131 + i*7) % 30000)
		}
		body := `{"user":"` + id + `","prompt":[` + strings.Join(prompt, ",") + `],"end":-1,"max_tokens":256}`
		t0 := time.Now()
		resp, err := cl.Post(d.URL+pathPrepRecv, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		var ans engine.Answer
		json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		prep[which] = append(prep[which], time.Since(t0))
		req, _ := http.NewRequest(http.MethodPost, d.URL+"/v1/kv", nil)
		req.Header.Set("KV-Append-Metadata", ans.Metadata)
		req.Header.Set("Content-Type", "application/octet-stream")
		kr, err := direct.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, kr.Body)
		kr.Body.Close()
		t0 = time.Now()
		resp, err = cl.Post(d.URL+pathStartGenerate, "application/json", bytes.NewReader([]byte(`{"user":"`+id+`","begin":63,"stream":true}`)))
		if err != nil {
			b.Fatal(err)
		}
		chunks := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: {") {
				chunks++
			}
		}
		resp.Body.Close()
		stream[which] = append(stream[which], time.Since(t0))
		if chunks != 256 {
			b.Fatalf("%s: %d chunks, want 256", [3]string{"direct", "through the tap", "through the plain proxy"}[which], chunks)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		// Interleaved, each first in turn, so that drift favours neither.
		order := [][2]any{{0, direct}, {1, tapped}, {2, plained}}
		for k := range order {
			o := order[(i+k)%len(order)]
			flow(o[0].(int), o[1].(*http.Client))
		}
	}
	b.StopTimer()
	q := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	mean := func(ds []time.Duration) float64 {
		var t time.Duration
		for _, d := range ds {
			t += d
		}
		return float64(t) / float64(len(ds))
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(q(prep[0], 0.5)), "prep-direct-p50-µs")
	b.ReportMetric(us(q(prep[1], 0.5)), "prep-tap-p50-µs")
	b.ReportMetric(us(q(prep[0], 0.99)), "prep-direct-p99-µs")
	b.ReportMetric(us(q(prep[1], 0.99)), "prep-tap-p99-µs")
	b.ReportMetric(us(q(prep[1], 0.99))-us(q(prep[0], 0.99)), "prep-added-p99-µs")
	b.ReportMetric(us(q(stream[0], 0.5))/1000, "stream-direct-p50-ms")
	b.ReportMetric(us(q(stream[1], 0.5))/1000, "stream-tap-p50-ms")
	b.ReportMetric(us(q(stream[0], 0.99))/1000, "stream-direct-p99-ms")
	b.ReportMetric(us(q(stream[1], 0.99))/1000, "stream-tap-p99-ms")
	b.ReportMetric(100*(mean(stream[1])/mean(stream[0])-1), "stream-added-%")
	b.ReportMetric(us(q(prep[2], 0.5)), "prep-plainproxy-p50-µs")
	b.ReportMetric(us(q(prep[2], 0.99)), "prep-plainproxy-p99-µs")
	b.ReportMetric(100*(mean(stream[2])/mean(stream[0])-1), "stream-plainproxy-added-%")
	for _, in := range tp.Instances(b.Context()) {
		if in.Divergences > 0 {
			b.Fatalf("the shadow diverged: %+v", in)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// startDecodeB is startDecode for a benchmark.
func startDecodeB(b *testing.B, cfg engine.Config) *httptest.Server { return startDecodeTB(b, cfg).srv }

func plainTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy, tr.MaxIdleConnsPerHost = nil, 256
	return tr
}
