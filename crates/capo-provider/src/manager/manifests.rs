//! What installs capo-rs in a management cluster, generated from one description
//! (`capo-rs manifests`):
//!
//! - `deploy/`: a kustomize base (Namespace, ServiceAccount, RBAC, the Deployment and its
//!   PodDisruptionBudget, the metrics and webhook Services, the webhook's cert-manager Issuer
//!   and Certificate; the CRDs from `crds/`), and `deploy/servicemonitor/`, an optional
//!   component for the Prometheus Operator;
//! - `deploy/clusterctl/`: `infrastructure-components.yaml` (the same objects, the tunables
//!   as clusterctl `${VAR:=default}` variables) and `metadata.yaml`.
//!
//! Like every Cluster API provider's, the manifests need cert-manager: it issues the
//! certificate the conversion webhook (v1beta1 <-> v1beta2) serves with.
//!
//! The RBAC rules are the least the controllers need: a test replays a whole cluster's life
//! against the simulated API server and compares its request log with them, both ways.

use serde_json::{Value, json};

/// Where capo-rs runs.
pub const NAMESPACE: &str = "capo-rs-system";
/// The Deployment, and the prefix of every object's name.
pub const DEPLOYMENT: &str = "capo-rs-controller-manager";
/// The ServiceAccount, ClusterRole and bindings.
pub const ACCOUNT: &str = "capo-rs-manager";
/// The image the manifests name (build it with the Dockerfile; override with kustomize's
/// `images:` or clusterctl's `CAPO_RS_IMAGE`).
pub const IMAGE: &str = "localhost/capo-rs:0.1.0";
/// The admin server's port (/healthz, /readyz).
pub const ADMIN_PORT: u16 = 8080;
/// The metrics server's port: /metrics over HTTPS, behind TokenReview and
/// SubjectAccessReview (CAPO's secure diagnostics port).
pub const METRICS_PORT: u16 = 8443;
/// The ClusterRole a scraper (Prometheus' ServiceAccount) is bound to, to read /metrics.
pub const METRICS_READER: &str = "capo-rs-metrics-reader";
/// The Service the API server calls to convert between v1beta1 and v1beta2 (the CRDs'
/// `spec.conversion` names it).
pub const WEBHOOK_SERVICE: &str = capo_api::crds::WEBHOOK_SERVICE.1;
/// The webhook server's port in the pod (controller-runtime's default, as other providers).
pub const WEBHOOK_PORT: u16 = 9443;
/// Where the pod finds the serving certificate (`tls.crt`, `tls.key`): controller-runtime's
/// default directory, so the layout is the one Cluster API users know.
pub const WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// The Secret cert-manager writes the serving certificate to, mounted at [`WEBHOOK_CERT_DIR`].
pub const WEBHOOK_SECRET: &str = "capo-rs-webhook-service-cert";
/// The cert-manager Certificate; the CRDs' `cert-manager.io/inject-ca-from` names it, so
/// cert-manager's CA injector writes its CA into their conversion config.
pub const CERTIFICATE: &str = capo_api::crds::CERTIFICATE.1;
/// The self-signed cert-manager Issuer that signs [`CERTIFICATE`] (the API server trusts it
/// through the injected CA bundle, nothing else has to).
pub const ISSUER: &str = "capo-rs-selfsigned-issuer";

/// One RBAC rule: verbs on resources of a group.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// The API group (`apiGroups`); `""` for the core group.
    pub group: &'static str,
    /// The resources it covers (plural names; a subresource as `<resource>/status`).
    pub resources: &'static [&'static str],
    /// The verbs allowed on them (`get`, `list`, `watch`, `create`, `patch`, ...).
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const INFRASTRUCTURE: &str = "infrastructure.cluster.x-k8s.io";

/// What the controllers do to namespaced objects: granted cluster-wide by the default install
/// (they watch every namespace), in the watched namespace alone by the namespaced one
/// (`deploy/namespaced/`, `--namespace`).
pub const WORKLOAD_RULES: &[Rule] = &[
    // Our objects: the controllers create and delete OpenStackServers for machines and
    // bastions, and patch finalizers and status on all three.
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackclusters"],
        verbs: &["get", "list", "watch", "patch"],
    },
    // Machines are read from the watch's cache only.
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackmachines"],
        verbs: &["list", "watch", "patch"],
    },
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackservers"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Rule {
        group: INFRASTRUCTURE,
        resources: &[
            "openstackclusters/status",
            "openstackmachines/status",
            "openstackservers/status",
            "openstackmachinetemplates/status",
        ],
        verbs: &["patch"],
    },
    // Cluster API: a Cluster's pause and ownership; a Machine's bootstrap data, and its
    // pre-terminate hook (set and cleared by patch) that holds deletion for the LB member.
    // Both are read from the watches' caches only.
    Rule {
        group: "cluster.x-k8s.io",
        resources: &["clusters"],
        verbs: &["list", "watch"],
    },
    Rule {
        group: "cluster.x-k8s.io",
        resources: &["machines"],
        verbs: &["list", "watch", "patch"],
    },
    // Floating IP pools: their finalizer and status.
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackfloatingippools"],
        verbs: &["list", "watch", "patch"],
    },
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackfloatingippools/status"],
        verbs: &["patch"],
    },
    // Cluster API's IPAM contract: a server claims its pool address; a pool answers claims
    // with IPAddresses, and lets them go.
    Rule {
        group: "ipam.cluster.x-k8s.io",
        resources: &["ipaddressclaims"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    Rule {
        group: "ipam.cluster.x-k8s.io",
        resources: &["ipaddressclaims/status"],
        verbs: &["patch"],
    },
    Rule {
        group: "ipam.cluster.x-k8s.io",
        resources: &["ipaddresses"],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
    },
    // ORC Images a server's imageRef names (read; their watch wakes the server).
    Rule {
        group: "openstack.k-orc.cloud",
        resources: &["images"],
        verbs: READ,
    },
    // Credentials and user data (read; a metadata-only watch wakes their users).
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: READ,
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
    // The storage migration (v1beta1 stored by CAPO 0.14 to v1beta2): a no-op patch of
    // every object of our two-version kinds, then the CRD's storedVersions.
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackclustertemplates"],
        verbs: &["list", "patch"],
    },
    // Templates are also watched, for scaling from zero (their status.capacity).
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackmachinetemplates"],
        verbs: &["list", "watch", "patch"],
    },
];

/// What is cluster-scoped, granted by a ClusterRole in both installs: none of it is a
/// tenant's Secret or object.
pub const CLUSTER_SCOPED_RULES: &[Rule] = &[
    // A cluster names its OpenStackClusterIdentity (cluster-scoped).
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackclusteridentities"],
        verbs: &["get"],
    },
    // An OpenStackClusterIdentity's namespace selector.
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["get"],
    },
    // At start: are our CRDs and Cluster API's installed and Established? The migration's
    // managed-fields cleanup marks the CRD's generation it cleaned (an annotation, as Cluster
    // API's migrator does).
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get", "patch"],
    },
    // The storage migration's last step (it also lists and patches every object of a kind,
    // across namespaces: the namespaced install cannot migrate, docs/installation.md).
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions/status"],
        verbs: &["patch"],
    },
    // Who reads /metrics: the caller's token, then its permission, asked of the API server.
    Rule {
        group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        verbs: &["create"],
    },
    Rule {
        group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
    },
];

/// Leader election, in capo-rs's own namespace only.
pub const LEASE_RULES: &[Rule] = &[Rule {
    group: "coordination.k8s.io",
    resources: &["leases"],
    // list: a shard adds up the budget shares written on the other shards' Leases.
    verbs: &["get", "list", "create", "update"],
}];

/// A setting of `capo-rs run` that clusterctl users set with a variable.
struct Tunable {
    flag: &'static str,
    variable: &'static str,
    default: &'static str,
}

const TUNABLES: &[Tunable] = &[
    Tunable {
        flag: "leader-elect",
        variable: "CAPO_RS_LEADER_ELECT",
        default: "true",
    },
    Tunable {
        flag: "leader-elect-lease-duration",
        variable: "CAPO_RS_LEADER_ELECT_LEASE_DURATION",
        default: "15s",
    },
    Tunable {
        flag: "leader-elect-renew-deadline",
        variable: "CAPO_RS_LEADER_ELECT_RENEW_DEADLINE",
        default: "10s",
    },
    Tunable {
        flag: "leader-elect-retry-period",
        variable: "CAPO_RS_LEADER_ELECT_RETRY_PERIOD",
        default: "2s",
    },
    Tunable {
        flag: "openstackcluster-concurrency",
        variable: "CAPO_RS_OPENSTACKCLUSTER_CONCURRENCY",
        default: "10",
    },
    Tunable {
        flag: "openstackmachine-concurrency",
        variable: "CAPO_RS_OPENSTACKMACHINE_CONCURRENCY",
        default: "10",
    },
    Tunable {
        flag: "openstackserver-concurrency",
        variable: "CAPO_RS_OPENSTACKSERVER_CONCURRENCY",
        default: "10",
    },
    Tunable {
        flag: "openstackmachinetemplate-concurrency",
        variable: "CAPO_RS_OPENSTACKMACHINETEMPLATE_CONCURRENCY",
        default: "10",
    },
    Tunable {
        flag: "feature-gates",
        variable: "CAPO_RS_FEATURE_GATES",
        default: "PriorityQueue=true,AutoScaleFromZero=false",
    },
    Tunable {
        flag: "scope-cache-max-size",
        variable: "CAPO_RS_SCOPE_CACHE_MAX_SIZE",
        default: "10",
    },
    Tunable {
        flag: "openstack-qps",
        variable: "CAPO_RS_OPENSTACK_QPS",
        default: "10",
    },
    Tunable {
        flag: "openstack-burst",
        variable: "CAPO_RS_OPENSTACK_BURST",
        default: "20",
    },
    Tunable {
        flag: "member-stuck-after",
        variable: "CAPO_RS_MEMBER_STUCK_AFTER",
        default: "600",
    },
    Tunable {
        flag: "gate",
        variable: "CAPO_RS_GATE",
        default: "serving",
    },
    Tunable {
        flag: "member-not-serving-after",
        variable: "CAPO_RS_MEMBER_NOT_SERVING_AFTER",
        default: "5m",
    },
    Tunable {
        flag: "api-health-monitor",
        variable: "CAPO_RS_API_HEALTH_MONITOR",
        default: "tcp",
    },
    Tunable {
        flag: "drain-period",
        variable: "CAPO_RS_DRAIN_PERIOD",
        default: "30s",
    },
    Tunable {
        flag: "member-repairs",
        variable: "CAPO_RS_MEMBER_REPAIRS",
        default: "3",
    },
    Tunable {
        flag: "sync-period",
        variable: "CAPO_RS_SYNC_PERIOD",
        default: "10m",
    },
    Tunable {
        flag: "kube-api-qps",
        variable: "CAPO_RS_KUBE_API_QPS",
        default: "20",
    },
    Tunable {
        flag: "kube-api-burst",
        variable: "CAPO_RS_KUBE_API_BURST",
        default: "30",
    },
    Tunable {
        flag: "log-format",
        variable: "CAPO_RS_LOG_FORMAT",
        default: "json",
    },
    Tunable {
        flag: "log-level",
        variable: "CAPO_RS_LOG_LEVEL",
        default: "info",
    },
];

/// How values are written: plainly (kustomize) or as clusterctl variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Tunables and the image written as their default values, for the kustomize base in
    /// `deploy/`.
    Kustomize,
    /// Tunables and the image written as clusterctl variables with their defaults
    /// (`${VAR:=default}`), for `infrastructure-components.yaml`.
    Clusterctl,
}

impl Flavor {
    fn value(self, variable: &str, default: &str) -> String {
        match self {
            Flavor::Kustomize => default.to_owned(),
            Flavor::Clusterctl => format!("${{{variable}:={default}}}"),
        }
    }
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": "capo-rs",
        "app.kubernetes.io/component": "controller-manager",
    })
}

/// The namespace, held to the Pod Security Standard `restricted`: the manager's pod keeps it
/// (non-root, no privilege escalation, every capability dropped, the runtime's seccomp
/// profile), and nothing less privileged can be started beside it.
fn namespace() -> Value {
    let mut labels = labels();
    for mode in ["enforce", "audit", "warn"] {
        labels[format!("pod-security.kubernetes.io/{mode}")] = json!("restricted");
    }
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": labels},
    })
}

fn rules_json<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Value {
    rules
        .into_iter()
        .map(|rule| json!({"apiGroups": [rule.group], "resources": rule.resources, "verbs": rule.verbs}))
        .collect()
}

/// Every rule the default (cluster-wide) install grants the manager in its ClusterRole.
pub fn cluster_wide_rules() -> impl Iterator<Item = &'static Rule> {
    WORKLOAD_RULES.iter().chain(CLUSTER_SCOPED_RULES)
}

fn rbac_metadata(name: &str, namespace: Option<&str>) -> Value {
    match namespace {
        Some(namespace) => json!({"name": name, "namespace": namespace, "labels": labels()}),
        None => json!({"name": name, "labels": labels()}),
    }
}

/// A role (`Role` or `ClusterRole`) of `rules`, and its binding to capo-rs's ServiceAccount.
fn role_and_binding<'a>(
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    rules: impl IntoIterator<Item = &'a Rule>,
) -> [Value; 2] {
    let subject = json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]);
    [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": rbac_metadata(name, namespace), "rules": rules_json(rules),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": format!("{kind}Binding"),
            "metadata": rbac_metadata(name, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
            "subjects": subject,
        }),
    ]
}

/// The namespace the shipped namespaced install (`deploy/namespaced/`) watches: where
/// `clusterctl generate cluster` puts a cluster unless told otherwise.
pub const NAMESPACED_EXAMPLE: &str = "default";

/// The namespaced install's grants: [`WORKLOAD_RULES`] in a Role of `watched` alone, and a
/// ClusterRole of [`CLUSTER_SCOPED_RULES`]. No Secret outside `watched` can be read.
pub fn namespaced_rbac(watched: &str) -> Vec<Value> {
    let mut objects = Vec::from(role_and_binding(
        "Role",
        ACCOUNT,
        Some(watched),
        WORKLOAD_RULES,
    ));
    objects.extend(role_and_binding(
        "ClusterRole",
        CLUSTER_SCOPED_ROLE,
        None,
        CLUSTER_SCOPED_RULES,
    ));
    objects
}

/// The namespaced install's ClusterRole (and binding), of cluster-scoped grants only.
pub const CLUSTER_SCOPED_ROLE: &str = "capo-rs-manager-cluster-scoped";

fn rbac() -> Vec<Value> {
    let leader = format!("{ACCOUNT}-leader-election");
    let [cluster_role, cluster_binding] =
        role_and_binding("ClusterRole", ACCOUNT, None, cluster_wide_rules());
    let [leader_role, leader_binding] =
        role_and_binding("Role", &leader, Some(NAMESPACE), LEASE_RULES);
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": rbac_metadata(ACCOUNT, Some(NAMESPACE))}),
        cluster_role,
        cluster_binding,
        leader_role,
        // Bound by whoever scrapes: Prometheus' ServiceAccount, for one.
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": rbac_metadata(METRICS_READER, None),
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        }),
        leader_binding,
    ]
}

/// `deploy/namespaced/`, a kustomize component: the base's manager ClusterRole and binding
/// replaced by [`namespaced_rbac`] of [`NAMESPACED_EXAMPLE`], and the manager told to watch
/// it alone. (A component, not an overlay: kustomize refuses an overlay inside its base.)
fn namespaced_overlay() -> (String, String) {
    let delete = |kind: &str| {
        format!(
            "- patch: |-\n    apiVersion: rbac.authorization.k8s.io/v1\n    kind: {kind}\n    \
             metadata:\n      name: {ACCOUNT}\n    $patch: delete\n"
        )
    };
    let kustomization = format!(
        "{GENERATED}apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n\
         # The namespaced install: capo-rs reconciles, and reads Secrets in, one namespace only.\n\
         # Add `components: [namespaced]` to deploy/kustomization.yaml, or to an overlay of it.\n\
         # To watch another namespace, replace `{NAMESPACED_EXAMPLE}` in role.yaml (twice) and below.\n\
         resources:\n- role.yaml\npatches:\n{}{}\
         - target:\n    kind: Deployment\n    name: {DEPLOYMENT}\n  patch: |-\n    \
         - op: add\n      path: /spec/template/spec/containers/0/args/-\n      \
         value: --namespace={NAMESPACED_EXAMPLE}\n",
        delete("ClusterRole"),
        delete("ClusterRoleBinding"),
    );
    (
        kustomization,
        generated(&namespaced_rbac(NAMESPACED_EXAMPLE)),
    )
}

fn deployment(flavor: Flavor) -> Value {
    let mut args = vec!["run".to_owned()];
    args.extend(
        TUNABLES
            .iter()
            .map(|t| format!("--{}={}", t.flag, flavor.value(t.variable, t.default))),
    );
    args.push(format!("--admin-address=:{ADMIN_PORT}"));
    args.push(format!("--metrics-address=:{METRICS_PORT}"));
    // Addresses and paths are not tunables: the Service and the volume below name them.
    args.push(format!("--webhook-address=:{WEBHOOK_PORT}"));
    args.push(format!("--webhook-cert-dir={WEBHOOK_CERT_DIR}"));
    let field = |path: &str| json!({"valueFrom": {"fieldRef": {"fieldPath": path}}});
    let mut pod_name = field("metadata.name");
    pod_name["name"] = json!("POD_NAME");
    let mut pod_namespace = field("metadata.namespace");
    pod_namespace["name"] = json!("POD_NAMESPACE");
    let probe = |path: &str, period: u32| json!({"httpGet": {"path": path, "port": "admin"}, "periodSeconds": period, "failureThreshold": 3});
    // Preferably on two nodes, so one node's loss leaves the webhook up; soft, so a one-node
    // management cluster still runs both.
    let spread = json!({
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": labels()},
            "topologyKey": "kubernetes.io/hostname",
        },
    });
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            // Two, because while no replica answers the conversion webhook every read of the
            // version not stored fails. Every replica serves the webhook, leading or not; the
            // Lease lets one run the controllers (so `--leader-elect` must stay on).
            "replicas": 2,
            "selector": {"matchLabels": labels()},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "serviceAccountName": ACCOUNT,
                    // Reconciles in flight finish their OpenStack calls (30 s timeout) first.
                    "terminationGracePeriodSeconds": 45,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "tolerations": [
                        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    ],
                    "affinity": {"podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [spread],
                    }},
                    "containers": [{
                        "name": "manager",
                        "image": flavor.value("CAPO_RS_IMAGE", IMAGE),
                        "args": args,
                        "env": [pod_name, pod_namespace],
                        "ports": [
                            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
                            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                            {"name": "webhook", "containerPort": WEBHOOK_PORT, "protocol": "TCP"},
                        ],
                        "livenessProbe": probe("/healthz", 20),
                        "readinessProbe": probe("/readyz", 10),
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"cpu": "1", "memory": "256Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "privileged": false,
                            "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        // A small writable /tmp on a read-only root (nothing of ours writes
                        // files now: CA bundles stay in memory); the webhook's certificate is
                        // mounted inside it (after it, so on top).
                        "volumeMounts": [
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "cert", "mountPath": WEBHOOK_CERT_DIR, "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                        // Until cert-manager has written the Secret the pod waits to start:
                        // a webhook without its certificate could not serve.
                        {"name": "cert", "secret": {"secretName": WEBHOOK_SECRET}},
                    ],
                },
            },
        },
    })
}

fn metrics_service() -> Value {
    let mut labels = labels();
    labels["app.kubernetes.io/part-of"] = json!("capo-rs");
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": format!("{DEPLOYMENT}-metrics"), "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": self::labels(),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    })
}

/// The conversion webhook's Service: it selects every replica (leading or standing by); no
/// `part-of` label, so the ServiceMonitor does not pick it up.
fn webhook_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "selector": labels(),
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}],
            // Reachable before a pod is Ready: the leader's readiness waits for its caches,
            // whose first list may need this very webhook (objects stored as v1beta1).
            "publishNotReadyAddresses": true,
        },
    })
}

/// The validating webhooks: CAPO's admission rules that the CRDs' CEL rules do not cover
/// (see `capo_api::admission`). Registered for the stored version with `matchPolicy:
/// Equivalent`, so that the API server sends v1beta1 requests too, converted. `Fail`: an
/// edit is never admitted unchecked.
fn validating_webhooks() -> Value {
    let webhooks: Vec<Value> = capo_api::crds::all()
        .iter()
        .filter(|crd| capo_api::admission::VALIDATED.contains(&crd.spec.names.plural.as_str()))
        .map(|crd| {
            let plural = &crd.spec.names.plural;
            let kind = crd.spec.names.kind.to_lowercase();
            let stored: Vec<&str> = crd
                .spec
                .versions
                .iter()
                .filter(|v| v.storage)
                .map(|v| v.name.as_str())
                .collect();
            json!({
                "name": format!("validation.{kind}.{INFRASTRUCTURE}"),
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE,
                    "path": format!("/validate/{plural}"), "port": 443}},
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "rules": [{"apiGroups": [INFRASTRUCTURE], "apiVersions": stored,
                    "operations": ["CREATE", "UPDATE"], "resources": [plural]}],
            })
        })
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "capo-rs-validating-webhook-configuration", "labels": labels(),
            "annotations": {"cert-manager.io/inject-ca-from": format!("{NAMESPACE}/{CERTIFICATE}")}},
        "webhooks": webhooks,
    })
}

/// A drain evicts one replica at a time: the conversion webhook keeps an answering pod.
fn disruption_budget() -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels()}},
    })
}

/// The webhook's serving certificate, for the Service's in-cluster names, from a self-signed
/// Issuer in our namespace: what Cluster API's providers ship.
fn certificate() -> Vec<Value> {
    let service = format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc");
    vec![
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": ISSUER, "namespace": NAMESPACE, "labels": labels()},
            "spec": {"selfSigned": {}},
        }),
        json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": CERTIFICATE, "namespace": NAMESPACE, "labels": labels()},
            "spec": {
                "dnsNames": [service.clone(), format!("{service}.cluster.local")],
                "issuerRef": {"kind": "Issuer", "name": ISSUER},
                "secretName": WEBHOOK_SECRET,
            },
        }),
    ]
}

/// Where the API server calls the webhook from, by default anywhere: NetworkPolicy cannot name
/// the API server, which calls from its host's network. Set it to the control plane's
/// addresses (clusterctl's `CAPO_RS_API_SERVER_CIDR`, or a kustomize patch).
pub const API_SERVER_CIDR: &str = "0.0.0.0/0";

/// Ingress to the manager pods: the webhook port from the API server's addresses, the metrics
/// port from anywhere (every caller must bring a token the API server accepts), nothing else.
/// The kubelet's probes of the admin port come from the node, which NetworkPolicy does not
/// hold back. Egress stays open: the tenants' clouds are anywhere.
fn network_policy(flavor: Flavor) -> Value {
    let api_server = flavor.value("CAPO_RS_API_SERVER_CIDR", API_SERVER_CIDR);
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "podSelector": {"matchLabels": labels()},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"ipBlock": {"cidr": api_server}}],
                    "ports": [{"protocol": "TCP", "port": WEBHOOK_PORT}],
                },
                {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        },
    })
}

fn service_monitor() -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "capo-rs", "app.kubernetes.io/part-of": "capo-rs"}},
            // The certificate is signed by itself; the token decides who reads.
            "endpoints": [{
                "port": "metrics", "scheme": "https", "path": "/metrics", "interval": "30s",
                "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "tlsConfig": {"insecureSkipVerify": true},
            }],
        },
    })
}

/// Every object but the CRDs, in apply order (the certificate early, so its Secret is there
/// when the pods start).
pub fn objects(flavor: Flavor) -> Vec<Value> {
    let mut all = vec![namespace()];
    all.extend(rbac());
    all.extend(certificate());
    all.push(deployment(flavor));
    all.push(metrics_service());
    all.push(webhook_service());
    all.push(validating_webhooks());
    all.push(disruption_budget());
    all.push(network_policy(flavor));
    all
}

fn yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|object| serde_saphyr::to_string(object).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}

const GENERATED: &str =
    "# Generated by `capo-rs manifests --out deploy`: edit src, not this file.\n";

/// One generated file of `deploy/`: the header, then the objects.
fn generated(objects: &[Value]) -> String {
    format!("{GENERATED}{}", yaml(objects))
}

/// The files of `deploy/` (path relative to it, contents).
pub fn files(crds_yaml: &str) -> Vec<(String, String)> {
    let kustomization = format!(
        "{GENERATED}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n\
         - namespace.yaml\n- ../crds\n- rbac.yaml\n- certificate.yaml\n- manager.yaml\n\
         - service.yaml\n- webhook-service.yaml\n- validating-webhook.yaml\n- pdb.yaml\n\
         - networkpolicy.yaml\n\
         # certificate.yaml holds cert-manager objects: install cert-manager first.\n\
         # Prometheus Operator users: add `components: [servicemonitor]` in an overlay.\n\
         # A namespaced install (Roles, one watched namespace): `components: [namespaced]`.\n"
    );
    let component = format!(
        "{GENERATED}apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n- servicemonitor.yaml\n"
    );
    let namespaced = namespaced_overlay();
    let mut components = generated(&objects_with_crds(crds_yaml));
    if !components.ends_with('\n') {
        components.push('\n');
    }
    vec![
        ("kustomization.yaml".into(), kustomization),
        ("namespace.yaml".into(), generated(&[namespace()])),
        ("rbac.yaml".into(), generated(&rbac())),
        ("certificate.yaml".into(), generated(&certificate())),
        (
            "manager.yaml".into(),
            generated(&[deployment(Flavor::Kustomize)]),
        ),
        ("service.yaml".into(), generated(&[metrics_service()])),
        (
            "webhook-service.yaml".into(),
            generated(&[webhook_service()]),
        ),
        (
            "validating-webhook.yaml".into(),
            generated(&[validating_webhooks()]),
        ),
        ("pdb.yaml".into(), generated(&[disruption_budget()])),
        (
            "networkpolicy.yaml".into(),
            generated(&[network_policy(Flavor::Kustomize)]),
        ),
        ("servicemonitor/kustomization.yaml".into(), component),
        (
            "servicemonitor/servicemonitor.yaml".into(),
            generated(&[service_monitor()]),
        ),
        (
            "clusterctl/infrastructure-components.yaml".into(),
            components,
        ),
        ("clusterctl/metadata.yaml".into(), metadata()),
        ("namespaced/kustomization.yaml".into(), namespaced.0),
        ("namespaced/role.yaml".into(), namespaced.1),
    ]
}

/// The clusterctl components: the Namespace first, the CRDs, then the rest.
fn objects_with_crds(crds_yaml: &str) -> Vec<Value> {
    let mut all = objects(Flavor::Clusterctl);
    let crds = serde_saphyr::from_str_multiple::<Value, Vec<Value>>(crds_yaml)
        .unwrap_or_default()
        .into_iter()
        .filter(|value| !value.is_null());
    let rest = all.split_off(1);
    all.extend(crds);
    all.extend(rest);
    all
}

/// clusterctl's `metadata.yaml`: this release series speaks Cluster API's v1beta2 contract.
pub fn metadata() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    format!(
        "{GENERATED}apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n- major: {major}\n  minor: {minor}\n  contract: v1beta2\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusterctl_sees_every_tunable_as_a_variable_with_its_default() {
        let components = yaml(&objects(Flavor::Clusterctl));
        for tunable in TUNABLES {
            let variable = format!("${{{}:={}}}", tunable.variable, tunable.default);
            assert!(components.contains(&variable), "{variable}");
        }
        assert!(components.contains("${CAPO_RS_IMAGE:=localhost/capo-rs:0.1.0}"));
        assert!(components.contains("${CAPO_RS_API_SERVER_CIDR:=0.0.0.0/0}"));
        let plain = yaml(&objects(Flavor::Kustomize));
        assert!(!plain.contains("${"), "the kustomize base has plain values");
        assert!(plain.contains("--leader-elect=true"));
    }

    #[test]
    fn the_network_policy_lets_in_the_webhook_and_metrics_ports_of_the_manager_pods_only() {
        let policy = network_policy(Flavor::Kustomize);
        let deployment = deployment(Flavor::Kustomize);
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .expect("labels")
        {
            assert_eq!(&pod_labels[key], value, "selects the manager pods");
        }
        let open: Vec<u64> = policy["spec"]["ingress"]
            .as_array()
            .expect("rules")
            .iter()
            .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|port| port["port"].as_u64())
            .collect();
        assert_eq!(open, [u64::from(WEBHOOK_PORT), u64::from(METRICS_PORT)]);
        let ports = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"];
        for port in &open {
            let exposed = ports.as_array().expect("ports").iter();
            assert!(
                exposed.clone().any(|p| p["containerPort"] == *port),
                "{port}"
            );
        }
        assert_eq!(
            policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"],
            API_SERVER_CIDR
        );
        let clusterctl = network_policy(Flavor::Clusterctl);
        assert_eq!(
            clusterctl["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"],
            "${CAPO_RS_API_SERVER_CIDR:=0.0.0.0/0}"
        );
    }

    #[test]
    fn the_deployment_is_locked_down() {
        let deployment = deployment(Flavor::Kustomize);
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        let pod = &deployment["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(pod["runAsNonRoot"], true);
        assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(container["resources"]["limits"]["memory"].is_string());
    }

    fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
        list.as_array()?.iter().find(|item| item["name"] == name)
    }

    #[test]
    fn every_replica_serves_the_webhook_with_the_certificate_from_its_secret() {
        for flavor in [Flavor::Kustomize, Flavor::Clusterctl] {
            let deployment = deployment(flavor);
            assert_eq!(deployment["spec"]["replicas"], 2);
            let pod = &deployment["spec"]["template"]["spec"];
            let container = &pod["containers"][0];
            let port = named(&container["ports"], "webhook").expect("a port named webhook");
            assert_eq!(port["containerPort"], WEBHOOK_PORT);
            let args: Vec<&str> = container["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let address = format!("--webhook-address=:{WEBHOOK_PORT}");
            let cert_dir = format!("--webhook-cert-dir={WEBHOOK_CERT_DIR}");
            assert!(args.contains(&address.as_str()), "{args:?}");
            assert!(args.contains(&cert_dir.as_str()), "{args:?}");
            let volume = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["secret"]["secretName"] == WEBHOOK_SECRET)
                .expect("a volume from the webhook's Secret");
            let name = volume["name"].as_str().unwrap_or_default();
            let mount = named(&container["volumeMounts"], name).expect("the Secret is mounted");
            assert_eq!(mount["mountPath"], WEBHOOK_CERT_DIR);
            assert_eq!(mount["readOnly"], true);
            // Both replicas preferably on two nodes, by the pods' own labels.
            let anti = &pod["affinity"]["podAntiAffinity"];
            let spread = &anti["preferredDuringSchedulingIgnoredDuringExecution"][0];
            assert_eq!(
                spread["podAffinityTerm"]["topologyKey"],
                "kubernetes.io/hostname"
            );
            assert_eq!(
                spread["podAffinityTerm"]["labelSelector"]["matchLabels"],
                deployment["spec"]["template"]["metadata"]["labels"]
            );
        }
    }

    #[test]
    fn the_crds_name_this_namespace_for_the_webhook_service_and_certificate() {
        assert_eq!(capo_api::crds::WEBHOOK_SERVICE.0, NAMESPACE);
        assert_eq!(capo_api::crds::CERTIFICATE.0, NAMESPACE);
    }

    #[test]
    fn the_certificate_names_the_webhook_service_in_our_namespace() {
        let objects = certificate();
        let [issuer, certificate] = objects.as_slice() else {
            panic!("an Issuer and a Certificate: {objects:?}");
        };
        assert_eq!(issuer["kind"], "Issuer");
        assert_eq!(issuer["metadata"]["name"], ISSUER);
        assert_eq!(issuer["spec"]["selfSigned"], json!({}));
        assert_eq!(certificate["kind"], "Certificate");
        assert_eq!(certificate["metadata"]["name"], CERTIFICATE);
        assert_eq!(certificate["metadata"]["namespace"], NAMESPACE);
        assert_eq!(
            certificate["spec"]["dnsNames"],
            json!([
                "capo-rs-webhook-service.capo-rs-system.svc",
                "capo-rs-webhook-service.capo-rs-system.svc.cluster.local",
            ])
        );
        assert_eq!(
            certificate["spec"]["issuerRef"],
            json!({"kind": "Issuer", "name": ISSUER})
        );
        assert_eq!(certificate["spec"]["secretName"], WEBHOOK_SECRET);

        // The Service those names resolve to reaches the pods' webhook port, and the budget
        // covers the same pods.
        let service = webhook_service();
        assert_eq!(service["metadata"]["name"], WEBHOOK_SERVICE);
        assert_eq!(service["metadata"]["namespace"], NAMESPACE);
        let port = named(&service["spec"]["ports"], "webhook").expect("a port named webhook");
        assert_eq!(port["port"], 443);
        assert_eq!(port["targetPort"], "webhook");
        let deployment = deployment(Flavor::Kustomize);
        let pods = &deployment["spec"]["template"]["metadata"]["labels"];
        assert_eq!(&service["spec"]["selector"], pods);
        assert_eq!(
            service["spec"]["selector"],
            metrics_service()["spec"]["selector"]
        );
        let budget = disruption_budget();
        assert_eq!(budget["spec"]["minAvailable"], 1);
        assert_eq!(&budget["spec"]["selector"]["matchLabels"], pods);
    }

    #[test]
    fn the_kustomize_base_lists_every_file_and_holds_every_object() {
        let files = files("");
        let kustomization = &files
            .iter()
            .find(|(path, _)| path == "kustomization.yaml")
            .expect("a kustomization")
            .1;
        let mut listed: Vec<Value> = Vec::new();
        for (path, text) in &files {
            if path.contains('/') || path == "kustomization.yaml" {
                continue;
            }
            assert!(
                kustomization.contains(&format!("\n- {path}\n")),
                "{path} is not a resource of the kustomization"
            );
            listed.extend(
                serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
                    .expect("YAML")
                    .into_iter()
                    .filter(|value| !value.is_null()),
            );
        }
        assert_eq!(listed, objects(Flavor::Kustomize));
    }

    /// The namespaced install's ClusterRole holds cluster-scoped resources alone; everything
    /// namespaced goes in the Role of the watched namespace, bound to capo-rs's account.
    #[test]
    fn the_namespaced_install_grants_nothing_namespaced_cluster_wide() {
        const CLUSTER_SCOPED: &[&str] = &[
            "openstackclusteridentities",
            "namespaces",
            "customresourcedefinitions",
            "customresourcedefinitions/status",
            "tokenreviews",
            "subjectaccessreviews",
        ];
        let resources = |rules: &[Rule]| -> Vec<&str> {
            rules
                .iter()
                .flat_map(|r| r.resources.iter().copied())
                .collect()
        };
        assert!(
            resources(CLUSTER_SCOPED_RULES)
                .iter()
                .all(|r| CLUSTER_SCOPED.contains(r))
        );
        assert!(
            !resources(WORKLOAD_RULES)
                .iter()
                .any(|r| CLUSTER_SCOPED.contains(r))
        );
        assert!(resources(WORKLOAD_RULES).contains(&"secrets"));
        let objects = namespaced_rbac("tenant-a");
        let kinds: Vec<_> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            kinds,
            ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
        );
        assert_eq!(objects[0]["metadata"]["namespace"], "tenant-a");
        assert_eq!(objects[1]["subjects"][0]["namespace"], NAMESPACE);
        assert_eq!(objects[1]["subjects"][0]["name"], ACCOUNT);
        let granted = |object: &Value| object["rules"].as_array().map_or(0, Vec::len);
        assert_eq!(granted(&objects[0]), WORKLOAD_RULES.len());
        assert_eq!(granted(&objects[2]), CLUSTER_SCOPED_RULES.len());
    }

    #[test]
    fn metadata_names_the_v1beta2_contract_for_this_release_series() {
        let metadata: Value = serde_saphyr::from_str(&metadata()).unwrap_or_default();
        assert_eq!(metadata["releaseSeries"][0]["contract"], "v1beta2");
        assert_eq!(metadata["releaseSeries"][0]["minor"], 1);
    }
}
