package pages

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
)

func newCache(t testing.TB, numPages int) *Cache {
	t.Helper()
	c, err := New(Config{PageSize: 16, NumPages: numPages})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func reserve(t testing.TB, c *Cache, id int64, n int) []int64 {
	t.Helper()
	slots, err := c.ReserveAppend(id, n, nil)
	if err != nil {
		t.Fatalf("ReserveAppend(%d, %d): %v", id, n, err)
	}
	return Compress(nil, slots)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNumPagesFor(t *testing.T) {
	for _, tc := range []struct {
		total, page, seqs int
		window            bool
		want              int
	}{
		{4096, 16, 4, false, 257}, // MLC's defaults: under the 401 the watermark needs
		{8192, 16, 4, false, 513},
		{32768, 16, 4, false, 2049},
		{2048, 16, 4, false, 129},
		{4096, 16, 4, true, 265},
		{4097, 16, 4, false, 258},
	} {
		if got := NumPagesFor(tc.total, tc.page, tc.seqs, tc.window); got != tc.want {
			t.Errorf("NumPagesFor(%d, %d, %d, %v) = %d, want %d", tc.total, tc.page, tc.seqs, tc.window, got, tc.want)
		}
	}
}

// Spec example 6: TVM's own transfer test as a golden vector.
func TestTransferGoldenVector(t *testing.T) {
	c := newCache(t, 129)
	lens := []int{7, 11, 16, 24, 26, 32, 34, 35, 43}
	want := [][]int64{{1, 0, 7}, {1, 16, 11}, {1, 32, 16}, {1, 48, 24}, {1, 80, 26}, {1, 112, 32}, {1, 144, 34}, {1, 192, 35}, {1, 240, 43}}
	for i, n := range lens {
		must(t, c.AddSequence(int64(i)))
		if got := reserve(t, c, int64(i), n); !slices.Equal(got, want[i]) {
			t.Errorf("sequence %d: ReserveAppend(%d) compressed = %v, want %v", i, n, got, want[i])
		}
	}
}

// Spec examples 2 and 3 at the cache level: a 39-token parent forked at 16 (page-aligned, no
// copy) and at 20 (mid-page: a fresh page takes a copy of 4 slots).
func TestForkInsideParent(t *testing.T) {
	for _, tc := range []struct {
		pos       int
		want      []int64
		wantFree  int
		wantPages []int32
	}{
		{16, []int64{1, 48, 23}, 513 - 5, []int32{0, 3, 4}},
		{20, []int64{1, 52, 19}, 513 - 5, []int32{0, 3, 4}},
	} {
		c := newCache(t, 513)
		must(t, c.AddSequence(0))
		reserve(t, c, 0, 39)
		must(t, c.ForkSequence(0, 1, tc.pos))
		if got := reserve(t, c, 1, 39-tc.pos); !slices.Equal(got, tc.want) {
			t.Errorf("fork at %d: child ReserveAppend = %v, want %v", tc.pos, got, tc.want)
		}
		if got := c.NumAvailablePages(); got != tc.wantFree {
			t.Errorf("fork at %d: NumAvailablePages() = %d, want %d", tc.pos, got, tc.wantFree)
		}
		if got, _ := c.SequencePages(1, nil); !slices.Equal(got, tc.wantPages) {
			t.Errorf("fork at %d: SequencePages(child) = %v, want %v", tc.pos, got, tc.wantPages)
		}
		if got := c.TotalSequenceLength(); got != 39+39 {
			t.Errorf("fork at %d: TotalSequenceLength() = %d, want 78", tc.pos, got)
		}
	}
}

// Spec example 7: a fork at the parent's whole, page-aligned length shares both pages and
// gives the parent a new empty block to append into.
func TestForkAtAlignedEnd(t *testing.T) {
	c := newCache(t, 513)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 32)
	must(t, c.ForkSequence(0, 1, 32))
	if got := reserve(t, c, 1, 5); !slices.Equal(got, []int64{1, 32, 5}) {
		t.Errorf("child ReserveAppend(5) = %v, want [1 32 5]", got)
	}
	if got := reserve(t, c, 0, 1); !slices.Equal(got, []int64{1, 48, 1}) {
		t.Errorf("parent ReserveAppend(1) = %v, want [1 48 1]", got)
	}
	blocks := c.Blocks()
	var shared []int32
	for _, b := range blocks {
		if b.Shared() {
			shared = append(shared, b.Pages...)
		}
	}
	if !slices.Equal(shared, []int32{0, 1}) {
		t.Errorf("shared pages = %v, want [0 1]", shared)
	}
}

// Forking twice at the same aligned end reuses the parent's empty block instead of adding
// another.
func TestForkAtAlignedEndTwice(t *testing.T) {
	c := newCache(t, 64)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 16)
	must(t, c.ForkSequence(0, 1, 16))
	must(t, c.ForkSequence(0, 2, 16))
	if got := len(c.Blocks()); got != 4 {
		t.Errorf("blocks after two aligned forks = %d, want 4 (shared, parent's empty, two children)", got)
	}
	must(t, c.RemoveSequence(0))
	must(t, c.RemoveSequence(1))
	if got := c.NumAvailablePages(); got != 63 {
		t.Errorf("NumAvailablePages() with one sharer left = %d, want 63", got)
	}
	must(t, c.RemoveSequence(2))
	if got := c.NumAvailablePages(); got != 64 {
		t.Errorf("NumAvailablePages() with nothing left = %d, want 64", got)
	}
}

// Spec example 4: pages are reused last-freed-first, so a later reservation is cut into
// several runs.
func TestLastFreedFirstReuse(t *testing.T) {
	c := newCache(t, 513)
	must(t, c.AddSequence(0))
	if got := reserve(t, c, 0, 20); !slices.Equal(got, []int64{1, 0, 20}) {
		t.Fatalf("A: ReserveAppend(20) = %v, want [1 0 20]", got)
	}
	must(t, c.RemoveSequence(0))
	must(t, c.AddSequence(1))
	if got := reserve(t, c, 1, 40); !slices.Equal(got, []int64{3, 16, 16, 0, 16, 32, 8}) {
		t.Errorf("B: ReserveAppend(40) = %v, want [3 16 16 0 16 32 8]", got)
	}
}

// Spec example 5 at the cache level: a 41-token sequence popped by 3 keeps its three pages,
// and the next slot lands on page 2 offset 6.
func TestPopThenReserve(t *testing.T) {
	c := newCache(t, 513)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 41)
	must(t, c.PopN(0, 3))
	if got := c.NumAvailablePages(); got != 510 {
		t.Errorf("NumAvailablePages() after PopN(3) = %d, want 510", got)
	}
	if got := reserve(t, c, 0, 1); !slices.Equal(got, []int64{1, 38, 1}) {
		t.Errorf("ReserveAppend(1) after PopN = %v, want [1 38 1]", got)
	}
}

func TestPopFreesPagesFromTheBack(t *testing.T) {
	c := newCache(t, 16)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 40) // pages 0, 1, 2
	must(t, c.PopN(0, 20))
	if got, _ := c.SequencePages(0, nil); !slices.Equal(got, []int32{0, 1}) {
		t.Errorf("SequencePages after PopN(20) = %v, want [0 1]", got)
	}
	if got := reserve(t, c, 0, 20); !slices.Equal(got, []int64{1, 20, 20}) {
		t.Errorf("ReserveAppend(20) = %v, want [1 20 20] (page 2 freed last, reused first)", got)
	}
}

// Popping into a shared block forks the sequence at its new length and removes the old one,
// so the sharer keeps its KV untouched.
func TestPopIntoSharedBlock(t *testing.T) {
	c := newCache(t, 16)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 32)              // pages 0, 1
	must(t, c.ForkSequence(0, 1, 32)) // both share pages 0, 1
	reserve(t, c, 1, 5)               // page 2
	must(t, c.PopN(1, 20))            // to 17 tokens: into the shared block, mid-page
	if got, _ := c.SequenceLength(1); got != 17 {
		t.Errorf("SequenceLength after PopN(20) = %d, want 17", got)
	}
	pages, _ := c.SequencePages(1, nil)
	if len(pages) != 2 || pages[0] != 0 || pages[1] == 1 {
		t.Errorf("SequencePages after PopN = %v, want [0 fresh] (page 1 stays with the sharer)", pages)
	}
	if got, _ := c.SequencePages(0, nil); !slices.Equal(got, []int32{0, 1}) {
		t.Errorf("sharer's SequencePages = %v, want [0 1]", got)
	}
	must(t, c.PopN(1, 17)) // everything: starts over empty
	if got, _ := c.SequenceLength(1); got != 0 {
		t.Errorf("SequenceLength after popping all = %d, want 0", got)
	}
	must(t, c.Check())
}

func TestReserveOutOfPagesChangesNothing(t *testing.T) {
	c := newCache(t, 3)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 20)
	before := c.State()
	_, err := c.ReserveAppend(0, 40, nil)
	if !errors.Is(err, ErrOutOfPages) {
		t.Fatalf("ReserveAppend beyond the pool = %v, want ErrOutOfPages", err)
	}
	if got := c.State(); !stateEqual(got, before) {
		t.Errorf("state changed by a failed ReserveAppend:\n got %+v\nwant %+v", got, before)
	}
}

func TestBadCallsAreErrors(t *testing.T) {
	c := newCache(t, 8)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 20)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"add existing", c.AddSequence(0), ErrSequenceExists},
		{"remove unknown", c.RemoveSequence(9), ErrUnknownSequence},
		{"fork unknown parent", c.ForkSequence(9, 1, 1), ErrUnknownSequence},
		{"fork onto existing", c.ForkSequence(0, 0, 1), ErrSequenceExists},
		{"fork at 0", c.ForkSequence(0, 1, 0), ErrBadPosition},
		{"fork past the end", c.ForkSequence(0, 1, 21), ErrBadPosition},
		{"pop negative", c.PopN(0, -1), ErrBadPosition},
		{"pop too many", c.PopN(0, 21), ErrBadPosition},
		{"pop unknown", c.PopN(9, 1), ErrUnknownSequence},
		{"reserve zero", func() error { _, err := c.ReserveAppend(0, 0, nil); return err }(), ErrBadPosition},
		{"reserve unknown", func() error { _, err := c.ReserveAppend(9, 1, nil); return err }(), ErrUnknownSequence},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	must(t, c.Check())
}

func TestFullPoolMidPageForkRefused(t *testing.T) {
	c := newCache(t, 2)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 32)
	if err := c.ForkSequence(0, 1, 20); !errors.Is(err, ErrOutOfPages) {
		t.Errorf("mid-page fork on a full pool = %v, want ErrOutOfPages", err)
	}
	if err := c.ForkSequence(0, 1, 16); err != nil {
		t.Errorf("aligned fork on a full pool = %v, want nil (no copy needed)", err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{PageSize: 0, NumPages: 1},
		{PageSize: 16, NumPages: 0},
		{PageSize: 16, NumPages: 1, SlidingWindow: 1024},
		{PageSize: 1 << 20, NumPages: 1 << 20},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

func TestCompress(t *testing.T) {
	for _, tc := range []struct {
		slots []int64
		want  []int64
	}{
		{nil, []int64{0}},
		{[]int64{5}, []int64{1, 5, 1}},
		{[]int64{0, 1, 2, 16, 17, 3}, []int64{3, 0, 3, 16, 2, 3, 1}},
		{[]int64{15, 16, 17}, []int64{1, 15, 3}}, // consecutive pages merge
	} {
		if got := Compress(nil, tc.slots); !slices.Equal(got, tc.want) {
			t.Errorf("Compress(%v) = %v, want %v", tc.slots, got, tc.want)
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	c := newCache(t, 64)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 40)
	must(t, c.ForkSequence(0, 1, 20))
	reserve(t, c, 1, 9)
	must(t, c.AddSequence(2))
	reserve(t, c, 2, 3)
	must(t, c.RemoveSequence(2))
	d, err := FromState(c.State(), nil)
	if err != nil {
		t.Fatalf("FromState(State()) = %v", err)
	}
	// The copy behaves identically from here on.
	for _, x := range []*Cache{c, d} {
		must(t, x.AddSequence(3))
		reserve(t, x, 3, 33)
		must(t, x.PopN(1, 12))
	}
	if !stateEqual(c.State(), d.State()) {
		t.Errorf("caches diverged after the same operations:\n%+v\n%+v", c.State(), d.State())
	}
}

func TestFromStateRefusesInconsistency(t *testing.T) {
	c := newCache(t, 8)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 20)
	for name, mutate := range map[string]func(*State){
		"page lost":           func(s *State) { s.Free = s.Free[1:] },
		"page twice":          func(s *State) { s.Free = append(s.Free, s.Blocks[0].Pages[0]) },
		"page out of range":   func(s *State) { s.Free[0] = 99 },
		"wrong refs":          func(s *State) { s.Blocks[0].Refs = 2 },
		"wrong length":        func(s *State) { s.Seqs[0].Length = 3 },
		"parent out of range": func(s *State) { s.Blocks[0].Parent = 7 },
		"self parent":         func(s *State) { s.Blocks[0].Parent = s.Blocks[0].ID },
	} {
		st := c.State()
		mutate(&st)
		if _, err := FromState(st, nil); !errors.Is(err, ErrBadState) {
			t.Errorf("FromState with %s = %v, want ErrBadState", name, err)
		}
	}
}

func TestArenaLayout(t *testing.T) {
	g := Geometry{Layers: 2, KVHeads: 3, HeadDim: 4}
	a, err := NewArena(g, 4, 16, 1<<20)
	must(t, err)
	if got, want := a.Bytes(), int64(2*4*2*3*16*4*2); got != want {
		t.Fatalf("Bytes() = %d, want %d", got, want)
	}
	tok := make([]byte, g.TokenBytes())
	for i := range tok {
		tok[i] = byte(i + 1)
	}
	a.WriteSlot(2*16+5, tok) // page 2, offset 5
	if got := a.ReadSlot(2*16+5, nil); !slices.Equal(got, tok) {
		t.Errorf("ReadSlot = %v, want %v", got, tok)
	}
	// Layer 1, V, head 2 of page 2 offset 5 lies where the GPU layout puts it.
	row := g.HeadDim * 2
	off := ((((1*4+2)*2+1)*3+2)*16 + 5) * row
	src := ((1*2+1)*3 + 2) * row
	if !slices.Equal(a.data[off:off+row], tok[src:src+row]) {
		t.Errorf("layer 1 V head 2 = %v, want %v", a.data[off:off+row], tok[src:src+row])
	}
	a.CopySlots(3, 2, 6)
	if got := a.ReadSlot(3*16+5, nil); !slices.Equal(got, tok) {
		t.Errorf("after CopySlots(3, 2, 6): slot 53 = %v, want %v", got, tok)
	}
	if _, err := NewArena(g, 1<<20, 16, 1<<20); !errors.Is(err, ErrArenaTooLarge) {
		t.Errorf("NewArena over the limit = %v, want ErrArenaTooLarge", err)
	}
}

// A geometry whose size overflows is refused, never wrapped into a small or zero arena.
func TestArenaSizeDoesNotOverflow(t *testing.T) {
	for _, g := range []Geometry{
		{Layers: 32, KVHeads: 1, HeadDim: 144115188075855873}, // token bytes wrap to 128
		{Layers: 1000000, KVHeads: 1000000, HeadDim: 1000000}, // a token fits; the arena does not
		{Layers: 4294967296, KVHeads: 4294967296, HeadDim: 2}, // wraps to exactly 0
	} {
		if g.Zero() {
			t.Errorf("%+v.Zero() = true, want false: no dimension is zero", g)
		}
		if got := g.TokenBytes(); got != -1 && g.Layers != 1000000 {
			t.Errorf("%+v.TokenBytes() = %d, want -1 (overflow)", g, got)
		}
		if n, err := ArenaSize(g, 513, 16); !errors.Is(err, ErrArenaTooLarge) {
			t.Errorf("ArenaSize(%+v) = %d, %v, want ErrArenaTooLarge", g, n, err)
		}
		if _, err := NewArena(g, 513, 16, math.MaxInt64); !errors.Is(err, ErrArenaTooLarge) {
			t.Errorf("NewArena(%+v) = %v, want ErrArenaTooLarge", g, err)
		}
	}
	if n, err := ArenaSize(Geometry{Layers: 32, KVHeads: 8, HeadDim: 128}, 513, 16); err != nil || n != 32*2*8*128*2*513*16 {
		t.Errorf("ArenaSize(32x8x128, 513 pages of 16) = %d, %v", n, err)
	}
}

func stateEqual(a, b State) bool {
	if a.PageSize != b.PageSize || a.NumPages != b.NumPages || a.PoolSize != b.PoolSize ||
		!slices.Equal(a.Free, b.Free) || !slices.Equal(a.FreeBlocks, b.FreeBlocks) ||
		!slices.Equal(a.Seqs, b.Seqs) || len(a.Blocks) != len(b.Blocks) {
		return false
	}
	for i := range a.Blocks {
		x, y := a.Blocks[i], b.Blocks[i]
		if x.ID != y.ID || x.Parent != y.Parent || x.Refs != y.Refs || x.Start != y.Start ||
			x.Length != y.Length || !slices.Equal(x.Pages, y.Pages) {
			return false
		}
	}
	return true
}

func TestPagesFreedByRemoving(t *testing.T) {
	c := newCache(t, 64)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 40) // pages 0-2
	must(t, c.ForkSequence(0, 1, 32))
	reserve(t, c, 1, 20) // child: copy of nothing (aligned), pages 3-4
	must(t, c.AddSequence(2))
	reserve(t, c, 2, 16) // page 5
	for _, tc := range []struct {
		ids  []int64
		want int
	}{
		{nil, 0},
		{[]int64{2}, 1},
		{[]int64{1}, 2},       // the shared pages stay with 0
		{[]int64{0}, 1},       // page 2 only
		{[]int64{0, 1}, 5},    // the shared block goes with its last sharer
		{[]int64{1, 0, 2}, 6}, // order does not matter
		{[]int64{7}, 0},
	} {
		if got := c.PagesFreedByRemoving(tc.ids); got != tc.want {
			t.Errorf("PagesFreedByRemoving(%v) = %d, want %d", tc.ids, got, tc.want)
		}
	}
	// Check the claim against the real thing.
	free := c.NumAvailablePages()
	must(t, c.RemoveSequence(1))
	must(t, c.RemoveSequence(0))
	if got := c.NumAvailablePages() - free; got != 5 {
		t.Errorf("removing 1 and 0 freed %d pages, want 5", got)
	}
}

func TestListJSON(t *testing.T) {
	for _, tc := range []struct {
		in   List
		want string
	}{
		{List{}, `[]`},
		{List{5}, `["5"]`},
		{List{3, 2, 1, 0}, `["3-0"]`},
		{List{0, 1, 2, 7, 9, 8}, `["0-2","7","9-8"]`},
		{List{1, 0, 2}, `["1-0","2"]`},
	} {
		b, err := json.Marshal(tc.in)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal(%v) = %s, %v, want %s", tc.in, b, err, tc.want)
		}
		var back List
		if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back, tc.in) {
			t.Errorf("Unmarshal(%s) = %v, %v, want %v", b, back, err, tc.in)
		}
	}
	for _, bad := range []string{`[1]`, `["x"]`, `["-1"]`, `["1-"]`, `["0-99999999"]`, `{}`} {
		var l List
		if err := json.Unmarshal([]byte(bad), &l); err == nil {
			t.Errorf("Unmarshal(%s) = %v, want an error", bad, l)
		}
	}
}

// BlockSequences names the sequences of a block as Blocks does, forks and all, and nothing
// for a free or unknown block.
func TestBlockSequences(t *testing.T) {
	c := newCache(t, 64)
	must(t, c.AddSequence(0))
	reserve(t, c, 0, 40)
	must(t, c.ForkSequence(0, 1, 20)) // mid-page: splits the parent's block
	must(t, c.ForkSequence(1, 2, 10))
	reserve(t, c, 2, 3)
	checked := 0
	for _, b := range c.Blocks() {
		if got := c.BlockSequences(b.ID, nil); !slices.Equal(got, b.Seqs) {
			t.Errorf("block %d: BlockSequences = %v, Blocks says %v", b.ID, got, b.Seqs)
		}
		if len(b.Seqs) > 1 {
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no shared block: the test checks nothing")
	}
	if got := c.BlockSequences(-1, nil); got != nil {
		t.Errorf("BlockSequences(-1) = %v", got)
	}
	if got := c.BlockSequences(1000, nil); got != nil {
		t.Errorf("BlockSequences(1000) = %v", got)
	}
}
