//! The Kubernetes writes every reconciler makes: finalizers (JSON patches that fail rather
//! than overwrite another writer's finalizers) and one status merge patch per reconcile,
//! skipped when nothing changed.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::FIELD_MANAGER;

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn json_patch(operations: serde_json::Value) -> Result<json_patch::Patch, kube::Error> {
    serde_json::from_value(operations).map_err(kube::Error::SerdeError)
}

/// Adds `finalizer` unless the object has it. The patch is conditional on the finalizers the
/// object has now (or, when it has none, on its resourceVersion), so a concurrent change is a
/// conflict to retry, never a lost finalizer.
pub async fn add_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let current = object.finalizers();
    if current.iter().any(|f| f == finalizer) {
        return Ok(false);
    }
    let operations = if current.is_empty() {
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    let patch: Patch<()> = Patch::Json(json_patch(operations)?);
    api.patch(&object.name_any(), &params(), &patch).await?;
    Ok(true)
}

/// Removes `finalizer` if the object has it, testing that it is still where we saw it.
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(index) = object.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let operations = json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    let patch: Patch<()> = Patch::Json(json_patch(operations)?);
    match api.patch(&object.name_any(), &params(), &patch).await {
        Ok(_) => Ok(()),
        // Gone already: nothing holds it any more.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Writes `status` with a merge patch on the status subresource, unless it equals `before`.
/// Returns whether it wrote.
pub async fn patch_status<K, S>(
    api: &Api<K>,
    name: &str,
    before: Option<&S>,
    status: &S,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize + PartialEq,
{
    if before == Some(status) {
        return Ok(false);
    }
    let patch = Patch::Merge(json!({ "status": status }));
    api.patch_status(name, &params(), &patch).await?;
    Ok(true)
}
