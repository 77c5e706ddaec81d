package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/goccy/go-yaml"
)

// Token is one accepted bearer token: a name for logs, the SHA-256 digest
// of the token, and its scopes. The token itself is not kept.
type Token struct {
	Name   string
	Digest [sha256.Size]byte
	Scopes Scope
}

// NewToken returns the token whose text is token, named name, with
// scopes.
func NewToken(name, token string, scopes Scope) Token {
	return Token{Name: name, Digest: sha256.Sum256([]byte(token)), Scopes: scopes}
}

// maxFileBytes bounds the tokens file read, far above any real one.
const maxFileBytes = 1 << 20

// file is the tokens file's schema.
type file struct {
	Tokens []fileToken `yaml:"tokens"`
}

// fileToken is one token of the file: its digest, or the token itself.
type fileToken struct {
	Name   string   `yaml:"name"`
	SHA256 string   `yaml:"sha256"`
	Token  string   `yaml:"token"`
	Scopes []string `yaml:"scopes"`
}

// ParseFile returns the tokens of a tokens file's content:
//
//	tokens:
//	  - name: envoy            # for logs; unique
//	    sha256: 9f86d081...    # the token's SHA-256, 64 hex digits
//	    scopes: [decide]
//	  - name: billing
//	    token: 6b1f...         # or the token itself
//	    scopes: [adjust]
//
// Each token has a name, exactly one of sha256 and token, and at least one
// scope. Unknown keys are refused. Errors never quote a token.
func ParseFile(data []byte) ([]Token, error) {
	var f file
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		// goccy/go-yaml quotes the source around the error, which may
		// hold a token: say where only.
		return nil, errors.New(yamlPosition(err))
	}
	out := make([]Token, 0, len(f.Tokens))
	names := make(map[string]bool, len(f.Tokens))
	for i, ft := range f.Tokens {
		where := fmt.Sprintf("token %d", i+1)
		if ft.Name == "" {
			return nil, fmt.Errorf("%s: no name", where)
		}
		where = fmt.Sprintf("token %d (%q)", i+1, ft.Name)
		if names[ft.Name] {
			return nil, fmt.Errorf("%s: the name is already taken by another token", where)
		}
		names[ft.Name] = true
		t := Token{Name: ft.Name}
		switch {
		case ft.SHA256 != "" && ft.Token != "":
			return nil, fmt.Errorf("%s: both sha256 and token are set; set one", where)
		case ft.SHA256 != "":
			b, err := hex.DecodeString(ft.SHA256)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("%s: sha256 must be %d hexadecimal digits", where, 2*sha256.Size)
			}
			copy(t.Digest[:], b)
		case ft.Token != "":
			if strings.IndexFunc(ft.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
				return nil, fmt.Errorf("%s: the token must not contain spaces or control characters", where)
			}
			t.Digest = sha256.Sum256([]byte(ft.Token))
		default:
			return nil, fmt.Errorf("%s: neither sha256 nor token is set", where)
		}
		if len(ft.Scopes) == 0 {
			return nil, fmt.Errorf("%s: no scopes: want one or more of %s", where, strings.Join(scopeNames[:], ", "))
		}
		for _, name := range ft.Scopes {
			s, err := ParseScope(name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			t.Scopes |= s
		}
		out = append(out, t)
	}
	return out, nil
}

// yamlPosition describes where a YAML error is, without the source text.
func yamlPosition(err error) string {
	var se yaml.Error
	if errors.As(err, &se) {
		if tok := se.GetToken(); tok != nil && tok.Position != nil {
			return fmt.Sprintf("invalid YAML at line %d, column %d: %s", tok.Position.Line, tok.Position.Column, se.GetMessage())
		}
		return "invalid YAML: " + se.GetMessage()
	}
	return "invalid YAML"
}

// ReadFile reads and parses the tokens file at path; see ParseFile.
func ReadFile(path string) ([]Token, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	tokens, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file %s: %w", path, err)
	}
	return tokens, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("auth: tokens file %s is larger than %d bytes", path, maxFileBytes)
	}
	return data, nil
}
