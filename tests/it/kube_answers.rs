//! The simulated API server held to the real one. One script of requests, of every kind the
//! provider and the Cluster API actor send (create, get, list with pages, watch with its initial
//! events and bookmark, a watch from an expired resourceVersion, merge, JSON and server-side
//! apply patches, the status subresource, 404, 409 for a name taken, a stale write and an apply
//! conflict, 422 from the schema and from a CEL rule, finalizers and deletionTimestamp), is sent
//! to the real kube-apiserver of `tests/kube/` and its answers recorded in
//! `tests/fixtures/kube/answers.json` (`CAPO_RECORD_KUBE_ANSWERS=1`). The simulator answers the
//! same script and is compared with the recording; the real server is too, whenever the tier
//! runs, so a recording gone stale fails. Answers are compared after the fields that differ on
//! every run (uids, resourceVersions, times, continue tokens, the namespace) are masked.

use std::collections::BTreeMap;
use std::time::Duration;

use capo_sim::kube::{KubeSim, KubeSimConfig};
use serde_json::{Value, json};

use crate::kube_world::{KubeWorld, real_kube};

const FIXTURE: &str = "tests/fixtures/kube/answers.json";
const GROUP: &str = "capo-rs.test";
const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

/// Differences between the simulator and the recording that stay, with the reason.
const KNOWN: &[(&str, &str)] = &[];

/// The test kind: a status subresource, a default, a bounded list and a CEL rule.
fn gadget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("gadgets.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object",
                        "x-kubernetes-validations": [{"rule": "self.size <= 10", "message": "size must be at most 10"}],
                        "properties": {
                            "size": {"type": "integer", "default": 1},
                            "tags": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 16}}}},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "observedGeneration": {"type": "integer", "format": "int64"}}}}}}}]}
    })
}

/// One request of the script; `{ns}` in the path stands for the namespace.
struct Step {
    name: &'static str,
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Option<Value>,
}

fn step(
    name: &'static str,
    method: &'static str,
    path: &str,
    content_type: &'static str,
    body: Option<Value>,
) -> Step {
    Step {
        name,
        method,
        path: path.to_owned(),
        content_type,
        body,
    }
}

fn gadget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Gadget", "metadata": {"name": name}, "spec": spec})
}

/// The script. Steps that need a resourceVersion read it from an earlier answer (`{rv:a}`:
/// the resourceVersion the last answer about `a` carried).
fn script() -> Vec<Step> {
    let gadgets = format!("/apis/{GROUP}/v1/namespaces/{{ns}}/gadgets");
    let one = |name: &str| format!("{gadgets}/{name}");
    vec![
        step(
            "create",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("a", json!({"tags": ["x"]}))),
        ),
        step(
            "create a second",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("b", json!({"size": 3}))),
        ),
        step(
            "create, name taken",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("a", json!({}))),
        ),
        step(
            "create, schema type wrong",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("c", json!({"size": "big"}))),
        ),
        step(
            "create, list too long",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("c", json!({"tags": ["1", "2", "3", "4", "5"]}))),
        ),
        step(
            "create, CEL rule broken",
            "POST",
            &gadgets,
            JSON,
            Some(gadget("c", json!({"size": 11}))),
        ),
        step("get", "GET", &one("a"), JSON, None),
        step("get, missing", "GET", &one("missing"), JSON, None),
        step("list", "GET", &gadgets, JSON, None),
        step(
            "list, a page of one",
            "GET",
            &format!("{gadgets}?limit=1"),
            JSON,
            None,
        ),
        step(
            "list, selector matching none",
            "GET",
            &format!("{gadgets}?labelSelector=app%3Dnone"),
            JSON,
            None,
        ),
        step(
            "merge patch",
            "PATCH",
            &one("a"),
            MERGE,
            Some(json!({"metadata": {"labels": {"app": "x"}}, "spec": {"size": 2}})),
        ),
        step(
            "merge patch, CEL rule broken",
            "PATCH",
            &one("a"),
            MERGE,
            Some(json!({"spec": {"size": 12}})),
        ),
        step(
            "JSON patch",
            "PATCH",
            &one("a"),
            JSON_PATCH,
            Some(json!([{"op": "add", "path": "/spec/tags/-", "value": "y"}])),
        ),
        step(
            "JSON patch, test fails",
            "PATCH",
            &one("a"),
            JSON_PATCH,
            Some(
                json!([{"op": "test", "path": "/spec/size", "value": 7}, {"op": "replace", "path": "/spec/size", "value": 8}]),
            ),
        ),
        step(
            "JSON patch, missing",
            "PATCH",
            &one("missing"),
            JSON_PATCH,
            Some(json!([{"op": "add", "path": "/spec/size", "value": 1}])),
        ),
        step(
            "apply",
            "PATCH",
            &format!("{}?fieldManager=one", one("d")),
            APPLY,
            Some(gadget("d", json!({"size": 4}))),
        ),
        step(
            "apply, another manager's field",
            "PATCH",
            &format!("{}?fieldManager=two", one("d")),
            APPLY,
            Some(gadget("d", json!({"size": 5}))),
        ),
        step(
            "apply, forced",
            "PATCH",
            &format!("{}?fieldManager=two&force=true", one("d")),
            APPLY,
            Some(gadget("d", json!({"size": 5}))),
        ),
        step(
            "status patch",
            "PATCH",
            &format!("{}/status", one("a")),
            MERGE,
            Some(json!({"status": {"phase": "Ready", "observedGeneration": 2}})),
        ),
        step(
            "status patch changes no spec",
            "PATCH",
            &format!("{}/status", one("a")),
            MERGE,
            Some(json!({"spec": {"size": 9}})),
        ),
        step(
            "replace, stale resourceVersion",
            "PUT",
            &one("b"),
            JSON,
            Some(
                json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Gadget", "metadata": {"name": "b", "resourceVersion": "1"}, "spec": {"size": 4}}),
            ),
        ),
        step(
            "finalizer added",
            "PATCH",
            &one("b"),
            MERGE,
            Some(json!({"metadata": {"finalizers": ["capo-rs.test/hold"]}})),
        ),
        step(
            "delete, held by a finalizer",
            "DELETE",
            &one("b"),
            JSON,
            None,
        ),
        step("get, deleting", "GET", &one("b"), JSON, None),
        step(
            "finalizer added while deleting",
            "PATCH",
            &one("b"),
            MERGE,
            Some(json!({"metadata": {"finalizers": ["capo-rs.test/hold", "capo-rs.test/late"]}})),
        ),
        step(
            "finalizer removed",
            "PATCH",
            &one("b"),
            MERGE,
            Some(json!({"metadata": {"finalizers": null}})),
        ),
        step("get, gone", "GET", &one("b"), JSON, None),
        step("delete", "DELETE", &one("d"), JSON, None),
        step("delete, missing", "DELETE", &one("missing"), JSON, None),
        step(
            "watch, initial events and their bookmark",
            "WATCH",
            &format!(
                "{gadgets}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"
            ),
            JSON,
            None,
        ),
        step(
            "watch, expired resourceVersion",
            "WATCH",
            &format!("{gadgets}?watch=true&resourceVersion=2&timeoutSeconds=1"),
            JSON,
            None,
        ),
    ]
}

/// Sends the script to the API server behind `client` in `namespace`; each answer masked.
async fn play(client: &kube::Client, namespace: &str) -> BTreeMap<String, Value> {
    let mut answers = BTreeMap::new();
    for (i, step) in script().into_iter().enumerate() {
        let path = step.path.replace("{ns}", namespace);
        let method = if step.method == "WATCH" {
            "GET"
        } else {
            step.method
        };
        let body = step
            .body
            .map(|b| b.to_string().into_bytes())
            .unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(&path)
            .header("Content-Type", step.content_type)
            .header("Accept", JSON)
            .body(kube::client::Body::from(body))
            .expect("a request");
        let response = tokio::time::timeout(Duration::from_secs(30), client.send(request))
            .await
            .unwrap_or_else(|_| panic!("{}: no answer within 30 s", step.name))
            .unwrap_or_else(|e| panic!("{}: {e}", step.name));
        let code = response.status().as_u16();
        let bytes = response.into_body().collect_bytes().await.expect("a body");
        let text = String::from_utf8_lossy(&bytes).replace(namespace, "{ns}");
        let body = if step.method == "WATCH" {
            Value::Array(
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| serde_json::from_str(l).unwrap_or(Value::String(l.to_owned())))
                    .filter(|event| !is_periodic_bookmark(event))
                    .collect(),
            )
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
        };
        answers.insert(
            format!("{i:02} {}", step.name),
            json!({"request": format!("{} {}", step.method, step.path), "code": code, "body": masked(body)}),
        );
    }
    answers
}

/// A BOOKMARK other than the one that ends the initial events. The server sends these on its
/// own clock (the watch cache's bookmark timer, and near a watch's deadline): CI caught a real
/// kube-apiserver under load adding one to a 1 s watch that the recording does not have.
fn is_periodic_bookmark(event: &Value) -> bool {
    event["type"] == "BOOKMARK"
        && event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] != "true"
}

/// What differs on every run: identities, versions, times, continue tokens.
fn masked(mut value: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    let volatile = matches!(
                        key.as_str(),
                        "uid"
                            | "resourceVersion"
                            | "creationTimestamp"
                            | "deletionTimestamp"
                            | "time"
                            | "continue"
                    );
                    let empty = child.is_null() || child.as_str() == Some("");
                    if volatile && !empty {
                        *child = Value::String("<masked>".into());
                    } else {
                        walk(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            Value::String(text) if text.starts_with("too old resource version") => {
                *text = "too old resource version: <masked>".into();
            }
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// The steps whose answers differ from the recording, described.
fn differences(
    recorded: &BTreeMap<String, Value>,
    answered: &BTreeMap<String, Value>,
) -> Vec<String> {
    recorded
        .iter()
        .filter(|(step, _)| !KNOWN.iter().any(|(known, _)| step.ends_with(known)))
        .filter_map(|(step, want)| {
            let got = answered.get(step).unwrap_or(&Value::Null);
            (got != want).then(|| {
                format!(
                    "{step}:\n  recorded: {}\n  answered: {}",
                    serde_json::to_string(want).unwrap_or_default(),
                    serde_json::to_string(got).unwrap_or_default()
                )
            })
        })
        .collect()
}

fn recording() -> Option<BTreeMap<String, Value>> {
    let text = std::fs::read_to_string(FIXTURE).ok()?;
    let doc: Value = serde_json::from_str(&text).expect("the recording parses");
    serde_json::from_value(doc["answers"].clone()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_answers_the_script_as_recorded() {
    let Some(real) = real_kube() else { return };
    let world = KubeWorld::real(real, &[gadget_crd()]).await;
    let answered = play(&world.client, &world.namespace).await;
    if std::env::var("CAPO_RECORD_KUBE_ANSWERS").is_ok_and(|v| v == "1") {
        let version = world.client.apiserver_version().await.expect("/version");
        let doc = json!({
            "about": format!("Answers of a real kube-apiserver {} (tests/kube/) to tests/it/kube_answers.rs's script, masked as that file masks them.", version.git_version),
            "answers": answered,
        });
        std::fs::create_dir_all("tests/fixtures/kube").expect("the fixture's directory");
        std::fs::write(
            FIXTURE,
            serde_json::to_string_pretty(&doc).expect("JSON") + "\n",
        )
        .expect("the recording written");
        return;
    }
    let recorded = recording()
        .expect("tests/fixtures/kube/answers.json: record it with CAPO_RECORD_KUBE_ANSWERS=1");
    let stale = differences(&recorded, &answered);
    assert!(
        stale.is_empty(),
        "the real server no longer answers as recorded:\n{}",
        stale.join("\n")
    );
}

#[tokio::test]
async fn sim_kube_answers_the_script_as_the_real_server_did() {
    let recorded = recording().expect("the recording is part of the repository");
    let sim = KubeSim::start(KubeSimConfig::default())
        .await
        .expect("the simulator");
    sim.install(&[gadget_crd()]).expect("the CRD");
    let answered = play(&sim.client().expect("a client"), "default").await;
    let differ = differences(&recorded, &answered);
    for (step, reason) in KNOWN {
        eprintln!("NOTICE: {step}: the simulator differs from the real server: {reason}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} answers differ from the real server's:\n{}",
        differ.len(),
        recorded.len(),
        differ.join("\n")
    );
}
