package stdmap

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/internal/vectors"
)

func keys(m *Map) []uint64 {
	var out []uint64
	for k := range m.All() {
		out = append(out, k)
	}
	return out
}

// describe writes the map as unordered_map.txt does: the keys in iteration order, then the
// bucket count.
func describe(m *Map) string {
	var b strings.Builder
	for k := range m.All() {
		fmt.Fprintf(&b, "%d ", k)
	}
	fmt.Fprintf(&b, "| buckets %d", m.BucketCount())
	return b.String()
}

// TestUnorderedMapVectors replays unordered_map.txt, recorded from libstdc++ (GCC 12), line
// by line: after every insert, evict (erase begin()) and erase, the iteration order and the
// bucket count must be libstdc++'s.
func TestUnorderedMapVectors(t *testing.T) {
	scripts, err := vectors.Load("unordered_map.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range scripts {
		var m Map
		for _, op := range s.Ops {
			if len(op.Args) != 1 {
				t.Fatalf("%s, %s: want one key", s.Header, op)
			}
			k, err := strconv.ParseUint(op.Args[0], 10, 64)
			if err != nil {
				t.Fatalf("%s, %s: %v", s.Header, op, err)
			}
			switch op.Name {
			case "insert":
				if !m.Insert(k, int64(k)) {
					t.Fatalf("%s, %s: Insert(%d) = false", s.Header, op, k)
				}
			case "evict":
				if got, _, ok := m.Front(); !ok || got != k {
					t.Fatalf("%s, %s: Front() = %d, %v, want %d", s.Header, op, got, ok, k)
				}
				m.Erase(k)
			case "erase":
				if !m.Erase(k) {
					t.Fatalf("%s, %s: Erase(%d) = false", s.Header, op, k)
				}
			default:
				t.Fatalf("%s, %s: unknown operation", s.Header, op)
			}
			want := strings.Join(strings.Fields(op.Answer), " ")
			if got := strings.TrimSpace(describe(&m)); got != want {
				t.Fatalf("%s, %s: map = %s, want %s", s.Header, op, got, want)
			}
			n++
		}
	}
	t.Logf("unordered_map.txt: %d scripts, %d answers agree", len(scripts), n)
}

// The bucket count grows as libstdc++'s prime rehash policy grows it at load factor 1:
// 13 at the first insertion, then, when an insertion would pass the count, the first prime
// of its table at least twice the count.
func TestBucketGrowth(t *testing.T) {
	var m Map
	if got := m.BucketCount(); got != 1 {
		t.Errorf("empty Map: BucketCount() = %d, want 1", got)
	}
	want := 13
	for i := uint64(1); i <= 6000; i++ {
		m.Insert(i, 0)
		if m.Len() > want {
			want = int(primes[6+firstAtLeast(primes[6:], uint64(2*want))])
		}
		if got := m.BucketCount(); got != want {
			t.Fatalf("after %d insertions: BucketCount() = %d, want %d", i, got, want)
		}
	}
	if want != 10273 {
		t.Errorf("6000 entries: %d buckets, want 10273 (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273)", want)
	}
	for i := uint64(1); i <= 6000; i++ {
		m.Erase(i)
	}
	if got := m.BucketCount(); got != want || m.Len() != 0 {
		t.Errorf("after erasing everything: BucketCount() = %d, Len() = %d, want %d, 0 (it never shrinks)", got, m.Len(), want)
	}
}

func firstAtLeast(xs []uint64, n uint64) int {
	for i, x := range xs {
		if x >= n {
			return i
		}
	}
	return len(xs)
}

// naive is a deliberately simple model of the layout: the iteration order as a plain slice,
// with the bucket count taken from the Map under test. Inserting scans for the bucket's first
// node; growing replays the old order into an empty list.
type naive struct {
	order   []uint64
	buckets uint64
}

func (n *naive) put(k uint64) {
	for i, x := range n.order {
		if x%n.buckets == k%n.buckets {
			n.order = slices.Insert(n.order, i, k)
			return
		}
	}
	n.order = slices.Insert(n.order, 0, k)
}

func (n *naive) insert(k uint64, buckets int) {
	if uint64(buckets) != n.buckets {
		old := n.order
		n.order, n.buckets = nil, uint64(buckets)
		for _, x := range old {
			n.put(x)
		}
	}
	n.put(k)
}

func (n *naive) erase(k uint64) {
	if i := slices.Index(n.order, k); i >= 0 {
		n.order = slices.Delete(n.order, i, i+1)
	}
}

// TestAgainstNaiveModel runs random inserts of growing keys (as MLC's counter makes them),
// evictions of the front and erasures of random keys on a Map and on the naive model, and
// compares the orders after each.
func TestAgainstNaiveModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for run := range 200 {
		var m Map
		n := &naive{}
		next := uint64(1)
		target := 1 + rng.IntN(150)
		for op := range 600 {
			switch r := rng.IntN(10); {
			case r < 5 || m.Len() < target/2:
				next += uint64(1 + rng.IntN(3))
				m.Insert(next, int64(-next))
				n.insert(next, m.BucketCount())
			case r < 7:
				k, v, ok := m.Front()
				if ok && v != -int64(k) {
					t.Fatalf("run %d op %d: Front() = %d, %d: value lost", run, op, k, v)
				}
				m.Erase(k)
				n.erase(k)
			default:
				if len(n.order) > 0 {
					k := n.order[rng.IntN(len(n.order))]
					if v, ok := m.Get(k); !ok || v != -int64(k) {
						t.Fatalf("run %d op %d: Get(%d) = %d, %v", run, op, k, v, ok)
					}
					m.Erase(k)
					n.erase(k)
				}
			}
			if got := keys(&m); !slices.Equal(got, n.order) || m.Len() != len(n.order) {
				t.Fatalf("run %d op %d: order %v (Len %d), want %v", run, op, got, m.Len(), n.order)
			}
		}
	}
}

func TestInsertExistingAndEraseMissing(t *testing.T) {
	var m Map
	if m.Erase(3) {
		t.Errorf("empty Map: Erase(3) = true")
	}
	if _, _, ok := m.Front(); ok {
		t.Errorf("empty Map: Front() ok")
	}
	m.Insert(3, 30)
	m.Insert(16, 160) // 16 mod 13 = 3: the front of bucket 3's run
	if m.Insert(3, 31) {
		t.Errorf("Insert(3) again = true")
	}
	if v, _ := m.Get(3); v != 30 {
		t.Errorf("Get(3) = %d, want 30: a second Insert must not overwrite", v)
	}
	if got := keys(&m); !slices.Equal(got, []uint64{16, 3}) {
		t.Errorf("order = %v, want [16 3]", got)
	}
	m.Insert(4, 40) // an empty bucket: the front of the list
	if got := keys(&m); !slices.Equal(got, []uint64{4, 16, 3}) {
		t.Errorf("order = %v, want [4 16 3]", got)
	}
	if !m.Erase(16) || m.Erase(16) {
		t.Errorf("Erase(16) twice did not answer true, false")
	}
	m.Insert(29, 290) // bucket 3 again, whose run now starts with 3
	if got := keys(&m); !slices.Equal(got, []uint64{4, 29, 3}) {
		t.Errorf("order = %v, want [4 29 3]", got)
	}
}

// BenchmarkRecycleEvict is the prefix cache's use at a steady state of 64 recycling
// sequences: one recycle (Insert of the next counter) and one eviction (Front, Erase).
func BenchmarkRecycleEvict(b *testing.B) {
	var m Map
	next := uint64(0)
	for range 64 {
		next++
		m.Insert(next, int64(next))
	}
	for b.Loop() {
		next++
		m.Insert(next, int64(next))
		k, _, _ := m.Front()
		m.Erase(k)
	}
}

// BenchmarkReuseErase is a reuse at a steady state of 1,024 recycling sequences: an Erase of
// a key that is not at the front (the oldest), and the recycle that follows.
func BenchmarkReuseErase(b *testing.B) {
	var m Map
	next := uint64(0)
	for range 1024 {
		next++
		m.Insert(next, int64(next))
	}
	for b.Loop() {
		m.Erase(next - 1023)
		next++
		m.Insert(next, int64(next))
	}
}
