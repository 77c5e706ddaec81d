package redistest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records a skip or a failure instead of
// stopping the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestUnavailableSkipsUnlessCI(t *testing.T) {
	cause := errors.New("docker: the engine does not answer")
	for _, tc := range []struct {
		ci         string
		skip, fail bool
	}{
		{"", true, false},
		{"false", true, false},
		{"true", false, true},
		{"1", false, true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			unavailable(r, cause)
			if (r.skipped != "") != tc.skip || (r.failed != "") != tc.fail {
				t.Fatalf("got skipped %q, failed %q; want skip=%v, fail=%v", r.skipped, r.failed, tc.skip, tc.fail)
			}
			msg := r.skipped + r.failed
			if !strings.Contains(msg, cause.Error()) {
				t.Errorf("message %q does not give the cause %q", msg, cause)
			}
		})
	}
}
