// Package connlimit bounds the connections a listener holds open, without
// ever blocking Accept: at the bound, a new connection makes room by
// closing the open one that has been idle longest, so that a flood of idle
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

// Listener is a net.Listener that holds at most Max connections open.
// A connection accepted at the bound closes, to make room, the open one
// that read nothing for longest among those not marked busy (SetBusy); when
// every open connection is busy, the new one is closed at once instead.
// Either way Accept goes on to the next connection: it never blocks on the
// bound. Its methods are safe for concurrent use.
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

	mu      sync.Mutex
	conns   map[*conn]struct{}
	evicted int // connections closed for room since the last log record
	refused int // new connections closed at once since then
	logged  time.Time
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
	for {
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
			if victim != nil {
				delete(l.conns, victim)
				l.evicted++
			} else {
				l.refused++
			}
			l.logLocked()
		}
		if len(l.conns) < l.max {
			l.conns[c] = struct{}{}
		} else {
			c = nil
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close()
		}
		if c == nil {
			nc.Close()
			continue
		}
		return c, nil
	}
}

// idlest returns the open connection, not busy, that read nothing for
// longest; nil when every one is busy. It scans them all: a few
// microseconds at 10,000 connections, paid only at the bound.
func (l *Listener) idlest() *conn {
	var best *conn
	var bestLast uint64
	for c := range l.conns {
		if c.busy.Load() {
			continue
		}
		if last := c.last.Load(); best == nil || last < bestLast {
			best, bestLast = c, last
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
		"closed_idle", l.evicted, "closed_new", l.refused)
	l.logged, l.evicted, l.refused = now, 0, 0
}

// Open returns the number of connections open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// SetBusy marks c, a connection Accept returned (or a *tls.Conn over one),
// busy or not: a busy connection is never closed to make room. An HTTP
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
