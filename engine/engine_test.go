package engine

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
)

var t0 = time.UnixMilli(1_000_000)

func newTestEngine(t *testing.T, mut func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MaxTotalSequenceLength = 8192
	cfg.MaxNumSequence = 4
	if mut != nil {
		mut(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func prompt(n int, salt int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = salt*1000 + int32(i)
	}
	return p
}

// metadataOf finds the answer to a prep_recv in a step's events.
func metadataOf(t *testing.T, rd Ready, id string) MetadataEmitted {
	t.Helper()
	for _, ev := range rd.Events {
		if m, ok := ev.(MetadataEmitted); ok && m.ID == id {
			return m
		}
	}
	t.Fatalf("no metadata for %s in step %d:\n%s", id, rd.Step, DescribeReady(rd))
	return MetadataEmitted{}
}

// The KV a prefill instance writes lands in the arena in the GPU layout, and a mid-page fork
// copies it: the child reads the parent's bytes for the shared slots of the copied page.
func TestKVPayloadLandsAndForkCopiesIt(t *testing.T) {
	g := pages.Geometry{Layers: 2, KVHeads: 2, HeadDim: 4}
	e := newTestEngine(t, func(c *Config) { c.Arena = g; c.Models = 2 })
	tb := g.TokenBytes()
	if err := e.PrepRecv(t0, PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	a := metadataOf(t, e.Step(t0), "A")
	slots := pages.Expand(nil, a.Runs[0])
	payload := make([]byte, len(slots)*tb*2)
	for i := range payload {
		payload[i] = byte(i*7 + 3)
	}
	if _, err := e.ReceiveKV(t0, slots, payload[:len(payload)-1]); !errors.Is(err, ErrBadKVWrite) {
		t.Fatalf("ReceiveKV with a short payload = %v, want ErrBadKVWrite", err)
	}
	res, err := e.ReceiveKV(t0, slots, payload)
	if err != nil || !slices.Equal(res.Complete, []string{"A"}) {
		t.Fatalf("ReceiveKV = %+v, %v, want A complete", res, err)
	}
	for m := range 2 {
		for i, s := range slots {
			off := (i*2 + m) * tb
			if got := e.stores[m].ReadSlot(s, nil); !slices.Equal(got, payload[off:off+tb]) {
				t.Fatalf("model %d slot %d = %v, want %v", m, s, got, payload[off:off+tb])
			}
		}
	}
	// B shares 20 tokens: page 1's first 4 slots are copied into a fresh page.
	bp := append(prompt(20, 1), prompt(20, 2)...)
	if err := e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: bp, End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	b := metadataOf(t, e.Step(t0), "B")
	if b.Matched != 20 || b.Runs[0][0].Start != 52 {
		t.Fatalf("B matched %d at %v, want 20 at slot 52", b.Matched, b.Runs[0])
	}
	for pos := 16; pos < 20; pos++ {
		src := slots[pos]
		dst := 3*16 + int64(pos-16)
		for m := range 2 {
			if got, want := e.stores[m].ReadSlot(dst, nil), e.stores[m].ReadSlot(src, nil); !slices.Equal(got, want) {
				t.Errorf("model %d: copied slot %d = %v, want slot %d's %v", m, dst, got, src, want)
			}
		}
	}
}

// A call that fails changes nothing: no event, the same snapshot.
func TestBadCallsChangeNothing(t *testing.T) {
	e := newTestEngine(t, nil)
	if err := e.PrepRecv(t0, PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	e.Step(t0)
	before := e.Snapshot()
	for name, err := range map[string]error{
		"duplicate":      e.PrepRecv(t0, PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true}),
		"empty id":       e.PrepRecv(t0, PrepRecv{Prompt: prompt(4, 1), End: -1, HasEnd: true}),
		"empty prompt":   e.PrepRecv(t0, PrepRecv{ID: "B", End: -1, HasEnd: true}),
		"too long":       e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: prompt(9000, 1), End: -1, HasEnd: true}),
		"negative token": e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: []int32{1, -1}, End: -1, HasEnd: true}),
		"bad window":     e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: prompt(4, 1), End: 4, HasEnd: true}),
		"n 2":            e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: prompt(4, 1), End: -1, HasEnd: true, N: 2}),
		"max_tokens":     e.PrepRecv(t0, PrepRecv{ID: "B", Prompt: prompt(4, 1), End: -1, HasEnd: true, MaxTokens: -1}),
		"start unknown":  e.StartGenerate(t0, "Z", 0),
		"begin too far":  e.StartGenerate(t0, "A", 40),
		"begin negative": e.StartGenerate(t0, "A", -41),
		"abort unknown":  e.Abort(t0, "Z"),
		"kv none":        func() error { _, err := e.ReceiveKV(t0, nil, nil); return err }(),
		"kv unreserved":  func() error { _, err := e.ReceiveKV(t0, []int64{4000}, nil); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if evs := e.TakeEvents(); len(evs) != 0 {
		t.Errorf("failed calls emitted %v", evs)
	}
	if after := e.Snapshot(); snapshotDiff(after, before) != "" {
		t.Errorf("failed calls changed the state:\n%s", snapshotDiff(after, before))
	}
}

// Same inputs, same events, byte for byte.
func TestDeterministic(t *testing.T) {
	run := func() string {
		e := newTestEngine(t, func(c *Config) { c.MaxNumSequence = 16 })
		var b strings.Builder
		now := t0
		for i := range 60 {
			now = now.Add(50 * time.Millisecond)
			if i%3 == 0 {
				id := string(rune('a'+i%26)) + string(rune('0'+i/26))
				p := append(prompt(20, 1), prompt(10+i%20, int32(i))...)
				_ = e.PrepRecv(now, PrepRecv{ID: id, Prompt: p, End: -1, HasEnd: true, MaxTokens: 1 + i%7})
			}
			rd := e.Step(now)
			for _, ev := range rd.Events {
				if m, ok := ev.(MetadataEmitted); ok {
					_, _ = e.ReceiveKV(now, pages.Expand(nil, m.Runs[0]), nil)
					_ = e.StartGenerate(now, m.ID, -1)
				}
			}
			b.WriteString(DescribeReady(rd))
			b.WriteString(DescribeEvents(e.TakeEvents()))
		}
		return b.String()
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("two runs with the same inputs differ")
	}
	if !strings.Contains(a, "finished") || !strings.Contains(a, "fork") {
		t.Fatalf("the run did not exercise forks and finishes:\n%s", a)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"page size":     func(c *Config) { c.PageSize = 0 },
		"batch":         func(c *Config) { c.MaxNumSequence = 0 },
		"capacity":      func(c *Config) { c.MaxTotalSequenceLength = 8 },
		"chunk":         func(c *Config) { c.PrefillChunkSize = 0 },
		"prefix mode":   func(c *Config) { c.PrefixCache = "lru" },
		"recycling":     func(c *Config) { c.MaxRecycling = -3 },
		"watermark":     func(c *Config) { c.Watermark = -1 },
		"models":        func(c *Config) { c.Models = 0 },
		"arena limit":   func(c *Config) { c.Arena = pages.Geometry{Layers: 80, KVHeads: 8, HeadDim: 128} },
		"age":           func(c *Config) { c.PreparedAgeLimit = -time.Second },
		"keep":          func(c *Config) { c.KeepFinished = -1 },
		"huge capacity": func(c *Config) { c.MaxTotalSequenceLength = 1 << 31 },
		// Sizes that wrap around in int64 arithmetic must not pass for small ones.
		"capacity overflow":    func(c *Config) { c.MaxTotalSequenceLength = math.MaxInt },
		"token bytes overflow": func(c *Config) { c.Arena = pages.Geometry{Layers: 32, KVHeads: 1, HeadDim: 144115188075855873} },
		"arena bytes overflow": func(c *Config) { c.Arena = pages.Geometry{Layers: 1000000, KVHeads: 1000000, HeadDim: 1000000} },
		"arena wraps to zero":  func(c *Config) { c.Arena = pages.Geometry{Layers: 4294967296, KVHeads: 4294967296, HeadDim: 2} },
		"arena beyond memory": func(c *Config) {
			c.Arena = pages.Geometry{Layers: 1 << 20, KVHeads: 1 << 10, HeadDim: 1 << 10}
			c.ArenaLimit = math.MaxInt64
		},
	} {
		cfg := DefaultConfig()
		mut(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: New = %v, want ErrBadConfig", name, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
}
