package prefix

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/internal/vectors"
)

// TestPrefixVectors replays every script of prefix.txt, the answers of MLC's PrefixCache and
// PagedRadixTree over TVM's KV cache, on a Cache with a pages.Cache behind it, wired as MLC's
// engine wires them: the eviction callback removes the sequence's KV. Every answer must
// agree: insert results, evictions, membership, and the free pages that follow from them.
func TestPrefixVectors(t *testing.T) {
	scripts, err := vectors.Load("prefix.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range scripts {
		n += replayPrefix(t, s)
	}
	t.Logf("prefix.txt: %d scripts, %d answers agree", len(scripts), n)
}

func replayPrefix(t *testing.T, s vectors.Script) (agreed int) {
	t.Helper()
	var (
		kv      *pages.Cache
		pc      *Cache
		evicted []string
	)
	for _, op := range s.Ops {
		fail := func(format string, args ...any) {
			t.Helper()
			tree := ""
			if pc != nil {
				tree = pc.Describe()
			}
			t.Fatalf("%s, %s: %s\n%s", s.Header, op, fmt.Sprintf(format, args...), tree)
		}
		arg := func(i int) int64 {
			t.Helper()
			if i >= len(op.Args) {
				fail("missing argument %d", i)
			}
			v, err := strconv.ParseInt(op.Args[i], 10, 64)
			if err != nil {
				fail("argument %d: %v", i, err)
			}
			return v
		}
		tokens := func(i int) []int32 {
			t.Helper()
			if i >= len(op.Args) {
				fail("missing tokens")
			}
			toks, err := vectors.Ints[int32](op.Args[i])
			if err != nil {
				fail("%v", err)
			}
			return toks
		}
		takeEvicted := func() string {
			if len(evicted) == 0 {
				return "-"
			}
			e := strings.Join(evicted, ",")
			evicted = evicted[:0]
			return e
		}
		var got string
		var err error
		switch op.Name {
		case "kv_create":
			kv, err = pages.New(pages.Config{NumPages: int(arg(0)), PageSize: int(arg(1))})
			got = "ok"
		case "pc_create":
			mode := map[string]Mode{"radix": Radix, "disable": Disabled}[op.Args[0]]
			if op.Args[0] != "radix" && op.Args[0] != "disable" {
				fail("unknown mode")
			}
			pc = New(Config{Mode: mode, MaxRecycling: int(arg(1)), OnEvict: func(ev Eviction) {
				if err := kv.RemoveSequence(ev.Seq); err != nil {
					fail("OnEvict(%d): %v", ev.Seq, err)
				}
				evicted = append(evicted, strconv.FormatInt(ev.Seq, 10))
			}})
			got = "ok"
		case "kv_add":
			err, got = kv.AddSequence(arg(0)), "ok"
		case "kv_remove":
			err, got = kv.RemoveSequence(arg(0)), "ok"
		case "kv_fork":
			err, got = kv.ForkSequence(arg(0), arg(1), int(arg(2))), "ok"
		case "kv_popn":
			err, got = kv.PopN(arg(0), int(arg(1))), "ok"
		case "kv_reserve":
			var slots []int64
			slots, err = kv.ReserveAppend(arg(0), int(arg(1)), nil)
			parts := []string{}
			for _, x := range pages.Compress(nil, slots) {
				parts = append(parts, strconv.FormatInt(x, 10))
			}
			got = strings.Join(parts, ",")
		case "kv_avail":
			got = strconv.Itoa(kv.NumAvailablePages())
		case "pc_insert":
			var res Result
			res, err = pc.InsertSequence(arg(0), tokens(1), NoWindow)
			forked, reused := int64(-1), int64(-1)
			switch res.Kind {
			case Fork:
				forked = res.Parent
			case Reuse:
				reused = res.Parent
			}
			got = fmt.Sprintf("%d %d %d %d", res.Offset, forked, reused, res.Pop)
		case "pc_extend":
			pc.ExtendSequence(arg(0), tokens(1))
			got = "ok"
		case "pc_commit":
			pc.CommitSequenceExtension()
			got = "ok"
		case "pc_recycle":
			err = pc.RecycleSequence(arg(0))
			got = "ok evicted=" + takeEvicted()
		case "pc_tryfree":
			ok := pc.TryFreeMemory()
			got = fmt.Sprintf("%d evicted=%s", map[bool]int{false: 0, true: 1}[ok], takeEvicted())
		case "pc_has":
			got = map[bool]string{false: "0", true: "1"}[pc.HasSequence(arg(0))]
		default:
			fail("unknown operation")
		}
		if err != nil {
			fail("kvtop refused it: %v", err)
		}
		if got != op.Answer {
			fail("got %s, want %s", got, op.Answer)
		}
		if len(evicted) > 0 {
			fail("evicted %v outside a recycle or a tryfree", evicted)
		}
		agreed++
	}
	return agreed
}
