#!/usr/bin/env bash
# Builds CAPO v0.14.7 and the peers it runs with, from the Go module proxy, pinned by this
# directory's go.mod and go.sum: CAPO's manager, ORC v2.4.0's manager and Cluster API
# v1.12.10's core manager (the release CAPO 0.14 pairs with). Prints the directory that holds
# them; its `env` file names them and the modules' sources in Go's cache, where the tests read
# CAPO's, ORC's and Cluster API's CRDs, webhook configurations and templates (nothing of it is
# ever copied into the repository). cert-manager's CRDs come with the Kubernetes tier
# (tests/kube/crds).
#
# The binaries are kept outside the clone, keyed by a digest of go.mod, go.sum and this script,
# so a second run builds nothing; Go's own module and build caches are reused when present.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

key=$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-16)
out=${CAPO_CAPO_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capo-rs/capo-peers/$key}

sources_present() {
  local name
  for name in CAPO_CAPO_SRC CAPO_ORC_SRC CAPO_CAPO_CAPI_SRC; do
    [ -d "$(sed -n "s/^$name=//p" "$out/env")" ] || return 1
  done
}
built() {
  [ -x "$out/capo-manager" ] && [ -x "$out/orc-manager" ] && [ -x "$out/capi-manager" ] \
    && [ -s "$out/env" ] && sources_present
}
if built; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is needed to build the peers (go 1.26 or later)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# A part directory of this run's own: a build left running by an earlier run cannot mix in.
part=$(mktemp -d "$out.part.XXXXXX")
trap 'rm -rf "$part"' EXIT
cd "$here"
build() { # name package [ldflags]
  local started=$SECONDS
  go build -trimpath -ldflags "-s -w ${3:-}" -o "$part/$1" "$2"
  echo "build.sh: $1 built in $((SECONDS - started)) s" >&2
}
capo=sigs.k8s.io/cluster-api-provider-openstack
build capo-manager "$capo" "-X $capo/version.gitVersion=v0.14.7"
build orc-manager github.com/k-orc/openstack-resource-controller/v2/cmd/manager
build capi-manager sigs.k8s.io/cluster-api
dir_of() { go list -m -f '{{.Dir}}' "$1"; }
{
  echo "CAPO_CAPO_BIN=$out"
  echo "CAPO_CAPO_SRC=$(dir_of "$capo")"
  echo "CAPO_ORC_SRC=$(dir_of github.com/k-orc/openstack-resource-controller/v2)"
  echo "CAPO_CAPO_CAPI_SRC=$(dir_of sigs.k8s.io/cluster-api)"
} >"$part/env"
while IFS='=' read -r name dir; do
  [ "$name" = CAPO_CAPO_BIN ] || [ -d "$dir" ] || { echo "build.sh: $name: no directory $dir" >&2; exit 1; }
done <"$part/env"
crds="$(sed -n 's/^CAPO_CAPO_SRC=//p' "$part/env")/config/crd/bases"
[ -d "$crds" ] || { echo "build.sh: no CRDs under $crds" >&2; exit 1; }
rm -rf "$out" && mv "$part" "$out"
echo "$out"
