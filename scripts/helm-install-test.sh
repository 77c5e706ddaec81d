#!/usr/bin/env bash
# Installs the Helm chart into a real Kubernetes API server on loopback:
# builds etcd, kube-apiserver and helm from the versions pinned in
# tools/etcd, tools/kubernetes and deploy/helm/test, then runs
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

step "build etcd, kube-apiserver and helm into .tools/bin"
go -C tools/etcd build -o "$bin/etcd" go.etcd.io/etcd/server/v3
# Clients refuse an API server that reports no version, so stamp the one
# tools/kubernetes/go.mod pins.
kube=$(go -C tools/kubernetes list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$kube" | cut -d. -f2)
go -C tools/kubernetes build -o "$bin/kube-apiserver" -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$kube \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-apiserver
go -C deploy/helm/test build -o "$bin/helm" helm.sh/helm/v3/cmd/helm
"$bin/kube-apiserver" --version
"$bin/helm" version --short

step "helm install, upgrade and uninstall against kube-apiserver $kube"
cd deploy/helm/test
RATELIMITER_ETCD=$bin/etcd RATELIMITER_KUBE_APISERVER=$bin/kube-apiserver RATELIMITER_HELM=$bin/helm \
  go test -tags apiserver -run '^TestInstall$' -count=1 -v .
