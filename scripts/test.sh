#!/usr/bin/env bash
# Runs every check the project has: formatting, vet, generated-code drift,
# the whole test suite under the race detector, and a short fuzzing pass of
# every fuzz target. Exits non-zero on the first failure.
#
#   ./scripts/test.sh            # FUZZTIME=10s per target by default
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-10s}
step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not on PATH (Go $(sed -n 's/^go //p' go.mod) or newer is required)"

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || fail "gofmt would change: $unformatted"

step "go vet"
go vet ./...

step "go.mod and go.sum are tidy"
go mod tidy -diff || fail "go mod tidy would change go.mod/go.sum (run go mod tidy and commit)"

step "generated code is up to date (go generate ./...)"
go generate ./...
if [ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1; then
  drift=$(git status --porcelain -- api internal/gen client)
  [ -z "$drift" ] || { git --no-pager diff --stat -- api internal/gen client; fail "go generate changed generated files: $drift (run go generate ./... and commit)"; }
else
  fail "not a git checkout: cannot check generated code for drift"
fi

step "go test -race ./..."
go test -race -count=1 ./...

step "fuzz each target for $fuzztime"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "--- $pkg $target"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done

printf '\nall checks passed\n'
