package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine/pages"
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

// kvReference is what a KV write does, worked out slot by slot from what the engine has
// said: the reservations its MetadataEmitted events announced and the writes that
// succeeded. It is the differential check of the engine's page-at-a-time writes.
type kvReference struct {
	pageSize int
	pool     int64
	runs     map[string][]pages.Run // the prepared requests' reservations
	matched  map[string]int
	got      map[int64]bool // slots written
	complete map[string]bool
}

// want returns what writing slots must answer: the error's text, or the requests in
// first-seen order, those complete after it, and each one's written slots as runs.
func (k *kvReference) want(slots []int64) (errText string, reqs, complete []string, runs map[string][]pages.Run) {
	bad := func(format string, args ...any) (string, []string, []string, map[string][]pages.Run) {
		return fmt.Sprintf(format, args...) + ": " + ErrBadKVWrite.Error(), nil, nil, nil
	}
	if len(slots) == 0 {
		return bad("kv write of no slots")
	}
	owner := map[int64]string{} // page -> the prepared request with KV to come on it
	index := map[int64]int{}    // slot -> its token index in its reservation
	for id, rs := range k.runs {
		if k.complete[id] {
			continue
		}
		i := 0
		for _, r := range rs {
			for s := r.Start; s < r.End(); s++ {
				owner[s/int64(k.pageSize)] = id
				index[s] = i
				i++
			}
		}
	}
	of := map[int64]string{}
	for id, rs := range k.runs {
		for _, r := range rs {
			for s := r.Start; s < r.End(); s++ {
				of[s] = id
			}
		}
	}
	for _, s := range slots {
		id, ok := owner[s/int64(k.pageSize)]
		switch {
		case s < 0 || s >= k.pool:
			return bad("kv write: slot %d is outside the pool [0, %d)", s, k.pool)
		case !ok:
			return bad("kv write: slot %d (page %d) is not reserved by a prepared request", s, s/int64(k.pageSize))
		case of[s] != id:
			return bad("kv write: slot %d is on a page of %s but not one of its reserved slots", s, id)
		case k.got[s]:
			return bad("kv write: slot %d of %s (token %d) was already written", s, id, k.matched[id]+index[s])
		}
	}
	seen := map[int64]bool{}
	for _, s := range slots {
		if seen[s] {
			return bad("kv write: slot %d appears twice", s)
		}
		seen[s] = true
	}
	mine := map[string][]int64{}
	for _, s := range slots {
		id := of[s]
		if mine[id] == nil {
			reqs = append(reqs, id)
		}
		mine[id] = append(mine[id], s)
		k.got[s] = true
	}
	runs = map[string][]pages.Run{}
	for _, id := range reqs {
		runs[id] = toRuns(mine[id])
		all := true
		for _, r := range k.runs[id] {
			for s := r.Start; s < r.End(); s++ {
				all = all && k.got[s]
			}
		}
		if all {
			k.complete[id] = true
			complete = append(complete, id)
		}
	}
	return "", reqs, complete, runs
}

// Random writes of slots, reserved and not, in order and not, written before and not, and
// written twice, are answered by the engine's page-at-a-time checks exactly as a
// slot-by-slot pass over them would answer them: the same first error, or the same requests,
// completions and events.
func TestReceiveKVAgreesWithSlotBySlot(t *testing.T) {
	e := newTestEngine(t, func(c *Config) { c.MaxNumSequence = 16; c.MaxTotalSequenceLength = 16384 })
	ps := int64(e.cfg.PageSize)
	ref := &kvReference{pageSize: int(ps), pool: int64(e.caches[0].NumPages()) * ps,
		runs: map[string][]pages.Run{}, matched: map[string]int{}, got: map[int64]bool{}, complete: map[string]bool{}}
	rng := rand.New(rand.NewPCG(1, 2))
	learn := func(evs []Event) {
		for _, ev := range evs {
			if m, ok := ev.(MetadataEmitted); ok {
				ref.runs[m.ID], ref.matched[m.ID] = m.Runs[0], m.Matched
				ref.complete[m.ID] = m.PromptLength-1 == m.Matched
				for _, s := range pages.Expand(nil, m.Runs[0]) {
					delete(ref.got, s) // a slot a finished request had
				}
			}
		}
	}
	next := 0
	// refill starts the requests whose KV is in, lets them finish, and sends new ones, with
	// prompts that share stems so that some reservations start mid-page after a fork.
	refill := func() {
		for id := range ref.runs {
			if ref.complete[id] {
				if err := e.StartGenerate(t0, id, -1); err != nil {
					t.Fatal(err)
				}
				delete(ref.runs, id)
			}
		}
		for range 4 {
			e.Step(t0)
		}
		for len(ref.runs) < 8 {
			p := prompt(20+rng.IntN(80), int32(next%3))
			p = append(p[:10+rng.IntN(10)], prompt(30, int32(100+next))...)
			if err := e.PrepRecv(t0, PrepRecv{ID: fmt.Sprint("r", next), Prompt: p, End: -1, HasEnd: true, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			next++
			learn(e.Step(t0).Events)
		}
		e.TakeEvents()
	}
	refill()
	seen := map[string]int{} // the answers the tries got, by kind
	defer func() {
		for _, kind := range []string{"outside the pool", "not reserved", "not one of its", "already written", "appears twice", "written", "several requests", "complete"} {
			if seen[kind] == 0 {
				t.Errorf("no try was answered %q: %v", kind, seen)
			}
		}
	}()
	for try := range 5000 {
		if try%50 == 0 {
			refill()
		}
		var ids []string
		for id := range ref.runs {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		var slots []int64
		for range 1 + rng.IntN(3) {
			all := pages.Expand(nil, ref.runs[ids[rng.IntN(len(ids))]])
			if rng.IntN(3) > 0 { // mostly what has not arrived yet
				all = slices.DeleteFunc(all, func(s int64) bool { return ref.got[s] })
			}
			if len(all) == 0 {
				continue
			}
			from := rng.IntN(len(all))
			piece := slices.Clone(all[from:min(len(all), from+1+rng.IntN(24))])
			if rng.IntN(4) == 0 {
				rng.Shuffle(len(piece), func(i, j int) { piece[i], piece[j] = piece[j], piece[i] })
			}
			slots = append(slots, piece...)
		}
		if len(slots) > 0 {
			switch rng.IntN(12) {
			case 0: // a slot beyond either end of the pool
				slots = append(slots, []int64{-1 - rng.Int64N(3), ref.pool + rng.Int64N(3)}[rng.IntN(2)])
			case 1: // a slot twice
				slots = append(slots, slots[rng.IntN(len(slots))])
			case 2: // any slot on the page of one of them
				slots = append(slots, slots[rng.IntN(len(slots))]/ps*ps+rng.Int64N(ps))
			case 3: // anywhere
				slots = append(slots, rng.Int64N(ref.pool))
			}
		}
		wantErr, wantReqs, wantDone, wantRuns := ref.want(slots)
		res, err := e.ReceiveKV(t0, slots, nil)
		evs := e.TakeEvents()
		if wantErr != "" {
			if err == nil || err.Error() != wantErr {
				t.Fatalf("try %d: ReceiveKV(%v) = %v, want %q", try, slots, err, wantErr)
			}
			for _, kind := range []string{"outside the pool", "not reserved", "not one of its", "already written", "appears twice"} {
				if strings.Contains(wantErr, kind) {
					seen[kind]++
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("try %d: ReceiveKV(%v) = %v, want success", try, slots, err)
		}
		if !slices.Equal(res.Requests, wantReqs) || !slices.Equal(res.Complete, wantDone) {
			t.Fatalf("try %d: ReceiveKV(%v) = %+v, want requests %v complete %v", try, slots, res, wantReqs, wantDone)
		}
		var got []string
		for _, ev := range evs {
			if kv, ok := ev.(KVReceived); ok {
				got = append(got, kv.ID)
				if !slices.Equal(kv.Runs, wantRuns[kv.ID]) {
					t.Fatalf("try %d: %s's event has runs %v, want %v", try, kv.ID, kv.Runs, wantRuns[kv.ID])
				}
			}
		}
		if !slices.Equal(got, wantReqs) {
			t.Fatalf("try %d: events for %v, want %v", try, got, wantReqs)
		}
		seen["written"]++
		if len(wantReqs) > 1 {
			seen["several requests"]++
		}
		if len(wantDone) > 0 {
			seen["complete"]++
		}
		if err := e.Check(); err != nil {
			t.Fatalf("try %d: %v", try, err)
		}
	}
	t.Logf("answers: %v", seen)
}

// A request's whole KV window written at once, by its metadata or by its runs, allocates
// nothing but the event that says so: no list of slots, no map of them.
func TestWholeWindowWriteAllocatesOnlyItsEvent(t *testing.T) {
	for _, by := range []string{"metadata", "runs"} {
		t.Run(by, func(t *testing.T) {
			e := newTestEngine(t, func(c *Config) {
				c.MaxNumSequence = 64
				c.MaxTotalSequenceLength = 1 << 20
				c.MaxSingleSequenceLength = 1 << 15
			})
			var ms []MetadataEmitted
			for i := range 50 {
				if err := e.PrepRecv(t0, PrepRecv{ID: fmt.Sprint("r", i), Prompt: prompt(12_000, int32(i)), End: -1, HasEnd: true}); err != nil {
					t.Fatal(err)
				}
				ms = append(ms, metadataOf(t, e.Step(t0), fmt.Sprint("r", i)))
			}
			e.TakeEvents()
			e.out = make([]Event, 0, 64) // room for the events, as a step's list has
			i := 0
			allocs := testing.AllocsPerRun(len(ms)-1, func() {
				m := ms[i]
				i++
				var err error
				if by == "metadata" {
					_, err = e.WriteKV(t0, KVWrite{Metadata: m.Encoded, Tokens: 11_999})
				} else {
					_, err = e.ReceiveRuns(t0, m.Runs[0], nil)
				}
				if err != nil {
					t.Fatal(err)
				}
			})
			if allocs > 1 {
				t.Errorf("a whole-window write of 11,999 tokens allocates %v times, want 1 (its event)", allocs)
			}
		})
	}
}
