//! What a floating IP pool does next (pure): which IPAddresses to release and how, which
//! claims to answer with which address, and the pool's status lists.
//!
//! The IPAddress objects are the truth about what is claimed, read fresh from the API
//! server at each reconcile, and the pool's reconciles never overlap. An address is handed
//! out only when no IPAddress holds it, and each one only once per pass. CAPO #1869 (one IP
//! handed to two claims) came from trusting a status list that lagged behind the
//! IPAddresses.

use std::collections::{BTreeMap, BTreeSet};

use capo_api::floating_ip_pool::ReclaimPolicy;

/// The pool's spec and last status, as the plan needs them.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    /// `spec.preAllocatedFloatingIPs`: IPs handed out first, never deleted on release.
    pub preallocated: Vec<String>,
    /// `status.availableIPs` as last written: IPs the pool held free.
    pub available: Vec<String>,
    /// `spec.reclaimPolicy`: whether a released IP (not preallocated) is deleted or kept.
    pub reclaim: ReclaimPolicy,
    /// `spec.maxIPs`: the most IPs claimed at once; `None` for no limit.
    pub max_ips: Option<i64>,
}

/// An IPAddress of this pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The IPAddress's name, the same as its claim's.
    pub name: String,
    /// The claim it answers (`spec.claimRef`).
    pub claim: String,
    /// The IP it holds (`spec.address`).
    pub ip: String,
    /// It has a deletion timestamp: its IP is to be released.
    pub deleting: bool,
    /// It still carries the pool's finalizer: its floating IP has not been released.
    pub held: bool,
}

/// An IPAddressClaim asking this pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The claim's name.
    pub name: String,
    /// It has a deletion timestamp: it gets no address, and its IPAddress goes.
    pub deleting: bool,
    /// The claim's `status.addressRef` names an address already.
    pub answered: bool,
}

/// A floating IP on the pool's network, as Neutron lists it for the project.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudIp {
    /// Neutron's ID of the floating IP.
    pub id: String,
    /// The address itself (`floating_ip_address`).
    pub ip: String,
    /// Associated with a port (`port_id` set).
    pub attached: bool,
    /// It carries the pool's tag: the pool allocated it.
    pub tagged: bool,
}

/// What to do with the floating IP of an IPAddress that is going.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// Reclaim policy Delete, and not preallocated: delete it.
    Delete {
        /// The IPAddress's name.
        address: String,
        /// The floating IP's Neutron ID.
        id: String,
    },
    /// Back into the pool, detached first when still attached.
    Return {
        /// The IPAddress's name.
        address: String,
        /// The floating IP's Neutron ID.
        id: String,
        /// Still associated with a port: detach it first.
        detach: bool,
    },
    /// Neutron no longer has it: nothing to release.
    Gone {
        /// The IPAddress's name.
        address: String,
    },
}

impl Release {
    /// The IPAddress whose finalizer goes once this is done.
    pub fn address(&self) -> &str {
        match self {
            Release::Delete { address, .. }
            | Release::Return { address, .. }
            | Release::Gone { address } => address,
        }
    }
}

/// How a claim is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Its IPAddress exists already (a lost status write): point the claim at it.
    Link {
        /// The claim's name (its IPAddress is named the same).
        claim: String,
    },
    /// An IP the pool holds.
    Give {
        /// The claim's name (its IPAddress is named the same).
        claim: String,
        /// The IP given.
        ip: String,
    },
    /// A new floating IP from the network.
    Allocate {
        /// The claim's name (its IPAddress is named the same).
        claim: String,
    },
}

/// Everything one pass does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// How each going IPAddress that still holds its floating IP lets it go.
    pub releases: Vec<Release>,
    /// IPAddresses whose claim is gone or going: deleted, so their IP is released. A
    /// garbage collector would do it through the owner reference; not waiting for one
    /// means nothing leaks where none runs, and the IP comes back sooner.
    pub orphans: Vec<String>,
    /// How each live claim with no address yet is answered, in the claims' order.
    pub answers: Vec<Answer>,
    /// Claims left waiting because `maxIPs` is reached.
    pub over_max: Vec<String>,
    /// Addresses that two live IPAddresses hold (left by an earlier provider): reported.
    pub duplicates: Vec<String>,
    /// `status.claimedIPs`: the IPs live IPAddresses hold, and those given this pass.
    pub claimed: Vec<String>,
    /// `status.availableIPs`: the IPs the pool still holds free after this pass's answers.
    pub available: Vec<String>,
    /// `status.failedIPs`: IPs the pool should hold (preallocated or free) that Neutron
    /// does not have.
    pub failed: Vec<String>,
}

/// The pass for a pool that is not being deleted.
pub fn plan(pool: &Pool, addresses: &[Address], claims: &[Claim], cloud: &[CloudIp]) -> Plan {
    let by_ip: BTreeMap<&str, &CloudIp> = cloud.iter().map(|c| (c.ip.as_str(), c)).collect();
    let releases = releases(pool, addresses, &by_ip);
    let live_claims: BTreeSet<&str> = claims
        .iter()
        .filter(|c| !c.deleting)
        .map(|c| c.name.as_str())
        .collect();
    let orphans = addresses
        .iter()
        .filter(|a| !a.deleting && !live_claims.contains(a.claim.as_str()))
        .map(|a| a.name.clone())
        .collect();
    let mut claimed: Vec<String> = Vec::new();
    let mut duplicates = BTreeSet::new();
    for address in addresses.iter().filter(|a| !a.deleting) {
        if claimed.contains(&address.ip) {
            duplicates.insert(address.ip.clone());
        } else {
            claimed.push(address.ip.clone());
        }
    }
    let (mut free, failed) = holdings(pool, &releases, &by_ip, &claimed);
    let existing: BTreeSet<&str> = addresses.iter().map(|a| a.name.as_str()).collect();
    let mut answers = Vec::new();
    let mut over_max = Vec::new();
    let mut holding = claimed.len() as i64;
    for claim in claims.iter().filter(|c| !c.deleting && !c.answered) {
        let name = claim.name.clone();
        if existing.contains(claim.name.as_str()) {
            answers.push(Answer::Link { claim: name });
        } else if !free.is_empty() {
            let ip = free.remove(0);
            claimed.push(ip.clone());
            answers.push(Answer::Give { claim: name, ip });
            holding += 1;
        } else if pool.max_ips.is_some_and(|max| holding >= max) {
            over_max.push(name);
        } else {
            answers.push(Answer::Allocate { claim: name });
            holding += 1;
        }
    }
    Plan {
        releases,
        orphans,
        answers,
        over_max,
        duplicates: duplicates.into_iter().collect(),
        claimed,
        available: free,
        failed,
    }
}

/// How each going IPAddress that still holds its floating IP lets it go.
fn releases(pool: &Pool, addresses: &[Address], by_ip: &BTreeMap<&str, &CloudIp>) -> Vec<Release> {
    addresses
        .iter()
        .filter(|a| a.deleting && a.held)
        .map(|a| {
            let address = a.name.clone();
            let Some(found) = by_ip.get(a.ip.as_str()) else {
                return Release::Gone { address };
            };
            let id = found.id.clone();
            let preallocated = pool.preallocated.contains(&a.ip);
            if pool.reclaim == ReclaimPolicy::Delete && !preallocated {
                Release::Delete { address, id }
            } else {
                Release::Return {
                    address,
                    id,
                    detach: found.attached,
                }
            }
        })
        .collect()
}

/// The IPs the pool may hand out (preallocated first, in the spec's order), and those it
/// should hold but Neutron does not have. A floating IP the pool allocated but never
/// recorded (a crash between the create and the IPAddress) is found by its tag and held.
/// One attached to a port no claim explains is someone else's, and is not handed out.
fn holdings(
    pool: &Pool,
    releases: &[Release],
    by_ip: &BTreeMap<&str, &CloudIp>,
    claimed: &[String],
) -> (Vec<String>, Vec<String>) {
    let returned = releases.iter().filter_map(|r| match r {
        Release::Return { id, .. } => by_ip.values().find(|c| &c.id == id).map(|c| c.ip.clone()),
        _ => None,
    });
    let tagged = by_ip.values().filter(|c| c.tagged).map(|c| c.ip.clone());
    let mut candidates: Vec<String> = Vec::new();
    for ip in pool
        .preallocated
        .iter()
        .cloned()
        .chain(pool.available.iter().cloned())
        .chain(returned)
        .chain(tagged)
    {
        if !candidates.contains(&ip) && !claimed.contains(&ip) {
            candidates.push(ip);
        }
    }
    let deleted: BTreeSet<&str> = releases
        .iter()
        .filter_map(|r| match r {
            Release::Delete { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let returned_ids: BTreeSet<&str> = releases
        .iter()
        .filter_map(|r| match r {
            Release::Return { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut free = Vec::new();
    let mut failed = Vec::new();
    for ip in candidates {
        match by_ip.get(ip.as_str()) {
            None => failed.push(ip),
            Some(found) if deleted.contains(found.id.as_str()) => {}
            Some(found) if found.attached && !returned_ids.contains(found.id.as_str()) => {}
            Some(_) => free.push(ip),
        }
    }
    (free, failed)
}

/// The floating IPs a pool being deleted removes: every one it allocated and holds free
/// (CAPO deletes the available ones that were not preallocated, whatever the policy).
pub fn on_pool_deletion(pool: &Pool, cloud: &[CloudIp]) -> Vec<String> {
    cloud
        .iter()
        .filter(|c| !pool.preallocated.contains(&c.ip))
        .filter(|c| c.tagged || pool.available.contains(&c.ip))
        .filter(|c| !c.attached)
        .map(|c| c.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(id: &str, ip: &str, tagged: bool) -> CloudIp {
        CloudIp {
            id: id.into(),
            ip: ip.into(),
            attached: false,
            tagged,
        }
    }

    fn address(name: &str, ip: &str) -> Address {
        Address {
            name: name.into(),
            claim: name.into(),
            ip: ip.into(),
            deleting: false,
            held: true,
        }
    }

    fn claim(name: &str) -> Claim {
        Claim {
            name: name.into(),
            deleting: false,
            answered: false,
        }
    }

    #[test]
    fn many_claims_at_once_get_distinct_addresses_preallocated_first() {
        let pool = Pool {
            preallocated: vec!["1.0.0.9".into(), "1.0.0.1".into()],
            ..Pool::default()
        };
        let cloud = [ip("a", "1.0.0.1", false), ip("b", "1.0.0.9", false)];
        let claims: Vec<Claim> = (0..4).map(|i| claim(&format!("c{i}"))).collect();
        let plan = plan(&pool, &[], &claims, &cloud);
        assert_eq!(
            plan.answers,
            [
                Answer::Give {
                    claim: "c0".into(),
                    ip: "1.0.0.9".into()
                },
                Answer::Give {
                    claim: "c1".into(),
                    ip: "1.0.0.1".into()
                },
                Answer::Allocate { claim: "c2".into() },
                Answer::Allocate { claim: "c3".into() },
            ]
        );
        assert!(plan.available.is_empty());
    }

    #[test]
    fn an_ip_an_ipaddress_holds_is_never_handed_out_even_when_the_status_says_it_is_free() {
        // The status lags behind (#1869): it still lists 1.0.0.1 as available.
        let pool = Pool {
            available: vec!["1.0.0.1".into()],
            ..Pool::default()
        };
        let cloud = [ip("a", "1.0.0.1", true)];
        let plan = plan(&pool, &[address("c0", "1.0.0.1")], &[claim("c1")], &cloud);
        assert_eq!(plan.answers, [Answer::Allocate { claim: "c1".into() }]);
        assert_eq!(plan.claimed, ["1.0.0.1"]);
        assert!(plan.available.is_empty());
    }

    #[test]
    fn a_claim_whose_address_exists_is_linked_not_given_a_second_one() {
        let claims = [claim("c0")];
        let plan = plan(
            &Pool::default(),
            &[address("c0", "1.0.0.1")],
            &claims,
            &[ip("a", "1.0.0.1", true)],
        );
        assert_eq!(plan.answers, [Answer::Link { claim: "c0".into() }]);
    }

    #[test]
    fn a_going_address_is_deleted_or_returned_by_the_reclaim_policy() {
        let mut going = address("c0", "1.0.0.1");
        going.deleting = true;
        let mut preallocated = address("c1", "1.0.0.2");
        preallocated.deleting = true;
        let mut cloud = vec![ip("a", "1.0.0.1", true), ip("b", "1.0.0.2", false)];
        cloud[1].attached = true;
        let mut pool = Pool {
            preallocated: vec!["1.0.0.2".into()],
            reclaim: ReclaimPolicy::Delete,
            ..Pool::default()
        };
        let deleting = plan(&pool, &[going.clone(), preallocated.clone()], &[], &cloud);
        assert_eq!(
            deleting.releases,
            [
                Release::Delete {
                    address: "c0".into(),
                    id: "a".into()
                },
                Release::Return {
                    address: "c1".into(),
                    id: "b".into(),
                    detach: true
                },
            ]
        );
        assert_eq!(deleting.available, ["1.0.0.2"], "deleted ones are not free");
        pool.reclaim = ReclaimPolicy::Retain;
        let retaining = plan(&pool, &[going, preallocated], &[], &cloud);
        assert!(matches!(retaining.releases[0], Release::Return { .. }));
        assert_eq!(retaining.available, ["1.0.0.2", "1.0.0.1"]);
    }

    #[test]
    fn an_ip_neutron_lost_is_failed_and_a_tagged_one_the_status_forgot_is_held() {
        let pool = Pool {
            available: vec!["1.0.0.1".into()],
            ..Pool::default()
        };
        let cloud = [ip("b", "1.0.0.2", true), ip("c", "1.0.0.3", false)];
        let plan = plan(&pool, &[], &[], &cloud);
        assert_eq!(plan.failed, ["1.0.0.1"]);
        assert_eq!(
            plan.available,
            ["1.0.0.2"],
            "untagged 1.0.0.3 is not the pool's"
        );
    }

    #[test]
    fn max_ips_stops_new_allocations_but_not_handing_out_held_ones() {
        let pool = Pool {
            max_ips: Some(2),
            available: vec!["1.0.0.2".into()],
            ..Pool::default()
        };
        let cloud = [ip("a", "1.0.0.1", true), ip("b", "1.0.0.2", true)];
        let claims = [claim("c1"), claim("c2"), claim("c3")];
        let plan = plan(&pool, &[address("c0", "1.0.0.1")], &claims, &cloud);
        assert_eq!(
            plan.answers,
            [Answer::Give {
                claim: "c1".into(),
                ip: "1.0.0.2".into()
            }]
        );
        assert_eq!(plan.over_max, ["c2", "c3"]);
    }

    #[test]
    fn an_address_whose_claim_is_gone_or_going_is_deleted_and_keeps_its_ip_until_released() {
        let mut going = claim("c1");
        going.deleting = true;
        let addresses = [
            address("c0", "1.0.0.1"),
            address("c1", "1.0.0.2"),
            address("c2", "1.0.0.3"),
        ];
        let cloud = [
            ip("a", "1.0.0.1", true),
            ip("b", "1.0.0.2", true),
            ip("c", "1.0.0.3", true),
        ];
        let plan = plan(&Pool::default(), &addresses, &[going, claim("c2")], &cloud);
        assert_eq!(plan.orphans, ["c0", "c1"]);
        assert_eq!(
            plan.claimed,
            ["1.0.0.1", "1.0.0.2", "1.0.0.3"],
            "held until released"
        );
    }

    #[test]
    fn two_live_addresses_on_one_ip_are_reported() {
        let addresses = [address("c0", "1.0.0.1"), address("c1", "1.0.0.1")];
        let plan = plan(
            &Pool::default(),
            &addresses,
            &[],
            &[ip("a", "1.0.0.1", true)],
        );
        assert_eq!(plan.duplicates, ["1.0.0.1"]);
        assert_eq!(plan.claimed, ["1.0.0.1"]);
    }

    #[test]
    fn a_deleted_pool_removes_what_it_allocated_and_keeps_what_was_given_to_it() {
        let pool = Pool {
            preallocated: vec!["1.0.0.1".into()],
            available: vec!["1.0.0.3".into()],
            ..Pool::default()
        };
        let cloud = [
            ip("a", "1.0.0.1", true),
            ip("b", "1.0.0.2", true),
            ip("c", "1.0.0.3", false),
            ip("d", "1.0.0.4", false),
        ];
        assert_eq!(on_pool_deletion(&pool, &cloud), ["b", "c"]);
    }
}
