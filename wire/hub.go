package wire

import (
	"context"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// hub fans the engine's stream out to every stream connection. It alone subscribes to the
// runner, so that the engine's goroutine offers each step's events once however many
// dashboards watch, and it keeps what every connection reads:
//
//   - a log of the recent events in frames, each encoded once an encoding for every
//     connection that sends it (protocol.SharedEvents), which each connection reads at its
//     own pace from its own place; the log holds at most a backlog of events, and a
//     connection that falls further behind loses what it missed and starts over from a
//     snapshot;
//   - a View folded from the same events, from which it builds the snapshots connections
//     need (a new one, one that fell behind, one that asked), on its own goroutine, never
//     the engine's: one for all that need one at a time, at most one a SnapshotInterval,
//     and none when the last one is recent enough that the log holds what followed it.
//
// The hub starts with the first connection and stops when none has been left for
// hubLinger, so that connection churn does not make the runner build a snapshot each time.
type hub struct {
	s       *Server
	sub     source
	backlog int // events the log holds
	cancel  context.CancelFunc
	done    chan struct{}
	wake    chan struct{} // a connection wants a snapshot

	mu    sync.Mutex
	conns map[*streamConn]struct{}
	// The log: frames base+1 … head. total counts the events of every frame appended.
	log        []hubFrame
	base, head uint64
	held       int
	total      uint64
	// epoch counts the hub's starts over: the snapshots its subscription gave it. Frames do
	// not follow from one epoch to the next; a connection of an older epoch needs a snapshot.
	epoch  uint64
	snap   *hubSnapshot // the newest snapshot
	wanted bool         // a connection waits for a newer one
	// lost counts the events the hub's own subscription lost (every connection lost them);
	// subLost is the subscription's own count of them.
	lost, subLost      uint64
	status             feed.Status
	statusVer          uint64 // 0: no status yet
	closed             bool   // the runner stopped: the connections end
	stopped            bool   // the hub is gone; a new connection starts another
	view               *engine.View
	lastBuild, emptied time.Time
}

// hubFrame is one frame of the log: its events, and the events total through it.
type hubFrame struct {
	ev   *protocol.SharedEvents
	upto uint64
}

// hubSnapshot is a snapshot of the hub's stream: after frame pos of epoch, upto events in.
// Its encoding is made once, by the first connection that sends it.
type hubSnapshot struct {
	epoch, pos, upto uint64
	at               time.Time // when it was made
	snap             *engine.Snapshot
	once             sync.Once
	enc              *protocol.SharedSnapshot
	err              error
}

func (sn *hubSnapshot) encoded() (*protocol.SharedSnapshot, error) {
	sn.once.Do(func() { sn.enc, sn.err = protocol.EncodeSnapshot(sn.snap) })
	return sn.enc, sn.err
}

// hubLinger is how long a hub outlives its last connection.
const hubLinger = 10 * time.Second

// hubUpdate is what a connection has to send: a drop notice (the events it lost so far),
// a snapshot to start over from, the status, and frames.
type hubUpdate struct {
	dropped uint64
	snap    *hubSnapshot
	status  *feed.Status
	frames  []*protocol.SharedEvents
	closed  bool
}

// hubPlace is a connection's place in the hub's stream. The hub's mu guards it.
type hubPlace struct {
	epoch, pos, upto uint64
	needSnap, behind bool
	lostAt, dropped  uint64 // the hub's lost when it joined; the events it lost itself
	statusVer        uint64
}

// join registers a connection with the server's hub, starting one if there is none, and
// signals it to take its first update.
func (s *Server) join(c *streamConn) *hub {
	s.hubMu.Lock()
	defer s.hubMu.Unlock()
	h := s.hub
	if h != nil {
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			h = nil
		}
	}
	if h == nil {
		h = s.startHub()
		h.mu.Lock()
	}
	h.conns[c] = struct{}{}
	c.place = hubPlace{needSnap: true, lostAt: h.lost}
	h.mu.Unlock()
	c.signal()
	return h
}

func (s *Server) startHub() *hub {
	ctx, cancel := context.WithCancel(s.ctx)
	h := &hub{
		s: s, sub: s.subscribe(), backlog: s.backlog, cancel: cancel,
		done: make(chan struct{}), wake: make(chan struct{}, 1), conns: make(map[*streamConn]struct{}),
		emptied: time.Now(),
	}
	s.hub = h
	s.conns.Add(1)
	go func() {
		defer s.conns.Done()
		h.run(ctx)
	}()
	return h
}

// leave unregisters a connection.
func (h *hub) leave(c *streamConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.conns, c)
	if len(h.conns) == 0 {
		h.emptied = time.Now()
		h.poke()
	}
}

// resync has a connection start over from a snapshot, as its client asked.
func (h *hub) resync(c *streamConn) {
	h.mu.Lock()
	c.place.needSnap = true
	h.mu.Unlock()
	c.signal()
}

// poke wakes the hub's goroutine. h.mu is held or not.
func (h *hub) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// take returns what a connection has to send, and moves it on. A connection that needs a
// snapshot the hub does not have yet gets nothing but the request for one; it is signalled
// again when one is built.
func (h *hub) take(c *streamConn) hubUpdate {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := &c.place
	if h.closed {
		return hubUpdate{closed: true}
	}
	if p.epoch != h.epoch {
		p.needSnap = true
	}
	if !p.needSnap && p.pos < h.base {
		p.needSnap, p.behind = true, true // the frames after its place are gone
	}
	var u hubUpdate
	if p.needSnap {
		if !h.current(h.snap, p.epoch == 0) {
			h.wanted = true
			h.poke()
			return u
		}
		sn := h.snap
		if p.behind {
			p.dropped += sn.upto - p.upto
		}
		u.snap = sn
		*p = hubPlace{epoch: h.epoch, pos: sn.pos, upto: sn.upto, lostAt: p.lostAt, dropped: p.dropped, statusVer: p.statusVer}
	}
	if h.statusVer != p.statusVer {
		st := h.status
		u.status, p.statusVer = &st, h.statusVer
	}
	if p.pos < h.head {
		for _, f := range h.log[p.pos-h.base:] {
			u.frames = append(u.frames, f.ev)
		}
		p.pos, p.upto = h.head, h.total
	}
	u.dropped = p.dropped + h.lost - p.lostAt
	return u
}

// current reports whether a snapshot can serve a connection that needs one. It must be of
// this epoch, with every frame after it still in the log; then it serves a connection that
// has just joined if what follows it is at most a quarter of the log (the connection
// catches up from the log, and connections that come and go cost no snapshot each), and
// one that starts over (it asked, or fell behind) if it is at the log's head or recent,
// younger than SnapshotInterval, so that it gets at most an interval's events after it and
// the hub builds at most one snapshot an interval. h.mu is held.
func (h *hub) current(sn *hubSnapshot, joining bool) bool {
	if sn == nil || sn.epoch != h.epoch || sn.pos < h.base {
		return false
	}
	if joining {
		return h.total-sn.upto <= uint64(h.backlog/4)
	}
	return sn.pos == h.head || time.Since(sn.at) < h.s.lim.SnapshotInterval
}

// run takes the subscription's updates and builds the snapshots asked for, until ctx ends,
// the runner stops, or the hub has had no connection for hubLinger.
func (h *hub) run(ctx context.Context) {
	defer close(h.done)
	defer h.cancel()
	defer h.sub.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	interval := h.s.lim.SnapshotInterval
	for {
		h.mu.Lock()
		conns, emptied, want := len(h.conns), h.emptied, h.wanted && h.view != nil
		h.mu.Unlock()
		wait := time.Duration(-1)
		if want {
			if wait = interval - time.Since(h.lastBuild); wait <= 0 {
				h.build()
				continue
			}
		}
		if conns == 0 {
			d := hubLinger - time.Since(emptied)
			if d <= 0 {
				if h.retire() {
					return
				}
				continue
			}
			if wait < 0 || d < wait {
				wait = d
			}
		}
		var tick <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			h.end(false)
			return
		case _, ok := <-h.sub.C():
			if !ok {
				h.end(true)
				return
			}
			h.absorb(h.sub.Take())
		case <-h.wake:
		case <-tick:
		}
		timer.Stop()
	}
}

// retire stops the hub if it still has no connection: a new connection starts another.
func (h *hub) retire() bool {
	h.s.hubMu.Lock()
	defer h.s.hubMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.conns) > 0 {
		return false
	}
	h.stopped = true
	if h.s.hub == h {
		h.s.hub = nil
	}
	return true
}

// end stops the hub for good: closed says the runner stopped, which ends the connections.
func (h *hub) end(closed bool) {
	h.s.hubMu.Lock()
	if h.s.hub == h {
		h.s.hub = nil
	}
	h.s.hubMu.Unlock()
	h.mu.Lock()
	h.stopped, h.closed = true, h.closed || closed
	h.signalAll()
	h.mu.Unlock()
}

// absorb takes one update of the subscription: a snapshot starts a new epoch; events are
// folded into the view and appended to the log in frames of at most Limits.FrameEvents.
func (h *hub) absorb(u feed.Update) {
	if u.Snapshot != nil {
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			h.s.logf("stream: the engine's snapshot: %v", err)
			h.sub.Resync()
			return
		}
		h.view = v
	}
	var frames []hubFrame
	if h.view != nil {
		for i, ev := range u.Events {
			if err := h.view.Apply(ev); err != nil {
				h.s.logf("stream: %v; starting over from a snapshot", err)
				h.view = nil
				u.Events = u.Events[:i]
				h.sub.Resync()
				break
			}
		}
		total := h.total
		for evs := u.Events; len(evs) > 0; {
			n := min(len(evs), h.s.lim.FrameEvents)
			total += uint64(n)
			frames = append(frames, hubFrame{ev: protocol.ShareEvents(evs[:n:n]), upto: total})
			evs = evs[n:]
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if u.Snapshot != nil {
		h.epoch++
		h.log, h.base, h.held = nil, h.head, 0
		h.snap = &hubSnapshot{epoch: h.epoch, pos: h.head, upto: h.total, at: time.Now(), snap: u.Snapshot}
		h.wanted = false // it serves every connection that waits
	}
	if u.Dropped > h.subLost {
		h.lost += u.Dropped - h.subLost
		h.subLost = u.Dropped
	}
	if u.Status != nil {
		h.status = *u.Status
		h.statusVer++
	}
	for _, f := range frames {
		h.log = append(h.log, f)
		h.head++
		h.held += f.ev.Len()
		h.total = f.upto
	}
	for h.held > h.backlog && len(h.log) > 1 {
		h.held -= h.log[0].ev.Len()
		h.log[0] = hubFrame{}
		h.log = h.log[1:]
		h.base++
	}
	h.signalAll()
}

// build makes a snapshot of the view, at the log's head, for the connections that wait.
func (h *hub) build() {
	snap := h.view.Snapshot()
	h.lastBuild = time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snap = &hubSnapshot{epoch: h.epoch, pos: h.head, upto: h.total, at: h.lastBuild, snap: &snap}
	h.wanted = false
	h.signalAll()
}

// signalAll signals every connection. h.mu is held.
func (h *hub) signalAll() {
	for c := range h.conns {
		c.signal()
	}
}
