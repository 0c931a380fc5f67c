//! What the engine is told (desired membership) and what it sees (observations), and the
//! per-member tracking that joins the two. Pure: time is passed in.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus, StatusTree};

/// The serving gate's times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServingRules {
    /// How long a member must have read ONLINE without a break.
    pub settle: Duration,
    /// How long a member that stopped serving must read ONLINE again without a break before
    /// it counts again: a flapping API is not trusted on its short good stretches.
    pub recovery: Duration,
    /// A monitored ACTIVE member not serving for longer than this holds the rollout, flagged.
    pub not_serving_after: Duration,
}

impl ServingRules {
    /// How long `member` must read up without a break to count as serving: the settle time,
    /// or the recovery time once it has stopped serving.
    pub fn steady_for(&self, member: &MemberTrack) -> Duration {
        match member.fell_at {
            Some(_) => self.recovery.max(self.settle),
            None => self.settle,
        }
    }
}

/// A namespaced object's name. Its kind follows from where it stands: [`DesiredLb::cluster`]
/// names an OpenStackCluster, [`DesiredMember::owner`] an OpenStackMachine. (Not kube's
/// `ObjectRef`, which carries its kind as a type.)
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name within its namespace.
    pub name: String,
}

impl ObjectName {
    /// The object `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A member a reconciler wants in a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredMember {
    /// The object that wants it (an OpenStackMachine), woken when its verdict changes.
    pub owner: ObjectName,
    /// The member's name in Octavia (the machine's name).
    pub name: String,
    /// The member's IP address: the machine's internal address, on the cluster network when
    /// it has one there.
    pub address: String,
    /// The pool's port (which pool), also the member's protocol port.
    pub port: u16,
    /// When the reconciler created (or asked for) it. Once a member is tracked, later `ensure`
    /// calls cannot move this: the earliest request counts (so a reconciler may stamp `now`).
    pub requested_at: Instant,
    /// Octavia's id once known (the `member-get` strategy needs it).
    pub member_id: Option<String>,
    /// Its machine was released on it (the machine's member condition reads True): it served
    /// before this engine knew it. Only a tracker's first look reads this: found up then
    /// (after a restart), it counts as serving at once rather than after the settle time.
    pub served: bool,
}

/// Desired membership of one load balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredLb {
    /// The Octavia load balancer's id.
    pub lb_id: String,
    /// The cluster object, woken on every verdict change.
    pub cluster: ObjectName,
    /// Pool id by port.
    pub pools: BTreeMap<u16, String>,
    /// Every member wanted in the pools: one per machine and port.
    pub members: Vec<DesiredMember>,
    /// A rollout waits on this LB: while something is on its way, its polls go before other
    /// urgent work (see the scheduler for the share the rest keeps).
    pub rollout_waiting: bool,
    /// OpenStackMachines whose members are on their way out of the pools: not desired, but
    /// woken by every change, so each sees its member go.
    pub leaving: Vec<ObjectName>,
}

/// What was known of a load balancer before a restart: its members (every one in its pools,
/// as a status tree showed them while nothing under it was on its way), as of its row's
/// `updated_at`, which a list had shown unchanged after that tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recalled {
    /// The LB's `updated_at` in Octavia as a list last showed it (an ISO 8601 timestamp): while
    /// the row still shows this, `members` is still what is in its pools.
    pub updated_at: String,
    /// Every member of its pools as last seen.
    pub members: Vec<SeenMember>,
}

impl Recalled {
    /// Whether the recalled members may stand without a status tree under the serving gate.
    /// Not when one reads NO_MONITOR and its machine has not been released: only a tree tells
    /// whether its pool has a monitor, and so whether anything checks it; trusted, a member
    /// held because nothing checks it would be released by the restart.
    pub fn may_stand_for_serving(&self, desired: &DesiredLb) -> bool {
        let held = |m: &SeenMember| {
            desired
                .members
                .iter()
                .any(|d| d.address == m.address && d.port == m.port && !d.served)
        };
        !self
            .members
            .iter()
            .any(|m| m.operating == OperatingStatus::NoMonitor && held(m))
    }
}

/// A member as one poll saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenMember {
    /// The id of the pool the member is in.
    pub pool_id: String,
    /// Octavia's id of the member.
    pub id: String,
    /// The member's `name` in Octavia (empty when it has none).
    pub name: String,
    /// The member's IP `address`.
    pub address: String,
    /// The member's `protocol_port`.
    pub port: u16,
    /// The member's `provisioning_status` (ACTIVE, PENDING_CREATE, ERROR, ...).
    pub provisioning: ProvisioningStatus,
    /// The member's `operating_status`: what its pool's health monitor reads (ONLINE, OFFLINE,
    /// NO_MONITOR, ...).
    pub operating: OperatingStatus,
}

/// One poll's result for one load balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The load balancer's own `provisioning_status`.
    pub provisioning: ProvisioningStatus,
    /// The load balancer's own `operating_status`.
    pub operating: OperatingStatus,
    /// The members of the pools in `pools_seen`.
    pub members: Vec<SeenMember>,
    /// Pools whose members were read (a member list covers only its pool; the tree, all).
    pub pools_seen: Vec<String>,
    /// Of `pools_seen`, those with a working health monitor (ACTIVE, or an update of one on
    /// its way); `None` when the poll could not tell (member lists, a recalled state).
    pub monitored_pools: Option<Vec<String>>,
}

impl Observation {
    /// Everything the status tree says.
    pub fn from_tree(tree: &StatusTree) -> Self {
        let mut members = Vec::new();
        let mut pools_seen = Vec::new();
        let mut monitored_pools = Vec::new();
        for pool in tree.listeners.iter().flat_map(|l| &l.pools) {
            if pools_seen.contains(&pool.id) {
                continue;
            }
            pools_seen.push(pool.id.clone());
            if pool.health_monitor.as_ref().is_some_and(|monitor| {
                matches!(
                    monitor.provisioning_status,
                    ProvisioningStatus::Active | ProvisioningStatus::PendingUpdate
                )
            }) {
                monitored_pools.push(pool.id.clone());
            }
            members.extend(pool.members.iter().map(|m| SeenMember {
                pool_id: pool.id.clone(),
                id: m.id.clone(),
                name: m.name.clone(),
                address: m.address.clone(),
                port: m.protocol_port,
                provisioning: m.provisioning_status,
                operating: m.operating_status,
            }));
        }
        Observation {
            provisioning: tree.provisioning_status,
            operating: tree.operating_status,
            members,
            pools_seen,
            monitored_pools: Some(monitored_pools),
        }
    }
}

/// Where a member is, as the engine knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Not seen in its pool (yet, or any more).
    Absent,
    /// In its pool, with this `provisioning_status`.
    Seen(ProvisioningStatus),
}

/// A desired member's tracked state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberTrack {
    /// What the reconciler wants of it.
    pub desired: DesiredMember,
    /// The id of its pool (the desired LB's pool for its port); `None` when no pool is known
    /// for that port.
    pub pool_id: Option<String>,
    /// Whether, and with which provisioning status, the last poll saw it in its pool.
    pub presence: Presence,
    /// Its `operating_status` as last seen; `None` while it is not seen.
    pub operating: Option<OperatingStatus>,
    /// Whether its pool has a working health monitor, as the last status tree showed; `None`
    /// until a tree has said. NO_MONITOR under a monitor means nothing checks this member
    /// (ovn-octavia-provider reports a member it failed to add ACTIVE and NO_MONITOR).
    pub pool_monitored: Option<bool>,
    /// When `operating` last changed (or the member was requested, while never seen).
    pub operating_since: Instant,
    /// Since when it has read up (ONLINE, or DRAINING: up at weight 0) without a break; `None`
    /// while it does not.
    pub up_since: Option<Instant>,
    /// When it stopped reading up after a stretch long enough to count as serving, and has
    /// not served that long since: the serving gate's not-serving clock runs from here, and
    /// the member needs the recovery time to count again.
    pub fell_at: Option<Instant>,
    /// When `presence` last changed (or the member was requested, while never seen).
    pub since: Instant,
    /// When it was first seen in its pool; `None` until then.
    pub first_seen: Option<Instant>,
    /// When it was first seen ACTIVE.
    pub active_at: Option<Instant>,
    /// Octavia's id of the member once known: the desired `member_id`, or the id it was first
    /// seen with (a re-created member's new id).
    pub id: Option<String>,
    /// Seen under another id after it was first seen: it was deleted and created again (a
    /// repair of an ERROR member), so its pending time counts from then, not from the request.
    pub recreated: bool,
}

/// The engine's knowledge of one load balancer.
#[derive(Clone, Debug)]
pub struct LbTrack {
    /// What the reconciler wants of this LB.
    pub desired: DesiredLb,
    /// `None` until the first poll answers; `Some(None)` when the LB is gone (404).
    pub lb: Option<Option<(ProvisioningStatus, OperatingStatus)>>,
    /// When the LB's provisioning status last changed (or it went gone); before the first poll,
    /// when tracking began.
    pub lb_since: Instant,
    /// Each desired member's tracked state, in the desired order.
    pub members: Vec<MemberTrack>,
    /// Members seen in desired pools that nobody wants.
    pub stale: Vec<SeenMember>,
    /// When a poll last answered for this LB; `None` before the first.
    pub last_poll: Option<Instant>,
}

impl LbTrack {
    /// Starts tracking `desired` at `now`: nothing observed yet, each member absent since its
    /// request.
    pub fn new(desired: DesiredLb, now: Instant) -> Self {
        let mut track = LbTrack {
            desired: desired.clone(),
            lb: None,
            lb_since: now,
            members: Vec::new(),
            stale: Vec::new(),
            last_poll: None,
        };
        track.set_desired(desired);
        track
    }

    /// New desired membership; what is known of members that stay desired is kept.
    pub fn set_desired(&mut self, desired: DesiredLb) {
        let previous = std::mem::take(&mut self.members);
        self.members = desired
            .members
            .iter()
            .map(|want| {
                let pool_id = desired.pools.get(&want.port).cloned();
                match previous.iter().find(|t| same_member(&t.desired, want)) {
                    Some(known) => MemberTrack {
                        desired: want.clone(),
                        pool_id,
                        id: known.id.clone().or_else(|| want.member_id.clone()),
                        ..known.clone()
                    },
                    None => MemberTrack {
                        desired: want.clone(),
                        pool_id,
                        presence: Presence::Absent,
                        operating: None,
                        pool_monitored: None,
                        operating_since: want.requested_at,
                        up_since: None,
                        fell_at: None,
                        since: want.requested_at,
                        first_seen: None,
                        active_at: None,
                        id: want.member_id.clone(),
                        recreated: false,
                    },
                }
            })
            .collect();
        self.desired = desired;
    }

    /// Folds one observation in; returns whether anything the verdict depends on changed.
    /// `serving` (the serving gate's times, when on) says which stretches up counted.
    pub fn observe(
        &mut self,
        seen: &Observation,
        now: Instant,
        serving: Option<&ServingRules>,
    ) -> bool {
        let lb = Some((seen.provisioning, seen.operating));
        let previous = self.lb.flatten().map(|(provisioning, _)| provisioning);
        if previous != Some(seen.provisioning) {
            self.lb_since = now;
        }
        let mut changed = self.lb != Some(lb);
        self.lb = Some(lb);
        self.last_poll = Some(now);
        for track in &mut self.members {
            let Some(pool) = &track.pool_id else { continue };
            if !seen.pools_seen.contains(pool) {
                continue;
            }
            let found = seen.members.iter().find(|m| {
                &m.pool_id == pool
                    && m.address == track.desired.address
                    && m.port == track.desired.port
            });
            let presence = match found {
                Some(m) => Presence::Seen(m.provisioning),
                None => Presence::Absent,
            };
            let operating = found.map(|m| m.operating);
            if let Some(monitored) = &seen.monitored_pools {
                let monitored = Some(monitored.contains(pool));
                changed |= monitored != track.pool_monitored;
                track.pool_monitored = monitored;
            }
            if presence != track.presence {
                track.presence = presence;
                track.since = now;
                changed = true;
            }
            if operating != track.operating {
                track.operating = operating;
                track.operating_since = now;
                let up = matches!(
                    operating,
                    Some(OperatingStatus::Online | OperatingStatus::Draining)
                );
                match (up, track.up_since) {
                    (true, None) => track.up_since = Some(up_from(track, now, serving)),
                    (false, Some(from)) => {
                        let counted = serving.is_some_and(|rules| {
                            now.duration_since(from) >= rules.steady_for(track)
                        });
                        if counted {
                            track.fell_at = Some(now);
                        }
                        track.up_since = None;
                    }
                    _ => {}
                }
                changed = true;
            }
            if let Some(m) = found {
                let another_object =
                    track.first_seen.is_some() && track.id.as_deref().is_some_and(|id| id != m.id);
                if another_object {
                    track.id = Some(m.id.clone());
                    track.active_at = None;
                    track.fell_at = None;
                    track.recreated = true;
                    track.since = now;
                    changed = true;
                }
                track.first_seen.get_or_insert(now);
                track.id.get_or_insert_with(|| m.id.clone());
                if m.provisioning == ProvisioningStatus::Active {
                    track.active_at.get_or_insert(now);
                }
            }
        }
        let desired_pools: Vec<&String> = self.desired.pools.values().collect();
        let stale: Vec<SeenMember> = seen
            .members
            .iter()
            .filter(|m| desired_pools.contains(&&m.pool_id))
            .filter(|m| {
                !self.members.iter().any(|t| {
                    t.pool_id.as_ref() == Some(&m.pool_id)
                        && t.desired.address == m.address
                        && t.desired.port == m.port
                })
            })
            .cloned()
            .collect();
        changed |= stale != self.stale;
        self.stale = stale;
        changed
    }

    /// The load balancer answered 404.
    pub fn observe_gone(&mut self, now: Instant) -> bool {
        let changed = self.lb != Some(None);
        if changed {
            self.lb_since = now;
        }
        self.lb = Some(None);
        self.last_poll = Some(now);
        changed
    }

    /// The OpenStackMachines behind this LB's desired members, and those leaving it, each once.
    pub fn machines(&self) -> Vec<ObjectName> {
        let mut machines: Vec<ObjectName> = self
            .members
            .iter()
            .map(|m| m.desired.owner.clone())
            .chain(self.desired.leaving.iter().cloned())
            .collect();
        machines.sort();
        machines.dedup();
        machines
    }
}

impl LbTrack {
    /// `desired` with each member already tracked keeping its earliest `requested_at` and,
    /// once seen, what it said about having served.
    pub fn keep_request_times(&self, mut desired: DesiredLb) -> DesiredLb {
        for want in &mut desired.members {
            if let Some(known) = self.members.iter().find(|t| same_member(&t.desired, want)) {
                want.requested_at = want.requested_at.min(known.desired.requested_at);
                // Read only before a first look: a machine released since changes nothing.
                if known.first_seen.is_some() {
                    want.served = known.desired.served;
                }
            }
        }
        desired
    }
}

/// When a member just seen up counts as up from: now, or, on a first look at a member that
/// served before (a restarted engine's), a settle time ago, so it serves at once. A member
/// at weight 0 (DRAINING) is a new one kept out of traffic, never counted so.
fn up_from(track: &MemberTrack, now: Instant, serving: Option<&ServingRules>) -> Instant {
    let served_before = track.first_seen.is_none()
        && track.desired.served
        && track.operating == Some(OperatingStatus::Online);
    serving
        .filter(|_| served_before)
        .and_then(|rules| now.checked_sub(rules.steady_for(track)))
        .unwrap_or(now)
}

fn same_member(a: &DesiredMember, b: &DesiredMember) -> bool {
    a.address == b.address && a.port == b.port
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub fn member(name: &str, address: &str, at: Instant) -> DesiredMember {
        DesiredMember {
            owner: ObjectName::new("ns", name),
            name: name.into(),
            address: address.into(),
            port: 6443,
            requested_at: at,
            member_id: None,
            served: false,
        }
    }

    pub fn desired(members: Vec<DesiredMember>) -> DesiredLb {
        DesiredLb {
            lb_id: "lb".into(),
            cluster: ObjectName::new("ns", "c1"),
            pools: BTreeMap::from([(6443, "pool".to_owned())]),
            members,
            rollout_waiting: false,
            leaving: Vec::new(),
        }
    }

    pub fn seen(lb: ProvisioningStatus, members: &[(&str, ProvisioningStatus)]) -> Observation {
        Observation {
            provisioning: lb,
            operating: OperatingStatus::Online,
            members: members
                .iter()
                .map(|(address, status)| SeenMember {
                    pool_id: "pool".into(),
                    id: format!("id-{address}"),
                    name: String::new(),
                    address: (*address).into(),
                    port: 6443,
                    provisioning: *status,
                    operating: OperatingStatus::NoMonitor,
                })
                .collect(),
            pools_seen: vec!["pool".into()],
            monitored_pools: Some(Vec::new()),
        }
    }

    #[test]
    fn recalled_members_reading_no_monitor_wait_for_a_tree_while_their_machine_is_held() {
        let mut recalled = Recalled {
            updated_at: "2026-12-01T03:00:00".into(),
            members: seen(
                ProvisioningStatus::Active,
                &[("10.0.0.1", ProvisioningStatus::Active)],
            )
            .members,
        };
        let mut wanted = desired(vec![member("m1", "10.0.0.1", Instant::now())]);
        assert!(
            !recalled.may_stand_for_serving(&wanted),
            "only a tree says whether a monitor checks it"
        );
        wanted.members[0].served = true;
        assert!(
            recalled.may_stand_for_serving(&wanted),
            "released before the restart: nothing to hold"
        );
        wanted.members[0].served = false;
        recalled.members[0].operating = OperatingStatus::Online;
        assert!(recalled.may_stand_for_serving(&wanted));
    }

    #[test]
    fn observation_tracks_transitions_first_seen_and_stale_members() {
        let t0 = Instant::now();
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        let t1 = t0 + Duration::from_secs(1);
        assert!(track.observe(
            &seen(
                ProvisioningStatus::PendingUpdate,
                &[("10.0.0.1", ProvisioningStatus::PendingCreate)]
            ),
            t1,
            None
        ));
        assert_eq!(
            track.members[0].presence,
            Presence::Seen(ProvisioningStatus::PendingCreate)
        );
        assert_eq!(track.members[0].first_seen, Some(t1));
        assert_eq!(track.members[0].id.as_deref(), Some("id-10.0.0.1"));
        let t2 = t1 + Duration::from_secs(1);
        // Nothing changed: no wake-up.
        assert!(!track.observe(
            &seen(
                ProvisioningStatus::PendingUpdate,
                &[("10.0.0.1", ProvisioningStatus::PendingCreate)]
            ),
            t2,
            None
        ));
        assert_eq!(track.members[0].since, t1);
        let t3 = t2 + Duration::from_secs(1);
        let both = seen(
            ProvisioningStatus::Active,
            &[
                ("10.0.0.1", ProvisioningStatus::Active),
                ("10.0.0.9", ProvisioningStatus::Active),
            ],
        );
        assert!(track.observe(&both, t3, None));
        assert_eq!(track.members[0].active_at, Some(t3));
        assert_eq!(track.stale.len(), 1);
        assert_eq!(track.stale[0].address, "10.0.0.9");
    }

    #[test]
    fn desired_changes_keep_what_is_known() {
        let t0 = Instant::now();
        let mut track = LbTrack::new(desired(vec![member("m1", "10.0.0.1", t0)]), t0);
        track.observe(
            &seen(
                ProvisioningStatus::Active,
                &[("10.0.0.1", ProvisioningStatus::Active)],
            ),
            t0,
            None,
        );
        track.set_desired(desired(vec![
            member("m1", "10.0.0.1", t0),
            member("m2", "10.0.0.2", t0),
        ]));
        assert_eq!(
            track.members[0].presence,
            Presence::Seen(ProvisioningStatus::Active)
        );
        assert_eq!(track.members[1].presence, Presence::Absent);
        let machines: Vec<String> = track.machines().into_iter().map(|m| m.name).collect();
        assert_eq!(machines, ["m1", "m2"]);
    }
}
