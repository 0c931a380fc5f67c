#!/usr/bin/env bash
# Runs a Go peer whose servers bind every address (controller-runtime's webhook server has no
# host flag) in a network namespace of its own, holding only a loopback, so that nothing it
# serves is reachable but through relays bound to 127.0.0.1:
#   --reach PORT              inside, 127.0.0.1:PORT -> outside, 127.0.0.1:PORT (the API
#                             server, a simulated cloud);
#   --serve OUTSIDE:INSIDE    outside, 127.0.0.1:OUTSIDE -> inside, 127.0.0.1:INSIDE (the
#                             peer's webhook server).
# Usage: isolated.sh NAME [--reach PORT]... [--serve OUTSIDE:INSIDE]... -- COMMAND [ARG...]
# Stop it with SIGTERM: the peer, the relays and the namespace go with it.
set -euo pipefail
usage() { echo "usage: $0 NAME [--reach PORT]... [--serve OUTSIDE:INSIDE]... -- COMMAND [ARG...]" >&2; exit 2; }
[ $# -ge 3 ] || usage
name=$1
shift
reach=() serve=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --reach) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; reach+=("$2"); shift 2 ;;
    --serve) [[ ${2:-} =~ ^[0-9]+:[0-9]+$ ]] || usage; serve+=("$2"); shift 2 ;;
    *) usage ;;
  esac
done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || usage
shift
for tool in ip socat nsenter; do
  command -v "$tool" >/dev/null || { echo "isolated.sh: $tool is needed (apt-get install iproute2 socat util-linux)" >&2; exit 1; }
done
here_ns=/proc/$$/ns/net
ip netns del "$name" 2>/dev/null || true
ip netns add "$name"
peer=""
stop() {
  trap - EXIT TERM INT
  if [ -n "$peer" ] && kill -TERM "$peer" 2>/dev/null; then
    timeout 10 tail --pid="$peer" -f /dev/null || kill -KILL "$peer" 2>/dev/null || true
  fi
  kill $(jobs -p) 2>/dev/null || true
  # Whatever the peer started is in the namespace too.
  ip netns pids "$name" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns del "$name" 2>/dev/null || true
}
trap 'stop; exit 143' TERM INT
trap stop EXIT
ip -n "$name" link set lo up
for port in "${reach[@]}"; do
  ip netns exec "$name" socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" \
    "SYSTEM:exec nsenter --net=$here_ns socat STDIO TCP\:127.0.0.1\:$port" &
done
for pair in "${serve[@]}"; do
  socat "TCP-LISTEN:${pair%%:*},bind=127.0.0.1,reuseaddr,fork" \
    "SYSTEM:exec ip netns exec $name socat STDIO TCP\:127.0.0.1\:${pair##*:}" &
done
# Every relay listening before the peer starts; a port taken meanwhile fails here, not later.
listening() { # netns-or-empty port
  local out
  if [ -n "$1" ]; then out=$(ip netns exec "$1" ss -Hltn "sport = :$2"); else out=$(ss -Hltn "sport = :$2"); fi
  [ -n "$out" ]
}
for _ in $(seq 100); do
  ready=1
  for port in "${reach[@]}"; do listening "$name" "$port" || ready=0; done
  for pair in "${serve[@]}"; do listening "" "${pair%%:*}" || ready=0; done
  [ "$ready" -eq 1 ] && break
  sleep 0.05
done
[ "$ready" -eq 1 ] || { echo "isolated.sh: a relay did not start (a port in use?)" >&2; exit 1; }
ip netns exec "$name" "$@" &
peer=$!
wait "$peer"
