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
	"github.com/kvtop/kvtop/wire/protocol"
)

// steady is a runner hook that keeps n requests decoding: each finished one is replaced by
// a new prep_recv, whose KV arrives and which starts as soon as it is admitted. Each step
// then carries the same mix: a Decoded of about n ids, arrivals, admissions, finishes.
type steady struct {
	n, live, next int
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
}

// busyEngine returns a paused runner whose engine keeps n requests decoding (steady).
func busyEngine(b *testing.B, n int, rc runner.Config) (*runner.Runner, func()) {
	b.Helper()
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 1 << 20
	cfg.MaxSingleSequenceLength = 4096
	cfg.MaxNumSequence = 1024
	cfg.KeepFinished = 64
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rc.Clock, rc.StartPaused = time.Now, true
	if n > 0 {
		rc.Hook = &steady{n: n}
	}
	r := runner.New(e, rc)
	ctx, cancel := context.WithCancel(context.Background())
	go r.Run(ctx)
	return r, func() { cancel(); <-r.Done() }
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

// batchSource is a stream source that always has a batch of events ready: it measures the wire
// (encode, write, read, decode), not the engine.
type batchSource struct {
	sig   chan struct{}
	snap  *engine.Snapshot
	batch []engine.Event
	first bool
}

func newBatchSource(snap *engine.Snapshot, batch []engine.Event) *batchSource {
	f := &batchSource{sig: make(chan struct{}, 1), snap: snap, batch: batch, first: true}
	f.sig <- struct{}{}
	return f
}

func (f *batchSource) C() <-chan struct{} { return f.sig }
func (f *batchSource) Resync()            {}
func (f *batchSource) Close()             {}
func (f *batchSource) Take() feed.Update {
	select {
	case f.sig <- struct{}{}:
	default:
	}
	if f.first {
		f.first = false
		return feed.Update{Snapshot: f.snap}
	}
	return feed.Update{Events: f.batch}
}

// BenchmarkStreamEvents is events delivered per second through the wire (encoded by the
// server, written, read and decoded by Clients) to 1 and 8 clients on loopback, in batches
// of 1 to 4096 events a frame. b.N events go to each client.
func BenchmarkStreamEvents(b *testing.B) {
	log := eventLog(b, 4096)
	e, _ := engine.New(engine.DefaultConfig())
	snap := e.Snapshot()
	r, stop := busyEngine(b, 0, runner.Config{})
	defer stop()
	for _, clients := range []int{1, 8} {
		for _, batch := range []int{1, 64, 1024, 4096} {
			b.Run(fmt.Sprintf("clients=%d/batch=%d", clients, batch), func(b *testing.B) {
				srv := NewServer(r, Options{})
				srv.subscribe = func() source { return newBatchSource(&snap, log[:batch]) }
				ts := httptest.NewServer(srv)
				defer func() { srv.Close(); ts.Close() }()
				cs := make([]*Client, clients)
				for i := range cs {
					c, err := Dial(context.Background(), ts.URL, ClientOptions{Backlog: 1 << 30})
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					cs[i] = c
				}
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, c := range cs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						got := 0
						for got < b.N {
							<-c.C()
							got += len(c.Take().Events)
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(clients*b.N)/b.Elapsed().Seconds(), "events/s")
				b.ReportMetric(0, "ns/op")
			})
		}
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
// stream client and with 8 that read slowly (16 KiB every 5ms, so they fall behind, lose
// their backlog and resync). ns/op is per step.
func BenchmarkEngineSteps(b *testing.B) {
	for _, slow := range []int{0, 8} {
		b.Run(fmt.Sprintf("slow_clients=%d", slow), func(b *testing.B) {
			r, stop := busyEngine(b, 256, runner.Config{Backlog: 4096})
			defer stop()
			srv := NewServer(r, Options{})
			ts := httptest.NewServer(srv)
			defer func() { srv.Close(); ts.Close() }()
			var wg sync.WaitGroup
			var drops atomic.Int64
			quit := make(chan struct{})
			for range slow {
				conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.URL, "http")+StreamPath, nil)
				if err != nil {
					b.Fatal(err)
				}
				conn.SetReadLimit(-1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer conn.Close()
					// 16 KiB every 5ms: about 3 MB/s, far less than the engine makes.
					chunk := make([]byte, 16<<10)
					for {
						_, r, err := conn.NextReader()
						if err != nil {
							return
						}
						first := true
						for {
							n, err := r.Read(chunk)
							if first && n > 0 {
								first = false
								if bytes.HasPrefix(chunk[:n], []byte(`{"type":"dropped"`)) {
									drops.Add(1)
								}
							}
							select {
							case <-quit:
								return
							case <-time.After(5 * time.Millisecond):
							}
							if err != nil {
								break
							}
						}
					}
				}()
			}
			// Warm up: let the clients connect and fall behind.
			runSteps(r, 2000)
			b.ResetTimer()
			runSteps(r, b.N)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
			if slow > 0 {
				// The slow clients must have fallen behind for the figure to mean anything.
				b.ReportMetric(float64(drops.Load())/float64(slow), "drops/client")
			}
			close(quit)
			srv.Close()
			wg.Wait()
		})
	}
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
