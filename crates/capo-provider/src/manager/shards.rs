//! Shards: replicas with `--watch-filter`, each holding its own Lease and a share of every
//! cloud's OpenStack budget (`--openstack-budget-share`). Kubernetes is the coordinator: a shard
//! writes its share on its Lease, and once it leads it adds up the shares written on the
//! Leases held beside it. When they come to more than the whole budget, it lets go of its
//! Lease and stops, naming the other shards, before it sends anything to a cloud.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};

/// The annotation that carries a shard's share on its Lease.
pub const SHARE_ANNOTATION: &str = "capo-rs.io/openstack-budget-share";

/// What the shares of the shards come to.
#[derive(Debug, PartialEq)]
pub struct Shares {
    /// Every held Lease that carries a share, with its share, this shard's included.
    pub by_lease: BTreeMap<String, f64>,
    /// The sum of the shares in `by_lease`; more than 1 is over a cloud's whole budget.
    pub total: f64,
}

impl Shares {
    /// Over the whole budget (with room for the rounding of decimal shares).
    pub fn exceed_budget(&self) -> bool {
        self.total > 1.0 + 1e-9
    }
}

/// This shard's share beside those written on the other Leases that someone holds at `now` (a
/// released Lease, with no holder, claims nothing; nor does one whose holder stopped renewing
/// it longer ago than its duration: a shard killed without releasing it, that nobody took
/// over, would otherwise claim its share for ever). A share that does not parse counts as the
/// whole budget: a cloud's limit is not to be guessed at.
pub fn add_up(leases: &[Lease], own_lease: &str, own_share: f64, now: Timestamp) -> Shares {
    let mut by_lease = BTreeMap::from([(own_lease.to_owned(), own_share)]);
    for lease in leases {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let held = lease.spec.as_ref().is_some_and(|spec| held_at(spec, now));
        let share = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARE_ANNOTATION));
        if name == own_lease || !held {
            continue;
        }
        if let Some(share) = share {
            let share = parse_share(share).unwrap_or(1.0);
            by_lease.insert(name, share);
        }
    }
    let total = by_lease.values().sum();
    Shares { by_lease, total }
}

/// Whether a Lease has a holder that renewed it within its duration (a Lease without a renewal
/// time or duration, as other tools may write, counts as held).
fn held_at(spec: &LeaseSpec, now: Timestamp) -> bool {
    let holder = spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(seconds)) => renewed
            .0
            .checked_add(SignedDuration::from_secs(i64::from(seconds)))
            .is_ok_and(|until| until < now),
        _ => false,
    };
    holder && !expired
}

/// A share as the flag and the annotation write it: a number in (0, 1].
pub fn parse_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!("{text:?} is not a share of the budget in (0, 1]")),
    }
}

/// Reads the Leases of `namespace` and adds up the shards' shares.
pub async fn shares(
    client: kube::Client,
    namespace: &str,
    own_lease: &str,
    own_share: f64,
) -> Result<Shares, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let leases = api.list(&ListParams::default()).await?;
    Ok(add_up(
        &leases.items,
        own_lease,
        own_share,
        Timestamp::now(),
    ))
}

/// The refusal a shard gives when the shares come to more than the budget.
pub fn over_budget_message(shares: &Shares) -> String {
    let listed: Vec<String> = shares
        .by_lease
        .iter()
        .map(|(lease, share)| format!("{lease} {share}"))
        .collect();
    format!(
        "the shards' --openstack-budget-share values add up to {:.3}, more than the cloud's whole budget: {} (Lease and share). Lower a share, or stop a shard",
        shares.total,
        listed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, holder: Option<&str>, share: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: share
                    .map(|s| BTreeMap::from([(SHARE_ANNOTATION.to_owned(), s.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
        }
    }

    /// A shard killed without releasing its Lease (found on a real API server: a Lease left
    /// by an earlier run kept every later leader from starting) claims its share only while
    /// its Lease lasts.
    #[test]
    fn a_lease_its_holder_stopped_renewing_claims_nothing_once_it_runs_out() {
        let now = Timestamp::now();
        let mut killed = lease("capo-rs-leader-election-a", Some("pod-a"), Some("1"));
        let spec = killed.spec.as_mut().expect("a spec");
        spec.lease_duration_seconds = Some(15);
        spec.renew_time = Some(MicroTime(now - SignedDuration::from_secs(60)));
        let shares = add_up(&[killed.clone()], "capo-rs-leader-election-b", 1.0, now);
        assert!(!shares.exceed_budget(), "{shares:?}");
        let spec = killed.spec.as_mut().expect("a spec");
        spec.renew_time = Some(MicroTime(now - SignedDuration::from_secs(5)));
        let shares = add_up(&[killed], "capo-rs-leader-election-b", 1.0, now);
        assert!(shares.exceed_budget(), "still held: {shares:?}");
    }

    #[test]
    fn held_shard_leases_count_and_released_or_foreign_ones_do_not() {
        let leases = [
            lease("capo-rs-leader-election-a", Some("pod-a"), Some("0.5")),
            lease("capo-rs-leader-election-b", None, Some("0.5")),
            lease("some-other-controller", Some("x"), None),
            lease("capo-rs-leader-election-c", Some("pod-c"), Some("0.25")),
        ];
        let shares = add_up(&leases, "capo-rs-leader-election-c", 0.25, Timestamp::now());
        assert_eq!(shares.total, 0.75);
        assert!(!shares.exceed_budget());
        let shares = add_up(&leases, "capo-rs-leader-election-d", 0.6, Timestamp::now());
        assert!(shares.exceed_budget(), "{shares:?}");
        let message = over_budget_message(&shares);
        assert!(
            message.contains("capo-rs-leader-election-a 0.5"),
            "{message}"
        );
    }

    #[test]
    fn thirds_fit_and_an_unreadable_share_claims_everything() {
        let third = 1.0 / 3.0;
        let leases = [
            lease("a", Some("pa"), Some(&third.to_string())),
            lease("b", Some("pb"), Some(&third.to_string())),
        ];
        assert!(!add_up(&leases, "c", third, Timestamp::now()).exceed_budget());
        let leases = [lease("a", Some("pa"), Some("half"))];
        assert!(add_up(&leases, "c", 0.1, Timestamp::now()).exceed_budget());
    }

    #[test]
    fn a_share_is_in_zero_to_one() {
        assert_eq!(parse_share("0.5"), Ok(0.5));
        assert_eq!(parse_share("1"), Ok(1.0));
        for bad in ["0", "-0.1", "1.5", "NaN", "half"] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
    }
}
