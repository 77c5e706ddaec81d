#!/usr/bin/env bash
# Installs the Helm chart into a real Kubernetes API server on loopback:
# builds etcd, kube-apiserver and helm (scripts/tools.sh), then runs
# deploy/helm/test/install_test.go, which starts etcd and the API server,
# runs helm install, checks every object, runs helm upgrade with changed
# values, runs helm uninstall, checks every object is gone, and stops both
# servers; then the same with the Redis backend and three replicas. Pods
# never start: there is no kubelet.
#
#   ./scripts/helm-install-test.sh
#
# The first run compiles kube-apiserver (about 10 minutes on 2 cores);
# later runs reuse Go's build cache.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$PWD/.tools/bin
mkdir -p "$bin"
step() { printf '\n==> %s\n' "$*"; }

step "build the tools into .tools/bin (scripts/tools.sh)"
./scripts/tools.sh
kube=$(go -C tools/kubernetes list -m -f '{{.Version}}' k8s.io/kubernetes)
"$bin/kube-apiserver" --version
"$bin/helm" version --short

step "helm install, upgrade and uninstall against kube-apiserver $kube"
cd deploy/helm/test
RATELIMITER_ETCD=$bin/etcd RATELIMITER_KUBE_APISERVER=$bin/kube-apiserver RATELIMITER_HELM=$bin/helm \
  go test -tags apiserver -run '^TestInstall$' -count=1 -v .
