package tap

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
	"github.com/kvtop/kvtop/engine/runner"
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
		var want map[uint64]blocks.Block
		if err := ds.r.Do(t.Context(), func(e *engine.Engine, _ time.Time) error {
			want = blocks.Of(e.Prefix(), e.Config().PageSize)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
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
