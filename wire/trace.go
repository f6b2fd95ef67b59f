package wire

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"sync"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
)

// tracer keeps the lifecycle of recent requests, read from the engine's events, for
// /debug/dump_event_trace: each request a track, its phases (waiting, awaiting KV, KV
// complete, prefill, decode) as spans inside a span of the whole request, and its moments
// (blocked, metadata, hazards) as instants. Finished requests go into a ring of a bounded
// size; requests still alive are kept while the engine holds them.
type tracer struct {
	mu    sync.Mutex
	open  map[string]*reqTrace
	ring  []*reqTrace // finished requests; ring[head] is the oldest once full
	head  int
	full  bool
	nextT int
}

type reqTrace struct {
	id      string
	tid     int
	begin   engine.Stamp
	end     engine.Stamp
	ended   bool
	outcome string
	args    map[string]any
	phases  []phase
	marks   []mark
	lost    int // marks beyond maxMarks
}

type phase struct {
	name     string
	from, to engine.Stamp
	open     bool
}

type mark struct {
	name string
	at   engine.Stamp
	args map[string]any
}

// maxMarks bounds the instants kept per request.
const maxMarks = 64

func newTracer(limit int) *tracer {
	return &tracer{open: make(map[string]*reqTrace), ring: make([]*reqTrace, limit)}
}

// run reads the engine's events until ctx ends or the runner stops.
func (t *tracer) run(ctx context.Context, r *runner.Runner) {
	sub := r.Subscribe()
	defer sub.Close()
	whenSignalled(ctx, sub.C(), func() { t.update(sub.Take()) })
}

// whenSignalled calls fn each time c is signalled, until c closes or ctx ends: the loop of
// the server's in-process viewer that follows every event (the tracer).
func whenSignalled(ctx context.Context, c <-chan struct{}, fn func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-c:
			if !ok {
				return
			}
			fn()
		}
	}
}

func (t *tracer) update(u feed.Update) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if u.Snapshot != nil {
		t.resync(u.Snapshot)
	}
	for _, ev := range u.Events {
		t.apply(ev)
	}
}

// resync squares the open requests with a snapshot after events were lost: those gone are
// closed, those unknown are opened in the phase they are in.
func (t *tracer) resync(s *engine.Snapshot) {
	alive := make(map[string]*engine.RequestView)
	for i := range s.Requests {
		if r := &s.Requests[i]; !r.State.Ended() {
			alive[r.ID] = r
		}
	}
	for id, tr := range t.open {
		if alive[id] == nil {
			t.finish(tr, s.Stamp, "unknown (events lost)")
		}
	}
	for id, r := range alive {
		if t.open[id] != nil {
			continue
		}
		tr := t.start(id, r.Arrived)
		tr.args["prompt_length"] = r.PromptLength
		from := slices.MaxFunc([]engine.Stamp{r.Arrived, r.Admitted, r.Started}, stampCmp)
		tr.phases = append(tr.phases, phase{name: phaseOf(r), from: from, open: true})
	}
}

func stampCmp(a, b engine.Stamp) int {
	return cmp.Or(cmp.Compare(a.Step, b.Step), cmp.Compare(a.At, b.At))
}

func phaseOf(r *engine.RequestView) string {
	switch r.State {
	case engine.StateWaiting:
		return "waiting"
	case engine.StatePrepared:
		return "awaiting KV"
	case engine.StateKVComplete:
		return "KV complete"
	}
	if r.Pending > 0 {
		return "prefill"
	}
	return "decode"
}

func (t *tracer) start(id string, at engine.Stamp) *reqTrace {
	t.nextT++
	tr := &reqTrace{id: id, tid: t.nextT, begin: at, args: map[string]any{"id": id}}
	t.open[id] = tr
	return tr
}

func (t *tracer) finish(tr *reqTrace, at engine.Stamp, outcome string) {
	tr.to(at, "")
	tr.end, tr.ended, tr.outcome = at, true, outcome
	delete(t.open, tr.id)
	if len(t.ring) == 0 {
		return
	}
	t.ring[t.head] = tr
	t.head = (t.head + 1) % len(t.ring)
	if t.head == 0 {
		t.full = true
	}
}

// to closes the open phase and, if name is set, opens the next.
func (tr *reqTrace) to(at engine.Stamp, name string) {
	if n := len(tr.phases); n > 0 && tr.phases[n-1].open {
		tr.phases[n-1].to, tr.phases[n-1].open = at, false
	}
	if name != "" {
		tr.phases = append(tr.phases, phase{name: name, from: at, open: true})
	}
}

func (tr *reqTrace) mark(name string, at engine.Stamp, args map[string]any) {
	if len(tr.marks) >= maxMarks {
		tr.lost++
		return
	}
	tr.marks = append(tr.marks, mark{name: name, at: at, args: args})
}

func (t *tracer) apply(ev engine.Event) {
	if e, ok := ev.(engine.RequestArrived); ok {
		if old := t.open[e.ID]; old != nil {
			t.finish(old, e.Stamp, "unknown (id reused)")
		}
		tr := t.start(e.ID, e.Stamp)
		tr.args["prompt_length"] = e.PromptLength
		tr.args["end"] = e.End
		tr.args["max_tokens"] = e.MaxTokens
		tr.phases = append(tr.phases, phase{name: "waiting", from: e.Stamp, open: true})
		return
	}
	id, _ := engine.RequestOf(ev)
	tr := t.open[id]
	if tr == nil {
		return
	}
	switch e := ev.(type) {
	case engine.PrepareBlocked:
		tr.mark("blocked: "+e.Eval.Reason.String(), e.Stamp, map[string]any{"why": e.Eval.Short()})
	case engine.PrepareAdmitted:
		tr.args["seq"], tr.args["matched"] = e.Seq, e.Matched
		next := "awaiting KV"
		if e.End == e.Matched {
			next = "KV complete"
		}
		tr.to(e.Stamp, next)
	case engine.MetadataEmitted:
		tr.args["kv_append_metadata"] = e.Encoded
		tr.mark("metadata", e.Stamp, map[string]any{"kv_append_metadata": e.Encoded, "matched": e.Matched})
	case engine.KVReceived:
		if e.Received == e.Reserved {
			tr.to(e.Stamp, "KV complete")
		}
	case engine.RequestStarted:
		next := "decode"
		if e.Tail > 0 {
			next = "prefill"
		}
		tr.to(e.Stamp, next)
	case engine.Prefilled:
		if e.Remaining == 0 {
			tr.to(e.Stamp, "decode")
		}
	case engine.RequestFinished:
		tr.args["generated"] = e.Generated
		t.finish(tr, e.Stamp, e.Reason)
	case engine.RequestAborted:
		if e.Leaked {
			tr.args["leaked_pages"] = e.LeakedPages
		}
		t.finish(tr, e.Stamp, e.Reason)
	case engine.HazardDetected:
		tr.mark("hazard: "+e.Hazard.Kind.String(), e.Stamp, map[string]any{"what": e.Hazard.String()})
	case engine.RequestRetired:
		t.finish(tr, e.Stamp, "retired")
	}
}

// traceEvent is one entry of the Chrome trace event format that MLC's
// /debug/dump_event_trace writes and Perfetto (ui.perfetto.dev) and chrome://tracing open.
type traceEvent struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	Ts    int64          `json:"ts"`            // microseconds
	Dur   *int64         `json:"dur,omitempty"` // for "X"
	Pid   int            `json:"pid"`
	Tid   int            `json:"tid"`
	Scope string         `json:"s,omitempty"` // for "i"
	Args  map[string]any `json:"args,omitempty"`
}

// dump writes the trace as a JSON array of trace events: the finished requests oldest
// first, then those still alive. Engine time is in milliseconds, so spans shorter than a
// millisecond show as instants; the step numbers are in each span's args.
func (t *tracer) dump() []byte {
	t.mu.Lock()
	var trs []*reqTrace
	if t.full {
		trs = append(trs, t.ring[t.head:]...)
	}
	trs = append(trs, t.ring[:t.head]...)
	open := make([]*reqTrace, 0, len(t.open))
	for _, tr := range t.open {
		open = append(open, tr)
	}
	slices.SortFunc(open, func(a, b *reqTrace) int { return cmp.Compare(a.tid, b.tid) })
	trs = append(trs, open...)
	out := []traceEvent{{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "kvtop decode instance"}}}
	for _, tr := range trs {
		out = tr.events(out)
	}
	t.mu.Unlock()
	b, err := json.Marshal(out)
	if err != nil {
		return []byte("[]")
	}
	return b
}

func (tr *reqTrace) events(out []traceEvent) []traceEvent {
	us := func(s engine.Stamp) int64 { return s.At * 1000 }
	span := func(name, cat string, from, to engine.Stamp, open bool, args map[string]any) traceEvent {
		ev := traceEvent{Name: name, Cat: cat, Ph: "B", Ts: us(from), Pid: 1, Tid: tr.tid, Args: args}
		if !open {
			d := us(to) - us(from)
			ev.Ph, ev.Dur = "X", &d
		}
		return ev
	}
	out = append(out, traceEvent{Name: "thread_name", Ph: "M", Pid: 1, Tid: tr.tid, Args: map[string]any{"name": tr.id}})
	args := make(map[string]any, len(tr.args)+3)
	for k, v := range tr.args {
		args[k] = v
	}
	args["begin_step"] = tr.begin.Step
	if tr.ended {
		args["end_step"], args["outcome"] = tr.end.Step, tr.outcome
	}
	if tr.lost > 0 {
		args["marks_lost"] = tr.lost
	}
	out = append(out, span("request "+tr.id, "request", tr.begin, tr.end, !tr.ended, args))
	for _, p := range tr.phases {
		a := map[string]any{"from_step": p.from.Step}
		if !p.open {
			a["to_step"] = p.to.Step
		}
		out = append(out, span(p.name, "phase", p.from, p.to, p.open, a))
	}
	for _, m := range tr.marks {
		a := map[string]any{"step": m.at.Step}
		for k, v := range m.args {
			a[k] = v
		}
		out = append(out, traceEvent{Name: m.name, Cat: "mark", Ph: "i", Scope: "t", Ts: us(m.at), Pid: 1, Tid: tr.tid, Args: a})
	}
	return out
}
