# Shared by up.sh and down.sh: where the tier runs, its ports, and small helpers.
# shellcheck shell=bash
RUN=${CAPO_KUBE_RUN:-/tmp/capo-kube}
# Every wait is bounded by this many seconds.
T=${CAPO_KUBE_TIMEOUT:-120}
ETCD_PORT=${CAPO_KUBE_ETCD_PORT:-22379}
ETCD_PEER_PORT=${CAPO_KUBE_ETCD_PEER_PORT:-22380}
APISERVER_PORT=${CAPO_KUBE_APISERVER_PORT:-26443}
KCM_PORT=${CAPO_KUBE_KCM_PORT:-20257}
# Started in this order, stopped in the reverse: the API server before etcd (without etcd it
# hangs in shutdown and keeps its port).
COMPONENTS=(etcd kube-apiserver kube-controller-manager)

say() { echo "kube tier: $*" >&2; }
die() { say "$*"; exit 1; }

pid_of() { cat "$RUN/pid/$1" 2>/dev/null || true; }
running() { local pid; pid=$(pid_of "$1"); [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

# Stops a component (its whole session): SIGTERM, then SIGKILL after $2 seconds.
stop_component() {
    local name=$1 grace=$2 pid
    pid=$(pid_of "$name")
    [[ -n $pid ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        say "stopping $name ($pid)"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$RUN/pid/$name"
}
