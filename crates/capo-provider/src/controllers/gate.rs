//! The API load balancer gate, as the controllers see it. Pure.
//!
//! - [`desired_members`] is the one place the desired member set of a cluster's API load
//!   balancer is computed: from the OpenStackCluster's pools and its control-plane
//!   OpenStackMachines. The cluster controller hands it to the engine; the machine
//!   controller creates (and removes) the Octavia members it names.
//! - The conditions the engine's verdict turns into, and what counts against `Ready`.

use std::collections::BTreeMap;

use capo_api::OpenStackMachine;
use capo_api::capi;
use capo_api::cluster::{
    LoadBalancerMemberStatus, LoadBalancerStatus, OperatingStatus as ApiOperating,
    ProvisioningStatus as ApiProvisioning,
};
use capo_api::common::MachineAddress;
use capo_api::conditions::{self, Desired, Status, reasons, types};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus};
use crate::membership::{
    DesiredMember, Health, LbVerdict, MemberTrack, ObjectName, Presence, Reason, Recalled,
    SeenMember,
};

/// The address a machine's member points at (see [`member_address_in`]).
pub fn member_address<'m>(
    machine: &'m OpenStackMachine,
    cluster_cidrs: &[String],
) -> Option<&'m str> {
    member_address_in(&machine.status.as_ref()?.addresses, cluster_cidrs)
}

/// The machine's internal address on the cluster network (within one of `cluster_cidrs`, its
/// subnets), as CAPO takes the address on the cluster network by name; without one there, any
/// internal address. IPv4 first: Nova lists a dual-stack network's addresses in no fixed order
/// (the real tier showed IPv6 first, then IPv4 on another run), and the VIP is IPv4 on the
/// usual IPv4-first network. A machine with ports on several networks has its addresses
/// listed by network name, so the first one can be on any of them.
pub fn member_address_in<'a>(
    addresses: &'a [MachineAddress],
    cluster_cidrs: &[String],
) -> Option<&'a str> {
    let internal: Vec<&MachineAddress> = addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .collect();
    let on_cluster: Vec<&MachineAddress> = internal
        .iter()
        .copied()
        .filter(|a| cluster_cidrs.iter().any(|cidr| within(&a.address, cidr)))
        .collect();
    let candidates = if on_cluster.is_empty() {
        internal
    } else {
        on_cluster
    };
    candidates
        .iter()
        .find(|a| a.address.parse::<std::net::Ipv4Addr>().is_ok())
        .or_else(|| candidates.first())
        .map(|a| a.address.as_str())
}

/// The CIDRs of the cluster network's subnets, where members' addresses are.
pub fn cluster_cidrs(network: Option<&capo_api::common::NetworkStatusWithSubnets>) -> Vec<String> {
    network
        .map(|n| n.subnets.iter().map(|s| s.cidr.clone()).collect())
        .unwrap_or_default()
}

/// Whether `address` is in `cidr` (`10.6.0.0/24`, `fd00::/64`); false when either does not
/// parse, or their families differ.
fn within(address: &str, cidr: &str) -> bool {
    use std::net::IpAddr;
    let Some((network, prefix)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(address), Ok(network), Ok(prefix)) = (
        address.parse::<IpAddr>(),
        network.parse::<IpAddr>(),
        prefix.parse::<u32>(),
    ) else {
        return false;
    };
    let masked = |bits: u128, width: u32| {
        let host_bits = width.saturating_sub(prefix);
        bits.checked_shr(host_bits).unwrap_or(0)
    };
    match (address, network) {
        (IpAddr::V4(a), IpAddr::V4(n)) if prefix <= 32 => {
            masked(u128::from(u32::from(a)), 32) == masked(u128::from(u32::from(n)), 32)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if prefix <= 128 => {
            masked(u128::from(a), 128) == masked(u128::from(n), 128)
        }
        _ => false,
    }
}

/// On an OpenStackMachine whose members are being removed (its Machine is deleting): the
/// machine controller sets it before it deletes a member, so the desired set drops the
/// machine first and nothing creates the member again. The value is when removal began.
pub const LEAVING_ANNOTATION: &str =
    "infrastructure.cluster.x-k8s.io/capo-rs-leaving-load-balancer";

/// On an OpenStackCluster: `https` or `tcp`, the API pools' health monitor, over the
/// controller's `--api-health-monitor`.
pub const MONITOR_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/capo-rs-api-health-monitor";

/// The API pools' health monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MonitorKind {
    /// A TCP connect (CAPO's): an open port counts, even while the API fails.
    #[default]
    Tcp,
    /// `GET /readyz` over TLS expecting 200: the API itself (kube-apiserver answers it to
    /// anonymous clients unless anonymous authentication is off).
    Https,
}

impl MonitorKind {
    /// The monitor `text` names (`tcp` or `https`, any case, spaces trimmed); `None` for
    /// anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "tcp" => Some(MonitorKind::Tcp),
            "https" => Some(MonitorKind::Https),
            _ => None,
        }
    }

    /// Octavia's `type`.
    pub fn octavia_type(self) -> &'static str {
        match self {
            MonitorKind::Tcp => "TCP",
            MonitorKind::Https => "HTTPS",
        }
    }
}

/// The monitor the cluster gets, and why it is not the one asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorChoice {
    /// The monitor the API pools get.
    pub kind: MonitorKind,
    /// Set when the choice differs from what was asked, or the annotation is unusable: the
    /// health condition's reason and message.
    pub note: Option<(&'static str, String)>,
}

/// The annotation over the flag; ovn checks TCP and UDP-CONNECT only, so HTTPS falls back
/// to TCP there (Octavia answers 501 to an HTTPS monitor on an ovn pool).
pub fn monitor_choice(
    default: MonitorKind,
    annotation: Option<&str>,
    provider: Option<&str>,
) -> MonitorChoice {
    let (asked, mut note) = match annotation.map(|a| (a, MonitorKind::parse(a))) {
        None => (default, None),
        Some((_, Some(kind))) => (kind, None),
        Some((text, None)) => (
            default,
            Some((
                reasons::INVALID_SPEC,
                format!(
                    "{MONITOR_ANNOTATION}: {text:?} is neither https nor tcp; using {}",
                    default.octavia_type()
                ),
            )),
        ),
    };
    let ovn = provider.is_some_and(|p| p.eq_ignore_ascii_case("ovn"));
    let kind = if ovn && asked == MonitorKind::Https {
        note = Some((
            reasons::HEALTH_MONITOR_TCP_FALLBACK,
            "the ovn provider checks TCP and UDP-CONNECT only: the API pools' monitor checks the TCP port, so ONLINE means the port is open, not that the API serves".into(),
        ));
        MonitorKind::Tcp
    } else {
        asked
    };
    MonitorChoice { kind, note }
}

/// Whether the machine's members are on their way out.
pub fn is_leaving(machine: &OpenStackMachine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
        || machine.annotations().contains_key(LEAVING_ANNOTATION)
}

fn is_cluster_control_plane(machine: &OpenStackMachine, cluster_name: &str) -> bool {
    capi::cluster_name(machine.labels()) == Some(cluster_name)
        && capi::is_control_plane(machine.labels())
}

/// Whether the machine belongs in the cluster's API pools: a control-plane machine of the
/// cluster (by Cluster API's labels), not leaving, whose server has an address.
pub fn wants_member(machine: &OpenStackMachine, cluster_name: &str) -> bool {
    is_cluster_control_plane(machine, cluster_name)
        && !is_leaving(machine)
        && member_address(machine, &[]).is_some()
}

/// The control-plane machines whose members are on their way out: the engine wakes them as
/// it sees their members go.
pub fn leaving_machines(cluster_name: &str, machines: &[OpenStackMachine]) -> Vec<ObjectName> {
    machines
        .iter()
        .filter(|m| is_cluster_control_plane(m, cluster_name) && is_leaving(m))
        .map(|m| ObjectName::new(m.namespace().unwrap_or_default(), m.name_any()))
        .collect()
}

/// Every member the cluster's API load balancer should have: each wanted machine in the pool
/// of each port. `now` is when they count as requested (the engine keeps the earliest).
pub fn desired_members(
    cluster_name: &str,
    cluster_cidrs: &[String],
    machines: &[OpenStackMachine],
    ports: &[u16],
    now: Instant,
) -> Vec<DesiredMember> {
    let mut wanted: Vec<&OpenStackMachine> = machines
        .iter()
        .filter(|m| wants_member(m, cluster_name))
        .collect();
    wanted.sort_by_key(|m| m.name_any());
    let mut members = Vec::with_capacity(wanted.len() * ports.len());
    for machine in wanted {
        let Some(address) = member_address(machine, cluster_cidrs) else {
            continue;
        };
        let owner = ObjectName::new(machine.namespace().unwrap_or_default(), machine.name_any());
        let served = machine.status.as_ref().is_some_and(|status| {
            conditions::status_of(
                &status.conditions,
                types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
            ) == Status::True
        });
        for port in ports {
            members.push(DesiredMember {
                owner: owner.clone(),
                name: machine.name_any(),
                address: address.to_owned(),
                port: *port,
                requested_at: now,
                member_id: None,
                served,
            });
        }
    }
    members
}

/// Routine progress: a rollout in motion, not something a person must look at. A member
/// ACTIVE and not yet seen serving is every serving-gate join's last step; one that has not
/// served past `--member-not-serving-after` (`MemberNotServing`) needs a person.
pub fn is_routine(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NotObserved
            | Reason::LoadBalancerPending
            | Reason::MembersPending
            | Reason::MembersMissing
            | Reason::MembersNotYetServing
    )
}

/// `APIServerLoadBalancerReady` from the engine's verdict.
pub fn gate_condition(verdict: &LbVerdict, now: Instant) -> Desired<'static> {
    let status = if verdict.is_ready() {
        Status::True
    } else if verdict.reason == Reason::NotObserved {
        Status::Unknown
    } else {
        Status::False
    };
    Desired::new(
        types::API_SERVER_LOAD_BALANCER_READY,
        status,
        verdict.reason.as_str(),
        verdict.message(now),
    )
}

/// `APIServerLoadBalancerHealthy` from the members' operating status: informational, and
/// where the serving gate cannot do its whole work (no monitor; a TCP fallback) it says so.
pub fn health_condition(
    health: &Health,
    verdict: &LbVerdict,
    monitor_note: Option<&(&'static str, String)>,
) -> Desired<'static> {
    let type_ = types::API_SERVER_LOAD_BALANCER_HEALTHY;
    match health {
        Health::Healthy if verdict.unmonitored => Desired::new(
            type_,
            Status::True,
            reasons::NO_HEALTH_MONITOR,
            "a pool has no health monitor (members read NO_MONITOR): the serving gate falls back to provisioning status",
        ),
        Health::Healthy => match monitor_note {
            Some((reason, message)) => Desired::new(type_, Status::True, reason, message.clone()),
            None => Desired::new(type_, Status::True, reasons::HEALTHY, ""),
        },
        Health::Unknown => Desired::new(
            type_,
            Status::Unknown,
            reasons::LOAD_BALANCER_NOT_OBSERVED,
            "load balancer not observed yet",
        ),
        Health::Degraded { members } => {
            let named: Vec<String> = members
                .iter()
                .map(|(name, status)| format!("{name} {}", status.as_str()))
                .collect();
            Desired::new(
                type_,
                Status::False,
                reasons::DEGRADED,
                format!("members not ONLINE: {}", named.join(", ")),
            )
        }
    }
}

/// The members as `status.apiServerManagedLoadBalancer.members` shows them, with wall-clock
/// times for the engine's instants.
pub fn member_statuses(
    members: &[MemberTrack],
    pools: &BTreeMap<u16, String>,
    now: Instant,
    wall_now: Timestamp,
) -> Vec<LoadBalancerMemberStatus> {
    // To the second, as the API server keeps it: a finer time never reads back equal.
    let wall = |at: Instant| -> Time {
        let ago = now.saturating_duration_since(at);
        let ago = k8s_openapi::jiff::SignedDuration::try_from(ago).unwrap_or_default();
        let at = wall_now.checked_sub(ago).unwrap_or(wall_now);
        Time(Timestamp::from_second(at.as_second()).unwrap_or(at))
    };
    members
        .iter()
        .map(|m| {
            let pool = m
                .pool_id
                .clone()
                .or_else(|| pools.get(&m.desired.port).cloned())
                .unwrap_or_default();
            let provisioning = match m.presence {
                Presence::Seen(status) => api_provisioning(status),
                Presence::Absent => None,
            };
            LoadBalancerMemberStatus {
                name: m.desired.name.clone(),
                pool,
                address: Some(m.desired.address.clone()),
                port: Some(i32::from(m.desired.port)),
                id: m.id.clone().filter(|_| provisioning.is_some()),
                provisioning_status: provisioning,
                operating_status: m.operating.and_then(api_operating),
                since: Some(wall(m.since)),
            }
        })
        .collect()
}

/// How far a member's `since`, mapped from the engine's clock to the wall's at each pass, may
/// drift from the recorded one and still be the same moment (the mapping moves with the
/// pass's duration and the second it rounds to).
const SINCE_DRIFT: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(2);

/// `fresh` (made by [`member_statuses`] from `tracks`, in their order) with each member's
/// `since` as `recorded` has it when the member is in the same state there and either the
/// times agree within `SINCE_DRIFT` (a pass that sees nothing new writes nothing) or the
/// engine's time is only when it first saw the member, later than the recorded one: after a
/// restart the engine knows nothing earlier, and the recorded time is the better one (moved
/// to the restart, every member of every cluster would be written again, saying less).
pub fn keep_recorded_since(
    mut fresh: Vec<LoadBalancerMemberStatus>,
    tracks: &[MemberTrack],
    recorded: &[LoadBalancerMemberStatus],
) -> Vec<LoadBalancerMemberStatus> {
    for (member, track) in fresh.iter_mut().zip(tracks) {
        let same = recorded.iter().find(|r| {
            r.name == member.name
                && r.pool == member.pool
                && r.id == member.id
                && r.provisioning_status == member.provisioning_status
                && r.operating_status == member.operating_status
        });
        let first_sight = track.first_seen == Some(track.since);
        if let (Some(kept), Some(Time(new))) = (same.and_then(|r| r.since.as_ref()), &member.since)
            && (new.duration_since(kept.0).abs() <= SINCE_DRIFT || (first_sight && *new > kept.0))
        {
            member.since = Some(kept.clone());
        }
    }
    fresh
}

/// What the recorded status says of the LB's members, for a restarted engine to confirm
/// against the LB's row ([`LoadBalancerStatus::members_as_of`]). `None` when there is no such
/// row, or a member seen is recorded without what the engine needs (an id, an address, a
/// port) or on its way (a row never vouches for that).
pub fn recalled(recorded: &LoadBalancerStatus) -> Option<Recalled> {
    let updated_at = recorded.members_as_of.clone()?;
    let mut members = Vec::new();
    for m in &recorded.members {
        let Some(provisioning) = m.provisioning_status else {
            continue;
        };
        let provisioning = cloud_provisioning(provisioning);
        if provisioning.is_pending() {
            return None;
        }
        members.push(SeenMember {
            pool_id: m.pool.clone(),
            id: m.id.clone()?,
            name: m.name.clone(),
            address: m.address.clone()?,
            port: u16::try_from(m.port?).ok()?,
            provisioning,
            operating: m
                .operating_status
                .map_or(OperatingStatus::Unknown, cloud_operating),
        });
    }
    Some(Recalled {
        updated_at,
        members,
    })
}

fn cloud_provisioning(status: ApiProvisioning) -> ProvisioningStatus {
    match status {
        ApiProvisioning::Active => ProvisioningStatus::Active,
        ApiProvisioning::PendingCreate => ProvisioningStatus::PendingCreate,
        ApiProvisioning::PendingUpdate => ProvisioningStatus::PendingUpdate,
        ApiProvisioning::PendingDelete => ProvisioningStatus::PendingDelete,
        ApiProvisioning::Deleted => ProvisioningStatus::Deleted,
        ApiProvisioning::Error => ProvisioningStatus::Error,
    }
}

fn cloud_operating(status: ApiOperating) -> OperatingStatus {
    match status {
        ApiOperating::Online => OperatingStatus::Online,
        ApiOperating::Draining => OperatingStatus::Draining,
        ApiOperating::Offline => OperatingStatus::Offline,
        ApiOperating::Degraded => OperatingStatus::Degraded,
        ApiOperating::Error => OperatingStatus::Error,
        ApiOperating::NoMonitor => OperatingStatus::NoMonitor,
    }
}

fn api_provisioning(status: ProvisioningStatus) -> Option<ApiProvisioning> {
    Some(match status {
        ProvisioningStatus::Active => ApiProvisioning::Active,
        ProvisioningStatus::PendingCreate => ApiProvisioning::PendingCreate,
        ProvisioningStatus::PendingUpdate => ApiProvisioning::PendingUpdate,
        ProvisioningStatus::PendingDelete => ApiProvisioning::PendingDelete,
        ProvisioningStatus::Deleted => ApiProvisioning::Deleted,
        ProvisioningStatus::Error => ApiProvisioning::Error,
        ProvisioningStatus::Unknown => return None,
    })
}

fn api_operating(status: OperatingStatus) -> Option<ApiOperating> {
    Some(match status {
        OperatingStatus::Online => ApiOperating::Online,
        OperatingStatus::Draining => ApiOperating::Draining,
        OperatingStatus::Offline => ApiOperating::Offline,
        OperatingStatus::Degraded => ApiOperating::Degraded,
        OperatingStatus::Error => ApiOperating::Error,
        OperatingStatus::NoMonitor => ApiOperating::NoMonitor,
        OperatingStatus::Unknown => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::common::{InstanceStatus, MachineAddress};
    use capo_api::machine::OpenStackMachineSpec;

    fn machine(name: &str, control_plane: bool, address: Option<&str>) -> OpenStackMachine {
        let mut labels = BTreeMap::from([(capi::labels::CLUSTER_NAME.to_owned(), "c1".to_owned())]);
        if control_plane {
            labels.insert(capi::labels::CONTROL_PLANE.into(), String::new());
        }
        let mut machine = OpenStackMachine::new(name, OpenStackMachineSpec::default());
        machine.metadata.namespace = Some("ns".into());
        machine.metadata.labels = Some(labels);
        machine.status = address.map(|a| InstanceStatus {
            addresses: vec![
                MachineAddress {
                    type_: "Hostname".into(),
                    address: name.into(),
                },
                MachineAddress {
                    type_: "InternalIP".into(),
                    address: a.into(),
                },
            ],
            ..InstanceStatus::default()
        });
        machine
    }

    #[test]
    fn a_dual_stack_member_is_its_ipv4_address_whatever_order_nova_lists_them_in() {
        let address = |type_: &str, address: &str| MachineAddress {
            type_: type_.into(),
            address: address.into(),
        };
        let v6_first = [
            address("InternalIP", "fd00:78::154"),
            address("InternalIP", "10.78.0.7"),
        ];
        assert_eq!(member_address_in(&v6_first, &[]), Some("10.78.0.7"));
        let v6_only = [
            address("ExternalIP", "172.24.4.9"),
            address("InternalIP", "fd00::9"),
        ];
        assert_eq!(member_address_in(&v6_only, &[]), Some("fd00::9"));
        assert_eq!(
            member_address_in(&[address("ExternalIP", "172.24.4.9")], &[]),
            None
        );
    }

    #[test]
    fn a_member_is_the_machines_address_on_the_cluster_network_whatever_network_nova_lists_first() {
        let address = |address: &str| MachineAddress {
            type_: "InternalIP".into(),
            address: address.into(),
        };
        // Nova lists networks by name: `capo-rs-storage` comes before the cluster's.
        let two_networks = [
            address("10.254.0.12"),
            address("fd00:6::5"),
            address("10.6.0.31"),
        ];
        let cluster = ["10.6.0.0/24".to_owned(), "fd00:6::/64".to_owned()];
        assert_eq!(
            member_address_in(&two_networks, &cluster),
            Some("10.6.0.31")
        );
        let v6_cluster = ["fd00:6::/64".to_owned()];
        assert_eq!(
            member_address_in(&two_networks, &v6_cluster),
            Some("fd00:6::5")
        );
        let elsewhere = ["192.168.0.0/16".to_owned()];
        assert_eq!(
            member_address_in(&two_networks, &elsewhere),
            Some("10.254.0.12"),
            "no address on the cluster's subnets: the first IPv4 one"
        );
    }

    #[test]
    fn cidr_containment_reads_both_families_and_refuses_nonsense() {
        assert!(within("10.6.0.31", "10.6.0.0/24"));
        assert!(!within("10.6.1.31", "10.6.0.0/24"));
        assert!(within("10.6.1.31", "0.0.0.0/0"));
        assert!(within("fd00:6::5", "fd00:6::/64"));
        assert!(!within("fd00:7::5", "fd00:6::/64"));
        assert!(!within("10.6.0.31", "fd00:6::/64"));
        assert!(!within("10.6.0.31", "10.6.0.0/33"));
        assert!(!within("10.6.0.31", "10.6.0.0"));
        assert!(!within("not an address", "10.6.0.0/24"));
    }

    #[test]
    fn the_desired_members_are_the_addressed_control_plane_machines_in_every_pool() {
        let now = Instant::now();
        let mut leaving = machine("cp-0", true, Some("10.0.0.9"));
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let mut other_cluster = machine("cp-x", true, Some("10.0.0.8"));
        other_cluster
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(capi::labels::CLUSTER_NAME.into(), "c2".into());
        let machines = vec![
            machine("cp-2", true, Some("10.0.0.2")),
            machine("cp-1", true, Some("10.0.0.1")),
            machine("cp-3", true, None),
            machine("worker", false, Some("10.0.0.5")),
            leaving,
            other_cluster,
        ];
        let members = desired_members("c1", &[], &machines, &[6443, 8443], now);
        let got: Vec<(String, String, u16)> = members
            .iter()
            .map(|m| (m.name.clone(), m.address.clone(), m.port))
            .collect();
        assert_eq!(
            got,
            [
                ("cp-1".into(), "10.0.0.1".into(), 6443),
                ("cp-1".into(), "10.0.0.1".into(), 8443),
                ("cp-2".into(), "10.0.0.2".into(), 6443),
                ("cp-2".into(), "10.0.0.2".into(), 8443),
            ]
        );
        assert_eq!(members[0].owner, ObjectName::new("ns", "cp-1"));
    }

    #[test]
    fn routine_progress_is_told_apart_from_what_needs_a_person() {
        assert!(is_routine(Reason::MembersPending));
        assert!(is_routine(Reason::LoadBalancerPending));
        assert!(is_routine(Reason::MembersNotYetServing));
        assert!(!is_routine(Reason::MemberNotServing));
        assert!(!is_routine(Reason::MemberStuck));
        assert!(!is_routine(Reason::MemberError));
        assert!(!is_routine(Reason::LoadBalancerError));
        assert!(!is_routine(Reason::Ready));
    }

    #[test]
    fn health_names_the_members_that_are_not_online() {
        let degraded = Health::Degraded {
            members: vec![("cp-1".into(), OperatingStatus::Offline)],
        };
        let verdict = verdict(false);
        let condition = health_condition(&degraded, &verdict, None);
        assert_eq!(condition.status, Status::False);
        assert_eq!(condition.message, "members not ONLINE: cp-1 OFFLINE");
        let healthy = health_condition(&Health::Healthy, &verdict, None);
        assert_eq!(
            (healthy.status, healthy.reason),
            (Status::True, reasons::HEALTHY)
        );
    }

    fn verdict(unmonitored: bool) -> LbVerdict {
        LbVerdict {
            reason: Reason::Ready,
            lb_status: Some(ProvisioningStatus::Active),
            lb_since: Instant::now(),
            members: Vec::new(),
            stale: Vec::new(),
            serving: 0,
            unmonitored,
            unchecked: Vec::new(),
            serving_gate: true,
        }
    }

    #[test]
    fn the_health_condition_says_when_the_serving_gate_cannot_check_serving() {
        let unmonitored = health_condition(&Health::Healthy, &verdict(true), None);
        assert_eq!(unmonitored.reason, reasons::NO_HEALTH_MONITOR);
        let choice = monitor_choice(MonitorKind::Tcp, Some("https"), Some("ovn"));
        assert_eq!(choice.kind, MonitorKind::Tcp, "ovn cannot check HTTPS");
        let fallback = health_condition(&Health::Healthy, &verdict(false), choice.note.as_ref());
        assert_eq!(fallback.reason, reasons::HEALTH_MONITOR_TCP_FALLBACK);
        assert!(fallback.message.contains("ovn"));
    }

    #[test]
    fn the_annotation_chooses_the_monitor_over_the_flag() {
        let amphora = Some("amphora");
        assert_eq!(
            monitor_choice(MonitorKind::Tcp, None, amphora),
            MonitorChoice {
                kind: MonitorKind::Tcp,
                note: None
            }
        );
        assert_eq!(
            monitor_choice(MonitorKind::Tcp, Some("HTTPS"), amphora).kind,
            MonitorKind::Https
        );
        assert_eq!(
            monitor_choice(MonitorKind::Https, Some("tcp"), None).kind,
            MonitorKind::Tcp
        );
        let odd = monitor_choice(MonitorKind::Https, Some("http"), amphora);
        assert_eq!(
            odd.kind,
            MonitorKind::Https,
            "an unusable value keeps the flag's"
        );
        assert!(
            odd.note.is_some_and(
                |(reason, n)| reason == reasons::INVALID_SPEC && n.contains("\"http\"")
            )
        );
    }

    fn seen(name: &str, id: Option<&str>, presence: Presence) -> MemberTrack {
        let now = Instant::now();
        MemberTrack {
            desired: DesiredMember {
                owner: ObjectName::new("ns", name),
                name: name.into(),
                address: format!("10.0.0.{}", name.len()),
                port: 6443,
                requested_at: now,
                member_id: None,
                served: false,
            },
            pool_id: Some("pool-1".into()),
            presence,
            operating: Some(OperatingStatus::Online),
            pool_monitored: Some(true),
            operating_since: now,
            up_since: Some(now),
            fell_at: None,
            since: now,
            first_seen: Some(now),
            active_at: None,
            id: id.map(str::to_owned),
            recreated: false,
        }
    }

    #[test]
    fn a_pass_that_sees_nothing_new_keeps_the_members_as_recorded() {
        let pools = BTreeMap::from([(6443, "pool-1".to_owned())]);
        let active = Presence::Seen(ProvisioningStatus::Active);
        let tracks = vec![seen("cp-1", Some("m-1"), active)];
        let now = Instant::now();
        let wall = Timestamp::from_second(1_800_000_000).expect("a time");
        let recorded = member_statuses(&tracks, &pools, now, wall);
        // The next pass maps the engine's clock to the wall's a moment later, off the second.
        let later = wall + std::time::Duration::from_millis(1_700);
        let next = member_statuses(&tracks, &pools, now, later);
        assert_ne!(next, recorded, "the fresh mapping drifted");
        assert_eq!(keep_recorded_since(next, &tracks, &recorded), recorded);
        // A member whose state changed takes the fresh time, to the second.
        let pending = [seen(
            "cp-1",
            Some("m-1"),
            Presence::Seen(ProvisioningStatus::PendingUpdate),
        )];
        let changed = member_statuses(&pending, &pools, now, later);
        let kept = keep_recorded_since(changed.clone(), &pending, &recorded);
        assert_eq!(kept, changed);
        let since = kept[0].since.as_ref().map(|t| t.0);
        assert_eq!(since.map(|t| t.subsec_nanosecond()), Some(0));
        // So does one back in the same state after a change the status missed: the engine
        // saw it before (first seen earlier), so its later time is news.
        let mut back = seen("cp-1", Some("m-1"), active);
        back.first_seen = back.since.checked_sub(std::time::Duration::from_secs(30));
        let much_later = wall + std::time::Duration::from_secs(5);
        let far = member_statuses(std::slice::from_ref(&back), &pools, now, much_later);
        assert_eq!(keep_recorded_since(far.clone(), &[back], &recorded), far);
    }

    #[test]
    fn a_restarted_engine_leaves_the_recorded_time_of_a_member_in_the_same_state() {
        let pools = BTreeMap::from([(6443, "pool-1".to_owned())]);
        let active = Presence::Seen(ProvisioningStatus::Active);
        let tracks = vec![seen("cp-1", Some("m-1"), active)];
        let now = Instant::now();
        let wall = Timestamp::from_second(1_800_000_000).expect("a time");
        let recorded = member_statuses(&tracks, &pools, now, wall);
        // Restarted ten minutes later, the engine first sees the member as it was recorded:
        // it knows no earlier time than its own first look.
        let restarted = wall + std::time::Duration::from_secs(600);
        let fresh = member_statuses(&tracks, &pools, now, restarted);
        assert_eq!(keep_recorded_since(fresh, &tracks, &recorded), recorded);
        // In another state it takes the fresh time.
        let offline = {
            let mut track = seen("cp-1", Some("m-1"), active);
            track.operating = Some(OperatingStatus::Offline);
            vec![track]
        };
        let fresh = member_statuses(&offline, &pools, now, restarted);
        assert_eq!(
            keep_recorded_since(fresh.clone(), &offline, &recorded),
            fresh
        );
    }

    #[test]
    fn the_recorded_members_are_recalled_as_the_engine_saw_them() {
        let pools = BTreeMap::from([(6443, "pool-1".to_owned())]);
        let now = Instant::now();
        let active = Presence::Seen(ProvisioningStatus::Active);
        let tracks = vec![
            seen("cp-1", Some("m-1"), active),
            seen("cp-22", None, Presence::Absent),
        ];
        let recorded = LoadBalancerStatus {
            members: member_statuses(&tracks, &pools, now, Timestamp::now()),
            members_as_of: Some("2026-11-23T12:00:05".into()),
            ..LoadBalancerStatus::default()
        };
        let got = recalled(&recorded).expect("recalled");
        assert_eq!(got.updated_at, "2026-11-23T12:00:05");
        // The absent member is not in the pool; the one seen is, as seen.
        assert_eq!(
            got.members,
            [SeenMember {
                pool_id: "pool-1".into(),
                id: "m-1".into(),
                name: "cp-1".into(),
                address: "10.0.0.4".into(),
                port: 6443,
                provisioning: ProvisioningStatus::Active,
                operating: OperatingStatus::Online,
            }]
        );
        // Nothing to recall: no row kept, a member on its way, or one without its id.
        let without_row = LoadBalancerStatus {
            members_as_of: None,
            ..recorded.clone()
        };
        assert_eq!(recalled(&without_row), None);
        let pending = vec![seen(
            "cp-1",
            Some("m-1"),
            Presence::Seen(ProvisioningStatus::PendingCreate),
        )];
        let on_its_way = LoadBalancerStatus {
            members: member_statuses(&pending, &pools, now, Timestamp::now()),
            ..recorded.clone()
        };
        assert_eq!(recalled(&on_its_way), None);
        let mut no_id = recorded;
        no_id.members[0].id = None;
        assert_eq!(recalled(&no_id), None);
    }
}
