package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// headerSection is a GET /livez whose request line, header lines and
// blank line take exactly n bytes, CRLFs included.
func headerSection(t *testing.T, n int) string {
	t.Helper()
	const base = "GET /livez HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
	if n < len(base) {
		t.Fatalf("a header section of %d bytes is too small for the request", n)
	}
	return strings.Replace(base, "X-Pad: ", "X-Pad: "+strings.Repeat("a", n-len(base)), 1)
}

// statusOf sends request over a new connection to addr and returns the
// status of the answer.
func statusOf(t *testing.T, addr, request string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatalf("write: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	res.Body.Close()
	return res.StatusCode
}

func TestMaxHeaderBytesIsWhatTheFlagSays(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	for _, limit := range []int{4097, 16384} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			base, _, _, _ := start(t, []string{"--listen", "127.0.0.1:0", "--max-header-bytes", strconv.Itoa(limit)}, nil)
			addr := strings.TrimPrefix(base, "http://")
			for _, tc := range []struct {
				size int
				want int
			}{
				{limit - 1, http.StatusOK},
				{limit, http.StatusOK},
				{limit + 1, http.StatusRequestHeaderFieldsTooLarge},
				{limit + 4096, http.StatusRequestHeaderFieldsTooLarge},
			} {
				if got := statusOf(t, addr, headerSection(t, tc.size)); got != tc.want {
					t.Errorf("a header section of %d bytes: got %d, want %d", tc.size, got, tc.want)
				}
			}
		})
	}
}
