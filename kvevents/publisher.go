package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/blocks"
)

// Config configures a Publisher.
type Config struct {
	// Endpoint is where the PUB socket listens, tcp://HOST:PORT (port 0 picks one); with
	// Dial it is where it connects instead (a subscriber that listens, as llm-d's indexer
	// does).
	Endpoint string
	Dial     bool
	// ReplayEndpoint, when set, is where the ROUTER socket that answers replay requests
	// listens, tcp://HOST:PORT.
	ReplayEndpoint string
	// Buffer is how many of the last batches are kept for replay (default 10,000), and
	// BufferBytes the most bytes they may hold (default 256 MiB): an engine stepping flat
	// out fills batches of tens of kilobytes, which 10,000 of would make half a gigabyte.
	Buffer      int
	BufferBytes int
	// Queue bounds the observations waiting for the sender (default 1,024): the engine
	// never waits for it; an observation that does not fit is dropped and counted, and the
	// next one that fits starts subscribers over (AllBlocksCleared, then every block held).
	// Observations go over in hand-overs of up to 16 (a box), so the bound is kept to a box.
	Queue int
	// Linger is how long the sender waits, once it has sent everything queued, before it
	// waits for the next observation (default 1ms; negative: not at all). Batches are sent
	// up to a linger late, and the engine wakes the sender at most once a linger instead
	// of once a step: on a busy engine that wake-up is most of what publishing costs its
	// goroutine.
	Linger time.Duration
	// Topic is the first frame of every message (default empty).
	Topic    string
	Encoding Encoding
	// DPRank is the data-parallel rank sent with every batch.
	DPRank int64
	// HWM bounds the messages the PUB socket queues for its peers (default 100,000);
	// beyond it they are dropped, as libzmq drops them, and subscribers fill the gap by
	// replay.
	HWM int
	// Logf, when set, logs what a caller cannot see (a failed send, a bad replay request).
	Logf func(format string, args ...any)

	// In tests: the sender waits on hold before it takes a batch from the queue; skip leaves a batch out of the
	// PUB socket (it is still kept for replay).
	hold <-chan struct{}
	skip func(seq uint64) bool
}

// Stats count what a stream (or, summed, a publisher) did.
type Stats struct {
	Batches uint64 // batches sent on the PUB socket
	Dropped uint64 // observations dropped because the sender's queue was full
	Resyncs uint64 // batches that started subscribers over after a drop
	Replays uint64 // replay requests answered
	Blocks  int64  // blocks held, as of the last observation the sender applied
}

// Publisher publishes prefix caches' blocks as vLLM's KV events on one PUB socket (and
// answers replays on one ROUTER socket): its own Stream, whose topic is Config.Topic, for the
// engine of a decode instance (Observe), and any others made with Stream, one an engine, as
// a tap makes one for each decode instance it follows.
type Publisher struct {
	*Stream // Config.Topic's
	cfg     Config
	pub     zmq4.Socket
	rtr     zmq4.Socket
	wg      sync.WaitGroup
	stop    context.CancelFunc

	mu      sync.Mutex
	streams map[string]*Stream // by topic
	closed  bool
}

// Stream is one engine's KV events, under one topic with a sequence of its own: a
// runner.Observer on the engine's side, a goroutine that encodes and sends on the other, a
// bounded queue between them. A Stream that observes another engine than before starts
// its subscribers over, as after a drop (a shadow that starts over has a new engine).
type Stream struct {
	p     *Publisher
	topic string
	queue chan pending
	free  chan *box // boxes the sender is done with, for Observe to reuse
	boxN  int       // the most observations a box takes

	// The engine's side (Observe).
	eng     *engine.Engine // the engine observed last
	rd      *blocks.Reader
	lost    bool
	open    *box       // the box last queued, which takes more until the sender takes it
	local   blocks.Ops // what an observation reads, before it is handed over
	scratch blocks.Ops // what an observation reads while the queue stays full

	ringMu    sync.Mutex
	ring      []kept // the last Buffer batches, oldest first
	keptBytes int    // the bytes of their payloads
	seq       uint64 // the next batch's sequence number

	batches, dropped, resyncs, replays atomic.Uint64
	queued                             atomic.Uint64 // hand-overs queued for the sender
	applied                            atomic.Uint64 // of which the sender is done with
	blocks                             atomic.Int64
}

// pending is one hand-over to the sender: a box of what the Reader read, which the sender's
// Tracker turns into the batch's changes; or, in tests, the changes themselves.
type pending struct {
	ts       float64 // of changes
	box      *box
	changes  []blocks.Change
	pageSize int
}

// A box carries observations from the engine's goroutine to the sender's. The engine queues
// a box with one observation's Ops and appends the next observations' to it for as long as
// the sender has not taken it and it has room: at thousands of steps a second the engine
// then hands over a box about once a linger, not once a call, and a call costs it a
// compare-and-swap and a copy. Its state says who may touch ops, ts and n: the engine while
// it is appending, the sender once it has taken it; the sender, to take it, waits out an
// append (a copy of what one call read).
type box struct {
	state atomic.Int32
	n     int     // observations in it (the engine's)
	ts    float64 // the last observation's time
	ops   blocks.Ops
}

// A box's states.
const (
	boxOpen      int32 = iota // queued; the engine may append
	boxAppending              // the engine is appending
	boxTaken                  // the sender's, until it hands the box back for reuse
)

// take makes b the sender's, waiting out an append in progress.
func (b *box) take() {
	for !b.state.CompareAndSwap(boxOpen, boxTaken) {
		runtime.Gosched()
	}
}

type kept struct {
	seq     uint64
	payload []byte
}

// Start opens the sockets and starts the sender of Config.Topic's stream (and the replay
// service); Close stops them.
func Start(cfg Config) (*Publisher, error) {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10_000
	}
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = 256 << 20
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	if cfg.HWM <= 0 {
		cfg.HWM = 100_000
	}
	if cfg.Linger == 0 {
		cfg.Linger = time.Millisecond
	}
	ep, err := endpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, stop: cancel, streams: map[string]*Stream{}}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		cancel()
		return nil, err
	}
	if cfg.Dial {
		err = p.pub.Dial(ep)
	} else {
		err = p.pub.Listen(ep)
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kv events on %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		rep, err := endpoint(cfg.ReplayEndpoint)
		if err == nil {
			p.rtr = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kvtop-replay")))
			err = p.rtr.Listen(rep)
		}
		if err != nil {
			if p.rtr != nil {
				p.rtr.Close()
			}
			p.pub.Close()
			cancel()
			return nil, fmt.Errorf("kv events replay on %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	p.Stream, _ = p.NewStream(cfg.Topic)
	return p, nil
}

// NewStream starts a stream of KV events under topic, with a sequence of its own, on the
// publisher's sockets: for another engine than the publisher's own (a tap's shadow of one
// decode instance). Its replays answer requests that name its topic. A topic may have
// only one stream.
func (p *Publisher) NewStream(topic string) (*Stream, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("kv events: the publisher is closed")
	}
	if p.streams[topic] != nil {
		return nil, fmt.Errorf("kv events: topic %q has a stream already", topic)
	}
	// Queue observations: boxes of boxN, as many as make up Queue.
	boxN := min(16, p.cfg.Queue)
	boxes := max(1, p.cfg.Queue/boxN)
	s := &Stream{p: p, topic: topic, queue: make(chan pending, boxes), free: make(chan *box, boxes+2), boxN: boxN}
	p.streams[topic] = s
	p.wg.Add(1)
	go s.send()
	return s, nil
}

// Addr is where the PUB socket listens (nil when it dials).
func (p *Publisher) Addr() net.Addr {
	if p.cfg.Dial {
		return nil
	}
	return p.pub.Addr()
}

// ReplayAddr is where the replay socket listens (nil without one).
func (p *Publisher) ReplayAddr() net.Addr {
	if p.rtr == nil {
		return nil
	}
	return p.rtr.Addr()
}

// Stats returns the stream's counters.
func (s *Stream) Stats() Stats {
	return Stats{Batches: s.batches.Load(), Dropped: s.dropped.Load(), Resyncs: s.resyncs.Load(),
		Replays: s.replays.Load(), Blocks: s.blocks.Load()}
}

// Stats returns the counters of all its streams, summed.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var t Stats
	for _, s := range p.streams {
		st := s.Stats()
		t.Batches += st.Batches
		t.Dropped += st.Dropped
		t.Resyncs += st.Resyncs
		t.Replays += st.Replays
		t.Blocks += st.Blocks
	}
	return t
}

// Observe follows one engine call's or step's events (a runner.Observer): on the engine's
// goroutine, it reads which sequences' blocks changed, copies out the tokens of the pages
// that became full, and hands that to the sender without waiting; the sender hashes,
// encodes and sends. The first observation publishes AllBlocksCleared and whatever the
// cache holds already.
func (s *Stream) Observe(e *engine.Engine, evs []engine.Event) {
	first := s.eng != e
	if first {
		// The first engine, or a new one: what subscribers were told is of no engine now.
		s.eng, s.rd = e, blocks.NewReader(e.Config().PageSize)
		s.open = nil // a box's observations are of one engine's page size
	}
	if s.lost && len(s.queue) == cap(s.queue) {
		// Still no room: what this observation did is read only to count it (the reader
		// starts over once there is room).
		s.scratch.Reset()
		s.rd.Read(e.Prefix(), evs, &s.scratch)
		if s.scratch.Len() > 0 {
			s.dropped.Add(1)
		}
		return
	}
	// The reader writes into an Ops of the engine's goroutine alone, whose memory stays in
	// its core's cache; what it wrote is then copied, in one piece, into an Ops for the
	// sender. Reading straight into the sender's Ops (whose memory the sender's core read
	// last) cost twice as much: each small write waited for the line to come back.
	l := &s.local
	l.Reset()
	if first || s.lost {
		s.rd.Sync(e.Prefix(), l) // only the subscribers are behind: start them over
		if s.lost {
			s.resyncs.Add(1)
		}
	} else {
		s.rd.Read(e.Prefix(), evs, l)
	}
	if l.Len() == 0 {
		return
	}
	ts := float64(lastAt(evs)) / 1000
	if b := s.open; b != nil && b.state.CompareAndSwap(boxOpen, boxAppending) {
		if b.n < s.boxN {
			b.ops.Append(l)
			b.n++
			b.ts = ts
			b.state.Store(boxOpen)
			return
		}
		b.state.Store(boxOpen) // full: the sender takes it as it is
	}
	b := s.newBox()
	b.ops.Append(l)
	b.n, b.ts = 1, ts
	select {
	case s.queue <- pending{box: b, pageSize: s.rd.PageSize()}:
		s.queued.Add(1)
		s.open = b
		s.lost = false
	default:
		s.reuse(b)
		s.dropped.Add(1)
		s.lost = true
		s.open = nil // what follows a drop goes after a resync, never into an older box
	}
}

// newBox returns an empty open box, one the sender is done with if there is one.
func (s *Stream) newBox() *box {
	var b *box
	select {
	case b = <-s.free:
		b.ops.Reset()
	default:
		b = new(box)
	}
	b.n = 0
	b.state.Store(boxOpen)
	return b
}

// reuse hands a box back for a later observation.
func (s *Stream) reuse(b *box) {
	select {
	case s.free <- b:
	default:
	}
}

func lastAt(evs []engine.Event) int64 {
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].When().At
}

// Close stops the senders (after they have sent what is queued) and the replay service, and
// closes the sockets. Nothing may be observed after it.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	for _, s := range p.streams {
		close(s.queue)
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	p.stop()
	var err error
	if p.rtr != nil {
		err = p.rtr.Close()
	}
	return errors.Join(err, p.pub.Close())
}

// send applies, encodes and sends the queued observations, numbering the batches, and
// keeps each for replay. Once it has emptied the queue it lingers (Config.Linger) before it
// waits on it again: while it lingers the engine's hand-offs wake nobody, so the engine's
// goroutine pays for waking the sender at most once a linger, not once a step.
func (s *Stream) send() {
	defer s.p.wg.Done()
	var st senderState
	for {
		b, ok := <-s.queue
		if !ok {
			return
		}
		if s.p.cfg.hold != nil {
			<-s.p.cfg.hold // a test's stuck sender: stuck before it takes more
		}
		s.take(&b)
		// What else is waiting joins this batch: one batch a drain, not one an observation,
		// so that an engine stepping thousands of times a second costs the sender (and the
		// two cores it shares with the engine) an encoding and a send a linger.
		closed := false
		for more := true; more; {
			select {
			case next, ok := <-s.queue:
				if !ok {
					closed, more = true, false
					break
				}
				s.take(&next)
				if !s.join(&b, next) {
					s.sendOne(&st, b)
					b = next
				}
			default:
				more = false
			}
		}
		s.sendOne(&st, b)
		if closed {
			return
		}
		if s.p.cfg.Linger > 0 {
			time.Sleep(s.p.cfg.Linger)
		}
	}
}

// take takes a hand-over's box from the engine, which appends to it no more, and gives the
// hand-over the box's time.
func (s *Stream) take(b *pending) {
	if b.box != nil {
		b.box.take()
		b.ts = b.box.ts
	}
}

// join makes one batch of two hand-overs in turn, b's operations and then next's, at next's
// time, and says whether it could: boxes carry Ops of one page size, but a batch made of
// changes (the tests') goes alone. Both were counted as queued; the one absorbed is counted
// as applied here.
func (s *Stream) join(b *pending, next pending) bool {
	if b.box == nil || next.box == nil || b.pageSize != next.pageSize {
		return false
	}
	b.box.ops.Append(&next.box.ops)
	s.reuse(next.box)
	b.ts = next.ts
	s.applied.Add(1)
	return true
}

// senderState is what the sender keeps from one batch to the next.
type senderState struct {
	tr  *blocks.Tracker
	buf []byte // the batch being encoded
}

func (s *Stream) sendOne(st *senderState, b pending) {
	cfg := &s.p.cfg
	defer s.applied.Add(1)
	if b.box != nil {
		if st.tr == nil || st.tr.PageSize() != b.pageSize {
			st.tr = blocks.NewTracker(b.pageSize)
		}
		b.changes = st.tr.ApplyShared(&b.box.ops) // encoded before the next
		s.blocks.Store(int64(st.tr.Len()))
		s.reuse(b.box)
		if len(b.changes) == 0 {
			return
		}
	}
	st.buf = appendBatch(st.buf[:0], b.ts, b.changes, b.pageSize, cfg.DPRank, cfg.Encoding)
	payload := bytes.Clone(st.buf) // kept for replay
	s.ringMu.Lock()
	seq := s.seq
	s.seq++
	s.ring = append(s.ring, kept{seq, payload})
	s.keptBytes += len(payload)
	drop := 0
	for len(s.ring)-drop > 1 && (len(s.ring)-drop > cfg.Buffer || s.keptBytes > cfg.BufferBytes) {
		s.keptBytes -= len(s.ring[drop].payload)
		drop++
	}
	if drop > 0 {
		clear(s.ring[:drop]) // the backing array holds no payload it no longer keeps
		s.ring = s.ring[drop:]
	}
	s.ringMu.Unlock()
	if cfg.skip != nil && cfg.skip(seq) {
		return
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if err := s.p.pub.SendMulti(zmq4.NewMsgFrom([]byte(s.topic), sb[:], payload)); err != nil {
		s.p.logf("kv events: %q: send batch %d: %v", s.topic, seq, err)
		return
	}
	s.batches.Add(1)
}

// endSeq is the replay's last message's sequence number, -1.
var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay answers replay requests: [identity, "", start seq as 8 bytes big-endian] is
// answered with [identity, "", seq, payload] for each batch kept from start on, then
// [identity, "", -1, ""]. A request without the empty delimiter is answered without it.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for ctx.Err() == nil {
		msg, err := p.rtr.Recv()
		if err != nil {
			if ctx.Err() == nil {
				p.logf("kv events replay: %v", err)
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		id, topic, start, delim, ok := splitReplay(msg.Frames)
		if !ok {
			p.logf("kv events replay: a request of %d frames, want [\"\", start seq] or [\"\", topic, start seq]", len(msg.Frames))
			continue
		}
		st := p.Stream
		if topic != nil {
			p.mu.Lock()
			st = p.streams[string(topic)]
			p.mu.Unlock()
		}
		from := binary.BigEndian.Uint64(start)
		var out []kept
		if st != nil { // a topic with no stream has nothing kept
			st.ringMu.Lock()
			for _, k := range st.ring {
				if k.seq >= from {
					out = append(out, k)
				}
			}
			st.ringMu.Unlock()
		}
		reply := func(frames ...[]byte) error {
			head := [][]byte{id}
			if delim {
				head = append(head, nil)
			}
			if topic != nil {
				head = append(head, topic)
			}
			return p.rtr.SendMulti(zmq4.NewMsgFrom(append(head, frames...)...))
		}
		var sb [8]byte
		for _, k := range out {
			binary.BigEndian.PutUint64(sb[:], k.seq)
			if err = reply(sb[:], k.payload); err != nil {
				break
			}
		}
		if err == nil {
			err = reply(endSeq[:], nil)
		}
		if err != nil {
			p.logf("kv events replay: %v", err)
			continue
		}
		if st != nil {
			st.replays.Add(1)
		}
	}
}

// splitReplay takes a replay request apart: [identity, "", start] as a REQ or DEALER socket
// sends it (vLLM's), [identity, start], or either with a topic before start, which asks
// for that topic's stream (kvtop's, for a publisher of several streams); the answers then
// carry the topic too.
func splitReplay(fr [][]byte) (id, topic, start []byte, delim, ok bool) {
	if len(fr) < 2 || len(fr) > 4 || len(fr[len(fr)-1]) != 8 {
		return nil, nil, nil, false, false
	}
	id, start, mid := fr[0], fr[len(fr)-1], fr[1:len(fr)-1]
	if len(mid) > 0 && len(mid[0]) == 0 {
		delim, mid = true, mid[1:]
	}
	switch len(mid) {
	case 0:
		return id, nil, start, delim, true
	case 1:
		if mid[0] == nil {
			return id, []byte{}, start, delim, true // an empty topic, not none
		}
		return id, mid[0], start, delim, true
	}
	return nil, nil, nil, false, false
}

func (p *Publisher) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}
