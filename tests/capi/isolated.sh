#!/usr/bin/env bash
# Runs a Go peer whose servers bind every address (controller-runtime's webhook server has no
# host flag) in a network namespace of its own, holding only a loopback, so that nothing it
# serves is reachable but through two relays bound to 127.0.0.1:
#   inside, 127.0.0.1:API_PORT   -> outside, 127.0.0.1:API_PORT (the API server);
#   outside, 127.0.0.1:OUTSIDE   -> inside, 127.0.0.1:INSIDE (the peer's webhook server).
# Usage: isolated.sh NAME API_PORT OUTSIDE INSIDE -- COMMAND [ARG...]
# Stop it with SIGTERM: the peer, the relays and the namespace go with it.
set -euo pipefail
[ $# -ge 6 ] && [ "$5" = "--" ] || { echo "usage: $0 NAME API_PORT OUTSIDE INSIDE -- COMMAND [ARG...]" >&2; exit 2; }
name=$1 api=$2 outside=$3 inside=$4
shift 5
for tool in ip socat nsenter; do
  command -v "$tool" >/dev/null || { echo "isolated.sh: $tool is needed (apt-get install iproute2 socat util-linux)" >&2; exit 1; }
done
here_ns=/proc/$$/ns/net
ip netns del "$name" 2>/dev/null || true
ip netns add "$name"
peer=""
stop() {
  trap - EXIT TERM INT
  [ -n "$peer" ] && kill -TERM "$peer" 2>/dev/null && { timeout 10 tail --pid="$peer" -f /dev/null || kill -KILL "$peer" 2>/dev/null; }
  kill $(jobs -p) 2>/dev/null || true
  # Whatever the peer started is in the namespace too.
  ip netns pids "$name" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns del "$name" 2>/dev/null || true
}
trap 'stop; exit 143' TERM INT
trap stop EXIT
ip -n "$name" link set lo up
ip netns exec "$name" socat "TCP-LISTEN:$api,bind=127.0.0.1,reuseaddr,fork" \
  "SYSTEM:exec nsenter --net=$here_ns socat STDIO TCP\:127.0.0.1\:$api" &
socat "TCP-LISTEN:$outside,bind=127.0.0.1,reuseaddr,fork" \
  "SYSTEM:exec ip netns exec $name socat STDIO TCP\:127.0.0.1\:$inside" &
ip netns exec "$name" "$@" &
peer=$!
wait "$peer"
