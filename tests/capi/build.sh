#!/usr/bin/env bash
# Builds Cluster API's peers of the test tier from the Go module proxy, pinned by this
# directory's go.mod and go.sum: Cluster API v1.14.2's core manager and clusterctl (the release
# capo-rs pairs with). Prints the directory that holds them; its `env` file names them and the
# module's source in Go's cache, where the tests read Cluster API's CRDs and webhook
# configurations (nothing of it is ever copied into the repository).
#
# The binaries are kept outside the clone, keyed by a digest of go.mod, go.sum and this script,
# so a second run builds nothing; Go's own module and build caches are reused when present.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

key=$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-16)
out=${CAPO_CAPI_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capo-rs/capi-peers/$key}

built() { [ -x "$out/capi-manager" ] && [ -x "$out/clusterctl" ] && [ -s "$out/env" ] && [ -d "$(sed -n 's/^CAPO_CAPI_SRC=//p' "$out/env")" ]; }
if built; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is needed to build the peers (go 1.26 or later)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# A part directory of this run's own: a build left running by an earlier run cannot mix in.
part=$(mktemp -d "$out.part.XXXXXX")
trap 'rm -rf "$part"' EXIT
cd "$here"
build() { # name package
  local started=$SECONDS
  go build -trimpath -ldflags "-s -w" -o "$part/$1" "$2"
  echo "build.sh: $1 built in $((SECONDS - started)) s" >&2
}
build capi-manager sigs.k8s.io/cluster-api/core
build clusterctl sigs.k8s.io/cluster-api/cmd/clusterctl
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
[ -d "$src/core/config/crd/bases" ] || { echo "build.sh: no CRDs under $src/core/config/crd/bases" >&2; exit 1; }
printf 'CAPO_CAPI_BIN=%s\nCAPO_CAPI_SRC=%s\n' "$out" "$src" >"$part/env"
rm -rf "$out" && mv "$part" "$out"
echo "$out"
