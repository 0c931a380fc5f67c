//! Storage migration, as Cluster API's CRD migrator does it. For each of our CRDs whose
//! `status.storedVersions` lists more than its storage version (CAPO 0.14 stored v1beta1;
//! we store v1beta2), every object is written once without a change (a merge patch holding
//! only its resourceVersion), which makes the API server store it again in the storage
//! version; then `storedVersions` is set to the storage version alone, so that a later CRD
//! may drop the old version. Safe to repeat: a CRD already migrated is skipped, and an
//! object that changed or went meanwhile needs nothing more. Nothing but the encoding
//! changes: the patch carries no field of the object.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// How many objects one list page holds.
const PAGE: u32 = 250;

/// Progress, for logs and dashboards.
#[derive(Clone)]
pub struct MigrationMetrics {
    objects: IntCounterVec,
    stored_versions: IntGaugeVec,
}

impl MigrationMetrics {
    /// Creates `capo_crd_storage_migration_objects_total` and `capo_crd_stored_versions` and
    /// registers them in `registry`; an error if either is already registered there.
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
        registry.register(Box::new(objects.clone()))?;
        registry.register(Box::new(stored_versions.clone()))?;
        Ok(MigrationMetrics {
            objects,
            stored_versions,
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

/// Migrates each CRD named (`<plural>.<group>`) that needs it.
pub async fn migrate_all(
    client: &kube::Client,
    crds: &[String],
    metrics: &MigrationMetrics,
) -> Result<Vec<Migrated>, MigrationError> {
    let mut done = Vec::new();
    for name in crds {
        if let Some(mut migrated) = migrate(client, name, metrics).await? {
            migrated.owners_repointed = repoint_servers_owners(client, &migrated).await?;
            done.push(migrated);
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
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get(name)
        .await
        .map_err(|source| MigrationError::ReadCrd {
            crd: name.to_owned(),
            source,
        })?;
    let stored: Vec<String> = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .ok_or_else(|| MigrationError::NoStorageVersion {
            crd: name.to_owned(),
        })?;
    metrics
        .stored_versions
        .with_label_values(&[name])
        .set(i64::try_from(stored.len()).unwrap_or(i64::MAX));
    if stored.is_empty() || stored == [storage.clone()] {
        return Ok(None);
    }
    let started = Instant::now();
    tracing::info!(crd = name, stored_versions = ?stored, storage = %storage, "migrating storage");
    let resource = ApiResource {
        group: crd.spec.group.clone(),
        version: storage.clone(),
        api_version: format!("{}/{storage}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
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
        let page = objects
            .list_metadata(&params)
            .await
            .map_err(|source| MigrationError::List {
                crd: crd.to_owned(),
                source,
            })?;
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
    metrics: MigrationMetrics,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    loop {
        match migrate_all(&client, &crds, &metrics).await {
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
