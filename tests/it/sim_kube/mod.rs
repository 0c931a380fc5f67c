//! Conformance of the simulated Kubernetes API server (`sim::kube`), driven through kube-rs
//! exactly as controllers use it: `Api`, `watcher`, `reflector`, `Controller` and
//! `finalizer`. Each test names the real-server behaviour it checks.

use std::sync::Arc;
use std::time::Duration;

use capo_sim::kube::{KubeSim, KubeSimConfig, StoreConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, VersionMatch,
    WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind, Status};
use kube::discovery::{Discovery, Scope};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{reflector, watcher};
use kube::{Client, CustomResource, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common;
mod crd_verdicts;
mod metadata;
mod write_answers;

/// A test kind with what our CRDs use: a status subresource, a default on status, nested
/// spec defaults, a required field, an enum and a printer column.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
struct WidgetSpec {
    size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network: Option<Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct WidgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
}

fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}},
                     "additionalPrinterColumns": [{"name": "Size", "type": "string", "jsonPath": ".spec.size"}],
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                         "metadata": {"type": "object"},
                         "spec": {"type": "object", "required": ["size"], "properties": {
                             "size": {"type": "string", "enum": ["small", "large"]},
                             "replicas": {"type": "integer", "default": 1},
                             "color": {"type": "string"},
                             "network": {"type": "object", "default": {},
                                         "properties": {"mtu": {"type": "integer", "default": 1500}}}}},
                         "status": {"type": "object", "default": {"observedGeneration": -1},
                                    "properties": {"observedGeneration": {"type": "integer"},
                                                   "ready": {"type": "boolean"}}}}}}}]}
    })
}

/// Minimal Cluster API CRDs, enough to own and be owned.
fn capi_crd(kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.cluster.x-k8s.io")},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
                 "names": {"plural": plural, "kind": kind, "categories": ["cluster-api"]},
                 "versions": [{"name": "v1beta2", "served": true, "storage": true,
                     "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object",
                         "x-kubernetes-preserve-unknown-fields": true}}}]}
    })
}

async fn start_with(config: KubeSimConfig) -> (KubeSim, Client) {
    let sim = KubeSim::start(config).await.expect("simulator starts");
    sim.install(&[
        widget_crd(),
        capi_crd("Cluster", "clusters"),
        capi_crd("Machine", "machines"),
    ])
    .expect("test CRDs install");
    let client = sim.client().expect("client");
    (sim, client)
}

async fn start() -> (KubeSim, Client) {
    start_with(KubeSimConfig::default()).await
}

fn widget(name: &str, size: &str) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            size: size.into(),
            ..WidgetSpec::default()
        },
    )
}

fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn assert_status(status: &Status, code: u16, reason: &str) {
    assert_eq!(
        (status.code, status.reason.as_str()),
        (code, reason),
        "{status:?}"
    );
    assert!(
        status.is_failure(),
        "a Status body with status Failure: {status:?}"
    );
}

fn rv<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .expect("numeric resourceVersion")
}

const WAIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn pp() -> PostParams {
    PostParams::default()
}

#[tokio::test]
async fn discovery_maps_kinds_to_resources() {
    let (_sim, client) = start().await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let find = |group: &str, kind: &str| {
        discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .chain(discovery.groups().flat_map(|g| {
                g.versions()
                    .flat_map(|v| g.versioned_resources(v))
                    .collect::<Vec<_>>()
            }))
            .find(|(ar, _)| ar.group == group && ar.kind == kind)
    };
    for (group, kind) in [
        ("", "Namespace"),
        ("", "Secret"),
        ("", "ConfigMap"),
        ("", "Event"),
        ("events.k8s.io", "Event"),
        ("coordination.k8s.io", "Lease"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        ("example.com", "Widget"),
        ("cluster.x-k8s.io", "Machine"),
    ] {
        assert!(
            find(group, kind).is_some(),
            "{group}/{kind} is discoverable"
        );
    }
    let (widgets, caps) = find("example.com", "Widget").expect("widgets");
    assert_eq!(widgets.plural, "widgets");
    assert_eq!(caps.scope, Scope::Namespaced);
    assert!(!caps.subresources.is_empty(), "status subresource listed");
    let (_, ns_caps) = find("", "Namespace").expect("namespaces");
    assert_eq!(ns_caps.scope, Scope::Cluster);
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "34")
    );
}

fn gadget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [
                     {"name": "v1beta1", "served": true, "storage": false,
                      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                          "spec": {"type": "object", "properties": {"v": {"type": "string", "default": "beta"}}}}}}},
                     {"name": "v1", "served": true, "storage": true,
                      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                          "spec": {"type": "object", "properties": {"v": {"type": "string", "default": "ga"}}}}}}}]}
    }))
    .expect("valid CRD")
}

fn gadgets(client: &Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.com", version, "Gadget");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "gadgets"),
    )
}

#[tokio::test]
async fn a_crd_serves_its_resource_in_every_version_until_deleted() {
    let (_sim, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let v1 = gadgets(&client, "v1");
    assert_status(
        &api_error(v1.list(&ListParams::default()).await),
        404,
        "NotFound",
    );

    let created = crds
        .create(&pp(), &gadget_crd())
        .await
        .expect("CRD created");
    let status = created.status.expect("CRD status");
    let established = status.conditions.unwrap_or_default();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    assert_eq!(status.stored_versions, Some(vec!["v1".to_owned()]));

    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {}}))
    .expect("object");
    let stored = v1.create(&pp(), &object).await.expect("gadget created");
    assert_eq!(stored.data["spec"]["v"], "ga", "v1 schema default");
    let beta = gadgets(&client, "v1beta1")
        .get("g")
        .await
        .expect("read via v1beta1");
    assert_eq!(
        beta.types.expect("types").api_version,
        "example.com/v1beta1"
    );

    let uid = created.metadata.uid.expect("uid");
    crds.delete("gadgets.example.com", &DeleteParams::default())
        .await
        .expect("CRD delete accepted");
    within(
        "the CRD to go",
        await_condition(
            crds.clone(),
            "gadgets.example.com",
            conditions::is_deleted(&uid),
        ),
    )
    .await
    .expect("watch");
    assert_status(
        &api_error(v1.list(&ListParams::default()).await),
        404,
        "NotFound",
    );
}

#[tokio::test]
async fn an_invalid_crd_is_refused_with_field_causes() {
    let (_sim, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let mut bad = gadget_crd();
    bad.metadata.name = Some("wrong.example.com".into());
    for v in &mut bad.spec.versions {
        v.storage = false;
    }
    let status = api_error(crds.create(&pp(), &bad).await);
    assert_status(&status, 422, "Invalid");
    let fields: Vec<String> = status
        .details
        .expect("details")
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert!(fields.contains(&"metadata.name".to_owned()), "{fields:?}");
    assert!(fields.contains(&"spec.versions".to_owned()), "{fields:?}");
}

#[tokio::test]
async fn create_sets_system_metadata() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let a = widgets
        .create(&pp(), &widget("a", "small"))
        .await
        .expect("create");
    let meta = &a.metadata;
    assert_eq!(meta.uid.as_ref().map(String::len), Some(36));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.namespace.as_deref(), Some("default"));

    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("gen-".into());
    cm.metadata.owner_references = Some(vec![a.controller_owner_ref(&()).expect("owner ref")]);
    let generated = configmaps
        .create(&pp(), &cm)
        .await
        .expect("generateName create");
    let name = generated.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    assert_eq!(
        generated.owner_references().len(),
        1,
        "ownerReferences kept"
    );
    assert!(
        rv(&generated) > rv(&a),
        "resourceVersion increases across kinds"
    );
    assert_eq!(
        generated.metadata.generation, None,
        "built-ins carry no generation"
    );

    let missing = api_error(widgets.get("nope").await);
    assert_status(&missing, 404, "NotFound");
    assert_eq!(missing.message, "widgets.example.com \"nope\" not found");
    let again = api_error(widgets.create(&pp(), &widget("a", "small")).await);
    assert_status(&again, 409, "AlreadyExists");
    let mut nameless = widget("", "small");
    nameless.metadata.name = None;
    assert_status(
        &api_error(widgets.create(&pp(), &nameless).await),
        422,
        "Invalid",
    );
    let upper = api_error(widgets.create(&pp(), &widget("Upper", "small")).await);
    assert_status(&upper, 422, "Invalid");
}

#[tokio::test]
async fn generation_moves_only_with_the_spec() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    widgets
        .create(&pp(), &widget("g", "small"))
        .await
        .expect("create");
    let merge = |v: Value| Patch::Merge(v);
    let labelled = widgets
        .patch(
            "g",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(labelled.metadata.generation, Some(1), "metadata change");
    let status = widgets
        .patch_status(
            "g",
            &PatchParams::default(),
            &merge(json!({"status": {"ready": true}})),
        )
        .await
        .expect("status");
    assert_eq!(status.metadata.generation, Some(1), "status change");
    let spec = widgets
        .patch(
            "g",
            &PatchParams::default(),
            &merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .expect("spec");
    assert_eq!(spec.metadata.generation, Some(2), "spec change");
    let same = widgets
        .patch(
            "g",
            &PatchParams::default(),
            &merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .expect("no-op");
    assert_eq!(same.metadata.generation, Some(2));
    assert_eq!(rv(&same), rv(&spec), "a no-op write is not a write");
}

#[tokio::test]
async fn stale_writes_conflict() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let first = widgets
        .create(&pp(), &widget("c", "small"))
        .await
        .expect("create");
    let mut newer = first.clone();
    newer.spec.color = Some("blue".into());
    widgets
        .replace("c", &pp(), &newer)
        .await
        .expect("replace with current rv");
    let mut stale = first.clone();
    stale.spec.color = Some("green".into());
    let conflict = api_error(widgets.replace("c", &pp(), &stale).await);
    assert_status(&conflict, 409, "Conflict");
    assert!(
        conflict.message.contains("the object has been modified"),
        "{}",
        conflict.message
    );
    let stale_patch = json!({"metadata": {"resourceVersion": first.resource_version()},
                             "spec": {"color": "green"}});
    let patched = widgets
        .patch("c", &PatchParams::default(), &Patch::Merge(stale_patch))
        .await;
    assert_status(&api_error(patched), 409, "Conflict");
    assert_eq!(
        widgets.get("c").await.expect("get").spec.color.as_deref(),
        Some("blue")
    );
    let mut unconditional = first;
    unconditional.metadata.resource_version = None;
    unconditional.spec.color = Some("pink".into());
    widgets
        .replace("c", &pp(), &unconditional)
        .await
        .expect("a custom resource may be replaced without a resourceVersion");
    let missing = widget("ghost", "small");
    assert_status(
        &api_error(widgets.replace("ghost", &pp(), &missing).await),
        404,
        "NotFound",
    );
}

#[tokio::test]
async fn the_status_subresource_splits_spec_and_status() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let mut with_status = widget("s", "small");
    with_status.status = Some(WidgetStatus {
        observed_generation: Some(7),
        ready: Some(true),
    });
    let created = widgets.create(&pp(), &with_status).await.expect("create");
    let defaulted = WidgetStatus {
        observed_generation: Some(-1),
        ready: None,
    };
    assert_eq!(
        created.status,
        Some(defaulted.clone()),
        "status dropped, then defaulted"
    );

    let mut replaced = created.clone();
    replaced.spec.color = Some("red".into());
    replaced.status = Some(WidgetStatus {
        observed_generation: Some(9),
        ready: Some(true),
    });
    let after = widgets
        .replace("s", &pp(), &replaced)
        .await
        .expect("replace");
    assert_eq!(after.spec.color.as_deref(), Some("red"));
    assert_eq!(
        after.status,
        Some(defaulted),
        "main resource ignores status"
    );

    let mut status_write = after.clone();
    status_write.spec.color = Some("ignored".into());
    status_write.status = Some(WidgetStatus {
        observed_generation: Some(2),
        ready: Some(true),
    });
    let written = widgets
        .replace_status("s", &pp(), &status_write)
        .await
        .expect("status replace");
    assert_eq!(
        written.spec.color.as_deref(),
        Some("red"),
        "/status ignores spec"
    );
    assert_eq!(written.status.as_ref().and_then(|s| s.ready), Some(true));
    assert_eq!(written.metadata.generation, after.metadata.generation);
}

#[tokio::test]
async fn schema_defaults_apply_on_write_and_read() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let created = widgets
        .create(&pp(), &widget("d", "large"))
        .await
        .expect("create");
    assert_eq!(created.spec.replicas, Some(1));
    assert_eq!(
        created.spec.network,
        Some(json!({"mtu": 1500})),
        "defaults inside defaults"
    );
    let emptied = widgets
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": null}})),
        )
        .await
        .expect("status patch");
    assert_eq!(
        emptied.status,
        Some(WidgetStatus::default()),
        "an existing empty status is not re-defaulted"
    );
    let null_replicas = json!({"spec": {"replicas": null}});
    let reset = widgets
        .patch("d", &PatchParams::default(), &Patch::Merge(null_replicas))
        .await
        .expect("patch");
    assert_eq!(
        reset.spec.replicas,
        Some(1),
        "a removed field gets its default back"
    );
}

#[tokio::test]
async fn invalid_objects_get_422_with_field_paths() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let status = api_error(widgets.create(&pp(), &widget("e", "huge")).await);
    assert_status(&status, 422, "Invalid");
    let causes = status.details.expect("details").causes;
    assert_eq!(causes[0].field, "spec.size");
    assert!(causes[0].message.contains("supported values"), "{causes:?}");

    let raw: Api<DynamicObject> = Api::default_namespaced_with(
        client,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "e"},
        "spec": {"replicas": "three"}}))
    .expect("object");
    let status = api_error(raw.create(&pp(), &bad).await);
    let mut fields: Vec<String> = status
        .details
        .expect("details")
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    fields.sort();
    assert_eq!(fields, ["spec.replicas", "spec.size"]);
}

#[tokio::test]
async fn unknown_fields_are_pruned_warned_or_refused() {
    let (_sim, client) = start().await;
    let raw: Api<DynamicObject> = Api::default_namespaced_with(
        client,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    let with_unknown: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "u"},
        "spec": {"size": "small", "flavour": "vanilla"}}))
    .expect("object");
    let created = raw.create(&pp(), &with_unknown).await.expect("pruned");
    assert_eq!(created.data["spec"].get("flavour"), None);
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let refused = raw
        .patch(
            "u",
            &strict,
            &Patch::Merge(json!({"spec": {"flavour": "mint"}})),
        )
        .await;
    let status = api_error(refused);
    assert_status(&status, 400, "BadRequest");
    assert!(
        status.message.contains("unknown field \"spec.flavour\""),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn every_patch_type_applies() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let params = PatchParams::default();
    widgets
        .create(&pp(), &widget("p", "small"))
        .await
        .expect("create");

    let merged = widgets
        .patch(
            "p",
            &params,
            &Patch::Merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .expect("merge");
    assert_eq!(merged.spec.color.as_deref(), Some("red"));

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/color", "value": "red"},
        {"op": "replace", "path": "/spec/color", "value": "blue"}]))
    .expect("ops");
    let json_patched = widgets
        .patch("p", &params, &Patch::<()>::Json(ops))
        .await
        .expect("json patch");
    assert_eq!(json_patched.spec.color.as_deref(), Some("blue"));
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/spec/color", "value": "red"}]))
            .expect("ops");
    let status = api_error(
        widgets
            .patch("p", &params, &Patch::<()>::Json(failing))
            .await,
    );
    assert_eq!(status.code, 422, "a failed test op is refused: {status:?}");

    // A real server has no strategic merge for custom resources; built-in kinds take it.
    let strategic = api_error(
        widgets
            .patch(
                "p",
                &params,
                &Patch::Strategic(json!({"spec": {"size": "large"}})),
            )
            .await,
    );
    assert_status(&strategic, 415, "UnsupportedMediaType");
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    configmaps
        .create(
            &pp(),
            &serde_json::from_value(json!({"metadata": {"name": "cm"}})).expect("cm"),
        )
        .await
        .expect("create configmap");
    let patched = configmaps
        .patch(
            "cm",
            &params,
            &Patch::Strategic(json!({"data": {"k": "v"}})),
        )
        .await
        .expect("strategic merge on a built-in kind");
    assert_eq!(
        patched
            .data
            .unwrap_or_default()
            .get("k")
            .map(String::as_str),
        Some("v")
    );

    let apply = PatchParams::apply("test-manager");
    let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": "small", "color": "green"}});
    let applied = widgets
        .patch("fresh", &apply, &Patch::Apply(&body))
        .await
        .expect("apply creates");
    assert_eq!(applied.spec.color.as_deref(), Some("green"));
    // Applying without a field the manager applied before removes it: apply is not a merge.
    let reapplied = widgets
        .patch("fresh", &apply, &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": "large"}})))
        .await
        .expect("apply again");
    assert_eq!(
        (
            reapplied.spec.size.as_str(),
            reapplied.spec.color.as_deref()
        ),
        ("large", None)
    );
    let unmanaged = widgets
        .patch(
            "fresh",
            &params,
            &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget"})),
        )
        .await;
    assert_status(&api_error(unmanaged), 400, "BadRequest");
}

async fn labelled_configmaps(client: &Client, namespace: &str, labels: &[(&str, &str)]) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for (name, app) in labels {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some((*name).into());
        cm.metadata.labels = Some([("app".to_owned(), (*app).to_owned())].into());
        configmaps.create(&pp(), &cm).await.expect("create");
    }
}

fn names<K: Resource>(items: &[K]) -> Vec<String> {
    items
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.into());
    namespaces.create(&pp(), &ns).await.expect("namespace");
}

#[tokio::test]
async fn list_filters_by_labels_and_fields() {
    let (_sim, client) = start().await;
    create_namespace(&client, "other").await;
    labelled_configmaps(
        &client,
        "default",
        &[("a", "web"), ("b", "api"), ("c", "db")],
    )
    .await;
    labelled_configmaps(&client, "other", &[("a", "web")]).await;
    let here: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let list = |selector: &str| {
        let here = here.clone();
        let lp = ListParams::default().labels(selector);
        async move { names(&here.list(&lp).await.expect("list").items) }
    };
    assert_eq!(list("app=web").await, ["a"]);
    assert_eq!(list("app!=web").await, ["b", "c"]);
    assert_eq!(list("app in (web,db)").await, ["a", "c"]);
    assert_eq!(list("app notin (web,db)").await, ["b"]);
    assert_eq!(list("app").await, ["a", "b", "c"]);
    assert_eq!(list("!app").await, Vec::<String>::new());
    let by_name = here
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .expect("list");
    assert_eq!(names(&by_name.items), ["b"]);
    let everywhere: Api<ConfigMap> = Api::all(client.clone());
    let web = everywhere
        .list(
            &ListParams::default()
                .labels("app=web")
                .fields("metadata.namespace!=default"),
        )
        .await
        .expect("list");
    assert_eq!(web.items[0].namespace().as_deref(), Some("other"));
    assert_eq!(web.items.len(), 1);
    let bad = here.list(&ListParams::default().fields("data.x=1")).await;
    assert_status(&api_error(bad), 400, "BadRequest");
}

#[tokio::test]
async fn paginated_lists_are_consistent_snapshots() {
    let (sim, client) = start().await;
    labelled_configmaps(
        &client,
        "default",
        &[("a", "x"), ("b", "x"), ("c", "x"), ("d", "x"), ("e", "x")],
    )
    .await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let first = configmaps
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    assert_eq!(names(&first.items), ["a", "b"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    labelled_configmaps(&client, "default", &[("bb", "x")]).await;
    let token = first.metadata.continue_.clone().expect("continue token");
    let second = configmaps
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(
        names(&second.items),
        ["c", "d"],
        "the object created meanwhile is not in this list"
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let last_token = second.metadata.continue_.clone().expect("continue token");
    let third = configmaps
        .list(&ListParams::default().limit(2).continue_token(&last_token))
        .await
        .expect("page 3");
    assert_eq!(names(&third.items), ["e"]);
    assert_eq!(third.metadata.continue_, None);

    for _ in 0..300 {
        configmaps
            .list(&ListParams::default().limit(1))
            .await
            .expect("paged list");
    }
    let expired = configmaps
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await;
    assert_status(&api_error(expired), 410, "Expired");
    // kube-rs retries 504s by default; ask once.
    let mut once = kube::Config::new(sim.url().parse().expect("url"));
    once.default_retry = false;
    let once: Api<ConfigMap> = Api::default_namespaced(Client::try_from(once).expect("client"));
    let future = once
        .list(
            &ListParams::default()
                .at("999999")
                .matching(VersionMatch::NotOlderThan),
        )
        .await;
    assert_eq!(
        api_error(future).code,
        504,
        "a resourceVersion from the future"
    );
}

#[tokio::test]
async fn watch_streams_every_change_in_order() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let created = widgets
        .create(&pp(), &widget("w", "small"))
        .await
        .expect("create");
    let from = created.resource_version().expect("rv");
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "red"}})),
        )
        .await
        .expect("patch");
    widgets
        .delete("w", &DeleteParams::default())
        .await
        .expect("delete");

    let replay: Vec<String> = widgets
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch")
        .take(2)
        .map(|e| match e.expect("event") {
            WatchEvent::Modified(w) => format!("MODIFIED {}", w.spec.color.unwrap_or_default()),
            WatchEvent::Deleted(w) => format!("DELETED {}", w.name_any()),
            other => format!("{other:?}"),
        })
        .collect()
        .await;
    assert_eq!(
        replay,
        ["MODIFIED red", "DELETED w"],
        "resuming from a resourceVersion replays"
    );

    let mut from_now = widgets
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    widgets
        .create(&pp(), &widget("w2", "small"))
        .await
        .expect("create");
    match within("ADDED", from_now.next()).await {
        Some(Ok(WatchEvent::Added(w))) => assert_eq!(w.name_any(), "w2"),
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[tokio::test]
async fn a_compacted_resource_version_gets_410_gone() {
    let config = KubeSimConfig {
        store: StoreConfig {
            history: 3,
            ..StoreConfig::default()
        },
        ..KubeSimConfig::default()
    };
    let (_sim, client) = start_with(config).await;
    labelled_configmaps(
        &client,
        "default",
        &[("a", "x"), ("b", "x"), ("c", "x"), ("d", "x"), ("e", "x")],
    )
    .await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let mut stream = configmaps
        .watch(&WatchParams::default(), "2")
        .await
        .expect("watch")
        .boxed();
    match within("an error event", stream.next()).await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn watches_get_bookmarks_and_selector_exits() {
    let config = KubeSimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..KubeSimConfig::default()
    };
    let (_sim, client) = start_with(config).await;
    labelled_configmaps(&client, "default", &[("a", "web")]).await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let params = WatchParams::default().labels("app=web");
    assert!(params.bookmarks, "kube-rs asks for bookmarks by default");
    let mut stream = configmaps.watch(&params, "0").await.expect("watch").boxed();
    match within("ADDED", stream.next()).await {
        Some(Ok(WatchEvent::Added(cm))) => assert_eq!(cm.name_any(), "a"),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match within("a bookmark", stream.next()).await {
        Some(Ok(WatchEvent::Bookmark(b))) => assert!(!b.metadata.resource_version.is_empty()),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    configmaps
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "api"}}})),
        )
        .await
        .expect("relabel");
    let left = within("DELETED", async {
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                other => return other,
            }
        }
    })
    .await;
    match left {
        Some(Ok(WatchEvent::Deleted(cm))) => assert_eq!(cm.name_any(), "a"),
        other => panic!("an object leaving the selection is DELETED for that watch: {other:?}"),
    }
}

#[tokio::test]
async fn reflectors_mirror_the_server() {
    let (_sim, client) = start().await;
    labelled_configmaps(&client, "default", &[("a", "x"), ("b", "x")]).await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for config in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ] {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let mut events = reflector(writer, watcher(configmaps.clone(), config)).boxed();
        within("initial list", async {
            while reader.state().len() < 2 {
                events.try_next().await.expect("watcher ok");
            }
        })
        .await;
        labelled_configmaps(&client, "default", &[("c", "x")]).await;
        configmaps
            .delete("a", &DeleteParams::default())
            .await
            .expect("delete");
        within("the store to follow", async {
            loop {
                let mut seen: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
                seen.sort();
                if seen == ["b", "c"] {
                    break;
                }
                events.try_next().await.expect("watcher ok");
            }
        })
        .await;
        configmaps
            .delete("c", &DeleteParams::default())
            .await
            .expect("reset");
        labelled_configmaps(&client, "default", &[("a", "x")]).await;
    }
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

struct Ctx {
    api: Api<Widget>,
    cleaned: mpsc::UnboundedSender<String>,
}

const FINALIZER: &str = "example.com/cleanup";

async fn reconcile(
    widget: Arc<Widget>,
    ctx: Arc<Ctx>,
) -> Result<Action, kube::runtime::finalizer::Error<ReconcileError>> {
    finalizer(&ctx.api, FINALIZER, widget, |event| async {
        match event {
            Finalizer::Apply(w) => {
                let status =
                    json!({"status": {"ready": true, "observedGeneration": w.metadata.generation}});
                ctx.api
                    .patch_status(
                        &w.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(status),
                    )
                    .await?;
            }
            Finalizer::Cleanup(w) => {
                // The receiver lives for the whole test.
                let _ = ctx.cleaned.send(w.name_any());
            }
        }
        Ok::<_, ReconcileError>(Action::await_change())
    })
    .await
}

#[tokio::test]
async fn a_controller_with_a_finalizer_runs_to_completion() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let (cleaned, mut cleaned_rx) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        api: widgets.clone(),
        cleaned,
    });
    let controller = Controller::new(widgets.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_millis(100)),
            ctx,
        )
        .for_each(|_| async {});
    let running = tokio::spawn(controller);

    let created = widgets
        .create(&pp(), &widget("ctl", "small"))
        .await
        .expect("create");
    let ready = within(
        "the controller to mark it ready",
        await_condition(widgets.clone(), "ctl", |w: Option<&Widget>| {
            w.and_then(|w| w.status.as_ref()).and_then(|s| s.ready) == Some(true)
        }),
    )
    .await
    .expect("watch")
    .expect("object");
    assert_eq!(ready.finalizers(), [FINALIZER]);
    assert_eq!(ready.status.and_then(|s| s.observed_generation), Some(1));

    let deleting = widgets
        .delete("ctl", &DeleteParams::default())
        .await
        .expect("delete");
    let uid = created.uid().expect("uid");
    within(
        "the finalizer to finish",
        await_condition(widgets.clone(), "ctl", conditions::is_deleted(&uid)),
    )
    .await
    .expect("watch");
    assert!(
        deleting.is_left(),
        "a deletion held by a finalizer returns the object"
    );
    assert_eq!(cleaned_rx.recv().await.as_deref(), Some("ctl"));
    running.abort();
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let mut held = widget("f", "small");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = widgets.create(&pp(), &held).await.expect("create");
    let deleting = widgets
        .delete("f", &DeleteParams::default())
        .await
        .expect("delete")
        .left()
        .expect("the object comes back");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(
        widgets.get("f").await.expect("still there").finalizers(),
        ["example.com/hold"]
    );

    let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}});
    let refused = widgets
        .patch("f", &PatchParams::default(), &Patch::Merge(more))
        .await;
    let status = api_error(refused);
    assert_status(&status, 422, "Invalid");
    assert!(
        status.message.contains("no new finalizers"),
        "{}",
        status.message
    );

    let mut stream = widgets
        .watch(
            &WatchParams::default(),
            &deleting.resource_version().expect("rv"),
        )
        .await
        .expect("watch")
        .boxed();
    widgets
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    match within("DELETED", stream.next()).await {
        Some(Ok(WatchEvent::Deleted(w))) => assert_eq!(w.uid(), created.uid()),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert_status(&api_error(widgets.get("f").await), 404, "NotFound");
}

/// The generic registry's `markAsDeleting`: the DELETE that first sets
/// `deletionTimestamp` on an object held by finalizers bumps `generation` (objects that
/// have one), once; a dry run answers the marked object and stores nothing.
#[tokio::test]
async fn a_held_deletion_bumps_generation_once() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let mut held = widget("held", "small");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = widgets.create(&pp(), &held).await.expect("create");
    assert_eq!(created.metadata.generation, Some(1));

    let dry = widgets
        .delete("held", &DeleteParams::default().dry_run())
        .await
        .expect("dry-run delete")
        .left()
        .expect("the object comes back");
    assert_eq!(dry.metadata.generation, Some(2), "what it would store");
    assert!(dry.metadata.deletion_timestamp.is_some());
    assert_eq!(dry.metadata.deletion_grace_period_seconds, Some(0));
    let stored = widgets.get("held").await.expect("get");
    assert_eq!(
        (
            stored.metadata.generation,
            &stored.metadata.deletion_timestamp
        ),
        (Some(1), &None),
        "a dry run stores nothing"
    );
    assert_eq!(stored.resource_version(), created.resource_version());

    let deleting = widgets
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete")
        .left()
        .expect("the object comes back");
    assert_eq!(deleting.metadata.generation, Some(2));
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(0));
    let stamp = deleting
        .metadata
        .deletion_timestamp
        .clone()
        .expect("stamped");

    let again = widgets
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete again")
        .left()
        .expect("still held");
    assert_eq!(
        again.metadata.generation,
        Some(2),
        "only the first DELETE bumps"
    );
    assert_eq!(again.metadata.deletion_timestamp, Some(stamp));
    assert_eq!(
        again.resource_version(),
        deleting.resource_version(),
        "no write"
    );

    // A foreground deletion holds the object with its own finalizer: the same bump.
    widgets
        .create(&pp(), &widget("fg", "small"))
        .await
        .expect("create");
    let foreground = widgets
        .delete("fg", &DeleteParams::foreground())
        .await
        .expect("delete")
        .left()
        .expect("held by foregroundDeletion");
    assert_eq!(foreground.metadata.generation, Some(2));

    // Built-ins without a generation get none.
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("held".into());
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    configmaps.create(&pp(), &cm).await.expect("create");
    let deleting = configmaps
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete")
        .left()
        .expect("held");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.generation, None);
}

#[tokio::test]
async fn a_delete_that_removes_the_object_answers_a_status() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let created = widgets
        .create(&pp(), &widget("gone", "small"))
        .await
        .expect("create");
    // kube-rs reads an object here as "still deleting"; a real server answers a Status.
    let status = widgets
        .delete("gone", &DeleteParams::default())
        .await
        .expect("delete")
        .right()
        .expect("a Status, not the object");
    assert!(status.is_success(), "{status:?}");
    let details = status.details.expect("details");
    assert_eq!(
        (
            details.name.as_str(),
            details.kind.as_str(),
            details.uid.as_str()
        ),
        (
            "gone",
            "widgets",
            created.uid().unwrap_or_default().as_str()
        )
    );

    widgets
        .create(&pp(), &widget("guarded", "small"))
        .await
        .expect("create");
    let refused = widgets
        .delete(
            "guarded",
            &DeleteParams::default().preconditions(kube::api::Preconditions {
                uid: Some("not-this-one".into()),
                resource_version: None,
            }),
        )
        .await;
    let status = api_error(refused);
    assert_status(&status, 409, "Conflict");
    assert!(
        status.message.starts_with("Operation cannot be fulfilled on Widget.example.com \"guarded\": the UID in the precondition (not-this-one) does not match the UID in record"),
        "{}",
        status.message
    );
    assert_eq!(status.details.expect("details").kind, "Widget");
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let owner = widgets
        .create(&pp(), &widget("owner", "small"))
        .await
        .expect("owner");
    let dependent: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "dependent", "finalizers": ["example.com/hold"],
        "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner",
                             "uid": owner.uid(), "blockOwnerDeletion": true}]}}))
    .expect("configmap");
    configmaps
        .create(&pp(), &dependent)
        .await
        .expect("dependent");

    let deleting = widgets
        .delete("owner", &DeleteParams::foreground())
        .await
        .expect("delete")
        .left()
        .expect("the owner stays");
    assert_eq!(deleting.finalizers(), ["foregroundDeletion"]);
    // The collector deletes the dependent; its own finalizer holds it, and so the owner.
    let marked = within(
        "the dependent marked for deletion",
        await_condition(configmaps.clone(), "dependent", |cm: Option<&ConfigMap>| {
            cm.is_some_and(|cm| cm.metadata.deletion_timestamp.is_some())
        }),
    )
    .await
    .expect("watch");
    assert!(marked.is_some());
    assert!(widgets.get("owner").await.is_ok(), "the owner waits");

    configmaps
        .patch(
            "dependent",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the dependent");
    within(
        "the owner to go",
        await_condition(
            widgets.clone(),
            "owner",
            conditions::is_deleted(&owner.uid().unwrap_or_default()),
        ),
    )
    .await
    .expect("watch");
}

#[tokio::test]
async fn server_side_apply_tracks_owners_and_conflicts() {
    let (_sim, client) = start().await;
    let widgets: Api<Widget> = Api::default_namespaced(client);
    let config = |color: &str| json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": "small", "color": color}});
    widgets
        .patch(
            "shared",
            &PatchParams::apply("alice"),
            &Patch::Apply(config("red")),
        )
        .await
        .expect("alice applies");
    // The same values are shared, not a conflict.
    widgets
        .patch(
            "shared",
            &PatchParams::apply("bob"),
            &Patch::Apply(config("red")),
        )
        .await
        .expect("bob applies the same");
    let status = api_error(
        widgets
            .patch(
                "shared",
                &PatchParams::apply("carol"),
                &Patch::Apply(config("blue")),
            )
            .await,
    );
    assert_status(&status, 409, "Conflict");
    assert_eq!(
        status.message,
        "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.color\nconflicts with \"bob\":\n- .spec.color"
    );
    let causes = status.details.expect("details").causes;
    assert_eq!(causes[0].field, ".spec.color");
    assert_eq!(causes[0].reason, "FieldManagerConflict");

    let forced = widgets
        .patch(
            "shared",
            &PatchParams::apply("carol").force(),
            &Patch::Apply(config("blue")),
        )
        .await
        .expect("force takes the field");
    assert_eq!(forced.spec.color.as_deref(), Some("blue"));
    let owners = |w: &Widget| -> Vec<(String, Option<String>)> {
        w.metadata
            .managed_fields
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.manager.unwrap_or_default(), e.operation))
            .collect()
    };
    // alice and bob still share spec.size; only carol owns the color now.
    assert_eq!(owners(&forced).len(), 3);
    let updated = widgets
        .patch(
            "shared",
            &PatchParams {
                field_manager: Some("editor".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"size": "large"}})),
        )
        .await
        .expect("an update");
    assert!(
        owners(&updated).contains(&("editor".into(), Some("Update".into()))),
        "{:?}",
        owners(&updated)
    );
    let status = api_error(
        widgets
            .patch(
                "shared",
                &PatchParams::apply("alice"),
                &Patch::Apply(config("blue")),
            )
            .await,
    );
    assert!(
        status
            .message
            .contains("conflict with \"editor\" using example.com/v1 at "),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn delete_collection_and_preconditions() {
    let (_sim, client) = start().await;
    labelled_configmaps(
        &client,
        "default",
        &[("a", "web"), ("b", "web"), ("c", "db")],
    )
    .await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let deleted = configmaps
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=web"),
        )
        .await
        .expect("delete collection")
        .left()
        .expect("list of deleted objects");
    assert_eq!(names(&deleted.items), ["a", "b"]);
    assert_eq!(
        names(
            &configmaps
                .list(&ListParams::default())
                .await
                .expect("list")
                .items
        ),
        ["c"]
    );
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some("1".into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_status(
        &api_error(configmaps.delete("c", &wrong).await),
        409,
        "Conflict",
    );
}

#[tokio::test]
async fn namespaces_take_their_content_with_them() {
    let (_sim, client) = start().await;
    create_namespace(&client, "doomed").await;
    labelled_configmaps(&client, "doomed", &[("a", "x")]).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "doomed");
    let mut held = widget("held", "small");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    widgets.create(&pp(), &held).await.expect("create");

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let uid = namespaces
        .get("doomed")
        .await
        .expect("ns")
        .uid()
        .expect("uid");
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    let terminating = namespaces.get("doomed").await.expect("still there");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    assert!(
        configmaps
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert!(
        widgets
            .get("held")
            .await
            .expect("held")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let mut late = ConfigMap::default();
    late.metadata.name = Some("late".into());
    assert_status(
        &api_error(configmaps.create(&pp(), &late).await),
        403,
        "Forbidden",
    );

    widgets
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release");
    within(
        "the namespace to go",
        await_condition(namespaces.clone(), "doomed", conditions::is_deleted(&uid)),
    )
    .await
    .expect("watch");
    let in_missing = api_error(configmaps.create(&pp(), &late).await);
    assert_status(&in_missing, 404, "NotFound");
    assert_status(
        &api_error(namespaces.delete("default", &DeleteParams::default()).await),
        403,
        "Forbidden",
    );
}

fn capi(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind);
    Api::default_namespaced_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

#[tokio::test]
async fn dependents_are_garbage_collected_with_their_owner() {
    let (_sim, client) = start().await;
    let clusters = capi(&client, "Cluster", "clusters");
    let machines = capi(&client, "Machine", "machines");
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c"}, "spec": {}}))
    .expect("cluster");
    let cluster = clusters.create(&pp(), &cluster).await.expect("cluster");
    let owner = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "c",
                       "uid": cluster.uid(), "controller": true});
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m", "ownerReferences": [owner]}, "spec": {}}))
    .expect("machine");
    let machine = machines.create(&pp(), &machine).await.expect("machine");
    clusters
        .delete("c", &DeleteParams::default())
        .await
        .expect("delete");
    let uid = machine.uid().expect("uid");
    within(
        "the machine to be collected",
        await_condition(machines.clone(), "m", conditions::is_deleted(&uid)),
    )
    .await
    .expect("watch");
}

#[tokio::test]
async fn scope_is_enforced_by_path() {
    let (_sim, client) = start().await;
    let ns_gvk = GroupVersionKind::gvk("", "v1", "Namespace");
    let namespaced_namespaces: Api<DynamicObject> = Api::default_namespaced_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&ns_gvk, "namespaces"),
    );
    assert_status(
        &api_error(namespaced_namespaces.get("default").await),
        404,
        "NotFound",
    );
    let widget_gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    let cluster_widgets: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&widget_gvk, "widgets"),
    );
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}, "spec": {"size": "small"}}))
    .expect("object");
    assert_status(
        &api_error(cluster_widgets.create(&pp(), &body).await),
        405,
        "MethodNotAllowed",
    );
    assert_status(&api_error(cluster_widgets.get("x").await), 404, "NotFound");
}

#[tokio::test]
async fn fifty_writers_never_lose_an_update_and_twenty_watchers_agree() {
    const WRITERS: usize = 50;
    const WATCHERS: usize = 20;
    let (_sim, client) = start().await;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let mut counter = ConfigMap::default();
    counter.metadata.name = Some("counter".into());
    counter.data = Some([("n".to_owned(), "0".to_owned())].into());
    let created = configmaps.create(&pp(), &counter).await.expect("create");
    let from = created.resource_version().expect("rv");

    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let stream = configmaps
            .watch(&WatchParams::default(), &from)
            .await
            .expect("watch");
        watchers.push(tokio::spawn(async move {
            stream
                .take(WRITERS)
                .map(|e| match e.expect("event") {
                    WatchEvent::Modified(cm) => {
                        let n = cm.data.as_ref().map(|d| d["n"].clone()).unwrap_or_default();
                        (rv(&cm), n)
                    }
                    other => panic!("unexpected {other:?}"),
                })
                .collect::<Vec<_>>()
                .await
        }));
    }

    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        let configmaps = configmaps.clone();
        writers.push(tokio::spawn(async move {
            let mut conflicts = 0;
            loop {
                let mut cm = configmaps.get("counter").await.expect("get");
                let data = cm.data.get_or_insert_default();
                let n: u64 = data["n"].parse().expect("number");
                data.insert("n".into(), (n + 1).to_string());
                match configmaps.replace("counter", &pp(), &cm).await {
                    Ok(_) => return conflicts,
                    Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
        }));
    }
    let mut conflicts = 0;
    for w in writers {
        conflicts += within("writers", w).await.expect("writer");
    }
    let last = configmaps.get("counter").await.expect("get");
    assert_eq!(
        last.data.unwrap_or_default()["n"],
        WRITERS.to_string(),
        "no lost update"
    );
    eprintln!("{WRITERS} writers met {conflicts} conflicts");

    let expected: Vec<String> = (1..=WRITERS).map(|n| n.to_string()).collect();
    let mut first: Option<Vec<(u64, String)>> = None;
    for w in watchers {
        let seen = within("watchers", w).await.expect("watcher");
        let values: Vec<String> = seen.iter().map(|(_, n)| n.clone()).collect();
        assert_eq!(values, expected, "every update, in order");
        assert!(
            seen.windows(2).all(|p| p[0].0 < p[1].0),
            "resourceVersions increase"
        );
        match &first {
            None => first = Some(seen),
            Some(f) => assert_eq!(&seen, f, "every watcher sees the same stream"),
        }
    }
}

#[tokio::test]
async fn a_secrets_string_data_is_folded_into_data_and_never_stored() {
    let (_sim, client) = start().await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "default");
    let secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cloud-config"},
        "data": {"cacert": "UEVN", "clouds.yaml": "b2xk"},
        "stringData": {"clouds.yaml": "clouds: {}"},
    }))
    .unwrap();
    let created = secrets.create(&pp(), &secret).await.unwrap();
    let data = created.data.unwrap_or_default();
    assert_eq!(
        data["clouds.yaml"].0, b"clouds: {}",
        "stringData wins over data"
    );
    assert_eq!(data["cacert"].0, b"PEM");
    assert!(created.string_data.is_none());
    let patch = json!({"stringData": {"extra": "x"}});
    let patched = secrets
        .patch(
            "cloud-config",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap_or_default()["extra"].0, b"x");
    assert!(patched.string_data.is_none());
}
