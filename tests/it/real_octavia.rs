//! Our Octavia client and the membership engine against a real Octavia (the real tier,
//! `tests/openstack/up.sh`: Octavia 19 with no-op amphora and compute drivers, behind a real
//! Keystone), and every scenario again against `sim::openstack`, so the simulator is held to what
//! the real service does.
//!
//! The real tier is found as [`crate::real_cloud`] says. Faults are injected with
//! `tests/openstack/fault.sh` (MySQL triggers, SIGSTOP of the worker), so the real tests run one
//! at a time.

use crate::common;
use crate::real_cloud::{PASSWORD_CLOUD, REAL, fault, real_cloud};

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use capo_provider::cloud::neutron::Filter;
use capo_provider::cloud::octavia::{
    HealthMonitorSpec, ListenerSpec, LoadBalancerSpec, MemberSpec, OperatingStatus, PoolSpec,
    ProvisioningStatus,
};
use capo_provider::cloud::{CloudClient, CloudError, CloudOptions, Clouds, Service};
use capo_provider::membership::{Change, Engine, EngineConfig, Reason, ScheduleConfig, Snapshot};
use capo_sim::openstack::{
    CloudSettings, Effect, ObjectKind, OpenStackSim, OpenStackSimConfig, Rule, Scenario, Timings,
};
use futures::FutureExt;
use prometheus::Registry;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Any UUID will do as the VIP subnet in the simulator.
const SIM_VIP_SUBNET: &str = "8f6b1e0a-3c55-4d0e-9a57-2f1f0c6a4b21";

/// The tenant's subnet on the real tier where the tests' VIPs go (up.sh makes it): the VIP's
/// port is real there.
const REAL_VIP_SUBNET_NAME: &str = "capo-rs-lb-tests";

/// How long scenario (a) holds a member PENDING while its LB is ACTIVE.
const HOLD: Duration = Duration::from_secs(20);

/// One place the scenarios run: a real Octavia or the simulator.
#[async_trait]
trait Backend: Send + Sync {
    fn client(&self) -> CloudClient;
    /// The subnet new load balancers take their VIP from.
    fn vip_subnet(&self) -> String;
    /// Members named `prefix*` stay PENDING_CREATE while their LB goes ACTIVE.
    async fn hold_members(&self, prefix: &str);
    /// Held members finish (ACTIVE).
    async fn release_members(&self, prefix: &str);
    /// Members named `prefix*` end in ERROR.
    async fn fail_members(&self, prefix: &str);
    /// Nothing progresses: every object stays PENDING_* (the LB included).
    async fn hold_worker(&self);
    async fn release_worker(&self);
    async fn clear(&self);
    /// A load balancer the scenario made, to be deleted after it whatever happens.
    fn made(&self, _lb: &str) {}
}

// ------------------------------------------------------------------------------ real Octavia

struct RealOctavia {
    client: CloudClient,
    vip_subnet: String,
    clouds_yaml_path: PathBuf,
    /// The load balancers made since the last [`RealOctavia::delete_what_it_made`].
    made: Mutex<Vec<String>>,
    _clouds: Arc<Clouds>,
}

impl RealOctavia {
    /// Runs a scenario alone on the real tier, faults cleared before and after, then deletes
    /// every load balancer it made, pass or fail: each VIP's port holds an address of the
    /// tenant's /24 until its load balancer goes, and the ones scenarios left filled it across
    /// CI runs ("No more IP addresses available on network").
    async fn run(&self, scenario: impl Future<Output = ()>) {
        self.clear().await;
        let outcome = AssertUnwindSafe(tokio::time::timeout(Duration::from_secs(180), scenario))
            .catch_unwind()
            .await;
        self.clear().await;
        self.delete_what_it_made().await;
        match outcome {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(finished) => finished.expect("scenario finished within 3 minutes"),
        }
    }

    /// Deletes (cascade) what [`Backend::made`] recorded and waits until Octavia no longer
    /// has it; one still there after two minutes fails the test.
    async fn delete_what_it_made(&self) {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(PoisonError::into_inner));
        let gone = tokio::time::timeout(Duration::from_secs(120), async {
            for lb in &made {
                until_deleted(&self.client, lb).await;
            }
        });
        assert!(
            gone.await.is_ok(),
            "load balancers a scenario made are still in Octavia 2 minutes after it: {made:?}"
        );
    }
}

/// Deletes a load balancer (cascade) until Octavia says it is gone. A pending one is waited
/// for (Octavia refuses to delete it), and a refused or failed delete is tried again.
async fn until_deleted(client: &CloudClient, lb: &str) {
    let octavia = client.octavia();
    loop {
        match octavia.get_load_balancer(lb).await {
            Err(CloudError::NotFound(_)) => return,
            Ok(read) if read.provisioning_status == ProvisioningStatus::Deleted => return,
            Ok(read) if !read.provisioning_status.is_pending() => {
                let _refused_is_retried = octavia.delete_load_balancer(lb, true).await;
            }
            Ok(_) | Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[async_trait]
impl Backend for RealOctavia {
    fn client(&self) -> CloudClient {
        self.client.clone()
    }
    fn vip_subnet(&self) -> String {
        self.vip_subnet.clone()
    }
    async fn hold_members(&self, prefix: &str) {
        // Until released: the test decides when the member finishes.
        fault(&["member-hold", &format!("{prefix}%"), "3600"]).await;
    }
    async fn release_members(&self, prefix: &str) {
        fault(&["member-release", &format!("{prefix}%")]).await;
    }
    async fn fail_members(&self, prefix: &str) {
        fault(&["member-error", &format!("{prefix}%")]).await;
    }
    async fn hold_worker(&self) {
        fault(&["worker-stop"]).await;
    }
    async fn release_worker(&self) {
        fault(&["worker-cont"]).await;
    }
    async fn clear(&self) {
        fault(&["clear"]).await;
        fault(&["worker-cont"]).await;
    }
    fn made(&self, lb: &str) {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        made.push(lb.to_owned());
    }
}

/// The real tier's Octavia as the tenant sees it (password through Keystone), or `None` (with a
/// notice) when the tier is not running and not required.
async fn real_octavia() -> Option<RealOctavia> {
    let real = real_cloud()?;
    let (client, clouds) = real.client(PASSWORD_CLOUD).await;
    let subnets = client
        .neutron()
        .list_subnets(&Filter::by_name(REAL_VIP_SUBNET_NAME))
        .await
        .expect("list subnets");
    let vip_subnet = subnets
        .first()
        .map(|s| s.id.clone())
        .expect("up.sh made the tenant's subnet capo-rs-lb-tests");
    Some(RealOctavia {
        client,
        vip_subnet,
        clouds_yaml_path: real.clouds_yaml_path,
        made: Mutex::default(),
        _clouds: clouds,
    })
}

/// Runs a scenario on the real stack, alone, with faults cleared before and after.
macro_rules! on_real_octavia {
    ($scenario:ident) => {{
        let _alone = REAL.lock().await;
        let Some(real) = real_octavia().await else {
            return;
        };
        real.run($scenario(&real)).await;
    }};
}

// ------------------------------------------------------------------------------ simulator

struct Simulated {
    sim: OpenStackSim,
    client: CloudClient,
    _clouds: Arc<Clouds>,
}

impl Simulated {
    /// Timings and ordering of the real no-op Octavia's: a member settles (in ~0.3 s) before its
    /// LB unlocks.
    async fn start() -> Simulated {
        let sim = OpenStackSim::start(OpenStackSimConfig {
            // No health manager on the test stack: nothing reports the amphorae healthy.
            settings: CloudSettings {
                heartbeats: false,
                ..CloudSettings::default()
            },
            scenario: Scenario {
                seed: Some(11),
                timings: Timings {
                    lb_waits_for_members: true,
                    ..Timings::default()
                },
                ..Scenario::default()
            },
            ..OpenStackSimConfig::default()
        })
        .await
        .expect("simulator");
        let clouds = Clouds::new(
            CloudOptions::default(),
            &Registry::new(),
            CancellationToken::new(),
        )
        .expect("clouds");
        let client = clouds.client(sim.session());
        Simulated {
            sim,
            client,
            _clouds: clouds,
        }
    }

    fn rule(&self, kind: ObjectKind, name: String, effect: Effect) {
        self.sim.add_rule(Rule {
            kind,
            name,
            effect,
            times: None,
        });
    }
}

#[async_trait]
impl Backend for Simulated {
    fn client(&self) -> CloudClient {
        self.client.clone()
    }
    fn vip_subnet(&self) -> String {
        SIM_VIP_SUBNET.to_owned()
    }
    async fn hold_members(&self, prefix: &str) {
        self.rule(ObjectKind::Member, format!("{prefix}*"), Effect::Stuck);
    }
    async fn release_members(&self, _prefix: &str) {
        self.sim.clear_rules();
    }
    async fn fail_members(&self, prefix: &str) {
        self.rule(ObjectKind::Member, format!("{prefix}*"), Effect::Error);
    }
    async fn hold_worker(&self) {
        self.rule(ObjectKind::Loadbalancer, "*".into(), Effect::Stuck);
        self.rule(ObjectKind::Member, "*".into(), Effect::Stuck);
    }
    async fn release_worker(&self) {
        self.sim.clear_rules();
    }
    async fn clear(&self) {
        self.sim.clear_rules();
    }
}

/// Runs a scenario on the simulator, on tokio's paused clock.
macro_rules! on_simulator {
    ($scenario:ident) => {{
        let simulated = Simulated::start().await;
        tokio::time::timeout(Duration::from_secs(600), $scenario(&simulated))
            .await
            .expect("scenario finished");
    }};
}

// ------------------------------------------------------------------------------ helpers

fn unique(prefix: &str) -> String {
    format!("{prefix}-{:06x}", fastrand::u32(..0xff_ffff))
}

/// Waits until the LB is out of PENDING_* (bounded).
async fn settle(client: &CloudClient, lb: &str) {
    tokio::time::timeout(
        Duration::from_secs(60),
        capo_sim::support::settle(client, lb),
    )
    .await
    .expect("load balancer settles within a minute")
    .expect("load balancer reads");
}

/// An API load balancer as CAPO builds it: LB, TCP listener on 6443, its pool.
async fn api_load_balancer(backend: &dyn Backend, name: &str) -> (String, String) {
    let client = &backend.client();
    let octavia = client.octavia();
    let lb = octavia
        .create_load_balancer(&LoadBalancerSpec {
            name: name.to_owned(),
            vip_subnet_id: Some(backend.vip_subnet()),
            ..Default::default()
        })
        .await
        .expect("create load balancer");
    backend.made(&lb.id);
    assert_eq!(lb.provisioning_status, ProvisioningStatus::PendingCreate);
    settle(client, &lb.id).await;
    let listener = octavia
        .create_listener(&ListenerSpec {
            name: format!("{name}-6443"),
            loadbalancer_id: lb.id.clone(),
            protocol: "TCP".into(),
            protocol_port: 6443,
            ..Default::default()
        })
        .await
        .expect("create listener");
    settle(client, &lb.id).await;
    let pool = octavia
        .create_pool(&PoolSpec {
            name: format!("{name}-6443"),
            protocol: "TCP".into(),
            lb_algorithm: "ROUND_ROBIN".into(),
            listener_id: Some(listener.id),
            ..Default::default()
        })
        .await
        .expect("create pool");
    settle(client, &lb.id).await;
    (lb.id, pool.id)
}

/// Creates a member (no `subnet_id`: the no-op network driver cannot delete those), waiting
/// out a locked LB as a requeueing reconciler would. The real Octavia now and then answers a
/// create with a 500 ("Something unknown went wrong") under CI's load: the member is then
/// looked up by name (the create may have gone through) and created again, twice at most.
async fn create_member(
    client: &CloudClient,
    lb: &str,
    pool: &str,
    name: &str,
    address: &str,
) -> String {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match capo_sim::support::create_member(client, lb, pool, name, address).await {
            Ok(id) => return id,
            Err(CloudError::Transient(error)) if attempts < 3 => {
                eprintln!("create member {name}: {error}; looking for it, then again");
                settle(client, lb).await;
                let made = client
                    .octavia()
                    .list_members(pool)
                    .await
                    .unwrap_or_default();
                if let Some(member) = made.into_iter().find(|m| m.name == name) {
                    return member.id;
                }
            }
            Err(error) => panic!("create member {name}: {error}"),
        }
    }
}

/// A new API load balancer under the engine's watch, for one scenario.
struct Watched {
    client: CloudClient,
    name: String,
    lb: String,
    pool: String,
    engine: Engine,
    changes: capo_provider::membership::Changes,
    registry: Registry,
}

/// An engine polling fast (so scenarios are short), and its registry.
fn fast_engine(stuck_after: Duration) -> (Engine, Registry) {
    let config = EngineConfig {
        stuck_after,
        schedule: ScheduleConfig {
            budget_qps: 50.0,
            burst: 50.0,
            urgent_initial: Duration::from_millis(250),
            urgent_max: Duration::from_secs(1),
            sweep_settled: Duration::from_secs(1),
            sweep_locked: Duration::from_millis(250),
            ..ScheduleConfig::default()
        },
        ..EngineConfig::default()
    };
    let registry = Registry::new();
    let engine = Engine::new(config, &registry, CancellationToken::new()).expect("engine");
    (engine, registry)
}

impl Watched {
    /// The LB and an engine polling fast (so scenarios are short) with `stuck_after`.
    async fn start(backend: &dyn Backend, prefix: &str, stuck_after: Duration) -> Watched {
        let client = backend.client();
        let name = unique(prefix);
        let (lb, pool) = api_load_balancer(backend, &name).await;
        let (engine, registry) = fast_engine(stuck_after);
        let changes = engine.subscribe();
        Watched {
            client,
            name,
            lb,
            pool,
            engine,
            changes,
            registry,
        }
    }

    /// Creates a member named `<LB name>-<suffix>`; returns its name and id.
    async fn add(&self, suffix: &str, address: &str) -> (String, String) {
        let name = format!("{}-{suffix}", self.name);
        let id = create_member(&self.client, &self.lb, &self.pool, &name, address).await;
        (name, id)
    }

    /// Desires exactly these members (name, address, id); returns the generation.
    fn ensure(&self, members: &[(&str, &str, &str)]) -> u64 {
        let members: Vec<(&str, &str, Option<&str>)> = members
            .iter()
            .map(|(name, address, id)| (*name, *address, Some(*id)))
            .collect();
        let desired = common::desired_lb(&self.lb, &self.pool, &members);
        self.engine.ensure(desired, &self.client)
    }

    /// The first verdict for `generation` or later with `reason`. A Ready verdict on the way
    /// to any other reason fails the test: nothing in these scenarios may open the gate early.
    async fn until(&mut self, generation: u64, reason: Reason, within: Duration) -> Snapshot {
        self.until_snapshot(generation, within, |change, _| {
            assert!(
                change.reason == reason || change.reason != Reason::Ready,
                "the gate opened while waiting for {reason:?}"
            );
            change.reason == reason
        })
        .await
    }

    /// The first verdict for `generation` or later whose snapshot satisfies `done`.
    async fn until_snapshot(
        &mut self,
        generation: u64,
        within: Duration,
        done: impl Fn(&Change, &Snapshot) -> bool,
    ) -> Snapshot {
        let deadline = Instant::now() + within;
        loop {
            let change = tokio::time::timeout_at(deadline, common::next_change(&mut self.changes))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no matching verdict within {within:?}; last: {:?}",
                        self.engine
                            .snapshot(&self.lb)
                            .map(|s| s.verdict.message(Instant::now()))
                    )
                })
                .expect("engine publishes changes");
            if change.lb_id != self.lb || change.generation < generation {
                continue;
            }
            if let Some(snapshot) = self.engine.snapshot(&self.lb)
                && done(&change, &snapshot)
            {
                return snapshot;
            }
        }
    }

    async fn member_status(&self, id: &str) -> Option<ProvisioningStatus> {
        member_status(&self.client, &self.pool, id).await
    }

    async fn lb_status(&self) -> ProvisioningStatus {
        self.client
            .octavia()
            .get_load_balancer(&self.lb)
            .await
            .expect("get LB")
            .provisioning_status
    }
}

async fn member_status(client: &CloudClient, pool: &str, id: &str) -> Option<ProvisioningStatus> {
    match client.octavia().get_member(pool, id).await {
        Ok(member) => Some(member.provisioning_status),
        Err(CloudError::NotFound(_)) => None,
        Err(error) => panic!("get member {id}: {error}"),
    }
}

// ------------------------------------------------------------------------------ scenarios

/// The whole lifecycle through our typed calls: LB, listener, pool, member, status tree,
/// deletes confirmed by 404.
async fn lifecycle(backend: &dyn Backend) {
    let client = backend.client();
    let octavia = client.octavia();
    let name = unique("life");
    let (lb, pool) = api_load_balancer(backend, &name).await;
    let loaded = octavia.get_load_balancer(&lb).await.expect("get LB");
    assert_eq!(loaded.name, name);
    assert_eq!(loaded.provisioning_status, ProvisioningStatus::Active);
    let created = octavia
        .create_member(
            &pool,
            &MemberSpec::new(format!("{name}-m0"), "10.0.0.5", 6443),
        )
        .await
        .expect("create member");
    assert_eq!(
        created.provisioning_status,
        ProvisioningStatus::PendingCreate
    );
    settle(&client, &lb).await;
    let member = octavia
        .get_member(&pool, &created.id)
        .await
        .expect("get member");
    assert_eq!(member.provisioning_status, ProvisioningStatus::Active);
    assert_eq!(member.address, "10.0.0.5");
    // Without a health monitor nobody checks the member; without a health manager nobody
    // reports the LB healthy.
    assert_eq!(member.operating_status, OperatingStatus::NoMonitor);
    let listed = octavia.list_members(&pool).await.expect("list members");
    assert_eq!(listed.len(), 1);
    let tree = octavia.status_tree(&lb).await.expect("status tree");
    let tree_members: Vec<_> = tree
        .listeners
        .iter()
        .flat_map(|l| &l.pools)
        .flat_map(|p| &p.members)
        .collect();
    assert_eq!(tree_members.len(), 1);
    assert_eq!(tree_members[0].id, created.id);
    assert_eq!(
        tree_members[0].provisioning_status,
        ProvisioningStatus::Active
    );
    assert_eq!(tree_members[0].operating_status, OperatingStatus::NoMonitor);
    assert_eq!(tree.operating_status, OperatingStatus::Offline);

    octavia
        .delete_member(&pool, &created.id)
        .await
        .expect("delete member");
    settle(&client, &lb).await;
    assert!(matches!(
        octavia.get_member(&pool, &created.id).await,
        Err(CloudError::NotFound(_))
    ));
    octavia
        .delete_load_balancer(&lb, true)
        .await
        .expect("cascade delete");
    let gone = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match octavia.get_load_balancer(&lb).await {
                Err(CloudError::NotFound(_)) => return,
                Ok(lb) if lb.provisioning_status == ProvisioningStatus::Deleted => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                Err(error) => panic!("get deleted LB: {error}"),
            }
        }
    });
    gone.await.expect("the LB goes away");
}

/// A raw PUT of `body` to `lbaas/{path}`: its status (to see what Octavia refuses).
async fn raw_put(client: &CloudClient, path: &str, body: serde_json::Value) -> u16 {
    let session = client.path().session();
    let base = session
        .service_url(Service::LoadBalancer)
        .await
        .expect("Octavia's URL");
    let url = base.join(&format!("lbaas/{path}")).expect("URL");
    let request = http::Request::put(url.as_str())
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("JSON"))
        .expect("request");
    session
        .send(request)
        .await
        .expect("answers")
        .status()
        .as_u16()
}

/// (s) What the serving gate relies on: an HTTPS `/readyz` monitor is accepted; its type
/// cannot change in place, its request can; a member's weight goes to 0 and back; and with no
/// health manager (the real tier, the simulator without heartbeats) a member created before
/// the monitor keeps NO_MONITOR, one created under it reads OFFLINE, and the monitor's deletion
/// turns both NO_MONITOR.
async fn serving_knobs(backend: &dyn Backend) {
    let client = backend.client();
    let octavia = client.octavia();
    let name = unique("serve");
    let (lb, pool) = api_load_balancer(backend, &name).await;
    let before = create_member(&client, &lb, &pool, &format!("{name}-before"), "10.0.0.7").await;
    settle(&client, &lb).await;
    let monitor = octavia
        .create_health_monitor(&HealthMonitorSpec {
            name: name.clone(),
            pool_id: pool.clone(),
            kind: "HTTPS".into(),
            delay: 10,
            timeout: 5,
            max_retries: 5,
            max_retries_down: Some(3),
            http_method: Some("GET".into()),
            url_path: Some("/readyz".into()),
            expected_codes: Some("200".into()),
            tags: Vec::new(),
        })
        .await
        .expect("an HTTPS monitor is accepted");
    assert_eq!(monitor.kind, "HTTPS");
    settle(&client, &lb).await;
    let after = create_member(&client, &lb, &pool, &format!("{name}-after"), "10.0.0.8").await;
    settle(&client, &lb).await;
    let operating = async |id: &str| {
        octavia
            .get_member(&pool, id)
            .await
            .expect("get member")
            .operating_status
    };
    assert_eq!(operating(&before).await, OperatingStatus::NoMonitor);
    assert_eq!(operating(&after).await, OperatingStatus::Offline);
    let path = format!("healthmonitors/{}", monitor.id);
    let retype = serde_json::json!({"healthmonitor": {"type": "TCP"}});
    assert_eq!(raw_put(&client, &path, retype).await, 400, "type is fixed");
    let mut livez = HealthMonitorSpec {
        url_path: Some("/livez".into()),
        ..HealthMonitorSpec::default()
    };
    (livez.delay, livez.timeout, livez.max_retries) = (10, 5, 5);
    livez.max_retries_down = Some(3);
    let changed = octavia
        .update_health_monitor(&monitor.id, &livez)
        .await
        .expect("the path changes in place");
    assert_eq!(changed.url_path.as_deref(), Some("/livez"));
    settle(&client, &lb).await;
    let drained = octavia
        .set_member_weight(&pool, &after, 0)
        .await
        .expect("weight 0");
    assert_eq!(drained.weight, Some(0));
    settle(&client, &lb).await;
    octavia
        .delete_health_monitor(&monitor.id)
        .await
        .expect("delete the monitor");
    settle(&client, &lb).await;
    assert_eq!(operating(&before).await, OperatingStatus::NoMonitor);
    assert_eq!(operating(&after).await, OperatingStatus::NoMonitor);
    octavia
        .delete_load_balancer(&lb, true)
        .await
        .expect("cascade delete");
}

/// A change while the LB is locked is refused with 409, which we map to `Busy` (retry later).
async fn locked_lb_is_busy(backend: &dyn Backend) {
    let client = backend.client();
    let name = unique("busy");
    let (lb, pool) = api_load_balancer(backend, &name).await;
    backend.hold_worker().await;
    let first = create_member(&client, &lb, &pool, &format!("{name}-m0"), "10.0.0.5").await;
    let second = client
        .octavia()
        .create_member(
            &pool,
            &MemberSpec::new(format!("{name}-m1"), "10.0.0.6", 6443),
        )
        .await;
    match second {
        Err(CloudError::Busy(e)) => assert!(e.message.contains("immutable"), "{e:?}"),
        other => panic!("a member create on a locked LB must be Busy, got {other:?}"),
    }
    let delete = client.octavia().delete_member(&pool, &first).await;
    assert!(matches!(delete, Err(CloudError::Busy(_))), "{delete:?}");
    backend.release_worker().await;
    settle(&client, &lb).await;
    assert_eq!(
        member_status(&client, &pool, &first).await,
        Some(ProvisioningStatus::Active)
    );
}

/// Both 404 shapes Octavia answers with are `NotFound`.
async fn not_found_shapes(backend: &dyn Backend) {
    let client = backend.client();
    let octavia = client.octavia();
    let missing = "00000000-0000-0000-0000-000000000000";
    let name = unique("nf");
    let (lb, pool) = api_load_balancer(backend, &name).await;
    // `{"faultcode": ..., "faultstring": "Member ... not found."}`
    match octavia.get_member(&pool, missing).await {
        Err(CloudError::NotFound(e)) => assert!(e.message.contains("not found"), "{e:?}"),
        other => panic!("missing member: {other:?}"),
    }
    // `{"code": 404, "title": ..., "description": "Pool ... not found."}`
    match octavia.list_members(missing).await {
        Err(CloudError::NotFound(e)) => assert!(e.message.contains("not found"), "{e:?}"),
        other => panic!("members of a missing pool: {other:?}"),
    }
    match octavia.status_tree(missing).await {
        Err(CloudError::NotFound(_)) => {}
        other => panic!("status tree of a missing LB: {other:?}"),
    }
    octavia
        .delete_load_balancer(&lb, true)
        .await
        .expect("cleanup");
}

/// The cluster controller lists its LB's listeners and pools by `loadbalancer_id`: another
/// cluster's are not in the answer (at 1,000 clusters, all of them were).
async fn children_are_listed_by_their_load_balancer(backend: &dyn Backend) {
    let client = backend.client();
    let octavia = client.octavia();
    let (mine, other) = (unique("by-lb-a"), unique("by-lb-b"));
    let (lb, _) = api_load_balancer(backend, &mine).await;
    let (other_lb, _) = api_load_balancer(backend, &other).await;
    let listeners = octavia.list_listeners(&lb, None).await.expect("listeners");
    let pools = octavia.list_pools(&lb, None).await.expect("pools");
    let listeners: Vec<String> = listeners.into_iter().map(|l| l.name).collect();
    let pools: Vec<String> = pools.into_iter().map(|p| p.name).collect();
    assert_eq!(listeners, vec![format!("{mine}-6443")]);
    assert_eq!(pools, vec![format!("{mine}-6443")]);
    for lb in [lb, other_lb] {
        octavia
            .delete_load_balancer(&lb, true)
            .await
            .expect("cleanup");
    }
}

/// The cluster controller makes its LB whole in one request (a fully populated create):
/// the listener, its pool and the pool's monitor are made with it, PENDING_CREATE, and are
/// ACTIVE, tagged and linked once it settles. A monitor the provider cannot make refuses the
/// whole request and leaves nothing behind (the simulator's provider without monitors; the
/// real tier's amphora makes them all).
async fn made_whole_in_one_request(backend: &dyn Backend) {
    let client = backend.client();
    let octavia = client.octavia();
    let name = unique("whole");
    let child = format!("{name}-6443");
    let tags = vec!["capo-rs-whole".to_owned()];
    let monitor = HealthMonitorSpec {
        name: child.clone(),
        kind: "TCP".into(),
        delay: 10,
        timeout: 5,
        max_retries: 5,
        max_retries_down: Some(3),
        ..Default::default()
    };
    let listener = ListenerSpec {
        name: child.clone(),
        protocol: "TCP".into(),
        protocol_port: 6443,
        allowed_cidrs: Some(vec!["10.6.0.0/24".into()]),
        tags: tags.clone(),
        default_pool: Some(PoolSpec {
            name: child.clone(),
            protocol: "TCP".into(),
            lb_algorithm: "ROUND_ROBIN".into(),
            tags: tags.clone(),
            healthmonitor: Some(monitor),
            ..Default::default()
        }),
        ..Default::default()
    };
    let lb = octavia
        .create_load_balancer(&LoadBalancerSpec {
            name: name.clone(),
            vip_subnet_id: Some(backend.vip_subnet()),
            tags: tags.clone(),
            listeners: vec![listener],
            ..Default::default()
        })
        .await
        .expect("a load balancer with its listener, pool and monitor");
    backend.made(&lb.id);
    assert_eq!(lb.provisioning_status, ProvisioningStatus::PendingCreate);
    assert_eq!(lb.listeners.len(), 1, "{lb:?}");
    assert_eq!(lb.pools.len(), 1, "{lb:?}");
    settle(&client, &lb.id).await;
    let listeners = octavia
        .list_listeners(&lb.id, None)
        .await
        .expect("listeners");
    let pools = octavia.list_pools(&lb.id, None).await.expect("pools");
    let ([listener], [pool]) = (listeners.as_slice(), pools.as_slice()) else {
        panic!("one listener and one pool: {listeners:?} {pools:?}");
    };
    assert_eq!(
        (
            listener.name.as_str(),
            listener.protocol_port,
            &listener.tags
        ),
        (child.as_str(), 6443, &tags)
    );
    assert_eq!(
        listener.allowed_cidrs.as_deref(),
        Some(&["10.6.0.0/24".to_owned()][..])
    );
    assert_eq!(listener.default_pool_id.as_deref(), Some(pool.id.as_str()));
    assert_eq!((pool.name.as_str(), &pool.tags), (child.as_str(), &tags));
    for status in [listener.provisioning_status, pool.provisioning_status] {
        assert_eq!(status, ProvisioningStatus::Active);
    }
    let monitor_id = pool.healthmonitor_id.clone().expect("the pool's monitor");
    let monitor = octavia
        .get_health_monitor(&monitor_id)
        .await
        .expect("the monitor");
    assert_eq!(
        (
            monitor.name.as_str(),
            monitor.kind.as_str(),
            monitor.provisioning_status
        ),
        (child.as_str(), "TCP", ProvisioningStatus::Active)
    );
    octavia
        .delete_load_balancer(&lb.id, true)
        .await
        .expect("cleanup");
}

/// What the cluster controller reads before making a load balancer with a provider or a
/// flavor: the providers (named) and the flavors (named, enabled or not).
async fn providers_and_flavors_are_listed(backend: &dyn Backend) {
    let client = backend.client();
    let providers = client.octavia().list_providers().await.expect("providers");
    assert!(!providers.is_empty(), "Octavia offers a provider");
    assert!(
        providers.iter().all(|p| !p.name.is_empty()),
        "{providers:?}"
    );
    let flavors = client.octavia().list_flavors(None).await.expect("flavors");
    assert!(
        flavors
            .iter()
            .all(|f| !f.name.is_empty() && !f.id.is_empty()),
        "{flavors:?}"
    );
}

/// (a) A member held PENDING_CREATE while its LB reads ACTIVE: the gate is never Ready until
/// the member is ACTIVE.
async fn held_member_is_never_ready(backend: &dyn Backend) {
    let mut w = Watched::start(backend, "held", Duration::from_secs(600)).await;
    backend.hold_members(&format!("{}-m0", w.name)).await;
    let (member, id) = w.add("m0", "10.0.1.5").await;
    let generation = w.ensure(&[(&member, "10.0.1.5", &id)]);
    // The premise: the LB settles to ACTIVE while the member stays PENDING_CREATE.
    settle(&w.client, &w.lb).await;
    assert_eq!(
        w.member_status(&id).await,
        Some(ProvisioningStatus::PendingCreate)
    );
    let held_until = Instant::now() + HOLD;
    let pending = w
        .until(generation, Reason::MembersPending, Duration::from_secs(30))
        .await;
    assert!(pending.verdict.message(Instant::now()).contains(&member));
    // Nothing may open the gate while the hold lasts. The inner wait's own bound is later
    // than the hold's end: two deadlines in the same timer tick let the inner one panic first.
    let waiting_for_ready = w.until(generation, Reason::Ready, HOLD + Duration::from_secs(10));
    let early = tokio::time::timeout_at(held_until, waiting_for_ready).await;
    assert!(early.is_err(), "Ready over a held member");
    assert_eq!(
        w.engine.snapshot(&w.lb).map(|s| s.verdict.reason),
        Some(Reason::MembersPending)
    );
    assert_eq!(w.lb_status().await, ProvisioningStatus::Active);
    backend.release_members(&member).await;
    w.until(generation, Reason::Ready, Duration::from_secs(30))
        .await;
    assert_eq!(
        w.member_status(&id).await,
        Some(ProvisioningStatus::Active),
        "Ready only once the member is ACTIVE"
    );
}

/// (b) A member that goes ERROR gives MemberError, naming it.
async fn failed_member_is_member_error(backend: &dyn Backend) {
    let mut w = Watched::start(backend, "err", Duration::from_secs(600)).await;
    backend.fail_members(&format!("{}-m0", w.name)).await;
    let (member, id) = w.add("m0", "10.0.2.5").await;
    let generation = w.ensure(&[(&member, "10.0.2.5", &id)]);
    let snapshot = w
        .until(generation, Reason::MemberError, Duration::from_secs(30))
        .await;
    assert!(snapshot.verdict.message(Instant::now()).contains(&member));
    assert_eq!(w.member_status(&id).await, Some(ProvisioningStatus::Error));
    settle(&w.client, &w.lb).await;
    assert_eq!(
        w.lb_status().await,
        ProvisioningStatus::Active,
        "the LB unlocks after a member fails"
    );
}

/// (c) With the worker held, a new member outstays a short stuck-after: MemberStuck; once the
/// worker runs again it recovers to Ready.
async fn held_worker_is_stuck(backend: &dyn Backend) {
    let mut w = Watched::start(backend, "stuck", Duration::from_secs(3)).await;
    backend.hold_worker().await;
    let (member, id) = w.add("m0", "10.0.3.5").await;
    let requested = Instant::now();
    let generation = w.ensure(&[(&member, "10.0.3.5", &id)]);
    assert_eq!(w.lb_status().await, ProvisioningStatus::PendingUpdate);
    let snapshot = w
        .until(generation, Reason::MemberStuck, Duration::from_secs(30))
        .await;
    let flagged_after = requested.elapsed();
    assert!(
        flagged_after >= Duration::from_secs(3) && flagged_after < Duration::from_secs(9),
        "stuck flagged after {flagged_after:?} (stuck-after 3 s)"
    );
    assert!(snapshot.verdict.message(Instant::now()).contains(&member));
    backend.release_worker().await;
    w.until(generation, Reason::Ready, Duration::from_secs(60))
        .await;
    assert_eq!(w.member_status(&id).await, Some(ProvisioningStatus::Active));
}

/// (d) A removed member stays reported (stale) until the cloud says it is gone: the engine
/// confirms removal only once the member answers 404.
async fn removal_confirmed_after_404(backend: &dyn Backend) {
    let mut w = Watched::start(backend, "rm", Duration::from_secs(600)).await;
    let (keep, keep_id) = w.add("keep", "10.0.4.5").await;
    let (leave, leave_id) = w.add("leave", "10.0.4.6").await;
    settle(&w.client, &w.lb).await;
    let both = [
        (keep.as_str(), "10.0.4.5", keep_id.as_str()),
        (leave.as_str(), "10.0.4.6", leave_id.as_str()),
    ];
    let generation = w.ensure(&both);
    w.until(generation, Reason::Ready, Duration::from_secs(30))
        .await;

    backend.hold_worker().await;
    w.client
        .octavia()
        .delete_member(&w.pool, &leave_id)
        .await
        .expect("delete member");
    let generation = w.ensure(&both[..1]);
    let reported = w
        .until_snapshot(generation, Duration::from_secs(30), |_, snapshot| {
            !snapshot.verdict.stale.is_empty()
        })
        .await;
    assert!(
        reported.verdict.stale[0].contains(&leave),
        "{:?}",
        reported.verdict.stale
    );
    assert_eq!(
        w.member_status(&leave_id).await,
        Some(ProvisioningStatus::PendingDelete)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        w.engine
            .snapshot(&w.lb)
            .is_some_and(|s| !s.verdict.stale.is_empty()),
        "still reported while PENDING_DELETE"
    );
    backend.release_worker().await;
    w.until_snapshot(generation, Duration::from_secs(60), |_, snapshot| {
        snapshot.verdict.stale.is_empty()
    })
    .await;
    assert_eq!(
        w.member_status(&leave_id).await,
        None,
        "removal confirmed only once the member is 404"
    );
}

/// Rows of the LB list as the session sends them, undecoded (to see what `fields` keeps).
async fn raw_list(client: &CloudClient, query: &str) -> serde_json::Value {
    let session = client.path().session();
    let base = session
        .service_url(Service::LoadBalancer)
        .await
        .expect("Octavia's URL");
    let url = base
        .join(&format!("lbaas/loadbalancers?{query}"))
        .expect("list URL");
    let request = http::Request::get(url.as_str())
        .body(Vec::new())
        .expect("request");
    let response = session.send(request).await.expect("list answers");
    assert_eq!(response.status(), 200);
    serde_json::from_slice(response.body()).expect("list is JSON")
}

/// Octavia stamps `updated_at` to the second: a write in the same second as the last one would
/// leave it as it was, so the scenario lets that second end before the next write.
async fn next_second() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

/// (e) The LB list the engine's sweep reads: `fields` (repeated) trims each row to what was
/// asked; the lock shows while a member change is in flight; `updated_at` moves after a member
/// create and after a delete; a member that finishes after its LB unlocked, or whose operating
/// status alone changes, leaves the row as it was (only a status tree shows those).
async fn lb_list_shows_what_changed(backend: &dyn Backend) {
    let client = backend.client();
    let name = unique("list");
    let (lb, pool) = api_load_balancer(backend, &name).await;
    let row = || async {
        let rows = client
            .octavia()
            .list_load_balancer_rows()
            .await
            .expect("list rows");
        rows.into_iter()
            .find(|row| row.id == lb)
            .expect("the LB is listed")
    };
    let trimmed = raw_list(
        &client,
        &format!("id={lb}&fields=id&fields=provisioning_status&fields=updated_at"),
    )
    .await;
    let keys: Vec<&String> = trimmed["loadbalancers"][0]
        .as_object()
        .expect("a row")
        .keys()
        .collect();
    assert_eq!(keys.len(), 3, "fields keeps only what it names: {keys:?}");
    let comma = raw_list(&client, &format!("id={lb}&fields=id,updated_at")).await;
    assert_eq!(comma["loadbalancers"][0], serde_json::json!({}));

    let settled = row().await;
    assert_eq!(settled.provisioning_status, ProvisioningStatus::Active);
    next_second().await;
    backend.hold_worker().await;
    let first = client
        .octavia()
        .create_member(
            &pool,
            &MemberSpec::new(format!("{name}-m0"), "10.0.5.5", 6443),
        )
        .await
        .expect("create member");
    let locked = row().await;
    assert_eq!(
        locked.provisioning_status,
        ProvisioningStatus::PendingUpdate
    );
    backend.release_worker().await;
    settle(&client, &lb).await;
    let created = row().await;
    assert_eq!(created.provisioning_status, ProvisioningStatus::Active);
    assert!(
        created.updated_at > settled.updated_at,
        "{created:?} after {settled:?}"
    );

    next_second().await;
    let held = format!("{name}-m1");
    backend.hold_members(&held).await;
    let second = create_member(&client, &lb, &pool, &held, "10.0.5.6").await;
    settle(&client, &lb).await;
    assert_eq!(
        member_status(&client, &pool, &second).await,
        Some(ProvisioningStatus::PendingCreate)
    );
    let unlocked = row().await;
    next_second().await;
    backend.release_members(&held).await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while member_status(&client, &pool, &second).await != Some(ProvisioningStatus::Active) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the held member finishes once released");
    assert_eq!(row().await, unlocked, "the list cannot see the late member");

    next_second().await;
    client
        .octavia()
        .delete_member(&pool, &first.id)
        .await
        .expect("delete member");
    settle(&client, &lb).await;
    let deleted = row().await;
    assert!(
        deleted.updated_at > unlocked.updated_at,
        "{deleted:?} after {unlocked:?}"
    );
}

/// The engine's polls of these kinds so far (`capo_lb_polls_total`, any result).
fn polls(registry: &Registry, kinds: &[&str]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == "capo_lb_polls_total")
        .flat_map(|family| family.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "kind" && kinds.contains(&l.value()))
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// Waits (bounded) until the engine's verdict on `lb` has `reason`.
async fn until_reason(engine: &Engine, lb: &str, reason: Reason, within: Duration) {
    tokio::time::timeout(within, async {
        while engine.snapshot(lb).map(|s| s.verdict.reason) != Some(reason) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{lb} did not turn {reason:?} within {within:?}"));
}

/// (f) The engine's list sweep on real rows: two settled LBs under one identity cost lists,
/// not trees; a member deleted behind the engine's back moves its LB's row, and one sweep
/// later a tree shows it missing.
async fn list_sees_drift(backend: &dyn Backend) {
    let mut w = Watched::start(backend, "sweep", Duration::from_secs(600)).await;
    let (a, a_id) = w.add("m0", "10.0.6.5").await;
    let other = format!("{}-b", w.name);
    let (lb_b, pool_b) = api_load_balancer(backend, &other).await;
    let b = format!("{other}-m0");
    let b_id = create_member(&w.client, &lb_b, &pool_b, &b, "10.0.6.6").await;
    settle(&w.client, &w.lb).await;
    settle(&w.client, &lb_b).await;
    let generation = w.ensure(&[(&a, "10.0.6.5", &a_id)]);
    w.until(generation, Reason::Ready, Duration::from_secs(30))
        .await;
    let desired_b = common::desired_lb(&lb_b, &pool_b, &[(&b, "10.0.6.6", Some(&b_id))]);
    w.engine.ensure(desired_b, &w.client);
    until_reason(&w.engine, &lb_b, Reason::Ready, Duration::from_secs(30)).await;

    let trees = polls(&w.registry, &["urgent", "drift"]);
    let lists = polls(&w.registry, &["list"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        polls(&w.registry, &["list"]) - lists >= 3.0,
        "a list every second"
    );
    assert_eq!(
        polls(&w.registry, &["urgent", "drift"]),
        trees,
        "settled LBs need no trees while their rows stay"
    );
    w.client
        .octavia()
        .delete_member(&pool_b, &b_id)
        .await
        .expect("delete member");
    until_reason(
        &w.engine,
        &lb_b,
        Reason::MembersMissing,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        w.engine.snapshot(&w.lb).map(|s| s.verdict.reason),
        Some(Reason::Ready),
        "the other LB is untouched"
    );
}

/// (g) A restart on real rows: once a list has vouched for two settled LBs' members, a new
/// engine given them (what their clusters keep) trusts the LB whose row is unchanged without a
/// tree, and reads the one whose member was deleted while it was down.
async fn restart_trusts_unchanged_rows(backend: &dyn Backend) {
    let w = Watched::start(backend, "recall", Duration::from_secs(600)).await;
    let (a, a_id) = w.add("m0", "10.0.7.5").await;
    let other = format!("{}-b", w.name);
    let (lb_b, pool_b) = api_load_balancer(backend, &other).await;
    let b = format!("{other}-m0");
    let b_id = create_member(&w.client, &lb_b, &pool_b, &b, "10.0.7.6").await;
    settle(&w.client, &w.lb).await;
    settle(&w.client, &lb_b).await;
    let desired = [
        common::desired_lb(&w.lb, &w.pool, &[(&a, "10.0.7.5", Some(&a_id))]),
        common::desired_lb(&lb_b, &pool_b, &[(&b, "10.0.7.6", Some(&b_id))]),
    ];
    for wanted in &desired {
        w.engine.ensure(wanted.clone(), &w.client);
        until_reason(
            &w.engine,
            &wanted.lb_id,
            Reason::Ready,
            Duration::from_secs(30),
        )
        .await;
    }
    // A tree read a second after the list first showed each row can be vouched for.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut recalled = Vec::new();
    for wanted in &desired {
        w.engine.changed_under(&wanted.lb_id);
        let vouched = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(kept) = w.engine.snapshot(&wanted.lb_id).and_then(|s| s.recalled()) {
                    return kept;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        recalled.push(vouched.expect("a list vouched for the LB's members"));
    }
    w.engine.shutdown().await;
    // While it is down, b loses its member (its row moves).
    w.client
        .octavia()
        .delete_member(&pool_b, &b_id)
        .await
        .expect("delete member");
    settle(&w.client, &lb_b).await;

    let (engine, registry) = fast_engine(Duration::from_secs(600));
    for (wanted, kept) in desired.iter().zip(recalled) {
        engine.ensure_recalled(wanted.clone(), &w.client, Some(kept));
    }
    until_reason(&engine, &w.lb, Reason::Ready, Duration::from_secs(10)).await;
    until_reason(
        &engine,
        &lb_b,
        Reason::MembersMissing,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        polls(&registry, &["urgent", "drift"]),
        1.0,
        "one tree, for the LB that changed"
    );
    engine.shutdown().await;
}

// ------------------------------------------------------------------------------ the tests

macro_rules! both {
    ($scenario:ident, $real:ident, $sim:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $real() {
            on_real_octavia!($scenario);
        }

        #[tokio::test(start_paused = true)]
        async fn $sim() {
            on_simulator!($scenario);
        }
    };
}

both!(
    lifecycle,
    real_lifecycle_through_typed_calls,
    sim_lifecycle_through_typed_calls
);
both!(
    children_are_listed_by_their_load_balancer,
    real_children_are_listed_by_their_load_balancer,
    sim_children_are_listed_by_their_load_balancer
);
both!(
    made_whole_in_one_request,
    real_a_load_balancer_is_made_whole_in_one_request,
    sim_a_load_balancer_is_made_whole_in_one_request
);
both!(
    providers_and_flavors_are_listed,
    real_providers_and_flavors_are_listed,
    sim_providers_and_flavors_are_listed
);
both!(
    locked_lb_is_busy,
    real_locked_lb_is_busy,
    sim_locked_lb_is_busy
);
both!(
    not_found_shapes,
    real_both_404_shapes_are_not_found,
    sim_both_404_shapes_are_not_found
);
both!(
    held_member_is_never_ready,
    real_held_member_is_never_ready,
    sim_held_member_is_never_ready
);
both!(
    failed_member_is_member_error,
    real_failed_member_is_member_error,
    sim_failed_member_is_member_error
);
both!(
    held_worker_is_stuck,
    real_held_worker_is_stuck,
    sim_held_worker_is_stuck
);
both!(
    lb_list_shows_what_changed,
    real_lb_list_shows_what_changed,
    sim_lb_list_shows_what_changed
);
both!(list_sees_drift, real_list_sees_drift, sim_list_sees_drift);
both!(
    restart_trusts_unchanged_rows,
    real_restart_trusts_unchanged_rows,
    sim_restart_trusts_unchanged_rows
);
both!(
    serving_knobs,
    real_serving_knobs_monitor_weight_and_unreported_status,
    sim_serving_knobs_monitor_weight_and_unreported_status
);
both!(
    removal_confirmed_after_404,
    real_removal_confirmed_after_404,
    sim_removal_confirmed_after_404
);

/// `capo-rs watch-lb` against the real Octavia: exits 0 once a new member is ACTIVE, 3 when
/// one goes ERROR, 2 when one outstays the stuck threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_watch_lb() {
    let _alone = REAL.lock().await;
    let Some(real) = real_octavia().await else {
        return;
    };
    real.run(watch_lb_exits(&real)).await;
}

async fn watch_lb_exits(real: &RealOctavia) {
    let clouds_yaml = real.clouds_yaml_path.to_string_lossy().into_owned();
    let client = real.client();
    let name = unique("watch");
    let (lb, pool) = api_load_balancer(real, &name).await;
    let good = format!("{name}-good");
    real.hold_members(&good).await;
    create_member(&client, &lb, &pool, &good, "10.0.5.5").await;
    let watch = |lb: &str, until_ready: bool, stuck_after: &str| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_capo-rs"));
        command.args([
            "watch-lb",
            "--clouds-yaml",
            &clouds_yaml,
            "--cloud",
            PASSWORD_CLOUD,
            "--member-stuck-after",
            stuck_after,
        ]);
        if until_ready {
            command.arg("--until-ready");
        }
        command.arg(lb).kill_on_drop(true);
        command
    };
    // Release the held member once watch-lb has reported it pending.
    let mut child = watch(&lb, true, "60")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("watch-lb runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut stdout = String::new();
    let mut released = false;
    while let Some(line) = lines.next_line().await.expect("read watch-lb output") {
        if !released && line.contains("-> Pending") {
            real.release_members(&good).await;
            released = true;
        }
        stdout.push_str(&line);
        stdout.push('\n');
    }
    let status = child.wait().await.expect("watch-lb exits");
    assert!(
        released,
        "watch-lb never reported the held member pending: {stdout}"
    );
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("gate Ready"), "{stdout}");

    let bad = format!("{name}-bad");
    real.fail_members(&bad).await;
    create_member(&client, &lb, &pool, &bad, "10.0.5.6").await;
    let output = tokio::time::timeout(Duration::from_secs(60), watch(&lb, false, "60").output())
        .await
        .expect("watch-lb exits")
        .expect("watch-lb runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains(&bad));

    let (held_lb, held_pool) = api_load_balancer(real, &format!("{name}-held")).await;
    real.hold_worker().await;
    let stuck = format!("{name}-stuck");
    create_member(&client, &held_lb, &held_pool, &stuck, "10.0.5.7").await;
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        watch(&held_lb, false, "2").output(),
    )
    .await;
    real.clear().await;
    let output = output.expect("watch-lb exits").expect("watch-lb runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains(&stuck));
}
