//! A control-plane machine's members in its cluster's API load balancer: joining (create,
//! repair, release once ACTIVE everywhere), and leaving (capo-rs's pre-terminate hook on the
//! Machine, or the machine's own deletion), never taking the last ACTIVE member of a pool.
//!
//! The engine's snapshot is what the machine sees: no poll of our own. Each change here asks
//! the engine to look soon (`changed_under`), and its change wakes the machine.

use std::collections::BTreeMap;
use std::time::Duration;

use capo_api::OpenStackCluster;
use capo_api::capi::{self, Machine};
use capo_api::cluster::LoadBalancerStatus;
use capo_api::common::{IdentityRef, InstanceStatus, NetworkStatusWithSubnets, SubnetParam};
use capo_api::conditions::{self, Desired, Status, reasons, types};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tokio::time::Instant;

use super::plan::{self, JoinStep, LeaveStep, Leaving, Pool};
use super::{MachineError, Owners, Pass};
use crate::cloud::octavia::{MemberSpec, OperatingStatus, ProvisioningStatus};
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::cluster::plan::{Names, load_balancer as lb_spec, tags as lb_tags};
use crate::controllers::gate;
use crate::controllers::outcome::Outcome;
use crate::controllers::server::resolve::primary_subnet;
use crate::membership::{MemberVerdict, Presence, Reason, Snapshot};

/// On an OpenStackMachine: how many times its members in ERROR were deleted to be created
/// again. Kept on the object so that a restart does not reset the bound.
pub const REPAIRS_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/capo-rs-lb-member-repairs";

/// The cluster's API load balancer, as a control-plane machine needs it.
pub struct LbRef {
    pub id: String,
    pub pools: Vec<Pool>,
    pub names: Names,
    pub identity: IdentityRef,
    /// The cluster is going away: its load balancer goes with every member at once.
    pub cluster_deleting: bool,
    /// Every member carries the cluster's tags, as CAPO's do.
    pub tags: Vec<String>,
    /// Set when the load balancer sits on another network than the machines: members then
    /// name the cluster network's primary subnet, or Octavia could not reach them.
    pub member_subnet: Option<MemberSubnet>,
    /// The cluster network's subnets: a member is the machine's address there.
    pub cluster_cidrs: Vec<String>,
    /// New members start at weight 0, out of traffic, until their monitor sees them up, when
    /// other members serve: the serving gate is on, the pools have monitors, and the provider
    /// honours weights (ovn ignores them).
    pub keep_out: bool,
}

/// Where members are, when that is not the load balancer's own network.
pub struct MemberSubnet {
    pub network: NetworkStatusWithSubnets,
    pub primary: Option<SubnetParam>,
}

/// The load balancer a machine joins: only control-plane machines, only when the cluster
/// has one and has recorded its pools.
pub fn load_balancer(pass: &Pass<'_>, owners: &Owners, infra: &OpenStackCluster) -> Option<LbRef> {
    if !capi::is_control_plane(pass.osm.labels()) {
        return None;
    }
    lb_spec(&infra.spec)?;
    let recorded = infra
        .status
        .as_ref()?
        .api_server_managed_load_balancer
        .as_ref()?;
    let pools: Vec<Pool> = recorded
        .pools
        .iter()
        .filter_map(|p| {
            Some(Pool {
                port: u16::try_from(p.port).ok()?,
                id: p.pool_id.clone(),
            })
        })
        .collect();
    if pools.is_empty() || recorded.id.is_empty() {
        return None;
    }
    let cluster_deleting = cluster_deleting(owners, infra);
    let monitored = recorded.pools.iter().all(|p| p.monitor_id.is_some());
    let ovn = lb_spec(&infra.spec)
        .and_then(|lb| lb.provider.as_deref())
        .is_some_and(|provider| provider.eq_ignore_ascii_case("ovn"));
    let keep_out = pass.ctx.engine.rules().serving.is_some() && monitored && !ovn;
    Some(LbRef {
        id: recorded.id.clone(),
        pools,
        names: Names::new(
            &infra.namespace().unwrap_or_default(),
            &capi_cluster_name(owners, infra),
        ),
        identity: infra.spec.identity_ref.clone(),
        cluster_deleting,
        tags: lb_tags(&infra.spec),
        member_subnet: member_subnet(infra, recorded),
        cluster_cidrs: gate::cluster_cidrs(infra.status.as_ref()?.network.as_ref()),
        keep_out,
    })
}

fn member_subnet(infra: &OpenStackCluster, recorded: &LoadBalancerStatus) -> Option<MemberSubnet> {
    let network = infra.status.as_ref()?.network.clone()?;
    let lb_network = recorded.load_balancer_network.as_ref()?;
    (lb_network.id != network.id).then(|| MemberSubnet {
        network,
        primary: infra.spec.primary_subnet.clone(),
    })
}

/// The cluster is going away (its OpenStackCluster or its Cluster API Cluster).
pub(super) fn cluster_deleting(owners: &Owners, infra: &OpenStackCluster) -> bool {
    infra.metadata.deletion_timestamp.is_some()
        || owners
            .cluster
            .as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
}

/// The Cluster API Cluster's name, which every name of the cluster's resources is built on
/// (as CAPO builds them; see `cluster::plan::Names`).
pub(super) fn capi_cluster_name(owners: &Owners, infra: &OpenStackCluster) -> String {
    owners
        .cluster
        .as_ref()
        .map(ResourceExt::name_any)
        .or_else(|| capi::cluster_name(infra.labels()).map(str::to_owned))
        .unwrap_or_else(|| infra.name_any())
}

/// The gate for a control-plane machine whose server runs: join, or leave when its Machine
/// waits for capo-rs's pre-terminate hook.
pub async fn reconcile(
    pass: &Pass<'_>,
    machine: &Machine,
    lb: &LbRef,
    status: &mut InstanceStatus,
) -> Result<Outcome, MachineError> {
    if machine.metadata.deletion_timestamp.is_some() {
        return leave_at_hook(pass, machine, leave(pass, lb, status)).await;
    }
    ensure_hook(pass, machine).await?;
    join(pass, lb, status).await
}

async fn cloud(pass: &Pass<'_>, lb: &LbRef) -> Result<CloudClient, MachineError> {
    Ok(crate::controllers::identity::cloud_client(pass.ctx, &pass.namespace, &lb.identity).await?)
}

/// `APIServerLoadBalancerMemberReady`, the machine's way in for API traffic.
pub(super) fn set(
    pass: &Pass<'_>,
    status: &mut InstanceStatus,
    reason: &str,
    state: Status,
    message: String,
) {
    let condition = Desired::new(
        types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
        state,
        reason,
        message,
    );
    pass.set(status, &condition);
}

/// A create or a repair's delete of the member for `port`: none is repeated until a poll
/// that started after it shows its effect.
fn change_note(port: u16) -> String {
    format!("member-changed/{port}")
}

fn note_change(pass: &Pass<'_>, port: u16) {
    pass.ctx.unnote(pass.key, &change_note(port));
    pass.ctx.note(pass.key, &change_note(port), Instant::now());
}

const REMOVAL_NOTE: &str = "member-removal";

/// On an OpenStackMachine: the ports whose member was created at weight 0 and not let in yet.
pub const HELD_OUT_ANNOTATION: &str =
    "infrastructure.cluster.x-k8s.io/capo-rs-member-out-of-traffic";

fn held_out(pass: &Pass<'_>) -> Vec<u16> {
    pass.osm
        .annotations()
        .get(HELD_OUT_ANNOTATION)
        .map(|ports| {
            ports
                .split(',')
                .filter_map(|p| p.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

async fn set_held_out(pass: &Pass<'_>, ports: &[u16]) -> Result<(), MachineError> {
    let value = (!ports.is_empty()).then(|| {
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    });
    set_annotation(pass, HELD_OUT_ANNOTATION, value).await
}

/// Lets a member kept out of traffic in: weight 1, now that its monitor sees it up.
async fn admit_member(
    pass: &Pass<'_>,
    lb: &LbRef,
    port: u16,
    member_id: &str,
    held: &[u16],
) -> Result<(), MachineError> {
    let Some(pool) = lb.pools.iter().find(|p| p.port == port) else {
        return Ok(());
    };
    let cloud = cloud(pass, lb).await?;
    match cloud
        .octavia()
        .set_member_weight(&pool.id, member_id, 1)
        .await
    {
        Ok(_) => {
            note_change(pass, port);
            let rest: Vec<u16> = held.iter().copied().filter(|p| *p != port).collect();
            set_held_out(pass, &rest).await?;
            tracing::info!(lb = %lb.id, member = member_id, port, "member let into traffic");
            let note = format!(
                "member for port {port} seen up at weight 0: weight 1, it takes traffic now"
            );
            pass.event(EventType::Normal, "MemberAdmitted", note).await;
        }
        Err(CloudError::Busy(_)) => {}
        Err(CloudError::NotFound(_)) => set_held_out(pass, &[]).await?,
        Err(error) => {
            return Err(MachineError::cloud("setting the member's weight to 1")(
                error,
            ));
        }
    }
    pass.ctx.engine.changed_under(&lb.id);
    Ok(())
}
/// When this removal first set a member's weight to 0.
const DRAIN_NOTE: &str = "member-drain";

/// The member for `port` was set to weight 0 in this removal.
fn drain_note(port: u16) -> String {
    format!("member-drained/{port}")
}

/// The member for `port` was given its weight back in this removal, at the noted time.
fn restore_note(port: u16) -> String {
    format!("member-restored/{port}")
}

/// Sets a leaving member's weight to 0, once per removal (the PUT locks the load balancer).
async fn drain_member(
    pass: &Pass<'_>,
    lb: &LbRef,
    port: u16,
    pool_id: &str,
    member_id: &str,
) -> Result<(), MachineError> {
    if set_leaving_weight(pass, lb, pool_id, member_id, 0).await? {
        let now = Instant::now();
        pass.ctx.note(pass.key, &drain_note(port), now);
        pass.ctx.note(pass.key, DRAIN_NOTE, now);
        tracing::info!(lb = %lb.id, member = member_id, port, "draining the member");
        let note = format!(
            "draining the member for port {port}: weight 0 for {}s before it is deleted",
            pass.ctx.config.drain_period.as_secs()
        );
        pass.event(EventType::Normal, "MemberDraining", note).await;
    }
    Ok(())
}

/// Gives a drained member its weight back: no other member of its pool serves any more. A
/// later drain starts its period afresh.
async fn restore_member(
    pass: &Pass<'_>,
    lb: &LbRef,
    port: u16,
    pool_id: &str,
    member_id: &str,
) -> Result<(), MachineError> {
    if set_leaving_weight(pass, lb, pool_id, member_id, 1).await? {
        pass.ctx.unnote(pass.key, &drain_note(port));
        pass.ctx.unnote(pass.key, DRAIN_NOTE);
        pass.ctx.unnote(pass.key, &restore_note(port));
        pass.ctx.note(pass.key, &restore_note(port), Instant::now());
        tracing::warn!(lb = %lb.id, member = member_id, port, "no other member serves: the drained member takes traffic again");
        let note = format!(
            "no other member of the pool for port {port} serves: this member takes traffic again (weight 1) and stays until another does"
        );
        pass.event(EventType::Warning, "MemberDrainUndone", note)
            .await;
    }
    Ok(())
}

/// Whether the weight was set (a member already gone counts); `false` when the load
/// balancer was busy.
async fn set_leaving_weight(
    pass: &Pass<'_>,
    lb: &LbRef,
    pool_id: &str,
    member_id: &str,
    weight: u32,
) -> Result<bool, MachineError> {
    let cloud = cloud(pass, lb).await?;
    let set = match cloud
        .octavia()
        .set_member_weight(pool_id, member_id, weight)
        .await
    {
        Ok(_) | Err(CloudError::NotFound(_)) => true,
        Err(CloudError::Busy(_)) => false,
        Err(error) => {
            let doing = if weight == 0 {
                "setting the member's weight to 0"
            } else {
                "setting the drained member's weight back to 1"
            };
            return Err(MachineError::cloud(doing)(error));
        }
    };
    pass.ctx.engine.changed_under(&lb.id);
    Ok(set)
}

async fn join(
    pass: &Pass<'_>,
    lb: &LbRef,
    status: &mut InstanceStatus,
) -> Result<Outcome, MachineError> {
    let safety_net = Outcome::Poll(pass.ctx.config.poll_max);
    let snapshot = pass.ctx.engine.snapshot(&lb.id);
    let observed = snapshot
        .as_ref()
        .is_some_and(|s| s.verdict.reason != Reason::NotObserved);
    let recorded = conditions::find(
        &status.conditions,
        types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
    )
    .is_some();
    // After a restart the recorded condition stays what it was until the engine has looked
    // (nothing is released before it has): writing Unknown, then the same condition again a
    // moment later, would be two writes per machine saying nothing.
    if !observed && recorded {
        return Ok(safety_net);
    }
    let Some(snapshot) = snapshot else {
        let message = "waiting for the membership engine's first look at the load balancer";
        set(
            pass,
            status,
            reasons::LOAD_BALANCER_NOT_OBSERVED,
            Status::Unknown,
            message.into(),
        );
        return Ok(safety_net);
    };
    let Some(views) = plan::member_views(&snapshot, &pass.name, &lb.pools) else {
        // Said as the engine says it a moment later, once the cluster has added this machine
        // to the members it wants: the same condition, not a second write.
        set(
            pass,
            status,
            reasons::MEMBERS_MISSING,
            Status::False,
            plan::not_in_pools(&lb.pools),
        );
        return Ok(safety_net);
    };
    let repairs = repairs(pass);
    let max_repairs = pass.ctx.config.member_repairs;
    let change_unseen = |port: u16| {
        pass.ctx
            .noted(pass.key, &change_note(port))
            .is_some_and(|at| {
                snapshot.last_poll.is_none_or(|polled| polled <= at)
                    && at.elapsed() < plan::CREATE_UNSEEN_FOR
            })
    };
    let lb_active = snapshot.verdict.lb_status == Some(ProvisioningStatus::Active);
    let held = held_out(pass);
    let step = plan::join_step(
        &views,
        lb_active,
        repairs,
        max_repairs,
        &held,
        change_unseen,
    );
    let now = Instant::now();
    pass.set(
        status,
        &plan::join_condition(&step, &views, repairs, max_repairs, now),
    );
    match step {
        JoinStep::Released => {
            if super::release(pass, status).await? {
                let waited = requested_ago(&snapshot, &pass.name, now);
                let serving = if snapshot.verdict.checks_serving() {
                    " and serving"
                } else {
                    ""
                };
                let note = format!(
                    "member ACTIVE{serving} in every pool after {waited}s: machine released to Cluster API (providerID set)"
                );
                pass.event(EventType::Normal, "MemberActive", note).await;
                if repairs > 0 {
                    let note = format!("member ACTIVE again after {repairs} repairs");
                    pass.event(EventType::Normal, "MemberRepaired", note).await;
                }
            }
            Ok(Outcome::Settled)
        }
        JoinStep::Create { port } => {
            // Out of traffic protects only the traffic others serve: the first members of a
            // cluster take it at once.
            let others_serve = snapshot.verdict.members.iter().any(|(name, p, verdict)| {
                *name != pass.name && *p == port && *verdict == MemberVerdict::Active
            });
            create_member(pass, lb, status, port, lb.keep_out && others_serve).await?;
            Ok(safety_net)
        }
        JoinStep::Repair { port, member_id } => {
            repair_member(pass, lb, port, &member_id, repairs).await?;
            Ok(safety_net)
        }
        JoinStep::Admit { port, member_id } => {
            admit_member(pass, lb, port, &member_id, &held).await?;
            Ok(safety_net)
        }
        JoinStep::Failed { .. } => Ok(Outcome::Settled),
        JoinStep::Stuck { .. } | JoinStep::NotServing { .. } | JoinStep::Wait => Ok(safety_net),
    }
}

/// How long ago the machine's first member was asked for, in whole seconds.
fn requested_ago(snapshot: &Snapshot, machine: &str, now: Instant) -> u64 {
    snapshot
        .members
        .iter()
        .filter(|m| m.desired.name == machine)
        .map(|m| {
            now.saturating_duration_since(m.desired.requested_at)
                .as_secs()
        })
        .max()
        .unwrap_or_default()
}

async fn create_member(
    pass: &Pass<'_>,
    lb: &LbRef,
    status: &InstanceStatus,
    port: u16,
    keep_out: bool,
) -> Result<(), MachineError> {
    let Some(pool) = lb.pools.iter().find(|p| p.port == port) else {
        return Ok(());
    };
    let Some(address) =
        gate::member_address_in(&status.addresses, &lb.cluster_cidrs).map(str::to_owned)
    else {
        return Ok(());
    };
    let cloud = cloud(pass, lb).await?;
    let name = lb.names.member(port, &pass.name);
    let mut spec = MemberSpec::new(&name, &address, port);
    spec.tags.clone_from(&lb.tags);
    if keep_out {
        // Recorded before the create, so that a lost answer cannot leave it at weight 0.
        let mut held = held_out(pass);
        if !held.contains(&port) {
            held.push(port);
            set_held_out(pass, &held).await?;
        }
        spec.weight = Some(0);
    }
    if let Some(on) = &lb.member_subnet {
        spec.subnet_id = primary_subnet(&cloud, on.primary.as_ref(), &on.network).await?;
    }
    let noted = || note_change(pass, port);
    match cloud.octavia().create_member(&pool.id, &spec).await {
        Ok(member) => {
            noted();
            tracing::info!(lb = %lb.id, member = %member.id, port, %address, "member created");
            let note = format!(
                "member {name} ({address}:{port}) created in pool {}",
                pool.id
            );
            pass.event(EventType::Normal, "MemberCreated", note).await;
        }
        // Already there (a create whose answer was lost): the engine will show it.
        Err(CloudError::Conflict(_)) => noted(),
        // The load balancer is locked: its unlock wakes us.
        Err(CloudError::Busy(_)) => {}
        Err(error) => {
            return Err(MachineError::cloud("creating the load balancer member")(
                error,
            ));
        }
    }
    pass.ctx.engine.changed_under(&lb.id);
    Ok(())
}

async fn repair_member(
    pass: &Pass<'_>,
    lb: &LbRef,
    port: u16,
    member_id: &str,
    repairs: u32,
) -> Result<(), MachineError> {
    let Some(pool) = lb.pools.iter().find(|p| p.port == port) else {
        return Ok(());
    };
    let cloud = cloud(pass, lb).await?;
    match cloud.octavia().delete_member(&pool.id, member_id).await {
        // Gone already: an earlier delete of ours went through; not another repair.
        Err(CloudError::NotFound(_)) => note_change(pass, port),
        Ok(()) => {
            note_change(pass, port);
            set_annotation(pass, REPAIRS_ANNOTATION, Some((repairs + 1).to_string())).await?;
            let note = format!(
                "member for port {port} in ERROR: deleted to create it again (repair {} of {})",
                repairs + 1,
                pass.ctx.config.member_repairs
            );
            tracing::warn!(lb = %lb.id, member = member_id, port, "repairing a member in ERROR");
            pass.event(EventType::Warning, "MemberRepairing", note)
                .await;
        }
        Err(CloudError::Busy(_)) => {}
        Err(error) => return Err(MachineError::cloud("deleting the member in ERROR")(error)),
    }
    pass.ctx.engine.changed_under(&lb.id);
    Ok(())
}

fn repairs(pass: &Pass<'_>) -> u32 {
    pass.osm
        .annotations()
        .get(REPAIRS_ANNOTATION)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How a removal pass ended.
pub enum Left {
    /// The members are gone (or there never were any): go on.
    Done,
    Waiting(Outcome),
}

/// Removes the machine's members from every pool and confirms they are gone, one change per
/// pass; holds the last ACTIVE member of a pool while the cluster stays.
pub async fn leave(
    pass: &Pass<'_>,
    lb: &LbRef,
    status: &mut InstanceStatus,
) -> Result<Left, MachineError> {
    if lb.cluster_deleting {
        // The load balancer goes with the cluster, every member with it.
        return Ok(Left::Done);
    }
    let Some(address) = gate::member_address(pass.osm, &lb.cluster_cidrs).map(str::to_owned) else {
        return Ok(Left::Done);
    };
    let safety_net = Left::Waiting(Outcome::Poll(pass.ctx.config.poll_max));
    let Some(snapshot) = pass.ctx.engine.snapshot(&lb.id) else {
        let message = "removing: waiting for the membership engine's first look".to_owned();
        set(
            pass,
            status,
            reasons::MEMBER_REMOVING,
            Status::False,
            message,
        );
        return Ok(safety_net);
    };
    let drained: Vec<u16> = lb
        .pools
        .iter()
        .map(|p| p.port)
        .filter(|port| pass.ctx.noted(pass.key, &drain_note(*port)).is_some())
        .collect();
    // A member given its weight back reads DRAINING until the next poll: not drained.
    let restoring: Vec<u16> = lb
        .pools
        .iter()
        .map(|p| p.port)
        .filter(|port| {
            pass.ctx
                .noted(pass.key, &restore_note(*port))
                .is_some_and(|at| snapshot.last_poll.is_none_or(|polled| polled <= at))
        })
        .collect();
    let present = leaving_members(
        &snapshot,
        &pass.name,
        &address,
        &lb.pools,
        (&drained, &restoring),
    );
    let now = Instant::now();
    if present.iter().any(|m| m.drained) {
        // Drained before a restart lost the note: its period starts again now.
        pass.ctx.note(pass.key, DRAIN_NOTE, now);
    }
    pass.ctx.note(pass.key, REMOVAL_NOTE, now);
    let started = pass.ctx.noted(pass.key, REMOVAL_NOTE).unwrap_or(now);
    let fresh = snapshot.last_poll.is_some_and(|polled| polled > started);
    let lb_active = snapshot.verdict.lb_status == Some(ProvisioningStatus::Active);
    let drain = plan::Drain {
        period: pass.ctx.config.drain_period,
        elapsed: pass
            .ctx
            .noted(pass.key, DRAIN_NOTE)
            .map(|at| now.saturating_duration_since(at)),
    };
    match plan::leave_step(&present, false, fresh, lb_active, drain) {
        LeaveStep::Drain {
            port,
            pool_id,
            member_id,
        } => {
            mark_leaving(pass).await?;
            drain_member(pass, lb, port, &pool_id, &member_id).await?;
            let message =
                format!("draining the member for port {port}: weight 0, open connections go on");
            set(
                pass,
                status,
                reasons::MEMBER_REMOVING,
                Status::False,
                message,
            );
            Ok(safety_net)
        }
        LeaveStep::Draining { left } => {
            let message = format!(
                "draining: the member takes no new connections; deleted in {}s",
                left.as_secs()
            );
            set(
                pass,
                status,
                reasons::MEMBER_REMOVING,
                Status::False,
                message,
            );
            Ok(Left::Waiting(Outcome::Poll(
                left.max(Duration::from_millis(100)),
            )))
        }
        LeaveStep::Restore {
            port,
            pool_id,
            member_id,
        } => {
            restore_and_hold(pass, lb, status, port, &pool_id, &member_id).await?;
            Ok(safety_net)
        }
        LeaveStep::Hold { port } => {
            let message = format!(
                "removal held: this machine's member is the last ready one of the pool for port {port} (ACTIVE; and serving, under the serving gate); it goes once another member is"
            );
            set_held(pass, status, message);
            Ok(safety_net)
        }
        LeaveStep::Delete {
            port,
            pool_id,
            member_id,
        } => {
            mark_leaving(pass).await?;
            let cloud = cloud(pass, lb).await?;
            if drained.contains(&port)
                && !another_serves_now(pass, &cloud, &pool_id, &member_id).await?
            {
                // Another member stopped serving during the drain, unseen: not this one too.
                pass.ctx.engine.changed_under(&lb.id);
                restore_and_hold(pass, lb, status, port, &pool_id, &member_id).await?;
                return Ok(safety_net);
            }
            match cloud.octavia().delete_member(&pool_id, &member_id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {
                    let counted = format!("{}/counted", drain_note(port));
                    if let Some(drained) = pass.ctx.noted(pass.key, &drain_note(port))
                        && pass.ctx.noted(pass.key, &counted).is_none()
                    {
                        pass.ctx.note(pass.key, &counted, now);
                        pass.ctx
                            .metrics
                            .member_drained(now.saturating_duration_since(drained));
                    }
                    // Only a poll after this delete can confirm it.
                    pass.ctx.unnote(pass.key, REMOVAL_NOTE);
                    pass.ctx.note(pass.key, REMOVAL_NOTE, Instant::now());
                    tracing::info!(lb = %lb.id, member = %member_id, port, "removing the member");
                    let note = format!("removing the member for port {port} from pool {pool_id}");
                    pass.event(EventType::Normal, "MemberRemoving", note).await;
                }
                Err(CloudError::Busy(_)) => {}
                Err(error) => return Err(MachineError::cloud("deleting the member")(error)),
            }
            pass.ctx.engine.changed_under(&lb.id);
            let message = format!("removing the member for port {port}");
            set(
                pass,
                status,
                reasons::MEMBER_REMOVING,
                Status::False,
                message,
            );
            Ok(safety_net)
        }
        LeaveStep::WaitGone => {
            mark_leaving(pass).await?;
            pass.ctx.engine.changed_under(&lb.id);
            let removing_for = now.saturating_duration_since(started);
            let stuck_after = pass.ctx.engine.stuck_after();
            if let Some(stuck) = plan::stuck_leaving(&present, removing_for, stuck_after) {
                let message = format!(
                    "removal held: member {} for port {} stuck in PENDING_DELETE for {}s; the Machine waits on capo-rs's pre-terminate hook",
                    stuck.member_id,
                    stuck.port,
                    removing_for.as_secs()
                );
                set(pass, status, reasons::MEMBER_STUCK, Status::False, message);
                return Ok(safety_net);
            }
            let message = "removing: waiting to see the members gone and the load balancer ACTIVE";
            set(
                pass,
                status,
                reasons::MEMBER_REMOVING,
                Status::False,
                message.into(),
            );
            Ok(safety_net)
        }
        LeaveStep::Confirmed => {
            pass.ctx.unnote(pass.key, REMOVAL_NOTE);
            let message = "removed from every pool; the load balancer is ACTIVE";
            set(
                pass,
                status,
                reasons::MEMBER_REMOVED,
                Status::False,
                message.into(),
            );
            pass.event(
                EventType::Normal,
                "MemberRemoved",
                format!("removal confirmed: {address} is gone from every pool and the load balancer is ACTIVE"),
            )
            .await;
            Ok(Left::Done)
        }
    }
}

/// The removal waits: this machine's member is the last ready one of its pool.
fn set_held(pass: &Pass<'_>, status: &mut InstanceStatus, message: String) {
    set(
        pass,
        status,
        reasons::LAST_ACTIVE_MEMBER,
        Status::True,
        message,
    );
}

/// The machine's members still in the pools, each with how many other members of its pool
/// serve. Only desired members count as others: another machine's leaving member may be
/// on its way out too.
fn leaving_members(
    snapshot: &Snapshot,
    machine: &str,
    address: &str,
    pools: &[Pool],
    (drained, restoring): (&[u16], &[u16]),
) -> Vec<Leaving> {
    let mut present = Vec::new();
    for pool in pools {
        let tracked = snapshot.members.iter().find_map(|m| {
            let mine = m.desired.name == machine && m.desired.port == pool.port;
            match (mine, m.presence, &m.id) {
                (true, Presence::Seen(status), Some(id)) => Some((id.clone(), status)),
                _ => None,
            }
        });
        let stale = snapshot
            .stale
            .iter()
            .find(|m| m.pool_id == pool.id && m.address == address && m.port == pool.port)
            .map(|m| (m.id.clone(), m.provisioning));
        let Some((member_id, status)) = tracked.or(stale) else {
            continue;
        };
        if status == ProvisioningStatus::Deleted {
            continue;
        }
        // Ready by the gate's own rules: under the serving gate, ACTIVE and serving.
        let others_active = snapshot
            .verdict
            .members
            .iter()
            .filter(|(name, port, verdict)| {
                name != machine && *port == pool.port && *verdict == MemberVerdict::Active
            })
            .count();
        let operating = snapshot
            .members
            .iter()
            .find(|m| m.desired.name == machine && m.desired.port == pool.port)
            .and_then(|m| m.operating)
            .or_else(|| {
                snapshot
                    .stale
                    .iter()
                    .find(|m| m.id == member_id)
                    .map(|m| m.operating)
            });
        present.push(Leaving {
            port: pool.port,
            pool_id: pool.id.clone(),
            failing: matches!(
                operating,
                Some(OperatingStatus::Error | OperatingStatus::Offline)
            ),
            // At weight 0 by this removal, or as its monitor reads it (a restart forgets
            // the note; amphora shows a passing member at weight 0 as DRAINING).
            drained: drained.contains(&pool.port)
                || (operating == Some(OperatingStatus::Draining)
                    && !restoring.contains(&pool.port)),
            member_id,
            status,
            others_active,
        });
    }
    present
}

/// A drained member whose pool has no other serving member takes traffic again, and the
/// machine says its removal is held.
async fn restore_and_hold(
    pass: &Pass<'_>,
    lb: &LbRef,
    status: &mut InstanceStatus,
    port: u16,
    pool_id: &str,
    member_id: &str,
) -> Result<(), MachineError> {
    restore_member(pass, lb, port, pool_id, member_id).await?;
    let message = format!(
        "removal held: no other member of the pool for port {port} serves now, so this machine's drained member takes traffic again; it goes once another member serves"
    );
    set_held(pass, status, message);
    Ok(())
}

/// Whether another member of the pool takes traffic, as Octavia lists the pool now.
async fn another_serves_now(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    pool_id: &str,
    member_id: &str,
) -> Result<bool, MachineError> {
    let members = cloud
        .octavia()
        .list_members(pool_id)
        .await
        .map_err(MachineError::cloud("listing the pool's members"))?;
    let serving_gate = pass.ctx.engine.rules().serving.is_some();
    Ok(plan::another_member_serves(
        &members,
        member_id,
        serving_gate,
    ))
}

/// Takes the machine out of the desired members before its member is deleted, so nothing
/// creates it again.
async fn mark_leaving(pass: &Pass<'_>) -> Result<(), MachineError> {
    if pass
        .osm
        .annotations()
        .contains_key(gate::LEAVING_ANNOTATION)
    {
        return Ok(());
    }
    set_annotation(pass, gate::LEAVING_ANNOTATION, Some(pass.now.to_string())).await
}

async fn set_annotation(
    pass: &Pass<'_>,
    key: &str,
    value: Option<String>,
) -> Result<(), MachineError> {
    let api: Api<capo_api::OpenStackMachine> =
        Api::namespaced(pass.ctx.client.clone(), &pass.namespace);
    let patch = Patch::Merge(json!({ "metadata": { "annotations": { key: value } } }));
    api.patch(&pass.name, &PatchParams::default(), &patch)
        .await
        .map_err(MachineError::kube("annotating the OpenStackMachine"))?;
    Ok(())
}

async fn patch_machine_hook(
    pass: &Pass<'_>,
    machine: &Machine,
    value: Option<&str>,
) -> Result<(), MachineError> {
    let api: Api<Machine> = Api::namespaced(pass.ctx.client.clone(), &pass.namespace);
    let patch = Patch::Merge(json!({
        "metadata": { "annotations": { capi::labels::LB_MEMBER_HOOK: value } }
    }));
    match api
        .patch(&machine.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(MachineError::kube(
            "writing the pre-terminate hook on the Machine",
        )(e)),
    }
}

/// A deleting Machine: once Cluster API waits on capo-rs's pre-terminate hook, `leaving`
/// runs (it is not started before), and the hook goes when it is done.
pub(super) async fn leave_at_hook(
    pass: &Pass<'_>,
    machine: &Machine,
    leaving: impl Future<Output = Result<Left, MachineError>>,
) -> Result<Outcome, MachineError> {
    let ours = machine
        .annotations()
        .contains_key(capi::labels::LB_MEMBER_HOOK);
    if !(ours && capi::waits_for_pre_terminate_hooks(machine)) {
        // Draining, or our hook is gone: the Machine's next change wakes us.
        return Ok(Outcome::Settled);
    }
    match leaving.await? {
        Left::Done => {
            drop_hook(pass, machine).await?;
            Ok(Outcome::Settled)
        }
        Left::Waiting(outcome) => Ok(outcome),
    }
}

/// Puts capo-rs's pre-terminate hook on the control-plane Machine, so that Cluster API waits
/// for the member's removal before it terminates the machine.
pub(super) async fn ensure_hook(pass: &Pass<'_>, machine: &Machine) -> Result<(), MachineError> {
    if machine
        .annotations()
        .contains_key(capi::labels::LB_MEMBER_HOOK)
    {
        return Ok(());
    }
    patch_machine_hook(pass, machine, Some("")).await
}

/// Removes capo-rs's pre-terminate hook: the member is gone.
pub async fn drop_hook(pass: &Pass<'_>, machine: &Machine) -> Result<(), MachineError> {
    if !machine
        .annotations()
        .contains_key(capi::labels::LB_MEMBER_HOOK)
    {
        return Ok(());
    }
    patch_machine_hook(pass, machine, None).await?;
    tracing::info!(machine = %machine.name_any(), "pre-terminate hook removed");
    Ok(())
}

/// Warning events for what needs a person, once per transition of the member condition.
pub async fn announce(pass: &Pass<'_>, before: Option<&InstanceStatus>, after: &InstanceStatus) {
    let type_ = types::API_SERVER_LOAD_BALANCER_MEMBER_READY;
    let reason_of = |status: Option<&InstanceStatus>| {
        status
            .and_then(|s| conditions::find(&s.conditions, type_))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((reason, message)) = reason_of(Some(after)) else {
        return;
    };
    let was = reason_of(before).map(|(reason, _)| reason);
    if was.as_deref() == Some(reason.as_str()) {
        return;
    }
    let warnings: BTreeMap<&str, &str> = [
        (reasons::MEMBER_STUCK, "MemberStuck"),
        (reasons::MEMBER_NOT_SERVING, "MemberNotServing"),
        (reasons::MEMBER_ERROR, "MemberError"),
        (reasons::LAST_ACTIVE_MEMBER, "MemberRemovalHeld"),
    ]
    .into_iter()
    .collect();
    if let Some(event_reason) = warnings.get(reason.as_str()) {
        tracing::warn!(reason = %reason, %message, "load balancer member needs attention");
        pass.event(EventType::Warning, event_reason, message).await;
    }
}
