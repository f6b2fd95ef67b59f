package prepare

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kvtop/kvtop/engine/pages"
)

// benchFixture is a 65,536-page cache whose prefix cache holds a 1,536-token sequence; the
// benchmark's 2,048-token prompt shares its first 1,024 tokens.
func benchFixture(b *testing.B) (*fixture, []int32) {
	b.Helper()
	t := &testing.T{}
	f := newFixture(t, fixtureConfig{maxTotal: 65535 * 16, maxNumSeq: 256})
	if got := f.caches[0].NumPages(); got != 65536 {
		b.Fatalf("pages = %d, want 65536", got)
	}
	cached := make([]int32, 1536)
	for i := range cached {
		cached[i] = int32(i)
	}
	f.prep("cached", cached, -1)
	prompt := make([]int32, 2048)
	for i := range prompt {
		prompt[i] = int32(i)
		if i >= 1024 {
			prompt[i] = int32(50000 + i)
		}
	}
	return f, prompt
}

// BenchmarkPrepareReceive is one complete prepare-receive: admission, the prefix match of a
// 2,048-token prompt with a 1,024-token hit, the fork, the reservation of 1,024 slots, the
// metadata and its encoding, and the commit of the prefix-cache extension. Removing the
// request again (so that every op sees the same cache) is inside the timing: stopping the
// timer costs more than the removal.
func BenchmarkPrepareReceive(b *testing.B) {
	f, prompt := benchFixture(b)
	queue := []Request{{ID: "r", Prompt: prompt, End: -1, HasEnd: true}}
	b.ReportAllocs()
	for b.Loop() {
		out := f.step(0, queue)
		f.pc.CommitSequenceExtension()
		if len(out.Admitted) != 1 || out.Admitted[0].Matched != 1024 {
			b.Fatalf("admitted %d, want 1 with 1024 matched", len(out.Admitted))
		}
		seq := out.Admitted[0].Seq
		if err := f.pc.RemoveSequence(seq); err != nil {
			b.Fatal(err)
		}
		if err := f.caches[0].RemoveSequence(seq); err != nil {
			b.Fatal(err)
		}
		f.ids.Recycle(seq)
	}
}

// BenchmarkPromptPass is the least any prepare-receive must do: read the prompt's 2,048
// tokens once, comparing them with the cached ones. BenchmarkPrepareReceive is reported
// as a ratio to it.
func BenchmarkPromptPass(b *testing.B) {
	_, prompt := benchFixture(b)
	cached := make([]int32, len(prompt))
	copy(cached, prompt[:1024])
	n := 0
	for b.Loop() {
		n = 0
		for i := range prompt {
			if prompt[i] == cached[i] {
				n++
			}
		}
	}
	if n != 1024 {
		b.Fatalf("matched %d", n)
	}
}

// BenchmarkPromptEqual is the other floor under prepare-receive: the prompt's 2,048 tokens
// compared as 8 KB of memory in one bytes.Equal, the vectorised compare a CPU does best.
// PromptPass is a scalar loop, whose speed depends far more on the CPU, so
// BenchmarkPrepareReceive is reported as a ratio to both.
func BenchmarkPromptEqual(b *testing.B) {
	_, prompt := benchFixture(b)
	x := make([]byte, 4*len(prompt))
	for i, t := range prompt {
		binary.LittleEndian.PutUint32(x[4*i:], uint32(t))
	}
	y := bytes.Clone(x)
	eq := false
	for b.Loop() {
		eq = bytes.Equal(x, y)
	}
	if !eq {
		b.Fatal("a prompt differs from its copy")
	}
}

// BenchmarkReserveAppendCompress is the decode-time path: one sequence grows by a 16-token
// chunk per op and its slots are compressed into a reused buffer; the sequence is popped
// back every 64 ops so the cache stays in a steady state. It must not allocate.
func BenchmarkReserveAppendCompress(b *testing.B) {
	c, err := pages.New(pages.Config{PageSize: 16, NumPages: 4096})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.AddSequence(0); err != nil {
		b.Fatal(err)
	}
	slots := make([]int64, 0, 64)
	meta := make([]int64, 0, 64)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		slots, err = c.ReserveAppend(0, 16, slots[:0])
		if err != nil {
			b.Fatal(err)
		}
		meta = pages.Compress(meta[:0], slots)
		if i++; i%64 == 0 {
			if err := c.PopN(0, 64*16); err != nil {
				b.Fatal(err)
			}
		}
	}
	_ = meta
}
