package tenant

import (
	"fmt"

	"github.com/ratelimiter/ratelimiter/internal/limiter/memory"
)

// AppendState appends the state of every tenant r remembers to b, as
// memory.Keys.AppendState writes it, and returns the extended slice.
func (r *Registry) AppendState(b []byte) []byte { return r.keys.AppendState(b) }

// RestoreState reads the tenants' state that AppendState wrote as b into
// r, as memory.Keys.RestoreState does: under another per-IP policy nothing
// is restored, and with crashed every tenant, remembered or not, starts
// exhausted at now. It is for a Registry on which nothing is decided yet.
func (r *Registry) RestoreState(b []byte, shift int64, crashed bool, now int64) error {
	rest, err := r.keys.RestoreState(b, shift, crashed, now)
	if err == nil && len(rest) != 0 {
		return fmt.Errorf("tenant: %w: trailing bytes", memory.ErrCorruptState)
	}
	return err
}
