//! Conversion between a CRD's versions, as apiextensions-apiserver does it
//! (`pkg/apiserver/conversion/webhook_converter.go`): `None` only rewrites `apiVersion`;
//! `Webhook` POSTs a `ConversionReview` v1 of one object to the CRD's webhook over HTTPS,
//! trusting `caBundle`, and checks the answer (uid, count, apiVersion, kind, name,
//! namespace, uid) before taking the converted object's labels and annotations and nothing
//! else of its metadata. Failures read as the real server's, wrapped in
//! `conversion webhook for <group/version, Kind=kind> failed: ...`.
//!
//! A webhook named by `service` is reached at the address [`Converter::route`] gave for
//! that Service (the real server resolves the Service's endpoints), under the Service's DNS
//! name, so the certificate must name `<service>.<namespace>.svc` as a real one must.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::errors::{ApiError, Cause};

/// How long the API server waits for a conversion webhook (not configurable).
const CONVERSION_TIMEOUT_S: u64 = 30;

/// Where a webhook is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `clientConfig.url`.
    Url(String),
    /// `clientConfig.service`.
    Service {
        namespace: String,
        name: String,
        port: u16,
        path: String,
    },
}

/// What a conversion needs to know of a resource: its kind, the `apiVersion` wanted, and how
/// its CRD converts.
pub struct Target<'a> {
    pub kind: &'a str,
    pub api_version: String,
    pub strategy: &'a Strategy,
}

/// A CRD's `spec.conversion`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Versions differ only in `apiVersion`.
    #[default]
    None,
    /// Converted by a webhook.
    Webhook {
        endpoint: Endpoint,
        /// PEM, decoded from `caBundle`.
        ca_bundle: Option<String>,
    },
}

impl Strategy {
    /// Reads `spec.conversion`, adding what the real server would refuse to `causes`.
    pub fn from_crd(crd: &Value, causes: &mut Vec<Cause>) -> Strategy {
        let conversion = &crd["spec"]["conversion"];
        match conversion["strategy"].as_str() {
            None | Some("None") => Strategy::None,
            Some("Webhook") => webhook(&conversion["webhook"], causes),
            Some(other) => {
                causes.push(cause(
                    "FieldValueNotSupported",
                    "spec.conversion.strategy",
                    format!(
                        "Unsupported value: {other:?}: supported values: \"None\", \"Webhook\""
                    ),
                ));
                Strategy::None
            }
        }
    }
}

fn cause(reason: &'static str, field: &str, message: String) -> Cause {
    Cause {
        reason,
        field: field.to_owned(),
        message,
    }
}

fn webhook(webhook: &Value, causes: &mut Vec<Cause>) -> Strategy {
    let config = &webhook["clientConfig"];
    if !webhook.is_object() || !config.is_object() {
        causes.push(cause(
            "FieldValueRequired",
            "spec.conversion.webhook",
            "Required value: required when strategy is set to Webhook".into(),
        ));
        return Strategy::None;
    }
    let versions = webhook["conversionReviewVersions"].as_array();
    if !versions.is_some_and(|v| v.iter().any(|v| v == "v1")) {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.conversion.webhook.conversionReviewVersions",
            "Invalid value: must include at least one of v1, v1beta1 (the simulator speaks v1 only)".into(),
        ));
    }
    match client_config(config, "spec.conversion.webhook.clientConfig", causes) {
        Some((endpoint, ca_bundle)) => Strategy::Webhook {
            endpoint,
            ca_bundle,
        },
        None => Strategy::None,
    }
}

/// A webhook's `clientConfig` (at field path `at`): where it is and the CA it is trusted
/// with (PEM); `None`, with the cause, when the real server would refuse it.
pub fn client_config(
    config: &Value,
    at: &str,
    causes: &mut Vec<Cause>,
) -> Option<(Endpoint, Option<String>)> {
    let endpoint = match (config["url"].as_str(), config["service"].as_object()) {
        (Some(url), None) => Endpoint::Url(url.to_owned()),
        (None, Some(service)) => Endpoint::Service {
            namespace: service
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            name: service
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            port: service
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(443),
            path: service
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_owned(),
        },
        _ => {
            causes.push(cause(
                "FieldValueRequired",
                at,
                "Required value: exactly one of url or service is required".into(),
            ));
            return None;
        }
    };
    let ca_bundle = config["caBundle"].as_str().filter(|b| !b.trim().is_empty());
    let ca_bundle =
        match ca_bundle.map(|b| base64::engine::general_purpose::STANDARD.decode(b.trim())) {
            None => None,
            Some(Ok(pem)) => Some(String::from_utf8_lossy(&pem).into_owned()),
            Some(Err(_)) => {
                causes.push(cause(
                    "FieldValueInvalid",
                    &format!("{at}.caBundle"),
                    "Invalid value: not base64".into(),
                ));
                None
            }
        };
    Some((endpoint, ca_bundle))
}

/// Calls conversion webhooks for the API server.
#[derive(Default)]
pub struct Converter {
    routes: Mutex<HashMap<(String, String), SocketAddr>>,
    clients: Mutex<HashMap<String, reqwest::Client>>,
    calls: Mutex<u64>,
}

impl Converter {
    /// Sends the Service `namespace/name` to `address` (its one endpoint).
    pub fn route(&self, namespace: &str, name: &str, address: SocketAddr) {
        lock(&self.routes).insert((namespace.to_owned(), name.to_owned()), address);
        lock(&self.clients).clear();
    }

    /// Forgets the Service's endpoint: calls fail as they do with no ready endpoint.
    pub fn unroute(&self, namespace: &str, name: &str) {
        lock(&self.routes).remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Conversion requests sent so far.
    pub fn calls(&self) -> u64 {
        *lock(&self.calls)
    }

    /// `object` (as stored, in any served version) in the target's version.
    pub async fn convert(&self, target: Target<'_>, object: &Value) -> Result<Value, ApiError> {
        let Target {
            kind,
            api_version: desired,
            strategy,
        } = target;
        if object["apiVersion"] == desired.as_str() {
            return Ok(object.clone());
        }
        let Strategy::Webhook {
            endpoint,
            ca_bundle,
        } = strategy
        else {
            let mut converted = object.clone();
            converted["apiVersion"] = Value::String(desired);
            return Ok(converted);
        };
        let gvk = format!(
            "{}, Kind={}",
            object["apiVersion"].as_str().unwrap_or_default(),
            kind
        );
        let failed = |why: String| {
            ApiError::conversion_failed(format!("conversion webhook for {gvk} failed: {why}"))
        };
        *lock(&self.calls) += 1;
        let uid = uuid::Uuid::new_v4().to_string();
        // As recorded from kube-apiserver 1.35: the object without its resourceVersion (the
        // storage layer sets it after decoding), and an empty response beside the request.
        let mut sent = object.clone();
        if let Some(metadata) = sent.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("resourceVersion");
        }
        let review = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": [sent]},
            "response": {"uid": "", "convertedObjects": null, "result": {"metadata": {}}},
        });
        let answer = self
            .post(
                endpoint,
                ca_bundle.as_deref(),
                &review,
                CONVERSION_TIMEOUT_S,
            )
            .await
            .map_err(failed)?;
        let converted = check_answer(&answer, &uid).map_err(failed)?;
        let converted = check_object(object, converted, &desired, kind).map_err(|why| {
            ApiError::conversion_failed(format!("conversion webhook for {gvk} {why}"))
        })?;
        Ok(converted)
    }

    /// POSTs `body` to a webhook, as the API server does (`?timeout=` the webhook's
    /// timeout: 30 s for conversion, the configuration's `timeoutSeconds` for admission);
    /// its JSON answer.
    pub async fn post(
        &self,
        endpoint: &Endpoint,
        ca_bundle: Option<&str>,
        body: &Value,
        timeout_s: u64,
    ) -> Result<Value, String> {
        let (url, client) = self.client(endpoint, ca_bundle)?;
        let target = format!("{url}?timeout={timeout_s}s");
        let response = client
            .post(&target)
            .timeout(Duration::from_secs(timeout_s))
            .json(body)
            .send()
            .await
            .map_err(|e| format!("Post \"{target}\": {}", error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(format!(
                "the server responded with status {}",
                response.status().as_u16()
            ));
        }
        response.json::<Value>().await.map_err(|e| error_chain(&e))
    }

    fn client(
        &self,
        endpoint: &Endpoint,
        ca: Option<&str>,
    ) -> Result<(String, reqwest::Client), String> {
        let (url, resolve) = match endpoint {
            Endpoint::Url(url) => (url.clone(), None),
            Endpoint::Service {
                namespace,
                name,
                port,
                path,
            } => {
                let host = format!("{name}.{namespace}.svc");
                let address = lock(&self.routes)
                    .get(&(namespace.clone(), name.clone()))
                    .copied()
                    .ok_or_else(|| format!("Post \"https://{host}:{port}{path}?timeout=30s\": no endpoints available for service \"{name}\""))?;
                (
                    format!("https://{host}:{port}{path}"),
                    Some((host, address)),
                )
            }
        };
        let key = format!("{url}|{resolve:?}|{}", ca.unwrap_or_default());
        if let Some(client) = lock(&self.clients).get(&key) {
            return Ok((url, client.clone()));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .http1_only();
        if let Some(pem) = ca {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| format!("caBundle: {e}"))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((host, address)) = resolve {
            builder = builder.resolve(&host, address);
        }
        let client = builder.build().map_err(|e| e.to_string())?;
        lock(&self.clients).insert(key, client.clone());
        Ok((url, client))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An error with its causes, as Go's `%v` of a wrapped error reads.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The one converted object of a well-formed, successful answer.
fn check_answer(answer: &Value, uid: &str) -> Result<Value, String> {
    if answer["apiVersion"] != "apiextensions.k8s.io/v1" || answer["kind"] != "ConversionReview" {
        return Err(format!(
            "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {}, Kind={}",
            answer["apiVersion"].as_str().unwrap_or_default(),
            answer["kind"].as_str().unwrap_or_default()
        ));
    }
    let response = &answer["response"];
    if !response.is_object() {
        return Err("no response provided".into());
    }
    let got = response["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let result = &response["result"];
    if result["status"] != "Success" {
        return Err(match result["message"].as_str() {
            Some(message) if !message.is_empty() => message.to_owned(),
            _ => format!(
                "response.result.status was '{}', not 'Success'",
                result["status"].as_str().unwrap_or_default()
            ),
        });
    }
    match response["convertedObjects"].as_array().map(Vec::as_slice) {
        Some([one]) => Ok(one.clone()),
        Some([]) | None => Err("no objects returned".into()),
        Some(many) => Err(format!("returned {} objects, expected 1", many.len())),
    }
}

/// The converted object with the original's metadata, except its labels and annotations.
fn check_object(
    original: &Value,
    mut converted: Value,
    desired: &str,
    kind: &str,
) -> Result<Value, String> {
    let invalid = |why: String| format!("returned invalid object at index 0: {why}");
    if converted["apiVersion"] != desired {
        return Err(invalid(format!(
            "invalid groupVersion (expected {desired}, received {})",
            converted["apiVersion"].as_str().unwrap_or_default()
        )));
    }
    if converted["kind"] != kind {
        return Err(invalid(format!(
            "invalid kind (expected {kind}, received {})",
            converted["kind"].as_str().unwrap_or_default()
        )));
    }
    for field in ["name", "namespace", "uid"] {
        let (was, now) = (&original["metadata"][field], &converted["metadata"][field]);
        if was != now {
            return Err(format!(
                "returned invalid object: must have the same {field}: {} != {}",
                was.as_str().unwrap_or_default(),
                now.as_str().unwrap_or_default()
            ));
        }
    }
    let Some(sent) = converted.get("metadata").and_then(Value::as_object) else {
        return Err("returned invalid metadata: missing metadata in converted object".into());
    };
    let mut metadata = original["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for field in ["labels", "annotations"] {
        match sent.get(field) {
            // An empty map is left out, as Go's `omitempty` leaves it out of the answer.
            Some(Value::Object(map)) if !map.is_empty() => {
                if map.values().any(|v| !v.is_string()) {
                    return Err(format!(
                        "returned invalid metadata: metadata.{field} must hold strings"
                    ));
                }
                metadata.insert(field.to_owned(), Value::Object(map.clone()));
            }
            _ => {
                metadata.remove(field);
            }
        }
    }
    converted["metadata"] = Value::Object(metadata);
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_converted_object_left_with_no_annotations_has_none_as_a_real_server_answers() {
        let original = json!({"metadata": {"name": "a", "namespace": "n", "uid": "u",
            "annotations": {"kept.only.in/v1beta2": "{}"}}});
        let converted = json!({"apiVersion": "g/v1", "kind": "K",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "annotations": {}, "labels": {"l": "v"}}});
        let object = check_object(&original, converted, "g/v1", "K").expect("valid");
        assert_eq!(object["metadata"].get("annotations"), None);
        assert_eq!(object["metadata"]["labels"], json!({"l": "v"}));
    }
}
