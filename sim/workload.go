package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// tokenRange keeps simulated prompt tokens clear of small ids.
const (
	tokenBase  = 100
	tokenRange = 30000
)

func randTokens(r *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(tokenBase + r.IntN(tokenRange))
	}
	return out
}

// between returns a uniform int in [lo, hi].
func between(r *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return lo + r.IntN(hi-lo+1)
}

// expDelay returns an exponential delay with the given mean.
func expDelay(r *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(-math.Log(1-r.Float64()) * float64(mean))
}

// queue holds arrivals in time order (ties in insertion order).
type queue []Arrival

func (q *queue) push(a Arrival) {
	i, _ := slices.BinarySearchFunc(*q, a.At, func(x Arrival, t time.Duration) int {
		if x.At <= t {
			return -1
		}
		return 1
	})
	*q = slices.Insert(*q, i, a)
}

func (q *queue) due(now time.Duration) []Arrival {
	n := 0
	for n < len(*q) && (*q)[n].At <= now {
		n++
	}
	out := slices.Clone((*q)[:n])
	*q = (*q)[n:]
	return out
}

// ChatParams shapes multi-turn chat over shared system prompts.
type ChatParams struct {
	Systems      int           // shared system prompts
	SystemLen    [2]int        // their length range
	FirstUser    [2]int        // the first user message's length range
	FollowUser   [2]int        // a follow-up message's length range
	MaxTokens    [2]int        // the completion length range
	Turns        [2]int        // turns a conversation has
	NewConvEvery time.Duration // mean time between new conversations
	Think        [2]time.Duration
	MaxContext   int     // a conversation stops before its prompt passes this
	LostRate     float64 // share of requests whose prefill instance dies (Lost)
	AbortRate    float64 // share aborted right after prep_recv
	MaxConvs     int     // 0: unbounded
}

// chat is a multi-turn chat workload: conversations open over a handful of shared system
// prompts; each turn's prompt is the last one plus the streamed answer plus a new message,
// so the cache sees forks (new conversations on a system prompt) and reuses (next turns).
type chat struct {
	p       ChatParams
	r       *rand.Rand
	systems [][]int32
	q       queue
	next    time.Duration
	convs   int
	turns   map[int]int // conversation -> turns planned
}

// NewChat returns a chat workload.
func NewChat(p ChatParams, seed uint64) Workload {
	r := rand.New(rand.NewPCG(seed, 0x6368617400000000))
	w := &chat{p: p, r: r, turns: map[int]int{}}
	for range p.Systems {
		w.systems = append(w.systems, randTokens(r, between(r, p.SystemLen[0], p.SystemLen[1])))
	}
	return w
}

func (w *chat) fate() Fate {
	x := w.r.Float64()
	switch {
	case x < w.p.LostRate:
		return Lost
	case x < w.p.LostRate+w.p.AbortRate:
		return AbortAfterPrep
	}
	return Normal
}

func (w *chat) Due(now time.Duration) []Arrival {
	for w.next <= now && (w.p.MaxConvs == 0 || w.convs < w.p.MaxConvs) {
		c := w.convs
		w.convs++
		sys := w.systems[w.r.IntN(len(w.systems))]
		prompt := append(slices.Clone(sys), randTokens(w.r, between(w.r, w.p.FirstUser[0], w.p.FirstUser[1]))...)
		w.turns[c] = between(w.r, w.p.Turns[0], w.p.Turns[1])
		w.q.push(Arrival{At: w.next, ID: fmt.Sprintf("c%d.1", c), Prompt: prompt,
			MaxTokens: between(w.r, w.p.MaxTokens[0], w.p.MaxTokens[1]), Fate: w.fate(), Conv: c, Turn: 1})
		w.next += expDelay(w.r, w.p.NewConvEvery)
	}
	return w.q.due(now)
}

func (w *chat) Finished(a Arrival, output []int32, reason string, now time.Duration) {
	if reason != "length" || a.Turn >= w.turns[a.Conv] {
		delete(w.turns, a.Conv)
		return
	}
	prompt := append(slices.Clone(a.Prompt), output...)
	prompt = append(prompt, randTokens(w.r, between(w.r, w.p.FollowUser[0], w.p.FollowUser[1]))...)
	if w.p.MaxContext > 0 && len(prompt) > w.p.MaxContext {
		delete(w.turns, a.Conv)
		return
	}
	think := w.p.Think[0] + time.Duration(w.r.Int64N(int64(w.p.Think[1]-w.p.Think[0])+1))
	w.q.push(Arrival{At: now + think, ID: fmt.Sprintf("c%d.%d", a.Conv, a.Turn+1), Prompt: prompt,
		MaxTokens: between(w.r, w.p.MaxTokens[0], w.p.MaxTokens[1]), Fate: w.fate(), Conv: a.Conv, Turn: a.Turn + 1})
}

// StreamParams shapes a stream of independent requests, optionally sharing a prefix.
type StreamParams struct {
	Every     time.Duration // mean time between requests
	Prompt    [2]int        // prompt length range (with the shared prefix)
	Shared    int           // tokens every prompt shares (0: none)
	MaxTokens [2]int
	LostRate  float64
	Max       int // 0: unbounded
	Prefix    string
}

// stream is a Poisson stream of independent requests.
type stream struct {
	p      StreamParams
	r      *rand.Rand
	shared []int32
	next   time.Duration
	n      int
}

// NewStream returns a stream workload.
func NewStream(p StreamParams, seed uint64) Workload {
	r := rand.New(rand.NewPCG(seed, 0x73747265616d0000))
	w := &stream{p: p, r: r}
	if p.Shared > 0 {
		w.shared = randTokens(r, p.Shared)
	}
	if w.p.Prefix == "" {
		w.p.Prefix = "r"
	}
	return w
}

func (w *stream) Due(now time.Duration) []Arrival {
	var out []Arrival
	for w.next <= now && (w.p.Max == 0 || w.n < w.p.Max) {
		n := between(w.r, w.p.Prompt[0], w.p.Prompt[1])
		prompt := slices.Clone(w.shared)
		if n > len(prompt) {
			prompt = append(prompt, randTokens(w.r, n-len(prompt))...)
		}
		fate := Normal
		if w.r.Float64() < w.p.LostRate {
			fate = Lost
		}
		out = append(out, Arrival{At: w.next, ID: fmt.Sprintf("%s%d", w.p.Prefix, w.n), Prompt: prompt,
			MaxTokens: between(w.r, w.p.MaxTokens[0], w.p.MaxTokens[1]), Fate: fate, Conv: -1})
		w.n++
		w.next += expDelay(w.r, w.p.Every)
	}
	return out
}

func (w *stream) Finished(Arrival, []int32, string, time.Duration) {}
