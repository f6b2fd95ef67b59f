package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// StreamPath is where the websocket stream is served.
const StreamPath = "/v1/stream"

var upgrader = websocket.Upgrader{
	ReadBufferSize:  4 << 10,
	WriteBufferSize: 64 << 10,
	// Large writes go out in 64 KiB frames from pooled buffers: few syscalls, and an idle
	// connection holds no buffer.
	WriteBufferPool: &sync.Pool{},
	// The server's guard checked the Origin before the handler ran (guard.go).
	CheckOrigin: func(*http.Request) bool { return true },
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return errorf(http.StatusBadRequest, errInvalidRequest, "stream: %s is a websocket; connect with a websocket client such as kvtop --attach", StreamPath)
	}
	if !s.connects.allow() {
		return errorf(http.StatusServiceUnavailable, errBusy, "stream: more than %d connection attempts a second; try again shortly", s.lim.MaxConnectsPerSec)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errorf(http.StatusServiceUnavailable, errUnavailable, "stream: the server is shutting down")
	}
	s.conns.Add(1)
	s.mu.Unlock()
	defer s.conns.Done()
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		s.logf("stream: upgrade from %s: %v", r.RemoteAddr, err) // the upgrader answered
		return nil
	}
	c := &streamConn{s: s, conn: conn, errs: make(chan protocol.ErrorBody, 16), readDone: make(chan struct{}),
		resync: make(chan struct{}, 1), sig: make(chan struct{}, 1)}
	if r.Header.Get(HeaderEvents) == protocol.EncodingBinary.String() {
		c.encoding = protocol.EncodingBinary
	}
	c.serve()
	return nil
}

// HeaderEvents is the stream handshake's header by which a client asks for its events
// frames in the binary encoding ("binary"); without it they come in JSON. The hello says
// which the server chose.
const HeaderEvents = "Kvtop-Events"

// streamConn is one stream client: its place in the hub's stream, read by the handler's
// goroutine, which alone writes frames, and a reader goroutine for the client's messages and
// pongs.
type streamConn struct {
	s        *Server
	conn     *websocket.Conn
	hub      *hub
	place    hubPlace                // the hub's mu guards it
	sig      chan struct{}           // the hub has something for it (coalesced)
	errs     chan protocol.ErrorBody // replies for the writer, from the reader
	readDone chan struct{}
	resync   chan struct{} // the client asked for a snapshot (coalesced)
	encoding protocol.Encoding

	seq      uint64 // of the last snapshot or events frame
	reported uint64 // dropped events already told
	hello    bool
	buf      bytes.Buffer
	enc      protocol.Encoder
}

// signal tells the connection the hub has something for it, without waiting.
func (c *streamConn) signal() {
	select {
	case c.sig <- struct{}{}:
	default:
	}
}

func (c *streamConn) serve() {
	s, lim := c.s, c.s.lim
	c.hub = s.join(c)
	s.metrics.clients.Add(1)
	defer func() {
		c.hub.leave(c)
		c.conn.Close()
		<-c.readDone
		s.metrics.clients.Add(-1)
	}()
	c.conn.SetReadLimit(lim.MaxMessageBytes)
	alive := func() { c.conn.SetReadDeadline(time.Now().Add(2 * lim.PingInterval)) }
	alive()
	c.conn.SetPongHandler(func(string) error { alive(); return nil })
	go c.read(alive)
	// Closing the server ends the connection even while a write to a client that does not
	// read is blocked.
	stop := context.AfterFunc(s.ctx, func() {
		c.close(websocket.CloseGoingAway, "server shutting down")
		c.conn.Close()
	})
	defer stop()
	ping := time.NewTicker(lim.PingInterval)
	defer ping.Stop()
	// A client's resyncs are spaced by the resync interval; those that come sooner are
	// coalesced into one, answered with the state when the interval has passed.
	var lastResync time.Time // the first may come at once
	var resyncDue <-chan time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-c.readDone:
			return
		case <-c.resync:
			if resyncDue != nil {
				break // one is due already
			}
			if wait := lim.ResyncInterval - time.Since(lastResync); wait > 0 {
				resyncDue = time.After(wait)
				break
			}
			c.hub.resync(c)
			lastResync = time.Now()
		case <-resyncDue:
			resyncDue = nil
			c.hub.resync(c)
			lastResync = time.Now()
		case eb := <-c.errs:
			if err := c.write(&protocol.Frame{Type: protocol.FrameError, Error: &eb}); err != nil {
				return
			}
		case <-ping.C:
			if err := c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(lim.WriteTimeout)); err != nil {
				s.logf("stream: ping %s: %v", c.conn.RemoteAddr(), err)
				return
			}
		case <-c.sig:
			u := c.hub.take(c)
			if u.closed {
				c.close(websocket.CloseGoingAway, "engine stopped")
				return
			}
			if err := c.send(u); err != nil {
				s.logf("stream: %s: %v", c.conn.RemoteAddr(), err)
				return
			}
		}
	}
}

// send writes an update as frames: a drop notice, the snapshot, the status, then the events
// in frames of at most Limits.FrameEvents, each written from the encoding every connection
// shares.
func (c *streamConn) send(u hubUpdate) error {
	s := c.s
	if !c.hello {
		if u.snap == nil {
			return nil // nothing before the first snapshot
		}
		c.hello = true
		if err := c.write(&protocol.Frame{Type: protocol.FrameHello, Hello: &protocol.Hello{
			Protocol: protocol.Version, Server: s.opts.Version, Config: u.snap.snap.Config, Control: s.opts.Control,
			PingIntervalMs: s.lim.PingInterval.Milliseconds(), MaxMessageBytes: s.lim.MaxMessageBytes,
			Events: c.encoding.String(),
		}}); err != nil {
			return err
		}
	}
	if u.dropped > c.reported {
		d := &protocol.Dropped{Count: u.dropped - c.reported, Total: u.dropped}
		c.reported = u.dropped
		s.metrics.droppedEvents.Add(int64(d.Count))
		if err := c.write(&protocol.Frame{Type: protocol.FrameDropped, Dropped: d}); err != nil {
			return err
		}
	}
	if u.snap != nil {
		if c.seq > 0 {
			s.metrics.resyncs.Add(1)
		}
		c.seq++
		if err := c.writeSnapshot(u.snap); err != nil {
			return err
		}
	}
	if u.status != nil {
		st := *u.status
		st.Controllable = s.opts.Control
		if err := c.write(&protocol.Frame{Type: protocol.FrameStatus, Status: &st}); err != nil {
			return err
		}
	}
	// Consecutive runs of the log go out together, up to FrameEvents events a frame.
	for runs := u.frames; len(runs) > 0; {
		k, n := 1, runs[0].Len()
		for k < len(runs) && n+runs[k].Len() <= s.lim.FrameEvents {
			n += runs[k].Len()
			k++
		}
		c.seq++
		if err := c.writeEvents(runs[:k]); err != nil {
			return err
		}
		s.metrics.sentEvents.Add(int64(n))
		runs = runs[k:]
	}
	return nil
}

// write encodes a frame and writes it as one message, within the write timeout.
func (c *streamConn) write(f *protocol.Frame) error {
	c.buf.Reset()
	if err := c.enc.Encode(&c.buf, f); err != nil {
		return err
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.s.lim.WriteTimeout))
	if err := c.conn.WriteMessage(websocket.TextMessage, c.buf.Bytes()); err != nil {
		return fmt.Errorf("write %s frame: %w", f.Type, err)
	}
	if c.buf.Cap() > 16<<20 {
		c.buf = bytes.Buffer{} // do not hold on to a huge frame's buffer
	}
	return nil
}

// writeEvents writes one events frame of shared runs, in the connection's encoding.
func (c *streamConn) writeEvents(runs []*protocol.SharedEvents) error {
	typ := websocket.TextMessage
	if c.encoding == protocol.EncodingBinary {
		typ = websocket.BinaryMessage
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.s.lim.WriteTimeout))
	w, err := c.conn.NextWriter(typ)
	if err == nil {
		err = protocol.WriteEvents(w, c.seq, c.encoding, runs)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("write events frame: %w", err)
	}
	return nil
}

// writeSnapshot writes a snapshot frame from the encoding every connection shares.
func (c *streamConn) writeSnapshot(sn *hubSnapshot) error {
	enc, err := sn.encoded()
	if err != nil {
		return err
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.s.lim.WriteTimeout))
	w, err := c.conn.NextWriter(websocket.TextMessage)
	if err == nil {
		err = enc.WriteFrame(w, c.seq)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("write snapshot frame: %w", err)
	}
	return nil
}

func (c *streamConn) close(code int, text string) {
	msg := websocket.FormatCloseMessage(code, text)
	_ = c.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
}

// read handles the client's messages until the connection fails: a resync, or a control
// when the server allows it. Replies go to the writer.
func (c *streamConn) read(alive func()) {
	defer close(c.readDone)
	for {
		_, data, err := c.conn.ReadMessage()
		if err != nil {
			return
		}
		alive()
		if eb := c.handle(data); eb != nil {
			select {
			case c.errs <- *eb:
			default: // a client flooding bad messages loses replies, not the server
			}
		}
	}
}

func (c *streamConn) handle(data []byte) *protocol.ErrorBody {
	var m protocol.ClientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return &protocol.ErrorBody{Type: errInvalidJSON, Message: fmt.Sprintf("stream: malformed message: %v", err)}
	}
	switch feed.ControlOp(m.Type) {
	case feed.ControlSnapshot:
		select {
		case c.resync <- struct{}{}:
		default: // one is pending: it answers this one too
		}
		return nil
	case feed.ControlPause, feed.ControlResume, feed.ControlStep:
		if !c.s.opts.Control {
			return &protocol.ErrorBody{Type: "read_only", Message: fmt.Sprintf("stream: %s: this server is read-only; start kvtop serve with --control to allow pause, resume and step", m.Type)}
		}
		ctl := feed.Control{Op: feed.ControlOp(m.Type), N: m.N}
		if ctl.Op == feed.ControlStep && m.N == 0 {
			ctl.N = 1 // {"type":"step"}: one step
		}
		if err := ctl.Validate(); err != nil {
			return &protocol.ErrorBody{Type: errInvalidRequest, Message: "stream: " + err.Error()}
		}
		if err := c.s.r.Control(ctl); err != nil {
			return &protocol.ErrorBody{Type: classify(err).typ, Message: "stream: " + err.Error()}
		}
		return nil
	}
	return &protocol.ErrorBody{Type: errInvalidRequest, Message: fmt.Sprintf("stream: unknown message type %q; want snapshot, pause, resume or step", m.Type)}
}
