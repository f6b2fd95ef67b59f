package tracing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/internal/lockstep"
)

// start starts a tracer that exports to memory, closed when the test ends.
func start(t *testing.T, cfg Config) (*Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	if cfg.Exporter == nil {
		cfg.Exporter = keeping{exp}
	}
	tr, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, exp
}

// keeping keeps the spans when the tracer shuts its exporter down (the in-memory exporter
// forgets them).
type keeping struct{ *tracetest.InMemoryExporter }

func (keeping) Shutdown(context.Context) error { return nil }

// reqTrace is one request's spans as exported: the request's and its phases', in order.
type reqTrace struct {
	root   tracetest.SpanStub
	phases []tracetest.SpanStub
}

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	return attrOf(s.Attributes, k)
}

func attrOf(kvs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func events(s tracetest.SpanStub, name string) []sdktrace.Event {
	var out []sdktrace.Event
	for _, ev := range s.Events {
		if ev.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

// byRequest groups the spans by request id, and fails the test on a span that belongs to no
// request or a request with two spans.
func byRequest(t *testing.T, spans tracetest.SpanStubs) map[string]*reqTrace {
	t.Helper()
	bySpan := map[trace.SpanID]*reqTrace{}
	out := map[string]*reqTrace{}
	for _, s := range spans {
		if s.Name != SpanRequest {
			continue
		}
		v, ok := attr(s, AttrID)
		if !ok {
			t.Fatalf("request span %v has no %s", s.SpanContext.SpanID(), AttrID)
		}
		if out[v.AsString()] != nil {
			t.Fatalf("request %s has two spans", v.AsString())
		}
		rt := &reqTrace{root: s}
		out[v.AsString()], bySpan[s.SpanContext.SpanID()] = rt, rt
	}
	for _, s := range spans {
		if s.Name == SpanRequest {
			continue
		}
		rt := bySpan[s.Parent.SpanID()]
		if rt == nil || s.Parent.TraceID() != rt.root.SpanContext.TraceID() {
			t.Fatalf("span %s (%v) is the child of no request's span", s.Name, s.SpanContext.SpanID())
		}
		rt.phases = append(rt.phases, s)
	}
	for _, rt := range out {
		slices.SortStableFunc(rt.phases, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	}
	return out
}

// next are the phases that may follow each.
var next = map[string][]string{
	"":             {SpanWait},
	SpanWait:       {SpanAwaitKV, SpanAwaitStart},
	SpanAwaitKV:    {SpanAwaitStart, SpanPrefill, SpanDecode}, // start_generate may come before the KV (a hazard)
	SpanAwaitStart: {SpanPrefill, SpanDecode},
	SpanPrefill:    {SpanDecode},
}

// check says what is wrong with a request's trace: its phases follow the lifecycle, back to
// back, from the request's start to its end, all in one trace.
func (rt *reqTrace) check() error {
	r := rt.root
	if r.SpanKind != trace.SpanKindServer {
		return fmt.Errorf("the request's span is of kind %v, want server", r.SpanKind)
	}
	prev, end := "", r.StartTime
	for _, p := range rt.phases {
		if !slices.Contains(next[prev], p.Name) {
			return fmt.Errorf("phase %s after %q", p.Name, prev)
		}
		if !p.StartTime.Equal(end) {
			return fmt.Errorf("phase %s starts at %v, the one before ends at %v", p.Name, p.StartTime, end)
		}
		if p.EndTime.Before(p.StartTime) {
			return fmt.Errorf("phase %s ends before it starts", p.Name)
		}
		prev, end = p.Name, p.EndTime
	}
	if len(rt.phases) == 0 || !end.Equal(r.EndTime) {
		return fmt.Errorf("the phases end at %v, the request at %v", end, r.EndTime)
	}
	return nil
}

// counts are what a scenario's events say the traces must hold.
type counts struct {
	arrived int
	// blocked counts the runs of blocked evaluations of one reason (a request's
	// evaluations, reason by reason, as they change), evaluations the evaluations.
	blocked, evaluations                 int
	kvWrites, preempted, leaked, hazards int
	outcome                              map[string]string
}

// blockedRun is a run of a request's blocked evaluations of one reason: the first's and the
// last's numbers, and how many.
type blockedRun struct {
	reason, first, last string
	n                   int
}

// In every scenario, every request that arrived is one trace: a request span with its
// phases as children, back to back in lifecycle order, with the request's attributes, a
// "blocked" event for every run of blocked evaluations of one reason (counting them, so
// that every evaluation is accounted for), a "kv_received" for every KV write (or counted
// among the span's dropped events past the SDK's limit), and preemptions, leaks and hazards
// as events on the request's span.
func TestEveryRequestIsATraceOfItsLifecycle(t *testing.T) {
	for _, c := range []struct {
		scenario string
		steps    int
		shows    func(counts) int // what the scenario is about, which its traces must show
	}{
		{"chat", 400, func(c counts) int { return c.kvWrites }},
		{"preempt", 400, func(c counts) int { return c.preempted }},
		{"leak", 2400, func(c counts) int { return min(c.leaked, c.hazards) }},
		{"fork-race", 400, func(c counts) int { return c.hazards }},
		{"recycle-stall", 400, func(c counts) int { return c.blocked }},
		{"watermark", 400, func(c counts) int { return c.evaluations - c.blocked }}, // runs of more than one
	} {
		t.Run(c.scenario, func(t *testing.T) {
			tr, exp := start(t, Config{})
			want := counts{outcome: map[string]string{}}
			runs := map[string][]blockedRun{} // by request
			var last *engine.Engine
			_, err := lockstep.Run(c.scenario, 1, c.steps, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
				last = e
				tr.Observe(e, evs)
				for _, ev := range evs {
					switch ev := ev.(type) {
					case engine.RequestArrived:
						want.arrived++
					case engine.PrepareBlocked:
						want.evaluations++
						rs := runs[ev.ID]
						if len(rs) == 0 || rs[len(rs)-1].reason != ev.Eval.Reason.String() {
							want.blocked++
							rs = append(rs, blockedRun{reason: ev.Eval.Reason.String(), first: ev.Eval.Short()})
						}
						rs[len(rs)-1].last = ev.Eval.Short()
						rs[len(rs)-1].n++
						runs[ev.ID] = rs
					case engine.KVReceived:
						want.kvWrites++
					case engine.RequestAborted:
						want.outcome[ev.ID] = ev.Reason
						if ev.Reason == engine.AbortPreempt {
							want.preempted++
						} else if ev.Leaked {
							want.leaked++
						}
					case engine.RequestFinished:
						want.outcome[ev.ID] = ev.Reason
					case engine.HazardDetected:
						if _, ended := want.outcome[ev.Hazard.ID]; !ended {
							want.hazards++
						}
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			if st := tr.Stats(); st.DroppedEvents > 0 || st.Open != 0 || st.Spans != uint64(len(exp.GetSpans())) || st.Exported != st.Spans {
				t.Fatalf("Stats() = %+v with %d spans exported: want none dropped or open, every span exported", st, len(exp.GetSpans()))
			}
			traces := byRequest(t, exp.GetSpans())
			if len(traces) != want.arrived || want.arrived == 0 {
				t.Fatalf("%d request spans for %d requests arrived", len(traces), want.arrived)
			}
			var got counts
			for id, rt := range traces {
				if err := rt.check(); err != nil {
					t.Fatalf("request %s: %v", id, err)
				}
				if rt.root.Parent.IsValid() {
					t.Fatalf("request %s: a parent %v without a traceparent", id, rt.root.Parent)
				}
				out, _ := attr(rt.root, AttrOutcome)
				if w, ok := want.outcome[id]; ok && out.AsString() != w || !ok && out.AsString() != outcomeOpenAtStop {
					t.Fatalf("request %s: outcome %q, want %q (%q while alive at the end)", id, out.AsString(), w, outcomeOpenAtStop)
				}
				if rv, ok := last.Request(id); ok {
					pl, _ := attr(rt.root, AttrPromptLength)
					if pl.AsInt64() != int64(rv.PromptLength) {
						t.Fatalf("request %s: %s %d, the engine says %d", id, AttrPromptLength, pl.AsInt64(), rv.PromptLength)
					}
					if rv.State > engine.StateWaiting && rv.Seq >= 0 {
						m, _ := attr(rt.root, AttrMatched)
						s, _ := attr(rt.root, AttrSegments)
						if m.AsInt64() != int64(rv.Matched) || s.AsInt64() < 1 {
							t.Fatalf("request %s: matched %d, %d segments; the engine says matched %d", id, m.AsInt64(), s.AsInt64(), rv.Matched)
						}
					}
				}
				var gotRuns []blockedRun
				for _, p := range rt.phases {
					for _, ev := range events(p, EventBlocked) {
						got.blocked++
						reason, _ := attrOf(ev.Attributes, AttrReason)
						first, _ := attrOf(ev.Attributes, AttrDetail)
						n, _ := attrOf(ev.Attributes, AttrEvaluations)
						last, ok := attrOf(ev.Attributes, AttrLastDetail)
						if !ok {
							last = first // a run of one
						}
						got.evaluations += int(n.AsInt64())
						gotRuns = append(gotRuns, blockedRun{reason.AsString(), first.AsString(), last.AsString(), int(n.AsInt64())})
					}
					got.kvWrites += len(events(p, EventKVReceived))
					// Past the SDK's limit of events a span (128) they are counted, not
					// kept: a wait span's would be blocked runs, whose evaluations are then
					// unknown (and the comparison fails); the others' are KV writes.
					if p.Name != SpanWait {
						got.kvWrites += p.DroppedEvents
					}
				}
				if fmt.Sprint(gotRuns) != fmt.Sprint(runs[id]) {
					t.Fatalf("request %s: blocked events %v, its evaluations say %v", id, gotRuns, runs[id])
				}
				got.preempted += len(events(rt.root, EventPreempted))
				got.leaked += len(events(rt.root, EventLeaked))
				got.hazards += len(events(rt.root, EventHazard))
				if len(events(rt.root, EventPreempted)) > 0 && rt.root.Status.Code != codes.Error {
					t.Fatalf("request %s: preempted with status %v, want Error", id, rt.root.Status)
				}
			}
			got.arrived, got.outcome = want.arrived, want.outcome
			if fmt.Sprint(got) != fmt.Sprint(want) || c.shows(got) == 0 {
				t.Fatalf("the traces hold %+v, the events say %+v: want the same, and what the scenario is about", got, want)
			}
			t.Logf("%d requests, %d spans; %+v", len(traces), len(exp.GetSpans()), want)
		})
	}
}

// The phases' spans are named as documented, and those a scenario goes through all show.
func TestAScenarioGoesThroughEveryPhase(t *testing.T) {
	tr, exp := start(t, Config{})
	_, err := lockstep.Run("chat", 2, 400, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) { tr.Observe(e, evs) })
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range exp.GetSpans() {
		seen[s.Name] = true
	}
	for _, n := range []string{SpanRequest, SpanWait, SpanAwaitKV, SpanAwaitStart, SpanDecode} {
		if !seen[n] {
			t.Errorf("no %q span among %v", n, seen)
		}
	}
}

// The engine never waits for the tracer: with the span builder stuck, every observation
// returns, what does not fit the queue is dropped and counted, and where the loss falls
// every open span is ended as lost, so that none stays open; requests that arrive later
// are traced whole.
func TestAStuckBuilderDoesNotSlowTheEngine(t *testing.T) {
	hold := make(chan struct{})
	tr, exp := start(t, Config{Queue: 64, hold: hold})
	var e *engine.Engine
	arrivedAfter := map[string]bool{}
	released := false
	steps := 0
	_, err := lockstep.Run("chat", 3, 600, 50*time.Millisecond, nil, func(en *engine.Engine, evs []engine.Event) {
		e = en
		tr.Observe(e, evs) // would hang the test if it waited
		if en.StepNumber() == 300 && !released {
			if tr.Stats().DroppedEvents == 0 {
				t.Errorf("with the builder stuck for 300 steps: Stats() = %+v, want events dropped", tr.Stats())
			}
			close(hold)
			released = true
			if err := tr.Flush(context.Background()); err != nil {
				t.Error(err)
			}
		}
		if released {
			// A builder that keeps up: what each call and step made is built before the next.
			if err := tr.Flush(context.Background()); err != nil {
				t.Error(err)
			}
			for _, ev := range evs {
				if a, ok := ev.(engine.RequestArrived); ok {
					arrivedAfter[a.ID] = true
				}
			}
		}
		steps++
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	st := tr.Stats()
	if st.Lost == 0 || st.Open != 0 {
		t.Fatalf("Stats() = %+v: want a loss, nothing open", st)
	}
	traces := byRequest(t, exp.GetSpans())
	lost := 0
	for id, rt := range traces {
		out, _ := attr(rt.root, AttrOutcome)
		if out.AsString() == outcomeLost {
			lost++
			continue
		}
		if err := rt.check(); err != nil {
			t.Fatalf("request %s: %v", id, err)
		}
	}
	for id := range arrivedAfter {
		rt := traces[id]
		if rt == nil {
			t.Fatalf("request %s arrived once the builder moved again, and has no span", id)
		}
		if out, _ := attr(rt.root, AttrOutcome); out.AsString() == outcomeLost {
			t.Fatalf("request %s arrived once the builder moved again, and its span was lost", id)
		}
	}
	if lost == 0 || len(arrivedAfter) == 0 {
		t.Fatalf("%d spans ended as lost, %d requests arrived after: want some of each", lost, len(arrivedAfter))
	}
}

// failing is an exporter that refuses every batch.
type failing struct {
	mu    sync.Mutex
	calls int
}

func (f *failing) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return errors.New("backend down")
}
func (f *failing) Shutdown(context.Context) error { return nil }

// A backend that refuses the spans costs them, counted; nothing else.
func TestExportFailuresAreCounted(t *testing.T) {
	f := &failing{}
	tr, _ := start(t, Config{Exporter: f})
	_, err := lockstep.Run("chat", 4, 200, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) { tr.Observe(e, evs) })
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if st := tr.Stats(); st.ExportFailures == 0 || st.Exported != 0 || st.Spans == 0 || st.DroppedEvents != 0 {
		t.Fatalf("Stats() = %+v: want the failed exports counted, no span dropped on the way", st)
	}
}

// The endpoint is an OTLP/HTTP URL; with no path the spans go to /v1/traces.
func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:4318":             "http://127.0.0.1:4318/v1/traces",
		"http://127.0.0.1:4318/":            "http://127.0.0.1:4318/v1/traces",
		"https://tempo.example:443/otlp/v1": "https://tempo.example:443/otlp/v1",
		"http://jaeger":                     "http://jaeger/v1/traces",
	} {
		if got, err := ParseEndpoint(in); err != nil || got != want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"127.0.0.1:4318", "grpc://127.0.0.1:4317", "http://", "http://u:p@h:1", "http://h:1/?a=b", "::"} {
		if got, err := ParseEndpoint(in); err == nil {
			t.Errorf("ParseEndpoint(%q) = %q, want an error", in, got)
		} else if !strings.Contains(err.Error(), "otlp endpoint") {
			t.Errorf("ParseEndpoint(%q): %v, want it to name the endpoint", in, err)
		}
	}
}

// A request's spans keep at most the SDK's limit of events each, and count the rest: a
// request that takes 300 KV writes holds 128 of them and says 172 were dropped, so an open
// request costs bounded memory however long it lives.
func TestASpansEventsAreBounded(t *testing.T) {
	tr, exp := start(t, Config{})
	const writes = 300
	stamp := func(step uint64) engine.Stamp { return engine.Stamp{Step: step, At: int64(step)} }
	evs := []engine.Event{
		engine.RequestArrived{Stamp: stamp(1), ID: "long", PromptLength: writes + 1, End: writes, MaxTokens: 4},
		engine.PrepareAdmitted{Stamp: stamp(2), ID: "long", End: writes, PagesTaken: 20},
	}
	for i := range writes {
		evs = append(evs, engine.KVReceived{Stamp: stamp(3 + uint64(i)), ID: "long", Received: i + 1, Reserved: writes})
	}
	evs = append(evs, engine.RequestAborted{Stamp: stamp(writes + 3), ID: "long", Reason: engine.AbortByClient})
	tr.Observe(nil, evs)
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rt := byRequest(t, exp.GetSpans())["long"]
	if rt == nil || len(rt.phases) != 3 || rt.phases[1].Name != SpanAwaitKV {
		t.Fatalf("request long: no trace of phases wait, kv.await, start_generate.wait")
	}
	kv := rt.phases[1]
	got := events(kv, EventKVReceived)
	if len(got) != 128 || kv.DroppedEvents != writes-128 {
		t.Fatalf("kv.await holds %d kv_received events and %d dropped, want 128 and %d", len(got), kv.DroppedEvents, writes-128)
	}
	if v, _ := attrOf(got[len(got)-1].Attributes, AttrReceived); v.AsInt64() != writes {
		t.Errorf("the last kv_received event says %d received, want %d (the latest are kept)", v.AsInt64(), writes)
	}
}
