package protocol_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	got = append(bytes.TrimRight(got, "\n"), '\n')
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n got %s\nwant %s", name, got, want)
	}
}

var at = engine.Stamp{Step: 7, At: 1_700_000_000_123}

// sampleEvents returns one event of every kind with every field set, so that a round trip
// exercises all of them (a test checks that none is left zero).
func sampleEvents() []engine.Event {
	eval := prepare.Evaluation{Request: "r-9", Reason: prepare.ReasonWatermark, Behind: "r-8", PromptLength: 40, End: 39,
		Running: 3, FreePages: 388, TotalPages: 513, Required: 3, Watermark: 400, MaxNumSequence: 32, PrefillChunkSize: 1024,
		SpecFactor: 1, TotalSequenceLength: 4000, MaxTotalSequenceLength: 8192, Evicted: 1, Recycling: 2, Evictable: 6}
	return []engine.Event{
		engine.RequestArrived{Stamp: at, ID: "r-1", PromptLength: 40, End: 39, MaxTokens: 16},
		engine.PrepareBlocked{Stamp: at, ID: "r-9", Eval: eval},
		engine.PrepareAdmitted{Stamp: at, ID: "r-1", Seq: 4, End: 39, Matched: 16, PagesTaken: 2, Evicted: 1},
		engine.PrefixMatched{Stamp: at, ID: "r-1", Seq: 4, Match: prefix.Fork, Matched: 16, Parent: 2, Pop: 3, Path: []prefix.NodeID{0, 5, 9}, Candidates: 2},
		engine.SeqAdded{Stamp: at, Seq: 4, ID: "r-1"},
		engine.SeqForked{Stamp: at, Parent: 2, Child: 4, Pos: 20, CopiedPage: 3, ID: "r-1"},
		engine.SeqPopped{Stamp: at, Seq: 4, N: 3},
		engine.PagesReserved{Stamp: at, Seq: 4, ID: "r-1", N: 23, NewPages: []int32{3, 4}},
		engine.SeqRemoved{Stamp: at, Seq: 4, Freed: 3},
		engine.SeqRecycled{Stamp: at, Seq: 4, ID: "r-1"},
		engine.SeqEvicted{Stamp: at, Seq: 4, ID: "r-0", Freed: 3, Recycled: 9, Oldest: 2, OldestRecycled: 5},
		engine.MetadataEmitted{Stamp: at, ID: "r-1", Seq: 4, PromptLength: 40, Matched: 16,
			Runs: [][]pages.Run{{{Start: 48, Len: 23}}, {{Start: 48, Len: 23}}}, Encoded: "CQAAAAAAAABbMSw0OCwyM10="},
		engine.KVReceived{Stamp: at, ID: "r-1", Runs: []pages.Run{{Start: 48, Len: 10}, {Start: 64, Len: 2}}, Received: 12, Reserved: 23},
		engine.RequestStarted{Stamp: at, ID: "r-1", Begin: 39, Tail: 1, Committed: true, MaxTokens: 17},
		engine.Prefilled{Stamp: at, ID: "r-1", Tokens: 40, Remaining: 2},
		engine.Decoded{Stamp: at, IDs: []string{"r-1", "r-2"}},
		engine.RequestFinished{Stamp: at, ID: "r-1", Generated: 17, Reason: "length"},
		engine.RequestAborted{Stamp: at, ID: "r-1", Reason: engine.AbortByClient, Leaked: true, LeakedPages: 3},
		engine.RequestRetired{Stamp: at, ID: "r-1"},
		engine.PrefixChanged{Stamp: at,
			Upserts: []prefix.Node{{ID: 5, Parent: 0, Order: 1, Depth: 16, Span: 16, Seqs: []prefix.SeqRef{{ID: 2, State: prefix.Recycling}}, Hits: 3}},
			Removed: []prefix.NodeID{7}, Stats: prefix.Stats{QueryTokens: 77, HitTokens: 16, Inserts: 2, Forks: 1, Reuses: 1, Evictions: 1},
			Recycling: []int64{2, 0}, Counterfactual: &engine.Counterfactual{Order: prefix.EvictLRU, Stats: prefix.Stats{QueryTokens: 77, HitTokens: 30, Inserts: 2, Forks: 1}}},
		engine.HazardDetected{Stamp: at, Hazard: engine.Hazard{Kind: engine.HazardForkUnreceived, ID: "r-1", Seq: 4, Parent: "r-0",
			ParentSeq: 2, Pos: 20, Unreceived: 4}},
		engine.StepCompleted{Stamp: at, Action: engine.ActionDecode, Admitted: 1, Prefilled: 2, Decoded: 3, Preempted: 1,
			Counts: engine.Counts{Waiting: 1, Blocked: 1, Prepared: 2, AwaitingKV: 1, Running: 3, Prefilling: 1, FreePages: 388, TotalSeqLen: 4000, Recycling: 2}},
		engine.Divergence{Stamp: at, ID: "r-1", What: engine.DivergedMetadata, Cause: "D reserved other pages", ShadowMatched: 16, DMatched: 16,
			ShadowMetadata: "CAAAAAAAAABbMSwwLDM5XQ==", DMetadata: "CAAAAAAAAABbMSw0OCwzOV0=", Swaps: []engine.PageSwap{{A: 0, B: 3}}, Unknown: []int32{7, 8}, Explained: []int32{3}, Reset: true},
	}
}

// Every event kind has a sample with every field set; each round-trips through its JSON,
// alone and in a frame, and matches its golden file.
func TestEventsRoundTrip(t *testing.T) {
	samples := sampleEvents()
	var kinds []string
	for _, ev := range samples {
		kinds = append(kinds, engine.KindOf(ev))
		v := reflect.ValueOf(ev)
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				t.Errorf("sample %s leaves %s zero; set it so the round trip covers it", engine.KindOf(ev), v.Type().Field(i).Name)
			}
		}
		b, err := protocol.EncodeEvent(ev)
		if err != nil {
			t.Fatalf("EncodeEvent(%s): %v", engine.KindOf(ev), err)
		}
		golden(t, filepath.Join("events", engine.KindOf(ev)+".json"), b)
		got, err := protocol.DecodeEvent(b)
		if err != nil {
			t.Fatalf("DecodeEvent(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Errorf("DecodeEvent(EncodeEvent(%#v)) = %#v", ev, got)
		}
	}
	if want := engine.EventKinds(); !slices.Equal(kinds, want) {
		t.Fatalf("sample kinds = %v, want every kind the engine has, in order: %v", kinds, want)
	}
	var buf bytes.Buffer
	if err := protocol.EncodeFrame(&buf, &protocol.Frame{Type: protocol.FrameEvents, Seq: 2, Events: samples}); err != nil {
		t.Fatal(err)
	}
	f, err := protocol.DecodeFrame(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Seq != 2 || !reflect.DeepEqual(f.Events, samples) {
		t.Errorf("an events frame of every kind does not round-trip")
	}
	// A reader accepts an event whose kind is not first.
	ev, err := protocol.DecodeEvent([]byte(`{"step":7,"at":1,"kind":"seq_popped","seq":4,"n":3}`))
	if want := (engine.SeqPopped{Stamp: engine.Stamp{Step: 7, At: 1}, Seq: 4, N: 3}); err != nil || ev != want {
		t.Errorf("DecodeEvent with kind last = %v, %v; want %v", ev, err, want)
	}
	for _, bad := range []string{`{"kind":"nope"}`, `{"kind":"seq_popped","n":"x"}`, `[1]`, `{"kind":"seq\"x"}`} {
		if _, err := protocol.DecodeEvent([]byte(bad)); err == nil {
			t.Errorf("DecodeEvent(%s) = nil error, want one", bad)
		}
	}
}

// testConfig is the engine configuration of the golden frames.
func testConfig() engine.Config {
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength, cfg.MaxSingleSequenceLength, cfg.MaxNumSequence = 8192, 8192, 64
	return cfg
}

// goldenEngine is an engine driven at fixed times, so its snapshot is the same every run.
func goldenEngine(t *testing.T) *engine.Engine {
	t.Helper()
	e, err := engine.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	a, b := make([]int32, 40), make([]int32, 40)
	for i := range 40 {
		a[i], b[i] = 1000+int32(i), 2000+int32(i)
	}
	copy(b, a[:20]) // b shares a's first 20 tokens
	for _, pr := range []engine.PrepRecv{{ID: "A", Prompt: a, End: -1, HasEnd: true, MaxTokens: 4}, {ID: "B", Prompt: b, End: -1, HasEnd: true}} {
		if err := e.PrepRecv(now, pr); err != nil {
			t.Fatal(err)
		}
		e.Step(now)
		now = now.Add(time.Millisecond)
	}
	return e
}

// Every frame type matches its golden JSON and decodes back to itself.
func TestFramesGolden(t *testing.T) {
	e := goldenEngine(t)
	snap := e.Snapshot()
	st := feed.Status{Paused: true, Rate: 49.5, Target: 50, Controllable: false}
	for _, f := range []*protocol.Frame{
		{Type: protocol.FrameHello, Hello: &protocol.Hello{Protocol: protocol.Version, Server: "kvtop 0.1.0", Config: testConfig(), PingIntervalMs: 20000, MaxMessageBytes: 4096, Events: "json"}},
		{Type: protocol.FrameSnapshot, Seq: 1, Snapshot: &snap},
		{Type: protocol.FrameEvents, Seq: 2, Events: sampleEvents()[:3]},
		{Type: protocol.FrameDropped, Dropped: &protocol.Dropped{Count: 1200, Total: 5000}},
		{Type: protocol.FrameStatus, Status: &st},
		{Type: protocol.FrameError, Error: &protocol.ErrorBody{Message: "stream: pause: this server is read-only", Type: "read_only"}},
	} {
		var buf bytes.Buffer
		if err := protocol.EncodeFrame(&buf, f); err != nil {
			t.Fatal(err)
		}
		golden(t, filepath.Join("frames", f.Type+".json"), buf.Bytes())
		got, err := protocol.DecodeFrame(buf.Bytes())
		if err != nil {
			t.Fatalf("DecodeFrame(%s): %v", f.Type, err)
		}
		if f.Type == protocol.FrameSnapshot {
			// A snapshot decodes to the same state: compare as JSON, where nil and empty
			// lists are alike.
			if g, w := mustJSON(t, got.Snapshot), mustJSON(t, &snap); !bytes.Equal(g, w) {
				t.Errorf("DecodeFrame(EncodeFrame(snapshot frame)) = a snapshot whose JSON differs:\n got %s\nwant %s", g, w)
			}
			continue
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("DecodeFrame(EncodeFrame(%s frame)) = %+v, want %+v", f.Type, got, f)
		}
	}
	for _, bad := range []string{`{"type":"hello"}`, `{"type":"party"}`, `{"type":"events","events":[{"kind":"nope"}]}`, `nope`} {
		if _, err := protocol.DecodeFrame([]byte(bad)); err == nil {
			t.Errorf("DecodeFrame(%s) = nil error, want one", bad)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A shared snapshot writes the same bytes, for any seq, as the frame encoded on its own.
func TestSharedSnapshotIsTheFrame(t *testing.T) {
	snap := goldenEngine(t).Snapshot()
	shared, err := protocol.EncodeSnapshot(&snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{0, 1, 7, 1 << 40} {
		var want, got bytes.Buffer
		if err := protocol.EncodeFrame(&want, &protocol.Frame{Type: protocol.FrameSnapshot, Seq: seq, Snapshot: &snap}); err != nil {
			t.Fatal(err)
		}
		if err := shared.WriteFrame(&got, seq); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("WriteFrame(seq %d) differs from EncodeFrame:\n got %.200s\nwant %.200s", seq, got.Bytes(), want.Bytes())
		}
	}
}
