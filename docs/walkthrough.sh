#!/usr/bin/env bash
# The book's walkthrough (docs/walkthrough.md) as one script: a simulated Kubernetes API server and a simulated
# OpenStack, the controllers (`capo-rs run`), then a Secret and an OpenStackServer watched
# until Ready, and deleted again. Needs kubectl. Everything listens on 127.0.0.1 only, on
# free ports, and stops when the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet
capo=target/debug/capo-rs
work=$(mktemp -d)
pids=()
stop() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -n "${KEEP_LOGS:-}" ] || rm -rf "$work"
}
trap stop EXIT

# Waits up to 30 s for a file a background command writes once it is listening.
wait_for_file() {
  for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "$1 never appeared; see $work/*.log" >&2
  exit 1
}

"$capo" sim kube --listen 127.0.0.1:0 --kubeconfig-out "$work/kubeconfig" --with-crds \
  2> "$work/kube.log" &
pids+=($!)
"$capo" sim openstack --listen 127.0.0.1:0 --clouds-yaml-out "$work/clouds.yaml" --tenant-network \
  2> "$work/openstack.log" &
pids+=($!)
wait_for_file "$work/kubeconfig"
wait_for_file "$work/clouds.yaml"
export KUBECONFIG="$work/kubeconfig"

"$capo" run 2> "$work/controllers.log" &
pids+=($!)

kubectl create secret generic cloud-config --from-file=clouds.yaml="$work/clouds.yaml"
kubectl apply -f - <<'YAML'
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: OpenStackServer
metadata:
  name: bastion
spec:
  flavor: m1.small
  image:
    filter:
      name: ubuntu-2404-kube-v1.33.4
  sshKeyName: my-key
  identityRef:
    name: cloud-config
    cloudName: sim
  ports:
  - network:
      filter:
        name: private
YAML
kubectl wait --for=condition=Ready oss/bastion --timeout=60s
kubectl get oss -o wide
kubectl get oss bastion -o jsonpath='{.status.addresses}{"\n"}'
kubectl delete oss bastion --timeout=60s
echo "walkthrough done; the controllers' log was $work/controllers.log"
