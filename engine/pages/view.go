package pages

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// BlockInfo is a read-only view of one live block, for dashboards and tests.
type BlockInfo struct {
	ID     int32
	Parent int32 // -1 for a root block
	Refs   int   // the sequence ending here, plus each child block
	Start  int   // position of the block's first token in its sequences
	Length int   // tokens
	Pages  []int32
	// Seqs lists the sequences whose chain passes through the block, ascending. More than
	// one means the block (and its pages) is a shared prefix.
	Seqs []int64
}

// Shared reports whether several sequences use the block.
func (b BlockInfo) Shared() bool { return len(b.Seqs) > 1 }

// Blocks returns every live block, by ascending id, with the sequences that use it.
func (c *Cache) Blocks() []BlockInfo {
	users := make(map[int32][]int64)
	for _, id := range c.SequenceIDs() {
		for b := c.seqs[id].last; b != noBlock; b = c.blocks[b].parent {
			users[b] = append(users[b], id)
		}
	}
	var out []BlockInfo
	for i := range c.blocks {
		b := &c.blocks[i]
		if !b.live {
			continue
		}
		out = append(out, BlockInfo{
			ID: int32(i), Parent: b.parent, Refs: int(b.refs), Start: b.start, Length: b.length,
			Pages: slices.Clone(b.pages), Seqs: users[int32(i)],
		})
	}
	return out
}

// BlockSequences appends to dst the sequences whose chain passes through block b,
// ascending: those that share its pages. It walks every sequence's chain, not the pages.
func (c *Cache) BlockSequences(b int32, dst []int64) []int64 {
	start := len(dst)
	if b < 0 || int(b) >= len(c.blocks) || !c.blocks[b].live {
		return dst
	}
	for _, s := range c.list {
		for x := s.last; x != noBlock; x = c.blocks[x].parent {
			if x == b {
				dst = append(dst, s.id)
				break
			}
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// SequenceIDs returns the ids of all sequences, ascending.
func (c *Cache) SequenceIDs() []int64 {
	return slices.Sorted(maps.Keys(c.seqs))
}

// SequenceBlocks appends the blocks of a sequence's chain to dst, root first.
func (c *Cache) SequenceBlocks(id int64, dst []int32) ([]int32, error) {
	s, ok := c.seqs[id]
	if !ok {
		return dst, fmt.Errorf("pages: blocks of %d: %w", id, ErrUnknownSequence)
	}
	return c.chain(s.last, dst), nil
}

// SequencePages appends the pages a sequence uses to dst, in token order.
func (c *Cache) SequencePages(id int64, dst []int32) ([]int32, error) {
	s, ok := c.seqs[id]
	if !ok {
		return dst, fmt.Errorf("pages: pages of %d: %w", id, ErrUnknownSequence)
	}
	var buf [16]int32
	for _, b := range c.chain(s.last, buf[:0]) {
		dst = append(dst, c.blocks[b].pages...)
	}
	return dst, nil
}

// PageBlock returns the block owning a page, or -1 when the page is free.
func (c *Cache) PageBlock(page int32) int32 {
	if page < 0 || int(page) >= c.numPages {
		return noBlock
	}
	return c.owner[page]
}

// FreePages appends the free list to dst, bottom of the stack first (the last one is handed
// out next).
func (c *Cache) FreePages(dst []int32) []int32 { return append(dst, c.free...) }

// State is everything a Cache holds except the page payload: enough to rebuild an identical
// cache with FromState. A viewer that rebuilds the cache from a snapshot and then applies the
// same operations stays identical to the engine's.
type State struct {
	PageSize   int          `json:"page_size"`
	NumPages   int          `json:"num_pages"`
	Free       List         `json:"free"`        // the free-list stack, bottom first
	PoolSize   int          `json:"pool_size"`   // blocks in the pool, live or not
	FreeBlocks List         `json:"free_blocks"` // the pool's free stack, bottom first
	Blocks     []BlockState `json:"blocks"`      // live blocks, ascending id
	Seqs       []SeqState   `json:"seqs"`        // ascending id
}

// BlockState is one live block in a State.
type BlockState struct {
	ID     int32 `json:"id"`
	Parent int32 `json:"parent"`
	Refs   int32 `json:"refs"`
	Start  int   `json:"start"`
	Length int   `json:"length"`
	Pages  List  `json:"pages"`
}

// SeqState is one sequence in a State.
type SeqState struct {
	ID     int64 `json:"id"`
	Last   int32 `json:"last"`
	Length int   `json:"length"`
}

// State returns a copy of the cache's bookkeeping.
func (c *Cache) State() State {
	st := State{
		PageSize:   c.pageSize,
		NumPages:   c.numPages,
		Free:       slices.Clone(c.free),
		PoolSize:   len(c.blocks),
		FreeBlocks: slices.Clone(c.freeBlocks),
	}
	for i := range c.blocks {
		b := &c.blocks[i]
		if b.live {
			st.Blocks = append(st.Blocks, BlockState{
				ID: int32(i), Parent: b.parent, Refs: b.refs, Start: b.start, Length: b.length,
				Pages: slices.Clone(b.pages),
			})
		}
	}
	for _, id := range c.SequenceIDs() {
		s := c.seqs[id]
		st.Seqs = append(st.Seqs, SeqState{ID: id, Last: s.last, Length: s.length})
	}
	return st
}

// ErrBadState is returned by FromState for a state that no cache could be in.
var ErrBadState = errors.New("pages: inconsistent state")

// FromState rebuilds a cache from a State, checking that it is consistent.
func FromState(st State, store Store) (*Cache, error) {
	c, err := New(Config{PageSize: st.PageSize, NumPages: st.NumPages, Store: store})
	if err != nil {
		return nil, err
	}
	if st.PoolSize < 0 || st.PoolSize > 1<<24 {
		return nil, fmt.Errorf("pages: block pool of %d: %w", st.PoolSize, ErrBadState)
	}
	for _, pg := range st.Free {
		if pg < 0 || int(pg) >= st.NumPages {
			return nil, fmt.Errorf("pages: free page %d of %d: %w", pg, st.NumPages, ErrBadState)
		}
	}
	for _, b := range st.FreeBlocks {
		if b < 0 || int(b) >= st.PoolSize {
			return nil, fmt.Errorf("pages: free block %d of %d: %w", b, st.PoolSize, ErrBadState)
		}
	}
	c.free = slices.Clone(st.Free)
	c.freeBlocks = slices.Clone(st.FreeBlocks)
	c.blocks = make([]block, st.PoolSize)
	for i := range c.blocks {
		c.blocks[i].parent = noBlock
	}
	for _, b := range st.Blocks {
		if b.ID < 0 || int(b.ID) >= st.PoolSize || c.blocks[b.ID].live ||
			b.Parent < noBlock || int(b.Parent) >= st.PoolSize || b.Refs < 1 || b.Length < 0 || b.Start < 0 {
			return nil, fmt.Errorf("pages: block %d: %w", b.ID, ErrBadState)
		}
		c.blocks[b.ID] = block{pages: slices.Clone(b.Pages), length: b.Length, start: b.Start, parent: b.Parent, refs: b.Refs, live: true}
	}
	for i := range c.owner {
		c.owner[i] = noBlock
	}
	for _, b := range st.Blocks {
		for _, pg := range b.Pages {
			if pg < 0 || int(pg) >= c.numPages || c.owner[pg] != noBlock {
				return nil, fmt.Errorf("pages: page %d of block %d: %w", pg, b.ID, ErrBadState)
			}
			c.owner[pg] = b.ID
		}
	}
	for _, s := range st.Seqs {
		if _, dup := c.seqs[s.ID]; dup || s.Last < 0 || int(s.Last) >= st.PoolSize || s.Length < 0 {
			return nil, fmt.Errorf("pages: sequence %d: %w", s.ID, ErrBadState)
		}
		c.put(s.ID, &sequence{last: s.Last, length: s.Length})
		c.totalLen += s.Length
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadState, err)
	}
	return c, nil
}

// Check verifies the cache's invariants (docs/kv-cache.md): pages
// are conserved and each is owned once, reference counts match what points at each block,
// every block holds ceil(length / page_size) pages and starts on a page boundary, and each
// sequence's length is the sum of its chain. It returns the first violation.
func (c *Cache) Check() error {
	owned := 0
	for i := range c.blocks {
		b := &c.blocks[i]
		if !b.live {
			continue
		}
		owned += len(b.pages)
		if want := (b.length + c.pageSize - 1) / c.pageSize; len(b.pages) != want {
			return fmt.Errorf("block %d: %d tokens on %d pages, want %d pages", i, b.length, len(b.pages), want)
		}
		if b.start%c.pageSize != 0 {
			return fmt.Errorf("block %d starts at %d, not on a page boundary", i, b.start)
		}
		if b.parent != noBlock {
			p := &c.blocks[b.parent]
			if !p.live {
				return fmt.Errorf("block %d: parent %d is not live", i, b.parent)
			}
			if b.start != p.start+p.length {
				return fmt.Errorf("block %d starts at %d, parent %d ends at %d", i, b.start, b.parent, p.start+p.length)
			}
		} else if b.start != 0 {
			return fmt.Errorf("root block %d starts at %d", i, b.start)
		}
		for _, pg := range b.pages {
			if c.owner[pg] != int32(i) {
				return fmt.Errorf("page %d in block %d is owned by %d", pg, i, c.owner[pg])
			}
		}
	}
	if owned+len(c.free) != c.numPages {
		return fmt.Errorf("%d owned + %d free pages != %d", owned, len(c.free), c.numPages)
	}
	seen := make([]bool, c.numPages)
	for _, pg := range c.free {
		if c.owner[pg] != noBlock {
			return fmt.Errorf("free page %d is owned by block %d", pg, c.owner[pg])
		}
		if seen[pg] {
			return fmt.Errorf("page %d is on the free list twice", pg)
		}
		seen[pg] = true
	}
	// Parent links must form a forest: walk each chain once, marking what is done.
	mark := make([]uint8, len(c.blocks)) // 0 unseen, 1 on the current walk, 2 known to reach a root
	for i := range c.blocks {
		var path []int
		b := i
		for c.blocks[b].live && mark[b] == 0 {
			mark[b] = 1
			path = append(path, b)
			if c.blocks[b].parent == noBlock {
				break
			}
			b = int(c.blocks[b].parent)
		}
		if c.blocks[b].live && mark[b] == 1 && c.blocks[b].parent != noBlock {
			return fmt.Errorf("block %d: parent links form a cycle", b)
		}
		for _, p := range path {
			mark[p] = 2
		}
	}
	refs := make([]int32, len(c.blocks))
	for i := range c.blocks {
		if b := &c.blocks[i]; b.live && b.parent != noBlock {
			refs[b.parent]++
		}
	}
	if len(c.list) != len(c.seqs) {
		return fmt.Errorf("%d sequences listed, %d known", len(c.list), len(c.seqs))
	}
	for i, s := range c.list {
		if s.at != i || c.seqs[s.id] != s {
			return fmt.Errorf("sequence %d listed at %d, says %d", s.id, i, s.at)
		}
	}
	total := 0
	for id, s := range c.seqs {
		if !c.blocks[s.last].live {
			return fmt.Errorf("sequence %d ends in dead block %d", id, s.last)
		}
		refs[s.last]++
		b := &c.blocks[s.last]
		if got := b.start + b.length; got != s.length {
			return fmt.Errorf("sequence %d has length %d, its chain holds %d", id, s.length, got)
		}
		total += s.length
	}
	for i := range c.blocks {
		b := &c.blocks[i]
		if b.live && b.refs != refs[i] {
			return fmt.Errorf("block %d counts %d references, has %d", i, b.refs, refs[i])
		}
		if b.live && refs[i] == 0 {
			return fmt.Errorf("block %d is live but unreferenced", i)
		}
	}
	freeBlock := make([]bool, len(c.blocks))
	for _, b := range c.freeBlocks {
		if b < 0 || int(b) >= len(c.blocks) || c.blocks[b].live || freeBlock[b] {
			return fmt.Errorf("block %d on the pool's free stack is live or listed twice", b)
		}
		freeBlock[b] = true
	}
	for i := range c.blocks {
		if !c.blocks[i].live && !freeBlock[i] {
			return fmt.Errorf("dead block %d is not on the pool's free stack", i)
		}
	}
	if total != c.totalLen {
		return fmt.Errorf("total sequence length %d, sequences sum to %d", c.totalLen, total)
	}
	return nil
}

// PagesFreedByRemoving returns how many pages removing all the given sequences would give
// back, without removing anything: a block's pages come back once no remaining sequence or
// child block refers to it. Unknown ids are ignored. The dashboard uses it to say what
// eviction could still free.
func (c *Cache) PagesFreedByRemoving(ids []int64) int {
	drop := make(map[int32]int32) // references dropped so far, per block
	freed := 0
	for _, id := range ids {
		s, ok := c.seqs[id]
		if !ok {
			continue
		}
		b := s.last
		for b != noBlock && c.blocks[b].refs-drop[b] == 1 {
			drop[b] = c.blocks[b].refs
			freed += len(c.blocks[b].pages)
			b = c.blocks[b].parent
		}
		if b != noBlock {
			drop[b]++
		}
	}
	return freed
}
