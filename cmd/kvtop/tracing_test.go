package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP trace receiver on loopback that keeps the spans it is sent.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	services map[string]bool
	paths    map[string]bool
}

func newCollector(t *testing.T) *collector {
	c := &collector{services: map[string]bool{}, paths: map[string]bool{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "want OTLP protobuf", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.paths[r.URL.Path] = true
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					c.services[a.GetValue().GetStringValue()] = true
				}
			}
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

// names counts the spans received by name.
func (c *collector) names() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, sp := range c.spans {
		out[sp.Name]++
	}
	return out
}

// Tracing is off by default, and a bad endpoint is a usage error.
func TestTracingFlags(t *testing.T) {
	o, err := parseServe(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.eco.otlp != "" {
		t.Errorf("parseServe() = %+v: want tracing off", o.eco)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--otlp-endpoint", "127.0.0.1:4318"}, "want http://HOST:PORT"},
		{[]string{"--otlp-endpoint", "grpc://127.0.0.1:4317"}, "want http://HOST:PORT"},
		{[]string{"--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-sample", "1.5"}, "otlp-sample"},
	} {
		_, err := parseServe(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseServe(%q) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
	// Off: nothing observes the engine, and /metrics has no tracing series.
	ctx, cancel := context.WithCancel(context.Background())
	o, _ = parseServe([]string{"--listen", "127.0.0.1:0"}, io.Discard)
	s, err := startServer(ctx, o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.eco.tracer != nil || len(s.eco.observers) != 0 {
		t.Errorf("without --otlp-endpoint: tracer %v, %d observers; want none", s.eco.tracer, len(s.eco.observers))
	}
	if m := get(t, s.URL()+"/metrics"); strings.Contains(m, "kvtop_trace_") {
		t.Errorf("without --otlp-endpoint /metrics has tracing series")
	}
	cancel()
	s.Wait()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// serve --otlp-endpoint sends every request's trace to an OTLP/HTTP receiver: the spans of
// a driven workload, as service kvtop, to /v1/traces; a prep_recv that carries a
// traceparent is a child of the caller's span; and /metrics counts the spans.
func TestServeExportsRequestTracesOverOTLP(t *testing.T) {
	col := newCollector(t)
	o, err := parseServe([]string{"--listen", "127.0.0.1:0", "--drive", "chat", "--steps-per-sec", "200", "--otlp-endpoint", col.URL}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb syncBuffer
	s, err := startServer(ctx, o, &errb)
	if err != nil {
		t.Fatal(err)
	}
	var desc bytes.Buffer
	s.eco.describe(&desc)
	if want := "request traces: OTLP/HTTP to " + col.URL + "/v1/traces"; !strings.Contains(desc.String(), want) {
		t.Errorf("describe() = %q, want %q", desc.String(), want)
	}
	const traceID, spanID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/microserving/prep_recv",
		strings.NewReader(`{"user": "traced", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "end": -1, "max_tokens": 4}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+spanID+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("prep_recv with a traceparent = %d", resp.StatusCode)
	}
	abort, _ := http.NewRequest(http.MethodPost, s.URL()+"/debug/abort", strings.NewReader(`{"user": "traced"}`))
	abort.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(abort); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("abort = %v %v", resp, err)
	}
	// The driven chat's first requests come and go, and the exporter's batches (a second
	// apart) reach the collector.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		names := col.names()
		if names["request"] >= 3 && names["decode"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the collector holds spans %v: want 3 requests' with a decode", names)
		}
	}
	metrics := get(t, s.URL()+"/metrics")
	cancel()
	if err := s.Wait(); err != nil { // the tracer's Close sends what is left
		t.Fatal(err)
	}
	for _, m := range []string{"kvtop_trace_spans_total", "kvtop_trace_exported_spans_total", "kvtop_trace_export_failures_total 0",
		"kvtop_trace_dropped_events_total 0", "kvtop_trace_open_requests"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics has no %q", m)
		}
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if !col.services["kvtop"] || !col.paths["/v1/traces"] {
		t.Errorf("spans from services %v to paths %v, want kvtop to /v1/traces", col.services, col.paths)
	}
	names := map[string]int{}
	var traced *tracepb.Span
	for _, sp := range col.spans {
		names[sp.Name]++
		for _, a := range sp.Attributes {
			if a.Key == "kvtop.request.id" && a.GetValue().GetStringValue() == "traced" && sp.Name == "request" {
				traced = sp
			}
		}
	}
	if names["request"] < 3 || names["decode"] == 0 || names["prep_recv.wait"] < names["request"] {
		t.Errorf("spans by name %v: want the driven requests' spans, each with its wait", names)
	}
	if traced == nil {
		t.Fatalf("no span for the traced request among %d", len(col.spans))
	}
	if got := hex.EncodeToString(traced.TraceId) + "/" + hex.EncodeToString(traced.ParentSpanId); got != traceID+"/"+spanID {
		t.Errorf("the traced request's span is in trace/parent %s, want %s/%s", got, traceID, spanID)
	}
}

// The demo traces its embedded engine's requests with --otlp-endpoint, and says at the end
// what became of the spans; --attach refuses the flag (the server traces, not the viewer).
func TestDemoExportsRequestTraces(t *testing.T) {
	if _, err := parseDashboard([]string{"--attach", "127.0.0.1:1", "--otlp-endpoint", "http://127.0.0.1:4318"}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "--otlp-endpoint is for the demo") {
		t.Errorf("parseDashboard(--attach, --otlp-endpoint) = %v, want it refused", err)
	}
	if _, err := parseDashboard([]string{"--otlp-endpoint", "localhost:4318"}, io.Discard); err == nil || !strings.Contains(err.Error(), "want http://HOST:PORT") {
		t.Errorf("parseDashboard(--otlp-endpoint localhost:4318) = %v, want a usage error", err)
	}
	col := newCollector(t)
	dc, err := parseDashboard([]string{"--scenario", "chat", "--steps-per-sec", "200", "--otlp-endpoint", col.URL}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb syncBuffer
	src, _, _, after, err := dashboardSource(ctx, dc, &errb)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); col.names()["request"] < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the collector holds spans %v: want the demo's requests'", col.names())
		}
	}
	cancel()
	after()
	src.Close()
	if out := errb.String(); !strings.Contains(out, "request traces: ") || !strings.Contains(out, "0 exports failed, 0 events dropped") {
		t.Errorf("the demo's last words %q: want what became of the spans, none lost", out)
	}
}
