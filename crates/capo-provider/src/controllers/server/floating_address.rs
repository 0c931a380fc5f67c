//! A floating IP from a pool (`spec.floatingIPPoolRef`), through Cluster API's IPAM
//! contract, as CAPO does it. The server claims an address (an IPAddressClaim named
//! `<server>-floating-ip-address`, owned by the server and held by its finalizer) before
//! any port is made. Once the pool answers and the server is ACTIVE, the floating IP is
//! attached to the first of the server's ports whose network routes to the floating IP's
//! network. On deletion, once the ports are gone, the claim is let go and deleted, and the
//! pool releases the address by its reclaim policy.

use capo_api::OpenStackServer;
use capo_api::capi;
use capo_api::capo_conditions::{capo_reasons, capo_types};
use capo_api::common::{InstanceStatus, TypedLocalObjectReference};
use capo_api::conditions::{self, Desired, Status, reasons};
use capo_api::ipam::{self, IPAddress, IPAddressClaim, IPAddressClaimSpec, PoolReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};

use super::ServerError;
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::{Context, writes};

/// The address the pool gave this server; `None` without `floatingIPPoolRef`. While the pool
/// has not answered, [`ServerError::WaitingForAddress`].
pub(super) async fn claimed(
    object: &OpenStackServer,
    ctx: &Context,
    status: &mut InstanceStatus,
) -> Result<Option<String>, ServerError> {
    let Some(pool) = &object.spec.floating_ip_pool_ref else {
        return Ok(None);
    };
    let namespace = object.namespace().unwrap_or_default();
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = ipam::server_claim_name(&object.name_any());
    let claim = match claims.get_opt(&name).await {
        Ok(Some(claim)) => claim,
        Ok(None) => create_claim(&claims, object, pool, &name).await?,
        Err(error) => return Err(not_installed(error, &name)),
    };
    let Some(address_name) = claim.address_name() else {
        let message = format!(
            "waiting for {} {} to answer IPAddressClaim {name}",
            pool.kind, pool.name
        );
        set(
            status,
            object,
            Status::False,
            reasons::WAITING_FOR_IP_ADDRESS_CLAIM,
            &message,
        );
        return Err(ServerError::WaitingForAddress(message));
    };
    let addresses: Api<IPAddress> = Api::namespaced(ctx.client.clone(), &namespace);
    let address = addresses
        .get_opt(address_name)
        .await
        .map_err(ServerError::kube(format!(
            "reading IPAddress {address_name}"
        )))?
        .ok_or_else(|| {
            ServerError::WaitingForAddress(format!(
                "IPAddressClaim {name} names IPAddress {address_name}, which does not exist yet"
            ))
        })?;
    Ok(Some(address.spec.address))
}

/// The server's claim, as CAPO makes it (with the Cluster's name when the server has one).
async fn create_claim(
    claims: &Api<IPAddressClaim>,
    object: &OpenStackServer,
    pool: &TypedLocalObjectReference,
    name: &str,
) -> Result<IPAddressClaim, ServerError> {
    let owner = OwnerReference {
        api_version: OpenStackServer::api_version(&()).into_owned(),
        kind: OpenStackServer::kind(&()).into_owned(),
        name: object.name_any(),
        uid: object.uid().unwrap_or_default(),
        ..OwnerReference::default()
    };
    let cluster = capi::cluster_name(object.labels()).map(str::to_owned);
    let labels = cluster.clone().map(|c| {
        [(capi::labels::CLUSTER_NAME.to_owned(), c)]
            .into_iter()
            .collect()
    });
    let claim = IPAddressClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: object.namespace(),
            owner_references: Some(vec![owner]),
            finalizers: Some(vec![ipam::CLAIM_FINALIZER.into()]),
            labels,
            ..ObjectMeta::default()
        },
        spec: IPAddressClaimSpec {
            pool_ref: PoolReference {
                api_group: pool.api_group.clone().unwrap_or_default(),
                kind: pool.kind.clone(),
                name: pool.name.clone(),
            },
            cluster_name: cluster,
        },
        status: None,
    };
    let created = claims
        .create(&PostParams::default(), &claim)
        .await
        .map_err(|error| not_installed(error, name))?;
    tracing::info!(claim = %name, pool = %pool.name, "created IPAddressClaim");
    Ok(created)
}

/// A 404 on the claims themselves means Cluster API's IPAM CRDs are not installed.
fn not_installed(error: kube::Error, claim: &str) -> ServerError {
    match &error {
        kube::Error::Api(status) if status.code == 404 => ServerError::WaitingForAddress(
            "IPAddressClaims cannot be made: Cluster API's IPAM CRDs (ipam.cluster.x-k8s.io) are not installed".into(),
        ),
        _ => ServerError::kube(format!("making IPAddressClaim {claim}"))(error),
    }
}

/// Attaches `address` to the first of `ports` that reaches its network. Neutron is the judge
/// of "reaches" (a router with a gateway on the floating IP's network): a port it refuses
/// with a 404 is not routed, and the next is tried.
pub(super) async fn attach(
    cloud: &CloudClient,
    object: &OpenStackServer,
    status: &mut InstanceStatus,
    address: &str,
    ports: &[String],
) -> Result<(), ServerError> {
    let result = try_attach(cloud, address, ports).await;
    match &result {
        Ok(()) => set(status, object, Status::True, reasons::READY, ""),
        Err(error) => {
            let message = error.to_string();
            set(
                status,
                object,
                Status::False,
                capo_reasons::FLOATING_IP_ERROR,
                &message,
            );
        }
    }
    result
}

async fn try_attach(
    cloud: &CloudClient,
    address: &str,
    ports: &[String],
) -> Result<(), ServerError> {
    let neutron = cloud.neutron();
    let found = neutron
        .find_floating_ip(address)
        .await
        .map_err(ServerError::cloud(format!(
            "looking up floating IP {address}"
        )))?;
    let Some(floating) = found else {
        return Err(ServerError::FloatingIp(format!(
            "the pool gave {address}, and Neutron has no such floating IP"
        )));
    };
    if floating.port_id.as_ref().is_some_and(|p| ports.contains(p)) {
        return Ok(());
    }
    for port in ports {
        match neutron
            .associate_floating_ip(&floating.id, Some(port))
            .await
        {
            Ok(_) => {
                tracing::info!(floating_ip = %address, port = %port, "attached the pool's floating IP");
                return Ok(());
            }
            Err(CloudError::NotFound(_)) => continue,
            Err(error) => {
                return Err(ServerError::cloud(format!(
                    "attaching floating IP {address} to port {port}"
                ))(error));
            }
        }
    }
    Err(ServerError::FloatingIp(format!(
        "no port of this server reaches network {} of floating IP {address}: add a router with a gateway there",
        floating.floating_network_id
    )))
}

/// Lets the claim go once the server's ports are gone: the finalizer off, then the claim
/// deleted (its owner reference would also do it, where a garbage collector runs).
pub(super) async fn release(object: &OpenStackServer, ctx: &Context) -> Result<(), ServerError> {
    if object.spec.floating_ip_pool_ref.is_none() {
        return Ok(());
    }
    let namespace = object.namespace().unwrap_or_default();
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = ipam::server_claim_name(&object.name_any());
    let claim = match claims.get_opt(&name).await {
        Ok(Some(claim)) => claim,
        Ok(None) => return Ok(()),
        // No IPAM CRDs: no claim was ever made.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => {
            return Err(ServerError::kube(format!("reading IPAddressClaim {name}"))(
                error,
            ));
        }
    };
    writes::remove_finalizer(&claims, &claim, ipam::CLAIM_FINALIZER)
        .await
        .map_err(ServerError::kube(format!(
            "releasing IPAddressClaim {name}"
        )))?;
    match claims.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => {
            return Err(ServerError::kube(format!("deleting IPAddressClaim {name}"))(error));
        }
    }
    tracing::info!(claim = %name, "released the floating IP claim");
    Ok(())
}

/// The address is attached already (Nova lists it on the server).
pub(super) fn attached(object: &OpenStackServer, status: &mut InstanceStatus) {
    set(status, object, Status::True, reasons::READY, "");
}

fn set(
    status: &mut InstanceStatus,
    object: &OpenStackServer,
    state: Status,
    reason: &str,
    message: &str,
) {
    let condition = Desired::new(
        capo_types::FLOATING_ADDRESS_FROM_POOL_READY,
        state,
        reason,
        message.to_owned(),
    );
    conditions::set(
        &mut status.conditions,
        &condition,
        object.meta().generation,
        Timestamp::now(),
    );
}
