#!/usr/bin/env bash
# Starts a single-node Kubernetes cluster on this machine, for the chart's
# tests (deploy/helm/test, build tag cluster):
#   - etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
#     loopback;
#   - a private containerd (its own socket, root and state directories; the
#     Docker engine and its containerd are never touched) with the pod
#     sandbox image built locally from tools/pause;
#   - a kubelet, whose pods join the bridge $bridge on $pod_cidr through
#     the CNI plugins, and whose node address is the bridge's;
#   - kube-proxy in nftables mode, so that Service addresses ($service_cidr,
#     routed to the bridge) reach the ready pods from the host and from pods;
#   - CoreDNS for the cluster.local names, answering only those.
# Every part is built by scripts/tools.sh from a pinned module, except
# containerd, runc and the CNI plugins, which are Debian's packages.
#
#   ./scripts/cluster-up.sh      # prints the kubeconfig's path
#   ./scripts/cluster-down.sh    # stops it and restores the machine
#
# Running it again while the cluster runs changes nothing; after a partial
# start it stops what is left and starts again. The kubelet sets kernel
# sysctls at start; their values are recorded here first and
# scripts/cluster-down.sh restores them. Everything else lives under
# $RATELIMITER_CLUSTER_DIR (default /tmp/ratelimiter-cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.env

fail() { printf 'cluster-up: %s\n' "$*" >&2; exit 1; }
step() { printf '==> %s\n' "$*"; }
[ "$(id -u)" = 0 ] || fail "must run as root: the kubelet, containerd and the bridge need it"
for tool in containerd containerd-shim-runc-v2 runc ctr nft iptables ip openssl curl; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH (Debian: apt-get install containerd runc nftables iptables iproute2 openssl curl)"
done
for plugin in bridge host-local firewall portmap; do
  [ -x "$cni_bin/$plugin" ] || fail "the CNI plugin $cni_bin/$plugin is missing (Debian: apt-get install containernetworking-plugins)"
done
containerd --version | grep -q " $containerd_version\." ||
  fail "containerd $containerd_version.x is required, found: $(containerd --version)"

if [ -f "$dir/kubeconfig" ] && running_all && node_ready; then
  echo "$dir/kubeconfig"
  exit 0
fi
if [ -d "$dir" ]; then
  step "a partial cluster is left in $dir: stopping it first"
  ./scripts/cluster-down.sh
fi
if [ -n "$(ip route show "$pod_cidr")$(ip route show "$service_cidr")" ] || ip link show "$bridge" >/dev/null 2>&1; then
  fail "a route for $pod_cidr or $service_cidr, or a link named $bridge, already exists: another network uses them (ip route; ip link)"
fi

step "build the tools (scripts/tools.sh)"
./scripts/tools.sh
mkdir -p "$dir"/{pki,logs,pids,cni/net.d,containerd,kubelet,pod-logs,etcd}

step "record what the kubelet and kube-proxy change on this machine"
# sysctls: kubelet tunes these unless protectKernelDefaults, which would
# instead refuse to start. A cluster left behind was stopped above, which
# restored them, so these are the machine's own values.
for key in "${sysctls[@]}"; do
  value=$(sysctl -n "$key" 2>/dev/null) || continue
  printf '%s=%s\n' "$key" "$value"
done >"$dir/sysctls"
# The nftables tables (iptables' too, on this machine's iptables-nft): the
# kubelet adds chains to iptables' tables (KUBE-FIREWALL and empty
# canaries), creating the tables it needs.
nft list tables | sed 's/^table //' >"$dir/nft-tables"
# And their chains: iptables-nft makes a table's base chains (INPUT,
# OUTPUT) when the kubelet first adds a rule to them, and leaves them,
# empty, when the rule goes.
nft list chains | awk '$1 == "table" { t = $2 " " $3 } $1 == "chain" { print t, $2 }' >"$dir/nft-chains"
# Directories the kubelet creates outside its root directory.
for path in "${outside_dirs[@]}"; do
  [ -e "$path" ] || echo "$path"
done >"$dir/created"

step "certificates and tokens"
pki=$dir/pki
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=ratelimiter-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
sign() { # sign NAME SUBJECT [SAN]
  local name=$1 subject=$2 san=${3:-}
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  if [ -n "$san" ]; then
    printf 'subjectAltName=%s\n' "$san" >"$pki/$name.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/$name.ext"
  fi
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}
sign apiserver "/CN=kube-apiserver" \
  "IP:127.0.0.1,IP:$api_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$cluster_domain"
sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
sign kubelet "/CN=$node_name" "IP:$node_ip,DNS:$node_name"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
token=$(openssl rand -hex 24)
# One identity for every component and the tests: a member of
# system:masters. The cluster lives for one test run on loopback.
printf '%s,admin,admin,"system:masters"\n' "$token" >"$pki/tokens.csv"
cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster:
      server: https://127.0.0.1:$api_port
      certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
  - name: admin
    user:
      token: $token
contexts:
  - name: test
    context: {cluster: test, user: admin}
current-context: test
EOF
chmod 600 "$dir/kubeconfig" "$pki/tokens.csv"

step "the pod network: bridge $bridge ($node_ip/${pod_cidr#*/}), Services $service_cidr routed to it"
ip link add "$bridge" type bridge
ip addr add "$node_ip/${pod_cidr#*/}" dev "$bridge"
ip link set "$bridge" up
# A packet to a Service address that kube-proxy has not mapped yet stays on
# the bridge instead of following the default route off the machine.
ip route add "$service_cidr" dev "$bridge"
# Pods get routes to the pod network and to the Services only, never a
# default route: nothing off this machine can be reached from a pod. The
# firewall plugin accepts their packets in the FORWARD chain, whose policy
# the Docker engine sets to DROP (with br_netfilter, bridged packets pass
# through it too).
cat >"$dir/cni/net.d/10-$bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$node_ip"}]],
        "routes": [{"dst": "$service_cidr", "gw": "$node_ip"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall", "backend": "iptables"}
  ]
}
EOF

# start NAME LOG COMMAND...: runs COMMAND in its own session, in the
# background, and records its pid.
start() {
  local name=$1
  shift
  setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}
# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  for _ in $(seq "$((seconds * 4))"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  tail -n 30 "$dir"/logs/*.log >&2 || true
  fail "$what did not come up within ${seconds}s (logs in $dir/logs)"
}
api() { curl -sf --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port$1"; }

step "etcd"
start etcd "$bin/etcd" --name default --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer_port" --listen-metrics-urls "http://127.0.0.1:$etcd_metrics_port"
wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

step "kube-apiserver"
start kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --endpoint-reconciler-type none \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" --authorization-mode RBAC \
  --kubelet-client-certificate "$pki/kubelet-client.crt" --kubelet-client-key "$pki/kubelet-client.key" \
  --kubelet-certificate-authority "$pki/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-issuer "https://kubernetes.default.svc.$cluster_domain" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range "$service_cidr" --enable-priority-and-fairness=false
wait_for kube-apiserver 90 api /readyz

step "kube-controller-manager and kube-scheduler"
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$dir/kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$controller_manager_port" --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials=false
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$scheduler_port" --leader-elect=false

step "containerd (private: $dir/containerd)"
cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$containerd_socket"
[ttrpc]
  address = "$containerd_socket.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$dir/cni/net.d"
EOF
start containerd containerd --config "$dir/containerd/config.toml"
wait_for containerd 30 ctr -a "$containerd_socket" version


step "the pod sandbox image $pause_image"
# No registry can be reached: the image is the static tools/pause binary
# alone, imported through the Docker engine, which writes the archive
# format ctr reads.
root=$(mktemp -d)
cp "$bin/pause" "$root/pause"
tar -C "$root" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - "$pause_image" >/dev/null
rm -rf "$root"
docker save "$pause_image" | ctr -a "$containerd_socket" -n k8s.io images import - >/dev/null

step "kubelet"
cat >"$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
containerRuntimeEndpoint: unix://$containerd_socket
cgroupDriver: cgroupfs
# This machine has cgroup v1, which kubelet 1.35+ refuses unless told.
failCgroupV1: false
# No CAP_SYS_RESOURCE here: the kubelet may not lower its own score.
oomScoreAdj: 0
failSwapOn: false
clusterDNS: [$node_ip]
clusterDomain: $cluster_domain
# Pods resolve cluster names only: nothing reaches this machine's resolver.
resolvConf: $dir/resolv.conf
podLogsDir: $dir/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 200Mi, nodefs.available: 1%, imagefs.available: 1%}
serializeImagePulls: false
EOF
: >"$dir/resolv.conf"
start kubelet "$bin/kubelet" --config "$dir/kubelet/config.yaml" --kubeconfig "$dir/kubeconfig" \
  --root-dir "$dir/kubelet/root" --cert-dir "$dir/kubelet/pki" \
  --volume-plugin-dir "$dir/kubelet/volume-plugins" \
  --hostname-override "$node_name" --node-ip "$node_ip"
wait_for "the node $node_name" 120 node_ready

step "kube-proxy (nftables)"
cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kubeconfig}
hostnameOverride: $node_name
mode: nftables
clusterCIDR: $pod_cidr
nodePortAddresses: [$node_ip/32]
healthzBindAddress: 127.0.0.1:$proxy_healthz_port
metricsBindAddress: 127.0.0.1:$proxy_metrics_port
# Zeros leave the machine's conntrack sysctls as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
start kube-proxy "$bin/kube-proxy" --config "$dir/kube-proxy.yaml"
wait_for kube-proxy 30 curl -sf "http://127.0.0.1:$proxy_healthz_port/healthz"

step "CoreDNS on $node_ip:53 (cluster.local only)"
cat >"$dir/Corefile" <<EOF
$cluster_domain:53 {
    bind $node_ip
    errors
    ready 127.0.0.1:$coredns_ready_port
    kubernetes $cluster_domain {
        kubeconfig $dir/kubeconfig test
    }
}
.:53 {
    bind $node_ip
    # Any other name is refused: there is no forwarder, nothing leaves
    # the machine.
    template ANY ANY {
        rcode REFUSED
    }
}
EOF
start coredns "$bin/coredns" -conf "$dir/Corefile"
wait_for CoreDNS 30 dns_ready

step "the default service account (the controllers work)"
wait_for "the default service account" 60 api /api/v1/namespaces/default/serviceaccounts/default

echo "$dir/kubeconfig"
