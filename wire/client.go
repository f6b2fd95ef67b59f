package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// Errors of the client.
var (
	// ErrNotConnected is returned by Control while the client is between connections.
	ErrNotConnected = errors.New("wire: not connected to the server")
	// ErrVersion is returned when the server speaks another protocol version.
	ErrVersion = errors.New("wire: protocol version mismatch")
	// ErrForbidden is returned when the server refuses the handshake (HTTP 403).
	ErrForbidden = errors.New("wire: the server refused the connection")
)

// ClientOptions configure a Client. The zero value works against a server without a token.
type ClientOptions struct {
	// Token is sent as "Authorization: Bearer TOKEN".
	Token string
	// MinBackoff and MaxBackoff bound the wait between reconnection attempts, which doubles
	// from one to the next (defaults 100ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// HandshakeTimeout bounds connecting and reading the hello (default 10s).
	HandshakeTimeout time.Duration
	// ReadLimit bounds one frame from the server (default 1 GiB: a snapshot of a large
	// engine is big).
	ReadLimit int64
	// Backlog is how many events may wait for Take before the client drops them and asks
	// for a snapshot (default feed.DefaultBacklog).
	Backlog int
	// JSONEvents asks for events frames in JSON rather than the binary encoding, which the
	// client asks for by default: it decodes about ten times faster.
	JSONEvents bool
	// NetDialContext, when set, opens the TCP connections (tests use it).
	NetDialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logf, when set, logs what the server reports in error frames and frames that did not
	// decode.
	Logf func(format string, args ...any)
}

func (o ClientOptions) withDefaults() ClientOptions {
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 1 << 30
	}
	return o
}

// Client is a dashboard's connection to kvtop serve's stream. It has the method set of the
// dashboard's Source: C, Take, Control, Link and Close. It reconnects with backoff when the
// connection fails; each new connection starts with a snapshot. A gap in seq, an event that
// does not decode, or a backlog that overflows makes it drop what it has and ask for a
// snapshot: deltas are an optimisation, the snapshot is the truth. What it has received
// waits in a feed.Mailbox, which owes a snapshot from the moment the client asks for one
// until the server's comes.
type Client struct {
	url  string
	opts ClientOptions
	mb   *feed.Mailbox

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	link    feed.Link
	conn    *websocket.Conn // nil between connections
	hello   *protocol.Hello
	wasUp   bool
	resyncs uint64     // snapshots asked for after a gap, a bad frame or an overflow
	wmu     sync.Mutex // one writer at a time on conn
}

// StreamURL turns what a user types into the stream's URL: "host:port" becomes
// ws://host:port/v1/stream; http and https URLs become ws and wss; a URL without a path
// gets /v1/stream.
func StreamURL(target string) (string, error) {
	if !strings.Contains(target, "://") {
		target = "ws://" + target
	}
	u, err := url.Parse(target)
	if err != nil {
		return "", fmt.Errorf("wire: attach %q: %w", target, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("wire: attach %q: scheme %q: want ws, wss, http or https", target, u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("wire: attach %q: no host", target)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = StreamPath
	}
	return u.String(), nil
}

func newClient(target string, opts ClientOptions) (*Client, error) {
	u, err := StreamURL(target)
	if err != nil {
		return nil, err
	}
	pu, _ := url.Parse(u)
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		url: u, opts: opts.withDefaults(), mb: feed.NewMailbox(opts.Backlog), ctx: ctx, cancel: cancel,
		done: make(chan struct{}),
		link: feed.Link{Name: pu.Host, State: feed.LinkConnecting},
	}, nil
}

// Dial connects to a server's stream ("host:port" or a URL) and returns once the server has
// said hello; it fails at once, with the reason, when the server cannot be reached, refuses
// the token (ErrUnauthorized) or speaks another protocol (ErrVersion). Later failures are
// retried in the background.
func Dial(ctx context.Context, target string, opts ClientOptions) (*Client, error) {
	c, err := newClient(target, opts)
	if err != nil {
		return nil, err
	}
	conn, hello, err := c.connect(ctx)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.up(conn, hello) // before Dial returns, so that Control knows what the server allows
	go c.run(conn, hello)
	return c, nil
}

// Attach returns a client that connects in the background and keeps reconnecting; Link
// reports how it goes. It fails only for a target that is not an address. A refused token
// or another protocol version ends the client (Link closed, with the reason; C closed).
func Attach(target string, opts ClientOptions) (*Client, error) {
	c, err := newClient(target, opts)
	if err != nil {
		return nil, err
	}
	go c.run(nil, nil)
	return c, nil
}

// C is signalled when updates are pending or the link changed, and closed when the client
// ends.
func (c *Client) C() <-chan struct{} { return c.mb.C() }

// Take returns everything pending: a snapshot to start over from (when set), then events in
// order, the latest status, and the events lost so far (those the server dropped for this
// client and those the client dropped itself).
func (c *Client) Take() feed.Update { return c.mb.Take() }

// Link says which server the client is attached to and how the connection stands.
func (c *Client) Link() feed.Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.link
}

// Control sends a control to the server: a snapshot request always; pause, resume and step
// only when the server's hello allowed control (else feed.ErrReadOnly). It does not wait
// for the effect, which comes back as a status frame or a snapshot.
func (c *Client) Control(ctl feed.Control) error {
	if err := ctl.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	conn, hello := c.conn, c.hello
	c.mu.Unlock()
	if ctl.Op != feed.ControlSnapshot && hello != nil && !hello.Control {
		return feed.ErrReadOnly
	}
	if conn == nil {
		if ctl.Op == feed.ControlSnapshot {
			return nil // the next connection starts with one
		}
		return ErrNotConnected
	}
	return c.send(conn, protocol.ClientMessage{Type: string(ctl.Op), N: ctl.N})
}

// Resyncs counts the snapshots the client asked for on its own: after a gap in seq, a frame
// that did not decode, or an overflowing backlog.
func (c *Client) Resyncs() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resyncs
}

// Close ends the client and waits for its goroutine.
func (c *Client) Close() {
	c.cancel()
	c.mu.Lock()
	if c.conn != nil {
		c.conn.Close()
	}
	c.mu.Unlock()
	<-c.done
}

func (c *Client) send(conn *websocket.Conn, m protocol.ClientMessage) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := conn.WriteJSON(m); err != nil {
		return fmt.Errorf("wire: send %s: %w", m.Type, err)
	}
	return nil
}

// connect dials the stream and reads the hello.
func (c *Client) connect(ctx context.Context) (*websocket.Conn, *protocol.Hello, error) {
	d := websocket.Dialer{
		HandshakeTimeout: c.opts.HandshakeTimeout,
		NetDialContext:   c.opts.NetDialContext,
		ReadBufferSize:   64 << 10,
		WriteBufferSize:  4 << 10,
	}
	h := http.Header{}
	if c.opts.Token != "" {
		h.Set("Authorization", "Bearer "+c.opts.Token)
	}
	if !c.opts.JSONEvents {
		h.Set(HeaderEvents, protocol.EncodingBinary.String())
	}
	conn, resp, err := d.DialContext(ctx, c.url, h)
	if err != nil {
		if resp == nil {
			return nil, nil, fmt.Errorf("wire: attach %s: %w", c.url, err)
		}
		defer resp.Body.Close()
		msg := resp.Status
		var eb struct {
			Error protocol.ErrorBody `json:"error"`
		}
		if b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10)); json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
			msg = eb.Error.Message
		}
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return nil, nil, fmt.Errorf("attach %s: %w (%s)", c.url, ErrUnauthorized, msg)
		case http.StatusForbidden:
			return nil, nil, fmt.Errorf("attach %s: %w: %s", c.url, ErrForbidden, msg)
		}
		return nil, nil, fmt.Errorf("wire: attach %s: HTTP %d: %s", c.url, resp.StatusCode, msg)
	}
	conn.SetReadLimit(c.opts.ReadLimit)
	conn.SetReadDeadline(time.Now().Add(c.opts.HandshakeTimeout))
	_, data, err := conn.ReadMessage()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("wire: attach %s: reading the hello: %w", c.url, err)
	}
	f, err := protocol.DecodeFrame(data)
	if err == nil && f.Type != protocol.FrameHello {
		err = fmt.Errorf("%w: the first frame is %s, not hello", protocol.ErrViolation, f.Type)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("wire: attach %s: %w", c.url, err)
	}
	if f.Hello.Protocol != protocol.Version {
		conn.Close()
		return nil, nil, fmt.Errorf("wire: attach %s: %w: the server speaks protocol %d, this client %d", c.url, ErrVersion, f.Hello.Protocol, protocol.Version)
	}
	return conn, f.Hello, nil
}

// permanent reports errors that retrying cannot fix.
func permanent(err error) bool {
	return errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden) || errors.Is(err, ErrVersion)
}

// run keeps a connection up until the client is closed or a permanent error.
func (c *Client) run(conn *websocket.Conn, hello *protocol.Hello) {
	defer close(c.done)
	defer c.end()
	attempts := 0
	for {
		if conn == nil {
			var err error
			conn, hello, err = c.connect(c.ctx)
			if err != nil {
				if c.ctx.Err() != nil {
					return
				}
				attempts++
				c.setLink(err, attempts)
				if permanent(err) {
					return
				}
				if !c.sleep(c.backoff(attempts)) {
					return
				}
				continue
			}
		}
		attempts = 0
		if !c.up(conn, hello) {
			conn.Close()
			return
		}
		err := c.read(conn, hello)
		c.mu.Lock()
		c.conn = nil
		c.mu.Unlock()
		conn.Close()
		conn = nil
		if c.ctx.Err() != nil {
			return
		}
		c.setLink(err, 0)
		if !c.sleep(c.opts.MinBackoff) {
			return
		}
	}
}

func (c *Client) backoff(attempt int) time.Duration {
	d := c.opts.MinBackoff << min(attempt-1, 20)
	if d > c.opts.MaxBackoff || d <= 0 {
		d = c.opts.MaxBackoff
	}
	// ±25% so that many dashboards do not come back in step.
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

func (c *Client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

func (c *Client) up(conn *websocket.Conn, hello *protocol.Hello) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		return false
	}
	if c.wasUp {
		c.mb.NewEpoch() // a reconnection: perhaps to a restarted server
	}
	c.conn, c.hello, c.wasUp = conn, hello, true
	c.link = feed.Link{Name: c.link.Name, State: feed.LinkUp}
	c.mb.Notify()
	return true
}

// setLink records a failed connection: connecting until the first success, reconnecting
// after; closed with the reason for a permanent failure.
func (c *Client) setLink(err error, attempts int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := feed.LinkConnecting
	if c.wasUp {
		st = feed.LinkReconnecting
	}
	if permanent(err) {
		st = feed.LinkClosed
	}
	c.link = feed.Link{Name: c.link.Name, State: st, Err: err.Error(), Attempts: attempts}
	c.mb.Notify()
}

// end closes the mailbox; Link keeps a permanent failure's reason.
func (c *Client) end() {
	c.mu.Lock()
	if c.link.State != feed.LinkClosed {
		c.link = feed.Link{Name: c.link.Name, State: feed.LinkClosed}
	}
	c.mu.Unlock()
	c.mb.Close()
}

func (c *Client) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

// read takes frames off one connection until it fails.
func (c *Client) read(conn *websocket.Conn, hello *protocol.Hello) error {
	alive := func() {
		if hello.PingIntervalMs > 0 {
			conn.SetReadDeadline(time.Now().Add(3 * time.Duration(hello.PingIntervalMs) * time.Millisecond))
		} else {
			conn.SetReadDeadline(time.Time{})
		}
	}
	alive()
	conn.SetPingHandler(func(data string) error {
		alive()
		err := conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
		if err == websocket.ErrCloseSent {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	})
	var last uint64      // the seq of the last snapshot or events frame
	var buf bytes.Buffer // reused: a frame is decoded into values that do not point into it
	var bin protocol.BinaryDecoder
	for {
		typ, r, err := conn.NextReader()
		if err != nil {
			return err
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return err
		}
		alive()
		var f *protocol.Frame
		if typ == websocket.BinaryMessage {
			f, err = bin.Decode(buf.Bytes()) // an events frame, as the hello said
		} else {
			f, err = protocol.DecodeFrame(buf.Bytes())
		}
		if err != nil {
			c.logf("wire: %s: %v; asking for a snapshot", c.url, err)
			if err := c.resync(conn); err != nil {
				return err
			}
			continue
		}
		if err := c.handle(conn, &last, f); err != nil {
			return err
		}
	}
}

// resync throws away what is pending and asks the server for a snapshot, which the mailbox
// owes until it comes.
func (c *Client) resync(conn *websocket.Conn) error {
	c.mb.Resync()
	return c.askSnapshot(conn)
}

// askSnapshot asks the server for the snapshot the mailbox owes.
func (c *Client) askSnapshot(conn *websocket.Conn) error {
	c.mu.Lock()
	c.resyncs++
	c.mu.Unlock()
	return c.send(conn, protocol.ClientMessage{Type: string(feed.ControlSnapshot)})
}

// handle takes one frame; last is the connection's seq so far. Events wait in the mailbox
// unless a snapshot is owed (the one asked for covers them; they count as dropped).
func (c *Client) handle(conn *websocket.Conn, last *uint64, f *protocol.Frame) error {
	switch f.Type {
	case protocol.FrameSnapshot:
		*last = f.Seq
		c.mb.Snapshot(f.Snapshot)
	case protocol.FrameEvents:
		owed := c.mb.Owed()
		if !owed && f.Seq != *last+1 {
			c.logf("wire: %s: events frame %d after %d; asking for a snapshot", c.url, f.Seq, *last)
			c.mb.Resync()
		}
		*last = f.Seq
		if !c.mb.Offer(f.Events) && !owed {
			return c.askSnapshot(conn) // after a gap, or the backlog overflowed just now
		}
	case protocol.FrameDropped:
		c.mb.AddDropped(f.Dropped.Count)
	case protocol.FrameStatus:
		c.mb.SetStatus(*f.Status)
	case protocol.FrameError:
		c.logf("wire: %s: the server says: %s (%s)", c.url, f.Error.Message, f.Error.Type)
	}
	return nil
}
