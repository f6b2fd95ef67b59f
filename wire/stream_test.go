package wire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire"
	"github.com/kvtop/kvtop/wire/protocol"
)

// flow plays a router and a prefill instance for one request: prep_recv, the KV, and a
// completion.
func (h *harness) flow(t *testing.T, id string, p []int32, maxTokens int) {
	t.Helper()
	ans := h.prepRecv(id, p, -1, maxTokens)
	if status, b := h.writeKV(ans.KVAppendMetadata, -1, 0, nil); status != http.StatusOK {
		t.Errorf("KV of %s = %d %s", id, status, b)
		return
	}
	h.startGenerate(id, len(p)-1)
}

// load runs n flows, several at a time, with prompts that share prefixes.
func (h *harness) load(t *testing.T, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p := prompt(40+i%17, int32(i%4))
			p[len(p)-1] = int32(90000 + i) // distinct last tokens
			h.flow(t, fmt.Sprint(prefix, i), p, 2+i%5)
		}()
	}
	wg.Wait()
}

// readFrame reads one frame from a raw stream connection.
func readFrame(t *testing.T, conn *websocket.Conn) *protocol.Frame {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := conn.ReadMessage()
	if err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	f, err := protocol.DecodeFrame(data)
	if err != nil {
		t.Fatalf("DecodeFrame(%.200s): %v", data, err)
	}
	return f
}

// A stream starts with hello and a snapshot; then events come in frames whose seq grows by
// one, several to a frame, and applying them to the snapshot gives the engine's state.
func TestStreamHelloSnapshotThenOrderedEvents(t *testing.T) {
	h := newHarness(t, setup{})
	conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello := readFrame(t, conn)
	if hello.Type != protocol.FrameHello || hello.Hello.Protocol != protocol.Version || hello.Hello.Server != "kvtop test" ||
		hello.Hello.Control || hello.Hello.Config.MaxTotalSequenceLength != 8192 {
		t.Fatalf("first frame = %+v, want hello, protocol %d, read-only, the engine's config", hello, protocol.Version)
	}
	snap := readFrame(t, conn)
	if snap.Type != protocol.FrameSnapshot || snap.Seq != 1 {
		t.Fatalf("second frame = %s seq %d, want snapshot seq 1", snap.Type, snap.Seq)
	}
	var v viewer
	v.apply(t, feed.Update{Snapshot: snap.Snapshot})
	h.load(t, "r", 20)
	h.pause()
	want := h.snapshot()
	seq, batched := snap.Seq, false
	for v.view.Stamp() != want.Stamp {
		f := readFrame(t, conn)
		switch f.Type {
		case protocol.FrameEvents:
			if f.Seq != seq+1 {
				t.Fatalf("events frame seq %d after %d, want %d", f.Seq, seq, seq+1)
			}
			seq = f.Seq
			batched = batched || len(f.Events) > 1
			v.apply(t, feed.Update{Events: f.Events})
		case protocol.FrameStatus:
			if f.Status.Controllable {
				t.Errorf("status says controllable on a read-only server")
			}
		default:
			t.Fatalf("unexpected %s frame", f.Type)
		}
	}
	sameState(t, v.view.Snapshot(), want)
	if !batched {
		t.Errorf("every events frame held one event; want batches")
	}
}

// A client that asks for binary events at the handshake is told so in the hello and gets
// its events frames as binary messages (every other frame stays JSON); one that does not
// gets JSON. Both, and the Go client either way, build the engine's state from them.
func TestBinaryEventsAreNegotiated(t *testing.T) {
	h := newHarness(t, setup{})
	dial := func(hdr http.Header) *websocket.Conn {
		conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), hdr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	raw := map[string]*websocket.Conn{
		"json":   dial(nil),
		"binary": dial(http.Header{wire.HeaderEvents: {"binary"}}),
	}
	var clients []*wire.Client
	for _, jsonEvents := range []bool{false, true} {
		c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{JSONEvents: jsonEvents})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	views := map[string]*viewer{}
	for enc, conn := range raw {
		var bin protocol.BinaryDecoder
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, data, err := conn.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		hello, err := protocol.DecodeFrame(data)
		if err != nil || hello.Type != protocol.FrameHello || hello.Hello.Events != enc {
			t.Fatalf("%s client: first frame %+v (%v), want a hello saying %q", enc, hello, err, enc)
		}
		v := &viewer{}
		views[enc] = v
		go func() {
			for {
				typ, data, err := conn.ReadMessage()
				if err != nil {
					return
				}
				var f *protocol.Frame
				if typ == websocket.BinaryMessage {
					f, err = bin.Decode(data)
				} else {
					f, err = protocol.DecodeFrame(data)
				}
				if err != nil {
					t.Errorf("%s client: %v", enc, err)
					return
				}
				if (typ == websocket.BinaryMessage) != (enc == "binary" && f.Type == protocol.FrameEvents) {
					t.Errorf("%s client: a %s frame as message type %d", enc, f.Type, typ)
				}
				h.mu.Lock()
				switch f.Type {
				case protocol.FrameSnapshot:
					v.apply(t, feed.Update{Snapshot: f.Snapshot})
				case protocol.FrameEvents:
					v.apply(t, feed.Update{Events: f.Events})
				}
				h.mu.Unlock()
			}
		}()
	}
	h.load(t, "r", 20)
	h.pause()
	want := h.snapshot()
	deadline := time.Now().Add(10 * time.Second)
	for enc, v := range views {
		for {
			h.mu.Lock()
			done := v.view != nil && v.view.Stamp() == want.Stamp
			h.mu.Unlock()
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the %s client did not reach the engine's state", enc)
			}
			time.Sleep(5 * time.Millisecond)
		}
		h.mu.Lock()
		sameState(t, v.view.Snapshot(), want)
		h.mu.Unlock()
	}
	for i, c := range clients {
		var v viewer
		for v.view == nil || v.view.Stamp() != want.Stamp {
			<-c.C()
			v.apply(t, c.Take())
		}
		sameState(t, v.view.Snapshot(), want)
		if v.dropped != 0 {
			t.Errorf("Go client %d dropped %d events", i, v.dropped)
		}
	}
}

// Read-only by default: pause is refused with an error frame; a resync request is always
// answered with a snapshot.
func TestStreamIsReadOnlyWithoutControl(t *testing.T) {
	h := newHarness(t, setup{})
	conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	readFrame(t, conn) // hello
	readFrame(t, conn) // snapshot
	expect := func(msg, typ, want string) *protocol.Frame {
		t.Helper()
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		for {
			f := readFrame(t, conn)
			if f.Type != typ {
				continue // events and status go on meanwhile
			}
			if typ == protocol.FrameError && (f.Error.Type != want) {
				t.Errorf("after %s: error %+v, want type %s", msg, f.Error, want)
			}
			return f
		}
	}
	expect(`{"type":"pause"}`, protocol.FrameError, "read_only")
	expect(`{"type":"step","n":3}`, protocol.FrameError, "read_only")
	expect(`{"type":"jump"}`, protocol.FrameError, "invalid_request")
	expect(`not json`, protocol.FrameError, "invalid_json")
	if f := expect(`{"type":"snapshot"}`, protocol.FrameSnapshot, ""); f.Seq < 2 {
		t.Errorf("resync snapshot seq = %d, want after the first", f.Seq)
	}
	if h.r.Status().Paused {
		t.Errorf("a read-only client paused the engine")
	}
	c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Control(feed.Control{Op: feed.ControlPause}); err != feed.ErrReadOnly {
		t.Errorf("Client.Control(pause) on a read-only server = %v, want feed.ErrReadOnly", err)
	}
}

// With control on, a client pauses, steps and resumes the engine, and sees it in status.
func TestStreamControl(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Control = true }})
	c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var v viewer
	takeUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !cond() {
			select {
			case <-c.C():
				v.apply(t, c.Take())
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	takeUntil("the first status", func() bool { return v.status != nil })
	if !v.status.Controllable {
		t.Errorf("status on a server with control: controllable false")
	}
	if err := c.Control(feed.Control{Op: feed.ControlPause}); err != nil {
		t.Fatal(err)
	}
	takeUntil("a paused status", func() bool { return v.status.Paused })
	h.pause()
	before := h.snapshot().Totals.Steps
	if err := c.Control(feed.Control{Op: feed.ControlStep, N: 3}); err != nil {
		t.Fatal(err)
	}
	takeUntil("3 steps", func() bool { return v.view.Totals().Steps == before+3 })
	time.Sleep(20 * time.Millisecond)
	if got := h.snapshot().Totals.Steps; got != before+3 {
		t.Errorf("steps after step 3 while paused = %d, want %d", got, before+3)
	}
	// {"type":"step"} without n is one step (a raw client; the Go client always sends n).
	raw, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.WriteMessage(websocket.TextMessage, []byte(`{"type":"step"}`)); err != nil {
		t.Fatal(err)
	}
	takeUntil("one more step", func() bool { return v.view.Totals().Steps == before+4 })
	if got := h.snapshot().Totals.Steps; got != before+4 {
		t.Errorf(`steps after {"type":"step"} = %d, want one more: %d`, got, before+4)
	}
	if err := c.Control(feed.Control{Op: feed.ControlResume}); err != nil {
		t.Fatal(err)
	}
	takeUntil("a running status", func() bool { return !v.status.Paused })
	if err := c.Control(feed.Control{Op: feed.ControlStep, N: 0}); err == nil {
		t.Errorf("Control(step 0) = nil, want an error")
	}
}

// smallBuffers makes a listener whose connections have tiny kernel buffers, so that a
// client that does not read blocks the server's writes after a few kilobytes.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// A client that stops reading does not hold up the engine or the other clients: its
// backlog is dropped; when it reads again it is told how much it lost and gets a snapshot
// from which the events that follow apply. Meanwhile a reading client sees every event.
func TestStalledClientDropsAndResyncs(t *testing.T) {
	// Paced (1,000 steps a second, far below what a reading client decodes) so that what
	// separates the two clients is reading, not a race for the machine's two cores.
	h := newHarness(t, setup{runner: func(c *runner.Config) { c.Backlog = 1024; c.StepsPerSec = 1000 }})
	// Restart the HTTP side on a listener with small buffers.
	h.ts.Close()
	ts := httptest.NewUnstartedServer(h.srv)
	ts.Listener = smallBuffers{ts.Listener}
	ts.Start()
	h.ts = ts

	reader, err := wire.Dial(context.Background(), ts.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var rv viewer
	readerDone := make(chan struct{})
	stopReader := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case _, ok := <-reader.C():
				if !ok {
					return
				}
				rv.apply(t, reader.Take())
			case <-stopReader:
				return
			}
		}
	}()

	d := websocket.Dialer{NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(4 << 10)
		}
		return c, err
	}}
	stalled, _, err := d.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()

	h.load(t, "r", 150) // the engine does all of it while the stalled client reads nothing
	h.pause()
	want := h.snapshot()
	if want.Totals.Finished != 150 {
		t.Fatalf("finished %d requests with a stalled client attached, want 150", want.Totals.Finished)
	}

	// The stalled client reads again: dropped, then a snapshot, then events that apply.
	var sv viewer
	// Notices: one or more (while the client is slow to drain its socket, a backlog can
	// overflow again after the first snapshot); each snapshot follows one.
	var dropped *protocol.Dropped
	var notices, counted uint64
	var seq uint64
	for sv.view == nil || sv.view.Stamp() != want.Stamp {
		f := readFrame(t, stalled)
		switch f.Type {
		case protocol.FrameDropped:
			dropped = f.Dropped
			notices++
			counted += f.Dropped.Count
		case protocol.FrameSnapshot:
			if sv.view != nil && dropped == nil {
				t.Fatalf("a second snapshot without a dropped notice")
			}
			seq = f.Seq
			sv.apply(t, feed.Update{Snapshot: f.Snapshot})
		case protocol.FrameEvents:
			if f.Seq != seq+1 {
				t.Fatalf("events seq %d after %d", f.Seq, seq)
			}
			seq = f.Seq
			sv.apply(t, feed.Update{Events: f.Events})
		}
	}
	if dropped == nil || dropped.Count == 0 || dropped.Total != counted {
		t.Fatalf("the stalled client was told it dropped %+v after %d notices counting %d, want counts that add up to the total", dropped, notices, counted)
	}
	sameState(t, sv.view.Snapshot(), want)

	close(stopReader)
	<-readerDone
	for rv.view.Stamp() != want.Stamp {
		<-reader.C()
		rv.apply(t, reader.Take())
	}
	sameState(t, rv.view.Snapshot(), want)
	if rv.dropped != 0 {
		t.Errorf("the reading client dropped %d events", rv.dropped)
	}
	if got := metric(t, h, "kvtop_stream_dropped_events_total"); got != fmt.Sprint(dropped.Total) {
		t.Errorf("kvtop_stream_dropped_events_total = %s, want %d", got, dropped.Total)
	}
}

// A client that answers no pings is closed.
func TestDeadClientIsClosed(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Limits.PingInterval = 20 * time.Millisecond }})
	conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "the stream client to be counted", func() bool { return metric(t, h, "kvtop_stream_clients") == "1" })
	// conn never reads, so it never answers a ping.
	waitFor(t, "the dead client to be closed", func() bool { return metric(t, h, "kvtop_stream_clients") == "0" })
}

// metric returns a metric's value from GET /metrics ("" when absent).
func metric(t *testing.T, h *harness, name string) string {
	t.Helper()
	status, b := h.call(context.Background(), http.MethodGet, "/metrics", nil, nil)
	if status != http.StatusOK {
		t.Fatalf("GET /metrics = %d", status)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// A client that does not Take drops its own backlog and asks for a snapshot; Update.Dropped
// says how much, and the state it then builds is the engine's.
func TestClientBacklogOverflowResyncs(t *testing.T) {
	h := newHarness(t, setup{})
	c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{Backlog: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var v viewer
	for v.view == nil {
		<-c.C()
		v.apply(t, c.Take())
	}
	h.load(t, "r", 10)
	h.pause()
	want := h.snapshot()
	for v.view.Stamp() != want.Stamp {
		<-c.C()
		v.apply(t, c.Take())
	}
	if v.dropped == 0 || c.Resyncs() == 0 || v.snapshots < 2 {
		t.Errorf("after overflowing a backlog of 16: dropped %d, resyncs %d, snapshots %d; want all > 0 (and 2 snapshots)", v.dropped, c.Resyncs(), v.snapshots)
	}
	sameState(t, v.view.Snapshot(), want)
}

// A gap in seq makes the client drop what follows until a fresh snapshot it asks for.
func TestSeqGapForcesResync(t *testing.T) {
	cfg := testConfig()
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	step := func(id string, salt int32) []engine.Event {
		if err := e.PrepRecv(now, engine.PrepRecv{ID: id, Prompt: prompt(40, salt), End: -1, HasEnd: true}); err != nil {
			t.Fatal(err)
		}
		evs := e.TakeEvents()
		return append(evs, e.Step(now).Events...)
	}
	frames := make(chan *protocol.Frame)
	asked := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		go func() {
			_, b, err := conn.ReadMessage()
			if err == nil {
				asked <- string(b)
			}
		}()
		for f := range frames {
			var buf bytes.Buffer
			if err := protocol.EncodeFrame(&buf, f); err != nil {
				t.Error(err)
				return
			}
			if err := conn.WriteMessage(websocket.TextMessage, buf.Bytes()); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	defer close(frames)

	c, err := wire.Attach(srv.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frames <- &protocol.Frame{Type: protocol.FrameHello, Hello: &protocol.Hello{Protocol: protocol.Version, Config: cfg}}
	snap := e.Snapshot()
	frames <- &protocol.Frame{Type: protocol.FrameSnapshot, Seq: 1, Snapshot: &snap}
	e1 := step("A", 1)
	frames <- &protocol.Frame{Type: protocol.FrameEvents, Seq: 2, Events: e1}
	var v viewer
	for v.events < len(e1) {
		<-c.C()
		v.apply(t, c.Take())
	}
	e2 := step("B", 2)
	frames <- &protocol.Frame{Type: protocol.FrameEvents, Seq: 4, Events: e2} // 3 is missing
	if got := <-asked; got != `{"type":"snapshot"}`+"\n" && got != `{"type":"snapshot"}` {
		t.Fatalf("after a gap the client sent %q, want a snapshot request", got)
	}
	e3 := step("C", 3)
	frames <- &protocol.Frame{Type: protocol.FrameEvents, Seq: 5, Events: e3} // still dropped
	snap = e.Snapshot()
	frames <- &protocol.Frame{Type: protocol.FrameSnapshot, Seq: 6, Snapshot: &snap}
	e4 := step("D", 4)
	frames <- &protocol.Frame{Type: protocol.FrameEvents, Seq: 7, Events: e4}
	want := e.Snapshot()
	for v.view.Stamp() != want.Stamp || v.snapshots < 2 {
		<-c.C()
		v.apply(t, c.Take())
	}
	if v.events != len(e1)+len(e4) || c.Resyncs() != 1 {
		t.Errorf("applied %d events with %d resyncs; want %d (the frames before the gap and after the new snapshot) and 1", v.events, c.Resyncs(), len(e1)+len(e4))
	}
	if want := uint64(len(e2) + len(e3)); v.dropped != want {
		t.Errorf("Take().Dropped = %d, want %d: the events of the frame after the gap and of the one after it, thrown away", v.dropped, want)
	}
	sameState(t, v.view.Snapshot(), want)
}

// A restarted server is a different engine: the client reconnects, with backoff, and ends
// up in the new engine's state.
func TestReconnectAfterServerRestart(t *testing.T) {
	h1 := newHarness(t, setup{})
	addr := h1.ts.Listener.Addr().String()
	c, err := wire.Attach(addr, wire.ClientOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var v viewer
	follow := func(h *harness, what string) {
		t.Helper()
		want := h.snapshot()
		deadline := time.After(10 * time.Second)
		for v.view == nil || v.view.Stamp() != want.Stamp || v.view.Config() != want.Config {
			select {
			case <-c.C():
				v.apply(t, c.Take())
			case <-deadline:
				t.Fatalf("timed out following %s; link %+v", what, c.Link())
			}
		}
		sameState(t, v.view.Snapshot(), want)
	}
	h1.load(t, "a", 5)
	h1.pause()
	follow(h1, "the first server")
	if v.epoch != 0 {
		t.Errorf("epoch of the first connection = %d, want 0", v.epoch)
	}
	if l := c.Link(); l.State != feed.LinkUp || l.Name != addr {
		t.Errorf("Link() = %+v, want connected to %s", l, addr)
	}
	h1.close()
	waitFor(t, "the client to notice", func() bool { return c.Link().State == feed.LinkReconnecting })
	waitFor(t, "a failed attempt", func() bool { return c.Link().Attempts > 0 })
	if l := c.Link(); l.Err == "" {
		t.Errorf("Link() while the server is down = %+v, want the error", l)
	}

	// The second server, on the same address, with another engine and other requests.
	h2 := newHarnessOn(t, addr, setup{cfg: func(c *engine.Config) { c.Seed, c.MaxNumSequence = 7, 8 }})
	h2.load(t, "b", 3)
	h2.pause()
	follow(h2, "the restarted server")
	if v.epoch != 1 {
		t.Errorf("epoch after reconnecting = %d, want 1: a recorder must know the steps may start over", v.epoch)
	}
	if l := c.Link(); l.State != feed.LinkUp || l.Attempts != 0 || l.Err != "" {
		t.Errorf("Link() after reconnecting = %+v, want connected", l)
	}
}

// newHarnessOn is newHarness on a given address.
func newHarnessOn(t *testing.T, addr string, s setup) *harness {
	t.Helper()
	var ln net.Listener
	waitFor(t, "the address to be free", func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	h := newHarness(t, s)
	h.ts.Close()
	ts := httptest.NewUnstartedServer(h.srv)
	ts.Listener.Close()
	ts.Listener = ln
	ts.Start()
	h.ts = ts
	return h
}

// A client that floods the server with snapshot requests gets them coalesced: at most one
// snapshot a ResyncInterval, answered with the latest state.
func TestResyncsAreCoalesced(t *testing.T) {
	const interval = 200 * time.Millisecond
	h := newHarness(t, setup{paused: true, opts: func(o *wire.Options) { o.Limits.ResyncInterval = interval }})
	conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for f := readFrame(t, conn); f.Type != protocol.FrameSnapshot; f = readFrame(t, conn) {
	}
	start := time.Now()
	for range 100 {
		if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"snapshot"}`)); err != nil {
			t.Fatal(err)
		}
	}
	snapshots := 0
	conn.SetReadDeadline(time.Now().Add(time.Second))
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			break // the read deadline: the window is over
		}
		if bytes.HasPrefix(data, []byte(`{"type":"snapshot"`)) {
			snapshots++
		}
	}
	allowed := 2 + int(time.Since(start)/interval)
	if snapshots == 0 || snapshots > allowed {
		t.Errorf("100 snapshot requests answered with %d snapshots in %v, want between 1 and %d (one a %v)", snapshots, time.Since(start).Round(time.Millisecond), allowed, interval)
	}
}

// Connection attempts beyond MaxConnectsPerSec are answered 503 with Retry-After, which the
// client takes as a reason to retry, not to give up; the next second has room again.
func TestStreamConnectionsAreCapped(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarness(t, setup{opts: func(o *wire.Options) { o.Limits.MaxConnectsPerSec = 3; o.Clock = clock }})
	for i := range 3 {
		conn, _, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
		if err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		conn.Close()
	}
	_, resp, err := websocket.DefaultDialer.Dial(h.wsURL(), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a fourth connection in the same second: %v (%v), want 503 with Retry-After", resp, err)
	}
	if _, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{}); err == nil || errors.Is(err, wire.ErrForbidden) || errors.Is(err, wire.ErrUnauthorized) {
		t.Errorf("Dial over the cap = %v, want a retryable error", err)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	c, err := wire.Dial(context.Background(), h.ts.URL, wire.ClientOptions{})
	if err != nil {
		t.Fatalf("a second later: %v", err)
	}
	c.Close()
}
