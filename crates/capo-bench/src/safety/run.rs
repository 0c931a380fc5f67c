//! One randomized rollout on virtual time: both simulators, the production manager, the
//! Cluster API actor, the trouble the draw asks for, and a checker that looks at every write
//! to the API server and every transition of the cloud as it happens.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use capo_api::capi::{self, Cluster, Machine};
use capo_api::conditions::{reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackMachineSpec};
use capo_provider::cloud::neutron::{NetworkSpec, SubnetSpec};
use capo_provider::cloud::{CloudOptions, Clouds};
use capo_provider::controllers::gate;
use capo_provider::manager::{self, ManagerConfig, ManagerError, SharedObserver};
use capo_provider::membership::ServingRules;
use capo_sim::capi::{CapiActor, CapiActorConfig, ControlPlane, RolloutStep};
use capo_sim::kube::store::Change;
use capo_sim::kube::{KubeSim, KubeSimConfig};
use capo_sim::openstack::{
    ApiServer, Delay, Effect, MemberTruth, ObjectKind, OpenStackSim, OpenStackSimConfig, Outage,
    RateLimitFault, Rule, Scenario, ServerErrorFault,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use prometheus::Registry;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::check::{self, Invariant, Violation};
use super::draw::{ApiTroubleKind, Draw, RestartKind};
use crate::Strategy;

const NAMESPACE: &str = "default";
const CLUSTER: &str = "c1";
/// A member PENDING this long is stuck (production's default is 600 s; the draw's slowest
/// member takes 120 s).
const STUCK_AFTER: Duration = Duration::from_secs(300);
/// The longest one step of the story may take (one machine joining, one going).
const STEP_TIMEOUT: Duration = Duration::from_secs(1200);

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Completed,
    /// Held: a member stuck in PENDING, named in the machine's condition.
    HeldMemberStuck,
    /// Held: a member in ERROR beyond its repairs, named in the machine's condition.
    HeldMemberError,
    /// Held: the load balancer itself in ERROR, named in the cluster's condition.
    HeldLoadBalancerError,
    /// Neither completed nor held with a condition naming why (invariant 4).
    /// Held: a member ACTIVE whose API does not serve, named in the machine's condition.
    HeldMemberNotServing,
    Hung,
}

impl Outcome {
    pub fn words(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::HeldMemberStuck => "held: MemberStuck",
            Outcome::HeldMemberError => "held: MemberError",
            Outcome::HeldLoadBalancerError => "held: LoadBalancerError",
            Outcome::HeldMemberNotServing => "held: MemberNotServing",
            Outcome::Hung => "hung",
        }
    }
}

/// What one run did.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub draw: Draw,
    pub outcome: Outcome,
    pub violations: Vec<Violation>,
    pub virtual_seconds: f64,
    pub cloud_requests: u64,
    pub kube_requests: u64,
    /// The most reconcile errors one object cost in one minute.
    pub worst_errors_per_object_minute: f64,
    /// For each control-plane machine released: seconds from its API member's first ACTIVE
    /// to its release.
    pub release_waits: Vec<f64>,
    /// For each member drained: seconds from its weight going to 0 to its being gone.
    pub drains: Vec<f64>,
    /// The longest stretch a member passing its monitor stayed at weight 0 while no member
    /// of the API pool served (seconds; how fast capo-rs puts a drained member back).
    pub longest_held_out: f64,
}

/// Plays the draw on the current (paused) runtime, the engine observing members as
/// `strategy` does (`status-tree` in production; `lb-only` shows what the checker catches).
pub async fn play(draw: &Draw, strategy: Strategy) -> RunReport {
    let started = Instant::now();
    let mut violations = Vec::new();
    let (outcome, world) = match World::start(draw, strategy).await {
        Ok(mut world) => {
            let outcome = world.story(draw, &mut violations).await;
            (outcome, Some(world))
        }
        Err(error) => {
            violations.push(Violation {
                invariant: Invariant::SilentHold,
                at: 0.0,
                detail: format!("the simulated world did not start: {error:#}"),
            });
            (Outcome::Hung, None)
        }
    };
    let mut report = RunReport {
        draw: draw.clone(),
        outcome,
        violations,
        virtual_seconds: 0.0,
        cloud_requests: 0,
        kube_requests: 0,
        worst_errors_per_object_minute: 0.0,
        release_waits: Vec::new(),
        drains: Vec::new(),
        longest_held_out: 0.0,
    };
    if let Some(world) = world {
        world.finish(&mut report).await;
    }
    report.virtual_seconds = started.elapsed().as_secs_f64();
    report
}

/// The manager, restartable, with its reconcile errors counted across restarts.
struct Manager {
    client: kube::Client,
    strategy: Strategy,
    running: Option<(CancellationToken, JoinHandle<Result<(), ManagerError>>)>,
    errors: Arc<Mutex<ErrorTotals>>,
}

#[derive(Default)]
struct ErrorTotals {
    /// Totals of the registries of managers that have stopped.
    carried: BTreeMap<String, f64>,
    current: Registry,
}

impl ErrorTotals {
    fn totals(&self) -> BTreeMap<String, f64> {
        let mut totals = self.carried.clone();
        for (controller, count) in reconcile_errors(&self.current) {
            *totals.entry(controller).or_default() += count;
        }
        totals
    }
}

fn reconcile_errors(registry: &Registry) -> BTreeMap<String, f64> {
    let mut totals = BTreeMap::new();
    for family in registry.gather() {
        if family.name() != "controller_runtime_reconcile_errors_total" {
            continue;
        }
        for metric in family.get_metric() {
            let controller = metric
                .get_label()
                .iter()
                .find(|label| label.name() == "controller")
                .map(|label| label.value().to_owned())
                .unwrap_or_default();
            *totals.entry(controller).or_default() += metric.get_counter().get_value();
        }
    }
    totals
}

/// The serving gate's times in the runs: `capo-rs run`'s defaults.
const SERVING: ServingRules = ServingRules {
    settle: Duration::from_secs(15),
    recovery: Duration::from_secs(300),
    not_serving_after: Duration::from_secs(300),
};

fn manager_config(strategy: Strategy) -> ManagerConfig {
    let mut config = ManagerConfig {
        crd_retry: Duration::from_secs(1),
        ..ManagerConfig::default()
    };
    config.engine.stuck_after = STUCK_AFTER;
    // Every run checks the API over HTTPS, so that a node whose API never serves reads
    // ERROR; the strategy decides whether that holds its machine. Old members drain for 30 s.
    config.controllers.api_monitor = gate::MonitorKind::Https;
    config.controllers.drain_period = Duration::from_secs(30);
    if strategy.serving_gate() {
        config.engine.serving = Some(SERVING);
    }
    config.engine.schedule = strategy.schedule(config.engine.schedule.clone());
    if !matches!(strategy, Strategy::StatusTree | Strategy::Provisioning) {
        config.observer = Some(SharedObserver(strategy.observer()));
    }
    config
}

impl Manager {
    fn start(&mut self) {
        let registry = Registry::new();
        {
            let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
            let stopped = errors.totals();
            errors.carried = stopped;
            errors.current = registry.clone();
        }
        let shutdown = CancellationToken::new();
        let (client, stop, strategy) = (self.client.clone(), shutdown.clone(), self.strategy);
        let task = tokio::spawn(async move {
            manager::run(client, manager_config(strategy), &registry, stop).await
        });
        self.running = Some((shutdown, task));
    }

    /// Stops the manager; an error is a failure of the manager's own shutdown.
    async fn stop(&mut self, kind: RestartKind) -> Result<(), String> {
        let Some((shutdown, task)) = self.running.take() else {
            return Ok(());
        };
        match kind {
            RestartKind::Crash => {
                task.abort();
                match task.await {
                    Err(error) if error.is_panic() => Err(format!("the manager panicked: {error}")),
                    _ => Ok(()),
                }
            }
            RestartKind::Graceful => {
                shutdown.cancel();
                match tokio::time::timeout(Duration::from_secs(120), task).await {
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(error))) => Err(format!("the manager failed: {error}")),
                    Ok(Err(error)) => Err(format!("the manager's task failed: {error}")),
                    Err(_) => Err("the manager did not stop within 120 s of SIGTERM".to_owned()),
                }
            }
        }
    }
}

struct World {
    kube: KubeSim,
    cloud: Arc<OpenStackSim>,
    client: kube::Client,
    manager: Arc<tokio::sync::Mutex<Manager>>,
    actor: Option<CapiActor>,
    baseline: BTreeMap<String, usize>,
    started: Instant,
    deleting: Arc<AtomicBool>,
    checker: Option<(CancellationToken, JoinHandle<Checker>)>,
    /// Tasks the story spawned (chaos, releases), stopped at the end.
    chores: Vec<JoinHandle<()>>,
}

impl World {
    async fn start(draw: &Draw, strategy: Strategy) -> anyhow::Result<World> {
        let started = Instant::now();
        let kube = KubeSim::start(KubeSimConfig::default()).await?;
        let crds: Vec<Value> = capo_api::crds::all()
            .iter()
            .chain(capo_api::capi::crds().iter())
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        kube.install(&crds)?;
        let cloud = Arc::new(
            OpenStackSim::start(OpenStackSimConfig {
                scenario: Scenario {
                    seed: Some(draw.seed),
                    ..Scenario::default()
                },
                ..OpenStackSimConfig::default()
            })
            .await?,
        );
        tenant_network(&cloud).await?;
        let client = kube.client()?;
        put_cloud_secret(&client, &cloud.clouds_yaml()).await?;
        let baseline = cloud.object_counts();
        let errors = Arc::new(Mutex::new(ErrorTotals::default()));
        let deleting = Arc::new(AtomicBool::new(false));
        let checker = Checker::new(cloud.clone(), errors.clone(), started, deleting.clone());
        let stop_checker = CancellationToken::new();
        let checking = tokio::spawn(checker.run(kube.changes(), stop_checker.clone()));
        let mut manager = Manager {
            client: client.clone(),
            strategy,
            running: None,
            errors,
        };
        manager.start();
        Ok(World {
            kube,
            cloud,
            client,
            manager: Arc::new(tokio::sync::Mutex::new(manager)),
            actor: None,
            baseline,
            started,
            deleting,
            checker: Some((stop_checker, checking)),
            chores: Vec::new(),
        })
    }

    fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Up, rolled, deleted; returns how the rollout ended.
    async fn story(&mut self, draw: &Draw, violations: &mut Vec<Violation>) -> Outcome {
        let plane = control_plane(draw.control_plane);
        let actor = match self.bring_up(&plane).await {
            Ok(actor) => actor,
            Err(error) => {
                violations.push(self.violation(
                    Invariant::SilentHold,
                    format!("the cluster never came up: {error:#}"),
                ));
                return Outcome::Hung;
            }
        };
        let outcome = self.roll(draw, &plane, &actor, violations).await;
        self.actor = Some(actor);
        self.delete(violations).await;
        outcome
    }

    async fn bring_up(&self, plane: &ControlPlane) -> anyhow::Result<CapiActor> {
        create_cluster(&self.client).await?;
        let clusters: Api<OpenStackCluster> = Api::namespaced(self.client.clone(), NAMESPACE);
        until("the OpenStackCluster to be provisioned", async || {
            let cluster = clusters.get_opt(CLUSTER).await?;
            Ok(cluster.filter(is_provisioned).map(|_| ()))
        })
        .await?;
        let actor = CapiActor::start(
            self.client.clone(),
            CapiActorConfig {
                namespace: NAMESPACE.into(),
                // Cluster API's own controllers react in seconds; a coarser tick costs the
                // run nothing it checks and saves most of the actor's requests.
                tick: Duration::from_secs(5),
                join_delay: Duration::from_secs(2),
                wait_timeout: STEP_TIMEOUT,
            },
            CancellationToken::new(),
        );
        actor
            .scale_control_plane(plane)
            .await
            .context("scaling the control plane up")?;
        Ok(actor)
    }

    /// The rollout, with the draw's trouble.
    async fn roll(
        &mut self,
        draw: &Draw,
        plane: &ControlPlane,
        actor: &CapiActor,
        violations: &mut Vec<Violation>,
    ) -> Outcome {
        let rollout_start = Instant::now();
        let since_sim_start = self.seconds();
        let (low, high) = draw.member_delay;
        self.cloud.update_scenario(|scenario| {
            scenario.timings.member_create = Delay::Uniform(low, high);
            scenario.timings.lb_waits_for_members = draw.lb_waits_for_members;
            if let Some(outage) = draw.keystone_outage {
                scenario.keystone_outages.push(Outage {
                    from: since_sim_start + outage.from,
                    until: since_sim_start + outage.until,
                });
            }
        });
        let stop_chaos = CancellationToken::new();
        let chaos = tokio::spawn(chaos(
            draw.clone(),
            self.cloud.clone(),
            self.manager.clone(),
            rollout_start,
            stop_chaos.clone(),
        ));
        let mut created = 0;
        let mut releases = Vec::new();
        let cloud = self.cloud.clone();
        let rollout = actor
            .replace_oldest(plane, draw.replacements, |step| {
                if let RolloutStep::Created { name } = step {
                    releases.extend(trouble_for(draw, created, &name, &cloud));
                    created += 1;
                }
            })
            .await;
        stop_chaos.cancel();
        if let Ok(Err(error)) = chaos.await {
            violations.push(self.violation(Invariant::PanicOrStorm, error));
        }
        self.chores.extend(releases);
        self.cloud.update_scenario(|scenario| {
            scenario.rate_limits.clear();
            scenario.server_errors.clear();
            scenario.keystone_outages.clear();
        });
        match rollout {
            Ok(_) => Outcome::Completed,
            Err(error) => {
                let (outcome, why) = self.why_held().await;
                if outcome == Outcome::Hung {
                    violations.push(self.violation(
                        Invariant::SilentHold,
                        format!("the rollout stopped ({error}) and nothing says why: {why}"),
                    ));
                }
                outcome
            }
        }
    }

    /// A held rollout must say why: a joining machine's condition naming its member, or
    /// the cluster's naming its load balancer in ERROR or the members that do not serve.
    async fn why_held(&self) -> (Outcome, String) {
        let machines: Api<OpenStackMachine> = Api::namespaced(self.client.clone(), NAMESPACE);
        let clusters: Api<OpenStackCluster> = Api::namespaced(self.client.clone(), NAMESPACE);
        let mut seen = Vec::new();
        if let Ok(list) = machines.list(&ListParams::default()).await {
            for machine in &list.items {
                let joining = capi::is_control_plane(kube::ResourceExt::labels(machine))
                    && !gate::is_leaving(machine)
                    && machine.spec.provider_id.is_none();
                if !joining {
                    continue;
                }
                let condition = machine.status.as_ref().and_then(|s| {
                    capo_api::conditions::find(
                        &s.conditions,
                        types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
                    )
                });
                let Some(condition) = condition else {
                    seen.push(format!(
                        "{}: no member condition",
                        kube::ResourceExt::name_any(machine)
                    ));
                    continue;
                };
                let names_member = condition.message.contains("(member ");
                match condition.reason.as_str() {
                    reasons::MEMBER_STUCK if names_member => {
                        return (Outcome::HeldMemberStuck, condition.message.clone());
                    }
                    reasons::MEMBER_ERROR if names_member => {
                        return (Outcome::HeldMemberError, condition.message.clone());
                    }
                    reasons::MEMBER_NOT_SERVING if names_member => {
                        return (Outcome::HeldMemberNotServing, condition.message.clone());
                    }
                    _ => seen.push(format!(
                        "{}: {} {}",
                        kube::ResourceExt::name_any(machine),
                        condition.reason,
                        condition.message
                    )),
                }
            }
        }
        if let Ok(Some(cluster)) = clusters.get_opt(CLUSTER).await {
            let condition = cluster.status.as_ref().and_then(|s| {
                capo_api::conditions::find(&s.conditions, types::API_SERVER_LOAD_BALANCER_READY)
            });
            if let Some(condition) = condition {
                if condition.reason == reasons::LOAD_BALANCER_ERROR {
                    return (Outcome::HeldLoadBalancerError, condition.message.clone());
                }
                // A released machine whose API stopped serving: the old machine's removal
                // waits for it (the last serving member stays), and the cluster names it.
                if condition.reason == reasons::MEMBER_NOT_SERVING
                    && condition.message.contains(':')
                {
                    return (Outcome::HeldMemberNotServing, condition.message.clone());
                }
                seen.push(format!(
                    "cluster: {} {}",
                    condition.reason, condition.message
                ));
            }
        }
        (Outcome::Hung, seen.join("; "))
    }

    /// Deletes the cluster as Cluster API does; nothing may be left in the cloud.
    async fn delete(&mut self, violations: &mut Vec<Violation>) {
        self.deleting.store(true, Ordering::SeqCst);
        let Some(actor) = &self.actor else {
            return;
        };
        if let Err(error) = delete_cluster(&self.client, actor).await {
            violations.push(self.violation(
                Invariant::Leak,
                format!("the cluster was never deleted: {error:#}"),
            ));
        }
        let left = check::leftovers(&self.baseline, &self.cloud.object_counts());
        if !left.is_empty() {
            violations.push(self.violation(
                Invariant::Leak,
                format!("left in the cloud: {}", left.join(", ")),
            ));
        }
    }

    fn violation(&self, invariant: Invariant, detail: String) -> Violation {
        Violation {
            invariant,
            at: self.seconds(),
            detail,
        }
    }

    /// Stops everything and adds what the checker saw.
    async fn finish(mut self, report: &mut RunReport) {
        for chore in self.chores.drain(..) {
            chore.abort();
        }
        if let Some(actor) = self.actor.take() {
            actor.stop().await;
        }
        if let Err(error) = self.manager.lock().await.stop(RestartKind::Graceful).await {
            report
                .violations
                .push(self.violation(Invariant::PanicOrStorm, error));
        }
        if let Some((stop, checker)) = self.checker.take() {
            stop.cancel();
            match checker.await {
                Ok(checker) => {
                    report.violations.extend(checker.violations);
                    report.worst_errors_per_object_minute = checker.worst_rate;
                    report.release_waits = checker.release_waits;
                    report.drains = checker.drains;
                    report.longest_held_out = checker.longest_held_out;
                }
                Err(error) => report.violations.push(self.violation(
                    Invariant::PanicOrStorm,
                    format!("the checker failed: {error}"),
                )),
            }
        }
        report.cloud_requests = self.cloud.request_log()["total"].as_u64().unwrap_or(0);
        report.kube_requests = self.kube.requests().len() as u64;
        if std::env::var_os("CAPO_SAFETY_DEBUG").is_some() {
            eprintln!("{}", self.kube.request_summary());
        }
        self.kube.shutdown().await;
    }
}

/// The rules the `index`th new machine's member gets, as the draw says; returns the task
/// that releases a stuck member later, if any.
fn trouble_for(
    draw: &Draw,
    index: usize,
    machine: &str,
    cloud: &Arc<OpenStackSim>,
) -> Option<JoinHandle<()>> {
    let members_of = format!("*-{machine}");
    if draw.lb_error && index == 0 {
        cloud.add_rule(Rule {
            kind: ObjectKind::Loadbalancer,
            name: "*".into(),
            effect: Effect::Error,
            times: Some(1),
        });
    }
    if let Some(error) = draw.error.filter(|e| e.machine == index) {
        cloud.add_rule(Rule {
            kind: ObjectKind::Member,
            name: members_of.clone(),
            effect: Effect::Error,
            times: Some(error.times),
        });
    }
    if let Some(api) = draw.api.filter(|a| a.machine == index) {
        let server = match api.kind {
            ApiTroubleKind::NeverServes => ApiServer::NeverReady,
            ApiTroubleKind::Flapping { period } => ApiServer::Flapping {
                period: Duration::from_secs_f64(period),
            },
        };
        cloud.set_api_server_for_members(&members_of, server);
    }
    let stuck = draw.stuck.filter(|s| s.machine == index)?;
    cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: members_of.clone(),
        effect: Effect::Stuck,
        times: None,
    });
    let after = Duration::from_secs_f64(stuck.released_after?);
    let cloud = cloud.clone();
    Some(tokio::spawn(async move {
        tokio::time::sleep(after).await;
        cloud.update_scenario(|scenario| {
            scenario
                .rules
                .retain(|rule| !(rule.name == members_of && rule.effect == Effect::Stuck));
        });
    }))
}

/// Rate limits, 5xx and the restart, each at its moment after the rollout starts.
async fn chaos(
    draw: Draw,
    cloud: Arc<OpenStackSim>,
    manager: Arc<tokio::sync::Mutex<Manager>>,
    start: Instant,
    stop: CancellationToken,
) -> Result<(), String> {
    enum Act {
        RateLimits(bool),
        ServerErrors(bool),
        Restart(RestartKind),
    }
    let mut acts: Vec<(f64, Act)> = Vec::new();
    if let Some(storm) = draw.rate_limits {
        acts.push((storm.window.from, Act::RateLimits(true)));
        acts.push((storm.window.until, Act::RateLimits(false)));
    }
    if let Some(burst) = draw.server_errors {
        acts.push((burst.window.from, Act::ServerErrors(true)));
        acts.push((burst.window.until, Act::ServerErrors(false)));
    }
    if let Some(restart) = draw.restart {
        acts.push((restart.at, Act::Restart(restart.kind)));
    }
    acts.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, act) in acts {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep_until(start + Duration::from_secs_f64(at)) => {}
        }
        match act {
            Act::RateLimits(on) => cloud.update_scenario(|scenario| {
                scenario.rate_limits.clear();
                if let (true, Some(storm)) = (on, draw.rate_limits) {
                    scenario.rate_limits.push(RateLimitFault {
                        service: None,
                        above_per_second: None,
                        probability: Some(storm.probability),
                        retry_after: storm.retry_after,
                    });
                }
            }),
            Act::ServerErrors(on) => cloud.update_scenario(|scenario| {
                scenario.server_errors.clear();
                if let (true, Some(burst)) = (on, draw.server_errors) {
                    scenario.server_errors.push(ServerErrorFault {
                        service: None,
                        probability: burst.probability,
                        status: burst.status,
                    });
                }
            }),
            Act::Restart(kind) => {
                let mut manager = manager.lock().await;
                manager.stop(kind).await?;
                manager.start();
            }
        }
    }
    Ok(())
}

/// Looks at every write to the API server and every transition of the cloud.
struct Checker {
    cloud: Arc<OpenStackSim>,
    errors: Arc<Mutex<ErrorTotals>>,
    started: Instant,
    deleting: Arc<AtomicBool>,
    /// Control-plane machines seen released (providerID or provisioned).
    released: HashSet<String>,
    pool_had_active: bool,
    pool_had_serving: bool,
    /// The API pool's members at the previous look, and since when a member passing its
    /// monitor has been held at weight 0 while none served.
    api_before: Vec<MemberTruth>,
    held_out_since: Option<Instant>,
    longest_held_out: f64,
    /// When each member was first seen ACTIVE, and each member's weight, by member id.
    first_active: HashMap<String, Instant>,
    weights: HashMap<String, u32>,
    /// Members whose weight went from 1 to 0 (drained), since when.
    draining: HashMap<String, Instant>,
    release_waits: Vec<f64>,
    drains: Vec<f64>,
    reported: BTreeSet<String>,
    /// Objects each controller reconciles, by name.
    live: BTreeMap<String, BTreeSet<String>>,
    last_errors: BTreeMap<String, f64>,
    worst_rate: f64,
    violations: Vec<Violation>,
}

impl Checker {
    fn new(
        cloud: Arc<OpenStackSim>,
        errors: Arc<Mutex<ErrorTotals>>,
        started: Instant,
        deleting: Arc<AtomicBool>,
    ) -> Checker {
        Checker {
            cloud,
            errors,
            started,
            deleting,
            released: HashSet::new(),
            pool_had_active: false,
            pool_had_serving: false,
            api_before: Vec::new(),
            held_out_since: None,
            longest_held_out: 0.0,
            first_active: HashMap::new(),
            weights: HashMap::new(),
            draining: HashMap::new(),
            release_waits: Vec::new(),
            drains: Vec::new(),
            reported: BTreeSet::new(),
            live: BTreeMap::new(),
            last_errors: BTreeMap::new(),
            worst_rate: 0.0,
            violations: Vec::new(),
        }
    }

    async fn run(
        mut self,
        mut changes: broadcast::Receiver<Arc<Change>>,
        stop: CancellationToken,
    ) -> Checker {
        let mut minute = tokio::time::interval(Duration::from_secs(60));
        minute.tick().await;
        loop {
            let next = self
                .cloud
                .next_transition()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                change = changes.recv() => match change {
                    Ok(change) => self.on_change(&change),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        self.report("lagged", Invariant::PanicOrStorm, format!("the checker missed {missed} writes"));
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                () = tokio::time::sleep_until(next) => {}
                _ = minute.tick() => self.sample_errors(),
                () = stop.cancelled() => break,
            }
            self.check_cloud();
        }
        self
    }

    fn report(&mut self, key: &str, invariant: Invariant, detail: String) {
        if self.reported.insert(key.to_owned()) {
            self.violations.push(Violation {
                invariant,
                at: self.started.elapsed().as_secs_f64(),
                detail,
            });
        }
    }

    fn on_change(&mut self, change: &Change) {
        let controller = match change.key.plural.as_str() {
            "openstackmachines" => manager::CONTROLLERS[2],
            "openstackclusters" => manager::CONTROLLERS[1],
            "openstackservers" => manager::CONTROLLERS[0],
            _ => return,
        };
        let object = &change.object;
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let gone = matches!(change.kind, capo_sim::kube::store::EventType::Deleted);
        let live = self.live.entry(controller.to_owned()).or_default();
        if gone {
            live.remove(&name);
            return;
        }
        live.insert(name.clone());
        if controller == manager::CONTROLLERS[2] {
            self.on_machine(&name, object);
        }
    }

    fn on_machine(&mut self, name: &str, machine: &Value) {
        let labels = machine.pointer("/metadata/labels");
        let control_plane = labels
            .and_then(|l| l.get(capi::labels::CONTROL_PLANE))
            .is_some();
        let leaving = machine.pointer("/metadata/deletionTimestamp").is_some()
            || machine
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(gate::LEAVING_ANNOTATION))
                .is_some();
        let released = machine.pointer("/spec/providerID").is_some()
            || machine.pointer("/status/initialization/provisioned") == Some(&Value::Bool(true));
        if !control_plane || leaving || !released || !self.released.insert(name.to_owned()) {
            return;
        }
        let address = machine
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|addresses| {
                addresses
                    .iter()
                    .find(|a| a["type"] == "InternalIP")
                    .and_then(|a| a["address"].as_str())
            });
        let members = self.cloud.member_truth();
        let first_active = members
            .iter()
            .filter(|m| m.port == check::API_PORT && Some(m.address.as_str()) == address)
            .find_map(|m| self.first_active.get(&m.id));
        if let Some(at) = first_active {
            self.release_waits.push(at.elapsed().as_secs_f64());
        }
        if let Some(problem) = check::early_release(address, &members) {
            self.report(
                &format!("early {name}"),
                Invariant::EarlyRelease,
                format!("{name} released: {problem}"),
            );
        }
        if let Some(problem) = address.and_then(|a| check::released_not_serving(a, &members)) {
            self.report(
                &format!("not serving {name}"),
                Invariant::ReleasedNotServing,
                format!("{name} released: {problem}"),
            );
        }
    }

    fn check_cloud(&mut self) {
        let members = self.cloud.member_truth();
        self.time_members(&members);
        let active = check::active_api_members(&members);
        if active > 0 {
            self.pool_had_active = true;
        } else if self.pool_had_active && !self.deleting.load(Ordering::SeqCst) {
            let states: Vec<String> = members
                .iter()
                .map(|m| format!("{} {}", m.address, m.provisioning_status))
                .collect();
            self.report(
                "empty",
                Invariant::EmptyPool,
                format!("no ACTIVE member in the API pool: [{}]", states.join(", ")),
            );
        }
        self.check_serving(&members);
        for duplicate in check::duplicates(&self.cloud.inventory()) {
            self.report(&duplicate, Invariant::Duplicate, duplicate.clone());
        }
    }

    /// Invariant 8: whenever the API pool has no serving member, it is not capo-rs's doing.
    fn check_serving(&mut self, members: &[MemberTruth]) {
        let api: Vec<MemberTruth> = members
            .iter()
            .filter(|m| m.port == check::API_PORT)
            .cloned()
            .collect();
        let before = std::mem::replace(&mut self.api_before, api.clone());
        if check::serving_api_members(&api) > 0 {
            self.pool_had_serving = true;
        }
        if !self.pool_had_serving || self.deleting.load(Ordering::SeqCst) {
            self.held_out_since = None;
            return;
        }
        if let Some(removed) = check::removed_the_only_server(&before, &api) {
            self.report(
                "removed the only server",
                Invariant::NoServingMember,
                format!("no ACTIVE, ONLINE member in the API pool: {removed}"),
            );
        }
        let held = check::held_out_while_unserved(&api);
        if held.is_empty() {
            self.held_out_since = None;
            return;
        }
        let since = *self.held_out_since.get_or_insert_with(Instant::now);
        let held_for = since.elapsed();
        self.longest_held_out = self.longest_held_out.max(held_for.as_secs_f64());
        if held_for > check::HELD_OUT_ALLOWANCE {
            let states: Vec<String> = api
                .iter()
                .map(|m| {
                    format!(
                        "{} {}/{}",
                        m.address, m.provisioning_status, m.operating_status
                    )
                })
                .collect();
            self.report(
                "held out",
                Invariant::NoServingMember,
                format!(
                    "no ACTIVE, ONLINE member in the API pool for {:.0} s while {} passed its monitor at weight 0: [{}]",
                    held_for.as_secs_f64(),
                    held.join(", "),
                    states.join(", ")
                ),
            );
        }
    }

    /// First ACTIVE of each member, and drains: a weight going from 1 to 0 until the member
    /// is gone.
    fn time_members(&mut self, members: &[MemberTruth]) {
        let now = Instant::now();
        for m in members {
            if m.provisioning_status == "ACTIVE" {
                self.first_active.entry(m.id.clone()).or_insert(now);
            }
            let before = self.weights.insert(m.id.clone(), m.weight);
            if before.is_some_and(|w| w > 0) && m.weight == 0 {
                self.draining.entry(m.id.clone()).or_insert(now);
            }
        }
        let present: HashSet<&str> = members.iter().map(|m| m.id.as_str()).collect();
        let gone: Vec<String> = self
            .draining
            .keys()
            .filter(|id| !present.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            if let Some(since) = self.draining.remove(&id) {
                self.drains.push(since.elapsed().as_secs_f64());
            }
        }
    }

    fn sample_errors(&mut self) {
        let totals = self
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .totals();
        let objects = self
            .live
            .iter()
            .map(|(controller, names)| (controller.clone(), names.len()))
            .collect();
        for (controller, rate) in check::error_rates(&self.last_errors, &totals, &objects) {
            self.worst_rate = self.worst_rate.max(rate);
            if rate > check::STORM_ERRORS_PER_OBJECT_MINUTE {
                self.report(
                    &format!("storm {controller}"),
                    Invariant::PanicOrStorm,
                    format!("{controller}: {rate:.0} reconcile errors per object in one minute"),
                );
            }
        }
        self.last_errors = totals;
    }
}

/// Polls `step` every second until it yields, within [`STEP_TIMEOUT`].
async fn until<T>(
    what: &str,
    mut step: impl AsyncFnMut() -> Result<Option<T>, kube::Error>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut last_error = None;
    while Instant::now() < deadline {
        match step().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    anyhow::bail!(
        "{what}: not within {} s (last error: {last_error:?})",
        STEP_TIMEOUT.as_secs()
    )
}

fn is_provisioned(cluster: &OpenStackCluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
}

fn control_plane(replicas: usize) -> ControlPlane {
    let template: OpenStackMachineSpec = serde_json::from_value(json!({
        "flavor": {"filter": {"name": "m1.small"}},
        "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
    }))
    .unwrap_or_default();
    ControlPlane {
        cluster: CLUSTER.into(),
        replicas,
        template,
        version: "v1.33.4".into(),
        failure_domains: Vec::new(),
    }
}

/// The project's own network, as a tenant has before any cluster.
async fn tenant_network(cloud: &OpenStackSim) -> anyhow::Result<()> {
    let clouds = Clouds::new(
        CloudOptions::default(),
        &Registry::new(),
        CancellationToken::new(),
    )?;
    let admin = clouds.client(cloud.session());
    let network = admin
        .neutron()
        .create_network(&NetworkSpec {
            name: "capo-net".into(),
            admin_state_up: true,
            ..NetworkSpec::default()
        })
        .await?;
    admin
        .neutron()
        .create_subnet(&SubnetSpec {
            name: "capo-subnet".into(),
            network_id: network.id.clone(),
            cidr: "10.6.0.0/24".into(),
            ip_version: 4,
            ..SubnetSpec::default()
        })
        .await?;
    Ok(())
}

/// The Secret named by `identityRef` (shared with `bench scale`).
pub(crate) async fn put_cloud_secret(
    client: &kube::Client,
    clouds_yaml: &str,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("cloud-config".into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "clouds.yaml".to_owned(),
            ByteString(clouds_yaml.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// A Cluster API Cluster (with Cluster API's finalizer) and its OpenStackCluster.
async fn create_cluster(client: &kube::Client) -> anyhow::Result<()> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE,
                     "finalizers": ["cluster.cluster.x-k8s.io"]},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": CLUSTER}}
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;
    let infrastructure: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE,
                     "labels": {capi::labels::CLUSTER_NAME: CLUSTER}},
        "spec": {
            "apiServer": {"managedLoadBalancer": {"enabled": true}},
            "identityRef": {"name": "cloud-config", "cloudName": "sim"},
            "managedSecurityGroups": {"allowAllInClusterTraffic": true},
            "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["192.0.2.53"]}],
        },
    }))?;
    let api: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    api.create(&PostParams::default(), &infrastructure).await?;
    Ok(())
}

/// The Cluster first (it stays, deleting), then its Machines, then the OpenStackCluster;
/// then Cluster API lets the Cluster go.
async fn delete_cluster(client: &kube::Client, actor: &CapiActor) -> anyhow::Result<()> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    clusters.delete(CLUSTER, &DeleteParams::default()).await?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let names: Vec<String> = machines
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    for name in &names {
        actor.delete_machine(name).await?;
    }
    for name in &names {
        actor.wait_gone(name).await?;
    }
    let infrastructure: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    infrastructure
        .delete(CLUSTER, &DeleteParams::default())
        .await?;
    until("the OpenStackCluster to be gone", async || {
        Ok(infrastructure
            .get_opt(CLUSTER)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let release = json!({"metadata": {"finalizers": null}});
    clusters
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    Ok(())
}
