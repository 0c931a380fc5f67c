//! The engine: one polling loop per cloud endpoint, every request through the cloud client
//! (and so its rate limiter), verdicts recomputed on each observation, changes published to
//! subscribers. Reconcilers talk to it through `ensure`, `forget`, `snapshot` and `subscribe`.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::EngineMetrics;
use super::model::{DesiredLb, LbTrack, MemberTrack, ObjectRef, Observation, Presence, SeenMember};
use super::schedule::{Finish, Pick, PollOutcome, ScheduleConfig, Scheduler};
use super::verdict::{Health, LbVerdict, MemberVerdict, Reason, health, lb_verdict};
use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus};
use crate::cloud::{CloudClient, CloudError};

/// How members are observed; the latter two reproduce other providers for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// One status-tree GET per LB per poll: every member's own status (ours).
    StatusTree,
    /// CAPO 0.14: after a member is created, GET it (1 s, x1.25, 20 steps) until ACTIVE, and
    /// GET the LB; a member is never looked at again once ACTIVE or given up on.
    MemberGet,
    /// A member counts as ready once the LB is ACTIVE (what a provider that trusts the LB does).
    LbOnly,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::StatusTree, Strategy::MemberGet, Strategy::LbOnly];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::StatusTree => "status-tree",
            Strategy::MemberGet => "member-get",
            Strategy::LbOnly => "lb-only",
        }
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| format!("unknown strategy {text:?} (status-tree, member-get, lb-only)"))
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub strategy: Strategy,
    /// A member PENDING_* longer than this is stuck.
    pub stuck_after: Duration,
    pub schedule: ScheduleConfig,
    /// Polls in flight per cloud endpoint.
    pub max_in_flight: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            strategy: Strategy::StatusTree,
            stuck_after: Duration::from_secs(600),
            schedule: ScheduleConfig::default(),
            max_in_flight: 8,
        }
    }
}

/// A verdict changed: wake these objects.
#[derive(Clone, Debug)]
pub struct Change {
    pub lb_id: String,
    /// The desired-state generation the verdict reflects (see [`Engine::ensure`]).
    pub generation: u64,
    pub owners: Vec<ObjectRef>,
    pub reason: Reason,
    /// When the poll's answer arrived (real time): subscribers can measure wake-up latency.
    pub observed: std::time::Instant,
}

/// What the engine knows about one LB.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The desired-state generation the verdict reflects.
    pub generation: u64,
    pub verdict: LbVerdict,
    pub health: Health,
    pub members: Vec<MemberTrack>,
    pub last_poll: Option<Instant>,
}

/// CAPO 0.14's per-member polling state.
#[derive(Clone, Debug)]
struct MemberGetState {
    steps: u32,
    next_at: Instant,
    last: Option<ProvisioningStatus>,
    finished: bool,
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
    member_get: HashMap<String, MemberGetState>,
    /// Metric label sets written for this LB, removed when they change or the LB goes.
    member_labels: Vec<[String; 6]>,
    reason_label: Option<String>,
}

struct Endpoint {
    scheduler: Mutex<Scheduler>,
    notify: Notify,
}

#[derive(Default)]
struct State {
    lbs: HashMap<String, LbEntry>,
    endpoints: HashMap<String, Arc<Endpoint>>,
}

struct Inner {
    config: EngineConfig,
    metrics: EngineMetrics,
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
    cancel: CancellationToken,
}

/// The membership engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Registers the engine's metrics on `registry`; `cancel` stops every loop.
    pub fn new(
        config: EngineConfig,
        registry: &prometheus::Registry,
        cancel: CancellationToken,
    ) -> prometheus::Result<Self> {
        let (changes, _) = broadcast::channel(4096);
        let mut config = config;
        if config.strategy != Strategy::StatusTree {
            // The providers these strategies reproduce never look at a settled LB again, and
            // start waiting for the LB the moment they changed it.
            config.schedule.drift_min = Duration::from_secs(86_400);
            config.schedule.drift_max = Duration::from_secs(86_400);
            config.schedule.look_after_change = Duration::ZERO;
        }
        Ok(Engine {
            inner: Arc::new(Inner {
                metrics: EngineMetrics::register(registry)?,
                config,
                state: Mutex::new(State::default()),
                changes,
                cancel,
            }),
        })
    }

    pub fn strategy(&self) -> Strategy {
        self.inner.config.strategy
    }

    /// Sets (or updates) a load balancer's desired membership; `client` is how to reach its
    /// cloud. The LB is polled soon after. Returns the desired-state generation: changes and
    /// snapshots carry the generation their verdict was computed for, so a caller can tell a
    /// verdict about its latest wish from an older one.
    pub fn ensure(&self, desired: DesiredLb, client: &CloudClient) -> u64 {
        let now = Instant::now();
        let scope = client.path().session().scope();
        let key = format!("{}|{}", scope.auth_url, scope.region);
        let lb_id = desired.lb_id.clone();
        let rollout_waiting = desired.rollout_waiting;
        let endpoint = {
            let mut state = self.inner.lock();
            let endpoint = match state.endpoints.get(&key) {
                Some(endpoint) => endpoint.clone(),
                None => {
                    let endpoint = Arc::new(Endpoint {
                        scheduler: Mutex::new(Scheduler::new(
                            self.inner.config.schedule.clone(),
                            now,
                        )),
                        notify: Notify::new(),
                    });
                    state.endpoints.insert(key.clone(), endpoint.clone());
                    tokio::spawn(run_endpoint(
                        self.inner.clone(),
                        key.clone(),
                        endpoint.clone(),
                    ));
                    endpoint
                }
            };
            let desired = match state.lbs.get(&lb_id) {
                Some(entry) => entry.track.keep_request_times(desired),
                None => desired,
            };
            let generation = match state.lbs.get_mut(&lb_id) {
                Some(entry) if entry.track.desired == desired => return entry.generation,
                Some(entry) => {
                    entry.generation += 1;
                    entry.track.set_desired(desired);
                    entry.client = client.clone();
                    // CAPO waits for the LB around every change.
                    entry.member_get.remove(LB_WAIT);
                    entry.generation
                }
                None => {
                    let track = LbTrack::new(desired, now);
                    let verdict = lb_verdict(&track, now, self.inner.config.stuck_after);
                    state.lbs.insert(
                        lb_id.clone(),
                        LbEntry {
                            generation: 1,
                            verdict_generation: 0,
                            track,
                            verdict,
                            endpoint: key,
                            client: client.clone(),
                            member_get: HashMap::new(),
                            member_labels: Vec::new(),
                            reason_label: None,
                        },
                    );
                    1
                }
            };
            (endpoint, generation)
        };
        let (endpoint, generation) = endpoint;
        lock(&endpoint.scheduler).wake(&lb_id, rollout_waiting, now);
        endpoint.notify.notify_one();
        generation
    }

    /// Stops tracking a load balancer.
    pub fn forget(&self, lb_id: &str) {
        let mut state = self.inner.lock();
        if let Some(entry) = state.lbs.remove(lb_id) {
            self.inner.clear_metrics(&entry);
            if let Some(endpoint) = state.endpoints.get(&entry.endpoint) {
                lock(&endpoint.scheduler).remove(lb_id);
            }
        }
    }

    pub fn snapshot(&self, lb_id: &str) -> Option<Snapshot> {
        let state = self.inner.lock();
        let entry = state.lbs.get(lb_id)?;
        Some(Snapshot {
            generation: entry.verdict_generation,
            verdict: entry.verdict.clone(),
            health: health(&entry.track),
            members: entry.track.members.clone(),
            last_poll: entry.track.last_poll,
        })
    }

    /// Every verdict change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    /// Load balancers tracked.
    pub fn len(&self) -> usize {
        self.inner.lock().lbs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn clear_metrics(&self, entry: &LbEntry) {
        for labels in &entry.member_labels {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            let _ = self.metrics.member_state.remove_label_values(&labels);
        }
        let cluster = &entry.track.desired.cluster;
        let lb = entry.track.desired.lb_id.as_str();
        let _ =
            self.metrics
                .gate_ready
                .remove_label_values(&[&cluster.namespace, &cluster.name, lb]);
        if let Some(reason) = &entry.reason_label {
            let _ = self.metrics.gate_reason.remove_label_values(&[
                &cluster.namespace,
                &cluster.name,
                lb,
                reason,
            ]);
        }
    }
}

async fn run_endpoint(inner: Arc<Inner>, key: String, endpoint: Arc<Endpoint>) {
    let mut polls = JoinSet::new();
    loop {
        let now = Instant::now();
        while polls.len() < inner.config.max_in_flight.max(1) {
            let Some(pick) = lock(&endpoint.scheduler).next(now) else {
                break;
            };
            polls.spawn(poll(inner.clone(), endpoint.clone(), pick));
        }
        let (wake, interval, learned) = {
            let scheduler = lock(&endpoint.scheduler);
            (
                scheduler.wake_at(now),
                scheduler.drift_interval(scheduler.len()),
                scheduler.provisioning_times().len(),
            )
        };
        inner
            .metrics
            .drift_interval_seconds
            .with_label_values(&[&key])
            .set(interval.as_secs_f64());
        inner
            .metrics
            .learned_windows
            .with_label_values(&[&key])
            .set(learned as f64);
        // Never a zero wait: if the scheduler has nothing now, time must pass.
        let wake = wake
            .unwrap_or(now + Duration::from_secs(3600))
            .max(now + Duration::from_millis(1));
        let sleep = tokio::time::sleep_until(wake);
        tokio::select! {
            () = inner.cancel.cancelled() => break,
            () = endpoint.notify.notified() => {}
            Some(_) = polls.join_next(), if !polls.is_empty() => {}
            () = sleep, if polls.len() < inner.config.max_in_flight.max(1) => {}
        }
    }
    polls.shutdown().await;
}

/// What one poll learnt.
enum Seen {
    Observed(Observation),
    Gone,
}

async fn poll(inner: Arc<Inner>, endpoint: Arc<Endpoint>, pick: Pick) {
    // Ours: urgent or drift polls; the comparison strategies poll on their own backoff.
    let kind = match (inner.config.strategy, pick.urgent) {
        (Strategy::StatusTree, true) => "urgent",
        (Strategy::StatusTree, false) => "drift",
        _ => "backoff",
    };
    inner
        .metrics
        .scheduler_lag_seconds
        .with_label_values(&[kind])
        .observe(pick.lag.as_secs_f64());
    let (client, desired, member_get, generation) = {
        let state = inner.lock();
        let Some(entry) = state.lbs.get(&pick.lb) else {
            return;
        };
        (
            entry.client.clone(),
            entry.track.desired.clone(),
            entry.member_get.clone(),
            entry.generation,
        )
    };
    let strategy = inner.config.strategy;
    let result = match strategy {
        Strategy::StatusTree => observe_tree(&client, &desired).await,
        Strategy::LbOnly => observe_lb_only(&client, &desired, member_get).await,
        Strategy::MemberGet => observe_member_get(&client, &desired, member_get).await,
    };
    let observed = std::time::Instant::now();
    let now = Instant::now();
    let (seen, member_get) = match result {
        Ok(seen) => seen,
        Err(error) => {
            let result = error.kind();
            inner
                .metrics
                .polls_total
                .with_label_values(&[strategy.as_str(), kind, result])
                .inc();
            tracing::debug!(lb = %pick.lb, %error, "load balancer poll failed");
            let mut scheduler = lock(&endpoint.scheduler);
            match error {
                CloudError::RateLimited { retry_after, .. } => {
                    scheduler.defer(&pick.lb, now + retry_after)
                }
                _ => scheduler.done(
                    &pick.lb,
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
    inner
        .metrics
        .polls_total
        .with_label_values(&[strategy.as_str(), kind, "ok"])
        .inc();
    let (outcome, learnt) = {
        let mut state = inner.lock();
        let Some(entry) = state.lbs.get_mut(&pick.lb) else {
            return;
        };
        if let Some(member_get) = member_get {
            entry.member_get = member_get;
        }
        let previous_poll = entry.track.last_poll;
        let before: Vec<MemberTrack> = entry.track.members.clone();
        let changed = match &seen {
            Seen::Observed(observation) => entry.track.observe(observation, now),
            Seen::Gone => entry.track.observe_gone(now),
        };
        let verdict = lb_verdict(&entry.track, now, inner.config.stuck_after);
        let learnt = record_member_metrics(&inner, entry, &before, &verdict, previous_poll, now);
        // A newer desired state arrived during the poll: this verdict is still about the one
        // the poll started with.
        let generation = generation.min(entry.generation);
        let verdict_changed =
            !verdict.same_gate(&entry.verdict) || generation != entry.verdict_generation;
        entry.verdict = verdict;
        entry.verdict_generation = generation;
        if verdict_changed {
            publish(&inner, entry, observed);
        }
        let deadline = stuck_deadline(entry, inner.config.stuck_after);
        let member_get_due = entry
            .member_get
            .values()
            .filter(|m| !m.finished)
            .map(|m| m.next_at)
            .min();
        let deadline = [deadline, member_get_due].into_iter().flatten().min();
        // Ours polls while something is on its way (pending, missing, not yet seen, stuck: it
        // may still recover); ERROR changes only when someone repairs it, which wakes us. So
        // an LB a rollout waits on is urgent exactly while it is on its way. The other
        // strategies follow their own backoff only.
        let urgent = strategy == Strategy::StatusTree
            && matches!(
                entry.verdict.reason,
                Reason::Unknown
                    | Reason::LoadBalancerPending
                    | Reason::MembersPending
                    | Reason::MembersMissing
                    | Reason::MemberStuck
            );
        let outcome = PollOutcome {
            // A load balancer that is gone stays reported but is only re-checked at drift pace.
            urgent: urgent && !matches!(seen, Seen::Gone),
            changed: changed || verdict_changed,
            deadline,
            creating_for: creating_for(entry, now),
        };
        (outcome, learnt)
    };
    let mut scheduler = lock(&endpoint.scheduler);
    for took in learnt {
        scheduler.learn(took);
    }
    scheduler.done(&pick.lb, &outcome, now);
}

/// How long each member still being created has been on its way, when those creations are
/// all the LB waits for (otherwise the LB's own state, or another pending member, paces the
/// polls).
fn creating_for(entry: &LbEntry, now: Instant) -> Vec<Duration> {
    let creating = Presence::Seen(ProvisioningStatus::PendingCreate);
    let other_pending = entry.track.members.iter().any(|m| {
        matches!(m.presence, Presence::Seen(p) if p.is_pending()) && m.presence != creating
    });
    if entry.verdict.reason != Reason::MembersPending || other_pending {
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

/// When the next pending member turns stuck, so the verdict flips on time.
fn stuck_deadline(entry: &LbEntry, stuck_after: Duration) -> Option<Instant> {
    entry
        .verdict
        .members
        .iter()
        .filter_map(|(_, _, v)| match v {
            MemberVerdict::Pending { since } => Some(*since + stuck_after),
            _ => None,
        })
        .min()
}

fn publish(inner: &Inner, entry: &mut LbEntry, observed: std::time::Instant) {
    let cluster = entry.track.desired.cluster.clone();
    let lb = entry.track.desired.lb_id.clone();
    let ready = i64::from(entry.verdict.is_ready());
    inner
        .metrics
        .gate_ready
        .with_label_values(&[&cluster.namespace, &cluster.name, &lb])
        .set(ready);
    let reason = entry.verdict.reason.as_str().to_owned();
    if let Some(old) = entry.reason_label.replace(reason.clone()) {
        let _ = inner.metrics.gate_reason.remove_label_values(&[
            &cluster.namespace,
            &cluster.name,
            &lb,
            &old,
        ]);
    }
    inner
        .metrics
        .gate_reason
        .with_label_values(&[&cluster.namespace, &cluster.name, &lb, &reason])
        .set(1);
    tracing::debug!(lb = %lb, cluster = %cluster, reason = %reason, "gate verdict changed");
    // Nobody listening is fine: reconcilers also read snapshots.
    let _ = inner.changes.send(Change {
        lb_id: lb,
        generation: entry.verdict_generation,
        owners: entry.track.owners(),
        reason: entry.verdict.reason,
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
    let strategy = inner.config.strategy.as_str();
    let cluster = entry.track.desired.cluster.clone();
    for labels in entry.member_labels.drain(..) {
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let _ = metrics.member_state.remove_label_values(&labels);
    }
    for (index, track) in entry.track.members.iter().enumerate() {
        let old = before.iter().find(|b| {
            b.desired.address == track.desired.address && b.desired.port == track.desired.port
        });
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
        let labels = [
            cluster.namespace.clone(),
            cluster.name.clone(),
            track.pool_id.clone().unwrap_or_default(),
            track.desired.name.clone(),
            provisioning.to_owned(),
            operating.to_owned(),
        ];
        let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
        metrics.member_state.with_label_values(&refs).set(1);
        entry.member_labels.push(labels);
        let newly_active = track.active_at.is_some() && old.is_none_or(|o| o.active_at.is_none());
        if newly_active {
            let took = now.saturating_duration_since(track.desired.requested_at);
            metrics
                .provisioning_seconds
                .with_label_values(&[strategy])
                .observe(took.as_secs_f64());
            if let Some(previous) = previous_poll {
                metrics
                    .detection_lag_seconds
                    .with_label_values(&[strategy])
                    .observe(now.saturating_duration_since(previous).as_secs_f64());
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
        let was = entry.verdict.members.get(index).map(|(_, _, v)| v.name());
        let is = verdict.members.get(index).map(|(_, _, v)| v.name());
        if is != was {
            match is {
                Some("Stuck") => metrics
                    .stuck_total
                    .with_label_values(&[&cluster.namespace, &cluster.name])
                    .inc(),
                Some("Error") => metrics
                    .error_total
                    .with_label_values(&[&cluster.namespace, &cluster.name])
                    .inc(),
                _ => {}
            }
        }
    }
    for name in [
        "Active", "Pending", "Stuck", "Error", "Missing", "Deleting", "Gone",
    ] {
        let delta = verdict
            .members
            .iter()
            .filter(|(_, _, v)| v.name() == name)
            .count() as i64
            - entry
                .verdict
                .members
                .iter()
                .filter(|(_, _, v)| v.name() == name)
                .count() as i64;
        if delta != 0 {
            metrics
                .members_by_verdict
                .with_label_values(&[name])
                .add(delta);
        }
    }
    learnt
}

type Observed = (Seen, Option<HashMap<String, MemberGetState>>);

/// Ours: the status tree; pool member lists when the tree is refused or missing.
async fn observe_tree(client: &CloudClient, desired: &DesiredLb) -> Result<Observed, CloudError> {
    match client.octavia().status_tree(&desired.lb_id).await {
        Ok(tree) => Ok((Seen::Observed(Observation::from_tree(&tree)), None)),
        Err(CloudError::NotFound(_) | CloudError::Forbidden(_)) => {
            observe_lists(client, desired).await
        }
        Err(error) => Err(error),
    }
}

/// The fallback: the LB, then each desired pool's members.
async fn observe_lists(client: &CloudClient, desired: &DesiredLb) -> Result<Observed, CloudError> {
    let lb = match client.octavia().get_load_balancer(&desired.lb_id).await {
        Ok(lb) => lb,
        Err(CloudError::NotFound(_)) => return Ok((Seen::Gone, None)),
        Err(error) => return Err(error),
    };
    let mut members = Vec::new();
    let mut pools_seen = Vec::new();
    for pool in desired.pools.values() {
        match client.octavia().list_members(pool).await {
            Ok(listed) => {
                pools_seen.push(pool.clone());
                members.extend(listed.into_iter().map(|m| SeenMember {
                    pool_id: pool.clone(),
                    id: m.id,
                    name: m.name,
                    address: m.address,
                    port: m.protocol_port,
                    provisioning: m.provisioning_status,
                    operating: m.operating_status,
                }));
            }
            Err(CloudError::NotFound(_)) => pools_seen.push(pool.clone()),
            Err(error) => return Err(error),
        }
    }
    let observation = Observation {
        provisioning: lb.provisioning_status,
        operating: lb.operating_status,
        members,
        pools_seen,
    };
    Ok((Seen::Observed(observation), None))
}

/// Every desired member with a made-up status.
fn assumed(
    desired: &DesiredLb,
    status: impl Fn(&super::model::DesiredMember) -> Option<ProvisioningStatus>,
    lb: ProvisioningStatus,
) -> Observation {
    let members = desired
        .members
        .iter()
        .filter_map(|m| {
            let pool_id = desired.pools.get(&m.port)?.clone();
            Some(SeenMember {
                pool_id,
                id: m.member_id.clone().unwrap_or_default(),
                name: m.name.clone(),
                address: m.address.clone(),
                port: m.port,
                provisioning: status(m)?,
                operating: OperatingStatus::NoMonitor,
            })
        })
        .collect();
    Observation {
        provisioning: lb,
        operating: OperatingStatus::Unknown,
        members,
        pools_seen: desired.pools.values().cloned().collect(),
    }
}

/// A provider that trusts the LB: members are whatever the LB is. It GETs the LB after each
/// change with CAPO's backoff until ACTIVE, and not again.
async fn observe_lb_only(
    client: &CloudClient,
    desired: &DesiredLb,
    mut states: HashMap<String, MemberGetState>,
) -> Result<Observed, CloudError> {
    let lb = match client.octavia().get_load_balancer(&desired.lb_id).await {
        Ok(lb) => lb,
        Err(CloudError::NotFound(_)) => return Ok((Seen::Gone, None)),
        Err(error) => return Err(error),
    };
    step(
        &mut states,
        LB_WAIT,
        Some(lb.provisioning_status),
        Instant::now(),
    );
    let status = lb.provisioning_status;
    let as_lb = if status == ProvisioningStatus::Active {
        ProvisioningStatus::Active
    } else {
        ProvisioningStatus::PendingCreate
    };
    Ok((
        Seen::Observed(assumed(desired, |_| Some(as_lb), status)),
        Some(states),
    ))
}

/// The key of the LB's own wait in the backoff states.
const LB_WAIT: &str = "lb";

/// One backoff step (1 s x1.25, at most 20) of a wait for ACTIVE.
fn step(
    states: &mut HashMap<String, MemberGetState>,
    key: &str,
    seen: Option<ProvisioningStatus>,
    now: Instant,
) {
    let state = states.entry(key.to_owned()).or_insert(MemberGetState {
        steps: 0,
        next_at: now,
        last: None,
        finished: false,
    });
    state.last = seen;
    state.steps += 1;
    state.finished = seen == Some(ProvisioningStatus::Active) || state.steps >= MEMBER_GET_STEPS;
    state.next_at =
        now + Duration::from_secs_f64(1.25f64.powi(i32::try_from(state.steps).unwrap_or(i32::MAX)));
}

const MEMBER_GET_STEPS: u32 = 20;

/// CAPO 0.14: after a change, the LB until ACTIVE, and each new member until ACTIVE, both with
/// 1 s x1.25 backoff for 20 steps; nothing is looked at again afterwards.
async fn observe_member_get(
    client: &CloudClient,
    desired: &DesiredLb,
    mut states: HashMap<String, MemberGetState>,
) -> Result<Observed, CloudError> {
    let now = Instant::now();
    states.retain(|key, _| key == LB_WAIT || desired.members.iter().any(|m| member_key(m) == *key));
    let due = |states: &HashMap<String, MemberGetState>, key: &str| {
        states
            .get(key)
            .is_none_or(|s| !s.finished && s.next_at <= now)
    };
    let known = states.get(LB_WAIT).and_then(|s| s.last);
    let lb_status = match known {
        Some(status) if !due(&states, LB_WAIT) => status,
        _ => {
            let lb = match client.octavia().get_load_balancer(&desired.lb_id).await {
                Ok(lb) => lb,
                Err(CloudError::NotFound(_)) => return Ok((Seen::Gone, None)),
                Err(error) => return Err(error),
            };
            step(&mut states, LB_WAIT, Some(lb.provisioning_status), now);
            lb.provisioning_status
        }
    };
    for member in &desired.members {
        let (Some(id), Some(pool)) = (&member.member_id, desired.pools.get(&member.port)) else {
            continue;
        };
        let key = member_key(member);
        if !due(&states, &key) {
            continue;
        }
        let seen = match client.octavia().get_member(pool, id).await {
            Ok(seen) => Some(seen.provisioning_status),
            Err(CloudError::NotFound(_)) => None,
            Err(error) => return Err(error),
        };
        step(&mut states, &key, seen, now);
    }
    let observation = assumed(
        desired,
        |m| states.get(&member_key(m)).and_then(|s| s.last),
        lb_status,
    );
    Ok((Seen::Observed(observation), Some(states)))
}

fn member_key(member: &super::model::DesiredMember) -> String {
    format!("{}:{}", member.address, member.port)
}
