// Package api holds the OpenAPI contract of ratelimiter, api/openapi.yaml: the
// single source of truth for the HTTP API. The server code in internal/gen
// and the Go SDK in client are generated from it, the server validates
// requests against it, and serves it at /openapi.yaml, /openapi.json and,
// browsable, at /docs.
package api

import _ "embed"

// Spec is the OpenAPI 3.0 document in YAML, as embedded at build time. It is
// shared: callers must not modify it.
//
//go:embed openapi.yaml
var Spec []byte
