//! What a machine needs, decided without any I/O: its server's spec, the next step for its
//! API load balancer members (joining or leaving), and the condition that says where they
//! stand. Time is passed in.

use std::collections::BTreeMap;
use std::time::Duration;

use capo_api::OpenStackMachineSpec;
use capo_api::cluster::OpenStackClusterStatus;
use capo_api::common::{FixedIp, IdOrFilter, InstanceStatus, MachineAddress, PortOpts};
use capo_api::conditions::{Desired, Status, reasons, types};
use capo_api::server::LocalObjectReference;
use capo_api::{OpenStackClusterSpec, OpenStackServerSpec};
use tokio::time::Instant;

use crate::cloud::octavia::{Member, OperatingStatus, ProvisioningStatus};
use crate::membership::{MemberVerdict, Presence, Snapshot};

/// What the server of a machine (or of the bastion) is built from, besides its own spec.
pub struct Placement<'a> {
    /// The OpenStackCluster's spec: its subnets, tags, and credentials to fall back on.
    pub cluster: &'a OpenStackClusterSpec,
    /// The OpenStackCluster's status: the cluster network's ID.
    pub status: &'a OpenStackClusterStatus,
    /// The group of the machine's role (control plane, worker, bastion), when managed.
    pub role_security_group: Option<String>,
    /// The Nova availability zone to boot in (the Machine's failure domain, or the
    /// bastion's zone); `None` lets Nova choose.
    pub availability_zone: Option<String>,
    /// The Secret holding the user data.
    pub user_data: Option<String>,
}

/// An OpenStackServer spec from a machine spec, exactly as CAPO builds it
/// (`openStackMachineSpecToOpenStackServerSpec`), so that the OpenStackServers of a cluster
/// CAPO built compare equal and are kept: one port when none are given; a port without a
/// network goes on the cluster network with a fixed IP in each of the cluster's `subnets`
/// (in `primarySubnet` alone when set);
/// each port with port security gets the role's managed group unless it names groups, then
/// the machine's groups; tags are the machine's then the cluster's, first seen kept, in
/// order; the credentials are the machine's or else the cluster's.
pub fn server_spec(
    machine: &OpenStackMachineSpec,
    placement: &Placement<'_>,
) -> OpenStackServerSpec {
    let network = placement.status.network.as_ref().map(|n| n.id.clone());
    // A primary subnet takes new machines alone (CAPO: to move off an exhausted subnet).
    let cluster_subnets = match &placement.cluster.primary_subnet {
        Some(primary) => std::slice::from_ref(primary),
        None => placement.cluster.subnets.as_slice(),
    };
    let subnets: Vec<FixedIp> = cluster_subnets
        .iter()
        .map(|subnet| FixedIp {
            subnet: Some(subnet.clone()),
            ip_address: None,
        })
        .collect();
    let mut ports = machine.ports.clone();
    if ports.is_empty() {
        ports.push(PortOpts::default());
    }
    for port in &mut ports {
        if port.network.is_none()
            && let Some(id) = &network
        {
            port.network = Some(IdOrFilter {
                id: Some(id.clone()),
                filter: None,
            });
            port.fixed_ips = subnets.clone();
        }
        let security_off = port.enable_port_security == Some(false);
        if !security_off
            && port.security_groups.is_empty()
            && let Some(group) = &placement.role_security_group
        {
            port.security_groups = vec![IdOrFilter {
                id: Some(group.clone()),
                filter: None,
            }];
        }
        port.security_groups
            .extend(machine.security_groups.iter().cloned());
    }
    let mut tags: Vec<String> = Vec::new();
    for tag in machine.tags.iter().chain(&placement.cluster.tags) {
        if !tags.contains(tag) {
            tags.push(tag.clone());
        }
    }
    OpenStackServerSpec {
        flavor: machine.flavor.filter.as_ref().and_then(|f| f.name.clone()),
        flavor_id: machine.flavor.id.clone(),
        image: machine.image.clone(),
        ssh_key_name: machine.ssh_key_name.clone().unwrap_or_default(),
        ports,
        security_groups: Vec::new(),
        trunk: machine.trunk.filter(|t| *t),
        tags,
        server_metadata: machine.server_metadata.clone(),
        config_drive: machine.config_drive,
        root_volume: machine.root_volume.clone(),
        additional_block_devices: machine.additional_block_devices.clone(),
        server_group: machine.server_group.clone(),
        identity_ref: machine
            .identity_ref
            .clone()
            .unwrap_or_else(|| placement.cluster.identity_ref.clone()),
        floating_ip_pool_ref: machine.floating_ip_pool_ref.clone(),
        availability_zone: placement.availability_zone.clone(),
        scheduler_hint_additional_properties: machine.scheduler_hint_additional_properties.clone(),
        user_data_ref: placement
            .user_data
            .clone()
            .map(|name| LocalObjectReference { name: Some(name) }),
    }
}

/// A machine's `spec.providerID`, as CAPO writes it: `openstack://<region>/<server ID>`, the
/// region of the machine's own credentials (none: `openstack:///<server ID>`).
pub fn provider_id(region: Option<&str>, instance: &str) -> String {
    format!("openstack://{}/{instance}", region.unwrap_or_default())
}

/// Cluster API's control-plane label and its value, when the Machine carries it and the
/// OpenStackMachine does not. CAPO tells a control-plane machine by its Machine; everything in
/// capo-rs (its members, the cluster's desired members, its security group) reads the label on
/// the OpenStackMachine, which KubeadmControlPlane writes but Cluster API's Machine controller
/// does not copy (only the cluster's name): a control plane made otherwise would have its
/// machines taken for workers and released with no member.
pub fn missing_control_plane_label(
    osm_labels: &BTreeMap<String, String>,
    machine_labels: &BTreeMap<String, String>,
) -> Option<(&'static str, String)> {
    let label = capo_api::capi::labels::CONTROL_PLANE;
    if osm_labels.contains_key(label) {
        return None;
    }
    machine_labels
        .get(label)
        .map(|value| (label, value.clone()))
}

/// A machine's addresses: its server's, and the server's name as `InternalDNS`, as CAPO
/// reports them. A kubelet that names its node after the server (the in-tree cloud provider
/// did) has its serving certificate's CSR approved only when a machine's InternalDNS matches
/// the node's name. No server yet: no addresses.
pub fn machine_addresses(
    server_addresses: &[MachineAddress],
    server_name: &str,
) -> Vec<MachineAddress> {
    if server_addresses.is_empty() {
        return Vec::new();
    }
    let mut addresses = server_addresses.to_vec();
    addresses.push(MachineAddress {
        type_: "InternalDNS".into(),
        address: server_name.to_owned(),
    });
    addresses
}

/// The managed security group of a machine's role, if the cluster manages them.
pub fn role_security_group(
    cluster: &OpenStackClusterSpec,
    status: &OpenStackClusterStatus,
    control_plane: bool,
) -> Option<String> {
    cluster.managed_security_groups.as_ref()?;
    let group = if control_plane {
        status.control_plane_security_group.as_ref()
    } else {
        status.worker_security_group.as_ref()
    };
    group.map(|g| g.id.clone())
}

/// One pool the machine's member belongs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// The load balancer port the pool serves.
    pub port: u16,
    /// Octavia's ID of the pool.
    pub id: String,
}

/// The machine's member in one pool, as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// The load balancer port of the member's pool.
    pub port: u16,
    /// The engine's verdict on the member.
    pub verdict: MemberVerdict,
    /// Octavia's ID of the member, once known.
    pub id: Option<String>,
    /// What the last poll showed (`None`: not in its pool).
    pub status: Option<ProvisioningStatus>,
    /// Its operating status, as the last poll showed it.
    pub operating: Option<OperatingStatus>,
}

/// The machine's members from the engine's snapshot: `None` while the engine does not (yet)
/// track every one of them (the cluster has not handed the machine over yet).
pub fn member_views(snapshot: &Snapshot, machine: &str, pools: &[Pool]) -> Option<Vec<MemberView>> {
    pools
        .iter()
        .map(|pool| {
            let track = snapshot
                .members
                .iter()
                .find(|m| m.desired.name == machine && m.desired.port == pool.port)?;
            let verdict = snapshot
                .verdict
                .members
                .iter()
                .find(|(name, port, _)| name == machine && *port == pool.port)
                .map(|(_, _, verdict)| *verdict)?;
            let status = match track.presence {
                Presence::Seen(status) => Some(status),
                Presence::Absent => None,
            };
            Some(MemberView {
                port: pool.port,
                verdict,
                id: track.id.clone(),
                status,
                operating: track.operating,
            })
        })
        .collect()
}

/// The next thing to do for a joining machine's members; one change per pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinStep {
    /// ACTIVE in every pool: the machine may be released to Cluster API.
    Released,
    /// Not in this pool: create it (the load balancer is ACTIVE).
    Create {
        /// The load balancer port of the member's pool.
        port: u16,
    },
    /// In ERROR: delete it so that it is created again.
    Repair {
        /// The load balancer port of the member's pool.
        port: u16,
        /// Octavia's ID of the member in ERROR.
        member_id: String,
    },
    /// In ERROR with every repair spent: a person must look.
    Failed {
        /// The load balancer port of the member's pool.
        port: u16,
    },
    /// PENDING past the stuck threshold: held, and said so.
    Stuck {
        /// The load balancer port of the member's pool.
        port: u16,
    },
    /// ACTIVE, but its monitor has not seen its API serve past the not-serving threshold:
    /// held, and said so. Nothing is repaired: a new member would not make the API serve.
    NotServing {
        /// The load balancer port of the member's pool.
        port: u16,
    },
    /// Created at weight 0 to keep it out of traffic, and up: set its weight to 1.
    Admit {
        /// The load balancer port of the member's pool.
        port: u16,
        /// Octavia's ID of the member to let in.
        member_id: String,
    },
    /// On its way (pending, or waiting for the load balancer to unlock).
    Wait,
}

/// Chooses the next step: what needs a person first, then repairs, then creations.
/// `change_unseen(port)`: this machine created or repair-deleted that port's member and no
/// poll since has shown it, so the snapshot is older than that change. `held_out`: the ports
/// whose member was created at weight 0 and not let in yet.
pub fn join_step(
    members: &[MemberView],
    lb_active: bool,
    repairs: u32,
    max_repairs: u32,
    held_out: &[u16],
    change_unseen: impl Fn(u16) -> bool,
) -> JoinStep {
    let first = |wanted: fn(&MemberVerdict) -> bool| members.iter().find(|m| wanted(&m.verdict));
    let is_error = |v: &MemberVerdict| matches!(v, MemberVerdict::Error { .. });
    if let Some(member) = first(is_error) {
        return match &member.id {
            Some(id) if repairs < max_repairs => {
                if lb_active && !change_unseen(member.port) {
                    JoinStep::Repair {
                        port: member.port,
                        member_id: id.clone(),
                    }
                } else {
                    JoinStep::Wait
                }
            }
            Some(_) => JoinStep::Failed { port: member.port },
            None => JoinStep::Wait,
        };
    }
    if let Some(member) = first(|v| matches!(v, MemberVerdict::Stuck { .. })) {
        return JoinStep::Stuck { port: member.port };
    }
    if let Some(member) = first(|v| matches!(v, MemberVerdict::NotServing { .. })) {
        return JoinStep::NotServing { port: member.port };
    }
    let missing = first(|v| matches!(v, MemberVerdict::Missing { .. }));
    if let Some(member) = missing.filter(|m| !change_unseen(m.port)) {
        return if lb_active {
            JoinStep::Create { port: member.port }
        } else {
            JoinStep::Wait
        };
    }
    // Up at weight 0 for the settle time, or serving while still recorded at weight 0 (a
    // monitor that went away): let it in before anything else.
    let admissible = members.iter().find(|m| match m.verdict {
        MemberVerdict::OutOfTraffic { .. } => true,
        MemberVerdict::Active => held_out.contains(&m.port),
        _ => false,
    });
    if let Some(member) = admissible {
        return match (&member.id, lb_active && !change_unseen(member.port)) {
            (Some(id), true) => JoinStep::Admit {
                port: member.port,
                member_id: id.clone(),
            },
            _ => JoinStep::Wait,
        };
    }
    // Never on a snapshot older than this machine's own last change (a weight set to 1 leaves
    // the member PENDING_UPDATE, which only a later poll shows).
    let all_active = members
        .iter()
        .all(|m| matches!(m.verdict, MemberVerdict::Active));
    if all_active && !members.iter().any(|m| change_unseen(m.port)) {
        JoinStep::Released
    } else {
        JoinStep::Wait
    }
}

/// What to look at for a member held as not serving: its kube-apiserver, or, when its pool's
/// monitor does not check it (NO_MONITOR), the member in Octavia: ovn-octavia-provider reports
/// a member it failed to add to OVN so.
fn not_serving_advice(members: &[MemberView], port: u16) -> &'static str {
    let unchecked = members
        .iter()
        .any(|m| m.port == port && m.operating == Some(OperatingStatus::NoMonitor));
    if unchecked {
        "the pool's health monitor does not check this machine's member (NO_MONITOR); look at the member in Octavia (ovn reports one it failed to add so)"
    } else {
        "the health monitor has not seen this machine's API serve; look at its kube-apiserver"
    }
}

fn not_in_pool(port: u16) -> String {
    format!("{port} not in its pool")
}

/// The member condition's message while none of the machine's members is in its pool.
pub fn not_in_pools(pools: &[Pool]) -> String {
    let ports: Vec<String> = pools.iter().map(|p| not_in_pool(p.port)).collect();
    ports.join(", ")
}

/// `APIServerLoadBalancerMemberReady` for a joining machine.
pub fn join_condition(
    step: &JoinStep,
    members: &[MemberView],
    repairs: u32,
    max_repairs: u32,
    now: Instant,
) -> Desired<'static> {
    let type_ = types::API_SERVER_LOAD_BALANCER_MEMBER_READY;
    let ports: Vec<String> = members.iter().map(|m| m.port.to_string()).collect();
    let named = |m: &MemberView| -> String {
        m.id.as_deref()
            .map(|id| format!(" (member {id})"))
            .unwrap_or_default()
    };
    let describe = |m: &MemberView| -> String {
        let ago = |since: Instant| now.saturating_duration_since(since).as_secs();
        match m.verdict {
            MemberVerdict::Active => format!("{} ACTIVE", m.port),
            // States on their way say no duration: the message stays the same from pass to
            // pass, so a status with nothing new is not written again.
            MemberVerdict::OutOfTraffic { .. } => {
                format!("{} ACTIVE and up at weight 0: letting it in", m.port)
            }
            // Its health checks' progress (not checked, OFFLINE until the monitor's rises
            // pass) is in the cluster's members; here it would be a write per check.
            MemberVerdict::NotYetServing { .. } => {
                format!("{} ACTIVE, its API not yet seen serving", m.port)
            }
            // Not serving and NO_MONITOR: its pool has a monitor that does not check it.
            MemberVerdict::NotServing { since }
                if m.operating == Some(OperatingStatus::NoMonitor) =>
            {
                format!(
                    "{}{} ACTIVE but no health check covers it (NO_MONITOR under its pool's monitor) for {}s",
                    m.port,
                    named(m),
                    ago(since)
                )
            }
            MemberVerdict::NotServing { since } => format!(
                "{}{} ACTIVE but its API does not serve ({}) for {}s",
                m.port,
                named(m),
                m.operating.map_or("not checked", OperatingStatus::as_str),
                ago(since)
            ),
            MemberVerdict::Pending { .. } => format!("{} PENDING", m.port),
            // A held rollout names the member, so that an operator can look it up.
            MemberVerdict::Stuck { since } => {
                format!(
                    "{}{} stuck in {} for {}s",
                    m.port,
                    named(m),
                    m.status.map_or("PENDING", ProvisioningStatus::as_str),
                    ago(since)
                )
            }
            MemberVerdict::Error { since } => {
                format!("{}{} in ERROR for {}s", m.port, named(m), ago(since))
            }
            MemberVerdict::Missing { .. } => not_in_pool(m.port),
            MemberVerdict::Deleting { .. } => format!("{} being deleted", m.port),
            MemberVerdict::Gone => format!("{} pool unknown", m.port),
        }
    };
    let state: Vec<String> = members.iter().map(describe).collect();
    let state = state.join(", ");
    match step {
        JoinStep::Released => Desired::new(
            type_,
            Status::True,
            reasons::READY,
            format!("member ACTIVE in every pool (ports {})", ports.join(", ")),
        ),
        JoinStep::Failed { port } => Desired::new(
            type_,
            Status::False,
            reasons::MEMBER_ERROR,
            format!(
                "member for port {port} in ERROR after {repairs} repairs: look at the load balancer, then delete the member to try again ({state})"
            ),
        ),
        JoinStep::Repair { port, .. } => Desired::new(
            type_,
            Status::False,
            reasons::MEMBER_ERROR,
            format!(
                "member for port {port} in ERROR: repairing it (attempt {} of {max_repairs}) ({state})",
                repairs + 1
            ),
        ),
        // What the waits before and after the weight's change say too: one message, not
        // three writes.
        JoinStep::Admit { .. } => Desired::new(
            type_,
            Status::False,
            reasons::MEMBERS_NOT_YET_SERVING,
            state,
        ),
        JoinStep::Stuck { .. } => Desired::new(
            type_,
            Status::False,
            reasons::MEMBER_STUCK,
            format!("the rollout is held: {state}"),
        ),
        JoinStep::NotServing { port } => Desired::new(
            type_,
            Status::False,
            reasons::MEMBER_NOT_SERVING,
            format!(
                "the rollout is held: {} ({state})",
                not_serving_advice(members, *port)
            ),
        ),
        JoinStep::Create { .. } | JoinStep::Wait => {
            let missing = members
                .iter()
                .any(|m| matches!(m.verdict, MemberVerdict::Missing { .. }));
            let error = members
                .iter()
                .any(|m| matches!(m.verdict, MemberVerdict::Error { .. }));
            let warming = members.iter().any(|m| {
                matches!(
                    m.verdict,
                    MemberVerdict::NotYetServing { .. } | MemberVerdict::OutOfTraffic { .. }
                )
            });
            let pending = members
                .iter()
                .any(|m| matches!(m.verdict, MemberVerdict::Pending { .. }));
            let reason = if error {
                reasons::MEMBER_ERROR
            } else if missing {
                reasons::MEMBERS_MISSING
            } else if warming && !pending {
                reasons::MEMBERS_NOT_YET_SERVING
            } else {
                reasons::MEMBERS_PENDING
            };
            Desired::new(type_, Status::False, reason, state)
        }
    }
}

/// The machine's member in one pool while it leaves: what the engine last saw there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaving {
    /// The load balancer port of the pool.
    pub port: u16,
    /// Octavia's ID of the pool.
    pub pool_id: String,
    /// Octavia's ID of the member.
    pub member_id: String,
    /// Its `provisioning_status` as last seen (PENDING_DELETE once its deletion is underway).
    pub status: ProvisioningStatus,
    /// Its health monitor says it does not serve (OFFLINE, ERROR): nothing to drain.
    pub failing: bool,
    /// Its weight was set to 0 during this removal.
    pub drained: bool,
    /// Other members of the pool ready now (ACTIVE; and serving, under the serving gate).
    pub others_active: usize,
}

/// A removal's drain: how long a member at weight 0 keeps its open connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    /// How long drained members keep their connections before they are deleted (zero: no drain).
    pub period: Duration,
    /// Since the first member's weight went to 0 in this removal (`None`: not yet).
    pub elapsed: Option<Duration>,
}

/// The next thing to do for a leaving machine's members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaveStep {
    /// The member is the last ready one of its pool and the cluster stays: it stays too.
    Hold {
        /// The load balancer port of the member's pool.
        port: u16,
    },
    /// The member was drained, and now no other member of its pool is ready (one stopped
    /// serving during the drain): its weight goes back to 1 and it is held.
    Restore {
        /// The load balancer port of the pool.
        port: u16,
        /// Octavia's ID of the pool.
        pool_id: String,
        /// Octavia's ID of the member.
        member_id: String,
    },
    /// Set the member's weight to 0: no new connections, open ones go on.
    Drain {
        /// The load balancer port of the pool.
        port: u16,
        /// Octavia's ID of the pool.
        pool_id: String,
        /// Octavia's ID of the member.
        member_id: String,
    },
    /// Drained; open connections get the rest of the drain period.
    Draining {
        /// What remains of the drain period.
        left: Duration,
    },
    /// Delete the member (drained for the whole period, or with nothing to drain).
    Delete {
        /// The load balancer port of the pool.
        port: u16,
        /// Octavia's ID of the pool.
        pool_id: String,
        /// Octavia's ID of the member.
        member_id: String,
    },
    /// Deleted; not yet seen gone, or the load balancer not yet ACTIVE again.
    WaitGone,
    /// Gone from every pool, seen by a poll after the removal began, the LB ACTIVE.
    Confirmed,
}

/// Whether a member of the pool other than `leaving` can serve as Octavia lists it now:
/// ACTIVE, and ONLINE under the serving gate. Read just before a drained member is deleted:
/// the engine's snapshot may be from before another member stopped serving during the drain.
/// Its weight does not count: a new member kept out of traffic (weight 0) until it serves is
/// let in once no other member serves, so requiring its weight would hold both for good.
pub fn another_member_serves(members: &[Member], leaving: &str, serving_gate: bool) -> bool {
    members.iter().any(|m| {
        m.id != leaving
            && m.provisioning_status == ProvisioningStatus::Active
            && (!serving_gate || m.operating_status == OperatingStatus::Online)
    })
}

/// Chooses the next removal step. `fresh` is whether the engine has polled since removal
/// began; `lb_active` whether it last saw the load balancer ACTIVE. Members that serve are
/// drained (weight 0) for `drain.period` before any is deleted.
pub fn leave_step(
    present: &[Leaving],
    cluster_deleting: bool,
    fresh: bool,
    lb_active: bool,
    drain: Drain,
) -> LeaveStep {
    let remaining: Vec<&Leaving> = present
        .iter()
        .filter(|m| m.status != ProvisioningStatus::PendingDelete)
        .collect();
    if let Some(last) = remaining.iter().find(|m| {
        !cluster_deleting && m.status == ProvisioningStatus::Active && m.others_active == 0
    }) {
        if last.drained && lb_active {
            return LeaveStep::Restore {
                port: last.port,
                pool_id: last.pool_id.clone(),
                member_id: last.member_id.clone(),
            };
        }
        return LeaveStep::Hold { port: last.port };
    }
    if let Some(member) = remaining.first() {
        if !lb_active {
            return LeaveStep::WaitGone;
        }
        if !drain.period.is_zero() {
            let undrained = remaining
                .iter()
                .find(|m| m.status == ProvisioningStatus::Active && !m.failing && !m.drained);
            if let Some(m) = undrained {
                return LeaveStep::Drain {
                    port: m.port,
                    pool_id: m.pool_id.clone(),
                    member_id: m.member_id.clone(),
                };
            }
            if let Some(elapsed) = drain.elapsed.filter(|e| *e < drain.period) {
                return LeaveStep::Draining {
                    left: drain.period - elapsed,
                };
            }
        }
        return LeaveStep::Delete {
            port: member.port,
            pool_id: member.pool_id.clone(),
            member_id: member.member_id.clone(),
        };
    }
    if present.is_empty() && fresh && lb_active {
        LeaveStep::Confirmed
    } else {
        LeaveStep::WaitGone
    }
}

/// A member of a leaving machine that Octavia has left in PENDING_DELETE for `stuck_after`
/// since its removal began (a lost flow): the Machine's deletion is held, and a person must
/// look.
pub fn stuck_leaving(
    present: &[Leaving],
    removing_for: Duration,
    stuck_after: Duration,
) -> Option<&Leaving> {
    if removing_for < stuck_after {
        return None;
    }
    present
        .iter()
        .find(|m| m.status == ProvisioningStatus::PendingDelete)
}

/// How long a member creation counts as unseen: after this, a member the engine still
/// does not show is created again (the create was lost).
pub const CREATE_UNSEEN_FOR: Duration = Duration::from_secs(60);

/// A control-plane machine that could carry the API floating IP of a cluster without a load
/// balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The OpenStackMachine's name.
    pub machine: String,
    /// Its port on the cluster network.
    pub port: String,
    /// Its server runs, and neither it nor its Machine is being deleted.
    pub fit: bool,
    /// Its Node joined: its API server answered kubeadm.
    pub joined: bool,
    /// Released to Cluster API (`spec.providerID`).
    pub released: bool,
    /// When it was created (seconds), to prefer the newest: the one a rollout keeps longest.
    pub created: i64,
}

/// The next thing to do with the API floating IP, for one control-plane machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressStep {
    /// Point the floating IP at this machine's port (the machine itself, or a successor).
    Attach {
        /// The OpenStackMachine that takes it.
        machine: String,
        /// Neutron's ID of that machine's port on the cluster network.
        port: String,
    },
    /// Where it is will do: on a fit machine (`Some`), or on a port capo-rs does not manage,
    /// which it leaves alone as CAPO does (`None`).
    Keep {
        /// The fit OpenStackMachine carrying it; `None` leaves it wherever it is.
        holder: Option<String>,
    },
    /// It is free, and this machine has no port on the cluster network to take it.
    NoPort,
    /// A leaving machine carries it, and no other machine can take it over.
    NoSuccessor,
}

/// For a machine whose server runs: take the floating IP when nobody fit carries it.
pub fn joining_address_step(
    attached: Option<&str>,
    own_port: Option<&str>,
    own_name: &str,
    others: &[Holder],
) -> AddressStep {
    let holder = attached.and_then(|port| others.iter().find(|h| h.port == port));
    match (attached, holder) {
        (Some(port), _) if Some(port) == own_port => AddressStep::Keep {
            holder: Some(own_name.to_owned()),
        },
        (Some(_), Some(holder)) if holder.fit => AddressStep::Keep {
            holder: Some(holder.machine.clone()),
        },
        // A port of no machine of this cluster: someone else's choice.
        (Some(_), None) => AddressStep::Keep { holder: None },
        // Free, or on a machine on its way out.
        _ => match own_port {
            Some(port) => AddressStep::Attach {
                machine: own_name.to_owned(),
                port: port.to_owned(),
            },
            None => AddressStep::NoPort,
        },
    }
}

/// For a machine on its way out: when it carries the floating IP, hand it to the fittest
/// other machine first (its Node joined, released, newest), so the endpoint never points
/// at a machine that is going.
pub fn leaving_address_step(
    attached: Option<&str>,
    own_port: Option<&str>,
    others: &[Holder],
) -> AddressStep {
    if attached.is_none() || attached != own_port {
        return AddressStep::Keep { holder: None };
    }
    others
        .iter()
        .filter(|h| h.fit)
        .max_by_key(|h| (h.joined, h.released, h.created))
        .map_or(AddressStep::NoSuccessor, |h| AddressStep::Attach {
            machine: h.machine.clone(),
            port: h.port.clone(),
        })
}

/// The port a machine has on `network`: resolved ports and created ports are in the same
/// order.
pub fn port_on_network(status: &InstanceStatus, network: &str) -> Option<String> {
    let index = status
        .resolved
        .as_ref()?
        .ports
        .iter()
        .position(|p| p.network_id == network)?;
    status
        .resources
        .as_ref()?
        .ports
        .get(index)
        .map(|p| p.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_reports_its_server_name_as_internal_dns_once_it_has_addresses() {
        let address = |type_: &str, address: &str| MachineAddress {
            type_: type_.into(),
            address: address.into(),
        };
        let server = [
            address("InternalIP", "10.6.0.4"),
            address("ExternalIP", "172.24.4.9"),
        ];
        assert_eq!(
            machine_addresses(&server, "cp-0"),
            vec![
                address("InternalIP", "10.6.0.4"),
                address("ExternalIP", "172.24.4.9"),
                address("InternalDNS", "cp-0"),
            ]
        );
        assert_eq!(machine_addresses(&[], "cp-0"), vec![]);
    }

    #[test]
    fn a_control_plane_machines_label_is_copied_only_when_missing() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let control_plane = labels(&[("cluster.x-k8s.io/control-plane", "")]);
        let worker = labels(&[("cluster.x-k8s.io/cluster-name", "c1")]);
        assert_eq!(
            missing_control_plane_label(&worker, &control_plane),
            Some(("cluster.x-k8s.io/control-plane", String::new()))
        );
        assert_eq!(
            missing_control_plane_label(&control_plane, &control_plane),
            None
        );
        assert_eq!(missing_control_plane_label(&worker, &worker), None);
        // The label is never taken away: a Machine without it leaves the OpenStackMachine's.
        assert_eq!(missing_control_plane_label(&control_plane, &worker), None);
    }

    #[test]
    fn provider_ids_read_as_capo_writes_them() {
        assert_eq!(provider_id(None, "abc"), "openstack:///abc");
        assert_eq!(
            provider_id(Some("RegionTwo"), "abc"),
            "openstack://RegionTwo/abc"
        );
    }

    fn view(port: u16, verdict: MemberVerdict) -> MemberView {
        MemberView {
            port,
            verdict,
            id: Some(format!("m-{port}")),
            status: None,
            operating: None,
        }
    }

    #[test]
    fn an_active_member_whose_api_does_not_serve_holds_the_machine_and_is_never_repaired() {
        let now = Instant::now();
        let warming = [view(6443, MemberVerdict::NotYetServing { since: now })];
        assert_eq!(
            join_step(&warming, true, 0, 3, &[], |_| false),
            JoinStep::Wait
        );
        let condition = join_condition(&JoinStep::Wait, &warming, 0, 3, now);
        assert_eq!(condition.reason, reasons::MEMBERS_NOT_YET_SERVING);
        let failing = [view(6443, MemberVerdict::NotServing { since: now })];
        let step = join_step(&failing, true, 0, 3, &[], |_| false);
        assert_eq!(step, JoinStep::NotServing { port: 6443 });
        let condition = join_condition(&step, &failing, 0, 3, now);
        assert_eq!(condition.reason, reasons::MEMBER_NOT_SERVING);
        assert!(
            condition.message.contains("m-6443"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_member_kept_out_of_traffic_is_let_in_before_the_machine_is_released() {
        let now = Instant::now();
        let up = [view(6443, MemberVerdict::OutOfTraffic { since: now })];
        let admit = JoinStep::Admit {
            port: 6443,
            member_id: "m-6443".into(),
        };
        assert_eq!(join_step(&up, true, 0, 3, &[6443], |_| false), admit);
        assert_eq!(
            join_step(&up, false, 0, 3, &[6443], |_| false),
            JoinStep::Wait,
            "not while the load balancer is locked"
        );
        // Serving although recorded at weight 0 (its monitor went away): let in, then released.
        let serving = [view(6443, MemberVerdict::Active)];
        assert_eq!(join_step(&serving, true, 0, 3, &[6443], |_| false), admit);
        assert_eq!(
            join_step(&serving, true, 0, 3, &[], |_| false),
            JoinStep::Released
        );
        assert_eq!(
            join_step(&serving, true, 0, 3, &[], |_| true),
            JoinStep::Wait,
            "not on a snapshot older than the weight change"
        );
    }

    #[test]
    fn a_machine_is_released_only_when_every_pool_has_its_member_active() {
        let now = Instant::now();
        let active = view(6443, MemberVerdict::Active);
        let pending = view(8443, MemberVerdict::Pending { since: now });
        let step = join_step(&[active.clone(), pending.clone()], true, 0, 3, &[], |_| {
            false
        });
        assert_eq!(step, JoinStep::Wait);
        let condition = join_condition(&step, &[active.clone(), pending], 0, 3, now);
        assert_eq!(condition.reason, reasons::MEMBERS_PENDING);
        assert_eq!(condition.status, Status::False);
        let both = [active.clone(), view(8443, MemberVerdict::Active)];
        assert_eq!(
            join_step(&both, true, 0, 3, &[], |_| false),
            JoinStep::Released
        );
        // An ACTIVE load balancer says nothing: a missing member is created, never passed.
        let missing = [active, view(8443, MemberVerdict::Missing { since: now })];
        assert_eq!(
            join_step(&missing, true, 0, 3, &[], |_| false),
            JoinStep::Create { port: 8443 }
        );
        assert_eq!(
            join_step(&missing, false, 0, 3, &[], |_| false),
            JoinStep::Wait
        );
        assert_eq!(
            join_step(&missing, true, 0, 3, &[], |_| true),
            JoinStep::Wait
        );
    }

    #[test]
    fn an_error_member_is_repaired_a_bounded_number_of_times_then_fails() {
        let now = Instant::now();
        let error = [view(6443, MemberVerdict::Error { since: now })];
        assert_eq!(
            join_step(&error, true, 2, 3, &[], |_| false),
            JoinStep::Repair {
                port: 6443,
                member_id: "m-6443".into()
            }
        );
        assert_eq!(
            join_step(&error, false, 2, 3, &[], |_| false),
            JoinStep::Wait
        );
        assert_eq!(
            join_step(&error, true, 2, 3, &[], |_| true),
            JoinStep::Wait,
            "a repair no poll has seen yet is not repeated (nor counted twice)"
        );
        let failed = join_step(&error, true, 3, 3, &[], |_| false);
        assert_eq!(failed, JoinStep::Failed { port: 6443 });
        let condition = join_condition(&failed, &error, 3, 3, now);
        assert_eq!(condition.reason, reasons::MEMBER_ERROR);
        assert!(
            condition.message.contains("after 3 repairs"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_stuck_member_holds_and_says_so() {
        let now = Instant::now();
        let stuck = [view(6443, MemberVerdict::Stuck { since: now })];
        let step = join_step(&stuck, true, 0, 3, &[], |_| false);
        assert_eq!(step, JoinStep::Stuck { port: 6443 });
        let condition = join_condition(&step, &stuck, 0, 3, now);
        assert_eq!(condition.reason, reasons::MEMBER_STUCK);
        assert!(condition.message.contains("held"));
        // A repair's delete that never ends is named as what it is.
        let mut deleting = view(6443, MemberVerdict::Stuck { since: now });
        deleting.status = Some(ProvisioningStatus::PendingDelete);
        let later = now + Duration::from_secs(312);
        let condition = join_condition(&step, &[deleting], 0, 3, later);
        assert!(
            condition
                .message
                .ends_with("6443 (member m-6443) stuck in PENDING_DELETE for 312s"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_leaving_member_left_in_pending_delete_is_stuck_after_the_threshold() {
        let stuck_after = Duration::from_secs(600);
        let going = [
            leaving(6443, ProvisioningStatus::Active, 2),
            leaving(8443, ProvisioningStatus::PendingDelete, 2),
        ];
        assert_eq!(
            stuck_leaving(&going, Duration::from_secs(599), stuck_after),
            None
        );
        assert_eq!(
            stuck_leaving(&going, stuck_after, stuck_after).map(|m| m.port),
            Some(8443)
        );
        let settled = [leaving(6443, ProvisioningStatus::Active, 2)];
        assert_eq!(stuck_leaving(&settled, stuck_after, stuck_after), None);
    }

    #[test]
    fn a_drained_member_goes_only_while_another_takes_traffic_now() {
        let member = |id: &str, operating: OperatingStatus, weight: Option<u32>| Member {
            id: id.to_owned(),
            name: String::new(),
            provisioning_status: ProvisioningStatus::Active,
            operating_status: operating,
            address: "10.6.0.3".to_owned(),
            protocol_port: 6443,
            subnet_id: None,
            weight,
            created_at: None,
            updated_at: None,
            tags: Vec::new(),
        };
        let old = member("old", OperatingStatus::Draining, Some(0));
        let new_up = member("new", OperatingStatus::Online, Some(1));
        let new_down = member("new", OperatingStatus::Error, Some(1));
        assert!(another_member_serves(
            &[old.clone(), new_up.clone()],
            "old",
            true
        ));
        assert!(!another_member_serves(
            &[old.clone(), new_down.clone()],
            "old",
            true
        ));
        // Under the provisioning gate, ACTIVE is enough (the real tier's members read
        // OFFLINE or NO_MONITOR for good).
        assert!(another_member_serves(
            &[old.clone(), new_down],
            "old",
            false
        ));
        // The leaving member itself does not count; a member kept out of traffic at weight 0
        // that passes its monitor does (it is let in once it is the only one).
        assert!(!another_member_serves(
            std::slice::from_ref(&old),
            "old",
            false
        ));
        let held_out = member("new", OperatingStatus::Online, Some(0));
        assert!(another_member_serves(&[old, held_out], "old", true));
        let mut pending = new_up;
        pending.provisioning_status = ProvisioningStatus::PendingUpdate;
        assert!(!another_member_serves(&[pending], "old", true));
    }

    fn leaving(port: u16, status: ProvisioningStatus, others_active: usize) -> Leaving {
        Leaving {
            port,
            pool_id: format!("pool-{port}"),
            member_id: format!("m-{port}"),
            status,
            failing: false,
            drained: false,
            others_active,
        }
    }

    const NO_DRAIN: Drain = Drain {
        period: Duration::ZERO,
        elapsed: None,
    };

    #[test]
    fn a_serving_member_is_drained_for_the_drain_period_before_it_is_deleted() {
        let period = Duration::from_secs(30);
        let fresh = Drain {
            period,
            elapsed: None,
        };
        let going = [leaving(6443, ProvisioningStatus::Active, 2)];
        assert!(
            matches!(
                leave_step(&going, false, true, true, fresh),
                LeaveStep::Drain { port: 6443, .. }
            ),
            "weight 0 first"
        );
        let mut drained = going.clone();
        drained[0].drained = true;
        let after = |secs| Drain {
            period,
            elapsed: Some(Duration::from_secs(secs)),
        };
        assert_eq!(
            leave_step(&drained, false, true, true, after(10)),
            LeaveStep::Draining {
                left: Duration::from_secs(20)
            }
        );
        assert!(matches!(
            leave_step(&drained, false, true, true, after(30)),
            LeaveStep::Delete { port: 6443, .. }
        ));
        // The last serving member is held before anything is drained.
        let last = [leaving(6443, ProvisioningStatus::Active, 0)];
        assert_eq!(
            leave_step(&last, false, true, true, fresh),
            LeaveStep::Hold { port: 6443 }
        );
        // Drained, then the other member stopped serving: back to weight 1, and held; not
        // while the load balancer is locked.
        let mut alone = drained.clone();
        alone[0].others_active = 0;
        assert!(matches!(
            leave_step(&alone, false, true, true, after(10)),
            LeaveStep::Restore { port: 6443, .. }
        ));
        assert_eq!(
            leave_step(&alone, false, true, false, after(10)),
            LeaveStep::Hold { port: 6443 }
        );
        // A member whose API fails (a failed node) has nothing worth draining.
        let mut failing = going.clone();
        failing[0].failing = true;
        assert!(matches!(
            leave_step(&failing, false, true, true, fresh),
            LeaveStep::Delete { .. }
        ));
        // A locked load balancer takes no weight change: wait.
        assert_eq!(
            leave_step(&going, false, true, false, fresh),
            LeaveStep::WaitGone
        );
    }

    #[test]
    fn the_last_active_member_of_a_pool_is_never_removed_while_the_cluster_stays() {
        let last = [leaving(6443, ProvisioningStatus::Active, 0)];
        assert_eq!(
            leave_step(&last, false, true, true, NO_DRAIN),
            LeaveStep::Hold { port: 6443 }
        );
        assert!(matches!(
            leave_step(&last, true, true, true, NO_DRAIN),
            LeaveStep::Delete { port: 6443, .. }
        ));
        let shared = [leaving(6443, ProvisioningStatus::Active, 2)];
        assert!(matches!(
            leave_step(&shared, false, true, true, NO_DRAIN),
            LeaveStep::Delete { .. }
        ));
        // A member that does not serve may always go.
        let broken = [leaving(6443, ProvisioningStatus::Error, 0)];
        assert!(matches!(
            leave_step(&broken, false, true, true, NO_DRAIN),
            LeaveStep::Delete { .. }
        ));
    }

    #[test]
    fn removal_is_confirmed_only_by_a_fresh_poll_with_the_lb_active() {
        let going = [leaving(6443, ProvisioningStatus::PendingDelete, 1)];
        assert_eq!(
            leave_step(&going, false, true, true, NO_DRAIN),
            LeaveStep::WaitGone
        );
        assert_eq!(
            leave_step(&[], false, false, true, NO_DRAIN),
            LeaveStep::WaitGone
        );
        assert_eq!(
            leave_step(&[], false, true, false, NO_DRAIN),
            LeaveStep::WaitGone
        );
        assert_eq!(
            leave_step(&[], false, true, true, NO_DRAIN),
            LeaveStep::Confirmed
        );
        let locked = [leaving(6443, ProvisioningStatus::Active, 1)];
        assert_eq!(
            leave_step(&locked, false, true, false, NO_DRAIN),
            LeaveStep::WaitGone
        );
    }

    fn holder(machine: &str, fit: bool, joined: bool, created: i64) -> Holder {
        Holder {
            machine: machine.into(),
            port: format!("port-{machine}"),
            fit,
            joined,
            released: joined,
            created,
        }
    }

    #[test]
    fn a_joining_machine_takes_the_api_address_only_when_nobody_fit_carries_it() {
        let others = [
            holder("old", true, true, 1),
            holder("going", false, true, 2),
        ];
        let attach = AddressStep::Attach {
            machine: "new".into(),
            port: "port-new".into(),
        };
        let step = |attached| joining_address_step(attached, Some("port-new"), "new", &others);
        assert_eq!(step(None), attach, "free: taken");
        assert_eq!(
            step(Some("port-going")),
            attach,
            "on a machine going: taken"
        );
        assert_eq!(
            step(Some("port-old")),
            AddressStep::Keep {
                holder: Some("old".into())
            },
            "on a fit machine: left there"
        );
        assert_eq!(
            step(Some("port-new")),
            AddressStep::Keep {
                holder: Some("new".into())
            }
        );
        assert_eq!(
            step(Some("port-of-someone-else")),
            AddressStep::Keep { holder: None },
            "a port capo-rs does not manage is left alone"
        );
        assert_eq!(
            joining_address_step(None, None, "new", &others),
            AddressStep::NoPort
        );
    }

    #[test]
    fn a_leaving_machine_hands_the_api_address_to_the_fittest_other_first() {
        let others = [
            holder("joined-old", true, true, 1),
            holder("joined-new", true, true, 5),
            holder("not-joined-newest", true, false, 9),
            holder("going", false, true, 10),
        ];
        assert_eq!(
            leaving_address_step(Some("port-me"), Some("port-me"), &others),
            AddressStep::Attach {
                machine: "joined-new".into(),
                port: "port-joined-new".into()
            }
        );
        assert_eq!(
            leaving_address_step(Some("port-joined-old"), Some("port-me"), &others),
            AddressStep::Keep { holder: None },
            "not ours: nothing to hand over"
        );
        assert_eq!(
            leaving_address_step(None, Some("port-me"), &others),
            AddressStep::Keep { holder: None }
        );
        assert_eq!(
            leaving_address_step(Some("port-me"), Some("port-me"), &others[3..]),
            AddressStep::NoSuccessor,
            "only machines on their way out: held"
        );
    }

    #[test]
    fn the_default_port_pins_an_address_in_each_cluster_subnet_or_in_the_primary_alone() {
        let by_id = |id: &str| capo_api::common::SubnetParam {
            id: Some(id.into()),
            filter: None,
        };
        let mut cluster = OpenStackClusterSpec {
            subnets: vec![by_id("v4"), by_id("v6")],
            ..OpenStackClusterSpec::default()
        };
        let status = OpenStackClusterStatus {
            network: Some(capo_api::common::NetworkStatusWithSubnets {
                id: "net".into(),
                ..Default::default()
            }),
            ..OpenStackClusterStatus::default()
        };
        let subnets_of = |cluster: &OpenStackClusterSpec| -> Vec<String> {
            let placement = Placement {
                cluster,
                status: &status,
                role_security_group: None,
                availability_zone: None,
                user_data: None,
            };
            let spec = server_spec(&OpenStackMachineSpec::default(), &placement);
            let port = spec.ports.first().expect("the default port");
            assert_eq!(
                port.network.as_ref().and_then(|n| n.id.as_deref()),
                Some("net")
            );
            port.fixed_ips
                .iter()
                .filter_map(|f| f.subnet.as_ref().and_then(|s| s.id.clone()))
                .collect()
        };
        assert_eq!(
            subnets_of(&cluster),
            ["v4", "v6"],
            "dual-stack: one of each"
        );
        cluster.primary_subnet = Some(by_id("v6"));
        assert_eq!(subnets_of(&cluster), ["v6"], "the primary subnet alone");
    }
}
