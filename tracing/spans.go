package tracing

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine"
)

// The spans' names: the request, and its phases in the order they come.
const (
	SpanRequest       = "request"
	SpanWait          = "prep_recv.wait"
	SpanAwaitKV       = "kv.await"
	SpanAwaitStart    = "start_generate.wait"
	SpanPrefill       = "prefill"
	SpanDecode        = "decode"
	EventBlocked      = "blocked"
	EventKVReceived   = "kv_received"
	EventPreempted    = "preempted"
	EventLeaked       = "leaked"
	EventHazard       = "hazard"
	outcomeLost       = "lost"
	outcomeIDReused   = "id reused"
	outcomeRetired    = "retired"
	outcomeOpenAtStop = "open at shutdown"
)

// The attributes of the request's span, and of its events.
const (
	AttrID           = attribute.Key("kvtop.request.id")
	AttrPromptLength = attribute.Key("kvtop.request.prompt_length")
	AttrEnd          = attribute.Key("kvtop.request.end") // the resolved kv_window_end
	AttrMaxTokens    = attribute.Key("kvtop.request.max_tokens")
	AttrMatch        = attribute.Key("kvtop.request.match") // new, fork or reuse
	AttrMatched      = attribute.Key("kvtop.request.matched_length")
	AttrSeq          = attribute.Key("kvtop.request.seq")
	AttrPages        = attribute.Key("kvtop.request.pages")   // pages prepare-receive took for it
	AttrEvicted      = attribute.Key("kvtop.request.evicted") // recycling sequences evicted to admit it
	AttrSegments     = attribute.Key("kvtop.request.segments")
	AttrMetadata     = attribute.Key("kvtop.request.kv_append_metadata")
	AttrBegin        = attribute.Key("kvtop.request.begin")
	AttrGenerated    = attribute.Key("kvtop.request.generated")
	AttrOutcome      = attribute.Key("kvtop.request.outcome") // length, abort, preempt, reclaim, or one of the tracer's
	// AttrEventsDropped counts the oldest events of the request's spans left out past 128.
	AttrEventsDropped = attribute.Key("kvtop.request.events_dropped")
	AttrLeakedPages   = attribute.Key("kvtop.request.leaked_pages")
	AttrStep          = attribute.Key("kvtop.step") // on events: the engine's step
	AttrReason        = attribute.Key("kvtop.blocked.reason")
	AttrDetail        = attribute.Key("kvtop.detail")
	AttrHazard        = attribute.Key("kvtop.hazard.kind")
	AttrReceived      = attribute.Key("kvtop.kv.received")
	AttrReserved      = attribute.Key("kvtop.kv.reserved")
)

// maxEvents bounds the events kept for a request's spans, as the SDK bounds a span's
// (128): past it the oldest go, and AttrEventsDropped counts them.
const maxEvents = 128

// request is what a request's spans will say, gathered from its events: the spans are made
// in one go when it ends (the SDK exports a span only once ended, so nothing shows any
// sooner), so that each takes its attributes at once.
type request struct {
	id     string
	parent trace.SpanContext // the caller's, from its traceparent; invalid if none
	start  engine.Stamp
	last   engine.Stamp // its latest event
	attrs  []attribute.KeyValue
	phases []phase
	events []spanEvent
	lost   int // events dropped past maxEvents
	status codes.Code
	why    string
}

// phase is one phase's span: from its start to the next phase's (or the request's end).
type phase struct {
	name string
	from engine.Stamp
}

// spanEvent is an event of the request's span (phase -1) or of one of its phases.
type spanEvent struct {
	phase int
	name  string
	at    engine.Stamp
	attrs [2]attribute.KeyValue
	n     int // of attrs
}

// builder turns events into spans, on the tracer's goroutine.
type builder struct {
	t       *Tracer
	open    map[string]*request
	scratch []attribute.KeyValue
}

func at(s engine.Stamp) time.Time { return time.UnixMilli(s.At) }

// apply builds the spans of a run of events, with an observation lost before each of gaps.
func (b *builder) apply(evs []engine.Event, gaps []int) {
	for i, ev := range evs {
		for len(gaps) > 0 && gaps[0] <= i {
			b.t.losses.Add(1)
			b.endAll(outcomeLost)
			gaps = gaps[1:]
		}
		b.event(ev)
	}
	if len(gaps) > 0 {
		b.t.losses.Add(uint64(len(gaps)))
		b.endAll(outcomeLost)
	}
}

func (b *builder) event(ev engine.Event) {
	if e, ok := ev.(engine.RequestArrived); ok {
		b.arrived(e)
		return
	}
	id, _ := engine.RequestOf(ev)
	r := b.open[id]
	if r == nil {
		return // arrived before the tracer started, or lost
	}
	when := ev.When()
	r.last = when
	switch e := ev.(type) {
	case engine.PrepareBlocked:
		r.event(r.current(), EventBlocked, when, AttrReason.String(e.Eval.Reason.String()), AttrDetail.String(e.Eval.Short()))
	case engine.PrefixMatched:
		r.attrs = append(r.attrs, AttrMatch.String(e.Match.String()), AttrSeq.Int64(e.Seq))
	case engine.PrepareAdmitted:
		r.attrs = append(r.attrs, AttrMatched.Int(e.Matched), AttrPages.Int(e.PagesTaken), AttrEvicted.Int(e.Evicted))
		next := SpanAwaitKV
		if e.End == e.Matched {
			next = SpanAwaitStart // every token matched: no KV to receive
		}
		if r.in(SpanWait) {
			r.to(next, when)
		}
	case engine.MetadataEmitted:
		segments := 0
		if len(e.Runs) > 0 {
			segments = len(e.Runs[0])
		}
		r.attrs = append(r.attrs, AttrSegments.Int(segments), AttrMetadata.String(e.Encoded))
	case engine.KVReceived:
		r.event(r.current(), EventKVReceived, when, AttrReceived.Int(e.Received), AttrReserved.Int(e.Reserved))
		if e.Received == e.Reserved && r.in(SpanAwaitKV) {
			r.to(SpanAwaitStart, when) // (KV that completes after start_generate does not)
		}
	case engine.RequestStarted:
		r.attrs = append(r.attrs, AttrBegin.Int(e.Begin))
		next := SpanDecode
		if e.Tail > 0 {
			next = SpanPrefill
		}
		r.to(next, when)
	case engine.Prefilled:
		if r.in(SpanPrefill) {
			r.to(SpanDecode, when)
		}
	case engine.HazardDetected:
		r.event(-1, EventHazard, when, AttrHazard.String(e.Hazard.Kind.String()), AttrDetail.String(e.Hazard.String()))
	case engine.RequestFinished:
		r.attrs = append(r.attrs, AttrGenerated.Int(e.Generated))
		b.end(r, when, e.Reason)
	case engine.RequestAborted:
		switch {
		case e.Reason == engine.AbortPreempt:
			r.event(-1, EventPreempted, when)
			r.status, r.why = codes.Error, "preempted for want of pages"
		case e.Leaked:
			r.event(-1, EventLeaked, when, AttrLeakedPages.Int(e.LeakedPages))
			r.attrs = append(r.attrs, AttrLeakedPages.Int(e.LeakedPages))
			r.status, r.why = codes.Error, "aborted while prepared: its KV leaked"
		}
		b.end(r, when, e.Reason)
	case engine.RequestRetired:
		b.end(r, when, outcomeRetired)
	}
}

// arrived opens a request, the child of its caller's span when its prep_recv carried a
// traceparent, in its first phase.
func (b *builder) arrived(e engine.RequestArrived) {
	if old := b.open[e.ID]; old != nil {
		b.end(old, e.Stamp, outcomeIDReused)
	}
	r := &request{id: e.ID, start: e.Stamp, last: e.Stamp, attrs: make([]attribute.KeyValue, 0, 16), phases: make([]phase, 0, 4)}
	r.parent, _ = b.t.parents.take(e.ID)
	r.attrs = append(r.attrs, AttrID.String(e.ID), AttrPromptLength.Int(e.PromptLength), AttrEnd.Int(e.End),
		AttrMaxTokens.Int(e.MaxTokens), AttrStep.Int64(int64(e.Step)))
	r.to(SpanWait, e.Stamp)
	b.open[e.ID] = r
	b.t.open.Store(int64(len(b.open)))
}

// current is the index of the phase the request is in.
func (r *request) current() int { return len(r.phases) - 1 }

// in reports whether the request is in the named phase.
func (r *request) in(name string) bool {
	return len(r.phases) > 0 && r.phases[len(r.phases)-1].name == name
}

// to starts the request's next phase, which ends the one it was in.
func (r *request) to(name string, when engine.Stamp) {
	r.phases = append(r.phases, phase{name: name, from: when})
}

// event records an event of a phase's span (-1: the request's).
func (r *request) event(phase int, name string, when engine.Stamp, attrs ...attribute.KeyValue) {
	if len(r.events) == maxEvents {
		copy(r.events, r.events[1:])
		r.events = r.events[:maxEvents-1]
		r.lost++
	}
	ev := spanEvent{phase: phase, name: name, at: when, n: len(attrs)}
	copy(ev.attrs[:], attrs)
	r.events = append(r.events, ev)
}

// end makes a request's spans, ending at when, and forgets it.
func (b *builder) end(r *request, when engine.Stamp, outcome string) {
	ctx := context.Background()
	if r.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, r.parent)
	}
	attrs := append(append(b.scratch[:0], r.attrs...), AttrOutcome.String(outcome))
	if r.lost > 0 {
		attrs = append(attrs, AttrEventsDropped.Int(r.lost))
	}
	b.scratch = attrs
	ctx, root := b.t.tracer.Start(ctx, SpanRequest, trace.WithTimestamp(at(r.start)), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrs...))
	evs := r.events
	for i, p := range r.phases {
		to := when
		if i+1 < len(r.phases) {
			to = r.phases[i+1].from
		}
		_, span := b.t.tracer.Start(ctx, p.name, trace.WithTimestamp(at(p.from)))
		for len(evs) > 0 && evs[0].phase == i {
			addEvent(span, &evs[0])
			evs = evs[1:]
		}
		span.End(trace.WithTimestamp(at(to)))
	}
	for _, ev := range r.events {
		if ev.phase < 0 {
			addEvent(root, &ev)
		}
	}
	if r.status != codes.Unset {
		root.SetStatus(r.status, r.why)
	}
	root.End(trace.WithTimestamp(at(when)))
	b.t.spans.Add(uint64(len(r.phases)) + 1)
	delete(b.open, r.id)
	b.t.open.Store(int64(len(b.open)))
}

func addEvent(span trace.Span, ev *spanEvent) {
	span.AddEvent(ev.name, trace.WithTimestamp(at(ev.at)),
		trace.WithAttributes(append(ev.attrs[:ev.n:ev.n], AttrStep.Int64(int64(ev.at.Step)))...))
}

// endAll ends every open request's spans at its latest event, in the order of their ids.
func (b *builder) endAll(outcome string) {
	ids := make([]string, 0, len(b.open))
	for id := range b.open {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := b.open[id]
		b.end(r, r.last, outcome)
	}
}
