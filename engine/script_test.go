package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// The scripts in testdata/ drive an engine through the calls a router and a prefill
// instance make, and show every step's output as DescribeReady gives it. Run with
// -rewrite to update the expected output after a deliberate change.
//
// Commands:
//
//	new [page_size=16] [max_total=8192] [max_num_seq=4] [chunk=1024] [prefix=radix|disable]
//	    [max_recycling=-1] [evict=mlc|lru] [watermark=400] [models=1] [age_limit=30s] [reclaim=0s]
//	    [exclude_unreceived] [keep_finished=256] [arena=LAYERSxHEADSxDIM]
//	prep id=A len=40 [end=-1] [max_tokens=16] [stem=S] [shared=N] [n=1]
//	    The prompt's first `shared` tokens (all by default) are those of stem S (the id by
//	    default); the rest are the request's own.
//	step [n=1] [every=100ms]
//	receive id=A[,B…] [from=0] [n=all]    write KV for reserved tokens [from, from+n)
//	write slots=1,2,3                write KV to raw slots
//	start id=A[,B…] [begin=END]
//	abort id=A
//	tick 30s
//	requests | pages | prefix | blocked | derived
//
// After every command the harness checks that a View built from the first snapshot (through
// JSON) and fed every event since equals the engine's snapshot now.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &scriptHarness{t: t}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out := h.run(d)
			h.checkView(d)
			return out
		})
	})
}

type scriptHarness struct {
	t    *testing.T
	e    *Engine
	view *View
	now  time.Time
}

func (h *scriptHarness) arg(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "true"
			}
			return a.Vals[0]
		}
	}
	return def
}

func (h *scriptHarness) intArg(d *datadriven.TestData, key string, def int) int {
	v := h.arg(d, key, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil {
		d.Fatalf(h.t, "%s=%s: %v", key, v, err)
	}
	return n
}

func (h *scriptHarness) durArg(d *datadriven.TestData, key string, def time.Duration) time.Duration {
	v := h.arg(d, key, def.String())
	x, err := time.ParseDuration(v)
	if err != nil {
		d.Fatalf(h.t, "%s=%s: %v", key, v, err)
	}
	return x
}

// tokenFor is the i-th token of stem s: stems are disjoint ranges of token ids.
func tokenFor(stem string, i int) int32 {
	h := uint32(2166136261)
	for _, c := range []byte(stem) {
		h = (h ^ uint32(c)) * 16777619
	}
	return int32((h%1000)*100000) + int32(i)
}

func (h *scriptHarness) run(d *datadriven.TestData) string {
	switch d.Cmd {
	case "new":
		cfg := DefaultConfig()
		cfg.PageSize = h.intArg(d, "page_size", 16)
		cfg.MaxTotalSequenceLength = h.intArg(d, "max_total", 8192)
		cfg.MaxSingleSequenceLength = cfg.MaxTotalSequenceLength
		cfg.MaxNumSequence = h.intArg(d, "max_num_seq", 4)
		cfg.PrefillChunkSize = h.intArg(d, "chunk", 1024)
		cfg.PrefixCache = h.arg(d, "prefix", "radix")
		cfg.MaxRecycling = h.intArg(d, "max_recycling", -1)
		if err := cfg.EvictOrder.UnmarshalText([]byte(h.arg(d, "evict", "mlc"))); err != nil {
			d.Fatalf(h.t, "evict: %v", err)
		}
		cfg.Watermark = h.intArg(d, "watermark", 400)
		cfg.Models = h.intArg(d, "models", 1)
		cfg.PreparedAgeLimit = h.durArg(d, "age_limit", 30*time.Second)
		cfg.ReclaimAfter = h.durArg(d, "reclaim", 0)
		cfg.ExcludeUnreceived = h.arg(d, "exclude_unreceived", "") == "true"
		cfg.KeepFinished = h.intArg(d, "keep_finished", 256)
		if a := h.arg(d, "arena", ""); a != "" {
			var g pages.Geometry
			if _, err := fmt.Sscanf(a, "%dx%dx%d", &g.Layers, &g.KVHeads, &g.HeadDim); err != nil {
				d.Fatalf(h.t, "arena=%s: %v", a, err)
			}
			cfg.Arena = g
		}
		e, err := New(cfg)
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		h.e = e
		h.now = time.UnixMilli(1_000_000)
		// The view starts from the snapshot as a viewer would get it: through JSON.
		b, err := json.Marshal(e.Snapshot())
		if err != nil {
			d.Fatalf(h.t, "marshal snapshot: %v", err)
		}
		var s Snapshot
		if err := json.Unmarshal(b, &s); err != nil {
			d.Fatalf(h.t, "unmarshal snapshot: %v", err)
		}
		if h.view, err = NewView(s); err != nil {
			d.Fatalf(h.t, "NewView: %v", err)
		}
		return fmt.Sprintf("%d pages of %d slots\n", e.Cache().NumPages(), cfg.PageSize)
	case "prep":
		id := h.arg(d, "id", "")
		n := h.intArg(d, "len", 40)
		stem := h.arg(d, "stem", id)
		shared := h.intArg(d, "shared", n)
		prompt := make([]int32, n)
		for i := range prompt {
			if i < shared {
				prompt[i] = tokenFor(stem, i)
			} else {
				prompt[i] = tokenFor(id+"/own", i)
			}
		}
		pr := PrepRecv{ID: id, Prompt: prompt, MaxTokens: h.intArg(d, "max_tokens", 16), N: h.intArg(d, "n", 1)}
		if end := h.arg(d, "end", "-1"); end != "none" {
			pr.End, pr.HasEnd = h.intArg(d, "end", -1), true
		}
		return h.call(h.e.PrepRecv(h.now, pr))
	case "step":
		var b strings.Builder
		every := h.durArg(d, "every", 100*time.Millisecond)
		for range h.intArg(d, "n", 1) {
			h.now = h.now.Add(every)
			rd := h.e.Step(h.now)
			h.applyAll(d, rd.Events)
			b.WriteString(DescribeReady(rd))
		}
		return b.String()
	case "receive":
		var b strings.Builder
		for _, id := range strings.Split(h.arg(d, "id", ""), ",") {
			r := h.e.reqs[id]
			if r == nil || len(r.runs) == 0 {
				d.Fatalf(h.t, "receive: %s has reserved nothing", id)
			}
			from := h.intArg(d, "from", 0)
			n := h.intArg(d, "n", r.kv.reserved-from)
			all := pages.Expand(nil, r.runs[0])
			if from < 0 || from+n > len(all) {
				d.Fatalf(h.t, "receive %s [%d, %d) of %d reserved", id, from, from+n, len(all))
			}
			b.WriteString(h.write(all[from : from+n]))
		}
		return b.String()
	case "write":
		var slots []int64
		for _, f := range strings.Split(h.arg(d, "slots", ""), ",") {
			s, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				d.Fatalf(h.t, "slots: %v", err)
			}
			slots = append(slots, s)
		}
		return h.write(slots)
	case "start":
		var b strings.Builder
		for _, id := range strings.Split(h.arg(d, "id", ""), ",") {
			begin := 0
			if r := h.e.reqs[id]; r != nil {
				begin = r.end
			}
			b.WriteString(h.call(h.e.StartGenerate(h.now, id, h.intArg(d, "begin", begin))))
		}
		return b.String()
	case "abort":
		return h.call(h.e.Abort(h.now, h.arg(d, "id", "")))
	case "tick":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(h.t, "tick: %v", err)
		}
		h.now = h.now.Add(dur)
		return ""
	case "requests":
		var b strings.Builder
		for _, r := range h.view.Requests() {
			fmt.Fprintf(&b, "%s %s seq=%d end=%d matched=%d kv=%d/%d generated=%d/%d", r.ID, r.State, r.Seq, r.End, r.Matched, r.Received, r.Reserved, r.Generated, r.MaxTokens)
			if r.Leaked {
				b.WriteString(" leaked")
			}
			if ev, ok := h.view.Blocked(r); ok {
				fmt.Fprintf(&b, " [%s]", ev.Short())
			}
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "waiting %v running %v\n", h.view.Waiting(), h.view.Running())
		return b.String()
	case "blocked":
		var b strings.Builder
		for _, r := range h.view.Requests() {
			if ev, ok := h.view.Blocked(r); ok {
				fmt.Fprintf(&b, "%s: %s\n", r.ID, ev.String())
			}
		}
		return b.String()
	case "pages":
		c := h.e.Cache()
		var b strings.Builder
		fmt.Fprintf(&b, "free %d of %d, total length %d\n", c.NumAvailablePages(), c.NumPages(), c.TotalSequenceLength())
		for _, blk := range c.Blocks() {
			fmt.Fprintf(&b, "block %d: len %d pages %v seqs %v\n", blk.ID, blk.Length, blk.Pages, blk.Seqs)
		}
		return b.String()
	case "prefix":
		return h.e.Prefix().Describe()
	case "derived":
		return describeDerived(h.view)
	}
	d.Fatalf(h.t, "unknown command %s", d.Cmd)
	return ""
}

// describeDerived writes what the view derives: pages by state, requests by condition with
// their status, blocked requests by reason, stuck ones. (The harness checks after every
// command that the engine derives the same.)
func describeDerived(v *View) string {
	d := v.Derived()
	var b strings.Builder
	b.WriteString("pages:")
	for _, st := range PageStates() {
		if n := d.Pages[st]; n > 0 {
			fmt.Fprintf(&b, " %s %d", st, n)
		}
	}
	b.WriteString("\nrequests:")
	for c := range NumConditions {
		if n := d.Conditions[c]; n > 0 {
			fmt.Fprintf(&b, " %s %d", c, n)
		}
	}
	fmt.Fprintf(&b, " (stuck %d, hazardous %d)\n", d.Stuck, d.Hazardous)
	for i, r := range v.Requests() {
		st := v.Statuses()[i]
		fmt.Fprintf(&b, "  %s %s pages=%d", r.ID, st.Condition, st.Pages)
		if st.Blocked != prepare.ReasonNone {
			fmt.Fprintf(&b, " blocked=%s", st.Blocked)
		}
		if st.Stuck {
			b.WriteString(" stuck")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (h *scriptHarness) write(slots []int64) string {
	tb := h.e.stores[0].TokenBytes() * len(h.e.stores)
	payload := make([]byte, len(slots)*tb)
	for i := range payload {
		payload[i] = byte(i)
	}
	_, err := h.e.ReceiveKV(h.now, slots, payload)
	return h.call(err)
}

// call prints a call's error, or the events it produced.
func (h *scriptHarness) call(err error) string {
	if err != nil {
		if evs := h.e.TakeEvents(); len(evs) > 0 {
			h.t.Fatalf("a failed call emitted %v", evs)
		}
		return "error: " + err.Error() + "\n"
	}
	evs := h.e.TakeEvents()
	h.applyAll(nil, evs)
	return DescribeEvents(evs)
}

func (h *scriptHarness) applyAll(d *datadriven.TestData, evs []Event) {
	for _, ev := range evs {
		// Events travel to viewers as JSON: apply them after a round trip.
		b, err := json.Marshal(ev)
		if err != nil {
			h.t.Fatalf("marshal %s: %v", KindOf(ev), err)
		}
		back, _ := NewEvent(KindOf(ev))
		if err := json.Unmarshal(b, back); err != nil {
			h.t.Fatalf("unmarshal %s: %v", KindOf(ev), err)
		}
		if err := h.view.Apply(Deref(back)); err != nil {
			h.t.Fatalf("View.Apply(%s): %v", ev, err)
		}
	}
}

// checkView compares the view with the engine's snapshot.
func (h *scriptHarness) checkView(d *datadriven.TestData) {
	if h.e == nil {
		return
	}
	if err := h.e.Check(); err != nil {
		h.t.Fatalf("%s: engine invariants: %v", d.Pos, err)
	}
	want := h.e.Snapshot()
	got := h.view.Snapshot()
	if !reflect.DeepEqual(got, want) {
		h.t.Fatalf("%s: the view differs from the engine's snapshot:\n%s", d.Pos, snapshotDiff(got, want))
	}
}

// snapshotDiff names the fields of two snapshots that differ, with their JSON.
func snapshotDiff(got, want Snapshot) string {
	var b strings.Builder
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		g, w := gv.Field(i).Interface(), wv.Field(i).Interface()
		if !reflect.DeepEqual(g, w) {
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			fmt.Fprintf(&b, "%s:\n view   %s\n engine %s\n", gv.Type().Field(i).Name, clip(gj), clip(wj))
		}
	}
	return b.String()
}

func clip(b []byte) string {
	if len(b) > 2000 {
		return string(b[:2000]) + "…"
	}
	return string(b)
}
