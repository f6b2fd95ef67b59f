package blocks

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
)

// Hash returns the hash of a block with the given parent's hash (0 for a first block) and
// tokens: XXH64 over parent as 8 bytes little-endian, then each token as 4 bytes
// little-endian.
func Hash(parent uint64, tokens []int32) uint64 {
	var h hasher
	return h.hash(parent, tokens)
}

// hasher hashes blocks with a buffer of its own, so that hashing allocates nothing.
type hasher struct {
	d   xxhash.Digest
	buf []byte
}

func (h *hasher) hash(parent uint64, tokens []int32) uint64 {
	n := 8 + 4*len(tokens)
	if cap(h.buf) < n {
		h.buf = make([]byte, n)
	}
	b := h.buf[:n]
	binary.LittleEndian.PutUint64(b, parent)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[8+4*i:], uint32(t))
	}
	return xxhash.Sum64(b)
}

// ChangeKind says what a Change did.
type ChangeKind uint8

// The kinds of change, as vLLM names its events.
const (
	// Stored: blocks came into the cache, each the child of the one before it, the first
	// the child of Parent.
	Stored ChangeKind = iota
	// Removed: blocks left the cache.
	Removed
	// Cleared: every block left the cache; what follows rebuilds it.
	Cleared
)

func (k ChangeKind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return fmt.Sprintf("change(%d)", uint8(k))
}

// Change is one change of the block set, in the order it happened.
type Change struct {
	Kind ChangeKind
	// Hashes are the blocks stored (a chain, parent first) or removed.
	Hashes []uint64
	// Parent is the parent of the first stored block; HasParent is false for a chain that
	// starts at the root.
	Parent    uint64
	HasParent bool
	// Tokens are the stored blocks' tokens, page after page.
	Tokens []int32
}

func (c Change) String() string {
	switch c.Kind {
	case Stored:
		parent := "root"
		if c.HasParent {
			parent = fmt.Sprintf("%016x", c.Parent)
		}
		return fmt.Sprintf("stored %d blocks after %s, %d tokens", len(c.Hashes), parent, len(c.Tokens))
	case Removed:
		return fmt.Sprintf("removed %d blocks", len(c.Hashes))
	}
	return c.Kind.String()
}

// block is a held block. A block is held while it is some sequence's last full block or the
// parent of a held block: refs counts both.
type block struct {
	hash   uint64
	parent *block
	refs   int32
	depth  int32 // blocks from the root to this one, itself included
}

// ancestor returns the block of b's chain at depth d (nil for 0).
func ancestor(b *block, d int) *block {
	for b != nil && int(b.depth) > d {
		b = b.parent
	}
	return b
}

// The work is split in two, so that the engine's goroutine does only its part: a Reader
// follows the events and copies out the tokens of the pages that became full (the prefix
// cache is the engine's, so only its goroutine may read it), and a Tracker hashes them and
// keeps the block set, on any goroutine, from what the Reader wrote (Ops). A Tracker's
// Track and Sync do both at once.

// opKind says what an op does to a sequence's chain of blocks.
type opKind uint8

const (
	// opClear forgets every sequence and block: what follows rebuilds them.
	opClear opKind = iota
	// opPoint points seq at the chain of src cut at depth (nothing for src -1 or depth 0):
	// a prepare-receive match.
	opPoint
	// opGrow keeps the first depth blocks of seq's chain and stores the blocks after them
	// whose tokens are Ops.toks[tok:], to a chain of want blocks.
	opGrow
)

type op struct {
	kind  opKind
	seq   int64
	src   int64 // opPoint
	depth int32
	want  int32 // opGrow
	tok   int   // opGrow: where its tokens start in Ops.toks
}

// Ops are what a Reader read of one engine call or step, for a Tracker to apply: the
// sequences' new chains and the tokens of their new blocks, copied out of the prefix cache.
// An Ops is reused: Reset empties it and keeps its memory.
type Ops struct {
	ops  []op
	toks []int32
}

// Reset empties o.
func (o *Ops) Reset() {
	o.ops = o.ops[:0]
	o.toks = o.toks[:0]
}

// Len returns the number of operations in o; an empty Ops changes nothing.
func (o *Ops) Len() int { return len(o.ops) }

// Append adds other's operations after o's, as if one Reader had read both in turn: a
// Tracker applying the result gives the changes of applying o and then other.
func (o *Ops) Append(other *Ops) {
	base := len(o.toks)
	o.toks = append(o.toks, other.toks...)
	if base == 0 {
		o.ops = append(o.ops, other.ops...)
		return
	}
	for _, x := range other.ops {
		if x.kind == opGrow {
			x.tok += base
		}
		o.ops = append(o.ops, x)
	}
}

// cursor is what a Reader knows of a sequence of the prefix cache: while its committed
// length stays in [blocks·page size, full) its blocks are as they were, and a step that
// changes nothing else costs the Reader two comparisons and no write.
type cursor struct {
	held   bool
	blocks int32 // full blocks of its chain
	full   int32 // the length at which its next block is full: (blocks+1)·page size
}

// Reader is the engine's side of block tracking: it follows the events of every engine call
// and step and writes down, as Ops, how each sequence's chain of blocks changed, with the
// tokens of the pages that became full. It reads the prefix cache only for those, and keeps
// a few integers a sequence: a decode step costs it a comparison per running sequence and a
// copy of the tokens of each page filled. It hashes nothing.
type Reader struct {
	ps   int
	seqs []cursor // by sequence id (the engine hands small ids out again)
}

// NewReader returns a reader for a prefix cache whose KV pages hold pageSize tokens. It
// starts from an empty cache; Sync starts it from a cache as it is.
func NewReader(pageSize int) *Reader {
	if pageSize < 1 {
		panic("blocks: page size must be positive")
	}
	return &Reader{ps: pageSize}
}

// PageSize returns the tokens of a block.
func (r *Reader) PageSize() int { return r.ps }

func (r *Reader) seq(id int64) *cursor {
	if id < 0 {
		return nil
	}
	for int64(len(r.seqs)) <= id {
		r.seqs = append(r.seqs, cursor{})
	}
	return &r.seqs[id]
}

// Read follows the events of one engine call or step, c being the prefix cache after it,
// and appends to o what they did to the sequences' blocks.
func (r *Reader) Read(c *prefix.Cache, evs []engine.Event, o *Ops) {
	for _, ev := range evs {
		switch e := ev.(type) {
		case engine.PrefixMatched:
			r.matched(e, o)
		case engine.SeqEvicted:
			r.drop(e.Seq, o)
		case engine.SeqRemoved:
			r.drop(e.Seq, o)
		case engine.PrefixChanged:
			for i := range e.Upserts {
				n := &e.Upserts[i]
				for _, ref := range n.Seqs {
					s := r.seq(ref.ID)
					if s == nil {
						continue
					}
					if s.held && n.Depth < int(s.full) && n.Depth >= int(s.full)-r.ps {
						// Still within the block after its full ones: no block to store,
						// which is most sequences on most steps (a decode step adds one
						// token).
						continue
					}
					r.grow(c, ref.ID, s, n.Depth, o)
				}
			}
		}
	}
}

// Sync starts the reader over from the prefix cache as it is, and writes to o a clearing of
// everything and then every sequence's blocks.
func (r *Reader) Sync(c *prefix.Cache, o *Ops) {
	r.seqs = r.seqs[:0]
	o.ops = append(o.ops, op{kind: opClear})
	for _, n := range c.Nodes() {
		for _, ref := range n.Seqs {
			r.grow(c, ref.ID, r.seq(ref.ID), n.Depth, o)
		}
	}
}

// matched starts a sequence's chain at prepare-receive: a new sequence holds nothing, a fork
// holds its parent's blocks up to the fork point, a reuse keeps its own up to the match (the
// rest was rolled back). The tokens past those come with the next PrefixChanged.
func (r *Reader) matched(e engine.PrefixMatched, o *Ops) {
	s := r.seq(e.Seq)
	if s == nil {
		return
	}
	keep := int32(e.Matched / r.ps)
	pt := op{kind: opPoint, seq: e.Seq, src: -1}
	switch e.Match {
	case prefix.Fork:
		if p := r.seq(e.Parent); p != nil && p.held {
			pt.src, pt.depth = e.Parent, min(keep, p.blocks)
		}
	case prefix.Reuse:
		if s.held {
			pt.src, pt.depth = e.Seq, min(keep, s.blocks)
		}
	}
	if pt.depth == 0 {
		pt.src = -1
	}
	if unchanged := (pt.depth == 0 && s.blocks == 0) || (pt.src == e.Seq && pt.depth == s.blocks); !unchanged {
		o.ops = append(o.ops, pt)
	}
	s.held, s.blocks = true, pt.depth
	s.full = (pt.depth + 1) * int32(r.ps)
}

// drop forgets a sequence that left the cache.
func (r *Reader) drop(id int64, o *Ops) {
	s := r.seq(id)
	if s == nil || !s.held {
		return
	}
	if s.blocks > 0 {
		o.ops = append(o.ops, op{kind: opPoint, seq: id, src: -1})
	}
	*s = cursor{}
}

// grow brings a sequence to its committed length l, copying out the tokens of the blocks it
// filled.
func (r *Reader) grow(c *prefix.Cache, id int64, s *cursor, l int, o *Ops) {
	have := s.blocks
	if !s.held || l < int(have)*r.ps {
		// Not seen start, or shorter than its full blocks without a roll-back event (the
		// engine rolls back only in a prepare-receive match, which matched follows):
		// rebuild it from its tokens.
		have = 0
	}
	want := int32(l / r.ps)
	base := min(have, want)
	if base != s.blocks || want != base {
		g := op{kind: opGrow, seq: id, depth: base, want: want, tok: len(o.toks)}
		if want > base {
			n := int(want-base) * r.ps
			var ok bool
			o.toks, ok = c.AppendTokens(o.toks, id, int(base)*r.ps)
			if !ok || len(o.toks)-g.tok < n {
				panic(fmt.Sprintf("blocks: sequence %d: the prefix cache lists it at %d tokens but gives %d from %d", id, l, len(o.toks)-g.tok, int(base)*r.ps))
			}
			o.toks = o.toks[:g.tok+n]
		}
		o.ops = append(o.ops, g)
	}
	s.held, s.blocks = true, want
	s.full = (want + 1) * int32(r.ps)
}

// Tracker follows the block set of one prefix cache: it applies what a Reader read (Apply),
// on a goroutine of its own if need be, or reads and applies at once on the engine's
// (Track, Sync).
type Tracker struct {
	ps     int
	tails  []*block // each sequence's last full block, by sequence id; nil while it has none
	blocks map[uint64]*block
	h      hasher
	free   []*block // blocks released, for reuse

	rd  *Reader // for Track and Sync
	ops Ops

	out []Change // the changes of the ops being applied
	// The slices of out's changes: each change's are at the end of these while it is the
	// last change, so it grows in place.
	hashes []uint64
	toks   []int32
	shared bool // the buffers are reused from one Apply to the next
}

// NewTracker returns a tracker for a prefix cache whose KV pages hold pageSize tokens. It
// starts from an empty cache; Sync starts it from a cache as it is.
func NewTracker(pageSize int) *Tracker {
	return &Tracker{ps: pageSize, rd: NewReader(pageSize), blocks: make(map[uint64]*block)}
}

// PageSize returns the tokens of a block.
func (t *Tracker) PageSize() int { return t.ps }

// Len returns the number of blocks held.
func (t *Tracker) Len() int { return len(t.blocks) }

func (t *Tracker) tail(id int64) **block {
	for int64(len(t.tails)) <= id {
		t.tails = append(t.tails, nil)
	}
	return &t.tails[id]
}

// Track follows the events of one engine call or step, c being the prefix cache after it,
// and returns the changes of the block set in the order they happened: a Reader's Read and
// Apply at once. The changes' slices are the caller's.
func (t *Tracker) Track(c *prefix.Cache, evs []engine.Event) []Change {
	t.ops.Reset()
	t.rd.Read(c, evs, &t.ops)
	return t.Apply(&t.ops)
}

// Sync starts the tracker over from the prefix cache as it is: its changes are Cleared,
// then every block held, each chain once.
func (t *Tracker) Sync(c *prefix.Cache) []Change {
	t.ops.Reset()
	t.rd.Sync(c, &t.ops)
	return t.Apply(&t.ops)
}

// Apply applies what a Reader read of one engine call or step (or a Sync) and returns the
// changes of the block set in the order they happened. The tracker must have applied every
// Ops its Reader wrote before, since the last Sync. The changes' slices are the caller's; o
// is left as it was.
func (t *Tracker) Apply(o *Ops) []Change {
	t.out, t.hashes, t.toks, t.shared = nil, nil, nil, false
	return t.apply(o)
}

// ApplyShared is Apply with changes that are the tracker's: they and their slices are
// valid until its next call. A consumer that encodes them at once allocates nothing then.
func (t *Tracker) ApplyShared(o *Ops) []Change {
	if !t.shared {
		t.out, t.hashes, t.toks, t.shared = nil, nil, nil, true
	}
	t.out, t.hashes, t.toks = t.out[:0], t.hashes[:0], t.toks[:0]
	return t.apply(o)
}

func (t *Tracker) apply(o *Ops) []Change {
	for i := range o.ops {
		p := &o.ops[i]
		switch p.kind {
		case opClear:
			clear(t.tails)
			t.tails = t.tails[:0]
			clear(t.blocks)
			t.out = append(t.out, Change{Kind: Cleared})
		case opPoint:
			var b *block
			if p.src >= 0 {
				b = ancestor(*t.tail(p.src), int(p.depth))
			}
			t.setTail(t.tail(p.seq), b)
		case opGrow:
			tp := t.tail(p.seq)
			b := ancestor(*tp, int(p.depth))
			toks := o.toks[p.tok:]
			for k := range int(p.want - p.depth) {
				b = t.store(b, toks[k*t.ps:(k+1)*t.ps])
			}
			t.setTail(tp, b)
		}
	}
	return t.out
}

// store returns the block of tokens after parent, held or new; a new one is recorded as
// stored.
func (t *Tracker) store(parent *block, tokens []int32) *block {
	var ph uint64
	if parent != nil {
		ph = parent.hash
	}
	h := t.h.hash(ph, tokens)
	if b := t.blocks[h]; b != nil {
		if b.parent != parent {
			panic(fmt.Sprintf("blocks: hash %016x names two prefixes", h))
		}
		return b
	}
	var b *block
	if n := len(t.free); n > 0 {
		b, t.free = t.free[n-1], t.free[:n-1]
		*b = block{hash: h, parent: parent, depth: 1}
	} else {
		b = &block{hash: h, parent: parent, depth: 1}
	}
	if parent != nil {
		parent.refs++
		b.depth = parent.depth + 1
	}
	t.blocks[h] = b
	t.stored(b, tokens)
	return b
}

// stored records a new block: appended to the last change when that is the stored chain it
// continues.
func (t *Tracker) stored(b *block, tokens []int32) {
	if n := len(t.out); n > 0 {
		last := &t.out[n-1]
		if last.Kind == Stored && b.parent != nil && last.Hashes[len(last.Hashes)-1] == b.parent.hash {
			last.Hashes = t.appendHash(last.Hashes, b.hash)
			last.Tokens = t.appendTokens(last.Tokens, tokens)
			return
		}
	}
	ch := Change{Kind: Stored, Hashes: t.appendHash(nil, b.hash), Tokens: t.appendTokens(nil, tokens)}
	if b.parent != nil {
		ch.Parent, ch.HasParent = b.parent.hash, true
	}
	t.out = append(t.out, ch)
}

// appendHash appends h to the last change's hashes, hs, which end t.hashes.
func (t *Tracker) appendHash(hs []uint64, h uint64) []uint64 {
	t.hashes = append(t.hashes, h)
	return t.hashes[len(t.hashes)-len(hs)-1 : len(t.hashes) : len(t.hashes)]
}

// appendTokens appends toks to the last change's tokens, ts, which end t.toks.
func (t *Tracker) appendTokens(ts, toks []int32) []int32 {
	t.toks = append(t.toks, toks...)
	return t.toks[len(t.toks)-len(ts)-len(toks) : len(t.toks) : len(t.toks)]
}

// setTail points a sequence at a new last block: the new one is held first, so the blocks
// both share never leave.
func (t *Tracker) setTail(tp **block, b *block) {
	if *tp == b {
		return
	}
	if b != nil {
		b.refs++
	}
	old := *tp
	*tp = b
	t.release(old)
}

// release drops a hold on b, and the blocks left unheld with it, root-ward.
func (t *Tracker) release(b *block) {
	for b != nil {
		b.refs--
		if b.refs > 0 {
			return
		}
		delete(t.blocks, b.hash)
		t.removed(b.hash)
		next := b.parent
		*b = block{}
		t.free = append(t.free, b)
		b = next
	}
}

func (t *Tracker) removed(h uint64) {
	if n := len(t.out); n > 0 && t.out[n-1].Kind == Removed {
		t.out[n-1].Hashes = t.appendHash(t.out[n-1].Hashes, h)
		return
	}
	t.out = append(t.out, Change{Kind: Removed, Hashes: t.appendHash(nil, h)})
}

// Block is a block as Of lists it.
type Block struct {
	Hash      uint64
	Parent    uint64
	HasParent bool
	Tokens    []int32
}

// Of returns every block the prefix cache holds, from scratch, by hash: the reference that
// a tracker's changes, applied in order, must rebuild.
func Of(c *prefix.Cache, pageSize int) map[uint64]Block {
	out := map[uint64]Block{}
	var h hasher
	for _, n := range c.Nodes() {
		for _, ref := range n.Seqs {
			toks, _ := c.AppendTokens(nil, ref.ID, 0)
			var parent uint64
			for k := 0; (k+1)*pageSize <= len(toks); k++ {
				page := toks[k*pageSize : (k+1)*pageSize]
				hash := h.hash(parent, page)
				b := Block{Hash: hash, Parent: parent, HasParent: k > 0, Tokens: page}
				if old, dup := out[hash]; dup && (old.Parent != b.Parent || !equal(old.Tokens, page)) {
					panic(fmt.Sprintf("blocks: hash %016x names two prefixes", hash))
				}
				out[hash] = b
				parent = hash
			}
		}
	}
	return out
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
