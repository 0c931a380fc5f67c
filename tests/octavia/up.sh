#!/usr/bin/env bash
# up.sh - install (if needed) and start a real OpenStack Octavia 19.0.0 API for
# capo-rs integration tests, on 127.0.0.1 only, with no-op compute, network,
# amphora, image, volume and certificate back ends.
#
# What runs (all as root, each in its own session, PID files in $RUN/pid):
#   mariadb               own datadir/socket under $RUN, TCP 127.0.0.1:$CAPO_OCTAVIA_DB_PORT
#   rabbitmq (+ its epmd) own node capo-octavia@localhost, AMQP 127.0.0.1:$CAPO_OCTAVIA_AMQP_PORT
#   octavia-api           gunicorn (gthread, 1 worker x 8 threads) serving octavia.wsgi.api
#   octavia-worker        amphora provider flows, all drivers no-op
#   octavia-driver-agent  status/stats/get sockets under $RUN/sock
# Providers: amphora (default) and noop_driver. Auth: noauth (send X-Project-Id).
#
# Idempotent: installed packages, the venv and running services are reused;
# octavia processes are restarted only if octavia.conf changed.
# The last stdout line is  CAPO_REAL_OCTAVIA_URL=http://127.0.0.1:<port>
# (also written to $RUN/env). Progress goes to stderr. Non-zero exit + log tail
# on any failure; every wait is bounded by $CAPO_OCTAVIA_TIMEOUT.
#
# Environment: see lib.sh (CAPO_OCTAVIA_RUN, CAPO_OCTAVIA_VENV,
# CAPO_OCTAVIA_PYTHON, CAPO_OCTAVIA_*_PORT, CAPO_OCTAVIA_TIMEOUT), plus
#   CAPO_OCTAVIA_DEBUG=1         debug logging in the octavia services
#   CAPO_OCTAVIA_API_WORKERS=N   gunicorn worker processes (default 1, 8 threads each)
# Stop with down.sh; inject faults with fault.sh.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

OCTAVIA_VERSION=19.0.0
CONSTRAINTS=$HERE/constraints.txt
APT_PACKAGES=(mariadb-server mariadb-client rabbitmq-server openssl python3-venv curl procps iproute2)
T=$CAPO_OCTAVIA_TIMEOUT
URL=http://127.0.0.1:$CAPO_OCTAVIA_API_PORT

trap 'die "up.sh failed at line $LINENO: $BASH_COMMAND"' ERR
[[ $(id -u) == 0 ]] || die "must run as root"

mkdir -p -m 755 "$RUN"
# Root runs code from here (the WSGI wrapper): refuse a run dir someone else could write.
[[ $(stat -c '%u' "$RUN") == 0 && $(( 0$(stat -c '%a' "$RUN") & 022 )) == 0 ]] ||
    die "$RUN must be owned by root and not group- or world-writable"
exec 9>"$RUN/.lock"
flock -w "$T" 9 || die "another up.sh/down.sh holds $RUN/.lock"

# ---------------------------------------------------------------- packages
install_packages() {
    local missing=() p created_policy=0
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' ||
            missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    say "apt: installing ${missing[*]}"
    # Debian daemons start on install unless policy-rc.d says no.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\n# capo-rs tests/octavia/up.sh: no daemon starts during install\nexit 101\n' \
            >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
        # Interrupted or not, never leave it behind: it would block every daemon start.
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$RUN/apt.log" 2>&1 || rc=$?
    if ((rc != 0)); then
        say "apt: install failed, refreshing package lists and retrying"
        rc=0
        { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
            >>"$RUN/apt.log" 2>&1 || rc=$?
    fi
    ((created_policy)) && rm -f /usr/sbin/policy-rc.d
    ((rc == 0)) || die "apt-get install ${missing[*]} failed" "$RUN/apt.log"
}

# ---------------------------------------------------------------- venv
VENV_CHANGED=0
install_venv() {
    local want have="" pins=none
    [[ -f $CONSTRAINTS ]] && pins=$(sha256sum <"$CONSTRAINTS" | cut -c1-16)
    want="octavia==$OCTAVIA_VERSION python=$("$CAPO_OCTAVIA_PYTHON" -c 'import sys; print(sys.version.split()[0])') constraints=$pins"
    [[ -f $VENV/.capo-stamp ]] && have=$(<"$VENV/.capo-stamp")
    if [[ $have == "$want" && -x $VENV/bin/octavia-worker && -x $VENV/bin/gunicorn ]]; then
        return 0
    fi
    VENV_CHANGED=1
    mkdir -p "$(dirname "$VENV")"
    # the venv may be shared by several run dirs: one installer at a time
    exec 8>"$VENV.lock"
    flock -w "$T" 8 || die "another up.sh is installing $VENV"
    if [[ ! -x $VENV/bin/python ]]; then
        say "venv: creating $VENV with $CAPO_OCTAVIA_PYTHON"
        "$CAPO_OCTAVIA_PYTHON" -m venv "$VENV" >"$RUN/pip.log" 2>&1 ||
            die "python venv creation failed" "$RUN/pip.log"
    fi
    local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    if [[ -f $CONSTRAINTS ]]; then
        say "venv: pip install octavia==$OCTAVIA_VERSION gunicorn (-c constraints.txt)"
        "${pip[@]}" -c "$CONSTRAINTS" "octavia==$OCTAVIA_VERSION" gunicorn >>"$RUN/pip.log" 2>&1 ||
            die "pip install failed" "$RUN/pip.log"
    else
        say "venv: no constraints.txt yet: unpinned install, then pip freeze > $CONSTRAINTS"
        "${pip[@]}" "octavia==$OCTAVIA_VERSION" gunicorn >>"$RUN/pip.log" 2>&1 ||
            die "pip install failed" "$RUN/pip.log"
        {
            echo "# Pins for tests/octavia/up.sh (octavia==$OCTAVIA_VERSION + gunicorn)."
            echo "# Generated by pip freeze after the first successful install; edit with care."
            "$VENV/bin/python" -m pip freeze --disable-pip-version-check
        } >"$CONSTRAINTS.tmp"
        mv "$CONSTRAINTS.tmp" "$CONSTRAINTS"
        want="${want% constraints=*} constraints=$(sha256sum <"$CONSTRAINTS" | cut -c1-16)"
    fi
    "$VENV/bin/python" -c 'import octavia, gunicorn, pymysql, octavia_lib' >>"$RUN/pip.log" 2>&1 ||
        die "venv is missing modules" "$RUN/pip.log"
    echo "$want" >"$VENV/.capo-stamp"
    exec 8>&-
}

# ---------------------------------------------------------------- files
make_files() {
    mkdir -p "$PIDS" "$LOGS" "$RUN/sock" "$RUN/lock" "$RUN/pki" "$RUN/mysql" \
        "$RMQ_BASE/home" "$RMQ_BASE/mnesia" "$RMQ_BASE/log" "$RMQ_BASE/conf.d"
    chmod 755 "$RUN"

    if [[ ! -s $RUN/secrets.env ]]; then
        (
            umask 077
            echo "DB_PASS=$(openssl rand -hex 12)"
            echo "RMQ_PASS=$(openssl rand -hex 12)"
            echo "AMP_PASS=$(openssl rand -hex 16)" # exactly 32 chars
        ) >"$RUN/secrets.env.tmp"
        chmod 600 "$RUN/secrets.env.tmp"
        mv "$RUN/secrets.env.tmp" "$RUN/secrets.env"
    fi
    # shellcheck disable=SC1091
    . "$RUN/secrets.env" # DB_PASS RMQ_PASS AMP_PASS

    if [[ ! -s $RUN/pki/ca.pem || ! -s $RUN/pki/ca.key ]]; then
        say "pki: generating test CA"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
            -subj "/CN=capo-rs octavia test CA" \
            -keyout "$RUN/pki/ca.key" -out "$RUN/pki/ca.pem" >"$LOGS/openssl.log" 2>&1 ||
            die "openssl failed" "$LOGS/openssl.log"
        chmod 600 "$RUN/pki/ca.key"
    fi

    cat >"$MY_CNF" <<EOF
# generated by tests/octavia/up.sh
[mysqld]
user=root
datadir=$RUN/mysql/data
socket=$RUN/mysql/mysqld.sock
pid-file=$RUN/mysql/mysqld.pid
log-error=$LOGS/mariadb.log
bind-address=127.0.0.1
port=$CAPO_OCTAVIA_DB_PORT
skip-name-resolve
skip-log-bin
character-set-server=utf8mb3
collation-server=utf8mb3_general_ci
max_connections=500
innodb_buffer_pool_size=128M
innodb_flush_log_at_trx_commit=2
innodb_use_native_aio=0
event_scheduler=ON
[client]
user=root
socket=$RUN/mysql/mysqld.sock
EOF

    if [[ ! -s $RMQ_BASE/home/.erlang.cookie ]]; then
        openssl rand -hex 10 | tr a-f A-F >"$RMQ_BASE/home/.erlang.cookie"
        chmod 400 "$RMQ_BASE/home/.erlang.cookie"
    fi
    echo "# our settings come from the environment (lib.sh rmq_env); do not read /etc" \
        >"$RMQ_BASE/rabbitmq-env.conf"
    echo "[]." >"$RMQ_BASE/enabled_plugins" # no management plugin (it would listen on 0.0.0.0)
    echo "[]." >"$RMQ_BASE/advanced.config"
    cat >"$RMQ_BASE/rabbitmq.conf" <<EOF
# generated by tests/octavia/up.sh; listeners come from RABBITMQ_NODE_IP_ADDRESS/PORT
default_user = octavia
default_pass = $RMQ_PASS
default_vhost = /
# no heartbeats: fault.sh worker-stop may freeze the worker for minutes
heartbeat = 0
log.console = false
log.file.level = info
EOF

    cat >"$RUN/capo_octavia_wsgi.py" <<'EOF'
# generated by tests/octavia/up.sh: gunicorn's own argv would reach oslo.config,
# so hand octavia.wsgi.api the arguments octavia-api would get.
import os
import sys

sys.argv = ["octavia-api", "--config-file", os.environ["CAPO_OCTAVIA_CONF"],
            "--log-file", os.environ["CAPO_OCTAVIA_API_LOG"]]

from octavia.wsgi.api import application  # noqa: E402,F401
EOF

    local debug=False
    [[ ${CAPO_OCTAVIA_DEBUG:-0} == 1 ]] && debug=True
    cat >"$OCTAVIA_CONF.new" <<EOF
# generated by tests/octavia/up.sh
[DEFAULT]
debug = $debug
use_stderr = false
transport_url = rabbit://octavia:$RMQ_PASS@127.0.0.1:$CAPO_OCTAVIA_AMQP_PORT/

[api_settings]
auth_strategy = noauth
bind_host = 127.0.0.1
bind_port = $CAPO_OCTAVIA_API_PORT
api_base_uri = $URL
enabled_provider_drivers = amphora:Amphora provider with no-op compute/network/amphora drivers,noop_driver:No-op provider (statuses only change via the driver agent)
default_provider_driver = amphora

[database]
connection = mysql+pymysql://octavia:$DB_PASS@127.0.0.1:$CAPO_OCTAVIA_DB_PORT/octavia
max_pool_size = 10
max_overflow = 50

[controller_worker]
workers = 1
amphora_driver = amphora_noop_driver
compute_driver = compute_noop_driver
network_driver = network_noop_driver
volume_driver = volume_noop_driver
image_driver = image_noop_driver
loadbalancer_topology = SINGLE
client_ca = $RUN/pki/ca.pem

[certificates]
cert_manager = noop_cert_manager
cert_generator = local_cert_generator
ca_certificate = $RUN/pki/ca.pem
ca_private_key = $RUN/pki/ca.key
server_certs_key_passphrase = $AMP_PASS

[driver_agent]
status_socket_path = $RUN/sock/status.sock
stats_socket_path = $RUN/sock/stats.sock
get_socket_path = $RUN/sock/get.sock

[task_flow]
jobboard_enabled = False

[oslo_messaging]
topic = octavia_prov

[oslo_messaging_rabbit]
heartbeat_timeout_threshold = 0

[oslo_concurrency]
lock_path = $RUN/lock
EOF
    CONF_CHANGED=0
    if ! cmp -s "$OCTAVIA_CONF.new" "$OCTAVIA_CONF"; then
        CONF_CHANGED=1
        mv "$OCTAVIA_CONF.new" "$OCTAVIA_CONF"
    else
        rm -f "$OCTAVIA_CONF.new"
    fi
    chmod 600 "$OCTAVIA_CONF" "$RMQ_BASE/rabbitmq.conf"
}

# ---------------------------------------------------------------- helpers
port_busy() { [[ -n $(ss -ltnH "sport = :$1" 2>/dev/null) ]]; }
# need_port PORT WHAT: die if something already listens on PORT.
need_port() {
    port_busy "$1" || return 0
    die "port $1 ($2) is already in use: $(ss -ltnpH "sport = :$1" | head -1)"
}

# start_bg NAME CMD...: start CMD in a new session, record its PID.
start_bg() {
    local name=$1
    shift
    setsid "$@" >>"$LOGS/$name.out" 2>&1 </dev/null 9>&- &
    echo $! >"$PIDS/$name.pid"
}

# wait_until NAME DESCRIPTION CMD...: poll CMD until it succeeds; fail if the
# service NAME dies or after $T seconds.
wait_until() {
    local name=$1 what=$2 deadline=$((SECONDS + T))
    shift 2
    local logs=("${SVC_LOG[$name]}" "$LOGS/$name.out")
    [[ $name == octavia-api ]] && logs+=("$LOGS/gunicorn.log")
    until "$@" >/dev/null 2>&1; do
        svc_pid "$name" >/dev/null || die "$name exited while waiting for $what" "${logs[@]}"
        ((SECONDS < deadline)) || die "timed out after ${T}s waiting for $what" "${logs[@]}"
        sleep 0.5
    done
}

# ---------------------------------------------------------------- mariadb
db_ping() { mariadb-admin --defaults-file="$MY_CNF" --connect-timeout=2 ping; }

start_mariadb() {
    if svc_pid mariadb >/dev/null; then
        wait_until mariadb "mariadb to answer" db_ping
        return 0
    fi
    if [[ ! -d $RUN/mysql/data/mysql ]]; then
        say "mariadb: initialising $RUN/mysql/data"
        rm -rf "$RUN/mysql/data"
        mariadb-install-db --defaults-file="$MY_CNF" --skip-test-db \
            --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed" "$LOGS/mariadb-install.log"
        rm -f "$RUN/mysql/schema.stamp"
    fi
    need_port "$CAPO_OCTAVIA_DB_PORT" CAPO_OCTAVIA_DB_PORT
    say "mariadb: starting on 127.0.0.1:$CAPO_OCTAVIA_DB_PORT"
    start_bg mariadb mariadbd --defaults-file="$MY_CNF"
    wait_until mariadb "mariadb to answer" db_ping
}

setup_db() {
    mysql_root <<EOF || die "creating the octavia database failed" "$LOGS/mariadb.log"
CREATE DATABASE IF NOT EXISTS octavia CHARACTER SET utf8mb3;
CREATE USER IF NOT EXISTS 'octavia'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'octavia'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON octavia.* TO 'octavia'@'127.0.0.1';
GRANT ALL PRIVILEGES ON octavia.* TO 'octavia'@'localhost';
EOF
    local want
    want=$(<"$VENV/.capo-stamp")
    if [[ ! -f $RUN/mysql/schema.stamp || $(<"$RUN/mysql/schema.stamp") != "$want" ]]; then
        say "mariadb: octavia-db-manage upgrade head"
        timeout "$T" "$VENV/bin/octavia-db-manage" --config-file "$OCTAVIA_CONF" upgrade head \
            >"$LOGS/db-manage.log" 2>&1 || die "octavia-db-manage upgrade head failed" "$LOGS/db-manage.log"
        echo "$want" >"$RUN/mysql/schema.stamp"
    fi
}

# ---------------------------------------------------------------- rabbitmq
rmq_ready() { rmqctl -q await_startup --timeout 10; }

start_rabbitmq() {
    if svc_pid rabbitmq >/dev/null; then
        wait_until rabbitmq "rabbitmq to boot" rmq_ready
        return 0
    fi
    need_port "$CAPO_OCTAVIA_AMQP_PORT" CAPO_OCTAVIA_AMQP_PORT
    need_port "$CAPO_OCTAVIA_DIST_PORT" CAPO_OCTAVIA_DIST_PORT
    say "rabbitmq: starting $RMQ_NODE on 127.0.0.1:$CAPO_OCTAVIA_AMQP_PORT"
    (rmq_env && start_bg rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
    wait_until rabbitmq "rabbitmq to boot" rmq_ready
}

# ---------------------------------------------------------------- octavia
start_octavia() {
    local name
    if ((CONF_CHANGED || VENV_CHANGED)); then
        for name in octavia-api octavia-driver-agent octavia-worker; do
            if svc_pid "$name" >/dev/null; then
                say "octavia.conf or venv changed: restarting $name"
                stop_group "$name" 30
            fi
        done
    fi
    if ! svc_pid octavia-worker >/dev/null; then
        say "octavia-worker: starting"
        start_bg octavia-worker "$VENV/bin/octavia-worker" --config-file "$OCTAVIA_CONF" \
            --log-file "${SVC_LOG[octavia-worker]}"
    fi
    if ! svc_pid octavia-driver-agent >/dev/null; then
        say "octavia-driver-agent: starting"
        rm -f "$RUN"/sock/*.sock
        start_bg octavia-driver-agent "$VENV/bin/octavia-driver-agent" --config-file "$OCTAVIA_CONF" \
            --log-file "${SVC_LOG[octavia-driver-agent]}"
    fi
    if ! svc_pid octavia-api >/dev/null; then
        need_port "$CAPO_OCTAVIA_API_PORT" CAPO_OCTAVIA_API_PORT
        say "octavia-api: starting gunicorn on $URL"
        CAPO_OCTAVIA_CONF=$OCTAVIA_CONF CAPO_OCTAVIA_API_LOG=${SVC_LOG[octavia-api]} \
            start_bg octavia-api "$VENV/bin/gunicorn" \
            --bind "127.0.0.1:$CAPO_OCTAVIA_API_PORT" \
            --workers "${CAPO_OCTAVIA_API_WORKERS:-1}" --worker-class gthread --threads 8 \
            --timeout 120 --graceful-timeout 5 \
            --pythonpath "$RUN" --chdir "$RUN" \
            --error-logfile "$LOGS/gunicorn.log" --no-control-socket \
            capo_octavia_wsgi:application
    fi
}

api_ready() {
    [[ $(curl -sS -m 5 -o /dev/null -w '%{http_code}' -H 'X-Project-Id: capo-up-probe' \
        "$URL/v2/lbaas/loadbalancers") == 200 ]]
}
worker_consuming() {
    rmqctl -q list_queues name consumers 2>/dev/null |
        awk '$1 == "octavia_provisioning_v2" && $2 > 0 { ok = 1 } END { exit !ok }'
}
agent_ready() { [[ -S $RUN/sock/status.sock && -S $RUN/sock/stats.sock && -S $RUN/sock/get.sock ]]; }

# ---------------------------------------------------------------- main
START=$SECONDS
install_packages
install_venv
make_files
start_mariadb
setup_db
start_rabbitmq
start_octavia
wait_until octavia-api "the API to answer GET /v2/lbaas/loadbalancers" api_ready
wait_until octavia-driver-agent "the driver-agent sockets" agent_ready
wait_until octavia-worker "octavia-worker to consume octavia_provisioning_v2" worker_consuming

echo "CAPO_REAL_OCTAVIA_URL=$URL" >"$RUN/env"
say "ready in $((SECONDS - START))s (run dir $RUN, logs $LOGS)"
trap - ERR
echo "CAPO_REAL_OCTAVIA_URL=$URL"
