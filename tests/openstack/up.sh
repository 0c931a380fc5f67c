#!/usr/bin/env bash
# up.sh - install (if needed) and start a real OpenStack for capo-rs's tests, on 127.0.0.1 only:
# Keystone, Glance, Placement, Nova, Neutron, Cinder and Octavia of one release (2026.2), with
# drivers that need no hypervisor, agent, storage or amphora.
#
# What runs (all as root, each in its own session, PID files in $RUN/pid; logs in $RUN/log):
#   mariadb, rabbitmq     their own datadir, node, ports (lib.sh PORT)
#   keystone              fernet tokens; the catalog; users admin, capo (tenant) and one per service
#   glance-api            file store under $RUN/glance
#   placement-api
#   nova-api, -conductor, -scheduler, -compute
#                         compute with the fake virt driver (servers live in its memory)
#   neutron-api           ML2 with vxlan tenant networks, a flat external network, the router
#                         and trunk plugins, port binding by capo_bind_all (drivers/)
#   cinder-api, -scheduler, -volume
#                         the NoStorageVolumeDriver back end (drivers/)
#   octavia-api, -worker, -driver-agent
#                         amphora provider, no-op compute and amphora drivers, VIP ports real
#                         (capo_vip_port, drivers/)
# The WSGI services run under gunicorn (1 worker x 8 threads).
#
# Then setup_cloud.py fills the cloud (see its docstring): flavors, an image, external networks,
# the tenant's network, a key pair, an application credential, a project with no room; and
# writes $RUN/clouds.yaml with clouds `capo` (password), `capo-appcred`, `capo-quota` and
# `capo-admin`.
#
# Idempotent: installed packages, the venv, the databases and running services are reused; a
# service restarts only when its configuration or the venv changed. Every wait is bounded by
# $CAPO_OPENSTACK_TIMEOUT. Progress goes to stderr; the last stdout line is
#   CAPO_REAL_OPENSTACK_CLOUDS=<path of clouds.yaml>
# (also written to $RUN/env). Non-zero exit and the log's tail on any failure.
#
# Environment: see lib.sh, plus CAPO_OPENSTACK_DEBUG=1 for debug logging in the services.
# Stop with down.sh; inject faults with fault.sh.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

# neutron 29.0.0 imports pyroute2 without declaring it.
RELEASE=(keystone==30.0.0 glance==33.0.0 openstack-placement==16.0.0 nova==34.0.0
    neutron==29.0.0 cinder==29.0.0 octavia==19.0.0 gunicorn python-openstackclient
    python-octaviaclient PyMySQL
    pyroute2)
CONSTRAINTS=$HERE/constraints.txt
DRIVERS=$HERE/drivers
APT_PACKAGES=(mariadb-server mariadb-client rabbitmq-server openssl python3-venv curl procps
    iproute2 qemu-utils)
# The compute host's name: the fake driver's servers and their port bindings live there.
COMPUTE_HOST=capo-compute-1

trap 'die "up.sh failed at line $LINENO: $BASH_COMMAND"' ERR
[[ $(id -u) == 0 ]] || die "must run as root"

mkdir -p -m 755 "$RUN"
# Root runs code from here (the WSGI wrappers): refuse a run dir someone else could write.
[[ $(stat -c '%u' "$RUN") == 0 && $((0$(stat -c '%a' "$RUN") & 022)) == 0 ]] ||
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
        printf '#!/bin/sh\n# capo-rs tests/openstack/up.sh: no daemon starts during install\nexit 101\n' \
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
venv_stamp() {
    local pins=none drivers
    [[ -f $CONSTRAINTS ]] && pins=$(sha256sum <"$CONSTRAINTS" | cut -c1-16)
    drivers=$(cat "$DRIVERS/pyproject.toml" "$DRIVERS"/capo_test_drivers/*.py | sha256sum | cut -c1-16)
    echo "${RELEASE[*]} python=$("$CAPO_OPENSTACK_PYTHON" -c 'import sys; print(sys.version.split()[0])') constraints=$pins drivers=$drivers"
}

install_venv() {
    local want have=""
    want=$(venv_stamp)
    [[ -f $VENV/.capo-stamp ]] && have=$(<"$VENV/.capo-stamp")
    [[ $have == "$want" && -x $VENV/bin/nova-compute && -x $VENV/bin/gunicorn ]] && return 0
    VENV_CHANGED=1
    mkdir -p "$(dirname "$VENV")"
    # the venv may be shared by several run dirs: one installer at a time
    exec 8>"$VENV.lock"
    flock -w "$T" 8 || die "another up.sh is installing $VENV"
    if [[ ! -x $VENV/bin/python ]]; then
        say "venv: creating $VENV with $CAPO_OPENSTACK_PYTHON"
        "$CAPO_OPENSTACK_PYTHON" -m venv "$VENV" >"$RUN/pip.log" 2>&1 ||
            die "python venv creation failed" "$RUN/pip.log"
    fi
    local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    if [[ -f $CONSTRAINTS ]]; then
        say "venv: pip install ${RELEASE[*]} (-c constraints.txt; a few minutes the first time)"
        "${pip[@]}" -c "$CONSTRAINTS" "${RELEASE[@]}" >>"$RUN/pip.log" 2>&1 ||
            die "pip install failed" "$RUN/pip.log"
    else
        say "venv: no constraints.txt: unpinned install, then pip freeze > $CONSTRAINTS"
        "${pip[@]}" "${RELEASE[@]}" >>"$RUN/pip.log" 2>&1 || die "pip install failed" "$RUN/pip.log"
        {
            echo "# Pins for tests/openstack/up.sh: every Python package of the test cloud's venv."
            echo "# Generated by pip freeze after an unpinned install; edit with care."
            "$VENV/bin/python" -m pip freeze --disable-pip-version-check --exclude capo-rs-test-drivers
        } >"$CONSTRAINTS.tmp"
        mv "$CONSTRAINTS.tmp" "$CONSTRAINTS"
    fi
    # The drivers' package (its build backend, setuptools, comes from PyPI like the rest).
    "${pip[@]}" --no-deps --force-reinstall "$DRIVERS" >>"$RUN/pip.log" 2>&1 ||
        die "installing tests/openstack/drivers failed" "$RUN/pip.log"
    rm -rf "$DRIVERS/build" "$DRIVERS"/*.egg-info
    "$VENV/bin/python" -c 'import keystone, glance, placement, nova, neutron, cinder, octavia, pymysql, capo_test_drivers.neutron_binding' \
        >>"$RUN/pip.log" 2>&1 || die "venv is missing modules" "$RUN/pip.log"
    venv_stamp >"$VENV/.capo-stamp"
    exec 8>&-
}

# ---------------------------------------------------------------- files
make_files() {
    mkdir -p "$PIDS" "$LOGS" "$ETC" "$RUN/lock" "$RUN/pki" "$RUN/mysql" \
        "$RMQ_BASE/home" "$RMQ_BASE/mnesia" "$RMQ_BASE/log" "$RMQ_BASE/conf.d"
    chmod 755 "$RUN"
    if [[ ! -s $RUN/secrets.env ]]; then
        (
            umask 077
            for name in DB_PASS RMQ_PASS ADMIN_PASS SERVICE_PASS TENANT_PASS APPCRED_SECRET; do
                echo "$name=$(openssl rand -hex 12)"
            done
            echo "AMP_PASS=$(openssl rand -hex 16)" # exactly 32 chars
        ) >"$RUN/secrets.env.tmp"
        mv "$RUN/secrets.env.tmp" "$RUN/secrets.env"
    fi
    # shellcheck disable=SC1091
    . "$RUN/secrets.env"
    if [[ ! -s $RUN/pki/ca.pem || ! -s $RUN/pki/ca.key ]]; then
        say "pki: generating Octavia's test CA"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
            -subj "/CN=capo-rs octavia test CA" \
            -keyout "$RUN/pki/ca.key" -out "$RUN/pki/ca.pem" >"$LOGS/openssl.log" 2>&1 ||
            die "openssl failed" "$LOGS/openssl.log"
        chmod 600 "$RUN/pki/ca.key"
    fi
    # The image: a raw disk of 1 MiB (nothing boots it).
    [[ -s $RUN/image.raw ]] || truncate -s 1M "$RUN/image.raw"
    write_mariadb_conf
    write_rabbitmq_conf
    write_admin_clouds
    # shellcheck source=conf.sh
    . "$HERE/conf.sh"
    write_configs
}

write_admin_clouds() {
    (
        umask 077
        cat >"$ADMIN_CLOUDS_YAML" <<EOF
# generated by tests/openstack/up.sh: the stack's admin, for its own scripts
clouds:
  capo-admin:
    auth:
      auth_url: http://127.0.0.1:${PORT[keystone]}/v3
      username: admin
      password: $ADMIN_PASS
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: $REGION
    identity_api_version: 3
EOF
    )
}

write_mariadb_conf() {
    cat >"$MY_CNF" <<EOF
# generated by tests/openstack/up.sh
[mysqld]
user=root
datadir=$RUN/mysql/data
socket=$RUN/mysql/mysqld.sock
pid-file=$RUN/mysql/mysqld.pid
log-error=$LOGS/mariadb.log
bind-address=127.0.0.1
port=${PORT[db]}
skip-name-resolve
skip-log-bin
character-set-server=utf8mb3
collation-server=utf8mb3_general_ci
max_connections=1000
innodb_buffer_pool_size=256M
innodb_flush_log_at_trx_commit=2
innodb_use_native_aio=0
event_scheduler=ON
[client]
user=root
socket=$RUN/mysql/mysqld.sock
EOF
}

write_rabbitmq_conf() {
    if [[ ! -s $RMQ_BASE/home/.erlang.cookie ]]; then
        openssl rand -hex 10 | tr a-f A-F >"$RMQ_BASE/home/.erlang.cookie"
        chmod 400 "$RMQ_BASE/home/.erlang.cookie"
    fi
    echo "# our settings come from the environment (lib.sh rmq_env); do not read /etc" \
        >"$RMQ_BASE/rabbitmq-env.conf"
    echo "[]." >"$RMQ_BASE/enabled_plugins" # no management plugin (it would listen on 0.0.0.0)
    echo "[]." >"$RMQ_BASE/advanced.config"
    cat >"$RMQ_BASE/rabbitmq.conf" <<EOF
# generated by tests/openstack/up.sh; listeners come from RABBITMQ_NODE_IP_ADDRESS/PORT
default_user = capo
default_pass = $RMQ_PASS
default_vhost = /
# no heartbeats: fault.sh may freeze a service for minutes
heartbeat = 0
log.console = false
log.file.level = info
EOF
    chmod 600 "$RMQ_BASE/rabbitmq.conf"
}

# ---------------------------------------------------------------- mariadb, rabbitmq
DATABASES=(keystone glance placement nova_api nova nova_cell0 neutron cinder octavia)
db_ping() { mariadb-admin --defaults-file="$MY_CNF" --connect-timeout=2 ping; }

start_mariadb() {
    if ! svc_pid mariadb >/dev/null; then
        if [[ ! -d $RUN/mysql/data/mysql ]]; then
            say "mariadb: initialising $RUN/mysql/data"
            rm -rf "$RUN/mysql/data" "$RUN"/mysql/*.stamp
            mariadb-install-db --defaults-file="$MY_CNF" --skip-test-db \
                --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1 ||
                die "mariadb-install-db failed" "$LOGS/mariadb-install.log"
        fi
        need_port "${PORT[db]}" "MariaDB"
        say "mariadb: starting on 127.0.0.1:${PORT[db]}"
        start_bg mariadb mariadbd --defaults-file="$MY_CNF"
    fi
    wait_until mariadb "mariadb to answer" db_ping
    local sql="" db
    for db in "${DATABASES[@]}"; do
        sql+="CREATE DATABASE IF NOT EXISTS $db CHARACTER SET utf8mb3;"
    done
    mysql_root <<EOF || die "creating the databases failed" "$LOGS/mariadb.log"
$sql
CREATE USER IF NOT EXISTS 'capo'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'capo'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'capo'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'capo'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON *.* TO 'capo'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO 'capo'@'localhost';
EOF
}

rmq_ready() { rmqctl -q await_startup --timeout 10; }

start_rabbitmq() {
    if ! svc_pid rabbitmq >/dev/null; then
        need_port "${PORT[amqp]}" "RabbitMQ AMQP"
        need_port "${PORT[dist]}" "RabbitMQ distribution"
        say "rabbitmq: starting $RMQ_NODE on 127.0.0.1:${PORT[amqp]}"
        (rmq_env && start_bg rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
    fi
    wait_until rabbitmq "rabbitmq to boot" rmq_ready
}

# ---------------------------------------------------------------- schemas
# migrate NAME CMD...: run a schema step once per venv (a stamp in the data dir).
migrate() {
    local name=$1 stamp="$RUN/mysql/$1.stamp" want
    shift
    want=$(<"$VENV/.capo-stamp")
    [[ -f $stamp && $(<"$stamp") == "$want" ]] && return 0
    say "schema: $name"
    timeout "$T" bash -c '"$@"' migrate "$@" >>"$LOGS/schema-$name.log" 2>&1 ||
        die "$name failed" "$LOGS/schema-$name.log"
    echo "$want" >"$stamp"
}

# The schema steps, run by `migrate` in a child bash (bounded by timeout).
keystone_manage() { "$VENV/bin/keystone-manage" --config-file "$ETC/keystone/keystone.conf" "$@"; }
keystone_keys() {
    keystone_manage fernet_setup --keystone-user root --keystone-group root &&
        keystone_manage credential_setup --keystone-user root --keystone-group root
}
nova_manage() { "$VENV/bin/nova-manage" --config-file "$ETC/nova/nova.conf" "$@"; }
# cell0 and cell1, each once (create_cell refuses a second cell1).
nova_cells() {
    nova_manage cell_v2 map_cell0 --database_connection "$CELL0_URL" &&
        { nova_manage cell_v2 list_cells | grep -q ' cell1 ' || nova_manage cell_v2 create_cell --name cell1; }
}

migrate_all() {
    export VENV ETC CELL0_URL
    CELL0_URL=$(db_url nova_cell0)
    export -f keystone_manage keystone_keys nova_manage nova_cells
    migrate keystone-db keystone_manage db_sync
    migrate keystone-keys keystone_keys
    migrate keystone-bootstrap keystone_manage bootstrap --bootstrap-password "$ADMIN_PASS" \
        --bootstrap-admin-url "$KEYSTONE_URL/v3" --bootstrap-internal-url "$KEYSTONE_URL/v3" \
        --bootstrap-public-url "$KEYSTONE_URL/v3" --bootstrap-region-id "$REGION"
    migrate glance "$VENV/bin/glance-manage" --config-file "$ETC/glance/glance-api.conf" db_sync
    migrate placement "$VENV/bin/placement-manage" --config-file "$ETC/placement/placement.conf" db sync
    migrate neutron "$VENV/bin/neutron-db-manage" --config-file "$ETC/neutron/neutron.conf" \
        --config-file "$ETC/neutron/ml2_conf.ini" upgrade heads
    migrate nova-api-db nova_manage api_db sync
    migrate nova-cells nova_cells
    migrate nova-db nova_manage db sync
    migrate cinder "$VENV/bin/cinder-manage" --config-file "$ETC/cinder/cinder.conf" db sync
    migrate octavia "$VENV/bin/octavia-db-manage" --config-file "$ETC/octavia/octavia.conf" upgrade head
}

# ---------------------------------------------------------------- services
# restart_changed: stop every running service whose configuration (or the venv) changed.
restart_changed() {
    local name component
    for name in "${SERVICES[@]}"; do
        [[ $name == mariadb || $name == rabbitmq ]] && continue
        component=${name%%-*}
        if ((VENV_CHANGED)) || [[ -n ${CHANGED[$component]:-} ]]; then
            svc_pid "$name" >/dev/null && stop_group "$name" 30
        fi
    done
    return 0
}

setup_cloud() {
    CAPO_OS_REGION=$REGION CAPO_OS_KEYSTONE_URL=$KEYSTONE_URL \
        CAPO_OS_GLANCE_URL=http://127.0.0.1:${PORT[glance]} \
        CAPO_OS_PLACEMENT_URL=http://127.0.0.1:${PORT[placement]} \
        CAPO_OS_NOVA_URL=http://127.0.0.1:${PORT[nova]} \
        CAPO_OS_NEUTRON_URL=http://127.0.0.1:${PORT[neutron]} \
        CAPO_OS_CINDER_URL=http://127.0.0.1:${PORT[cinder]} \
        CAPO_OS_OCTAVIA_URL=http://127.0.0.1:${PORT[octavia]} \
        CAPO_OS_ADMIN_PASS=$ADMIN_PASS CAPO_OS_SERVICE_PASS=$SERVICE_PASS \
        CAPO_OS_TENANT_PASS=$TENANT_PASS CAPO_OS_APPCRED_SECRET=$APPCRED_SECRET \
        CAPO_OS_CLOUDS_YAML=$CLOUDS_YAML CAPO_OS_IMAGE_FILE=$RUN/image.raw \
        timeout "$T" "$VENV/bin/python" "$HERE/setup_cloud.py" "$1" >>"$LOGS/setup-cloud.log" 2>&1 ||
        die "setup_cloud.py $1 failed" "$LOGS/setup-cloud.log"
}

# The compute host is up, mapped to its cell, and has a resource provider.
compute_ready() {
    openstack_cli compute service list --service nova-compute -f value -c State |
        grep -qx up &&
        openstack_cli hypervisor list -f value -c 'Hypervisor Hostname' | grep -q .
}
volume_ready() {
    openstack_cli volume service list --service cinder-volume -f value -c State | grep -qx up
}
worker_consuming() {
    rmqctl -q list_queues name consumers 2>/dev/null |
        awk '$1 == "octavia_provisioning_v2" && $2 > 0 { ok = 1 } END { exit !ok }'
}
agent_ready() {
    local s=$RUN/octavia/sock
    [[ -S $s/status.sock && -S $s/stats.sock && -S $s/get.sock ]]
}

start_all() {
    local name
    start_service keystone
    setup_cloud identity
    for name in "${SERVICES[@]}"; do
        case $name in mariadb | rabbitmq | keystone) continue ;; esac
        start_service "$name"
    done
    wait_until nova-compute "the compute host to report to Nova and Placement" compute_ready
    wait_until cinder-volume "cinder-volume to report" volume_ready
    wait_until octavia-worker "octavia-worker to consume octavia_provisioning_v2" worker_consuming
    wait_until octavia-driver-agent "the driver-agent sockets" agent_ready
    setup_cloud resources
}

# ---------------------------------------------------------------- main
START=$SECONDS
install_packages
install_venv
make_files
start_mariadb
start_rabbitmq
migrate_all
restart_changed
start_all

echo "CAPO_REAL_OPENSTACK_CLOUDS=$CLOUDS_YAML" >"$RUN/env"
say "ready in $((SECONDS - START))s (run dir $RUN, logs $LOGS)"
trap - ERR
echo "CAPO_REAL_OPENSTACK_CLOUDS=$CLOUDS_YAML"
