#!/usr/bin/env bash
# Runs every check the project has and exits non-zero on the first failure:
#   - formatting, vet, tidy go.mod files, generated-code drift;
#   - the service's tests under the race detector (the forward-auth ones
#     need nginx, caddy and haproxy), and a short fuzzing pass of every
#     fuzz target;
#   - the benchmark harness (bench/), one short round of each comparison
#     (needs wrk, redis-server, redis-benchmark and nginx);
#   - the Helm chart: lint, render, strict schema validation, properties;
#   - the end-to-end suite: the image built from ./Dockerfile, driven in
#     containers through the generated client (needs Docker);
#   - helm install, upgrade and uninstall against a real kube-apiserver;
#   - the chart in a real single-node Kubernetes cluster: pods, Services,
#     DNS, helm test, Redis mode, rollouts and pod loss under load
#     (scripts/cluster-test.sh; needs root and Docker).
#
#   ./scripts/test.sh            # FUZZTIME=50000x (runs) per target by default
#
# The first run builds helm, etcd, the Kubernetes components and CoreDNS
# from pinned modules, and the images (about 30 minutes on 2 cores); later
# runs reuse Go's build cache and Docker's layer cache. Without Docker the
# end-to-end suite and the cluster tests are skipped with a warning, and
# without root the cluster tests, unless CI=true, where either is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# A count, not a duration: with a duration, Go 1.26's fuzzing coordinator can
# report "context deadline exceeded" when time runs out on a loaded machine
# (go.dev/issue/75804, fixed in Go 1.27).
fuzztime=${FUZZTIME:-50000x}
# Each module builds with its own go.mod, as its users build it, even where
# a developer has generated go.work (scripts/workspace.sh says why).
export GOWORK=off
# Every Go module in the repository; all but the root stay out of the
# service's go.mod.
mapfile -t modules < <(git ls-files '*go.mod' | xargs -n1 dirname)
skipped=()
step() { printf '\n==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
# counted runs go test -v with the given arguments and prints each
# package's result and how many tests and subtests passed, skipped and
# failed; on a failure it prints the whole output.
counted() {
  local log
  log=$(mktemp)
  if ! go "$@" -v >"$log" 2>&1; then
    cat "$log"
    rm -f "$log"
    fail "go $*"
  fi
  grep -E '^(ok|FAIL|\?) ' "$log" || true
  printf 'tests and subtests: %d passed, %d skipped, %d failed\n' \
    "$(grep -cE '^ *--- PASS' "$log" || true)" \
    "$(grep -cE '^ *--- SKIP' "$log" || true)" \
    "$(grep -cE '^ *--- FAIL' "$log" || true)"
  rm -f "$log"
}

command -v go >/dev/null || fail "go is not on PATH (Go $(sed -n 's/^go //p' go.mod) or newer is required)"
git rev-parse --git-dir >/dev/null 2>&1 || fail "not a git checkout: cannot check formatting and generated code"

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
[ -z "$unformatted" ] || fail "gofmt would change: $unformatted"

step "go vet (every module)"
go vet ./...
go -C e2e vet ./...
go -C bench vet ./...
go -C deploy/helm/test vet -tags apiserver,cluster ./...

step "go.mod and go.sum are tidy"
for m in "${modules[@]}"; do
  go -C "$m" mod tidy -diff || fail "go mod tidy would change $m/go.mod or go.sum (run go mod tidy there and commit)"
done

step "generated code is up to date (go generate ./...)"
go generate ./...
drift=$(git status --porcelain -- api internal/gen client)
[ -z "$drift" ] || { git --no-pager diff --stat -- api internal/gen client; fail "go generate changed generated files: $drift (run go generate ./... and commit)"; }

step "go test -race ./..."
# The forward-auth tests run real proxies; go test alone would skip them
# without, and say so only under -v.
for tool in nginx caddy haproxy; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH: the forward-auth tests run it (Debian: apt-get install nginx caddy haproxy)"
done
go test -race -count=1 ./...

step "fuzz each target for $fuzztime"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "--- $pkg $target"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done

step "benchmark harness smoke run (bench/: one short round of each comparison)"
for tool in wrk redis-server redis-benchmark nginx; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH: the benchmark harness needs it (Debian: apt-get install wrk redis-server redis-tools nginx)"
done
go -C bench test -race -count=1 ./...
go -C bench run . -smoke

step "Helm chart: lint, render, schema validation, properties (deploy/helm/test)"
counted -C deploy/helm/test test -race -count=1 ./...

step "Helm chart installed into a real kube-apiserver"
./scripts/helm-install-test.sh

step "end-to-end suite (e2e/)"
if docker info >/dev/null 2>&1; then
  export TESTCONTAINERS_HOST_OVERRIDE=localhost TESTCONTAINERS_RYUK_DISABLED=true
  RATELIMITER_E2E_GO_IMAGE=$(./scripts/images.sh toolchain)
  export RATELIMITER_E2E_GO_IMAGE
  # The image is built from scratch in TestMain (about 6 minutes on 2
  # cores, Envoy's generated types included), before 200-odd tests: more
  # than go test's default 10 minutes in all.
  counted -C e2e test -race -count=1 -timeout 30m ./...
  docker images ratelimiter
elif [ "${CI:-}" = true ]; then
  fail "Docker is not available (docker info failed), and CI=true: the end-to-end suite must run in CI"
else
  printf '\n%s\n' "WARNING: Docker is not available (docker info failed): the end-to-end suite was NOT run." >&2
  skipped+=("end-to-end suite (no Docker)")
fi

step "the chart in a real single-node Kubernetes cluster (scripts/cluster-test.sh)"
if [ "$(id -u)" = 0 ] && docker info >/dev/null 2>&1; then
  ./scripts/cluster-test.sh
elif [ "${CI:-}" = true ]; then
  fail "the cluster tests need root and the Docker engine, and CI=true: they must run in CI"
else
  printf '\n%s\n' "WARNING: not root, or no Docker: the cluster tests were NOT run." >&2
  skipped+=("cluster tests (need root and Docker)")
fi

if [ ${#skipped[@]} -gt 0 ]; then
  printf '\nchecks passed, but these were SKIPPED:\n' >&2
  printf '  - %s\n' "${skipped[@]}" >&2
  exit 0
fi
printf '\nall checks passed\n'
