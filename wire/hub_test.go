package wire

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/runner"
	"github.com/kvtop/kvtop/feed"
)

// hubTest is a server whose stream reads a mailbox the test feeds, and an engine whose
// events the test offers through it.
type hubTest struct {
	t      *testing.T
	srv    *Server
	src    *feed.Mailbox
	e      *engine.Engine
	now    time.Time
	subs   int
	next   int
	cancel context.CancelFunc
}

func newHubTest(t *testing.T, backlog int) *hubTest {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength, cfg.MaxSingleSequenceLength, cfg.MaxNumSequence = 8192, 8192, 64
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := engine.New(cfg)
	r := runner.New(other, runner.Config{Clock: time.Now, StartPaused: true})
	ctx, cancel := context.WithCancel(context.Background())
	go r.Run(ctx)
	ht := &hubTest{t: t, e: e, now: time.UnixMilli(1_700_000_000_000), src: feed.NewMailbox(1 << 20), cancel: cancel}
	ht.srv = NewServer(r, Options{Limits: Limits{SnapshotInterval: time.Millisecond}})
	ht.srv.subscribe = func() source { ht.subs++; return ht.src }
	ht.srv.backlog = backlog
	snap := e.Snapshot()
	ht.src.Snapshot(&snap)
	t.Cleanup(func() { ht.srv.Close(); cancel(); <-r.Done() })
	return ht
}

// step has the engine take a request and a step, and offers its events to the hub.
func (ht *hubTest) step() []engine.Event {
	ht.t.Helper()
	p := make([]int32, 30)
	for i := range p {
		p[i] = int32(ht.next*100 + i)
	}
	if err := ht.e.PrepRecv(ht.now, engine.PrepRecv{ID: fmt.Sprint("r", ht.next), Prompt: p, End: -1, HasEnd: true, MaxTokens: 2}); err != nil {
		ht.t.Fatal(err)
	}
	ht.next++
	ht.now = ht.now.Add(time.Millisecond)
	evs := append(ht.e.TakeEvents(), ht.e.Step(ht.now).Events...)
	ht.src.Offer(evs)
	return evs
}

func (ht *hubTest) conn() *streamConn {
	c := &streamConn{s: ht.srv, sig: make(chan struct{}, 1)}
	c.hub = ht.srv.join(c)
	ht.t.Cleanup(func() { c.hub.leave(c) })
	return c
}

// until takes a connection's updates until one satisfies ok.
func (ht *hubTest) until(c *streamConn, what string, ok func(hubUpdate) bool) hubUpdate {
	ht.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-c.sig:
			if u := c.hub.take(c); ok(u) {
				return u
			}
		case <-deadline:
			ht.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func events(u hubUpdate) (n int) {
	for _, f := range u.frames {
		n += f.Len()
	}
	return n
}

// Every connection reads the hub's one subscription, and gets the same snapshot and the same
// frames, encoded once for all of them.
func TestHubSharesOneSubscriptionAndItsEncodings(t *testing.T) {
	ht := newHubTest(t, 1<<16)
	a, b, c := ht.conn(), ht.conn(), ht.conn()
	var first []hubUpdate
	for _, x := range []*streamConn{a, b, c} {
		first = append(first, ht.until(x, "the first snapshot", func(u hubUpdate) bool { return u.snap != nil }))
	}
	if first[0].snap != first[1].snap || first[1].snap != first[2].snap {
		t.Errorf("three connections got three snapshots, want one shared")
	}
	evs := ht.step()
	ua := ht.until(a, "the events", func(u hubUpdate) bool { return events(u) > 0 })
	ub := ht.until(b, "the events", func(u hubUpdate) bool { return events(u) > 0 })
	if events(ua) != len(evs) || len(ua.frames) != len(ub.frames) || ua.frames[0] != ub.frames[0] {
		t.Errorf("the connections got frames %v and %v of %d events, want the same shared frames", ua.frames, ub.frames, len(evs))
	}
	if !reflect.DeepEqual(ua.frames[0].Events(), evs) {
		t.Errorf("the frame holds other events than the engine's")
	}
	if ht.subs != 1 {
		t.Errorf("the stream subscribed %d times for three connections, want once", ht.subs)
	}
}

// A connection that does not keep up loses what the log no longer holds: it is told how many
// events it lost and starts over from a snapshot the hub builds from its view, which is the
// engine's state at that point; the events after it follow. One that keeps up loses
// nothing.
func TestHubConnectionThatFallsBehindStartsOverFromASnapshot(t *testing.T) {
	ht := newHubTest(t, 16)
	fast, slow := ht.conn(), ht.conn()
	ht.until(fast, "the first snapshot", func(u hubUpdate) bool { return u.snap != nil })
	ht.until(slow, "the first snapshot", func(u hubUpdate) bool { return u.snap != nil })
	got := 0
	var sent int
	for range 10 {
		sent += len(ht.step())
		u := ht.until(fast, "events", func(u hubUpdate) bool { return events(u) > 0 })
		got += events(u)
	}
	for got < sent {
		got += events(ht.until(fast, "the rest", func(u hubUpdate) bool { return events(u) > 0 }))
	}
	want := ht.e.Snapshot()
	u := ht.until(slow, "a snapshot", func(u hubUpdate) bool { return u.snap != nil })
	if u.dropped == 0 || u.dropped > uint64(sent) {
		t.Errorf("the slow connection was told it lost %d of %d events", u.dropped, sent)
	}
	if u.snap.upto != uint64(sent) || !reflect.DeepEqual(*u.snap.snap, want) {
		t.Errorf("the slow connection's snapshot is at %d events of %d, or not the engine's state", u.snap.upto, sent)
	}
	if fu := fast.hub.take(fast); fu.dropped != 0 {
		t.Errorf("the connection that kept up was told it lost %d events", fu.dropped)
	}
}

// Connections that need a snapshot at once (they joined, or asked) get one, built once for
// all of them.
func TestHubBuildsOneSnapshotForAllThatNeedOne(t *testing.T) {
	ht := newHubTest(t, 1<<16)
	cs := []*streamConn{ht.conn(), ht.conn(), ht.conn(), ht.conn()}
	for _, c := range cs {
		ht.until(c, "the first snapshot", func(u hubUpdate) bool { return u.snap != nil })
	}
	ht.step()
	for _, c := range cs {
		ht.until(c, "events", func(u hubUpdate) bool { return events(u) > 0 })
	}
	time.Sleep(2 * ht.srv.lim.SnapshotInterval) // the first snapshot is no longer recent
	for _, c := range cs {
		c.hub.resync(c)
	}
	var snaps []*hubSnapshot
	for _, c := range cs {
		snaps = append(snaps, ht.until(c, "a new snapshot", func(u hubUpdate) bool { return u.snap != nil }).snap)
	}
	for _, sn := range snaps[1:] {
		if sn != snaps[0] {
			t.Fatalf("four connections asking at once got several snapshots, want one")
		}
	}
	if want := ht.e.Snapshot(); !reflect.DeepEqual(*snaps[0].snap, want) {
		t.Errorf("the snapshot built from the hub's view is not the engine's state")
	}
}

// When the hub's own subscription starts over (it fell behind the engine), every connection
// starts over from the snapshot it gets, told of the events lost.
func TestHubStartsOverWithItsSubscription(t *testing.T) {
	ht := newHubTest(t, 1<<16)
	c := ht.conn()
	ht.until(c, "the first snapshot", func(u hubUpdate) bool { return u.snap != nil })
	ht.src.AddDropped(5)
	snap := ht.e.Snapshot()
	ht.src.Snapshot(&snap)
	u := ht.until(c, "the new snapshot", func(u hubUpdate) bool { return u.snap != nil })
	if u.snap.snap != &snap || u.dropped != 5 {
		t.Errorf("after the subscription's snapshot: snapshot %p (want %p), dropped %d (want 5)", u.snap.snap, &snap, u.dropped)
	}
}
