#!/usr/bin/env bash
# Builds the tools the chart's tests run into .tools/bin, each from the
# module that pins its version:
#   tools/etcd          etcd
#   tools/kubernetes    kube-apiserver, kube-controller-manager,
#                       kube-scheduler, kubelet, kube-proxy, kubectl
#   tools/coredns       coredns (the test cluster's DNS, with the plugins it uses)
#   tools/pause         pause (the pod sandbox of the test cluster)
#   deploy/helm/test    helm (the version whose Go packages the tests use)
#
#   ./scripts/tools.sh
#
# The Kubernetes components share one go build, so they compile their common
# packages once (about 12 minutes on 2 cores with an empty build cache, and
# seconds after). Every run rebuilds, which Go's build cache makes cheap, so
# .tools/bin never holds a binary of another pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$PWD/.tools/bin
mkdir -p "$bin"

go -C tools/etcd build -o "$bin/etcd" go.etcd.io/etcd/server/v3

# Clients refuse components that report no version, so stamp the one
# tools/kubernetes/go.mod pins.
kube=$(go -C tools/kubernetes list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$kube" | cut -d. -f2)
mapfile -t commands < <(go -C tools/kubernetes list -f '{{.ImportPath}}' tool)
go -C tools/kubernetes build -o "$bin/" -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$kube \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" \
  "${commands[@]}"

go -C tools/coredns build -o "$bin/coredns" .
CGO_ENABLED=0 go -C tools/pause build -o "$bin/pause" .
go -C deploy/helm/test build -o "$bin/helm" helm.sh/helm/v3/cmd/helm
