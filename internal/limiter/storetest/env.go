package storetest

import (
	"os"
	"strconv"
	"testing"
)

// EnvInt returns the integer in the environment variable name, or def when
// it is unset or empty, failing t when it is not an integer. The scale
// and spray measurements, which run large only on request, read their
// sizes with it.
func EnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
