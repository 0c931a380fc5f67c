//! The ConversionReview and AdmissionReview requests an API server sends our webhooks, as
//! the real kube-apiserver 1.35 sends them and as the simulator does: a recording webhook
//! (HTTPS on 127.0.0.1) stands in front of capo-rs's own, keeps every request's body and
//! passes it on. The same writes and reads in v1beta1 run on a real API server of the test's
//! own and on the simulator; the reviews each sent, action by action and normalised (uids,
//! times, versions, the caller), are held to `tests/fixtures/kube/reviews.json`, recorded
//! from the real server with `CAPO_RECORD_KUBE_ANSWERS=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use capo_api::conversion::SPOKE;
use capo_sim::certs::WebhookCerts;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::conversion::{ServedWebhook, resource, spoke_machine};
use crate::kube_world::{KubeWorld, real_kube};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kube/reviews.json"
);

/// Every request body it is sent (path and query, JSON), passed on to capo-rs's webhook.
struct RecordingWebhook {
    address: SocketAddr,
    certs: WebhookCerts,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    stop: CancellationToken,
    _ours: ServedWebhook,
}

impl Drop for RecordingWebhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl RecordingWebhook {
    async fn start() -> Self {
        let ours = ServedWebhook::start_for_real().await;
        let mut names = crate::conversion::service_names();
        names.push("127.0.0.1".into());
        let certs = WebhookCerts::issue(&names).expect("certificates");
        let tls = tls_config(&certs);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("an address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let onward = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(ours.certs.ca_pem.as_bytes()).expect("our CA"),
            )
            .build()
            .expect("a client");
        let base = ours.url("");
        let (seen_by_server, stopped) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let (acceptor, seen, onward, base) = (
                    acceptor.clone(),
                    seen_by_server.clone(),
                    onward.clone(),
                    base.clone(),
                );
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        pass_on(request, seen.clone(), onward.clone(), base.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        RecordingWebhook {
            address,
            certs,
            seen,
            stop,
            _ours: ours,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.address)
    }

    /// The requests seen since the last call.
    fn take(&self) -> Vec<(String, Value)> {
        std::mem::take(&mut *self.seen.lock().expect("the recording"))
    }
}

fn tls_config(certs: &WebhookCerts) -> rustls::ServerConfig {
    certs.server_config().expect("a server configuration")
}

async fn pass_on(
    request: hyper::Request<Incoming>,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    onward: reqwest::Client,
    base: String,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Ok(mut seen) = seen.lock() {
        seen.push((target.clone(), review));
    }
    let answer = onward
        .post(format!("{base}{target}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let (status, bytes) = match answer {
        Ok(answer) => (
            answer.status().as_u16(),
            answer.bytes().await.unwrap_or_default(),
        ),
        Err(e) => (502, Bytes::from(e.to_string())),
    };
    Ok(hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(bytes))
        .unwrap_or_default())
}

/// Our OpenStackMachine CRD and admission for it, both through the recording webhook: by URL
/// on a real server, through the webhook Service (routed to it) on the simulator.
fn through(recording: &RecordingWebhook, by_url: bool) -> Vec<Value> {
    let ca = recording.certs.ca_bundle();
    let client_config = |service: &Value| match by_url {
        true => {
            let path = service["path"].as_str().unwrap_or("/convert");
            json!({"url": recording.url(path), "caBundle": ca})
        }
        false => json!({"service": service, "caBundle": ca}),
    };
    let mut crd = capo_api::crds::all()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).expect("CRD"))
        .find(|crd| crd["spec"]["names"]["kind"] == "OpenStackMachine")
        .expect("our OpenStackMachine CRD");
    let service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"].clone();
    crd["spec"]["conversion"]["webhook"]["clientConfig"] = client_config(&service);
    let mut admission: Vec<Value> = capo_provider::manager::manifests::objects(
        capo_provider::manager::manifests::Flavor::Kustomize,
    )
    .into_iter()
    .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
    .collect();
    for configuration in &mut admission {
        if let Some(hooks) = configuration["webhooks"].as_array_mut() {
            hooks.retain(|h| h["rules"][0]["resources"][0] == "openstackmachines");
            for hook in hooks {
                let service = hook["clientConfig"]["service"].clone();
                hook["clientConfig"] = client_config(&service);
            }
        }
    }
    std::iter::once(crd).chain(admission).collect()
}

/// What differs from run to run or between callers, replaced by what it stands for.
fn normalised(target: &str, review: &Value) -> Value {
    let mut review = review.clone();
    let request = &mut review["request"];
    for (field, stands_for) in [("uid", "<uid>"), ("namespace", "<namespace>")] {
        if request.get(field).is_some() {
            request[field] = json!(stands_for);
        }
    }
    if let Some(user) = request.get_mut("userInfo").and_then(Value::as_object_mut) {
        for value in user.values_mut() {
            *value = json!("<caller>");
        }
    }
    if let Some(manager) = request.pointer_mut("/options/fieldManager") {
        *manager = json!("<caller>");
    }
    let Some(request) = request.as_object_mut() else {
        return json!({"target": target, "review": review});
    };
    for (field, value) in request.iter_mut() {
        let objects: Vec<&mut Value> = match (field.as_str(), value) {
            ("objects", Value::Array(objects)) => objects.iter_mut().collect(),
            ("object" | "oldObject", object) => vec![object],
            _ => continue,
        };
        objects.into_iter().for_each(mask_metadata);
    }
    json!({"target": target, "review": review})
}

/// An object's metadata as it stands for what varies: system fields by name only, managed
/// fields by their count.
fn mask_metadata(object: &mut Value) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for (field, value) in metadata.iter_mut() {
            match field.as_str() {
                "name" | "labels" | "annotations" | "finalizers" => {}
                "managedFields" => {
                    *value = json!(format!(
                        "<{} entries>",
                        value.as_array().map_or(0, Vec::len)
                    ))
                }
                _ => *value = json!(format!("<{field}>")),
            }
        }
    }
}

/// v1beta1 writes and reads of OpenStackMachines (stored as v1beta2), and the reviews each
/// one made the server send, normalised.
async fn reviews_for_each_action(world: &KubeWorld, recording: &RecordingWebhook) -> Value {
    let machines: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        &world.namespace,
        &resource("OpenStackMachine", SPOKE),
    );
    let object = |name: &str| {
        let mut machine = spoke_machine(name);
        machine["metadata"]["namespace"] = json!(world.namespace);
        serde_json::from_value::<DynamicObject>(machine).expect("an object")
    };
    recording.take();
    let mut actions = BTreeMap::new();
    let mut record = |action: &str, seen: Vec<(String, Value)>| {
        let reviews: Vec<Value> = seen.iter().map(|(t, r)| normalised(t, r)).collect();
        actions.insert(action.to_owned(), Value::Array(reviews));
    };
    machines
        .create(&PostParams::default(), &object("a"))
        .await
        .expect("create in v1beta1");
    record("1 create in v1beta1", recording.take());
    machines.get("a").await.expect("get in v1beta1");
    record("2 get in v1beta1", recording.take());
    machines
        .create(&PostParams::default(), &object("b"))
        .await
        .expect("create in v1beta1");
    recording.take();
    machines
        .list(&ListParams::default())
        .await
        .expect("list in v1beta1");
    record("3 list of two in v1beta1", recording.take());
    machines
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"edited": "yes"}}})),
        )
        .await
        .expect("merge patch in v1beta1");
    record("4 merge patch in v1beta1", recording.take());
    machines
        .patch(
            "a",
            &PatchParams::apply("reviews-test").force(),
            &Patch::Apply(json!({
                "apiVersion": format!("{}/{SPOKE}", capo_api::GROUP), "kind": "OpenStackMachine",
                "metadata": {"name": "a", "annotations": {"applied": "yes"}},
            })),
        )
        .await
        .expect("apply in v1beta1");
    record("5 server-side apply in v1beta1", recording.take());
    machines
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .expect("status in v1beta1");
    record("6 status merge patch in v1beta1", recording.take());
    machines
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete in v1beta1");
    record("7 delete in v1beta1", recording.take());
    Value::Object(actions.into_iter().collect())
}

fn recorded() -> Value {
    let text = std::fs::read_to_string(FIXTURE).expect("tests/fixtures/kube/reviews.json");
    serde_json::from_str(&text).expect("the recorded reviews")
}

/// Every distinct review sent, whatever the action, as far as the simulator is held to it:
/// the whole envelope (the path and its timeout, every field of the request and the empty
/// response, the options, the caller's fields, the kinds and resources) and each object's
/// kind, name and spec ([`envelope`]). Listed in `docs/real-kubernetes.md`, not
/// compared: how many
/// reviews an action makes (the real server converts an object into each served version as
/// that version's watch cache takes the write, so a list from the cache converts nothing;
/// the simulator converts as each read asks), and objects' system metadata and status (the
/// real server converts a new object after filling its metadata and dropping its status).
fn distinct(actions: &Value) -> BTreeSet<String> {
    actions
        .as_object()
        .into_iter()
        .flat_map(|actions| actions.values())
        .filter_map(Value::as_array)
        .flatten()
        .map(|entry| serde_json::to_string(&envelope(entry)).unwrap_or_default())
        .collect()
}

fn envelope(entry: &Value) -> Value {
    let mut entry = entry.clone();
    // Which objects a write converts on its way differs too (the simulator converts an
    // apply's partial configuration, the real server the live object in the request's
    // version, and a deleted object into the storage version): of a converted object, only
    // its kind is compared; of an admitted one, its content as well.
    let converting = entry.pointer("/review/kind") == Some(&json!("ConversionReview"));
    let request = entry.pointer_mut("/review/request");
    for (field, value) in request.and_then(Value::as_object_mut).into_iter().flatten() {
        let objects: Vec<&mut Value> = match (field.as_str(), value) {
            ("objects", Value::Array(objects)) => objects.iter_mut().collect(),
            ("object" | "oldObject", object) if object.is_object() => vec![object],
            _ => continue,
        };
        for object in objects {
            if converting {
                *object = json!({"apiVersion": object["apiVersion"], "kind": object["kind"]});
                continue;
            }
            // Not its labels: the real server may admit an apply twice, first against the
            // live object as its watch cache held it (a label written just before missing),
            // then, the write conflicting, against the object as stored.
            *object = json!({
                "apiVersion": object["apiVersion"], "kind": object["kind"],
                "name": object["metadata"]["name"], "spec": object["spec"],
            });
        }
    }
    entry
}

/// The bodies only the recording has, and those only `seen` has.
fn differences(recorded: &Value, seen: &Value) -> Vec<String> {
    let (recorded, seen) = (distinct(recorded), distinct(seen));
    let only = |from: &BTreeSet<String>, not_in: &BTreeSet<String>, who: &str| {
        from.difference(not_in)
            .map(|review| format!("only {who}: {review}"))
            .collect::<Vec<_>>()
    };
    let mut differ = only(&recorded, &seen, "the real server sent");
    differ.extend(only(&seen, &recorded, "this server sent"));
    differ
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_sends_the_reviews_recorded_from_it() {
    if real_kube().is_none() {
        return;
    }
    let recording = RecordingWebhook::start().await;
    let world = KubeWorld::own_real(&through(&recording, true), "reviews").await;
    let seen = reviews_for_each_action(&world, &recording).await;
    if std::env::var("CAPO_RECORD_KUBE_ANSWERS").is_ok_and(|v| v == "1") {
        let text = serde_json::to_string_pretty(&seen).expect("JSON");
        std::fs::write(FIXTURE, text + "\n").expect("the fixture written");
        return;
    }
    let differ = differences(&recorded(), &seen);
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_kube_sends_the_reviews_the_real_server_sends() {
    let recording = RecordingWebhook::start().await;
    let world = KubeWorld::sim(&through(&recording, false)).await;
    let (namespace, name) = capo_api::crds::WEBHOOK_SERVICE;
    world
        .simulator()
        .converter()
        .route(namespace, name, recording.address);
    let seen = reviews_for_each_action(&world, &recording).await;
    let differ = differences(&recorded(), &seen);
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
