package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

const realm = `Bearer realm="ratelimiter"`

// authorize reports whether r may run an admin operation, or the problem
// to answer: with an admin token configured, r must carry it as
// "Authorization: Bearer <token>". Tokens are compared through their
// SHA-256 digests in constant time, so neither their content nor their
// length leaks through timing.
func (s *server) authorize(r *http.Request) *problem {
	if !s.admin {
		return nil
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return &problem{
			status:       http.StatusUnauthorized,
			detail:       "This operation requires the admin bearer token.",
			authenticate: realm,
		}
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(got[:], s.adminHash[:]) != 1 {
		return &problem{
			status:       http.StatusUnauthorized,
			detail:       "The bearer token is not the admin token.",
			authenticate: realm + `, error="invalid_token"`,
		}
	}
	return nil
}
