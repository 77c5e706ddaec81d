// Package connlimit bounds the connections a listener holds open, without
// ever blocking Accept: at the bound, a new connection makes room by
// closing the open one that has read nothing for longest, so that a flood of idle
// connections cannot keep out the next client (a health check, say).
// x/net/netutil.LimitListener instead stops accepting at its bound, which
// lets the connections that hold the bound shut everyone else out.
package connlimit

import (
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// logEvery is the shortest time between two log records of a listener at
// its bound.
const logEvery = 10 * time.Second

// Listener is a net.Listener that holds at most max connections open.
// A connection accepted at the bound closes, to make room, the open one
// that read nothing for longest among those not marked busy (SetBusy), or
// among the busy ones when every one is: a client that keeps every
// connection busy with requests it never finishes (a slow body, an HTTP/2
// stream left open) must not shut out everyone else, and the connection
// that read nothing for longest is the likeliest to be such a one. Accept
// never blocks on the bound. Its methods are safe for concurrent use.
type Listener struct {
	net.Listener
	max    int
	name   string
	logger *slog.Logger
	now    func() time.Time

	// reads orders the connections by their last read: each read takes
	// the next number. A counter rather than a clock, since only the order
	// matters.
	reads atomic.Uint64

	mu         sync.Mutex
	conns      map[*conn]struct{}
	closedIdle int // connections not busy closed for room since the last log record
	closedBusy int // busy ones
	logged     time.Time
}

// New returns l bounded to max open connections (max ≥ 1). name names the
// listener in the warnings logged, at most one every 10 seconds, while it
// is at its bound.
func New(l net.Listener, max int, name string, logger *slog.Logger) *Listener {
	return &Listener{Listener: l, max: max, name: name, logger: logger, now: time.Now, conns: make(map[*conn]struct{}, min(max, 4096))}
}

// Accept waits for and returns the next connection, making room for it if
// the listener is at its bound.
func (l *Listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, l: l}
	c.last.Store(l.reads.Add(1))
	l.mu.Lock()
	var victim *conn
	if len(l.conns) >= l.max {
		victim = l.idlest()
		delete(l.conns, victim)
		if victim.busy.Load() {
			l.closedBusy++
		} else {
			l.closedIdle++
		}
		l.logLocked()
	}
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		victim.Conn.Close()
	}
	return c, nil
}

// idlest returns the open connection that read nothing for longest,
// preferring those not busy; l.conns is not empty. It scans them all: a
// few microseconds at 10,000 connections, paid only at the bound.
func (l *Listener) idlest() *conn {
	var best *conn
	var bestBusy bool
	var bestLast uint64
	for c := range l.conns {
		busy, last := c.busy.Load(), c.last.Load()
		if best == nil || !busy && bestBusy || busy == bestBusy && last < bestLast {
			best, bestBusy, bestLast = c, busy, last
		}
	}
	return best
}

// logLocked logs that the listener is at its bound, at most once every
// logEvery, with the connections closed since the last record. l.mu is held.
func (l *Listener) logLocked() {
	now := l.now()
	if now.Sub(l.logged) < logEvery {
		return
	}
	l.logger.Warn("connection limit reached: closing connections to make room", "listener", l.name, "max_connections", l.max,
		"closed_idle", l.closedIdle, "closed_busy", l.closedBusy)
	l.logged, l.closedIdle, l.closedBusy = now, 0, 0
}

// Open returns the number of connections open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// SetBusy marks c, a connection Accept returned (or a *tls.Conn over one),
// busy or not: a busy connection is closed to make room only when every
// connection is busy. An HTTP
// server marks a connection busy while it serves a request on it
// (http.Server.ConnState); one that is never marked may be closed
// whenever it is the idlest.
func (l *Listener) SetBusy(c net.Conn, busy bool) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if cc, ok := c.(*conn); ok && cc.l == l {
		cc.busy.Store(busy)
	}
}

// conn is an accepted connection that records when it last read.
type conn struct {
	net.Conn
	l      *Listener
	last   atomic.Uint64 // l.reads at its last read
	busy   atomic.Bool
	closed sync.Once
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.last.Store(c.l.reads.Add(1))
	}
	return n, err
}

// Close closes the connection and gives its place back.
func (c *conn) Close() error {
	c.closed.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
