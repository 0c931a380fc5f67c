#!/usr/bin/env bash
# Builds the real Kubernetes peers of the test tier from the Go module proxy, pinned by this
# directory's go.mod and go.sum: kube-apiserver, kube-controller-manager and kubectl v1.35.4,
# etcd v3.6.16. Prints the directory that holds them.
#
# The binaries are kept outside the clone, keyed by a digest of go.mod, go.sum and this script,
# so a second run (or CI on a machine that ran before) builds nothing; Go's own module and build
# caches are reused when present. Nothing fetched is ever written into the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

kube_version=v1.35.4
key=$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-16)
out=${CAPO_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capo-rs/kube-peers/$key}
tools=(kube-apiserver kube-controller-manager kubectl etcd)

built() { for t in "${tools[@]}"; do [ -x "$out/$t" ] || return 1; done; }
if built; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is needed to build the peers (go 1.25 or later)" >&2; exit 1; }
mkdir -p "$out.part"
cd "$here"
# What upstream's hack/lib/version.sh stamps, so that /version answers the release.
minor=${kube_version#v1.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
build() { # name package
  local started=$SECONDS
  go build -trimpath -ldflags "-s -w$stamp" -o "$out.part/$1" "$2"
  echo "build.sh: $1 built in $((SECONDS - started)) s" >&2
}
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl
build etcd go.etcd.io/etcd/server/v3
rm -rf "$out" && mv "$out.part" "$out"
echo "$out"
