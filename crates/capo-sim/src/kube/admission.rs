//! Validating admission, as kube-apiserver runs it on a write to a custom resource: the
//! object is checked against the schema and CEL rules of the version it was sent in (the
//! old object read into that version), then sent to every ValidatingWebhookConfiguration
//! webhook whose rules match (`AdmissionReview` v1 over HTTPS, through the
//! [`Converter`]'s routes). With `matchPolicy: Equivalent` (the
//! default) a request in a version the rule does not list is converted to one it lists, and
//! `requestKind` keeps the version sent. A refusal reads as the real server's:
//! `admission webhook "<name>" denied the request: <message>`.
//!
//! A server-side apply is admitted too: its merged object, tried without storing, against the
//! live one (`server.rs`), as the real server's recorded UPDATE review shows.
//!
//! Not modelled: mutating webhooks, namespace and object selectors, match conditions, and
//! timeouts other than 30 s.

use std::sync::{Mutex, MutexGuard};

use serde_json::{Value, json};

use super::conversion::{Converter, Endpoint, client_config};
use super::errors::ApiError;
use super::store::{Store, Target};

/// What admission needs of the API server: its store and its webhook client.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    /// The store.
    pub store: &'a Mutex<Store>,
    /// Calls webhooks (and converts objects for them).
    pub converter: &'a Converter,
}

impl Server<'_> {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One write to admit.
#[derive(Clone, Copy)]
pub struct Write<'a> {
    /// What is written to, in the request's version.
    pub target: &'a Target,
    /// CREATE or UPDATE.
    pub operation: &'static str,
    /// The object as sent, in the request's version.
    pub object: &'a Value,
    /// The stored object, read into the request's version (UPDATE).
    pub old: Option<&'a Value>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// The request's `fieldManager`, when it named one.
    pub field_manager: Option<&'a str>,
}

/// Validates `write` in its version, then asks the matching validating webhooks.
pub async fn admit(shared: Server<'_>, write: &Write<'_>) -> Result<(), ApiError> {
    if !write.target.def.custom {
        return Ok(());
    }
    let mut object = write.object.clone();
    if let Some(schema) = write
        .target
        .def
        .version(&write.target.version)
        .and_then(|v| v.schema.as_ref())
    {
        crate::structural::drop_nulls(&mut object, schema);
        crate::structural::prune(&mut object, schema);
        crate::structural::apply_defaults(&mut object, schema);
    }
    let write = &Write {
        object: &object,
        ..*write
    };
    shared
        .store()
        .check_in_version(write.target, write.object, write.old)?;
    for webhook in matching_webhooks(shared, write) {
        call(shared, &webhook, write).await?;
    }
    Ok(())
}

/// A webhook of a ValidatingWebhookConfiguration, with the version it wants objects in.
struct Webhook {
    name: String,
    endpoint: Endpoint,
    ca_bundle: Option<String>,
    ignore_failure: bool,
    version: String,
    /// `timeoutSeconds` (10 unless set).
    timeout_s: u64,
}

fn matching_webhooks(shared: Server<'_>, write: &Write<'_>) -> Vec<Webhook> {
    let configurations = shared.store().all_of(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    );
    configurations
        .iter()
        .flat_map(|configuration| {
            configuration["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|webhook| matching(&webhook, write))
        .collect()
}

/// The webhook, if one of its rules matches the write, with the version to send.
fn matching(webhook: &Value, write: &Write<'_>) -> Option<Webhook> {
    let def = &write.target.def;
    let listed = |rule: &Value, field: &str, value: &str| {
        rule[field]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item == value || item == "*"))
    };
    let equivalent = webhook["matchPolicy"] != "Exact";
    let version = webhook["rules"]
        .as_array()?
        .iter()
        .filter(|rule| {
            listed(rule, "apiGroups", &def.key.group)
                && listed(rule, "resources", &def.key.plural)
                && listed(rule, "operations", write.operation)
        })
        .find_map(|rule| {
            if listed(rule, "apiVersions", &write.target.version) {
                return Some(write.target.version.clone());
            }
            let served = def.versions.iter().map(|v| v.name.clone());
            served
                .filter(|_| equivalent)
                .find(|v| listed(rule, "apiVersions", v))
        })?;
    let (endpoint, ca_bundle) = client_config(&webhook["clientConfig"], "", &mut Vec::new())?;
    Some(Webhook {
        name: webhook["name"].as_str().unwrap_or_default().to_owned(),
        endpoint,
        ca_bundle,
        ignore_failure: webhook["failurePolicy"] == "Ignore",
        version,
        timeout_s: webhook["timeoutSeconds"].as_u64().unwrap_or(10),
    })
}

async fn call(shared: Server<'_>, webhook: &Webhook, write: &Write<'_>) -> Result<(), ApiError> {
    let def = &write.target.def;
    let object = in_webhook_version(shared, write, write.object, &webhook.version).await?;
    let old = match write.old {
        Some(old) => in_webhook_version(shared, write, old, &webhook.version).await?,
        None => Value::Null,
    };
    let uid = uuid::Uuid::new_v4().to_string();
    let kind =
        |version: &str| json!({"group": def.key.group, "version": version, "kind": def.kind});
    let resource = |version: &str| json!({"group": def.key.group, "version": version, "resource": def.key.plural});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind(&webhook.version), "resource": resource(&webhook.version),
            "requestKind": kind(&write.target.version),
            "requestResource": resource(&write.target.version),
            "name": write.object["metadata"]["name"],
            "namespace": write.target.namespace,
            "operation": write.operation,
            "userInfo": {"username": "capo-sim", "groups": ["system:authenticated"], "extra": {}},
            "object": object, "oldObject": old,
            "dryRun": write.dry_run,
            "options": options(write),
        },
    });
    let answer = shared
        .converter
        .post(
            &webhook.endpoint,
            webhook.ca_bundle.as_deref(),
            &review,
            webhook.timeout_s,
        )
        .await;
    let response = match answer {
        Ok(answer) if answer["response"]["uid"] == uid.as_str() => answer["response"].clone(),
        Ok(answer) => {
            let why = format!(
                "received invalid webhook response: expected response.uid={uid}, got {}",
                answer["response"]["uid"]
            );
            return failed(webhook, &why);
        }
        Err(why) => return failed(webhook, &format!("failed to call webhook: {why}")),
    };
    if response["allowed"] == true {
        return Ok(());
    }
    Err(denied(webhook, &response["status"]))
}

/// The write's options as the real server puts them in a review (a patch's as an update's).
fn options(write: &Write<'_>) -> Value {
    let kind = match write.operation {
        "CREATE" => "CreateOptions",
        _ => "UpdateOptions",
    };
    let mut options = json!({"apiVersion": "meta.k8s.io/v1", "kind": kind});
    if let Some(manager) = write.field_manager {
        options["fieldManager"] = json!(manager);
    }
    if write.dry_run {
        options["dryRun"] = json!(["All"]);
    }
    options
}

async fn in_webhook_version(
    shared: Server<'_>,
    write: &Write<'_>,
    object: &Value,
    version: &str,
) -> Result<Value, ApiError> {
    let def = &write.target.def;
    let mut object = object.clone();
    object["apiVersion"] = Value::String(def.api_version(&write.target.version));
    object["kind"] = Value::String(def.kind.clone());
    shared
        .converter
        .convert(def.conversion_target(version), &object)
        .await
}

/// A call that failed: refused (`failurePolicy: Fail`, the default) or let through.
fn failed(webhook: &Webhook, why: &str) -> Result<(), ApiError> {
    if webhook.ignore_failure {
        return Ok(());
    }
    Err(ApiError::internal(format!(
        "failed calling webhook \"{}\": {why}",
        webhook.name
    )))
}

/// The refusal as kube-apiserver words it (apiserver's `webhook/errors.ToStatusErr`): the
/// webhook's code (at least 400) and message (else its reason), after whose webhook denied it.
fn denied(webhook: &Webhook, status: &Value) -> ApiError {
    let denied_by = format!("admission webhook \"{}\" denied the request", webhook.name);
    let said = |field: &str| status[field].as_str().filter(|m| !m.is_empty());
    let message = match said("message").or_else(|| said("reason")) {
        Some(message) => format!("{denied_by}: {message}"),
        None => format!("{denied_by} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let reason = match status["reason"].as_str() {
        Some("Forbidden") => "Forbidden",
        Some("Invalid") => "Invalid",
        _ => "",
    };
    ApiError::new(code, reason, message)
}
