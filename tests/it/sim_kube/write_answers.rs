//! The simulator answers DELETE, PATCH and server-side apply as a real kube-apiserver
//! does. The same requests were sent to a real v1.35.3 server and its answers recorded in
//! the reference recording `kube-real-answers/delete-patch-apply.json` (outside the
//! repository: see `common::shared_reference`); this test replays them against
//! the simulator over plain HTTP and compares the answers, summarised the same way. Without the
//! recording it still runs every request and checks the answers it can without the
//! recording (see the focused tests in `main.rs` for those behaviours through kube-rs).

use std::collections::BTreeMap;

use capo_sim::kube::{KubeSim, KubeSimConfig};
use serde_json::{Value, json};

/// The test kind: a status subresource with a default, a bounded list.
fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.test"},
        "spec": {"group": "example.test", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "spec": {"type": "object", "properties": {
                             "size": {"type": "integer"},
                             "tags": {"type": "array", "maxItems": 8, "items": {"type": "string", "maxLength": 63}}}},
                         "status": {"type": "object", "default": {"observedGeneration": -1}, "properties": {
                             "observedGeneration": {"type": "integer", "format": "int64"},
                             "phase": {"type": "string"}}}}}}}]}
    })
}

struct Replay {
    http: reqwest::Client,
    base: String,
    answers: BTreeMap<String, Value>,
}

const WIDGETS: &str = "/apis/example.test/v1/namespaces/default/widgets";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.test/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}

impl Replay {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("Content-Type", content_type)
            .header("Accept", "application/json");
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.expect("the simulator answers");
        let code = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn create(&self, object: &Value) {
        let (code, body) = self
            .send(
                reqwest::Method::POST,
                WIDGETS,
                "application/json",
                Some(object),
            )
            .await;
        assert_eq!(code, 201, "setup create: {body}");
    }

    async fn delete(&self, name: &str, options: Option<Value>) -> (u16, Value) {
        let path = format!("{WIDGETS}/{name}");
        self.send(
            reqwest::Method::DELETE,
            &path,
            "application/json",
            options.as_ref(),
        )
        .await
    }

    async fn get(&self, name: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::GET,
            &format!("{WIDGETS}/{name}"),
            "application/json",
            None,
        )
        .await
    }

    async fn patch(&self, path: &str, content_type: &str, body: &Value) -> (u16, Value) {
        self.send(
            reqwest::Method::PATCH,
            &format!("{WIDGETS}/{path}"),
            content_type,
            Some(body),
        )
        .await
    }

    fn record(&mut self, key: &str, summary: Value) {
        self.answers.insert(key.to_owned(), summary);
    }
}

/// An answer as the recording summarises it: a Status by its reason and details kind, a
/// list by its kind, an object by its deletion state.
fn summary((code, body): (u16, Value)) -> Value {
    let kind = body["kind"].as_str().unwrap_or_default();
    if kind == "Status" {
        return json!({"code": code, "kind": kind, "reason": body.get("reason").cloned().unwrap_or(Value::Null),
                      "status": body["status"], "details_kind": body.pointer("/details/kind").cloned().unwrap_or(Value::Null)});
    }
    if kind.ends_with("List") {
        return json!({"code": code, "kind": kind});
    }
    json!({"code": code, "kind": kind,
           "deletionTimestamp": body.pointer("/metadata/deletionTimestamp").is_some(),
           "finalizers": body.pointer("/metadata/finalizers").cloned().unwrap_or(Value::Null)})
}

#[allow(clippy::too_many_lines)]
async fn replay(base: String) -> BTreeMap<String, Value> {
    let mut r = Replay {
        http: reqwest::Client::new(),
        base,
        answers: BTreeMap::new(),
    };

    r.create(&widget("plain", json!({"size": 1}))).await;
    let a = r.delete("plain", None).await;
    r.record("delete-no-finalizers", summary(a));

    let mut held = widget("held", json!({"size": 1}));
    held["metadata"]["finalizers"] = json!(["example.test/hold"]);
    r.create(&held).await;
    let a = r.delete("held", None).await;
    r.record("delete-with-finalizers", summary(a));
    let a = r.delete("held", None).await;
    r.record("delete-again-while-deleting", summary(a));
    let a = r.get("held").await;
    r.record("get-while-deleting", summary(a));
    let a = r
        .patch("held", MERGE, &json!({"metadata": {"finalizers": null}}))
        .await;
    r.record("remove-finalizer-merge-patch", summary(a));
    let a = r.get("held").await;
    r.record("get-after-finalizer-removed", summary(a));

    r.create(&widget("foreground", json!({"size": 1}))).await;
    let a = r
        .delete(
            "foreground",
            Some(json!({"propagationPolicy": "Foreground"})),
        )
        .await;
    r.record("delete-foreground", summary(a));
    let a = r.get("foreground").await;
    r.record("get-after-foreground", summary(a));

    r.create(&widget("background", json!({"size": 1}))).await;
    let a = r
        .delete(
            "background",
            Some(json!({"propagationPolicy": "Background"})),
        )
        .await;
    r.record("delete-background", summary(a));

    let a = r.delete("missing", None).await;
    r.record("delete-missing", summary(a));

    r.create(&widget("guarded", json!({"size": 1}))).await;
    let a = r
        .delete(
            "guarded",
            Some(json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})),
        )
        .await;
    r.record("delete-precondition-uid-mismatch", summary(a));
    let a = r
        .delete(
            "guarded",
            Some(json!({"preconditions": {"resourceVersion": "1"}})),
        )
        .await;
    r.record("delete-precondition-rv-stale", summary(a));

    for name in ["batch-a", "batch-b"] {
        let mut w = widget(name, json!({"size": 1}));
        w["metadata"]["labels"] = json!({"batch": "yes"});
        r.create(&w).await;
    }
    let a = r
        .send(
            reqwest::Method::DELETE,
            &format!("{WIDGETS}?labelSelector=batch%3Dyes"),
            "application/json",
            None,
        )
        .await;
    r.record("deletecollection", summary(a));

    r.create(&widget("patched", json!({"size": 1}))).await;
    let a = r
        .patch("patched", STRATEGIC, &json!({"spec": {"size": 2}}))
        .await;
    r.record("patch-strategic-merge-on-cr", summary(a));
    let a = r
        .patch("patched", MERGE, &json!({"status": {"phase": "Running"}}))
        .await;
    r.record("patch-merge-status-via-main", summary(a));
    let status = r.get("patched").await.1["status"].clone();
    r.record("status-after-main-patch", status);
    let a = r
        .patch(
            "patched/status",
            MERGE,
            &json!({"status": {"observedGeneration": 1, "phase": "Running"}}),
        )
        .await;
    r.record("patch-merge-status-subresource", summary(a));
    let status = r.get("patched").await.1["status"].clone();
    r.record("status-after-subresource-patch", status);
    let (code, body) = r
        .patch("patched/status", MERGE, &json!({"spec": {"size": 5}}))
        .await;
    r.record(
        "patch-status-subresource-spec-ignored",
        json!({"code": code, "spec.size": body["spec"]["size"], "generation": body["metadata"]["generation"]}),
    );

    let applied = |size: i64| widget("applied", json!({"size": size}));
    let a = r.patch("applied?fieldManager=a", APPLY, &applied(1)).await;
    r.record("ssa-create", summary(a));
    let a = r.patch("applied?fieldManager=b", APPLY, &applied(2)).await;
    r.record("ssa-conflict-other-manager", summary(a));
    let a = r
        .patch("applied?fieldManager=b&force=true", APPLY, &applied(2))
        .await;
    r.record("ssa-force", summary(a));
    let managers: Vec<Value> = r.get("applied").await.1["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|entry| entry["manager"].clone())
        .collect();
    r.record("ssa-managers-after-force", Value::Array(managers));
    let status = json!({"apiVersion": "example.test/v1", "kind": "Widget", "metadata": {"name": "applied"},
                        "status": {"phase": "Running"}});
    let a = r
        .patch("applied/status?fieldManager=a", APPLY, &status)
        .await;
    r.record("ssa-status-subresource", summary(a));

    let a = r
        .send(
            reqwest::Method::POST,
            WIDGETS,
            "application/json",
            Some(&widget(
                "too-many-tags",
                json!({"tags": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}),
            )),
        )
        .await;
    r.record("create-over-maxItems", summary(a));
    r.answers
}

fn recorded_answers() -> Option<BTreeMap<String, Value>> {
    let file = super::common::shared_reference(
        "kube-real-answers/delete-patch-apply.json",
        "the comparison with a real server's answers",
    )?;
    let text = std::fs::read_to_string(&file).expect("readable recorded answers");
    let json: Value = serde_json::from_str(&text).expect("recorded answers are JSON");
    let answers = json["answers"].as_object().expect("an answers map");
    Some(
        answers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

#[tokio::test]
async fn delete_patch_and_apply_answer_as_a_real_server_does() {
    // The recording read the object right after the foreground DELETE, before the garbage
    // collector had run; keep the simulated collector away for that read.
    let config = KubeSimConfig {
        garbage_collector_period: std::time::Duration::from_secs(3600),
        ..KubeSimConfig::default()
    };
    let sim = KubeSim::start(config).await.expect("simulator starts");
    sim.install(&[widget_crd()])
        .expect("the widget CRD installs");
    let ours = super::within("the replay", replay(sim.url())).await;
    assert_eq!(ours.len(), 25, "every recorded request was replayed");
    let Some(recorded) = recorded_answers() else {
        return;
    };
    let keys: Vec<&String> = recorded.keys().collect();
    assert_eq!(
        keys,
        ours.keys().collect::<Vec<_>>(),
        "the same 25 requests"
    );
    let mismatches: Vec<String> = recorded
        .iter()
        .filter(|(key, answer)| ours.get(*key) != Some(answer))
        .map(|(key, answer)| format!("{key}:\n  real:      {answer}\n  simulator: {}", ours[key]))
        .collect();
    eprintln!(
        "{} of {} answers equal the real server's",
        recorded.len() - mismatches.len(),
        recorded.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
