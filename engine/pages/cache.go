package pages

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvtop/kvtop/internal/invariants"
)

// Errors returned by Cache. They are wrapped with the operation and its arguments; match
// them with errors.Is.
var (
	ErrUnknownSequence = errors.New("pages: unknown sequence")
	ErrSequenceExists  = errors.New("pages: sequence exists")
	// ErrOutOfPages is TVM's "KV cache is full": the free list ran out.
	ErrOutOfPages  = errors.New("pages: out of pages")
	ErrBadPosition = errors.New("pages: position out of range")
	// ErrSharedBlock means the sequence's last block is shared with a fork, so it cannot
	// accept new KV. The fork rules keep this from happening; TVM checks it too.
	ErrSharedBlock = errors.New("pages: last block is shared")
	ErrBadConfig   = errors.New("pages: bad configuration")
)

// noBlock is the parent of a root block, and the block of a free page.
const noBlock = -1

// Config sizes a Cache.
type Config struct {
	PageSize int // tokens per page (MLC's kv_cache_page_size, 16 by default)
	NumPages int // pages in the pool; see NumPagesFor

	// Store holds the page payload. Nil means none: only the bookkeeping runs. A non-nil
	// Store must have been made for the same PageSize and NumPages.
	Store Store

	// SlidingWindow and AttentionSink are the model's sliding-window settings (not modelled yet: docs/mlc-differences.md).
	// Only -1 and 0 (no sliding window) are supported yet; other values are refused so that
	// nothing silently behaves as if the window were not there.
	SlidingWindow int
	AttentionSink int
}

// NumPagesFor is MLC's page count for a KV capacity of maxTotalSeqLen tokens:
// ceil(maxTotalSeqLen / pageSize) + 1, plus 2 * maxNumSeq when the model has a sliding
// window.
func NumPagesFor(maxTotalSeqLen, pageSize, maxNumSeq int, slidingWindow bool) int {
	n := (maxTotalSeqLen+pageSize-1)/pageSize + 1
	if slidingWindow {
		n += 2 * maxNumSeq
	}
	return n
}

// Cache is the paged KV cache of one model: TVM's page pool, block tree and sequences.
//
// A fresh Cache hands out pages 0, 1, 2, …; freed pages are pushed on the free-list stack
// and reused last-freed-first.
type Cache struct {
	pageSize int
	numPages int
	store    Store

	free   []int32 // stack: the top is the end
	owner  []int32 // page -> block, noBlock when free
	blocks []block // the block pool; free entries are listed in freeBlocks
	// freeBlocks is a stack of unused block ids, reused last-freed-first as TVM does.
	freeBlocks []int32
	seqs       map[int64]*sequence
	// list holds the sequences densely, in no order, for walks over all of them.
	list     []*sequence
	totalLen int
}

// block is a run of KV shared by every sequence whose chain passes through it. Its pages
// hold the tokens [start, start+length) of those sequences.
type block struct {
	pages  []int32
	length int
	start  int
	parent int32
	// refs counts what points at the block: the sequence whose last block it is, and each
	// child block. A block with refs > 1 is read-only.
	refs int32
	live bool
}

type sequence struct {
	last   int32 // the sequence's last block
	length int
	id     int64
	at     int // its index in list
}

// New returns an empty cache whose free list hands out pages 0, 1, 2, ….
func New(cfg Config) (*Cache, error) {
	switch {
	case cfg.PageSize <= 0:
		return nil, fmt.Errorf("page size %d must be positive: %w", cfg.PageSize, ErrBadConfig)
	case cfg.NumPages <= 0:
		return nil, fmt.Errorf("page count %d must be positive: %w", cfg.NumPages, ErrBadConfig)
	case int64(cfg.PageSize)*int64(cfg.NumPages) > 1<<31-1:
		return nil, fmt.Errorf("%d pages of %d slots overflow int32 slot numbers: %w", cfg.NumPages, cfg.PageSize, ErrBadConfig)
	case cfg.SlidingWindow != 0 && cfg.SlidingWindow != -1:
		return nil, fmt.Errorf("sliding window %d: not supported yet: %w", cfg.SlidingWindow, ErrBadConfig)
	case cfg.AttentionSink != 0:
		return nil, fmt.Errorf("attention sink %d: not supported yet: %w", cfg.AttentionSink, ErrBadConfig)
	}
	store := cfg.Store
	if store == nil {
		store = nopStore{}
	}
	c := &Cache{
		pageSize: cfg.PageSize,
		numPages: cfg.NumPages,
		store:    store,
		free:     make([]int32, cfg.NumPages),
		owner:    make([]int32, cfg.NumPages),
		seqs:     make(map[int64]*sequence),
	}
	for i := range c.free {
		c.free[i] = int32(cfg.NumPages - 1 - i)
		c.owner[i] = noBlock
	}
	return c, nil
}

// PageSize returns the tokens per page.
func (c *Cache) PageSize() int { return c.pageSize }

// NumPages returns the size of the page pool.
func (c *Cache) NumPages() int { return c.numPages }

// Store returns the page payload store.
func (c *Cache) Store() Store { return c.store }

// NumAvailablePages returns the length of the free list.
func (c *Cache) NumAvailablePages() int { return len(c.free) }

// TotalSequenceLength returns the sum of the lengths of all sequences in the cache, counting
// a shared prefix once per sharer. Admission uses it.
func (c *Cache) TotalSequenceLength() int { return c.totalLen }

// NumSequences returns the number of sequences in the cache.
func (c *Cache) NumSequences() int { return len(c.seqs) }

// HasSequence reports whether the cache holds sequence id.
func (c *Cache) HasSequence(id int64) bool { _, ok := c.seqs[id]; return ok }

// SequenceLength returns the length of sequence id.
func (c *Cache) SequenceLength(id int64) (int, bool) {
	s, ok := c.seqs[id]
	if !ok {
		return 0, false
	}
	return s.length, true
}

// AddSequence adds an empty sequence. It takes no pages.
func (c *Cache) AddSequence(id int64) error {
	if _, ok := c.seqs[id]; ok {
		return fmt.Errorf("pages: add sequence %d: %w", id, ErrSequenceExists)
	}
	c.put(id, &sequence{last: c.newBlock(noBlock, 0)})
	c.check()
	return nil
}

// put records a new sequence.
func (c *Cache) put(id int64, s *sequence) {
	s.id, s.at = id, len(c.list)
	c.seqs[id] = s
	c.list = append(c.list, s)
}

// drop forgets a sequence.
func (c *Cache) drop(s *sequence) {
	last := c.list[len(c.list)-1]
	c.list[s.at], last.at = last, s.at
	c.list[len(c.list)-1] = nil
	c.list = c.list[:len(c.list)-1]
	delete(c.seqs, s.id)
}

// RemoveSequence removes a sequence. Walking from its last block up, every block that only
// this sequence uses gives its pages back to the free list in the block's page order (so the
// last page freed is the first reused); the walk stops at the first shared block, which loses
// one reference.
func (c *Cache) RemoveSequence(id int64) error {
	s, ok := c.seqs[id]
	if !ok {
		return fmt.Errorf("pages: remove sequence %d: %w", id, ErrUnknownSequence)
	}
	c.releaseChain(s.last)
	c.totalLen -= s.length
	c.drop(s)
	c.check()
	return nil
}

// releaseChain drops one reference to block b, freeing it and its ancestors while nothing
// else refers to them.
func (c *Cache) releaseChain(b int32) {
	for b != noBlock && c.blocks[b].refs == 1 {
		parent := c.blocks[b].parent
		c.freeBlock(b)
		b = parent
	}
	if b != noBlock {
		c.blocks[b].refs--
	}
}

// ForkSequence makes child a sequence holding the first pos tokens of parent
// (0 < pos <= length of parent), sharing whole blocks with it.
//
// When pos falls inside a page, the child takes one fresh page and the first pos mod
// page_size slots of the parent's page are copied into it (payload included): the only copy
// a fork makes. When pos is the parent's whole, page-aligned length, the parent gets a new
// empty last block so that it can keep appending.
func (c *Cache) ForkSequence(parent, child int64, pos int) error {
	p, ok := c.seqs[parent]
	if !ok {
		return fmt.Errorf("pages: fork %d from %d: parent: %w", child, parent, ErrUnknownSequence)
	}
	if _, ok := c.seqs[child]; ok {
		return fmt.Errorf("pages: fork %d from %d: %w", child, parent, ErrSequenceExists)
	}
	if pos <= 0 || pos > p.length {
		return fmt.Errorf("pages: fork %d from %d at %d: want 0 < pos <= %d: %w", child, parent, pos, p.length, ErrBadPosition)
	}
	if pos%c.pageSize != 0 && len(c.free) == 0 {
		return fmt.Errorf("pages: fork %d from %d at %d: copying the shared page: %w", child, parent, pos, ErrOutOfPages)
	}
	c.put(child, c.fork(p, pos))
	c.totalLen += pos
	c.check()
	return nil
}

// fork does ForkSequence's work once the arguments are known to be good and a page is free
// if one is needed. It returns the child sequence.
func (c *Cache) fork(p *sequence, pos int) *sequence {
	if pos == p.length && pos%c.pageSize == 0 && c.blocks[p.last].length > 0 {
		// The parent keeps appending into a new empty block so that its new KV does not land
		// in the block the child shares. The parent's reference moves to the new block.
		p.last = c.newBlock(p.last, p.length)
	}
	fb, off := c.locate(p.last, pos)
	inPage := off % c.pageSize
	moved := off - inPage
	var childParent int32
	if moved == 0 {
		childParent = c.blocks[fb].parent
		if childParent != noBlock {
			c.blocks[childParent].refs++
		}
	} else {
		// fb's leading pages move into a new block between fb and its parent, which fb and
		// the child then share.
		f := &c.blocks[fb]
		mp := moved / c.pageSize
		nb := c.newBlock(f.parent, f.start)
		f = &c.blocks[fb] // newBlock may have grown the pool
		n := &c.blocks[nb]
		n.refs = 2
		n.pages = append(n.pages, f.pages[:mp]...)
		n.length = moved
		for _, pg := range n.pages {
			c.owner[pg] = nb
		}
		f.pages = append(f.pages[:0], f.pages[mp:]...)
		f.start += moved
		f.length -= moved
		f.parent = nb
		childParent = nb
	}
	cb := c.newBlock(childParent, pos-inPage)
	if inPage > 0 {
		src := c.blocks[fb].pages[0]
		dst := c.takePage(cb)
		c.blocks[cb].length = inPage
		c.store.CopySlots(dst, src, inPage)
	}
	return &sequence{last: cb, length: pos}
}

// locate finds the block holding position pos on the chain ending in last, and pos's offset
// in it: walking from the first block, each block that is not the last and whose length is at
// most the remaining offset is skipped.
func (c *Cache) locate(last int32, pos int) (fb int32, off int) {
	chain := c.chain(last, nil)
	off = pos
	for i, b := range chain {
		if i < len(chain)-1 && c.blocks[b].length <= off {
			off -= c.blocks[b].length
			continue
		}
		return b, off
	}
	panic("pages: empty chain")
}

// chain appends the blocks from the root down to last.
func (c *Cache) chain(last int32, dst []int32) []int32 {
	start := len(dst)
	for b := last; b != noBlock; b = c.blocks[b].parent {
		dst = append(dst, b)
	}
	slices.Reverse(dst[start:])
	return dst
}

// PopN removes the last n tokens of a sequence (0 <= n <= its length).
//
// Walking from the last block up while the block is this sequence's alone: a block shorter
// than what is left to pop is released whole; otherwise it is shortened, keeping
// ceil((len - n) / page_size) pages and freeing the rest from the back. If tokens are still
// left to pop at a shared block, the sequence is forked at its new length, the old one is
// removed and the fork takes its id.
func (c *Cache) PopN(id int64, n int) error {
	s, ok := c.seqs[id]
	if !ok {
		return fmt.Errorf("pages: pop %d from %d: %w", n, id, ErrUnknownSequence)
	}
	if n < 0 || n > s.length {
		return fmt.Errorf("pages: pop %d from %d of length %d: %w", n, id, s.length, ErrBadPosition)
	}
	if n == 0 {
		return nil
	}
	if err := c.checkPop(s, n); err != nil {
		return fmt.Errorf("pages: pop %d from %d: %w", n, id, err)
	}
	b := s.last
	for b != noBlock && c.blocks[b].refs == 1 {
		blk := &c.blocks[b]
		if n > blk.length {
			n -= blk.length
			s.length -= blk.length
			c.totalLen -= blk.length
			parent := blk.parent
			c.freeBlock(b)
			// The parent keeps the reference the released block held: it is now the
			// sequence's.
			b = parent
			s.last = b
			continue
		}
		keep := (blk.length - n + c.pageSize - 1) / c.pageSize
		for len(blk.pages) > keep {
			pg := blk.pages[len(blk.pages)-1]
			blk.pages = blk.pages[:len(blk.pages)-1]
			c.pushFree(pg)
		}
		blk.length -= n
		s.length -= n
		c.totalLen -= n
		n = 0
		break
	}
	if n > 0 {
		target := s.length - n
		if target == 0 {
			// Nothing of the shared prefix is kept: the sequence starts over empty.
			c.releaseChain(s.last)
			c.totalLen -= s.length
			s.last, s.length = c.newBlock(noBlock, 0), 0
		} else {
			forked := c.fork(s, target)
			c.releaseChain(s.last)
			c.totalLen -= s.length - target
			s.last, s.length = forked.last, forked.length
		}
	}
	c.check()
	return nil
}

// checkPop reports whether PopN(s, n) would need a page for a mid-page fork and find none,
// before anything changes.
func (c *Cache) checkPop(s *sequence, n int) error {
	freed := 0
	length := s.length
	b := s.last
	for b != noBlock && c.blocks[b].refs == 1 {
		blk := &c.blocks[b]
		if n <= blk.length {
			return nil
		}
		n -= blk.length
		length -= blk.length
		freed += len(blk.pages)
		b = blk.parent
	}
	target := length - n
	if target == 0 || b == noBlock {
		return nil
	}
	_, off := c.locate(b, target)
	if off%c.pageSize != 0 && len(c.free)+freed == 0 {
		return fmt.Errorf("forking at %d to copy the shared page: %w", target, ErrOutOfPages)
	}
	return nil
}

// ReserveAppend grows a sequence by n > 0 tokens at once, taking pages from the free list as
// its last block needs them, and appends the reserved slots to dst in token order. The slot
// of a token is page_id * page_size + offset_in_page. On an error nothing changes.
func (c *Cache) ReserveAppend(id int64, n int, dst []int64) ([]int64, error) {
	s, ok := c.seqs[id]
	if !ok {
		return dst, fmt.Errorf("pages: reserve %d in %d: %w", n, id, ErrUnknownSequence)
	}
	if n <= 0 {
		return dst, fmt.Errorf("pages: reserve %d in %d: want n > 0: %w", n, id, ErrBadPosition)
	}
	b := &c.blocks[s.last]
	if b.refs != 1 {
		return dst, fmt.Errorf("pages: reserve %d in %d: block referenced %d times: %w", n, id, b.refs, ErrSharedBlock)
	}
	need := (b.length+n+c.pageSize-1)/c.pageSize - len(b.pages)
	if need > len(c.free) {
		return dst, fmt.Errorf("pages: reserve %d in %d: needs %d pages, %d free: %w", n, id, need, len(c.free), ErrOutOfPages)
	}
	for range need {
		c.takePage(s.last)
	}
	b = &c.blocks[s.last]
	ps := c.pageSize
	for pos := b.length; pos < b.length+n; pos++ {
		dst = append(dst, int64(b.pages[pos/ps])*int64(ps)+int64(pos%ps))
	}
	b.length += n
	s.length += n
	c.totalLen += n
	c.check()
	return dst, nil
}

// newBlock takes a block from the pool with one reference.
func (c *Cache) newBlock(parent int32, start int) int32 {
	var id int32
	if k := len(c.freeBlocks); k > 0 {
		id = c.freeBlocks[k-1]
		c.freeBlocks = c.freeBlocks[:k-1]
	} else {
		c.blocks = append(c.blocks, block{})
		id = int32(len(c.blocks) - 1)
	}
	b := &c.blocks[id]
	*b = block{pages: b.pages[:0], start: start, parent: parent, refs: 1, live: true}
	return id
}

// freeBlock returns a block's pages to the free list, in page order, and the block to the
// pool. Its page slice is kept for reuse so that steady-state appends do not allocate.
func (c *Cache) freeBlock(id int32) {
	b := &c.blocks[id]
	for _, pg := range b.pages {
		c.pushFree(pg)
	}
	*b = block{pages: b.pages[:0], parent: noBlock}
	c.freeBlocks = append(c.freeBlocks, id)
}

func (c *Cache) takePage(b int32) int32 {
	pg := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.owner[pg] = b
	c.blocks[b].pages = append(c.blocks[b].pages, pg)
	return pg
}

func (c *Cache) pushFree(pg int32) {
	c.owner[pg] = noBlock
	c.free = append(c.free, pg)
}

func (c *Cache) check() {
	if invariants.Enabled {
		if err := c.Check(); err != nil {
			panic(err)
		}
	}
}

// SwapPages exchanges the ids of pages a and b everywhere the cache holds them: in the
// blocks that own them and in the free list (their places in it). Every structure stays as
// sound as it was; only which physical page holds what changes. A follower uses it to make
// its pages agree with the ones a real decode instance named. The KV payload is not moved.
func (c *Cache) SwapPages(a, b int32) error {
	if a < 0 || b < 0 || int(a) >= c.numPages || int(b) >= c.numPages {
		return fmt.Errorf("pages: swap %d and %d: outside the pool of %d: %w", a, b, c.numPages, ErrBadPosition)
	}
	if a == b {
		return nil
	}
	oa, ob := c.owner[a], c.owner[b]
	rename := func(owner int32, from, to int32) {
		if owner == noBlock {
			i := slices.Index(c.free, from)
			c.free[i] = to
			return
		}
		pgs := c.blocks[owner].pages
		pgs[slices.Index(pgs, from)] = to
	}
	if oa == ob && oa == noBlock {
		ia, ib := slices.Index(c.free, a), slices.Index(c.free, b)
		c.free[ia], c.free[ib] = b, a
	} else if oa == ob {
		pgs := c.blocks[oa].pages
		ia, ib := slices.Index(pgs, a), slices.Index(pgs, b)
		pgs[ia], pgs[ib] = b, a
	} else {
		rename(oa, a, b)
		rename(ob, b, a)
	}
	c.owner[a], c.owner[b] = ob, oa
	c.check()
	return nil
}

// PageOwned reports whether a page belongs to a block (is not free).
func (c *Cache) PageOwned(pg int32) bool {
	return pg >= 0 && int(pg) < c.numPages && c.owner[pg] != noBlock
}

// SinkFree moves free pages to the bottom of the free list, keeping their order and the
// others': they are handed out last. A follower uses it for pages it believes free that the
// instance it follows holds for something it does not know (a page not free is left alone).
func (c *Cache) SinkFree(pgs []int32) {
	if len(pgs) == 0 {
		return
	}
	sink := make(map[int32]bool, len(pgs))
	for _, p := range pgs {
		if p >= 0 && int(p) < c.numPages && c.owner[p] == noBlock {
			sink[p] = true
		}
	}
	if len(sink) == 0 {
		return
	}
	out := make([]int32, 0, len(c.free))
	for _, p := range c.free {
		if sink[p] {
			out = append(out, p)
		}
	}
	for _, p := range c.free {
		if !sink[p] {
			out = append(out, p)
		}
	}
	copy(c.free, out)
	c.check()
}

// FreeList returns the free list, bottom first (the next page handed out is the last).
func (c *Cache) FreeList() []int32 { return slices.Clone(c.free) }
