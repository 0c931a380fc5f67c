# shellcheck shell=bash disable=SC2034
# Shared settings and helpers for up.sh, down.sh and fault.sh (sourced, not run).
#
# Everything the real-Octavia test stack runs lives under one run directory and
# listens on 127.0.0.1 only. Environment (all optional):
#   CAPO_OCTAVIA_RUN        run dir: config, data, logs, PID files, sockets
#                           (default /tmp/capo-octavia)
#   CAPO_OCTAVIA_VENV       Python venv holding octavia==19.0.0 + gunicorn
#                           (default /var/cache/capo-rs/octavia-venv)
#   CAPO_OCTAVIA_PYTHON     interpreter used to create the venv (default /usr/bin/python3)
#   CAPO_OCTAVIA_API_PORT   Octavia API (gunicorn)            default 19876
#   CAPO_OCTAVIA_DB_PORT    MariaDB TCP                       default 13306
#   CAPO_OCTAVIA_AMQP_PORT  RabbitMQ AMQP                     default 15673
#   CAPO_OCTAVIA_DIST_PORT  RabbitMQ node Erlang distribution default 15674
#   CAPO_OCTAVIA_EPMD_PORT  private epmd                      default 15675
#   CAPO_OCTAVIA_CTL_PORT   first of 11 ports for rabbitmqctl's own distribution
#                           listener (default 15676, i.e. 15676-15686)
#   CAPO_OCTAVIA_TIMEOUT    seconds allowed for each wait (default 180)

CAPO_OCTAVIA_RUN=${CAPO_OCTAVIA_RUN:-/tmp/capo-octavia}
CAPO_OCTAVIA_VENV=${CAPO_OCTAVIA_VENV:-/var/cache/capo-rs/octavia-venv}
CAPO_OCTAVIA_PYTHON=${CAPO_OCTAVIA_PYTHON:-/usr/bin/python3}
CAPO_OCTAVIA_API_PORT=${CAPO_OCTAVIA_API_PORT:-19876}
CAPO_OCTAVIA_DB_PORT=${CAPO_OCTAVIA_DB_PORT:-13306}
CAPO_OCTAVIA_AMQP_PORT=${CAPO_OCTAVIA_AMQP_PORT:-15673}
CAPO_OCTAVIA_DIST_PORT=${CAPO_OCTAVIA_DIST_PORT:-15674}
CAPO_OCTAVIA_EPMD_PORT=${CAPO_OCTAVIA_EPMD_PORT:-15675}
CAPO_OCTAVIA_CTL_PORT=${CAPO_OCTAVIA_CTL_PORT:-15676}
CAPO_OCTAVIA_TIMEOUT=${CAPO_OCTAVIA_TIMEOUT:-180}

RUN=$CAPO_OCTAVIA_RUN
VENV=$CAPO_OCTAVIA_VENV
PIDS=$RUN/pid
LOGS=$RUN/log
OCTAVIA_CONF=$RUN/octavia.conf
MY_CNF=$RUN/my.cnf
RMQ_BASE=$RUN/rabbitmq
RMQ_NODE=capo-octavia@localhost

# Name of each service we start, the log to show when it fails, and a string
# that must appear in /proc/PID/cmdline (guards against a recycled PID).
declare -A SVC_LOG=(
    [mariadb]=$LOGS/mariadb.log
    [rabbitmq]=$RMQ_BASE/log/$RMQ_NODE.log
    [octavia-api]=$LOGS/octavia-api.log
    [octavia-worker]=$LOGS/octavia-worker.log
    [octavia-driver-agent]=$LOGS/octavia-driver-agent.log
)
declare -A SVC_MARK=(
    [mariadb]=$MY_CNF
    [rabbitmq]=rabbitmq
    [octavia-api]=capo_octavia_wsgi
    [octavia-worker]=octavia-worker
    [octavia-driver-agent]=octavia-driver-agent
)

say() { printf '[capo-octavia +%ss] %s\n' "$SECONDS" "$*" >&2; }

# die MESSAGE [LOGFILE...]: print the message and the tail of each log, exit 1.
die() {
    local msg=$1 f
    shift
    printf '[capo-octavia] ERROR: %s\n' "$msg" >&2
    for f in "$@"; do
        [[ -f $f ]] || continue
        printf '[capo-octavia] ---- last 40 lines of %s ----\n' "$f" >&2
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

# Environment for RabbitMQ server and CLI tools: private node name, dirs,
# cookie ($HOME), epmd port and loopback-only listeners.
rmq_env() {
    export HOME=$RMQ_BASE/home
    export RABBITMQ_CONF_ENV_FILE=$RMQ_BASE/rabbitmq-env.conf
    export RABBITMQ_NODENAME=$RMQ_NODE
    export RABBITMQ_USE_LONGNAME=false
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$CAPO_OCTAVIA_AMQP_PORT
    export RABBITMQ_DIST_PORT=$CAPO_OCTAVIA_DIST_PORT
    export RABBITMQ_CONFIG_FILE=$RMQ_BASE/rabbitmq.conf
    export RABBITMQ_CONFIG_FILES=$RMQ_BASE/conf.d
    export RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ_BASE/advanced.config
    export RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_BASE/enabled_plugins
    export RABBITMQ_MNESIA_BASE=$RMQ_BASE/mnesia
    export RABBITMQ_LOG_BASE=$RMQ_BASE/log
    export RABBITMQ_PID_FILE=$RMQ_BASE/beam.pid
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_DIST_PORT_MIN=$CAPO_OCTAVIA_CTL_PORT
    export RABBITMQ_CTL_DIST_PORT_MAX=$((CAPO_OCTAVIA_CTL_PORT + 10))
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=$CAPO_OCTAVIA_EPMD_PORT
}

# rmqctl ARGS...: rabbitmqctl against our node, as root, in a subshell.
rmqctl() {
    (rmq_env && exec /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RMQ_NODE" "$@")
}

# mysql_root ARGS...: the MariaDB client as root over our unix socket.
mysql_root() {
    mariadb --defaults-file="$MY_CNF" "$@"
}

# stop_group NAME [SECONDS]: SIGTERM the process we started for NAME and wait
# until its whole session is gone (each service is started with setsid, so its
# PID is also its session and group id); SIGKILL the group after the grace
# period. Only the leader gets SIGTERM: gunicorn, cotyledon and the driver
# agent shut their children down themselves (the driver agent hangs forever
# if its children die first). Idempotent.
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
