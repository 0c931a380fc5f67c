//! OpenStackFloatingIPPool and Cluster API's IPAM contract, end to end on the real OpenStack
//! tier and on the simulator (see [`crate::real_provider`]): claims answered with distinct
//! addresses (CAPO #1869), `maxIPs`, the reclaim policies, a floating IP the pool allocated but
//! never recorded (a leak in CAPO), and a control-plane machine whose address comes from a
//! pool.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use capo_api::OpenStackFloatingIPPool;
use capo_api::OpenStackServer;
use capo_api::capo_conditions::capo_types;
use capo_api::ipam::{self, IPAddress, IPAddressClaim};
use capo_provider::cloud::neutron::{Filter, FloatingIp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::real_cloud::{PASSWORD_CLOUD, REAL, census, fault, real_cloud};
use crate::real_provider::{
    E2e, SECRET, WAIT, actor, assert_nothing_left, both, cluster_spec, create_cluster_with,
    delete_cluster, on_real, on_sim, plane, spent, unique_cluster_name, wait_for, wait_provisioned,
};

fn pools(e2e: &E2e) -> Api<OpenStackFloatingIPPool> {
    e2e.kube.api()
}

fn claims(e2e: &E2e) -> Api<IPAddressClaim> {
    e2e.kube.api()
}

fn addresses(e2e: &E2e) -> Api<IPAddress> {
    e2e.kube.api()
}

async fn create_pool(e2e: &E2e, name: &str, spec: Value) {
    let mut full = json!({
        "identityRef": {"name": SECRET, "cloudName": e2e.cloud_name},
        "floatingIPNetwork": {"id": e2e.external_network},
    });
    for (key, value) in spec.as_object().expect("an object") {
        full[key] = value.clone();
    }
    let pool: OpenStackFloatingIPPool = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "OpenStackFloatingIPPool",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": full,
    }))
    .expect("a pool");
    pools(e2e)
        .create(&PostParams::default(), &pool)
        .await
        .expect("pool created");
}

async fn create_claim(e2e: &E2e, name: &str, pool: &str) {
    let claim: IPAddressClaim = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": {"poolRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                              "kind": "OpenStackFloatingIPPool", "name": pool}},
    }))
    .expect("a claim");
    claims(e2e)
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim created");
}

/// The address the pool gave `claim`, once it has.
async fn answer(e2e: &E2e, claim: &str) -> String {
    let answered = wait_for(
        &claims(e2e),
        claim,
        "answered",
        WAIT,
        |c: &IPAddressClaim| c.address_name().is_some(),
    )
    .await;
    let name = answered.address_name().expect("answered").to_owned();
    let address = addresses(e2e).get(&name).await.expect("its IPAddress");
    assert_eq!(address.spec.prefix, 32);
    assert_eq!(address.spec.claim_ref.name, claim);
    assert!(
        address
            .finalizers()
            .contains(&ipam::ADDRESS_FINALIZER.to_owned())
    );
    address.spec.address
}

async fn delete_claim(e2e: &E2e, name: &str) {
    claims(e2e)
        .delete(name, &DeleteParams::default())
        .await
        .expect("claim deleted");
}

/// Waits until no IPAddress answers `claim` (the pool released it).
async fn released(e2e: &E2e, claim: &str) {
    let gone =
        kube::runtime::wait::await_condition(addresses(e2e), claim, |a: Option<&IPAddress>| {
            a.is_none()
        });
    tokio::time::timeout(WAIT, gone)
        .await
        .expect("the IPAddress released in time")
        .expect("watch");
}

async fn floating_ip(e2e: &E2e, address: &str) -> Option<FloatingIp> {
    crate::topologies::floating_ip(&e2e.tenant, address).await
}

/// Deletes the pool and waits for it to go (its floating IPs released).
async fn delete_pool(e2e: &E2e, pool: &str) {
    pools(e2e)
        .delete(pool, &DeleteParams::default())
        .await
        .expect("pool deleted");
    crate::real_provider::wait_gone(&pools(e2e), pool, WAIT).await;
}

fn pool_is(
    reason: &'static str,
) -> impl Fn(&OpenStackFloatingIPPool) -> bool + Send + Sync + 'static {
    move |pool| {
        pool.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == reason)
        })
    }
}

/// Five claims at once on a pool that holds two addresses already (one preallocated, one it
/// allocated but whose IPAddress a crash never wrote, found by its tag) and may hold four:
/// four distinct answers, the fifth waits; one released (Retain) goes to the fifth. Then
/// everything goes: the pool deletes what it allocated, the preallocated one stays.
async fn claims_on_a_pool(e2e: &mut E2e) {
    let pool = unique_cluster_name("pool");
    let before = census(&e2e.tenant).await;
    let neutron = e2e.tenant.neutron();
    let given = neutron
        .create_floating_ip(&e2e.external_network, None, "preallocated for a pool")
        .await
        .expect("a preallocated floating IP");
    let forgotten = neutron
        .create_tagged_floating_ip(
            &e2e.external_network,
            None,
            None,
            "allocated by a pool that crashed before recording it",
            &[ipam::pool_tag(&pool)],
        )
        .await
        .expect("a tagged floating IP");
    create_pool(
        e2e,
        &pool,
        json!({"preAllocatedFloatingIPs": [given.floating_ip_address], "maxIPs": 4,
               "reclaimPolicy": "Retain"}),
    )
    .await;
    let names: Vec<String> = (0..5).map(|i| format!("{pool}-c{i}")).collect();
    let requests_before = e2e.requests();
    let started = Instant::now();
    for name in &names {
        create_claim(e2e, name, &pool).await;
    }
    let mut answers = Vec::new();
    for name in &names[..4] {
        answers.push(answer(e2e, name).await);
    }
    let answered_in = started.elapsed();
    let requests = spent(&requests_before, &e2e.requests());
    let distinct: BTreeSet<&String> = answers.iter().collect();
    assert_eq!(distinct.len(), 4, "{}: {answers:?}", e2e.label);
    assert!(
        answers.contains(&given.floating_ip_address),
        "{}",
        e2e.label
    );
    assert!(
        answers.contains(&forgotten.floating_ip_address),
        "{}: the forgotten one is handed out, not leaked",
        e2e.label
    );
    let full = wait_for(
        &pools(e2e),
        &pool,
        "at maxIPs",
        WAIT,
        pool_is("MaxIPsReached"),
    )
    .await;
    let status = full.status.expect("a status");
    assert_eq!(status.claimed_ips.len(), 4, "{}", e2e.label);
    assert!(
        claims(e2e)
            .get(&names[4])
            .await
            .unwrap()
            .address_name()
            .is_none()
    );

    // Retain: the released address goes back to the pool, and to the waiting claim.
    let first = answers[0].clone();
    delete_claim(e2e, &names[0]).await;
    let last = answer(e2e, &names[4]).await;
    assert_eq!(last, first, "{}: the retained address is reused", e2e.label);
    assert!(
        floating_ip(e2e, &first).await.is_some(),
        "{}: retained",
        e2e.label
    );

    for name in &names[1..] {
        delete_claim(e2e, name).await;
    }
    for name in &names {
        released(e2e, name).await;
    }
    delete_pool(e2e, &pool).await;
    assert!(
        floating_ip(e2e, &given.floating_ip_address).await.is_some(),
        "{}: the preallocated address is the user's",
        e2e.label
    );
    for ip in answers
        .iter()
        .filter(|ip| **ip != given.floating_ip_address)
    {
        assert!(
            floating_ip(e2e, ip).await.is_none(),
            "{}: {ip} deleted",
            e2e.label
        );
    }
    neutron
        .delete_floating_ip(&given.id)
        .await
        .expect("the preallocated one deleted");
    assert_nothing_left(e2e, &before).await;
    eprintln!(
        "FIGURES pool {}: 5 claims (pool creation included), 4 answered in {:.2} s, OpenStack requests {requests}",
        e2e.label,
        answered_in.as_secs_f64(),
    );
}

both!(
    claims_on_a_pool,
    PASSWORD_CLOUD,
    false,
    real_a_pool_answers_claims_with_distinct_addresses_within_max_ips_and_releases_them,
    sim_a_pool_answers_claims_with_distinct_addresses_within_max_ips_and_releases_them
);

/// The same contract, with Cluster API's own IPAM CRDs serving the claims and addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_answers_claims_through_cluster_apis_real_ipam_crds() {
    let Some(dir) = crate::common::shared_reference("capi/crds", "the real IPAM CRD check") else {
        return;
    };
    let files = [
        "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
        "ipam.cluster.x-k8s.io_ipaddresses.yaml",
    ];
    if files.iter().any(|f| !dir.join(f).exists()) {
        eprintln!(
            "NOTICE: Cluster API's IPAM CRDs are not in {}; skipping",
            dir.display()
        );
        return;
    }
    let crds = files
        .iter()
        .map(|f| serde_saphyr::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap())
        .collect();
    let mut e2e = E2e::simulated_with_ipam(false, crds).await;
    let outcome = tokio::time::timeout(Duration::from_secs(600), claims_on_a_pool(&mut e2e)).await;
    e2e.stop_manager(true).await;
    outcome.expect("within 10 minutes");
}

/// A control-plane machine whose address comes from a pool (`floatingIPPoolRef`), reclaim
/// policy Delete: the server claims, the pool answers, the address is attached to the
/// server's port before the machine is released; deleting the cluster deletes the address.
async fn a_machine_from_a_pool(e2e: &mut E2e) {
    let name = unique_cluster_name("fippool");
    let before = census(&e2e.tenant).await;
    let pool = format!("{name}-pool");
    create_pool(e2e, &pool, json!({"reclaimPolicy": "Delete"})).await;
    let mut spec = cluster_spec(e2e.cloud_name, &e2e.external_network);
    let spec_map = spec.as_object_mut().expect("an object");
    spec_map.remove("bastion");
    spec_map.insert(
        "apiServer".into(),
        json!({"enableFloatingIP": false, "fixedIP": "10.6.0.10"}),
    );
    create_cluster_with(e2e, &name, &name, spec).await;
    wait_provisioned(e2e, &name).await;
    let actor = actor(e2e);
    let mut plane = plane(&name, 1);
    plane.template.floating_ip_pool_ref = Some(capo_api::common::TypedLocalObjectReference {
        api_group: Some("infrastructure.cluster.x-k8s.io".into()),
        kind: "OpenStackFloatingIPPool".into(),
        name: pool.clone(),
    });
    let machines = actor
        .scale_control_plane(&plane)
        .await
        .expect("a control-plane machine, released");
    let machine = e2e.machines().get(&machines[0]).await.expect("the machine");
    let port = machine
        .status
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.ports.first())
        .map(|p| p.id.clone())
        .expect("a port");
    let servers: Api<OpenStackServer> = e2e.kube.api();
    let server = servers
        .list(&ListParams::default())
        .await
        .expect("servers")
        .items
        .into_iter()
        .find(|s| s.spec.floating_ip_pool_ref.is_some())
        .expect("the machine's server");
    let condition = server.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == capo_types::FLOATING_ADDRESS_FROM_POOL_READY)
    });
    assert_eq!(
        condition.map(|c| c.status.as_str()),
        Some("True"),
        "{}: {condition:?}",
        e2e.label
    );
    let claim = ipam::server_claim_name(&server.name_any());
    let address = answer(e2e, &claim).await;
    let attached = floating_ip(e2e, &address).await.expect("the floating IP");
    assert_eq!(
        attached.port_id.as_deref(),
        Some(port.as_str()),
        "{}",
        e2e.label
    );
    let status = pools(e2e).get(&pool).await.unwrap().status.unwrap();
    assert_eq!(
        status.claimed_ips,
        std::slice::from_ref(&address),
        "{}",
        e2e.label
    );

    // A claim deleted without cascading (`--cascade=orphan`) leaves its IPAddress to nobody:
    // the pool deletes it, and its address is released all the same.
    let stray = format!("{name}-stray");
    create_claim(e2e, &stray, &pool).await;
    let stray_address = answer(e2e, &stray).await;
    claims(e2e)
        .delete(&stray, &DeleteParams::orphan())
        .await
        .expect("claim deleted, its IPAddress orphaned");
    released(e2e, &stray).await;
    assert!(
        floating_ip(e2e, &stray_address).await.is_none(),
        "{}: the orphaned address is released",
        e2e.label
    );

    delete_cluster(e2e, Some(&actor), &name).await;
    actor.stop().await;
    released(e2e, &claim).await;
    assert!(
        floating_ip(e2e, &address).await.is_none(),
        "{}: reclaim policy Delete",
        e2e.label
    );
    delete_pool(e2e, &pool).await;
    assert_nothing_left(e2e, &before).await;
    assert_every_pool_grant_used(e2e);
}

/// Every RBAC grant for pools and IPAM was sent to the API server (the demo sends none):
/// the machine's life from a pool uses them all.
fn assert_every_pool_grant_used(e2e: &E2e) {
    // The real server keeps no request log: there RBAC refuses a grant missing, and this
    // check, on the simulator, a grant too many.
    let Some(log) = e2e.kube_requests() else {
        return;
    };
    let sent: BTreeSet<(String, String, String)> = log
        .iter()
        .map(|r| (r.verb.clone(), r.group.clone(), r.resource.clone()))
        .collect();
    let unused: Vec<_> = crate::packaging::used_by_floating_ip_pools()
        .into_iter()
        .filter(|grant| !sent.contains(grant))
        .collect();
    assert!(
        unused.is_empty(),
        "{}: granted, never sent: {unused:?}",
        e2e.label
    );
}

both!(
    a_machine_from_a_pool,
    PASSWORD_CLOUD,
    false,
    real_a_machine_gets_its_floating_ip_from_a_pool_and_gives_it_back,
    sim_a_machine_gets_its_floating_ip_from_a_pool_and_gives_it_back
);

/// A server whose network has no router to the pool's network (CAPO #1827 and #1632: an
/// address allocated and never attached, again at every reconcile). The pool allocates once
/// per claim, however often the attach is retried; the server says why it cannot attach; and
/// deleting it gives the address back.
async fn an_unroutable_server(e2e: &mut E2e) {
    let name = unique_cluster_name("noroute");
    let before = census(&e2e.tenant).await;
    let pool = format!("{name}-pool");
    create_pool(e2e, &pool, json!({"reclaimPolicy": "Delete"})).await;
    let server: OpenStackServer = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "OpenStackServer",
        "metadata": {"name": name, "namespace": e2e.ns()},
        "spec": {
            "flavor": crate::real_provider::FLAVOR,
            "image": {"filter": {"name": crate::real_provider::IMAGE}},
            "sshKeyName": crate::real_provider::KEY_PAIR,
            "identityRef": {"name": SECRET, "cloudName": e2e.cloud_name},
            "ports": [{"network": {"filter": {"name": crate::real_provider::TENANT_NETWORK}}}],
            "floatingIPPoolRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                  "kind": "OpenStackFloatingIPPool", "name": pool},
        }
    }))
    .expect("OpenStackServer");
    e2e.servers()
        .create(&PostParams::default(), &server)
        .await
        .expect("OpenStackServer created");
    let refused = |s: &OpenStackServer| {
        s.status.as_ref().is_some_and(|st| {
            st.conditions.iter().any(|c| {
                c.type_ == capo_types::FLOATING_ADDRESS_FROM_POOL_READY
                    && c.reason == capo_api::capo_conditions::capo_reasons::FLOATING_IP_ERROR
            })
        })
    };
    let failing = wait_for(&e2e.servers(), &name, "refused", WAIT, refused).await;
    let message = failing
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == capo_types::FLOATING_ADDRESS_FROM_POOL_READY)
        })
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("reaches network"),
        "{}: {message}",
        e2e.label
    );
    // Three more tries, each woken by a change to the server.
    for round in 1..=3 {
        let attempts = attach_attempts(e2e);
        let bump = json!({"metadata": {"annotations": {"capo-rs.test/round": round.to_string()}}});
        e2e.servers()
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&bump),
            )
            .await
            .expect("annotated");
        let retried = async {
            while attach_attempts(e2e) <= attempts {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(WAIT, retried)
            .await
            .expect("tried again");
    }
    let created = e2e
        .request_counts()
        .get("floating_ip_create")
        .copied()
        .unwrap_or_default();
    assert_eq!(created, 1, "{}: one address for one claim", e2e.label);
    let tagged = Filter {
        tags: vec![ipam::pool_tag(&pool)],
        ..Filter::default()
    };
    let held = e2e
        .tenant
        .neutron()
        .list_floating_ips(&tagged)
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "{}: {held:?}", e2e.label);
    assert_eq!(held[0].port_id, None, "{}", e2e.label);

    e2e.servers()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("server deleted");
    crate::real_provider::wait_gone(&e2e.servers(), &name, WAIT).await;
    released(e2e, &ipam::server_claim_name(&name)).await;
    delete_pool(e2e, &pool).await;
    assert_nothing_left(e2e, &before).await;
}

/// Attempts to attach a floating IP the manager made.
fn attach_attempts(e2e: &E2e) -> u64 {
    e2e.request_counts()
        .get("floating_ip_update")
        .copied()
        .unwrap_or_default()
}

both!(
    an_unroutable_server,
    PASSWORD_CLOUD,
    false,
    real_an_unroutable_server_holds_one_pool_address_says_why_and_gives_it_back,
    sim_an_unroutable_server_holds_one_pool_address_says_why_and_gives_it_back
);
