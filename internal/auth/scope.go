// Package auth decides who may run which operation of the service: bearer
// tokens, each with scopes, checked alike by the HTTP API and the gRPC rate
// limit service.
//
// There are three scopes: Admin creates, replaces and deletes limiters;
// Decide takes permits or looks at them (acquisitions, decisions, peeks,
// reservations, availability, the lowest keys, forward-auth, Envoy's
// ShouldRateLimit) and reads definitions; Adjust gives permits back or
// moves counts outside a decision (charge, refund, settle, cancel). A
// scope for which no token is configured is open to every caller, which
// keeps a service configured without tokens working as before; Guard.Open
// names those scopes so that the service can say so loudly.
package auth

import (
	"fmt"
	"strings"
)

// Scope is a set of scopes: one bit per scope. The zero Scope is the empty
// set.
type Scope uint8

// The scopes.
const (
	// Admin creates, replaces and deletes limiters.
	Admin Scope = 1 << iota
	// Decide takes permits or looks at them, and reads definitions.
	Decide
	// Adjust gives permits back or moves counts outside a decision.
	Adjust

	// All is every scope.
	All = Admin | Decide | Adjust
)

// scopeNames are the scopes' names, one per bit, in the order of the bits.
var scopeNames = [...]string{"admin", "decide", "adjust"}

// String names the scopes of s, separated by commas: "decide,adjust".
func (s Scope) String() string {
	return strings.Join(s.Names(), ",")
}

// Names returns the name of each scope of s, in the order admin, decide,
// adjust; nil for the empty set.
func (s Scope) Names() []string {
	var names []string
	for i, n := range scopeNames {
		if s&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return names
}

// ParseScope returns the scope named name ("admin", "decide" or "adjust").
func ParseScope(name string) (Scope, error) {
	for i, n := range scopeNames {
		if n == name {
			return 1 << i, nil
		}
	}
	return 0, fmt.Errorf("unknown scope %q: want one of %s", name, strings.Join(scopeNames[:], ", "))
}

// ShouldRateLimit is the full name of the gRPC method Envoy calls.
const ShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// operations is the one table of the scope each operation requires: HTTP
// operations by their operationId in api/openapi.yaml, gRPC methods by
// their full name. An operation it leaves out requires none: the probes,
// the contract itself (/openapi.yaml, /openapi.json) and, on gRPC, health
// checking and reflection.
//
// Reads of definitions (listLimiters, getLimiter, getTenantPolicy) take
// Decide or Admin: a caller that decides learns the policy anyway, from
// the RateLimit-Policy header of every answer, and an administrator reads
// back what it writes.
var operations = map[string]Scope{
	"putLimiter":    Admin,
	"deleteLimiter": Admin,

	"listLimiters":    Admin | Decide,
	"getLimiter":      Admin | Decide,
	"getTenantPolicy": Admin | Decide,

	"acquire":            Decide,
	"getAvailable":       Decide,
	"listLowestKeys":     Decide,
	"acquireBatch":       Decide,
	"decide":             Decide,
	"peek":               Decide,
	"reserve":            Decide,
	"acquireTenant":      Decide,
	"getTenantAvailable": Decide,
	"listLowestTenants":  Decide,
	"forwardAuth":        Decide,
	ShouldRateLimit:      Decide,

	"charge":            Adjust,
	"refund":            Adjust,
	"settleReservation": Adjust,
	"cancelReservation": Adjust,
}

// Required returns the scopes of which a caller of operation op must hold
// one, and whether op requires any: op is an HTTP operationId or a gRPC
// full method name.
func Required(op string) (Scope, bool) {
	s, ok := operations[op]
	return s, ok
}
