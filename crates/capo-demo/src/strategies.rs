//! The ways other providers watch members, run through our engine and scheduler so the
//! benchmark compares like with like. Production observes only through status trees.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use capo_provider::cloud::octavia::{OperatingStatus, ProvisioningStatus};
use capo_provider::cloud::{CloudClient, CloudError};
use capo_provider::membership::model::{Observation, SeenMember};
use capo_provider::membership::{
    DesiredLb, DesiredMember, Observer, ScheduleConfig, Seen, StatusTreeObserver,
};
use tokio::time::Instant;

/// How members are observed; the latter two reproduce other providers for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// One status-tree GET per LB per poll: every member's own status, and the serving gate
    /// (ours: `capo-rs run`'s defaults).
    StatusTree,
    /// The same polls with the provisioning gate: a member counts once ACTIVE, whatever its
    /// health monitor says (capo-rs's `--gate=provisioning`).
    Provisioning,
    /// CAPO 0.14: after a member is created, GET it (1 s, x1.25, 20 steps) until ACTIVE, and
    /// GET the LB; a member is never looked at again once ACTIVE or given up on.
    MemberGet,
    /// A member counts as ready once the LB is ACTIVE (what a provider that trusts the LB does).
    LbOnly,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::StatusTree,
        Strategy::Provisioning,
        Strategy::MemberGet,
        Strategy::LbOnly,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::StatusTree => "status-tree",
            Strategy::Provisioning => "provisioning",
            Strategy::MemberGet => "member-get",
            Strategy::LbOnly => "lb-only",
        }
    }

    /// Whether a member must also serve (its health monitor reading ONLINE) to count.
    pub fn serving_gate(self) -> bool {
        self == Strategy::StatusTree
    }

    pub fn observer(self) -> Arc<dyn Observer> {
        match self {
            Strategy::StatusTree | Strategy::Provisioning => Arc::new(StatusTreeObserver),
            Strategy::MemberGet => Arc::new(Backoff::new(Strategy::MemberGet)),
            Strategy::LbOnly => Arc::new(Backoff::new(Strategy::LbOnly)),
        }
    }

    /// The schedule each strategy runs with: the providers the other two reproduce never
    /// look at a settled LB again, and start waiting for the LB the moment they changed it.
    pub fn schedule(self, ours: ScheduleConfig) -> ScheduleConfig {
        match self {
            Strategy::StatusTree | Strategy::Provisioning => ours,
            Strategy::MemberGet | Strategy::LbOnly => ScheduleConfig {
                drift_min: Duration::from_secs(86_400),
                drift_max: Duration::from_secs(86_400),
                look_after_change: Duration::ZERO,
                ..ours
            },
        }
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown strategy {text:?} (status-tree, provisioning, member-get, lb-only)"
                )
            })
    }
}

/// One wait for ACTIVE, CAPO 0.14's way.
#[derive(Clone, Debug)]
struct Wait {
    steps: u32,
    next_at: Instant,
    last: Option<ProvisioningStatus>,
    finished: bool,
}

/// The waits of one LB: the LB's own under [`LB_WAIT`], each member's under its address:port.
type Waits = HashMap<String, Wait>;

/// The key of the LB's own wait.
const LB_WAIT: &str = "lb";
/// CAPO's backoff: 1 s x1.25, at most this many steps.
const WAIT_STEPS: u32 = 20;

/// `member-get` or `lb-only`: both wait with CAPO's backoff after each change, and never
/// look again once done.
struct Backoff {
    strategy: Strategy,
    waits: Mutex<HashMap<String, Waits>>,
}

impl Backoff {
    fn new(strategy: Strategy) -> Self {
        Backoff {
            strategy,
            waits: Mutex::new(HashMap::new()),
        }
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waits>> {
        self.waits.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Observer for Backoff {
    fn name(&self) -> &'static str {
        self.strategy.as_str()
    }

    fn polls_urgently(&self) -> bool {
        false
    }

    fn desired_changed(&self, lb_id: &str) {
        // CAPO waits for the LB around every change.
        self.waits()
            .entry(lb_id.to_owned())
            .or_default()
            .remove(LB_WAIT);
    }

    fn forget(&self, lb_id: &str) {
        self.waits().remove(lb_id);
    }

    fn next_due(&self, lb_id: &str) -> Option<Instant> {
        self.waits()
            .get(lb_id)?
            .values()
            .filter(|w| !w.finished)
            .map(|w| w.next_at)
            .min()
    }

    async fn observe(&self, client: &CloudClient, desired: &DesiredLb) -> Result<Seen, CloudError> {
        // The waits as the poll starts; stored back only when it answers.
        let waits = self
            .waits()
            .get(&desired.lb_id)
            .cloned()
            .unwrap_or_default();
        let (seen, waits) = match self.strategy {
            Strategy::LbOnly => observe_lb_only(client, desired, waits).await?,
            _ => observe_member_get(client, desired, waits).await?,
        };
        if let Some(waits) = waits {
            self.waits().insert(desired.lb_id.clone(), waits);
        }
        Ok(seen)
    }
}

/// Every desired member with a made-up status.
fn assumed(
    desired: &DesiredLb,
    status: impl Fn(&DesiredMember) -> Option<ProvisioningStatus>,
    lb: ProvisioningStatus,
) -> Observation {
    let members = desired
        .members
        .iter()
        .filter_map(|m| {
            let pool_id = desired.pools.get(&m.port)?.clone();
            Some(SeenMember {
                pool_id,
                id: m.member_id.clone().unwrap_or_default(),
                name: m.name.clone(),
                address: m.address.clone(),
                port: m.port,
                provisioning: status(m)?,
                operating: OperatingStatus::NoMonitor,
            })
        })
        .collect();
    Observation {
        provisioning: lb,
        operating: OperatingStatus::Unknown,
        members,
        pools_seen: desired.pools.values().cloned().collect(),
        monitored_pools: None,
    }
}

/// A provider that trusts the LB: a member it created counts as whatever the LB is. It looks
/// after each change with CAPO's backoff until the LB is ACTIVE, and not again. One status
/// tree per look, as one LB GET would be: the tree tells which members exist (a provider
/// knows which it created), never their own state.
async fn observe_lb_only(
    client: &CloudClient,
    desired: &DesiredLb,
    mut waits: Waits,
) -> Result<(Seen, Option<Waits>), CloudError> {
    let tree = match client.octavia().status_tree(&desired.lb_id).await {
        Ok(tree) => tree,
        Err(CloudError::NotFound(_)) => return Ok((Seen::Gone, None)),
        Err(error) => return Err(error),
    };
    let status = tree.provisioning_status;
    step(&mut waits, LB_WAIT, Some(status), Instant::now());
    let as_lb = if status == ProvisioningStatus::Active {
        ProvisioningStatus::Active
    } else {
        ProvisioningStatus::PendingCreate
    };
    let mut seen = Observation::from_tree(&tree);
    for member in &mut seen.members {
        member.provisioning = as_lb;
    }
    Ok((Seen::Observed(seen), Some(waits)))
}

/// One backoff step of a wait for ACTIVE.
fn step(waits: &mut Waits, key: &str, seen: Option<ProvisioningStatus>, now: Instant) {
    let wait = waits.entry(key.to_owned()).or_insert(Wait {
        steps: 0,
        next_at: now,
        last: None,
        finished: false,
    });
    wait.last = seen;
    wait.steps += 1;
    wait.finished = seen == Some(ProvisioningStatus::Active) || wait.steps >= WAIT_STEPS;
    wait.next_at =
        now + Duration::from_secs_f64(1.25f64.powi(i32::try_from(wait.steps).unwrap_or(i32::MAX)));
}

/// CAPO 0.14: after a change, the LB until ACTIVE, and each new member until ACTIVE, both with
/// 1 s x1.25 backoff for 20 steps; nothing is looked at again afterwards.
async fn observe_member_get(
    client: &CloudClient,
    desired: &DesiredLb,
    mut waits: Waits,
) -> Result<(Seen, Option<Waits>), CloudError> {
    let now = Instant::now();
    waits.retain(|key, _| key == LB_WAIT || desired.members.iter().any(|m| member_key(m) == *key));
    let due = |waits: &Waits, key: &str| {
        waits
            .get(key)
            .is_none_or(|w| !w.finished && w.next_at <= now)
    };
    let known = waits.get(LB_WAIT).and_then(|w| w.last);
    let lb_status = match known {
        Some(status) if !due(&waits, LB_WAIT) => status,
        _ => {
            let lb = match client.octavia().get_load_balancer(&desired.lb_id).await {
                Ok(lb) => lb,
                Err(CloudError::NotFound(_)) => return Ok((Seen::Gone, None)),
                Err(error) => return Err(error),
            };
            step(&mut waits, LB_WAIT, Some(lb.provisioning_status), now);
            lb.provisioning_status
        }
    };
    for member in &desired.members {
        let (Some(id), Some(pool)) = (&member.member_id, desired.pools.get(&member.port)) else {
            continue;
        };
        let key = member_key(member);
        if !due(&waits, &key) {
            continue;
        }
        let seen = match client.octavia().get_member(pool, id).await {
            Ok(seen) => Some(seen.provisioning_status),
            Err(CloudError::NotFound(_)) => None,
            Err(error) => return Err(error),
        };
        step(&mut waits, &key, seen, now);
    }
    let observation = assumed(
        desired,
        |m| waits.get(&member_key(m)).and_then(|w| w.last),
        lb_status,
    );
    Ok((Seen::Observed(observation), Some(waits)))
}

fn member_key(member: &DesiredMember) -> String {
    format!("{}:{}", member.address, member.port)
}
