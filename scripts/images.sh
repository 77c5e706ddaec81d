#!/usr/bin/env bash
# Builds the project's container images without pulling anything, from the
# Go installation and module cache of this machine.
#
#   scripts/images.sh toolchain   # a Go toolchain image; prints its name
#   scripts/images.sh service     # the service image from ./Dockerfile; prints its name
#
# The toolchain image holds $(go env GOROOT), a POSIX shell, CA certificates
# and the modules go.sum lists, with GOPROXY=off: the Dockerfile's build stage
# runs on it exactly as it does on the public golang image, and fails at once,
# rather than reaching for the network, if a module is missing. It is named
# after the Go version and a hash of go.sum and of this script, and reused
# while they stay the same.
#
# The service image is tagged ratelimiter:$VERSION and ratelimiter:latest,
# where VERSION defaults to `git describe --tags --always --dirty`.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { printf 'images.sh: %s\n' "$*" >&2; exit 1; }
command -v docker >/dev/null || fail "docker is not on PATH"
docker info >/dev/null 2>&1 || fail "the Docker engine does not answer (docker info failed)"

toolchain() {
  local goversion sum name
  goversion=$(go env GOVERSION)
  sum=$(cat go.sum "$0" | sha256sum | cut -c1-12)
  name="local/golang:${goversion#go}-${sum}"
  if docker image inspect "$name" >/dev/null 2>&1; then
    echo "$name"
    return
  fi

  local root
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  mkdir -p "$root/usr/local" "$root/bin" "$root/etc/ssl/certs" "$root/go/pkg/mod" "$root/root"
  mkdir -m 1777 "$root/tmp"
  cp -a "$(go env GOROOT)" "$root/usr/local/go"
  cp -L /bin/sh "$root/bin/sh"
  for lib in $(ldd /bin/sh | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  # The modules come from this machine's module cache when it has them.
  GOMODCACHE="$root/go/pkg/mod" GOFLAGS=-modcacherw \
    GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" \
    go mod download
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/go/bin:/go/bin:/bin' \
    -c 'ENV GOPATH=/go' -c 'ENV HOME=/root' \
    -c 'ENV GOPROXY=off' -c 'ENV GOSUMDB=off' -c 'ENV GOTOOLCHAIN=local' \
    -c 'WORKDIR /' - "$name" >/dev/null
  echo "$name"
}

service() {
  local go_image version commit
  go_image=$(toolchain)
  version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  docker build -q \
    --build-arg GO_IMAGE="$go_image" \
    --build-arg VERSION="$version" --build-arg COMMIT="$commit" \
    -t "ratelimiter:$version" -t ratelimiter:latest . >/dev/null
  echo "ratelimiter:$version"
}

case "${1:-}" in
  toolchain) toolchain ;;
  service) service ;;
  *) fail "usage: scripts/images.sh toolchain|service" ;;
esac
