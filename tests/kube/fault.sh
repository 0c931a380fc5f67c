#!/usr/bin/env bash
# fault.sh - take a component of the real Kubernetes tier away and bring it back.
# Usage: fault.sh stop|start|restart etcd|kube-apiserver|kube-controller-manager
#   stop     stops it (SIGTERM, then SIGKILL after a grace period); what depends on it keeps
#            running and sees it gone, as on a real control plane
#   start    starts whatever is not running (up.sh, which waits until it serves)
#   restart  stop, then start
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
usage() { echo "usage: $0 stop|start|restart etcd|kube-apiserver|kube-controller-manager" >&2; exit 2; }
[[ $# == 2 ]] || usage
case $2 in etcd | kube-apiserver | kube-controller-manager) ;; *) usage ;; esac
case $1 in
stop) stop_component "$2" 10 ;;
start) bash "$HERE/up.sh" >/dev/null ;;
restart) stop_component "$2" 10 && bash "$HERE/up.sh" >/dev/null ;;
*) usage ;;
esac
