#!/usr/bin/env bash
# down.sh - stop the real-Octavia test stack started by up.sh.
#
# Stops, by the PIDs recorded in $CAPO_OCTAVIA_RUN/pid (each service runs in
# its own session, so its whole process tree goes): octavia-api (gunicorn),
# octavia-driver-agent, octavia-worker, rabbitmq, mariadb; then the private
# epmd that rabbitmq started on $CAPO_OCTAVIA_EPMD_PORT. Waits for each to
# exit (SIGTERM, SIGKILL after a grace period). Safe to run when nothing runs.
#
# Usage: down.sh [--purge]
#   --purge   also delete the run dir (database, queues, CA, logs). The venv and
#             the Debian packages are kept.
#
# Environment: CAPO_OCTAVIA_RUN, CAPO_OCTAVIA_EPMD_PORT, CAPO_OCTAVIA_TIMEOUT
# (see lib.sh).
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
flock -w "$CAPO_OCTAVIA_TIMEOUT" 9 || die "another up.sh/down.sh holds $RUN/.lock"

# API first so nothing new arrives, then the consumers, then the back ends.
stop_group octavia-api 15
stop_group octavia-driver-agent 15
stop_group octavia-worker 30
stop_group rabbitmq 60
stop_group mariadb 60

# rabbitmq's node daemonised an epmd on our private port. Stop it once no
# node is registered with it any more (it may serve another run dir's node).
if [[ -n $(ss -ltnH "sport = :$CAPO_OCTAVIA_EPMD_PORT" 2>/dev/null) ]]; then
    if ERL_EPMD_PORT=$CAPO_OCTAVIA_EPMD_PORT epmd -names 2>/dev/null | grep -q '^name '; then
        say "epmd on 127.0.0.1:$CAPO_OCTAVIA_EPMD_PORT still has registered nodes; left running"
    else
        say "stopping epmd on 127.0.0.1:$CAPO_OCTAVIA_EPMD_PORT"
        ERL_EPMD_PORT=$CAPO_OCTAVIA_EPMD_PORT epmd -kill >/dev/null 2>&1 || true
        for _ in $(seq 1 50); do
            [[ -z $(ss -ltnH "sport = :$CAPO_OCTAVIA_EPMD_PORT" 2>/dev/null) ]] && break
            sleep 0.1
        done
    fi
fi

rm -f "$RUN/env" "$RUN"/sock/*.sock
if ((purge)); then
    exec 9>&-
    say "removing $RUN"
    rm -rf "$RUN"
fi
say "stopped"
