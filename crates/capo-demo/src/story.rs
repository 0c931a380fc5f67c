//! The story: a cluster from the template (3 control-plane machines, 2 workers), a rollout of
//! its control plane in which the first new member is stuck until capo-rs has flagged it, the
//! second goes ERROR and is repaired, and the third is slow and its kube-apiserver does not
//! answer `/readyz` until capo-rs has flagged it `MemberNotServing` (with a short burst of
//! 429s and of 503s from the cloud on the way), then the cluster's deletion and a check that
//! nothing is left. Trusting the load balancer instead, the slow member is the only one that
//! can serve once the last old machine is gone, and until it is ACTIVE nothing serves. With
//! the provisioning gate, the third machine is released on ACTIVE and never serves: the
//! cluster runs a control-plane node short.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capo_api::capi::Cluster;
use capo_api::{OpenStackCluster, OpenStackMachineSpec, OpenStackMachineTemplate};
use capo_sim::capi::{CapiActor, CapiActorConfig, ControlPlane, RolloutStep};
use capo_sim::openstack::{
    ApiServer, Delay, Effect, ObjectKind, OpenStackSim, RateLimitFault, Rule, ServerErrorFault,
};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::await_condition;
use prometheus::Registry;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::board::{Board, Sampler, Stage};
use crate::summary::Summary;
use crate::view::View;
use crate::world::DemoWorld;
use crate::{CLUSTER, DemoConfig, NAMESPACE, STEP_TIMEOUT, template};

const CONTROL_PLANE_REPLICAS: usize = 3;
const WORKERS: usize = 2;
/// Cluster API's own finalizer on a Cluster: it stays, deleting, until its parts are gone.
const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
const KUBERNETES_VERSION: &str = "v1.33.4";

/// Plays the story with the view following it; the summary at the end.
pub async fn play(
    world: &DemoWorld,
    config: &DemoConfig,
    view: &mut View,
    started: Instant,
) -> anyhow::Result<Summary> {
    let sampler = Sampler::start(world.client.clone(), world.cloud.clone());
    let actor = CapiActor::start(
        world.client.clone(),
        CapiActorConfig {
            namespace: NAMESPACE.to_owned(),
            tick: Duration::from_millis(50),
            join_delay: config.pace.of(0.5),
            wait_timeout: STEP_TIMEOUT,
        },
        CancellationToken::new(),
    );
    let mut boards = sampler.boards.clone();
    let script = Script {
        world,
        config,
        sampler: &sampler,
        actor: &actor,
        side: JoinSet::new(),
    };
    let mut story = Box::pin(script.run());
    let outcome = loop {
        tokio::select! {
            outcome = &mut story => break outcome,
            changed = boards.changed() => {
                if changed.is_ok() {
                    let board = boards.borrow_and_update().clone();
                    view.show(&board);
                }
            }
        }
    };
    drop(story);
    actor.stop().await;
    view.show(&sampler.boards.borrow().clone());
    let stats = sampler.stop().await;
    let figures = outcome?;
    Ok(Summary {
        strategy: config.strategy,
        total: started.elapsed(),
        bring_up: figures.bring_up,
        rollout: figures.rollout,
        machines_replaced: figures.replaced,
        openstack_requests: world.requests(),
        stats,
        leaked: figures.leaked,
    })
}

struct Figures {
    bring_up: Duration,
    rollout: Duration,
    replaced: usize,
    leaked: BTreeMap<String, i64>,
}

struct Script<'a> {
    world: &'a DemoWorld,
    config: &'a DemoConfig,
    sampler: &'a Sampler,
    actor: &'a CapiActor,
    /// The story's side plots (fault bursts, the stuck member's release); all owned here.
    side: JoinSet<()>,
}

impl Script<'_> {
    async fn run(mut self) -> anyhow::Result<Figures> {
        let baseline = self.world.cloud.object_counts();
        self.sampler.set_stage(Stage::CreatingCluster);
        let templates = self.create_cluster().await?;
        let plane = ControlPlane {
            cluster: CLUSTER.to_owned(),
            replicas: CONTROL_PLANE_REPLICAS,
            template: templates.control_plane,
            version: KUBERNETES_VERSION.to_owned(),
            failure_domains: Vec::new(),
        };

        self.sampler.set_stage(Stage::BringingUp);
        let bring_up = Instant::now();
        self.actor.scale_control_plane(&plane).await?;
        for worker in self
            .actor
            .create_workers(CLUSTER, WORKERS, templates.worker)
            .await?
        {
            self.actor.wait_joined(&worker).await?;
        }
        let bring_up = bring_up.elapsed();

        self.sampler.set_stage(Stage::RollingOut);
        let rollout = self.rollout(&plane).await?;

        self.sampler.set_stage(Stage::Deleting);
        self.side.shutdown().await;
        self.world.cloud.clear_rules();
        self.delete_cluster().await?;
        let leaked = leaks(&baseline, &self.world.cloud.object_counts());
        self.sampler.set_stage(Stage::Done);
        Ok(Figures {
            bring_up,
            rollout: rollout.0,
            replaced: rollout.1,
            leaked,
        })
    }

    async fn create_cluster(&self) -> anyhow::Result<Templates> {
        let client = &self.world.client;
        let objects =
            template::cluster_objects(CLUSTER, NAMESPACE, &self.world.cloud.clouds_yaml())
                .map_err(anyhow::Error::msg)?;
        for object in &objects {
            create(client, object).await?;
        }
        let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
        let finalizer = json!({"metadata": {"finalizers": [CLUSTER_FINALIZER]}});
        clusters
            .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&finalizer))
            .await
            .context("adding Cluster API's finalizer to the Cluster")?;
        let infra: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
        let provisioned = await_condition(infra, CLUSTER, |c: Option<&OpenStackCluster>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned)
                == Some(true)
        });
        tokio::time::timeout(STEP_TIMEOUT, provisioned)
            .await
            .context("the OpenStackCluster was not provisioned in time")?
            .context("watching the OpenStackCluster")?;
        Templates::from_objects(&objects)
    }

    /// Rolls the control plane; returns its time and how many machines it replaced.
    async fn rollout(&mut self, plane: &ControlPlane) -> anyhow::Result<(Duration, usize)> {
        // Each machine: the new one created and joined, the old one asked to go and gone.
        let steps = 4 * plane.replicas as u64;
        self.sampler.rollout_steps(0, steps);
        let mut done = 0;
        let mut round = 0;
        let report = {
            let sampler = self.sampler;
            let side = &mut self.side;
            let plot = Plot {
                cloud: self.world.cloud.clone(),
                registry: self.world.registry.clone(),
                boards: sampler.boards.clone(),
                config: self.config.clone(),
            };
            self.actor
                .rollout(plane, |step| {
                    done = (done + 1).min(steps);
                    sampler.rollout_steps(done, steps);
                    if let RolloutStep::Created { name } = step {
                        sampler.note(plot.twist(round, &name, side));
                        round += 1;
                    }
                })
                .await?
        };
        Ok((report.elapsed, report.replaced.len()))
    }

    /// Deletes the cluster as Cluster API does: the Cluster first (it stays, deleting), its
    /// Machines, then the infrastructure cluster; then the Cluster goes.
    async fn delete_cluster(&self) -> anyhow::Result<()> {
        let client = &self.world.client;
        let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
        clusters
            .delete(CLUSTER, &DeleteParams::default())
            .await
            .context("deleting the Cluster")?;
        let all: Api<capo_api::capi::Machine> = Api::namespaced(client.clone(), NAMESPACE);
        let names: Vec<String> = all
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(kube::ResourceExt::name_any)
            .collect();
        for name in &names {
            self.actor.delete_machine(name).await?;
        }
        for name in &names {
            self.actor.wait_gone(name).await?;
        }
        let infra: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
        infra
            .delete(CLUSTER, &DeleteParams::default())
            .await
            .context("deleting the OpenStackCluster")?;
        let gone = await_condition(infra, CLUSTER, |c: Option<&OpenStackCluster>| c.is_none());
        tokio::time::timeout(STEP_TIMEOUT, gone)
            .await
            .context("the OpenStackCluster was not deleted in time")?
            .context("watching the OpenStackCluster")?;
        let release = json!({"metadata": {"finalizers": null}});
        clusters
            .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .context("removing Cluster API's finalizer")?;
        for template in [
            format!("{CLUSTER}-control-plane"),
            format!("{CLUSTER}-md-0"),
        ] {
            let api: Api<OpenStackMachineTemplate> = Api::namespaced(client.clone(), NAMESPACE);
            let _ = api.delete(&template, &DeleteParams::default()).await;
        }
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(client.clone(), NAMESPACE);
        let _ = secrets
            .delete(&format!("{CLUSTER}-cloud-config"), &DeleteParams::default())
            .await;
        Ok(())
    }
}

/// The machine templates, as the KubeadmControlPlane and the MachineDeployment would use them.
struct Templates {
    control_plane: OpenStackMachineSpec,
    worker: OpenStackMachineSpec,
}

impl Templates {
    fn from_objects(objects: &[Value]) -> anyhow::Result<Self> {
        let spec = |suffix: &str| -> anyhow::Result<OpenStackMachineSpec> {
            let name = format!("{CLUSTER}-{suffix}");
            let object = objects
                .iter()
                .find(|o| o["kind"] == "OpenStackMachineTemplate" && o["metadata"]["name"] == name)
                .with_context(|| format!("the template has no OpenStackMachineTemplate {name}"))?;
            let template: OpenStackMachineTemplate = serde_json::from_value(object.clone())
                .with_context(|| format!("reading OpenStackMachineTemplate {name}"))?;
            Ok(template.spec.template.spec)
        };
        Ok(Templates {
            control_plane: spec("control-plane")?,
            worker: spec("md-0")?,
        })
    }
}

/// What the cloud does to each new machine of the rollout.
struct Plot {
    cloud: Arc<OpenStackSim>,
    registry: Registry,
    boards: watch::Receiver<Board>,
    config: DemoConfig,
}

impl Plot {
    /// Sets up the `round`th new machine's twist; returns what it is, in words.
    fn twist(&self, round: usize, machine: &str, side: &mut JoinSet<()>) -> String {
        let pace = self.config.pace;
        let member = format!("*-{machine}");
        match round {
            0 => {
                self.cloud.add_rule(Rule {
                    kind: ObjectKind::Member,
                    name: member.clone(),
                    effect: Effect::Stuck,
                    times: None,
                });
                side.spawn(release_when_flagged(
                    self.cloud.clone(),
                    self.boards.clone(),
                    machine.to_owned(),
                    member,
                    self.config.clone(),
                ));
                format!("{machine}: its member will be stuck in PENDING_CREATE for a while")
            }
            1 => {
                self.cloud.add_rule(Rule {
                    kind: ObjectKind::Member,
                    name: member,
                    effect: Effect::Error,
                    times: Some(1),
                });
                side.spawn(throttle_when_built(
                    self.cloud.clone(),
                    self.registry.clone(),
                    self.boards.clone(),
                    machine.to_owned(),
                ));
                format!(
                    "{machine}: its member will go ERROR; once its server is up, Octavia \
                     answers every request 429 (Retry-After: 1) until a call gives up"
                )
            }
            _ => {
                self.cloud.add_rule(Rule {
                    kind: ObjectKind::Member,
                    name: member.clone(),
                    effect: Effect::Delay(Delay::Fixed(pace.slow_member())),
                    times: Some(1),
                });
                // Its kube-apiserver listens but never answers /readyz until capo-rs says so.
                self.cloud
                    .set_api_server_for_members(&member, ApiServer::NeverReady);
                side.spawn(burst(self.cloud.clone(), pace.burst(), Burst::Unavailable));
                side.spawn(serve_when_flagged(
                    self.cloud.clone(),
                    self.boards.clone(),
                    machine.to_owned(),
                    member,
                    self.config.clone(),
                ));
                format!(
                    "{machine}: its member will take {:.0} s (slow), and its API will not \
                     answer /readyz; Nova answers half its requests 503 for {:.0} s",
                    pace.slow_member(),
                    pace.burst().as_secs_f64()
                )
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Burst {
    TooManyRequests,
    Unavailable,
}

/// The least time Octavia throttles every request: long enough that a call's four attempts,
/// one second apart as Retry-After asks, all meet a 429. Retry-After counts whole seconds, so
/// this does not compress with `--speed`.
const THROTTLED_AT_LEAST: Duration = Duration::from_millis(4500);

/// The most: on a busy machine no call may start early enough in the least time to meet four
/// 429s, so the throttling lasts until one has given up, or this long.
const THROTTLED_AT_MOST: Duration = Duration::from_secs(30);

/// The cloud answers requests with 429 (Octavia, every one) or 503 (Nova, half) for a while.
async fn burst(cloud: Arc<OpenStackSim>, lasting: Duration, kind: Burst) {
    start_burst(&cloud, kind);
    tokio::time::sleep(lasting).await;
    end_bursts(&cloud);
}

fn start_burst(cloud: &OpenStackSim, kind: Burst) {
    cloud.update_scenario(|scenario| match kind {
        Burst::TooManyRequests => scenario.rate_limits.push(RateLimitFault {
            service: Some("load-balancer".into()),
            above_per_second: None,
            probability: Some(1.0),
            retry_after: 1,
        }),
        Burst::Unavailable => scenario.server_errors.push(ServerErrorFault {
            service: Some("compute".into()),
            probability: 0.5,
            status: 503,
        }),
    });
}

fn end_bursts(cloud: &OpenStackSim) {
    cloud.update_scenario(|scenario| {
        scenario.rate_limits.clear();
        scenario.server_errors.clear();
    });
}

/// Throttles Octavia once the machine's server is up, just as its member is to be created,
/// until a call has met a 429 at each of its attempts and failed, to be tried again later.
async fn throttle_when_built(
    cloud: Arc<OpenStackSim>,
    registry: Registry,
    mut boards: watch::Receiver<Board>,
    machine: String,
) {
    let built = boards.wait_for(|board| {
        board
            .machines
            .iter()
            .any(|m| m.name == machine && m.server == "ACTIVE")
    });
    if !matches!(tokio::time::timeout(STEP_TIMEOUT, built).await, Ok(Ok(_))) {
        return;
    }
    let before = calls_failed_by_429s(&registry);
    start_burst(&cloud, Burst::TooManyRequests);
    tokio::time::sleep(THROTTLED_AT_LEAST).await;
    let mut waited = THROTTLED_AT_LEAST;
    while calls_failed_by_429s(&registry) == before && waited < THROTTLED_AT_MOST {
        tokio::time::sleep(Duration::from_millis(250)).await;
        waited += Duration::from_millis(250);
    }
    end_bursts(&cloud);
}

/// OpenStack calls that gave up on 429s, as the manager counts them.
fn calls_failed_by_429s(registry: &Registry) -> u64 {
    capo_provider::controllers::metrics::value(
        registry,
        "capo_openstack_api_request_errors_total",
        &[("error", "rate_limited")],
    ) as u64
}

/// Releases the stuck member a while after capo-rs flags the machine `MemberStuck`. Nothing
/// flags it when the load balancer is trusted: it then stays stuck until the cluster goes.
async fn release_when_flagged(
    cloud: Arc<OpenStackSim>,
    boards: watch::Receiver<Board>,
    machine: String,
    member: String,
    config: DemoConfig,
) {
    if !shown_flagged(boards, &machine, "MemberStuck", config.pace.stuck_shown()).await {
        return;
    }
    cloud.update_scenario(|scenario| {
        scenario
            .rules
            .retain(|rule| !(rule.effect == Effect::Stuck && rule.name == member));
    });
}

/// Makes the machine's API serve a while after capo-rs flags it `MemberNotServing` (someone
/// fixed its kube-apiserver). Nothing flags it when machines are released on ACTIVE alone:
/// it then never serves, and the cluster runs a control-plane node short.
async fn serve_when_flagged(
    cloud: Arc<OpenStackSim>,
    boards: watch::Receiver<Board>,
    machine: String,
    member: String,
    config: DemoConfig,
) {
    let shown = config.pace.not_serving_shown();
    if shown_flagged(boards, &machine, "MemberNotServing", shown).await {
        cloud.set_api_server_for_members(&member, ApiServer::Serving);
    }
}

/// Waits until the board shows `machine` held for `reason`, then `shown` more, so that the
/// board shows it a while; false when the story ended first (nothing flagged it).
async fn shown_flagged(
    mut boards: watch::Receiver<Board>,
    machine: &str,
    reason: &str,
    shown: Duration,
) -> bool {
    let flagged = boards
        .wait_for(|board| {
            board
                .machines
                .iter()
                .any(|m| m.name == machine && m.gate_reason.as_deref() == Some(reason))
        })
        .await
        .is_ok();
    if flagged {
        tokio::time::sleep(shown).await;
    }
    flagged
}

/// Creates one object of the template, whatever its kind.
async fn create(client: &kube::Client, object: &Value) -> anyhow::Result<()> {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    let dynamic: DynamicObject = serde_json::from_value(object.clone())
        .with_context(|| format!("reading the template's {kind} {name}"))?;
    match api.create(&PostParams::default(), &dynamic).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => bail!(
            "{kind} {NAMESPACE}/{name} already exists: a previous demo left it; delete the \
             namespace {NAMESPACE} and run again"
        ),
        Err(error) => Err(error).with_context(|| format!("creating {kind} {name}")),
    }
}

/// What the cloud holds now that it did not before, by kind.
fn leaks(
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .map(|(kind, count)| {
            let was = before.get(kind).copied().unwrap_or(0);
            (kind.clone(), *count as i64 - was as i64)
        })
        .filter(|(_, extra)| *extra != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaks_are_what_the_cloud_holds_beyond_what_it_held() {
        let before = BTreeMap::from([("ports".to_owned(), 2), ("servers".to_owned(), 0)]);
        let after = BTreeMap::from([
            ("ports".to_owned(), 3),
            ("servers".to_owned(), 0),
            ("members".to_owned(), 1),
        ]);
        assert_eq!(
            leaks(&before, &after),
            BTreeMap::from([("members".to_owned(), 1), ("ports".to_owned(), 1)])
        );
    }
}
