package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/tracing"
	"github.com/kvtop/kvtop/wire"
)

type keeping struct{ *tracetest.InMemoryExporter }

func (keeping) Shutdown(context.Context) error { return nil }

// A prep_recv call's traceparent header is honoured: the request's span is a child of the
// caller's span, in the caller's trace; a call without one starts a trace of its own; and
// the traceparent of a call the engine refused is not kept.
func TestPrepRecvsTraceparentIsTheRequestsParent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := tracing.Start(tracing.Config{Exporter: keeping{exp}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := runner.New(e, runner.Config{Clock: time.Now, Observers: []runner.Observer{tr}})
	ctx, stop := context.WithCancel(context.Background())
	go r.Run(ctx)
	ws := wire.NewServer(r, wire.Options{PrepRecvTrace: tr.Remote})
	ts := httptest.NewServer(ws) // on loopback
	defer ts.Close()

	call := func(path, traceparent string, body map[string]any) int {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, ts.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
			req.Header.Set("tracestate", "vendor=x")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	if c := call("/microserving/prep_recv", "00-"+traceID+"-"+spanID+"-01", map[string]any{"user": "child", "prompt": prompt, "end": -1, "max_tokens": 4}); c != http.StatusOK {
		t.Fatalf("prep_recv child = %d", c)
	}
	if c := call("/microserving/prep_recv", "", map[string]any{"user": "root", "prompt": prompt, "end": -1, "max_tokens": 4}); c != http.StatusOK {
		t.Fatalf("prep_recv root = %d", c)
	}
	if c := call("/microserving/prep_recv", "00-"+traceID+"-00f067aa0ba902b8-01", map[string]any{"user": "refused", "prompt": prompt, "end": 99, "max_tokens": 4}); c == http.StatusOK {
		t.Fatalf("prep_recv refused = %d, want a refusal (end past the prompt)", c)
	}
	for _, id := range []string{"child", "root"} {
		if c := call("/debug/abort", "", map[string]any{"user": id}); c != http.StatusOK {
			t.Fatalf("abort %s = %d", id, c)
		}
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := tr.Stats().Parents; n != 0 {
		t.Errorf("%d traceparents kept after every call was answered, want 0", n)
	}
	ws.Close()
	stop()
	<-r.Done()
	tr.Close()

	roots := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Name != tracing.SpanRequest {
			continue
		}
		for _, kv := range s.Attributes {
			if kv.Key == tracing.AttrID {
				roots[kv.Value.AsString()] = s
			}
		}
	}
	if _, ok := roots["refused"]; ok || len(roots) != 2 {
		t.Fatalf("request spans for %v, want child and root only", roots)
	}
	child := roots["child"]
	if p := child.Parent; !p.IsValid() || !p.IsRemote() || p.TraceID().String() != traceID || p.SpanID().String() != spanID {
		t.Errorf("child's parent is %v, want the remote span %s of trace %s", p, spanID, traceID)
	}
	if got := child.SpanContext.TraceID().String(); got != traceID {
		t.Errorf("child's trace is %s, want the caller's %s", got, traceID)
	}
	if got := child.Parent.TraceState().Get("vendor"); got != "x" {
		t.Errorf("child's parent's tracestate vendor=%q, want x", got)
	}
	if p := roots["root"].Parent; p.IsValid() {
		t.Errorf("root's parent is %v, want none (no traceparent)", p)
	}
	if roots["root"].SpanContext.TraceID() == child.SpanContext.TraceID() || roots["root"].SpanContext.TraceID() == (trace.TraceID{}) {
		t.Errorf("root's trace %v: want a new one of its own", roots["root"].SpanContext.TraceID())
	}
}
