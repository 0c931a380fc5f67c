//! What the reconcilers share, against the simulated cloud: OpenStack clients per credentials.

use std::collections::BTreeMap;

use capo_provider::cloud::{CloudOptions, Clouds};
use capo_provider::controllers::credentials::CLOUDS_YAML_KEY;
use capo_provider::controllers::{
    Categorized, ClientCache, CredentialsError, CredentialsKey, ErrorCategory,
};
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

fn key(resource_version: &str, cloud_name: &str) -> CredentialsKey {
    CredentialsKey {
        secret: "default/cloud-config".into(),
        uid: "3f1c".into(),
        resource_version: resource_version.into(),
        cloud_name: cloud_name.into(),
        region: None,
    }
}

fn secret(clouds_yaml: &str) -> BTreeMap<String, Vec<u8>> {
    BTreeMap::from([(CLOUDS_YAML_KEY.to_owned(), clouds_yaml.as_bytes().to_vec())])
}

#[tokio::test]
async fn one_client_per_secret_version_and_a_changed_secret_replaces_it() {
    let sim = OpenStackSim::start(OpenStackSimConfig::default())
        .await
        .unwrap();
    let clouds = Clouds::new(
        CloudOptions::default(),
        &Registry::new(),
        CancellationToken::new(),
    )
    .unwrap();
    let cache = ClientCache::new(clouds);
    let data = secret(&sim.clouds_yaml());
    let client = cache.client(&key("1", "sim"), &data).await.unwrap();
    client.octavia().list_providers().await.unwrap();
    let again = cache.client(&key("1", "sim"), &data).await.unwrap();
    again.octavia().list_providers().await.unwrap();
    assert_eq!(sim.request_count("identity token_create"), 1, "one login");
    assert_eq!(cache.len(), 1);

    // The Secret changed (new resourceVersion): a new client, and the old one is dropped.
    cache.client(&key("2", "sim"), &data).await.unwrap();
    assert_eq!(cache.len(), 1);
    // Another cloud in the same Secret is another client.
    cache.client(&key("2", "sim-appcred"), &data).await.unwrap();
    assert_eq!(cache.len(), 2);
}

#[tokio::test]
async fn unknown_clouds_and_malformed_clouds_yaml_are_credentials_errors_that_say_why() {
    let sim = OpenStackSim::start(OpenStackSimConfig::default())
        .await
        .unwrap();
    let clouds = Clouds::new(
        CloudOptions::default(),
        &Registry::new(),
        CancellationToken::new(),
    )
    .unwrap();
    let cache = ClientCache::new(clouds);
    let unknown = cache
        .client(&key("1", "nope"), &secret(&sim.clouds_yaml()))
        .await
        .unwrap_err();
    assert_eq!(unknown.category(), ErrorCategory::Credentials);
    let message = unknown.to_string();
    assert!(message.contains("default/cloud-config"), "{message}");
    assert!(
        message.contains("\"nope\" is not in clouds.yaml"),
        "{message}"
    );
    assert!(
        message.contains("sim"),
        "names the clouds it has: {message}"
    );

    let malformed = cache
        .client(&key("1", "sim"), &secret("clouds: [password: hunter2"))
        .await
        .unwrap_err();
    assert!(matches!(malformed, CredentialsError::Cloud { .. }));
    assert_eq!(malformed.category(), ErrorCategory::Credentials);
    assert!(!malformed.to_string().contains("hunter2"), "{malformed}");
    assert!(cache.is_empty(), "failures are not cached");
}

// ------------------------------------------------------------------ Cluster API objects

use capo_api::capi::{self, Machine};
use capo_sim::kube::{KubeSim, KubeSimConfig};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// A Machine as Cluster API writes it, with fields capo-rs does not model.
fn machine_manifest() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": "cp-0", "namespace": "default",
            "labels": {"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/control-plane": ""}},
        "spec": {
            "clusterName": "c1",
            "bootstrap": {
                "configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "cp-0"},
                "dataSecretName": "cp-0-bootstrap"
            },
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "OpenStackMachine", "name": "cp-0"},
            "failureDomain": "az-1",
            "version": "v1.33.0",
            "deletion": {"nodeDrainTimeoutSeconds": 10}
        }
    })
}

/// Creates the Machine through the API server, then reads it back typed and untyped.
async fn machine_round_trip(crds: Vec<Value>) -> (Machine, DynamicObject) {
    let sim = KubeSim::start(KubeSimConfig::default()).await.unwrap();
    sim.install(&crds).unwrap();
    let client = sim.client().unwrap();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(capi::GROUP, "v1beta2", "Machine"));
    let dynamic: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let object: DynamicObject = serde_json::from_value(machine_manifest()).unwrap();
    dynamic
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let typed: Api<Machine> = Api::namespaced(client, "default");
    (
        typed.get("cp-0").await.unwrap(),
        dynamic.get("cp-0").await.unwrap(),
    )
}

fn check_machine(typed: &Machine, untyped: &DynamicObject) {
    assert_eq!(
        typed.spec.bootstrap.data_secret_name.as_deref(),
        Some("cp-0-bootstrap")
    );
    assert_eq!(typed.spec.failure_domain.as_deref(), Some("az-1"));
    let labels = typed.metadata.labels.clone().unwrap_or_default();
    assert!(capi::is_control_plane(&labels));
    assert_eq!(capi::cluster_name(&labels), Some("c1"));
    // What we do not model is kept by the server, not pruned.
    assert_eq!(
        untyped.data["spec"]["deletion"]["nodeDrainTimeoutSeconds"],
        json!(10)
    );
}

#[tokio::test]
async fn our_minimal_capi_crds_serve_machines_as_cluster_api_writes_them() {
    let crds = capi::crds()
        .iter()
        .map(|crd| serde_json::to_value(crd).unwrap())
        .collect();
    let (typed, untyped) = machine_round_trip(crds).await;
    check_machine(&typed, &untyped);
}

#[tokio::test]
async fn our_capi_types_read_machines_served_by_cluster_apis_real_crds() {
    let Some(dir) = crate::common::shared_reference("capi/crds", "the real Cluster API CRD check")
    else {
        return;
    };
    let crds = [
        "cluster.x-k8s.io_clusters.yaml",
        "cluster.x-k8s.io_machines.yaml",
    ]
    .iter()
    .map(|file| {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        serde_yaml::from_str::<Value>(&text).unwrap()
    })
    .collect();
    let (typed, untyped) = machine_round_trip(crds).await;
    check_machine(&typed, &untyped);
}

// ------------------------------------------------------------------ the manager's CRD check

use capo_provider::manager::{CrdCheckError, check_crds};

#[tokio::test]
async fn the_manager_names_missing_crds_and_how_to_install_them() {
    let sim = KubeSim::start(KubeSimConfig::default()).await.unwrap();
    let client = sim.client().unwrap();
    let ours: Vec<String> = capo_api::crds::all()
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect();
    let missing = check_crds(&client, &ours).await.unwrap_err();
    assert!(!missing.is_transient());
    let message = missing.to_string();
    assert!(
        message.contains("openstackservers.infrastructure.cluster.x-k8s.io"),
        "{message}"
    );
    assert!(
        message.contains("kubectl apply --server-side -f crds/"),
        "{message}"
    );

    let all_but_servers: Vec<Value> = capo_api::crds::all()
        .iter()
        .filter(|crd| crd.spec.names.kind != "OpenStackServer")
        .map(|crd| serde_json::to_value(crd).unwrap())
        .collect();
    sim.install(&all_but_servers).unwrap();
    let Err(CrdCheckError::Missing(names)) = check_crds(&client, &ours).await else {
        panic!("OpenStackServer's CRD is still missing");
    };
    assert_eq!(names, ["openstackservers.infrastructure.cluster.x-k8s.io"]);

    let servers: Vec<Value> = capo_api::crds::all()
        .iter()
        .filter(|crd| crd.spec.names.kind == "OpenStackServer")
        .map(|crd| serde_json::to_value(crd).unwrap())
        .collect();
    sim.install(&servers).unwrap();
    check_crds(&client, &ours).await.unwrap();
}
