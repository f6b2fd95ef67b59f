package pages

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/internal/vectors"
)

// copyLog is a Store that keeps no payload and records the single-page copies forks make,
// as "src:dst:len" (source page, destination page, slots copied).
type copyLog struct {
	nopStore
	copies []string
}

func (l *copyLog) CopySlots(dst, src int32, n int) {
	l.copies = append(l.copies, fmt.Sprintf("%d:%d:%d", src, dst, n))
}

// take returns the copies since the last take, as kvcache.txt writes them.
func (l *copyLog) take() string {
	if len(l.copies) == 0 {
		return "-"
	}
	s := strings.Join(l.copies, ";")
	l.copies = l.copies[:0]
	return s
}

// TestKVCacheVectors replays every script of kvcache.txt, the answers of TVM's
// PagedAttentionKVCache, on a Cache and asserts every answer. An ERR answer (a failed check,
// fatal in TVM) must be an operation the Cache refuses with an error and that changes
// nothing.
func TestKVCacheVectors(t *testing.T) {
	scripts, err := vectors.Load("kvcache.txt")
	if err != nil {
		t.Fatal(err)
	}
	ops, refused := 0, 0
	for _, s := range scripts {
		n, r := replayKV(t, s)
		ops += n
		refused += r
	}
	t.Logf("kvcache.txt: %d scripts, %d answers agree (%d refusals)", len(scripts), ops, refused)
}

func replayKV(t *testing.T, s vectors.Script) (agreed, refused int) {
	t.Helper()
	var (
		c   *Cache
		log = &copyLog{}
	)
	for _, op := range s.Ops {
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s, %s: %s", s.Header, op, fmt.Sprintf(format, args...))
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
		if op.Name == "kv_create" {
			var err error
			if c, err = New(Config{NumPages: int(arg(0)), PageSize: int(arg(1)), Store: log}); err != nil {
				fail("New: %v", err)
			}
			if op.Answer != "ok" {
				fail("want %q, kvtop creates the cache", op.Answer)
			}
			agreed++
			continue
		}
		if c == nil {
			fail("no kv_create first")
		}
		before := c.State()
		var (
			got  string
			oerr error
		)
		switch op.Name {
		case "kv_add":
			oerr, got = c.AddSequence(arg(0)), "ok"
		case "kv_remove":
			oerr, got = c.RemoveSequence(arg(0)), "ok"
		case "kv_fork":
			oerr, got = c.ForkSequence(arg(0), arg(1), int(arg(2))), "ok"
		case "kv_popn":
			oerr, got = c.PopN(arg(0), int(arg(1))), "ok"
		case "kv_reserve":
			var slots []int64
			slots, oerr = c.ReserveAppend(arg(0), int(arg(1)), nil)
			got = joinInts(Compress(nil, slots))
		case "kv_copies":
			got = log.take()
		case "kv_avail":
			got = strconv.Itoa(c.NumAvailablePages())
		case "kv_total":
			got = strconv.Itoa(c.TotalSequenceLength())
		default:
			fail("unknown operation")
		}
		if strings.HasPrefix(op.Answer, "ERR ") {
			if oerr == nil {
				fail("kvtop accepted it (answer %q)", got)
			}
			if after := c.State(); !stateEqual(before, after) {
				fail("refused with %v, but the cache changed", oerr)
			}
			if l := log.take(); l != "-" {
				fail("refused with %v, but copied %s", oerr, l)
			}
			return agreed + 1, refused + 1 // the script stops after its first ERR
		}
		if oerr != nil {
			fail("kvtop refused it: %v", oerr)
		}
		if got != op.Answer {
			fail("got %s, want %s", got, op.Answer)
		}
		agreed++
	}
	return agreed, refused
}

func joinInts(xs []int64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(parts, ",")
}
