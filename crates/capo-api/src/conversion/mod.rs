//! Conversion between CAPO's v1beta1 API and v1beta2 (ours, the storage version), on JSON as
//! the API server sends it in a `ConversionReview`.
//!
//! The field-by-field mapping is CAPO's (`api/v1beta1/conversion.go` in CAPO main): moved
//! and inverted fields (see [`fields`]), the flavor as a name or an ID, CAPI v1beta1
//! conditions against `metav1.Condition`, failure domains as a map against a list, and
//! `ready` derived from the `Ready` condition.
//!
//! **Nothing is lost on a round trip.** Where one version cannot say what the other holds
//! (a flavor given both by name and ID, a condition's severity, `spec.template.metadata`
//! of a cluster template...), the source's spec and status are kept in the
//! `cluster.x-k8s.io/conversion-data` annotation of the converted object, in CAPO's format
//! (the source object without its metadata). Converting back restores each section from
//! it, but only if that section is still what the annotation was made from: an edit made
//! in the other version always wins over the stashed copy. CAPO restores unconditionally,
//! so a stale copy can undo a later edit; we do not.

pub mod fields;
pub mod schema;
mod sections;

pub use sections::NO_REASON;

use serde_json::{Map, Value, json};

use fields::Direction;

/// The version every object is stored in.
pub const HUB: &str = "v1beta2";
/// CAPO 0.12–0.14's version, served for the clients and manifests that still use it.
pub const SPOKE: &str = "v1beta1";
/// Where what one version cannot express is kept (Cluster API's name, as CAPO uses it).
pub const DATA_ANNOTATION: &str = "cluster.x-k8s.io/conversion-data";
/// The kinds served in both versions.
pub const CONVERTIBLE_KINDS: [&str; 4] = [
    "OpenStackCluster",
    "OpenStackClusterTemplate",
    "OpenStackMachine",
    "OpenStackMachineTemplate",
];

/// Why an object could not be converted. The message names the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {reason}")]
pub struct ConversionError {
    /// `Kind namespace/name`, as far as it is known.
    pub object: String,
    /// What is wrong.
    pub reason: String,
}

fn describe(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("object");
    let name = object["metadata"]["name"].as_str().unwrap_or("<no name>");
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Converts one object to `desired_api_version` (`group/version`). An object already in
/// that version comes back unchanged.
pub fn convert(object: &Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let fail = |reason: String| ConversionError {
        object: describe(object),
        reason,
    };
    let Value::Object(_) = object else {
        return Err(fail("not a JSON object".into()));
    };
    let (from_group, from) = split_api_version(object["apiVersion"].as_str().unwrap_or(""))
        .ok_or_else(|| {
            fail(format!(
                "apiVersion {} is not group/version",
                object["apiVersion"]
            ))
        })?;
    let (to_group, to) = split_api_version(desired_api_version).ok_or_else(|| {
        fail(format!(
            "desired apiVersion {desired_api_version:?} is not group/version"
        ))
    })?;
    if from_group != crate::GROUP || to_group != crate::GROUP {
        return Err(fail(format!(
            "cannot convert {from_group}/{from} to {desired_api_version}: not the {} group",
            crate::GROUP
        )));
    }
    let kind = object["kind"].as_str().unwrap_or("");
    let versions = served_versions(kind).ok_or_else(|| fail(format!("unknown kind {kind:?}")))?;
    for version in [from, to] {
        if !versions.contains(&version) {
            return Err(fail(format!(
                "{kind} is not served in version {version:?} (served: {})",
                versions.join(", ")
            )));
        }
    }
    if from == to {
        return Ok(object.clone());
    }
    for section in ["spec", "status"] {
        if !matches!(object.get(section), None | Some(Value::Object(_))) {
            return Err(fail(format!("{section} is not an object")));
        }
    }
    let direction = if to == HUB {
        Direction::Up
    } else {
        Direction::Down
    };
    Ok(convert_keeping_what_is_lost(
        object,
        kind,
        direction,
        desired_api_version,
    ))
}

/// The versions a kind is served in, oldest first.
pub fn served_versions(kind: &str) -> Option<&'static [&'static str]> {
    match kind {
        k if CONVERTIBLE_KINDS.contains(&k) => Some(&[SPOKE, HUB]),
        "OpenStackServer" | "OpenStackClusterIdentity" => Some(&["v1alpha1"]),
        _ => None,
    }
}

fn split_api_version(api_version: &str) -> Option<(&str, &str)> {
    api_version
        .split_once('/')
        .filter(|(g, v)| !g.is_empty() && !v.is_empty())
}

/// The plain conversion, then the annotation: restore what the source's annotation kept
/// (section by section, only if unchanged since), and keep what the target cannot hold.
fn convert_keeping_what_is_lost(
    source: &Value,
    kind: &str,
    direction: Direction,
    desired_api_version: &str,
) -> Value {
    let mut source = source.clone();
    let stashed = take_annotation(&mut source);
    let mut target = sections::convert(&source, kind, direction);
    target["apiVersion"] = Value::String(desired_api_version.to_owned());
    if let Some(mut stashed) = stashed {
        // Converted as this object would be (the generation feeds observedGeneration).
        stashed["metadata"] = source["metadata"].clone();
        let back = sections::convert(&stashed, kind, direction.reverse());
        for section in ["spec", "status"] {
            if back.get(section) == source.get(section)
                && let Some(kept) = stashed.get(section)
            {
                target[section] = kept.clone();
            }
        }
    }
    let again = sections::convert(&target, kind, direction.reverse());
    let lossy = ["spec", "status"]
        .iter()
        .any(|s| again.get(*s) != source.get(*s));
    if lossy {
        let mut kept = Map::new();
        for key in ["apiVersion", "kind", "spec", "status"] {
            if let Some(value) = source.get(key) {
                kept.insert(key.to_owned(), value.clone());
            }
        }
        set_annotation(&mut target, Value::Object(kept).to_string());
    }
    target
}

impl Direction {
    fn reverse(self) -> Self {
        match self {
            Direction::Up => Direction::Down,
            Direction::Down => Direction::Up,
        }
    }
}

/// Removes the conversion-data annotation, returning what it held if it parses as an
/// object (a malformed one is dropped: it cannot be restored from).
fn take_annotation(object: &mut Value) -> Option<Value> {
    let annotations = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)?;
    let raw = annotations.remove(DATA_ANNOTATION)?;
    if annotations.is_empty()
        && let Some(metadata) = object["metadata"].as_object_mut()
    {
        metadata.remove("annotations");
    }
    serde_json::from_str::<Value>(raw.as_str()?)
        .ok()
        .filter(Value::is_object)
}

fn set_annotation(object: &mut Value, data: String) {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let metadata = &mut object["metadata"];
    if !metadata["annotations"].is_object() {
        metadata["annotations"] = json!({});
    }
    metadata["annotations"][DATA_ANNOTATION] = Value::String(data);
}

/// Answers a `ConversionReview` (apiextensions.k8s.io/v1) request. Every object converts,
/// or none is returned and the result is a Failure naming the first that could not.
pub fn review(body: &Value) -> Value {
    let reviewed = review_bytes(body.to_string().as_bytes());
    serde_json::from_slice(&reviewed.answer).unwrap_or(Value::Null)
}

/// What [`review_bytes`] answered.
#[derive(Debug)]
pub struct Reviewed {
    /// The `ConversionReview` answer, as JSON.
    pub answer: Vec<u8>,
    /// The version converted to and the kinds of the objects converted, or why the review
    /// failed.
    pub outcome: Result<Converted, String>,
}

/// What a successful review converted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Converted {
    /// The version asked for (`v1beta1`, `v1beta2`).
    pub to: String,
    /// How many objects of each kind.
    pub kinds: std::collections::BTreeMap<String, u64>,
}

/// The envelope of a `ConversionReview` as sent: the objects are left as the text they came
/// in, and parsed one at a time.
#[derive(serde::Deserialize)]
struct ReviewIn<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Value,
    #[serde(default)]
    kind: Value,
    #[serde(default, borrow)]
    request: Option<RequestIn<'a>>,
}

#[derive(serde::Deserialize)]
struct RequestIn<'a> {
    #[serde(default)]
    uid: Value,
    #[serde(rename = "desiredAPIVersion", default)]
    desired_api_version: Option<String>,
    #[serde(default, borrow)]
    objects: Option<Vec<&'a serde_json::value::RawValue>>,
}

/// [`review`] on the request's bytes, answering bytes. A real API server sends a whole list
/// in one review when a client lists in a version other than the storage version, so the
/// objects are never held as one JSON tree: each is parsed, converted and written out in turn.
/// What it holds at once is the request, the answer, and one object.
pub fn review_bytes(body: &[u8]) -> Reviewed {
    let envelope: ReviewIn<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        Err(error) => return failure(&Value::Null, &format!("the request is not JSON: {error}")),
    };
    if envelope.api_version != "apiextensions.k8s.io/v1" || envelope.kind != "ConversionReview" {
        let message = format!(
            "expected an apiextensions.k8s.io/v1 ConversionReview, got apiVersion {} kind {}",
            envelope.api_version, envelope.kind
        );
        let uid = envelope.request.as_ref().map_or(&Value::Null, |r| &r.uid);
        return failure(uid, &message);
    }
    let Some(request) = envelope.request else {
        return failure(&Value::Null, "request.uid is missing");
    };
    let uid = &request.uid;
    if !uid.is_string() {
        return failure(uid, "request.uid is missing");
    }
    let Some(desired) = request.desired_api_version.as_deref() else {
        return failure(uid, "request.desiredAPIVersion is missing");
    };
    let Some(objects) = request.objects else {
        return failure(uid, "request.objects is missing");
    };
    let mut done = Converted {
        to: desired.rsplit('/').next().unwrap_or_default().to_owned(),
        ..Converted::default()
    };
    // Written straight into the answer: the request and the answer are all that is held.
    let mut answer = Vec::with_capacity(body.len() + 256);
    answer.extend_from_slice(
        br#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","response":{"uid":"#,
    );
    answer.extend_from_slice(uid.to_string().as_bytes());
    answer.extend_from_slice(br#","convertedObjects":["#);
    for (i, raw) in objects.iter().enumerate() {
        let object: Value = match serde_json::from_str(raw.get()) {
            Ok(object) => object,
            Err(error) => {
                return failure(
                    uid,
                    &format!("cannot convert object {i}: not JSON: {error}"),
                );
            }
        };
        if i > 0 {
            answer.push(b',');
        }
        let written = convert(&object, desired)
            .map_err(|e| format!("cannot convert {e}"))
            .and_then(|out| {
                let kind = out["kind"].as_str().unwrap_or_default().to_owned();
                *done.kinds.entry(kind).or_default() += 1;
                serde_json::to_writer(&mut answer, &out).map_err(|e| e.to_string())
            });
        if let Err(message) = written {
            return failure(uid, &message);
        }
    }
    answer.extend_from_slice(br#"],"result":{"status":"Success"}}}"#);
    Reviewed {
        answer,
        outcome: Ok(done),
    }
}

/// A failed review that names no request (the request could not be looked at): `message` says
/// why.
pub fn review_failed(message: &str) -> Reviewed {
    failure(&Value::Null, message)
}

fn failure(uid: &Value, message: &str) -> Reviewed {
    let answer = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {"uid": uid, "convertedObjects": [], "result": {"status": "Failure", "message": message}},
    });
    Reviewed {
        answer: answer.to_string().into_bytes(),
        outcome: Err(message.to_owned()),
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
