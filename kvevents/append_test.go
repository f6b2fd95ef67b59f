package kvevents

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
	"github.com/kvtop/kvtop/internal/lockstep"
)

// eventOf is a block change as vLLM's event: the mapping the publisher's encoder writes
// directly.
func eventOf(ch blocks.Change, ps int) Event {
	medium := MediumGPU
	hashes := func() []Hash {
		out := make([]Hash, len(ch.Hashes))
		for i, h := range ch.Hashes {
			out[i] = IntHash(h)
		}
		return out
	}
	switch ch.Kind {
	case blocks.Stored:
		ev := BlockStored{BlockHashes: hashes(), TokenIDs: make([]int64, len(ch.Tokens)), BlockSize: int64(ps), Medium: &medium}
		for i, t := range ch.Tokens {
			ev.TokenIDs[i] = int64(t)
		}
		if ch.HasParent {
			h := IntHash(ch.Parent)
			ev.ParentBlockHash = &h
		}
		return ev
	case blocks.Removed:
		return BlockRemoved{BlockHashes: hashes(), Medium: &medium}
	}
	return AllBlocksCleared{}
}

// checkAppend says whether the publisher's encoder writes a batch of changes byte for byte
// as Encode writes the same batch of events.
func checkAppend(t *testing.T, ts float64, chs []blocks.Change, ps int, rank int64) {
	t.Helper()
	for _, enc := range []Encoding{Map, Array} {
		b := Batch{TS: ts, DPRank: rank, HasDPRank: true}
		for _, ch := range chs {
			b.Events = append(b.Events, eventOf(ch, ps))
		}
		want, err := Encode(b, enc)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendBatch([]byte("left alone"), ts, chs, ps, rank, enc); !bytes.Equal(got[10:], want) || string(got[:10]) != "left alone" {
			t.Fatalf("%s: appendBatch(%v) =\n%x\nwant Encode's\n%x", enc, chs, got, want)
		}
	}
}

// The publisher's encoder writes what Encode writes: for every batch of a scenario, and for
// the edges of msgpack's integer and length forms.
func TestAppendBatchIsEncode(t *testing.T) {
	batches := 0
	var tr *blocks.Tracker
	_, err := lockstep.Run("chat", 7, 900, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		if tr == nil {
			tr = blocks.NewTracker(e.Config().PageSize)
			checkAppend(t, 0, tr.Sync(e.Prefix()), tr.PageSize(), 0)
			return
		}
		if chs := tr.Track(e.Prefix(), evs); len(chs) > 0 {
			batches++
			checkAppend(t, float64(evs[len(evs)-1].When().At)/1000, chs, tr.PageSize(), 3)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if batches < 50 {
		t.Fatalf("%d batches: the scenario should make more", batches)
	}
	ints := []int64{0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	var toks []int32
	var hashes []uint64
	for _, n := range ints {
		toks = append(toks, int32(n))
		hashes = append(hashes, uint64(n))
	}
	long := make([]int32, 70_000)
	for i := range long {
		long[i] = int32(i * 31)
	}
	for _, rank := range ints {
		checkAppend(t, -1.5, []blocks.Change{
			{Kind: blocks.Cleared},
			{Kind: blocks.Stored, Hashes: hashes, Tokens: toks},
			{Kind: blocks.Stored, Hashes: []uint64{math.MaxUint64}, Parent: math.MaxUint64 - 1, HasParent: true, Tokens: long[:16]},
			{Kind: blocks.Removed, Hashes: hashes[:15]},
		}, 1, rank)
	}
	checkAppend(t, math.Inf(1), []blocks.Change{{Kind: blocks.Stored, Hashes: []uint64{1}, Tokens: long}, {Kind: blocks.Removed, Hashes: make([]uint64, 65_536)}}, 70_000, 0)
	many := make([]blocks.Change, 17)
	for i := range many {
		many[i] = blocks.Change{Kind: blocks.Cleared}
	}
	checkAppend(t, 0, many, 16, 0)
}
