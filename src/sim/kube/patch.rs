//! Patch bodies, applied the way the API server applies them to custom resources.

use serde_json::Value;

use super::errors::ApiError;

/// A PATCH request body, by its content type.
#[derive(Clone, Debug)]
pub enum Patch {
    /// `application/merge-patch+json` (RFC 7386), and strategic merge treated like it.
    Merge(Value),
    /// `application/json-patch+json` (RFC 6902), `test` included.
    Json(json_patch::Patch),
    /// `application/apply-patch+yaml`: server-side apply, simulated as a merge that creates
    /// the object when it is missing.
    Apply(Value),
}

impl Patch {
    /// Parses a body by its content type (parameters such as `charset` ignored).
    pub fn parse(content_type: &str, body: &[u8]) -> Result<Self, ApiError> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        let json = |body: &[u8]| {
            serde_json::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        match media {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                Ok(Self::Merge(json(body)?))
            }
            "application/json-patch+json" => serde_json::from_slice(body)
                .map(Self::Json)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}"))),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                let value: Value = serde_yaml::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                if !value.is_object() {
                    return Err(ApiError::bad_request("apply patch must be an object"));
                }
                Ok(Self::Apply(value))
            }
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }

    /// Applies the patch to an object's current state.
    pub fn apply_to(&self, current: &Value) -> Result<Value, ApiError> {
        let mut patched = current.clone();
        match self {
            Self::Merge(patch) | Self::Apply(patch) => json_patch::merge(&mut patched, patch),
            Self::Json(patch) => apply_json_patch(&mut patched, patch)?,
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
        json_patch::patch(document, std::slice::from_ref(operation)).map_err(|e| {
            ApiError::unprocessable(format!(
                "the server rejected our request due to an error in our request: {e}"
            ))
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
        )
        .unwrap();
        let out = patch.apply_to(&json!({"metadata": {}})).unwrap();
        assert_eq!(out, json!({"metadata": {"finalizers": ["f"]}}));
    }

    #[test]
    fn apply_accepts_yaml_and_unknown_types_are_refused() {
        let patch = Patch::parse("application/apply-patch+yaml", b"spec:\n  a: 5\n").unwrap();
        assert_eq!(
            patch.apply_to(&json!({})).unwrap(),
            json!({"spec": {"a": 5}})
        );
        let err = Patch::parse("text/plain", b"{}").unwrap_err();
        assert_eq!(err.code, 415);
    }
}
