//! A management cluster as CAPO 0.14 leaves it, for the takeover scenario
//! (`real_provider::takeover_from_capo`): CAPO 0.14's CRDs (v1beta1 alone, stored), and the
//! objects of a running cluster stored as v1beta1 with CAPO's finalizers, its v1beta1 status
//! and its conditions (severity, no reason on True), next to Cluster API's own objects.
//!
//! The cloud side is the cluster a provider built under CAPO's names and tags (capo-rs names
//! every resource as CAPO does: `docs/migrating-from-capo.md`); the Kubernetes side is
//! rewritten here as CAPO 0.14 would have stored it, then created in a fresh API server
//! through the v1beta1 API, so it is stored as v1beta1.

use std::collections::BTreeMap;

use capo_api::conversion::{self, DATA_ANNOTATION, SPOKE};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::conversion::v1beta1_only;

/// CAPO 0.14's CRDs: its own files when the reference material is there, else ours cut
/// down to v1beta1 (the same schema, field for field: the parity test holds it to CAPO's).
pub fn capo_crds() -> Vec<Value> {
    if let Some(dir) = crate::common::shared_reference(
        "capo/v0.14.7/crds",
        "CAPO 0.14's CRD files (ours cut down to v1beta1 stand in)",
    ) {
        return crate::common::yaml_files(&dir)
            .iter()
            .flat_map(|f| {
                crate::common::yaml_documents(&std::fs::read_to_string(f).expect("CRD file"))
            })
            .collect();
    }
    capo_api::crds::all()
        .into_iter()
        .map(|crd| {
            with_capi_v1beta1_conditions(v1beta1_only(&serde_json::to_value(crd).expect("CRD")))
        })
        .collect()
}

/// CAPO 0.14 keeps Cluster API v1beta1 conditions on every kind, OpenStackServer (v1alpha1)
/// too: a True condition needs no reason or message. Ours (metav1 conditions) would refuse
/// the statuses CAPO wrote.
fn with_capi_v1beta1_conditions(mut crd: Value) -> Value {
    if let Some(Value::Array(versions)) = crd.pointer_mut("/spec/versions") {
        for version in versions {
            let items = version.pointer_mut(
                "/schema/openAPIV3Schema/properties/status/properties/conditions/items",
            );
            if let Some(Value::Object(items)) = items {
                items.insert(
                    "required".into(),
                    json!(["lastTransitionTime", "status", "type"]),
                );
            }
        }
    }
    crd
}

/// The kinds copied, owners before what they own, with the version CAPO 0.14's world
/// serves them in.
const KINDS: [(&str, &str, &str, &str); 8] = [
    ("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
    (
        "infrastructure.cluster.x-k8s.io",
        SPOKE,
        "OpenStackCluster",
        "openstackclusters",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        SPOKE,
        "OpenStackClusterTemplate",
        "openstackclustertemplates",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        SPOKE,
        "OpenStackMachineTemplate",
        "openstackmachinetemplates",
    ),
    ("cluster.x-k8s.io", "v1beta2", "Machine", "machines"),
    ("", "v1", "Secret", "secrets"),
    (
        "infrastructure.cluster.x-k8s.io",
        SPOKE,
        "OpenStackMachine",
        "openstackmachines",
    ),
    (
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "OpenStackServer",
        "openstackservers",
    ),
];

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Every object of the copied kinds in `namespace`, as JSON (infrastructure kinds in v1beta2
/// where they have it: what capo-rs stored).
pub async fn snapshot(client: &Client, namespace: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for (group, version, kind, plural) in KINDS {
        let version = if version == SPOKE {
            conversion::HUB
        } else {
            version
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            namespace,
            &resource(group, version, kind, plural),
        );
        for object in api.list(&ListParams::default()).await.expect("list").items {
            let mut object = serde_json::to_value(object).expect("JSON");
            object["apiVersion"] = json!(if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            });
            object["kind"] = json!(kind);
            objects.push(object);
        }
    }
    objects
}

/// Conditions as CAPO 0.14 writes them (Cluster API v1beta1: True without a reason).
fn capo_conditions(types: &[&str], at: &str) -> Value {
    Value::Array(
        types
            .iter()
            .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": at}))
            .collect(),
    )
}

/// Status fields CAPO 0.14 has no place for (capo-rs's additions).
fn drop_ours(status: &mut Value) {
    for path in [
        "/apiServerLoadBalancer",
        "/bastion/resources",
        "/resources",
        "",
    ] {
        if let Some(Value::Object(map)) = status.pointer_mut(path) {
            for extra in [
                "members",
                "membersAsOf",
                "pools",
                "volumes",
                "observedGeneration",
                "failureDomain",
            ] {
                map.remove(extra);
            }
        }
    }
}

/// One of capo-rs's objects (v1beta2) as CAPO 0.14 stores it (v1beta1), or a Cluster API
/// object as it is.
pub fn as_capo_left_it(object: &Value) -> Value {
    let kind = object["kind"].as_str().unwrap_or_default();
    let mut out = if conversion::CONVERTIBLE_KINDS.contains(&kind) {
        conversion::convert(object, &format!("{}/{SPOKE}", capo_api::GROUP)).expect("converts")
    } else {
        object.clone()
    };
    if let Some(Value::Object(annotations)) = out.pointer_mut("/metadata/annotations") {
        annotations.remove(DATA_ANNOTATION);
    }
    let at = "2026-11-20T08:00:00Z";
    let conditions: &[&str] = match kind {
        "OpenStackCluster" => &[
            "Ready",
            "NetworkReady",
            "RouterReady",
            "SecurityGroupsReady",
            "APIEndpointReady",
        ],
        "OpenStackMachine"
            if object["metadata"]["labels"]
                .get("cluster.x-k8s.io/control-plane")
                .is_some() =>
        {
            &["Ready", "InstanceReady", "APIServerIngressReadyCondition"]
        }
        "OpenStackMachine" => &["Ready", "InstanceReady"],
        "OpenStackServer" => &["Ready", "InstanceReady"],
        _ => &[],
    };
    if let Some(status) = out.get_mut("status").filter(|s| s.is_object()) {
        drop_ours(status);
        if !conditions.is_empty() {
            status["conditions"] = capo_conditions(conditions, at);
        }
        if kind == "OpenStackServer" {
            let provisioned = status
                .pointer("/initialization/provisioned")
                .cloned()
                .unwrap_or(json!(false));
            if let Some(map) = status.as_object_mut() {
                map.remove("initialization");
            }
            status["ready"] = provisioned;
        }
    }
    out
}

/// Creates `objects` (owners first) through the API in `namespace`, their owner references
/// pointing at the new owners, then writes their status.
pub async fn recreate(client: &Client, namespace: &str, objects: &[Value]) {
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    for (group, version, kind, plural) in KINDS {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            namespace,
            &resource(group, version, kind, plural),
        );
        for object in objects.iter().filter(|o| o["kind"] == kind) {
            let mut fresh = object.clone();
            let old_uid = object["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let metadata = fresh["metadata"].as_object_mut().expect("metadata");
            metadata.insert("namespace".into(), json!(namespace));
            for system in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                metadata.remove(system);
            }
            if let Some(Value::Array(owners)) = metadata.get_mut("ownerReferences") {
                for owner in owners.iter_mut() {
                    let uid = owner["uid"].as_str().unwrap_or_default();
                    owner["uid"] = json!(uids.get(uid).cloned().unwrap_or_default());
                }
            }
            let status = fresh.as_object_mut().and_then(|o| o.remove("status"));
            let name = fresh["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let created = api
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(fresh).expect("object"),
                )
                .await
                .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
            uids.insert(old_uid, created.metadata.uid.clone().unwrap_or_default());
            if let Some(status) = status.filter(|_| kind != "Secret") {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
                .unwrap_or_else(|e| panic!("{kind} {name} status: {e}"));
            }
        }
    }
}

/// The cloud as CAPO leaves it: capo-rs's owner marks taken off everything the first phase
/// made for the cluster (every name holds `cluster`; CAPO marks nothing), so that the takeover
/// can reach it only through the IDs the status recorded. Volumes carry none here (no machine
/// of the scenario has one). Other scenarios' resources on the same cloud are left alone.
pub(crate) async fn strip_owner_marks(tenant: &capo_provider::cloud::CloudClient, cluster: &str) {
    use capo_provider::cloud::Service;
    use capo_provider::cloud::neutron::Filter;
    let prefix = format!("{}-", capo_provider::cloud::OWNER_KEY);
    let unmarked = |name: &str, tags: &[String]| -> Option<Vec<String>> {
        let kept: Vec<String> = tags
            .iter()
            .filter(|t| !t.starts_with(&prefix))
            .cloned()
            .collect();
        (name.contains(cluster) && kept.len() < tags.len()).then_some(kept)
    };
    let neutron = tenant.neutron();
    let any = Filter::default();
    let mut neutron_marked: Vec<(&'static str, String, Vec<String>)> = Vec::new();
    for n in neutron.list_networks(&any).await.expect("networks") {
        neutron_marked.extend(unmarked(&n.name, &n.tags).map(|t| ("networks", n.id, t)));
    }
    for r in neutron.list_routers(&any).await.expect("routers") {
        neutron_marked.extend(unmarked(&r.name, &r.tags).map(|t| ("routers", r.id, t)));
    }
    for p in neutron.list_ports(&any).await.expect("ports") {
        neutron_marked.extend(unmarked(&p.name, &p.tags).map(|t| ("ports", p.id, t)));
    }
    for g in neutron.list_security_groups(&any).await.expect("groups") {
        neutron_marked.extend(unmarked(&g.name, &g.tags).map(|t| ("security-groups", g.id, t)));
    }
    assert!(
        !neutron_marked.is_empty(),
        "the first phase marked what it made"
    );
    for (collection, id, tags) in neutron_marked {
        neutron
            .set_tags(collection, &id, &tags)
            .await
            .expect("Neutron takes the tags off");
    }
    let servers = raw(tenant, Service::Compute, "GET", "servers/detail", None).await;
    for server in servers["servers"].as_array().into_iter().flatten() {
        let tags: Vec<String> = serde_json::from_value(server["tags"].clone()).unwrap_or_default();
        let name = server["name"].as_str().unwrap_or_default();
        if let Some(kept) = unmarked(name, &tags) {
            let path = format!("servers/{}/tags", server["id"].as_str().expect("an id"));
            raw(
                tenant,
                Service::Compute,
                "PUT",
                &path,
                Some(json!({"tags": kept})),
            )
            .await;
        }
    }
    let lbs = raw(
        tenant,
        Service::LoadBalancer,
        "GET",
        "lbaas/loadbalancers",
        None,
    )
    .await;
    for lb in lbs["loadbalancers"].as_array().into_iter().flatten() {
        let tags: Vec<String> = serde_json::from_value(lb["tags"].clone()).unwrap_or_default();
        let name = lb["name"].as_str().unwrap_or_default();
        if let Some(kept) = unmarked(name, &tags) {
            let path = format!("lbaas/loadbalancers/{}", lb["id"].as_str().expect("an id"));
            let body = json!({"loadbalancer": {"tags": kept}});
            raw(tenant, Service::LoadBalancer, "PUT", &path, Some(body)).await;
        }
    }
    let volumes = raw(tenant, Service::BlockStorage, "GET", "volumes/detail", None).await;
    for volume in volumes["volumes"].as_array().into_iter().flatten() {
        assert!(
            volume["metadata"]
                .get(capo_provider::cloud::OWNER_KEY)
                .is_none(),
            "a marked volume the scenario does not expect: {volume}"
        );
    }
}

/// One request outside the typed client, answered 2xx: its JSON body (null when empty).
async fn raw(
    client: &capo_provider::cloud::CloudClient,
    service: capo_provider::cloud::Service,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Value {
    let session = client.path().session();
    let base = session.service_url(service).await.expect("a URL");
    let url = base.join(path).expect("URL");
    let mut request = http::Request::builder().method(method).uri(url.as_str());
    if service == capo_provider::cloud::Service::Compute {
        request = request
            .header("openstack-api-version", "compute 2.53")
            .header("x-openstack-nova-api-version", "2.53");
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let body = body.map(|b| serde_json::to_vec(&b).expect("JSON"));
    let request = request.body(body.unwrap_or_default()).expect("request");
    let response = session.send(request).await.expect("an answer");
    let status = response.status();
    let text = String::from_utf8_lossy(response.body()).into_owned();
    assert!(status.is_success(), "{method} {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}
