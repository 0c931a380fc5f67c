//! The Kubernetes writes every reconciler makes: finalizers (JSON patches that fail rather
//! than overwrite another writer's finalizers) and one status merge patch per reconcile,
//! skipped when nothing changed.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::{FIELD_MANAGER, LastWrites};

pub(super) fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn json_patch(operations: serde_json::Value) -> Result<json_patch::Patch, kube::Error> {
    serde_json::from_value(operations).map_err(kube::Error::SerdeError)
}

/// Adds `finalizer` unless the object has it. The patch tests the finalizers the object has
/// now (`null` when none: the API server's JSON patch takes a missing path as null there), so
/// a concurrent change is a conflict to retry, never a lost finalizer.
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
            {"op": "test", "path": "/metadata/finalizers", "value": null},
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

/// The generation our own spec write moved the object to, when nothing else moved it (the
/// write answered exactly one past the generation the pass read).
pub fn moved_only_by_us(read: Option<i64>, written: Option<i64>) -> Option<i64> {
    written.filter(|w| read.map(|g| g + 1) == Some(*w))
}

/// [`patch_status`], unless this process already wrote `status` over `before` (`key`'s
/// cached copy lags our own write).
pub async fn patch_status_once<K, S>(
    last: &LastWrites,
    key: &str,
    api: &Api<K>,
    name: &str,
    before: Option<&S>,
    status: &S,
    owned: &[&str],
) -> Result<Option<String>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    S: Serialize + PartialEq,
{
    if before != Some(status) && last.repeats(key, before, status) {
        tracing::debug!(name, "status already written; the cache has not caught up");
        return Ok(None);
    }
    let written = patch_status(api, name, before, status, owned).await?;
    if written.is_some() {
        last.wrote(key, before, status);
    }
    Ok(written)
}

/// Writes `status` with a merge patch on the status subresource, unless it equals `before`.
/// `owned` lists the fields (`a`, or `a/b` inside `a`) this controller writes: those `status`
/// leaves out (an empty list, a `None`) are sent as `null`, so the patch removes them rather
/// than keeping what was there. Returns the object's new resourceVersion if it wrote.
pub async fn patch_status<K, S>(
    api: &Api<K>,
    name: &str,
    before: Option<&S>,
    status: &S,
    owned: &[&str],
) -> Result<Option<String>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    S: Serialize + PartialEq,
{
    if before == Some(status) {
        return Ok(None);
    }
    let mut body = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    if tracing::enabled!(tracing::Level::DEBUG) {
        let before = before.and_then(|b| serde_json::to_value(b).ok());
        let changed = changed_fields(before.as_ref(), &body);
        let types = K::DynamicType::default();
        let kind = K::kind(&types);
        tracing::debug!(%kind, name, changed = %changed.join(","), "writing status");
    }
    for field in owned {
        let path: Vec<&str> = field.split('/').collect();
        null_if_missing(&mut body, &path);
    }
    let patch = Patch::Merge(json!({ "status": body }));
    let written = api.patch_status(name, &params(), &patch).await?;
    Ok(written.resource_version())
}

/// Which of `after`'s top-level fields differ from `before`'s (conditions by type), to say in
/// the log why a status is written. Names only: never the values.
fn changed_fields(before: Option<&serde_json::Value>, after: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let before = before.and_then(|b| b.as_object()).unwrap_or(&empty);
    let after = after.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut changed = Vec::new();
    for key in keys {
        let (was, is) = (before.get(key), after.get(key));
        if was == is {
            continue;
        }
        match (key.as_str(), was, is) {
            ("conditions", _, _) => changed.extend(changed_conditions(was, is)),
            // One level down, to tell a field of a nested status from its neighbours.
            (_, Some(a @ serde_json::Value::Object(_)), Some(b @ serde_json::Value::Object(_))) => {
                changed.extend(
                    changed_fields(Some(a), b)
                        .into_iter()
                        .map(|inner| format!("{key}.{inner}")),
                );
            }
            (_, Some(serde_json::Value::Array(a)), Some(serde_json::Value::Array(b)))
                if a.len() == b.len() =>
            {
                for (i, (a, b)) in a.iter().zip(b).enumerate().filter(|(_, (a, b))| a != b) {
                    let inner = changed_fields(Some(a), b);
                    changed.push(format!("{key}[{i}].{}", inner.join("+")));
                }
            }
            _ => changed.push(key.clone()),
        }
    }
    changed
}

/// The condition types whose entries differ, each with the first field that does.
fn changed_conditions(
    was: Option<&serde_json::Value>,
    is: Option<&serde_json::Value>,
) -> Vec<String> {
    let by_type =
        |v: Option<&serde_json::Value>| -> std::collections::BTreeMap<String, serde_json::Value> {
            v.and_then(|v| v.as_array())
                .into_iter()
                .flatten()
                .filter_map(|c| Some((c.get("type")?.as_str()?.to_owned(), c.clone())))
                .collect()
        };
    let (was, is) = (by_type(was), by_type(is));
    let mut types: Vec<&String> = was.keys().chain(is.keys()).collect();
    types.sort();
    types.dedup();
    types
        .into_iter()
        .filter_map(|t| {
            let (a, b) = (was.get(t), is.get(t));
            if a == b {
                return None;
            }
            let field = [
                "status",
                "reason",
                "message",
                "observedGeneration",
                "lastTransitionTime",
            ]
            .into_iter()
            .find(|f| a.and_then(|a| a.get(*f)) != b.and_then(|b| b.get(*f)))
            .unwrap_or("added");
            Some(format!("conditions[{t}].{field}"))
        })
        .collect()
}

/// Sets the field at `path` to `null` where its parent exists and it does not.
fn null_if_missing(value: &mut serde_json::Value, path: &[&str]) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    match path {
        [] => {}
        [leaf] => {
            object
                .entry((*leaf).to_owned())
                .or_insert(serde_json::Value::Null);
        }
        [head, rest @ ..] => {
            if let Some(child) = object.get_mut(*head) {
                null_if_missing(child, rest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_is_ours_only_when_our_write_alone_moved_it() {
        assert_eq!(moved_only_by_us(Some(4), Some(5)), Some(5));
        assert_eq!(
            moved_only_by_us(Some(4), Some(6)),
            None,
            "someone else wrote too"
        );
        assert_eq!(moved_only_by_us(Some(4), Some(4)), None, "nothing moved");
        assert_eq!(moved_only_by_us(None, Some(1)), None);
    }

    #[test]
    fn owned_fields_left_out_are_sent_as_null() {
        let mut status = json!({"instanceID": "s1", "resources": {"ports": [{"id": "p"}]}});
        for field in [
            "addresses",
            "instanceID",
            "resources/volumes",
            "resolved/ports",
        ] {
            let path: Vec<&str> = field.split('/').collect();
            null_if_missing(&mut status, &path);
        }
        assert_eq!(
            status,
            json!({"instanceID": "s1", "addresses": null,
                   "resources": {"ports": [{"id": "p"}], "volumes": null}})
        );
    }
}
