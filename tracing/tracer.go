package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine"
)

// Config configures a Tracer.
type Config struct {
	// Endpoint is the OTLP/HTTP receiver, http(s)://HOST:PORT[/PATH]; with no path the
	// spans go to /v1/traces (as OTEL_EXPORTER_OTLP_ENDPOINT says). The exporter's other
	// settings come from the OTEL_EXPORTER_OTLP_* environment variables (headers,
	// compression, timeout, certificates).
	Endpoint string
	// Exporter, when set, receives the spans instead of an OTLP exporter to Endpoint (tests
	// pass tracetest's in-memory exporter).
	Exporter sdktrace.SpanExporter
	// Sampler decides which requests are traced (default: those whose caller's traceparent
	// says sampled, and every request without one).
	Sampler sdktrace.Sampler
	// ServiceName is the resource's service.name (default "kvtop"; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it).
	ServiceName string
	// Version, when set, is the resource's service.version.
	Version string
	// Queue bounds the events waiting for the span builder (default 65,536): the engine
	// never waits for it; an observation that does not fit is dropped, and counted.
	Queue int
	// Linger is how long the span builder waits, once it has emptied the queue, before it
	// waits for the next events (default 1ms; negative: not at all).
	Linger time.Duration
	// BatchTimeout is how long the SDK's batch span processor keeps ended spans before it
	// exports them (default 1s).
	BatchTimeout time.Duration
	// Logf, when set, logs what a caller cannot see (a failed export).
	Logf func(format string, args ...any)

	// In tests: the builder waits on hold before it takes what is queued.
	hold <-chan struct{}
}

// Stats count what a tracer did.
type Stats struct {
	Spans          uint64 // spans ended, and so handed to the exporter
	Exported       uint64 // spans the exporter accepted
	ExportFailures uint64 // exports that failed (their spans are lost)
	DroppedEvents  uint64 // events dropped because the span builder's queue was full
	Lost           uint64 // losses, after each of which the open spans were ended as lost
	Open           int64  // requests with spans open
	Parents        int64  // traceparents waiting for their request to arrive
}

// Tracer builds request spans from the engine's events (a runner.Observer) and exports them.
type Tracer struct {
	cfg    Config
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer

	// The queue between Observe and the builder.
	mu     sync.Mutex
	pend   []engine.Event
	gaps   []int // positions in pend where an observation was dropped
	lost   bool  // an observation was dropped and no gap is marked yet
	signal chan struct{}
	flush  chan chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup

	parents parents
	b       builder // the builder goroutine's

	spans, exported, failures, dropped, losses atomic.Uint64
	open                                       atomic.Int64
	closeOnce                                  sync.Once
	closeErr                                   error
}

// ParseEndpoint checks an OTLP/HTTP endpoint and returns the URL spans are sent to.
func ParseEndpoint(ep string) (string, error) {
	const want = "want http://HOST:PORT or https://HOST:PORT, with an optional path"
	u, err := url.Parse(ep)
	if err != nil {
		return "", fmt.Errorf("otlp endpoint %q: %s (%v)", ep, want, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "", fmt.Errorf("otlp endpoint %q: %s", ep, want)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("otlp endpoint %q: no user, query or fragment (headers go in OTEL_EXPORTER_OTLP_HEADERS)", ep)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Start starts a tracer: its span builder, and the exporter.
func Start(cfg Config) (*Tracer, error) {
	if cfg.Queue <= 0 {
		cfg.Queue = 1 << 16
	}
	if cfg.Linger == 0 {
		cfg.Linger = time.Millisecond
	}
	if cfg.BatchTimeout <= 0 {
		cfg.BatchTimeout = time.Second
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "kvtop"
	}
	if cfg.Sampler == nil {
		cfg.Sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	exp := cfg.Exporter
	if exp == nil {
		u, err := ParseEndpoint(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		if exp, err = otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(u)); err != nil {
			return nil, fmt.Errorf("otlp exporter: %w", err)
		}
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	res, err := resource.New(context.Background(), resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && res == nil {
		return nil, fmt.Errorf("otlp resource: %w", err)
	}
	t := &Tracer{cfg: cfg, signal: make(chan struct{}, 1), flush: make(chan chan struct{}), done: make(chan struct{})}
	// The SDK reports what goes wrong (a failed export) to OpenTelemetry's global error
	// handler, which logs to the standard logger unless told otherwise: here, to Logf.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { t.logf("otlp: %v", err) }))
	t.tp = sdktrace.NewTracerProvider(
		// Blocking: a backend that cannot keep up holds the span builder, so spans are lost
		// in one place only, the bounded queue before it, and counted there.
		sdktrace.WithBatcher(&counting{SpanExporter: exp, t: t}, sdktrace.WithBlocking(), sdktrace.WithBatchTimeout(cfg.BatchTimeout)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(cfg.Sampler),
	)
	t.tracer = t.tp.Tracer("github.com/kvtop/kvtop/tracing")
	t.b = builder{t: t, open: make(map[string]*request)}
	t.parents.init()
	t.wg.Add(1)
	go t.build()
	return t, nil
}

// wanted reports whether an event concerns a request's spans.
func wanted(ev engine.Event) bool {
	switch e := ev.(type) {
	case engine.RequestArrived, engine.PrepareBlocked, engine.PrefixMatched, engine.PrepareAdmitted,
		engine.MetadataEmitted, engine.KVReceived, engine.RequestStarted, engine.RequestFinished,
		engine.RequestAborted, engine.HazardDetected, engine.RequestRetired:
		return true
	case engine.Prefilled:
		return e.Remaining == 0
	}
	return false
}

// Observe takes the events of one engine call or step that concern spans (a
// runner.Observer): on the engine's goroutine, without waiting.
func (t *Tracer) Observe(_ *engine.Engine, evs []engine.Event) {
	n := 0
	for _, ev := range evs {
		if wanted(ev) {
			n++
		}
	}
	if n == 0 {
		return
	}
	t.mu.Lock()
	if len(t.pend)+n > t.cfg.Queue {
		t.lost = true
		t.mu.Unlock()
		t.dropped.Add(uint64(n))
		return
	}
	wake := len(t.pend) == 0 && len(t.gaps) == 0
	if t.lost {
		t.gaps = append(t.gaps, len(t.pend))
		t.lost = false
	}
	for _, ev := range evs {
		if wanted(ev) {
			t.pend = append(t.pend, ev)
		}
	}
	t.mu.Unlock()
	if wake {
		select {
		case t.signal <- struct{}{}:
		default:
		}
	}
}

// build is the span builder's goroutine.
func (t *Tracer) build() {
	defer t.wg.Done()
	var evs []engine.Event
	var gaps []int
	take := func() {
		if t.cfg.hold != nil {
			<-t.cfg.hold
		}
		t.mu.Lock()
		evs, t.pend = t.pend, evs[:0]
		gaps, t.gaps = t.gaps, gaps[:0]
		t.mu.Unlock()
		t.b.apply(evs, gaps)
		clear(evs) // let the events go
	}
	for {
		select {
		case <-t.signal:
			take()
			if t.cfg.Linger > 0 {
				time.Sleep(t.cfg.Linger)
			}
		case reply := <-t.flush:
			take()
			close(reply)
		case <-t.done:
			take()
			t.b.endAll("open at shutdown")
			return
		}
	}
}

// Flush waits until every span of the events observed so far is built, and the spans ended
// exported.
func (t *Tracer) Flush(ctx context.Context) error {
	reply := make(chan struct{})
	select {
	case t.flush <- reply:
	case <-t.done:
		return errors.New("tracing: closed")
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-reply:
	case <-ctx.Done():
		return ctx.Err()
	}
	return t.tp.ForceFlush(ctx)
}

// Close builds the spans of what was observed, ends those still open (AttrOutcome "open at
// shutdown") and exports them, for up to 5 seconds. Nothing may be observed after it.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		t.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t.closeErr = t.tp.Shutdown(ctx)
	})
	return t.closeErr
}

// Stats returns the counters.
func (t *Tracer) Stats() Stats {
	return Stats{Spans: t.spans.Load(), Exported: t.exported.Load(), ExportFailures: t.failures.Load(),
		DroppedEvents: t.dropped.Load(), Lost: t.losses.Load(), Open: t.open.Load(), Parents: t.parents.len()}
}

func (t *Tracer) logf(format string, args ...any) {
	if t.cfg.Logf != nil {
		t.cfg.Logf(format, args...)
	}
}

// counting counts what the exporter took and what it refused.
type counting struct {
	sdktrace.SpanExporter
	t *Tracer
}

func (c *counting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		c.t.failures.Add(1) // and the batch span processor hands err to otel's error handler
		return err
	}
	c.t.exported.Add(uint64(len(spans)))
	return nil
}
