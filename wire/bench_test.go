package wire

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/internal/stepbench"
	"github.com/kvtop/kvtop/wire/protocol"
)

// steady is a runner hook that keeps n requests decoding: each finished one is replaced by
// a new prep_recv, whose KV arrives and which starts as soon as it is admitted. Each step
// then carries the same mix: a Decoded of about n ids, arrivals, admissions, finishes.
type steady struct {
	n, live, next int
	// reached, when set, is closed after the step numbered target (stepsOf).
	target  uint64
	reached chan struct{}
}

// stepsOf has a paused runner whose hook is h take n steps as fast as it can, and returns
// once they are taken: the hook says so, so nothing polls the engine meanwhile.
func stepsOf(r *runner.Runner, h *steady, n int) {
	done := make(chan struct{})
	r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
		h.target, h.reached = e.StepNumber()+uint64(n), done
		return nil
	})
	r.Control(feed.Control{Op: feed.ControlStep, N: n})
	<-done
}

func (h *steady) BeforeStep(e *engine.Engine, now time.Time) {
	for ; h.live < h.n; h.live++ {
		p := make([]int32, 200)
		for j := range p {
			p[j] = int32(h.next*1000 + j)
		}
		if err := e.PrepRecv(now, engine.PrepRecv{ID: fmt.Sprint("r", h.next), Prompt: p, End: -1, HasEnd: true, MaxTokens: 64}); err != nil {
			panic(err)
		}
		h.next++
	}
}

func (h *steady) AfterStep(e *engine.Engine, rd engine.Ready) {
	for _, ev := range rd.Events {
		switch ev := ev.(type) {
		case engine.MetadataEmitted:
			if _, err := e.ReceiveKV(time.UnixMilli(rd.Now), pages.Expand(nil, ev.Runs[0]), nil); err != nil {
				panic(err)
			}
			if err := e.StartGenerate(time.UnixMilli(rd.Now), ev.ID, -1); err != nil {
				panic(err)
			}
		case engine.RequestFinished, engine.RequestAborted:
			h.live--
		}
	}
	if h.reached != nil && e.StepNumber() >= h.target {
		close(h.reached)
		h.reached = nil
	}
}

// busyEngine returns a paused runner whose engine keeps n requests decoding (steady).
func busyEngine(b *testing.B, n int, rc runner.Config) (*runner.Runner, func()) {
	r, _, stop := busyEngineHook(b, n, rc)
	return r, stop
}

// busyEngineHook is busyEngine, with the hook.
func busyEngineHook(b *testing.B, n int, rc runner.Config) (*runner.Runner, *steady, func()) {
	b.Helper()
	e, err := engine.New(stepbench.Config())
	if err != nil {
		b.Fatal(err)
	}
	rc.Clock, rc.StartPaused = time.Now, true
	h := &steady{n: n}
	rc.Hook = h
	r := runner.New(e, rc)
	ctx, cancel := context.WithCancel(context.Background())
	go r.Run(ctx)
	return r, h, func() { cancel(); <-r.Done() }
}

// eventLog returns n events of a busy engine's life: arrivals, admissions, metadata, KV,
// starts, decodes of 32 requests, finishes, prefix changes, as a dashboard receives them.
func eventLog(b *testing.B, n int) []engine.Event {
	b.Helper()
	cfg := engine.DefaultConfig()
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	var out []engine.Event
	for i := 0; len(out) < n; i++ {
		p := make([]int32, 100+i%50)
		for j := range p {
			p[j] = int32(j + (i%7)*10000)
		}
		p[len(p)-1] = int32(50000 + i)
		if err := e.PrepRecv(now, engine.PrepRecv{ID: fmt.Sprint("req-", i), Prompt: p, End: -1, HasEnd: true, MaxTokens: 32}); err != nil {
			b.Fatal(err)
		}
		rd := e.Step(now)
		out = append(out, rd.Events...)
		for _, ev := range rd.Events {
			if m, ok := ev.(engine.MetadataEmitted); ok {
				e.ReceiveKV(now, pages.Expand(nil, m.Runs[0]), nil)
				e.StartGenerate(now, m.ID, -1)
			}
		}
		out = append(out, e.TakeEvents()...)
		now = now.Add(time.Millisecond)
	}
	return out[:n]
}

// logSource is a stream source that replays a real engine's life: a snapshot of the engine
// as it started, then its events a batch at a time, and from the start again (the snapshot,
// then the events) once they run out, so that a reader can fold them. It stays at most
// window events ahead of the slowest reader, so that what is measured is delivery, not a
// backlog that overflows and resyncs.
type logSource struct {
	sig     chan struct{}
	start   *engine.Snapshot
	log     []engine.Event
	batch   int
	next    int // the log's next event
	sent    int // events handed out
	first   bool
	readers *streamReaders
}

// streamReaders counts what each reader has received, and wakes the sources when they may
// send more.
type streamReaders struct {
	window  int
	mu      sync.Mutex
	got     []int
	sources []*logSource
}

func (r *streamReaders) slowest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := -1
	for _, g := range r.got {
		if m < 0 || g < m {
			m = g
		}
	}
	return m
}

func (r *streamReaders) add(i, n int) {
	r.mu.Lock()
	r.got[i] += n
	srcs := r.sources
	r.mu.Unlock()
	for _, s := range srcs {
		s.poke()
	}
}

func (r *streamReaders) source(start *engine.Snapshot, log []engine.Event, batch int) *logSource {
	s := &logSource{sig: make(chan struct{}, 1), start: start, log: log, batch: batch, first: true, readers: r}
	r.mu.Lock()
	r.sources = append(r.sources, s)
	r.mu.Unlock()
	s.poke()
	return s
}

func (s *logSource) poke() {
	select {
	case s.sig <- struct{}{}:
	default:
	}
}

func (s *logSource) C() <-chan struct{} { return s.sig }
func (s *logSource) Resync()            {}
func (s *logSource) Close()             {}
func (s *logSource) Take() feed.Update {
	if s.first {
		s.first = false
		s.poke()
		return feed.Update{Snapshot: s.start}
	}
	if s.sent-s.readers.slowest() >= s.readers.window {
		return feed.Update{} // a reader's progress pokes it again
	}
	var u feed.Update
	if s.next == len(s.log) {
		s.next = 0
		u.Snapshot = s.start
	}
	u.Events = s.log[s.next : s.next+s.batch]
	s.next += s.batch
	s.sent += s.batch
	s.poke()
	return u
}

// BenchmarkStreamEvents is the events delivered to each client a second, through the whole
// stream: a real engine's events (logSource) taken by the server, encoded, written, read,
// decoded and taken from the Client by a reader, to 1 and 8 clients on loopback, in updates
// of 1 to 4,096 events, each encoding. b.N updates go to every client; events/s is the
// events every client got, together, a second of the run. consume=fold also folds every
// event into a View, as a dashboard does.
func BenchmarkStreamEvents(b *testing.B) {
	e, _ := engine.New(engine.DefaultConfig())
	start := e.Snapshot()
	log := eventLog(b, 16384)
	r, stop := busyEngine(b, 0, runner.Config{})
	defer stop()
	type run struct {
		enc            string
		clients, batch int
		fold           bool
	}
	var runs []run
	for _, enc := range []string{"json", "binary"} {
		for _, clients := range []int{1, 8} {
			for _, batch := range []int{1, 64, 4096} {
				runs = append(runs, run{enc, clients, batch, false})
			}
		}
		runs = append(runs, run{enc, 1, 4096, true})
	}
	for _, rn := range runs {
		consume := "take"
		if rn.fold {
			consume = "fold"
		}
		b.Run(fmt.Sprintf("enc=%s/clients=%d/batch=%d/consume=%s", rn.enc, rn.clients, rn.batch, consume), func(b *testing.B) {
			readers := &streamReaders{window: 4 * max(rn.batch, 1024), got: make([]int, rn.clients)}
			srv := NewServer(r, Options{})
			srv.subscribe = func() source { return readers.source(&start, log, rn.batch) }
			ts := httptest.NewServer(srv)
			defer func() { srv.Close(); ts.Close() }()
			cs := make([]*Client, rn.clients)
			for i := range cs {
				c, err := Dial(context.Background(), ts.URL, ClientOptions{Backlog: 1 << 30, JSONEvents: rn.enc == "json"})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				cs[i] = c
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			var lost atomic.Uint64
			for i, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var v *engine.View
					for got := 0; got < b.N*rn.batch; {
						<-c.C()
						u := c.Take()
						if rn.fold {
							if u.Snapshot != nil {
								v, _ = engine.NewView(*u.Snapshot)
							}
							for _, ev := range u.Events {
								if err := v.Apply(ev); err != nil {
									b.Error(err)
									return
								}
							}
						}
						got += len(u.Events)
						readers.add(i, len(u.Events))
						lost.Store(max(lost.Load(), u.Dropped))
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(rn.clients*b.N*rn.batch)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(lost.Load()), "dropped")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkStreamBytes compares the websocket with raw TCP for the same bytes in the same
// run: a frame of 4096 real events (large batch) or of one (small), written back to back by
// one writer and read by one reader on loopback. MB/s is the figure.
func BenchmarkStreamBytes(b *testing.B) {
	log := eventLog(b, 4096)
	for _, batch := range []int{1, 4096} {
		var buf bytes.Buffer
		var enc protocol.Encoder
		if err := enc.Encode(&buf, &protocol.Frame{Type: protocol.FrameEvents, Seq: 1, Events: log[:batch]}); err != nil {
			b.Fatal(err)
		}
		msg := buf.Bytes()
		b.Run(fmt.Sprintf("batch=%d/transport=websocket", batch), func(b *testing.B) {
			wsBytes(b, msg)
		})
		b.Run(fmt.Sprintf("batch=%d/transport=tcp", batch), func(b *testing.B) {
			tcpBytes(b, msg)
		})
	}
}

func wsBytes(b *testing.B, msg []byte) {
	ready := make(chan *websocket.Conn, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			b.Error(err)
			return
		}
		ready <- conn
	}))
	defer ts.Close()
	client, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.URL, "http"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	server := <-ready
	defer server.Close()
	done := make(chan error, 1)
	go func() {
		for range b.N {
			_, r, err := client.NextReader()
			if err != nil {
				done <- err
				return
			}
			io.Copy(io.Discard, r)
		}
		done <- nil
	}()
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	for range b.N {
		if err := server.WriteMessage(websocket.TextMessage, msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func tcpBytes(b *testing.B, msg []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	defer server.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, client, int64(b.N)*int64(len(msg)))
		done <- err
	}()
	b.SetBytes(int64(len(msg)))
	b.ResetTimer()
	for range b.N {
		if _, err := server.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEngineSteps is the engine's steps per second, 256 requests decoding, with no
// stream client and with 8 slow ones, in one run: two engines alike, one with no client
// and one with 8 that each read a fixed 16 KiB every 10 ms (1.6 MB/s, through a 16 KiB
// socket buffer: a fraction of what the engine makes, so they fall behind, lose their
// backlog and resync over and over), stepped in turns of 500 steps each, so that both see
// the same machine. It reports each one's steps/s, their ratio, and what the slow clients went
// through: drop notices and snapshots a client, and the events each lost.
func BenchmarkEngineSteps(b *testing.B) {
	const turn = 500
	type side struct {
		r     *runner.Runner
		h     *steady
		spent time.Duration
	}
	var sides [2]side
	var drops, snaps, lost atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(quit); wg.Wait() }()
	for i, slow := range []int{0, 8} {
		r, h, stop := busyEngineHook(b, 256, runner.Config{Backlog: 4096})
		defer stop()
		srv := NewServer(r, Options{})
		ts := httptest.NewServer(srv)
		defer func() { srv.Close(); ts.Close() }()
		sides[i] = side{r: r, h: h}
		d := websocket.Dialer{ReadBufferSize: 16 << 10, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(16 << 10)
			}
			return c, err
		}}
		for range slow {
			conn, _, err := d.Dial("ws"+strings.TrimPrefix(ts.URL, "http")+StreamPath, nil)
			if err != nil {
				b.Fatal(err)
			}
			conn.SetReadLimit(-1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				chunk := make([]byte, 16<<10)
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					_, r, err := conn.NextReader()
					if err != nil {
						return
					}
					var head []byte
					for {
						select {
						case <-quit:
							return
						case <-tick.C:
						}
						n, err := r.Read(chunk)
						if len(head) < 64 {
							head = append(head, chunk[:n]...)
						}
						if err != nil {
							break
						}
					}
					switch {
					case bytes.HasPrefix(head, []byte(`{"type":"dropped"`)):
						drops.Add(1)
						if f, err := protocol.DecodeFrame(head); err == nil {
							lost.Add(int64(f.Dropped.Count))
						}
					case bytes.HasPrefix(head, []byte(`{"type":"snapshot"`)):
						snaps.Add(1)
					}
				}
			}()
		}
		stepsOf(r, h, 2000) // warm up: the clients connect and fall behind
	}
	drops.Store(0)
	snaps.Store(0)
	lost.Store(0)
	b.ResetTimer()
	for b.Loop() {
		for i := range sides {
			start := time.Now()
			stepsOf(sides[i].r, sides[i].h, turn)
			sides[i].spent += time.Since(start)
		}
	}
	b.StopTimer()
	steps := float64(b.N * turn)
	none, slow := steps/sides[0].spent.Seconds(), steps/sides[1].spent.Seconds()
	b.ReportMetric(none, "steps/s-none")
	b.ReportMetric(slow, "steps/s-8slow")
	b.ReportMetric(slow/none, "8slow/none")
	b.ReportMetric(float64(drops.Load())/8, "drops/client")
	b.ReportMetric(float64(snaps.Load())/8, "snapshots/client")
	b.ReportMetric(float64(lost.Load())/8, "lost-events/client")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkViewers is the engine's step rate on the same state (256 requests decoding,
// a snapshot of about 1 MB) with viewers that ask a lot of it, against none, in one run:
//
//   - clients=none: no stream client;
//   - readers=20: 20 clients that read everything;
//   - flood=20: the same 20, each also asking for a snapshot every 5 ms;
//   - churn=200: 200 clients that connect, read the hello and close, over and over; one
//     refused (503) waits the Retry-After it is given, as wire.Client backs off.
//
// pace=200 runs the engine at 200 steps a second, the regime of issue 11 (about 185 steps
// a second alone): what it measures is stalls, the engine's goroutine kept from stepping.
// pace=max steps as fast as the machine allows, so there every client's CPU counts too.
// Compare steps/s with clients=none of the same pace and run. snapshot-KB is the state's
// size; snapshots/s and connects/s are what the clients got.
func BenchmarkViewers(b *testing.B) {
	for _, pace := range []float64{200, 0} {
		for _, mode := range []string{"clients=none", "readers=20", "flood=20", "churn=200"} {
			name := fmt.Sprintf("pace=%v/%s", pace, mode)
			if pace == 0 {
				name = "pace=max/" + mode
			}
			b.Run(name, func(b *testing.B) { benchViewers(b, pace, mode) })
		}
	}
}

func benchViewers(b *testing.B, pace float64, mode string) {
	r, stop := busyEngine(b, 256, runner.Config{StepsPerSec: pace})
	defer stop()
	srv := NewServer(r, Options{})
	ts := httptest.NewServer(srv)
	defer func() { srv.Close(); ts.Close() }()
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + StreamPath
	var wg sync.WaitGroup
	var snapshots, connects atomic.Int64
	quit := make(chan struct{})
	sleep := func(d time.Duration) bool {
		select {
		case <-quit:
			return false
		case <-time.After(d):
			return true
		}
	}
	switch mode {
	case "readers=20", "flood=20":
		for range 20 {
			conn, _, err := websocket.DefaultDialer.Dial(url, nil)
			if err != nil {
				b.Fatal(err)
			}
			conn.SetReadLimit(-1)
			wg.Add(2)
			go func() {
				defer wg.Done()
				head := make([]byte, 20)
				for {
					_, rd, err := conn.NextReader()
					if err != nil {
						return
					}
					n, _ := io.ReadFull(rd, head)
					if bytes.HasPrefix(head[:n], []byte(`{"type":"snapshot"`)) {
						snapshots.Add(1)
					}
					io.Copy(io.Discard, rd)
				}
			}()
			go func() {
				defer wg.Done()
				defer conn.Close()
				for sleep(5 * time.Millisecond) {
					if mode == "flood=20" && conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"snapshot"}`)) != nil {
						return
					}
				}
			}()
		}
	case "churn=200":
		for range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					conn, resp, err := websocket.DefaultDialer.Dial(url, nil)
					if err != nil {
						wait := 50 * time.Millisecond
						if resp != nil && resp.Header.Get("Retry-After") != "" {
							wait = time.Second
						}
						if !sleep(wait) {
							return
						}
						continue
					}
					_, _, err = conn.ReadMessage() // the hello
					conn.Close()
					if err == nil {
						connects.Add(1)
					}
					select {
					case <-quit:
						return
					default:
					}
				}
			}()
		}
	}
	// Warm up: the clients connect and the state fills.
	runSteps(r, 500)
	var size int
	r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error {
		s := e.Snapshot()
		var buf bytes.Buffer
		protocol.EncodeFrame(&buf, &protocol.Frame{Type: protocol.FrameSnapshot, Snapshot: &s})
		size = buf.Len()
		return nil
	})
	snapshots.Store(0)
	connects.Store(0)
	b.ResetTimer()
	if pace > 0 {
		// Paced: run until b.N more steps are taken.
		target := stepNumber(r) + uint64(b.N)
		r.Control(feed.Control{Op: feed.ControlResume})
		for stepNumber(r) < target {
			time.Sleep(time.Millisecond)
		}
		r.Control(feed.Control{Op: feed.ControlPause})
	} else {
		runSteps(r, b.N)
	}
	b.StopTimer()
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/secs, "steps/s")
	b.ReportMetric(float64(size)/1000, "snapshot-KB")
	b.ReportMetric(float64(snapshots.Load())/secs, "snapshots/s")
	b.ReportMetric(float64(connects.Load())/secs, "connects/s")
	close(quit)
	srv.Close()
	wg.Wait()
}

// stepNumber returns the steps a runner's engine has taken.
func stepNumber(r *runner.Runner) uint64 {
	var n uint64
	r.Do(context.Background(), func(e *engine.Engine, _ time.Time) error { n = e.StepNumber(); return nil })
	return n
}

// runSteps has a paused runner take n steps as fast as it can, a thousand at a time, and
// returns once they are taken.
func runSteps(r *runner.Runner, n int) {
	const chunk = 1000
	for done := 0; done < n; done += chunk {
		k := min(chunk, n-done)
		target := stepNumber(r) + uint64(k)
		r.Control(feed.Control{Op: feed.ControlStep, N: k})
		for stepNumber(r) < target {
			time.Sleep(200 * time.Microsecond)
		}
	}
}
