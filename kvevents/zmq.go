package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4's sockets write to a peer with no deadline: a subscriber that stops reading without
// closing its connection would hold the PUB socket's one writer, and every other subscriber
// with it, for good. kvtop's sockets therefore use a transport of their own, TCP whose
// writes time out: a peer that takes longer than the timeout to accept a write is cut off
// (a write error closes the connection) and the others go on. The transport's scheme is
// internal; endpoints are given as tcp://HOST:PORT.

const scheme = "kvtop-tcp"

var (
	registerOnce sync.Once
	writeTimeout = 5 * time.Second // tests shorten it before the first socket
)

func register() {
	registerOnce.Do(func() {
		if err := zmq4.RegisterTransport(scheme, deadlineTransport{tcp: transport.New("tcp"), timeout: writeTimeout}); err != nil {
			panic(err)
		}
	})
}

// endpoint turns tcp://HOST:PORT into the transport's endpoint.
func endpoint(ep string) (string, error) {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("kvtop: endpoint %q: want tcp://HOST:PORT", ep)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("kvtop: endpoint %q: %w", ep, err)
	}
	register()
	return scheme + "://" + addr, nil
}

type deadlineTransport struct {
	tcp     transport.Transport
	timeout time.Duration
}

func (t deadlineTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return deadlineConn{Conn: c, timeout: t.timeout}, nil
}

func (t deadlineTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.tcp.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return deadlineListener{Listener: l, timeout: t.timeout}, nil
}

func (t deadlineTransport) Addr(ep string) (string, error) { return t.tcp.Addr(ep) }

type deadlineListener struct {
	net.Listener
	timeout time.Duration
}

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return deadlineConn{Conn: c, timeout: l.timeout}, nil
}

// deadlineConn bounds every write by the timeout.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c deadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
