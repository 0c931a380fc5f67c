#!/usr/bin/env bash
# down.sh - stop the real Kubernetes tier started by up.sh. Safe to run when nothing runs.
# Usage: down.sh [--purge]   (--purge also deletes the run dir: etcd's data, keys, logs)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[[ -d $RUN ]] || { say "nothing to stop: $RUN does not exist"; exit 0; }
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    case ${COMPONENTS[i]} in kube-apiserver) grace=10 ;; *) grace=20 ;; esac
    stop_component "${COMPONENTS[i]}" "$grace"
done
rm -f "$RUN/env"
[[ ${1:-} == --purge ]] && { say "removing $RUN"; rm -rf "$RUN"; }
say "stopped"
