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

// seqState is what the tracker knows of a sequence of the prefix cache.
type seqState struct {
	held   bool
	length int    // committed tokens, as of the last change seen
	tail   *block // the last full block; nil while it has none
}

func (s *seqState) blocks() int {
	if s.tail == nil {
		return 0
	}
	return int(s.tail.depth)
}

// Tracker follows the block set of one prefix cache through the engine's events.
type Tracker struct {
	ps     int
	seqs   []seqState // by sequence id (the engine hands small ids out again)
	blocks map[uint64]*block
	h      hasher
	toks   []int32 // scratch: a sequence's new tokens

	out []Change // the changes of the call being tracked
}

// NewTracker returns a tracker for a prefix cache whose KV pages hold pageSize tokens. It
// starts from an empty cache; Sync starts it from a cache as it is.
func NewTracker(pageSize int) *Tracker {
	if pageSize < 1 {
		panic("blocks: page size must be positive")
	}
	return &Tracker{ps: pageSize, blocks: make(map[uint64]*block)}
}

// PageSize returns the tokens of a block.
func (t *Tracker) PageSize() int { return t.ps }

// Len returns the number of blocks held.
func (t *Tracker) Len() int { return len(t.blocks) }

// Has reports whether the block is held.
func (t *Tracker) Has(hash uint64) bool { return t.blocks[hash] != nil }

func (t *Tracker) seq(id int64) *seqState {
	if id < 0 {
		return nil
	}
	for int64(len(t.seqs)) <= id {
		t.seqs = append(t.seqs, seqState{})
	}
	return &t.seqs[id]
}

// Track follows the events of one engine call or step, c being the prefix cache after it,
// and returns the changes of the block set in the order they happened. The changes' slices
// are the caller's.
func (t *Tracker) Track(c *prefix.Cache, evs []engine.Event) []Change {
	t.out = nil
	for _, ev := range evs {
		switch e := ev.(type) {
		case engine.PrefixMatched:
			t.matched(e)
		case engine.SeqEvicted:
			t.drop(e.Seq)
		case engine.SeqRemoved:
			t.drop(e.Seq)
		case engine.PrefixChanged:
			for i := range e.Upserts {
				n := &e.Upserts[i]
				for _, ref := range n.Seqs {
					s := t.seq(ref.ID)
					if s == nil || (s.held && s.length == n.Depth) {
						continue
					}
					t.grow(c, ref.ID, s, n.Depth)
				}
			}
		}
	}
	return t.out
}

// matched starts a sequence's state at prepare-receive: a new sequence holds nothing, a fork
// holds its parent's blocks up to the fork point, a reuse keeps its own up to the match (the
// rest was rolled back). The tokens past those come with the next PrefixChanged.
func (t *Tracker) matched(e engine.PrefixMatched) {
	s := t.seq(e.Seq)
	if s == nil {
		return
	}
	keep := e.Matched / t.ps
	switch e.Match {
	case prefix.Fresh:
		t.setTail(s, nil)
	case prefix.Fork:
		var tail *block
		if p := t.seq(e.Parent); p != nil && p.held {
			tail = ancestor(p.tail, min(keep, p.blocks()))
		}
		t.setTail(s, tail)
	case prefix.Reuse:
		if !s.held {
			t.setTail(s, nil)
			break
		}
		t.setTail(s, ancestor(s.tail, min(keep, s.blocks())))
	}
	s.held = true
	s.length = s.blocks() * t.ps
}

// ancestor returns the block of b's chain at depth d (nil for 0).
func ancestor(b *block, d int) *block {
	for b != nil && int(b.depth) > d {
		b = b.parent
	}
	return b
}

// drop forgets a sequence that left the cache.
func (t *Tracker) drop(id int64) {
	s := t.seq(id)
	if s == nil || !s.held {
		return
	}
	t.setTail(s, nil)
	*s = seqState{}
}

// grow brings a sequence to its committed length l, hashing the blocks it filled.
func (t *Tracker) grow(c *prefix.Cache, id int64, s *seqState, l int) {
	have := s.blocks()
	if !s.held || l < s.length {
		// Not seen start, or shorter without a roll-back event: rebuild it from its tokens.
		have = 0
	}
	want := l / t.ps
	if want > have {
		var ok bool
		t.toks, ok = c.AppendTokens(t.toks[:0], id, have*t.ps)
		if !ok || len(t.toks) < (want-have)*t.ps {
			panic(fmt.Sprintf("blocks: sequence %d: the prefix cache lists it at %d tokens but gives %d from %d", id, l, len(t.toks), have*t.ps))
		}
		tail := ancestor(s.tail, have)
		first := len(t.out)
		for k := range want - have {
			tail = t.store(tail, t.toks[k*t.ps:(k+1)*t.ps])
		}
		_ = first
		t.setTail(s, tail)
	} else if want < have {
		t.setTail(s, ancestor(s.tail, want))
	}
	s.held = true
	s.length = l
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
	b := &block{hash: h, parent: parent, depth: 1}
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
			last.Hashes = append(last.Hashes, b.hash)
			last.Tokens = append(last.Tokens, tokens...)
			return
		}
	}
	ch := Change{Kind: Stored, Hashes: []uint64{b.hash}, Tokens: append([]int32(nil), tokens...)}
	if b.parent != nil {
		ch.Parent, ch.HasParent = b.parent.hash, true
	}
	t.out = append(t.out, ch)
}

// setTail points a sequence at a new last block: the new one is held first, so the blocks
// both share never leave.
func (t *Tracker) setTail(s *seqState, b *block) {
	if s.tail == b {
		return
	}
	if b != nil {
		b.refs++
	}
	old := s.tail
	s.tail = b
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
		b = b.parent
	}
}

func (t *Tracker) removed(h uint64) {
	if n := len(t.out); n > 0 && t.out[n-1].Kind == Removed {
		t.out[n-1].Hashes = append(t.out[n-1].Hashes, h)
		return
	}
	t.out = append(t.out, Change{Kind: Removed, Hashes: []uint64{h}})
}

// Sync starts the tracker over from the prefix cache as it is: its changes are Cleared,
// then every block held, each chain once.
func (t *Tracker) Sync(c *prefix.Cache) []Change {
	t.seqs = t.seqs[:0]
	clear(t.blocks)
	t.out = []Change{{Kind: Cleared}}
	for _, n := range c.Nodes() {
		for _, ref := range n.Seqs {
			s := t.seq(ref.ID)
			t.grow(c, ref.ID, s, n.Depth)
		}
	}
	return t.out
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
