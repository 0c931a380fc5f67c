//! CAPO's condition types, written beside ours with the meaning CAPO gives them, so that
//! dashboards, alerts and scripts keyed on CAPO's names keep working. Each is derived from
//! our own conditions (pure), just before a controller writes its status:
//!
//! | CAPO's condition | on | derived from |
//! |---|---|---|
//! | `OpenStackAuthenticationSucceeded` | cluster, machine, server, machine template | False (`OpenStackAuthenticationFailed`) while a condition says `InvalidCredentials`; True (`Ready`) once a condition that needs OpenStack is True; otherwise left as it was |
//! | `RouterReady` | cluster | `NetworkReady` (one step builds the network, its subnets and the router) |
//! | `APIServerIngressReady` | control-plane machine | `APIServerLoadBalancerMemberReady`: True only once the gate released the machine (stricter than CAPO, which says True once the member is created); False `LoadBalancerMemberError` for a member in ERROR or stuck |
//! | `FloatingAddressFromPoolReady` | server with `floatingIPPoolRef` | set by the server controller itself, not derived: True once the pool's address is attached; False `FloatingIPError` while it is not |

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{self, Desired, Status, reasons, types};

/// CAPO's condition types.
pub mod capo_types {
    /// Whether the provider could authenticate to OpenStack.
    pub const OPENSTACK_AUTHENTICATION_SUCCEEDED: &str = "OpenStackAuthenticationSucceeded";
    /// The cluster's router.
    pub const ROUTER_READY: &str = "RouterReady";
    /// A control-plane machine's way in for API traffic (its load balancer member).
    pub const API_SERVER_INGRESS_READY: &str = "APIServerIngressReady";
    /// A floating IP from an OpenStackFloatingIPPool.
    pub const FLOATING_ADDRESS_FROM_POOL_READY: &str = "FloatingAddressFromPoolReady";
}

/// CAPO's reasons for them.
pub mod capo_reasons {
    /// The credentials were refused.
    pub const OPENSTACK_AUTHENTICATION_FAILED: &str = "OpenStackAuthenticationFailed";
    /// A load balancer member could not be made to serve.
    pub const LOAD_BALANCER_MEMBER_ERROR: &str = "LoadBalancerMemberError";
    /// A floating IP could not be had.
    pub const FLOATING_IP_ERROR: &str = "FloatingIPError";
}

/// Which object the conditions belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// An OpenStackCluster.
    Cluster,
    /// An OpenStackMachine; `control_plane` when it carries Cluster API's control-plane label.
    Machine {
        /// A control-plane machine.
        control_plane: bool,
    },
    /// An OpenStackServer.
    Server,
    /// An OpenStackMachineTemplate (its `Ready` says whether its flavor and image were read).
    MachineTemplate,
}

/// Our conditions that say OpenStack answered us (authenticated), by owner.
fn needs_openstack(owner: Owner) -> &'static [&'static str] {
    match owner {
        Owner::Cluster => &[
            types::NETWORK_READY,
            types::SECURITY_GROUPS_READY,
            types::API_SERVER_LOAD_BALANCER_READY,
            types::API_ENDPOINT_READY,
        ],
        Owner::Machine { .. } | Owner::Server => &[types::INSTANCE_READY],
        Owner::MachineTemplate => &[types::READY],
    }
}

/// Writes CAPO's conditions for `owner` from ours in `list`.
pub fn derive(list: &mut Vec<Condition>, owner: Owner, generation: Option<i64>, now: Timestamp) {
    let derived = derived(list, owner);
    for (type_, status, reason, message) in derived {
        let desired = Desired::new(type_, status, &reason, message);
        conditions::set(list, &desired, generation, now);
    }
}

type Derived = (&'static str, Status, String, String);

fn derived(list: &[Condition], owner: Owner) -> Vec<Derived> {
    let mut out: Vec<Derived> = authentication(list, owner).into_iter().collect();
    match owner {
        Owner::Cluster => out.extend(mirror(list, types::NETWORK_READY, capo_types::ROUTER_READY)),
        Owner::Machine {
            control_plane: true,
        } => out.extend(ingress(list)),
        Owner::Machine { .. } | Owner::Server | Owner::MachineTemplate => {}
    }
    out
}

fn authentication(list: &[Condition], owner: Owner) -> Option<Derived> {
    let type_ = capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED;
    if let Some(refused) = list
        .iter()
        .find(|c| c.reason == reasons::INVALID_CREDENTIALS)
    {
        let reason = capo_reasons::OPENSTACK_AUTHENTICATION_FAILED.to_owned();
        return Some((type_, Status::False, reason, refused.message.clone()));
    }
    let answered = needs_openstack(owner)
        .iter()
        .any(|t| conditions::status_of(list, t) == Status::True);
    answered.then(|| {
        (
            type_,
            Status::True,
            reasons::READY.to_owned(),
            String::new(),
        )
    })
}

/// `to` says what `from` says, once `from` says something.
fn mirror(list: &[Condition], from: &str, to: &'static str) -> Option<Derived> {
    let source = conditions::find(list, from)?;
    let status = Status::parse(&source.status);
    let reason = source.reason.clone();
    Some((to, status, reason, source.message.clone()))
}

fn ingress(list: &[Condition]) -> Option<Derived> {
    let (_, status, reason, message) = mirror(
        list,
        types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
        capo_types::API_SERVER_INGRESS_READY,
    )?;
    let reason = match reason.as_str() {
        _ if status == Status::True => reasons::READY.to_owned(),
        reasons::MEMBER_ERROR | reasons::MEMBER_STUCK => {
            capo_reasons::LOAD_BALANCER_MEMBER_ERROR.to_owned()
        }
        _ => reason,
    };
    Some((
        capo_types::API_SERVER_INGRESS_READY,
        status,
        reason,
        message,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(list: &[(&'static str, Status, &'static str)]) -> Vec<Condition> {
        let mut out = Vec::new();
        for (type_, status, reason) in list {
            let desired = Desired::new(type_, *status, reason, format!("{type_} says"));
            conditions::set(&mut out, &desired, Some(1), Timestamp::now());
        }
        out
    }

    fn said(list: &[Condition], type_: &str) -> Option<(String, String)> {
        conditions::find(list, type_).map(|c| (c.status.clone(), c.reason.clone()))
    }

    #[test]
    fn refused_credentials_say_authentication_failed_and_an_answer_says_it_succeeded() {
        let control_plane = Owner::Machine {
            control_plane: true,
        };
        let mut refused = with(&[(
            types::INSTANCE_READY,
            Status::False,
            reasons::INVALID_CREDENTIALS,
        )]);
        derive(&mut refused, control_plane, Some(1), Timestamp::now());
        assert_eq!(
            said(&refused, capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED),
            Some((
                "False".into(),
                capo_reasons::OPENSTACK_AUTHENTICATION_FAILED.into()
            ))
        );
        let mut waiting = with(&[(
            types::INSTANCE_READY,
            Status::False,
            reasons::DEPENDENCY_MISSING,
        )]);
        derive(&mut waiting, control_plane, Some(1), Timestamp::now());
        assert_eq!(
            said(&waiting, capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED),
            None,
            "not known yet"
        );
        let mut template = with(&[(types::READY, Status::True, reasons::READY)]);
        derive(
            &mut template,
            Owner::MachineTemplate,
            Some(1),
            Timestamp::now(),
        );
        assert_eq!(
            said(&template, capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED),
            Some(("True".into(), reasons::READY.into())),
            "a template whose flavor and image were read"
        );
        let mut ready = with(&[(types::INSTANCE_READY, Status::True, reasons::READY)]);
        derive(&mut ready, control_plane, Some(1), Timestamp::now());
        assert_eq!(
            said(&ready, capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED),
            Some(("True".into(), reasons::READY.into()))
        );
    }

    #[test]
    fn ingress_is_true_only_once_the_gate_releases_and_a_member_error_is_capos_reason() {
        let control_plane = Owner::Machine {
            control_plane: true,
        };
        for (ours, wanted) in [
            (
                (Status::False, reasons::MEMBERS_PENDING),
                ("False", reasons::MEMBERS_PENDING),
            ),
            (
                (Status::False, reasons::MEMBER_ERROR),
                ("False", capo_reasons::LOAD_BALANCER_MEMBER_ERROR),
            ),
            (
                (Status::False, reasons::MEMBER_STUCK),
                ("False", capo_reasons::LOAD_BALANCER_MEMBER_ERROR),
            ),
            ((Status::True, reasons::READY), ("True", reasons::READY)),
            (
                (Status::True, reasons::LOAD_BALANCER_DISABLED),
                ("True", reasons::READY),
            ),
        ] {
            let mut list = with(&[(types::API_SERVER_LOAD_BALANCER_MEMBER_READY, ours.0, ours.1)]);
            derive(&mut list, control_plane, Some(1), Timestamp::now());
            assert_eq!(
                said(&list, capo_types::API_SERVER_INGRESS_READY),
                Some((wanted.0.into(), wanted.1.into())),
                "{ours:?}"
            );
        }
        let mut worker = with(&[(
            types::API_SERVER_LOAD_BALANCER_MEMBER_READY,
            Status::True,
            reasons::NOT_CONTROL_PLANE,
        )]);
        derive(
            &mut worker,
            Owner::Machine {
                control_plane: false,
            },
            Some(1),
            Timestamp::now(),
        );
        assert_eq!(
            said(&worker, capo_types::API_SERVER_INGRESS_READY),
            None,
            "CAPO sets it on control-plane machines only"
        );
    }

    #[test]
    fn router_ready_follows_network_ready_and_a_servers_pool_condition_is_left_to_its_controller() {
        let mut cluster = with(&[(types::NETWORK_READY, Status::True, reasons::READY)]);
        derive(&mut cluster, Owner::Cluster, Some(1), Timestamp::now());
        assert_eq!(
            said(&cluster, capo_types::ROUTER_READY),
            Some(("True".into(), reasons::READY.into()))
        );
        let mut server = Vec::new();
        derive(&mut server, Owner::Server, Some(1), Timestamp::now());
        assert_eq!(
            said(&server, capo_types::FLOATING_ADDRESS_FROM_POOL_READY),
            None
        );
    }
}
