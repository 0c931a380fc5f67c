//! How the engine looks at a load balancer. Production has one way, [`StatusTreeObserver`];
//! the trait exists so the benchmarks can run other providers' ways through the same engine
//! and scheduler, and so tests can make a poll fail in ways a cloud cannot.

use async_trait::async_trait;
use tokio::time::Instant;

use super::model::{DesiredLb, Observation, SeenMember};
use crate::cloud::{CloudClient, CloudError};

/// What one poll learnt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The load balancer was read: its own status and the members of the pools that were read.
    Observed(Observation),
    /// The load balancer does not exist (404).
    Gone,
}

/// A way to observe load balancers. Polls of one LB never overlap.
#[async_trait]
pub trait Observer: Send + Sync + 'static {
    /// Names it in metric labels (`strategy`).
    fn name(&self) -> &'static str;

    /// Whether the scheduler polls an LB urgently while something on it is on its way. An
    /// observer that paces itself ([`Observer::next_due`]) says no.
    fn polls_urgently(&self) -> bool {
        true
    }

    /// Whether the engine may watch LBs through their identity's LB list and poll a tree only
    /// where it shows a change (ours); other ways are measured as they are.
    fn uses_list(&self) -> bool {
        false
    }

    /// `lb_id` is new, or its desired membership changed.
    fn desired_changed(&self, _lb_id: &str) {}

    /// `lb_id` is no longer tracked.
    fn forget(&self, _lb_id: &str) {}

    /// When the observer wants to look at `lb_id` again on its own account, if ever.
    fn next_due(&self, _lb_id: &str) -> Option<Instant> {
        None
    }

    /// Polls the load balancer `desired.lb_id` once: what it and its members read, or
    /// [`Seen::Gone`] when it does not exist; an error when the cloud call fails.
    async fn observe(&self, client: &CloudClient, desired: &DesiredLb) -> Result<Seen, CloudError>;
}

/// Ours: one status-tree GET shows the LB and every member's own status. Where the tree is
/// refused (403) or missing (404), the LB and each desired pool's member list instead.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatusTreeObserver;

#[async_trait]
impl Observer for StatusTreeObserver {
    fn name(&self) -> &'static str {
        "status-tree"
    }

    fn uses_list(&self) -> bool {
        true
    }

    async fn observe(&self, client: &CloudClient, desired: &DesiredLb) -> Result<Seen, CloudError> {
        match client.octavia().status_tree(&desired.lb_id).await {
            Ok(tree) => Ok(Seen::Observed(Observation::from_tree(&tree))),
            Err(CloudError::NotFound(_) | CloudError::Forbidden(_)) => {
                observe_lists(client, desired).await
            }
            Err(error) => Err(error),
        }
    }
}

/// The fallback: the LB, then each desired pool's members.
async fn observe_lists(client: &CloudClient, desired: &DesiredLb) -> Result<Seen, CloudError> {
    let lb = match client.octavia().get_load_balancer(&desired.lb_id).await {
        Ok(lb) => lb,
        Err(CloudError::NotFound(_)) => return Ok(Seen::Gone),
        Err(error) => return Err(error),
    };
    let mut members = Vec::new();
    let mut pools_seen = Vec::new();
    for pool in desired.pools.values() {
        match client.octavia().list_members(pool).await {
            Ok(listed) => {
                pools_seen.push(pool.clone());
                members.extend(listed.into_iter().map(|m| SeenMember {
                    pool_id: pool.clone(),
                    id: m.id,
                    name: m.name,
                    address: m.address,
                    port: m.protocol_port,
                    provisioning: m.provisioning_status,
                    operating: m.operating_status,
                }));
            }
            Err(CloudError::NotFound(_)) => pools_seen.push(pool.clone()),
            Err(error) => return Err(error),
        }
    }
    Ok(Seen::Observed(Observation {
        provisioning: lb.provisioning_status,
        operating: lb.operating_status,
        members,
        pools_seen,
        // A member list does not say whether its pool has a monitor.
        monitored_pools: None,
    }))
}
