package prefix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// The benchmark set: 10,000 cached sequences of 512 to 4,096 tokens (uniform), each one of
// 8 system prompts (256 to 1,024 tokens, uniform) followed by its own tokens (at least 64),
// token ids uniform in [0, 32000). Seeded, so every run builds the same set.
const (
	benchSeqs    = 10_000
	benchPrompts = 8
	benchQuery   = 2_500
	benchVocab   = 32_000
)

type benchData struct {
	seqs    [][]int32
	own     []int // where each sequence's own tokens start
	prompts [][]int32
	cache   *Cache
	heapMB  float64 // the cache's heap, measured once
	spanMB  float64 // the token bytes on the tree's edges: the floor for any token-keyed tree
	returns [][]int32
	shared  [][]int32
}

var (
	benchOnce sync.Once
	bench     *benchData
)

func benchTokens(rng *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = rng.Int32N(benchVocab)
	}
	return out
}

func loadBench() *benchData {
	benchOnce.Do(func() {
		rng := rand.New(rand.NewPCG(42, 1))
		d := &benchData{}
		for range benchPrompts {
			d.prompts = append(d.prompts, benchTokens(rng, 256+rng.IntN(1024-256+1)))
		}
		for range benchSeqs {
			p := d.prompts[rng.IntN(benchPrompts)]
			l := 512 + rng.IntN(4096-512+1)
			d.seqs = append(d.seqs, cat(p, benchTokens(rng, max(l-len(p), 64))))
			d.own = append(d.own, len(p))
		}
		// Queries: a returning conversation (a cached sequence's first 2,500 tokens, or all of
		// it and new tokens up to 2,500), and a new conversation on a known system prompt.
		for range 1024 {
			s := d.seqs[rng.IntN(benchSeqs)]
			q := cat(s[:min(len(s), benchQuery)], benchTokens(rng, max(benchQuery-len(s), 0)))
			d.returns = append(d.returns, q)
			p := d.prompts[rng.IntN(benchPrompts)]
			d.shared = append(d.shared, cat(p, benchTokens(rng, benchQuery-len(p))))
		}
		before := heapAlloc()
		d.cache = buildBench(d.seqs)
		d.heapMB = float64(heapAlloc()-before) / 1e6
		for _, n := range d.cache.Nodes() {
			d.spanMB += float64(4*n.Span) / 1e6
		}
		bench = d
	})
	return bench
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// buildBench caches seqs as the engine does: insert, queue the extension, commit.
func buildBench(seqs [][]int32) *Cache {
	c := New(Config{MaxRecycling: -1})
	for i, s := range seqs {
		id := int64(i)
		res, err := c.InsertSequence(id, s, NoWindow)
		if err != nil {
			panic(err)
		}
		if res.Kind == Reuse {
			id = res.Parent
		}
		c.ExtendSequence(id, s[res.Offset:])
		c.CommitSequenceExtension()
	}
	return c
}

// BenchmarkMatch: one lookup of a returning conversation (about 2,500 tokens matched, one
// candidate or a few).
func BenchmarkMatch(b *testing.B) {
	d := loadBench()
	for i := 0; b.Loop(); i++ {
		d.cache.Match(d.returns[i%len(d.returns)])
	}
}

// BenchmarkMatchShared: one lookup of a new conversation on a known system prompt: the match
// stops at the prompt's node and Match lists its ~1,250 candidates.
func BenchmarkMatchShared(b *testing.B) {
	d := loadBench()
	for i := 0; b.Loop(); i++ {
		d.cache.Match(d.shared[i%len(d.shared)])
	}
}

// BenchmarkInsert builds the whole set per iteration and reports the cost per sequence
// (InsertSequence + ExtendSequence + CommitSequenceExtension), the cache's heap for the set,
// and the token bytes on its edges.
func BenchmarkInsert(b *testing.B) {
	d := loadBench()
	for b.Loop() {
		buildBench(d.seqs)
	}
	b.ReportMetric(d.heapMB, "MB-heap")
	b.ReportMetric(d.spanMB, "MB-tokens")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchSeqs), "ns/seq")
}

// naive is the baseline: every sequence's tokens, and a scan of them all per lookup.
type naive [][]int32

func (n naive) match(q []int32) (int, []int) {
	m := 0
	var cands []int
	for i, s := range n {
		l := lcp(s, q)
		if l > m {
			m, cands = l, cands[:0]
		}
		if l == m && m > 0 {
			cands = append(cands, i)
		}
	}
	return m, cands
}

// BenchmarkMatchNaive is BenchmarkMatch on the naive baseline (a copy of every sequence,
// scanned with the same lcp), for the ratio.
func BenchmarkMatchNaive(b *testing.B) {
	d := loadBench()
	before := heapAlloc()
	n := make(naive, len(d.seqs))
	for i, s := range d.seqs {
		n[i] = append([]int32(nil), s...)
	}
	heapMB := float64(heapAlloc()-before) / 1e6
	for i := 0; b.Loop(); i++ {
		n.match(d.returns[i%len(d.returns)])
	}
	b.ReportMetric(heapMB, "MB-heap")
	runtime.KeepAlive(n)
}

// BenchmarkInsertCopyOnly is the floor under BenchmarkInsert: it only makes the copy of each
// sequence's own tokens that ExtendSequence must make (the set's data is cold, as it is for
// BenchmarkInsert).
func BenchmarkInsertCopyOnly(b *testing.B) {
	d := loadBench()
	keep := make([][]int32, len(d.seqs))
	for b.Loop() {
		for i, s := range d.seqs {
			keep[i] = append([]int32(nil), s[d.own[i]:]...)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchSeqs), "ns/seq")
}

// BenchmarkDecode is what a decode step costs the cache: each of n active sequences (one of
// 8 system prompts of 256 to 1,024 tokens, then 64 to 512 tokens of its own, so that each
// ends alone on a leaf's last page) is extended by one token, and the extensions are
// committed, as the engine does after every step. ns/ext is the cost of one committed
// one-token extension. Every 2,048 steps the set is built again, off the clock, so that the
// sequences stay near their starting lengths.
func BenchmarkDecode(b *testing.B) {
	for _, n := range []int{16, 256} {
		b.Run(fmt.Sprintf("active=%d", n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(7, uint64(n)))
			prompts := make([][]int32, benchPrompts)
			for i := range prompts {
				prompts[i] = benchTokens(rng, 256+rng.IntN(1024-256+1))
			}
			seqs := make([][]int32, n)
			for i := range seqs {
				seqs[i] = cat(prompts[rng.IntN(benchPrompts)], benchTokens(rng, 64+rng.IntN(512-64+1)))
			}
			next := benchTokens(rng, 4096)
			const rebuild = 2048
			var c *Cache
			for step := 0; b.Loop(); step++ {
				if step%rebuild == 0 {
					b.StopTimer()
					c = buildBench(seqs)
					b.StartTimer()
				}
				for id := range n {
					k := (step*n + id) % len(next)
					c.ExtendSequence(int64(id), next[k:k+1])
				}
				c.CommitSequenceExtension()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/ext")
		})
	}
}

// BenchmarkTurnover is the rest of a step's cost to the cache: one request finishes
// (RecycleSequence; at the cap of 1,024 recycling sequences it first evicts one) and one
// arrives (InsertSequence of a shared 256-token system prompt and 200 tokens of its own, a
// fork from the prompt, then the extension of its own tokens, committed), among 256 active
// sequences, under either eviction order. The prompt's node has about 1,280 children.
func BenchmarkTurnover(b *testing.B) {
	for _, order := range []EvictOrder{EvictMLC, EvictLRU} {
		b.Run("order="+order.String(), func(b *testing.B) {
			const active, own = 256, 200
			rng := rand.New(rand.NewPCG(9, 9))
			prompt := benchTokens(rng, 256)
			pool := benchTokens(rng, 1<<16)
			c := New(Config{MaxRecycling: 1024, Evict: order})
			var live []int64 // oldest first
			next := int64(0)
			turn := func() {
				if len(live) == active {
					if err := c.RecycleSequence(live[0]); err != nil {
						b.Fatal(err)
					}
					live = live[1:]
				}
				k := int(next*own) % (len(pool) - own)
				s := cat(prompt, pool[k:k+own])
				res, err := c.InsertSequence(next, s, NoWindow)
				if err != nil {
					b.Fatal(err)
				}
				id := next
				if res.Kind == Reuse {
					id = res.Parent
				}
				c.ExtendSequence(id, s[res.Offset:])
				c.CommitSequenceExtension()
				live = append(live, id)
				next++
			}
			for range 2 * (1024 + active) {
				turn()
			}
			for b.Loop() {
				turn()
			}
		})
	}
}
