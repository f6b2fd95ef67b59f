package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
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
	// Buffer is how many of the last batches are kept for replay (default 10,000).
	Buffer int
	// Queue bounds the batches waiting for the sender (default 1,024): the engine never
	// waits for it; a batch that does not fit is dropped and counted, and the next one that
	// fits starts subscribers over (AllBlocksCleared, then every block held).
	Queue int
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

	// In tests: the sender waits on hold before each batch; skip leaves a batch out of the
	// PUB socket (it is still kept for replay).
	hold <-chan struct{}
	skip func(seq uint64) bool
}

// Stats count what a publisher did.
type Stats struct {
	Batches uint64 // batches sent on the PUB socket
	Dropped uint64 // batches dropped because the sender's queue was full
	Resyncs uint64 // batches that started subscribers over after a drop
	Replays uint64 // replay requests answered
	Blocks  int64  // blocks held, as of the last batch the engine made
}

// Publisher publishes the prefix cache's blocks as vLLM's KV events: a runner.Observer on
// the engine's side, a goroutine that encodes and sends on the other, a bounded queue
// between them.
type Publisher struct {
	cfg   Config
	pub   zmq4.Socket
	rtr   zmq4.Socket
	queue chan pending
	wg    sync.WaitGroup
	stop  context.CancelFunc

	// The engine's side (Observe).
	tr   *blocks.Tracker
	lost bool

	ringMu sync.Mutex
	ring   []kept // the last Buffer batches, oldest first
	seq    uint64 // the next batch's sequence number

	batches, dropped, resyncs, replays atomic.Uint64
	queued                             atomic.Uint64 // batches handed to the sender
	blocks                             atomic.Int64
}

type pending struct {
	ts       float64
	changes  []blocks.Change
	pageSize int
}

type kept struct {
	seq     uint64
	payload []byte
}

// Start opens the sockets and starts the sender (and the replay service); Close stops them.
func Start(cfg Config) (*Publisher, error) {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10_000
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	if cfg.HWM <= 0 {
		cfg.HWM = 100_000
	}
	ep, err := endpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, queue: make(chan pending, cfg.Queue), stop: cancel}
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
	p.wg.Add(1)
	go p.send()
	return p, nil
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

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	return Stats{Batches: p.batches.Load(), Dropped: p.dropped.Load(), Resyncs: p.resyncs.Load(),
		Replays: p.replays.Load(), Blocks: p.blocks.Load()}
}

// Observe follows one engine call's or step's events (a runner.Observer): on the engine's
// goroutine, it derives the block changes and hands them to the sender without waiting. The
// first observation publishes AllBlocksCleared and whatever the cache holds already.
func (p *Publisher) Observe(e *engine.Engine, evs []engine.Event) {
	var chs []blocks.Change
	if p.tr == nil {
		p.tr = blocks.NewTracker(e.Config().PageSize)
		chs = p.tr.Sync(e.Prefix())
	} else {
		chs = p.tr.Track(e.Prefix(), evs)
	}
	p.blocks.Store(int64(p.tr.Len()))
	if p.lost {
		if len(p.queue) == cap(p.queue) {
			if len(chs) > 0 {
				p.dropped.Add(1)
			}
			return
		}
		chs = p.tr.Sync(e.Prefix()) // the tracker is current: only the subscribers are not
		p.resyncs.Add(1)
	}
	if len(chs) == 0 {
		return
	}
	b := pending{ts: float64(lastAt(evs)) / 1000, changes: chs, pageSize: p.tr.PageSize()}
	select {
	case p.queue <- b:
		p.queued.Add(1)
		p.lost = false
	default:
		p.dropped.Add(1)
		p.lost = true
	}
}

func lastAt(evs []engine.Event) int64 {
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].When().At
}

// Close stops the sender (after it has sent what is queued) and the replay service, and
// closes the sockets. Nothing may be observed after it.
func (p *Publisher) Close() error {
	close(p.queue)
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

// send encodes and sends the queued batches, numbering them, and keeps each for replay.
func (p *Publisher) send() {
	defer p.wg.Done()
	medium := MediumGPU
	for b := range p.queue {
		if p.cfg.hold != nil {
			<-p.cfg.hold
		}
		batch := Batch{TS: b.ts, DPRank: p.cfg.DPRank, HasDPRank: true, Events: make([]Event, 0, len(b.changes))}
		for _, ch := range b.changes {
			batch.Events = append(batch.Events, eventOf(ch, &medium, b.pageSize))
		}
		payload, err := Encode(batch, p.cfg.Encoding)
		if err != nil {
			p.logf("kv events: %v", err)
			continue
		}
		p.ringMu.Lock()
		seq := p.seq
		p.seq++
		p.ring = append(p.ring, kept{seq, payload})
		if len(p.ring) > p.cfg.Buffer {
			p.ring = p.ring[len(p.ring)-p.cfg.Buffer:]
		}
		p.ringMu.Unlock()
		if p.cfg.skip != nil && p.cfg.skip(seq) {
			continue
		}
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), sb[:], payload)); err != nil {
			p.logf("kv events: send batch %d: %v", seq, err)
			continue
		}
		p.batches.Add(1)
	}
}

// eventOf is a block change as vLLM's event.
func eventOf(ch blocks.Change, medium *string, ps int) Event {
	hashes := func() []Hash {
		out := make([]Hash, len(ch.Hashes))
		for i, h := range ch.Hashes {
			out[i] = IntHash(h)
		}
		return out
	}
	switch ch.Kind {
	case blocks.Stored:
		ev := BlockStored{BlockHashes: hashes(), TokenIDs: make([]int64, len(ch.Tokens)), BlockSize: int64(ps), Medium: medium}
		for i, t := range ch.Tokens {
			ev.TokenIDs[i] = int64(t)
		}
		if ch.HasParent {
			h := IntHash(ch.Parent)
			ev.ParentBlockHash = &h
		}
		return ev
	case blocks.Removed:
		return BlockRemoved{BlockHashes: hashes(), Medium: medium}
	}
	return AllBlocksCleared{}
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
		fr := msg.Frames
		var id, start []byte
		delim := false
		switch {
		case len(fr) == 3 && len(fr[1]) == 0 && len(fr[2]) == 8:
			id, start, delim = fr[0], fr[2], true
		case len(fr) == 2 && len(fr[1]) == 8:
			id, start = fr[0], fr[1]
		default:
			p.logf("kv events replay: a request of %d frames, want [\"\", start seq]", len(fr))
			continue
		}
		from := binary.BigEndian.Uint64(start)
		p.ringMu.Lock()
		var out []kept
		for _, k := range p.ring {
			if k.seq >= from {
				out = append(out, k)
			}
		}
		p.ringMu.Unlock()
		reply := func(frames ...[]byte) error {
			head := [][]byte{id}
			if delim {
				head = append(head, nil)
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
		p.replays.Add(1)
	}
}

func (p *Publisher) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}
