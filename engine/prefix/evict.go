package prefix

import (
	"fmt"

	"github.com/kvtop/kvtop/engine/prefix/stdmap"
)

// EvictOrder says which recycling sequence TryFreeMemory evicts.
type EvictOrder uint8

const (
	// EvictMLC evicts the sequence MLC evicts: every RecycleSequence stamps the sequence with
	// the next value of a counter (1, 2, 3, …) and stores stamp → sequence in a libstdc++
	// std::unordered_map<size_t, int64_t>, and TryFreeMemory evicts the entry at its begin()
	// (see package stdmap). That is usually the most recently recycled sequence, although
	// MLC's comment promises the oldest. The default.
	EvictMLC EvictOrder = iota
	// EvictLRU evicts the least recently recycled sequence: what MLC's comment promises.
	EvictLRU
)

func (o EvictOrder) String() string {
	switch o {
	case EvictMLC:
		return "mlc"
	case EvictLRU:
		return "lru"
	}
	return fmt.Sprintf("EvictOrder(%d)", uint8(o))
}

// MarshalText writes the order's name.
func (o EvictOrder) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an order's name: "mlc" or "lru".
func (o *EvictOrder) UnmarshalText(b []byte) error {
	for _, c := range []EvictOrder{EvictMLC, EvictLRU} {
		if c.String() == string(b) {
			*o = c
			return nil
		}
	}
	return fmt.Errorf("prefix: unknown eviction order %q", b)
}

// Eviction is what OnEvict is told about a sequence the cache dropped.
type Eviction struct {
	Seq int64 `json:"seq"`
	// Recycled is the sequence's recycle stamp: the value of the cache's recycle counter
	// when it was recycled (1 for the first RecycleSequence of the cache's life). It is 0
	// for a sequence removed as it was recycled (MaxRecycling 0), which was never kept.
	Recycled uint64 `json:"recycled"`
	// Oldest is the least recently recycled sequence still held after the eviction, -1 if
	// none, and OldestRecycled its stamp (0 if none).
	Oldest         int64  `json:"oldest"`
	OldestRecycled uint64 `json:"oldest_recycled"`
}

// OlderKept reports whether a sequence recycled before the evicted one stayed: the victim
// was not the least recently recycled, as MLC's order often has it.
func (e Eviction) OlderKept() bool { return e.Oldest >= 0 && e.OldestRecycled < e.Recycled }

func (e Eviction) String() string {
	s := fmt.Sprintf("evicted %d (recycled #%d)", e.Seq, e.Recycled)
	if e.OlderKept() {
		s += fmt.Sprintf(", %d recycled earlier (#%d) stays", e.Oldest, e.OldestRecycled)
	}
	return s
}

// recycling is the Cache's bookkeeping of its recycling sequences: the stamps, the list in
// stamp order (for EvictLRU, and for Eviction.Oldest under either order) and, under
// EvictMLC, the emulated map whose front is MLC's victim.
type recycling struct {
	order      EvictOrder
	counter    uint64 // MLC's lru_counter_: the last stamp given
	head, tail *entry // least recently recycled first
	n          int
	mlc        stdmap.Map // stamp → sequence, EvictMLC only
}

// add stamps e and files it as the most recently recycled.
func (r *recycling) add(e *entry) {
	r.counter++
	e.stamp = r.counter
	e.prev, e.next = r.tail, nil
	if r.tail != nil {
		r.tail.next = e
	} else {
		r.head = e
	}
	r.tail = e
	r.n++
	if r.order == EvictMLC {
		r.mlc.Insert(e.stamp, e.id)
	}
}

// drop takes e out, as a reuse or a removal does.
func (r *recycling) drop(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		r.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		r.tail = e.prev
	}
	e.prev, e.next = nil, nil
	r.n--
	if r.order == EvictMLC {
		r.mlc.Erase(e.stamp)
	}
	e.stamp = 0
}

// victim returns the id of the sequence the order evicts next; there must be one.
func (r *recycling) victim() int64 {
	if r.order == EvictMLC {
		_, id, _ := r.mlc.Front()
		return id
	}
	return r.head.id
}

// oldest returns the least recently recycled sequence and its stamp, or -1, 0.
func (r *recycling) oldest() (int64, uint64) {
	if r.head == nil {
		return -1, 0
	}
	return r.head.id, r.head.stamp
}

// appendIDs appends the recycling sequences in eviction order, the next victim first.
func (r *recycling) appendIDs(dst []int64) []int64 {
	if r.order == EvictMLC {
		for _, id := range r.mlc.All() {
			dst = append(dst, id)
		}
		return dst
	}
	for e := r.head; e != nil; e = e.next {
		dst = append(dst, e.id)
	}
	return dst
}
