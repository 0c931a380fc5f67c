//! API errors as the Kubernetes API server reports them: a `metav1.Status` body with an
//! HTTP code, a machine-readable `reason` and a message worded like the real server's.

use serde_json::{Value, json};

/// A resource name qualified by its group, as it appears in messages
/// (`openstackclusters.infrastructure.cluster.x-k8s.io`, or `secrets` for the core group).
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// One failed field in an `Invalid` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// Dotted field path, e.g. `spec.flavor`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// An error response. `code` and `reason` follow `metav1.StatusReason`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `metav1.StatusReason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` of the Status, when the server would give them.
    pub details: Option<Value>,
}

fn details(group: &str, kind: &str, name: &str) -> Value {
    json!({"name": name, "group": group, "kind": kind})
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 404 for a named object that does not exist.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", qualified(group, plural));
        Self::new(404, "NotFound", message).with_details(details(group, plural, name))
    }

    /// 404 for a path the server does not serve.
    pub fn no_such_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// 409 for a create whose name is taken.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", qualified(group, plural));
        Self::new(409, "AlreadyExists", message).with_details(details(group, plural, name))
    }

    /// 409 for a write that lost an optimistic-concurrency race or failed a precondition.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(group, plural)
        );
        Self::new(409, "Conflict", message).with_details(details(group, plural, name))
    }

    /// 409 for a write carrying a stale `resourceVersion`.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per failed field.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        // As `field.ErrorList.ToAggregate`: an error listed twice is said once.
        let mut listed: Vec<String> = Vec::new();
        for cause in &causes {
            let line = format!("{}: {}", cause.field, cause.message);
            if !listed.contains(&line) {
                listed.push(line);
            }
        }
        let summary = match listed.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let qualified_kind = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        let mut d = details(group, kind, name);
        d["causes"] = Value::Array(causes);
        Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
        )
        .with_details(d)
    }

    /// 422 without field causes (e.g. a JSON patch that does not apply).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400: the request itself is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403: the server refuses (e.g. new content in a terminating namespace).
    pub fn forbidden(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "{} \"{name}\" is forbidden: {why}",
            qualified(group, plural)
        );
        Self::new(403, "Forbidden", message).with_details(details(group, plural, name))
    }

    /// 405: the verb is not allowed on this path.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    /// 410: a resourceVersion or continue token that is too old.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415: a patch type the server does not accept for this resource (custom resources
    /// take no strategic merge patch).
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 406: no form the client accepts can be given (`Accept`), or the transformation it
    /// asked for does not fit the answer (`PartialObjectMetadata` of a list).
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 409 for a delete whose preconditions fail. The API server names the object by its
    /// kind here, not its resource (`Widget.example.test`), in the message and the details.
    pub fn precondition_failed(group: &str, kind: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(group, kind)
        );
        Self::new(409, "Conflict", message).with_details(details(group, kind, name))
    }

    /// 409 for a server-side apply that would change fields other managers own.
    pub fn apply_conflict(conflicts: &super::managed::Conflicts) -> Self {
        let causes: Vec<Value> = conflicts
            .0
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"), "field": field})
            })
            .collect();
        Self::new(409, "Conflict", conflicts.message()).with_details(json!({"causes": causes}))
    }

    /// 504: a resourceVersion newer than the server has.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}))
    }

    /// 500 with no reason: what a read gets when its conversion fails (the converter's error
    /// is not a Status, so the server answers `StatusReasonUnknown`).
    pub fn conversion_failed(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    /// 500 InternalError, as a watch's ERROR event carries a failed conversion.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// 504 Timeout: what kube-apiserver 1.35 answers a write it could not finish, e.g. a
    /// status PATCH while etcd is stopped (recorded on the real tier, after 34 s).
    pub fn write_timed_out() -> Self {
        Self::new(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )
    }

    /// The `metav1.Status` body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_like_the_real_servers() {
        let e = ApiError::not_found("infrastructure.cluster.x-k8s.io", "openstackclusters", "a");
        assert_eq!(
            e.message,
            "openstackclusters.infrastructure.cluster.x-k8s.io \"a\" not found"
        );
        assert_eq!(e.status()["code"], 404);
        assert_eq!(e.status()["reason"], "NotFound");
        let core = ApiError::already_exists("", "secrets", "s");
        assert_eq!(core.message, "secrets \"s\" already exists");
    }

    #[test]
    fn invalid_lists_every_cause() {
        let cause = |f: &str| Cause {
            reason: "FieldValueRequired",
            field: f.into(),
            message: "Required value".into(),
        };
        let one = ApiError::invalid("g", "Thing", "t", vec![cause("spec.a")]);
        assert_eq!(
            one.message,
            "Thing.g \"t\" is invalid: spec.a: Required value"
        );
        let two = ApiError::invalid("g", "Thing", "t", vec![cause("spec.a"), cause("spec.b")]);
        assert!(
            two.message
                .ends_with("[spec.a: Required value, spec.b: Required value]")
        );
        assert_eq!(two.status()["details"]["causes"][1]["field"], "spec.b");
    }
}
