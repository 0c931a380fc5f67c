//! Patch bodies, applied the way the API server applies them to custom resources.

use serde_json::Value;

use super::errors::ApiError;

/// A PATCH request body, by its content type.
#[derive(Clone, Debug)]
pub enum Patch {
    /// `application/merge-patch+json` (RFC 7386), and, for built-in kinds only, strategic
    /// merge treated like it (its list semantics are not modelled).
    Merge(Value),
    /// `application/json-patch+json` (RFC 6902), `test` included.
    Json(json_patch::Patch),
    /// `application/apply-patch+yaml`: server-side apply (see [`super::managed`]).
    Apply(Value),
}

/// The patch types the API server accepts for custom resources, in its order.
const CUSTOM_PATCH_TYPES: [&str; 3] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];
const BUILTIN_PATCH_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

impl Patch {
    /// Parses a body by its content type (parameters such as `charset` ignored). Custom
    /// resources take no strategic merge patch, as on a real server (415).
    pub fn parse(content_type: &str, body: &[u8], custom: bool) -> Result<Self, ApiError> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        let json = |body: &[u8]| {
            serde_json::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        let accepted: &[&str] = if custom {
            &CUSTOM_PATCH_TYPES
        } else {
            &BUILTIN_PATCH_TYPES
        };
        if !accepted.contains(&media) && media != "application/apply-patch+cbor" {
            return Err(ApiError::unsupported_media_type(accepted));
        }
        match media {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                Ok(Self::Merge(json(body)?))
            }
            "application/json-patch+json" => serde_json::from_slice(body)
                .map(Self::Json)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}"))),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                let value: Value = serde_saphyr::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                if !value.is_object() {
                    return Err(ApiError::bad_request("apply patch must be an object"));
                }
                Ok(Self::Apply(value))
            }
            _ => Err(ApiError::unsupported_media_type(accepted)),
        }
    }

    /// Whether the patch names a resourceVersion (then a lost race is the client's 409,
    /// never retried by the server).
    pub fn sets_resource_version(&self) -> bool {
        match self {
            Self::Merge(patch) | Self::Apply(patch) => {
                patch.pointer("/metadata/resourceVersion").is_some()
            }
            Self::Json(patch) => patch.0.iter().any(|op| {
                serde_json::to_string(op).is_ok_and(|t| t.contains("/metadata/resourceVersion"))
            }),
        }
    }

    /// Applies a merge or JSON patch to an object's current state. Server-side apply is the
    /// store's ([`super::store::Store::apply`]): it needs field ownership.
    pub fn apply_to(&self, current: &Value) -> Result<Value, ApiError> {
        let mut patched = current.clone();
        match self {
            Self::Merge(patch) => json_patch::merge(&mut patched, patch),
            Self::Json(patch) => apply_json_patch(&mut patched, patch)?,
            Self::Apply(_) => {
                return Err(ApiError::bad_request(
                    "an apply patch goes through the field manager",
                ));
            }
        }
        Ok(patched)
    }
}

/// Applies operations in order. Like the API server (evanphx/json-patch), a `test` that
/// a missing path is `null` passes: kube-rs's finalizer helper relies on it.
fn apply_json_patch(document: &mut Value, patch: &json_patch::Patch) -> Result<(), ApiError> {
    for operation in &patch.0 {
        if let json_patch::PatchOperation::Test(test) = operation
            && test.value.is_null()
            && document.pointer(test.path.as_str()).is_none()
        {
            continue;
        }
        // A real server says no more than this, with empty details (recorded from v1.35).
        json_patch::patch(document, std::slice::from_ref(operation)).map_err(|_| {
            ApiError::unprocessable(
                "the server rejected our request due to an error in our request",
            )
            .with_details(serde_json::json!({}))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_sets_and_removes_fields() {
        let patch = Patch::parse(
            "application/merge-patch+json",
            br#"{"spec":{"a":2,"b":null}}"#,
            true,
        )
        .unwrap();
        let out = patch
            .apply_to(&json!({"spec": {"a": 1, "b": 1, "c": 1}}))
            .unwrap();
        assert_eq!(out, json!({"spec": {"a": 2, "c": 1}}));
    }

    #[test]
    fn json_patch_test_failure_is_unprocessable() {
        let patch = Patch::parse(
            "application/json-patch+json",
            br#"[{"op":"test","path":"/spec/a","value":9},{"op":"replace","path":"/spec/a","value":3}]"#,
            true,
        )
        .unwrap();
        let err = patch.apply_to(&json!({"spec": {"a": 1}})).unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn a_null_test_passes_on_a_missing_path() {
        let patch = Patch::parse(
            "application/json-patch+json",
            br#"[{"op":"test","path":"/metadata/finalizers","value":null},{"op":"add","path":"/metadata/finalizers","value":["f"]}]"#,
            true,
        )
        .unwrap();
        let out = patch.apply_to(&json!({"metadata": {}})).unwrap();
        assert_eq!(out, json!({"metadata": {"finalizers": ["f"]}}));
    }

    #[test]
    fn apply_accepts_yaml_and_unknown_types_are_refused() {
        let Patch::Apply(body) =
            Patch::parse("application/apply-patch+yaml", b"spec:\n  a: 5\n", true).unwrap()
        else {
            panic!("an apply patch");
        };
        assert_eq!(body, json!({"spec": {"a": 5}}));
        let err = Patch::parse("text/plain", b"{}", true).unwrap_err();
        assert_eq!(err.code, 415);
    }

    #[test]
    fn strategic_merge_is_refused_on_custom_resources_only() {
        let strategic = "application/strategic-merge-patch+json";
        let err = Patch::parse(strategic, br#"{"spec":{}}"#, true).unwrap_err();
        assert_eq!((err.code, err.reason), (415, "UnsupportedMediaType"));
        assert_eq!(
            err.message,
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        );
        assert!(err.details.is_none());
        assert!(matches!(
            Patch::parse(strategic, br#"{"data":{}}"#, false),
            Ok(Patch::Merge(_))
        ));
    }
}
