//! Each controller wired to its watches: what wakes an object, and what does not.
//!
//! - Our objects wake their reconciler when their spec (generation), labels, annotations
//!   (paused) or deletion change; our own status writes do not.
//! - A Secret's creation or change wakes the objects that name it (credentials, user data):
//!   a metadata-only watch, so no Secret's contents are held in memory.
//! - A Cluster's `spec.paused` wakes the objects labelled with its name.
//! - An object that does not decode is handed over as such (`DeserializeGuard`), reported
//!   and skipped; it never stalls the watch.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use capo_api::capi::{self, Cluster};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackServer};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::controllers::metrics::ReconcileMetrics;
use crate::controllers::{Context, cluster, machine, server};
use crate::manager::Health;

/// Which objects this manager reconciles.
#[derive(Clone, Debug, Default)]
pub struct WatchScope {
    /// Only this namespace; all when `None`.
    pub namespace: Option<String>,
    /// Only objects labelled `cluster.x-k8s.io/watch-filter=<value>` (CAPI's `--watch-filter`).
    pub watch_filter: Option<String>,
}

impl WatchScope {
    pub fn api<K>(&self, client: kube::Client) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }

    /// The watch of Cluster API objects (ours and Clusters): filtered by label when asked.
    pub fn watcher_config(&self) -> watcher::Config {
        match &self.watch_filter {
            Some(value) => watcher::Config::default()
                .labels(&format!("{}={value}", capi::labels::WATCH_FILTER)),
            None => watcher::Config::default(),
        }
    }
}

/// Notes, for the queue depth metric, every object a trigger hands a controller.
#[derive(Clone)]
struct Queue {
    metrics: ReconcileMetrics,
    controller: &'static str,
}

impl Queue {
    fn new(ctx: &Context, controller: &'static str) -> Self {
        Queue {
            metrics: ctx.metrics.clone(),
            controller,
        }
    }

    fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!(
            "{}/{}/{name}",
            self.controller,
            namespace.unwrap_or_default()
        )
    }

    fn note<K: reflector::Lookup + ?Sized>(&self, object: &ObjectRef<K>) {
        let key = self.key(object.namespace.as_deref(), &object.name);
        self.metrics.queued(self.controller, key);
    }

    fn note_object<K: Resource>(&self, object: &K) {
        let key = self.key(object.meta().namespace.as_deref(), &object.name_any());
        self.metrics.queued(self.controller, key);
    }

    /// An object that was gone by the time its turn came.
    fn dropped(&self, namespace: Option<&str>, name: &str) {
        self.metrics
            .unqueued(self.controller, &self.key(namespace, name));
    }

    /// `mapper`, noting what it picks.
    fn mapping<T, K, I, F>(&self, mapper: F) -> impl Fn(T) -> Vec<ObjectRef<K>> + use<T, K, I, F>
    where
        K: reflector::Lookup,
        I: IntoIterator<Item = ObjectRef<K>>,
        F: Fn(T) -> I,
    {
        let queue = self.clone();
        move |value| {
            let picked: Vec<ObjectRef<K>> = mapper(value).into_iter().collect();
            for object in &picked {
                queue.note(object);
            }
            picked
        }
    }

    /// Own objects' changes, noted.
    fn own<K: Resource, E, S>(
        &self,
        stream: S,
    ) -> impl futures::Stream<Item = Result<K, E>> + use<K, E, S>
    where
        S: futures::Stream<Item = Result<K, E>>,
    {
        let queue = self.clone();
        stream.inspect(move |result| {
            if let Ok(object) = result {
                queue.note_object(object);
            }
        })
    }

    /// Wake-ups, noted.
    fn wakeups<K: reflector::Lookup, S>(
        &self,
        stream: S,
    ) -> impl futures::Stream<Item = ObjectRef<K>> + use<K, S>
    where
        S: futures::Stream<Item = ObjectRef<K>>,
    {
        let queue = self.clone();
        stream.inspect(move |object| queue.note(object))
    }
}

/// What in an object's metadata and spec calls for a reconcile (not its status, which we
/// write ourselves).
fn reconcile_worthy<K: Resource>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let mut hasher = DefaultHasher::new();
    // An owner appearing matters: an OpenStackMachine waits for its Machine.
    let owners: Vec<(&str, &str)> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.as_str(), o.uid.as_str()))
        .collect();
    (
        meta.generation,
        &meta.labels,
        &meta.annotations,
        meta.deletion_timestamp.is_some(),
        owners,
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

fn paused_changes(cluster: &Cluster) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    (cluster.spec.paused, predicates::generation(cluster)).hash(&mut hasher);
    Some(hasher.finish())
}

/// A Cluster's objects in `store`: those labelled with its name, in its namespace.
fn labelled_for_cluster<K>(store: Store<K>) -> impl Fn(Cluster) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    move |cluster| {
        let name = cluster.name_any();
        pick(&store, cluster.namespace(), |object: &K| {
            capi::cluster_name(object.labels()) == Some(name.as_str())
        })
    }
}

/// Objects in `store` within the namespace of `meta` that `wanted` picks.
fn pick<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
    namespace: Option<String>,
    wanted: impl Fn(&K) -> bool,
) -> Vec<ObjectRef<K>> {
    store
        .state()
        .into_iter()
        .filter(|object| object.namespace() == namespace && wanted(object))
        .map(|object| ObjectRef::from(object.as_ref()))
        .collect()
}

/// A watch stream of `K` that restarts with backoff on errors.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<K, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Clone + Eq + Hash,
{
    watcher(api, config).default_backoff().touched_objects()
}

/// A controller's own objects, mirrored in a store, waking it only for what
/// [`reconcile_worthy`] sees change.
fn own_objects<K>(
    scope: &WatchScope,
    client: kube::Client,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + use<K>,
)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let stream = reflector(
        writer,
        watcher(scope.api::<K>(client), scope.watcher_config()).modify(strip_for_cache),
    )
    .default_backoff()
    .touched_objects()
    .predicate_filter(reconcile_worthy, Default::default());
    (reader, stream)
}

/// What the store keeps of an object: no reconciler reads its field managers or the
/// copy `kubectl apply` leaves, which are often most of its bytes.
pub fn strip_for_cache<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    if let Some(annotations) = object.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Secrets (metadata only). A relist (after a watch error) hands back every Secret
/// unchanged: only a new resourceVersion wakes anything.
fn secret_changes(
    scope: &WatchScope,
    client: kube::Client,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>> + use<> {
    watch(
        scope.api::<PartialObjectMeta<Secret>>(client),
        watcher::Config::default(),
    )
    .predicate_filter(predicates::resource_version, Default::default())
}

/// Cluster API Clusters, when they appear or their `spec.paused` changes.
fn capi_cluster_changes(
    scope: &WatchScope,
    client: kube::Client,
) -> impl futures::Stream<Item = Result<Cluster, watcher::Error>> + use<> {
    watch(scope.api::<Cluster>(client), scope.watcher_config())
        .predicate_filter(paused_changes, Default::default())
}

/// The OpenStackServer controller, until `shutdown`; reconciles in flight finish first.
pub async fn run_servers(
    ctx: Arc<Context>,
    scope: &WatchScope,
    concurrency: u16,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    type Watched = DeserializeGuard<OpenStackServer>;
    let client = ctx.client.clone();
    let (reader, servers) = own_objects::<Watched>(scope, client.clone());
    let secrets = secret_changes(scope, client.clone());
    let clusters = capi_cluster_changes(scope, client);
    let by_secret = reader.clone();
    let by_cluster = reader.clone();
    let listed = reader.clone();
    ctx.metrics
        .controller_started(server::CONTROLLER, usize::from(concurrency));
    let queue = Queue::new(&ctx, server::CONTROLLER);
    let queue_name = server::CONTROLLER;
    let controller = Controller::for_stream(queue.own(servers), reader)
        .watches_stream(
            secrets,
            queue.mapping(move |secret: PartialObjectMeta<Secret>| {
                let name = secret.name_any();
                pick(&by_secret, secret.namespace(), |object: &Watched| {
                    object
                        .0
                        .as_ref()
                        .is_ok_and(|server| names_secret(server, &name))
                })
            }),
        )
        .watches_stream(clusters, queue.mapping(labelled_for_cluster(by_cluster)))
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(server::reconcile, server::error_policy, ctx)
        .for_each(log_errors(queue));
    let synced = Synced {
        health,
        controller: queue_name,
    };
    until_stopped(controller, listed, synced, shutdown).await;
}

/// What wakes an OpenStackCluster besides its own changes: the engine's wake-ups (through
/// `reconcile_on`) and re-syncs.
pub struct ClusterWakeups {
    pub changed: futures::channel::mpsc::UnboundedReceiver<ObjectRef<cluster::Watched>>,
    pub resync: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// The OpenStackCluster controller, until `shutdown`; reconciles in flight finish first.
pub async fn run_clusters(
    ctx: Arc<Context>,
    scope: &WatchScope,
    concurrency: u16,
    wakeups: ClusterWakeups,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    type Watched = cluster::Watched;
    let client = ctx.client.clone();
    let (reader, clusters) = own_objects::<Watched>(scope, client.clone());
    let secrets = secret_changes(scope, client.clone());
    let capi_clusters = capi_cluster_changes(scope, client.clone());
    // Control-plane machines change the desired members: their address, their deletion.
    // (Through `DeserializeGuard`: one undecodable object must not stall the watch.)
    let machines = watch(
        scope.api::<DeserializeGuard<OpenStackMachine>>(client.clone()),
        scope.watcher_config(),
    )
    .predicate_filter(member_changes, Default::default());
    // The bastion's server, as it builds.
    let bastions = watch(
        scope.api::<DeserializeGuard<OpenStackServer>>(client),
        scope.watcher_config(),
    )
    .predicate_filter(predicates::resource_version, Default::default());
    let by_secret = reader.clone();
    let by_cluster = reader.clone();
    let by_machine = reader.clone();
    let listed = reader.clone();
    ctx.metrics
        .controller_started(cluster::CONTROLLER, usize::from(concurrency));
    let queue = Queue::new(&ctx, cluster::CONTROLLER);
    let queue_name = cluster::CONTROLLER;
    let controller = Controller::for_stream(queue.own(clusters), reader)
        .watches_stream(
            secrets,
            queue.mapping(move |secret: PartialObjectMeta<Secret>| {
                let name = secret.name_any();
                pick(&by_secret, secret.namespace(), |object: &Watched| {
                    object.0.as_ref().is_ok_and(|c| {
                        c.spec.identity_ref.kind() == capo_api::common::IdentityRefType::Secret
                            && c.spec.identity_ref.name == name
                    })
                })
            }),
        )
        .watches_stream(
            capi_clusters,
            queue.mapping(labelled_for_cluster(by_cluster)),
        )
        .watches_stream(
            machines,
            queue.mapping(move |machine: DeserializeGuard<OpenStackMachine>| {
                let name = capi::cluster_name(machine.labels()).map(str::to_owned);
                pick(&by_machine, machine.namespace(), |object: &Watched| {
                    name.is_some() && capi::cluster_name(object.labels()) == name.as_deref()
                })
            }),
        )
        .watches_stream(
            bastions,
            queue.mapping(|server: DeserializeGuard<OpenStackServer>| {
                owned_by::<Watched>(&server, "OpenStackCluster")
            }),
        )
        .reconcile_on(queue.wakeups(wakeups.changed))
        .reconcile_all_on(wakeups.resync)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(cluster::reconcile, cluster::error_policy, ctx)
        .for_each(log_errors(queue));
    let synced = Synced {
        health,
        controller: queue_name,
    };
    until_stopped(controller, listed, synced, shutdown).await;
}

/// What wakes an OpenStackMachine besides its own changes: the engine's wake-ups and
/// re-syncs.
pub struct MachineWakeups {
    pub changed: futures::channel::mpsc::UnboundedReceiver<ObjectRef<machine::Watched>>,
    pub resync: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// The OpenStackMachine controller, until `shutdown`; reconciles in flight finish first.
pub async fn run_machines(
    ctx: Arc<Context>,
    scope: &WatchScope,
    concurrency: u16,
    wakeups: MachineWakeups,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    type Watched = machine::Watched;
    let client = ctx.client.clone();
    let (reader, machines) = own_objects::<Watched>(scope, client.clone());
    let capi_clusters = capi_cluster_changes(scope, client.clone());
    // The Machine: its bootstrap data, its deletion and hooks.
    let capi_machines = watch(
        scope.api::<DeserializeGuard<capi::Machine>>(client.clone()),
        scope.watcher_config(),
    )
    .predicate_filter(capi_machine_changes, Default::default());
    // The machine's server, as it builds.
    let servers = watch(
        scope.api::<DeserializeGuard<OpenStackServer>>(client.clone()),
        scope.watcher_config(),
    )
    .predicate_filter(predicates::resource_version, Default::default());
    // The cluster's infrastructure: provisioned, its load balancer's pools, its deletion.
    let infra = watch(
        scope.api::<DeserializeGuard<OpenStackCluster>>(client),
        scope.watcher_config(),
    )
    .predicate_filter(infra_changes, Default::default());
    let by_cluster = reader.clone();
    let by_infra = reader.clone();
    let listed = reader.clone();
    ctx.metrics
        .controller_started(machine::CONTROLLER, usize::from(concurrency));
    let queue = Queue::new(&ctx, machine::CONTROLLER);
    let queue_name = machine::CONTROLLER;
    let controller = Controller::for_stream(queue.own(machines), reader)
        .watches_stream(
            capi_clusters,
            queue.mapping(labelled_for_cluster(by_cluster)),
        )
        .watches_stream(
            capi_machines,
            queue.mapping(|owner: DeserializeGuard<capi::Machine>| {
                let infrastructure = owner
                    .0
                    .as_ref()
                    .ok()
                    .and_then(|m| m.spec.infrastructure_ref.clone())
                    .filter(|r| r.kind == "OpenStackMachine");
                infrastructure.map(|r| {
                    let mut object = ObjectRef::<Watched>::new(&r.name);
                    object.namespace = owner.namespace();
                    object
                })
            }),
        )
        .watches_stream(
            servers,
            queue.mapping(|server: DeserializeGuard<OpenStackServer>| {
                owned_by::<Watched>(&server, "OpenStackMachine")
            }),
        )
        .watches_stream(
            infra,
            queue.mapping(move |osc: DeserializeGuard<OpenStackCluster>| {
                let name = capi::cluster_name(osc.labels())
                    .map(str::to_owned)
                    .unwrap_or_else(|| osc.name_any());
                pick(&by_infra, osc.namespace(), |object: &Watched| {
                    capi::cluster_name(object.labels()) == Some(name.as_str())
                })
            }),
        )
        .reconcile_on(queue.wakeups(wakeups.changed))
        .reconcile_all_on(wakeups.resync)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(machine::reconcile, machine::error_policy, ctx)
        .for_each(log_errors(queue));
    let synced = Synced {
        health,
        controller: queue_name,
    };
    until_stopped(controller, listed, synced, shutdown).await;
}

/// What about a Machine matters to its OpenStackMachine.
fn capi_machine_changes(machine: &DeserializeGuard<capi::Machine>) -> Option<u64> {
    let Ok(machine) = machine.0.as_ref() else {
        return Some(0);
    };
    let mut hasher = DefaultHasher::new();
    let deleting_reason = machine.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == capi::deleting::CONDITION)
            .map(|c| c.reason.clone())
    });
    (
        machine.meta().deletion_timestamp.is_some(),
        &machine.spec.bootstrap.data_secret_name,
        &machine.spec.failure_domain,
        capi::pre_terminate_hooks(machine.annotations()),
        deleting_reason,
        machine.spec.infrastructure_ref.as_ref().map(|r| &r.name),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// What about an OpenStackCluster matters to its machines.
fn infra_changes(cluster: &DeserializeGuard<OpenStackCluster>) -> Option<u64> {
    let Ok(cluster) = cluster.0.as_ref() else {
        return Some(0);
    };
    let mut hasher = DefaultHasher::new();
    let status = cluster.status.as_ref();
    let provisioned = status
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned);
    let lb = status
        .and_then(|s| s.api_server_managed_load_balancer.as_ref())
        .map(|lb| {
            let pools: Vec<(i32, &str)> = lb
                .pools
                .iter()
                .map(|p| (p.port, p.pool_id.as_str()))
                .collect();
            (lb.id.as_str(), format!("{pools:?}"))
        });
    (provisioned, lb, cluster.meta().deletion_timestamp.is_some()).hash(&mut hasher);
    Some(hasher.finish())
}

/// What about a machine changes its cluster's desired members.
fn member_changes(machine: &DeserializeGuard<OpenStackMachine>) -> Option<u64> {
    let machine = machine.0.as_ref().ok()?;
    let mut hasher = DefaultHasher::new();
    (
        capi::is_control_plane(machine.labels()),
        crate::controllers::gate::member_address(machine),
        crate::controllers::gate::is_leaving(machine),
        &machine.spec.provider_id,
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Where a controller reports that its cache has listed once (`/readyz`).
struct Synced {
    health: Arc<Health>,
    controller: &'static str,
}

/// Runs a controller until its graceful shutdown ends. kube-runtime holds reconciles until
/// the store has listed once, and a controller told to stop before then never finishes; with
/// nothing in flight then, it is simply dropped.
async fn until_stopped<K: Resource + Clone>(
    controller: impl std::future::Future<Output = ()>,
    store: Store<K>,
    synced: Synced,
    shutdown: CancellationToken,
) where
    K::DynamicType: Eq + Hash + Clone,
{
    let listed = store.clone();
    let report = async move {
        if listed.wait_until_ready().await.is_ok() {
            synced.health.synced(synced.controller);
        }
        std::future::pending::<()>().await;
    };
    let never_listed = async move {
        shutdown.cancelled().await;
        if store.wait_until_ready().now_or_never().is_none() {
            return;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = controller => {}
        () = never_listed => tracing::debug!("stopped before the first list"),
        () = report => {}
    }
}

/// The objects of `K` (of kind `kind`) that own `object`, in its namespace.
fn owned_by<K>(object: &impl Resource, kind: &str) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    let namespace = object.meta().namespace.clone();
    object
        .owner_references()
        .iter()
        .filter(|o| o.kind == kind)
        .map(|o| {
            let mut owner = ObjectRef::<K>::new(&o.name);
            owner.namespace.clone_from(&namespace);
            owner
        })
        .collect()
}

/// Whether the server names this Secret, for credentials or user data.
fn names_secret(server: &OpenStackServer, secret: &str) -> bool {
    let identity = &server.spec.identity_ref;
    let credentials =
        identity.kind() == capo_api::common::IdentityRefType::Secret && identity.name == secret;
    let user_data = server
        .spec
        .user_data_ref
        .as_ref()
        .and_then(|r| r.name.as_deref())
        == Some(secret);
    credentials || user_data
}

/// What a controller's stream hands back, its errors logged.
fn log_errors<T, E: std::error::Error, Q: std::error::Error>(
    queue: Queue,
) -> impl FnMut(Result<T, controller::Error<E, Q>>) -> std::future::Ready<()> {
    move |result| {
        if let Err(error) = result {
            log_controller_error(&queue, &error);
        }
        std::future::ready(())
    }
}

/// Reconcile failures are logged where they happen, with their object; the rest here.
fn log_controller_error<E: std::error::Error, Q: std::error::Error>(
    queue: &Queue,
    error: &controller::Error<E, Q>,
) {
    let controller = queue.controller;
    match error {
        controller::Error::ReconcilerFailed(..) => {}
        controller::Error::ObjectNotFound(object) => {
            queue.dropped(object.namespace.as_deref(), &object.name);
            tracing::debug!(controller, %object, "object gone before its reconcile");
        }
        other => tracing::warn!(controller, error = %other, "watch trouble; retrying"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn the_cache_keeps_no_field_managers_and_no_last_applied_copy() {
        let mut secret = Secret::default();
        secret.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        secret.metadata.annotations = Some(
            [(LAST_APPLIED, "{...}"), ("team", "infra")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        );
        strip_for_cache(&mut secret);
        assert_eq!(secret.metadata.managed_fields, None);
        let annotations = secret.metadata.annotations.unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["team"], "infra");
    }
}
