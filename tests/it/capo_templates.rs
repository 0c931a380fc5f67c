//! CAPO's own cluster templates, as a user applies them with clusterctl, reach provisioned,
//! and their control-plane machine is released: on the simulator and on the real OpenStack
//! tier. The templates are read from `../shared/capo/templates/` (skipped with a notice when
//! absent), and the copy the demo keeps and capo-rs's own flavors (`deploy/clusterctl/`) are
//! checked as well.

use std::collections::BTreeMap;
use std::path::PathBuf;

use capo_api::{OpenStackCluster, OpenStackMachineTemplate};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject};
use serde_json::{Value, json};

use crate::real_cloud::{PASSWORD_CLOUD, REAL, census, fault, real_cloud};
use crate::real_provider::{
    E2e, FLAVOR, IMAGE, KEY_PAIR, SECRET, actor, assert_nothing_left, both, create_capi_cluster,
    create_ours, delete_cluster, on_real, on_sim, plane, unique_cluster_name, wait_provisioned,
};
use crate::waits::waited;

/// The templates a cluster is made from (the image templates make ORC images, not clusters;
/// the topology template needs a ClusterClass CAPO ships elsewhere).
fn capo_templates() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/capo/templates");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "NOTICE: {} is absent: CAPO's templates are not tried",
            dir.display()
        );
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("cluster-template")
            && name != "cluster-template-topology.yaml"
            && let Ok(text) = std::fs::read_to_string(entry.path())
        {
            found.push((name, text));
        }
    }
    found.sort();
    found
}

/// capo-rs's own flavors (`deploy/clusterctl/`, [flavors](../../docs/flavors.md)).
fn our_flavors() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/clusterctl");
    let mut found: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("deploy/clusterctl")
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(entry.path()).ok()?;
            // The topology flavor's objects are made by Cluster API's topology controller:
            // `cluster_class.rs` builds it.
            (name.starts_with("cluster-template") && !name.contains("topology"))
                .then(|| (format!("deploy/clusterctl/{name}"), text))
        })
        .collect();
    found.sort();
    assert!(!found.is_empty(), "deploy/clusterctl/ has its flavors");
    found
}

fn variables(e2e: &E2e, cluster: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("CLUSTER_NAME", cluster.to_owned()),
        ("NAMESPACE", e2e.ns().to_owned()),
        ("OPENSTACK_CLOUD", e2e.cloud_name.to_owned()),
        ("OPENSTACK_CLOUD_YAML_B64", String::new()),
        ("OPENSTACK_CLOUD_CACERT_B64", String::new()),
        ("OPENSTACK_CLOUD_YAML", "\"\"".to_owned()),
        (
            "OPENSTACK_EXTERNAL_NETWORK_ID",
            e2e.external_network.clone(),
        ),
        ("OPENSTACK_DNS_NAMESERVERS", "192.0.2.53".to_owned()),
        ("OPENSTACK_CONTROL_PLANE_MACHINE_FLAVOR", FLAVOR.to_owned()),
        ("OPENSTACK_NODE_MACHINE_FLAVOR", FLAVOR.to_owned()),
        ("OPENSTACK_IMAGE_NAME", IMAGE.to_owned()),
        ("OPENSTACK_IMAGE_NAME_UPGRADE_FROM", IMAGE.to_owned()),
        ("OPENSTACK_FLATCAR_IMAGE_NAME", IMAGE.to_owned()),
        ("FLATCAR_IMAGE_NAME", IMAGE.to_owned()),
        ("OPENSTACK_SSH_KEY_NAME", KEY_PAIR.to_owned()),
        ("OPENSTACK_FAILURE_DOMAIN", "nova".to_owned()),
        ("KUBERNETES_VERSION", "v1.33.4".to_owned()),
        ("CONTROL_PLANE_MACHINE_COUNT", "1".to_owned()),
        ("WORKER_MACHINE_COUNT", "0".to_owned()),
        ("COREOS_OPENSTACK_HOSTNAME", "host".to_owned()),
        ("COREOS_OPENSTACK_INSTANCE_UUID", "uuid".to_owned()),
    ])
}

fn api_for(e2e: &E2e, object: &Value) -> Api<DynamicObject> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let version = object["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or_default();
    Api::namespaced_with(
        e2e.client.clone(),
        e2e.ns(),
        &crate::conversion::resource(kind, version),
    )
}

/// One template: its OpenStackCluster (as written, in its own API version) to provisioned,
/// then a control-plane machine from its control-plane OpenStackMachineTemplate, released.
async fn one_template(e2e: &E2e, file: &str, text: &str) {
    let name = unique_cluster_name("tmpl");
    let filled = capo_demo::template::substitute(text, &variables(e2e, &name))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let objects = capo_demo::template::objects(&filled).unwrap_or_else(|e| panic!("{file}: {e}"));
    let find = |kind: &str, name_is: &dyn Fn(&str) -> bool| -> Value {
        objects
            .iter()
            .find(|o| {
                o["kind"] == kind && name_is(o["metadata"]["name"].as_str().unwrap_or_default())
            })
            .cloned()
            .unwrap_or_else(|| panic!("{file}: no {kind}"))
    };
    let mut infra = find("OpenStackCluster", &|_| true);
    infra["metadata"]["namespace"] = json!(e2e.ns());
    infra["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": name});
    // The credentials the tests hold, in place of the template's Secret.
    infra["spec"]["identityRef"]["name"] = json!(SECRET);
    // The demo's copy names no external network, as the simulator has one; the real tier has
    // two, where CAPO (and capo-rs) refuse to guess, so a user names it.
    if infra["spec"].get("externalNetwork").is_none() && e2e.sim.is_none() {
        infra["spec"]["externalNetwork"] = json!({"id": e2e.external_network});
    }
    let control_plane = format!("{name}-control-plane");
    let mut template = find("OpenStackMachineTemplate", &|n| n == control_plane);
    template["metadata"]["namespace"] = json!(e2e.ns());

    create_capi_cluster(e2e, &name, &name).await;
    for object in [&infra, &template] {
        let created: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
        create_ours(&api_for(e2e, object), &created)
            .await
            .unwrap_or_else(|e| panic!("{file}: {} refused: {e}", object["kind"]));
    }
    let cluster: OpenStackCluster = wait_provisioned(e2e, &name).await;
    let templates: Api<OpenStackMachineTemplate> = e2e.kube.api();
    let stored = templates
        .get(&control_plane)
        .await
        .expect("the template, as v1beta2");
    let actor = actor(e2e);
    let mut plane = plane(&name, 1);
    plane.template = stored.spec.template.spec.clone();
    let released = format!("{name}'s control-plane machine released");
    if let Err(e) = waited(released, actor.scale_control_plane(&plane)).await {
        let why = machines_story(e2e, &name).await;
        panic!("{file}: the control-plane machine was never released: {e}; {why}");
    }
    eprintln!(
        "FIGURES e2e {} {file}: provisioned, endpoint {:?}, control-plane machine released",
        e2e.label,
        cluster.spec.control_plane_endpoint.and_then(|e| e.host),
    );
    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    templates
        .delete(&control_plane, &DeleteParams::default())
        .await
        .expect("template deleted");
}

/// One line per OpenStackMachine and OpenStackServer of `cluster`: what it says that is not
/// yet true (a failed scenario has a few hundred characters to say why).
async fn machines_story(e2e: &E2e, cluster: &str) -> String {
    let selector = format!("{}={cluster}", capo_api::capi::labels::CLUSTER_NAME);
    let params = kube::api::ListParams::default().labels(&selector);
    let mut lines = Vec::new();
    let machines = e2e.machines().list(&params).await.map(|l| l.items);
    for machine in machines.unwrap_or_default() {
        lines.push(status_story("OpenStackMachine", &machine));
    }
    let servers = e2e.servers().list(&params).await.map(|l| l.items);
    for server in servers.unwrap_or_default() {
        lines.push(status_story("OpenStackServer", &server));
    }
    if lines.is_empty() {
        lines.push(format!(
            "no OpenStackMachine or OpenStackServer labelled {selector}"
        ));
    }
    lines.join("; ")
}

/// An object's name, instance state, and each condition not True with its reason and message.
fn status_story<K: kube::Resource + serde::Serialize>(kind: &str, object: &K) -> String {
    let value = serde_json::to_value(object).unwrap_or_default();
    let status = &value["status"];
    let mut said = vec![format!(
        "{kind} {} state {}",
        object.meta().name.as_deref().unwrap_or("?"),
        status["instanceState"].as_str().unwrap_or("-")
    )];
    for condition in status["conditions"].as_array().into_iter().flatten() {
        if condition["status"] != "True" {
            said.push(format!(
                "{}={} {}: {}",
                condition["type"].as_str().unwrap_or("?"),
                condition["status"].as_str().unwrap_or("?"),
                condition["reason"].as_str().unwrap_or(""),
                condition["message"].as_str().unwrap_or("")
            ));
        }
    }
    said.join(", ")
}

/// What capo-rs reads of a template: its OpenStackCluster and control-plane
/// OpenStackMachineTemplate (version and spec), filled in for one fixed cluster name. Two
/// templates alike in these are alike to capo-rs, whatever their bootstrap objects hold (the
/// flatcar flavors differ from the default in those alone).
fn infrastructure(e2e: &E2e, file: &str, text: &str) -> Value {
    let filled = capo_demo::template::substitute(text, &variables(e2e, "probe"))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let objects = capo_demo::template::objects(&filled).unwrap_or_else(|e| panic!("{file}: {e}"));
    let read = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && (name.is_empty() || o["metadata"]["name"] == name))
            .map(|o| json!([o["apiVersion"], o["spec"]]))
            .unwrap_or_else(|| panic!("{file}: no {kind} {name}"))
    };
    json!([
        read("OpenStackCluster", ""),
        read("OpenStackMachineTemplate", "probe-control-plane")
    ])
}

async fn every_capo_template(e2e: &mut E2e) {
    let before = census(&e2e.tenant).await;
    // CAPO 0.14's template is in v1beta1: it converts through capo-rs's webhook.
    let _webhook = e2e.serve_webhook().await;
    let mut templates = capo_templates();
    templates.push((
        "capo-demo/src/cluster-template.yaml (the demo's copy)".to_owned(),
        capo_demo::template::CLUSTER_TEMPLATE.to_owned(),
    ));
    templates.extend(our_flavors());
    let mut distinct: Vec<(Value, &str, &str)> = Vec::new();
    for (file, text) in &templates {
        let read = infrastructure(e2e, file, text);
        if let Some((_, like, _)) = distinct.iter().find(|(seen, ..)| *seen == read) {
            eprintln!(
                "{}: {file} gives capo-rs the same OpenStackCluster and control-plane template as {like}, built beside it",
                e2e.label
            );
            continue;
        }
        distinct.push((read, file, text));
    }
    // Three at a time, as a management cluster holds many: one after the other, the seven ran
    // past the scenario's 15 minutes in CI, on a real cloud the other lanes were using too.
    let e2e = &*e2e;
    futures::stream::iter(distinct.iter())
        .map(|(_, file, text)| one_template(e2e, file, text))
        .buffer_unordered(3)
        .collect::<Vec<()>>()
        .await;
    assert_nothing_left(e2e, &before).await;
}

both!(
    every_capo_template,
    PASSWORD_CLOUD,
    false,
    real_every_capo_cluster_template_reaches_provisioned_and_releases_its_control_plane,
    sim_every_capo_cluster_template_reaches_provisioned_and_releases_its_control_plane
);
