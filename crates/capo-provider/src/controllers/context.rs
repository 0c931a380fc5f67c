//! The one `Context` every reconciler shares: the Kubernetes client and event recorder, the
//! membership engine, OpenStack clients per credentials, metrics, tunables, and the
//! per-object backoff that turns a category of error into the next attempt's delay.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde::Serialize;

use super::backoff::{Backoff, BackoffPolicy};
use super::caches::Caches;
use super::credentials::ClientCache;
use super::error::ErrorCategory;
use super::events::{EventSpec, Recorder, Reporter};
use super::metrics::ReconcileMetrics;
use super::outcome::Outcome;
use super::settled::{SettledBook, key_digest};
use super::steps::StepBook;
use crate::cloud::Clouds;
use crate::membership::Engine;

/// The `reportingController` of our events.
pub const REPORTING_CONTROLLER: &str = "capo-rs";
/// The field manager of our writes.
pub const FIELD_MANAGER: &str = "capo-rs";

/// Tunables of every controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// A settled object is looked at again this often, to see drift. An object held by a
    /// terminal error is too: the cloud may have been fixed meanwhile (an image uploaded).
    pub sync_period: Duration,
    /// How often each controller's store is swept for settled objects whose next complete
    /// pass is due: how late such a pass may start. Waits of six sweeps or more are kept in
    /// a [`SettledBook`] rather than kube-runtime's scheduler (memory: see its module).
    pub settled_sweep: Duration,
    /// While something in the cloud is on its way (a server building, a volume being
    /// created, a server being deleted), the object is looked at again after a quarter of
    /// the time it has been waiting, within these bounds: soon at first, rarely for slow work.
    pub poll_min: Duration,
    /// The upper of those bounds: the longest wait between looks at slow work.
    pub poll_max: Duration,
    /// Transient errors back off per object.
    pub backoff: BackoffPolicy,
    /// `reportingInstance` of events (the pod's name in a cluster).
    pub instance: Option<String>,
    /// Times a control-plane machine's API load balancer member in ERROR is deleted and
    /// created again before the machine reports MemberError for a person to look.
    pub member_repairs: u32,
    /// The API pools' health monitor where the OpenStackCluster's annotation does not choose.
    pub api_monitor: crate::controllers::gate::MonitorKind,
    /// How long a leaving control-plane member keeps its open connections at weight 0 before
    /// it is deleted; zero deletes it at once.
    pub drain_period: Duration,
    /// Machine templates get the capacity and node info the cluster autoscaler reads (CAPO's
    /// `AutoScaleFromZero` gate; the manager sets it from its feature gates).
    pub scale_from_zero: bool,
    /// Objects of a first list and periodic passes wait behind changes (CAPO's
    /// `PriorityQueue` gate; the manager sets it from its feature gates).
    pub priority_queue: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            sync_period: Duration::from_secs(600),
            settled_sweep: Duration::from_secs(10),
            poll_min: Duration::from_secs(1),
            poll_max: Duration::from_secs(30),
            backoff: BackoffPolicy::default(),
            instance: None,
            member_repairs: 3,
            api_monitor: crate::controllers::gate::MonitorKind::Tcp,
            // The library's default keeps removals immediate; `capo-rs run` drains for 30 s.
            drain_period: Duration::ZERO,
            scale_from_zero: false,
            priority_queue: true,
        }
    }
}

impl ControllerConfig {
    /// When to look again at work that has been on its way for `waited`.
    pub fn poll_after(&self, waited: Duration) -> Duration {
        (waited / 4).clamp(self.poll_min, self.poll_max.max(self.poll_min))
    }
}

/// Shared by every reconcile of every controller.
pub struct Context {
    /// The Kubernetes client: every write, and the reads that must be fresh.
    pub client: kube::Client,
    /// What reconcilers read of other objects (and of their own kind, but theirs).
    pub caches: Caches,
    /// Publishes our Kubernetes events (reporting controller `capo-rs`).
    pub recorder: Recorder,
    /// The membership engine: what Octavia shows for the API pools' members, and the gate's
    /// verdicts on them.
    pub engine: Engine,
    /// OpenStack clients, one per credentials key.
    pub clouds: ClientCache,
    /// The reconcile metrics every controller records.
    pub metrics: ReconcileMetrics,
    /// The tunables, shared by every controller.
    pub config: ControllerConfig,
    backoff: Mutex<Backoff<String>>,
    /// Engine observations not yet written, by object key: when each was observed.
    wakes: Mutex<HashMap<String, Instant>>,
    /// Which steps of each object's complete pass are fresh.
    steps: Mutex<StepBook>,
    /// Per controller, when each settled object's next complete pass is due.
    settled: Mutex<HashMap<&'static str, SettledBook>>,
    /// The resourceVersion of each object as a reconcile last knew it whole (read from the
    /// API server, or written): a cached copy at that version needs no fresh read.
    versions: Mutex<HashMap<String, String>>,
    /// What each object's status was last written with (see [`LastWrites`]).
    pub last_writes: LastWrites,
    /// In-memory notes about objects (when a member was created, when a removal began), by
    /// object key and what. Lost on a restart; every use of them is safe without.
    notes: Mutex<HashMap<(String, String), tokio::time::Instant>>,
    /// New `membersAsOf` stamps held back, by OpenStackCluster key.
    held_stamps: Mutex<HashMap<String, HeldStamp>>,
}

/// A new `membersAsOf` a cluster pass held back (it was the only news), with the version of
/// the copy it was computed over. A graceful stop writes it while the object is still at that
/// version: the stamp vouches only for the members that copy records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldStamp {
    /// The OpenStackCluster's namespace.
    pub namespace: String,
    /// The OpenStackCluster's name.
    pub name: String,
    /// The resourceVersion of the copy the pass read.
    pub version: String,
    /// The `membersAsOf` held back.
    pub stamp: String,
}

impl Context {
    /// A context around `client`, with no backoff, notes or step records yet; events are
    /// reported as `capo-rs` from `config.instance`, and the clients for `clouds` made on demand.
    pub fn new(
        client: kube::Client,
        engine: Engine,
        clouds: Arc<Clouds>,
        metrics: ReconcileMetrics,
        config: ControllerConfig,
        caches: Caches,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: config.instance.clone(),
        };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            caches,
            engine,
            clouds: ClientCache::new(clouds),
            metrics,
            backoff: Mutex::new(Backoff::new(config.backoff)),
            wakes: Mutex::default(),
            steps: Mutex::default(),
            settled: Mutex::default(),
            versions: Mutex::default(),
            last_writes: LastWrites::default(),
            notes: Mutex::default(),
            held_stamps: Mutex::default(),
            config,
        })
    }

    /// Publishes an event. A refused event is logged, never a reason to fail a reconcile.
    pub async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = EventSpec {
            type_,
            reason,
            action,
            note: &note,
        };
        if let Err(error) = self.recorder.publish(event, regarding).await {
            tracing::warn!(%error, reason, "cannot publish event");
        }
    }

    /// What to do after a reconcile of `key` failed with `category`: terminal errors wait
    /// for a change (or the sync period); others back off, per object, with jitter.
    pub fn after_error(&self, key: &str, category: ErrorCategory) -> Action {
        if category.is_terminal() {
            return Action::requeue(self.config.sync_period);
        }
        let retry_after = match category {
            ErrorCategory::RateLimited { retry_after } => Some(retry_after),
            _ => None,
        };
        let delay = self
            .lock_backoff()
            .failed(&key.to_owned(), retry_after, fastrand::f64());
        Action::requeue(delay)
    }

    /// `key` reconciled: its next failure backs off from the start.
    pub fn succeeded(&self, key: &str) {
        self.lock_backoff().succeeded(&key.to_owned());
    }

    /// `key` is gone.
    pub fn forget(&self, key: &str) {
        self.lock_backoff().forget(&key.to_owned());
        lock(&self.wakes).remove(key);
        lock(&self.steps).forget(key);
        for book in lock(&self.settled).values_mut() {
            book.unsettle(key_digest(key));
        }
        lock(&self.versions).remove(key);
        self.last_writes.forget(key);
        lock(&self.notes).retain(|(object, _), _| object != key);
        self.release_stamp(key);
    }

    /// Forgets what is held about `controller`'s objects that left its store (`live`: the keys
    /// of those still in it): an object deleted while another replica led, or one whose last
    /// pass never came, would otherwise be remembered for as long as the process runs.
    pub fn prune(&self, controller: &str, live: &HashSet<String>) {
        let prefix = format!("{controller}/");
        let keep = |key: &str| !key.starts_with(&prefix) || live.contains(key);
        self.lock_backoff().retain(|key| keep(key));
        lock(&self.wakes).retain(|key, _| keep(key));
        lock(&self.steps).retain(keep);
        lock(&self.versions).retain(|key, _| keep(key));
        lock(&self.notes).retain(|(key, _), _| keep(key));
        self.update_held_stamps(|held| held.retain(|key, _| keep(key)));
        let live: HashSet<u64> = live.iter().map(|key| key_digest(key)).collect();
        self.last_writes.retain(controller, &live);
    }

    /// Notes that `what` happened to `key` at `at` (the first time counts).
    pub fn note(&self, key: &str, what: &str, at: tokio::time::Instant) {
        lock(&self.notes)
            .entry((key.to_owned(), what.to_owned()))
            .or_insert(at);
    }

    /// When `what` was noted for `key`.
    pub fn noted(&self, key: &str, what: &str) -> Option<tokio::time::Instant> {
        lock(&self.notes)
            .get(&(key.to_owned(), what.to_owned()))
            .copied()
    }

    /// Forgets one note.
    pub fn unnote(&self, key: &str, what: &str) {
        lock(&self.notes).remove(&(key.to_owned(), what.to_owned()));
    }

    /// Holds `key`'s new stamp (replacing one held before).
    pub fn hold_stamp(&self, key: &str, held: HeldStamp) {
        self.update_held_stamps(|stamps| {
            stamps.insert(key.to_owned(), held);
        });
    }

    /// `key` holds no stamp back any more (written, cleared, or gone).
    pub fn release_stamp(&self, key: &str) {
        self.update_held_stamps(|stamps| {
            stamps.remove(key);
        });
    }

    /// Every stamp held back, no longer held.
    pub fn take_held_stamps(&self) -> Vec<HeldStamp> {
        let mut taken = Vec::new();
        self.update_held_stamps(|stamps| taken.extend(stamps.drain().map(|(_, held)| held)));
        taken
    }

    fn update_held_stamps(&self, change: impl FnOnce(&mut HashMap<String, HeldStamp>)) {
        let mut stamps = lock(&self.held_stamps);
        change(&mut stamps);
        let held = i64::try_from(stamps.len()).unwrap_or(i64::MAX);
        self.metrics.held_stamps.set(held);
    }

    /// The engine observed something about `key` at `observed`; the earliest unwritten
    /// observation counts.
    pub fn note_wake(&self, key: String, observed: Instant) {
        lock(&self.wakes).entry(key).or_insert(observed);
    }

    /// The observation a reconcile of `key` is about to write, if any.
    pub fn take_wake(&self, key: &str) -> Option<Instant> {
        lock(&self.wakes).remove(key)
    }

    /// Whether a cached copy of `key` at `version` holds this process's own last write: it
    /// is the version a reconcile last read or wrote, or this process has neither read nor
    /// written `key`. A copy of the second kind came from a watch that began after this
    /// process took over: its lists are quorum reads (kube-runtime's default), made once
    /// the leader Lease is held, so they hold every write of a replica that led before.
    pub fn cache_holds_own_writes(&self, key: &str, version: Option<&str>) -> bool {
        holds_own_writes(lock(&self.versions).get(key).map(String::as_str), version)
    }

    /// A reconcile read or wrote `key` at `version`.
    pub fn note_version(&self, key: &str, version: Option<String>) {
        if let Some(version) = version {
            lock(&self.versions).insert(key.to_owned(), version);
        }
    }

    /// Whether `step` of `key` at `generation` must run (see [`StepBook::due`]).
    pub fn step_due(&self, key: &str, step: &'static str, generation: Option<i64>) -> bool {
        lock(&self.steps).due(
            key,
            step,
            generation,
            Instant::now(),
            self.config.sync_period,
        )
    }

    /// `step` of `key` at `generation` found everything in place.
    pub fn step_done(&self, key: &str, step: &'static str, generation: Option<i64>) {
        lock(&self.steps).done(key, step, generation, Instant::now());
    }

    /// Our own spec write moved `key` from `from` to `to`: what was fresh stays fresh.
    pub fn steps_carried(&self, key: &str, from: Option<i64>, to: Option<i64>) {
        lock(&self.steps).carried(key, from, to);
    }

    /// Every step of `key` runs on its next pass (after an error: something moved).
    pub fn steps_needed(&self, key: &str) {
        lock(&self.steps).needed(key);
    }

    /// The first pass of `key` since start, and its status says a complete pass at
    /// `generation` found everything in place: `steps` count as done at a random moment in
    /// the last sync period (see [`StepBook::settled_before`]).
    pub fn steps_settled_before(&self, key: &str, steps: &[&'static str], generation: Option<i64>) {
        let ago = self.config.sync_period.mul_f64(fastrand::f64());
        let at = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        lock(&self.steps).settled_before(key, steps, generation, at);
    }

    /// How long a settled `key` may wait before its next pass.
    pub fn settled_for(&self, key: &str) -> Duration {
        let config = &self.config;
        lock(&self.steps).settled_for(key, Instant::now(), config.sync_period, config.poll_min)
    }

    /// What kube-runtime does next with `key` of `controller` after `outcome`. A settled
    /// object that may wait long waits in the controller's [`SettledBook`], not in
    /// kube-runtime's scheduler; its controller's sweep hands it back when due.
    pub fn next_action(&self, controller: &'static str, key: &str, outcome: Outcome) -> Action {
        let wait = self.settled_for(key);
        let mut books = lock(&self.settled);
        let book = books.entry(controller).or_default();
        if outcome == Outcome::Settled && wait >= self.config.settled_sweep * 6 {
            book.settle(key_digest(key), Instant::now() + wait);
            return Action::await_change();
        }
        book.unsettle(key_digest(key));
        outcome.action(wait)
    }

    /// A reconcile of `key` of `controller` failed: the error policy decides its next pass.
    pub fn unsettle(&self, controller: &'static str, key: &str) {
        if let Some(book) = lock(&self.settled).get_mut(controller) {
            book.unsettle(key_digest(key));
        }
    }

    /// Of `controller`'s objects in its store (`live`, their keys' digests), the positions of
    /// those whose next complete pass is due now (see [`SettledBook::take_due`]).
    pub fn take_due(&self, controller: &'static str, live: &[u64]) -> Vec<usize> {
        lock(&self.settled)
            .get_mut(controller)
            .map(|book| book.take_due(live, Instant::now()))
            .unwrap_or_default()
    }

    fn lock_backoff(&self) -> MutexGuard<'_, Backoff<String>> {
        lock(&self.backoff)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What this process last wrote to each object's status, and over what. A pass that starts
/// from a cached copy our last write has not reached yet (another wake-up queued before the
/// watch brought it) computes the same status again; it has nothing to write.
///
/// Keyed by a digest of the object's key: one entry per object each controller wrote, and the
/// key's string was most of an entry.
#[derive(Default)]
pub struct LastWrites(Mutex<HashMap<u64, Written>>);

/// A digest of the writing controller's name, and of the status before and after.
type Written = (u64, u64, u64);

impl LastWrites {
    /// Whether `status` is what we last wrote over `before`.
    pub fn repeats<S: Serialize>(&self, key: &str, before: Option<&S>, status: &S) -> bool {
        let last = self.lock().get(&key_digest(key)).copied();
        last == Some((controller_of(key), digest(before), digest(Some(status))))
    }

    /// Records that `status` was just written to `key` over `before`.
    pub fn wrote<S: Serialize>(&self, key: &str, before: Option<&S>, status: &S) {
        let entry = (controller_of(key), digest(before), digest(Some(status)));
        self.lock().insert(key_digest(key), entry);
    }

    /// Forgets what was written to `key` (it is gone).
    pub fn forget(&self, key: &str) {
        self.lock().remove(&key_digest(key));
    }

    /// Forgets what `controller` wrote to objects other than `live` (key digests).
    pub fn retain(&self, controller: &str, live: &HashSet<u64>) {
        let controller = key_digest(controller);
        self.lock()
            .retain(|key, (by, _, _)| *by != controller || live.contains(key));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Written>> {
        lock(&self.0)
    }
}

/// The digest of the controller part of an object key (`controller/namespace/name`).
fn controller_of(key: &str) -> u64 {
    key_digest(key.split('/').next().unwrap_or_default())
}

fn digest<S: Serialize>(value: Option<&S>) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_vec(&value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// See [`Context::cache_holds_own_writes`]: `known` is the version this process last read or
/// wrote, `cached` the cached copy's.
fn holds_own_writes(known: Option<&str>, cached: Option<&str>) -> bool {
    match known {
        None => true,
        Some(known) => cached == Some(known),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_follow_the_wait_within_bounds() {
        let config = ControllerConfig::default();
        assert_eq!(config.poll_after(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            config.poll_after(Duration::from_secs(20)),
            Duration::from_secs(5)
        );
        assert_eq!(
            config.poll_after(Duration::from_secs(3600)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn a_cached_copy_is_trusted_unless_it_may_lag_our_own_write() {
        // Never read nor written here: the copy came from a list made after we took over.
        assert!(holds_own_writes(None, Some("7")));
        assert!(holds_own_writes(None, None));
        // Written here at 8: a copy at 7 lags that write; the copy at 8 holds it.
        assert!(!holds_own_writes(Some("8"), Some("7")));
        assert!(!holds_own_writes(Some("8"), None));
        assert!(holds_own_writes(Some("8"), Some("8")));
        // Another version: resource versions are opaque, so it may not hold ours.
        assert!(!holds_own_writes(Some("8"), Some("9")));
    }

    #[test]
    fn a_status_repeats_only_over_the_same_copy_it_was_written_over() {
        let last = LastWrites::default();
        let (stale, ours) = ("pending".to_owned(), "ready".to_owned());
        assert!(!last.repeats("m", Some(&stale), &ours));
        last.wrote("m", Some(&stale), &ours);
        // The cache still shows the copy we wrote over, and we arrive at our write again.
        assert!(last.repeats("m", Some(&stale), &ours));
        // Someone else's write since (or a different result) is written as usual.
        assert!(!last.repeats("m", Some(&"error".to_owned()), &ours));
        assert!(!last.repeats("m", Some(&stale), &"gone".to_owned()));
        assert!(!last.repeats("other", Some(&stale), &ours));
        last.forget("m");
        assert!(!last.repeats("m", Some(&stale), &ours));
    }
}
