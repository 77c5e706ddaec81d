#!/usr/bin/env bash
# Stops the test cluster that scripts/cluster-up.sh started and leaves the
# machine as it was before: every component stopped (and the pods'
# containers with containerd's shims), the kubelet's mounts unmounted, the
# bridge, its route and the CNI plugins' firewall chains deleted,
# kube-proxy's nftables tables deleted, the recorded sysctls restored, the
# directories the kubelet created outside its root removed, and
# $RATELIMITER_CLUSTER_DIR deleted. Running it when nothing runs does
# nothing and succeeds.
#
#   ./scripts/cluster-down.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.env

[ "$(id -u)" = 0 ] || { echo "cluster-down: must run as root" >&2; exit 1; }
[ -d "$dir" ] || exit 0

# stop NAME: SIGTERM, then SIGKILL after 10 s.
stop() {
  running "$1" || return 0
  local pid
  pid=$(cat "$dir/pids/$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 40); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  kill -9 "$pid" 2>/dev/null || true
}

# The kubelet first, so that it restarts nothing; then the pods' containers
# through containerd, whose CRI plugin tears down their network (the CNI
# plugins delete their firewall rules and addresses).
stop kubelet
if running containerd; then
  for ns in $(ctr -a "$containerd_socket" namespaces list -q 2>/dev/null); do
    for task in $(ctr -a "$containerd_socket" -n "$ns" tasks list -q 2>/dev/null); do
      ctr -a "$containerd_socket" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
  done
fi
for ((i = ${#components[@]} - 1; i >= 0; i--)); do
  stop "${components[i]}"
done
# containerd's shims outlive it by design: stop the ones of this
# containerd (their command line names its socket).
pkill -KILL -f "containerd-shim-runc-v2 .*-address $containerd_socket" 2>/dev/null || true

# Mounts under the cluster directory: the kubelet's bind mount of its root
# onto itself, pods' volumes, containerd's snapshots and network namespaces.
# Deepest first.
findmnt -rn -o TARGET | { grep -F "$dir/" || true; } | sort -r | while read -r target; do
  umount -l "$target" 2>/dev/null || true
done

# The network.
ip link delete "$bridge" 2>/dev/null || true
ip route delete "$service_cidr" 2>/dev/null || true
for family in ip ip6; do
  nft delete table "$family" kube-proxy 2>/dev/null || true
done
# iptables' chains of the kubelet (KUBE-FIREWALL, which drops packets to
# loopback from other addresses, and empty canaries) and of the CNI
# firewall plugin (CNI-FORWARD, CNI-ADMIN): the rules that jump to them,
# then the chains, then the tables the kubelet created for them.
for family in ip ip6; do
  cmd=iptables
  [ "$family" = ip6 ] && cmd=ip6tables
  for table in filter nat mangle; do
    # Listing a table through iptables would create it: ask nft first.
    nft list table "$family" "$table" >/dev/null 2>&1 || continue
    rules=$("$cmd" -t "$table" -S 2>/dev/null)
    awk '$1 == "-A" && $2 !~ /^(KUBE|CNI)-/ && / -j (KUBE|CNI)-/' <<<"$rules" | sed 's/^-A /-D /' |
      while read -r rule; do
        eval "$cmd -t $table $rule" 2>/dev/null || echo "cluster-down: could not delete $cmd -t $table $rule" >&2
      done
    chains=$(awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print $2 }' <<<"$rules")
    for chain in $chains; do "$cmd" -t "$table" -F "$chain" 2>/dev/null; done
    for chain in $chains; do
      "$cmd" -t "$table" -X "$chain" 2>/dev/null || echo "cluster-down: could not delete chain $chain of $family $table" >&2
    done
    if [ -f "$dir/nft-tables" ] && ! grep -qx "$family $table" "$dir/nft-tables" &&
      ! nft list table "$family" "$table" | grep -q '^[[:space:]]*chain '; then
      nft delete table "$family" "$table"
    fi
  done
done

# The chains iptables-nft made for those rules in tables that existed
# before (INPUT and OUTPUT of ip filter, on a machine whose Docker uses
# neither), if they are empty now: a chain that holds a rule is someone
# else's, and stays.
if [ -f "$dir/nft-chains" ]; then
  nft list chains 2>/dev/null | awk '$1 == "table" { t = $2 " " $3 } $1 == "chain" { print t, $2 }' |
    while read -r family table chain; do
      grep -qx "$family $table $chain" "$dir/nft-chains" && continue
      nft list chain "$family" "$table" "$chain" 2>/dev/null | grep -vqE '^[[:space:]]*(table |chain |type |}|$)' && continue
      nft delete chain "$family" "$table" "$chain" || echo "cluster-down: could not delete chain $chain of $family $table" >&2
    done
fi

# The sysctls, as recorded before the first kubelet start.
if [ -f "$dir/sysctls" ]; then
  while IFS='=' read -r key value; do
    sysctl -q -w "$key=$value" >/dev/null || echo "cluster-down: could not restore $key=$value" >&2
  done <"$dir/sysctls"
fi

# Directories that did not exist before the cluster started.
if [ -f "$dir/created" ]; then
  while read -r path; do
    [ -n "$path" ] && rm -rf "$path"
  done <"$dir/created"
fi

rm -rf "$dir"
