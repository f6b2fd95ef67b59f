package runner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
	"github.com/kvtop/kvtop/feed"
)

func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 8192
	cfg.MaxNumSequence = 64
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func prompt(n int, salt int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = salt*1000 + int32(i)
	}
	return p
}

// drive plays a router and a prefill instance against the runner: a request every 20ms,
// its KV at once, then start_generate, so that every step has work.
func drive(ctx context.Context, t *testing.T, r *Runner, n int) {
	for i := range n {
		id := fmt.Sprint("r-", i)
		go func() {
			ans, err := r.PrepRecv(ctx, engine.PrepRecv{ID: id, Prompt: prompt(40+i%30, int32(i%5)), End: -1, HasEnd: true, MaxTokens: 8})
			if err != nil {
				return
			}
			md, err := decodeRuns(ans.KVAppendMetadata)
			if err != nil {
				t.Errorf("%s: metadata: %v", id, err)
				return
			}
			_ = r.Do(ctx, func(e *engine.Engine, now time.Time) error {
				_, err := e.ReceiveKV(now, md, nil)
				return err
			})
			toks, err := r.StartGenerate(ctx, id, -1)
			if err != nil {
				return
			}
			for range toks {
			}
		}()
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func decodeRuns(s string) ([]int64, error) {
	arr, err := prepare.Decode(s)
	if err != nil {
		return nil, err
	}
	md, err := prepare.Split(arr)
	if err != nil {
		return nil, err
	}
	return pages.Expand(nil, md[0]), nil
}

// A subscriber that never reads does not slow the engine: the paced runner takes as many
// steps with it as without it, the stalled one is told what it lost and gets a snapshot, and
// a subscriber that reads sees every event in order (a View fed them equals the engine).
func TestStalledSubscriberDoesNotSlowTheEngine(t *testing.T) {
	steps := func(stalled int) (uint64, *Runner, *Subscription, []*Subscription, *engine.View) {
		var (
			r      *Runner
			reader *Subscription
			stuck  []*Subscription
			view   *engine.View
			n      uint64
		)
		synctest.Test(t, func(t *testing.T) {
			e := newEngine(t)
			r = New(e, Config{StepsPerSec: 100, Clock: time.Now, Backlog: 200})
			ctx, cancel := context.WithCancel(t.Context())
			go r.Run(ctx)
			for range stalled {
				stuck = append(stuck, r.Subscribe())
			}
			reader = r.Subscribe()
			dctx, stopDriving := context.WithCancel(ctx)
			go drive(dctx, t, r, 100)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range reader.C() {
					u := reader.Take()
					if u.Snapshot != nil {
						v, err := engine.NewView(*u.Snapshot)
						if err != nil {
							t.Errorf("NewView: %v", err)
							return
						}
						view = v
					}
					for _, ev := range u.Events {
						if err := view.Apply(ev); err != nil {
							t.Errorf("Apply: %v", err)
							return
						}
					}
				}
			}()
			time.Sleep(3 * time.Second)
			synctest.Wait()
			var snap engine.Snapshot
			_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error {
				n = e.StepNumber()
				return nil
			})
			// Stop the router, let everything settle, and compare the reader's view with the
			// engine between steps.
			stopDriving()
			r.Control(feed.Control{Op: feed.ControlPause})
			time.Sleep(time.Second)
			synctest.Wait()
			_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error {
				snap = e.Snapshot()
				return nil
			})
			synctest.Wait()
			if got := view.Snapshot(); !reflect.DeepEqual(got, snap) {
				t.Errorf("the reading subscriber's view differs from the engine's snapshot")
			}
			cancel()
			<-r.Done()
			<-done
		})
		return n, r, reader, stuck, view
	}
	alone, _, _, _, _ := steps(0)
	crowded, _, reader, stuck, _ := steps(8)
	// Under synctest the clock is fake, so what this catches is waiting: a runner that
	// blocked on a full mailbox would stop stepping. (The cost of offering is measured by
	// BenchmarkSteps.) Idle stretches step at the idle tick, hence fewer than 300.
	if alone < 100 {
		t.Errorf("steps in 3s at 100/s: %d, want over 100", alone)
	}
	if crowded+5 < alone {
		t.Errorf("stalled subscribers slowed the engine: %d steps, %d without them", crowded, alone)
	}
	if reader.Dropped() != 0 {
		t.Errorf("the reading subscriber lost %d events", reader.Dropped())
	}
	for i, s := range stuck {
		if s.Dropped() == 0 {
			t.Errorf("stalled subscriber %d lost nothing; its backlog should have overflowed", i)
		}
	}
}

// After a loss, Take returns a fresh snapshot (and the count), from which the events that
// follow apply cleanly.
func TestLostSubscriberGetsASnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(t)
		r := New(e, Config{StepsPerSec: 100, Clock: time.Now, Backlog: 50})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		s := r.Subscribe()
		first := s.Take()
		if first.Snapshot == nil {
			t.Fatal("first update has no snapshot")
		}
		go drive(ctx, t, r, 30)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		u := s.Take()
		if u.Snapshot == nil || u.Dropped == 0 {
			t.Fatalf("after overflowing: snapshot %v, dropped %d; want a snapshot and a count", u.Snapshot != nil, u.Dropped)
		}
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range u.Events {
			if err := v.Apply(ev); err != nil {
				t.Fatalf("Apply of an event that came with the snapshot: %v", err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		for _, ev := range s.Take().Events {
			if err := v.Apply(ev); err != nil {
				t.Fatalf("Apply after resync: %v", err)
			}
		}
		cancel()
		<-r.Done()
	})
}

func TestPauseAndSingleStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(t)
		r := New(e, Config{StepsPerSec: 10, Clock: time.Now, StartPaused: true})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		stepNumber := func() uint64 {
			var n uint64
			_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error { n = e.StepNumber(); return nil })
			return n
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := stepNumber(); n != 0 {
			t.Fatalf("paused for 5s: %d steps, want 0", n)
		}
		if err := r.Control(feed.Control{Op: feed.ControlStep, N: 3}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := stepNumber(); n != 3 {
			t.Fatalf("after step 3 while paused: %d steps, want 3", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := stepNumber(); n != 3 {
			t.Fatalf("still paused 1s later: %d steps, want 3", n)
		}
		if err := r.Control(feed.Control{Op: feed.ControlResume}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		// Resumed but idle: the idle tick (250ms) paces the steps, not the 10/s rate.
		if n := stepNumber(); n < 5 || n > 8 {
			t.Fatalf("1s after resuming an idle engine: %d steps, want 3 + about 4", n)
		}
		if !reflect.DeepEqual(r.Status().Paused, false) {
			t.Errorf("Status().Paused = true after resume")
		}
		if err := r.Control(feed.Control{Op: "jump"}); err == nil {
			t.Errorf("Control(jump) = nil, want an error")
		}
		cancel()
		<-r.Done()
	})
}

func TestPrepRecvWaitsForAdmissionAndAbortsWhenTheClientLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := engine.DefaultConfig()
		cfg.MaxTotalSequenceLength = 4096 // 257 pages: the watermark admits nothing
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := New(e, Config{StepsPerSec: 50, Clock: time.Now})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		_, err = r.PrepRecv(cctx, engine.PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("PrepRecv on a cache the watermark never admits = %v, want the client's deadline", err)
		}
		synctest.Wait()
		var st engine.RequestState
		_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error {
			rv, _ := e.Request("A")
			st = rv.State
			return nil
		})
		if st != engine.StateAborted {
			t.Errorf("after the client left, A is %s, want aborted", st)
		}
		if _, err := r.PrepRecv(ctx, engine.PrepRecv{ID: "B", Prompt: prompt(40, 1), End: 40, HasEnd: true}); err == nil {
			t.Errorf("PrepRecv with a bad window = nil, want an error")
		}
		cancel()
		<-r.Done()
	})
}

func TestStartGenerateStreamsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(newEngine(t), Config{Clock: time.Now})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		ans, err := r.PrepRecv(ctx, engine.PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true, MaxTokens: 5})
		if err != nil {
			t.Fatal(err)
		}
		if ans.KVAppendMetadata != "CAAAAAAAAABbMSwwLDM5XQ==" || ans.PromptLength != 40 || ans.PrefixMatchedLength != 0 {
			t.Fatalf("answer = %+v, want the worked example 1", ans)
		}
		toks, err := r.StartGenerate(ctx, "A", -1)
		if err != nil {
			t.Fatal(err)
		}
		var got []engine.Token
		for tok := range toks {
			got = append(got, tok)
		}
		if len(got) != 5 || !got[4].Final || got[4].FinishReason != "length" || got[0].Index != 0 || got[4].Index != 4 {
			t.Fatalf("tokens = %+v, want 5 indexed 0-4, the last final", got)
		}
		if _, err := r.StartGenerate(ctx, "A", -1); !errors.Is(err, engine.ErrNotPrepared) {
			t.Errorf("second StartGenerate = %v, want ErrNotPrepared", err)
		}
		cancel()
		<-r.Done()
	})
}

// A completion longer than the token channel's buffer still arrives whole and in order,
// while the runner never waits for the reader.
func TestLongCompletionOverflowsIntoItsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(newEngine(t), Config{Clock: time.Now})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go r.Run(ctx)
		if _, err := r.PrepRecv(ctx, engine.PrepRecv{ID: "A", Prompt: prompt(40, 1), End: -1, HasEnd: true, MaxTokens: 3000}); err != nil {
			t.Fatal(err)
		}
		toks, err := r.StartGenerate(ctx, "A", -1)
		if err != nil {
			t.Fatal(err)
		}
		if cap(toks) != maxTokenBuffer {
			t.Errorf("token buffer = %d, want %d", cap(toks), maxTokenBuffer)
		}
		// Read nothing until the request has run to the end.
		time.Sleep(time.Minute)
		synctest.Wait()
		n := 0
		for tok := range toks {
			if tok.Index != n {
				t.Fatalf("token %d has index %d", n, tok.Index)
			}
			n++
		}
		if n != 3000 {
			t.Errorf("read %d tokens, want 3000", n)
		}
		cancel()
		<-r.Done()
	})
}

// start runs a runner for e until the test ends, and returns it and its context.
func start(t *testing.T, e *engine.Engine, cfg Config) (*Runner, context.Context) {
	t.Helper()
	r := New(e, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	go r.Run(ctx)
	t.Cleanup(func() { cancel(); <-r.Done() })
	return r, ctx
}

// waiters returns what the runner holds for callers.
func waiters(t *testing.T, r *Runner) Waiters {
	t.Helper()
	w, err := r.Waiters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// prepared admits a request with its KV in, ready for start_generate.
func prepared(ctx context.Context, t *testing.T, r *Runner, id string, maxTokens int) {
	t.Helper()
	ans, err := r.PrepRecv(ctx, engine.PrepRecv{ID: id, Prompt: prompt(40, 1), End: -1, HasEnd: true, MaxTokens: maxTokens})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := decodeRuns(ans.KVAppendMetadata)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Do(ctx, func(e *engine.Engine, now time.Time) error { _, err := e.ReceiveKV(now, slots, nil); return err }); err != nil {
		t.Fatal(err)
	}
}

// A completion whose reader goes away without reading leaves nothing behind in the runner:
// no sink, no queued token, whatever the request goes on to generate.
func TestAbandonedCompletionLeavesNoSink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, ctx := start(t, newEngine(t), Config{Clock: time.Now})
		prepared(ctx, t, r, "A", 5000)
		rctx, leave := context.WithCancel(ctx)
		if _, err := r.StartGenerate(rctx, "A", -1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // the channel fills, the rest queues
		synctest.Wait()
		if w := waiters(t, r); w.Streams != 1 || w.QueuedTokens == 0 {
			t.Fatalf("with a reader that does not read: %+v, want 1 stream with tokens queued", w)
		}
		leave()
		synctest.Wait()
		if w := waiters(t, r); w != (Waiters{}) {
			t.Errorf("after the reader left: %+v, want nothing held", w)
		}
		time.Sleep(10 * time.Second) // the request keeps generating: nothing is queued for it
		synctest.Wait()
		if w := waiters(t, r); w != (Waiters{}) {
			t.Errorf("10s after the reader left: %+v, want nothing held", w)
		}
	})
}

// A start_generate whose client goes away while the call waits for the engine still ends
// the request (started, then aborted as a running request is), instead of leaving it
// prepared with its pages until the age hazard notices.
func TestStartGenerateAbandonedInTheQueueEndsItsRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, ctx := start(t, newEngine(t), Config{Clock: time.Now})
		prepared(ctx, t, r, "A", 16)
		gone, leave := context.WithCancel(ctx)
		leave() // gone before the call reaches the engine
		if _, err := r.StartGenerate(gone, "A", -1); !errors.Is(err, context.Canceled) {
			t.Errorf("StartGenerate for a client already gone = %v, want context.Canceled", err)
		}
		var rv engine.RequestView
		_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error { rv, _ = e.Request("A"); return nil })
		if rv.State != engine.StateAborted || rv.Leaked {
			t.Errorf("A after its start_generate was abandoned: %s (leaked %v), want aborted, not leaked", rv.State, rv.Leaked)
		}
		if w := waiters(t, r); w != (Waiters{}) {
			t.Errorf("after the abandoned start_generate: %+v, want nothing held", w)
		}
	})
}

// A max_tokens too large for any buffer makes a bounded one, not a panic.
func TestHugeMaxTokensGetsABoundedBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, ctx := start(t, newEngine(t), Config{Clock: time.Now})
		prepared(ctx, t, r, "A", math.MaxInt)
		toks, err := r.StartGenerate(ctx, "A", -1)
		if err != nil {
			t.Fatal(err)
		}
		if cap(toks) != maxTokenBuffer {
			t.Errorf("token buffer for max_tokens MaxInt = %d, want %d", cap(toks), maxTokenBuffer)
		}
	})
}

// Beyond MaxWaiting calls waiting for admission, prep_recv is refused with ErrBusy and the
// engine does not see the request; once one leaves, there is room again.
func TestPrepRecvBeyondMaxWaitingIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := engine.DefaultConfig()
		cfg.MaxTotalSequenceLength = 4096 // the watermark admits nothing: every call waits
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, ctx := start(t, e, Config{StepsPerSec: 50, Clock: time.Now, MaxWaiting: 3})
		leave := make([]context.CancelFunc, 3)
		for i := range leave {
			cctx, c := context.WithCancel(ctx)
			leave[i] = c
			go r.PrepRecv(cctx, engine.PrepRecv{ID: fmt.Sprint("w", i), Prompt: prompt(40, int32(i)), End: -1, HasEnd: true})
		}
		synctest.Wait()
		if w := waiters(t, r); w.PrepRecv != 3 {
			t.Fatalf("%d prep_recv waiting, want 3", w.PrepRecv)
		}
		_, err = r.PrepRecv(ctx, engine.PrepRecv{ID: "x", Prompt: prompt(40, 9), End: -1, HasEnd: true})
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("a fourth prep_recv = %v, want ErrBusy", err)
		}
		var known bool
		_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error { _, known = e.Request("x"); return nil })
		if known {
			t.Errorf("the refused request is in the engine")
		}
		leave[0]()
		synctest.Wait()
		go r.PrepRecv(ctx, engine.PrepRecv{ID: "y", Prompt: prompt(40, 8), End: -1, HasEnd: true})
		synctest.Wait()
		if w := waiters(t, r); w.PrepRecv != 3 {
			t.Errorf("after one left and another came: %d waiting, want 3", w.PrepRecv)
		}
	})
}

// The measured rate is 0 while paused, even while single steps run, and measures the pace
// again once resumed.
func TestRateIsZeroWhilePaused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := start(t, newEngine(t), Config{StepsPerSec: 100, Clock: time.Now, IdleTick: 10 * time.Millisecond})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if rate := r.Status().Rate; rate < 90 || rate > 110 {
			t.Fatalf("rate at 100 steps/s = %v", rate)
		}
		r.Control(feed.Control{Op: feed.ControlPause})
		synctest.Wait()
		if rate := r.Status().Rate; rate != 0 {
			t.Errorf("rate just after pausing = %v, want 0", rate)
		}
		r.Control(feed.Control{Op: feed.ControlStep, N: 100000})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if rate := r.Status().Rate; rate != 0 {
			t.Errorf("rate while paused, after a burst of single steps = %v, want 0", rate)
		}
		r.Control(feed.Control{Op: feed.ControlResume})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if rate := r.Status().Rate; rate < 90 || rate > 110 {
			t.Errorf("rate 3s after resuming at 100 steps/s = %v", rate)
		}
	})
}

// However many subscriptions want a snapshot at once, the engine builds one and they share
// it; while the engine does not change, it builds none at all.
func TestSubscribersShareOneSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := start(t, newEngine(t), Config{Clock: time.Now, StartPaused: true})
		r.Subscribe().Close() // the first snapshot of a fresh engine flushes its prefix tree
		subs := make([]*Subscription, 100)
		done := make(chan struct{})
		for i := range subs {
			go func() { subs[i] = r.Subscribe(); done <- struct{}{} }()
		}
		for range subs {
			<-done
		}
		first := subs[0].Take().Snapshot
		for i, s := range subs[1:] {
			if got := s.Take().Snapshot; got != first {
				t.Fatalf("subscription %d got snapshot %p, the first %p: want one shared", i+1, got, first)
			}
		}
		// Paused, nothing changes: resyncs are answered with the same snapshot.
		for range 5 {
			subs[7].Resync()
			if got := subs[7].Take().Snapshot; got != first {
				t.Fatalf("a resync of an unchanged engine built a new snapshot")
			}
			time.Sleep(time.Second)
		}
	})
}

// Twenty subscriptions that resync as fast as they can cost the engine at most one
// snapshot a SnapshotInterval, and the engine keeps its pace.
func TestResyncFloodBuildsOneSnapshotAnInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, ctx := start(t, newEngine(t), Config{Clock: time.Now, StepsPerSec: 100, IdleTick: 10 * time.Millisecond, SnapshotInterval: 50 * time.Millisecond})
		stop := make(chan struct{})
		var mu sync.Mutex
		seen := map[*engine.Snapshot]bool{}
		var wg sync.WaitGroup
		subs := make([]*Subscription, 20)
		for i := range subs {
			wg.Add(1)
			go func() { defer wg.Done(); subs[i] = r.Subscribe() }()
		}
		wg.Wait()
		for _, s := range subs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					s.Resync()
					if snap := s.Take().Snapshot; snap != nil {
						mu.Lock()
						seen[snap] = true
						mu.Unlock()
					}
				}
			}()
		}
		var before, after uint64
		_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error { before = e.StepNumber(); return nil })
		time.Sleep(2 * time.Second)
		_ = r.Do(ctx, func(e *engine.Engine, _ time.Time) error { after = e.StepNumber(); return nil })
		close(stop)
		wg.Wait()
		if n := len(seen); n > 2*1000/50+2 {
			t.Errorf("20 subscriptions resyncing for 2s got %d distinct snapshots, want at most one a 50ms interval (%d)", n, 2*1000/50+2)
		}
		if steps := after - before; steps < 190 {
			t.Errorf("the engine took %d steps in 2s at 100 a second under the flood, want about 200", steps)
		}
	})
}
