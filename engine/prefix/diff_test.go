package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestDifferential runs thousands of random operation sequences on a Cache and on refCache,
// a plain transcription of MLC's radix tree and prefix cache checked against brute force, and
// compares results, held sets, states, lengths, the page layout, recycling order, stats,
// OnEvict calls, tree invariants and TakeChanges after every operation. The configuration
// comes from the data: both eviction orders, MLC's 64-token pages and small ones.
func TestDifferential(t *testing.T) {
	runs, size := 3000, 300
	if testing.Short() {
		runs = 300
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range runs {
		data := make([]byte, 1+rng.IntN(size))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		runOps(t, data)
	}
}

// FuzzOps decodes random bytes into a configuration and operations (see runOps) and checks
// the Cache against refCache after each. As an ordinary test it runs testdata/fuzz/FuzzOps.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 12, 1, 0, 1, 2, 0, 1, 2, 0, 1, 2, 5, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		runOps(t, data)
	})
}
