//! Each controller wired to its watches: what wakes an object, and what does not.
//!
//! - Our objects wake their reconciler when their spec (generation), labels, annotations
//!   (paused) or deletion change; our own status writes do not.
//! - A Secret's creation or change wakes the objects that name it (credentials, user data):
//!   a metadata-only watch, so no Secret's contents are held in memory.
//! - A Cluster's `spec.paused` wakes the objects labelled with its name.
//! - An ORC Image that changes wakes the servers that name it (`spec.image.imageRef`); a
//!   cluster without ORC's CRD is watched again with backoff, so installing ORC later needs
//!   no restart.
//! - An object that does not decode is handed over as such (`DeserializeGuard`), reported
//!   and skipped; it never stalls the watch.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use capo_api::OpenStackServer;
use capo_api::capi::{self, Cluster};
use capo_api::ipam;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::controllers::metrics::ReconcileMetrics;
use crate::controllers::packed::{Packed, StoredMeta, identity_of, strip_metadata, version_of};
use crate::controllers::{
    Caches, ClientCache, Context, cluster, floating_ip_pool, machine, machine_template, server,
};
use crate::manager::Health;
use crate::manager::priority::Lanes;
use crate::manager::secret_readers::SecretReaders;
use crate::manager::shared::{Origin, SharedWatch, changed};
use crate::manager::sweep::due_passes;
use crate::manager::watch_backoff::{WatchBackoff, WatchBackoffExt};

/// Which objects this manager reconciles.
#[derive(Clone, Debug, Default)]
pub struct WatchScope {
    /// Only this namespace; all when `None`.
    pub namespace: Option<String>,
    /// Only objects labelled `cluster.x-k8s.io/watch-filter=<value>` (CAPI's `--watch-filter`).
    pub watch_filter: Option<String>,
}

impl WatchScope {
    /// An API for `K` in the scope's namespace, or across all namespaces when it names none.
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
            Some(value) => {
                listed_in_pages().labels(&format!("{}={value}", capi::labels::WATCH_FILTER))
            }
            None => listed_in_pages(),
        }
    }
}

/// Objects per page of a watch's list. A page is decoded whole before its first object
/// is stored (kube buffers the page as a tree of values, several times its text), and a
/// restarted controller lists every kind at once: with kube's default of 500, those pages
/// were most of a restart's peak (docs/memory.md).
const LIST_PAGE: u32 = 100;

/// A watch whose lists come in pages of [`LIST_PAGE`].
fn listed_in_pages() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
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
    fn own<K: Resource, S>(
        &self,
        stream: S,
    ) -> impl futures::Stream<Item = (Arc<K>, Origin)> + use<K, S>
    where
        S: futures::Stream<Item = (Arc<K>, Origin)>,
    {
        let queue = self.clone();
        stream.inspect(move |(object, _)| queue.note_object(object.as_ref()))
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
fn reconcile_worthy<K: Resource + StoredMeta>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let mut hasher = DefaultHasher::new();
    (
        meta.generation,
        object.stored_labels(),
        object.stored_annotations(),
        meta.deletion_timestamp.is_some(),
        // An owner appearing matters: an OpenStackMachine waits for its Machine.
        object.stored_owners(),
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
fn labelled_for_cluster<K>(store: Store<K>) -> impl Fn(Arc<Cluster>) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + StoredMeta + Clone,
{
    move |cluster| {
        let name = cluster.name_any();
        pick(&store, cluster.namespace(), |object: &K| {
            capi::cluster_name(object.stored_labels()) == Some(name.as_str())
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

/// The manager's one watch of each kind the controllers share (Secrets aside: see
/// `secret_changes`).
pub struct Watches {
    servers: SharedWatch<server::Watched>,
    infra_clusters: SharedWatch<cluster::Watched>,
    infra_machines: SharedWatch<machine::Watched>,
    clusters: SharedWatch<Cluster>,
    machines: SharedWatch<Packed<capi::Machine>>,
    templates: SharedWatch<machine_template::Watched>,
}

/// The futures that drive [`Watches`]: run them once every controller has subscribed.
pub type Drivers = Vec<futures::future::BoxFuture<'static, ()>>;

impl Watches {
    /// Sets up one shared watch per kind over `scope` (label-filtered when asked); nothing is
    /// watched until the returned [`Drivers`] run.
    pub fn new(scope: &WatchScope, client: &kube::Client) -> (Watches, Drivers) {
        let config = scope.watcher_config();
        let mut drivers: Drivers = Vec::new();
        let mut shared = |driver: futures::future::BoxFuture<'static, ()>| drivers.push(driver);
        let (servers, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config.clone(),
            packed_as_is::<server::Watched>,
        );
        shared(driver.boxed());
        let (infra_clusters, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config.clone(),
            packed_as_is::<cluster::Watched>,
        );
        shared(driver.boxed());
        let (infra_machines, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config.clone(),
            packed_as_is::<machine::Watched>,
        );
        shared(driver.boxed());
        let (clusters, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config.clone(),
            strip_for_cache::<Cluster>,
        );
        shared(driver.boxed());
        let (machines, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config.clone(),
            packed_as_is::<Packed<capi::Machine>>,
        );
        shared(driver.boxed());
        let (templates, driver) = SharedWatch::new(
            scope.api(client.clone()),
            config,
            strip_for_cache::<machine_template::Watched>,
        );
        shared(driver.boxed());
        let watches = Watches {
            servers,
            infra_clusters,
            infra_machines,
            clusters,
            machines,
            templates,
        };
        (watches, drivers)
    }

    /// The stores, for reconcilers to read.
    pub fn caches(&self) -> Caches {
        Caches {
            clusters: self.clusters.store(),
            machines: self.machines.store(),
            infra_clusters: self.infra_clusters.store(),
            infra_machines: self.infra_machines.store(),
            servers: self.servers.store(),
        }
    }

    /// Clusters, when they appear or their `spec.paused` changes.
    fn paused_clusters(
        &self,
    ) -> impl futures::Stream<Item = (Arc<Cluster>, Origin)> + Send + use<> {
        changed(
            self.clusters.subscribe(),
            self.clusters.store(),
            paused_changes,
        )
    }
}

/// What the store keeps of an object: no reconciler reads its field managers or the
/// copy `kubectl apply` leaves, which are often most of its bytes.
pub fn strip_for_cache<K: Resource>(object: &mut K) {
    strip_metadata(object.meta_mut());
}

/// A packed object as the store keeps it: stripped and trimmed when it was packed.
pub fn packed_as_is<K>(_object: &mut K) {}

/// Secrets that appear, change or go (metadata only: no Secret's contents are held). The
/// first list wakes nothing (every object is reconciled at start anyway); a relist after a
/// watch error wakes only what changed meanwhile. Each change or deletion also tells the
/// credentials cache that a Secret it read is not current.
fn secret_changes(
    scope: &WatchScope,
    ctx: &Arc<Context>,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>> + use<> {
    let seen = ctx.clone();
    let mut changes = SecretChanges::default();
    watcher(
        scope.api::<PartialObjectMeta<Secret>>(ctx.client.clone()),
        listed_in_pages(),
    )
    .watch_backoff()
    .inspect_ok(move |event| note_secret(&seen.clouds, event))
    .try_filter_map(move |event| std::future::ready(Ok(changes.wakes(event))))
}

/// The servers an ORC Image's change wakes: those in its namespace that name it.
fn orc_image_wakeups(
    scope: &WatchScope,
    client: &kube::Client,
    servers: Store<server::Watched>,
) -> impl futures::Stream<Item = ObjectRef<server::Watched>> + use<> {
    let resource = server::orc::image_resource();
    let api: Api<kube::api::DynamicObject> = match &scope.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    watcher(api, watcher::Config::default())
        .watch_backoff()
        .touched_objects()
        .filter_map(|image| {
            if let Err(error) = &image {
                tracing::debug!(%error, "ORC Images cannot be watched (is ORC installed?)");
            }
            std::future::ready(image.ok())
        })
        .flat_map(move |image| {
            let name = image.name_any();
            let named = pick(&servers, image.namespace(), |object: &server::Watched| {
                object.unpack().is_ok_and(|server| {
                    server
                        .spec
                        .image
                        .image_ref
                        .as_ref()
                        .is_some_and(|r| r.name == name)
                })
            });
            futures::stream::iter(named)
        })
}

/// Which Secret events wake anything: pure, so it is tested without a watch.
#[derive(Default)]
struct SecretChanges {
    /// A digest of each Secret's resourceVersion by its identity's (see `packed::identity_of`):
    /// a cluster's Secrets number several per machine, and the strings were most of this.
    versions: std::collections::HashMap<u64, Option<u64>>,
    listed_once: bool,
}

impl SecretChanges {
    fn wakes(
        &mut self,
        event: watcher::Event<PartialObjectMeta<Secret>>,
    ) -> Option<PartialObjectMeta<Secret>> {
        match event {
            watcher::Event::Init => None,
            watcher::Event::InitDone => {
                self.listed_once = true;
                None
            }
            watcher::Event::InitApply(secret) | watcher::Event::Apply(secret) => {
                let version = version_of(&secret.metadata);
                let new =
                    self.versions.insert(identity_of(&secret.metadata), version) != Some(version);
                (new && self.listed_once).then_some(secret)
            }
            watcher::Event::Delete(secret) => {
                self.versions.remove(&identity_of(&secret.metadata));
                Some(secret)
            }
        }
    }
}

fn note_secret(clouds: &ClientCache, event: &watcher::Event<PartialObjectMeta<Secret>>) {
    let (secret, deleted) = match event {
        watcher::Event::Apply(secret) | watcher::Event::InitApply(secret) => (secret, false),
        watcher::Event::Delete(secret) => (secret, true),
        watcher::Event::Init | watcher::Event::InitDone => return,
    };
    let label = format!(
        "{}/{}",
        secret.namespace().unwrap_or_default(),
        secret.name_any()
    );
    let (uid, version) = (
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default(),
    );
    clouds.secret_seen(
        &label,
        (!deleted).then_some((uid.as_str(), version.as_str())),
    );
}

/// The OpenStackServer controller, until `shutdown`; reconciles in flight finish first. It
/// subscribes to the watches now, so run it before the watches start.
pub fn run_servers(
    ctx: Arc<Context>,
    watches: &Watches,
    scope: &WatchScope,
    concurrency: u16,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, ()> {
    type Watched = server::Watched;
    let reader = watches.servers.store();
    let servers = changed(
        watches.servers.subscribe(),
        reader.clone(),
        reconcile_worthy,
    );
    let secrets = secret_changes(scope, &ctx);
    let images = orc_image_wakeups(scope, &ctx.client, reader.clone());
    let claims = claim_wakeups(scope, &ctx.client);
    let clusters = watches.paused_clusters();
    let by_secret = reader.clone();
    let readers = SecretReaders::new(|object: &Watched| {
        object
            .unpack()
            .map(|s| secrets_named(&s))
            .unwrap_or_default()
    });
    let by_cluster = reader.clone();
    let listed = reader.clone();
    let due = due_passes(ctx.clone(), server::CONTROLLER, reader.clone());
    // Boxed: the controller's future is large, and it is built before the caller's own
    // future is on the heap.
    Box::pin(async move {
        ctx.metrics
            .controller_started(server::CONTROLLER, usize::from(concurrency));
        let queue = Queue::new(&ctx, server::CONTROLLER);
        let queue_name = server::CONTROLLER;
        let (lanes, low) = Lanes::new(ctx.config.priority_queue, usize::from(concurrency));
        let controller = Controller::for_shared_stream(lanes.own(queue.own(servers)), reader)
            .watches_stream(
                secrets,
                queue.mapping(move |secret: PartialObjectMeta<Secret>| {
                    readers.naming(&by_secret, secret.namespace(), &secret.name_any())
                }),
            )
            .reconcile_on(lanes.related(clusters, queue.mapping(labelled_for_cluster(by_cluster))))
            .reconcile_on(lanes.news(queue.wakeups(images)))
            .reconcile_on(lanes.news(queue.wakeups(claims)))
            .reconcile_on(lanes.low(queue.wakeups(due)))
            .reconcile_on(low)
            .with_config(controller::Config::default().concurrency(concurrency))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(lanes.starting(server::reconcile), server::error_policy, ctx)
            .for_each(log_errors(queue, lanes));
        let synced = Synced {
            health,
            controller: queue_name,
        };
        until_stopped(controller, listed, synced, shutdown).await;
    })
}

/// The OpenStackFloatingIPPool controller, until `shutdown`. A pool is woken by its own
/// changes and by the IPAddressClaims and IPAddresses that name it. Those two kinds are Cluster
/// API's: where their CRDs are not installed, their watches retry with backoff and the pools
/// wait, so installing Cluster API's IPAM later needs no restart.
pub fn run_pools(
    ctx: Arc<Context>,
    scope: &WatchScope,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, ()> {
    let pools = scope.api::<floating_ip_pool::Watched>(ctx.client.clone());
    let claims = ipam_wakeups::<ipam::IPAddressClaim>(scope, &ctx.client, |c| &c.spec.pool_ref);
    let addresses = ipam_wakeups::<ipam::IPAddress>(scope, &ctx.client, |a| &a.spec.pool_ref);
    let config = scope.watcher_config();
    Box::pin(async move {
        ctx.metrics
            .controller_started(floating_ip_pool::CONTROLLER, 1);
        let queue = Queue::new(&ctx, floating_ip_pool::CONTROLLER);
        let controller = Controller::new(pools, config).trigger_backoff(WatchBackoff::default());
        let listed = controller.store();
        let due = due_passes(ctx.clone(), floating_ip_pool::CONTROLLER, listed.clone());
        let controller = controller
            .reconcile_on(queue.wakeups(claims))
            .reconcile_on(queue.wakeups(addresses))
            .reconcile_on(queue.wakeups(due))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                floating_ip_pool::reconcile,
                floating_ip_pool::error_policy,
                ctx,
            )
            // Its own objects come from kube-runtime's watch, which says nothing of lists:
            // one lane. (A handful of pools per cluster, not thousands.)
            .for_each(log_errors(queue, Lanes::new(false, 1).0));
        let synced = Synced {
            health,
            controller: floating_ip_pool::CONTROLLER,
        };
        until_stopped(controller, listed, synced, shutdown).await;
    })
}

/// The pools that IPAM objects of kind `K` name, as they change.
fn ipam_wakeups<K>(
    scope: &WatchScope,
    client: &kube::Client,
    pool_of: fn(&K) -> &ipam::PoolReference,
) -> impl futures::Stream<Item = ObjectRef<floating_ip_pool::Watched>> + use<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    watcher(scope.api::<K>(client.clone()), watcher::Config::default())
        .watch_backoff()
        .touched_objects()
        .filter_map(move |object| {
            let picked = match object {
                Ok(object) => pool_of(&object).floating_ip_pool().map(|name| {
                    let mut pool = ObjectRef::new(name);
                    pool.namespace = object.namespace();
                    pool
                }),
                Err(error) => {
                    tracing::debug!(%error, "IPAM objects cannot be watched (are Cluster API's IPAM CRDs installed?)");
                    None
                }
            };
            std::future::ready(picked)
        })
}

/// The servers whose IPAddressClaim changed (the pool answered it).
fn claim_wakeups(
    scope: &WatchScope,
    client: &kube::Client,
) -> impl futures::Stream<Item = ObjectRef<server::Watched>> + use<> {
    watcher(
        scope.api::<ipam::IPAddressClaim>(client.clone()),
        watcher::Config::default(),
    )
    .watch_backoff()
    .touched_objects()
    .filter_map(|claim| std::future::ready(claim.ok()))
    .flat_map(|claim| futures::stream::iter(owned_by::<server::Watched>(&claim, "OpenStackServer")))
}

/// What wakes an OpenStackCluster besides its own changes: the engine's wake-ups (through
/// `reconcile_on`) and re-syncs.
pub struct ClusterWakeups {
    /// OpenStackClusters to reconcile: the engine changed their load balancer's verdict.
    pub changed: futures::channel::mpsc::Receiver<ObjectRef<cluster::Watched>>,
    /// One message per re-sync (the bridge fell behind the engine): reconcile every
    /// OpenStackCluster.
    pub resync: futures::channel::mpsc::Receiver<()>,
}

/// The OpenStackCluster controller, until `shutdown`; reconciles in flight finish first. It
/// subscribes to the watches now, so run it before the watches start.
pub fn run_clusters(
    ctx: Arc<Context>,
    watches: &Watches,
    scope: &WatchScope,
    concurrency: u16,
    wakeups: ClusterWakeups,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, ()> {
    type Watched = cluster::Watched;
    let reader = watches.infra_clusters.store();
    let clusters = changed(
        watches.infra_clusters.subscribe(),
        reader.clone(),
        reconcile_worthy,
    );
    let secrets = secret_changes(scope, &ctx);
    let capi_clusters = watches.paused_clusters();
    // Control-plane machines change the desired members: their address, their deletion.
    // (Through `DeserializeGuard`: one undecodable object must not stall the watch.)
    let machines = changed(
        watches.infra_machines.subscribe(),
        watches.infra_machines.store(),
        member_changes,
    );
    // The bastion's server, as it builds.
    let bastions = changed(
        watches.servers.subscribe(),
        watches.servers.store(),
        StoredMeta::stored_version,
    );
    let by_secret = reader.clone();
    let readers = SecretReaders::new(|object: &Watched| {
        let identity = object.unpack().ok().map(|c| c.spec.identity_ref);
        identity
            .filter(|i| i.kind() == capo_api::common::IdentityRefType::Secret)
            .map(|i| i.name)
            .into_iter()
            .collect()
    });
    let by_cluster = reader.clone();
    let by_machine = reader.clone();
    let listed = reader.clone();
    let due = due_passes(ctx.clone(), cluster::CONTROLLER, reader.clone());
    // Boxed: the controller's future is large, and it is built before the caller's own
    // future is on the heap.
    Box::pin(async move {
        ctx.metrics
            .controller_started(cluster::CONTROLLER, usize::from(concurrency));
        let queue = Queue::new(&ctx, cluster::CONTROLLER);
        let queue_name = cluster::CONTROLLER;
        let (lanes, low) = Lanes::new(ctx.config.priority_queue, usize::from(concurrency));
        let controller = Controller::for_shared_stream(lanes.own(queue.own(clusters)), reader)
            .watches_stream(
                secrets,
                queue.mapping(move |secret: PartialObjectMeta<Secret>| {
                    readers.naming(&by_secret, secret.namespace(), &secret.name_any())
                }),
            )
            .reconcile_on(lanes.related(
                capi_clusters,
                queue.mapping(labelled_for_cluster(by_cluster)),
            ))
            .reconcile_on(lanes.related(
                machines,
                queue.mapping(move |machine: Arc<machine::Watched>| {
                    let name = capi::cluster_name(machine.labels()).map(str::to_owned);
                    pick(&by_machine, machine.namespace(), |object: &Watched| {
                        name.is_some() && capi::cluster_name(object.labels()) == name.as_deref()
                    })
                }),
            ))
            .reconcile_on(lanes.related(
                bastions,
                queue.mapping(|server: Arc<server::Watched>| {
                    owned_by::<Watched>(server.as_ref(), "OpenStackCluster")
                }),
            ))
            .reconcile_on(lanes.news(queue.wakeups(wakeups.changed)))
            .reconcile_on(lanes.low(queue.wakeups(due)))
            .reconcile_on(low)
            .reconcile_all_on(wakeups.resync)
            .with_config(controller::Config::default().concurrency(concurrency))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                lanes.starting(cluster::reconcile),
                cluster::error_policy,
                ctx.clone(),
            )
            .for_each(log_errors(queue, lanes));
        let synced = Synced {
            health,
            controller: queue_name,
        };
        until_stopped(controller, listed, synced, shutdown.clone()).await;
        // Still leading (a lost Lease drops this future): what passes held back goes out now.
        if shutdown.is_cancelled() {
            cluster::write_held_stamps(&ctx).await;
        }
    })
}

/// What wakes an OpenStackMachine besides its own changes: the engine's wake-ups and
/// re-syncs.
pub struct MachineWakeups {
    /// OpenStackMachines to reconcile: the engine changed a verdict that names them.
    pub changed: futures::channel::mpsc::Receiver<ObjectRef<machine::Watched>>,
    /// One message per re-sync (the bridge fell behind the engine): reconcile every
    /// OpenStackMachine.
    pub resync: futures::channel::mpsc::Receiver<()>,
}

/// The OpenStackMachine controller, until `shutdown`; reconciles in flight finish first. It
/// subscribes to the watches now, so run it before the watches start.
pub fn run_machines(
    ctx: Arc<Context>,
    watches: &Watches,
    concurrency: u16,
    wakeups: MachineWakeups,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, ()> {
    type Watched = machine::Watched;
    let reader = watches.infra_machines.store();
    let machines = changed(
        watches.infra_machines.subscribe(),
        reader.clone(),
        reconcile_worthy,
    );
    let capi_clusters = watches.paused_clusters();
    // The Machine: its bootstrap data, its deletion and hooks.
    let capi_machines = changed(
        watches.machines.subscribe(),
        watches.machines.store(),
        capi_machine_changes,
    );
    // The machine's server, as it builds.
    let servers = changed(
        watches.servers.subscribe(),
        watches.servers.store(),
        StoredMeta::stored_version,
    );
    // The cluster's infrastructure: provisioned, its load balancer's pools, its deletion.
    let infra = changed(
        watches.infra_clusters.subscribe(),
        watches.infra_clusters.store(),
        infra_changes,
    );
    let by_cluster = reader.clone();
    let by_infra = reader.clone();
    let listed = reader.clone();
    let due = due_passes(ctx.clone(), machine::CONTROLLER, reader.clone());
    // Boxed: the controller's future is large, and it is built before the caller's own
    // future is on the heap.
    Box::pin(async move {
        ctx.metrics
            .controller_started(machine::CONTROLLER, usize::from(concurrency));
        let queue = Queue::new(&ctx, machine::CONTROLLER);
        let queue_name = machine::CONTROLLER;
        let (lanes, low) = Lanes::new(ctx.config.priority_queue, usize::from(concurrency));
        let controller = Controller::for_shared_stream(lanes.own(queue.own(machines)), reader)
            .reconcile_on(lanes.related(
                capi_clusters,
                queue.mapping(labelled_for_cluster(by_cluster)),
            ))
            .reconcile_on(lanes.related(
                capi_machines,
                queue.mapping(|owner: Arc<Packed<capi::Machine>>| {
                    let infrastructure = owner
                        .unpack()
                        .ok()
                        .and_then(|m| m.spec.infrastructure_ref)
                        .filter(|r| r.kind == "OpenStackMachine");
                    infrastructure.map(|r| {
                        let mut object = ObjectRef::<Watched>::new(&r.name);
                        object.namespace = owner.namespace();
                        object
                    })
                }),
            ))
            .reconcile_on(lanes.related(
                servers,
                queue.mapping(|server: Arc<server::Watched>| {
                    owned_by::<Watched>(server.as_ref(), "OpenStackMachine")
                }),
            ))
            .reconcile_on(lanes.related(
                infra,
                queue.mapping(move |osc: Arc<cluster::Watched>| {
                    let name = capi::cluster_name(osc.labels())
                        .map(str::to_owned)
                        .unwrap_or_else(|| osc.name_any());
                    pick(&by_infra, osc.namespace(), |object: &Watched| {
                        capi::cluster_name(object.labels()) == Some(name.as_str())
                    })
                }),
            ))
            .reconcile_on(lanes.news(queue.wakeups(wakeups.changed)))
            .reconcile_on(lanes.low(queue.wakeups(due)))
            .reconcile_on(low)
            .reconcile_all_on(wakeups.resync)
            .with_config(controller::Config::default().concurrency(concurrency))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                lanes.starting(machine::reconcile),
                machine::error_policy,
                ctx,
            )
            .for_each(log_errors(queue, lanes));
        let synced = Synced {
            health,
            controller: queue_name,
        };
        until_stopped(controller, listed, synced, shutdown).await;
    })
}

/// The OpenStackMachineTemplate controller (scale from zero), until `shutdown`. A template
/// is woken by its own changes and by its cluster's infrastructure (whose identity it may
/// borrow); run it before the watches start.
pub fn run_machine_templates(
    ctx: Arc<Context>,
    watches: &Watches,
    concurrency: u16,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> futures::future::BoxFuture<'static, ()> {
    type Watched = machine_template::Watched;
    let reader = watches.templates.store();
    let templates = changed(
        watches.templates.subscribe(),
        reader.clone(),
        reconcile_worthy,
    );
    let infra = changed(
        watches.infra_clusters.subscribe(),
        watches.infra_clusters.store(),
        predicates::generation,
    );
    let by_infra = reader.clone();
    let listed = reader.clone();
    let due = due_passes(ctx.clone(), machine_template::CONTROLLER, reader.clone());
    Box::pin(async move {
        ctx.metrics
            .controller_started(machine_template::CONTROLLER, usize::from(concurrency));
        let queue = Queue::new(&ctx, machine_template::CONTROLLER);
        let queue_name = machine_template::CONTROLLER;
        let (lanes, low) = Lanes::new(ctx.config.priority_queue, usize::from(concurrency));
        let controller = Controller::for_shared_stream(lanes.own(queue.own(templates)), reader)
            .reconcile_on(lanes.related(
                infra,
                queue.mapping(move |osc: Arc<cluster::Watched>| {
                    let name = capi::cluster_name(osc.labels())
                        .map(str::to_owned)
                        .unwrap_or_else(|| osc.name_any());
                    pick(&by_infra, osc.namespace(), |object: &Watched| {
                        capi::cluster_name(object.labels()) == Some(name.as_str())
                    })
                }),
            ))
            .reconcile_on(lanes.low(queue.wakeups(due)))
            .reconcile_on(low)
            .with_config(controller::Config::default().concurrency(concurrency))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                lanes.starting(machine_template::reconcile),
                machine_template::error_policy,
                ctx,
            )
            .for_each(log_errors(queue, lanes));
        let synced = Synced {
            health,
            controller: queue_name,
        };
        until_stopped(controller, listed, synced, shutdown).await;
    })
}

/// What about a Machine matters to its OpenStackMachine.
fn capi_machine_changes(machine: &Packed<capi::Machine>) -> Option<u64> {
    let Ok(machine) = machine.unpack() else {
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
fn infra_changes(cluster: &cluster::Watched) -> Option<u64> {
    let Ok(cluster) = cluster.unpack() else {
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
fn member_changes(stored: &machine::Watched) -> Option<u64> {
    if !stored.is_valid() {
        return None;
    }
    if !capi::is_control_plane(stored.labels()) {
        // A worker is no member: its arrival and its removal are all the cluster hears of
        // it, not every address and providerID it goes through. (Told from the metadata:
        // a worker's every change is not decoded for this.)
        return Some(0);
    }
    let machine = stored.unpack().ok()?;
    let mut hasher = DefaultHasher::new();
    (
        // Every address: which one is the member's depends on the cluster's subnets.
        machine.status.as_ref().map(|s| {
            s.addresses
                .iter()
                .map(|a| (a.type_.as_str(), a.address.as_str()))
                .collect::<Vec<_>>()
        }),
        crate::controllers::gate::is_leaving(&machine),
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
fn owned_by<K>(object: &impl StoredMeta, kind: &str) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    let namespace = object.meta().namespace.clone();
    object
        .stored_owners()
        .iter()
        .filter(|o| o.kind() == kind)
        .map(|o| {
            let mut owner = ObjectRef::<K>::new(o.name());
            owner.namespace.clone_from(&namespace);
            owner
        })
        .collect()
}

/// The Secrets the server names, for credentials and user data.
fn secrets_named(server: &OpenStackServer) -> Vec<String> {
    let identity = &server.spec.identity_ref;
    let credentials = (identity.kind() == capo_api::common::IdentityRefType::Secret)
        .then(|| identity.name.clone());
    let user_data = server
        .spec
        .user_data_ref
        .as_ref()
        .and_then(|r| r.name.clone());
    credentials.into_iter().chain(user_data).collect()
}

/// One reconcile's end, as a controller's stream hands it back.
type Ended<K, T, E, Q> = Result<(ObjectRef<K>, T), controller::Error<E, Q>>;

/// What a controller's stream hands back: each ended reconcile gives back its low-lane
/// permit, and errors are logged.
fn log_errors<K, T, E: std::error::Error, Q: std::error::Error>(
    queue: Queue,
    lanes: Lanes<K>,
) -> impl FnMut(Ended<K, T, E, Q>) -> std::future::Ready<()>
where
    K: reflector::Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Eq + std::hash::Hash + Send + Sync,
{
    move |result| {
        match &result {
            Ok((object, _)) => lanes.finished(object.namespace.as_deref(), &object.name),
            Err(controller::Error::ReconcilerFailed(_, object)) => {
                lanes.finished(object.namespace.as_deref(), &object.name);
            }
            Err(controller::Error::ObjectNotFound(object)) => {
                lanes.not_found(object.namespace.as_deref(), &object.name);
            }
            Err(_) => {}
        }
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
    use crate::controllers::packed::LAST_APPLIED;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn secret(uid: &str, version: &str) -> PartialObjectMeta<Secret> {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some(format!("s-{uid}"));
        secret.metadata.uid = Some(uid.into());
        secret.metadata.resource_version = Some(version.into());
        secret
    }

    #[test]
    fn secrets_wake_on_changes_after_the_first_list_not_on_it() {
        use watcher::Event;
        let mut changes = SecretChanges::default();
        assert!(changes.wakes(Event::Init).is_none());
        assert!(changes.wakes(Event::InitApply(secret("a", "1"))).is_none());
        assert!(changes.wakes(Event::InitDone).is_none());
        assert!(changes.wakes(Event::Apply(secret("a", "1"))).is_none());
        assert!(changes.wakes(Event::Apply(secret("a", "2"))).is_some());
        assert!(changes.wakes(Event::Apply(secret("b", "1"))).is_some());
        // A relist after a watch error: only what changed meanwhile.
        assert!(changes.wakes(Event::Init).is_none());
        assert!(changes.wakes(Event::InitApply(secret("a", "2"))).is_none());
        assert!(changes.wakes(Event::InitApply(secret("b", "5"))).is_some());
        assert!(changes.wakes(Event::Delete(secret("b", "5"))).is_some());
        // The same name made again is another Secret, even at a version seen before.
        let mut again = secret("a", "2");
        again.metadata.uid = Some("a-again".into());
        assert!(changes.wakes(Event::Apply(again)).is_some());
    }

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
