package pages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the deliberately simple reference the cache is checked against: a sequence is
// just the list of values its tokens' KV holds. The cache is right when, for every sequence
// and position, the slot the cache maps that position to holds the value the model says; when
// no slot is reserved by two sequences unless they share that prefix; and when the free pages
// are exactly the pages no sequence uses.
type model struct {
	seqs map[int64][]uint64
	next uint64 // the next fresh KV value
}

// harness runs the same operations on a Cache (over a tiny arena that stores one uint64 a
// token) and on the model.
type harness struct {
	t     testing.TB
	c     *Cache
	arena *Arena
	m     model
}

func newHarness(t testing.TB, pageSize, numPages int) *harness {
	a, err := NewArena(Geometry{Layers: 1, KVHeads: 1, HeadDim: 2}, numPages, pageSize, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{PageSize: pageSize, NumPages: numPages, Store: a})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, c: c, arena: a, m: model{seqs: map[int64][]uint64{}, next: 1}}
}

func (h *harness) ids() []int64 {
	return slices.Sorted(func(yield func(int64) bool) {
		for id := range h.m.seqs {
			if !yield(id) {
				return
			}
		}
	})
}

// op applies one operation chosen by (kind, a, b) to both sides and reports what it did.
func (h *harness) op(kind, a, b int) string {
	ids := h.ids()
	pick := func() (int64, bool) {
		if len(ids) == 0 {
			return 0, false
		}
		return ids[a%len(ids)], true
	}
	free := func() int64 {
		for id := int64(0); ; id++ {
			if _, ok := h.m.seqs[id]; !ok {
				return id
			}
		}
	}
	switch kind % 5 {
	case 0:
		id := free()
		if err := h.c.AddSequence(id); err != nil {
			h.t.Fatalf("AddSequence(%d) = %v", id, err)
		}
		h.m.seqs[id] = nil
		return fmt.Sprintf("add %d", id)
	case 1:
		id, ok := pick()
		if !ok {
			return "reserve: none"
		}
		n := 1 + b%40
		slots, err := h.c.ReserveAppend(id, n, nil)
		if errors.Is(err, ErrOutOfPages) {
			return fmt.Sprintf("reserve %d in %d: out of pages", n, id)
		}
		if err != nil {
			h.t.Fatalf("ReserveAppend(%d, %d) = %v", id, n, err)
		}
		if len(slots) != n {
			h.t.Fatalf("ReserveAppend(%d, %d) returned %d slots", id, n, len(slots))
		}
		runs := Compress(nil, slots)
		sum := int64(0)
		for i := 1; i < len(runs); i += 2 {
			sum += runs[i+1]
		}
		if sum != int64(n) || len(runs) != 2*int(runs[0])+1 {
			h.t.Fatalf("Compress of %d slots = %v: runs do not sum to %d", n, runs, n)
		}
		var buf [8]byte
		for _, s := range slots {
			binary.LittleEndian.PutUint64(buf[:], h.m.next)
			h.arena.WriteSlot(s, buf[:])
			h.m.seqs[id] = append(h.m.seqs[id], h.m.next)
			h.m.next++
		}
		return fmt.Sprintf("reserve %d in %d", n, id)
	case 2:
		id, ok := pick()
		if !ok || len(h.m.seqs[id]) == 0 {
			return "fork: none"
		}
		parent := h.m.seqs[id]
		pos := 1 + b%len(parent)
		child := free()
		err := h.c.ForkSequence(id, child, pos)
		if errors.Is(err, ErrOutOfPages) {
			return fmt.Sprintf("fork %d from %d at %d: out of pages", child, id, pos)
		}
		if err != nil {
			h.t.Fatalf("ForkSequence(%d, %d, %d) = %v", id, child, pos, err)
		}
		h.m.seqs[child] = slices.Clone(parent[:pos])
		return fmt.Sprintf("fork %d from %d at %d", child, id, pos)
	case 3:
		id, ok := pick()
		if !ok {
			return "pop: none"
		}
		n := b % (len(h.m.seqs[id]) + 1)
		err := h.c.PopN(id, n)
		if errors.Is(err, ErrOutOfPages) {
			return fmt.Sprintf("pop %d from %d: out of pages", n, id)
		}
		if err != nil {
			h.t.Fatalf("PopN(%d, %d) = %v", id, n, err)
		}
		h.m.seqs[id] = h.m.seqs[id][:len(h.m.seqs[id])-n]
		return fmt.Sprintf("pop %d from %d", n, id)
	default:
		id, ok := pick()
		if !ok {
			return "remove: none"
		}
		if err := h.c.RemoveSequence(id); err != nil {
			h.t.Fatalf("RemoveSequence(%d) = %v", id, err)
		}
		delete(h.m.seqs, id)
		return fmt.Sprintf("remove %d", id)
	}
}

// verify checks the cache against the model and the spec's invariants.
func (h *harness) verify(history []string) {
	fail := func(format string, args ...any) {
		h.t.Helper()
		h.t.Fatalf("after %v:\n"+format, append([]any{history}, args...)...)
	}
	if err := h.c.Check(); err != nil {
		fail("Check() = %v", err)
	}
	ps := int64(h.c.PageSize())
	used := map[int32]bool{}
	slotValue := map[int64]uint64{}
	total := 0
	for _, id := range h.ids() {
		want := h.m.seqs[id]
		total += len(want)
		if got, ok := h.c.SequenceLength(id); !ok || got != len(want) {
			fail("SequenceLength(%d) = %d, %v, want %d", id, got, ok, len(want))
		}
		pgs, err := h.c.SequencePages(id, nil)
		if err != nil {
			fail("SequencePages(%d) = %v", id, err)
		}
		if need := (len(want) + int(ps) - 1) / int(ps); len(pgs) != need {
			fail("sequence %d of %d tokens uses %d pages, want %d", id, len(want), len(pgs), need)
		}
		for _, pg := range pgs {
			used[pg] = true
		}
		for pos, v := range want {
			slot := int64(pgs[int64(pos)/ps])*ps + int64(pos)%ps
			got := binary.LittleEndian.Uint64(h.arena.ReadSlot(slot, nil))
			if got != v {
				fail("sequence %d position %d: slot %d holds %d, want %d", id, pos, slot, got, v)
			}
			// Two sequences may map a position to the same slot only when both hold the same
			// KV there: a shared prefix. Anything else is a slot owned twice.
			if prev, ok := slotValue[slot]; ok && prev != v {
				fail("slot %d is used for values %d and %d", slot, prev, v)
			}
			slotValue[slot] = v
		}
	}
	if got := h.c.TotalSequenceLength(); got != total {
		fail("TotalSequenceLength() = %d, want %d", got, total)
	}
	if got, want := h.c.NumAvailablePages(), h.c.NumPages()-len(used); got != want {
		fail("NumAvailablePages() = %d, want %d (pages no sequence uses)", got, want)
	}
}

func TestDifferentialRandomOperations(t *testing.T) {
	runs, steps := 2000, 60
	if testing.Short() {
		runs = 200
	}
	for run := range runs {
		r := rand.New(rand.NewPCG(uint64(run), 7))
		pageSize := []int{1, 2, 4, 16}[r.IntN(4)]
		h := newHarness(t, pageSize, 4+r.IntN(40))
		var history []string
		for range steps {
			history = append(history, h.op(r.IntN(5), r.IntN(1000), r.IntN(1000)))
			h.verify(history)
		}
	}
}

// FuzzOps decodes the input into cache operations and checks the cache against the model
// after each. As an ordinary test it runs the committed corpus.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 39, 2, 0, 20, 1, 1, 19, 3, 0, 5, 4, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0, 32, 2, 0, 31, 1, 0, 1, 3, 1, 30, 2, 1, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		h := newHarness(t, 1+int(data[0]%16), 8)
		var history []string
		for i := 1; i+2 < len(data) && len(history) < 200; i += 3 {
			history = append(history, h.op(int(data[i]), int(data[i+1]), int(data[i+2])))
			h.verify(history)
		}
	})
}
