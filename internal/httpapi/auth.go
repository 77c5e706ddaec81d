package httpapi

import (
	"errors"
	"net/http"

	"github.com/ratelimiter/ratelimiter/internal/auth"
)

const realm = `Bearer realm="ratelimiter"`

// authorize reports whether r may run an operation that requires one of
// the scopes need, or the problem to answer: 401 with a WWW-Authenticate
// challenge when r carries no token or an unknown one, 403 when its token
// has none of need (RFC 6750, section 3). The decision is s.guard's, the
// same the gRPC server takes; the problem never quotes the token.
func (s *server) authorize(r *http.Request, need auth.Scope) *problem {
	err := s.guard.Check(r.Header.Get("Authorization"), need)
	if err == nil {
		return nil
	}
	var e *auth.Error
	if !errors.As(err, &e) { // cannot happen: Check returns nil or an *auth.Error
		return &problem{status: http.StatusInternalServerError, detail: "The request could not be authorized."}
	}
	scopes := e.Need.String()
	switch {
	case e.Code == auth.Forbidden:
		s.log.DebugContext(r.Context(), "token refused", "token", e.Name, "need", scopes, "method", r.Method, "path", r.URL.Path)
		return &problem{
			status:       http.StatusForbidden,
			detail:       "The bearer token does not have the scope this operation requires: " + scopes + ".",
			authenticate: realm + `, error="insufficient_scope", scope="` + scopes + `"`,
		}
	case e.Invalid:
		return &problem{
			status:       http.StatusUnauthorized,
			detail:       "The bearer token is not one this service accepts. This operation requires a token with the scope: " + scopes + ".",
			authenticate: realm + `, error="invalid_token"`,
		}
	default:
		return &problem{
			status:       http.StatusUnauthorized,
			detail:       "This operation requires a bearer token with the scope: " + scopes + ".",
			authenticate: realm,
		}
	}
}
