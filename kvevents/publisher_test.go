package kvevents

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
	"github.com/kvtop/kvtop/internal/lockstep"
)

func TestMain(m *testing.M) {
	writeTimeout = 300 * time.Millisecond // a stalled peer is cut off quickly
	os.Exit(m.Run())
}

type held struct {
	parent    uint64
	hasParent bool
	tokens    []int64
}

// follower rebuilds the block set from what a subscriber hands over, as an indexer does.
type follower struct {
	mu       sync.Mutex
	blocks   map[uint64]held
	got      uint64 // batches applied
	replayed int
	missing  uint64
	err      error
}

func newFollower() *follower { return &follower{blocks: map[uint64]held{}} }

func (f *follower) apply(m Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.Missing > 0 {
		f.missing += m.Missing
		return nil
	}
	if m.Err != nil && f.err == nil {
		f.err = m.Err
	}
	if m.Replayed {
		f.replayed++
	}
	f.got++
	for _, ev := range m.Batch.Events {
		switch e := ev.(type) {
		case AllBlocksCleared:
			clear(f.blocks)
		case BlockStored:
			var parent uint64
			has := e.ParentBlockHash != nil
			if has {
				parent = e.ParentBlockHash.N
			}
			for i, h := range e.BlockHashes {
				if _, dup := f.blocks[h.N]; dup && f.err == nil {
					f.err = fmt.Errorf("batch %d: block %d stored twice", m.Seq, h.N)
				}
				f.blocks[h.N] = held{parent, has, e.TokenIDs[i*int(e.BlockSize) : (i+1)*int(e.BlockSize)]}
				parent, has = h.N, true
			}
		case BlockRemoved:
			for _, h := range e.BlockHashes {
				if _, ok := f.blocks[h.N]; !ok && f.err == nil {
					f.err = fmt.Errorf("batch %d: block %d removed but not held", m.Seq, h.N)
				}
				delete(f.blocks, h.N)
			}
		}
	}
	return nil
}

// diff compares the rebuilt blocks with those the prefix cache holds.
func (f *follower) diff(want map[uint64]blocks.Block) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err.Error()
	}
	if len(f.blocks) != len(want) {
		return fmt.Sprintf("%d blocks rebuilt, the prefix cache holds %d", len(f.blocks), len(want))
	}
	for h, w := range want {
		g, ok := f.blocks[h]
		toks := make([]int64, len(w.Tokens))
		for i, t := range w.Tokens {
			toks[i] = int64(t)
		}
		if !ok || g.parent != w.Parent || g.hasParent != w.HasParent || !slices.Equal(g.tokens, toks) {
			return fmt.Sprintf("block %d: rebuilt %+v (held %v), want parent %d (%v) tokens %v", h, g, ok, w.Parent, w.HasParent, toks)
		}
	}
	return ""
}

// waitFor waits until the follower has applied n batches.
func (f *follower) waitFor(t *testing.T, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		f.mu.Lock()
		got := f.got
		f.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subscriber applied %d batches of %d", got, n)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// settle waits until the sender has applied every observation queued, and returns the
// number of batches it has numbered: what a subscriber then has to have seen.
func settle(t *testing.T, p *Stream) uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.applied.Load() < p.queued.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the sender applied %d observations of %d", p.applied.Load(), p.queued.Load())
		}
		time.Sleep(100 * time.Microsecond)
	}
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	return p.seq
}

// start starts a publisher on loopback, with replay, and a subscriber that follows it.
func start(t *testing.T, cfg Config) (*Publisher, *follower) {
	t.Helper()
	cfg.Endpoint, cfg.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := newFollower()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Subscribe(ctx, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), ReplayEndpoint: "tcp://" + p.ReplayAddr().String(), FromStart: true}, f.apply)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe = %v", err)
		}
		p.Close()
	})
	return p, f
}

// A subscriber sees exactly the blocks the engine's prefix cache holds: rebuilt from the
// KV events over ZMQ, after every call and step of a scenario, the same hashes, parents and
// tokens. Both encodings.
func TestSubscriberRebuildsThePrefixCache(t *testing.T) {
	for _, enc := range []Encoding{Map, Array} {
		t.Run(enc.String(), func(t *testing.T) {
			p, f := start(t, Config{Encoding: enc})
			calls := 0
			_, err := lockstep.Run("chat", 3, 500, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
				if t.Failed() {
					return
				}
				calls++
				p.Observe(e, evs)
				f.waitFor(t, settle(t, p.Stream))
				if d := f.diff(blocks.Of(e.Prefix(), e.Config().PageSize)); d != "" {
					t.Fatalf("call %d (step %d): %s", calls, e.StepNumber(), d)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Batches < 50 || st.Dropped > 0 || st.Blocks == 0 {
				t.Errorf("Stats() = %+v: want over 100 batches, none dropped, blocks held", st)
			}
		})
	}
}

// A batch the PUB socket never sent (as a slow link or a full high-water mark loses one) is
// a gap in the sequence: the subscriber fills it from the replay socket, and ends with the
// prefix cache's blocks.
func TestReplayFillsAForcedGap(t *testing.T) {
	skipped := 0
	p, f := start(t, Config{skip: func(seq uint64) bool {
		if seq%3 == 1 {
			skipped++
			return true
		}
		return false
	}})
	var last *engine.Engine
	_, err := lockstep.Run("chat", 4, 300, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		p.Observe(e, evs)
		last = e
	})
	if err != nil {
		t.Fatal(err)
	}
	// One more batch, sent, so that the last gap shows.
	for n := settle(t, p.Stream); n%3 == 1 || n%3 == 2; n = settle(t, p.Stream) {
		p.queue <- pending{ts: 1, changes: nil, pageSize: 16}
		p.queued.Add(1)
	}
	p.queue <- pending{ts: 1, changes: nil, pageSize: 16}
	p.queued.Add(1)
	f.waitFor(t, settle(t, p.Stream))
	if d := f.diff(blocks.Of(last.Prefix(), last.Config().PageSize)); d != "" {
		t.Fatal(d)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.replayed < skipped || f.missing > 0 || skipped == 0 {
		t.Errorf("%d batches skipped, %d replayed, %d missing: want every skipped one replayed", skipped, f.replayed, f.missing)
	}
}

// The engine never waits for the publisher: with the sender stuck, every observation
// returns, the batches that do not fit are dropped and counted, and once the sender moves
// again subscribers are started over and end with the prefix cache's blocks.
func TestAStuckSenderDoesNotSlowTheEngine(t *testing.T) {
	hold := make(chan struct{})
	p, f := start(t, Config{Queue: 4, hold: hold})
	observed := 0
	e, err := lockstep.Run("chat", 5, 400, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
		p.Observe(e, evs) // would hang the test if it waited
		observed++
	})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Dropped == 0 || p.queued.Load() > 5 {
		t.Fatalf("with the sender stuck: %d observations, %d queued, %d dropped; want all but 5 dropped", observed, p.queued.Load(), st.Dropped)
	}
	close(hold)
	// The next observation that fits resyncs (observations run on the engine's goroutine,
	// this one, so p.lost is ours to read).
	deadline := time.Now().Add(5 * time.Second)
	for p.lost {
		p.Observe(e, nil)
		if time.Now().After(deadline) {
			t.Fatal("no resync after the sender moved again")
		}
		time.Sleep(time.Millisecond)
	}
	f.waitFor(t, settle(t, p.Stream))
	if d := f.diff(blocks.Of(e.Prefix(), e.Config().PageSize)); d != "" {
		t.Fatal(d)
	}
	if p.Stats().Resyncs == 0 {
		t.Errorf("Stats() = %+v, want a resync", p.Stats())
	}
}

// A subscriber that stops reading without closing its connection is cut off once a write to
// it times out; the other subscribers keep receiving.
func TestAStalledSubscriberDoesNotStopTheOthers(t *testing.T) {
	p, f := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled := zmq4.NewSub(ctx)
	defer stalled.Close()
	if err := stalled.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	ep, _ := endpoint("tcp://" + p.Addr().String())
	if err := stalled.Dial(ep); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let it subscribe
	// 120 batches of 16k large token ids each, about 10 MB: far more than the stalled
	// peer's buffers take.
	toks := make([]int32, 1<<14)
	for i := range toks {
		toks[i] = 1<<30 + int32(i)
	}
	for i := range 120 {
		p.queue <- pending{ts: float64(i), pageSize: 1 << 14, changes: []blocks.Change{{Kind: blocks.Stored, Hashes: []uint64{uint64(i + 1)}, Tokens: toks}}}
		p.queued.Add(1)
	}
	p.queue <- pending{ts: 999, pageSize: 16, changes: []blocks.Change{{Kind: blocks.Cleared}}}
	p.queued.Add(1)
	f.waitFor(t, settle(t, p.Stream))
}

// Streams share the publisher's sockets, each with its own topic and sequence (a tap's, one
// a decode instance): a subscriber to them all follows each topic's sequence apart, fills
// each topic's gaps by a replay that names the topic, and rebuilds each engine's blocks.
func TestStreamsShareTheSocketsAndKeepTheirOwnSequences(t *testing.T) {
	p, err := Start(Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		skip: func(seq uint64) bool { return seq%4 == 2 }})
	if err != nil {
		t.Fatal(err)
	}
	topics := []string{"kv@127.0.0.1:8001", "kv@127.0.0.1:8002"}
	streams := map[string]*Stream{}
	follow := map[string]*follower{}
	for _, tp := range topics {
		if streams[tp], err = p.NewStream(tp); err != nil {
			t.Fatal(err)
		}
		follow[tp] = newFollower()
	}
	if _, err := p.NewStream(topics[0]); err == nil {
		t.Errorf("a second stream of topic %q: no error", topics[0])
	}
	var mu sync.Mutex
	other := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Subscribe(ctx, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), ReplayEndpoint: "tcp://" + p.ReplayAddr().String(),
			Topic: "kv@", ReplayByTopic: true, FromStart: true}, func(m Message) error {
			mu.Lock()
			f := follow[m.Topic]
			if f == nil {
				other++
			}
			mu.Unlock()
			if f == nil {
				return nil
			}
			return f.apply(m)
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe = %v", err)
		}
		p.Close()
	}()
	time.Sleep(200 * time.Millisecond) // let it subscribe
	// Two engines at once, one a stream, as a tap's shadows run: their batches interleave on
	// the socket.
	engines := make([]*engine.Engine, len(topics))
	var wg sync.WaitGroup
	errs := make([]error, len(topics))
	for i, scenario := range []string{"chat", "recycle-stall"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[i], errs[i] = lockstep.Run(scenario, uint64(i+1), 300, 50*time.Millisecond, nil, streams[topics[i]].Observe)
		}()
	}
	wg.Wait()
	for i, tp := range topics {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		s := streams[tp]
		// Empty batches, up to one the PUB socket sends past a skipped one, so that the
		// stream has a gap and the subscriber sees it.
		n := settle(t, s)
		for n < 4 || (n-1)%4 == 2 {
			s.queue <- pending{ts: 1, pageSize: 16}
			s.queued.Add(1)
			n = settle(t, s)
		}
		follow[tp].waitFor(t, n)
		if d := follow[tp].diff(blocks.Of(engines[i].Prefix(), engines[i].Config().PageSize)); d != "" {
			t.Errorf("%s: %s", tp, d)
		}
		if st := s.Stats(); st.Batches < 2 || st.Replays == 0 {
			t.Errorf("%s: Stats() = %+v, want batches sent and replays answered", tp, st)
		}
		follow[tp].mu.Lock()
		if f := follow[tp]; f.replayed == 0 || f.missing > 0 {
			t.Errorf("%s: %d batches replayed, %d missing: want the skipped ones replayed", tp, f.replayed, f.missing)
		}
		follow[tp].mu.Unlock()
	}
	if total := p.Stats(); total.Batches != streams[topics[0]].Stats().Batches+streams[topics[1]].Stats().Batches {
		t.Errorf("the publisher's Stats() = %+v, want its streams' summed", total)
	}
	mu.Lock()
	defer mu.Unlock()
	if other > 0 {
		t.Errorf("%d batches of other topics", other)
	}
}

// A stream that observes another engine than before (a tap's shadow that started over)
// starts its subscribers over: they end with the new engine's blocks, none of the old's.
func TestANewEngineStartsSubscribersOver(t *testing.T) {
	p, f := start(t, Config{})
	var last *engine.Engine
	// The second engine has fewer sequences than the first: what the first held is not all
	// undone by the second's reusing its sequence ids.
	for i, run := range []struct {
		scenario string
		steps    int
	}{{"recycle-stall", 300}, {"chat", 30}} {
		e, err := lockstep.Run(run.scenario, uint64(i+1), run.steps, 50*time.Millisecond, nil, p.Observe)
		if err != nil {
			t.Fatal(err)
		}
		last = e
	}
	f.waitFor(t, settle(t, p.Stream))
	if d := f.diff(blocks.Of(last.Prefix(), last.Config().PageSize)); d != "" {
		t.Fatal(d)
	}
}

// The replay ring keeps the last Buffer batches, and no more than BufferBytes of them (but
// always the newest): a flat-out engine's large batches do not make it hold gigabytes.
func TestTheReplayRingIsBoundedByCountAndBytes(t *testing.T) {
	toks := make([]int32, 1024)
	for _, c := range []struct {
		cfg      Config
		max      int
		maxBytes int
	}{
		{Config{Buffer: 5}, 5, 1 << 30},
		{Config{BufferBytes: 10_000}, 10_000, 10_000},
		{Config{BufferBytes: 100}, 1, 1 << 30}, // smaller than one batch: the newest is kept
	} {
		c.cfg.Endpoint = "tcp://127.0.0.1:0"
		p, err := Start(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		s := p.Stream
		for i := range 40 {
			s.queue <- pending{ts: float64(i), pageSize: 1024, changes: []blocks.Change{{Kind: blocks.Stored, Hashes: []uint64{uint64(i + 1)}, Tokens: toks}}}
			s.queued.Add(1)
		}
		n := settle(t, s)
		s.ringMu.Lock()
		size := 0
		for _, k := range s.ring {
			size += len(k.payload)
		}
		last := s.ring[len(s.ring)-1].seq
		if len(s.ring) == 0 || len(s.ring) > c.max || size > c.maxBytes || last != n-1 || size != s.keptBytes {
			t.Errorf("%+v: the ring keeps %d batches, %d bytes (counted %d), the last %d of %d; want at most %d and %d bytes, the newest kept",
				c.cfg, len(s.ring), size, s.keptBytes, last, n, c.max, c.maxBytes)
		}
		s.ringMu.Unlock()
	}
}

// A replay request is vLLM's [identity, "", start] or [identity, start], or either with a
// topic before start (a publisher of several streams); anything else is refused.
func TestReplayRequestForms(t *testing.T) {
	start := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	id, tp := []byte("peer"), []byte("kv@d0")
	for _, c := range []struct {
		frames    [][]byte
		ok, delim bool
		topic     []byte
		name      string
	}{
		{[][]byte{id, nil, start}, true, true, nil, "REQ/DEALER"},
		{[][]byte{id, start}, true, false, nil, "no delimiter"},
		{[][]byte{id, nil, tp, start}, true, true, tp, "REQ/DEALER, topic"},
		{[][]byte{id, tp, start}, true, false, tp, "topic, no delimiter"},
		{[][]byte{id, nil, nil, start}, true, true, []byte{}, "an empty topic"},
		{[][]byte{id}, false, false, nil, "no start"},
		{[][]byte{id, nil, []byte{1, 2}}, false, false, nil, "a short start"},
		{[][]byte{id, tp, tp, start}, false, false, nil, "two topics"},
		{[][]byte{id, nil, tp, tp, start}, false, false, nil, "five frames"},
	} {
		gid, topic, gstart, delim, ok := splitReplay(c.frames)
		if ok != c.ok {
			t.Errorf("%s: ok = %v, want %v", c.name, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if !slices.Equal(gid, id) || !slices.Equal(gstart, start) || delim != c.delim || (topic == nil) != (c.topic == nil) || !slices.Equal(topic, c.topic) {
			t.Errorf("%s: id %q topic %q start %v delim %v; want %q %q %v %v", c.name, gid, topic, gstart, delim, id, c.topic, start, c.delim)
		}
	}
}

// With Dial the PUB socket connects to a subscriber that listens, as llm-d's indexer does
// for a fleet (its zmqEndpoint, every pod dialling in): each stream's batches reach it
// under the stream's topic, the first of each AllBlocksCleared.
func TestDialReachesAListeningSubscriber(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p, err := Start(Config{Endpoint: "tcp://" + sub.Addr().String(), Dial: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Addr() != nil {
		t.Errorf("Addr() = %v for a dialling publisher, want nil", p.Addr())
	}
	time.Sleep(300 * time.Millisecond) // the connection and the subscription
	topics := []string{"kv@d0@m", "kv@d1@m"}
	for i, tp := range topics {
		s, err := p.NewStream(tp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lockstep.Run("chat", uint64(i+1), 40, 50*time.Millisecond, nil, s.Observe); err != nil {
			t.Fatal(err)
		}
	}
	first := map[string]bool{}
	stop := time.AfterFunc(10*time.Second, cancel) // a Recv that waits for nothing ends
	defer stop.Stop()
	for len(first) < len(topics) {
		m, err := sub.Recv()
		if err != nil {
			t.Fatalf("after %v: %v", first, err)
		}
		topic, seq, payload, ok := splitLive(m.Frames)
		if !ok || first[topic] {
			continue
		}
		b, err := Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, cleared := b.Events[0].(AllBlocksCleared); seq != 0 || !cleared {
			t.Errorf("%s's first batch: seq %d, events %v; want batch 0, AllBlocksCleared first", topic, seq, b.Events)
		}
		first[topic] = true
	}
	for _, tp := range topics {
		if !first[tp] {
			t.Errorf("nothing of %s reached the listening subscriber", tp)
		}
	}
}
