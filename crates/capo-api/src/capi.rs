//! The Cluster API objects capo-rs reads, as minimal v1beta2 types: only the fields we use.
//! Reading real objects ignores everything else. [`crds`] generates minimal CRDs from these
//! types, with unknown fields preserved, for the demo and the tests that have no real Cluster
//! API CRDs at hand; a management cluster has Cluster API's own.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Cluster API's group.
pub const GROUP: &str = "cluster.x-k8s.io";

/// Labels and annotations of the Cluster API contract.
pub mod labels {
    /// On every object of a cluster: the Cluster's name.
    pub const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
    /// On control-plane Machines (any value).
    pub const CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
    /// Annotation: this object is paused (any value).
    pub const PAUSED: &str = "cluster.x-k8s.io/paused";
    /// Annotation: an infrastructure cluster managed by something else than its provider
    /// (any value); the provider leaves it alone.
    pub const MANAGED_BY: &str = "cluster.x-k8s.io/managed-by";
    /// Label a controller's `--watch-filter` selects on.
    pub const WATCH_FILTER: &str = "cluster.x-k8s.io/watch-filter";
    /// Annotation prefix of a Machine's pre-terminate deletion hooks.
    pub const PRE_TERMINATE_HOOK_PREFIX: &str =
        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/";
    /// capo-rs's own pre-terminate hook on control-plane Machines: the Machine's API load
    /// balancer member is removed (and seen gone) before the hook goes.
    pub const LB_MEMBER_HOOK: &str =
        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/capo-rs-lb-member";
    /// KubeadmControlPlane's hook: it removes the etcd member, after every other hook.
    pub const KCP_HOOK: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";
}

/// The Machine condition that tells why a deletion waits, and its reasons.
pub mod deleting {
    /// Condition type.
    pub const CONDITION: &str = "Deleting";
    /// The Machine waits for its pre-terminate hooks to be removed.
    pub const WAITING_FOR_PRE_TERMINATE_HOOK: &str = "WaitingForPreTerminateHook";
}

/// A reference to a contract object (v1beta2's `ContractVersionedObjectReference`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractReference {
    /// The referenced object's API group, without a version (e.g.
    /// `infrastructure.cluster.x-k8s.io`).
    #[serde(default)]
    pub api_group: String,
    /// The referenced object's kind (e.g. `OpenStackCluster`).
    #[serde(default)]
    pub kind: String,
    /// The referenced object's name, in the referring object's namespace.
    #[serde(default)]
    pub name: String,
}

/// The part of a Cluster capo-rs reads.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    plural = "clusters",
    namespaced,
    status = "ClusterStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ClusterSpec {
    /// Reconciliation of the cluster's objects is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The infrastructure cluster (an OpenStackCluster for capo-rs) that provides the cluster's
    /// infrastructure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractReference>,
    /// The object that manages the cluster's control plane (e.g. a KubeadmControlPlane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractReference>,
    /// Copied from the infrastructure cluster once it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<Endpoint>,
}

/// Where the cluster's API server answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Hostname or IP address of the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// TCP port of the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// The part of a Cluster's status capo-rs reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ClusterStatus {
    /// How far the cluster's initialization has got; None until Cluster API reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
}

/// How far a Cluster's initialization has got (v1beta2 `status.initialization`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// The infrastructure cluster has reported its infrastructure provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The control plane is initialized: functional enough to accept requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// The part of a Machine capo-rs reads.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    plural = "machines",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineSpec {
    /// The Cluster's name.
    #[serde(default)]
    pub cluster_name: String,
    /// Where the machine's bootstrap data comes from.
    #[serde(default)]
    pub bootstrap: Bootstrap,
    /// The infrastructure machine (an OpenStackMachine for capo-rs) backing this Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractReference>,
    /// Where the machine is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// The cloud's ID for the machine's instance (`spec.providerID`), copied from the
    /// infrastructure machine once it has one.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// The Kubernetes version the machine runs (e.g. `v1.33.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A Machine's bootstrap data source; capo-rs reads only the generated Secret's name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct Bootstrap {
    /// The Secret whose `value` key is the machine's user data, once the bootstrap provider
    /// has written it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// The part of a Machine's status capo-rs reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineStatus {
    /// Cluster API's one-word summary of the machine's lifecycle (`Pending`, `Provisioning`,
    /// `Running`, `Deleting`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Node this machine became, once it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NodeReference>,
    /// How far the machine's initialization has got; None until Cluster API reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// v1beta2 conditions; `Deleting` says what a deletion waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// A reference to the Node a Machine became.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReference {
    /// The Node's name (Nodes are cluster-scoped).
    pub name: String,
}

/// How far a Machine's initialization has got (v1beta2 `status.initialization`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The infrastructure machine has reported its instance provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The bootstrap provider has written the Secret with the machine's bootstrap data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_data_secret_created: Option<bool>,
}

/// Whether an object is paused: its Cluster says so, or the object carries the annotation.
pub fn is_paused(cluster: Option<&Cluster>, annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(labels::PAUSED) || cluster.is_some_and(|c| c.spec.paused == Some(true))
}

/// Whether an infrastructure cluster is managed by someone else (Cluster API's
/// `annotations.IsExternallyManaged`).
pub fn is_externally_managed(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(labels::MANAGED_BY)
}

/// The Cluster an object belongs to, by its `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels
        .get(labels::CLUSTER_NAME)
        .map(String::as_str)
        .filter(|name| !name.is_empty())
}

/// The pre-terminate hooks a Machine still carries.
pub fn pre_terminate_hooks(annotations: &BTreeMap<String, String>) -> Vec<&str> {
    annotations
        .keys()
        .filter(|key| key.starts_with(labels::PRE_TERMINATE_HOOK_PREFIX))
        .map(String::as_str)
        .collect()
}

/// Whether a deleting Machine says it waits for its pre-terminate hooks (the Machine
/// controller has drained it and will terminate the infrastructure once they are gone).
pub fn waits_for_pre_terminate_hooks(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
        && machine.status.as_ref().is_some_and(|status| {
            status.conditions.iter().any(|c| {
                c.type_ == deleting::CONDITION
                    && c.reason == deleting::WAITING_FOR_PRE_TERMINATE_HOOK
            })
        })
}

/// Whether a Machine is a control-plane machine.
pub fn is_control_plane(labels: &BTreeMap<String, String>) -> bool {
    labels.contains_key(labels::CONTROL_PLANE)
}

/// Minimal Cluster and Machine CRDs: the fields above, everything else preserved, a status
/// subresource. For the demo and tests only.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [Cluster::crd(), Machine::crd()]
        .into_iter()
        .map(preserve_unknown_fields)
        .collect()
}

/// Marks the root schema of each version as preserving unknown fields, as a real server
/// keeps `metadata`-adjacent fields we do not model.
pub(crate) fn preserve_unknown_fields(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    if let Some(versions) = value
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut)
    {
        for version in versions {
            if let Some(schema) = version
                .pointer_mut("/schema/openAPIV3Schema")
                .and_then(Value::as_object_mut)
            {
                schema.insert(
                    "x-kubernetes-preserve-unknown-fields".into(),
                    Value::Bool(true),
                );
            }
        }
    }
    serde_json::from_value(value).unwrap_or(crd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_real_shaped_machine_reads_with_the_fields_we_use() {
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": "cp-0", "namespace": "default",
                "labels": {"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/control-plane": ""}},
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "cp-0"},
                              "dataSecretName": "cp-0-bootstrap"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "OpenStackMachine", "name": "cp-0"},
                "failureDomain": "az-1",
                "version": "v1.33.0",
                "deletion": {"nodeDrainTimeoutSeconds": 10}
            },
            "status": {"phase": "Provisioning", "conditions": []}
        }))
        .unwrap();
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("cp-0-bootstrap")
        );
        assert_eq!(machine.spec.failure_domain.as_deref(), Some("az-1"));
        let labels = machine.metadata.labels.clone().unwrap_or_default();
        assert_eq!(cluster_name(&labels), Some("c1"));
        assert!(is_control_plane(&labels));
    }

    #[test]
    fn paused_by_the_cluster_or_by_the_annotation() {
        let mut cluster = Cluster::new("c1", ClusterSpec::default());
        let none = BTreeMap::new();
        assert!(!is_paused(Some(&cluster), &none));
        assert!(!is_paused(None, &none));
        let annotated = BTreeMap::from([(labels::PAUSED.to_owned(), String::new())]);
        assert!(is_paused(None, &annotated));
        cluster.spec.paused = Some(true);
        assert!(is_paused(Some(&cluster), &none));
        let empty_name = BTreeMap::from([(labels::CLUSTER_NAME.to_owned(), String::new())]);
        assert_eq!(cluster_name(&empty_name), None);
    }

    #[test]
    fn minimal_crds_preserve_what_they_do_not_model() {
        for crd in crds() {
            let value = serde_json::to_value(&crd).unwrap();
            let root = &value["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            assert_eq!(root["x-kubernetes-preserve-unknown-fields"], json!(true));
            assert_eq!(
                root["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"],
                json!(true)
            );
            assert_eq!(crd.spec.group, GROUP);
        }
    }
}
