package tracing

import (
	"context"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
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
	AttrLeakedPages  = attribute.Key("kvtop.request.leaked_pages")
	AttrStep         = attribute.Key("kvtop.step") // on events: the engine's step
	AttrReason       = attribute.Key("kvtop.blocked.reason")
	// AttrEvaluations counts the blocked evaluations a "blocked" event stands for: every
	// evaluation of one reason in a row, from the event's time (AttrDetail is the first's
	// numbers) to AttrLastStep (AttrLastDetail the last's).
	AttrEvaluations = attribute.Key("kvtop.blocked.evaluations")
	AttrLastDetail  = attribute.Key("kvtop.blocked.last_detail")
	AttrLastStep    = attribute.Key("kvtop.blocked.last_step")
	AttrDetail      = attribute.Key("kvtop.detail")
	AttrHazard      = attribute.Key("kvtop.hazard.kind")
	AttrReceived    = attribute.Key("kvtop.kv.received")
	AttrReserved    = attribute.Key("kvtop.kv.reserved")
)

// request is an open request's spans. They are started as the request enters each phase,
// with the engine's times, and take attributes and events as its events come; the SDK
// bounds the events a span keeps (128 unless OTEL_SPAN_EVENT_COUNT_LIMIT says otherwise) and
// counts those past it as dropped, so an open request's memory is bounded however long it
// lives.
type request struct {
	id     string
	ctx    context.Context // the request's span's
	root   trace.Span
	phase  trace.Span // the phase it is in
	name   string     // of the phase
	last   engine.Stamp
	block  blockRun
	status codes.Code
	why    string
	// What the request's span says of it once it ends, set as its events come (one
	// SetAttributes at the end costs the SDK one copy, not one growth an event).
	matched                  bool // a PrefixMatched came
	match                    prefix.Kind
	seq                      int64
	admitted                 bool // a PrepareAdmitted came
	matchedLen, pages, evict int
	segments                 int // -1: no metadata yet
	metadata                 string
	begin, generated, leaked int // -1: not started, not finished, not leaked
}

// blockRun is a run of blocked evaluations of one reason not yet recorded: it becomes one
// "blocked" event when the reason changes, or the request leaves the phase. The engine
// reports an evaluation each time its numbers change (free pages, the request in front), so
// a request held by the watermark can have one a step; the reason is what a reader wants,
// and the run keeps the first and the last numbers and how many there were.
type blockRun struct {
	n           int
	first, last engine.PrepareBlocked
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
		r.blocked(e)
	case engine.PrefixMatched:
		r.matched, r.match, r.seq = true, e.Match, e.Seq
	case engine.PrepareAdmitted:
		r.admitted, r.matchedLen, r.pages, r.evict = true, e.Matched, e.PagesTaken, e.Evicted
		next := SpanAwaitKV
		if e.End == e.Matched {
			next = SpanAwaitStart // every token matched: no KV to receive
		}
		if r.name == SpanWait {
			b.to(r, next, when)
		}
	case engine.MetadataEmitted:
		segments := 0
		if len(e.Runs) > 0 {
			segments = len(e.Runs[0])
		}
		r.segments, r.metadata = segments, e.Encoded
	case engine.KVReceived:
		addEvent(r.phase, EventKVReceived, when, AttrReceived.Int(e.Received), AttrReserved.Int(e.Reserved))
		if e.Received == e.Reserved && r.name == SpanAwaitKV {
			b.to(r, SpanAwaitStart, when) // (KV that completes after start_generate does not)
		}
	case engine.RequestStarted:
		r.begin = e.Begin
		next := SpanDecode
		if e.Tail > 0 {
			next = SpanPrefill
		}
		b.to(r, next, when)
	case engine.Prefilled:
		if r.name == SpanPrefill {
			b.to(r, SpanDecode, when)
		}
	case engine.HazardDetected:
		addEvent(r.root, EventHazard, when, AttrHazard.String(e.Hazard.Kind.String()), AttrDetail.String(e.Hazard.String()))
	case engine.RequestFinished:
		r.generated = e.Generated
		b.end(r, when, e.Reason)
	case engine.RequestAborted:
		switch {
		case e.Reason == engine.AbortPreempt:
			addEvent(r.root, EventPreempted, when)
			r.status, r.why = codes.Error, "preempted for want of pages"
		case e.Leaked:
			addEvent(r.root, EventLeaked, when, AttrLeakedPages.Int(e.LeakedPages))
			r.leaked = e.LeakedPages
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
	ctx := context.Background()
	if parent, ok := b.t.parents.take(e.ID); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	r := &request{id: e.ID, last: e.Stamp, segments: -1, begin: -1, generated: -1, leaked: -1}
	r.ctx, r.root = b.t.tracer.Start(ctx, SpanRequest, trace.WithTimestamp(at(e.Stamp)), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(AttrID.String(e.ID), AttrPromptLength.Int(e.PromptLength), AttrEnd.Int(e.End),
			AttrMaxTokens.Int(e.MaxTokens), AttrStep.Int64(int64(e.Step))))
	b.to(r, SpanWait, e.Stamp)
	b.open[e.ID] = r
	b.t.open.Store(int64(len(b.open)))
}

// blocked adds an evaluation to the request's run of blocked evaluations, recording the run
// before it if the reason changed.
func (r *request) blocked(e engine.PrepareBlocked) {
	if r.block.n > 0 && r.block.first.Eval.Reason != e.Eval.Reason {
		r.endBlock()
	}
	if r.block.n == 0 {
		r.block.first = e
	}
	r.block.last = e
	r.block.n++
}

// endBlock records the run of blocked evaluations as an event of the phase they came in.
func (r *request) endBlock() {
	run := &r.block
	if run.n == 0 {
		return
	}
	attrs := []attribute.KeyValue{AttrReason.String(run.first.Eval.Reason.String()), AttrDetail.String(run.first.Eval.Short()),
		AttrEvaluations.Int(run.n)}
	if run.n > 1 {
		attrs = append(attrs, AttrLastDetail.String(run.last.Eval.Short()), AttrLastStep.Int64(int64(run.last.Step)))
	}
	addEvent(r.phase, EventBlocked, run.first.Stamp, attrs...)
	*run = blockRun{}
}

// to ends the request's phase, if any, at when and starts the next.
func (b *builder) to(r *request, name string, when engine.Stamp) {
	if r.phase != nil {
		r.endBlock()
		b.endSpan(r.phase, when)
	}
	_, r.phase = b.t.tracer.Start(r.ctx, name, trace.WithTimestamp(at(when)))
	r.name = name
}

// end ends a request's spans at when, and forgets it.
func (b *builder) end(r *request, when engine.Stamp, outcome string) {
	r.endBlock()
	b.endSpan(r.phase, when)
	if r.root.IsRecording() {
		r.root.SetAttributes(b.attrs(r, outcome)...)
	}
	if r.status != codes.Unset {
		r.root.SetStatus(r.status, r.why)
	}
	b.endSpan(r.root, when)
	delete(b.open, r.id)
	b.t.open.Store(int64(len(b.open)))
}

// attrs returns the attributes of a request's span that its events gave it, in a buffer
// reused for the next request.
func (b *builder) attrs(r *request, outcome string) []attribute.KeyValue {
	a := b.scratch[:0]
	if r.matched {
		a = append(a, AttrMatch.String(r.match.String()), AttrSeq.Int64(r.seq))
	}
	if r.admitted {
		a = append(a, AttrMatched.Int(r.matchedLen), AttrPages.Int(r.pages), AttrEvicted.Int(r.evict))
	}
	if r.segments >= 0 {
		a = append(a, AttrSegments.Int(r.segments), AttrMetadata.String(r.metadata))
	}
	if r.begin >= 0 {
		a = append(a, AttrBegin.Int(r.begin))
	}
	if r.generated >= 0 {
		a = append(a, AttrGenerated.Int(r.generated))
	}
	if r.leaked >= 0 {
		a = append(a, AttrLeakedPages.Int(r.leaked))
	}
	a = append(a, AttrOutcome.String(outcome))
	b.scratch = a
	return a
}

// endSpan ends a span at when, counting it if it is sampled (and so goes to the exporter).
func (b *builder) endSpan(span trace.Span, when engine.Stamp) {
	if span.IsRecording() {
		b.t.spans.Add(1)
	}
	span.End(trace.WithTimestamp(at(when)))
}

// addEvent adds an event of the engine's, stamped with its time and step, to span.
func addEvent(span trace.Span, name string, when engine.Stamp, attrs ...attribute.KeyValue) {
	if !span.IsRecording() {
		return // not sampled
	}
	span.AddEvent(name, trace.WithTimestamp(at(when)), trace.WithAttributes(append(attrs, AttrStep.Int64(int64(when.Step)))...))
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
