package sim

import (
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

var genTrace = flag.Bool("gentrace", false, "regenerate testdata/small_trace.jsonl")

// TestGenerateSmallTrace writes the excerpt-sized trace the tests use: our own, in the
// Mooncake format, with conversations that re-send their earlier blocks. (The real trace is
// not ours to copy.)
func TestGenerateSmallTrace(t *testing.T) {
	if !*genTrace {
		t.Skip("run with -gentrace to regenerate testdata/small_trace.jsonl")
	}
	r := rand.New(rand.NewPCG(42, 42))
	next := int64(0)
	newBlock := func() int64 { next++; return next - 1 }
	system := []int64{newBlock(), newBlock()}
	type conv struct{ blocks []int64 }
	var convs []*conv
	f, err := os.Create(filepath.Join("testdata", "small_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	ts := int64(0)
	for range 60 {
		ts += int64(r.IntN(2000))
		var c *conv
		if len(convs) > 0 && r.IntN(3) > 0 {
			c = convs[r.IntN(len(convs))]
		} else {
			c = &conv{blocks: append([]int64(nil), system[:1+r.IntN(2)]...)}
			convs = append(convs, c)
		}
		for range 1 + r.IntN(3) {
			c.blocks = append(c.blocks, newBlock())
		}
		if len(c.blocks) > 16 {
			c.blocks = c.blocks[:16]
		}
		n := len(c.blocks)
		rec := TraceRecord{Timestamp: ts, InputLength: (n-1)*TraceBlock + 1 + r.IntN(TraceBlock), OutputLength: 20 + r.IntN(180), HashIDs: append([]int64(nil), c.blocks...)}
		if err := enc.Encode(rec); err != nil {
			t.Fatal(err)
		}
	}
}
