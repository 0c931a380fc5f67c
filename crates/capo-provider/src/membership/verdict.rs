//! The gate's verdicts: pure functions of what is tracked and the time.
//!
//! Ready means the load balancer is ACTIVE and every desired member is in its pool with
//! `provisioning_status` ACTIVE. Under the serving gate ([`GateRules::serving`]) a member whose
//! pool has a health monitor must also read `operating_status` ONLINE, and have read it for the
//! settle time: ovn reports a new member ONLINE before any check, and an amphora's haproxy
//! starts a new server UP until its first check fails. A member reading NO_MONITOR in a pool
//! with no health monitor falls back to provisioning status (and [`LbVerdict::unmonitored`]
//! says so); under a monitor, NO_MONITOR means nothing checks it, so it does not serve
//! ([`unchecked`]).

use std::time::Duration;

use tokio::time::Instant;

use capo_api::conditions::reasons;

pub use super::model::ServingRules;
use super::model::{LbTrack, MemberTrack, Presence};
use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus};

/// What a member must show to count as ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateRules {
    /// A member PENDING_* longer than this is stuck.
    pub stuck_after: Duration,
    /// The serving gate, when on; `None` is the provisioning gate.
    pub serving: Option<ServingRules>,
}

impl GateRules {
    /// The provisioning gate: ACTIVE is enough.
    pub fn provisioning(stuck_after: Duration) -> Self {
        GateRules {
            stuck_after,
            serving: None,
        }
    }
}

/// One desired member's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberVerdict {
    /// Ready: ACTIVE (and serving, under the serving gate).
    Active,
    /// ACTIVE, but its monitor has not (yet, or for long enough) seen it serve.
    NotYetServing {
        /// When its not-serving clock started: when it went ACTIVE, or when it last stopped
        /// serving.
        since: Instant,
    },
    /// ACTIVE and not serving for longer than the not-serving threshold.
    NotServing {
        /// When its not-serving clock started: when it went ACTIVE, or when it last stopped
        /// serving.
        since: Instant,
    },
    /// ACTIVE, kept out of traffic at weight 0, and its monitor has seen it up (DRAINING) for
    /// the settle time: it may be let in.
    OutOfTraffic {
        /// Since when its monitor has read it up (ONLINE or DRAINING) without a break.
        since: Instant,
    },
    /// PENDING_CREATE or PENDING_UPDATE, since then.
    Pending {
        /// When it went pending; for a member never seen ACTIVE nor re-created, when it was
        /// requested.
        since: Instant,
    },
    /// PENDING_* (PENDING_DELETE included) for longer than the stuck threshold.
    Stuck {
        /// When it went pending (as for `Pending`), or when it was first seen PENDING_DELETE.
        since: Instant,
    },
    /// Its `provisioning_status` is ERROR: Octavia's last create, update or delete of it failed.
    Error {
        /// When it was first seen in ERROR.
        since: Instant,
    },
    /// Not (yet) in its pool; `since` is when it was requested or disappeared.
    Missing {
        /// When it was requested, or when a poll first found it gone from its pool.
        since: Instant,
    },
    /// PENDING_DELETE: on its way out although desired.
    Deleting {
        /// When it was first seen PENDING_DELETE.
        since: Instant,
    },
    /// DELETED, or its pool is not known: it will not serve.
    Gone,
}

impl MemberVerdict {
    /// The verdict without its time: what metrics count and displays show.
    pub fn kind(self) -> MemberVerdictKind {
        match self {
            MemberVerdict::Active => MemberVerdictKind::Active,
            MemberVerdict::NotYetServing { .. } => MemberVerdictKind::NotYetServing,
            MemberVerdict::NotServing { .. } => MemberVerdictKind::NotServing,
            MemberVerdict::OutOfTraffic { .. } => MemberVerdictKind::OutOfTraffic,
            MemberVerdict::Pending { .. } => MemberVerdictKind::Pending,
            MemberVerdict::Stuck { .. } => MemberVerdictKind::Stuck,
            MemberVerdict::Error { .. } => MemberVerdictKind::Error,
            MemberVerdict::Missing { .. } => MemberVerdictKind::Missing,
            MemberVerdict::Deleting { .. } => MemberVerdictKind::Deleting,
            MemberVerdict::Gone => MemberVerdictKind::Gone,
        }
    }

    /// The verdict's kind as a name (see [`MemberVerdictKind::as_str`]).
    pub fn name(self) -> &'static str {
        self.kind().as_str()
    }
}

/// [`MemberVerdict`]'s variants, for counting and labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemberVerdictKind {
    /// Ready: ACTIVE (and serving, under the serving gate).
    Active,
    /// ACTIVE, but not yet seen serving by its monitor.
    NotYetServing,
    /// ACTIVE and not serving for longer than the not-serving threshold.
    NotServing,
    /// ACTIVE at weight 0 and seen up for the settle time: it may be let in.
    OutOfTraffic,
    /// PENDING_CREATE or PENDING_UPDATE.
    Pending,
    /// PENDING_* for longer than the stuck threshold.
    Stuck,
    /// Provisioning status ERROR.
    Error,
    /// Not (yet) in its pool.
    Missing,
    /// PENDING_DELETE although desired.
    Deleting,
    /// DELETED, or its pool is not known.
    Gone,
}

impl MemberVerdictKind {
    /// Every kind, in declaration order (each has a `capo_lb_members` series from the start).
    pub const ALL: [MemberVerdictKind; 10] = [
        MemberVerdictKind::Active,
        MemberVerdictKind::NotYetServing,
        MemberVerdictKind::NotServing,
        MemberVerdictKind::OutOfTraffic,
        MemberVerdictKind::Pending,
        MemberVerdictKind::Stuck,
        MemberVerdictKind::Error,
        MemberVerdictKind::Missing,
        MemberVerdictKind::Deleting,
        MemberVerdictKind::Gone,
    ];

    /// The kind's name, as in the `verdict` metric label: the variant's name.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberVerdictKind::Active => "Active",
            MemberVerdictKind::NotYetServing => "NotYetServing",
            MemberVerdictKind::NotServing => "NotServing",
            MemberVerdictKind::OutOfTraffic => "OutOfTraffic",
            MemberVerdictKind::Pending => "Pending",
            MemberVerdictKind::Stuck => "Stuck",
            MemberVerdictKind::Error => "Error",
            MemberVerdictKind::Missing => "Missing",
            MemberVerdictKind::Deleting => "Deleting",
            MemberVerdictKind::Gone => "Gone",
        }
    }
}

/// The member's verdict under `rules`: its provisioning verdict, then, if ACTIVE and the
/// serving gate is on, whether its monitor has seen it serve.
pub fn member_verdict(track: &MemberTrack, now: Instant, rules: &GateRules) -> MemberVerdict {
    let provisioned = provisioning_verdict(track, now, rules.stuck_after);
    match (provisioned, rules.serving) {
        (MemberVerdict::Active, Some(serving)) => serving_verdict(track, now, &serving),
        _ => provisioned,
    }
}

/// An ACTIVE member under the serving gate. It serves once it has read up (ONLINE) for the
/// settle time without a break; up at weight 0 (DRAINING: a new member kept out of traffic)
/// that long, it may be let in. Once it has stopped serving, it needs the longer recovery
/// time to count again. Its not-serving clock starts when it went ACTIVE, or when it stopped
/// serving; short good stretches do not restart it, so a flapping member is flagged too.
fn serving_verdict(track: &MemberTrack, now: Instant, rules: &ServingRules) -> MemberVerdict {
    if track.operating == Some(OperatingStatus::NoMonitor) && !unchecked(track) {
        return MemberVerdict::Active;
    }
    let needed = rules.steady_for(track);
    if let Some(up) = track
        .up_since
        .filter(|up| now.saturating_duration_since(*up) >= needed)
    {
        return match track.operating {
            Some(OperatingStatus::Draining) => MemberVerdict::OutOfTraffic { since: up },
            _ => MemberVerdict::Active,
        };
    }
    let active = track.active_at.unwrap_or(track.since);
    let since = track.fell_at.map_or(active, |fell| fell.max(active));
    if now.saturating_duration_since(since) >= rules.not_serving_after {
        MemberVerdict::NotServing { since }
    } else {
        MemberVerdict::NotYetServing { since }
    }
}

/// A member reading NO_MONITOR though a status tree showed a working monitor on its pool: no
/// health check covers it. ovn-octavia-provider reports a member whose addition to OVN failed
/// ACTIVE and NO_MONITOR (`helper.py` `member_create`, which reports every member it has
/// recorded ACTIVE); an amphora's haproxy reports a server it does not check the same way.
/// Where no tree has said (a recalled state, member lists), NO_MONITOR reads as no monitor.
pub fn unchecked(track: &MemberTrack) -> bool {
    track.operating == Some(OperatingStatus::NoMonitor) && track.pool_monitored == Some(true)
}

fn provisioning_verdict(track: &MemberTrack, now: Instant, stuck_after: Duration) -> MemberVerdict {
    let since = track.since;
    if track.pool_id.is_none() {
        return MemberVerdict::Gone;
    }
    match track.presence {
        Presence::Absent => MemberVerdict::Missing { since },
        Presence::Seen(status) => match status {
            ProvisioningStatus::Active => MemberVerdict::Active,
            ProvisioningStatus::Error => MemberVerdict::Error { since },
            ProvisioningStatus::Deleted => MemberVerdict::Gone,
            // A desired member on its way out (a repair's delete). A lost Octavia flow can
            // leave it there for good, so it turns stuck like a pending creation.
            ProvisioningStatus::PendingDelete => {
                if now.saturating_duration_since(since) >= stuck_after {
                    MemberVerdict::Stuck { since }
                } else {
                    MemberVerdict::Deleting { since }
                }
            }
            ProvisioningStatus::PendingCreate
            | ProvisioningStatus::PendingUpdate
            | ProvisioningStatus::Unknown => {
                // A member never seen ACTIVE counts from its request, not from when we first
                // saw it: a restarted engine must not reset the clock. One that was ACTIVE,
                // or was made again (a repair), counts from when it went pending again.
                let pending_since = match (track.active_at, track.recreated) {
                    (None, false) => since.min(track.desired.requested_at),
                    _ => since,
                };
                if now.saturating_duration_since(pending_since) >= stuck_after {
                    MemberVerdict::Stuck {
                        since: pending_since,
                    }
                } else {
                    MemberVerdict::Pending {
                        since: pending_since,
                    }
                }
            }
        },
    }
}

/// Why a load balancer is (not) ready, most serious first. Each is a condition reason of the
/// API ([`reasons::LOAD_BALANCER_GATE`]): the gate's conditions carry them as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Not observed yet.
    NotObserved,
    /// The load balancer is in ERROR or DELETED, or is gone (404).
    LoadBalancerError,
    /// A desired member is in ERROR.
    MemberError,
    /// A desired member has been PENDING_* for longer than the stuck threshold.
    MemberStuck,
    /// A desired member is ACTIVE but has not served for longer than the not-serving threshold.
    MemberNotServing,
    /// The load balancer itself is PENDING_* (or reads a status this code does not know).
    LoadBalancerPending,
    /// Desired members are not in their pool: not yet created, being deleted, or gone.
    MembersMissing,
    /// Desired members are PENDING_CREATE or PENDING_UPDATE.
    MembersPending,
    /// Desired members are ACTIVE but not yet seen serving (the serving gate).
    MembersNotYetServing,
    /// The load balancer is ACTIVE and every desired member is ready: the gate is open.
    Ready,
}

impl Reason {
    /// Every reason, most serious first (the order of the API's `LOAD_BALANCER_GATE`).
    pub const ALL: [Reason; 10] = [
        Reason::NotObserved,
        Reason::LoadBalancerError,
        Reason::MemberError,
        Reason::MemberStuck,
        Reason::MemberNotServing,
        Reason::LoadBalancerPending,
        Reason::MembersMissing,
        Reason::MembersPending,
        Reason::MembersNotYetServing,
        Reason::Ready,
    ];

    /// Whether the gate holds rollouts for a known cause (not ready, and observed).
    pub fn holds(self) -> bool {
        !matches!(self, Reason::Ready | Reason::NotObserved)
    }

    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotObserved => reasons::LOAD_BALANCER_NOT_OBSERVED,
            Reason::LoadBalancerError => reasons::LOAD_BALANCER_ERROR,
            Reason::MemberError => reasons::MEMBER_ERROR,
            Reason::MemberStuck => reasons::MEMBER_STUCK,
            Reason::MemberNotServing => reasons::MEMBER_NOT_SERVING,
            Reason::MembersNotYetServing => reasons::MEMBERS_NOT_YET_SERVING,
            Reason::LoadBalancerPending => reasons::LOAD_BALANCER_PENDING,
            Reason::MembersMissing => reasons::MEMBERS_MISSING,
            Reason::MembersPending => reasons::MEMBERS_PENDING,
            Reason::Ready => reasons::READY,
        }
    }
}

/// A load balancer's verdict with the members behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbVerdict {
    /// Why the LB is (not) ready: the most serious reason that applies.
    pub reason: Reason,
    /// The LB's provisioning status, if observed and present.
    pub lb_status: Option<ProvisioningStatus>,
    /// When the LB's provisioning status last changed (or it went gone); before the first poll,
    /// when tracking began.
    pub lb_since: Instant,
    /// Each desired member: name, pool port, verdict.
    pub members: Vec<(String, u16, MemberVerdict)>,
    /// Members in desired pools that nobody wants (reported, never deleted here).
    pub stale: Vec<String>,
    /// Desired members ready to take traffic (ACTIVE; and serving, under the serving gate).
    pub serving: usize,
    /// The serving gate is on but some ACTIVE member reads NO_MONITOR in a pool without a
    /// working monitor: for those the gate fell back to provisioning status.
    pub unmonitored: bool,
    /// Under the serving gate, ACTIVE members (`name:port`) that read NO_MONITOR though their
    /// pool has a health monitor: nothing checks them, so they do not count as serving.
    pub unchecked: Vec<String>,
    /// The serving gate was on.
    pub serving_gate: bool,
}

impl LbVerdict {
    /// Whether the gate is open (the reason is [`Reason::Ready`]).
    pub fn is_ready(&self) -> bool {
        self.reason == Reason::Ready
    }

    /// Whether readiness included a health monitor's word (the serving gate, with a monitor).
    pub fn checks_serving(&self) -> bool {
        self.serving_gate && !self.unmonitored
    }

    /// Whether a subscriber would see no difference: the same reason, the same verdict kind for
    /// each member, the same stale members (durations moving on is not a change).
    pub fn same_gate(&self, other: &LbVerdict) -> bool {
        let kinds = |v: &LbVerdict| -> Vec<(String, u16, MemberVerdictKind)> {
            v.members
                .iter()
                .map(|(name, port, m)| (name.clone(), *port, m.kind()))
                .collect()
        };
        self.reason == other.reason
            && self.stale == other.stale
            && self.unmonitored == other.unmonitored
            && self.unchecked == other.unchecked
            && kinds(self) == kinds(other)
    }

    /// Names the members no health check covers, for the not-serving messages.
    fn unchecked_note(&self) -> String {
        if self.unchecked.is_empty() {
            return String::new();
        }
        format!(
            "; read NO_MONITOR though their pool has a health monitor, so nothing checks them: {}",
            self.unchecked.join(", ")
        )
    }

    /// A sentence for a condition message: which members, and for how long (relative to
    /// `now`) only for states an operator acts on (not serving, stuck, ERROR). A state on its
    /// way gives no duration: the message then stays the same from one pass to the next, and
    /// a status with nothing new is not written again (the members' `since` says when).
    pub fn message(&self, now: Instant) -> String {
        let ago = |since: Instant| human(now.saturating_duration_since(since));
        let named = |wanted: MemberVerdictKind| -> Vec<String> {
            self.members
                .iter()
                .filter(|(_, _, v)| v.kind() == wanted)
                .map(|(name, port, v)| match v {
                    MemberVerdict::NotServing { since }
                    | MemberVerdict::Stuck { since }
                    | MemberVerdict::Error { since } => {
                        format!("{name}:{port} for {}", ago(*since))
                    }
                    _ => format!("{name}:{port}"),
                })
                .collect()
        };
        match self.reason {
            Reason::NotObserved => "load balancer not observed yet".into(),
            Reason::Ready if self.unmonitored => format!(
                "load balancer ACTIVE and all {} members ACTIVE (no health monitor: serving is not checked)",
                self.members.len()
            ),
            Reason::Ready => format!(
                "load balancer ACTIVE and all {} members ACTIVE{}",
                self.members.len(),
                if self.checks_serving() {
                    " and serving"
                } else {
                    ""
                }
            ),
            Reason::MemberNotServing => format!(
                "members ACTIVE whose API does not serve: {} ({} of {} serving){}",
                named(MemberVerdictKind::NotServing).join(", "),
                self.serving,
                self.members.len(),
                self.unchecked_note()
            ),
            Reason::MembersNotYetServing => format!(
                "members ACTIVE, waiting for their API to serve: {} ({} of {} serving){}",
                named(MemberVerdictKind::NotYetServing)
                    .into_iter()
                    .chain(named(MemberVerdictKind::OutOfTraffic))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.serving,
                self.members.len(),
                self.unchecked_note()
            ),
            Reason::LoadBalancerError => match self.lb_status {
                None => "load balancer not found".into(),
                Some(_) => format!("load balancer in ERROR for {}", ago(self.lb_since)),
            },
            Reason::LoadBalancerPending => format!(
                "load balancer {}",
                self.lb_status
                    .map(ProvisioningStatus::as_str)
                    .unwrap_or("pending"),
            ),
            Reason::MemberError => format!(
                "members in ERROR: {}",
                named(MemberVerdictKind::Error).join(", ")
            ),
            Reason::MemberStuck => {
                format!(
                    "members stuck in PENDING: {}",
                    named(MemberVerdictKind::Stuck).join(", ")
                )
            }
            Reason::MembersMissing => {
                let mut missing = named(MemberVerdictKind::Missing);
                missing.extend(named(MemberVerdictKind::Deleting));
                missing.extend(named(MemberVerdictKind::Gone));
                format!("members not in their pool: {}", missing.join(", "))
            }
            Reason::MembersPending => format!(
                "members pending: {}",
                named(MemberVerdictKind::Pending).join(", ")
            ),
        }
    }
}

fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7199 => format!("{}m{}s", seconds / 60, seconds % 60),
        _ => format!("{}h{}m", seconds / 3600, seconds % 3600 / 60),
    }
}

/// The load balancer's verdict at `now` under `rules`: each desired member's verdict, and the
/// most serious reason that applies.
pub fn lb_verdict(track: &LbTrack, now: Instant, rules: &GateRules) -> LbVerdict {
    let members: Vec<(String, u16, MemberVerdict)> = track
        .members
        .iter()
        .map(|m| {
            (
                m.desired.name.clone(),
                m.desired.port,
                member_verdict(m, now, rules),
            )
        })
        .collect();
    let active = |m: &&MemberTrack| m.presence == Presence::Seen(ProvisioningStatus::Active);
    let unmonitored = rules.serving.is_some()
        && track
            .members
            .iter()
            .filter(active)
            .any(|m| m.operating == Some(OperatingStatus::NoMonitor) && !unchecked(m));
    let unchecked_members = match rules.serving {
        Some(_) => track
            .members
            .iter()
            .filter(active)
            .filter(|m| unchecked(m))
            .map(|m| format!("{}:{}", m.desired.name, m.desired.port))
            .collect(),
        None => Vec::new(),
    };
    let serving = members
        .iter()
        .filter(|(_, _, v)| *v == MemberVerdict::Active)
        .count();
    let lb_status = track.lb.flatten().map(|(p, _)| p);
    let has = |wanted: MemberVerdictKind| members.iter().any(|(_, _, v)| v.kind() == wanted);
    let reason = match track.lb {
        None => Reason::NotObserved,
        Some(None) => Reason::LoadBalancerError,
        Some(Some((status, _))) => match status {
            ProvisioningStatus::Error | ProvisioningStatus::Deleted => Reason::LoadBalancerError,
            _ if has(MemberVerdictKind::Error) => Reason::MemberError,
            _ if has(MemberVerdictKind::Stuck) => Reason::MemberStuck,
            _ if has(MemberVerdictKind::NotServing) => Reason::MemberNotServing,
            ProvisioningStatus::Active => {
                if has(MemberVerdictKind::Missing)
                    || has(MemberVerdictKind::Deleting)
                    || has(MemberVerdictKind::Gone)
                {
                    Reason::MembersMissing
                } else if has(MemberVerdictKind::Pending) {
                    Reason::MembersPending
                } else if has(MemberVerdictKind::NotYetServing)
                    || has(MemberVerdictKind::OutOfTraffic)
                {
                    Reason::MembersNotYetServing
                } else {
                    Reason::Ready
                }
            }
            _ => Reason::LoadBalancerPending,
        },
    };
    LbVerdict {
        reason,
        lb_status,
        lb_since: track.lb_since,
        members,
        stale: track
            .stale
            .iter()
            .map(|m| format!("{} ({}:{})", m.name, m.address, m.port))
            .collect(),
        serving,
        unmonitored,
        unchecked: unchecked_members,
        serving_gate: rules.serving.is_some(),
    }
}

/// Health from operating status: reported, never blocking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// No desired member seen reads anything but ONLINE or NO_MONITOR.
    Healthy,
    /// Members reading OFFLINE, ERROR, DEGRADED or DRAINING (NO_MONITOR is healthy: nothing
    /// watches them).
    Degraded {
        /// Each such member's name in Octavia and its operating status.
        members: Vec<(String, OperatingStatus)>,
    },
    /// The load balancer has not been observed yet.
    Unknown,
}

/// The load balancer's health from its desired members' operating statuses; `Unknown` until
/// a poll has answered.
pub fn health(track: &LbTrack) -> Health {
    if track.lb.is_none() {
        return Health::Unknown;
    }
    let healthy = |m: &MemberTrack, o: OperatingStatus| {
        !unchecked(m) && matches!(o, OperatingStatus::Online | OperatingStatus::NoMonitor)
    };
    let members: Vec<(String, OperatingStatus)> = track
        .members
        .iter()
        .filter_map(|m| m.operating.map(|o| (m, o)))
        .filter(|(m, o)| !healthy(m, *o))
        .map(|(m, o)| (m.desired.name.clone(), o))
        .collect();
    if members.is_empty() {
        Health::Healthy
    } else {
        Health::Degraded { members }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::model::tests::{desired, member, seen};
    use crate::membership::model::{LbTrack, Observation, Presence};
    use ProvisioningStatus::*;

    const STUCK: Duration = Duration::from_secs(600);
    const RULES: GateRules = GateRules {
        stuck_after: STUCK,
        serving: None,
    };
    const ALL: [ProvisioningStatus; 7] = [
        Active,
        Deleted,
        Error,
        PendingCreate,
        PendingUpdate,
        PendingDelete,
        Unknown,
    ];

    #[test]
    fn the_engine_reasons_are_the_api_gate_reasons_in_the_same_order() {
        let ours: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(ours, reasons::LOAD_BALANCER_GATE);
        // Most serious first: the derived order is the declared one.
        assert!(Reason::ALL.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn a_repaired_member_counts_its_pending_time_from_its_new_creation() {
        let t0 = Instant::now();
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        let t1 = t0 + Duration::from_secs(300);
        track.observe(&seen(Active, &[("10.0.0.1", Error)]), t1, None);
        // Deleted and created again: another member object at the same address.
        let t2 = t1 + Duration::from_secs(400);
        let mut again = seen(Active, &[("10.0.0.1", PendingCreate)]);
        again.members[0].id = "id-new".into();
        assert!(track.observe(&again, t2, None));
        let soon = t2 + Duration::from_secs(10);
        assert_eq!(
            member_verdict(&track.members[0], soon, &RULES),
            MemberVerdict::Pending { since: t2 },
            "700 s after the first request, but 10 s after the repair: pending, not stuck"
        );
        assert!(matches!(
            member_verdict(&track.members[0], t2 + STUCK, &RULES),
            MemberVerdict::Stuck { .. }
        ));
    }

    fn track_with(
        lb: ProvisioningStatus,
        member_status: Option<ProvisioningStatus>,
        t0: Instant,
    ) -> LbTrack {
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        let members: Vec<(&str, ProvisioningStatus)> = member_status
            .map(|s| vec![("10.0.0.1", s)])
            .unwrap_or_default();
        track.observe(&seen(lb, &members), t0, None);
        track
    }

    /// Every LB status x every member status (and absent): the verdict is Ready exactly when
    /// both are ACTIVE, and never Ready otherwise.
    #[test]
    fn ready_only_when_lb_and_every_member_are_active() {
        let t0 = Instant::now();
        for lb in ALL {
            for member in ALL.map(Some).into_iter().chain([None]) {
                let verdict = lb_verdict(&track_with(lb, member, t0), t0, &RULES);
                let expected_ready = lb == Active && member == Some(Active);
                assert_eq!(
                    verdict.is_ready(),
                    expected_ready,
                    "lb {lb:?} member {member:?}: {verdict:?}"
                );
            }
        }
    }

    #[test]
    fn reasons_by_combination() {
        let t0 = Instant::now();
        let reason = |lb, member| lb_verdict(&track_with(lb, member, t0), t0, &RULES).reason;
        assert_eq!(reason(Error, Some(Active)), Reason::LoadBalancerError);
        assert_eq!(reason(Active, Some(Error)), Reason::MemberError);
        assert_eq!(reason(PendingUpdate, Some(Error)), Reason::MemberError);
        assert_eq!(
            reason(PendingUpdate, Some(PendingCreate)),
            Reason::LoadBalancerPending
        );
        assert_eq!(reason(Active, Some(PendingCreate)), Reason::MembersPending);
        assert_eq!(reason(Active, Some(PendingUpdate)), Reason::MembersPending);
        assert_eq!(reason(Active, None), Reason::MembersMissing);
        assert_eq!(reason(Active, Some(PendingDelete)), Reason::MembersMissing);
        assert_eq!(reason(Active, Some(Deleted)), Reason::MembersMissing);
        assert_eq!(reason(Active, Some(Active)), Reason::Ready);
        let unobserved = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        assert_eq!(
            lb_verdict(&unobserved, t0, &RULES).reason,
            Reason::NotObserved
        );
        let mut gone = unobserved.clone();
        gone.observe_gone(t0);
        assert_eq!(
            lb_verdict(&gone, t0, &RULES).reason,
            Reason::LoadBalancerError
        );
        assert_eq!(
            lb_verdict(&gone, t0, &RULES).message(t0),
            "load balancer not found"
        );
    }

    #[test]
    fn stuck_after_the_threshold_counted_from_the_request() {
        let t0 = Instant::now();
        let track = track_with(Active, Some(PendingCreate), t0);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            member_verdict(&track.members[0], at(599), &RULES),
            MemberVerdict::Pending { since: t0 }
        );
        assert_eq!(
            member_verdict(&track.members[0], at(600), &RULES),
            MemberVerdict::Stuck { since: t0 }
        );
        let verdict = lb_verdict(&track, at(700), &RULES);
        assert_eq!(verdict.reason, Reason::MemberStuck);
        assert_eq!(
            verdict.message(at(700)),
            "members stuck in PENDING: m1:6443 for 11m40s"
        );
    }

    #[test]
    fn a_desired_member_left_in_pending_delete_turns_stuck() {
        let t0 = Instant::now();
        let track = track_with(Active, Some(PendingDelete), t0);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            member_verdict(&track.members[0], at(599), &RULES),
            MemberVerdict::Deleting { since: t0 }
        );
        assert_eq!(
            member_verdict(&track.members[0], at(600), &RULES),
            MemberVerdict::Stuck { since: t0 }
        );
        let verdict = lb_verdict(&track, at(600), &RULES);
        assert_eq!(verdict.reason, Reason::MemberStuck);
    }

    #[test]
    fn member_verdicts_for_every_status() {
        let t0 = Instant::now();
        for status in ALL {
            let track = track_with(Active, Some(status), t0);
            let verdict = member_verdict(&track.members[0], t0, &RULES);
            let expected = match status {
                Active => "Active",
                Error => "Error",
                Deleted => "Gone",
                PendingDelete => "Deleting",
                PendingCreate | PendingUpdate | Unknown => "Pending",
            };
            assert_eq!(verdict.name(), expected, "{status:?}");
        }
        let mut missing = track_with(Active, None, t0);
        assert_eq!(missing.members[0].presence, Presence::Absent);
        assert_eq!(
            member_verdict(&missing.members[0], t0, &RULES).name(),
            "Missing"
        );
        missing.members[0].pool_id = None;
        assert_eq!(
            member_verdict(&missing.members[0], t0, &RULES),
            MemberVerdict::Gone
        );
    }

    #[test]
    fn operating_status_never_blocks_and_is_summarised() {
        let t0 = Instant::now();
        for operating in [
            OperatingStatus::Online,
            OperatingStatus::NoMonitor,
            OperatingStatus::Offline,
            OperatingStatus::Error,
            OperatingStatus::Degraded,
            OperatingStatus::Draining,
        ] {
            let mut track = track_with(Active, Some(Active), t0);
            track.members[0].operating = Some(operating);
            assert!(lb_verdict(&track, t0, &RULES).is_ready(), "{operating:?}");
            let healthy = matches!(
                operating,
                OperatingStatus::Online | OperatingStatus::NoMonitor
            );
            assert_eq!(health(&track) == Health::Healthy, healthy, "{operating:?}");
        }
    }

    #[test]
    fn messages_name_members_and_durations() {
        let t0 = Instant::now();
        let track = track_with(Active, Some(PendingCreate), t0);
        let later = t0 + Duration::from_secs(42);
        // On its way: the same message at every pass.
        assert_eq!(
            lb_verdict(&track, later, &RULES).message(later),
            "members pending: m1:6443"
        );
        let track = track_with(PendingUpdate, Some(PendingCreate), t0);
        assert_eq!(
            lb_verdict(&track, later, &RULES).message(later),
            "load balancer PENDING_UPDATE"
        );
        // Stuck: how long, for the operator.
        let stuck_at = t0 + STUCK + Duration::from_secs(42);
        let track = track_with(Active, Some(PendingCreate), t0);
        let message = lb_verdict(&track, stuck_at, &RULES).message(stuck_at);
        assert!(message.ends_with("m1:6443 for 10m42s"), "{message}");
    }

    const SERVING: GateRules = GateRules {
        stuck_after: STUCK,
        serving: Some(ServingRules {
            settle: Duration::from_secs(15),
            recovery: Duration::from_secs(120),
            not_serving_after: Duration::from_secs(300),
        }),
    };

    fn seen_operating(operating: OperatingStatus) -> crate::membership::model::Observation {
        let mut observation = seen(Active, &[("10.0.0.1", Active)]);
        observation.members[0].operating = operating;
        observation
    }

    #[test]
    fn the_serving_gate_releases_a_member_only_once_it_has_read_online_for_the_settle_time() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(
            &seen_operating(OperatingStatus::Offline),
            at(5),
            SERVING.serving.as_ref(),
        );
        let verdict = lb_verdict(&track, at(5), &SERVING);
        assert_eq!(verdict.reason, Reason::MembersNotYetServing);
        assert_eq!(verdict.serving, 0);
        assert!(
            lb_verdict(&track, at(5), &RULES).is_ready(),
            "the provisioning gate takes ACTIVE alone"
        );
        // ONLINE at 20 s: ovn says so before any check, so it must hold for the settle time.
        track.observe(
            &seen_operating(OperatingStatus::Online),
            at(20),
            SERVING.serving.as_ref(),
        );
        assert_eq!(
            member_verdict(&track.members[0], at(34), &SERVING),
            MemberVerdict::NotYetServing { since: at(5) },
            "its not-serving clock runs from ACTIVE"
        );
        let ready = lb_verdict(&track, at(35), &SERVING);
        assert!(ready.is_ready(), "{:?}", ready.reason);
        assert_eq!(ready.serving, 1);
        assert!(ready.message(at(35)).contains("and serving"));
    }

    /// A restarted engine: a member whose machine was released (it served) and that reads
    /// ONLINE on the first look serves at once; one that was not released, or that is not up
    /// on the first look, waits the settle time as any join does.
    #[test]
    fn a_member_that_served_before_a_restart_serves_at_the_first_look_that_finds_it_up() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let served = |served: bool| {
            let mut m = member("m1", "10.0.0.1", t0);
            m.served = served;
            LbTrack::new(desired(vec![m]), t0)
        };
        let serving = SERVING.serving.as_ref();
        let mut released = served(true);
        released.observe(&seen_operating(OperatingStatus::Online), at(1), serving);
        let verdict = lb_verdict(&released, at(1), &SERVING);
        assert!(verdict.is_ready(), "{:?}", verdict.reason);
        let mut joining = served(false);
        joining.observe(&seen_operating(OperatingStatus::Online), at(1), serving);
        assert_eq!(
            lb_verdict(&joining, at(1), &SERVING).reason,
            Reason::MembersNotYetServing
        );
        // Down on the first look: once up again it must hold for the settle time.
        let mut down = served(true);
        down.observe(&seen_operating(OperatingStatus::Offline), at(1), serving);
        down.observe(&seen_operating(OperatingStatus::Online), at(2), serving);
        assert_eq!(
            lb_verdict(&down, at(2), &SERVING).reason,
            Reason::MembersNotYetServing
        );
        assert!(lb_verdict(&down, at(17), &SERVING).is_ready());
        // A machine released after the first look changes nothing the engine would act on.
        let mut wish = joining.desired.clone();
        wish.members[0].served = true;
        assert_eq!(joining.keep_request_times(wish), joining.desired);
    }

    #[test]
    fn a_member_that_never_serves_or_flaps_is_held_and_only_a_steady_failure_is_flagged() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(
            &seen_operating(OperatingStatus::Error),
            at(5),
            SERVING.serving.as_ref(),
        );
        assert_eq!(
            lb_verdict(&track, at(304), &SERVING).reason,
            Reason::MembersNotYetServing
        );
        let flagged = lb_verdict(&track, at(305), &SERVING);
        assert_eq!(flagged.reason, Reason::MemberNotServing);
        assert!(flagged.message(at(305)).contains("m1:6443"));
        // Flapping: each change restarts the clock, and a short ONLINE never releases.
        let mut flapping = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        for (i, second) in (10..600).step_by(10).enumerate() {
            let operating = if i % 2 == 0 {
                OperatingStatus::Online
            } else {
                OperatingStatus::Error
            };
            flapping.observe(
                &seen_operating(operating),
                at(second),
                SERVING.serving.as_ref(),
            );
            assert!(!lb_verdict(&flapping, at(second + 9), &SERVING).is_ready());
        }
        assert_eq!(
            lb_verdict(&flapping, at(599), &SERVING).reason,
            Reason::MemberNotServing,
            "never up for the settle time since it went ACTIVE: flagged"
        );
        // A member that served steadily counts from when that ended.
        let mut steady = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        steady.observe(
            &seen_operating(OperatingStatus::Online),
            at(5),
            SERVING.serving.as_ref(),
        );
        steady.observe(
            &seen_operating(OperatingStatus::Error),
            at(400),
            SERVING.serving.as_ref(),
        );
        assert_eq!(
            member_verdict(&steady.members[0], at(500), &SERVING),
            MemberVerdict::NotYetServing { since: at(400) }
        );
    }

    #[test]
    fn a_member_that_stopped_serving_counts_again_only_after_the_recovery_time() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let serving = SERVING.serving.as_ref();
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(&seen_operating(OperatingStatus::Online), at(5), serving);
        assert!(lb_verdict(&track, at(20), &SERVING).is_ready());
        // It falls at 100 s, then comes back up for 60 s at a time: each stretch is longer
        // than the settle time but shorter than the recovery time, so it never counts.
        track.observe(&seen_operating(OperatingStatus::Error), at(100), serving);
        for start in [130, 220, 310] {
            track.observe(&seen_operating(OperatingStatus::Online), at(start), serving);
            let up = lb_verdict(&track, at(start + 59), &SERVING);
            assert!(
                !up.is_ready(),
                "up {start}..{}: {:?}",
                start + 59,
                up.reason
            );
            track.observe(
                &seen_operating(OperatingStatus::Error),
                at(start + 60),
                serving,
            );
        }
        assert_eq!(
            member_verdict(&track.members[0], at(399), &SERVING),
            MemberVerdict::NotYetServing { since: at(100) },
            "its clock runs from the first fall"
        );
        let flagged = lb_verdict(&track, at(400), &SERVING);
        assert_eq!(flagged.reason, Reason::MemberNotServing);
        // Still flagged on a short good stretch, and serving once up for the recovery time.
        track.observe(&seen_operating(OperatingStatus::Online), at(410), serving);
        assert_eq!(
            lb_verdict(&track, at(480), &SERVING).reason,
            Reason::MemberNotServing
        );
        assert!(lb_verdict(&track, at(530), &SERVING).is_ready());
        // A fall after that recovery starts a new clock.
        track.observe(&seen_operating(OperatingStatus::Error), at(600), serving);
        assert_eq!(
            member_verdict(&track.members[0], at(610), &SERVING),
            MemberVerdict::NotYetServing { since: at(600) }
        );
    }

    #[test]
    fn a_member_kept_out_of_traffic_may_be_let_in_once_up_for_the_settle_time() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(
            &seen_operating(OperatingStatus::Offline),
            at(1),
            SERVING.serving.as_ref(),
        );
        track.observe(
            &seen_operating(OperatingStatus::Draining),
            at(3),
            SERVING.serving.as_ref(),
        );
        assert!(matches!(
            member_verdict(&track.members[0], at(10), &SERVING),
            MemberVerdict::NotYetServing { .. }
        ));
        assert_eq!(
            member_verdict(&track.members[0], at(18), &SERVING),
            MemberVerdict::OutOfTraffic { since: at(3) }
        );
        assert_eq!(
            lb_verdict(&track, at(18), &SERVING).reason,
            Reason::MembersNotYetServing
        );
        // Let in: DRAINING -> ONLINE is one stretch up, so it serves at once.
        track.observe(
            &seen_operating(OperatingStatus::Online),
            at(20),
            SERVING.serving.as_ref(),
        );
        assert!(lb_verdict(&track, at(20), &SERVING).is_ready());
    }

    #[test]
    fn without_a_monitor_the_serving_gate_falls_back_to_provisioning_and_says_so() {
        let t0 = Instant::now();
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(
            &seen_operating(OperatingStatus::NoMonitor),
            t0,
            SERVING.serving.as_ref(),
        );
        let verdict = lb_verdict(&track, t0, &SERVING);
        assert!(verdict.is_ready());
        assert!(verdict.unmonitored && !verdict.checks_serving());
        assert!(verdict.message(t0).contains("no health monitor"));
        assert!(!lb_verdict(&track, t0, &RULES).unmonitored);
    }

    /// A status tree recorded from a real Octavia: an HTTP monitor ACTIVE on the pool, and
    /// two members reading NO_MONITOR under it (made before the monitor; no health manager
    /// ran to check them).
    fn recorded_tree() -> crate::cloud::octavia::StatusTree {
        serde_json::from_value(recorded_tree_json()).unwrap()
    }

    #[test]
    fn a_member_no_health_check_covers_under_a_monitored_pool_never_serves() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let tree = recorded_tree();
        let pool = tree.listeners[0].pools[0].id.clone();
        let mut wanted = member("m1", "192.0.2.10", t0);
        wanted.port = 8080;
        let mut lb = desired(vec![wanted]);
        lb.pools = std::collections::BTreeMap::from([(8080, pool.clone())]);
        let mut track = LbTrack::new(lb, t0);
        let seen = Observation::from_tree(&tree);
        assert_eq!(seen.monitored_pools, Some(vec![pool]));
        track.observe(&seen, t0, SERVING.serving.as_ref());
        assert!(unchecked(&track.members[0]));
        let waiting = lb_verdict(&track, t0, &SERVING);
        assert_eq!(waiting.reason, Reason::MembersNotYetServing);
        assert!(!waiting.unmonitored, "the pool has a monitor");
        assert_eq!(waiting.unchecked, vec!["m1:8080".to_owned()]);
        assert!(waiting.message(t0).contains("nothing checks them: m1:8080"));
        let held = lb_verdict(&track, at(300), &SERVING);
        assert_eq!(held.reason, Reason::MemberNotServing);
        assert_eq!(held.serving, 0);
        assert!(matches!(health(&track), Health::Degraded { .. }));
        assert!(
            lb_verdict(&track, at(300), &RULES).is_ready(),
            "the provisioning gate takes ACTIVE alone"
        );
        // A later tree without the monitor (deleted): NO_MONITOR means no monitor again.
        let mut unmonitored = seen.clone();
        unmonitored.monitored_pools = Some(Vec::new());
        track.observe(&unmonitored, at(301), SERVING.serving.as_ref());
        let fallback = lb_verdict(&track, at(301), &SERVING);
        assert!(fallback.is_ready() && fallback.unmonitored);
        // A poll that cannot tell (member lists) keeps what the last tree said.
        let mut told = seen.clone();
        track.observe(&told, at(302), SERVING.serving.as_ref());
        told.monitored_pools = None;
        track.observe(&told, at(303), SERVING.serving.as_ref());
        assert!(unchecked(&track.members[0]));
    }

    #[test]
    fn a_monitor_on_its_way_or_in_error_does_not_make_no_monitor_unchecked() {
        for status in ["PENDING_CREATE", "ERROR", "PENDING_DELETE"] {
            let mut answer = recorded_tree_json();
            answer["listeners"][0]["pools"][0]["health_monitor"]["provisioning_status"] =
                status.into();
            let tree: crate::cloud::octavia::StatusTree = serde_json::from_value(answer).unwrap();
            assert_eq!(
                Observation::from_tree(&tree).monitored_pools,
                Some(Vec::new()),
                "{status}"
            );
        }
    }

    fn recorded_tree_json() -> serde_json::Value {
        crate::cloud::octavia::tests::sample("status_tree_with_hm_and_operating_error.json")
            ["statuses"]["loadbalancer"]
            .clone()
    }
}
