//! Storage migration, as Cluster API's CRD migrator does it. For each of our CRDs whose
//! `status.storedVersions` lists more than its storage version (CAPO 0.14 stored v1beta1;
//! we store v1beta2), every object is written once without a change (a merge patch holding
//! only its resourceVersion), which makes the API server store it again in the storage
//! version; then `storedVersions` is set to the storage version alone, so that a later CRD
//! may drop the old version. Safe to repeat: a CRD already migrated is skipped, and an
//! object that changed or went meanwhile needs nothing more. Nothing but the encoding
//! changes: the patch carries no field of the object.
//!
//! Then, as Cluster API's migrator's CleanupManagedFields phase does, every object's
//! `managedFields` entries recorded in a version the CRD no longer serves are dropped, once
//! per CRD generation (marked on the CRD with Cluster API's own annotation).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::features::MigrationPhase;

/// How many objects one list page holds.
const PAGE: u32 = 250;

/// The annotation on a CRD naming the generation whose objects' managed fields were last
/// cleaned. Cluster API's CRD migrator (which CAPO main runs) sets the same one after the same
/// work, so neither redoes the other's.
pub const OBSERVED_GENERATION: &str = "crd-migration.cluster.x-k8s.io/observed-generation";

/// How often one object's cleanup is tried again after a conflict (client-go's
/// `retry.DefaultRetry`, which Cluster API's migrator uses, allows 5 steps).
const CONFLICT_RETRIES: usize = 5;

/// Progress, for logs and dashboards.
#[derive(Clone)]
pub struct MigrationMetrics {
    objects: IntCounterVec,
    stored_versions: IntGaugeVec,
    fields_cleaned: IntCounterVec,
}

impl MigrationMetrics {
    /// Creates `capo_crd_storage_migration_objects_total`, `capo_crd_stored_versions` and
    /// `capo_crd_managed_fields_cleaned_total` and registers them in `registry`; an error if
    /// any is already registered there.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let objects = IntCounterVec::new(
            Opts::new(
                "capo_crd_storage_migration_objects_total",
                "Objects rewritten by the storage migration, by CRD and result (migrated, gone, changed, error).",
            ),
            &["crd", "result"],
        )?;
        let stored_versions = IntGaugeVec::new(
            Opts::new(
                "capo_crd_stored_versions",
                "How many versions each of our CRDs' status.storedVersions lists (1 once migrated).",
            ),
            &["crd"],
        )?;
        let fields_cleaned = IntCounterVec::new(
            Opts::new(
                "capo_crd_managed_fields_cleaned_total",
                "Objects whose managedFields entries of versions their CRD no longer serves were dropped, by CRD.",
            ),
            &["crd"],
        )?;
        registry.register(Box::new(objects.clone()))?;
        registry.register(Box::new(stored_versions.clone()))?;
        registry.register(Box::new(fields_cleaned.clone()))?;
        Ok(MigrationMetrics {
            objects,
            stored_versions,
            fields_cleaned,
        })
    }
}

/// Why a storage migration stopped; [`migrate_until_done`] retries it.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The CRD could not be read.
    #[error("reading CRD {crd}: {source}")]
    ReadCrd {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
    /// None of the CRD's versions is marked as the storage version.
    #[error("CRD {crd} has no storage version")]
    NoStorageVersion {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
    },
    /// A page of the CRD's objects could not be listed.
    #[error("listing {crd}: {source}")]
    List {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
    /// An object could not be written again (an error other than 404 Not Found or 409
    /// Conflict, which count as gone and changed).
    #[error("rewriting {crd} {object}: {source}")]
    Rewrite {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The object, as `<namespace>/<name>` (an empty namespace when cluster-scoped).
        object: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
    /// An object's managed fields could not be cleaned (an error other than 404 Not Found, or
    /// a conflict on every try).
    #[error("cleaning the managed fields of {crd} {object}: {source}")]
    CleanManagedFields {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The object, as `<namespace>/<name>` (an empty namespace when cluster-scoped).
        object: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
    /// The CRD could not be marked with the generation whose managed fields were cleaned.
    #[error("marking {crd} cleaned at generation {generation}: {source}")]
    MarkCleaned {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The CRD's generation.
        generation: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
    /// The CRD's `status.storedVersions` could not be set to the storage version alone (a
    /// conflict when the CRD changed since it was read).
    #[error("setting {crd}'s storedVersions to [{storage}]: {source}")]
    StoredVersions {
        /// The CRD's name (`<plural>.<group>`).
        crd: String,
        /// The storage version it was to be set to (e.g. `v1beta2`).
        storage: String,
        /// The API server's or the client's error.
        source: kube::Error,
    },
}

/// What one CRD's migration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// The CRD's name (`<plural>.<group>`).
    pub crd: String,
    /// Its kind.
    pub kind: String,
    /// The storage version it was migrated to, as `<group>/<version>`.
    pub api_version: String,
    /// OpenStackServers whose owner reference was pointed at that version.
    pub owners_repointed: usize,
    /// `storedVersions` before.
    pub stored_before: Vec<String>,
    /// Objects written again.
    pub rewritten: usize,
    /// Objects that changed or went since the list (stored anew by that change, or gone).
    pub skipped: usize,
}

/// Runs `phases` on each CRD named (`<plural>.<group>`) that needs them: its storage first,
/// then its managed fields, in the order of Cluster API's migrator. The storage migrations
/// done are returned.
pub async fn migrate_all(
    client: &kube::Client,
    crds: &[String],
    phases: &[MigrationPhase],
    metrics: &MigrationMetrics,
) -> Result<Vec<Migrated>, MigrationError> {
    let mut done = Vec::new();
    for name in crds {
        if phases.contains(&MigrationPhase::StorageVersionMigration)
            && let Some(mut migrated) = migrate(client, name, metrics).await?
        {
            migrated.owners_repointed = repoint_servers_owners(client, &migrated).await?;
            done.push(migrated);
        }
        if phases.contains(&MigrationPhase::CleanupManagedFields) {
            clean_managed_fields(client, name, metrics).await?;
        }
    }
    Ok(done)
}

/// Points the owner references of OpenStackServers that name `migrated`'s kind at its new
/// storage version. A rollback to CAPO 0.14 moves storage to `v1beta1` and then installs
/// CRDs that serve `v1beta1` alone: a server capo-rs made names its machine as `v1beta2`,
/// which CAPO's watch then cannot map to its machine (controller-runtime's
/// `enqueueRequestForOwner` needs a served version), so CAPO would look at that machine again
/// only at its sync period. The storage version is served by any CRD that stores it.
async fn repoint_servers_owners(
    client: &kube::Client,
    migrated: &Migrated,
) -> Result<usize, MigrationError> {
    let (group, _) = migrated.api_version.split_once('/').unwrap_or_default();
    let servers: Api<capo_api::OpenStackServer> = Api::all(client.clone());
    let crd = "openstackservers.infrastructure.cluster.x-k8s.io";
    let list = servers
        .list_metadata(&ListParams::default())
        .await
        .map_err(|source| MigrationError::List {
            crd: crd.to_owned(),
            source,
        })?;
    let mut repointed = 0;
    for server in &list.items {
        let refs = server
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default();
        let Some(refs) = owners_at(refs, group, &migrated.kind, &migrated.api_version) else {
            continue;
        };
        let (namespace, name) = (
            server.metadata.namespace.as_deref().unwrap_or_default(),
            server.metadata.name.as_deref().unwrap_or_default(),
        );
        // The references as read, or nothing: a 409 means the server changed since the list.
        let patch = json!({"metadata": {
            "resourceVersion": server.metadata.resource_version,
            "ownerReferences": refs,
        }});
        let api: Api<capo_api::OpenStackServer> = Api::namespaced(client.clone(), namespace);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => repointed += 1,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => {
                return Err(MigrationError::Rewrite {
                    crd: crd.to_owned(),
                    object: format!("{namespace}/{name}"),
                    source,
                });
            }
        }
    }
    tracing::info!(kind = %migrated.kind, api_version = %migrated.api_version, repointed, "OpenStackServers' owner references point at the storage version");
    Ok(repointed)
}

/// `refs` with every reference to `kind` of `group` in another version naming `api_version`
/// instead; `None` when none does.
fn owners_at(
    refs: &[OwnerReference],
    group: &str,
    kind: &str,
    api_version: &str,
) -> Option<Vec<OwnerReference>> {
    let stale = |r: &OwnerReference| {
        r.kind == kind
            && r.api_version != api_version
            && r.api_version
                .split_once('/')
                .is_some_and(|(g, _)| g == group)
    };
    refs.iter().any(stale).then(|| {
        refs.iter()
            .map(|r| match stale(r) {
                true => OwnerReference {
                    api_version: api_version.to_owned(),
                    ..r.clone()
                },
                false => r.clone(),
            })
            .collect()
    })
}

/// Migrates one CRD, if its stored versions are more than its storage version.
pub async fn migrate(
    client: &kube::Client,
    name: &str,
    metrics: &MigrationMetrics,
) -> Result<Option<Migrated>, MigrationError> {
    let (crds, crd) = read_crd(client, name).await?;
    let stored: Vec<String> = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let storage = storage_version(&crd, name)?;
    metrics
        .stored_versions
        .with_label_values(&[name])
        .set(i64::try_from(stored.len()).unwrap_or(i64::MAX));
    if stored.is_empty() || stored == [storage.clone()] {
        return Ok(None);
    }
    let started = Instant::now();
    tracing::info!(crd = name, stored_versions = ?stored, storage = %storage, "migrating storage");
    let resource = resource_at(&crd, &storage);
    let mut migrated = rewrite_every_object(client, name, &resource, metrics).await?;
    migrated.stored_before = stored;
    migrated.kind = resource.kind.clone();
    migrated.api_version = resource.api_version.clone();
    set_stored_versions(&crds, &crd, &storage).await?;
    metrics.stored_versions.with_label_values(&[name]).set(1);
    tracing::info!(
        crd = name,
        rewritten = migrated.rewritten,
        skipped = migrated.skipped,
        took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        storage = %storage,
        "storage migrated"
    );
    Ok(Some(migrated))
}

/// The CRD named, and the API it was read through.
async fn read_crd(
    client: &kube::Client,
    name: &str,
) -> Result<(Api<CustomResourceDefinition>, CustomResourceDefinition), MigrationError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get(name)
        .await
        .map_err(|source| MigrationError::ReadCrd {
            crd: name.to_owned(),
            source,
        })?;
    Ok((crds, crd))
}

fn storage_version(crd: &CustomResourceDefinition, name: &str) -> Result<String, MigrationError> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .ok_or_else(|| MigrationError::NoStorageVersion {
            crd: name.to_owned(),
        })
}

/// The CRD's kind in `version`.
fn resource_at(crd: &CustomResourceDefinition, version: &str) -> ApiResource {
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.to_owned(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

/// Cluster API's CleanupManagedFields phase on one CRD: every object's `managedFields` entries
/// recorded in a version the CRD no longer serves are dropped. The API server keeps such
/// entries for ever, and a server-side apply to the object then fails converting them
/// (kubernetes/kubernetes#111937): objects written in v1alpha7 or v1alpha6 under CAPO carry
/// them once capo-rs's CRDs serve v1beta1 and v1beta2 alone. Once per CRD generation, marked
/// on the CRD with [`OBSERVED_GENERATION`]; the objects cleaned, or `None` when the CRD's
/// generation was done already.
pub async fn clean_managed_fields(
    client: &kube::Client,
    name: &str,
    metrics: &MigrationMetrics,
) -> Result<Option<usize>, MigrationError> {
    let (crds, crd) = read_crd(client, name).await?;
    let generation = crd.metadata.generation.unwrap_or_default().to_string();
    let observed = crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OBSERVED_GENERATION));
    if observed == Some(&generation) {
        return Ok(None);
    }
    let resource = resource_at(&crd, &storage_version(&crd, name)?);
    let served: BTreeSet<String> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| format!("{}/{}", crd.spec.group, v.name))
        .collect();
    let objects: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut cleaned = 0;
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = list_page(&objects, &params, name).await?;
        for object in page.items {
            let at = object_name(&object.metadata);
            let done = clean_object(client, &resource, &served, object.metadata)
                .await
                .map_err(|source| MigrationError::CleanManagedFields {
                    crd: name.to_owned(),
                    object: at,
                    source,
                })?;
            if done {
                cleaned += 1;
                metrics.fields_cleaned.with_label_values(&[name]).inc();
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let mark = json!({"metadata": {"annotations": {OBSERVED_GENERATION: generation}}});
    crds.patch(name, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .map_err(|source| MigrationError::MarkCleaned {
            crd: name.to_owned(),
            generation: generation.clone(),
            source,
        })?;
    tracing::info!(crd = name, cleaned, %generation, served = ?served, "managed fields of versions not served dropped");
    Ok(Some(cleaned))
}

/// One page of the CRD's objects, metadata only.
async fn list_page(
    objects: &Api<DynamicObject>,
    params: &ListParams,
    crd: &str,
) -> Result<kube::api::ObjectList<kube::core::PartialObjectMeta<DynamicObject>>, MigrationError> {
    objects
        .list_metadata(params)
        .await
        .map_err(|source| MigrationError::List {
            crd: crd.to_owned(),
            source,
        })
}

fn object_name(metadata: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        metadata.namespace.as_deref().unwrap_or_default(),
        metadata.name.as_deref().unwrap_or_default()
    )
}

/// Drops one object's entries of versions not `served` by a JSON patch that also names the
/// resourceVersion read, so that a write in between is a conflict, not lost: on a conflict the
/// object is read again and the cleanup tried again. Whether the object was written.
async fn clean_object(
    client: &kube::Client,
    resource: &ApiResource,
    served: &BTreeSet<String>,
    mut metadata: ObjectMeta,
) -> Result<bool, kube::Error> {
    let name = metadata.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> = match metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let mut tries = 0;
    loop {
        let entries = metadata.managed_fields.as_deref().unwrap_or_default();
        let now = Time(Timestamp::now());
        let Some(kept) = without_unserved(entries, served, &resource.api_version, &now) else {
            return Ok(false);
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "replace", "path": "/metadata/managedFields", "value": kept},
            {"op": "replace", "path": "/metadata/resourceVersion", "value": metadata.resource_version},
        ]))
        .map_err(kube::Error::SerdeError)?;
        tries += 1;
        match api
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(kube::Error::Api(e)) if e.code == 409 && tries < CONFLICT_RETRIES => {
                match api.get_metadata_opt(&name).await? {
                    Some(now) => metadata = now.metadata,
                    None => return Ok(false),
                }
            }
            Err(error) => return Err(error),
        }
    }
}

/// `entries` without those recorded in a version `served` does not hold; `None` when none
/// is. When none is left, one is put in their place that owns `metadata.name` alone, in
/// `storage` (the storage version, as `<group>/<version>`), under the first dropped entry's
/// manager and operation: an object with no entries at all would have the API server invent
/// one at the next server-side apply, co-owning every field (as Cluster API's migrator seeds).
pub fn without_unserved(
    entries: &[ManagedFieldsEntry],
    served: &BTreeSet<String>,
    storage: &str,
    now: &Time,
) -> Option<Vec<ManagedFieldsEntry>> {
    let is_served = |e: &&ManagedFieldsEntry| {
        e.api_version
            .as_deref()
            .is_some_and(|version| served.contains(version))
    };
    let kept: Vec<ManagedFieldsEntry> = entries.iter().filter(is_served).cloned().collect();
    if kept.len() == entries.len() {
        return None;
    }
    if !kept.is_empty() {
        return Some(kept);
    }
    let first = entries.first()?;
    Some(vec![ManagedFieldsEntry {
        api_version: Some(storage.to_owned()),
        fields_type: Some("FieldsV1".to_owned()),
        fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:name": {}}}))),
        manager: first.manager.clone(),
        operation: first.operation.clone(),
        subresource: None,
        time: Some(now.clone()),
    }])
}

async fn rewrite_every_object(
    client: &kube::Client,
    crd: &str,
    resource: &ApiResource,
    metrics: &MigrationMetrics,
) -> Result<Migrated, MigrationError> {
    let objects: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut migrated = Migrated {
        crd: crd.to_owned(),
        ..Migrated::default()
    };
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = list_page(&objects, &params, crd).await?;
        for object in &page.items {
            let (namespace, name) = (
                object.metadata.namespace.as_deref(),
                object.metadata.name.as_deref().unwrap_or_default(),
            );
            let api: Api<DynamicObject> = match namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            // Only the resourceVersion: the write changes nothing, and if the object changed
            // since the list, that change stored it anew already (409 is done, not failed).
            let patch = json!({"metadata": {"resourceVersion": object.metadata.resource_version}});
            let result = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            let outcome = match result {
                Ok(_) => "migrated",
                Err(kube::Error::Api(e)) if e.code == 404 => "gone",
                Err(kube::Error::Api(e)) if e.code == 409 => "changed",
                Err(source) => {
                    metrics.objects.with_label_values(&[crd, "error"]).inc();
                    return Err(MigrationError::Rewrite {
                        crd: crd.to_owned(),
                        object: format!("{}/{name}", namespace.unwrap_or_default()),
                        source,
                    });
                }
            };
            metrics.objects.with_label_values(&[crd, outcome]).inc();
            match outcome {
                "migrated" => migrated.rewritten += 1,
                _ => migrated.skipped += 1,
            }
        }
        tracing::info!(
            crd,
            rewritten = migrated.rewritten,
            skipped = migrated.skipped,
            "storage migration progress"
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(migrated),
        }
    }
}

/// `storedVersions: [storage]`, through /status (the API server checks no stored version
/// there), on the CRD as read: a CRD changed meanwhile is a conflict, and the next run
/// starts again.
async fn set_stored_versions(
    crds: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    storage: &str,
) -> Result<(), MigrationError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": crd.metadata.resource_version},
        "status": {"storedVersions": [storage]},
    });
    crds.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| MigrationError::StoredVersions {
            crd: name,
            storage: storage.to_owned(),
            source,
        })
}

/// Migrates until it succeeds (a failure, such as a webhook not yet reachable, is retried
/// with a growing pause) or `shutdown`. The controllers do not wait for it: an object
/// stored in the old version reads through the conversion webhook meanwhile.
pub async fn migrate_until_done(
    client: kube::Client,
    crds: Vec<String>,
    phases: Vec<MigrationPhase>,
    metrics: MigrationMetrics,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        match migrate_all(&client, &crds, &phases, &metrics).await {
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, retry_in_s = pause.as_secs(), "storage migration failed; will retry")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(api_version: &str, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "m".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    const GROUP: &str = "infrastructure.cluster.x-k8s.io";

    fn entry(manager: &str, api_version: &str, operation: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            api_version: Some(api_version.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {"f:x": {}}}))),
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: None,
            time: None,
        }
    }

    fn served() -> BTreeSet<String> {
        ["v1beta1", "v1beta2"]
            .into_iter()
            .map(|v| format!("{GROUP}/{v}"))
            .collect()
    }

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn entries_of_versions_not_served_are_dropped_and_the_rest_kept_as_they_are() {
        let entries = [
            entry("capi", &format!("{GROUP}/v1alpha7"), "Update"),
            entry("capo-rs", &format!("{GROUP}/v1beta2"), "Apply"),
            entry("kubectl", &format!("{GROUP}/v1beta1"), "Update"),
        ];
        let kept = without_unserved(&entries, &served(), &format!("{GROUP}/v1beta2"), &now())
            .expect("one dropped");
        assert_eq!(kept, entries[1..].to_vec());
    }

    #[test]
    fn entries_all_served_need_no_write() {
        let entries = [entry("capo-rs", &format!("{GROUP}/v1beta2"), "Apply")];
        let storage = format!("{GROUP}/v1beta2");
        assert_eq!(
            without_unserved(&entries, &served(), &storage, &now()),
            None
        );
        assert_eq!(without_unserved(&[], &served(), &storage, &now()), None);
    }

    #[test]
    fn when_every_entry_goes_one_owning_the_name_alone_is_left_in_the_storage_version() {
        let entries = [
            entry("capo", &format!("{GROUP}/v1alpha7"), "Update"),
            entry("kubectl", &format!("{GROUP}/v1alpha6"), "Apply"),
            ManagedFieldsEntry::default(),
        ];
        let storage = format!("{GROUP}/v1beta2");
        let kept = without_unserved(&entries, &served(), &storage, &now()).expect("dropped");
        assert_eq!(kept.len(), 1);
        let seed = &kept[0];
        assert_eq!(seed.api_version.as_deref(), Some(storage.as_str()));
        assert_eq!(
            (seed.manager.as_deref(), seed.operation.as_deref()),
            (Some("capo"), Some("Update")),
            "the first dropped entry's manager and operation"
        );
        assert_eq!(
            seed.fields_v1,
            Some(FieldsV1(json!({"f:metadata": {"f:name": {}}})))
        );
        assert_eq!(seed.fields_type.as_deref(), Some("FieldsV1"));
        assert_eq!(seed.time, Some(now()));
    }

    #[test]
    fn a_reference_to_the_migrated_kind_in_another_version_names_the_storage_version() {
        let refs = [
            owner(
                "infrastructure.cluster.x-k8s.io/v1beta2",
                "OpenStackMachine",
            ),
            owner("cluster.x-k8s.io/v1beta2", "Machine"),
        ];
        let now = owners_at(
            &refs,
            GROUP,
            "OpenStackMachine",
            "infrastructure.cluster.x-k8s.io/v1beta1",
        )
        .expect("repointed");
        assert_eq!(
            now[0].api_version,
            "infrastructure.cluster.x-k8s.io/v1beta1"
        );
        assert_eq!((now[0].controller, now[0].uid.as_str()), (Some(true), "u"));
        assert_eq!(now[1], refs[1], "another kind is left as it is");
    }

    #[test]
    fn references_already_at_the_storage_version_or_to_other_kinds_need_no_write() {
        let at = "infrastructure.cluster.x-k8s.io/v1beta1";
        assert_eq!(
            owners_at(
                &[owner(at, "OpenStackMachine")],
                GROUP,
                "OpenStackMachine",
                at
            ),
            None
        );
        let other = [owner(
            "infrastructure.cluster.x-k8s.io/v1beta2",
            "OpenStackCluster",
        )];
        assert_eq!(owners_at(&other, GROUP, "OpenStackMachine", at), None);
        let another_group = [owner("example.com/v1beta2", "OpenStackMachine")];
        assert_eq!(
            owners_at(&another_group, GROUP, "OpenStackMachine", at),
            None
        );
        assert_eq!(owners_at(&[], GROUP, "OpenStackMachine", at), None);
    }
}
