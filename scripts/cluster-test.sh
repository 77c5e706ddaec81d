#!/usr/bin/env bash
# Runs the chart in a real single-node Kubernetes cluster: starts the
# cluster (scripts/cluster-up.sh, twice, the second start changing
# nothing), runs deploy/helm/test's cluster tests in it (build tag
# cluster), stops it (scripts/cluster-down.sh, twice, the second stop
# doing nothing), and fails unless the machine is then as it was before:
# the same sysctls, links, routes, nftables and iptables rules, mounts and
# directories, and no process of the cluster left.
#
#   sudo ./scripts/cluster-test.sh           # every cluster test
#   sudo ./scripts/cluster-test.sh -run TestClusterRedis
#
# Extra arguments go to go test. Needs root, the Docker engine (the images
# are built with it), and Debian's containerd, runc,
# containernetworking-plugins and nftables.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.env

fail() { printf 'cluster-test: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "must run as root (the kubelet, containerd and the bridge need it)"
docker info >/dev/null 2>&1 || fail "the Docker engine does not answer: the cluster's images are built with it"
[ ! -d "$dir" ] || fail "$dir exists: a cluster is running or was left behind (scripts/cluster-down.sh stops it)"

# fingerprint prints what the cluster may change on the machine.
fingerprint() {
  for key in "${sysctls[@]}"; do sysctl "$key" 2>/dev/null || true; done
  ip -br link | awk '{ print $1 }'
  ip route
  ip -6 route
  nft -s list ruleset
  iptables-legacy-save 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//' || true
  findmnt -rn -o TARGET
  for path in "${outside_dirs[@]}"; do [ -e "$path" ] && echo "exists: $path"; done
  pgrep -a -f "$dir" || true
}
before=$(mktemp)
after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
fingerprint >"$before" 2>/dev/null

printf '==> start the cluster\n'
./scripts/cluster-up.sh
trap './scripts/cluster-down.sh; rm -f "$before" "$after"' EXIT
start=$(date +%s)
./scripts/cluster-up.sh | grep -qx "$dir/kubeconfig" || fail "a second cluster-up did not find the running cluster"
[ $(($(date +%s) - start)) -le 5 ] || fail "a second cluster-up took more than 5 s: it started something again"

printf '==> the cluster tests\n'
status=0
TESTCONTAINERS_HOST_OVERRIDE=localhost TESTCONTAINERS_RYUK_DISABLED=true RATELIMITER_CLUSTER_DIR=$dir \
  go -C deploy/helm/test test -tags cluster -run '^TestCluster' -count=1 -timeout 30m -v "$@" . || status=$?

printf '==> stop the cluster\n'
./scripts/cluster-down.sh
./scripts/cluster-down.sh
trap 'rm -f "$before" "$after"' EXIT
fingerprint >"$after" 2>/dev/null
if ! diff -u "$before" "$after"; then
  fail "the machine is not as it was before the cluster started (diff above: - before, + after)"
fi
echo "the machine is as it was before the cluster started"
exit "$status"
