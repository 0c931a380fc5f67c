//! The OpenStackCluster controller in the simulated world (the simulated Kubernetes API with
//! our CRDs and minimal Cluster API CRDs, and the simulated OpenStack), with the manager and
//! the membership engine running. Members are created the way the machine controller will:
//! an OpenStackMachine with an address, and its Octavia member in each pool.

use std::collections::BTreeMap;
use std::time::Duration;

use capo_api::conditions::{self, reasons, types};
use capo_api::{OpenStackCluster, OpenStackMachine};
use capo_provider::cloud::Owner;
use capo_provider::cloud::neutron::{Filter, NetworkSpec};
use capo_provider::cloud::octavia::{LoadBalancerSpec, MemberSpec};
use capo_provider::manager::{ManagerConfig, WatchScope};
use capo_sim::openstack::{Delay, Effect, ObjectKind, Outage, RateLimitFault, Rule, Scenario};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::{Value, json};

use crate::common;
use crate::server_controller::{WAIT, World, eventually, manager_config, timings};

pub(crate) fn clusters(world: &World) -> Api<OpenStackCluster> {
    world.kube.api()
}

pub(crate) fn machines(world: &World) -> Api<OpenStackMachine> {
    world.kube.api()
}

/// CAPO's cluster-template.yaml OpenStackCluster, filled in for the simulator.
pub(crate) fn cluster_spec() -> Value {
    json!({
        "apiServer": {"managedLoadBalancer": {"enabled": true}},
        "identityRef": {"name": "cloud-config", "cloudName": "sim"},
        "managedSecurityGroups": {
            "allowAllInClusterTraffic": false,
            "clusterNodesSecurityGroupRules": [{
                "name": "BGP (Calico)", "description": "BGP (calico)", "direction": "ingress",
                "etherType": "IPv4", "portRangeMin": 179, "portRangeMax": 179, "protocol": "tcp",
                "remoteManagedGroups": ["controlplane", "worker"]
            }]
        },
        "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["192.0.2.53"]}],
        "tags": ["capo-rs-test"],
    })
}

/// A Cluster API Cluster and its OpenStackCluster, labelled as Cluster API labels them.
pub(crate) async fn create_cluster(world: &World, name: &str, spec: Value) -> OpenStackCluster {
    let capi: Api<capo_api::capi::Cluster> = world.kube.api();
    let owner: capo_api::capi::Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": world.ns()},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": name}}
    }))
    .unwrap();
    capi.create(&PostParams::default(), &owner).await.unwrap();
    let cluster: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": name, "namespace": world.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "spec": spec,
    }))
    .unwrap();
    clusters(world)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap()
}

pub(crate) async fn wait_cluster(
    world: &World,
    name: &str,
    what: &str,
    done: impl Fn(&OpenStackCluster) -> bool,
) -> OpenStackCluster {
    wait_cluster_within(world, name, what, WAIT, done).await
}

pub(crate) async fn wait_cluster_within(
    world: &World,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&OpenStackCluster) -> bool,
) -> OpenStackCluster {
    let condition = move |object: Option<&OpenStackCluster>| object.is_some_and(&done);
    let waited = await_condition(clusters(world), name, condition);
    match tokio::time::timeout(within, waited).await {
        Ok(Ok(Some(object))) => object,
        other => {
            let now = clusters(world).get_opt(name).await.ok().flatten();
            panic!(
                "{name}: never {what}: {other:?}\nlast seen: {:#?}",
                now.map(|o| o.status)
            );
        }
    }
}

pub(crate) async fn wait_cluster_gone(world: &World, name: &str) {
    let waited = await_condition(clusters(world), name, |o: Option<&OpenStackCluster>| {
        o.is_none()
    });
    if tokio::time::timeout(WAIT, waited).await.is_err() {
        let now = clusters(world).get_opt(name).await.ok().flatten();
        panic!(
            "{name} never deleted; last seen: {:#?}",
            now.map(|o| o.status)
        );
    }
}

pub(crate) fn condition(cluster: &OpenStackCluster, type_: &str) -> (String, String, String) {
    cluster
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

pub(crate) fn has(
    type_: &'static str,
    status: &'static str,
    reason: &'static str,
) -> impl Fn(&OpenStackCluster) -> bool {
    move |c| {
        let (s, r, _) = condition(c, type_);
        s == status && r == reason
    }
}

pub(crate) fn provisioned(cluster: &OpenStackCluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true)
}

pub(crate) fn ready(cluster: &OpenStackCluster) -> bool {
    condition(cluster, types::READY).0 == "True"
}

/// Ready, and for the latest generation (setting the endpoint changes the spec).
pub(crate) fn settled(cluster: &OpenStackCluster) -> bool {
    provisioned(cluster)
        && ready(cluster)
        && cluster.status.as_ref().and_then(|s| s.observed_generation)
            == cluster.metadata.generation
}

/// The API pool's ID, by port.
fn pool(cluster: &OpenStackCluster, port: i32) -> String {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.api_server_managed_load_balancer.as_ref())
        .and_then(|lb| lb.pools.iter().find(|p| p.port == port))
        .map(|p| p.pool_id.clone())
        .expect("the pool is recorded")
}

/// A control-plane OpenStackMachine of `cluster` whose server has `address`.
async fn control_plane_machine(world: &World, cluster: &str, name: &str, address: &str) {
    let machine: OpenStackMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
        "metadata": {"name": name, "namespace": world.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster,
                                "cluster.x-k8s.io/control-plane": ""}},
        "spec": {"flavor": {"filter": {"name": "m1.small"}},
                 "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}}},
    }))
    .unwrap();
    machines(world)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    // No Machine owns it: the machine controller only says it waits. Its first status write
    // comes before ours, which plays the server's address.
    let api = machines(world);
    eventually("the machine controller's first look", || async {
        let machine = api.get(name).await.ok()?;
        machine
            .status
            .is_some_and(|s| !s.conditions.is_empty())
            .then_some(())
    })
    .await;
    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": address}]}});
    machines(world)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// A control-plane machine `name` of cluster `c1` at `address`, with its member in `pool` made
/// as the machine controller makes it.
async fn control_plane_member(world: &World, pool: &str, name: &str, address: &str) {
    control_plane_machine(world, "c1", name, address).await;
    world
        .admin
        .octavia()
        .create_member(pool, &MemberSpec::new(name, address, 6443))
        .await
        .unwrap();
}

/// What the simulated cloud holds, by kind, without the objects it was seeded with.
pub(crate) fn objects(world: &World) -> BTreeMap<String, usize> {
    world.cloud.object_counts()
}

pub(crate) async fn delete_cluster(world: &World, name: &str) {
    clusters(world)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_cluster_gone(world, name).await;
}

#[tokio::test]
async fn a_cluster_is_built_as_capo_builds_it_then_deleted_without_a_leak() {
    let world = World::start().await;
    let before = objects(&world);
    let requests_before = world.request_total();
    create_cluster(&world, "c1", cluster_spec()).await;
    // Ready comes with the endpoint; the gate reads True once the engine has seen the LB
    // settle after its monitor was made (a routine PENDING_UPDATE keeps Ready True).
    let cluster = wait_cluster(&world, "c1", "provisioned, Ready and gated open", |c| {
        settled(c) && condition(c, types::API_SERVER_LOAD_BALANCER_READY).0 == "True"
    })
    .await;
    let create_requests = world.request_total() - requests_before;
    eprintln!(
        "create requests by operation: {}",
        world.cloud.request_log()["by_operation"]
    );
    let create_reconciles = reconciles(&world);
    let status = cluster.status.clone().unwrap();
    // The network, with CAPO's names.
    let network = status.network.as_ref().unwrap();
    assert_eq!(
        network.name,
        format!("k8s-clusterapi-cluster-{}-c1", world.ns())
    );
    assert_eq!(network.subnets[0].cidr, "10.6.0.0/24");
    assert_eq!(status.external_network.as_ref().unwrap().name, "public");
    let router = status.router.as_ref().unwrap();
    assert_eq!(
        router.ips.len(),
        1,
        "the router has its gateway: {router:?}"
    );
    // CAPO's condition names, beside ours.
    for type_ in [
        capo_api::capo_conditions::capo_types::ROUTER_READY,
        capo_api::capo_conditions::capo_types::OPENSTACK_AUTHENTICATION_SUCCEEDED,
    ] {
        assert_eq!(condition(&cluster, type_).0, "True", "{type_}");
    }
    // The security groups, with Calico's rule on both node groups.
    let groups = world
        .admin
        .neutron()
        .list_security_groups(&Filter::by_name(format!(
            "k8s-cluster-{}-c1-secgroup-controlplane",
            world.ns()
        )))
        .await
        .unwrap();
    let rules = &groups[0].security_group_rules;
    assert!(rules.iter().any(|r| r.port_range_min == Some(179)));
    assert!(rules.iter().any(|r| r.port_range_min == Some(6443)));
    assert!(
        status.bastion_security_group.is_none(),
        "no bastion, no bastion group"
    );
    // The load balancer, its listener, pool and monitor, and the floating IP.
    let lb = status.api_server_managed_load_balancer.as_ref().unwrap();
    assert_eq!(
        lb.name,
        format!("k8s-clusterapi-cluster-{}-c1-kubeapi", world.ns())
    );
    assert_eq!(lb.pools.len(), 1);
    assert!(lb.pools[0].monitor_id.is_some());
    assert_ne!(lb.ip, lb.internal_ip, "the endpoint is the floating IP");
    let endpoint = cluster.spec.control_plane_endpoint.clone().unwrap();
    assert_eq!(endpoint.host.as_deref(), Some(lb.ip.as_str()));
    assert_eq!(endpoint.port, Some(6443));
    // Failure domains from Nova, conditions all True.
    assert_eq!(status.failure_domains[0].name, "nova");
    for type_ in [
        types::NETWORK_READY,
        types::SECURITY_GROUPS_READY,
        types::API_ENDPOINT_READY,
        types::API_SERVER_LOAD_BALANCER_READY,
        types::API_SERVER_LOAD_BALANCER_HEALTHY,
    ] {
        assert_eq!(
            condition(&cluster, type_).0,
            "True",
            "{type_}: {:?}",
            condition(&cluster, type_)
        );
    }
    assert_eq!(status.observed_generation, cluster.metadata.generation);

    let requests_before = world.request_total();
    delete_cluster(&world, "c1").await;
    let delete_requests = world.request_total() - requests_before;
    assert_eq!(
        objects(&world),
        before,
        "every object the cluster made is gone"
    );
    eprintln!(
        "cluster create: {create_requests} OpenStack requests, {create_reconciles} reconciles; delete: {delete_requests} requests"
    );
}

/// The OpenStackCluster of CAPO's cluster-template.yaml as a user applies it: the external
/// network by its ID, Calico's BGP and IP-in-IP rules, no tags (`cluster_spec` adds one).
fn capo_template_spec(external_network: &str) -> Value {
    let calico = |name: &str, protocol: &str, ports: Option<u16>| {
        let mut rule = json!({
            "name": name, "description": format!("Created by cluster-api-provider-openstack - {name}"),
            "direction": "ingress", "etherType": "IPv4", "protocol": protocol,
            "remoteManagedGroups": ["controlplane", "worker"]
        });
        if let Some(port) = ports {
            rule["portRangeMin"] = json!(port);
            rule["portRangeMax"] = json!(port);
        }
        rule
    };
    json!({
        "apiServer": {"managedLoadBalancer": {"enabled": true}},
        "externalNetwork": {"id": external_network},
        "identityRef": {"name": "cloud-config", "cloudName": "sim"},
        "managedSecurityGroups": {
            "clusterNodesSecurityGroupRules": [
                calico("BGP (Calico)", "tcp", Some(179)),
                calico("IP-in-IP (calico)", "4", None),
            ]
        },
        "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["192.0.2.53"]}],
    })
}

/// CAPO's template cluster (untagged, as the template leaves it) gets its floating IP in one
/// request, made on the VIP's port. Prints the OpenStack requests to provisioned and Ready,
/// by operation (issue 59's row for this template).
#[tokio::test]
async fn capo_s_template_cluster_gets_its_floating_ip_in_one_request() {
    let world = World::start().await;
    let public = public_network(&world).await;
    world.cloud.reset_request_log();
    create_cluster(&world, "c1", capo_template_spec(&public.id)).await;
    let cluster = wait_cluster(&world, "c1", "provisioned, Ready and gated open", |c| {
        settled(c) && condition(c, types::API_SERVER_LOAD_BALANCER_READY).0 == "True"
    })
    .await;
    let log = world.cloud.request_log();
    let count = |operation: &str| log["by_operation"][operation].as_u64().unwrap_or(0);
    eprintln!(
        "CAPO's template cluster: {} OpenStack requests; by operation: {}",
        log["total"], log["by_operation"]
    );
    assert_eq!(count("network floating_ip_create"), 1);
    assert_eq!(count("network floating_ip_update"), 0, "made on its port");
    let status = cluster.status.clone().unwrap();
    assert_eq!(status.external_network.as_ref().unwrap().id, public.id);
    let lb = status.api_server_managed_load_balancer.clone().unwrap();
    let on_port = world
        .admin
        .neutron()
        .find_floating_ip(&lb.ip)
        .await
        .unwrap()
        .expect("the endpoint's floating IP");
    assert_eq!(
        on_port.fixed_ip_address.as_deref(),
        Some(lb.internal_ip.as_str())
    );

    delete_cluster(&world, "c1").await;
}

/// A floating IP put on the VIP's port by hand, without our description, before the cluster
/// gets to its own: the create on the port is refused (Neutron: the fixed IP has one), and
/// that one is adopted as the endpoint rather than a second allocated.
#[tokio::test]
async fn a_floating_ip_put_on_the_vip_port_by_hand_is_adopted_not_doubled() {
    let world = World::start().await;
    let neutron = world.admin.neutron();
    let public = public_network(&world).await;
    world.cloud.set_scenario(Scenario {
        timings: timings(),
        rules: vec![Rule {
            kind: ObjectKind::Loadbalancer,
            name: "*-kubeapi".into(),
            effect: Effect::Stuck,
            times: None,
        }],
        ..Scenario::default()
    });
    create_cluster(&world, "c1", capo_template_spec(&public.id)).await;
    let octavia = world.admin.octavia();
    let vip_port = eventually("the load balancer's VIP port", || async {
        let lbs = octavia
            .list_load_balancers(&Default::default())
            .await
            .ok()?;
        lbs.into_iter()
            .find(|lb| lb.name.ends_with("-c1-kubeapi"))?
            .vip_port_id
    })
    .await;
    let by_hand = neutron
        .create_tagged_floating_ip(&public.id, None, Some(&vip_port), "attached by hand", &[])
        .await
        .unwrap();
    world.cloud.clear_rules();
    let cluster = wait_cluster(&world, "c1", "provisioned, Ready and gated open", |c| {
        settled(c) && condition(c, types::API_SERVER_LOAD_BALANCER_READY).0 == "True"
    })
    .await;
    let endpoint = cluster.spec.control_plane_endpoint.clone().unwrap();
    assert_eq!(
        endpoint.host.as_deref(),
        Some(by_hand.floating_ip_address.as_str())
    );
    let on_vip = neutron
        .list_floating_ips(&Filter::default().with("port_id", vip_port.clone()))
        .await
        .unwrap();
    assert_eq!(
        on_vip.len(),
        1,
        "one floating IP on the VIP's port: {on_vip:?}"
    );
    assert_eq!(
        world.cloud.request_log()["by_status"]["409"].as_u64(),
        Some(1),
        "our create on the port, refused"
    );
    delete_cluster(&world, "c1").await;
}

/// The simulated cloud's external network.
async fn public_network(world: &World) -> capo_provider::cloud::neutron::Network {
    world
        .admin
        .neutron()
        .list_networks(&Filter::by_name("public"))
        .await
        .unwrap()
        .remove(0)
}

fn reconciles(world: &World) -> f64 {
    world
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == "controller_runtime_reconcile_total")
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "controller" && l.value() == "openstackcluster")
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// The gate, with a member created the way the machine controller will create it.
#[tokio::test]
async fn the_gate_holds_while_a_member_is_pending_under_an_active_lb_and_opens_when_it_is_active() {
    let mut world = World::start().await;
    create_cluster(&world, "c1", cluster_spec()).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", |c| provisioned(c) && ready(c)).await;
    let pool = pool(&cluster, 6443);
    // AmphoraV2's race: the LB unlocks long before the member is ACTIVE.
    world.cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "cp-1".into(),
        effect: Effect::Delay(Delay::Fixed(3.0)),
        times: None,
    });
    control_plane_machine(&world, "c1", "cp-1", "10.6.0.11").await;
    let missing = wait_cluster(
        &world,
        "c1",
        "MembersMissing",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::MEMBERS_MISSING,
        ),
    )
    .await;
    assert!(
        condition(&missing, types::API_SERVER_LOAD_BALANCER_READY)
            .2
            .contains("cp-1:6443")
    );
    world
        .admin
        .octavia()
        .create_member(&pool, &MemberSpec::new("cp-1", "10.6.0.11", 6443))
        .await
        .unwrap();
    let pending = wait_cluster(
        &world,
        "c1",
        "MembersPending under an ACTIVE LB",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::MEMBERS_PENDING,
        ),
    )
    .await;
    let (_, _, message) = condition(&pending, types::API_SERVER_LOAD_BALANCER_READY);
    // Named, and no duration while it is on its way: the message holds from pass to pass.
    assert!(message.ends_with("cp-1:6443"), "{message}");
    assert!(ready(&pending), "routine progress keeps the cluster Ready");
    let member = &pending
        .status
        .as_ref()
        .unwrap()
        .api_server_managed_load_balancer
        .as_ref()
        .unwrap()
        .members[0];
    assert_eq!(member.name, "cp-1");
    assert!(member.since.is_some());
    let open = wait_cluster(
        &world,
        "c1",
        "Ready gate",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "True",
            reasons::READY,
        ),
    )
    .await;
    let member = &open
        .status
        .as_ref()
        .unwrap()
        .api_server_managed_load_balancer
        .as_ref()
        .unwrap()
        .members[0];
    assert_eq!(
        member.provisioning_status,
        Some(capo_api::cluster::ProvisioningStatus::Active)
    );
    // The wake-up latency: engine observation to condition written.
    let name = "capo_lb_gate_condition_latency_seconds";
    let gate = histogram(&world, name, "gate");
    assert!(gate.0 > 0, "woken by the engine, not by polling");
    for (pass, (count, p50, max, mean)) in [
        ("gate", gate),
        ("complete", histogram(&world, name, "complete")),
    ] {
        eprintln!(
            "gate latency ({pass} passes): {count} writes, p50 <= {p50:.3} s, max <= {max:.3} s, mean {mean:.4} s"
        );
    }
    world.stop_manager().await;
}

/// (count, p50 upper bound, max upper bound, mean) of a histogram, for one `pass` label.
fn histogram(world: &World, name: &str, pass: &str) -> (u64, f64, f64, f64) {
    let families = world.registry.gather();
    let Some(h) = families
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == pass))
        .map(|m| m.get_histogram().clone())
        .next()
    else {
        return (0, 0.0, 0.0, 0.0);
    };
    let count = h.get_sample_count();
    let bound = |fraction: f64| {
        h.get_bucket()
            .iter()
            .find(|b| b.cumulative_count() as f64 >= fraction * count as f64)
            .map(|b| b.upper_bound())
            .unwrap_or(f64::INFINITY)
    };
    let mean = if count == 0 {
        0.0
    } else {
        h.get_sample_sum() / count as f64
    };
    (count, bound(0.5), bound(1.0), mean)
}

fn stuck_after(seconds: u64) -> ManagerConfig {
    let mut config = manager_config(WatchScope::default());
    config.engine.stuck_after = Duration::from_secs(seconds);
    config
}

#[tokio::test]
async fn a_stuck_member_turns_the_gate_and_ready_false_and_an_error_member_too() {
    let mut world = World::start().await;
    world.stop_manager().await;
    world.start_manager_with(stuck_after(2));
    create_cluster(&world, "c1", cluster_spec()).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", |c| provisioned(c) && ready(c)).await;
    let pool = pool(&cluster, 6443);
    world.cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "cp-1".into(),
        effect: Effect::Stuck,
        times: None,
    });
    control_plane_member(&world, &pool, "cp-1", "10.6.0.11").await;
    let stuck = wait_cluster(
        &world,
        "c1",
        "MemberStuck",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::MEMBER_STUCK,
        ),
    )
    .await;
    assert!(
        condition(&stuck, types::API_SERVER_LOAD_BALANCER_READY)
            .2
            .contains("cp-1:6443")
    );
    let not_ready = wait_cluster(&world, "c1", "Ready False", |c| {
        condition(c, types::READY).0 == "False"
    })
    .await;
    assert_eq!(condition(&not_ready, types::READY).1, reasons::MEMBER_STUCK);

    // A second machine whose member goes ERROR outranks the stuck one.
    world.cloud.clear_rules();
    world.cloud.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "cp-2".into(),
        effect: Effect::Error,
        times: None,
    });
    control_plane_machine(&world, "c1", "cp-2", "10.6.0.12").await;
    let member = eventually("the LB accepts a change", || async {
        world
            .admin
            .octavia()
            .create_member(&pool, &MemberSpec::new("cp-2", "10.6.0.12", 6443))
            .await
            .ok()
    })
    .await;
    assert_eq!(member.name, "cp-2");
    let error = wait_cluster(
        &world,
        "c1",
        "MemberError",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::MEMBER_ERROR,
        ),
    )
    .await;
    assert!(
        condition(&error, types::API_SERVER_LOAD_BALANCER_READY)
            .2
            .contains("cp-2:6443")
    );
    assert_eq!(condition(&error, types::READY).0, "False");
    world.stop_manager().await;
}

#[tokio::test]
async fn an_lb_in_error_is_reported_and_the_cluster_is_not_ready() {
    let world = World::start_with(
        Scenario {
            rules: vec![Rule {
                kind: ObjectKind::Loadbalancer,
                name: "*kubeapi".into(),
                effect: Effect::Error,
                times: None,
            }],
            ..Scenario::default()
        },
        WatchScope::default(),
    )
    .await;
    create_cluster(&world, "c1", cluster_spec()).await;
    let failed = wait_cluster(
        &world,
        "c1",
        "LoadBalancerError",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::LOAD_BALANCER_ERROR,
        ),
    )
    .await;
    assert!(!provisioned(&failed));
    let failed = wait_cluster(
        &world,
        "c1",
        "endpoint says so",
        has(
            types::API_ENDPOINT_READY,
            "False",
            reasons::LOAD_BALANCER_ERROR,
        ),
    )
    .await;
    assert_eq!(condition(&failed, types::READY).0, "False");
}

#[tokio::test]
async fn a_keystone_outage_and_a_rate_limit_storm_say_so_and_the_cluster_converges_afterwards() {
    let world = World::start().await;
    let fault = |scenario: Scenario| Scenario {
        timings: timings(),
        ..scenario
    };
    world.cloud.set_scenario(fault(Scenario {
        keystone_outages: vec![Outage {
            from: 0.0,
            until: f64::MAX,
        }],
        ..Scenario::default()
    }));
    create_cluster(&world, "c1", cluster_spec()).await;
    let troubled = wait_cluster(&world, "c1", "OpenStackUnavailable", |c| {
        condition(c, types::NETWORK_READY).1 == reasons::OPENSTACK_UNAVAILABLE
    })
    .await;
    assert_eq!(condition(&troubled, types::NETWORK_READY).0, "False");
    // Keystone back, but Neutron and Octavia answer 429 beyond five requests a second.
    let storm = |service: &str| RateLimitFault {
        service: Some(service.into()),
        above_per_second: Some(5),
        probability: None,
        retry_after: 1,
    };
    world.cloud.set_scenario(fault(Scenario {
        rate_limits: vec![storm("network"), storm("load-balancer")],
        ..Scenario::default()
    }));
    // About 60 requests at five a second per service, retried after each 429: slow by design,
    // and slower still when the whole suite shares two cores.
    let storm_wait = Duration::from_secs(120);
    wait_cluster_within(
        &world,
        "c1",
        "provisioned despite 429s",
        storm_wait,
        settled,
    )
    .await;
    assert!(
        world.cloud.request_log()["by_status"]["429"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "the storm was met"
    );
    assert_eq!(
        crate::server_controller::metric_sum(
            &world.registry,
            "controller_runtime_terminal_reconcile_errors_total"
        ),
        0.0,
        "trouble in the cloud is never terminal"
    );
}

/// CAPO's names join namespace and name with a hyphen, so cluster `x-c1` here and cluster
/// `c1` in namespace `<ns>-x` share every name. What the other made (marked as its own, as
/// capo-rs marks, or unmarked, as CAPO leaves it with no status of ours pointing at it) is
/// neither adopted nor deleted.
#[tokio::test]
async fn resources_of_another_cluster_whose_names_collide_are_neither_adopted_nor_deleted() {
    let world = World::start().await;
    let neutron = world.admin.neutron();
    let resource = format!("{}-x-c1", world.ns());
    let theirs = Owner::new("OpenStackCluster", &format!("{}-x", world.ns()), "c1");
    let network = neutron
        .create_network(&NetworkSpec {
            name: format!("k8s-clusterapi-cluster-{resource}"),
            admin_state_up: true,
            tags: vec![theirs.tag().to_owned()],
            ..NetworkSpec::default()
        })
        .await
        .unwrap();
    let group = neutron
        .create_security_group(
            &format!("k8s-cluster-{resource}-secgroup-controlplane"),
            "Cluster API managed group",
            &[],
        )
        .await
        .unwrap();
    let lb = world
        .admin
        .octavia()
        .create_load_balancer(&LoadBalancerSpec {
            name: format!("k8s-clusterapi-cluster-{resource}-kubeapi"),
            vip_network_id: Some(network.id.clone()),
            tags: vec![theirs.tag().to_owned()],
            ..LoadBalancerSpec::default()
        })
        .await
        .unwrap();
    let before = objects(&world);
    create_cluster(&world, "x-c1", cluster_spec()).await;
    let cluster = wait_cluster(&world, "x-c1", "provisioned", |c| {
        provisioned(c) && ready(c)
    })
    .await;
    let status = cluster.status.unwrap();
    assert_ne!(status.network.unwrap().id, network.id, "not their network");
    assert_ne!(
        status.api_server_managed_load_balancer.unwrap().id,
        lb.id,
        "not their load balancer"
    );
    assert_ne!(status.control_plane_security_group.unwrap().id, group.id);
    let after = objects(&world);
    for kind in ["networks", "loadbalancers", "security-groups"] {
        let made = after.get(kind).copied().unwrap_or(0) - before.get(kind).copied().unwrap_or(0);
        let expected = if kind == "security-groups" { 2 } else { 1 };
        assert_eq!(made, expected, "{kind}: {before:?} -> {after:?}");
    }

    delete_cluster(&world, "x-c1").await;
    assert_eq!(objects(&world), before, "ours gone, theirs left");
    neutron
        .get_network(&network.id)
        .await
        .expect("their network stays");
    let groups = neutron
        .list_security_groups(&Filter::default().with("id", group.id.clone()))
        .await
        .unwrap();
    assert_eq!(groups.len(), 1, "their group stays");
    world
        .admin
        .octavia()
        .get_load_balancer(&lb.id)
        .await
        .expect("their load balancer stays");
}

#[tokio::test]
async fn the_bastion_is_created_with_a_floating_ip_replaced_on_a_spec_change_and_removed() {
    let world = World::start().await;
    let mut spec = cluster_spec();
    spec["bastion"] = json!({
        "enabled": true,
        "spec": {"flavor": {"filter": {"name": "m1.small"}},
                 "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
                 "sshKeyName": "capo"},
    });
    create_cluster(&world, "c1", spec).await;
    let with_bastion = wait_cluster(&world, "c1", "a bastion with a floating IP", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.bastion.as_ref())
            .is_some_and(|b| b.floating_ip.is_some() && b.state.as_deref() == Some("ACTIVE"))
    })
    .await;
    let first = with_bastion.status.unwrap().bastion.unwrap();
    // A new flavor: the server cannot change, so it is replaced.
    let patch =
        json!({"spec": {"bastion": {"spec": {"flavor": {"filter": {"name": "m1.medium"}}}}}});
    clusters(&world)
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let replaced = wait_cluster(&world, "c1", "a new bastion server", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.bastion.as_ref())
            .is_some_and(|b| b.id.is_some() && b.id != first.id && b.floating_ip.is_some())
    })
    .await;
    assert!(
        replaced
            .status
            .unwrap()
            .bastion
            .unwrap()
            .floating_ip
            .is_some()
    );
    let patch = json!({"spec": {"bastion": {"enabled": false}}});
    clusters(&world)
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_cluster(&world, "c1", "no bastion", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.bastion.is_none() && s.bastion_security_group.is_none())
    })
    .await;
    let before_delete = world.cloud.object_counts();
    assert_eq!(
        before_delete.get("servers").copied().unwrap_or(0),
        0,
        "{before_delete:?}"
    );
    delete_cluster(&world, "c1").await;
}

#[tokio::test]
async fn a_cluster_without_a_load_balancer_gets_its_endpoint_from_a_floating_ip() {
    let world = World::start().await;
    let before = objects(&world);
    let mut spec = cluster_spec();
    spec["apiServer"] = json!({});
    create_cluster(&world, "c1", spec).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", |c| provisioned(c) && ready(c)).await;
    let host = cluster
        .spec
        .control_plane_endpoint
        .clone()
        .unwrap()
        .host
        .unwrap();
    assert!(host.starts_with("172.24.4."), "a floating IP: {host}");
    assert_eq!(
        condition(&cluster, types::API_SERVER_LOAD_BALANCER_READY).1,
        reasons::LOAD_BALANCER_DISABLED
    );
    delete_cluster(&world, "c1").await;
    assert_eq!(objects(&world), before);
}

/// Every OpenStackCluster (and cluster template) in CAPO's samples reconciles to provisioned.
#[tokio::test]
async fn every_capo_template_cluster_is_provisioned() {
    let Some(docs) = common::sample_documents() else {
        return;
    };
    let world = World::start().await;
    let public = public_network(&world).await.id;
    let mut names = Vec::new();
    for (index, (file, doc)) in docs.iter().enumerate() {
        let spec = match doc["kind"].as_str() {
            Some("OpenStackCluster") => doc["spec"].clone(),
            Some("OpenStackClusterTemplate") => doc["spec"]["template"]["spec"].clone(),
            _ => continue,
        };
        let mut spec = spec;
        spec["identityRef"] = json!({"name": "cloud-config", "cloudName": "sim"});
        if spec["externalNetwork"].is_object() {
            spec["externalNetwork"] = json!({"id": public});
        }
        let name = format!("t{index}");
        eprintln!("{file}: {} as {name}", doc["kind"]);
        create_cluster(&world, &name, spec).await;
        names.push(name);
    }
    assert!(!names.is_empty());
    for name in &names {
        wait_cluster(&world, name, "provisioned", provisioned).await;
    }
}

/// A load balancer locked by a member change (Octavia's own order: the LB stays
/// PENDING_UPDATE until its member settles) while the spec restricts the allowed CIDRs: the
/// cluster waits without an error storm, stays Ready, and updates the listener once it
/// unlocks, adding what the cluster itself needs (its subnet, the router).
#[tokio::test]
async fn a_locked_load_balancer_is_waited_for_without_errors_and_the_cluster_stays_ready() {
    let world = World::start().await;
    let mut locking = timings();
    locking.lb_waits_for_members = true;
    world.cloud.set_scenario(Scenario {
        timings: locking.clone(),
        rules: vec![Rule {
            kind: ObjectKind::Member,
            name: "cp-1".into(),
            effect: Effect::Delay(Delay::Fixed(4.0)),
            times: None,
        }],
        ..Scenario::default()
    });
    create_cluster(&world, "c1", cluster_spec()).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", settled).await;
    control_plane_member(&world, &pool(&cluster, 6443), "cp-1", "10.6.0.11").await;
    let patch =
        json!({"spec": {"apiServer": {"managedLoadBalancer": {"allowedCIDRs": ["192.0.2.0/24"]}}}});
    clusters(&world)
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let held = wait_cluster(
        &world,
        "c1",
        "the LB pending",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "False",
            reasons::LOAD_BALANCER_PENDING,
        ),
    )
    .await;
    assert!(
        ready(&held),
        "a busy LB is routine: {:?}",
        condition(&held, types::READY)
    );
    let applied = wait_cluster(
        &world,
        "c1",
        "the CIDRs applied and the member ACTIVE",
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.api_server_managed_load_balancer.as_ref())
                .is_some_and(|lb| lb.allowed_cidrs.len() == 3)
                && condition(c, types::API_SERVER_LOAD_BALANCER_READY).0 == "True"
        },
    )
    .await;
    let lb = applied
        .status
        .unwrap()
        .api_server_managed_load_balancer
        .unwrap();
    assert_eq!(lb.allowed_cidrs[0], "10.6.0.0/24", "{:?}", lb.allowed_cidrs);
    let listeners = world
        .admin
        .octavia()
        .list_listeners(&lb.id, None)
        .await
        .unwrap();
    assert_eq!(listeners[0].allowed_cidrs.as_ref(), Some(&lb.allowed_cidrs));
    let errors = crate::server_controller::metric_sum(
        &world.registry,
        "controller_runtime_reconcile_errors_total",
    );
    assert_eq!(errors, 0.0, "waiting on a busy LB is not an error");
}

/// A given network (by filter) without external connectivity: no router, no floating IP, the
/// endpoint is the VIP; deleting the cluster leaves the network it was given.
#[tokio::test]
async fn a_given_network_without_external_access_is_used_and_never_deleted() {
    let world = World::start().await;
    let spec = json!({
        "apiServer": {"managedLoadBalancer": {"enabled": true}, "enableFloatingIP": false},
        "enableExternalNetwork": false,
        "identityRef": {"name": "cloud-config", "cloudName": "sim"},
        "network": {"filter": {"name": "capo-net"}},
        "managedSecurityGroups": {},
    });
    let before = objects(&world);
    create_cluster(&world, "c1", spec).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", settled).await;
    let status = cluster.status.clone().unwrap();
    let network = status.network.unwrap();
    assert_eq!(network.name, "capo-net");
    assert_eq!(network.subnets[0].name, "capo-subnet");
    assert!(status.external_network.is_none());
    assert!(status.router.is_none());
    let lb = status.api_server_managed_load_balancer.unwrap();
    assert_eq!(
        lb.ip, lb.internal_ip,
        "no floating IP: the endpoint is the VIP"
    );
    assert!(lb.internal_ip.starts_with("10.6.0."), "{}", lb.internal_ip);
    assert_eq!(
        cluster.spec.control_plane_endpoint.unwrap().host.as_deref(),
        Some(lb.internal_ip.as_str())
    );
    delete_cluster(&world, "c1").await;
    assert_eq!(
        objects(&world),
        before,
        "the given network is still there, nothing else"
    );
}

/// The monitor settings may change: the health monitor follows, in place.
#[tokio::test]
async fn a_monitor_change_is_applied_in_place() {
    let world = World::start().await;
    create_cluster(&world, "c1", cluster_spec()).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", settled).await;
    let monitor = |c: &OpenStackCluster| {
        c.status
            .as_ref()
            .and_then(|s| s.api_server_managed_load_balancer.as_ref())
            .and_then(|lb| lb.pools.first())
            .and_then(|p| p.monitor_id.clone())
    };
    let id = monitor(&cluster).unwrap();
    let defaults = world.admin.octavia().get_health_monitor(&id).await.unwrap();
    assert_eq!(
        (
            defaults.delay,
            defaults.timeout,
            defaults.max_retries,
            defaults.max_retries_down
        ),
        (10, 5, 5, Some(3)),
        "CAPO's defaults"
    );
    let patch = json!({"spec": {"apiServer": {"managedLoadBalancer": {"monitor": {"delay": 20, "timeout": 7}}}}});
    clusters(&world)
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let changed = eventually("the monitor updated", || async {
        let now = world.admin.octavia().get_health_monitor(&id).await.ok()?;
        (now.delay == 20 && now.timeout == 7).then_some(now)
    })
    .await;
    assert_eq!(changed.id, id, "the same monitor, changed in place");
    wait_cluster(&world, "c1", "settled again", settled).await;
}

/// A provider that implements no health monitors (Octavia answers 501) gets its pools without
/// one, as CAPO does: a `SkippedCreateMonitor` warning, and the gate opens on the member's
/// provisioning status alone, where it would otherwise fail on every pass and never open.
/// Named as the provider (`c2`), whose one-request create carries the monitors, the 501
/// refuses that request whole, and the load balancer is made part by part instead.
#[tokio::test]
async fn a_provider_without_health_monitors_serves_without_one_and_the_gate_still_opens() {
    let mut world = World::start().await;
    world.cloud.set_providers_without_monitors(&["amphora"]);
    let mut named = cluster_spec();
    named["apiServer"]["managedLoadBalancer"]["provider"] = json!("amphora");
    create_cluster(&world, "c1", cluster_spec()).await;
    create_cluster(&world, "c2", named).await;
    let mut cluster = None;
    for name in ["c2", "c1"] {
        let provisioned = wait_cluster(&world, name, "provisioned", settled).await;
        let lb = provisioned
            .status
            .as_ref()
            .and_then(|s| s.api_server_managed_load_balancer.as_ref())
            .expect("its load balancer");
        assert!(
            !lb.pools.is_empty() && lb.pools.iter().all(|p| p.monitor_id.is_none()),
            "{name}: pools without a monitor: {lb:?}"
        );
        cluster = Some(provisioned);
    }
    let cluster = cluster.expect("c1");
    let warnings = world.warnings("SkippedCreateMonitor").await;
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("Provider 'amphora' does not support")),
        "{warnings:?}"
    );
    let pool = pool(&cluster, 6443);
    control_plane_member(&world, &pool, "cp-1", "10.6.0.11").await;
    wait_cluster(
        &world,
        "c1",
        "the gate open on provisioning status",
        has(
            types::API_SERVER_LOAD_BALANCER_READY,
            "True",
            reasons::READY,
        ),
    )
    .await;
    world.stop_manager().await;
}

/// Extra ports get their own listener and pool, each machine is wanted in every pool, and
/// the VIP and floating IP the spec names are the ones used.
#[tokio::test]
async fn additional_ports_fixed_and_floating_ips_are_as_the_spec_says() {
    let world = World::start().await;
    let mut spec = cluster_spec();
    spec["apiServer"] = json!({
        "managedLoadBalancer": {"enabled": true, "additionalPorts": [8443]},
        "fixedIP": "10.6.0.250",
        "floatingIP": "172.24.4.100",
    });
    create_cluster(&world, "c1", spec).await;
    let cluster = wait_cluster(&world, "c1", "provisioned", settled).await;
    let lb = cluster
        .status
        .as_ref()
        .unwrap()
        .api_server_managed_load_balancer
        .clone()
        .unwrap();
    assert_eq!(lb.internal_ip, "10.6.0.250");
    assert_eq!(lb.ip, "172.24.4.100");
    let ports: Vec<i32> = lb.pools.iter().map(|p| p.port).collect();
    assert_eq!(ports, [6443, 8443]);
    let groups = world
        .admin
        .neutron()
        .list_security_groups(&Filter::by_name(format!(
            "k8s-cluster-{}-c1-secgroup-controlplane",
            world.ns()
        )))
        .await
        .unwrap();
    assert!(
        groups[0]
            .security_group_rules
            .iter()
            .any(|r| r.port_range_min == Some(8443)),
        "the additional port is open on the control plane"
    );
    control_plane_machine(&world, "c1", "cp-1", "10.6.0.11").await;
    let missing = wait_cluster(&world, "c1", "MembersMissing in both pools", |c| {
        condition(c, types::API_SERVER_LOAD_BALANCER_READY)
            .2
            .contains("cp-1:8443")
    })
    .await;
    let members = &missing
        .status
        .unwrap()
        .api_server_managed_load_balancer
        .unwrap()
        .members;
    assert_eq!(members.len(), 2, "{members:?}");
    // The cluster waits for its machines before it deletes anything.
    clusters(&world)
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    let waiting = wait_cluster(&world, "c1", "waiting for its machines", |c| {
        condition(c, types::READY).2.contains("OpenStackMachines")
    })
    .await;
    assert!(
        waiting.status.unwrap().network.is_some(),
        "nothing deleted yet"
    );
    machines(&world)
        .delete("cp-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_cluster_gone(&world, "c1").await;
    let left = world
        .admin
        .neutron()
        .list_floating_ips(&Filter::default())
        .await
        .unwrap();
    assert!(
        left.iter()
            .any(|ip| ip.floating_ip_address == "172.24.4.100"),
        "a floating IP the spec named is the user's: kept"
    );
}

/// An OpenStackCluster annotated `cluster.x-k8s.io/managed-by` is its manager's: capo-rs
/// makes nothing for it and writes no status, while a cluster beside it is built; deleted, it
/// goes without a cloud call.
#[tokio::test]
async fn an_externally_managed_cluster_is_left_to_its_manager() {
    let world = World::start().await;
    let capi: Api<capo_api::capi::Cluster> = world.kube.api();
    let owner: capo_api::capi::Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "theirs", "namespace": world.ns()},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": "theirs"}}
    }))
    .unwrap();
    capi.create(&PostParams::default(), &owner).await.unwrap();
    let theirs: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": "theirs", "namespace": world.ns(),
                     "labels": {"cluster.x-k8s.io/cluster-name": "theirs"},
                     "annotations": {"cluster.x-k8s.io/managed-by": "someone-else"}},
        "spec": cluster_spec(),
    }))
    .unwrap();
    clusters(&world)
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    create_cluster(&world, "ours", cluster_spec()).await;
    wait_cluster(&world, "ours", "settled", settled).await;
    let theirs = clusters(&world).get("theirs").await.unwrap();
    assert!(
        theirs
            .status
            .as_ref()
            .is_none_or(|s| s.conditions.is_empty()),
        "no status written: {:?}",
        theirs.status
    );
    assert!(
        theirs.metadata.finalizers.is_none_or(|f| f.is_empty()),
        "no finalizer"
    );
    let networks = world.cloud.object_counts();
    clusters(&world)
        .delete("theirs", &DeleteParams::default())
        .await
        .unwrap();
    wait_cluster_gone(&world, "theirs").await;
    assert_eq!(
        world.cloud.object_counts(),
        networks,
        "nothing made or removed for it"
    );
    delete_cluster(&world, "ours").await;
}

/// An OpenStackCluster that no Cluster API Cluster owns yet (no owner, no cluster-name label)
/// builds nothing and says why, as CAPO (`controllers/openstackcluster_controller.go`
/// `Reconcile`, `util.GetOwnerCluster`, v0.14.7); once its Cluster claims it, it is built.
#[tokio::test]
async fn a_cluster_no_cluster_api_cluster_owns_builds_nothing_until_one_does() {
    let world = World::start().await;
    let before = world.cloud.object_counts();
    let early: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": "early", "namespace": world.ns()},
        "spec": cluster_spec(),
    }))
    .unwrap();
    clusters(&world)
        .create(&PostParams::default(), &early)
        .await
        .unwrap();
    let waiting = wait_cluster(
        &world,
        "early",
        "waiting for its Cluster",
        has(types::READY, "False", reasons::DEPENDENCY_MISSING),
    )
    .await;
    let (_, _, message) = condition(&waiting, types::READY);
    assert!(message.contains("no Cluster owns"), "{message}");
    assert_eq!(world.cloud.object_counts(), before, "nothing built");
    let capi: Api<capo_api::capi::Cluster> = world.kube.api();
    let owner: capo_api::capi::Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "early", "namespace": world.ns()},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": "early"}}
    }))
    .unwrap();
    capi.create(&PostParams::default(), &owner).await.unwrap();
    // As Cluster API's Cluster controller labels the infrastructure it references.
    let label = json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "early"}}});
    clusters(&world)
        .patch("early", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    wait_cluster(&world, "early", "built once its Cluster owns it", settled).await;
    delete_cluster(&world, "early").await;
}

/// A provider or flavor Octavia does not offer is refused before anything is made (CAPO
/// would make the load balancer with the defaults), naming what Octavia offers.
#[tokio::test]
async fn an_unknown_load_balancer_provider_or_flavor_is_refused_before_anything_is_made() {
    let world = World::start().await;
    for (name, field, value, offered) in [
        ("p1", "provider", "nonesuch", "amphora, ovn"),
        ("f1", "flavor", "nonesuch", "it offers"),
    ] {
        let mut spec = cluster_spec();
        spec["apiServer"]["managedLoadBalancer"][field] = json!(value);
        create_cluster(&world, name, spec).await;
        let cluster = wait_cluster(&world, name, "refused", |c| {
            condition(c, types::READY).1 == reasons::INVALID_SPEC
        })
        .await;
        let (_, _, message) = condition(&cluster, types::READY);
        assert!(
            message.contains("nonesuch") && message.contains(offered),
            "{message}"
        );
        let counts = objects(&world);
        assert_eq!(
            counts.get("loadbalancers").copied().unwrap_or_default(),
            0,
            "no load balancer made: {counts:?}"
        );
        delete_cluster(&world, name).await;
    }
}

/// The namespaced install (`deploy/namespaced/`): a manager whose ServiceAccount holds only
/// the Role of its watched namespace and the ClusterRole of cluster-scoped grants builds a
/// cluster and deletes it, on the real API server (whose RBAC refuses anything more), and
/// cannot read a Secret of another namespace.
#[tokio::test]
async fn real_kube_a_namespaced_install_builds_and_deletes_a_cluster_with_its_role_alone() {
    use crate::server_controller::{minimal_capi_crds, our_crds_and};
    let Some(real) = crate::kube_world::real_kube() else {
        return;
    };
    let kube =
        crate::kube_world::KubeWorld::real(real.clone(), &our_crds_and(minimal_capi_crds())).await;
    let mut world = World::prepare_on(kube, Scenario::default()).await;
    let manager = namespaced_manager(&world, &real.admin).await;
    // The Role is in force (the authorizer's cache has it) before the refusal below means
    // anything: Secrets of the watched namespace can be listed.
    let own: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(manager.clone(), world.ns());
    crate::server_controller::eventually("the Role in force", || async {
        own.list(&Default::default()).await.ok()
    })
    .await;
    let elsewhere: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(manager.clone(), "kube-system");
    match elsewhere.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("Secrets of another namespace are refused: {other:?}"),
    }
    world.kube.manager_client = manager;
    world.start_manager(WatchScope::default());
    let before = objects(&world);
    create_cluster(&world, "c1", cluster_spec()).await;
    wait_cluster(&world, "c1", "provisioned and Ready", settled).await;
    delete_cluster(&world, "c1").await;
    assert_eq!(objects(&world), before, "nothing left in the cloud");
    // The cluster-scoped grants are this test's own: they go with it.
    let name = format!("{}-cluster-scoped", world.ns());
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(world.client.clone());
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
        Api::all(world.client.clone());
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
}

/// A client of a fresh ServiceAccount of `world`'s namespace, granted what the namespaced
/// install grants capo-rs's for that namespace.
async fn namespaced_manager(world: &World, admin: &std::path::Path) -> kube::Client {
    use capo_provider::manager::manifests;
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let ns = world.ns().to_owned();
    let account = "namespaced-manager";
    let accounts: Api<ServiceAccount> = Api::namespaced(world.client.clone(), &ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
    accounts.create(&PostParams::default(), &sa).await.unwrap();
    let cluster_role = format!("{ns}-cluster-scoped");
    let rbac: Vec<Value> = manifests::namespaced_rbac(&ns)
        .into_iter()
        .map(|mut object| {
            if object["metadata"]["name"] == manifests::CLUSTER_SCOPED_ROLE {
                object["metadata"]["name"] = json!(cluster_role);
            }
            if object["roleRef"]["name"] == manifests::CLUSTER_SCOPED_ROLE {
                object["roleRef"]["name"] = json!(cluster_role);
            }
            if object.get("subjects").is_some() {
                object["subjects"] =
                    json!([{"kind": "ServiceAccount", "name": account, "namespace": ns}]);
            }
            object
        })
        .collect();
    crate::kube_world::apply_crds(&world.client, &rbac).await;
    let token = accounts
        .create_token_request(account, &PostParams::default(), &TokenRequest::default())
        .await
        .unwrap()
        .status
        .expect("a token")
        .token;
    let kubeconfig = kube::config::Kubeconfig::read_from(admin).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    kube::Client::try_from(config).unwrap()
}

/// Status writes that time out (504, as kube-apiserver answers them while etcd is stopped)
/// hold a cluster back and no more: what a reconcile made before its status write failed is
/// found again, not made twice; the reconciles are counted as errors and retried with
/// backoff, and the cluster comes out as one built without the fault.
#[tokio::test]
async fn status_writes_that_time_out_delay_a_cluster_and_make_nothing_twice() {
    use crate::server_controller::{metric_sum, minimal_capi_crds};
    let clean = World::start_sim().await;
    create_cluster(&clean, "c1", cluster_spec()).await;
    wait_cluster(&clean, "c1", "provisioned and Ready", settled).await;
    let wanted = objects(&clean);

    let mut world = World::prepare_sim(Scenario::default(), minimal_capi_crds()).await;
    let faults = 6;
    let sim = world.kube.simulator();
    sim.fail_status_writes(faults, Duration::from_millis(100));
    // The manager's client as production builds it (kube's own retries off).
    let config = kube::Config::new(sim.url().parse().unwrap());
    world.kube.manager_client =
        capo_provider::manager::kube_client::client(config, &Default::default()).unwrap();
    world.start_manager(WatchScope::default());
    create_cluster(&world, "c1", cluster_spec()).await;
    wait_cluster(&world, "c1", "provisioned and Ready", settled).await;
    let sim = world.kube.simulator();
    assert_eq!(sim.status_write_faults_left(), 0, "every fault was met");
    let timed_out = sim.requests().iter().filter(|r| r.status == 504).count();
    assert_eq!(timed_out, faults as usize);
    assert_eq!(objects(&world), wanted, "nothing made twice");
    let errors = metric_sum(&world.registry, "controller_runtime_reconcile_errors_total");
    assert!(
        errors >= f64::from(faults),
        "each failed write is a reconcile error: {errors}"
    );
}
