//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does
//! it (controller-runtime's `--leader-elect`):
//!
//! - Every `retry_period` a candidate reads the Lease. It takes it when nobody holds it, or
//!   when the holder's record has not changed for the record's `leaseDurationSeconds` *as
//!   measured on this replica's own monotonic clock* (remote clocks are never compared).
//! - Writes replace the Lease at the resourceVersion read, so two candidates can never both
//!   win one round: the second gets 409 Conflict.
//! - The leader renews every `retry_period`. When it has not renewed for `renew_deadline`
//!   (shorter than the lease duration), or it sees another holder, it has lost: the manager
//!   stops at once. So an old leader has stopped before any standby may take over.
//! - On a graceful stop the leader releases the Lease (no holder, 1 s duration), so a
//!   standby takes over within a retry period instead of a lease duration.
//!
//! Why not a crate: kube-lease-manager (the one made for kube 5) keeps a leader that cannot
//! renew believing it leads until it next reads another holder (no renew deadline), so a
//! partitioned leader would reconcile beside its successor.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How this replica competes for the Lease.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a holder's silence must last before a standby takes over.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// How often candidates try, and the leader renews.
    pub retry_period: Duration,
    /// Written on the Lease whenever this replica takes or renews it (a shard's budget share).
    pub annotations: BTreeMap<String, String>,
}

impl LeaderElection {
    /// The timings' own consistency: a leader must give up before a standby may take over.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(
                "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration"
                    .into(),
            );
        }
        if self.retry_period >= self.renew_deadline {
            return Err(
                "--leader-elect-retry-period must be shorter than --leader-elect-renew-deadline"
                    .into(),
            );
        }
        if self.name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return Err("the Lease needs a name, a namespace and an identity".into());
        }
        Ok(())
    }
}

/// The Lease's record as this replica last saw it change.
#[derive(Clone, Debug)]
struct Observed {
    resource_version: String,
    at: Instant,
}

/// What one look at the Lease calls for.
#[derive(Debug, PartialEq)]
enum Move {
    /// No Lease yet: create it, held by us.
    Create,
    /// Free, expired or ours: write it, held by us, at this resourceVersion.
    Claim {
        spec: Box<LeaseSpec>,
        resource_version: String,
    },
    /// Someone else holds it and has renewed within its lease duration.
    Wait { holder: String },
}

/// The pure decision of one round (client-go's tryAcquireOrRenew).
fn decide(
    lease: Option<&Lease>,
    observed: &mut Option<Observed>,
    config: &LeaderElection,
    now: Instant,
    wall: MicroTime,
) -> Move {
    let Some(lease) = lease else {
        return Move::Create;
    };
    let resource_version = lease.metadata.resource_version.clone().unwrap_or_default();
    if observed.as_ref().map(|o| &o.resource_version) != Some(&resource_version) {
        *observed = Some(Observed {
            resource_version: resource_version.clone(),
            at: now,
        });
    }
    let seen_at = observed.as_ref().map_or(now, |o| o.at);
    let old = lease.spec.clone().unwrap_or_default();
    let holder = old.holder_identity.clone().unwrap_or_default();
    let ours = holder == config.identity;
    // The record's own duration, bounded: a hostile or broken value must not overflow.
    let duration = Duration::from_secs(
        old.lease_duration_seconds
            .map_or(1, |s| u64::try_from(s).unwrap_or(1).clamp(1, 3600)),
    );
    if !holder.is_empty() && !ours && now < seen_at + duration {
        return Move::Wait { holder };
    }
    let transitions = old.lease_transitions.unwrap_or(0);
    let spec = LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(seconds(config.lease_duration)),
        acquire_time: if ours {
            old.acquire_time.clone()
        } else {
            Some(wall.clone())
        },
        renew_time: Some(wall),
        lease_transitions: Some(if ours {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..LeaseSpec::default()
    };
    Move::Claim {
        spec: Box::new(spec),
        resource_version,
    }
}

fn seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn wall_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Whether a round made or kept us the holder, and who holds it otherwise.
#[derive(Debug)]
enum Round {
    Holding,
    HeldBy(String),
    /// A write lost a race (409), or the API could not be reached.
    Failed(String),
}

struct Candidate {
    api: Api<Lease>,
    config: LeaderElection,
    observed: Option<Observed>,
}

impl Candidate {
    async fn round(&mut self) -> Round {
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(current) => current,
            Err(error) => return Round::Failed(format!("reading the Lease: {error}")),
        };
        let decided = decide(
            current.as_ref(),
            &mut self.observed,
            &self.config,
            Instant::now(),
            wall_now(),
        );
        let written = match decided {
            Move::Wait { holder } => return Round::HeldBy(holder),
            Move::Create => {
                let wall = wall_now();
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        annotations: Some(self.config.annotations.clone())
                            .filter(|a| !a.is_empty()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(seconds(self.config.lease_duration)),
                        acquire_time: Some(wall.clone()),
                        renew_time: Some(wall),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Move::Claim {
                spec,
                resource_version,
            } => {
                let mut lease = current.unwrap_or_default();
                lease.metadata.resource_version = Some(resource_version);
                if !self.config.annotations.is_empty() {
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .extend(self.config.annotations.clone());
                }
                lease.spec = Some(*spec);
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                self.observed = Some(Observed {
                    resource_version: lease.metadata.resource_version.unwrap_or_default(),
                    at: Instant::now(),
                });
                Round::Holding
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Round::Failed("another replica wrote the Lease first".to_owned())
            }
            Err(error) => Round::Failed(format!("writing the Lease: {error}")),
        }
    }

    /// Gives the Lease up: no holder, a 1 s duration, so a standby takes it at its next try.
    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(wall_now());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.config.name, "released the leader Lease"),
            Err(error) => {
                tracing::warn!(%error, "could not release the leader Lease; a standby takes over when it expires")
            }
        }
    }
}

/// `leader_election_master_status{name}` as controller-runtime exports it: 1 while leading.
#[derive(Clone)]
pub struct LeaderMetrics {
    status: IntGaugeVec,
}

impl LeaderMetrics {
    /// Creates the `leader_election_master_status` gauge and registers it in `registry`; an
    /// error if it is already registered there.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "1 while this replica holds the leader Lease, 0 while it stands by.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(status.clone()))?;
        Ok(LeaderMetrics { status })
    }

    fn set(&self, name: &str, leading: bool) {
        self.status
            .with_label_values(&[name])
            .set(i64::from(leading));
    }
}

/// The Lease, held. [`Leadership::lost`] resolves when it is lost; [`Leadership::release`]
/// gives it up on a graceful stop.
pub struct Leadership {
    lost: CancellationToken,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Candidate>,
    metrics: LeaderMetrics,
    name: String,
}

impl Leadership {
    /// Resolves once the Lease is lost (not renewed within the deadline, or taken).
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Stops renewing and releases the Lease.
    pub async fn release(self) {
        self.stop.cancel();
        self.metrics.set(&self.name, false);
        if let Ok(mut candidate) = self.task.await
            && !self.lost.is_cancelled()
        {
            candidate.release().await;
        }
    }
}

/// Waits until this replica holds the Lease; `None` when `shutdown` comes first.
pub async fn acquire(
    client: kube::Client,
    config: LeaderElection,
    metrics: LeaderMetrics,
    shutdown: &CancellationToken,
) -> Option<Leadership> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut candidate = Candidate {
        api,
        config,
        observed: None,
    };
    let name = candidate.config.name.clone();
    metrics.set(&name, false);
    let started = Instant::now();
    let mut said = String::new();
    loop {
        let round = tokio::select! {
            () = shutdown.cancelled() => return None,
            round = candidate.round() => round,
        };
        match round {
            Round::Holding => break,
            Round::HeldBy(holder) if holder != said => {
                tracing::info!(lease = %name, %holder, "standing by: another replica leads");
                said = holder;
            }
            Round::HeldBy(_) => {}
            Round::Failed(why) => {
                tracing::warn!(lease = %name, %why, "leader election: will try again")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(jittered(candidate.config.retry_period)) => {}
        }
    }
    tracing::info!(
        lease = %name,
        identity = %candidate.config.identity,
        waited_s = started.elapsed().as_secs_f64(),
        "became the leader"
    );
    metrics.set(&name, true);
    let lost = CancellationToken::new();
    let stop = CancellationToken::new();
    let task = tokio::spawn(renew(
        candidate,
        lost.clone(),
        stop.clone(),
        metrics.clone(),
    ));
    Some(Leadership {
        lost,
        stop,
        task,
        metrics,
        name,
    })
}

/// The leader's loop: renews every retry period until `stop`; cancels `lost` when a renewal
/// has not succeeded within the renew deadline or another holder shows.
async fn renew(
    mut candidate: Candidate,
    lost: CancellationToken,
    stop: CancellationToken,
    metrics: LeaderMetrics,
) -> Candidate {
    let mut renewed = Instant::now();
    let deadline = candidate.config.renew_deadline;
    loop {
        tokio::select! {
            () = stop.cancelled() => return candidate,
            () = tokio::time::sleep(candidate.config.retry_period) => {}
        }
        let left = deadline.saturating_sub(renewed.elapsed());
        let round = tokio::select! {
            () = stop.cancelled() => return candidate,
            round = tokio::time::timeout(left, candidate.round()) => round,
        };
        let why = match round {
            Ok(Round::Holding) => {
                renewed = Instant::now();
                continue;
            }
            Ok(Round::HeldBy(holder)) => format!("{holder} holds it now"),
            Ok(Round::Failed(why)) if renewed.elapsed() < deadline => {
                tracing::warn!(%why, "could not renew the leader Lease; trying again");
                continue;
            }
            Ok(Round::Failed(why)) => format!("not renewed within {deadline:?}: {why}"),
            Err(_) => format!("not renewed within {deadline:?}"),
        };
        tracing::error!(lease = %candidate.config.name, %why, "lost the leader Lease");
        metrics.set(&candidate.config.name, false);
        lost.cancel();
        return candidate;
    }
}

/// client-go's jitter: a retry period stretched by up to 20%, so candidates spread out.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + fastrand::f64() * 0.2)
}

/// A unique identity: `base` (the pod's name) with a random suffix, as client-go's callers do.
pub fn identity(base: &str) -> String {
    let suffix: String = std::iter::repeat_with(fastrand::alphanumeric)
        .take(8)
        .collect();
    format!("{base}_{}", suffix.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(identity: &str) -> LeaderElection {
        LeaderElection {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            annotations: BTreeMap::new(),
        }
    }

    fn lease(holder: Option<&str>, version: &str, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(duration),
                lease_transitions: Some(4),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn no_lease_is_created_and_a_free_one_is_claimed_with_a_transition() {
        let me = config("b");
        let mut observed = None;
        let now = Instant::now();
        assert_eq!(
            decide(None, &mut observed, &me, now, wall_now()),
            Move::Create
        );
        let free = lease(None, "7", 1);
        let Move::Claim {
            spec,
            resource_version,
        } = decide(Some(&free), &mut observed, &me, now, wall_now())
        else {
            panic!("a free Lease is claimed");
        };
        assert_eq!(resource_version, "7");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(spec.lease_duration_seconds, Some(15));
    }

    #[test]
    fn a_held_lease_waits_its_duration_on_our_clock_from_its_last_change() {
        let me = config("b");
        let mut observed = None;
        let start = Instant::now();
        let held = lease(Some("a"), "1", 15);
        let wait = Move::Wait { holder: "a".into() };
        assert_eq!(
            decide(Some(&held), &mut observed, &me, start, wall_now()),
            wait
        );
        // Renewed at 10 s: the clock restarts.
        let renewed = lease(Some("a"), "2", 15);
        let at = start + Duration::from_secs(10);
        assert_eq!(
            decide(Some(&renewed), &mut observed, &me, at, wall_now()),
            wait
        );
        let before = start + Duration::from_secs(24);
        assert_eq!(
            decide(Some(&renewed), &mut observed, &me, before, wall_now()),
            wait
        );
        let after = start + Duration::from_secs(25);
        assert!(matches!(
            decide(Some(&renewed), &mut observed, &me, after, wall_now()),
            Move::Claim { .. }
        ));
    }

    #[test]
    fn our_own_lease_is_renewed_without_a_transition() {
        let me = config("a");
        let mut observed = None;
        let ours = lease(Some("a"), "3", 15);
        let Move::Claim { spec, .. } =
            decide(Some(&ours), &mut observed, &me, Instant::now(), wall_now())
        else {
            panic!("our Lease is renewed");
        };
        assert_eq!(spec.lease_transitions, Some(4));
    }

    #[test]
    fn a_broken_duration_neither_panics_nor_holds_forever() {
        let me = config("b");
        let mut observed = None;
        let now = Instant::now();
        let broken = lease(Some("a"), "1", -5);
        assert_eq!(
            decide(Some(&broken), &mut observed, &me, now, wall_now()),
            Move::Wait { holder: "a".into() }
        );
        let later = now + Duration::from_secs(1);
        assert!(matches!(
            decide(Some(&broken), &mut observed, &me, later, wall_now()),
            Move::Claim { .. }
        ));
    }

    #[test]
    fn timings_that_would_let_two_lead_are_refused() {
        let mut timings = config("a");
        assert!(timings.validate().is_ok());
        timings.renew_deadline = Duration::from_secs(15);
        assert!(timings.validate().is_err());
        assert!(identity("pod").starts_with("pod_"));
        assert_ne!(identity("pod"), identity("pod"));
    }
}
