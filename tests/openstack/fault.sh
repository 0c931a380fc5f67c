#!/usr/bin/env bash
# fault.sh - inject faults into the test OpenStack started by up.sh.
#
# Usage:
#   fault.sh stop SERVICE     stop a service (its port refuses connections), e.g. keystone,
#                             nova-api, neutron-api; see lib.sh SERVICES for the names
#   fault.sh start SERVICE    start it again; waits until an API answers
#   fault.sh freeze SERVICE   SIGSTOP it: connections are accepted and never answered
#   fault.sh thaw SERVICE     SIGCONT it
#   fault.sh member-delay LIKE_PATTERN SECONDS
#       MariaDB trigger: when a member whose name is LIKE the pattern turns
#       provisioning_status ACTIVE, SLEEP(SECONDS) inside that UPDATE. The
#       worker's flow blocks there, so the member stays PENDING_* that much
#       longer - and so does its load balancer (PENDING_UPDATE): Octavia marks
#       the member ACTIVE before the pool, listeners and LB.
#   fault.sh member-hold LIKE_PATTERN SECONDS
#       Trigger + MariaDB event: the ACTIVE write for a matching member is
#       swallowed (the member stays PENDING_CREATE/PENDING_UPDATE) while the
#       flow goes on and the LB returns to ACTIVE; about SECONDS later (1 s
#       granularity) an event flips the member to ACTIVE. Use this for
#       "LB ACTIVE, member still pending".
#   fault.sh member-release LIKE_PATTERN
#       End a member-hold now: drop its trigger and turn the matching held
#       members ACTIVE at once.
#   fault.sh member-error LIKE_PATTERN
#       Trigger: that ACTIVE write fails (SIGNAL 45000); the flow reverts, the
#       member goes ERROR and the LB/listener/pool go back to ACTIVE.
#   fault.sh ml2-extension DRIVER on|off
#       Add (or remove) an ML2 extension driver, e.g. port_trusted (the
#       port-trusted-vif extension), and restart neutron-api to load it.
#   fault.sh clear            drop every fault trigger and pending hold
#   fault.sh list             show the fault triggers in place
#   fault.sh worker-stop      SIGSTOP every octavia-worker process: new
#                             operations stay PENDING_* (LB PENDING_UPDATE)
#   fault.sh worker-cont      SIGCONT them; queued operations then run
#   fault.sh push-status KIND ID PROVISIONING_STATUS [OPERATING_STATUS]
#       Push a status through the driver-agent status socket with octavia-lib's
#       DriverLibrary, as a provider driver would (meant for the noop_driver
#       provider, whose objects otherwise stay PENDING_* forever).
#       KIND: loadbalancer|listener|pool|member|healthmonitor|l7policy|l7rule.
#       PROVISIONING_STATUS DELETED deletes the record. Use '' to leave
#       provisioning_status out (operating_status only).
#   fault.sh push-status-json JSON
#       Same with a full status dict, e.g.
#       '{"members":[{"id":"...","provisioning_status":"ACTIVE"}]}'.
#
# Several patterns may be active at once (one trigger per kind and pattern;
# MariaDB >= 10.2 allows several BEFORE UPDATE triggers per table). Setting the
# same kind and pattern again replaces that trigger. Patterns are SQL LIKE
# patterns (% and _ wildcards); a member with no name never matches.
#
# Environment: CAPO_OPENSTACK_RUN, CAPO_OPENSTACK_VENV (see lib.sh); CAPO_FAULT_SCOPE (below).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() {
    sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

need_db() {
    svc_pid mariadb >/dev/null || die "mariadb of $RUN is not running (run up.sh)"
}

# sql_string TEXT: TEXT as a single-quoted SQL literal.
sql_string() {
    local s=${1//\\/\\\\}
    s=${s//\'/\'\'}
    printf "'%s'" "$s"
}

# CAPO_FAULT_SCOPE (a word, default none): the member faults of one suite apart from the
# others'. A scoped suite's triggers are named capo_<scope>_fault_* and its holds live in the
# database capo_<scope>_fault, so `clear` elsewhere (unscoped, or another scope) leaves them be,
# and its own `clear` touches nothing else. tests/it/capo_peers.rs runs beside the main pass
# with CAPO_FAULT_SCOPE=peers.
SCOPE=${CAPO_FAULT_SCOPE:-}
[[ -z $SCOPE || $SCOPE =~ ^[a-z0-9]+$ ]] || die "CAPO_FAULT_SCOPE must be lower-case letters and digits, got '$SCOPE'"
PREFIX=capo_fault
[[ -z $SCOPE ]] || PREFIX=capo_${SCOPE}_fault
DB=$PREFIX

# trigger_name KIND PATTERN: a stable, valid identifier per kind and pattern.
trigger_name() {
    printf '%s_%s_%s' "$PREFIX" "$1" "$(printf '%s' "$2" | sha256sum | cut -c1-16)"
}

# The condition shared by all member triggers: this UPDATE turns a matching
# member ACTIVE.
member_cond() {
    printf "NEW.provisioning_status = 'ACTIVE' AND OLD.provisioning_status <> 'ACTIVE' AND NEW.name LIKE %s" \
        "$(sql_string "$1")"
}

create_trigger() { # NAME BODY
    mysql_root octavia <<EOF
DELIMITER //
CREATE OR REPLACE TRIGGER $1 BEFORE UPDATE ON member FOR EACH ROW
BEGIN
$2
END//
DELIMITER ;
EOF
}

ensure_hold_schema() {
    mysql_root <<EOF
CREATE DATABASE IF NOT EXISTS $DB;
CREATE TABLE IF NOT EXISTS $DB.member_hold (
    member_id VARCHAR(36) NOT NULL PRIMARY KEY,
    release_at DATETIME(3) NOT NULL,
    released TINYINT NOT NULL DEFAULT 0
);
SET GLOBAL event_scheduler = ON;
DELIMITER //
CREATE OR REPLACE EVENT $DB.release_members
ON SCHEDULE EVERY 1 SECOND
DO BEGIN
    UPDATE $DB.member_hold SET released = 1
        WHERE released = 0 AND release_at <= NOW(3);
    UPDATE octavia.member m JOIN $DB.member_hold h ON h.member_id = m.id
        SET m.provisioning_status = 'ACTIVE'
        WHERE h.released = 1
          AND m.provisioning_status IN ('PENDING_CREATE', 'PENDING_UPDATE');
    DELETE FROM $DB.member_hold WHERE released = 1;
END//
DELIMITER ;
EOF
}

# session_pids NAME: every process of the session up.sh started NAME in.
session_pids() {
    local pid
    pid=$(svc_pid "$1") || die "$1 of $RUN is not running"
    ps -o pid= --sid "$pid" | tr -d ' '
}

known_service() {
    local name
    for name in "${SERVICES[@]}"; do [[ $name == "$1" ]] && return 0; done
    die "unknown service '$1' (one of: ${SERVICES[*]})"
}

push_status() { # JSON
    local py=$VENV/bin/python
    [[ -x $py ]] || die "no venv at $VENV"
    [[ -S $RUN/octavia/sock/status.sock ]] || die "no driver-agent status socket in $RUN/octavia/sock"
    CAPO_STATUS_JSON=$1 CAPO_SOCK_DIR=$RUN/octavia/sock "$py" - <<'EOF'
import json
import os

from octavia_lib.api.drivers import driver_lib

sock = os.environ["CAPO_SOCK_DIR"]
lib = driver_lib.DriverLibrary(
    status_socket=os.path.join(sock, "status.sock"),
    stats_socket=os.path.join(sock, "stats.sock"),
    get_socket=os.path.join(sock, "get.sock"),
)
# raises octavia_lib UpdateStatusError if the agent refuses the update
lib.update_loadbalancer_status(json.loads(os.environ["CAPO_STATUS_JSON"]))
print("pushed")
EOF
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift

case $cmd in
member-delay)
    (($# == 2)) || usage
    [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "SECONDS must be a number, got '$2'"
    need_db
    name=$(trigger_name delay "$1")
    create_trigger "$name" "  IF $(member_cond "$1") THEN
    DO SLEEP($2);
  END IF;"
    say "member-delay: $name (name LIKE '$1', ${2}s)"
    ;;
member-hold)
    (($# == 2)) || usage
    [[ $2 =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number, got '$2'"
    need_db
    ensure_hold_schema
    name=$(trigger_name hold "$1")
    create_trigger "$name" "  IF $(member_cond "$1") AND NOT EXISTS (
      SELECT 1 FROM $DB.member_hold h WHERE h.member_id = NEW.id AND h.released = 1) THEN
    INSERT INTO $DB.member_hold (member_id, release_at)
      VALUES (NEW.id, NOW(3) + INTERVAL $2 SECOND)
      ON DUPLICATE KEY UPDATE release_at = VALUES(release_at), released = 0;
    SET NEW.provisioning_status = OLD.provisioning_status;
  END IF;"
    say "member-hold: $name (name LIKE '$1', ${2}s)"
    ;;
member-release)
    (($# == 1)) || usage
    need_db
    name=$(trigger_name hold "$1")
    mysql_root octavia -e "DROP TRIGGER IF EXISTS $name"
    if [[ -n $(mysql_root -N -B -e "SHOW DATABASES LIKE '$DB'") ]]; then
        mysql_root "$DB" <<EOF
UPDATE octavia.member m JOIN $DB.member_hold h ON h.member_id = m.id
    SET m.provisioning_status = 'ACTIVE'
    WHERE m.name LIKE $(sql_string "$1")
      AND m.provisioning_status IN ('PENDING_CREATE', 'PENDING_UPDATE');
DELETE h FROM $DB.member_hold h JOIN octavia.member m ON h.member_id = m.id
    WHERE m.name LIKE $(sql_string "$1");
EOF
    fi
    say "member-release: $name (name LIKE '$1')"
    ;;
member-error)
    (($# == 1)) || usage
    need_db
    name=$(trigger_name error "$1")
    create_trigger "$name" "  IF $(member_cond "$1") THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'capo-rs fault.sh member-error';
  END IF;"
    say "member-error: $name (name LIKE '$1')"
    ;;
clear)
    (($# == 0)) || usage
    need_db
    names=$(mysql_root -N -B -e "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS
        WHERE TRIGGER_SCHEMA = 'octavia' AND TRIGGER_NAME LIKE '${PREFIX//_/\\_}\\_%'")
    for name in $names; do
        mysql_root octavia -e "DROP TRIGGER IF EXISTS $name"
    done
    # release held members now rather than leaving them pending forever
    if [[ -n $(mysql_root -N -B -e "SHOW DATABASES LIKE '$DB'") ]]; then
        mysql_root -e "UPDATE $DB.member_hold SET release_at = NOW(3)"
        for _ in $(seq 1 30); do
            [[ $(mysql_root -N -B -e "SELECT COUNT(*) FROM $DB.member_hold") == 0 ]] && break
            sleep 0.2
        done
        mysql_root -e "DROP EVENT IF EXISTS $DB.release_members; DROP DATABASE $DB"
    fi
    say "clear: dropped $(wc -w <<<"$names") trigger(s)"
    ;;
list)
    need_db
    mysql_root -e "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS
        WHERE TRIGGER_SCHEMA = 'octavia' AND TRIGGER_NAME LIKE '${PREFIX//_/\\_}\\_%'\\G"
    ;;
ml2-extension)
    (($# == 2)) || usage
    [[ $1 =~ ^[a-z_]+$ && $2 =~ ^(on|off)$ ]] || die "usage: ml2-extension DRIVER on|off, got '$*'"
    conf=$ETC/neutron/ml2_conf.ini
    drivers=$(sed -n 's/^extension_drivers = //p' "$conf" | tr ',' '\n' | grep -vx "$1" | paste -sd, -)
    [[ $2 == on ]] && drivers=${drivers:+$drivers,}$1
    sed -i "s/^extension_drivers = .*/extension_drivers = $drivers/" "$conf"
    stop_group neutron-api 20
    start_service neutron-api
    say "ml2-extension: extension_drivers = $drivers"
    ;;
stop)
    (($# == 1)) || usage
    known_service "$1"
    stop_group "$1" 20
    ;;
start)
    (($# == 1)) || usage
    known_service "$1"
    start_service "$1"
    ;;
freeze | thaw)
    (($# == 1)) || usage
    known_service "$1"
    sig=STOP
    [[ $cmd == thaw ]] && sig=CONT
    pids=$(session_pids "$1")
    # shellcheck disable=SC2086
    kill -"$sig" $pids
    say "$cmd $1: SIG$sig sent to ${pids//$'\n'/ }"
    ;;
worker-stop | worker-cont)
    (($# == 0)) || usage
    sig=STOP
    [[ $cmd == worker-cont ]] && sig=CONT
    pids=$(session_pids octavia-worker)
    # shellcheck disable=SC2086
    kill -"$sig" $pids
    say "$cmd: SIG$sig sent to ${pids//$'\n'/ }"
    ;;
push-status)
    (($# == 3 || $# == 4)) || usage
    case $1 in
    loadbalancer | listener | pool | member | healthmonitor | l7policy | l7rule) ;;
    *) die "unknown KIND '$1'" ;;
    esac
    json=$(KIND=$1 ID=$2 PS=$3 OS=${4:-} python3 -c '
import json, os
item = {"id": os.environ["ID"]}
if os.environ["PS"]:
    item["provisioning_status"] = os.environ["PS"]
if os.environ["OS"]:
    item["operating_status"] = os.environ["OS"]
print(json.dumps({os.environ["KIND"] + "s": [item]}))')
    push_status "$json"
    ;;
push-status-json)
    (($# == 1)) || usage
    push_status "$1"
    ;;
-h | --help | help) usage ;;
*) usage ;;
esac
