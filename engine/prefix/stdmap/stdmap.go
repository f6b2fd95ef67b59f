package stdmap

import (
	"iter"
	"slices"
)

// fastBuckets answers libstdc++'s bucket-count requests below 14 without a search.
var fastBuckets = [14]uint64{2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13}

// primes is the start of libstdc++'s __prime_list, the bucket counts it grows through, up
// to the largest below 2^32. Requests from 14 up search it from its seventh entry.
var primes = []uint64{
	2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89,
	97, 103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277,
	293, 313, 337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953,
	1031, 1109, 1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971,
	3209, 3469, 3739, 4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497,
	10273, 11113, 12011, 12983, 14033, 15173, 16411, 17749, 19183, 20753, 22447, 24281, 26267,
	28411, 30727, 33223, 35933, 38873, 42043, 45481, 49201, 53201, 57557, 62233, 67307, 72817,
	78779, 85229, 92203, 99733, 107897, 116731, 126271, 136607, 147793, 159871, 172933, 187091,
	202409, 218971, 236897, 256279, 277261, 299951, 324503, 351061, 379787, 410857, 444487,
	480881, 520241, 562841, 608903, 658753, 712697, 771049, 834181, 902483, 976369, 1056323,
	1142821, 1236397, 1337629, 1447153, 1565659, 1693859, 1832561, 1982627, 2144977, 2320627,
	2510653, 2716249, 2938679, 3179303, 3439651, 3721303, 4026031, 4355707, 4712381, 5098259,
	5515729, 5967347, 6456007, 6984629, 7556579, 8175383, 8844859, 9569143, 10352717, 11200489,
	12117689, 13109983, 14183539, 15345007, 16601593, 17961079, 19431899, 21023161, 22744717,
	24607243, 26622317, 28802401, 31160981, 33712729, 36473443, 39460231, 42691603, 46187573,
	49969847, 54061849, 58488943, 63278561, 68460391, 74066549, 80131819, 86693767, 93793069,
	101473717, 109783337, 118773397, 128499677, 139022417, 150406843, 162723577, 176048909,
	190465427, 206062531, 222936881, 241193053, 260944219, 282312799, 305431229, 330442829,
	357502601, 386778277, 418451333, 452718089, 489790921, 529899637, 573292817, 620239453,
	671030513, 725980837, 785430967, 849749479, 919334987, 994618837, 1076067617, 1164186217,
	1259520799, 1362662261, 1474249943, 1594975441, 1725587117, 1866894511, 2019773507,
	2185171673, 2364114217, 2557710269, 2767159799, 2993761039, 3238918481, 3504151727,
	3791104843, 4101556399, 4294967291,
}

// Map is a map from uint64 keys to int64 values that iterates as libstdc++'s
// std::unordered_map<size_t, int64_t> does. The zero value is an empty map with one bucket,
// as a default-constructed std::unordered_map.
type Map struct {
	// nodes is the node pool; index 0 is not a node, so that 0 means none and the zero Map
	// needs no set-up.
	nodes []node
	free  int32 // a free node of the pool, chained through next; 0 when none
	head  int32 // the first node in iteration order
	// buckets holds, per bucket, the first node of its run on the list. nil is one bucket.
	buckets []int32
	index   map[uint64]int32
	size    int
	// nextResize is libstdc++'s _M_next_resize: the element count past which an insertion
	// asks the policy for more buckets. 0 means nothing was ever allocated.
	nextResize uint64
}

type node struct {
	key        uint64
	val        int64
	prev, next int32
}

// Len returns the number of entries.
func (m *Map) Len() int { return m.size }

// BucketCount returns the number of buckets libstdc++'s table would have (bucket_count()).
func (m *Map) BucketCount() int { return max(len(m.buckets), 1) }

// Front returns the entry at begin(), the first in iteration order; ok is false when the map
// is empty.
func (m *Map) Front() (key uint64, val int64, ok bool) {
	if m.head == 0 {
		return 0, 0, false
	}
	n := &m.nodes[m.head]
	return n.key, n.val, true
}

// Get returns the value of key.
func (m *Map) Get(key uint64) (val int64, ok bool) {
	x, ok := m.index[key]
	if !ok {
		return 0, false
	}
	return m.nodes[x].val, true
}

// All yields the entries in iteration order. The map must not change during the iteration.
func (m *Map) All() iter.Seq2[uint64, int64] {
	return func(yield func(uint64, int64) bool) {
		for x := m.head; x != 0; x = m.nodes[x].next {
			if !yield(m.nodes[x].key, m.nodes[x].val) {
				return
			}
		}
	}
}

// Insert adds key with val, as emplace does: it reports false, and changes nothing, when key
// is present already.
func (m *Map) Insert(key uint64, val int64) bool {
	if _, ok := m.index[key]; ok {
		return false
	}
	if m.index == nil {
		m.index = make(map[uint64]int32)
		m.nodes = make([]node, 1, 16)
	}
	if grow, n := m.needRehash(); grow {
		m.rehash(n)
	}
	x := m.free
	if x != 0 {
		m.free = m.nodes[x].next
	} else {
		m.nodes = append(m.nodes, node{})
		x = int32(len(m.nodes) - 1)
	}
	m.nodes[x] = node{key: key, val: val}
	m.link(x, m.buckets)
	m.index[key] = x
	m.size++
	return true
}

// link puts node x on the list by libstdc++'s rule for the bucket array b: at the front of
// its bucket's run, or at the front of the list when the bucket is empty.
func (m *Map) link(x int32, b []int32) {
	n := &m.nodes[x]
	k := n.key % uint64(len(b))
	if f := b[k]; f != 0 {
		p := m.nodes[f].prev
		n.prev, n.next = p, f
		m.nodes[f].prev = x
		if p != 0 {
			m.nodes[p].next = x
		} else {
			m.head = x
		}
	} else {
		n.prev, n.next = 0, m.head
		if m.head != 0 {
			m.nodes[m.head].prev = x
		}
		m.head = x
	}
	b[k] = x
}

// Erase removes key and reports whether it was there. Nothing else moves.
func (m *Map) Erase(key uint64) bool {
	x, ok := m.index[key]
	if !ok {
		return false
	}
	delete(m.index, key)
	n := m.nodes[x]
	nb := uint64(len(m.buckets))
	if k := key % nb; m.buckets[k] == x {
		if n.next != 0 && m.nodes[n.next].key%nb == k {
			m.buckets[k] = n.next
		} else {
			m.buckets[k] = 0
		}
	}
	if n.prev != 0 {
		m.nodes[n.prev].next = n.next
	} else {
		m.head = n.next
	}
	if n.next != 0 {
		m.nodes[n.next].prev = n.prev
	}
	m.nodes[x] = node{next: m.free}
	m.free = x
	m.size--
	return true
}

// needRehash is libstdc++'s _Prime_rehash_policy::_M_need_rehash for one insertion at load
// factor 1.
func (m *Map) needRehash() (bool, uint64) {
	want := uint64(m.size) + 1
	if want <= m.nextResize {
		return false, 0
	}
	if m.nextResize == 0 {
		want = max(want, 11) // the first allocation asks for 11 buckets at least
	}
	nb := uint64(m.BucketCount())
	if want >= nb {
		return true, m.nextBucketCount(max(want+1, 2*nb))
	}
	m.nextResize = nb
	return false, 0
}

// nextBucketCount is libstdc++'s _Prime_rehash_policy::_M_next_bkt at load factor 1: the
// bucket count for a request of n, noting when the table must grow again.
func (m *Map) nextBucketCount(n uint64) uint64 {
	if n < uint64(len(fastBuckets)) {
		m.nextResize = fastBuckets[n]
		return fastBuckets[n]
	}
	i, _ := slices.BinarySearch(primes[6:], n)
	if 6+i >= len(primes) {
		panic("stdmap: more buckets than emulated")
	}
	m.nextResize = primes[6+i]
	return primes[6+i]
}

// rehash moves every node into n buckets, walking the list in its order and linking each
// node by the insertion rule.
func (m *Map) rehash(n uint64) {
	b := make([]int32, n)
	x := m.head
	m.head = 0
	for x != 0 {
		next := m.nodes[x].next
		m.link(x, b)
		x = next
	}
	m.buckets = b
}
