package pages

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Store holds the KV payload of the pages: the bytes a prefill instance writes and attention
// reads. The host-memory Arena implements it; a store in GPU memory could too.
//
// A token's KV travels as TokenBytes bytes laid out [layer][K, V][kv_head][head_dim], fp16.
type Store interface {
	// TokenBytes returns the size of one token's KV; 0 for a store that keeps no payload.
	TokenBytes() int
	// WriteSlot stores one token's KV (TokenBytes bytes) into a slot.
	WriteSlot(slot int64, kv []byte)
	// ReadSlot appends the KV of a slot to dst.
	ReadSlot(slot int64, dst []byte) []byte
	// CopySlots copies the first n slots of page src into page dst: a mid-page fork's copy.
	CopySlots(dst, src int32, n int)
}

// Geometry is the shape of a model's KV: what one token's KV holds.
type Geometry struct {
	Layers  int `json:"layers"`
	KVHeads int `json:"kv_heads"`
	HeadDim int `json:"head_dim"`
}

// TokenBytes returns the bytes of one token's KV in fp16: layers × {K,V} × heads × dim × 2.
// It is only meaningful for a geometry ArenaSize accepts; for one whose size overflows it
// returns -1, never a wrapped-around number.
func (g Geometry) TokenBytes() int {
	n, ok := checkedProduct(g.Layers, 2, g.KVHeads, g.HeadDim, 2)
	if !ok || n > math.MaxInt {
		return -1
	}
	return int(n)
}

// Zero reports whether the geometry holds no payload: one of its dimensions is zero.
func (g Geometry) Zero() bool { return g.Layers == 0 || g.KVHeads == 0 || g.HeadDim == 0 }

// ErrArenaTooLarge is returned for an arena that would not fit the limit it was given.
var ErrArenaTooLarge = errors.New("pages: KV arena too large")

// Arena is a KV cache payload in host memory, laid out as a GPU paged KV cache is:
// layers × pages × {K, V} × kv_heads × page_size × head_dim, fp16 as raw bytes.
type Arena struct {
	g        Geometry
	numPages int
	pageSize int
	data     []byte
}

// ArenaBytes returns the size of an arena of the given shape, or -1 when it does not fit an
// int64 (or a dimension is negative): callers compare it with a limit, and -1 must not pass
// for a small arena, so use ArenaSize where the difference matters.
func ArenaBytes(g Geometry, numPages, pageSize int) int64 {
	n, err := ArenaSize(g, numPages, pageSize)
	if err != nil {
		return -1
	}
	return n
}

// ArenaSize returns the size of an arena of the given shape in bytes, computed without
// overflow: a shape larger than any host's memory (or than an int64) is ErrArenaTooLarge,
// one with a negative dimension ErrBadConfig.
func ArenaSize(g Geometry, numPages, pageSize int) (int64, error) {
	if g.Layers < 0 || g.KVHeads < 0 || g.HeadDim < 0 || numPages < 0 || pageSize < 0 {
		return 0, fmt.Errorf("pages: arena geometry %+v of %d pages of %d: negative dimension: %w", g, numPages, pageSize, ErrBadConfig)
	}
	n, ok := checkedProduct(g.Layers, 2, g.KVHeads, g.HeadDim, 2, numPages, pageSize)
	if !ok || n > maxArenaBytes {
		return 0, fmt.Errorf("pages: arena geometry %+v of %d pages of %d: over %d bytes, more than any host holds: %w", g, numPages, pageSize, int64(maxArenaBytes), ErrArenaTooLarge)
	}
	return n, nil
}

// maxArenaBytes is more memory than any host has: an allocation beyond it would panic, not
// fail.
const maxArenaBytes = 1 << 47

// checkedProduct multiplies non-negative factors and reports whether the product fits an
// int64.
func checkedProduct(factors ...int) (int64, bool) {
	p := uint64(1)
	for _, f := range factors {
		if f < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(p, uint64(f))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		p = lo
	}
	return int64(p), true
}

// NewArena allocates a zeroed arena, refusing one larger than limit bytes. A zero geometry
// gives an arena that keeps nothing.
func NewArena(g Geometry, numPages, pageSize int, limit int64) (*Arena, error) {
	if g.Layers < 0 || g.KVHeads < 0 || g.HeadDim < 0 {
		return nil, fmt.Errorf("pages: arena geometry %+v: negative dimension: %w", g, ErrBadConfig)
	}
	if g.Zero() {
		return &Arena{numPages: numPages, pageSize: pageSize}, nil
	}
	size, err := ArenaSize(g, numPages, pageSize)
	if err != nil {
		return nil, err
	}
	if size > limit {
		return nil, fmt.Errorf("pages: arena of %d bytes over the limit of %d: %w", size, limit, ErrArenaTooLarge)
	}
	return &Arena{g: g, numPages: numPages, pageSize: pageSize, data: make([]byte, size)}, nil
}

// Geometry returns the arena's shape.
func (a *Arena) Geometry() Geometry { return a.g }

// Bytes returns the arena's size.
func (a *Arena) Bytes() int64 { return int64(len(a.data)) }

// TokenBytes returns the size of one token's KV.
func (a *Arena) TokenBytes() int {
	if a.data == nil {
		return 0
	}
	return a.g.TokenBytes()
}

// offset returns where the head_dim row of (layer, kv, head) for page, in-page offset o lies.
func (a *Arena) offset(layer, kv, head int, page int32, o int) int {
	g := a.g
	return ((((layer*a.numPages+int(page))*2+kv)*g.KVHeads+head)*a.pageSize + o) * g.HeadDim * 2
}

// WriteSlot stores one token's KV into a slot, scattering it over layers, K/V and heads.
func (a *Arena) WriteSlot(slot int64, kv []byte) {
	if a.data == nil {
		return
	}
	page, o := int32(slot/int64(a.pageSize)), int(slot%int64(a.pageSize))
	row := a.g.HeadDim * 2
	src := 0
	for l := range a.g.Layers {
		for k := range 2 {
			for h := range a.g.KVHeads {
				off := a.offset(l, k, h, page, o)
				copy(a.data[off:off+row], kv[src:src+row])
				src += row
			}
		}
	}
}

// ReadSlot appends a slot's KV to dst, in the order WriteSlot takes it.
func (a *Arena) ReadSlot(slot int64, dst []byte) []byte {
	if a.data == nil {
		return dst
	}
	page, o := int32(slot/int64(a.pageSize)), int(slot%int64(a.pageSize))
	row := a.g.HeadDim * 2
	for l := range a.g.Layers {
		for k := range 2 {
			for h := range a.g.KVHeads {
				off := a.offset(l, k, h, page, o)
				dst = append(dst, a.data[off:off+row]...)
			}
		}
	}
	return dst
}

// CopySlots copies the first n slots of page src into page dst, for every layer, K and V and
// head: n × head_dim contiguous values each.
func (a *Arena) CopySlots(dst, src int32, n int) {
	if a.data == nil {
		return
	}
	span := n * a.g.HeadDim * 2
	for l := range a.g.Layers {
		for k := range 2 {
			for h := range a.g.KVHeads {
				d, s := a.offset(l, k, h, dst, 0), a.offset(l, k, h, src, 0)
				copy(a.data[d:d+span], a.data[s:s+span])
			}
		}
	}
}

// nopStore keeps no payload.
type nopStore struct{}

func (nopStore) TokenBytes() int                     { return 0 }
func (nopStore) WriteSlot(int64, []byte)             {}
func (nopStore) ReadSlot(_ int64, dst []byte) []byte { return dst }
func (nopStore) CopySlots(dst, src int32, n int)     {}
