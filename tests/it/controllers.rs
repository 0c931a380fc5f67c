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

/// A client left unused for the idle time is dropped when another is made, so a process does
/// not hold a client, a session and a CA file for every Secret it ever saw.
#[tokio::test]
async fn a_client_left_unused_for_the_idle_time_is_dropped() {
    let sim = OpenStackSim::start(OpenStackSimConfig::default())
        .await
        .unwrap();
    let data = secret(&sim.clouds_yaml());
    for (idle, kept) in [
        (std::time::Duration::from_secs(3600), 2),
        (std::time::Duration::ZERO, 1),
    ] {
        let options = CloudOptions {
            session_idle_ttl: idle,
            ..CloudOptions::default()
        };
        let clouds = Clouds::new(options, &Registry::new(), CancellationToken::new()).unwrap();
        let cache = ClientCache::new(clouds);
        cache.client(&key("1", "sim"), &data).await.unwrap();
        cache.client(&key("1", "sim-appcred"), &data).await.unwrap();
        assert_eq!(cache.len(), kept, "idle time {idle:?}");
    }
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
        serde_saphyr::from_str::<Value>(&text).unwrap()
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

/// The context the reconcilers share, on `world`'s API server, without a manager around it.
fn bare_context(
    world: &crate::kube_world::KubeWorld,
) -> (
    std::sync::Arc<capo_provider::controllers::Context>,
    Registry,
    CancellationToken,
) {
    use capo_provider::controllers::{Context, ControllerConfig, ReconcileMetrics};
    use capo_provider::manager::controllers::{WatchScope, Watches};
    use capo_provider::membership::{Engine, EngineConfig};
    let registry = Registry::new();
    let stop = CancellationToken::new();
    let engine = Engine::new(EngineConfig::default(), &registry, stop.clone()).expect("engine");
    let clouds = Clouds::new(CloudOptions::default(), &registry, stop.clone()).expect("clouds");
    let scope = WatchScope {
        namespace: Some(world.namespace.clone()),
        watch_filter: None,
    };
    let (watches, _drivers) = Watches::new(&scope, &world.manager_client);
    let ctx = Context::new(
        world.manager_client.clone(),
        engine,
        clouds,
        ReconcileMetrics::register(&registry).expect("metrics"),
        ControllerConfig::default(),
        watches.caches(),
    );
    (ctx, registry, stop)
}

/// What the context holds about objects that left a controller's store is forgotten at the
/// next pruning; what it holds about the store's objects, and about other controllers'
/// objects, is kept.
#[tokio::test]
async fn the_per_object_state_of_objects_gone_from_the_store_is_pruned() {
    let world = crate::kube_world::KubeWorld::sim(&[]).await;
    let (ctx, _registry, stop) = bare_context(&world);
    let at = tokio::time::Instant::now();
    let status = serde_json::json!({"ready": true});
    let keys = [
        "openstackcluster/ns/kept",
        "openstackcluster/ns/gone",
        "openstackmachine/ns/gone",
    ];
    for key in keys {
        ctx.note(key, "member-created", at);
        ctx.last_writes.wrote(key, None, &status);
    }
    let live = std::collections::HashSet::from(["openstackcluster/ns/kept".to_owned()]);
    ctx.prune("openstackcluster", &live);
    let held = |key: &str| {
        (
            ctx.noted(key, "member-created").is_some(),
            ctx.last_writes.repeats(key, None, &status),
        )
    };
    assert_eq!(held("openstackcluster/ns/kept"), (true, true));
    assert_eq!(held("openstackcluster/ns/gone"), (false, false), "pruned");
    assert_eq!(
        held("openstackmachine/ns/gone"),
        (true, true),
        "another controller's: its own sweep prunes it"
    );
    stop.cancel();
}

/// A reconcile that panics (a bug of ours) is its object's error alone: the panic is caught,
/// said in a Warning event on the object, counted as an internal error and backed off, and
/// the next reconcile, of it or of any other object, runs. Uncaught, it would end the
/// controller's stream and every other object's reconciles with it.
#[tokio::test]
async fn a_reconcile_that_panics_is_its_objects_error_and_is_retried_with_backoff() {
    use capo_api::OpenStackCluster;
    use capo_provider::controllers::cluster::{self, ClusterError};
    use capo_provider::controllers::packed::Packed;
    use capo_provider::controllers::{Context, Outcome};
    use k8s_openapi::api::events::v1::Event;
    use std::sync::Arc;

    let world =
        crate::kube_world::KubeWorld::start(&[crate::common::our_crd("OpenStackCluster")]).await;
    let clusters = world.api::<OpenStackCluster>();
    let mut objects = Vec::new();
    for name in ["panics", "carries-on"] {
        let cluster: OpenStackCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "OpenStackCluster",
            "metadata": {"name": name},
            "spec": {"identityRef": {"cloudName": "capo", "name": "cloud-config"}}
        }))
        .expect("an OpenStackCluster");
        let created = clusters
            .create(&Default::default(), &cluster)
            .await
            .expect("created");
        objects.push(Arc::new(Packed::pack(created)));
    }

    let (ctx, registry, stop) = bare_context(&world);
    let write_failed = |source| ClusterError::Kubernetes {
        what: "writing status".into(),
        source,
    };

    let panicked = capo_provider::controllers::reconcile_watched(
        cluster::CONTROLLER,
        objects[0].clone(),
        ctx.clone(),
        async |_: &OpenStackCluster, _: &Context, _: &str| -> Result<Outcome, ClusterError> {
            panic!("an index out of bounds, say")
        },
        write_failed,
    )
    .await
    .expect_err("a panic is an error");
    assert_eq!(panicked.category(), ErrorCategory::Internal, "{panicked}");
    assert!(panicked.to_string().contains("an index out of bounds, say"));
    let action = cluster::error_policy(objects[0].clone(), &panicked, ctx.clone());
    assert_ne!(
        format!("{action:?}"),
        format!("{:?}", kube::runtime::controller::Action::await_change()),
        "retried, not left waiting for a change"
    );

    let events = world
        .api::<Event>()
        .list(&Default::default())
        .await
        .expect("events");
    let said: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("panics"))
        .filter_map(|e| {
            Some((
                e.type_.as_deref()?,
                e.reason.as_deref()?,
                e.note.as_deref()?,
            ))
        })
        .collect();
    assert!(
        said.iter().any(|(type_, reason, note)| *type_ == "Warning"
            && *reason == "InternalError"
            && note.contains("an index out of bounds, say")),
        "a Warning event on the object says so: {said:?}"
    );
    let errors = registry
        .gather()
        .into_iter()
        .find(|family| family.name() == "controller_runtime_reconcile_errors_total")
        .map(|family| {
            family
                .get_metric()
                .iter()
                .map(|m| m.get_counter().get_value())
                .sum::<f64>()
        });
    assert_eq!(errors, Some(1.0), "counted as a reconcile error");

    let next = capo_provider::controllers::reconcile_watched(
        cluster::CONTROLLER,
        objects[1].clone(),
        ctx.clone(),
        async |_: &OpenStackCluster, _: &Context, _: &str| -> Result<Outcome, ClusterError> {
            Ok(Outcome::Settled)
        },
        write_failed,
    )
    .await;
    assert!(next.is_ok(), "the next reconcile runs: {next:?}");
    stop.cancel();
}
