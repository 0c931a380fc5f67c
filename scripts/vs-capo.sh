#!/usr/bin/env bash
# vs-capo.sh - CAPO v0.14.7 and capo-rs side by side, in one run (docs/vs-capo.md): the same
# scenarios on a fresh simulated OpenStack and a fresh real API server each, one provider after
# the other; prints a table with capo-rs / CAPO ratios. Not part of CI (it takes about
# 15 minutes at 100 clusters on 2 cores).
#
# Usage: scripts/vs-capo.sh [CLUSTERS]     (default 100; CAPO_VS_WINDOW=SECONDS for the idle
#                                           and steady windows, default 60;
#                                           CAPO_VS_CAPO_RS_ARGS="--openstack-qps 100" adds
#                                           flags to capo-rs's command; CAPO_VS_SIDES=capo-rs
#                                           measures that side alone)
# Needs what the real Kubernetes tier needs (Go 1.26, openssl, curl, iproute2, socat): the
# peers are built by tests/kube, tests/capi and tests/capo's build.sh, from Go's module proxy,
# into caches outside the clone. capo-rs is measured in its release build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CAPO_VS_CLUSTERS=${1:-100}
bash tests/kube/build.sh >/dev/null
for peers in capi capo; do
  while IFS= read -r line; do export "${line?}"; done <"$(bash "tests/$peers/build.sh" | tail -n 1)/env"
done
cargo build --release --quiet
export CAPO_VS_CAPO_RS=$PWD/target/release/capo-rs
exec cargo test --quiet --test it -- --ignored --nocapture --exact \
  vs_capo::capo_v0_14_7_and_capo_rs_side_by_side
