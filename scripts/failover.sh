#!/usr/bin/env bash
# Measures leader failover: two `capo-rs run --leader-elect` replicas against a simulated API
# server (default lease flags: 15 s duration, 10 s renew deadline, 2 s retry period). The
# leader gets a signal (KILL: it dies holding the Lease; TERM: it releases it) and the script
# prints how long the standby took to lead.
#   scripts/failover.sh [KILL|TERM]
# CONTROLLER: the binary to measure (default target/release/capo-rs; the production build
# works too). SIM: a build with the simulators (default target/release/capo-rs).
set -euo pipefail
cd "$(dirname "$0")/.."
controller=${CONTROLLER:-target/release/capo-rs}
sim=${SIM:-target/release/capo-rs}
signal=${1:-KILL}
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
wait_for() { # file, text, seconds
  local until=$((SECONDS + $3))
  until grep -qs "$2" "$1"; do
    ((SECONDS < until)) || { echo "no '$2' in $1 after $3 s"; cat "$1"; exit 1; }
    sleep 0.01
  done
}
"$sim" --log-level error sim kube --listen 127.0.0.1:0 --kubeconfig-out "$work/kubeconfig" \
  --with-crds >"$work/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
replica() { # name
  "$controller" run --kubeconfig "$work/kubeconfig" --instance "$1" --admin-address 127.0.0.1:0 \
    --leader-elect --log-format json >"$work/$1.log" 2>&1 &
  pids+=($!)
}
replica first
first=${pids[-1]}
wait_for "$work/first.log" "became the leader" 30
replica second
second=${pids[-1]}
wait_for "$work/second.log" "standing by" 30
sleep 5 # a few renewals
started=$(date +%s%N)
kill "-$signal" "$first"
wait_for "$work/second.log" "became the leader" 60
led=$(date +%s%N)
echo "signal $signal: the standby led $(((led - started) / 1000000)) ms after the leader got it"
kill -TERM "$second"
wait "$second" || true
