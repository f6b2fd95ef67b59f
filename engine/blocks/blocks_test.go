package blocks_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
	"github.com/kvtop/kvtop/internal/lockstep"
)

// replica is what a consumer of the changes knows: the blocks, rebuilt from the changes in
// order, as a strict consumer would (a block stored twice, or removed unknown, is an error).
type replica map[uint64]blocks.Block

func (r replica) apply(chs []blocks.Change, ps int) error {
	for _, ch := range chs {
		switch ch.Kind {
		case blocks.Cleared:
			clear(r)
		case blocks.Stored:
			if len(ch.Tokens) != len(ch.Hashes)*ps {
				return fmt.Errorf("%v: %d tokens for %d blocks of %d", ch, len(ch.Tokens), len(ch.Hashes), ps)
			}
			parent, has := ch.Parent, ch.HasParent
			if has && r[parent].Hash != parent {
				return fmt.Errorf("%v: parent %016x is not held", ch, parent)
			}
			for i, h := range ch.Hashes {
				if _, dup := r[h]; dup {
					return fmt.Errorf("%v: block %016x stored twice", ch, h)
				}
				r[h] = blocks.Block{Hash: h, Parent: parent, HasParent: has, Tokens: ch.Tokens[i*ps : (i+1)*ps]}
				parent, has = h, true
			}
		case blocks.Removed:
			for _, h := range ch.Hashes {
				if _, ok := r[h]; !ok {
					return fmt.Errorf("%v: block %016x removed but not held", ch, h)
				}
				delete(r, h)
			}
		}
	}
	return nil
}

// diff says how the replica differs from the blocks the prefix cache holds.
func (r replica) diff(want map[uint64]blocks.Block) string {
	for h, w := range want {
		g, ok := r[h]
		switch {
		case !ok:
			return fmt.Sprintf("block %016x (tokens %v) is held but was never stored", h, w.Tokens)
		case g.Parent != w.Parent || g.HasParent != w.HasParent || !slices.Equal(g.Tokens, w.Tokens):
			return fmt.Sprintf("block %016x: got parent %016x (%v) tokens %v, want parent %016x (%v) tokens %v", h, g.Parent, g.HasParent, g.Tokens, w.Parent, w.HasParent, w.Tokens)
		}
	}
	for h := range r {
		if _, ok := want[h]; !ok {
			return fmt.Sprintf("block %016x was stored and is no longer held, but was never removed", h)
		}
	}
	return ""
}

// pageBlocks counts the full pages of the prefix tree from its nodes alone (each node's
// edge holds the page ends that fall in it), which needs no token: a check independent of
// the hashing.
func pageBlocks(e *engine.Engine) int {
	ps := e.Config().PageSize
	n := 0
	for _, node := range e.Prefix().Nodes() {
		n += node.Depth/ps - (node.Depth-node.Span)/ps
	}
	return n
}

// In every scenario, after every call and every step, the blocks rebuilt from the changes
// are exactly the full pages the prefix cache holds: the same hashes, parents and tokens.
func TestChangesRebuildThePrefixCachesBlocks(t *testing.T) {
	for _, c := range []struct {
		scenario string
		steps    int
		cfg      func(*engine.Config)
		removes  bool // the run evicts or removes cached sequences
	}{
		{"chat", 900, nil, true},
		{"recycle-stall", 500, nil, false},
		{"leak", 600, nil, false},
		{"fork-race", 600, nil, true},
		{"preempt", 600, nil, true},
		{"chat", 600, func(c *engine.Config) { c.ExcludeUnreceived = true; c.PageSize = 7 }, false},
		{"chat", 300, func(c *engine.Config) { c.MaxRecycling = 0 }, true},
	} {
		t.Run(c.scenario, func(t *testing.T) {
			var tr *blocks.Tracker
			rep := replica{}
			calls, stored, removed := 0, 0, 0
			_, err := lockstep.Run(c.scenario, 1, c.steps, 50*time.Millisecond, c.cfg, func(e *engine.Engine, evs []engine.Event) {
				if t.Failed() {
					return
				}
				ps := e.Config().PageSize
				if tr == nil {
					tr = blocks.NewTracker(ps)
				}
				calls++
				chs := tr.Track(e.Prefix(), evs)
				for _, ch := range chs {
					switch ch.Kind {
					case blocks.Stored:
						stored += len(ch.Hashes)
					case blocks.Removed:
						removed += len(ch.Hashes)
					}
				}
				if err := rep.apply(chs, ps); err != nil {
					t.Fatalf("call %d (step %d): %v", calls, e.StepNumber(), err)
				}
				if d := rep.diff(blocks.Of(e.Prefix(), ps)); d != "" {
					t.Fatalf("call %d (step %d): %s", calls, e.StepNumber(), d)
				}
				if n := pageBlocks(e); n != len(rep) || tr.Len() != n {
					t.Fatalf("call %d (step %d): %d blocks rebuilt, tracker holds %d, the tree has %d full pages", calls, e.StepNumber(), len(rep), tr.Len(), n)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if stored == 0 || (c.removes && removed == 0) {
				t.Errorf("%d blocks stored, %d removed: the scenario should store and remove blocks", stored, removed)
			}
			t.Logf("%d calls, %d blocks stored, %d removed, %d held at the end", calls, stored, removed, len(rep))
		})
	}
}

// Sync, at any point, restarts a consumer from nothing: Cleared, then every block held once,
// and tracking goes on from there.
func TestSyncStartsAConsumerOver(t *testing.T) {
	var tr *blocks.Tracker
	rep := replica{}
	calls := 0
	_, err := lockstep.Run("chat", 2, 600, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		if t.Failed() {
			return
		}
		ps := e.Config().PageSize
		calls++
		var chs []blocks.Change
		switch {
		case tr == nil && calls < 200:
			return // a tracker that starts late
		case tr == nil || calls%150 == 0:
			if tr == nil {
				tr = blocks.NewTracker(ps)
			}
			rep[42] = blocks.Block{Hash: 42} // whatever the consumer held is gone
			chs = tr.Sync(e.Prefix())
			if chs[0].Kind != blocks.Cleared {
				t.Fatalf("Sync()[0] = %v, want cleared", chs[0])
			}
		default:
			chs = tr.Track(e.Prefix(), evs)
		}
		if err := rep.apply(chs, ps); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
		if d := rep.diff(blocks.Of(e.Prefix(), ps)); d != "" {
			t.Fatalf("call %d: %s", calls, d)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// With the prefix cache disabled nothing is cached, so there is no block.
func TestNoBlocksWithoutThePrefixCache(t *testing.T) {
	tr := blocks.NewTracker(16)
	_, err := lockstep.Run("chat", 1, 300, 50*time.Millisecond, func(c *engine.Config) { c.PrefixCache = "disable" }, func(e *engine.Engine, evs []engine.Event) {
		if chs := tr.Track(e.Prefix(), evs); len(chs) > 0 {
			t.Fatalf("Track() = %v, want no change", chs)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The hash is the documented function: XXH64 over the parent's hash and the tokens, little
// endian, so a consumer can check it.
func TestHashIsTheDocumentedFunction(t *testing.T) {
	in := []byte{7, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}
	if got, want := blocks.Hash(0x8000000000000007, []int32{1, -2}), xxhash.Sum64(in); got != want {
		t.Errorf("Hash(0x8000000000000007, [1 -2]) = %016x, want XXH64 %016x", got, want)
	}
	if blocks.Hash(0, []int32{1, 2}) == blocks.Hash(1, []int32{1, 2}) {
		t.Errorf("the parent does not change the hash")
	}
	if blocks.Hash(0, []int32{-1}) == blocks.Hash(0, []int32{1}) {
		t.Errorf("the sign of a token does not change the hash")
	}
}

// A Reader on the engine's side and a Tracker elsewhere, applying what it read, give the
// changes Track gives, and so does ApplyShared (its changes read before the next call), a
// resync now and then included.
func TestReaderAndTrackerApartGiveTracksChanges(t *testing.T) {
	var (
		whole, apart, shared *blocks.Tracker
		rd                   *blocks.Reader
		o                    blocks.Ops
	)
	calls := 0
	_, err := lockstep.Run("preempt", 3, 600, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		if t.Failed() {
			return
		}
		ps := e.Config().PageSize
		if whole == nil {
			whole, apart, shared, rd = blocks.NewTracker(ps), blocks.NewTracker(ps), blocks.NewTracker(ps), blocks.NewReader(ps)
		}
		calls++
		o.Reset()
		var want []blocks.Change
		if calls%97 == 0 {
			want = whole.Sync(e.Prefix())
			rd.Sync(e.Prefix(), &o)
		} else {
			want = whole.Track(e.Prefix(), evs)
			rd.Read(e.Prefix(), evs, &o)
		}
		got := apart.Apply(&o)
		if !sameChanges(got, want) {
			t.Fatalf("call %d: Apply gives %v, Track %v", calls, got, want)
		}
		if sh := shared.ApplyShared(&o); !sameChanges(sh, want) {
			t.Fatalf("call %d: ApplyShared gives %v, Track %v", calls, sh, want)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Len() == 0 || apart.Len() != whole.Len() || shared.Len() != whole.Len() {
		t.Errorf("blocks held: %d by Track, %d by Apply, %d by ApplyShared; want the same, not 0", whole.Len(), apart.Len(), shared.Len())
	}
}

func sameChanges(a, b []blocks.Change) bool {
	return slices.EqualFunc(a, b, func(x, y blocks.Change) bool {
		return x.Kind == y.Kind && x.Parent == y.Parent && x.HasParent == y.HasParent &&
			slices.Equal(x.Hashes, y.Hashes) && slices.Equal(x.Tokens, y.Tokens)
	})
}
