# shellcheck shell=bash disable=SC2034
# Shared settings and helpers for up.sh, down.sh and fault.sh (sourced, not run).
#
# Everything the real OpenStack test stack runs lives under one run directory and listens on
# 127.0.0.1 only. Environment (all optional):
#   CAPO_OPENSTACK_RUN      run dir: config, data, logs, PID files, sockets
#                           (default /tmp/capo-openstack)
#   CAPO_OPENSTACK_VENV     Python venv holding the services + gunicorn
#                           (default /var/cache/capo-rs/openstack-venv)
#   CAPO_OPENSTACK_PYTHON   interpreter used to create the venv (default /usr/bin/python3)
#   CAPO_OPENSTACK_TIMEOUT  seconds allowed for each wait (default 180)
#   CAPO_OPENSTACK_<SERVICE>_PORT  see PORT below (KEYSTONE, GLANCE, PLACEMENT, NOVA, NEUTRON,
#                           CINDER, OCTAVIA, DB, AMQP, DIST, EPMD, CTL; CTL is the first of 11)

CAPO_OPENSTACK_RUN=${CAPO_OPENSTACK_RUN:-/tmp/capo-openstack}
CAPO_OPENSTACK_VENV=${CAPO_OPENSTACK_VENV:-/var/cache/capo-rs/openstack-venv}
CAPO_OPENSTACK_PYTHON=${CAPO_OPENSTACK_PYTHON:-/usr/bin/python3}
CAPO_OPENSTACK_TIMEOUT=${CAPO_OPENSTACK_TIMEOUT:-180}

declare -A PORT=(
    [keystone]=${CAPO_OPENSTACK_KEYSTONE_PORT:-19500}
    [glance]=${CAPO_OPENSTACK_GLANCE_PORT:-19292}
    [placement]=${CAPO_OPENSTACK_PLACEMENT_PORT:-19778}
    [nova]=${CAPO_OPENSTACK_NOVA_PORT:-19774}
    [neutron]=${CAPO_OPENSTACK_NEUTRON_PORT:-19696}
    [cinder]=${CAPO_OPENSTACK_CINDER_PORT:-19776}
    [octavia]=${CAPO_OPENSTACK_OCTAVIA_PORT:-19876}
    [db]=${CAPO_OPENSTACK_DB_PORT:-13306}
    [amqp]=${CAPO_OPENSTACK_AMQP_PORT:-15673}
    [dist]=${CAPO_OPENSTACK_DIST_PORT:-15674}
    [epmd]=${CAPO_OPENSTACK_EPMD_PORT:-15675}
    [ctl]=${CAPO_OPENSTACK_CTL_PORT:-15676}
)

RUN=$CAPO_OPENSTACK_RUN
VENV=$CAPO_OPENSTACK_VENV
T=$CAPO_OPENSTACK_TIMEOUT
PIDS=$RUN/pid
LOGS=$RUN/log
ETC=$RUN/etc
MY_CNF=$RUN/my.cnf
RMQ_BASE=$RUN/rabbitmq
RMQ_NODE=capo-openstack@localhost
REGION=RegionOne
CLOUDS_YAML=$RUN/clouds.yaml
# The admin's cloud alone, written before the tenant's credentials exist (root only).
ADMIN_CLOUDS_YAML=$RUN/admin-clouds.yaml

# The WSGI services: name -> the module gunicorn serves (through a generated wrapper that hands
# it its configuration).
declare -A WSGI_APP=(
    [keystone]=keystone.wsgi.api
    [glance-api]=glance.wsgi.api
    [placement-api]=placement.wsgi.api
    [nova-api]=nova.wsgi.osapi_compute
    [neutron-api]=neutron.wsgi.api
    [cinder-api]=cinder.wsgi.api
    [octavia-api]=octavia.wsgi.api
)
# The port each WSGI service listens on.
declare -A WSGI_PORT=(
    [keystone]=${PORT[keystone]}
    [glance-api]=${PORT[glance]}
    [placement-api]=${PORT[placement]}
    [nova-api]=${PORT[nova]}
    [neutron-api]=${PORT[neutron]}
    [cinder-api]=${PORT[cinder]}
    [octavia-api]=${PORT[octavia]}
)

# Every service in start order; down.sh stops them in reverse.
SERVICES=(mariadb rabbitmq keystone glance-api placement-api neutron-api nova-api nova-conductor
    nova-scheduler nova-compute cinder-api cinder-scheduler cinder-volume octavia-api
    octavia-worker octavia-driver-agent)

# A string that must appear in /proc/PID/cmdline of each service (guards against a recycled
# PID).
declare -A SVC_MARK=(
    [mariadb]=$MY_CNF
    [rabbitmq]=rabbitmq
)
for _svc in "${!WSGI_APP[@]}"; do SVC_MARK[$_svc]="capo_wsgi_${_svc//-/_}"; done
for _svc in nova-conductor nova-scheduler nova-compute cinder-scheduler \
    cinder-volume octavia-worker octavia-driver-agent; do
    SVC_MARK[$_svc]=$_svc
done
unset _svc

say() { printf '[capo-openstack +%ss] %s\n' "$SECONDS" "$*" >&2; }

# The log a service writes, to show when it fails.
svc_log() {
    case $1 in
    mariadb) echo "$LOGS/mariadb.log" ;;
    rabbitmq) echo "$RMQ_BASE/log/$RMQ_NODE.log" ;;
    *) echo "$LOGS/$1.log" ;;
    esac
}

# die MESSAGE [LOGFILE...]: print the message and the tail of each log, exit 1.
die() {
    local msg=$1 f
    shift
    printf '[capo-openstack] ERROR: %s\n' "$msg" >&2
    for f in "$@"; do
        [[ -f $f ]] || continue
        printf '[capo-openstack] ---- last 40 lines of %s ----\n' "$f" >&2
        tail -n 40 "$f" >&2
    done
    exit 1
}

# svc_pid NAME: print the recorded PID if that process is alive and is ours.
svc_pid() {
    local name=$1 pid
    [[ -s $PIDS/$name.pid ]] || return 1
    pid=$(<"$PIDS/$name.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    # a zombie has an empty cmdline and is not "running"
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "${SVC_MARK[$name]}" || return 1
    echo "$pid"
}

# Environment for RabbitMQ server and CLI tools: private node name, dirs, cookie ($HOME), epmd
# port and loopback-only listeners.
rmq_env() {
    export HOME=$RMQ_BASE/home
    export RABBITMQ_CONF_ENV_FILE=$RMQ_BASE/rabbitmq-env.conf
    export RABBITMQ_NODENAME=$RMQ_NODE
    export RABBITMQ_USE_LONGNAME=false
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=${PORT[amqp]}
    export RABBITMQ_DIST_PORT=${PORT[dist]}
    export RABBITMQ_CONFIG_FILE=$RMQ_BASE/rabbitmq.conf
    export RABBITMQ_CONFIG_FILES=$RMQ_BASE/conf.d
    export RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ_BASE/advanced.config
    export RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_BASE/enabled_plugins
    export RABBITMQ_MNESIA_BASE=$RMQ_BASE/mnesia
    export RABBITMQ_LOG_BASE=$RMQ_BASE/log
    export RABBITMQ_PID_FILE=$RMQ_BASE/beam.pid
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_DIST_PORT_MIN=${PORT[ctl]}
    export RABBITMQ_CTL_DIST_PORT_MAX=$((PORT[ctl] + 10))
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=${PORT[epmd]}
}

# rmqctl ARGS...: rabbitmqctl against our node, as root, in a subshell.
rmqctl() {
    (rmq_env && exec /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RMQ_NODE" "$@")
}

# mysql_root ARGS...: the MariaDB client as root over our unix socket.
mysql_root() {
    mariadb --defaults-file="$MY_CNF" "$@"
}

# stop_group NAME [SECONDS]: SIGTERM the process we started for NAME and wait until its whole
# session is gone (each service is started with setsid, so its PID is also its session and group
# id); SIGKILL the group after the grace period. Only the leader gets SIGTERM: gunicorn,
# cotyledon and the driver agent shut their children down themselves (the driver agent hangs
# forever if its children die first). Idempotent.
stop_group() {
    local name=$1 grace=${2:-30} pid i
    if ! pid=$(svc_pid "$name"); then
        rm -f "$PIDS/$name.pid"
        return 0
    fi
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    # a SIGSTOPped group (fault.sh worker-stop) only acts on SIGTERM once continued
    kill -CONT -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        group_alive "$pid" || break
        sleep 0.1
    done
    if group_alive "$pid"; then
        say "$name did not exit within ${grace}s; SIGKILL"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            group_alive "$pid" || break
            sleep 0.1
        done
    fi
    rm -f "$PIDS/$name.pid"
}

# group_alive PGID: true while any non-zombie process is in the group.
group_alive() {
    local st
    while read -r st; do
        [[ $st == Z* ]] || return 0
    done < <(ps -o stat= --sid "$1" 2>/dev/null)
    return 1
}

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
    setsid "$@" >>"$LOGS/$name.out" 2>&1 </dev/null 9>&- 8>&- &
    echo $! >"$PIDS/$name.pid"
}

# wait_until NAME DESCRIPTION CMD...: poll CMD until it succeeds; fail if the service NAME dies
# or after $T seconds.
wait_until() {
    local name=$1 what=$2 deadline=$((SECONDS + T))
    shift 2
    local logs=("$(svc_log "$name")" "$LOGS/$name.out")
    until "$@" >/dev/null 2>&1; do
        svc_pid "$name" >/dev/null || die "$name exited while waiting for $what" "${logs[@]}"
        ((SECONDS < deadline)) || die "timed out after ${T}s waiting for $what" "${logs[@]}"
        sleep 0.5
    done
}

# start_wsgi NAME: gunicorn serving the service's WSGI wrapper on its port.
# Idle connections are kept for 5 minutes, not gunicorn's 2 s: a client reusing a pooled
# connection just as the server closes it gets "connection reset by peer", and OpenStack's own
# clients do not send again. Octavia's worker met it asking Neutron in the middle of a load
# balancer's create, which then went to ERROR (CI at f385d4c, seven clusters at once).
start_wsgi() {
    local name=$1 module="capo_wsgi_${1//-/_}"
    svc_pid "$name" >/dev/null && return 0
    need_port "${WSGI_PORT[$name]}" "$name"
    say "$name: starting gunicorn on 127.0.0.1:${WSGI_PORT[$name]}"
    start_bg "$name" "$VENV/bin/gunicorn" \
        --bind "127.0.0.1:${WSGI_PORT[$name]}" \
        --workers 1 --worker-class gthread --threads "${WSGI_THREADS:-8}" \
        --timeout 120 --graceful-timeout 5 --keep-alive "${WSGI_KEEPALIVE:-300}" \
        --pythonpath "$RUN/wsgi" --chdir "$RUN" \
        --error-logfile "$LOGS/$name.gunicorn.log" --no-control-socket \
        --name "$module" "$module:application"
}

# The configuration files each daemon (a non-WSGI service) reads.
declare -A DAEMON_CONF=(
    [nova-conductor]=$ETC/nova/nova.conf
    [nova-scheduler]=$ETC/nova/nova.conf
    [nova-compute]=$ETC/nova/nova.conf
    [cinder-scheduler]=$ETC/cinder/cinder.conf
    [cinder-volume]=$ETC/cinder/cinder.conf
    [octavia-worker]=$ETC/octavia/octavia.conf
    [octavia-driver-agent]=$ETC/octavia/octavia.conf
)

# start_daemon NAME: an oslo.service daemon of the venv, with its configuration.
start_daemon() {
    local name=$1
    svc_pid "$name" >/dev/null && return 0
    [[ $name == octavia-driver-agent ]] && rm -f "$RUN"/octavia/sock/*.sock
    say "$name: starting"
    start_bg "$name" "$VENV/bin/$name" --config-file "${DAEMON_CONF[$name]}" \
        --log-file "$LOGS/$name.log"
}

api_answers() { http_answers "http://127.0.0.1:${WSGI_PORT[$1]}/"; }

# start_service NAME: start NAME (a WSGI service or a daemon) unless it runs; for a WSGI
# service, wait until it answers.
start_service() {
    if [[ -n ${WSGI_APP[$1]:-} ]]; then
        start_wsgi "$1"
        wait_until "$1" "$1 to answer on port ${WSGI_PORT[$1]}" api_answers "$1"
    else
        start_daemon "$1"
    fi
}

# An admin token-free check that an HTTP service answers: any status below 500.
http_answers() {
    local code
    code=$(curl -sS -m 5 -o /dev/null -w '%{http_code}' "$1") || return 1
    ((code > 0 && code < 500))
}

# openstack_cli ARGS...: the OpenStack client as the stack's admin.
openstack_cli() {
    OS_CLOUD=capo-admin OS_CLIENT_CONFIG_FILE=$ADMIN_CLOUDS_YAML "$VENV/bin/openstack" "$@"
}
