//! What a cloud offers, checked before it is used, as CAPO checks it: the trunk extension
//! before a trunk, `standard-attr-tag` before tagging (CAPO #3319), `port-trusted-vif` before a
//! port's own `trusted` (CAPO #3120), Octavia API 2.12 before a listener's `allowedCIDRs`. A cloud without one gets a clear word, not a failed create.
//! The simulator refuses each as the real service does (a tag call without the extension is a
//! 404; an old Octavia refuses the unknown attribute).

use capo_api::conditions::types;
use capo_api::{OpenStackCluster, OpenStackServer};
use serde_json::json;

use crate::cluster_controller::{cluster_spec, create_cluster, provisioned, ready, wait_cluster};
use crate::server_controller::{World, is_ready, server_manifest};

fn message_of<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> (&'a str, &'a str, &'a str) {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map_or(("", "", ""), |c| {
            (c.status.as_str(), c.reason.as_str(), c.message.as_str())
        })
}

fn server_says(server: &OpenStackServer, type_: &str) -> (String, String, String) {
    let conditions = server
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let (status, reason, message) = message_of(conditions, type_);
    (status.into(), reason.into(), message.into())
}

#[tokio::test]
async fn a_trunk_on_a_cloud_without_the_extension_is_refused_before_any_port() {
    let world = World::start().await;
    world
        .cloud
        .set_capabilities(&["standard-attr-tag"], (2, 27));
    let before = world.cloud.object_counts();
    let mut manifest = server_manifest("trunked");
    manifest["spec"]["trunk"] = json!(true);
    world.create(manifest).await;
    let refused = world
        .wait_for("trunked", "refused for its trunk", |s| {
            server_says(s, types::INSTANCE_READY)
                .2
                .contains("no trunk extension")
        })
        .await;
    let (status, reason, _) = server_says(&refused, types::INSTANCE_READY);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert_eq!(world.cloud.object_counts(), before, "no port, no server");
    assert_eq!(world.requests("network extension_get"), 1);
}

/// A trusted VF is the port's own `trusted` where Neutron has `port-trusted-vif`, and
/// `binding:profile`'s elsewhere (where the simulator, as Neutron, refuses the attribute).
#[tokio::test]
async fn a_trusted_vf_is_the_ports_own_attribute_where_neutron_has_port_trusted_vif() {
    for (extensions, attribute, in_profile) in [
        (
            &["trunk", "standard-attr-tag", "port-trusted-vif"][..],
            Some(true),
            // Neutron mirrors the port's own `trusted` into `binding:profile`.
            Some(true),
        ),
        (&["trunk", "standard-attr-tag"][..], None, Some(true)),
    ] {
        let world = World::start().await;
        world.cloud.set_capabilities(extensions, (2, 27));
        let mut manifest = server_manifest("trusted");
        manifest["spec"]["ports"][0]["profile"] = json!({"trustedVF": true});
        world.create(manifest).await;
        let ready = world.wait_for("trusted", "Ready", is_ready).await;
        let port = (ready.status.as_ref())
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.ports.first())
            .and_then(|p| world.cloud.port(&p.id))
            .expect("the server's port");
        assert_eq!(
            (
                port["trusted"].as_bool(),
                port["binding:profile"]["trusted"].as_bool()
            ),
            (attribute, in_profile),
            "with {extensions:?}: {port:#}"
        );
        assert_eq!(
            world.requests("network extension_get"),
            2,
            "port-trusted-vif and standard-attr-tag, each asked once"
        );
    }
}

#[tokio::test]
async fn without_tagging_a_cluster_is_built_untagged_and_no_tag_call_is_made() {
    let world = World::start().await;
    world.cloud.set_capabilities(&["trunk"], (2, 27));
    create_cluster(&world, "untagged", cluster_spec()).await;
    wait_cluster(&world, "untagged", "provisioned", |c| {
        provisioned(c) && ready(c)
    })
    .await;
    let log = world.cloud.request_log();
    let tag_calls: u64 = log["by_operation"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(operation, _)| operation.contains("tags_update"))
        .filter_map(|(_, count)| count.as_u64())
        .sum();
    assert_eq!(tag_calls, 0, "no tag call reached Neutron");
    assert_eq!(
        world.requests("network extension_get"),
        1,
        "asked once, then remembered"
    );
}

#[tokio::test]
async fn allowed_cidrs_on_an_octavia_before_2_12_leave_the_listener_open_and_say_so() {
    let world = World::start().await;
    world
        .cloud
        .set_capabilities(&["trunk", "standard-attr-tag"], (2, 11));
    let mut spec = cluster_spec();
    spec["apiServer"]["managedLoadBalancer"]["allowedCIDRs"] = json!(["192.0.2.0/24"]);
    create_cluster(&world, "old-octavia", spec).await;
    let cluster: OpenStackCluster = wait_cluster(&world, "old-octavia", "provisioned", |c| {
        provisioned(c) && ready(c)
    })
    .await;
    let conditions = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let (status, _, message) = message_of(conditions, types::API_ENDPOINT_READY);
    assert_eq!(status, "True");
    assert!(
        message.contains("allowedCIDRs not enforced") && message.contains("2.11"),
        "{message}"
    );
    let recorded = cluster
        .status
        .and_then(|s| s.api_server_managed_load_balancer)
        .expect("the load balancer");
    assert_eq!(recorded.allowed_cidrs, Vec::<String>::new());
}

/// The real cloud answers the questions as the simulator does: the extensions it has, a 404
/// for one it lacks, and its Octavia version document at the endpoint's root.
#[tokio::test]
async fn the_real_cloud_says_what_it_offers() {
    let Some(real) = crate::real_cloud::real_cloud() else {
        return;
    };
    // Alone: the trusted-VF test loads `port_trusted` for a while.
    let _alone = crate::real_cloud::REAL.lock().await;
    let (tenant, _clouds) = real.client(crate::real_cloud::PASSWORD_CLOUD).await;
    let neutron = tenant.neutron();
    for (alias, offered) in [
        ("trunk", true),
        ("standard-attr-tag", true),
        // The tier's ML2 loads no `port_trusted` extension driver (but for the trusted-VF
        // test, which holds the tier alone meanwhile).
        ("port-trusted-vif", false),
        ("capo-rs-no-such-extension", false),
    ] {
        assert_eq!(
            neutron.has_extension(alias).await.expect("an answer"),
            offered,
            "{alias}"
        );
    }
    let version = tenant.octavia().api_version().await.expect("a version");
    eprintln!("FIGURES real Octavia API version {version:?}");
    assert!(version.is_some_and(|v| v >= (2, 12)), "{version:?}");
}

/// What one real Neutron made of capo-rs's request for a trusted VF: whether it reported
/// `port-trusted-vif`, and the port's `trusted` and `binding:profile.trusted` as an
/// administrator reads them back.
async fn real_trusted_vf_port(
    real: &crate::real_cloud::RealCloud,
    network: &str,
) -> Result<(bool, Option<bool>, Option<bool>), String> {
    use capo_provider::cloud::{Owner, Service};
    use capo_provider::controllers::server::plan;
    // A client of its own: Neutron's extensions are asked once per cloud and remembered.
    let (admin, _clouds) = real.client(crate::real_cloud::ADMIN_CLOUD).await;
    let has_extension = admin
        .neutron()
        .has_extension(plan::PORT_TRUSTED_VIF)
        .await
        .map_err(|e| format!("Neutron's extensions: {e}"))?;
    let wanted: capo_api::common::ResolvedPortSpec = serde_json::from_value(json!({
        "name": "capo-rs-trusted-vf", "networkID": network, "profile": {"trustedVF": true},
    }))
    .unwrap();
    let owner = Owner::new("OpenStackServer", "capabilities", "trusted-vf");
    let request = plan::port_request(&wanted, &owner, has_extension);
    let port = (admin.neutron().create_port(&request).await)
        .map_err(|e| format!("Neutron refused the trusted VF port: {e}"))?;
    let read =
        crate::real_cloud::get_json(&admin, Service::Network, &format!("ports/{}", port.id)).await;
    (admin.neutron().delete_port(&port.id).await).map_err(|e| format!("port deleted: {e}"))?;
    Ok((
        has_extension,
        read["port"]["trusted"].as_bool(),
        read["port"]["binding:profile"]["trusted"].as_bool(),
    ))
}

/// On the real tier's Neutron, without and then with the `port_trusted` ML2 extension driver
/// (`port-trusted-vif`), as the tier's administrator: capo-rs asks whether it is there; with
/// it, its request carries the port's own `trusted`, which Neutron accepts and mirrors into
/// `binding:profile`; without it, the request carries `binding:profile`'s `trusted`, which
/// Neutron's default policy keeps for the `service` role.
#[tokio::test]
async fn real_a_trusted_vf_port_is_accepted_by_neutron_with_and_without_port_trusted_vif() {
    use crate::real_cloud::{REAL, fault, real_cloud};
    let Some(real) = real_cloud() else {
        return;
    };
    let _alone = REAL.lock().await;
    let (admin, _clouds) = real.client(crate::real_cloud::ADMIN_CLOUD).await;
    let networks = admin
        .neutron()
        .list_networks(&capo_provider::cloud::neutron::Filter::by_name(
            crate::real_provider::TENANT_NETWORK,
        ))
        .await
        .expect("networks");
    let network = networks.first().expect("the tenant's network").id.clone();
    let without = real_trusted_vf_port(&real, &network).await;
    fault(&["ml2-extension", "port_trusted", "on"]).await;
    let with = real_trusted_vf_port(&real, &network).await;
    fault(&["ml2-extension", "port_trusted", "off"]).await;
    // The driver goes before any assertion: the tier's other tests run without it.
    // Without the extension Neutron's default policy (new defaults) keeps `binding:profile`
    // for the `service` role, Nova's: even an administrator is refused, and capo-rs passes
    // Neutron's word on. That is why the port's own `trusted` is used where it exists.
    let refused = without
        .as_ref()
        .err()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        refused.contains("create_port:binding:profile) is disallowed by policy"),
        "without port-trusted-vif: {without:?}"
    );
    assert_eq!(
        with,
        Ok((true, Some(true), Some(true))),
        "with port-trusted-vif"
    );
}
