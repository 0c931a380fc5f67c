//! `capo-rs bench membership`: a fleet of control-plane rollouts against the simulated cloud,
//! in-process on virtual time, once per strategy, and what each strategy cost and got wrong.
//!
//! Each cluster has an API load balancer with three ACTIVE members. At a random time within the
//! window its rollout starts: for each old member, create a new one, wait for the gate to say
//! Ready, delete the old one, wait again. The driver acts on the gate exactly as Cluster API
//! would, so a Ready verdict while a desired member is not ACTIVE in the cloud is a false-ready:
//! the moment an old control-plane machine would be removed too early.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use capo_provider::cloud::{
    CloudClient, CloudError, CloudOptions, Clouds, RateLimit, SendError, Service, Session,
    SessionScope,
};
use capo_provider::membership::{
    DesiredLb, DesiredMember, Engine, EngineConfig, Notice, ObjectName, Reason, Recalled,
    ScheduleConfig,
};

use crate::Strategy;
use capo_sim::openstack::{
    Delay, Effect, ObjectKind, OpenStackSim, OpenStackSimConfig, Rule, Scenario, Timings,
};

/// The scenario's knobs.
#[derive(Clone, Debug, Serialize)]
pub struct BenchConfig {
    pub clusters: u32,
    pub members: u32,
    /// Rollouts start uniformly within this window.
    pub window: Duration,
    pub provision_min: f64,
    pub provision_max: f64,
    pub slow_share: f64,
    pub slow_seconds: f64,
    pub stuck_share: f64,
    pub error_share: f64,
    pub qps: u32,
    pub burst: u32,
    pub stuck_after: Duration,
    pub seed: u64,
    /// An LB stays locked until its new member settles (Octavia's own flow order), instead
    /// of the race where members outlast their LB's unlock.
    pub octavia_ordered: bool,
    /// The status-tree engine's scheduling (budget fields are set from `qps` and `burst`).
    pub schedule: ScheduleConfig,
    /// The lag the floor's poller sees every finish within (`crate::floor`).
    pub floor_lag: f64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            clusters: 1000,
            members: 3,
            window: Duration::from_secs(3600),
            provision_min: 2.0,
            provision_max: 30.0,
            slow_share: 0.05,
            slow_seconds: 120.0,
            stuck_share: 0.01,
            error_share: 0.01,
            qps: 20,
            burst: 40,
            stuck_after: Duration::from_secs(600),
            seed: 42,
            octavia_ordered: false,
            schedule: ScheduleConfig::default(),
            floor_lag: 2.0,
        }
    }
}

/// One strategy's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StrategyReport {
    pub strategy: String,
    /// Requests the engine sent (polls of every kind).
    pub requests: u64,
    /// Of which drift checks of settled load balancers (a cost the other strategies skip).
    pub drift_polls: u64,
    /// Of which LB list pages (status-tree: the sweep that shows changed and unlocked LBs).
    pub list_pages: u64,
    /// Rollout-related requests (all but drift) per member transition.
    pub rollout_requests_per_transition: f64,
    /// Member transitions the rollouts completed (creates and deletes that settled).
    pub transitions: u64,
    pub requests_per_transition: f64,
    /// The most engine requests in any one second of (virtual) time.
    pub peak_requests_per_second: u64,
    /// Requests a token bucket of the budget (rate and burst) would have refused: 0 means the
    /// budget was never exceeded (a second may hold up to rate + burst after a quiet spell).
    pub over_budget: u64,
    /// Poll answer -> subscriber holding the change, real microseconds.
    pub wakeup_p50_us: f64,
    pub wakeup_max_us: f64,
    /// Those that changed a verdict, less the simulator's turns on the benchmark's thread ...
    pub wakeup_news_p50_us: f64,
    pub wakeup_news_max_us: f64,
    /// ... and of those, the ones no LB list page was answered (and parsed) during.
    pub wakeup_quiet_p50_us: f64,
    pub wakeup_quiet_max_us: f64,
    pub wakeup_quiet_samples: u64,
    /// Member ACTIVE in the cloud -> gate verdict change, seconds.
    pub detection_lag_p50: f64,
    pub detection_lag_p99: f64,
    pub detection_lag_max: f64,
    /// Creations the lag was measured on: those whose member was ACTIVE when the gate opened
    /// (a gate that opens before the member is ACTIVE has no lag, it is a false-ready).
    pub detection_lag_samples: u64,
    /// Requests per rollout (its LB and pool; lists aside), by the worst fate it met.
    pub requests_by_fate: Vec<FateCost>,
    /// The fewest requests any poller told the scenario's windows could have spent on the same
    /// rollouts, seeing every finish within `floor_lag` (`crate::floor`); `None` when the LB
    /// waits for its members (a list then shows each finish, and the floor does not apply).
    pub floor_requests: Option<u64>,
    pub floor_per_transition: Option<f64>,
    /// Ready verdicts acted on while a desired member was not ACTIVE.
    pub false_ready: u64,
    pub stuck_members: u64,
    /// Seconds after the stuck threshold (request + stuck-after) that MemberStuck was seen;
    /// `None` when a stuck member was never flagged.
    pub stuck_flag_late_max: Option<f64>,
    pub stuck_unflagged: u64,
    pub error_members: u64,
    /// Seconds from a member's ERROR to MemberError.
    pub error_flag_max: Option<f64>,
    pub error_unflagged: u64,
    pub rollouts_completed: u64,
    /// Gate waits that got no notification for an hour (should be 0).
    pub missed_notifications: u64,
    /// Virtual time the run covered.
    pub virtual_seconds: f64,
    /// Real CPU time of the run on one thread, and the part the simulator took.
    pub cpu_seconds: f64,
    pub simulator_cpu_seconds: f64,
}

/// A session that counts when each request was sent (virtual time) before passing it on,
/// and how many were LB list pages.
struct CountingSession {
    inner: Arc<dyn Session>,
    sent: Mutex<Vec<Instant>>,
    list_pages: std::sync::atomic::AtomicU64,
    /// Requests about one LB or pool, by its id.
    per_object: Mutex<HashMap<String, u64>>,
    sim: Arc<OpenStackSim>,
    /// Each answer as it came back.
    answered: Mutex<Vec<Answer>>,
}

impl CountingSession {
    fn new(sim: Arc<OpenStackSim>) -> Self {
        CountingSession {
            inner: sim.session(),
            sent: Mutex::new(Vec::new()),
            list_pages: Default::default(),
            per_object: Default::default(),
            sim,
            answered: Mutex::new(Vec::new()),
        }
    }
}

/// The LB or pool a request is about (`.../loadbalancers/{id}/...`, `.../pools/{id}/...`).
fn object_of(path: &str) -> Option<&str> {
    let mut segments = path.split('/');
    while let Some(segment) = segments.next() {
        if segment == "loadbalancers" || segment == "pools" {
            return segments.next().filter(|id| !id.is_empty());
        }
    }
    None
}

#[async_trait]
impl Session for CountingSession {
    fn scope(&self) -> &SessionScope {
        self.inner.scope()
    }
    async fn service_url(&self, service: Service) -> Result<url::Url, SendError> {
        self.inner.service_url(service).await
    }
    async fn send(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<bytes::Bytes>, SendError> {
        if let Ok(mut sent) = self.sent.lock() {
            sent.push(Instant::now());
        }
        let list = request.uri().path().ends_with("/lbaas/loadbalancers");
        if list {
            self.list_pages
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(object) = object_of(request.uri().path())
            && let Ok(mut per_object) = self.per_object.lock()
        {
            *per_object.entry(object.to_owned()).or_default() += 1;
        }
        let answer = self.inner.send(request).await;
        if let Ok(mut answered) = self.answered.lock() {
            answered.push(Answer {
                at: std::time::Instant::now(),
                sim_busy: self.sim.busy(),
                list,
            });
        }
        answer
    }
}

/// An answer as it came back to the engine.
struct Answer {
    at: std::time::Instant,
    /// The simulator's busy time by then.
    sim_busy: Duration,
    /// It was a page of an LB list (which the engine then parses on the same thread).
    list: bool,
}

/// Wake-up latencies (microseconds, sorted).
#[derive(Default)]
struct WakeupLatencies {
    every: Vec<f64>,
    /// Those that changed a verdict, less the simulator's turns on the benchmark's one
    /// thread meanwhile (its busy time between the answer the verdict came from and the
    /// wake-up) ...
    news: Vec<f64>,
    /// ... and of those, the ones during which no LB list page was answered (and parsed).
    news_without_list: Vec<f64>,
}

fn median(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// A verdict's way from the poll that saw it to the cluster waiting on it.
struct Wakeup {
    observed: std::time::Instant,
    received: std::time::Instant,
    /// The simulator's busy time when it was received.
    sim_busy: Duration,
    /// It changed the verdict its cluster held (not the same one published again).
    news: bool,
}

fn wakeup_latencies(wakeups: &[Wakeup], answered: &[Answer]) -> WakeupLatencies {
    let mut latencies = WakeupLatencies::default();
    for w in wakeups {
        let took = w.received.saturating_duration_since(w.observed);
        latencies.every.push(took.as_secs_f64() * 1e6);
        if !w.news {
            continue;
        }
        let before = answered.partition_point(|a| a.at <= w.observed);
        let busy_then = before
            .checked_sub(1)
            .and_then(|i| answered.get(i))
            .map_or(Duration::ZERO, |a| a.sim_busy);
        let net = took.saturating_sub(w.sim_busy.saturating_sub(busy_then));
        latencies.news.push(net.as_secs_f64() * 1e6);
        let meanwhile = answered[before..].iter().take_while(|a| a.at <= w.received);
        if !meanwhile.into_iter().any(|a| a.list) {
            latencies.news_without_list.push(net.as_secs_f64() * 1e6);
        }
    }
    for v in [
        &mut latencies.every,
        &mut latencies.news,
        &mut latencies.news_without_list,
    ] {
        v.sort_by(f64::total_cmp);
    }
    latencies
}

/// The gate as each cluster's driver sees it.
type Gates = Arc<Mutex<HashMap<String, watch::Sender<GateState>>>>;

/// The latest verdict of a cluster's LB: reason, when it arrived, which desired generation.
type GateState = (Reason, Instant, u64);

/// What the drivers record, shared.
#[derive(Default)]
struct Record {
    lags: Vec<f64>,
    /// Each member created (its id) and when it was asked for.
    created: Vec<(String, Instant)>,
    /// Removals whose verdict was waited on.
    removals: u64,
    false_ready: u64,
    transitions: u64,
    rollouts_completed: u64,
    stuck_late: Vec<f64>,
    stuck_unflagged: u64,
    error_flag: Vec<f64>,
    error_unflagged: u64,
    missed_notifications: u64,
}

pub fn run(config: &BenchConfig, strategies: &[Strategy]) -> anyhow::Result<Vec<StrategyReport>> {
    strategies.iter().map(|s| run_one(config, *s)).collect()
}

fn run_one(config: &BenchConfig, strategy: Strategy) -> anyhow::Result<StrategyReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let cpu_start = thread_cpu();
    let mut report = runtime.block_on(rollouts(config, strategy))?;
    report.cpu_seconds = (thread_cpu() - cpu_start).as_secs_f64();
    Ok(report)
}

/// How many of `sent` (in time order) a token bucket of `qps` and `burst` would refuse.
fn over_budget(sent: &[Instant], qps: f64, burst: f64) -> u64 {
    let mut tokens = burst;
    let mut last: Option<Instant> = None;
    let mut refused = 0;
    for at in sent {
        if let Some(last) = last {
            tokens = (tokens + at.saturating_duration_since(last).as_secs_f64() * qps).min(burst);
        }
        last = Some(*at);
        // Timer granularity: a millisecond's worth of slack.
        if tokens + qps * 1e-3 >= 1.0 {
            tokens -= 1.0;
        } else {
            refused += 1;
        }
    }
    refused
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the parenthesised command: utime and stime are the 12th and 13th.
    let after = text.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

fn scenario(config: &BenchConfig) -> Scenario {
    Scenario {
        seed: Some(config.seed),
        timings: Timings {
            member_create: Delay::Uniform(config.provision_min, config.provision_max),
            member_delete: Delay::Uniform(config.provision_min, config.provision_max),
            lb_waits_for_members: config.octavia_ordered,
            ..Timings::default()
        },
        rules: vec![
            Rule {
                kind: ObjectKind::Member,
                name: "*-slow".into(),
                effect: Effect::Delay(Delay::Fixed(config.slow_seconds)),
                times: None,
            },
            Rule {
                kind: ObjectKind::Member,
                name: "*-stuck".into(),
                effect: Effect::Stuck,
                times: None,
            },
            Rule {
                kind: ObjectKind::Member,
                name: "*-error".into(),
                effect: Effect::Error,
                times: None,
            },
        ],
        ..Scenario::default()
    }
}

fn unlimited_options() -> CloudOptions {
    let mut options = CloudOptions::default();
    let unlimited = std::num::NonZeroU32::new(1_000_000).unwrap_or(std::num::NonZeroU32::MAX);
    options.rate_limit = RateLimit {
        qps: unlimited,
        burst: unlimited,
    };
    options.path.max_gate_wait = Duration::from_secs(3600);
    options
}

/// A cluster's load balancer: ids and the current members' addresses.
struct Fleet {
    lbs: Vec<(String, String)>,
}

async fn build_fleet(client: &CloudClient, config: &BenchConfig) -> anyhow::Result<Fleet> {
    let mut tasks = tokio::task::JoinSet::new();
    for cluster in 0..config.clusters {
        let client = client.clone();
        let members = config.members;
        tasks.spawn(async move {
            let (lb, pool) =
                capo_sim::support::api_load_balancer(&client, &format!("c{cluster}-kubeapi"))
                    .await?;
            for k in 0..members {
                capo_sim::support::create_member(
                    &client,
                    &lb,
                    &pool,
                    &format!("c{cluster}-cp-old-{k}"),
                    &address(cluster, k, 0),
                )
                .await?;
            }
            Ok::<_, anyhow::Error>((cluster, lb, pool))
        });
    }
    let mut lbs = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (cluster, lb, pool) = done??;
        lbs.insert(cluster, (lb, pool));
    }
    // Let every old member settle.
    tokio::time::sleep(Duration::from_secs_f64(config.provision_max + 5.0)).await;
    Ok(Fleet {
        lbs: lbs.into_values().collect(),
    })
}

fn address(cluster: u32, member: u32, generation: u32) -> String {
    format!(
        "10.{}.{}.{}",
        cluster / 250,
        cluster % 250,
        generation * 16 + member + 2
    )
}

async fn delete_member(
    client: &CloudClient,
    lb: &str,
    pool: &str,
    id: &str,
) -> Result<(), CloudError> {
    loop {
        match client.octavia().delete_member(pool, id).await {
            Ok(()) | Err(CloudError::NotFound(_)) => return Ok(()),
            Err(CloudError::Busy(_)) => capo_sim::support::settle(client, lb).await?,
            Err(error) => return Err(error),
        }
    }
}

async fn rollouts(config: &BenchConfig, strategy: Strategy) -> anyhow::Result<StrategyReport> {
    let sim = OpenStackSim::start(OpenStackSimConfig {
        scenario: scenario(config),
        ..OpenStackSimConfig::default()
    })
    .await?;
    let registry = prometheus::Registry::new();
    let driver_clouds = Clouds::new(unlimited_options(), &registry, CancellationToken::new())?;
    let driver = driver_clouds.client(sim.session());
    let fleet = build_fleet(&driver, config).await?;
    let load_balancers = fleet.lbs.len() as u64;
    tracing::info!(load_balancers = fleet.lbs.len(), "fleet built");
    sim.reset_request_log();
    let sim = Arc::new(sim);

    let counting = Arc::new(CountingSession::new(sim.clone()));
    let mut engine_options = unlimited_options();
    let qps = std::num::NonZeroU32::new(config.qps).unwrap_or(std::num::NonZeroU32::MIN);
    let burst = std::num::NonZeroU32::new(config.burst).unwrap_or(std::num::NonZeroU32::MIN);
    engine_options.rate_limit = RateLimit { qps, burst };
    let engine_registry = prometheus::Registry::new();
    let engine_clouds = Clouds::new(engine_options, &engine_registry, CancellationToken::new())?;
    let engine_client = engine_clouds.client(counting.clone());
    let engine_config = EngineConfig {
        stuck_after: config.stuck_after,
        schedule: strategy.schedule(ScheduleConfig {
            budget_qps: f64::from(config.qps),
            burst: f64::from(config.burst),
            ..config.schedule.clone()
        }),
        ..EngineConfig::default()
    };
    let cancel = CancellationToken::new();
    let engine = Engine::with_observer(
        engine_config,
        strategy.observer(),
        &engine_registry,
        cancel.clone(),
    )?;
    // A controller tracks every cluster's load balancer all the time, not only during rollouts.
    let truth = sim.member_truth();
    for (cluster, (lb, pool)) in fleet.lbs.iter().enumerate() {
        let members = truth
            .iter()
            .filter(|m| &m.pool_id == pool)
            .map(|m| desired_member(&m.name, &m.address, &m.id, Instant::now()))
            .collect();
        engine.ensure(
            DesiredLb {
                lb_id: lb.clone(),
                cluster: ObjectName::new("bench", format!("c{cluster}")),
                pools: BTreeMap::from([(6443, pool.clone())]),
                members,
                rollout_waiting: false,
                leaving: Vec::new(),
            },
            &engine_client,
        );
    }

    // Every change goes to its cluster's gate.
    let gates: Gates = Arc::new(Mutex::new(HashMap::new()));
    let mut changes = engine.subscribe();
    let dispatch_gates = gates.clone();
    let dispatch_engine = engine.clone();
    let wakeups: Arc<Mutex<Vec<Wakeup>>> = Arc::new(Mutex::new(Vec::new()));
    let dispatch_wakeups = wakeups.clone();
    let dispatch_sim = sim.clone();
    let dispatcher = tokio::spawn(async move {
        loop {
            match changes.recv().await {
                Some(Notice::Changed(change)) => {
                    let received = std::time::Instant::now();
                    let gate = dispatch_gates
                        .lock()
                        .ok()
                        .and_then(|g| g.get(&change.lb_id).cloned());
                    let news = gate.as_ref().is_none_or(|gate| {
                        let (reason, _, generation) = *gate.borrow();
                        (reason, generation) != (change.reason, change.generation)
                    });
                    if let Ok(mut wakeups) = dispatch_wakeups.lock() {
                        wakeups.push(Wakeup {
                            observed: change.observed,
                            received,
                            sim_busy: dispatch_sim.busy(),
                            news,
                        });
                    }
                    if let Some(gate) = gate {
                        let _ = gate.send((change.reason, Instant::now(), change.generation));
                    }
                }
                // Fell behind: every gate gets its current verdict.
                Some(Notice::Resync { .. }) => {
                    let gates: Vec<(String, watch::Sender<GateState>)> = dispatch_gates
                        .lock()
                        .map(|g| g.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                        .unwrap_or_default();
                    for (lb, gate) in gates {
                        if let Some(snapshot) = dispatch_engine.snapshot(&lb) {
                            let _ = gate.send((
                                snapshot.verdict.reason,
                                Instant::now(),
                                snapshot.generation,
                            ));
                        }
                    }
                }
                None => break,
            }
        }
    });

    let record = Arc::new(Mutex::new(Record::default()));
    let started = Instant::now();
    let cpu_sim_start = sim.busy();
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut drivers = tokio::task::JoinSet::new();
    let mut worst_fates: Vec<([String; 2], &'static str)> = Vec::new();
    for (cluster, (lb, pool)) in fleet.lbs.into_iter().enumerate() {
        let cluster = u32::try_from(cluster).unwrap_or(u32::MAX);
        let (gate_tx, gate_rx) = watch::channel((Reason::NotObserved, Instant::now(), 0));
        if let Ok(mut gates) = gates.lock() {
            gates.insert(lb.clone(), gate_tx);
        }
        let fates: Vec<&'static str> = (0..config.members)
            .map(|_| {
                let roll = rng.f64();
                if roll < config.stuck_share {
                    "-stuck"
                } else if roll < config.stuck_share + config.error_share {
                    "-error"
                } else if roll < config.stuck_share + config.error_share + config.slow_share {
                    "-slow"
                } else {
                    ""
                }
            })
            .collect();
        worst_fates.push(([lb.clone(), pool.clone()], worst_fate(&fates)));
        let start_at = started + config.window.mul_f64(rng.f64());
        let rollout = Rollout {
            cluster,
            lb,
            pool,
            fates,
            members: config.members,
            stuck_after: config.stuck_after,
            engine: engine.clone(),
            engine_client: engine_client.clone(),
            driver: driver.clone(),
            sim: sim.clone(),
            record: record.clone(),
        };
        drivers.spawn(async move {
            tokio::time::sleep_until(start_at).await;
            rollout.run(gate_rx).await
        });
    }
    let mut finished = 0;
    while let Some(done) = drivers.join_next().await {
        done??;
        finished += 1;
        tracing::debug!(
            finished,
            virtual_seconds = started.elapsed().as_secs(),
            "rollout finished"
        );
    }
    let virtual_seconds = started.elapsed().as_secs_f64();
    cancel.cancel();
    engine.shutdown().await;
    dispatcher.abort();

    let sent = counting.sent.lock().map(|s| s.clone()).unwrap_or_default();
    let per_object = counting
        .per_object
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    let drift_polls = drift_polls(&engine_registry);
    let mut per_second: HashMap<u64, u64> = HashMap::new();
    for at in &sent {
        *per_second
            .entry(at.saturating_duration_since(started).as_secs())
            .or_default() += 1;
    }
    let record = record
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned record"))?;
    let wakeups = {
        let wakeups = wakeups
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned wake-ups"))?;
        let answered = counting
            .answered
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned answers"))?;
        wakeup_latencies(&wakeups, &answered)
    };
    let mut lags = record.lags.clone();
    lags.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        lags.get(((lags.len() as f64 - 1.0) * q).round().max(0.0) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let max_of = |v: &[f64]| v.iter().copied().reduce(f64::max);
    let floor_requests = (!config.octavia_ordered).then(|| {
        let asked = asked_of(&record, &sim.member_truth(), load_balancers);
        crate::floor::requests(&floor_windows(config), &asked)
    });
    Ok(StrategyReport {
        strategy: strategy.as_str().to_owned(),
        requests: sent.len() as u64,
        transitions: record.transitions,
        requests_per_transition: sent.len() as f64 / (record.transitions.max(1) as f64),
        drift_polls,
        list_pages: counting
            .list_pages
            .load(std::sync::atomic::Ordering::Relaxed),
        rollout_requests_per_transition: (sent.len() as u64).saturating_sub(drift_polls) as f64
            / (record.transitions.max(1) as f64),
        peak_requests_per_second: per_second.values().copied().max().unwrap_or(0),
        over_budget: over_budget(&sent, f64::from(config.qps), f64::from(config.burst)),
        wakeup_p50_us: median(&wakeups.every),
        wakeup_max_us: wakeups.every.last().copied().unwrap_or(0.0),
        wakeup_news_p50_us: median(&wakeups.news),
        wakeup_news_max_us: wakeups.news.last().copied().unwrap_or(0.0),
        wakeup_quiet_p50_us: median(&wakeups.news_without_list),
        wakeup_quiet_max_us: wakeups.news_without_list.last().copied().unwrap_or(0.0),
        wakeup_quiet_samples: wakeups.news_without_list.len() as u64,
        detection_lag_p50: quantile(0.5),
        detection_lag_p99: quantile(0.99),
        detection_lag_max: lags.last().copied().unwrap_or(0.0),
        detection_lag_samples: lags.len() as u64,
        requests_by_fate: requests_by_fate(&worst_fates, &per_object),
        floor_requests,
        floor_per_transition: floor_requests
            .map(|floor| floor as f64 / (record.transitions.max(1) as f64)),
        false_ready: record.false_ready,
        stuck_members: record.stuck_late.len() as u64 + record.stuck_unflagged,
        stuck_flag_late_max: max_of(&record.stuck_late),
        stuck_unflagged: record.stuck_unflagged,
        error_members: record.error_flag.len() as u64 + record.error_unflagged,
        error_flag_max: max_of(&record.error_flag),
        error_unflagged: record.error_unflagged,
        rollouts_completed: record.rollouts_completed,
        missed_notifications: record.missed_notifications,
        virtual_seconds,
        cpu_seconds: 0.0,
        simulator_cpu_seconds: (sim.busy() - cpu_sim_start).as_secs_f64(),
    })
}

/// Where the scenario's finishes fall, and the lag the floor sees them within.
fn floor_windows(config: &BenchConfig) -> crate::floor::Windows {
    crate::floor::Windows {
        first: config.provision_min,
        last: config.provision_max,
        lag: config.floor_lag,
    }
}

/// What the run asked of a poller: each created member's finish, from the cloud's truth.
fn asked_of(
    record: &Record,
    truth: &[capo_sim::openstack::MemberTruth],
    load_balancers: u64,
) -> crate::floor::Asked {
    let settled: HashMap<&str, Option<Instant>> = truth
        .iter()
        .map(|m| (m.id.as_str(), m.settled_at))
        .collect();
    let finishes = record
        .created
        .iter()
        .map(|(id, requested)| {
            let settled = settled.get(id.as_str()).copied().flatten()?;
            Some(settled.saturating_duration_since(*requested).as_secs_f64())
        })
        .collect();
    crate::floor::Asked {
        finishes,
        removals: record.removals,
        load_balancers,
    }
}

/// The worst fate a rollout meets: it stops at the first stuck or ERROR member.
fn worst_fate(fates: &[&'static str]) -> &'static str {
    let reached = fates
        .iter()
        .position(|f| *f == "-stuck" || *f == "-error")
        .map_or(fates, |at| &fates[..=at]);
    ["-stuck", "-error", "-slow"]
        .into_iter()
        .find(|worst| reached.contains(worst))
        .unwrap_or("")
}

/// Requests about each rollout's LB and pool (lists aside), grouped by the worst fate it met.
fn requests_by_fate(
    worst_fates: &[([String; 2], &'static str)],
    per_object: &HashMap<String, u64>,
) -> Vec<FateCost> {
    let mut by_fate: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (objects, fate) in worst_fates {
        let requests: u64 = objects.iter().filter_map(|o| per_object.get(o)).sum();
        let (rollouts, total) = by_fate.entry(fate).or_default();
        *rollouts += 1;
        *total += requests;
    }
    by_fate
        .into_iter()
        .map(|(fate, (rollouts, total))| FateCost {
            fate: fate.trim_start_matches('-').to_owned(),
            rollouts,
            requests_per_rollout: total as f64 / rollouts.max(1) as f64,
        })
        .collect()
}

/// What the rollouts that met one fate cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FateCost {
    /// `""`: every member normal; else the worst met (stuck, error, slow).
    pub fate: String,
    pub rollouts: u64,
    pub requests_per_rollout: f64,
}

/// `schedule` aimed at a detection lag of `target` seconds: pending work polled, and lists read
/// while an LB is locked, that far apart (and no sooner after a change).
pub fn aim_at(schedule: ScheduleConfig, target: Option<f64>) -> ScheduleConfig {
    let Some(target) = target else {
        return schedule;
    };
    let pace = Duration::from_secs_f64(target);
    ScheduleConfig {
        urgent_initial: pace,
        look_after_change: pace,
        sweep_locked: pace,
        urgent_max: schedule.urgent_max.max(pace),
        ..schedule
    }
}

/// One point of the cost/lag trade-off.
#[derive(Clone, Debug, Serialize)]
pub struct ParetoPoint {
    pub strategy: String,
    /// `None` for member-get (it has no target).
    pub detection_target: Option<f64>,
    pub requests_per_transition: f64,
    pub rollout_requests_per_transition: f64,
    pub detection_lag_p99: f64,
    pub false_ready: u64,
    pub stuck_unflagged: u64,
    pub error_unflagged: u64,
    pub requests_by_fate: Vec<FateCost>,
    /// The floor at this target's lag (`StrategyReport::floor_per_transition`).
    pub floor_per_transition: Option<f64>,
}

impl ParetoPoint {
    fn of(report: &StrategyReport, target: Option<f64>) -> Self {
        ParetoPoint {
            strategy: report.strategy.clone(),
            detection_target: target,
            requests_per_transition: report.requests_per_transition,
            rollout_requests_per_transition: report.rollout_requests_per_transition,
            detection_lag_p99: report.detection_lag_p99,
            false_ready: report.false_ready,
            stuck_unflagged: report.stuck_unflagged,
            error_unflagged: report.error_unflagged,
            requests_by_fate: report.requests_by_fate.clone(),
            floor_per_transition: report.floor_per_transition,
        }
    }
}

/// Status-tree once per detection target, and member-get once, on the same scenario.
pub fn pareto(config: &BenchConfig, targets: &[f64]) -> anyhow::Result<Vec<ParetoPoint>> {
    let mut points = Vec::new();
    for target in targets {
        let aimed = BenchConfig {
            schedule: aim_at(config.schedule.clone(), Some(*target)),
            floor_lag: *target,
            ..config.clone()
        };
        let report = run_one(&aimed, Strategy::StatusTree)?;
        points.push(ParetoPoint::of(&report, Some(*target)));
    }
    let member_get = run_one(config, Strategy::MemberGet)?;
    points.push(ParetoPoint::of(&member_get, None));
    Ok(points)
}

pub fn print_pareto(config: &BenchConfig, points: &[ParetoPoint]) {
    println!(
        "requests per member transition against detection lag: {} clusters x {} members, {}; budget {} req/s",
        config.clusters,
        config.members,
        if config.octavia_ordered {
            "Octavia-ordered (the LB stays locked until its member settles)"
        } else {
            "the race (members outlast their LB's unlock)"
        },
        config.qps
    );
    println!(
        "{:<14}{:>10}{:>14}{:>16}{:>13}{:>13}{:>13}   req. per rollout: normal/slow/stuck/error",
        "strategy", "target s", "req/trans.", "without drift", "floor", "lag p99 s", "false-ready"
    );
    for p in points {
        let target = p
            .detection_target
            .map(|t| format!("{t}"))
            .unwrap_or_else(|| "-".into());
        let by_fate: Vec<String> = ["", "slow", "stuck", "error"]
            .into_iter()
            .map(|fate| {
                p.requests_by_fate
                    .iter()
                    .find(|c| c.fate == fate)
                    .map_or_else(|| "-".into(), |c| format!("{:.0}", c.requests_per_rollout))
            })
            .collect();
        let floor = p
            .floor_per_transition
            .map_or_else(|| "-".into(), |f| format!("{f:.2}"));
        println!(
            "{:<14}{:>10}{:>14.2}{:>16.2}{:>13}{:>13.2}{:>13}   {}",
            p.strategy,
            target,
            p.requests_per_transition,
            p.rollout_requests_per_transition,
            floor,
            p.detection_lag_p99,
            p.false_ready,
            by_fate.join("/")
        );
    }
}

/// The engine's `capo_lb_polls_total` by `kind`.
fn polls_by_kind(registry: &prometheus::Registry) -> std::collections::BTreeMap<String, u64> {
    let mut by_kind = std::collections::BTreeMap::new();
    for family in registry
        .gather()
        .iter()
        .filter(|family| family.name() == "capo_lb_polls_total")
    {
        for metric in family.get_metric() {
            let kind = metric
                .get_label()
                .iter()
                .find(|l| l.name() == "kind")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            *by_kind.entry(kind).or_default() += metric.get_counter().get_value() as u64;
        }
    }
    by_kind
}

/// Drift polls counted by the engine's `capo_lb_polls_total{kind="drift"}`.
fn drift_polls(registry: &prometheus::Registry) -> u64 {
    capo_provider::controllers::metrics::value(
        registry,
        "capo_lb_polls_total",
        &[("kind", "drift")],
    ) as u64
}

struct Rollout {
    cluster: u32,
    lb: String,
    pool: String,
    fates: Vec<&'static str>,
    members: u32,
    stuck_after: Duration,
    engine: Engine,
    engine_client: CloudClient,
    driver: CloudClient,
    sim: Arc<OpenStackSim>,
    record: Arc<Mutex<Record>>,
}

/// How a wait on the gate ended.
enum Gate {
    Ready(Instant),
    Stuck(Instant),
    Error(Instant),
}

impl Rollout {
    fn desired(&self, members: &[DesiredMember]) -> DesiredLb {
        DesiredLb {
            lb_id: self.lb.clone(),
            cluster: ObjectName::new("bench", format!("c{}", self.cluster)),
            pools: BTreeMap::from([(6443, self.pool.clone())]),
            members: members.to_vec(),
            rollout_waiting: true,
            leaving: Vec::new(),
        }
    }

    fn record(&self, f: impl FnOnce(&mut Record)) {
        if let Ok(mut record) = self.record.lock() {
            f(&mut record);
        }
    }

    /// Whether every desired member is ACTIVE in the cloud right now (ground truth).
    fn truly_ready(&self, members: &[DesiredMember]) -> bool {
        let truth = self.sim.member_truth();
        members.iter().all(|m| {
            truth.iter().any(|t| {
                t.pool_id == self.pool
                    && t.address == m.address
                    && t.provisioning_status == "ACTIVE"
            })
        })
    }

    async fn wait_gate(&self, gate: &mut watch::Receiver<GateState>, generation: u64) -> Gate {
        loop {
            let (reason, at, seen) = *gate.borrow_and_update();
            if seen >= generation {
                match reason {
                    Reason::Ready => return Gate::Ready(at),
                    Reason::MemberStuck => return Gate::Stuck(at),
                    Reason::MemberError => return Gate::Error(at),
                    _ => {}
                }
            }
            match tokio::time::timeout(Duration::from_secs(3600), gate.changed()).await {
                Ok(Ok(())) => {}
                // No notification for an hour: a lost wake-up. Count it and read the snapshot.
                _ => {
                    self.record(|r| r.missed_notifications += 1);
                    let now = Instant::now();
                    match self.engine.snapshot(&self.lb).map(|s| s.verdict.reason) {
                        Some(Reason::Ready) => return Gate::Ready(now),
                        Some(Reason::MemberError) => return Gate::Error(now),
                        _ => return Gate::Stuck(now),
                    }
                }
            }
        }
    }

    async fn run(self, mut gate: watch::Receiver<GateState>) -> anyhow::Result<()> {
        let truth = self.sim.member_truth();
        let mut current: Vec<DesiredMember> = truth
            .iter()
            .filter(|m| m.pool_id == self.pool)
            .map(|m| DesiredMember {
                owner: ObjectName::new("bench", m.name.clone()),
                name: m.name.clone(),
                address: m.address.clone(),
                port: 6443,
                requested_at: Instant::now(),
                member_id: Some(m.id.clone()),
                served: false,
            })
            .collect();
        current.sort_by(|a, b| a.name.cmp(&b.name));
        for k in 0..self.members {
            let fate = self.fates[k as usize];
            let name = format!("c{}-cp-new-{k}{fate}", self.cluster);
            let address = address(self.cluster, k, 1);
            let requested = Instant::now();
            let id = capo_sim::support::create_member(
                &self.driver,
                &self.lb,
                &self.pool,
                &name,
                &address,
            )
            .await?;
            self.record(|r| r.created.push((id.clone(), requested)));
            current.push(DesiredMember {
                owner: ObjectName::new("bench", name.clone()),
                name: name.clone(),
                address: address.clone(),
                port: 6443,
                requested_at: requested,
                member_id: Some(id.clone()),
                served: false,
            });
            let generation = self
                .engine
                .ensure(self.desired(&current), &self.engine_client);
            match self.wait_gate(&mut gate, generation).await {
                Gate::Ready(at) => {
                    if !self.truly_ready(&current) {
                        self.record(|r| r.false_ready += 1);
                    }
                    let settled = self
                        .sim
                        .member_truth()
                        .into_iter()
                        .find(|m| m.id == id)
                        .and_then(|m| m.settled_at);
                    if let Some(settled) = settled {
                        self.record(|r| {
                            r.lags
                                .push(at.saturating_duration_since(settled).as_secs_f64())
                        });
                    }
                    self.record(|r| r.transitions += 1);
                }
                Gate::Stuck(at) => {
                    let late = at
                        .saturating_duration_since(requested + self.stuck_after)
                        .as_secs_f64();
                    self.record(|r| {
                        if fate == "-stuck" {
                            r.stuck_late.push(late)
                        }
                    });
                    return Ok(());
                }
                Gate::Error(at) => {
                    let errored = self
                        .sim
                        .member_truth()
                        .into_iter()
                        .find(|m| m.id == id)
                        .and_then(|m| m.settled_at);
                    self.record(|r| match errored {
                        Some(errored) => r
                            .error_flag
                            .push(at.saturating_duration_since(errored).as_secs_f64()),
                        None => r.error_unflagged += 1,
                    });
                    return Ok(());
                }
            }
            if fate == "-stuck" {
                // The gate opened over a stuck member: never flagged.
                self.record(|r| r.stuck_unflagged += 1);
            }
            if fate == "-error" {
                self.record(|r| r.error_unflagged += 1);
            }
            // Cluster API removes an old machine once the new one is ready.
            let old = current.remove(0);
            if let Some(id) = &old.member_id {
                delete_member(&self.driver, &self.lb, &self.pool, id).await?;
            }
            let generation = self
                .engine
                .ensure(self.desired(&current), &self.engine_client);
            self.record(|r| r.removals += 1);
            if let Gate::Ready(_) = self.wait_gate(&mut gate, generation).await {
                self.record(|r| r.transitions += 1);
            }
        }
        self.record(|r| r.rollouts_completed += 1);
        Ok(())
    }
}

fn desired_member(name: &str, address: &str, id: &str, requested_at: Instant) -> DesiredMember {
    DesiredMember {
        owner: ObjectName::new("bench", name),
        name: name.into(),
        address: address.into(),
        port: 6443,
        requested_at,
        member_id: Some(id.into()),
        served: false,
    }
}

/// Requests per rollout that met `fate`, and how many rollouts did.
fn fate_cost(report: &StrategyReport, fate: &str) -> String {
    report
        .requests_by_fate
        .iter()
        .find(|c| c.fate == fate)
        .map(|c| format!("{:.1} ({})", c.requests_per_rollout, c.rollouts))
        .unwrap_or_else(|| "-".into())
}

/// How one row reads its value from a report.
type Column = Box<dyn Fn(&StrategyReport) -> String>;

/// The table, one row per measure, one column per strategy.
pub fn print_table(config: &BenchConfig, reports: &[StrategyReport]) {
    println!(
        "membership benchmark: {} clusters x {} control-plane members, rollouts over {} s, provisioning {}-{} s, {:.0}% slow ({} s), {:.0}% stuck, {:.0}% ERROR; budget {} req/s, burst {}; stuck after {} s",
        config.clusters,
        config.members,
        config.window.as_secs(),
        config.provision_min,
        config.provision_max,
        config.slow_share * 100.0,
        config.slow_seconds,
        config.stuck_share * 100.0,
        config.error_share * 100.0,
        config.qps,
        config.burst,
        config.stuck_after.as_secs()
    );
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let floor_row = format!("floor, every finish in {} s", config.floor_lag);
    let rows: Vec<(&str, Column)> = vec![
        (
            "OpenStack requests (engine)",
            Box::new(|r| r.requests.to_string()),
        ),
        (
            "  of which drift checks",
            Box::new(|r| r.drift_polls.to_string()),
        ),
        (
            "  of which LB list pages",
            Box::new(|r| r.list_pages.to_string()),
        ),
        (
            "requests per member transition",
            Box::new(|r| format!("{:.2}", r.requests_per_transition)),
        ),
        (
            "  without drift checks",
            Box::new(|r| format!("{:.2}", r.rollout_requests_per_transition)),
        ),
        (
            &floor_row,
            Box::new(|r| {
                r.floor_requests
                    .map_or_else(|| "-".into(), |f| f.to_string())
            }),
        ),
        (
            "  per member transition",
            Box::new(|r| {
                r.floor_per_transition
                    .map_or_else(|| "-".into(), |f| format!("{f:.2}"))
            }),
        ),
        (
            "  requests / floor",
            Box::new(|r| match r.floor_requests {
                Some(floor) if floor > 0 => format!("{:.2}", r.requests as f64 / floor as f64),
                _ => "-".into(),
            }),
        ),
        (
            "peak requests/s",
            Box::new(|r| r.peak_requests_per_second.to_string()),
        ),
        (
            "  requests over the budget",
            Box::new(|r| r.over_budget.to_string()),
        ),
        (
            "wake-up latency p50 (us)",
            Box::new(|r| format!("{:.0}", r.wakeup_p50_us)),
        ),
        (
            "wake-up latency max (us)",
            Box::new(|r| format!("{:.0}", r.wakeup_max_us)),
        ),
        (
            "  verdict changes less simulator, p50",
            Box::new(|r| format!("{:.0}", r.wakeup_news_p50_us)),
        ),
        (
            "  verdict changes less simulator, max",
            Box::new(|r| format!("{:.0}", r.wakeup_news_max_us)),
        ),
        (
            "  of which no list parsed meanwhile, p50",
            Box::new(|r| format!("{:.0}", r.wakeup_quiet_p50_us)),
        ),
        (
            "  of which no list parsed meanwhile, max",
            Box::new(|r| format!("{:.0}", r.wakeup_quiet_max_us)),
        ),
        (
            "    measured on",
            Box::new(|r| r.wakeup_quiet_samples.to_string()),
        ),
        (
            "detection lag p50 (s)",
            Box::new(|r| format!("{:.2}", r.detection_lag_p50)),
        ),
        (
            "detection lag p99 (s)",
            Box::new(|r| format!("{:.2}", r.detection_lag_p99)),
        ),
        (
            "detection lag max (s)",
            Box::new(|r| format!("{:.2}", r.detection_lag_max)),
        ),
        (
            "  measured on (creations)",
            Box::new(|r| r.detection_lag_samples.to_string()),
        ),
        (
            "requests per rollout, all normal",
            Box::new(|r| fate_cost(r, "")),
        ),
        ("  with a slow member", Box::new(|r| fate_cost(r, "slow"))),
        ("  ending stuck", Box::new(|r| fate_cost(r, "stuck"))),
        ("  ending in ERROR", Box::new(|r| fate_cost(r, "error"))),
        ("FALSE-READY", Box::new(|r| r.false_ready.to_string())),
        ("stuck members", Box::new(|r| r.stuck_members.to_string())),
        (
            "  flagged late by, max (s)",
            Box::new(move |r| opt(r.stuck_flag_late_max)),
        ),
        (
            "  never flagged",
            Box::new(|r| r.stuck_unflagged.to_string()),
        ),
        ("ERROR members", Box::new(|r| r.error_members.to_string())),
        (
            "  flagged after, max (s)",
            Box::new(move |r| opt(r.error_flag_max)),
        ),
        (
            "  never flagged",
            Box::new(|r| r.error_unflagged.to_string()),
        ),
        (
            "rollouts completed",
            Box::new(|r| r.rollouts_completed.to_string()),
        ),
        (
            "missed notifications",
            Box::new(|r| r.missed_notifications.to_string()),
        ),
        (
            "virtual time (s)",
            Box::new(|r| format!("{:.0}", r.virtual_seconds)),
        ),
        (
            "CPU, whole run (s)",
            Box::new(|r| format!("{:.2}", r.cpu_seconds)),
        ),
        (
            "  of which simulator (s)",
            Box::new(|r| format!("{:.2}", r.simulator_cpu_seconds)),
        ),
    ];
    print!("{:<34}", "");
    for report in reports {
        print!("{:>14}", report.strategy);
    }
    println!();
    for (name, value) in rows {
        print!("{name:<34}");
        for report in reports {
            print!("{:>14}", value(report));
        }
        println!();
    }
}

/// Steady state with every member settled: memory and CPU of tracking `lbs` load balancers.
#[derive(Debug, Serialize)]
pub struct SteadyReport {
    pub load_balancers: u32,
    pub members: u32,
    /// Whether the engine watched through the LB list.
    pub list: bool,
    pub resident_growth_mib: Option<f64>,
    pub virtual_seconds: f64,
    /// Requests in the measured stretch, and per hour.
    pub polls: u64,
    pub polls_per_hour: f64,
    /// Of which LB list pages.
    pub list_pages: u64,
    /// Members deleted behind the engine's back during the stretch, and how long until the
    /// engine's verdict showed each (seconds; `None`: never within the stretch).
    pub drifts: u32,
    pub drift_detection_p50: Option<f64>,
    pub drift_detection_max: Option<f64>,
    pub drifts_unseen: u32,
    /// The engine's polls over the whole run (first pass included) by kind.
    pub polls_by_kind: std::collections::BTreeMap<String, u64>,
    /// Engine and client CPU per second of (virtual) steady state, as a share of one core.
    pub core_share: f64,
    /// At the end, LBs whose members a list had vouched for (what a cluster keeps in status).
    pub restart_recalled: u32,
    /// A new engine given those (a controller restart) ...
    pub restart: RestartFigures,
    /// ... and one given nothing.
    pub restart_without_recall: RestartFigures,
}

/// How long a restarted engine took to know every verdict again, and what it asked for.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartFigures {
    /// Virtual seconds until every LB had a verdict; `None`: not within 10 minutes.
    pub every_verdict_after: Option<f64>,
    pub requests: u64,
    pub list_pages: u64,
}

/// A new engine tracking `fleet` (each LB with its recalled state, if any): how long until
/// every LB's verdict is known, and the requests it took.
async fn restart(
    config: EngineConfig,
    fleet: &[DesiredLb],
    recalled: Vec<Option<Recalled>>,
    client: &CloudClient,
    counting: &CountingSession,
) -> anyhow::Result<RestartFigures> {
    let registry = prometheus::Registry::new();
    let cancel = CancellationToken::new();
    let engine = Engine::new(config, &registry, cancel.clone())?;
    let mut changes = engine.subscribe();
    let requests_before = counting.sent.lock().map(|s| s.len()).unwrap_or(0);
    let pages_before = counting
        .list_pages
        .load(std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    for (desired, recalled) in fleet.iter().zip(recalled) {
        engine.ensure_recalled(desired.clone(), client, recalled);
    }
    let mut known = std::collections::HashSet::new();
    let deadline = started + Duration::from_secs(600);
    while known.len() < fleet.len() {
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Ok(Some(Notice::Changed(change))) if change.reason != Reason::NotObserved => {
                known.insert(change.lb_id);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let every_verdict_after = (known.len() == fleet.len()).then(|| started.elapsed().as_secs_f64());
    cancel.cancel();
    engine.shutdown().await;
    Ok(RestartFigures {
        every_verdict_after,
        requests: (counting.sent.lock().map(|s| s.len()).unwrap_or(0) - requests_before) as u64,
        list_pages: counting
            .list_pages
            .load(std::sync::atomic::Ordering::Relaxed)
            - pages_before,
    })
}

pub fn steady(
    load_balancers: u32,
    members: u32,
    seconds: u64,
    qps: u32,
    list: bool,
    drifts: u32,
) -> anyhow::Result<SteadyReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    runtime.block_on(async move {
        let config = BenchConfig {
            clusters: load_balancers,
            members,
            ..BenchConfig::default()
        };
        let sim = Arc::new(
            OpenStackSim::start(OpenStackSimConfig {
                scenario: Scenario {
                    seed: Some(1),
                    ..Scenario::default()
                },
                ..OpenStackSimConfig::default()
            })
            .await?,
        );
        let registry = prometheus::Registry::new();
        let clouds = Clouds::new(unlimited_options(), &registry, CancellationToken::new())?;
        let client = clouds.client(sim.session());
        let fleet = build_fleet(&client, &config).await?;
        let truth = sim.member_truth();
        let rss_before = resident_bytes();
        let mut options = unlimited_options();
        let rate = std::num::NonZeroU32::new(qps).unwrap_or(std::num::NonZeroU32::MIN);
        options.rate_limit = RateLimit {
            qps: rate,
            burst: rate,
        };
        let engine_registry = prometheus::Registry::new();
        let engine_clouds = Clouds::new(options, &engine_registry, CancellationToken::new())?;
        let counting = Arc::new(CountingSession::new(sim.clone()));
        let engine_client = engine_clouds.client(counting.clone());
        let cancel = CancellationToken::new();
        let engine_config = EngineConfig {
            schedule: ScheduleConfig {
                budget_qps: f64::from(qps),
                burst: f64::from(qps),
                list_sweep: list,
                ..ScheduleConfig::default()
            },
            ..EngineConfig::default()
        };
        let engine = Engine::new(engine_config.clone(), &engine_registry, cancel.clone())?;
        let mut fleet_desired = Vec::new();
        for (i, (lb, pool)) in fleet.lbs.iter().enumerate() {
            let desired = DesiredLb {
                lb_id: lb.clone(),
                cluster: ObjectName::new("bench", format!("c{i}")),
                pools: BTreeMap::from([(6443, pool.clone())]),
                members: truth
                    .iter()
                    .filter(|m| &m.pool_id == pool)
                    .map(|m| DesiredMember {
                        owner: ObjectName::new("bench", m.name.clone()),
                        name: m.name.clone(),
                        address: m.address.clone(),
                        port: 6443,
                        requested_at: Instant::now(),
                        member_id: Some(m.id.clone()),
                        served: false,
                    })
                    .collect(),
                rollout_waiting: false,
                leaving: Vec::new(),
            };
            engine.ensure(desired.clone(), &engine_client);
            fleet_desired.push(desired);
        }
        // First pass: every LB observed once; then measure a steady stretch.
        tokio::time::sleep(Duration::from_secs(
            u64::from(load_balancers) / u64::from(qps.max(1)) + 30,
        ))
        .await;
        let resident_growth_mib = rss_before
            .zip(resident_bytes())
            .map(|(b, a)| a.saturating_sub(b) as f64 / 1048576.0);
        let polls_before = counting.sent.lock().map(|s| s.len()).unwrap_or(0);
        let pages_before = counting
            .list_pages
            .load(std::sync::atomic::Ordering::Relaxed);
        let cpu_before = thread_cpu();
        let sim_before = sim.busy();
        let changes = engine.subscribe();
        let drift = tokio::spawn(delete_behind_its_back(
            client.clone(),
            changes,
            fleet.lbs.clone(),
            truth,
            drifts,
            Duration::from_secs(seconds),
        ));
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu = thread_cpu()
            .saturating_sub(cpu_before)
            .saturating_sub(sim.busy() - sim_before);
        let polls = counting.sent.lock().map(|s| s.len()).unwrap_or(0) - polls_before;
        let list_pages = counting
            .list_pages
            .load(std::sync::atomic::Ordering::Relaxed)
            - pages_before;
        let recalled: Vec<Option<Recalled>> = fleet_desired
            .iter()
            .map(|d| engine.snapshot(&d.lb_id).and_then(|s| s.recalled()))
            .collect();
        cancel.cancel();
        engine.shutdown().await;
        let mut seen = drift.await.unwrap_or_default();
        let restart = |recalled: Vec<Option<Recalled>>| {
            restart(
                engine_config.clone(),
                &fleet_desired,
                recalled,
                &engine_client,
                &counting,
            )
        };
        let with_recall = restart(recalled.clone()).await?;
        let without_recall = restart(vec![None; fleet_desired.len()]).await?;
        seen.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let drifts_seen = seen.len() as u32;
        Ok(SteadyReport {
            load_balancers,
            members: load_balancers * members,
            list,
            resident_growth_mib,
            virtual_seconds: seconds as f64,
            polls: polls as u64,
            polls_per_hour: polls as f64 * 3600.0 / seconds as f64,
            list_pages,
            drifts,
            drift_detection_p50: seen.get(seen.len() / 2).copied(),
            drift_detection_max: seen.last().copied(),
            drifts_unseen: drifts.saturating_sub(drifts_seen),
            polls_by_kind: polls_by_kind(&engine_registry),
            core_share: cpu.as_secs_f64() / seconds as f64,
            restart_recalled: recalled.iter().flatten().count() as u32,
            restart: with_recall,
            restart_without_recall: without_recall,
        })
    })
}

/// Deletes one member of each of `drifts` load balancers at random moments of the first
/// half of `within` (nothing tells the engine), and returns how long the engine took to
/// publish a verdict naming each change (seconds), for those it saw within `within`.
async fn delete_behind_its_back(
    client: CloudClient,
    mut changes: capo_provider::membership::Changes,
    lbs: Vec<(String, String)>,
    truth: Vec<capo_sim::openstack::MemberTruth>,
    drifts: u32,
    within: Duration,
) -> Vec<f64> {
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut plan: Vec<(Duration, usize)> = (0..drifts as usize)
        .map(|k| {
            let at = within.mul_f64(rng.f64() * 0.5);
            (
                at,
                (k * lbs.len() / drifts.max(1) as usize) % lbs.len().max(1),
            )
        })
        .collect();
    plan.sort();
    let deleted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let deleter = {
        let deleted = deleted.clone();
        tokio::spawn(async move {
            for (at, index) in plan {
                tokio::time::sleep_until(started + at).await;
                let Some((lb, pool)) = lbs.get(index) else {
                    continue;
                };
                let Some(member) = truth.iter().find(|m| &m.pool_id == pool) else {
                    continue;
                };
                if client
                    .octavia()
                    .delete_member(pool, &member.id)
                    .await
                    .is_ok()
                    && let Ok(mut deleted) = deleted.lock()
                {
                    deleted.insert(lb.clone(), Instant::now());
                }
            }
        })
    };
    let mut seen = Vec::new();
    let deadline = started + within;
    while let Ok(Some(notice)) = tokio::time::timeout_at(deadline, changes.recv()).await {
        let capo_provider::membership::Notice::Changed(change) = notice else {
            continue;
        };
        if change.reason == Reason::Ready {
            continue;
        }
        let at = deleted
            .lock()
            .ok()
            .and_then(|mut d| d.remove(&change.lb_id));
        if let Some(at) = at {
            seen.push(Instant::now().saturating_duration_since(at).as_secs_f64());
        }
    }
    deleter.abort();
    seen
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
