//! Whole control-plane rollouts, end to end: the manager (cluster, machine and server
//! controllers, the engine), the Cluster API actor (Cluster, Machine, a KCP-like rollout), the
//! simulated Kubernetes API and the simulated OpenStack in AmphoraV2's race: the load balancer
//! unlocks in a fraction of a second while each member takes longer. Members made while the
//! cluster comes up take the simulator's 0.2–0.45 s; each member a rollout adds takes 30, 25
//! and 20 s (the slow end of the 2–30 s AmphoraV2 shows), on the real clock, so that the same
//! rollout trusting the LB can show what it does.
//!
//! A watcher samples the simulated cloud and the OpenStackMachines throughout and records:
//! the fewest ACTIVE members the API pool had once it first had one, and every machine seen
//! with a providerID while its member was not ACTIVE.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capo_api::capi::{self, Cluster, Machine};
use capo_api::conditions::{self, reasons, types};
use capo_api::{OpenStackMachine, OpenStackMachineSpec};
use capo_bench::Strategy;
use capo_provider::controllers::gate;
use capo_provider::manager::{ManagerConfig, SharedObserver, WatchScope};
use capo_sim::capi::{CapiActor, CapiActorConfig, ControlPlane, RolloutReport, RolloutStep};
use capo_sim::openstack::{Delay, Effect, MemberTruth, ObjectKind, Rule};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::cluster_controller::{
    cluster_spec, create_cluster, delete_cluster, machines, provisioned, ready, wait_cluster,
};
use crate::server_controller::{World, eventually, manager_config};

/// How long the member of each machine a rollout adds takes to be ACTIVE, in order.
const ROLLOUT_MEMBER_SECONDS: [f64; 3] = [30.0, 25.0, 20.0];

/// The `round`th new machine's member takes its time (its creation only).
fn slow_member(machine: &str, round: usize) -> Rule {
    let seconds = ROLLOUT_MEMBER_SECONDS[round.min(ROLLOUT_MEMBER_SECONDS.len() - 1)];
    Rule {
        kind: ObjectKind::Member,
        name: format!("*-{machine}"),
        effect: Effect::Delay(Delay::Fixed(seconds)),
        times: Some(1),
    }
}

fn config(strategy: Strategy, stuck_after: Duration) -> ManagerConfig {
    let mut config = manager_config(WatchScope::default());
    config.engine.stuck_after = stuck_after;
    config.engine.schedule = strategy.schedule(config.engine.schedule.clone());
    if strategy != Strategy::StatusTree {
        config.observer = Some(SharedObserver(strategy.observer()));
    }
    config
}

fn template() -> OpenStackMachineSpec {
    serde_json::from_value(json!({
        "flavor": {"filter": {"name": "m1.small"}},
        "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
    }))
    .unwrap()
}

fn plane(replicas: usize) -> ControlPlane {
    ControlPlane {
        cluster: "c1".into(),
        replicas,
        template: template(),
        version: "v1.33.4".into(),
        failure_domains: Vec::new(),
    }
}

/// What the watcher saw.
#[derive(Debug, Default)]
struct Seen {
    samples: u64,
    /// ACTIVE members of the API pool: the fewest once it first had one.
    min_active: Option<usize>,
    /// Machines seen released while their member was not ACTIVE.
    released_early: Vec<String>,
}

/// What the gate promises through a rollout: the API pool never empty once it had a member,
/// and no machine released before its member was ACTIVE.
fn assert_gate_held(seen: &Seen) {
    assert!(
        seen.min_active.is_some_and(|min| min >= 1),
        "the API pool never had zero ACTIVE members: {:?}",
        seen.min_active
    );
    assert_eq!(
        seen.released_early,
        Vec::<String>::new(),
        "no machine released before its member was ACTIVE"
    );
}

/// Samples the cloud and the machines until `stop`.
fn watch(
    world: &World,
    stop: CancellationToken,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let machines: Api<OpenStackMachine> = machines(world);
    let cloud = world.cloud.clone();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // The machines first: a providerID seen now was set on an ACTIVE member, which
            // the cloud, read after, must still show.
            let Ok(list) = machines.list(&ListParams::default()).await else {
                continue;
            };
            let members = cloud.member_truth();
            let api_pool: Vec<_> = members.iter().filter(|m| m.port == 6443).collect();
            let active = active_members(&members);
            // A machine that looked joining with its providerID set, and whose member was
            // not ACTIVE: released early only if it is still joining when read again after
            // the cloud. A slow list can show a machine as it was before it began to leave,
            // while the cloud already shows its member going.
            let suspects: Vec<String> = list
                .items
                .iter()
                .filter(|machine| {
                    joining(machine)
                        && machine.spec.provider_id.is_some()
                        && gate::member_address(machine, &[]).is_some_and(|address| {
                            !api_pool
                                .iter()
                                .any(|m| m.address == address && m.provisioning_status == "ACTIVE")
                        })
                })
                .map(kube::ResourceExt::name_any)
                .collect();
            let mut confirmed = Vec::new();
            for name in suspects {
                if let Ok(Some(now)) = machines.get_opt(&name).await
                    && joining(&now)
                {
                    confirmed.push(name);
                }
            }
            let mut seen = record.lock().unwrap();
            seen.samples += 1;
            if active > 0 || seen.min_active.is_some() {
                seen.min_active = Some(seen.min_active.map_or(active, |min| min.min(active)));
            }
            for name in confirmed {
                if !seen.released_early.contains(&name) {
                    seen.released_early.push(name);
                }
            }
        }
    });
    (seen, task)
}

/// The API pool's ACTIVE members.
fn active_members(members: &[MemberTruth]) -> usize {
    members
        .iter()
        .filter(|m| m.port == 6443 && m.provisioning_status == "ACTIVE")
        .count()
}

/// A control-plane machine whose member is wanted in the pool.
pub(crate) fn joining(machine: &OpenStackMachine) -> bool {
    capi::is_control_plane(kube::ResourceExt::labels(machine)) && !gate::is_leaving(machine)
}

/// The world with a provisioned cluster `c1` and the actor playing Cluster API.
async fn cluster_with_actor(strategy: Strategy, stuck_after: Duration) -> (World, CapiActor) {
    let (world, actor, _) = cluster_with_actor_counted(strategy, stuck_after).await;
    (world, actor)
}

/// The same, with what the cloud held before the cluster (the tenant's own network, ...).
async fn cluster_with_actor_counted(
    strategy: Strategy,
    stuck_after: Duration,
) -> (World, CapiActor, BTreeMap<String, usize>) {
    cluster_with_actor_configured(config(strategy, stuck_after)).await
}

/// The same, with the manager configured as given.
async fn cluster_with_actor_configured(
    config: ManagerConfig,
) -> (World, CapiActor, BTreeMap<String, usize>) {
    init_test_log();
    let mut world = World::start().await;
    world.stop_manager().await;
    world.start_manager_with(config);
    let baseline = world.cloud.object_counts();
    create_owned_cluster(&world).await;
    wait_cluster(&world, "c1", "provisioned", |c| provisioned(c) && ready(c)).await;
    let actor = start_actor(&world);
    (world, actor, baseline)
}

/// Cluster `c1` and its OpenStackCluster, with Cluster API's own finalizer on the Cluster: it
/// stays, deleting, until its parts are gone.
async fn create_owned_cluster(world: &World) -> Api<Cluster> {
    create_cluster(world, "c1", cluster_spec()).await;
    let clusters: Api<Cluster> = world.kube.api();
    let finalizer = json!({"metadata": {"finalizers": ["cluster.cluster.x-k8s.io"]}});
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .unwrap();
    clusters
}

/// The Cluster API actor, at the tests' pace.
fn start_actor(world: &World) -> CapiActor {
    start_actor_waiting(world, Duration::from_secs(60))
}

/// [`start_actor`], each of its waits bounded by `wait_timeout`.
fn start_actor_waiting(world: &World, wait_timeout: Duration) -> CapiActor {
    CapiActor::start(
        world.client.clone(),
        CapiActorConfig {
            namespace: world.ns().into(),
            tick: Duration::from_millis(50),
            join_delay: Duration::from_millis(200),
            wait_timeout,
        },
        CancellationToken::new(),
    )
}

/// CAPO_TEST_LOG=capo_provider=debug shows what the controllers do.
pub(crate) fn init_test_log() {
    if let Ok(filter) = std::env::var("CAPO_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// Requests the simulated cloud served so far.
fn requests(world: &World) -> u64 {
    world.request_total()
}

/// Deletes the cluster as Cluster API does: the Cluster first (it stays, deleting), then its
/// machines, then the infrastructure cluster; then nothing may be left in the cloud.
async fn delete_everything(world: &World, actor: &CapiActor, baseline: &BTreeMap<String, usize>) {
    let clusters: Api<Cluster> = world.kube.api();
    clusters.delete("c1", &Default::default()).await.unwrap();
    let all: Api<Machine> = world.kube.api();
    let names: Vec<String> = all
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    for name in &names {
        actor.delete_machine(name).await.unwrap();
    }
    for name in &names {
        actor.wait_gone(name).await.unwrap();
    }
    delete_cluster(world, "c1").await;
    let release = json!({"metadata": {"finalizers": null}});
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert_eq!(
        &world.cloud.object_counts(),
        baseline,
        "nothing left behind in the cloud"
    );
}

struct Figures {
    wall: Duration,
    rollout: RolloutReport,
    requests: u64,
    min_active: Option<usize>,
    samples: u64,
}

impl Figures {
    fn print(&self, strategy: Strategy) {
        let replaced = self.rollout.replaced.len().max(1) as f64;
        eprintln!(
            "rollout ({}): wall {:.1} s; rollout {:.1} s; {} machines replaced; {:.1} OpenStack requests per machine replaced; min ACTIVE members in the API pool {:?} over {} samples",
            strategy.as_str(),
            self.wall.as_secs_f64(),
            self.rollout.elapsed.as_secs_f64(),
            self.rollout.replaced.len(),
            self.requests as f64 / replaced,
            self.min_active,
            self.samples,
        );
    }
}

/// How the members a rollout adds behave.
#[derive(Clone, Copy)]
enum NewMembers {
    /// Each takes its time to be ACTIVE ([`ROLLOUT_MEMBER_SECONDS`]).
    Slow,
    /// Each stays PENDING_CREATE until the rollout is over: what a provider trusting the LB
    /// does with them cannot depend on how fast the rollout went.
    StuckUntilTheEnd,
}

impl NewMembers {
    fn rule(self, machine: &str, round: usize) -> Rule {
        match self {
            NewMembers::Slow => slow_member(machine, round),
            NewMembers::StuckUntilTheEnd => Rule {
                kind: ObjectKind::Member,
                name: format!("*-{machine}"),
                effect: Effect::Stuck,
                times: None,
            },
        }
    }
}

/// Brings up 3 control-plane machines and a worker, rolls the control plane, and returns
/// what the watcher saw (its last sample taken as the rollout ended).
async fn rollout_of_three(
    strategy: Strategy,
    new_members: NewMembers,
) -> (World, CapiActor, Figures, Seen, BTreeMap<String, usize>) {
    let started = Instant::now();
    let (world, actor, baseline) =
        cluster_with_actor_counted(strategy, Duration::from_secs(600)).await;
    let stop = CancellationToken::new();
    let (seen, watcher) = watch(&world, stop.clone());
    let plane = plane(3);
    actor.scale_control_plane(&plane).await.unwrap();
    let workers = actor.create_workers("c1", 1, template()).await.unwrap();
    for worker in &workers {
        actor.wait_joined(worker).await.unwrap();
    }
    let before = requests(&world);
    let cloud = world.cloud.clone();
    let mut round = 0;
    let report = actor
        .rollout(&plane, |step| {
            if let RolloutStep::Created { name } = step {
                cloud.add_rule(new_members.rule(&name, round));
                round += 1;
            }
        })
        .await;
    let requests = requests(&world) - before;
    stop.cancel();
    watcher.await.unwrap();
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    // One last sample as the rollout ended, before any held member is let go.
    let active_at_end = active_members(&world.cloud.member_truth());
    seen.min_active = seen.min_active.map(|min| min.min(active_at_end));
    if let NewMembers::StuckUntilTheEnd = new_members {
        world.cloud.clear_rules();
    }
    let report = report.unwrap_or_else(|e| panic!("the {} rollout: {e}", strategy.as_str()));
    let figures = Figures {
        wall: started.elapsed(),
        rollout: report,
        requests,
        min_active: seen.min_active,
        samples: seen.samples,
    };
    (world, actor, figures, seen, baseline)
}

#[tokio::test]
async fn a_gated_rollout_never_empties_the_api_pool_and_deleting_the_cluster_leaves_nothing() {
    let (mut world, actor, figures, seen, baseline) =
        rollout_of_three(Strategy::StatusTree, NewMembers::Slow).await;
    figures.print(Strategy::StatusTree);
    assert_eq!(figures.rollout.replaced.len(), 3, "every machine replaced");
    assert!(seen.samples > 10, "the watcher sampled throughout");
    assert_gate_held(&seen);
    // Workers do no load balancer work: released at once, no member.
    let all = machines(&world).list(&ListParams::default()).await.unwrap();
    let worker = all
        .items
        .iter()
        .find(|m| !capi::is_control_plane(kube::ResourceExt::labels(*m)))
        .expect("a worker");
    assert!(worker.spec.provider_id.is_some());
    let address = gate::member_address(worker, &[]).unwrap().to_owned();
    assert!(
        !world
            .cloud
            .member_truth()
            .iter()
            .any(|m| m.address == address),
        "a worker is no member"
    );
    let (status, reason) = member_condition(worker);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::NOT_CONTROL_PLANE)
    );
    // Each transition the gate acts on is an event.
    for reason in [
        "MemberCreated",
        "MemberActive",
        "MemberRemoving",
        "MemberRemoved",
    ] {
        assert!(
            !events(&world, reason).await.is_empty(),
            "a {reason} event was published"
        );
    }
    // The pool holds exactly the three new machines, each ACTIVE, and nothing else.
    let pool: Vec<_> = world
        .cloud
        .member_truth()
        .into_iter()
        .filter(|m| m.port == 6443)
        .collect();
    assert_eq!(pool.len(), 3, "{pool:#?}");
    assert!(pool.iter().all(|m| m.provisioning_status == "ACTIVE"));
    for name in &figures.rollout.created {
        assert!(
            pool.iter().any(|m| m.name.ends_with(name.as_str())),
            "{name}"
        );
    }
    delete_everything(&world, &actor, &baseline).await;
    actor.stop().await;
    world.stop_manager().await;
}

#[tokio::test]
async fn trusting_the_lb_instead_empties_the_api_pool_during_the_same_rollout() {
    let (mut world, actor, figures, seen, _) =
        rollout_of_three(Strategy::LbOnly, NewMembers::StuckUntilTheEnd).await;
    figures.print(Strategy::LbOnly);
    assert_eq!(figures.rollout.replaced.len(), 3);
    assert_eq!(
        figures.min_active,
        Some(0),
        "trusting the LB, the pool reaches zero ACTIVE members"
    );
    assert!(
        !seen.released_early.is_empty(),
        "machines were released before their members were ACTIVE"
    );
    actor.stop().await;
    world.stop_manager().await;
}

/// The status and reason of a machine's `APIServerLoadBalancerMemberReady` condition.
pub(crate) fn member_condition(machine: &OpenStackMachine) -> (String, String) {
    machine
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::API_SERVER_LOAD_BALANCER_MEMBER_READY))
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

async fn events(world: &World, reason: &str) -> Vec<String> {
    let events: Api<Event> = world.kube.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// Waits until the machine's member condition has `reason`.
async fn wait_member_reason(world: &World, name: &str, reason: &str) -> OpenStackMachine {
    let api = machines(world);
    eventually(&format!("{name} with {reason}"), || async {
        let machine = api.get_opt(name).await.ok().flatten()?;
        (member_condition(&machine).1 == reason).then_some(machine)
    })
    .await
}

#[tokio::test]
async fn a_stuck_member_holds_the_rollout_until_released_and_an_error_member_is_repaired() {
    let (mut world, actor) = cluster_with_actor(Strategy::StatusTree, Duration::from_secs(2)).await;
    let plane = plane(3);
    let old = actor.scale_control_plane(&plane).await.unwrap();
    let created = Arc::new(Mutex::new(Vec::<String>::new()));
    let cloud = world.cloud.clone();
    let noted = created.clone();
    let rollout = actor.rollout(&plane, move |step| {
        let RolloutStep::Created { name } = step else {
            return;
        };
        let mut created = noted.lock().unwrap();
        created.push(name.clone());
        // The first new member sticks in PENDING_CREATE; the second goes ERROR once.
        let effect = match created.len() {
            1 => Some((Effect::Stuck, None)),
            2 => Some((Effect::Error, Some(1))),
            _ => None,
        };
        let Some((effect, times)) = effect else {
            return;
        };
        let rule = Rule {
            kind: ObjectKind::Member,
            name: format!("*-{name}"),
            effect,
            times,
        };
        cloud.add_rule(rule);
    });
    let check = async {
        let first = eventually("the first new machine", || async {
            created.lock().unwrap().first().cloned()
        })
        .await;
        let stuck = wait_member_reason(&world, &first, reasons::MEMBER_STUCK).await;
        assert!(stuck.spec.provider_id.is_none(), "a stuck machine is held");
        // The rollout is held: every old machine is still there, none deleting.
        let all: Api<Machine> = world.kube.api();
        for name in &old {
            let machine = all.get(name).await.unwrap();
            assert!(machine.metadata.deletion_timestamp.is_none(), "{name} kept");
        }
        assert!(!events(&world, "MemberStuck").await.is_empty());
        // The stuck rule goes: the member finishes, and the rollout goes on.
        world.cloud.clear_rules();
        let second = eventually("the second new machine", || async {
            created.lock().unwrap().get(1).cloned()
        })
        .await;
        wait_member_reason(&world, &second, reasons::MEMBER_ERROR).await;
    };
    let (report, ()) = tokio::join!(rollout, check);
    let report = report.unwrap();
    assert_eq!(
        report.replaced, old,
        "every old machine replaced, oldest first"
    );
    assert!(
        !events(&world, "MemberRepairing").await.is_empty(),
        "ERROR repaired"
    );
    assert!(!events(&world, "MemberRepaired").await.is_empty());
    let pool: Vec<_> = world
        .cloud
        .member_truth()
        .into_iter()
        .filter(|m| m.port == 6443)
        .collect();
    assert_eq!(pool.len(), 3, "{pool:#?}");
    assert!(pool.iter().all(|m| m.provisioning_status == "ACTIVE"));
    actor.stop().await;
    world.stop_manager().await;
}

#[tokio::test]
async fn the_last_active_member_of_a_pool_is_held_until_another_serves() {
    let (mut world, actor) =
        cluster_with_actor(Strategy::StatusTree, Duration::from_secs(600)).await;
    let names = actor.scale_control_plane(&plane(1)).await.unwrap();
    let only = names[0].clone();
    // A second machine joins, but its member sticks in PENDING_CREATE: the first one's member
    // stays the only ACTIVE one of the pool. Deleting the first machine must not empty it.
    // Every member created from now on sticks (the first one's is ACTIVE already).
    world.cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "*".into(),
        effect: Effect::Stuck,
        times: None,
    });
    let two = plane(2);
    let scaling = actor.scale_control_plane(&two);
    let check = async {
        let api = machines(&world);
        let second = eventually("a second machine", || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .map(kube::ResourceExt::name_any)
                .find(|name| *name != only)
        })
        .await;
        wait_member_reason(&world, &second, reasons::MEMBERS_PENDING).await;
        actor.delete_machine(&only).await.unwrap();
        let held = wait_member_reason(&world, &only, reasons::LAST_ACTIVE_MEMBER).await;
        assert!(!gate::is_leaving(&held), "a held machine stays a member");
        assert!(!events(&world, "MemberRemovalHeld").await.is_empty());
        let all: Api<Machine> = world.kube.api();
        let machine = all.get(&only).await.unwrap();
        assert!(
            kube::ResourceExt::annotations(&machine).contains_key(capi::labels::LB_MEMBER_HOOK),
            "the hook stays while the member is held"
        );
        let active: Vec<_> = world
            .cloud
            .member_truth()
            .into_iter()
            .filter(|m| m.provisioning_status == "ACTIVE")
            .collect();
        assert_eq!(active.len(), 1, "{active:#?}");
        // The second member finishes: the first may go now.
        world.cloud.clear_rules();
    };
    let (scaled, ()) = tokio::join!(scaling, check);
    scaled.unwrap();
    actor.wait_gone(&only).await.unwrap();
    let pool = world.cloud.member_truth();
    assert!(
        pool.iter().any(|m| m.provisioning_status == "ACTIVE"),
        "a member serves after the hand-over: {pool:#?}"
    );
    assert!(!pool.iter().any(|m| m.name.ends_with(only.as_str())));
    actor.stop().await;
    world.stop_manager().await;
}

/// The serving gate on an HTTPS monitor, its clocks shortened for a test, and the drain.
fn serving_gate_config(drain_period: Duration) -> ManagerConfig {
    let mut config = config(Strategy::StatusTree, Duration::from_secs(600));
    config.engine.serving = Some(capo_provider::membership::ServingRules {
        settle: Duration::from_millis(500),
        recovery: Duration::from_secs(3),
        not_serving_after: Duration::from_secs(3),
    });
    config.controllers.api_monitor = gate::MonitorKind::Https;
    config.controllers.drain_period = drain_period;
    config
}

/// A cluster of one control-plane machine whose API serves, under the serving gate (its drain
/// 1 s); every API server made from now on listens but never answers `/readyz` with 200.
async fn one_serving_machine_under_the_serving_gate() -> (World, CapiActor, String) {
    let config = serving_gate_config(Duration::from_secs(1));
    let (world, actor, _) = cluster_with_actor_configured(config).await;
    let first = actor.scale_control_plane(&plane(1)).await.unwrap()[0].clone();
    world
        .cloud
        .set_api_server("*", capo_sim::openstack::ApiServer::NeverReady);
    let first_address = {
        let machine = machines(&world).get(&first).await.unwrap();
        gate::member_address(&machine, &[]).unwrap().to_owned()
    };
    world
        .cloud
        .set_api_server(&first_address, capo_sim::openstack::ApiServer::Serving);
    (world, actor, first)
}

/// The serving gate's rollout: a new machine whose API never answers `/readyz` is held with
/// MemberNotServing (its member ACTIVE all along), released once its API serves; the old
/// machine's member is drained at weight 0 before it is deleted.
#[tokio::test]
async fn the_serving_gate_holds_a_machine_whose_api_never_serves_and_drains_the_old_one() {
    let (mut world, actor, first) = one_serving_machine_under_the_serving_gate().await;
    let two = plane(2);
    let scaling = actor.scale_control_plane(&two);
    let check = async {
        let api = machines(&world);
        let second = eventually("a second machine", || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .map(kube::ResourceExt::name_any)
                .find(|name| *name != first)
        })
        .await;
        let held = wait_member_reason(&world, &second, reasons::MEMBER_NOT_SERVING).await;
        assert!(
            held.spec.provider_id.is_none(),
            "held while its API does not serve"
        );
        let address = gate::member_address(&held, &[]).unwrap().to_owned();
        let member = world
            .cloud
            .member_truth()
            .into_iter()
            .find(|m| m.address == address)
            .expect("its member");
        assert_eq!(
            (
                member.provisioning_status,
                member.operating_status,
                member.weight
            ),
            ("ACTIVE", "ERROR", 0),
            "ACTIVE all along (the provisioning gate would have released it), out of traffic"
        );
        assert!(!events(&world, "MemberNotServing").await.is_empty());
        // Its API comes up: released.
        world
            .cloud
            .set_api_server(&address, capo_sim::openstack::ApiServer::Serving);
        wait_member_reason(&world, &second, reasons::READY).await;
        let admitted = world
            .cloud
            .member_truth()
            .into_iter()
            .find(|m| m.address == address)
            .expect("its member");
        assert_eq!((admitted.weight, admitted.operating_status), (1, "ONLINE"));
        assert!(!events(&world, "MemberAdmitted").await.is_empty());
    };
    let (scaled, ()) = tokio::join!(scaling, check);
    scaled.unwrap();
    actor.delete_machine(&first).await.unwrap();
    actor.wait_gone(&first).await.unwrap();
    let draining = events(&world, "MemberDraining").await;
    assert!(
        draining.iter().any(|note| note.contains("weight 0")),
        "{draining:?}"
    );
    let pool = world.cloud.member_truth();
    assert_eq!(pool.len(), 1, "{pool:#?}");
    assert_eq!(pool[0].operating_status, "ONLINE");
    actor.stop().await;
    world.stop_manager().await;
}

/// A member no health check covers: ACTIVE and NO_MONITOR in a pool with a monitor, as
/// ovn-octavia-provider reports a member it failed to add to OVN (`helper.py` `member_create`).
/// The serving gate holds its machine (MemberNotServing, no providerID, the condition saying
/// why) though its API serves, and releases it once a check covers it.
#[tokio::test]
async fn the_serving_gate_holds_a_machine_whose_member_no_health_check_covers() {
    let (mut world, actor, first) = one_serving_machine_under_the_serving_gate().await;
    let two = plane(2);
    let scaling = actor.scale_control_plane(&two);
    let check = async {
        let api = machines(&world);
        let (second, member) = eventually("a second machine with its member", || async {
            let list = api.list(&ListParams::default()).await.ok()?;
            let second = list
                .items
                .iter()
                .find(|m| kube::ResourceExt::name_any(*m) != first)?;
            let address = gate::member_address(second, &[])?;
            let member = world
                .cloud
                .member_truth()
                .into_iter()
                .find(|m| m.address == address)?;
            Some((kube::ResourceExt::name_any(second), member))
        })
        .await;
        assert!(
            world
                .cloud
                .set_operating_status(&member.id, Some("NO_MONITOR")),
            "pinned"
        );
        world
            .cloud
            .set_api_server(&member.address, capo_sim::openstack::ApiServer::Serving);
        let held = wait_member_reason(&world, &second, reasons::MEMBER_NOT_SERVING).await;
        assert!(
            held.spec.provider_id.is_none(),
            "held while nothing checks it"
        );
        let message = held
            .status
            .as_ref()
            .and_then(|s| {
                conditions::find(&s.conditions, types::API_SERVER_LOAD_BALANCER_MEMBER_READY)
            })
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(message.contains("NO_MONITOR"), "{message}");
        assert!(!message.contains("kube-apiserver"), "{message}");
        let truth = world
            .cloud
            .member_truth()
            .into_iter()
            .find(|m| m.id == member.id)
            .expect("its member");
        assert_eq!(
            (truth.provisioning_status, truth.operating_status),
            ("ACTIVE", "NO_MONITOR")
        );
        // A check covers it again, and its API serves: released.
        world.cloud.set_operating_status(&member.id, None);
        wait_member_reason(&world, &second, reasons::READY).await;
    };
    let (scaled, ()) = tokio::join!(scaling, check);
    scaled.unwrap();
    actor.stop().await;
    world.stop_manager().await;
}

/// A drain undone: the new machine's API stops serving while the old member drains. The old
/// member takes traffic again and its machine waits; once the new API serves again, the old
/// member is drained afresh and goes.
#[tokio::test]
async fn a_drain_is_undone_when_the_only_other_member_stops_serving() {
    let config = serving_gate_config(Duration::from_secs(10));
    let (mut world, actor, _) = cluster_with_actor_configured(config).await;
    let first = actor.scale_control_plane(&plane(1)).await.unwrap()[0].clone();
    let second = actor.scale_control_plane(&plane(2)).await.unwrap();
    let second = second
        .into_iter()
        .find(|n| *n != first)
        .expect("a second machine");
    wait_member_reason(&world, &second, reasons::READY).await;
    let address = |name: String| {
        let api = machines(&world);
        async move {
            let machine = api.get(&name).await.unwrap();
            gate::member_address(&machine, &[]).unwrap().to_owned()
        }
    };
    let (old, new) = (address(first.clone()).await, address(second).await);
    let member = |address: &str| {
        world
            .cloud
            .member_truth()
            .into_iter()
            .find(|m| m.address == address && m.port == 6443)
    };
    actor.delete_machine(&first).await.unwrap();
    eventually("the old member drained", || async {
        member(&old).filter(|m| m.weight == 0)
    })
    .await;
    world
        .cloud
        .set_api_server(&new, capo_sim::openstack::ApiServer::Down);
    let held = wait_member_reason(&world, &first, reasons::LAST_ACTIVE_MEMBER).await;
    assert!(held.status.is_some());
    let restored = eventually("the old member back at weight 1", || async {
        member(&old).filter(|m| m.weight == 1 && m.provisioning_status == "ACTIVE")
    })
    .await;
    assert_eq!(restored.operating_status, "ONLINE", "it serves again");
    let undone = events(&world, "MemberDrainUndone").await;
    assert!(undone.iter().any(|n| n.contains("weight 1")), "{undone:?}");
    let all: Api<Machine> = world.kube.api();
    assert!(
        all.get_opt(&first).await.unwrap().is_some(),
        "the old machine waits"
    );
    // The new API serves again: the old member is drained afresh, then goes.
    world
        .cloud
        .set_api_server(&new, capo_sim::openstack::ApiServer::Serving);
    actor.wait_gone(&first).await.unwrap();
    let pool = world.cloud.member_truth();
    assert_eq!(pool.len(), 1, "{pool:#?}");
    assert_eq!(
        (pool[0].address.as_str(), pool[0].operating_status),
        (new.as_str(), "ONLINE")
    );
    actor.stop().await;
    world.stop_manager().await;
}

/// A controller restart shows nothing new to a user: released machines keep their member
/// condition (never Unknown while the engine has not looked again, and not written again),
/// and a machine that joins after the restart is still released only on an ACTIVE member.
#[tokio::test]
async fn a_restart_leaves_what_the_machines_said_until_the_engine_looks_again() {
    restart_leaves_what_the_machines_said(config(Strategy::StatusTree, Duration::from_secs(600)))
        .await;
}

/// The same under the serving gate: a restarted engine has not seen the released members
/// read ONLINE for the settle time, yet they served before; they must not turn "not yet
/// serving" (every control-plane machine not Ready) until they have again.
#[tokio::test]
async fn a_restart_under_the_serving_gate_leaves_what_the_machines_said() {
    let mut config = serving_gate_config(Duration::ZERO);
    // Long enough that a member counted afresh after the restart would show.
    if let Some(serving) = config.engine.serving.as_mut() {
        serving.settle = Duration::from_secs(3);
    }
    restart_leaves_what_the_machines_said(config).await;
}

async fn restart_leaves_what_the_machines_said(config: ManagerConfig) {
    let (mut world, actor, _) = cluster_with_actor_configured(config.clone()).await;
    actor.scale_control_plane(&plane(3)).await.unwrap();
    let api = machines(&world);
    let released: Vec<(String, String)> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| {
            (
                kube::ResourceExt::name_any(&m),
                kube::ResourceExt::resource_version(&m).unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(released.len(), 3);
    for (name, _) in &released {
        wait_member_reason(&world, name, reasons::READY).await;
    }
    let members_since = recorded_members_since(&world).await;
    assert_eq!(members_since.len(), 3, "{members_since:?}");
    let stop = CancellationToken::new();
    let (seen, watcher) = watch(&world, stop.clone());
    let changes = record_member_conditions(&world, stop.clone());
    world.stop_manager().await;
    let logged_before = world.kube.sim_requests().map(|log| log.len());
    world.start_manager_with(config);
    // A fourth machine released means the engine looked at the load balancer again.
    actor.scale_control_plane(&plane(4)).await.unwrap();
    // The new process trusts the copy its first list brought: no cluster is read again (the
    // simulator alone keeps a request log; nothing else here reads the cluster by name).
    if let (Some(log), Some(before)) = (world.kube.sim_requests(), logged_before) {
        let reads: Vec<_> = log[before..]
            .iter()
            .filter(|r| r.verb == "get" && r.resource == "openstackclusters")
            .collect();
        assert!(
            reads.is_empty(),
            "the cluster was read again after the restart: {reads:?}"
        );
    }
    // The engine knows no earlier time than its first look after the restart; the time the
    // cluster recorded for a member still in the same state stands. (A member's health may
    // turn ONLINE meanwhile: that is a new state, with its own time.)
    let after = recorded_members_since(&world).await;
    let mut stood = 0;
    for (member, (since, state)) in &members_since {
        let Some((since_after, state_after)) = after.get(member) else {
            panic!("{member} is no longer recorded: {after:?}");
        };
        if state_after == state {
            assert_eq!(since_after, since, "{member}'s since moved: {after:?}");
            stood += 1;
        }
    }
    assert!(
        stood > 0,
        "no member kept its state across the restart: {after:?}"
    );
    stop.cancel();
    watcher.await.unwrap();
    let changes = changes.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(seen.released_early.is_empty(), "{:?}", seen.released_early);
    for (name, version) in &released {
        let after: Vec<_> = changes
            .iter()
            .filter(|(n, v, _)| n == name && v != version)
            .map(|(_, _, condition)| condition)
            .collect();
        assert!(
            after.is_empty(),
            "{name}'s status was written again after the restart: {after:?}"
        );
    }
    world.stop_manager().await;
}

/// A graceful stop writes the `membersAsOf` stamps passes held back (alone, a new stamp waits
/// 60 s to go out with other news): the next process trusts the load balancers' recorded
/// members from one list, and reads no status tree. (Two clusters: a list is read only when
/// it covers two load balancers or more.) A join's stamp goes out with its Ready; a removal's
/// and a new LB's come alone, from the list after the tree the unlock brought at once.
#[tokio::test]
async fn a_graceful_stop_writes_the_held_members_stamps_and_the_next_process_reads_no_tree() {
    let mut config = config(Strategy::StatusTree, Duration::from_secs(600));
    // Lists come often, so one vouches for the settled members soon.
    config.engine.schedule.sweep_settled = Duration::from_secs(1);
    config.engine.schedule.vouch_after = Duration::from_secs(2);
    let (mut world, actor, _) = cluster_with_actor_configured(config.clone()).await;
    create_cluster(&world, "c2", cluster_spec()).await;
    wait_cluster(&world, "c2", "provisioned", |c| provisioned(c) && ready(c)).await;
    let stop = CancellationToken::new();
    let versions = record_cluster_versions(&world, stop.clone());
    actor.scale_control_plane(&plane(2)).await.unwrap();
    for machine in machines(&world).list(&ListParams::default()).await.unwrap() {
        wait_member_reason(
            &world,
            &kube::ResourceExt::name_any(&machine),
            reasons::READY,
        )
        .await;
    }
    stop.cancel();
    assert_joins_come_with_their_verdict(&versions.await.unwrap(), "c1");
    actor.scale_control_plane(&plane(1)).await.unwrap();
    let registry = world.registry.clone();
    eventually("both clusters' membersAsOf held back", || {
        let held = crate::server_controller::metric_sum(&registry, "capo_lb_members_as_of_held");
        async move { (held >= 2.0).then_some(()) }
    })
    .await;
    let held_back = recorded_members_as_of(&world).await;
    let clusters = crate::cluster_controller::clusters(&world);
    let read_before = clusters.get("c1").await.unwrap();
    actor.stop().await;
    world.stop_manager().await;
    let written = recorded_members_as_of(&world).await;
    for (name, stamp) in &written {
        assert!(
            stamp.is_some() && held_back.get(name) != Some(stamp),
            "{name}: recorded {held_back:?} before the stop, {written:?} after"
        );
    }

    let cloud = world.cloud.clone();
    let trees = || cloud.request_count("load-balancer loadbalancer_status_get");
    let lists = || cloud.request_count("load-balancer loadbalancer_list");
    let (trees_before, lists_before) = (trees(), lists());
    world.start_manager_with(config);
    // Two lists after the start: a load balancer not trusted would have had its first tree.
    eventually("two load balancer lists after the restart", || {
        let listed = lists() >= lists_before + 2;
        async move { listed.then_some(()) }
    })
    .await;
    assert_eq!(trees() - trees_before, 0, "status trees after the restart");
    world.stop_manager().await;
    // What makes the writes safe, checked on the API server: a patch naming a version the
    // object has left is refused (a stamp never lands on members it did not vouch for).
    let stale = json!({
        "metadata": {"resourceVersion": kube::ResourceExt::resource_version(&read_before)},
        "status": {"apiServerManagedLoadBalancer": {"membersAsOf": "2026-01-01T00:00:00"}},
    });
    let refused = clusters
        .patch_status("c1", &PatchParams::default(), &Patch::Merge(&stale))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 409),
        "{refused:?}"
    );
}

/// Every version of every OpenStackCluster until `stop`.
fn record_cluster_versions(
    world: &World,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<capo_api::OpenStackCluster>> {
    record_versions(crate::cluster_controller::clusters(world), stop, |c| c)
}

/// What `keep` takes of every version of every object of `api` the watch delivers until `stop`.
fn record_versions<K, T>(
    api: Api<K>,
    stop: CancellationToken,
    keep: impl Fn(K) -> T + Send + 'static,
) -> tokio::task::JoinHandle<Vec<T>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    T: Send + 'static,
{
    use futures::StreamExt;
    let stream = kube::runtime::watcher(api, Default::default());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(stream));
        let mut versions = Vec::new();
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return versions,
                next = stream.next() => next,
            };
            if let Some(Ok(object)) = next {
                versions.push(keep(object));
            }
        }
    })
}

/// A joining machine's members first show in cluster `name`'s status with the gate's verdict
/// on them (not yet ready), never on their own under the verdict from before they were
/// wanted: one status write for the join, not two.
fn assert_joins_come_with_their_verdict(versions: &[capo_api::OpenStackCluster], name: &str) {
    let members = |cluster: &capo_api::OpenStackCluster| -> usize {
        let names: std::collections::BTreeSet<_> = cluster
            .status
            .iter()
            .flat_map(|s| &s.api_server_managed_load_balancer)
            .flat_map(|lb| &lb.members)
            .map(|m| m.name.clone())
            .collect();
        names.len()
    };
    let own: Vec<_> = versions
        .iter()
        .filter(|c| kube::ResourceExt::name_any(*c) == name)
        .collect();
    let before = own.first().map_or(0, |c| members(c));
    let joined = own
        .iter()
        .find(|c| members(c) > before)
        .unwrap_or_else(|| panic!("{name}: the join never showed in its status"));
    let gate = joined
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::API_SERVER_LOAD_BALANCER_READY));
    assert_eq!(
        gate.map(|c| c.status.as_str()),
        Some("False"),
        "{name}: the join's members showed with {gate:?}"
    );
}

/// Each cluster's recorded `membersAsOf`, by name.
async fn recorded_members_as_of(world: &World) -> BTreeMap<String, Option<String>> {
    let clusters = crate::cluster_controller::clusters(world);
    let listed = clusters.list(&ListParams::default()).await.unwrap();
    listed
        .items
        .into_iter()
        .map(|cluster| {
            let stamp = cluster
                .status
                .and_then(|s| s.api_server_managed_load_balancer)
                .and_then(|lb| lb.members_as_of);
            (cluster.metadata.name.unwrap_or_default(), stamp)
        })
        .collect()
}

/// Each member the cluster records, by name: its `since`, and its state (id, provisioning
/// and operating status).
async fn recorded_members_since(world: &World) -> BTreeMap<String, (String, String)> {
    let cluster = crate::cluster_controller::clusters(world)
        .get("c1")
        .await
        .unwrap();
    cluster
        .status
        .and_then(|s| s.api_server_managed_load_balancer)
        .map(|lb| lb.members)
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            let state = format!(
                "{:?} {:?} {:?}",
                m.id, m.provisioning_status, m.operating_status
            );
            (m.name, (format!("{:?}", m.since), state))
        })
        .collect()
}

/// One version of an OpenStackMachine: name, resourceVersion, and its member condition's
/// (status, reason).
type MachineVersion = (String, String, (String, String));

/// Every version of every OpenStackMachine until `stop`.
fn record_member_conditions(
    world: &World,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<MachineVersion>> {
    record_versions(machines(world), stop, |machine| {
        (
            kube::ResourceExt::name_any(&machine),
            kube::ResourceExt::resource_version(&machine).unwrap_or_default(),
            member_condition(&machine),
        )
    })
}

/// The objects of cluster c1 whose `Paused` condition does not say `reason`, with what it says.
async fn not_saying(world: &World, reason: &str) -> Vec<String> {
    let said = |kind: &str, name: String, conditions: Option<&Vec<Condition>>| {
        let found = conditions.and_then(|c| conditions::find(c, types::PAUSED));
        let says = found.map_or("nothing", |c| c.reason.as_str());
        (says != reason).then(|| format!("{kind} {name}: {says}"))
    };
    let mut lagging = Vec::new();
    if let Ok(cluster) = crate::cluster_controller::clusters(world).get("c1").await {
        let name = kube::ResourceExt::name_any(&cluster);
        lagging.extend(said(
            "OpenStackCluster",
            name,
            cluster.status.as_ref().map(|s| &s.conditions),
        ));
    }
    for machine in machines(world).list(&ListParams::default()).await.unwrap() {
        let name = kube::ResourceExt::name_any(&machine);
        lagging.extend(said(
            "OpenStackMachine",
            name,
            machine.status.as_ref().map(|s| &s.conditions),
        ));
    }
    for server in world.servers().list(&ListParams::default()).await.unwrap() {
        let name = kube::ResourceExt::name_any(&server);
        lagging.extend(said(
            "OpenStackServer",
            name,
            server.status.as_ref().map(|s| &s.conditions),
        ));
    }
    lagging
}

/// Waits until the cluster's OpenStackCluster, OpenStackMachines and OpenStackServers all
/// say `reason` on `Paused`; names those that do not when it gives up.
async fn wait_all_paused_reason(world: &World, reason: &str) {
    let deadline = tokio::time::Instant::now() + crate::server_controller::WAIT;
    loop {
        let lagging = not_saying(world, reason).await;
        if lagging.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {reason} after {:?}: {lagging:?}",
            crate::server_controller::WAIT
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Labels every object of cluster c1 for shard `filter`: the OpenStack objects first, the
/// Cluster last (docs/sharding.md: while the old shard still sees the paused Cluster, all it
/// still holds of the cluster reads paused).
async fn relabel_cluster(world: &World, filter: &str) {
    let label = json!({"metadata": {"labels": {capi::labels::WATCH_FILTER: filter}}});
    let patch = Patch::Merge(&label);
    let params = PatchParams::default();
    for server in world.servers().list(&ListParams::default()).await.unwrap() {
        let name = kube::ResourceExt::name_any(&server);
        world.servers().patch(&name, &params, &patch).await.unwrap();
    }
    for machine in machines(world).list(&ListParams::default()).await.unwrap() {
        let name = kube::ResourceExt::name_any(&machine);
        machines(world).patch(&name, &params, &patch).await.unwrap();
    }
    let owners: Api<Machine> = world.kube.api();
    for machine in owners.list(&ListParams::default()).await.unwrap() {
        let name = kube::ResourceExt::name_any(&machine);
        owners.patch(&name, &params, &patch).await.unwrap();
    }
    let infra = crate::cluster_controller::clusters(world);
    infra.patch("c1", &params, &patch).await.unwrap();
    let clusters: Api<Cluster> = world.kube.api();
    clusters.patch("c1", &params, &patch).await.unwrap();
}

/// A whole load-balanced cluster moved between shards as docs/sharding.md says (pause, wait
/// for the old shard to say so, relabel, unpause): the old shard writes nothing to it after
/// the relabel; the new one takes it from its status, rolls its control plane under the gate
/// (the API pool never empty, no machine released before its member is ACTIVE), and deletes
/// it, leaving nothing in the cloud.
#[tokio::test]
async fn a_cluster_moved_between_shards_is_let_go_by_one_then_rolled_and_deleted_by_the_other() {
    let capi = capi::crds()
        .iter()
        .map(|crd| serde_json::to_value(crd).unwrap())
        .collect();
    init_test_log();
    let world = World::prepare_sim(capo_sim::openstack::Scenario::default(), capi).await;
    let dir = tempfile::tempdir().unwrap();
    let stop_a = crate::server_controller::start_shard(&world, dir.path(), "a").await;
    let stop_b = crate::server_controller::start_shard(&world, dir.path(), "b").await;
    let baseline = world.cloud.object_counts();
    let clusters = create_owned_cluster(&world).await;
    relabel_cluster(&world, "a").await;
    wait_cluster(&world, "c1", "provisioned by shard a", |c| {
        provisioned(c) && ready(c)
    })
    .await;
    let actor = start_actor(&world);
    let plane = plane(3);
    actor.scale_control_plane(&plane).await.unwrap();

    // The move.
    let pause = |paused: Option<bool>| {
        let clusters = clusters.clone();
        async move {
            let body = json!({"spec": {"paused": paused}});
            clusters
                .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
                .await
                .unwrap();
        }
    };
    pause(Some(true)).await;
    wait_all_paused_reason(&world, reasons::PAUSED).await;
    let relabelled_at = world.kube.simulator().requests().len();
    relabel_cluster(&world, "b").await;
    pause(None).await;
    wait_all_paused_reason(&world, reasons::NOT_PAUSED).await;

    // Shard b rolls the control plane under the gate, then deletes the cluster.
    let stop = CancellationToken::new();
    let (seen, watcher) = watch(&world, stop.clone());
    let report = actor.rollout(&plane, |_| {}).await.unwrap();
    stop.cancel();
    watcher.await.unwrap();
    assert_eq!(report.replaced.len(), 3, "shard b replaced every machine");
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.released_early.is_empty(),
        "released before ACTIVE: {:?}",
        seen.released_early
    );
    assert!(
        seen.min_active >= Some(1),
        "the API pool emptied: {:?}",
        seen.min_active
    );
    delete_everything(&world, &actor, &baseline).await;

    let writes_by =
        |shard| crate::server_controller::shard_writes_since(&world, relabelled_at, shard);
    assert_eq!(writes_by("a"), 0, "the old shard wrote after the move");
    assert!(writes_by("b") > 0, "the new shard took the cluster");
    stop_a.cancel();
    stop_b.cancel();
}

/// On the real Kubernetes tier, with the server to itself: a gated rollout of three while
/// kube-apiserver is gone for 30 s (as the first new machine is created; its watchers resume,
/// or relist on 410 Gone) and etcd is stopped for 20 s (as the second is). The manager's
/// client is production's (rate-limited, no retries inside a call). The rollout completes,
/// the gate never opens early, the cloud holds what it did before (nothing made twice), and
/// deleting the cluster leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_a_rollout_rides_out_the_api_server_gone_30_s_and_etcd_stopped_for_20_s() {
    let Some(real) = crate::kube_world::real_kube() else {
        return;
    };
    init_test_log();
    let crds =
        crate::server_controller::our_crds_and(crate::server_controller::minimal_capi_crds());
    let production = capo_provider::manager::kube_client::connect(
        Some(&real.manager),
        &capo_provider::manager::kube_client::KubeClientOptions::default(),
    )
    .await
    .expect("the manager's client, as production makes it");
    let mut kube = crate::kube_world::KubeWorld::real_alone(real, &crds).await;
    kube.manager_client = production;
    let mut world = World::prepare_on(kube, capo_sim::openstack::Scenario::default()).await;
    world.start_manager_with(config(Strategy::StatusTree, Duration::from_secs(600)));
    let baseline = world.cloud.object_counts();
    create_owned_cluster(&world).await;
    wait_cluster(&world, "c1", "provisioned", |c| provisioned(c) && ready(c)).await;
    // Each member of the rollout takes 20-30 s; a fault may add its own length to that.
    let actor = start_actor_waiting(&world, Duration::from_secs(180));
    let plane = plane(3);
    actor.scale_control_plane(&plane).await.unwrap();
    let before = world.cloud.object_counts();

    let stop = CancellationToken::new();
    let (seen, watcher) = watch(&world, stop.clone());
    let (faults_tx, mut faults_rx) = tokio::sync::mpsc::unbounded_channel();
    let cloud = world.cloud.clone();
    let mut round = 0;
    let rollout = actor.rollout(&plane, move |step| {
        if let RolloutStep::Created { name } = step {
            cloud.add_rule(slow_member(&name, round));
            let _ = faults_tx.send(round);
            round += 1;
        }
    });
    let faults = async {
        while let Some(round) = faults_rx.recv().await {
            match round {
                0 => {
                    crate::kube_world::fault(&world.kube, "stop", "kube-apiserver").await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    crate::kube_world::fault(&world.kube, "start", "kube-apiserver").await;
                }
                1 => {
                    crate::kube_world::fault(&world.kube, "stop", "etcd").await;
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    crate::kube_world::fault(&world.kube, "start", "etcd").await;
                }
                _ => {}
            }
        }
    };
    // The rollout ends first (its closure holds the sender); the faults it started finish
    // after.
    let (report, ()) = tokio::join!(rollout, faults);
    let report = report.expect("the rollout rides out both faults");
    stop.cancel();
    watcher.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(report.replaced.len(), 3, "every machine replaced");
    assert_gate_held(&seen);
    assert_eq!(
        world.cloud.object_counts(),
        before,
        "the cloud holds what it did: nothing made twice"
    );
    eprintln!(
        "FIGURES real-kube faults: rollout of 3 through the API server gone 30 s and etcd down 20 s in {:.1} s; min ACTIVE members {:?} over {} samples",
        report.elapsed.as_secs_f64(),
        seen.min_active,
        seen.samples
    );
    delete_everything(&world, &actor, &baseline).await;
    world.stop_manager().await;
}
