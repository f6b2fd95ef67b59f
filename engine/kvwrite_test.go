package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvtop/kvtop/engine/prepare"
)

// hazardsIn returns the hazards among events.
func hazardsIn(evs []Event) []Hazard {
	var out []Hazard
	for _, ev := range evs {
		if h, ok := ev.(HazardDetected); ok {
			out = append(out, h.Hazard)
		}
	}
	return out
}

// A write with the metadata of a request that is no longer prepared is refused, even when
// its slots are now reserved by another prepared request (a real decode instance would write
// them into that request's KV), and is flagged; the prepared request's own metadata still
// writes. The reproduction of issue 11: with no recycling, C is prepared, written and
// finished; D is prepared on C's old pages; C's metadata at offset 16 must not count for D.
func TestStaleKVWriteIsRefusedAndFlagged(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.MaxRecycling = 0 })
	if err := e.PrepRecv(t0, PrepRecv{ID: "C", Prompt: prompt(40, 1), End: -1, HasEnd: true, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	c := metadataOf(t, e.Step(t0), "C")
	if _, err := e.WriteKV(t0, KVWrite{Metadata: c.Encoded, Tokens: 39}); err != nil {
		t.Fatalf("WriteKV(C's metadata) = %v", err)
	}
	if err := e.StartGenerate(t0, "C", -1); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		e.Step(t0)
	}
	if rv, _ := e.Request("C"); rv.State != StateFinished {
		t.Fatalf("C is %s, want finished", rv.State)
	}
	if err := e.PrepRecv(t0, PrepRecv{ID: "D", Prompt: prompt(40, 2), End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	d := metadataOf(t, e.Step(t0), "D")
	if d.Encoded == c.Encoded {
		t.Fatalf("D's metadata is C's (%v): the stale write could not be told apart", d.Runs[0])
	}
	e.TakeEvents()
	_, err := e.WriteKV(t0, KVWrite{Metadata: c.Encoded, Offset: 16, Tokens: 1})
	if !errors.Is(err, ErrStaleKVWrite) {
		t.Fatalf("WriteKV(C's metadata at 16) = %v, want ErrStaleKVWrite", err)
	}
	if rv, _ := e.Request("D"); rv.Received != 0 {
		t.Errorf("after the stale write D has %d KV tokens, want 0", rv.Received)
	}
	hz := hazardsIn(e.TakeEvents())
	want := Hazard{Kind: HazardStaleKVWrite, ID: "C", Seq: c.Seq, Offset: 16, Tokens: 1, Holder: "D"}
	if len(hz) != 1 || hz[0] != want {
		t.Errorf("hazards of the stale write = %+v, want %+v", hz, want)
	}
	if got := e.Totals().Hazards[HazardStaleKVWrite]; got != 1 {
		t.Errorf("stale-kv-write hazards counted %d, want 1", got)
	}
	if res, err := e.WriteKV(t0, KVWrite{Metadata: d.Encoded, Offset: 16, Tokens: 1}); err != nil || !slices.Equal(res.Requests, []string{"D"}) {
		t.Errorf("WriteKV(D's metadata at 16) = %+v, %v, want it written for D", res, err)
	}
	if err := e.Check(); err != nil {
		t.Error(err)
	}
}

// Metadata that decodes but was never issued is stale too (no request named); metadata that
// does not decode is bad metadata and flags nothing; a range outside the request's slots is
// a bad write.
func TestWriteKVRefusals(t *testing.T) {
	e := newTestEngine(t, nil)
	if err := e.PrepRecv(t0, PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true}); err != nil {
		t.Fatal(err)
	}
	a := metadataOf(t, e.Step(t0), "A")
	e.TakeEvents()
	never := prepare.Encode([]int64{1, 4000, 8})
	if _, err := e.WriteKV(t0, KVWrite{Metadata: never, Tokens: 8}); !errors.Is(err, ErrStaleKVWrite) {
		t.Errorf("WriteKV(metadata never issued) = %v, want ErrStaleKVWrite", err)
	}
	if hz := hazardsIn(e.TakeEvents()); len(hz) != 1 || hz[0].ID != "" || hz[0].Holder != "" {
		t.Errorf("hazards of a write with unknown metadata = %+v, want one naming no request", hz)
	}
	if _, err := e.WriteKV(t0, KVWrite{Metadata: "not base64!", Tokens: 1}); !errors.Is(err, prepare.ErrBadMetadata) {
		t.Errorf("WriteKV(garbage) = %v, want ErrBadMetadata", err)
	}
	// A huge claimed run must not be written out to find its slot.
	huge := prepare.Encode([]int64{1, 0, 1 << 40})
	if _, err := e.WriteKV(t0, KVWrite{Metadata: huge, Offset: 1 << 39, Tokens: 1}); !errors.Is(err, ErrStaleKVWrite) {
		t.Errorf("WriteKV(a run of 2^40 slots) = %v, want ErrStaleKVWrite", err)
	}
	for _, w := range []KVWrite{{Offset: -1, Tokens: 1}, {Offset: 39, Tokens: 1}, {Offset: 0, Tokens: 0}, {Offset: 30, Tokens: 10}} {
		w.Metadata = a.Encoded
		if _, err := e.WriteKV(t0, w); !errors.Is(err, ErrBadKVWrite) {
			t.Errorf("WriteKV(A, offset %d, tokens %d) = %v, want ErrBadKVWrite", w.Offset, w.Tokens, err)
		}
	}
	if hz := hazardsIn(e.TakeEvents()); len(hz) != 1 {
		t.Errorf("%d more hazards, want only the huge run's", len(hz))
	}
	if rv, _ := e.Request("A"); rv.Received != 0 {
		t.Errorf("A received %d KV tokens from refused writes", rv.Received)
	}
}
