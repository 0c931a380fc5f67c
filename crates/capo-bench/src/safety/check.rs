//! The eight invariants, as pure functions of what the simulators hold at one instant.

use std::collections::{BTreeMap, BTreeSet};

use capo_sim::openstack::MemberTruth;
use serde::Serialize;

/// The API server's port: the pool that must never lose its last ACTIVE member.
pub const API_PORT: u16 = 6443;

/// Reconcile errors one object may cost per minute before it is a storm. With the default
/// backoff (1 s doubling to 5 min) a failing object costs at most 6 in its first minute; an
/// object that fails, succeeds and fails again restarts at 1 s, which a fault burst can
/// repeat, so the bound leaves room for that and still catches a loop that ignores backoff.
pub const STORM_ERRORS_PER_OBJECT_MINUTE: f64 = 30.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invariant {
    /// 1: a control-plane machine got a providerID (or `provisioned`) while its member was
    /// not ACTIVE in every pool.
    EarlyRelease,
    /// 2: the API pool had zero ACTIVE members after it first had one, before deletion.
    EmptyPool,
    /// 3: two OpenStack objects for one owner.
    Duplicate,
    /// 4: a run neither completed nor was held with conditions naming the member (or LB).
    SilentHold,
    /// 5: objects left in the cloud after the cluster was deleted.
    Leak,
    /// 6: a panic, or a reconcile error storm.
    PanicOrStorm,
    /// 7: a control-plane machine released while its member's monitor did not read it ONLINE
    /// in every pool (the serving gate's promise).
    ReleasedNotServing,
    /// 8: the API pool had no member both ACTIVE and ONLINE (after it first had one, before
    /// deletion) because of capo-rs: it removed the only serving member, or kept a member
    /// that passes its monitor at weight 0 past the reaction allowance. A member failing its
    /// monitor on its own is the node's doing, not the provider's.
    NoServingMember,
}

impl Invariant {
    pub const ALL: [Invariant; 8] = [
        Invariant::EarlyRelease,
        Invariant::EmptyPool,
        Invariant::Duplicate,
        Invariant::SilentHold,
        Invariant::Leak,
        Invariant::PanicOrStorm,
        Invariant::ReleasedNotServing,
        Invariant::NoServingMember,
    ];

    pub fn number(self) -> usize {
        self as usize + 1
    }

    pub fn title(self) -> &'static str {
        match self {
            Invariant::EarlyRelease => "no providerID before the member is ACTIVE",
            Invariant::EmptyPool => "the API pool never empties",
            Invariant::Duplicate => "no duplicate OpenStack objects",
            Invariant::SilentHold => "completed, or held with named members",
            Invariant::Leak => "nothing left after deletion",
            Invariant::PanicOrStorm => "no panic, no error storm",
            Invariant::ReleasedNotServing => "no providerID before the member is ONLINE",
            Invariant::NoServingMember => "the API pool always has an ACTIVE, ONLINE member",
        }
    }
}

/// One broken invariant in one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    pub invariant: Invariant,
    /// Virtual seconds since the run started.
    pub at: f64,
    pub detail: String,
}

/// Why a machine at `address` may not be released now: its member is missing or not ACTIVE
/// in some pool of the load balancer. `None` when it is ACTIVE in every pool.
pub fn early_release(address: Option<&str>, members: &[MemberTruth]) -> Option<String> {
    let Some(address) = address else {
        return Some("released before its server had an address".to_owned());
    };
    let pools: BTreeSet<&str> = members.iter().map(|m| m.pool_id.as_str()).collect();
    if pools.is_empty() {
        return Some(format!("{address} released while no pool has any member"));
    }
    let problems: Vec<String> = pools
        .into_iter()
        .filter_map(|pool| {
            let member = members
                .iter()
                .find(|m| m.pool_id == pool && m.address == address);
            match member {
                Some(m) if m.provisioning_status == "ACTIVE" => None,
                Some(m) => Some(format!(
                    "member {} in pool {pool} is {}",
                    m.id, m.provisioning_status
                )),
                None => Some(format!("no member for {address} in pool {pool}")),
            }
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Why a released machine at `address` does not serve: its member reads neither ONLINE nor
/// NO_MONITOR (nothing checks it) in some pool. `None` when it serves in every pool.
pub fn released_not_serving(address: &str, members: &[MemberTruth]) -> Option<String> {
    let problems: Vec<String> = members
        .iter()
        .filter(|m| m.address == address)
        .filter(|m| !matches!(m.operating_status, "ONLINE" | "NO_MONITOR"))
        .map(|m| {
            format!(
                "member {} in pool {} reads {}",
                m.id, m.pool_id, m.operating_status
            )
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Members of the API pool that serve: ACTIVE, and ONLINE (or NO_MONITOR: unchecked).
pub fn serving_api_members(members: &[MemberTruth]) -> usize {
    members.iter().filter(|m| serves(m)).count()
}

/// How long a member that passes its monitor may stay at weight 0 while nothing else serves:
/// the time capo-rs has to see the others fail (a status tree, 10 s apart while anything
/// moves) and put the weight back (one member update).
pub const HELD_OUT_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(30);

fn serves(m: &MemberTruth) -> bool {
    m.port == API_PORT
        && m.provisioning_status == "ACTIVE"
        && matches!(m.operating_status, "ONLINE" | "NO_MONITOR")
}

/// A member of the API pool that passes its monitor and is not being deleted: it serves, or
/// would at weight 1.
fn could_serve(m: &MemberTruth) -> bool {
    m.port == API_PORT
        && matches!(m.provisioning_status, "ACTIVE" | "PENDING_UPDATE")
        && matches!(m.operating_status, "ONLINE" | "DRAINING" | "NO_MONITOR")
}

/// Why the API pool has no serving member by capo-rs's doing: a member that served or could
/// (drained) was removed (gone or PENDING_DELETE now) while, at the previous look, no other
/// member served. `None` when a member serves now, or when the ones that served before
/// failed on their own.
pub fn removed_the_only_server(before: &[MemberTruth], now: &[MemberTruth]) -> Option<String> {
    if now.iter().any(serves) {
        return None;
    }
    let removed = |m: &&MemberTruth| {
        now.iter()
            .find(|n| n.id == m.id)
            .is_none_or(|n| n.provisioning_status == "PENDING_DELETE")
    };
    let alone = |m: &MemberTruth| !before.iter().any(|o| o.id != m.id && serves(o));
    before
        .iter()
        .filter(|m| could_serve(m) && alone(m))
        .find(removed)
        .map(|m| {
            format!(
                "member {} ({}) removed while no other member served",
                m.id, m.address
            )
        })
}

/// Members of the API pool that pass their monitor but take no traffic (weight 0, read
/// DRAINING) while no member serves: capo-rs keeps capacity out that the pool needs.
pub fn held_out_while_unserved(members: &[MemberTruth]) -> Vec<String> {
    if members.iter().any(serves) {
        return Vec::new();
    }
    members
        .iter()
        .filter(|m| m.port == API_PORT && m.operating_status == "DRAINING")
        .map(|m| format!("{} {}/DRAINING", m.address, m.provisioning_status))
        .collect()
}

/// ACTIVE members of the API pool.
pub fn active_api_members(members: &[MemberTruth]) -> usize {
    members
        .iter()
        .filter(|m| m.port == API_PORT && m.provisioning_status == "ACTIVE")
        .count()
}

/// Keys held by more than one object of a kind, as `kind key xN`.
pub fn duplicates(inventory: &[(&'static str, String)]) -> Vec<String> {
    let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (kind, key) in inventory {
        *counts.entry((kind, key.as_str())).or_default() += 1;
    }
    counts
        .into_iter()
        .filter(|(_, count)| *count > 1)
        .map(|((kind, key), count)| format!("{kind} {key} x{count}"))
        .collect()
}

/// What is left in the cloud beyond what was there before the cluster.
pub fn leftovers(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> Vec<String> {
    after
        .iter()
        .filter_map(|(kind, count)| {
            let was = before.get(kind).copied().unwrap_or(0);
            (*count > was).then(|| format!("{} {kind}", count - was))
        })
        .collect()
}

/// Errors per object in one minute, for each controller whose count moved.
pub fn error_rates(
    before: &BTreeMap<String, f64>,
    now: &BTreeMap<String, f64>,
    objects: &BTreeMap<String, usize>,
) -> Vec<(String, f64)> {
    now.iter()
        .filter_map(|(controller, total)| {
            let delta = total - before.get(controller).copied().unwrap_or(0.0);
            let objects = objects.get(controller).copied().unwrap_or(0).max(1);
            (delta > 0.0).then(|| (controller.clone(), delta / objects as f64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(pool: &str, address: &str, status: &'static str) -> MemberTruth {
        MemberTruth {
            lb_id: "lb".into(),
            pool_id: pool.into(),
            id: format!("{pool}-{address}"),
            name: String::new(),
            address: address.into(),
            port: API_PORT,
            provisioning_status: status,
            operating_status: "NO_MONITOR",
            weight: 1,
            settled_at: None,
        }
    }

    #[test]
    fn a_machine_is_released_only_when_active_in_every_pool() {
        let members = vec![
            member("api", "10.0.0.1", "ACTIVE"),
            member("extra", "10.0.0.1", "PENDING_CREATE"),
            member("api", "10.0.0.2", "ACTIVE"),
            member("extra", "10.0.0.2", "ACTIVE"),
        ];
        assert_eq!(early_release(Some("10.0.0.2"), &members), None);
        let early = early_release(Some("10.0.0.1"), &members).unwrap();
        assert!(
            early.contains("extra-10.0.0.1 in pool extra is PENDING_CREATE"),
            "{early}"
        );
        let missing = early_release(Some("10.0.0.3"), &members).unwrap();
        assert!(
            missing.contains("no member for 10.0.0.3 in pool api"),
            "{missing}"
        );
        assert!(early_release(None, &members).is_some());
        assert!(early_release(Some("10.0.0.2"), &[]).is_some());
    }

    #[test]
    fn only_active_members_of_the_api_pool_count() {
        let mut other_port = member("extra", "10.0.0.3", "ACTIVE");
        other_port.port = 8443;
        let members = vec![
            member("api", "10.0.0.1", "ACTIVE"),
            member("api", "10.0.0.2", "PENDING_DELETE"),
            member("api", "10.0.0.4", "ERROR"),
            other_port,
        ];
        assert_eq!(active_api_members(&members), 1);
    }

    fn reading(mut m: MemberTruth, operating: &'static str, weight: u32) -> MemberTruth {
        m.operating_status = operating;
        m.weight = weight;
        m
    }

    #[test]
    fn only_capo_rs_taking_the_last_server_away_counts() {
        let a = reading(member("api", "10.0.0.1", "ACTIVE"), "ONLINE", 1);
        let b = reading(member("api", "10.0.0.2", "ACTIVE"), "ERROR", 1);
        // The old member served alone and was deleted: capo-rs emptied the pool.
        let before = vec![a.clone(), b.clone()];
        let deleting = reading(member("api", "10.0.0.1", "PENDING_DELETE"), "ONLINE", 1);
        let found = removed_the_only_server(&before, &[deleting, b.clone()]).unwrap();
        assert!(found.contains("10.0.0.1"), "{found}");
        assert!(removed_the_only_server(&before, std::slice::from_ref(&b)).is_some());
        // Both served, then the new one failed as the old one went: the node's doing.
        let b_online = reading(b.clone(), "ONLINE", 1);
        assert_eq!(
            removed_the_only_server(&[a.clone(), b_online], std::slice::from_ref(&b)),
            None
        );
        // Nothing removed: a member failing on its own is not capo-rs's doing.
        let a_failed = reading(a.clone(), "ERROR", 1);
        assert_eq!(
            removed_the_only_server(&before, &[a_failed, b.clone()]),
            None
        );
        // A drained member deleted while the other fails: the pool lost what could serve.
        let drained_before = vec![reading(a.clone(), "DRAINING", 0), b.clone()];
        assert!(removed_the_only_server(&drained_before, std::slice::from_ref(&b)).is_some());
        // A drained member that still passes its monitor, while the other fails.
        let a_drained = reading(a.clone(), "DRAINING", 0);
        assert_eq!(
            held_out_while_unserved(&[a_drained.clone(), b.clone()]),
            vec!["10.0.0.1 ACTIVE/DRAINING".to_owned()]
        );
        let b_online = reading(b, "ONLINE", 1);
        assert!(held_out_while_unserved(&[a_drained, b_online]).is_empty());
    }

    #[test]
    fn a_key_seen_twice_is_a_duplicate() {
        let inventory = vec![
            ("server", "c1-cp-a".to_owned()),
            ("port", "c1-cp-a-0".to_owned()),
            ("server", "c1-cp-b".to_owned()),
            ("server", "c1-cp-a".to_owned()),
            ("port", "c1-cp-a".to_owned()),
        ];
        assert_eq!(duplicates(&inventory), vec!["server c1-cp-a x2".to_owned()]);
    }

    #[test]
    fn leftovers_are_what_the_census_gained() {
        let before = BTreeMap::from([("networks".to_owned(), 2), ("ports".to_owned(), 1)]);
        let after = BTreeMap::from([
            ("networks".to_owned(), 2),
            ("ports".to_owned(), 3),
            ("members".to_owned(), 1),
        ]);
        assert_eq!(leftovers(&before, &after), vec!["1 members", "2 ports"]);
        assert!(leftovers(&before, &before).is_empty());
    }

    #[test]
    fn error_rates_are_per_object_and_minute() {
        let before = BTreeMap::from([("openstackmachine".to_owned(), 4.0)]);
        let now = BTreeMap::from([
            ("openstackmachine".to_owned(), 34.0),
            ("openstackcluster".to_owned(), 2.0),
        ]);
        let objects = BTreeMap::from([("openstackmachine".to_owned(), 3)]);
        let rates = error_rates(&before, &now, &objects);
        assert_eq!(
            rates,
            vec![
                ("openstackcluster".to_owned(), 2.0),
                ("openstackmachine".to_owned(), 10.0)
            ]
        );
    }
}
