package tracing

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine/runner"
)

// maxParents bounds the traceparents waiting for their requests; parentTTL is how long one
// waits before it may be dropped to make room.
const (
	maxParents = 4096
	parentTTL  = time.Minute
)

// parents are the trace contexts of prep_recv calls, by request id, from the call until the
// builder sees the request arrive.
type parents struct {
	mu   sync.Mutex
	m    map[string]parent
	next uint64
}

type parent struct {
	sc   trace.SpanContext
	at   time.Time
	call uint64 // which call set it
}

func (p *parents) init() { p.m = make(map[string]parent) }

// Remote takes a prep_recv call's W3C trace context (its traceparent and tracestate
// headers) before the call goes to the engine, so that the span of request id is a child
// of the caller's; the function it returns is to be called with the call's error, and
// forgets the context of a call the engine refused. A call without a valid traceparent
// costs a header lookup. It is what wire.Options.PrepRecvTrace takes.
func (t *Tracer) Remote(id string, h http.Header) func(error) {
	if h.Get("traceparent") == "" {
		return func(error) {}
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
	if !sc.IsValid() {
		return func(error) {}
	}
	call, ok := t.parents.put(id, sc, time.Now())
	if !ok {
		return func(error) {}
	}
	return func(err error) {
		if err != nil && !accepted(err) {
			t.parents.forget(id, call)
		}
	}
}

// accepted reports whether a prep_recv that failed with err had still been accepted by the
// engine (and so has its RequestArrived): its client went away while it waited, or it was
// aborted.
func accepted(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, runner.ErrAborted)
}

func (p *parents) put(id string, sc trace.SpanContext, now time.Time) (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) >= maxParents {
		for k, v := range p.m {
			if now.Sub(v.at) > parentTTL {
				delete(p.m, k) // its request never arrived, or its arrival was lost
			}
		}
		if len(p.m) >= maxParents {
			return 0, false
		}
	}
	p.next++
	p.m[id] = parent{sc: sc, at: now, call: p.next}
	return p.next, true
}

func (p *parents) forget(id string, call uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v, ok := p.m[id]; ok && v.call == call {
		delete(p.m, id)
	}
}

func (p *parents) take(id string) (trace.SpanContext, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[id]
	if ok {
		delete(p.m, id)
	}
	return v.sc, ok
}

func (p *parents) len() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(len(p.m))
}
