//! What installs capo-rs in a management cluster, generated from one description
//! (`capo-rs manifests`):
//!
//! - `deploy/`: a kustomize base (Namespace, ServiceAccount, RBAC, the Deployment, the
//!   metrics Service; the CRDs from `crds/`), and `deploy/servicemonitor/`, an optional
//!   component for the Prometheus Operator;
//! - `deploy/clusterctl/`: `infrastructure-components.yaml` (the same objects, the tunables
//!   as clusterctl `${VAR:=default}` variables) and `metadata.yaml`.
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
/// The admin server's port (/metrics, /healthz, /readyz).
pub const ADMIN_PORT: u16 = 8080;

/// One RBAC rule: verbs on resources of a group.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const INFRASTRUCTURE: &str = "infrastructure.cluster.x-k8s.io";

/// What the controllers do, cluster-wide (they watch every namespace unless told one).
pub const CLUSTER_RULES: &[Rule] = &[
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
        ],
        verbs: &["patch"],
    },
    Rule {
        group: INFRASTRUCTURE,
        resources: &["openstackclusteridentities"],
        verbs: &["get"],
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
    // Credentials and user data (read; a metadata-only watch wakes their users).
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: READ,
    },
    // An OpenStackClusterIdentity's namespace selector.
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["get"],
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
    // At start: are our CRDs and Cluster API's installed and Established?
    Rule {
        group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        verbs: &["get"],
    },
];

/// Leader election, in capo-rs's own namespace only.
pub const LEASE_RULES: &[Rule] = &[Rule {
    group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["get", "create", "update"],
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
        flag: "watch-filter",
        variable: "CAPO_RS_WATCH_FILTER",
        default: "",
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
    Kustomize,
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

fn namespace() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": labels()},
    })
}

fn rules_json(rules: &[Rule]) -> Value {
    rules
        .iter()
        .map(|rule| json!({"apiGroups": [rule.group], "resources": rule.resources, "verbs": rule.verbs}))
        .collect()
}

fn rbac() -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]);
    let metadata = |name: &str, namespaced: bool| match namespaced {
        true => json!({"name": name, "namespace": NAMESPACE, "labels": labels()}),
        false => json!({"name": name, "labels": labels()}),
    };
    let leader = format!("{ACCOUNT}-leader-election");
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(ACCOUNT, true)}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": metadata(ACCOUNT, false), "rules": rules_json(CLUSTER_RULES),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": metadata(ACCOUNT, false),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ACCOUNT},
            "subjects": subject,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(&leader, true), "rules": rules_json(LEASE_RULES),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(&leader, true),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": leader},
            "subjects": subject,
        }),
    ]
}

fn deployment(flavor: Flavor) -> Value {
    let mut args = vec!["run".to_owned()];
    args.extend(
        TUNABLES
            .iter()
            .map(|t| format!("--{}={}", t.flag, flavor.value(t.variable, t.default))),
    );
    args.push(format!("--admin-address=:{ADMIN_PORT}"));
    let field = |path: &str| json!({"valueFrom": {"fieldRef": {"fieldPath": path}}});
    let mut pod_name = field("metadata.name");
    pod_name["name"] = json!("POD_NAME");
    let mut pod_namespace = field("metadata.namespace");
    pod_namespace["name"] = json!("POD_NAMESPACE");
    let probe = |path: &str, period: u32| json!({"httpGet": {"path": path, "port": "admin"}, "periodSeconds": period, "failureThreshold": 3});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()},
        "spec": {
            // One works at a time (the Lease); more replicas only stand by.
            "replicas": 1,
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
                    "containers": [{
                        "name": "manager",
                        "image": flavor.value("CAPO_RS_IMAGE", IMAGE),
                        "args": args,
                        "env": [pod_name, pod_namespace],
                        "ports": [{"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"}],
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
                        // A cloud's CA bundle is handed to the OpenStack SDK as a file.
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}],
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
            "ports": [{"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"}],
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
            "endpoints": [{"port": "admin", "path": "/metrics", "interval": "30s"}],
        },
    })
}

/// Every object but the CRDs, in apply order.
pub fn objects(flavor: Flavor) -> Vec<Value> {
    let mut all = vec![namespace()];
    all.extend(rbac());
    all.push(deployment(flavor));
    all.push(metrics_service());
    all
}

fn yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|object| serde_yaml::to_string(object).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}

const GENERATED: &str =
    "# Generated by `capo-rs manifests --out deploy`: edit src, not this file.\n";

/// The files of `deploy/` (path relative to it, contents).
pub fn files(crds_yaml: &str) -> Vec<(String, String)> {
    let plain = objects(Flavor::Kustomize);
    let (namespace, rest) = plain.split_at(1);
    let (rbac, rest) = rest.split_at(5);
    let (manager, service) = rest.split_at(1);
    let kustomization = format!(
        "{GENERATED}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n\
         - namespace.yaml\n- ../crds\n- rbac.yaml\n- manager.yaml\n- service.yaml\n\
         # Prometheus Operator users: add `components: [servicemonitor]` in an overlay.\n"
    );
    let component = format!(
        "{GENERATED}apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n- servicemonitor.yaml\n"
    );
    let mut components = format!("{GENERATED}{}", yaml(&objects_with_crds(crds_yaml)));
    if !components.ends_with('\n') {
        components.push('\n');
    }
    vec![
        ("kustomization.yaml".into(), kustomization),
        (
            "namespace.yaml".into(),
            format!("{GENERATED}{}", yaml(namespace)),
        ),
        ("rbac.yaml".into(), format!("{GENERATED}{}", yaml(rbac))),
        (
            "manager.yaml".into(),
            format!("{GENERATED}{}", yaml(manager)),
        ),
        (
            "service.yaml".into(),
            format!("{GENERATED}{}", yaml(service)),
        ),
        ("servicemonitor/kustomization.yaml".into(), component),
        (
            "servicemonitor/servicemonitor.yaml".into(),
            format!("{GENERATED}{}", yaml(&[service_monitor()])),
        ),
        (
            "clusterctl/infrastructure-components.yaml".into(),
            components,
        ),
        ("clusterctl/metadata.yaml".into(), metadata()),
    ]
}

/// The clusterctl components: the Namespace first, the CRDs, then the rest.
fn objects_with_crds(crds_yaml: &str) -> Vec<Value> {
    let mut all = objects(Flavor::Clusterctl);
    let crds = serde_yaml::Deserializer::from_str(crds_yaml)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .filter(|value: &Value| !value.is_null());
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
        let plain = yaml(&objects(Flavor::Kustomize));
        assert!(!plain.contains("${"), "the kustomize base has plain values");
        assert!(plain.contains("--leader-elect=true"));
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

    #[test]
    fn metadata_names_the_v1beta2_contract_for_this_release_series() {
        let metadata: Value = serde_yaml::from_str(&metadata()).unwrap_or_default();
        assert_eq!(metadata["releaseSeries"][0]["contract"], "v1beta2");
        assert_eq!(metadata["releaseSeries"][0]["minor"], 1);
    }
}
