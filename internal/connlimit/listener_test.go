package connlimit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// serve accepts on a Listener of max connections until the test ends,
// echoing what each connection reads, and returns it and its address.
func serve(t *testing.T, max int, logs io.Writer) *Listener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, max, "test", slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l
}

// dialEcho opens a connection to l and checks that it is served: a byte
// sent comes back.
func dialEcho(t *testing.T, l *Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if !echoes(c) {
		t.Fatalf("a new connection is not served")
	}
	return c
}

// echoes reports whether c is served: a byte sent on it comes back.
func echoes(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte{'x'}); err != nil {
		return false
	}
	b := make([]byte, 1)
	_, err := io.ReadFull(c, b)
	return err == nil
}

// closedByServer reports whether the server closed c: a read ends with
// EOF or a reset rather than waiting.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// At its bound the listener keeps accepting: each new connection closes
// the one that has read nothing for longest, and the count never passes
// the bound.
func TestAtTheBoundTheIdlestConnectionMakesRoom(t *testing.T) {
	var logs bytes.Buffer
	l := serve(t, 3, &logs)
	a := dialEcho(t, l)
	b := dialEcho(t, l)
	c := dialEcho(t, l)
	// a reads last of the three, so b is now the idlest, then c.
	if !echoes(a) {
		t.Fatal("a is not served")
	}
	d := dialEcho(t, l)
	if !closedByServer(b) {
		t.Errorf("b, the idlest, is still open after a fourth connection, want it closed")
	}
	e := dialEcho(t, l)
	if !closedByServer(c) {
		t.Errorf("c is still open after a fifth connection, want it closed")
	}
	for name, conn := range map[string]net.Conn{"a": a, "d": d, "e": e} {
		if !echoes(conn) {
			t.Errorf("%s: got closed, want served", name)
		}
	}
	if got, want := l.Open(), 3; got != want {
		t.Errorf("open connections: got %d, want %d", got, want)
	}
	if !bytes.Contains(logs.Bytes(), []byte("connection limit reached")) {
		t.Errorf("logs %q: want a warning that the limit was reached", logs.String())
	}
}

// Busy connections are closed to make room only when every connection is
// busy, and then the one that read nothing for longest, so that no client
// can shut out the next by keeping its connections busy.
func TestBusyConnectionsGoLast(t *testing.T) {
	l := serve(t, 2, io.Discard)
	a := dialEcho(t, l)
	b := dialEcho(t, l)
	setBusy := func(busy bool) {
		l.mu.Lock()
		for c := range l.conns {
			l.SetBusy(c, busy)
		}
		l.mu.Unlock()
	}
	// a is busy and read nothing for longer than b; b is not busy: b
	// makes room.
	l.mu.Lock()
	for c := range l.conns {
		if c.RemoteAddr().String() == a.LocalAddr().String() {
			l.SetBusy(c, true)
		}
	}
	l.mu.Unlock()
	if !echoes(b) {
		t.Fatal("b is not served")
	}
	c := dialEcho(t, l)
	if !closedByServer(b) {
		t.Errorf("b, not busy, is still open after a third connection, want it closed")
	}
	if !echoes(a) {
		t.Errorf("a, busy: got closed, want served")
	}

	// Every one busy: the one that read nothing for longest, c, makes room.
	setBusy(true)
	if !echoes(a) {
		t.Fatal("a is not served")
	}
	dialEcho(t, l)
	if !closedByServer(c) {
		t.Errorf("c, busy and the idlest, is still open after a connection past the bound, want it closed")
	}
	if !echoes(a) {
		t.Errorf("a, busy and recently read: got closed, want served")
	}
	if got, want := l.Open(), 2; got != want {
		t.Errorf("open connections: got %d, want %d", got, want)
	}
}

// A connection that closes gives its place back at once.
func TestClosedConnectionsGiveTheirPlaceBack(t *testing.T) {
	l := serve(t, 1, io.Discard)
	for i := range 5 {
		c := dialEcho(t, l)
		c.Close()
		// Wait for the server's side to close; its place is then free.
		for deadline := time.Now().Add(10 * time.Second); l.Open() != 0; {
			if time.Now().After(deadline) {
				t.Fatalf("connection %d: still counted open 10s after it closed", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
