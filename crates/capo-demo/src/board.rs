//! What the demo shows and measures. A sampler reads the Kubernetes objects and the
//! simulated cloud's members every tenth of a second into a [`Board`]; [`Stats`] folds the
//! boards into the summary's figures. Both are plain data, tested without servers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capo_api::OpenStackMachine;
use capo_api::capi::{self, Machine};
use capo_api::conditions::{self, types};
use capo_provider::controllers::gate;
use capo_provider::controllers::machine::REPAIRS_ANNOTATION;
use capo_sim::openstack::{MemberTruth, OpenStackSim};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{CLUSTER, NAMESPACE};

/// The API server's port: its pool is the one whose members serve the cluster's API.
const API_PORT: u16 = 6443;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Events shown on the board.
const RECENT_EVENTS: usize = 4;

/// Where the story is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Stage {
    #[default]
    Starting,
    CreatingCluster,
    BringingUp,
    RollingOut,
    Deleting,
    Done,
}

impl Stage {
    pub fn words(&self) -> &'static str {
        match self {
            Stage::Starting => "starting",
            Stage::CreatingCluster => "creating the cluster's network and API load balancer",
            Stage::BringingUp => "bringing up 3 control-plane machines and 2 workers",
            Stage::RollingOut => "rolling the control plane",
            Stage::Deleting => "deleting the cluster",
            Stage::Done => "done",
        }
    }
}

/// The story's part of the board, set by the story.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    pub stage: Stage,
    /// Rollout steps done (a new machine created, joined; the old one asked to go, gone: four
    /// per machine) and in all.
    pub rollout_steps: (u64, u64),
    /// What the story just made happen.
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRow {
    pub name: String,
    pub control_plane: bool,
    pub deleting: bool,
    /// The server's state (`-` before there is one).
    pub server: String,
    /// Its member's provisioning status in the API pool, if it has one.
    pub member: Option<String>,
    /// Its member's operating status (what the health monitor says), if it has one.
    pub operating: Option<String>,
    /// Has a providerID: Cluster API may count it.
    pub released: bool,
    /// The reason of APIServerLoadBalancerMemberReady.
    pub gate_reason: Option<String>,
    /// Times its ERROR member was repaired.
    pub repairs: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Board {
    pub phase: Phase,
    /// The cluster's APIServerLoadBalancerReady.
    pub gate: Option<Gate>,
    pub machines: Vec<MachineRow>,
    /// ACTIVE members in the API pool, and all members there.
    pub pool_active: usize,
    pub pool_members: usize,
    /// Members of the API pool that serve: ACTIVE, and ONLINE (or NO_MONITOR: unchecked).
    pub pool_serving: usize,
    /// The newest events, newest last: `Reason: note`.
    pub events: Vec<String>,
}

/// The figures of the summary, folded from boards.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// The fewest ACTIVE members in the API pool during the rollout.
    pub min_active: Option<usize>,
    /// Time the API pool had no ACTIVE member during the rollout.
    pub zero_active: Duration,
    /// Time the gate held during the rollout, by reason.
    pub gate_held: BTreeMap<String, Duration>,
    /// Control-plane machines seen with a providerID while their member was not ACTIVE.
    pub released_early: BTreeSet<String>,
    /// The fewest serving members in the API pool during the rollout.
    pub min_serving: Option<usize>,
    /// Control-plane machines seen with a providerID while their member did not serve
    /// (ACTIVE, but its health monitor not reading ONLINE): capacity Cluster API counts and
    /// nobody has.
    pub released_not_serving: BTreeSet<String>,
    /// When each joining machine's member was first seen ACTIVE, and when it was released:
    /// the difference is what waiting for it to serve added.
    pub joins: BTreeMap<String, (Option<Duration>, Option<Duration>)>,
    /// When each leaving machine's member was first seen DRAINING (weight 0), and when it was
    /// gone: the drain.
    pub drains: BTreeMap<String, (Option<Duration>, Option<Duration>)>,
    /// Time sampled so far: the clock of `joins` and `drains`.
    pub clock: Duration,
    pub stuck: BTreeSet<String>,
    /// Machines whose member was seen in ERROR.
    pub errored: BTreeSet<String>,
    /// Repairs per machine.
    pub repairs: BTreeMap<String, u32>,
}

impl Stats {
    /// Adds what `board` showed for `elapsed` (the time since the previous sample).
    pub fn record(&mut self, board: &Board, elapsed: Duration) {
        let rolling = board.phase.stage == Stage::RollingOut;
        if rolling {
            let active = board.pool_active;
            self.min_active = Some(self.min_active.map_or(active, |min| min.min(active)));
            if active == 0 {
                self.zero_active += elapsed;
            }
            if let Some(gate) = board.gate.as_ref().filter(|g| !g.ready) {
                *self.gate_held.entry(gate.reason.clone()).or_default() += elapsed;
            }
        }
        self.clock += elapsed;
        if rolling {
            let serving = board.pool_serving;
            self.min_serving = Some(self.min_serving.map_or(serving, |min| min.min(serving)));
        }
        let deleting_cluster = board.phase.stage == Stage::Deleting;
        for machine in &board.machines {
            let joining = machine.control_plane && !machine.deleting;
            let member_active = machine.member.as_deref() == Some("ACTIVE");
            if joining && machine.released && !member_active && !deleting_cluster {
                self.released_early.insert(machine.name.clone());
            }
            let serves = matches!(machine.operating.as_deref(), Some("ONLINE" | "NO_MONITOR"));
            if joining && machine.released && !serves && !deleting_cluster {
                self.released_not_serving.insert(machine.name.clone());
            }
            if rolling {
                self.time_rollout_steps(machine);
            }
            if machine.gate_reason.as_deref() == Some("MemberStuck") {
                self.stuck.insert(machine.name.clone());
            }
            if machine.member.as_deref() == Some("ERROR") {
                self.errored.insert(machine.name.clone());
            }
            if machine.repairs > 0 {
                let most = self.repairs.entry(machine.name.clone()).or_default();
                *most = (*most).max(machine.repairs);
            }
        }
    }

    pub fn gate_held_total(&self) -> Duration {
        self.gate_held.values().sum()
    }

    /// Notes when a joining member went ACTIVE and its machine was released, and when a
    /// leaving member began draining and was gone.
    fn time_rollout_steps(&mut self, machine: &MachineRow) {
        let now = self.clock;
        if machine.control_plane && !machine.deleting {
            let join = self.joins.entry(machine.name.clone()).or_default();
            if machine.member.as_deref() == Some("ACTIVE") && join.0.is_none() {
                join.0 = Some(now);
            }
            if machine.released && join.1.is_none() {
                join.1 = Some(now);
            }
        }
        if machine.control_plane && machine.deleting {
            let drain = self.drains.entry(machine.name.clone()).or_default();
            if machine.operating.as_deref() == Some("DRAINING") && drain.0.is_none() {
                drain.0 = Some(now);
            }
            if drain.0.is_some() && machine.member.is_none() && drain.1.is_none() {
                drain.1 = Some(now);
            }
        }
    }

    /// The median time from a new member's ACTIVE to its machine's release, over machines
    /// whose member was seen ACTIVE before they were released.
    pub fn median_serving_wait(&self) -> Option<Duration> {
        median(self.joins.values().filter_map(|(active, released)| {
            let (active, released) = ((*active)?, (*released)?);
            (released >= active).then(|| released - active)
        }))
    }

    /// The median time from a leaving member's weight 0 to its being gone.
    pub fn median_drain(&self) -> Option<Duration> {
        median(
            self.drains
                .values()
                .filter_map(|(from, until)| Some((*until)?.saturating_sub((*from)?))),
        )
    }
}

fn median(values: impl Iterator<Item = Duration>) -> Option<Duration> {
    let mut values: Vec<Duration> = values.collect();
    values.sort();
    values.get(values.len() / 2).copied()
}

/// The board as plain lines of what changed from `before` (for logs, when there is no
/// terminal to redraw).
pub fn changes(before: &Board, after: &Board) -> Vec<String> {
    let mut lines = Vec::new();
    if before.phase.stage != after.phase.stage {
        lines.push(format!("== {}", after.phase.stage.words()));
    }
    if before.phase.note != after.phase.note && !after.phase.note.is_empty() {
        lines.push(format!("story: {}", after.phase.note));
    }
    if before.gate != after.gate
        && let Some(gate) = &after.gate
    {
        let state = if gate.ready { "open" } else { "holding" };
        lines.push(format!("gate {state}: {} {}", gate.reason, gate.message));
    }
    for machine in &after.machines {
        let old = before.machines.iter().find(|m| m.name == machine.name);
        lines.extend(machine_changes(old, machine));
    }
    for gone in &before.machines {
        if !after.machines.iter().any(|m| m.name == gone.name) {
            lines.push(format!("machine {} gone", gone.name));
        }
    }
    let pool = |b: &Board| (b.pool_active, b.pool_members, b.pool_serving);
    if pool(before) != pool(after) {
        lines.push(format!(
            "API pool: {} of {} members ACTIVE, {} serving",
            after.pool_active, after.pool_members, after.pool_serving
        ));
    }
    let new_events = after
        .events
        .iter()
        .filter(|e| !before.events.contains(e))
        .map(|e| format!("event {e}"));
    lines.extend(new_events);
    lines
}

fn machine_changes(old: Option<&MachineRow>, new: &MachineRow) -> Vec<String> {
    let name = &new.name;
    let Some(old) = old else {
        let role = if new.control_plane {
            "control plane"
        } else {
            "worker"
        };
        return vec![format!("machine {name} ({role}) created")];
    };
    let mut lines = Vec::new();
    if old.server != new.server {
        lines.push(format!("machine {name}: server {}", new.server));
    }
    if (&old.member, &old.operating) != (&new.member, &new.operating) {
        let status = new.member.as_deref().unwrap_or("none");
        match new.operating.as_deref() {
            Some(operating) => lines.push(format!("machine {name}: member {status}/{operating}")),
            None => lines.push(format!("machine {name}: member {status}")),
        }
    }
    if old.gate_reason != new.gate_reason
        && let Some(reason) = &new.gate_reason
    {
        lines.push(format!("machine {name}: gate {reason}"));
    }
    if !old.released && new.released {
        lines.push(format!(
            "machine {name}: providerID set (released to Cluster API)"
        ));
    }
    if !old.deleting && new.deleting {
        lines.push(format!("machine {name}: deleting"));
    }
    lines
}

/// Samples the world into boards until `stop`; the story sets the phase.
pub struct Sampler {
    pub boards: watch::Receiver<Board>,
    pub stats: Arc<Mutex<Stats>>,
    pub phase: Arc<Mutex<Phase>>,
    task: JoinHandle<()>,
    stop: CancellationToken,
}

impl Sampler {
    pub fn start(client: kube::Client, cloud: Arc<OpenStackSim>) -> Self {
        let (sender, boards) = watch::channel(Board::default());
        let stats = Arc::new(Mutex::new(Stats::default()));
        let phase = Arc::new(Mutex::new(Phase::default()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(sample(
            Sources {
                client,
                cloud,
                phase: phase.clone(),
            },
            sender,
            stats.clone(),
            stop.clone(),
        ));
        Sampler {
            boards,
            stats,
            phase,
            task,
            stop,
        }
    }

    pub fn set_stage(&self, stage: Stage) {
        let mut phase = lock(&self.phase);
        phase.stage = stage;
        phase.note.clear();
    }

    pub fn note(&self, note: impl Into<String>) {
        lock(&self.phase).note = note.into();
    }

    pub fn rollout_steps(&self, done: u64, all: u64) {
        lock(&self.phase).rollout_steps = (done, all);
    }

    /// Stops sampling; returns the figures.
    pub async fn stop(self) -> Stats {
        self.stop.cancel();
        let _ = self.task.await;
        lock(&self.stats).clone()
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

struct Sources {
    client: kube::Client,
    cloud: Arc<OpenStackSim>,
    phase: Arc<Mutex<Phase>>,
}

async fn sample(
    sources: Sources,
    boards: watch::Sender<Board>,
    stats: Arc<Mutex<Stats>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A failed read skips one sample; the next one tries again.
        let Ok(board) = read_board(&sources).await else {
            continue;
        };
        let now = tokio::time::Instant::now();
        lock(&stats).record(&board, now - last);
        last = now;
        boards.send_replace(board);
    }
}

async fn read_board(sources: &Sources) -> Result<Board, kube::Error> {
    let client = &sources.client;
    // The machines before the cloud: a providerID seen now was set on an ACTIVE member,
    // which the cloud, read after, still shows.
    let machines: Api<OpenStackMachine> = Api::namespaced(client.clone(), NAMESPACE);
    let machines = machines.list(&ListParams::default()).await?.items;
    let owners: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let owners = owners.list(&ListParams::default()).await?.items;
    let clusters: Api<capo_api::OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster = clusters.get_opt(CLUSTER).await?;
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let events = events.list(&ListParams::default()).await?.items;
    let members = sources.cloud.member_truth();
    let pool: Vec<&MemberTruth> = members.iter().filter(|m| m.port == API_PORT).collect();
    let rows = machines
        .iter()
        .map(|machine| machine_row(machine, &owners, &pool))
        .collect();
    Ok(Board {
        phase: lock(&sources.phase).clone(),
        gate: cluster.as_ref().and_then(gate_of),
        machines: rows,
        pool_active: pool
            .iter()
            .filter(|m| m.provisioning_status == "ACTIVE")
            .count(),
        pool_members: pool.len(),
        pool_serving: pool
            .iter()
            .filter(|m| {
                m.provisioning_status == "ACTIVE"
                    && matches!(m.operating_status, "ONLINE" | "NO_MONITOR")
            })
            .count(),
        events: recent_events(events),
    })
}

fn machine_row(
    machine: &OpenStackMachine,
    owners: &[Machine],
    pool: &[&MemberTruth],
) -> MachineRow {
    let name = machine.name_any();
    let owner = owners.iter().find(|m| {
        m.spec
            .infrastructure_ref
            .as_ref()
            .is_some_and(|r| r.name == name)
    });
    let status = machine.status.as_ref();
    let seen = gate::member_address(machine, &[])
        .and_then(|address| pool.iter().find(|m| m.address == address));
    let member = seen.map(|m| m.provisioning_status.to_owned());
    let operating = seen.map(|m| m.operating_status.to_owned());
    MachineRow {
        control_plane: capi::is_control_plane(machine.labels()),
        deleting: machine.meta().deletion_timestamp.is_some()
            || owner.is_some_and(|o| o.meta().deletion_timestamp.is_some()),
        server: status
            .and_then(|s| s.instance_state.clone())
            .unwrap_or_else(|| "-".to_owned()),
        member,
        operating,
        released: machine.spec.provider_id.is_some(),
        gate_reason: status
            .and_then(|s| {
                conditions::find(&s.conditions, types::API_SERVER_LOAD_BALANCER_MEMBER_READY)
            })
            .map(|c| c.reason.clone()),
        repairs: machine
            .annotations()
            .get(REPAIRS_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        name,
    }
}

fn gate_of(cluster: &capo_api::OpenStackCluster) -> Option<Gate> {
    let status = cluster.status.as_ref()?;
    let condition = conditions::find(&status.conditions, types::API_SERVER_LOAD_BALANCER_READY)?;
    Some(Gate {
        ready: condition.status == "True",
        reason: condition.reason.clone(),
        message: condition.message.clone(),
    })
}

fn recent_events(mut events: Vec<Event>) -> Vec<String> {
    events.sort_by_key(|e| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    let ours: Vec<&Event> = events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() != Some("cluster-api-actor"))
        .collect();
    ours[ours.len().saturating_sub(RECENT_EVENTS)..]
        .iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.as_deref().unwrap_or("Normal"),
                e.reason.as_deref().unwrap_or(""),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, member: Option<&str>, released: bool) -> MachineRow {
        MachineRow {
            name: name.into(),
            control_plane: true,
            deleting: false,
            server: "ACTIVE".into(),
            member: member.map(str::to_owned),
            operating: member.map(|_| "ONLINE".to_owned()),
            released,
            gate_reason: None,
            repairs: 0,
        }
    }

    fn rolling(active: usize, gate: Option<&str>, machines: Vec<MachineRow>) -> Board {
        Board {
            phase: Phase {
                stage: Stage::RollingOut,
                ..Phase::default()
            },
            gate: gate.map(|reason| Gate {
                ready: reason == "Ready",
                reason: reason.into(),
                message: String::new(),
            }),
            machines,
            pool_active: active,
            pool_members: 3,
            pool_serving: active,
            events: Vec::new(),
        }
    }

    #[test]
    fn the_rollout_is_measured_and_the_time_before_it_is_not() {
        let mut stats = Stats::default();
        let second = Duration::from_secs(1);
        let mut before = rolling(0, Some("MembersPending"), Vec::new());
        before.phase.stage = Stage::BringingUp;
        stats.record(&before, second);
        assert_eq!(stats.min_active, None, "bring-up is not the rollout");
        stats.record(&rolling(3, Some("Ready"), Vec::new()), second);
        stats.record(&rolling(2, Some("MembersPending"), Vec::new()), second);
        stats.record(&rolling(2, Some("MemberStuck"), Vec::new()), second * 2);
        stats.record(&rolling(0, Some("Ready"), Vec::new()), second);
        assert_eq!(stats.min_active, Some(0));
        assert_eq!(stats.zero_active, second);
        assert_eq!(stats.gate_held_total(), second * 3);
        assert_eq!(stats.gate_held["MemberStuck"], second * 2);
    }

    #[test]
    fn a_machine_released_before_its_member_is_active_is_caught() {
        let mut stats = Stats::default();
        let early = row("early", Some("PENDING_CREATE"), true);
        let held = row("held", Some("PENDING_CREATE"), false);
        let fine = row("fine", Some("ACTIVE"), true);
        let mut leaving = row("leaving", None, true);
        leaving.deleting = true;
        stats.record(
            &rolling(1, None, vec![early, held, fine, leaving]),
            Duration::from_millis(100),
        );
        assert_eq!(stats.released_early.iter().collect::<Vec<_>>(), ["early"]);
    }

    #[test]
    fn a_machine_released_while_its_api_does_not_serve_is_caught_and_the_waits_are_timed() {
        let mut stats = Stats::default();
        let second = Duration::from_secs(1);
        let mut joining = row("new", Some("ACTIVE"), false);
        joining.operating = Some("DRAINING".into());
        let mut leaving = row("old", Some("ACTIVE"), true);
        leaving.deleting = true;
        leaving.operating = Some("DRAINING".into());
        stats.record(
            &rolling(2, None, vec![joining.clone(), leaving.clone()]),
            second,
        );
        joining.operating = Some("ONLINE".into());
        joining.released = true;
        stats.record(
            &rolling(2, None, vec![joining.clone(), leaving.clone()]),
            second * 2,
        );
        leaving.member = None;
        stats.record(
            &rolling(1, None, vec![joining.clone(), leaving]),
            second * 3,
        );
        assert_eq!(stats.median_serving_wait(), Some(second * 2));
        assert_eq!(stats.median_drain(), Some(second * 5));
        assert!(stats.released_not_serving.is_empty());
        let mut failing = row("failing", Some("ACTIVE"), true);
        failing.operating = Some("ERROR".into());
        stats.record(&rolling(1, None, vec![failing]), second);
        assert_eq!(
            stats.released_not_serving.iter().collect::<Vec<_>>(),
            ["failing"]
        );
    }

    #[test]
    fn plain_lines_tell_what_changed() {
        let before = rolling(2, Some("Ready"), vec![row("a", Some("ACTIVE"), true)]);
        let mut b = row("b", Some("PENDING_CREATE"), false);
        b.gate_reason = Some("MembersPending".into());
        let mut after = rolling(2, Some("MembersPending"), vec![b.clone()]);
        after.events.push("Normal MemberCreated: x".into());
        let lines = changes(&before, &after);
        assert!(
            lines.contains(&"gate holding: MembersPending ".to_owned()),
            "{lines:?}"
        );
        assert!(lines.contains(&"machine b (control plane) created".to_owned()));
        assert!(lines.contains(&"machine a gone".to_owned()));
        assert!(lines.contains(&"event Normal MemberCreated: x".to_owned()));
        let mut active = after.clone();
        active.machines[0].member = Some("ACTIVE".into());
        active.machines[0].released = true;
        assert_eq!(
            changes(&after, &active),
            [
                "machine b: member ACTIVE/ONLINE",
                "machine b: providerID set (released to Cluster API)"
            ]
        );
    }
}
