package tap

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/kvevents"
)

// blockWatch follows one shadow's prefix-cache blocks from the events it observes, as the
// KV-event publisher does: a new engine (the shadow started over) starts it over.
type blockWatch struct {
	mu     sync.Mutex
	eng    *engine.Engine
	tr     *blocks.Tracker
	held   map[uint64]bool
	starts int
	calls  atomic.Uint64
}

func (w *blockWatch) Observe(e *engine.Engine, evs []engine.Event) {
	w.calls.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	var chs []blocks.Change
	if e != w.eng {
		w.eng, w.tr, w.held = e, blocks.NewTracker(e.Config().PageSize), map[uint64]bool{}
		w.starts++
		chs = w.tr.Sync(e.Prefix())
	} else {
		chs = w.tr.Track(e.Prefix(), evs)
	}
	for _, ch := range chs {
		switch ch.Kind {
		case blocks.Cleared:
			clear(w.held)
		case blocks.Stored:
			for _, h := range ch.Hashes {
				w.held[h] = true
			}
		case blocks.Removed:
			for _, h := range ch.Hashes {
				delete(w.held, h)
			}
		}
	}
}

// A shadow's observers (Config.Observe) see every call and step of its engine, on the
// engine's goroutine: the blocks they follow from the events are exactly the decode
// instance's, and their metrics are the tap's, with the instance's decode_instance label.
func TestShadowObserversFollowTheirInstance(t *testing.T) {
	cfg := scenarioConfig(t, "chat")
	var mu sync.Mutex
	watches := map[string]*blockWatch{}
	observe := func(addr string) ([]runner.Observer, []prometheus.Collector) {
		mu.Lock()
		defer mu.Unlock()
		w := watches[addr]
		if w == nil {
			w = &blockWatch{}
			watches[addr] = w
		}
		calls := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvtop_test_observed_calls_total", Help: "Calls and steps observed."},
			func() float64 { return float64(w.calls.Load()) })
		return []runner.Observer{w}, []prometheus.Collector{calls}
	}
	tp := newTopology(t, []engine.Config{cfg, cfg}, Config{Engine: cfg, Observe: observe})
	d := tp.drive("chat", 3, 120, 2*time.Minute)
	if st := d.Stats(); st.Finished < 5 || st.CallErrors > 0 {
		t.Fatalf("driver stats %+v (last error %v): the scenario did not run", st, d.LastError())
	}
	tp.flush()
	resp, err := http.Get(tp.tapSrv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for i, ds := range tp.ds {
		want := ds.blocks(t)
		mu.Lock()
		w := watches[ds.addr()]
		mu.Unlock()
		if w == nil {
			t.Fatalf("D%d (%s): no observer was asked for", i, ds.addr())
		}
		w.mu.Lock()
		got, starts := len(w.held), w.starts
		missing := 0
		for h := range want {
			if !w.held[h] {
				missing++
			}
		}
		w.mu.Unlock()
		if len(want) == 0 || got != len(want) || missing > 0 || starts != 1 {
			t.Errorf("D%d: the observer follows %d blocks (%d of D's %d missing), over %d engines; want D's, over one", i, got, missing, len(want), starts)
		}
		line := fmt.Sprintf(`kvtop_test_observed_calls_total{decode_instance=%q} %d`, ds.addr(), w.calls.Load())
		if !strings.Contains(string(metrics), line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// kvtop tap's KV events, end to end: with a stream of a publisher for each shadow, a
// subscriber to them all, following each instance's topic apart, rebuilds from the events
// exactly each decode instance's blocks (hashes, parents, tokens).
func TestKVEventsOfEachShadowRebuildItsInstance(t *testing.T) {
	cfg := scenarioConfig(t, "chat")
	pub, err := kvevents.Start(kvevents.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	streams := map[string]*kvevents.Stream{}
	observe := func(addr string) ([]runner.Observer, []prometheus.Collector) {
		mu.Lock()
		defer mu.Unlock()
		s := streams[addr]
		if s == nil {
			var err error
			if s, err = pub.NewStream("kv@" + addr); err != nil {
				t.Error(err)
				return nil, nil
			}
			streams[addr] = s
		}
		return []runner.Observer{s}, nil
	}
	// What the subscriber rebuilt, by topic.
	type block struct {
		parent    uint64
		hasParent bool
		tokens    []int64
	}
	rebuilt := map[string]map[uint64]block{}
	batches := map[string]uint64{}
	var problem error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kvevents.Subscribe(ctx, kvevents.SubscriberConfig{Endpoint: "tcp://" + pub.Addr().String(), ReplayEndpoint: "tcp://" + pub.ReplayAddr().String(),
			Topic: "kv@", ReplayByTopic: true, FromStart: true}, func(m kvevents.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Missing > 0 || m.Err != nil {
				problem = fmt.Errorf("%s: batch %d: missing %d, %v", m.Topic, m.Seq, m.Missing, m.Err)
				return nil
			}
			bs := rebuilt[m.Topic]
			if bs == nil {
				bs = map[uint64]block{}
				rebuilt[m.Topic] = bs
			}
			batches[m.Topic]++
			for _, ev := range m.Batch.Events {
				switch e := ev.(type) {
				case kvevents.AllBlocksCleared:
					clear(bs)
				case kvevents.BlockStored:
					var parent uint64
					has := e.ParentBlockHash != nil
					if has {
						parent = e.ParentBlockHash.N
					}
					for i, h := range e.BlockHashes {
						bs[h.N] = block{parent, has, e.TokenIDs[i*int(e.BlockSize) : (i+1)*int(e.BlockSize)]}
						parent, has = h.N, true
					}
				case kvevents.BlockRemoved:
					for _, h := range e.BlockHashes {
						delete(bs, h.N)
					}
				}
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe = %v", err)
		}
		pub.Close()
	})
	time.Sleep(200 * time.Millisecond) // let it subscribe
	tp := newTopology(t, []engine.Config{cfg, cfg}, Config{Engine: cfg, Observe: observe})
	d := tp.drive("chat", 5, 120, 2*time.Minute)
	if st := d.Stats(); st.Finished < 5 || st.CallErrors > 0 {
		t.Fatalf("driver stats %+v (last error %v): the scenario did not run", st, d.LastError())
	}
	tp.flush()
	for i, ds := range tp.ds {
		want := ds.blocks(t)
		topic := "kv@" + ds.addr()
		mu.Lock()
		s := streams[ds.addr()]
		mu.Unlock()
		if s == nil {
			t.Fatalf("D%d: no stream", i)
		}
		// The shadow is idle: its sender sends what it has within a linger.
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := batches[topic]
			mu.Unlock()
			if sent := s.Stats().Batches; sent > 0 && got == sent {
				time.Sleep(20 * time.Millisecond)
				if s.Stats().Batches == sent {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("D%d: the subscriber has %d batches of %d", i, got, s.Stats().Batches)
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		bs := rebuilt[topic]
		if problem != nil {
			t.Error(problem)
		}
		if len(want) == 0 || len(bs) != len(want) {
			t.Errorf("D%d: %d blocks rebuilt from %s, D holds %d", i, len(bs), topic, len(want))
		}
		for h, w := range want {
			g, ok := bs[h]
			toks := make([]int64, len(w.Tokens))
			for k, tk := range w.Tokens {
				toks[k] = int64(tk)
			}
			if !ok || g.parent != w.Parent || g.hasParent != w.HasParent || !slices.Equal(g.tokens, toks) {
				t.Errorf("D%d: block %016x rebuilt %+v (held %v), D's has parent %016x (%v) tokens %v", i, h, g, ok, w.Parent, w.HasParent, toks)
				break
			}
		}
		mu.Unlock()
	}
}

// blocks returns the blocks D's prefix cache holds, read on its engine's goroutine.
func (d *decodeServer) blocks(t *testing.T) map[uint64]blocks.Block {
	t.Helper()
	var bs map[uint64]blocks.Block
	if err := d.r.Do(t.Context(), func(e *engine.Engine, _ time.Time) error {
		bs = blocks.Of(e.Prefix(), e.Config().PageSize)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return bs
}
