#!/usr/bin/env bash
# Writes go.work at the repository's root, listing every Go module the
# repository holds (each directory with a go.mod that git tracks), so that
# one editor session (gopls) sees the service, its end-to-end suite, the
# benchmark harness, the chart's tests and the pinned tools at once.
#
#   ./scripts/workspace.sh
#
# go.work is not committed, and the test command runs with GOWORK=off: a
# workspace resolves every module's requirements together, so in it the
# service would build with the newest version any module asks for rather
# than the versions its own go.mod pins (golang.org/x/net, for one, differs
# between the service and the Kubernetes tools). Users build each module on
# its own; so does CI.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f go.work go.work.sum
go work init
git ls-files '*go.mod' | while read -r mod; do
  go work use "$(dirname "$mod")"
done
echo "wrote $(pwd)/go.work:"
cat go.work
