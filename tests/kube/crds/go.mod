// CRDs the real Kubernetes tier installs from published modules: cert-manager's (its binaries
// live in nested modules that are not published, so cert-manager itself cannot run here; its
// CRDs are in the root module under deploy/crds), and the Prometheus Operator's
// ServiceMonitor (example/prometheus-operator-crd), so that deploy/servicemonitor applies.
// Read from Go's module cache by up.sh; never committed.
module capo-rs.test/kube-crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2
	github.com/prometheus-operator/prometheus-operator v0.85.0
)
