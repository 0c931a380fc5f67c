#!/usr/bin/env bash
# up.sh - build (if needed) and start a real Kubernetes control plane for capo-rs's tests, on
# 127.0.0.1 only: etcd v3.6.16, kube-apiserver v1.35.4 (real TLS, service-account signing keys,
# the Node,RBAC authorizers) and kube-controller-manager v1.35.4 with the garbage collector and
# the namespace controller (so ownerReferences cascade and namespaces terminate).
#
# The binaries come from build.sh (Go module proxy, pinned by go.mod/go.sum, cached outside the
# clone). Then capo-rs's namespace, ServiceAccount and RBAC are applied from deploy/, and two
# kubeconfigs are written: an admin one (system:masters) and one with a token of capo-rs's
# ServiceAccount, so the controller runs under exactly the permissions it ships with.
#
# Idempotent: what runs is left running, certificates and etcd's data are reused. Every wait is
# bounded by $CAPO_KUBE_TIMEOUT; a component that does not come up fails the script with its
# log's tail. Progress goes to stderr; stdout ends with
#   CAPO_REAL_KUBECONFIG=<admin kubeconfig>
#   CAPO_REAL_KUBE_SA_KUBECONFIG=<capo-rs's ServiceAccount kubeconfig>
#   CAPO_REAL_KUBE_BIN=<directory of kubectl and the peers>
# (also in $RUN/env). Stop with down.sh; faults with fault.sh.
#
# CAPO_KUBE_AUDIT=1 also logs every write to an infrastructure.cluster.x-k8s.io object (who, with
# which client, what) to $RUN/audit.log, one JSON event per line: how the side-by-side bench
# counts each provider's writes.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
command -v openssl >/dev/null || die "openssl is needed (apt-get install openssl)"
command -v curl >/dev/null || die "curl is needed (apt-get install curl)"

BIN=$(bash "$HERE/build.sh")
mkdir -p "$RUN"/{pki,pid,log,etcd}
chmod 700 "$RUN/pki" "$RUN/etcd"
PKI=$RUN/pki
SERVER=https://127.0.0.1:$APISERVER_PORT

fail_with_log() { # component message
    say "$2; the tail of $RUN/log/$1.log:"
    tail -n 40 "$RUN/log/$1.log" >&2 || true
    exit 1
}

# --- certificates: a CA, the API server's certificate (not a CA: rustls refuses a server
# certificate that is its own CA), an admin client, and the service-account signing key.
issue() { # name subject extensions
    local name=$1 subject=$2 ext=$3
    [[ -s $PKI/$name.crt ]] && return 0
    openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subject" \
        -out "$PKI/$name.csr" 2>/dev/null
    printf '%s\n' "$ext" >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
}
if [[ ! -s $PKI/ca.crt ]]; then
    openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -days 3650 -sha256 \
        -subj "/CN=capo-rs test kube CA" -out "$PKI/ca.crt" 2>/dev/null
fi
issue apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
issue admin "/O=system:masters/CN=capo-admin" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
[[ -s $PKI/sa.key ]] || openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
[[ -s $PKI/sa.pub ]] || openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

b64() { base64 -w0 <"$1"; }
# kubeconfig FILE USER CREDENTIALS (a YAML flow mapping) [NAMESPACE]
kubeconfig() {
    cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: capo-kube
  cluster: {server: "$SERVER", certificate-authority-data: $(b64 "$PKI/ca.crt")}
users:
- name: $2
  user: $3
contexts:
- name: $2
  context: {cluster: capo-kube, user: $2${4:+, namespace: $4}}
current-context: $2
YAML
    chmod 600 "$1"
}
kubeconfig "$RUN/admin.kubeconfig" capo-admin \
    "{client-certificate-data: $(b64 "$PKI/admin.crt"), client-key-data: $(b64 "$PKI/admin.key")}"

start() { # name args...
    local name=$1; shift
    running "$name" && return 0
    say "starting $name"
    setsid "$BIN/$name" "$@" >>"$RUN/log/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN/pid/$name"
}
wait_for() { # name url [curl args...]
    local name=$1 url=$2; shift 2
    local deadline=$((SECONDS + T))
    until curl -fsS --max-time 2 "$@" "$url" >/dev/null 2>&1; do
        running "$name" || fail_with_log "$name" "$name exited"
        ((SECONDS < deadline)) || fail_with_log "$name" "$name not ready after $T s"
        sleep 0.2
    done
}

start etcd --name capo-kube --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "capo-kube=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --quota-backend-bytes 4294967296 --log-level warn
wait_for etcd "http://127.0.0.1:$ETCD_PORT/health"

audit=()
if [ "${CAPO_KUBE_AUDIT:-0}" = 1 ]; then
    cat > "$RUN/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources: [{group: "infrastructure.cluster.x-k8s.io"}]
- level: None
POLICY
    audit=(--audit-policy-file "$RUN/audit-policy.yaml" --audit-log-path "$RUN/audit.log"
        --audit-log-format json)
fi
start kube-apiserver "${audit[@]}" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.96.0.0/24 --profiling=false --v 1
wait_for kube-apiserver "$SERVER/readyz" --cacert "$PKI/ca.crt"

start kube-controller-manager --kubeconfig "$RUN/admin.kubeconfig" \
    --authentication-kubeconfig "$RUN/admin.kubeconfig" --authorization-kubeconfig "$RUN/admin.kubeconfig" \
    --controllers garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --profiling=false --v 1
wait_for kube-controller-manager "https://127.0.0.1:$KCM_PORT/healthz" -k

KUBECTL=("$BIN/kubectl" --kubeconfig "$RUN/admin.kubeconfig")
# --- cert-manager's own CRDs (pinned by crds/go.mod, read from Go's module cache), so that
# deploy/'s Issuer and Certificate meet cert-manager's schemas.
cert_manager=$(cd "$HERE/crds" && GOTOOLCHAIN=local GOFLAGS= go mod download -json \
    github.com/cert-manager/cert-manager | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[[ -d $cert_manager/deploy/crds ]] || die "cert-manager's CRDs are not in Go's module cache ($cert_manager)"
"${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager capo-kube-tier \
    -f "$cert_manager/deploy/crds/" >/dev/null
# --- the Prometheus Operator's ServiceMonitor CRD (same go.mod), so that the book's overlay
# with deploy/servicemonitor applies as on a cluster that runs the operator.
operator=$(cd "$HERE/crds" && GOTOOLCHAIN=local GOFLAGS= go mod download -json \
    github.com/prometheus-operator/prometheus-operator | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
service_monitor=$operator/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml
[[ -f $service_monitor ]] || die "the Prometheus Operator's CRDs are not in Go's module cache ($operator)"
"${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager capo-kube-tier \
    -f "$service_monitor" >/dev/null

# --- capo-rs's ServiceAccount and RBAC as deploy/ ships them, and a kubeconfig with its token.
"${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager capo-kube-tier \
    -f "$REPO/deploy/namespace.yaml" -f "$REPO/deploy/rbac.yaml" >/dev/null
token=$("${KUBECTL[@]}" -n capo-rs-system create token capo-rs-manager --duration 48h)
kubeconfig "$RUN/capo-rs.kubeconfig" capo-rs-manager "{token: \"$token\"}" capo-rs-system

version=$("${KUBECTL[@]}" version -o json | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | tail -n 1)
say "up in $SECONDS s: kube-apiserver $version on $SERVER"
{
    echo "CAPO_REAL_KUBECONFIG=$RUN/admin.kubeconfig"
    echo "CAPO_REAL_KUBE_SA_KUBECONFIG=$RUN/capo-rs.kubeconfig"
    echo "CAPO_REAL_KUBE_BIN=$BIN"
} | tee "$RUN/env"
