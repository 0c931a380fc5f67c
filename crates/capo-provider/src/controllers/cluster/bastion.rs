//! The bastion: an OpenStackServer owned by the cluster (the server controller builds it),
//! and its floating IP. The bastion spec may change; a server cannot, so a change deletes
//! the server and a later pass creates the new one.

use capo_api::capi;
use capo_api::cluster::{BastionStatus, OpenStackClusterStatus};
use capo_api::conditions::{self, types};
use capo_api::{OpenStackClusterSpec, OpenStackServer, OpenStackServerSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Resource, ResourceExt};

use super::load_balancer::find_floating_ip;
use super::plan;
use super::{ClusterError, Pass};
use crate::cloud::{CloudClient, CloudError};
use crate::controllers::machine::{self, plan::Placement};
use crate::controllers::outcome::Outcome;

/// Whether the spec asks for a bastion.
pub fn enabled(spec: &OpenStackClusterSpec) -> bool {
    spec.bastion
        .as_ref()
        .is_some_and(|b| b.enabled != Some(false) && b.spec.is_some())
}

/// Whether the bastion is as the spec wants it, by the status alone: none when disabled; when
/// enabled, its server ACTIVE and, with an external network, its floating IP attached.
pub fn in_place(spec: &OpenStackClusterSpec, status: &OpenStackClusterStatus) -> bool {
    if !enabled(spec) {
        return status.bastion.is_none();
    }
    status.bastion.as_ref().is_some_and(|bastion| {
        bastion.state.as_deref() == Some("ACTIVE")
            && (status.external_network.is_none() || bastion.floating_ip.is_some())
    })
}

/// The bastion's OpenStackServer spec, as CAPO builds it (`bastionToOpenStackServerSpec`):
/// the bastion's machine spec on the cluster network, in the bastion security group, always
/// with the cluster's credentials. A bastion CAPO made compares equal and is kept.
pub fn server_spec(
    spec: &OpenStackClusterSpec,
    status: &OpenStackClusterStatus,
) -> Option<OpenStackServerSpec> {
    let bastion = spec.bastion.as_ref()?;
    let machine = bastion.spec.as_ref()?;
    let placement = Placement {
        cluster: spec,
        status,
        role_security_group: status.bastion_security_group.as_ref().map(|g| g.id.clone()),
        availability_zone: bastion.availability_zone.clone(),
        user_data: None,
    };
    let mut server = machine::plan::server_spec(machine, &placement);
    server.identity_ref = spec.identity_ref.clone();
    Some(server)
}

/// Brings the bastion to the spec: created, replaced, or removed.
pub async fn reconcile(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<Outcome, ClusterError> {
    let spec = &pass.cluster.spec;
    let namespace = pass.cluster.namespace().unwrap_or_default();
    let servers: Api<OpenStackServer> = Api::namespaced(pass.ctx.client.clone(), &namespace);
    let existing = servers
        .get_opt(&pass.names.bastion)
        .await
        .map_err(ClusterError::kube("reading the bastion OpenStackServer"))?;
    let waiting = Outcome::Poll(pass.ctx.config.poll_max);
    let wanted = server_spec(spec, status).filter(|_| enabled(spec));
    let Some(wanted) = wanted else {
        return match existing {
            Some(server) => {
                remove(pass, cloud, &servers, &server, status).await?;
                Ok(waiting)
            }
            None => {
                status.bastion = None;
                Ok(Outcome::Settled)
            }
        };
    };
    let Some(server) = existing else {
        create(pass, &servers, wanted).await?;
        return Ok(waiting);
    };
    if server.meta().deletion_timestamp.is_some() {
        return Ok(waiting);
    }
    if server.spec != wanted {
        tracing::info!(bastion = %pass.names.bastion, "the bastion spec changed: replacing its server");
        remove(pass, cloud, &servers, &server, status).await?;
        return Ok(waiting);
    }
    record(pass, cloud, &server, status).await
}

async fn create(
    pass: &Pass<'_>,
    servers: &Api<OpenStackServer>,
    spec: OpenStackServerSpec,
) -> Result<(), ClusterError> {
    let cluster = pass.cluster;
    let mut server = OpenStackServer::new(&pass.names.bastion, spec);
    server.metadata.namespace = cluster.namespace();
    server.metadata.labels = Some(
        [(
            capi::labels::CLUSTER_NAME.to_owned(),
            pass.capi_name.clone(),
        )]
        .into_iter()
        .collect(),
    );
    server.metadata.owner_references = Some(vec![OwnerReference {
        api_version: capo_api::OpenStackCluster::api_version(&()).into_owned(),
        kind: "OpenStackCluster".into(),
        name: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: Some(false),
    }]);
    match servers.create(&PostParams::default(), &server).await {
        Ok(_) => {
            tracing::info!(bastion = %pass.names.bastion, "created the bastion OpenStackServer");
            Ok(())
        }
        // Made by an earlier pass a moment ago: the next pass looks at it.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(ClusterError::kube("creating the bastion OpenStackServer")(
            e,
        )),
    }
}

/// Records the bastion in status and gives it its floating IP once it is running.
async fn record(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    server: &OpenStackServer,
    status: &mut OpenStackClusterStatus,
) -> Result<Outcome, ClusterError> {
    let server_status = server.status.clone().unwrap_or_default();
    let ip = server_status
        .addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone());
    let mut bastion = BastionStatus {
        id: server_status.instance_id.clone(),
        name: Some(server.name_any()),
        ssh_key_name: Some(server.spec.ssh_key_name.clone()).filter(|k| !k.is_empty()),
        state: server_status.instance_state.clone(),
        ip,
        floating_ip: status.bastion.as_ref().and_then(|b| b.floating_ip.clone()),
        resolved: server_status.resolved.clone(),
        resources: server_status.resources.clone(),
    };
    let running = conditions::status_of(&server_status.conditions, types::INSTANCE_READY)
        == conditions::Status::True;
    let port = server_status
        .resources
        .as_ref()
        .and_then(|r| r.ports.first())
        .map(|p| p.id.clone());
    let external = status.external_network.as_ref().map(|n| n.id.clone());
    let outcome = match (running, port, external) {
        (true, Some(port), Some(external)) => {
            let address = attach_floating_ip(pass, cloud, &bastion, &port, &external).await?;
            bastion.floating_ip = Some(address);
            Outcome::Settled
        }
        (true, _, _) => Outcome::Settled,
        (false, _, _) => Outcome::Poll(pass.ctx.config.poll_max),
    };
    status.bastion = Some(bastion);
    Ok(outcome)
}

/// The bastion's floating IP: the recorded one, the spec's, or a new one; on its port.
async fn attach_floating_ip(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    bastion: &BastionStatus,
    port: &str,
    external: &str,
) -> Result<String, ClusterError> {
    let on_port = cloud
        .neutron()
        .list_floating_ips(&crate::cloud::neutron::Filter::default().with("port_id", port))
        .await
        .map_err(ClusterError::cloud("reading the bastion's floating IP"))?;
    if let Some(ip) = on_port.into_iter().next() {
        return Ok(ip.floating_ip_address);
    }
    let spec = &pass.cluster.spec;
    let wanted = bastion
        .floating_ip
        .clone()
        .or_else(|| spec.bastion.as_ref().and_then(|b| b.floating_ip.clone()));
    let existing = match &wanted {
        Some(address) => find_floating_ip(cloud, address).await?,
        None => None,
    };
    let ip = match existing {
        Some(ip) => {
            cloud
                .neutron()
                .associate_floating_ip(&ip.id, Some(port))
                .await
                .map_err(ClusterError::cloud("attaching the bastion floating IP"))?;
            ip
        }
        None => cloud
            .neutron()
            .create_tagged_floating_ip(
                external,
                wanted.as_deref(),
                Some(port),
                &pass.names.description(),
                &plan::tags(spec),
            )
            .await
            .map_err(ClusterError::cloud("allocating the bastion floating IP"))?,
    };
    tracing::info!(address = %ip.floating_ip_address, "bastion floating IP attached");
    Ok(ip.floating_ip_address)
}

/// Deletes the bastion's floating IP (unless the spec named it: the user's own) and its
/// OpenStackServer.
pub async fn remove(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    servers: &Api<OpenStackServer>,
    server: &OpenStackServer,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    release_floating_ip(pass, cloud, status).await?;
    if server.meta().deletion_timestamp.is_none() {
        match servers
            .delete(&server.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(ClusterError::kube("deleting the bastion OpenStackServer")(
                    e,
                ));
            }
        }
    }
    Ok(())
}

async fn release_floating_ip(
    pass: &Pass<'_>,
    cloud: &CloudClient,
    status: &mut OpenStackClusterStatus,
) -> Result<(), ClusterError> {
    let Some(address) = status.bastion.as_ref().and_then(|b| b.floating_ip.clone()) else {
        return Ok(());
    };
    let given = pass
        .cluster
        .spec
        .bastion
        .as_ref()
        .and_then(|b| b.floating_ip.as_deref());
    if let Some(ip) = find_floating_ip(cloud, &address).await? {
        let result = if given == Some(address.as_str()) {
            cloud
                .neutron()
                .associate_floating_ip(&ip.id, None)
                .await
                .map(|_| ())
        } else {
            cloud.neutron().delete_floating_ip(&ip.id).await
        };
        match result {
            Ok(()) | Err(CloudError::NotFound(_)) => {}
            Err(e) => return Err(ClusterError::cloud("releasing the bastion floating IP")(e)),
        }
    }
    if let Some(bastion) = status.bastion.as_mut() {
        bastion.floating_ip = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::cluster::Bastion;
    use capo_api::common::NetworkStatus;

    fn spec(bastion: Option<bool>) -> OpenStackClusterSpec {
        OpenStackClusterSpec {
            bastion: bastion.map(|enabled| Bastion {
                enabled: Some(enabled),
                spec: Some(Default::default()),
                ..Bastion::default()
            }),
            ..OpenStackClusterSpec::default()
        }
    }

    fn status(
        state: Option<&str>,
        floating_ip: Option<&str>,
        external: bool,
    ) -> OpenStackClusterStatus {
        OpenStackClusterStatus {
            bastion: state.map(|state| BastionStatus {
                state: Some(state.into()),
                floating_ip: floating_ip.map(Into::into),
                ..BastionStatus::default()
            }),
            external_network: external.then(|| NetworkStatus {
                id: "ext".into(),
                name: "public".into(),
                ..NetworkStatus::default()
            }),
            ..OpenStackClusterStatus::default()
        }
    }

    #[test]
    fn a_bastion_is_in_place_once_running_with_its_floating_ip() {
        assert!(in_place(&spec(None), &status(None, None, true)));
        assert!(in_place(
            &spec(Some(true)),
            &status(Some("ACTIVE"), Some("172.24.4.9"), true)
        ));
        assert!(in_place(
            &spec(Some(true)),
            &status(Some("ACTIVE"), None, false)
        ));
        // Still building, running without its address, or to be removed: not yet.
        assert!(!in_place(&spec(Some(true)), &status(None, None, true)));
        assert!(!in_place(
            &spec(Some(true)),
            &status(Some("BUILD"), None, true)
        ));
        assert!(!in_place(
            &spec(Some(true)),
            &status(Some("ACTIVE"), None, true)
        ));
        assert!(!in_place(
            &spec(Some(false)),
            &status(Some("ACTIVE"), None, true)
        ));
    }
}
