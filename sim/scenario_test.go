package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prepare"
)

var update = flag.Bool("update", false, "rewrite testdata/digests.golden")

// run plays a scenario in lockstep for the given simulated time, 20 steps a second as the
// demo does, and returns the engine, the driver and a digest of every step's output.
func run(t *testing.T, name string, seed uint64, d time.Duration) (*engine.Engine, *Driver, string) {
	t.Helper()
	sc, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.DefaultConfig()
	cfg.Seed = seed
	sc.Configure(&cfg)
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := sc.New(Options{Seed: seed, TracePath: filepath.Join("testdata", "small_trace.jsonl"), Speed: 1})
	if err != nil {
		t.Fatal(err)
	}
	drv := NewDriver(w, sc.Driver)
	h := sha256.New()
	ls := &Lockstep{E: e, D: drv, StepTime: 50 * time.Millisecond, OnReady: func(rd engine.Ready) {
		h.Write([]byte(engine.DescribeReady(rd)))
	}}
	ls.Run(int(d / ls.StepTime))
	if drv.Stats().CallErrors > 0 && name != "preempt" {
		t.Logf("%s: %d call errors, last: %v", name, drv.Stats().CallErrors, drv.LastError())
	}
	return e, drv, hex.EncodeToString(h.Sum(nil))[:16]
}

func TestChatFlowsWithForksAndReuse(t *testing.T) {
	e, d, _ := run(t, "chat", 1, 3*time.Minute)
	tot := e.Totals()
	ps := e.Prefix().Stats()
	if tot.Finished < 100 || ps.Forks < 20 || ps.Reuses < 10 || tot.Recycled < 50 || tot.Evicted < 1 {
		t.Errorf("chat for 3 minutes: %d finished, %d forks, %d reuses, %d recycled, %d evicted; want traffic showing all of them",
			tot.Finished, ps.Forks, ps.Reuses, tot.Recycled, tot.Evicted)
	}
	if ps.HitTokens*2 < ps.QueryTokens {
		t.Errorf("chat: prefix hit %d of %d tokens, want over half (shared system prompts and follow-up turns)", ps.HitTokens, ps.QueryTokens)
	}
	if s := d.Stats(); s.Refused > 0 || s.CallErrors > 0 {
		t.Errorf("chat: %d refused, %d call errors (last %v)", s.Refused, s.CallErrors, d.LastError())
	}
	// Nothing stays stuck: the queue keeps moving.
	snap := e.Snapshot()
	for _, r := range snap.Requests {
		if r.State == engine.StateWaiting && snap.Stamp.At-r.Arrived.At > 20_000 {
			t.Errorf("chat: %s has waited %dms", r.ID, snap.Stamp.At-r.Arrived.At)
		}
	}
}

func TestWatermarkScenarioPilesUpBehindTheWatermark(t *testing.T) {
	e, _, _ := run(t, "watermark", 1, time.Minute)
	snap := e.Snapshot()
	v, err := engine.NewView(snap)
	if err != nil {
		t.Fatal(err)
	}
	head := v.Head()
	if head == nil || head.Eval == nil || head.Eval.Reason != prepare.ReasonWatermark {
		t.Fatalf("watermark: head %+v, want blocked by the watermark", head)
	}
	if c := snap.Last.Counts; c.Blocked < 10 {
		t.Errorf("watermark: %d blocked, want a pile-up", c.Blocked)
	}
	if e.Totals().Finished < 5 {
		t.Errorf("watermark: %d finished, want the few admitted ones to finish", e.Totals().Finished)
	}
}

func TestRecycleStallStopsAdmissionForGood(t *testing.T) {
	e, _, _ := run(t, "recycle-stall", 1, 2*time.Minute)
	admitted := e.Totals().Admitted
	snap := e.Snapshot()
	v, _ := engine.NewView(snap)
	head := v.Head()
	if head == nil || head.Eval == nil || head.Eval.Reason != prepare.ReasonWatermark {
		t.Fatalf("recycle-stall: head %+v, want blocked by the watermark", head)
	}
	ev := *head.Eval
	if ev.Recycling == 0 || ev.Evictable < ev.Required || !strings.Contains(ev.String(), "does not trigger eviction") {
		t.Errorf("recycle-stall: %q; want recycling sequences whose pages would make room", ev.String())
	}
	if snap.Last.Counts.Running != 0 {
		t.Errorf("recycle-stall: %d running; the stall is for good only when nothing runs", snap.Last.Counts.Running)
	}
	// For good: another minute admits nothing.
	ls := &Lockstep{E: e, D: NewDriver(NewStream(StreamParams{Every: time.Second, Prompt: [2]int{400, 800}, MaxTokens: [2]int{8, 8}, Prefix: "late"}, 9), DriverConfig{}), StepTime: 50 * time.Millisecond, Start: time.UnixMilli(snap.Stamp.At)}
	ls.Run(1200)
	if got := e.Totals().Admitted; got != admitted {
		t.Errorf("recycle-stall: %d more admitted after the stall, want none", got-admitted)
	}
}

func TestLeakScenarioFlagsLeaks(t *testing.T) {
	e, d, _ := run(t, "leak", 1, 2*time.Minute)
	h := e.Totals().Hazards
	if h[engine.HazardPreparedAge] == 0 || h[engine.HazardAbortLeak] == 0 || d.Stats().Lost == 0 {
		t.Errorf("leak: prepared-age %d, abort-leak %d hazards, %d lost; want both hazards", h[engine.HazardPreparedAge], h[engine.HazardAbortLeak], d.Stats().Lost)
	}
}

func TestForkRaceFlagsForksFromUnreceivedKV(t *testing.T) {
	e, _, _ := run(t, "fork-race", 1, time.Minute)
	if n := e.Totals().Hazards[engine.HazardForkUnreceived]; n < 5 {
		t.Errorf("fork-race: %d fork-unreceived hazards, want several", n)
	}
}

func TestPreemptScenarioPreemptsAndRetries(t *testing.T) {
	e, d, _ := run(t, "preempt", 1, 2*time.Minute)
	if e.Totals().Preempted == 0 || d.Stats().Retried == 0 {
		t.Errorf("preempt: %d preempted, %d retried; want both", e.Totals().Preempted, d.Stats().Retried)
	}
	if e.Totals().Finished == 0 {
		t.Errorf("preempt: nothing finished")
	}
}

func TestTraceScenarioReplaysTheExcerpt(t *testing.T) {
	e, d, _ := run(t, "trace", 1, 2*time.Minute)
	f, _ := os.Open(filepath.Join("testdata", "small_trace.jsonl"))
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if d.Stats().Sent != len(recs) {
		t.Errorf("trace: sent %d, the excerpt has %d", d.Stats().Sent, len(recs))
	}
	ps := e.Prefix().Stats()
	hit := float64(ps.HitTokens) / float64(ps.QueryTokens)
	if bound := ReuseBound(recs); hit <= 0 || hit > bound+0.02 {
		t.Errorf("trace: hit ratio %.3f, want in (0, the reuse bound %.3f]", hit, bound)
	}
}

// Each scenario is deterministic for its seed: the same event stream, byte for byte (its
// digest is golden), and another seed gives another stream.
func TestScenariosAreDeterministic(t *testing.T) {
	var lines []string
	for _, sc := range Scenarios() {
		_, _, a := run(t, sc.Name, 1, 20*time.Second)
		_, _, b := run(t, sc.Name, 1, 20*time.Second)
		_, _, c := run(t, sc.Name, 2, 20*time.Second)
		if a != b {
			t.Errorf("%s: two runs with seed 1 differ", sc.Name)
		}
		if a == c && sc.Name != "trace" {
			t.Errorf("%s: seeds 1 and 2 give the same stream", sc.Name)
		}
		lines = append(lines, fmt.Sprintf("%s %s", sc.Name, a))
	}
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "digests.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("scenario digests changed (a deliberate change? run with -update):\n got %s\nwant %s", got, want)
	}
}

func TestReadTraceRefusesBadLines(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"not json", "{"},
		{"no blocks", `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[]}`},
		{"too long for its blocks", `{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1]}`},
		{"too short for its blocks", `{"timestamp":0,"input_length":100,"output_length":1,"hash_ids":[1,2]}`},
		{"no output", `{"timestamp":0,"input_length":100,"output_length":0,"hash_ids":[1]}`},
		{"negative hash", `{"timestamp":0,"input_length":100,"output_length":1,"hash_ids":[-1]}`},
		{"time goes back", `{"timestamp":5,"input_length":100,"output_length":1,"hash_ids":[1]}` + "\n" + `{"timestamp":4,"input_length":100,"output_length":1,"hash_ids":[1]}`},
	} {
		if _, err := ReadTrace(strings.NewReader(tc.in)); err == nil {
			t.Errorf("ReadTrace(%s) = nil error", tc.name)
		}
	}
}

func TestTraceTokensShareExactlyTheirBlocks(t *testing.T) {
	a := TraceRecord{InputLength: 1100, OutputLength: 1, HashIDs: []int64{7, 8, 9}}.Tokens()
	b := TraceRecord{InputLength: 600, OutputLength: 1, HashIDs: []int64{7, 5}}.Tokens()
	n := 0
	for n < len(b) && a[n] == b[n] {
		n++
	}
	if n != TraceBlock {
		t.Errorf("records sharing block 7 only share %d tokens, want %d", n, TraceBlock)
	}
}
