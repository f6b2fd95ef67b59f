package engine

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/internal/vectors"
)

// The prepare-receive flows of engine.txt, the real code's answers, replayed through the
// engine's own calls: each prep_recv is queued and stepped until it is admitted (or blocked,
// which ends its script); each finish writes the request's KV, starts it at its begin and
// steps until it has generated its tokens and its sequence is recycled. Every matched length,
// metadata array, free page count and blocked reason must be the real code's.
func TestEngineVectors(t *testing.T) {
	agree, total := replayEngineVectors(t, prefix.EvictMLC, true)
	t.Logf("%d of %d answers agree", agree, total)
	if total < 1000 {
		t.Errorf("only %d answers replayed", total)
	}
}

// The vectors tell the eviction orders apart: replayed in the least recently recycled order,
// the engine gives other answers (once an eviction has chosen differently, later page ids and
// matches drift).
func TestEngineVectorsNeedMLCsOrder(t *testing.T) {
	agree, total := replayEngineVectors(t, prefix.EvictLRU, false)
	t.Logf("under --evict-order lru, %d of %d answers agree (%.1f%%)", agree, total, 100*float64(agree)/float64(total))
	if agree == total {
		t.Errorf("every answer agrees under the LRU order too: the vectors do not pin the order")
	}
}

// replayEngineVectors replays engine.txt under an eviction order and counts the answers that
// agree. strict stops at the first that does not; otherwise a script goes on after a
// disagreement (and stops where the real code blocked).
func replayEngineVectors(t *testing.T, order prefix.EvictOrder, strict bool) (agree, total int) {
	scripts, err := vectors.Load("engine.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scripts {
		e := newVectorEngine(t, sc.Header, order)
		now := time.UnixMilli(1_000_000)
		step := func() Ready {
			now = now.Add(10 * time.Millisecond)
			return e.Step(now)
		}
	ops:
		for _, op := range sc.Ops {
			args := vectorArgs(op.Args)
			id := args["name"]
			total++
			switch op.Name {
			case "prep":
				prompt, err := vectors.Ints[int32](args["prompt"])
				if err != nil {
					t.Fatalf("%s: %v", op, err)
				}
				end, _ := strconv.Atoi(args["end"])
				maxTokens, _ := strconv.Atoi(args["max_tokens"])
				if err := e.PrepRecv(now, PrepRecv{ID: id, Prompt: prompt, End: end, HasEnd: true, MaxTokens: maxTokens}); err != nil {
					t.Fatalf("%s: %v", op, err)
				}
				got := ""
				for steps := 0; got == ""; steps++ {
					if steps == 100 {
						t.Fatalf("%s: neither admitted nor blocked in %d steps", op, steps)
					}
					for _, ev := range step().Events {
						switch ev := ev.(type) {
						case MetadataEmitted:
							if ev.ID == id {
								got = fmt.Sprintf("matched=%d metadata=[%s] free_pages=%d", ev.Matched,
									joinInts(pagesFlatten(ev.Runs)), e.Cache().NumAvailablePages())
							}
						case PrepareBlocked:
							if ev.ID == id {
								got = "blocked " + ev.Eval.Reason.String()
							}
						}
					}
				}
				switch {
				case got == op.Answer:
					agree++
				case strict:
					t.Fatalf("%s\n got %s", op, got)
				}
				if strings.HasPrefix(got, "blocked") || strings.HasPrefix(op.Answer, "blocked") {
					break ops
				}
			case "finish":
				begin, _ := strconv.Atoi(args["begin"])
				r := e.reqs[id]
				if r == nil {
					t.Fatalf("%s: no request %s", op, id)
				}
				if slots := pages.Expand(nil, r.runs[0]); len(slots) > 0 {
					if _, err := e.ReceiveKV(now, slots, nil); err != nil {
						t.Fatalf("%s: %v", op, err)
					}
				}
				if err := e.StartGenerate(now, id, begin); err != nil {
					t.Fatalf("%s: %v", op, err)
				}
				for steps := 0; !r.state.Ended(); steps++ {
					if steps == 10_000 {
						t.Fatalf("%s: %s did not end", op, id)
					}
					step()
				}
				if r.state != StateFinished || op.Answer != "ok" {
					t.Fatalf("%s: %s ended %s", op, id, r.state)
				}
				agree++
			default:
				t.Fatalf("%s: unknown operation", op)
			}
		}
	}
	return agree, total
}

// newVectorEngine makes the engine a script's header describes:
// "engine seed N: page_size 16, max_total_seq_len 32768, max_num_seq 8, prefill_chunk 1024,
// prefix_cache radix, max_recycling 4, watermark 400".
func newVectorEngine(t *testing.T, header string, order prefix.EvictOrder) *Engine {
	t.Helper()
	_, settings, ok := strings.Cut(header, ": ")
	if !ok {
		t.Fatalf("header %q", header)
	}
	cfg := DefaultConfig()
	for _, kv := range strings.Split(settings, ", ") {
		k, v, _ := strings.Cut(kv, " ")
		n, err := strconv.Atoi(v)
		switch k {
		case "page_size":
			cfg.PageSize = n
		case "max_total_seq_len":
			cfg.MaxTotalSequenceLength = n
			cfg.MaxSingleSequenceLength = n
		case "max_num_seq":
			cfg.MaxNumSequence = n
		case "prefill_chunk":
			cfg.PrefillChunkSize = n
		case "prefix_cache":
			cfg.PrefixCache, err = v, nil
		case "max_recycling":
			cfg.MaxRecycling = n
		case "watermark":
			cfg.Watermark = n
		default:
			t.Fatalf("header %q: unknown setting %q", header, k)
		}
		if err != nil {
			t.Fatalf("header %q: %s: %v", header, kv, err)
		}
	}
	cfg.EvictOrder = order
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("header %q: %v", header, err)
	}
	return e
}

// vectorArgs reads "prep NAME end=E max_tokens=M prompt=TOKENS": the first word is the name.
func vectorArgs(words []string) map[string]string {
	out := map[string]string{}
	for i, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			out[k] = v
		} else if i == 0 {
			out["name"] = w
		}
	}
	return out
}

func pagesFlatten(runs [][]pages.Run) []int64 {
	var out []int64
	for _, model := range runs {
		out = append(out, int64(len(model)))
		for _, r := range model {
			out = append(out, r.Start, r.Len)
		}
	}
	return out
}

func joinInts(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range slices.Clip(xs) {
		s[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(s, ",")
}
