//! A change of the machine's ports' `allowedAddressPairs` (the one spec change the
//! admission rules let through, as CAPO #3056 does) pushed to its existing ports. The
//! server's spec keeps what the ports were created with; what was pushed since is recorded
//! as a digest in an annotation, so a machine whose pairs are as pushed costs no call.

use capo_api::OpenStackServer;
use capo_api::common::AddressPair;
use capo_api::machine::OpenStackMachineSpec;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::{Value, json};

use super::{MachineError, Pass};
use crate::controllers::server::plan::neutron_address_pairs;

/// The digest of the allowed address pairs last pushed to the machine's ports.
pub const APPLIED_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/allowed-address-pairs";

/// The ports to update, each with its pairs as Neutron takes them, and the digest to record.
#[derive(Debug, PartialEq)]
pub struct Push {
    pub ports: Vec<(String, Vec<Value>)>,
    pub digest: String,
}

/// What to push, if anything: nothing while the server's ports are not all made, nor when
/// the pairs are what was last pushed (or, before any push, what the ports were made with).
pub fn plan(
    machine: &OpenStackMachineSpec,
    server: &OpenStackServer,
    applied: Option<&str>,
) -> Option<Push> {
    let wanted: Vec<&[AddressPair]> = machine
        .ports
        .iter()
        .map(|port| port.allowed_address_pairs.as_slice())
        .collect();
    let digest = digest(&wanted);
    let created_with: Vec<&[AddressPair]> = server
        .spec
        .ports
        .iter()
        .map(|port| port.allowed_address_pairs.as_slice())
        .collect();
    let unchanged = match applied {
        Some(applied) => applied == digest,
        None => created_with == wanted,
    };
    let made = server.status.as_ref()?.resources.as_ref()?;
    if unchanged || wanted.is_empty() || made.ports.len() != wanted.len() {
        return None;
    }
    let ports = made
        .ports
        .iter()
        .zip(&wanted)
        .map(|(port, pairs)| (port.id.clone(), neutron_address_pairs(pairs)))
        .collect();
    Some(Push { ports, digest })
}

/// A stable digest (FNV-1a, 64 bits) of the pairs of every port.
fn digest(pairs: &[&[AddressPair]]) -> String {
    let text = serde_json::to_string(pairs).unwrap_or_default();
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Updates each port, then records the digest on the machine (metadata only: the spec's
/// rules are not involved).
pub async fn apply(
    pass: &Pass<'_>,
    api: &Api<super::OpenStackMachine>,
    server: &OpenStackServer,
    push: Push,
) -> Result<(), MachineError> {
    let cloud = crate::controllers::identity::cloud_client(
        pass.ctx,
        &pass.namespace,
        &server.spec.identity_ref,
    )
    .await?;
    for (port, pairs) in &push.ports {
        cloud
            .neutron()
            .update_port_address_pairs(port, pairs)
            .await
            .map_err(MachineError::cloud(
                "updating a port's allowed address pairs",
            ))?;
    }
    let patch = json!({"metadata": {"annotations": {APPLIED_ANNOTATION: push.digest}}});
    api.patch(&pass.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(MachineError::kube(
            "recording the allowed address pairs pushed",
        ))?;
    tracing::info!(
        ports = push.ports.len(),
        "allowed address pairs pushed to the ports"
    );
    pass.event(
        EventType::Normal,
        "AllowedAddressPairsUpdated",
        format!(
            "allowed address pairs pushed to {} port(s)",
            push.ports.len()
        ),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::common::{MachineResources, PortStatus};

    fn pair(ip: &str) -> AddressPair {
        AddressPair {
            ip_address: ip.into(),
            mac_address: None,
        }
    }

    fn machine(pairs: Vec<AddressPair>) -> OpenStackMachineSpec {
        let mut spec: OpenStackMachineSpec = serde_json::from_value(json!({
            "flavor": {"filter": {"name": "m1"}}, "image": {"filter": {"name": "ubuntu"}},
            "ports": [{}]}))
        .expect("a machine spec");
        spec.ports[0].allowed_address_pairs = pairs;
        spec
    }

    fn server(created_with: Vec<AddressPair>, made: bool) -> OpenStackServer {
        let mut server: OpenStackServer = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "OpenStackServer",
            "metadata": {"name": "s"},
            "spec": {"flavor": "m1", "image": {"filter": {"name": "ubuntu"}}, "sshKeyName": "",
                     "identityRef": {"name": "cloud", "cloudName": "openstack"},
                     "ports": [{}]}}))
        .expect("a server");
        server.spec.ports[0].allowed_address_pairs = created_with;
        let mut status = capo_api::OpenStackServerStatus::default();
        if made {
            status.resources = Some(MachineResources {
                ports: vec![PortStatus { id: "p-1".into() }],
                ..MachineResources::default()
            });
        }
        server.status = Some(status);
        server
    }

    #[test]
    fn nothing_is_pushed_while_the_pairs_are_what_the_ports_were_made_with() {
        let pairs = vec![pair("10.0.0.9")];
        assert_eq!(
            plan(&machine(pairs.clone()), &server(pairs, true), None),
            None
        );
    }

    #[test]
    fn a_change_is_pushed_once_the_ports_are_made_and_then_not_again() {
        let old = vec![pair("10.0.0.9")];
        let new = vec![pair("10.0.0.9"), pair("10.0.0.10")];
        assert_eq!(
            plan(&machine(new.clone()), &server(old.clone(), false), None),
            None
        );
        let push = plan(&machine(new.clone()), &server(old.clone(), true), None).expect("a push");
        assert_eq!(
            push.ports,
            vec![(
                "p-1".to_owned(),
                vec![
                    json!({"ip_address": "10.0.0.9"}),
                    json!({"ip_address": "10.0.0.10"})
                ]
            )]
        );
        assert_eq!(
            plan(
                &machine(new),
                &server(old.clone(), true),
                Some(&push.digest)
            ),
            None
        );
        // Back to what the ports were made with: pushed too, since something else was.
        assert!(
            plan(
                &machine(old.clone()),
                &server(old, true),
                Some(&push.digest)
            )
            .is_some()
        );
    }
}
