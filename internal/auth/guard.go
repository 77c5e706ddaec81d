package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Code says why a request was refused.
type Code uint8

const (
	// Unauthenticated: the request carries no bearer token, or one that
	// is not configured (HTTP 401, gRPC UNAUTHENTICATED).
	Unauthenticated Code = iota + 1
	// Forbidden: the token is configured but holds none of the scopes
	// the operation requires (HTTP 403, gRPC PERMISSION_DENIED).
	Forbidden
)

// Error is a refusal. Its text is written for the client: it names the
// scopes required, never a token.
type Error struct {
	Code Code
	// Need is the scopes of which the operation requires one.
	Need Scope
	// Invalid is set when the request carried a bearer token that no
	// configured token matches.
	Invalid bool
	// Name is the name of the token the request carried when Code is
	// Forbidden, for logs.
	Name string
}

func (e *Error) Error() string {
	need := strings.Join(e.Need.Names(), " or ")
	switch {
	case e.Code == Forbidden:
		return "the bearer token does not have the " + need + " scope this operation requires"
	case e.Invalid:
		return "the bearer token is not one the service accepts; this operation requires a token with the " + need + " scope"
	default:
		return "this operation requires a bearer token with the " + need + " scope"
	}
}

// set is the tokens in force, and the scopes no token has.
type set struct {
	tokens []Token
	open   Scope
}

func newSet(tokens []Token) *set {
	s := &set{tokens: tokens, open: All}
	for _, t := range tokens {
		s.open &^= t.Scopes
	}
	return s
}

// Guard checks the bearer tokens of requests against the tokens in force,
// which Set and Watch replace while it serves. It is safe for concurrent
// use. The zero Guard has no tokens: every scope is open.
type Guard struct {
	cur atomic.Pointer[set]
}

// NewGuard returns a Guard with tokens in force.
func NewGuard(tokens []Token) *Guard {
	g := new(Guard)
	g.Set(tokens)
	return g
}

// Set puts tokens in force in place of the previous ones.
func (g *Guard) Set(tokens []Token) {
	g.cur.Store(newSet(slices.Clone(tokens)))
}

func (g *Guard) load() *set {
	if g == nil {
		return newSet(nil)
	}
	if s := g.cur.Load(); s != nil {
		return s
	}
	return newSet(nil)
}

// Open returns the scopes for which no token is in force: every caller
// may run their operations.
func (g *Guard) Open() Scope {
	return g.load().open
}

// Check decides whether a request may run an operation that requires one
// of the scopes need (see Required), given its Authorization header (an
// HTTP header, or gRPC's "authorization" metadata). It returns nil when
// need is empty, when one of need is open, or when the header is
// "Bearer <token>" with a configured token that holds one of need;
// otherwise an *Error. Tokens are compared through their SHA-256 digests
// in constant time, against every configured token, so neither their
// content, nor their length, nor which one matched leaks through timing.
func (g *Guard) Check(authorization string, need Scope) error {
	if need == 0 {
		return nil
	}
	s := g.load()
	if need&s.open != 0 {
		return nil
	}
	scheme, token, ok := strings.Cut(authorization, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return &Error{Code: Unauthenticated, Need: need}
	}
	got := sha256.Sum256([]byte(token))
	var held Scope
	name := ""
	for _, t := range s.tokens {
		match := subtle.ConstantTimeCompare(got[:], t.Digest[:])
		held |= t.Scopes & Scope(-match) // all bits of Scopes when match is 1, none when 0
		if match == 1 && name == "" {
			name = t.Name
		}
	}
	if name == "" {
		return &Error{Code: Unauthenticated, Need: need, Invalid: true}
	}
	if held&need == 0 {
		return &Error{Code: Forbidden, Need: need, Name: name}
	}
	return nil
}

// Source is where a Guard's tokens come from: fixed tokens (such as the
// admin token given on the command line) and a tokens file, reread when
// its content changes.
type Source struct {
	Fixed []Token
	Path  string // the tokens file; empty for none
}

// Load reads the source's tokens.
func (src Source) Load() ([]Token, []byte, error) {
	tokens := slices.Clone(src.Fixed)
	if src.Path == "" {
		return tokens, nil, nil
	}
	data, err := readFile(src.Path)
	if err != nil {
		return nil, nil, err
	}
	more, err := ParseFile(data)
	if err != nil {
		return nil, nil, &fileError{path: src.Path, err: err}
	}
	return append(tokens, more...), data, nil
}

type fileError struct {
	path string
	err  error
}

func (e *fileError) Error() string { return "auth: tokens file " + e.path + ": " + e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

// Watcher keeps a Guard on a Source as its tokens file changes: tokens
// rotate without a restart. A file that cannot be read or parsed is
// logged, and the tokens in force stay.
type Watcher struct {
	Guard  *Guard
	Source Source
	Logger *slog.Logger

	seen   []byte // the file's content when last read
	failed string // the last error logged, not to repeat it every check
}

// NewWatcher loads src into a new Guard and returns the Watcher of both,
// or the error of the first load.
func NewWatcher(src Source, logger *slog.Logger) (*Watcher, error) {
	tokens, data, err := src.Load()
	if err != nil {
		return nil, err
	}
	return &Watcher{Guard: NewGuard(tokens), Source: src, Logger: logger, seen: data}, nil
}

// Check rereads the tokens file and puts its tokens in force if its
// content changed; it reports whether it did.
func (w *Watcher) Check() bool {
	if w.Source.Path == "" {
		return false
	}
	data, err := readFile(w.Source.Path)
	if err == nil && bytes.Equal(data, w.seen) {
		return false
	}
	var tokens []Token
	if err == nil {
		tokens, err = ParseFile(data)
		if err != nil {
			err = &fileError{path: w.Source.Path, err: err}
		}
	}
	if err != nil {
		if msg := err.Error(); msg != w.failed {
			w.failed = msg
			w.Logger.Error("tokens not reloaded; the previous ones stay in force", "path", w.Source.Path, "error", msg)
		}
		return false
	}
	w.seen, w.failed = data, ""
	before := w.Guard.Open()
	w.Guard.Set(append(slices.Clone(w.Source.Fixed), tokens...))
	w.Logger.Info("tokens reloaded", "path", w.Source.Path, "tokens", Names(tokens))
	if open := w.Guard.Open(); open != before && open != 0 {
		WarnOpen(w.Logger, open)
	}
	return true
}

// Run calls Check every interval until ctx is done.
func (w *Watcher) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check()
		}
	}
}

// Names returns the names of tokens, for logs.
func Names(tokens []Token) []string {
	names := make([]string, len(tokens))
	for i, t := range tokens {
		names[i] = t.Name
	}
	return names
}

// WarnOpen logs, at WARN, that the scopes open are open to every caller.
func WarnOpen(logger *slog.Logger, open Scope) {
	logger.Warn("no token has these scopes, so every caller may run their operations; configure tokens with --tokens-file or --admin-token",
		"open_scopes", open.Names())
}
