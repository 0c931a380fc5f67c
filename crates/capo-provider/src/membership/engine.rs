//! The engine: one polling loop per cloud endpoint, every request through the cloud client
//! (and so its rate limiter), verdicts recomputed on each observation, changes published to
//! subscribers. Reconcilers talk to it through `ensure`, `forget`, `snapshot` and `subscribe`.
//!
//! Every loop is owned: the engine's [`TaskTracker`] holds them and its cancellation token
//! stops them; [`Engine::shutdown`] waits for them. A panic in a poll or a loop is logged,
//! counted (`capo_lb_engine_panics_total`) and survived: the poll is retried, the loop is
//! restarted after a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use tokio::runtime::Handle;
use tokio::sync::{Notify, broadcast};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use crate::clock::Later;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::changes::{Change, Changes};
use super::metrics::{EngineMetrics, EngineTask, GateClock, PollKind};
use super::model::{
    DesiredLb, DesiredMember, LbTrack, MemberTrack, ObjectName, Observation, Presence, Recalled,
    SeenMember,
};
use super::observe::{Observer, Seen, StatusTreeObserver};
use super::schedule::{
    Finish, ListFindings, ListState, PollOutcome, ScheduleConfig, Scheduler, Target,
};
use super::series::MemberRow;
use super::verdict::{
    GateRules, Health, LbVerdict, MemberVerdict, MemberVerdictKind, Reason, ServingRules, health,
    lb_verdict,
};
use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus};
use crate::cloud::{CloudClient, CloudError};

/// Tunables of the membership engine: the stuck threshold, the serving gate, poll pacing,
/// polls in flight and the change buffer.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// A member PENDING_* longer than this is stuck.
    pub stuck_after: Duration,
    /// The serving gate, when on (`--gate=serving`).
    pub serving: Option<ServingRules>,
    /// How polls of each cloud endpoint are paced within its request budget.
    pub schedule: ScheduleConfig,
    /// Polls in flight per cloud endpoint.
    pub max_in_flight: usize,
    /// Changes a subscriber may fall behind before it is told to re-sync.
    pub change_buffer: usize,
}

impl EngineConfig {
    /// The gate rules these tunables set: the stuck threshold and, when on, the serving gate.
    pub fn rules(&self) -> GateRules {
        GateRules {
            stuck_after: self.stuck_after,
            serving: self.serving,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            stuck_after: Duration::from_secs(600),
            serving: None,
            schedule: ScheduleConfig::default(),
            max_in_flight: 8,
            change_buffer: 4096,
        }
    }
}

/// Why the membership engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// It was started outside a tokio runtime, which its loops need.
    #[error("the membership engine needs a tokio runtime to start in")]
    NoRuntime,
    /// Its metrics could not be registered (e.g. already registered in that registry).
    #[error("registering the membership engine's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What the engine knows about one LB.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The desired-state generation the verdict reflects.
    pub generation: u64,
    /// The load balancer's current verdict (computed for `generation`).
    pub verdict: LbVerdict,
    /// What the members' operating statuses say, reported but never blocking.
    pub health: Health,
    /// Each desired member's tracked state.
    pub members: Vec<MemberTrack>,
    /// Members seen in the LB's pools that nobody wants (members on their way out).
    pub stale: Vec<SeenMember>,
    /// When a poll last answered for this LB; `None` before the first.
    pub last_poll: Option<Instant>,
    /// The LB's `updated_at` in Octavia while its members read as in `members` and `stale`,
    /// once a list has shown it (see [`Recalled`]): kept with them, it lets a restarted
    /// engine trust them while the LB's row still shows it.
    pub members_as_of: Option<String>,
}

impl Snapshot {
    /// What to keep of this LB to recall after a restart ([`Engine::ensure_recalled`]): its
    /// members as seen, once a list has vouched for them.
    pub fn recalled(&self) -> Option<Recalled> {
        let members = self
            .members
            .iter()
            .filter_map(|m| match m.presence {
                Presence::Seen(provisioning) => Some(SeenMember {
                    pool_id: m.pool_id.clone()?,
                    id: m.id.clone()?,
                    name: m.desired.name.clone(),
                    address: m.desired.address.clone(),
                    port: m.desired.port,
                    provisioning,
                    operating: m.operating.unwrap_or(OperatingStatus::Unknown),
                }),
                Presence::Absent => None,
            })
            .collect();
        Some(Recalled {
            updated_at: self.members_as_of.clone()?,
            members,
        })
    }
}

struct LbEntry {
    /// Bumped by every `ensure` that changes the desired state.
    generation: u64,
    /// The generation the current verdict was computed for (after a poll).
    verdict_generation: u64,
    track: LbTrack,
    verdict: LbVerdict,
    endpoint: String,
    client: CloudClient,
    /// How long the gate has held, for the hold metrics.
    gate_clock: GateClock,
    /// Someone changed the LB: publish a change when it is next seen ACTIVE, even if the
    /// verdict reads the same (a short PENDING_UPDATE may fall between two polls).
    wake_when_settled: bool,
    /// See [`Snapshot::members_as_of`].
    members_as_of: Option<String>,
    /// A state from before a restart, waiting for the list to confirm it.
    recalled: Option<Recalled>,
}

struct Endpoint {
    scheduler: Mutex<Scheduler>,
    /// A client per identity, to read that identity's LB list with.
    listers: Mutex<HashMap<String, CloudClient>>,
    /// Identities whose list was refused: said once in the log.
    refusals_logged: Mutex<std::collections::HashSet<String>>,
    notify: Notify,
    /// Ends this endpoint's loop (a child of the engine's token).
    cancel: CancellationToken,
}

#[derive(Default)]
struct State {
    lbs: HashMap<String, LbEntry>,
    endpoints: HashMap<String, Arc<Endpoint>>,
}

struct Inner {
    config: EngineConfig,
    observer: Arc<dyn Observer>,
    metrics: EngineMetrics,
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
    cancel: CancellationToken,
    tasks: TaskTracker,
    runtime: Handle,
}

/// The membership engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// An engine that observes through status trees. Registers its metrics on `registry`;
    /// `cancel` (or [`Engine::shutdown`]) stops every loop. Its loops run on the runtime this
    /// is called in.
    pub fn new(
        config: EngineConfig,
        registry: &prometheus::Registry,
        cancel: CancellationToken,
    ) -> Result<Self, EngineError> {
        Self::with_observer(config, Arc::new(StatusTreeObserver), registry, cancel)
    }

    /// An engine that observes through `observer` (benchmarks and tests).
    pub fn with_observer(
        config: EngineConfig,
        observer: Arc<dyn Observer>,
        registry: &prometheus::Registry,
        cancel: CancellationToken,
    ) -> Result<Self, EngineError> {
        let runtime = Handle::try_current().map_err(|_| EngineError::NoRuntime)?;
        let (changes, _) = broadcast::channel(config.change_buffer.max(1));
        Ok(Engine {
            inner: Arc::new(Inner {
                metrics: EngineMetrics::register(registry)?,
                observer,
                config,
                state: Mutex::new(State::default()),
                changes,
                cancel: cancel.child_token(),
                tasks: TaskTracker::new(),
                runtime,
            }),
        })
    }

    /// The observer's name (`status-tree` in production).
    pub fn observer_name(&self) -> &'static str {
        self.inner.observer.name()
    }

    /// How long a member may stay PENDING_* before it is stuck.
    pub fn stuck_after(&self) -> Duration {
        self.inner.config.stuck_after
    }

    /// What a member must show to count as ready.
    pub fn rules(&self) -> GateRules {
        self.inner.config.rules()
    }

    /// Sets (or updates) a load balancer's desired membership; `client` is how to reach its
    /// cloud. The LB is polled soon after. Returns the desired-state generation: changes and
    /// snapshots carry the generation their verdict was computed for, so a caller can tell a
    /// verdict about its latest wish from an older one.
    pub fn ensure(&self, desired: DesiredLb, client: &CloudClient) -> u64 {
        self.ensure_recalled(desired, client, None)
    }

    /// [`Engine::ensure`], with what was known of the LB before a restart (its members, as
    /// of its row's `updated_at`, from [`Snapshot::members_as_of`]). An LB the engine does not
    /// know yet then waits for its LB list: if the list shows the row unchanged, nothing
    /// under it changed (Octavia moves `updated_at` on every member create, update and
    /// delete), and the recalled members stand without a status tree.
    pub fn ensure_recalled(
        &self,
        desired: DesiredLb,
        client: &CloudClient,
        recalled: Option<Recalled>,
    ) -> u64 {
        let now = Instant::now();
        let scope = client.path().session().scope();
        let key = format!("{}|{}", scope.auth_url, scope.region);
        let lb_id = desired.lb_id.clone();
        let rollout_waiting = desired.rollout_waiting;
        let mut recall: Option<Recalled> = None;
        let (endpoint, started, generation) = {
            let mut state = self.inner.lock();
            let (endpoint, started) = match state.endpoints.get(&key) {
                Some(endpoint) => (endpoint.clone(), false),
                None => {
                    let endpoint = Arc::new(Endpoint {
                        scheduler: Mutex::new(Scheduler::new(
                            self.inner.config.schedule.clone(),
                            now,
                        )),
                        listers: Mutex::default(),
                        refusals_logged: Mutex::default(),
                        notify: Notify::new(),
                        cancel: self.inner.cancel.child_token(),
                    });
                    state.endpoints.insert(key.clone(), endpoint.clone());
                    (endpoint, true)
                }
            };
            let desired = match state.lbs.get(&lb_id) {
                Some(entry) => entry.track.keep_request_times(desired),
                None => desired,
            };
            let generation = match state.lbs.get_mut(&lb_id) {
                Some(entry) if entry.track.desired == desired => {
                    // Same wish, maybe new credentials: later polls use them.
                    entry.client = client.clone();
                    let generation = entry.generation;
                    drop(state);
                    if started {
                        self.start_loop(key, endpoint);
                    }
                    return generation;
                }
                Some(entry) => {
                    entry.generation += 1;
                    // What its cluster records follows the desired members (one gone from
                    // them may still be in its pool): vouched for again after the next tree.
                    // A wish that differs only in how it is waited on (a rollout waiting, a
                    // machine released, a member's id learnt) records the same members.
                    if !same_members(&entry.track.desired, &desired) {
                        entry.members_as_of = None;
                    }
                    entry.track.set_desired(desired);
                    entry.client = client.clone();
                    entry.generation
                }
                None => {
                    let serving = self.inner.config.serving.is_some();
                    recall = recalled
                        .filter(|_| self.inner.observer.uses_list())
                        .filter(|r| !serving || r.may_stand_for_serving(&desired));
                    self.inner.metrics.track_cluster(&desired.cluster);
                    let track = LbTrack::new(desired, now);
                    let verdict = lb_verdict(&track, now, &self.inner.config.rules());
                    state.lbs.insert(
                        lb_id.clone(),
                        LbEntry {
                            generation: 1,
                            verdict_generation: 0,
                            track,
                            verdict,
                            endpoint: key.clone(),
                            client: client.clone(),
                            gate_clock: GateClock::default(),
                            wake_when_settled: false,
                            members_as_of: None,
                            recalled: recall.clone(),
                        },
                    );
                    1
                }
            };
            (endpoint, started, generation)
        };
        self.inner.observer.desired_changed(&lb_id);
        let list = self
            .inner
            .observer
            .uses_list()
            .then(|| scope.identity.clone());
        {
            // Scheduler, then listers: the loop's order. The loop drops the clients of lists
            // the scheduler does not know, so the client goes in with its list.
            let mut scheduler = lock(&endpoint.scheduler);
            scheduler.wake(&lb_id, rollout_waiting, now);
            scheduler.cover(&lb_id, list.as_deref(), now);
            if let Some(recalled) = &recall {
                scheduler.recall(&lb_id, &recalled.updated_at, now);
            }
            if let Some(list) = &list {
                lock(&endpoint.listers).insert(list.clone(), client.clone());
            }
        }
        endpoint.notify.notify_one();
        if started {
            self.start_loop(key, endpoint);
        }
        generation
    }

    /// Starts an endpoint's loop; never called with the state lock held.
    fn start_loop(&self, key: String, endpoint: Arc<Endpoint>) {
        let inner = self.inner.clone();
        self.inner.tasks.spawn_on(
            supervise_endpoint(inner, key, endpoint),
            &self.inner.runtime,
        );
    }

    /// A reconciler just changed members under this LB, or found it locked: poll it soon (as
    /// new desired state, never later than a look already due), and publish a change once it
    /// is seen ACTIVE again, whatever the verdict, so the reconciler is woken for its next
    /// step instead of polling.
    pub fn changed_under(&self, lb_id: &str) {
        self.changed(lb_id, Scheduler::wake);
    }

    /// [`Engine::changed_under`] for a change of the LB itself (made, or a listener, pool or
    /// monitor added): looked at after `look_after_lb_change`, and not before.
    pub fn changed_lb(&self, lb_id: &str) {
        self.changed(lb_id, Scheduler::lb_changed);
    }

    fn changed(&self, lb_id: &str, wake: fn(&mut Scheduler, &str, bool, Instant)) {
        let now = Instant::now();
        let endpoint = {
            let mut state = self.inner.lock();
            let Some(entry) = state.lbs.get_mut(lb_id) else {
                return;
            };
            entry.wake_when_settled = true;
            let rollout_waiting = entry.track.desired.rollout_waiting;
            let key = entry.endpoint.clone();
            state
                .endpoints
                .get(&key)
                .cloned()
                .map(|e| (e, rollout_waiting))
        };
        if let Some((endpoint, rollout_waiting)) = endpoint {
            wake(&mut lock(&endpoint.scheduler), lb_id, rollout_waiting, now);
            endpoint.notify.notify_one();
        }
    }

    /// Stops tracking a load balancer. Forgetting an endpoint's last one ends its loop.
    pub fn forget(&self, lb_id: &str) {
        let mut state = self.inner.lock();
        let Some(mut entry) = state.lbs.remove(lb_id) else {
            return;
        };
        self.inner.clear_metrics(&mut entry);
        self.inner.observer.forget(lb_id);
        let still_used = state.lbs.values().any(|e| e.endpoint == entry.endpoint);
        if still_used {
            if let Some(endpoint) = state.endpoints.get(&entry.endpoint) {
                lock(&endpoint.scheduler).remove(lb_id, Instant::now());
            }
        } else if let Some(endpoint) = state.endpoints.remove(&entry.endpoint) {
            endpoint.cancel.cancel();
        }
    }

    /// What the engine knows of the load balancer `lb_id` now; `None` when it is not tracked.
    pub fn snapshot(&self, lb_id: &str) -> Option<Snapshot> {
        let state = self.inner.lock();
        let entry = state.lbs.get(lb_id)?;
        Some(Snapshot {
            generation: entry.verdict_generation,
            verdict: entry.verdict.clone(),
            health: health(&entry.track),
            members: entry.track.members.clone(),
            stale: entry.track.stale.clone(),
            last_poll: entry.track.last_poll,
            members_as_of: entry.members_as_of.clone(),
        })
    }

    /// Every verdict change from now on (see [`Changes`] for what a slow subscriber gets).
    pub fn subscribe(&self) -> Changes {
        Changes::new(
            self.inner.changes.subscribe(),
            self.inner.metrics.change_resyncs_total.clone(),
            self.inner.cancel.clone(),
        )
    }

    /// Load balancers tracked.
    pub fn len(&self) -> usize {
        self.inner.lock().lbs.len()
    }

    /// Whether no load balancer is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Endpoint loops still running (a forgotten endpoint's loop may take a moment to end).
    pub fn running_loops(&self) -> usize {
        self.inner.tasks.len()
    }

    /// Stops every loop and waits until they have ended; polls in flight are abandoned.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn clear_metrics(&self, entry: &mut LbEntry) {
        let gate_time = entry.gate_clock.stop(Instant::now());
        let cluster = &entry.track.desired.cluster;
        self.metrics.gate_time(cluster, &gate_time);
        self.metrics.forget_lb(cluster, &entry.track.desired.lb_id);
    }
}

/// Runs an endpoint's loop until it is cancelled, restarting it after a panic.
async fn supervise_endpoint(inner: Arc<Inner>, key: String, endpoint: Arc<Endpoint>) {
    loop {
        let mut run = JoinSet::new();
        run.spawn_on(
            run_endpoint(inner.clone(), key.clone(), endpoint.clone()),
            &inner.runtime,
        );
        // The loop watches the endpoint's token itself and ends once its polls are gone.
        match run.join_next().await {
            Some(Err(error)) if error.is_panic() => {
                inner.metrics.panicked(&key, EngineTask::Loop);
                tracing::error!(
                    endpoint = %key,
                    panic = %panic_message(error),
                    "membership engine loop panicked; restarting it in 1 s"
                );
                // Polls it had in flight were aborted with it.
                lock(&endpoint.scheduler).abandon_in_flight(Instant::now());
                tokio::select! {
                    () = endpoint.cancel.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            _ => break,
        }
    }
    inner.metrics.clear_endpoint(&key);
}

fn panic_message(error: JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(not a string)".to_owned()),
        Err(error) => error.to_string(),
    }
}

async fn run_endpoint(inner: Arc<Inner>, key: String, endpoint: Arc<Endpoint>) {
    let max_in_flight = inner.config.max_in_flight.max(1);
    let mut polls = JoinSet::new();
    let mut polling: HashMap<tokio::task::Id, Target> = HashMap::new();
    loop {
        let now = Instant::now();
        while polls.len() < max_in_flight {
            let Some(pick) = lock(&endpoint.scheduler).next(now) else {
                break;
            };
            let target = pick.target.clone();
            let task = match pick.target {
                Target::Lb(lb) => {
                    poll(inner.clone(), endpoint.clone(), lb, pick.urgent, pick.lag).boxed()
                }
                Target::List(list) => {
                    sweep(inner.clone(), endpoint.clone(), key.clone(), list, pick.lag).boxed()
                }
            };
            let handle = polls.spawn_on(task, &inner.runtime);
            polling.insert(handle.id(), target);
        }
        let (wake, interval, learned, lists) = {
            let scheduler = lock(&endpoint.scheduler);
            lock(&endpoint.listers).retain(|list, _| scheduler.list_state(list).is_some());
            (
                scheduler.wake_at(now),
                scheduler.drift_interval(scheduler.len()),
                scheduler.provisioning_times().len(),
                scheduler.list_counts(),
            )
        };
        inner.metrics.endpoint_schedule(&key, interval, learned);
        inner.metrics.endpoint_lists(&key, lists);
        // Never a zero wait: if the scheduler has nothing now, time must pass.
        let wake = wake
            .unwrap_or(now + Duration::from_secs(3600))
            .max(now + Duration::from_millis(1));
        let sleep = tokio::time::sleep_until(wake);
        tokio::select! {
            () = endpoint.cancel.cancelled() => break,
            () = endpoint.notify.notified() => {}
            Some(joined) = polls.join_next_with_id(), if !polls.is_empty() => {
                poll_ended(&inner, &key, &endpoint, &mut polling, joined);
            }
            () = sleep, if polls.len() < max_in_flight => {}
        }
    }
    polls.shutdown().await;
}

/// A poll task ended; a panicked one is counted and its LB polled again soon.
fn poll_ended(
    inner: &Inner,
    key: &str,
    endpoint: &Endpoint,
    polling: &mut HashMap<tokio::task::Id, Target>,
    joined: Result<(tokio::task::Id, ()), JoinError>,
) {
    let id = match &joined {
        Ok((id, ())) => *id,
        Err(error) => error.id(),
    };
    let target = polling.remove(&id);
    let Err(error) = joined else { return };
    if !error.is_panic() {
        return;
    }
    inner.metrics.panicked(key, EngineTask::Poll);
    let now = Instant::now();
    match target {
        Some(Target::Lb(lb)) => {
            tracing::error!(
                endpoint = %key,
                lb = %lb,
                panic = %panic_message(error),
                "load balancer poll panicked; polling it again"
            );
            let retry = PollOutcome {
                urgent: true,
                ..PollOutcome::default()
            };
            lock(&endpoint.scheduler).done(&lb, &retry, now);
        }
        Some(Target::List(list)) => {
            tracing::error!(
                endpoint = %key,
                panic = %panic_message(error),
                "load balancer list panicked; reading it again"
            );
            lock(&endpoint.scheduler).list_failed(&list, now);
        }
        None => {}
    }
}

/// Reads one identity's LB list and hands the rows to the scheduler. A refusal (403, 404)
/// sends its LBs back to their own polls, said once in the log.
async fn sweep(
    inner: Arc<Inner>,
    endpoint: Arc<Endpoint>,
    key: String,
    list: String,
    lag: Duration,
) {
    inner.metrics.poll_started(PollKind::List, lag);
    let Some(client) = lock(&endpoint.listers).get(&list).cloned() else {
        // Every identity a list is scheduled for was given a client first.
        lock(&endpoint.scheduler).list_failed(&list, Instant::now());
        return;
    };
    let wanted = lock(&endpoint.scheduler).covered_by(&list);
    let result = client
        .octavia()
        .list_load_balancer_rows_covering(Some(&wanted))
        .await;
    let now = Instant::now();
    let observer = inner.observer.name();
    match &result {
        Ok(_) => inner.metrics.poll_finished(observer, PollKind::List, "ok"),
        Err(error) => inner
            .metrics
            .poll_finished(observer, PollKind::List, error.kind()),
    }
    let mut scheduler = lock(&endpoint.scheduler);
    match result {
        Ok(rows) => {
            let findings = scheduler.listed(&list, &rows, now);
            drop(scheduler);
            apply_findings(&inner, &endpoint, findings, now);
            if lock(&endpoint.refusals_logged).remove(&list) {
                tracing::info!(endpoint = %key, "the load balancer list answers again; using it");
            }
        }
        Err(CloudError::RateLimited { retry_after, .. }) => {
            scheduler.defer_list(&list, now.later(retry_after));
        }
        Err(error) => {
            let refused = matches!(error, CloudError::Forbidden(_) | CloudError::NotFound(_));
            if refused {
                scheduler.list_refused(&list, now);
            } else {
                scheduler.list_failed(&list, now);
            }
            let unavailable = matches!(
                scheduler.list_state(&list),
                Some(ListState::Unavailable { .. })
            );
            drop(scheduler);
            if unavailable && lock(&endpoint.refusals_logged).insert(list) {
                tracing::warn!(
                    endpoint = %key,
                    %error,
                    "cannot list load balancers; polling each one on its own (capo_lb_lists shows it)"
                );
            } else {
                tracing::debug!(endpoint = %key, %error, "load balancer list failed");
            }
        }
    }
}

/// Acts on what a list confirmed: recalled states whose row is unchanged stand (as if a
/// tree had read them; the others get a tree, which the scheduler has due), and last trees a
/// list has vouched for get the row they reflect, so their cluster can keep it.
fn apply_findings(inner: &Inner, endpoint: &Endpoint, findings: ListFindings, now: Instant) {
    let observed = std::time::Instant::now();
    let mut outcomes = Vec::new();
    {
        let mut state = inner.lock();
        for (lb, operating) in findings.recalled {
            let Some(entry) = state.lbs.get_mut(&lb) else {
                continue;
            };
            let Some(recalled) = entry.recalled.take() else {
                continue;
            };
            let Some(operating) = operating.filter(|_| entry.track.last_poll.is_none()) else {
                continue;
            };
            let observation = Observation {
                provisioning: ProvisioningStatus::Active,
                operating,
                members: recalled.members,
                pools_seen: entry.track.desired.pools.values().cloned().collect(),
                monitored_pools: None,
            };
            let generation = entry.generation;
            let seen = Seen::Observed(observation);
            let (outcome, _) = fold(inner, entry, &seen, generation, None, observed, now);
            entry.members_as_of = Some(recalled.updated_at);
            tracing::debug!(%lb, "recalled members stand: the load balancer is unchanged");
            outcomes.push((lb, outcome));
        }
        for (lb, answered, updated_at) in findings.vouched {
            let Some(entry) = state.lbs.get_mut(&lb) else {
                continue;
            };
            let same_tree = entry.track.last_poll == Some(answered);
            if same_tree
                && vouchable(&entry.track)
                && entry.members_as_of.as_ref() != Some(&updated_at)
            {
                entry.members_as_of = Some(updated_at);
                // Its cluster keeps the row with the members it records.
                publish(inner, entry, observed);
            }
        }
    }
    let mut scheduler = lock(&endpoint.scheduler);
    for (lb, outcome) in outcomes {
        scheduler.done(&lb, &outcome, now);
    }
}

/// Whether two wishes for one LB want the same members in the same pools: what its cluster
/// records of them is then the same.
fn same_members(a: &DesiredLb, b: &DesiredLb) -> bool {
    fn key(m: &DesiredMember) -> (&ObjectName, &str, &str, u16) {
        (&m.owner, &m.name, &m.address, m.port)
    }
    a.pools == b.pools && a.members.iter().map(key).eq(b.members.iter().map(key))
}

/// Whether the LB's row can vouch for what the engine knows of it: nothing under it is on
/// its way (a member may finish after its LB unlocked without touching the row), and every
/// member in its pools is a desired one (so the members its cluster records are all there is).
fn vouchable(track: &LbTrack) -> bool {
    let lb_settled = matches!(track.lb, Some(Some((status, _))) if !status.is_pending());
    let pending = |p: &Presence| matches!(p, Presence::Seen(status) if status.is_pending());
    lb_settled && track.stale.is_empty() && !track.members.iter().any(|m| pending(&m.presence))
}

async fn poll(inner: Arc<Inner>, endpoint: Arc<Endpoint>, lb: String, urgent: bool, lag: Duration) {
    let observer = inner.observer.clone();
    // Ours: urgent or drift polls; an observer that paces itself polls on its own backoff.
    let kind = match (observer.polls_urgently(), urgent) {
        (true, true) => PollKind::Urgent,
        (true, false) => PollKind::Drift,
        (false, _) => PollKind::Backoff,
    };
    inner.metrics.poll_started(kind, lag);
    let (client, desired, generation) = {
        let state = inner.lock();
        let Some(entry) = state.lbs.get(&lb) else {
            return;
        };
        (
            entry.client.clone(),
            entry.track.desired.clone(),
            entry.generation,
        )
    };
    let result = observer.observe(&client, &desired).await;
    let observed = std::time::Instant::now();
    let now = Instant::now();
    let seen = match result {
        Ok(seen) => seen,
        Err(error) => {
            inner
                .metrics
                .poll_finished(observer.name(), kind, error.kind());
            tracing::debug!(%lb, %error, "load balancer poll failed");
            let mut scheduler = lock(&endpoint.scheduler);
            match error {
                CloudError::RateLimited { retry_after, .. } => {
                    scheduler.defer(&lb, now.later(retry_after))
                }
                _ => scheduler.done(
                    &lb,
                    &PollOutcome {
                        urgent: true,
                        ..PollOutcome::default()
                    },
                    now,
                ),
            }
            return;
        }
    };
    inner.metrics.poll_finished(observer.name(), kind, "ok");
    let row = lock(&endpoint.scheduler).row_before_tree(&lb);
    let (outcome, learnt) = {
        let mut state = inner.lock();
        let Some(entry) = state.lbs.get_mut(&lb) else {
            return;
        };
        let (mut outcome, learnt) = fold(&inner, entry, &seen, generation, row, observed, now);
        outcome.read = true;
        (outcome, learnt)
    };
    let mut scheduler = lock(&endpoint.scheduler);
    for took in learnt {
        scheduler.learn(took);
    }
    scheduler.done(&lb, &outcome, now);
}

/// Folds one observation of `entry`'s LB into its track and verdict (publishing a change),
/// and says how to schedule its next poll and what it taught about provisioning times.
/// `row_before` is the LB's row a list showed before the observation and can vouch for it
/// ([`Scheduler::row_before_tree`]).
fn fold(
    inner: &Inner,
    entry: &mut LbEntry,
    seen: &Seen,
    generation: u64,
    row_before: Option<String>,
    observed: std::time::Instant,
    now: Instant,
) -> (PollOutcome, Vec<Finish>) {
    let observer = &inner.observer;
    let previous_poll = entry.track.last_poll;
    let before: Vec<MemberTrack> = entry.track.members.clone();
    let changed = match seen {
        Seen::Observed(observation) => {
            let rules = inner.config.rules();
            entry
                .track
                .observe(observation, now, rules.serving.as_ref())
        }
        Seen::Gone => entry.track.observe_gone(now),
    };
    if changed {
        // Only a row a list showed a second before this observation, or one a list shows
        // after it, can say which row it belongs to.
        entry.members_as_of = None;
    }
    // Vouched for at once, the stamp goes out in the same status write as the change.
    let stamped = match row_before {
        Some(row)
            if generation == entry.generation
                && vouchable(&entry.track)
                && entry.members_as_of.as_ref() != Some(&row) =>
        {
            entry.members_as_of = Some(row);
            true
        }
        _ => false,
    };
    let verdict = lb_verdict(&entry.track, now, &inner.config.rules());
    let learnt = record_member_metrics(inner, entry, &before, &verdict, previous_poll, now);
    // A newer desired state arrived during the poll: this verdict is still about the one
    // the poll started with.
    let generation = generation.min(entry.generation);
    let verdict_changed =
        !verdict.same_gate(&entry.verdict) || generation != entry.verdict_generation;
    let settled_after_change =
        entry.wake_when_settled && verdict.lb_status == Some(ProvisioningStatus::Active);
    if settled_after_change {
        entry.wake_when_settled = false;
    }
    entry.verdict = verdict;
    entry.verdict_generation = generation;
    let gate_time = entry.gate_clock.advance(entry.verdict.reason, now);
    inner
        .metrics
        .gate_time(&entry.track.desired.cluster, &gate_time);
    if verdict_changed || settled_after_change || stamped {
        publish(inner, entry, observed);
    }
    let deadline = [
        stuck_deadline(entry, &inner.config.rules(), now),
        observer.next_due(&entry.track.desired.lb_id),
    ]
    .into_iter()
    .flatten()
    .min();
    // Ours polls while something is on its way (pending, missing, not yet seen, stuck: it
    // may still recover); ERROR changes only when someone repairs it, which wakes us. So
    // an LB a rollout waits on is urgent exactly while it is on its way. An observer that
    // paces itself follows its own backoff only.
    // A member being drained (weight 0) is only safe to take out while another serves:
    // the others' fall must be seen within the drain's grace, not at the list's pace.
    let urgent = observer.polls_urgently()
        && (matches!(
            entry.verdict.reason,
            Reason::NotObserved
                | Reason::LoadBalancerPending
                | Reason::MembersPending
                | Reason::MembersMissing
                | Reason::MemberStuck
                | Reason::MembersNotYetServing
                | Reason::MemberNotServing
        ) || draining(&entry.track));
    let stuck = entry.verdict.reason == Reason::MemberStuck;
    (
        PollOutcome {
            // A load balancer that is gone stays reported but is only re-checked at drift pace.
            urgent: urgent && !matches!(seen, Seen::Gone),
            // Turning stuck is the clock's doing, not news from the cloud: no reason to look
            // closely again.
            changed: changed || (verdict_changed && !stuck),
            stuck,
            deadline,
            creating_for: creating_for(entry, now),
            lb_locked: matches!(seen, Seen::Observed(o) if o.provisioning.is_pending()),
            read: false,
        },
        learnt,
    )
}

/// How long each member still being created has been on its way, when those creations are
/// all the LB waits for (otherwise the LB's own state, or another pending member, paces the
/// polls). Stuck ones count: they have outlasted every creation seen, so they are polled
/// slowly (MemberStuck is already said; a recovery is seen within the slow pace).
fn creating_for(entry: &LbEntry, now: Instant) -> Vec<Duration> {
    let creating = Presence::Seen(ProvisioningStatus::PendingCreate);
    let other_pending = entry.track.members.iter().any(|m| {
        matches!(m.presence, Presence::Seen(p) if p.is_pending()) && m.presence != creating
    });
    let waiting = matches!(
        entry.verdict.reason,
        Reason::MembersPending | Reason::MemberStuck
    );
    if !waiting || other_pending {
        return Vec::new();
    }
    entry
        .track
        .members
        .iter()
        .filter(|m| m.presence == creating)
        .map(|m| now.saturating_duration_since(m.desired.requested_at))
        .collect()
}

/// Whether a member of the LB reads DRAINING: up at weight 0, on its way out or kept out.
fn draining(track: &LbTrack) -> bool {
    let draining = OperatingStatus::Draining;
    track.members.iter().any(|m| m.operating == Some(draining))
        || track.stale.iter().any(|m| m.operating == draining)
}

/// When the next pending (or deleting) member turns stuck, or the next member not yet serving
/// settles or is flagged not serving, so the verdict flips on time.
fn stuck_deadline(entry: &LbEntry, rules: &GateRules, now: Instant) -> Option<Instant> {
    let flips = entry
        .verdict
        .members
        .iter()
        .filter_map(|(_, _, v)| match v {
            MemberVerdict::Pending { since } | MemberVerdict::Deleting { since } => {
                Some(*since + rules.stuck_after)
            }
            MemberVerdict::NotYetServing { since } => {
                rules.serving.map(|s| *since + s.not_serving_after)
            }
            _ => None,
        });
    // A member reading up turns serving (or may be let in) once it has for the settle time
    // (the recovery time, once it has stopped serving).
    let settles = entry
        .track
        .members
        .iter()
        .filter_map(|m| Some(m.up_since? + rules.serving?.steady_for(m)));
    flips.chain(settles).filter(|at| *at > now).min()
}

fn publish(inner: &Inner, entry: &mut LbEntry, observed: std::time::Instant) {
    let cluster = &entry.track.desired.cluster;
    let lb = &entry.track.desired.lb_id;
    let reason = entry.verdict.reason;
    inner.metrics.set_gate(cluster, lb, reason);
    tracing::debug!(%lb, %cluster, reason = reason.as_str(), "gate verdict changed");
    // Nobody listening is fine: reconcilers also read snapshots.
    let _ = inner.changes.send(Change {
        lb_id: lb.clone(),
        generation: entry.verdict_generation,
        cluster: cluster.clone(),
        machines: entry.track.machines(),
        reason,
        observed,
    });
}

/// Updates the member metrics; returns when the members whose creation the engine watched
/// and this poll saw ACTIVE finished.
fn record_member_metrics(
    inner: &Inner,
    entry: &mut LbEntry,
    before: &[MemberTrack],
    verdict: &LbVerdict,
    previous_poll: Option<Instant>,
    now: Instant,
) -> Vec<Finish> {
    let mut learnt = Vec::new();
    let metrics = &inner.metrics;
    let observer = inner.observer.name();
    let cluster = &entry.track.desired.cluster;
    let rows = entry.track.members.iter().map(member_row).collect();
    metrics.set_members(cluster, &entry.track.desired.lb_id, rows);
    for (index, track) in entry.track.members.iter().enumerate() {
        let old = before.iter().find(|b| {
            b.desired.address == track.desired.address && b.desired.port == track.desired.port
        });
        let newly_active = track.active_at.is_some() && old.is_none_or(|o| o.active_at.is_none());
        if newly_active {
            let took = now.saturating_duration_since(track.desired.requested_at);
            let lag = previous_poll.map(|previous| now.saturating_duration_since(previous));
            metrics.member_active(observer, took, lag);
            if let Some(previous) = previous_poll {
                // Only creations the engine watched teach it how long they take: a member
                // first seen already ACTIVE says nothing about when it finished.
                let watched = old.is_some_and(|o| {
                    o.presence == Presence::Seen(ProvisioningStatus::PendingCreate)
                }) || track.desired.requested_at >= previous;
                if watched {
                    learnt.push(Finish {
                        earliest: previous.saturating_duration_since(track.desired.requested_at),
                        latest: took,
                    });
                }
            }
        }
        let was = entry.verdict.members.get(index).map(|(_, _, v)| v.kind());
        let is = verdict.members.get(index).map(|(_, _, v)| v.kind());
        if let Some(is) = is.filter(|is| Some(*is) != was) {
            metrics.member_became(cluster, is);
        }
    }
    let count = |verdict: &LbVerdict, kind: MemberVerdictKind| {
        verdict
            .members
            .iter()
            .filter(|(_, _, v)| v.kind() == kind)
            .count() as i64
    };
    for kind in MemberVerdictKind::ALL {
        metrics.add_members_by_verdict(kind, count(verdict, kind) - count(&entry.verdict, kind));
    }
    learnt
}

fn member_row(track: &MemberTrack) -> MemberRow {
    let (provisioning, operating) = match track.presence {
        Presence::Seen(p) => (
            p.as_str(),
            track
                .operating
                .map(OperatingStatus::as_str)
                .unwrap_or("UNKNOWN"),
        ),
        Presence::Absent => ("ABSENT", "UNKNOWN"),
    };
    MemberRow {
        pool: track.pool_id.clone().unwrap_or_default(),
        member: track.desired.name.clone(),
        machine: track.desired.owner.name.clone(),
        provisioning,
        operating,
    }
}
