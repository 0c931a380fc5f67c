//! OpenStackClusterIdentity (v1alpha1): cluster-scoped credentials shared across namespaces.

#![allow(
    clippy::duplicated_attributes,
    reason = "each kube printcolumn(...) repeats the same keys"
)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Credentials in a Secret of any namespace, usable by clusters in selected namespaces.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "OpenStackClusterIdentity",
    plural = "openstackclusteridentities",
    shortname = "osci",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "Cluster-scoped OpenStack credentials shared by clusters in selected namespaces.",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "SecretNamespace",
        type_ = "string",
        json_path = ".spec.secretRef.namespace",
        description = "Namespace of the credentials Secret"
    ),
    printcolumn(
        name = "SecretName",
        type_ = "string",
        json_path = ".spec.secretRef.name",
        description = "Name of the credentials Secret"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct OpenStackClusterIdentitySpec {
    /// The Secret holding `clouds.yaml` (and optionally `cacert`).
    pub secret_ref: SecretReference,
    /// Namespaces whose clusters may use this identity; all when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub namespace_selector: Option<LabelSelector>,
}

/// A Secret by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SecretReference {
    /// Secret name.
    pub name: String,
    /// Secret namespace.
    pub namespace: String,
}

/// A Kubernetes label selector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Requirements that must all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub match_expressions: Vec<LabelSelectorRequirement>,
    /// Labels that must all match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// One label selector requirement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    /// Values for In and NotIn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub values: Vec<String>,
}
