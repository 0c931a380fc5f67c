#!/usr/bin/env bash
# down.sh - stop the test OpenStack started by up.sh.
#
# Stops, by the PIDs recorded in $CAPO_OPENSTACK_RUN/pid (each service runs in its own
# session, so its whole process tree goes), every service in the reverse of up.sh's order; then
# the private epmd that rabbitmq started. Waits for each to exit (SIGTERM, SIGKILL after a
# grace period). Safe to run when nothing runs.
#
# Usage: down.sh [--purge]
#   --purge   also delete the run dir (databases, queues, keys, logs). The venv and the
#             Debian packages are kept.
#
# Environment: CAPO_OPENSTACK_RUN, CAPO_OPENSTACK_EPMD_PORT, CAPO_OPENSTACK_TIMEOUT (see
# lib.sh).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

purge=0
case ${1:-} in
"") ;;
--purge) purge=1 ;;
*)
    echo "usage: $0 [--purge]" >&2
    exit 2
    ;;
esac

if [[ ! -d $RUN ]]; then
    say "nothing to stop: $RUN does not exist"
    exit 0
fi

exec 9>"$RUN/.lock"
flock -w "$T" 9 || die "another up.sh/down.sh holds $RUN/.lock"

# The reverse of the start order: APIs before their consumers, the back ends last.
for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    case ${SERVICES[i]} in
    mariadb | rabbitmq) grace=60 ;;
    *) grace=20 ;;
    esac
    stop_group "${SERVICES[i]}" "$grace"
done

# rabbitmq's node daemonised an epmd on our private port. Stop it once no
# node is registered with it any more (it may serve another run dir's node).
if [[ -n $(ss -ltnH "sport = :${PORT[epmd]}" 2>/dev/null) ]]; then
    if ERL_EPMD_PORT=${PORT[epmd]} epmd -names 2>/dev/null | grep -q '^name '; then
        say "epmd on 127.0.0.1:${PORT[epmd]} still has registered nodes; left running"
    else
        say "stopping epmd on 127.0.0.1:${PORT[epmd]}"
        ERL_EPMD_PORT=${PORT[epmd]} epmd -kill >/dev/null 2>&1 || true
        for _ in $(seq 1 50); do
            [[ -z $(ss -ltnH "sport = :${PORT[epmd]}" 2>/dev/null) ]] && break
            sleep 0.1
        done
    fi
fi

rm -f "$RUN/env" "$RUN"/octavia/sock/*.sock
if ((purge)); then
    exec 9>&-
    say "removing $RUN"
    rm -rf "$RUN"
fi
say "stopped"
