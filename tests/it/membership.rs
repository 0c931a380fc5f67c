//! The membership engine against the simulated cloud, in-process on tokio's paused clock.

use crate::common;

use std::time::Duration;

use capo_bench::Strategy;
use capo_provider::cloud::octavia::MemberSpec;
use capo_provider::cloud::{CloudClient, CloudOptions, Clouds};
use capo_provider::membership::{
    Changes, DesiredLb, Engine, EngineConfig, EngineError, Notice, ObjectName, Observer, OwnerKind,
    Reason, Recalled, Seen, StatusTreeObserver,
};
use capo_sim::openstack::{
    Delay, Effect, ObjectKind, OpenStackSim, OpenStackSimConfig, RateLimitFault, Rule, Scenario,
    Timings,
};
use prometheus::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn scenario(rules: Vec<Rule>) -> Scenario {
    Scenario {
        seed: Some(7),
        timings: Timings {
            lb_create: Delay::Fixed(0.5),
            lb_update: Delay::Fixed(0.3),
            child_create: Delay::Fixed(0.3),
            member_create: Delay::Fixed(5.0),
            member_delete: Delay::Fixed(2.0),
            ..Timings::default()
        },
        rules,
        ..Scenario::default()
    }
}

struct Setup {
    sim: OpenStackSim,
    client: CloudClient,
    engine: Engine,
    changes: Changes,
    lb: String,
    pool: String,
    registry: Registry,
}

async fn setup(rules: Vec<Rule>, strategy: Strategy) -> Setup {
    let sim = OpenStackSim::start(OpenStackSimConfig {
        scenario: scenario(rules),
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap();
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let client = clouds.client(sim.session());
    let (lb, pool) = capo_sim::support::api_load_balancer(&client, "c1-kubeapi")
        .await
        .unwrap();
    let config = EngineConfig {
        stuck_after: Duration::from_secs(60),
        schedule: strategy.schedule(EngineConfig::default().schedule),
        ..EngineConfig::default()
    };
    let engine = Engine::with_observer(
        config,
        strategy.observer(),
        &registry,
        CancellationToken::new(),
    )
    .unwrap();
    let changes = engine.subscribe();
    Setup {
        sim,
        client,
        engine,
        changes,
        lb,
        pool,
        registry,
    }
}

/// Waits (in virtual time, bounded) until the load balancer is out of PENDING_*.
async fn settle(client: &CloudClient, lb: &str) {
    tokio::time::timeout(
        Duration::from_secs(600),
        capo_sim::support::settle(client, lb),
    )
    .await
    .unwrap_or_else(|_| panic!("load balancer {lb} stayed pending"))
    .unwrap();
}

fn desired(setup: &Setup, members: &[(&str, &str, Option<String>)]) -> DesiredLb {
    let members: Vec<(&str, &str, Option<&str>)> = members
        .iter()
        .map(|(name, address, id)| (*name, *address, id.as_deref()))
        .collect();
    common::desired_lb(&setup.lb, &setup.pool, &members)
}

async fn add_member(setup: &Setup, name: &str, address: &str) -> String {
    settle(&setup.client, &setup.lb).await;
    let spec = MemberSpec::new(name, address, 6443);
    setup
        .client
        .octavia()
        .create_member(&setup.pool, &spec)
        .await
        .unwrap()
        .id
}

/// The next change with this reason (within an hour of virtual time).
async fn wait_for(setup: &mut Setup, reason: Reason) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let change = tokio::time::timeout_at(deadline, common::next_change(&mut setup.changes))
            .await
            .expect("no change in time")
            .unwrap();
        if change.reason == reason {
            return Instant::now();
        }
    }
}

/// Ground truth: is every desired address ACTIVE in the simulated pool?
fn truly_ready(setup: &Setup, addresses: &[&str]) -> bool {
    let truth = setup.sim.member_truth();
    addresses.iter().all(|a| {
        truth.iter().any(|m| {
            m.address == *a && m.pool_id == setup.pool && m.provisioning_status == "ACTIVE"
        })
    })
}

#[tokio::test(start_paused = true)]
async fn an_active_lb_with_a_pending_member_is_never_ready() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    let first = tokio::time::timeout(Duration::from_secs(5), common::next_change(&mut s.changes))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(first.reason, Reason::Ready);
    // The LB is ACTIVE again long before the member (5 s): still not ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let snapshot = s.engine.snapshot(&s.lb).unwrap();
    assert_eq!(
        snapshot.verdict.reason,
        Reason::MembersPending,
        "{snapshot:?}"
    );
    let ready_at = wait_for(&mut s, Reason::Ready).await;
    assert!(truly_ready(&s, &["10.0.0.1"]));
    let settled = s.sim.member_truth()[0].settled_at.unwrap();
    let lag = ready_at - settled;
    assert!(
        lag <= Duration::from_secs(2),
        "detected {lag:?} after the member became ACTIVE"
    );
    // The change names the cluster and the machine, each with its kind.
    let wakes: Vec<(OwnerKind, ObjectName)> = first
        .wakes()
        .map(|(kind, name)| (kind, name.clone()))
        .collect();
    assert_eq!(
        wakes,
        [
            (
                OwnerKind::OpenStackCluster,
                ObjectName::new("default", "c1")
            ),
            (
                OwnerKind::OpenStackMachine,
                ObjectName::new("default", "cp-1")
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn lb_only_is_ready_too_early_which_is_the_failure_we_prevent() {
    let mut s = setup(vec![], Strategy::LbOnly).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    wait_for(&mut s, Reason::Ready).await;
    assert!(
        !truly_ready(&s, &["10.0.0.1"]),
        "lb-only said Ready while the member was still pending"
    );
}

#[tokio::test(start_paused = true)]
async fn stuck_member_is_flagged_on_time_and_recovers() {
    let rule = Rule {
        kind: ObjectKind::Member,
        name: "cp-2".into(),
        effect: Effect::Stuck,
        times: None,
    };
    let mut s = setup(vec![rule], Strategy::StatusTree).await;
    add_member(&s, "cp-2", "10.0.0.2").await;
    let requested = Instant::now();
    s.engine
        .ensure(desired(&s, &[("cp-2", "10.0.0.2", None)]), &s.client);
    let flagged = wait_for(&mut s, Reason::MemberStuck).await;
    let late = flagged - requested;
    assert!(
        late >= Duration::from_secs(60) && late <= Duration::from_secs(65),
        "flagged after {late:?}"
    );
    let message = s
        .engine
        .snapshot(&s.lb)
        .unwrap()
        .verdict
        .message(Instant::now());
    assert!(message.contains("cp-2:6443"), "{message}");
    s.sim.clear_rules();
    wait_for(&mut s, Reason::Ready).await;
    assert!(truly_ready(&s, &["10.0.0.2"]));
}

#[tokio::test(start_paused = true)]
async fn error_members_are_flagged_within_five_seconds() {
    let rule = Rule {
        kind: ObjectKind::Member,
        name: "bad".into(),
        effect: Effect::Error,
        times: None,
    };
    let mut s = setup(vec![rule], Strategy::StatusTree).await;
    add_member(&s, "bad", "10.0.0.3").await;
    s.engine
        .ensure(desired(&s, &[("bad", "10.0.0.3", None)]), &s.client);
    let flagged = wait_for(&mut s, Reason::MemberError).await;
    let errored = s.sim.member_truth()[0].settled_at.unwrap();
    assert!(
        flagged - errored <= Duration::from_secs(5),
        "{:?}",
        flagged - errored
    );
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&s.registry.gather())
        .unwrap();
    assert!(
        text.contains(r#"capo_lb_member_error_total{cluster="c1",namespace="default"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"capo_lb_gate_reason{cluster="c1",loadbalancer=""#),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn stale_members_are_reported_not_deleted() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    add_member(&s, "old", "10.0.0.9").await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    wait_for(&mut s, Reason::Ready).await;
    let snapshot = s.engine.snapshot(&s.lb).unwrap();
    assert_eq!(
        snapshot.verdict.stale,
        vec!["old (10.0.0.9:6443)".to_owned()]
    );
    assert_eq!(s.sim.member_truth().len(), 2, "the engine deletes nothing");
}

#[tokio::test(start_paused = true)]
async fn a_429_storm_pauses_polling_and_the_gate_opens_after() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    let mut storm = scenario(vec![]);
    storm.rate_limits.push(RateLimitFault {
        service: Some("load-balancer".into()),
        above_per_second: None,
        probability: Some(1.0),
        retry_after: 5,
    });
    s.sim.set_scenario(storm);
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let limited = s.sim.request_count("load-balancer loadbalancer_status_get");
    // One attempt per Retry-After pause at most (plus the in-line retry), not a flood.
    assert!(
        limited <= 60 / 5 * 2 + 2,
        "{limited} requests during a 60 s storm"
    );
    assert_ne!(
        s.engine.snapshot(&s.lb).unwrap().verdict.reason,
        Reason::Ready
    );
    s.sim.set_scenario(scenario(vec![]));
    wait_for(&mut s, Reason::Ready).await;
}

/// A reconciler may stamp `requested_at` with now on every ensure: the first request counts,
/// and an unchanged wish is not a new generation.
#[tokio::test(start_paused = true)]
async fn re_ensuring_the_same_members_keeps_the_first_request_time() {
    let s = setup(vec![], Strategy::StatusTree).await;
    let id = add_member(&s, "m0", "10.0.2.10").await;
    let first = s.engine.ensure(
        desired(&s, &[("m0", "10.0.2.10", Some(id.clone()))]),
        &s.client,
    );
    let asked = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = s
        .engine
        .ensure(desired(&s, &[("m0", "10.0.2.10", Some(id))]), &s.client);
    assert_eq!(again, first);
    let snapshot = s.engine.snapshot(&s.lb).expect("tracked");
    assert_eq!(snapshot.members[0].desired.requested_at, asked);
}

/// Once it has watched 30 members finish, the engine polls a new one where members finish
/// on this cloud instead of at every beat of its pace, and still notices within the pace.
#[tokio::test(start_paused = true)]
async fn polls_aim_at_learned_provisioning_times() {
    let pace = capo_provider::membership::ScheduleConfig::default()
        .urgent_initial
        .as_secs_f64();
    let mut s = setup(vec![], Strategy::StatusTree).await;
    let mut slow = scenario(vec![]);
    slow.timings.member_create = Delay::Fixed(20.0);
    s.sim.set_scenario(slow);
    let mut members: Vec<(String, String, Option<String>)> = Vec::new();
    let mut last = (0, 0.0);
    for i in 0..31 {
        let (name, address) = (format!("m{i}"), format!("10.0.1.{}", i + 10));
        let id = add_member(&s, &name, &address).await;
        members.push((name, address, Some(id.clone())));
        let wanted: Vec<(&str, &str, Option<String>)> = members
            .iter()
            .map(|(n, a, id)| (n.as_str(), a.as_str(), id.clone()))
            .collect();
        let polls_before = s.sim.request_count("load-balancer loadbalancer_status_get");
        s.engine.ensure(desired(&s, &wanted), &s.client);
        let ready = wait_for(&mut s, Reason::Ready).await;
        let settled = s
            .sim
            .member_truth()
            .into_iter()
            .find(|m| m.id == id)
            .and_then(|m| m.settled_at)
            .expect("the member settled");
        let polls = s.sim.request_count("load-balancer loadbalancer_status_get") - polls_before;
        last = (polls, (ready - settled).as_secs_f64());
        if i == 0 {
            let beats = (20.0 / pace).floor() as u64;
            assert!(
                polls >= beats,
                "unlearnt: every {pace} s for 20 s, got {polls}"
            );
        }
    }
    let (polls, lag) = last;
    assert!(
        polls <= 5,
        "learnt: a few polls for a 20 s member, got {polls}"
    );
    assert!(
        lag <= pace + 0.1,
        "noticed {lag} s after the member finished"
    );
}

#[tokio::test(start_paused = true)]
async fn member_get_follows_a_created_member_until_active() {
    let mut s = setup(vec![], Strategy::MemberGet).await;
    let id = add_member(&s, "cp-1", "10.0.0.1").await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", Some(id))]), &s.client);
    wait_for(&mut s, Reason::Ready).await;
    assert!(truly_ready(&s, &["10.0.0.1"]));
    assert!(s.sim.request_count("load-balancer loadbalancer_member_get") >= 3);
}

#[tokio::test(start_paused = true)]
async fn forgetting_stops_polling_and_a_deleted_lb_is_reported() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    wait_for(&mut s, Reason::Ready).await;
    s.client
        .octavia()
        .delete_load_balancer(&s.lb, true)
        .await
        .unwrap();
    let gone = wait_for(&mut s, Reason::LoadBalancerError).await;
    assert!(gone.elapsed() < Duration::from_secs(1));
    assert!(
        s.engine
            .snapshot(&s.lb)
            .unwrap()
            .verdict
            .message(Instant::now())
            .contains("not found")
    );
    s.engine.forget(&s.lb);
    let before = s.sim.request_count("load-balancer loadbalancer_status_get");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        s.sim.request_count("load-balancer loadbalancer_status_get"),
        before
    );
    assert!(s.engine.is_empty());
}

/// The simulator's session, but the status tree is forbidden (as a restrictive policy does).
struct NoStatusTree(std::sync::Arc<dyn capo_provider::cloud::Session>);

#[async_trait::async_trait]
impl capo_provider::cloud::Session for NoStatusTree {
    fn scope(&self) -> &capo_provider::cloud::SessionScope {
        self.0.scope()
    }
    async fn service_url(
        &self,
        service: capo_provider::cloud::Service,
    ) -> Result<url::Url, capo_provider::cloud::SendError> {
        self.0.service_url(service).await
    }
    async fn send(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<bytes::Bytes>, capo_provider::cloud::SendError> {
        if request.uri().path().ends_with("/status") {
            let body = br#"{"faultcode":"Client","faultstring":"Policy does not allow this request to be performed.","debuginfo":null}"#;
            return Ok(http::Response::builder()
                .status(403)
                .body(bytes::Bytes::from_static(body))
                .unwrap());
        }
        self.0.send(request).await
    }
}

#[tokio::test(start_paused = true)]
async fn member_lists_stand_in_when_the_status_tree_is_refused() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let restricted = clouds.client(std::sync::Arc::new(NoStatusTree(s.sim.session())));
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &restricted);
    wait_for(&mut s, Reason::Ready).await;
    assert!(truly_ready(&s, &["10.0.0.1"]));
    assert!(
        s.sim
            .request_count("load-balancer loadbalancer_member_list")
            >= 1
    );
    assert_eq!(
        s.sim.request_count("load-balancer loadbalancer_status_get"),
        0,
        "refused before reaching the cloud"
    );
}

/// `capo-rs watch-lb` against the simulator over HTTP: exit 0 when ready, 3 on an ERROR member.
#[tokio::test]
async fn watch_lb_reports_transitions_and_exits_by_verdict() {
    let sim = OpenStackSim::start(OpenStackSimConfig {
        scenario: Scenario {
            timings: Timings {
                member_create: Delay::Fixed(0.3),
                ..scenario(vec![]).timings
            },
            ..scenario(vec![])
        },
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap();
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let client = clouds.client(sim.session());
    let octavia = client.octavia();
    let (lb, pool) = capo_sim::support::api_load_balancer(&client, "watched")
        .await
        .unwrap();
    octavia
        .create_member(&pool, &MemberSpec::new("cp-0", "10.0.0.5", 6443))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clouds_yaml = dir.path().join("clouds.yaml");
    std::fs::write(&clouds_yaml, sim.clouds_yaml()).unwrap();
    let watch = |name: &str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_capo-rs"))
            .args(["watch-lb", "--clouds-yaml"])
            .arg(&clouds_yaml)
            .args(["--cloud", "sim", "--until-ready", name])
            .output()
    };
    let ready = watch("watched").await.unwrap();
    let stdout = String::from_utf8_lossy(&ready.stdout);
    assert_eq!(ready.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("member cp-0:6443 -> Active"), "{stdout}");
    assert!(stdout.contains("gate Ready"), "{stdout}");

    settle(&client, &lb).await;
    sim.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "cp-bad".into(),
        effect: Effect::Error,
        times: None,
    });
    octavia
        .create_member(&pool, &MemberSpec::new("cp-bad", "10.0.0.6", 6443))
        .await
        .unwrap();
    let failed = watch(&lb).await.unwrap();
    assert_eq!(
        failed.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&failed.stdout)
    );
    assert!(String::from_utf8_lossy(&failed.stderr).contains("members in ERROR: cp-bad:6443"));
    let missing = watch("no-such-lb").await.unwrap();
    assert_ne!(missing.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no load balancer has id or name"));
}

/// An observer that panics on its first poll, then looks through status trees.
struct PanicsOnce(std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl Observer for PanicsOnce {
    fn name(&self) -> &'static str {
        "panics-once"
    }

    async fn observe(
        &self,
        client: &CloudClient,
        desired: &DesiredLb,
    ) -> Result<Seen, capo_provider::cloud::CloudError> {
        if !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected panic in a poll");
        }
        StatusTreeObserver.observe(client, desired).await
    }
}

/// The value of a counter or gauge series with these labels, 0 when absent.
fn metric(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    capo_provider::controllers::metrics::value(registry, name, labels)
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_panics_is_counted_and_its_lb_polled_again() {
    let s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    let registry = Registry::new();
    let observer = std::sync::Arc::new(PanicsOnce(std::sync::atomic::AtomicBool::new(false)));
    let engine = Engine::with_observer(
        EngineConfig::default(),
        observer,
        &registry,
        CancellationToken::new(),
    )
    .unwrap();
    let mut changes = engine.subscribe();
    engine.ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(change) = common::next_change(&mut changes).await {
            if change.reason == Reason::Ready {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "the LB was polled again after the panic");
    let panics = metric(
        &registry,
        "capo_lb_engine_panics_total",
        &[("task", "poll")],
    );
    assert_eq!(panics, 1.0);
    engine.shutdown().await;
}

/// A subscriber that falls behind is told so, and nothing is lost without a word: what it
/// missed plus what it received is every change.
#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_gets_a_resync_instead_of_silent_loss() {
    let s = setup(vec![], Strategy::StatusTree).await;
    let registry = Registry::new();
    let config = EngineConfig {
        change_buffer: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::new(config, &registry, CancellationToken::new()).unwrap();
    let mut slow = engine.subscribe();
    let mut fast = engine.subscribe();
    let mut published = 0u64;
    let mut wanted: Vec<(String, String, Option<String>)> = Vec::new();
    for i in 1..=5 {
        wanted.push((format!("m{i}"), format!("10.0.3.{i}"), None));
        let members: Vec<(&str, &str, Option<String>)> = wanted
            .iter()
            .map(|(n, a, id)| (n.as_str(), a.as_str(), id.clone()))
            .collect();
        let generation = engine.ensure(desired(&s, &members), &s.client);
        // The fast subscriber keeps up; it tells when this generation's verdict is out.
        loop {
            let change =
                tokio::time::timeout(Duration::from_secs(60), common::next_change(&mut fast))
                    .await
                    .expect("a verdict for every generation")
                    .expect("the engine runs");
            published += 1;
            if change.generation >= generation {
                break;
            }
        }
    }
    let mut notices = Vec::new();
    while let Some(Some(notice)) = futures::FutureExt::now_or_never(slow.recv()) {
        notices.push(notice);
    }
    let Some(Notice::Resync { missed }) = notices.first() else {
        panic!("the slow subscriber was not told to re-sync: {notices:?}");
    };
    let received = notices
        .iter()
        .filter(|n| matches!(n, Notice::Changed(_)))
        .count() as u64;
    assert_eq!(missed + received, published, "{notices:?}");
    assert_eq!(received, 2, "the buffer's worth, the newest ones");
    let Some(Notice::Changed(last)) = notices.last() else {
        panic!("{notices:?}");
    };
    assert_eq!(last.generation, 5);
    assert_eq!(metric(&registry, "capo_lb_change_resyncs_total", &[]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn forgetting_an_endpoints_last_lb_ends_its_loop_and_shutdown_waits_for_all() {
    let s = setup(vec![], Strategy::StatusTree).await;
    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    assert_eq!(s.engine.running_loops(), 1);
    s.engine.forget(&s.lb);
    // On the paused clock this runs every task until all are idle, then moves time on.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(s.engine.running_loops(), 0, "no LB left, no loop left");

    s.engine
        .ensure(desired(&s, &[("cp-1", "10.0.0.1", None)]), &s.client);
    assert_eq!(s.engine.running_loops(), 1, "a new LB starts a new loop");
    let mut changes = s.engine.subscribe();
    s.engine.shutdown().await;
    assert_eq!(s.engine.running_loops(), 0);
    // Subscribers hear the end rather than waiting forever.
    while let Some(notice) = changes.recv().await {
        assert!(matches!(notice, Notice::Changed(_)), "{notice:?}");
    }
}

#[test]
fn an_engine_outside_a_runtime_is_an_error_not_a_panic() {
    let engine = Engine::new(
        EngineConfig::default(),
        &Registry::new(),
        CancellationToken::new(),
    );
    assert!(matches!(engine, Err(EngineError::NoRuntime)));
}

#[test]
fn change_kinds_are_the_api_kinds() {
    use kube::Resource;
    assert_eq!(
        OwnerKind::OpenStackCluster.as_str(),
        capo_api::OpenStackCluster::kind(&())
    );
    assert_eq!(
        OwnerKind::OpenStackMachine.as_str(),
        capo_api::OpenStackMachine::kind(&())
    );
}

/// Reconcilers may call `ensure` from anywhere: a thread outside the runtime starts polling
/// on the engine's runtime rather than panicking.
#[tokio::test(start_paused = true)]
async fn ensure_from_a_thread_outside_the_runtime_starts_polling() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    add_member(&s, "cp-1", "10.0.0.1").await;
    let wanted = desired(&s, &[("cp-1", "10.0.0.1", None)]);
    let (engine, client) = (s.engine.clone(), s.client.clone());
    let generation = std::thread::spawn(move || engine.ensure(wanted, &client))
        .join()
        .expect("ensure does not panic outside a runtime");
    assert_eq!(generation, 1);
    wait_for(&mut s, Reason::Ready).await;
}

// ------------------------------------------------------------------ the LB list

/// Three API load balancers (the setup's and two more), one ACTIVE member each, all under the
/// engine and Ready; their (lb, pool, member id) in order.
async fn three_ready_lbs(s: &mut Setup) -> Vec<(String, String, String)> {
    let mut lbs = vec![(s.lb.clone(), s.pool.clone())];
    for k in 1..3 {
        let built = capo_sim::support::api_load_balancer(&s.client, &format!("c{k}-kubeapi"))
            .await
            .unwrap();
        lbs.push(built);
    }
    let mut ready = Vec::new();
    for (k, (lb, pool)) in lbs.into_iter().enumerate() {
        settle(&s.client, &lb).await;
        let (name, address) = (format!("cp-{k}"), format!("10.0.0.{}", k + 1));
        let member = s
            .client
            .octavia()
            .create_member(&pool, &MemberSpec::new(&name, &address, 6443))
            .await
            .unwrap();
        let mut wanted = common::desired_lb(&lb, &pool, &[(&name, &address, None)]);
        wanted.rollout_waiting = false;
        s.engine.ensure(wanted, &s.client);
        wait_for_lb(s, &lb, Reason::Ready).await;
        ready.push((lb, pool, member.id));
    }
    ready
}

/// The next change of `lb` with this reason (within an hour of virtual time).
async fn wait_for_lb(setup: &mut Setup, lb: &str, reason: Reason) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let change = tokio::time::timeout_at(deadline, common::next_change(&mut setup.changes))
            .await
            .unwrap_or_else(|_| panic!("{lb} never turned {reason:?}"))
            .unwrap();
        if change.lb_id == lb && change.reason == reason {
            return Instant::now();
        }
    }
}

/// Deletes the LB's member behind the engine's back; how long until its verdict shows it.
async fn drift_seen_after(
    s: &mut Setup,
    (lb, pool, member): &(String, String, String),
) -> Duration {
    s.client
        .octavia()
        .delete_member(pool, member)
        .await
        .unwrap();
    let deleted = Instant::now();
    wait_for_lb(s, lb, Reason::MembersMissing).await - deleted
}

/// Creates member `cp-9` in `pool` beside `cp-0` (the first of `three_ready_lbs`); returns
/// both, as wanted.
async fn join_cp9(
    s: &Setup,
    pool: &str,
) -> [(&'static str, &'static str, Option<&'static str>); 2] {
    s.client
        .octavia()
        .create_member(pool, &MemberSpec::new("cp-9", "10.0.0.9", 6443))
        .await
        .unwrap();
    [("cp-0", "10.0.0.1", None), ("cp-9", "10.0.0.9", None)]
}

fn requests(s: &Setup) -> (u64, u64) {
    (
        s.sim.request_count("load-balancer loadbalancer_status_get"),
        s.sim.request_count("load-balancer loadbalancer_list"),
    )
}

#[tokio::test(start_paused = true)]
async fn settled_lbs_cost_one_list_per_sweep_and_drift_is_seen_within_one() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    let lbs = three_ready_lbs(&mut s).await;
    let (trees, lists) = requests(&s);
    tokio::time::sleep(Duration::from_secs(600)).await;
    let (trees_after, lists_after) = requests(&s);
    // A list every 30 s; no LB needs a tree of its own (the safety net is 10 minutes away).
    assert!(
        (19..=21).contains(&(lists_after - lists)),
        "{} lists in 10 minutes",
        lists_after - lists
    );
    assert!(trees_after - trees <= 3, "{} trees", trees_after - trees);
    assert_eq!(
        metric(&s.registry, "capo_lb_lists", &[("state", "working")]),
        1.0
    );
    // A member deleted behind the engine's back: its LB's row moves, one tree shows it.
    let seen_after = drift_seen_after(&mut s, &lbs[1]).await;
    assert!(seen_after <= Duration::from_secs(32), "{seen_after:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_list_falls_back_to_drift_checks_until_it_answers_again() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    s.sim.refuse_lb_list(true);
    let lbs = three_ready_lbs(&mut s).await;
    // Refused once, then each LB is checked on its own (every 60 s at this size).
    let (trees, _) = requests(&s);
    tokio::time::sleep(Duration::from_secs(600)).await;
    let (trees_after, _) = requests(&s);
    assert!(
        trees_after - trees >= 3 * 9,
        "{} drift trees",
        trees_after - trees
    );
    assert_eq!(
        metric(&s.registry, "capo_lb_lists", &[("state", "unavailable")]),
        1.0
    );
    assert_eq!(
        metric(
            &s.registry,
            "capo_lb_polls_total",
            &[("kind", "list"), ("result", "forbidden")]
        ),
        1.0,
        "refused once, not retried every sweep"
    );
    let seen_after = drift_seen_after(&mut s, &lbs[2]).await;
    assert!(seen_after <= Duration::from_secs(62), "{seen_after:?}");
    // Allowed again: the list is tried again within the hour and used.
    s.sim.refuse_lb_list(false);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        metric(&s.registry, "capo_lb_lists", &[("state", "working")]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn a_locked_lb_is_not_polled_while_the_list_shows_it_locked() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    let lbs = three_ready_lbs(&mut s).await;
    // A member that takes 60 s, and an LB that stays locked until it settles (Octavia's
    // ordered flow).
    s.sim.update_scenario(|scenario| {
        scenario.timings.member_create = Delay::Fixed(60.0);
        scenario.timings.lb_waits_for_members = true;
    });
    let (lb, pool, _) = &lbs[0];
    let members = join_cp9(&s, pool).await;
    let asked = Instant::now();
    let (trees, lists) = requests(&s);
    s.engine
        .ensure(common::desired_lb(lb, pool, &members), &s.client);
    let ready = wait_for_lb(&mut s, lb, Reason::Ready).await;
    let (trees_after, lists_after) = requests(&s);
    assert!(truly_ready(&s, &[members[0].1, members[1].1]));
    // Seen within a locked sweep (1.5 s) of the unlock, for a couple of trees rather than
    // one every 1.5 s (the lock is looked at on its own every 30 s).
    assert!(
        ready - asked <= Duration::from_secs(62),
        "{:?}",
        ready - asked
    );
    assert!(trees_after - trees <= 4, "{} trees", trees_after - trees);
    assert!(lists_after - lists <= 45, "{} lists", lists_after - lists);
}

#[tokio::test(start_paused = true)]
async fn a_member_that_finishes_under_an_unlocked_lb_comes_with_its_row_in_the_same_change() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    let lbs = three_ready_lbs(&mut s).await;
    tokio::time::sleep(Duration::from_secs(300)).await;
    s.changes = s.engine.subscribe();
    // A join: the LB unlocks in 0.3 s and the member finishes 5 s later, which its row
    // does not show.
    let (lb, pool, _) = &lbs[0];
    let members = join_cp9(&s, pool).await;
    s.engine
        .ensure(common::desired_lb(lb, pool, &members), &s.client);
    wait_for_lb(&mut s, lb, Reason::Ready).await;
    // The change that says Ready already carries the row a list showed before the tree
    // (its cluster writes both at once), not a moment later on its own.
    let snapshot = s.engine.snapshot(lb).expect("tracked");
    let rows = s.client.octavia().list_load_balancer_rows().await.unwrap();
    let row = rows.iter().find(|row| row.id == *lb).expect("listed");
    assert!(row.updated_at.is_some());
    assert_eq!(snapshot.members_as_of, row.updated_at);
    let recalled = snapshot.recalled().expect("vouched for");
    assert_eq!(recalled.members.len(), 2);
    assert!(truly_ready(&s, &[members[0].1, members[1].1]));
    // The machine is released and the rollout stops waiting: the same members, so the
    // stamp stands (clearing it would be one more write, and another later to set it).
    let mut released = common::desired_lb(lb, pool, &members);
    released.rollout_waiting = false;
    for member in &mut released.members {
        member.served = true;
    }
    s.engine.ensure(released, &s.client);
    let stamp = |s: &Setup| s.engine.snapshot(lb).and_then(|snap| snap.members_as_of);
    assert_eq!(stamp(&s), row.updated_at);
    // Another member wanted: what the cluster records changes, and the stamp goes with it.
    let more = [members[0], members[1], ("cp-8", "10.0.0.8", None)];
    s.engine
        .ensure(common::desired_lb(lb, pool, &more), &s.client);
    assert_eq!(stamp(&s), None);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_engine_trusts_recalled_members_while_their_lb_row_is_unchanged() {
    let mut s = setup(vec![], Strategy::StatusTree).await;
    let lbs = three_ready_lbs(&mut s).await;
    // Within a few minutes a list has vouched for every LB's members.
    tokio::time::sleep(Duration::from_secs(300)).await;
    let recalled: Vec<Recalled> = lbs
        .iter()
        .map(|(lb, _, _)| {
            let snapshot = s.engine.snapshot(lb).expect("tracked");
            snapshot
                .recalled()
                .unwrap_or_else(|| panic!("{lb} not vouched for"))
        })
        .collect();
    s.engine.shutdown().await;
    // While the controller is down, one LB loses its member.
    s.client
        .octavia()
        .delete_member(&lbs[2].1, &lbs[2].2)
        .await
        .unwrap();
    settle(&s.client, &lbs[2].0).await;

    // The restart: a new engine, told what the clusters recorded.
    s.registry = Registry::new();
    s.engine = Engine::new(
        EngineConfig {
            stuck_after: Duration::from_secs(60),
            ..EngineConfig::default()
        },
        &s.registry,
        CancellationToken::new(),
    )
    .unwrap();
    s.changes = s.engine.subscribe();
    let (trees, lists) = requests(&s);
    let started = Instant::now();
    for (k, ((lb, pool, _), recalled)) in lbs.iter().zip(recalled).enumerate() {
        let (name, address) = (format!("cp-{k}"), format!("10.0.0.{}", k + 1));
        let mut wanted = common::desired_lb(lb, pool, &[(&name, &address, None)]);
        wanted.rollout_waiting = false;
        s.engine.ensure_recalled(wanted, &s.client, Some(recalled));
    }
    let mut expected: Vec<(String, Reason)> = vec![
        (lbs[0].0.clone(), Reason::Ready),
        (lbs[1].0.clone(), Reason::Ready),
        (lbs[2].0.clone(), Reason::MembersMissing),
    ];
    let deadline = started + Duration::from_secs(600);
    while !expected.is_empty() {
        let change = tokio::time::timeout_at(deadline, common::next_change(&mut s.changes))
            .await
            .unwrap_or_else(|_| panic!("never seen: {expected:?}"))
            .unwrap();
        expected.retain(|(lb, reason)| !(change.lb_id == *lb && change.reason == *reason));
    }
    let elapsed = started.elapsed();
    let (trees_after, lists_after) = requests(&s);
    // One list says which rows are unchanged; only the changed LB is read.
    assert!(elapsed <= Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(trees_after - trees, 1, "status trees after the restart");
    assert_eq!(lists_after - lists, 1, "lists after the restart");
    assert!(
        s.engine
            .snapshot(&lbs[0].0)
            .is_some_and(|snapshot| snapshot.members_as_of.is_some()),
        "a recalled state stays vouched for"
    );
}

/// The floor `bench membership` prints is a floor: no strategy that sees every finish in time
/// spends fewer requests on the same rollouts, and the status-tree engine, which does, stays
/// above it. A floor the engine beat would mean its reasoning (what a poller must look at in
/// the race) was wrong, and the ratio the bench prints against it meaningless.
#[test]
fn the_engine_never_spends_fewer_requests_than_the_benchs_floor() {
    let config = capo_bench::membership::BenchConfig {
        clusters: 40,
        window: Duration::from_secs(300),
        slow_share: 0.1,
        stuck_share: 0.05,
        error_share: 0.05,
        // The engine aims at 1.9 s, and at this density a few finishes are seen up to 2.3 s
        // late: the floor is priced at a lag the engine met for every member.
        floor_lag: 2.5,
        ..capo_bench::membership::BenchConfig::default()
    };
    let reports = capo_bench::membership::run(&config, &[Strategy::StatusTree])
        .unwrap_or_else(|e| panic!("bench: {e:#}"));
    let report = &reports[0];
    let floor = report
        .floor_requests
        .unwrap_or_else(|| panic!("no floor in the race"));
    assert_eq!(report.false_ready, 0);
    assert!(
        report.detection_lag_max <= config.floor_lag,
        "lag {}",
        report.detection_lag_max
    );
    assert!(
        floor > 3 * u64::from(config.clusters),
        "floor {floor}: below a look per member"
    );
    assert!(
        report.requests >= floor,
        "the engine spent {} requests, under the floor {floor}",
        report.requests
    );
}
