//! Content negotiation on `Accept`, as kube-apiserver does it: the object itself, a `Table`
//! (`kubectl get`) or metadata only (`PartialObjectMetadata` and
//! `PartialObjectMetadataList`, what kube-rs's `Api<PartialObjectMeta<K>>` and client-go's
//! metadata client ask for). Bodies are always JSON here; the media type only decides
//! which clause of the header wins.

use serde_json::{Value, json};

use super::errors::ApiError;
use super::resources::ResourceDef;

/// The media types the API server lists when it refuses an `Accept` header.
const SERVED: &[(&str, &str)] = &[
    ("application", "json"),
    ("application", "yaml"),
    ("application", "vnd.kubernetes.protobuf"),
];

/// The form an answer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The object (or list) itself.
    Object,
    /// `meta.k8s.io` `Table`.
    Table,
    /// `PartialObjectMetadata` of `meta.k8s.io/<version>`.
    Metadata(&'static str),
    /// `PartialObjectMetadataList` of `meta.k8s.io/<version>`.
    MetadataList(&'static str),
}

/// One clause of an `Accept` header.
struct Clause<'a> {
    type_: &'a str,
    subtype: &'a str,
    q: f32,
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Clause<'a> {
    fn parse(text: &'a str) -> Option<Self> {
        let mut parts = text.split(';').map(str::trim);
        let media = parts.next().filter(|m| !m.is_empty())?;
        let (type_, subtype) = media.split_once('/').unwrap_or((media, "*"));
        let mut clause = Self {
            type_: type_.trim(),
            subtype: subtype.trim(),
            q: 1.0,
            params: Vec::new(),
        };
        for param in parts {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            let (key, value) = (key.trim(), value.trim().trim_matches('"'));
            if key == "q" {
                clause.q = value.parse().unwrap_or(0.0);
            } else {
                clause.params.push((key, value));
            }
        }
        Some(clause)
    }

    fn param(&self, name: &str) -> Option<&'a str> {
        self.params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }

    /// Whether this clause covers a media type the server encodes.
    fn covers(&self, type_: &str, subtype: &str) -> bool {
        (self.type_ == type_ && (self.subtype == subtype || self.subtype == "*"))
            || (self.type_ == "*" && self.subtype == "*")
    }

    /// What this clause asks for when answered in `type_/subtype`, if the endpoint allows
    /// it (the API server's `acceptMediaTypeOptions` and `AllowsMediaTypeTransform`).
    fn output(&self, subtype: &str, custom: bool) -> Option<Output> {
        if self
            .param("stream")
            .is_some_and(|s| !s.is_empty() && (s != "watch" || subtype == "yaml"))
        {
            return None;
        }
        let (kind, group, version) = (self.param("as"), self.param("g"), self.param("v"));
        if kind.is_none() && group.is_none() && version.is_none() {
            // Custom resources have no protobuf form of their own.
            return (!custom || subtype != "vnd.kubernetes.protobuf").then_some(Output::Object);
        }
        let version = match (group, version) {
            (Some("meta.k8s.io"), Some("v1")) => "v1",
            (Some("meta.k8s.io"), Some("v1beta1")) => "v1beta1",
            _ => return None,
        };
        match kind? {
            "Table" if matches!(subtype, "json" | "yaml") => Some(Output::Table),
            "PartialObjectMetadata" => Some(Output::Metadata(version)),
            "PartialObjectMetadataList" => Some(Output::MetadataList(version)),
            _ => None,
        }
    }
}

/// The answer's form for an `Accept` header: the first clause (by quality, then
/// specificity, then order) the server can honour; no header means the object. A header
/// none of whose clauses can be honoured gets 406 `NotAcceptable`, listing what is served.
pub fn negotiate(accept: Option<&str>, custom: bool) -> Result<Output, ApiError> {
    let Some(header) = accept.map(str::trim).filter(|h| !h.is_empty()) else {
        return Ok(Output::Object);
    };
    let mut clauses: Vec<Clause<'_>> = header.split(',').filter_map(Clause::parse).collect();
    // As goautoneg sorts them: higher quality first, wildcards after concrete types.
    clauses.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then((a.type_ == "*").cmp(&(b.type_ == "*")))
            .then((a.subtype == "*").cmp(&(b.subtype == "*")))
    });
    clauses
        .iter()
        .filter(|c| c.q > 0.0)
        .find_map(|clause| {
            SERVED
                .iter()
                .filter(|(t, s)| clause.covers(t, s))
                .find_map(|(_, subtype)| clause.output(subtype, custom))
        })
        .ok_or_else(|| {
            let served: Vec<String> = SERVED.iter().map(|(t, s)| format!("{t}/{s}")).collect();
            ApiError::not_acceptable(format!(
                "only the following media types are accepted: {}",
                served.join(", ")
            ))
        })
}

/// `PartialObjectMetadata` for an object (already presented): its whole metadata.
pub fn partial(object: &Value, version: &str) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// `PartialObjectMetadataList` for a page of objects, with the list's metadata
/// (`resourceVersion`, `continue`, `remainingItemCount`).
pub fn partial_list(items: &[Value], list_metadata: Value, version: &str) -> Value {
    let items: Vec<Value> = items.iter().map(|o| partial(o, version)).collect();
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": list_metadata,
        "items": items,
    })
}

/// The Go type the API server holds an object (or list) of this resource in, as its 406
/// messages name it: `*core.ConfigMap`, `*unstructured.UnstructuredList`.
fn go_type(def: &ResourceDef, list: bool) -> String {
    let suffix = if list { "List" } else { "" };
    if def.custom {
        return format!("*unstructured.Unstructured{suffix}");
    }
    let package = match def.key.group.as_str() {
        "" | "events.k8s.io" => "core",
        group => group.split('.').next().unwrap_or(group),
    };
    format!("*{package}.{}{suffix}", def.kind)
}

/// 406 for `PartialObjectMetadataList` asked of one object.
pub fn not_a_list(def: &ResourceDef) -> ApiError {
    ApiError::not_acceptable(format!(
        "you requested PartialObjectMetadataList, but the requested object is not a list ({})",
        go_type(def, false)
    ))
}

/// 406 for `PartialObjectMetadata` asked of a list.
pub fn a_list(def: &ResourceDef) -> ApiError {
    ApiError::not_acceptable(format!(
        "you requested PartialObjectMetadata, but the requested object is a list ({})",
        go_type(def, true)
    ))
}
