//! Builders shared by tests and benchmarks: a cluster's API load balancer as CAPO builds it,
//! and member creation that waits out a locked LB, as a reconciler's requeue would.

use std::time::Duration;

use capo_provider::cloud::octavia::{ListenerSpec, LoadBalancerSpec, MemberSpec, PoolSpec};
use capo_provider::cloud::{CloudClient, CloudError};

/// Waits until the load balancer is no longer PENDING_*, as a requeueing reconciler would.
pub async fn settle(client: &CloudClient, lb: &str) -> Result<(), CloudError> {
    while client
        .octavia()
        .get_load_balancer(lb)
        .await?
        .provisioning_status
        .is_pending()
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A cluster's API load balancer as CAPO builds it: the LB, a TCP listener on 6443 and its
/// pool, each settled before the next. Returns the LB's and the pool's ids.
pub async fn api_load_balancer(
    client: &CloudClient,
    name: &str,
) -> Result<(String, String), CloudError> {
    let octavia = client.octavia();
    let lb = octavia
        .create_load_balancer(&LoadBalancerSpec {
            name: name.to_owned(),
            vip_network_id: Some("net".into()),
            ..Default::default()
        })
        .await?;
    settle(client, &lb.id).await?;
    let listener = octavia
        .create_listener(&ListenerSpec {
            name: "api".into(),
            loadbalancer_id: lb.id.clone(),
            protocol: "TCP".into(),
            protocol_port: 6443,
            ..Default::default()
        })
        .await?;
    settle(client, &lb.id).await?;
    let pool = octavia
        .create_pool(&PoolSpec {
            name: "api".into(),
            protocol: "TCP".into(),
            lb_algorithm: "ROUND_ROBIN".into(),
            listener_id: Some(listener.id),
            ..Default::default()
        })
        .await?;
    settle(client, &lb.id).await?;
    Ok((lb.id, pool.id))
}

/// Creates a member, waiting out a locked LB as a reconciler's requeue would.
pub async fn create_member(
    client: &CloudClient,
    lb: &str,
    pool: &str,
    name: &str,
    address: &str,
) -> Result<String, CloudError> {
    let spec = MemberSpec::new(name, address, 6443);
    loop {
        match client.octavia().create_member(pool, &spec).await {
            Ok(member) => return Ok(member.id),
            Err(CloudError::Busy(e)) => {
                tracing::trace!(%e, "busy");
                settle(client, lb).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error),
        }
    }
}
