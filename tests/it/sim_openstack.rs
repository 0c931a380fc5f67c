//! The simulated OpenStack: conformance with the recorded Octavia responses, the cloud layer
//! through its Keystone, and each kind of injected fault.

use std::time::Duration;

use capo_provider::cloud::cinder::VolumeSpec;
use capo_provider::cloud::neutron::Filter;
use capo_provider::cloud::octavia::{
    ListenerSpec, LoadBalancerSpec, MemberSpec, OperatingStatus, ProvisioningStatus,
};
use capo_provider::cloud::{CloudClient, CloudCredentials, CloudError, CloudOptions, Clouds};
use capo_sim::openstack::{
    CloudSettings, Delay, Effect, ObjectKind, OpenStackSim, OpenStackSimConfig, Outage,
    RateLimitFault, Rule, Scenario, ServerErrorFault, Timings,
};
use prometheus::Registry;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn sample(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/octavia")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Fast, fixed timings: the member finishes after its load balancer (AmphoraV2).
fn quick_timings() -> Timings {
    Timings {
        lb_create: Delay::Fixed(0.10),
        lb_update: Delay::Fixed(0.05),
        lb_delete: Delay::Fixed(0.05),
        child_create: Delay::Fixed(0.05),
        member_create: Delay::Fixed(0.15),
        member_update: Delay::Fixed(0.10),
        member_delete: Delay::Fixed(0.10),
        member_online: Delay::Fixed(0.10),
        server_build: Delay::Fixed(0.10),
        server_delete: Delay::Fixed(0.10),
        volume_create: Delay::Fixed(0.10),
        volume_delete: Delay::Fixed(0.10),
        lb_waits_for_members: false,
    }
}

async fn start(heartbeats: bool, scenario: Scenario) -> OpenStackSim {
    OpenStackSim::start(OpenStackSimConfig {
        settings: CloudSettings {
            heartbeats,
            ..CloudSettings::default()
        },
        scenario,
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap()
}

fn quick() -> Scenario {
    Scenario {
        seed: Some(1),
        timings: quick_timings(),
        ..Scenario::default()
    }
}

/// Raw HTTP with a token from the simulator's Keystone.
struct Raw {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Raw {
    async fn new(sim: &OpenStackSim) -> Self {
        let http = reqwest::Client::new();
        let body = json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": "demo", "password": "secret", "domain": {"name": "Default"}}}}}});
        let response = http
            .post(format!("{}/auth/tokens", sim.auth_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let token = response.headers()["x-subject-token"]
            .to_str()
            .unwrap()
            .to_owned();
        Raw {
            http,
            base: sim.url(),
            token,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("x-auth-token", &self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Polls `path` until `pointer` reads `want` (or 5 s pass).
    async fn wait_for(&self, path: &str, pointer: &str, want: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (_, body) = self.get(path).await;
            if body.pointer(pointer).and_then(Value::as_str) == Some(want) {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} {pointer} never became {want}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Same keys at every level (arrays: their first elements), and the same status values.
fn assert_shape(context: &str, ours: &Value, real: &Value) {
    match (ours, real) {
        (Value::Object(a), Value::Object(b)) => {
            let mut ka: Vec<&String> = a.keys().collect();
            let mut kb: Vec<&String> = b.keys().collect();
            ka.sort();
            kb.sort();
            assert_eq!(ka, kb, "{context}: key sets differ");
            for (key, value) in b {
                if key.ends_with("_status") {
                    assert_eq!(&a[key], value, "{context}.{key}");
                }
                if value.is_object() || value.is_array() {
                    assert_shape(&format!("{context}.{key}"), &a[key], value);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if let (Some(x), Some(y)) = (a.first(), b.first()) {
                assert_shape(&format!("{context}[0]"), x, y);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn octavia_conformance_with_recorded_responses() {
    // No-op drivers send no heartbeats: that is what the recordings show.
    let sim = start(false, quick()).await;
    let raw = Raw::new(&sim).await;
    let (_, subnets) = raw.get("/network/v2.0/subnets").await;
    let subnet = subnets["subnets"][0]["id"].as_str().unwrap().to_owned();

    let (status, lb) = raw
        .post(
            "/load-balancer/v2/lbaas/loadbalancers",
            json!({"loadbalancer": {"name": "lb-ex", "vip_subnet_id": subnet}}),
        )
        .await;
    assert_eq!(status, 201);
    assert_shape(
        "lb create",
        &lb,
        &sample("loadbalancer_create_response.json"),
    );
    let lb_id = lb["loadbalancer"]["id"].as_str().unwrap().to_owned();
    let lb_path = format!("/load-balancer/v2/lbaas/loadbalancers/{lb_id}");
    let listener_409 = raw.post("/load-balancer/v2/lbaas/listeners", json!({"listener": {"name": "li-ex", "loadbalancer_id": lb_id, "protocol": "HTTP", "protocol_port": 80}})).await;
    assert_eq!(listener_409.0, 409, "a change while PENDING_CREATE");
    assert_eq!(
        listener_409.1["faultstring"],
        format!("Load Balancer {lb_id} is immutable and cannot be updated.")
    );
    let active = raw
        .wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    assert_shape("lb active", &active, &sample("loadbalancer_active.json"));

    let (status, listener) = raw.post("/load-balancer/v2/lbaas/listeners", json!({"listener": {"name": "li-ex", "loadbalancer_id": lb_id, "protocol": "HTTP", "protocol_port": 80}})).await;
    assert_eq!(status, 201);
    assert_shape(
        "listener create",
        &listener,
        &sample("listener_create_response.json"),
    );
    let listener_id = listener["listener"]["id"].as_str().unwrap().to_owned();
    raw.wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    let (status, pool) = raw.post("/load-balancer/v2/lbaas/pools", json!({"pool": {"name": "pool-ex", "listener_id": listener_id, "protocol": "HTTP", "lb_algorithm": "ROUND_ROBIN"}})).await;
    assert_eq!(status, 201);
    assert_shape("pool create", &pool, &sample("pool_create_response.json"));
    let pool_id = pool["pool"]["id"].as_str().unwrap().to_owned();
    let pool_path = format!("/load-balancer/v2/lbaas/pools/{pool_id}");
    let pool_active = raw
        .wait_for(&pool_path, "/pool/provisioning_status", "ACTIVE")
        .await;
    assert_shape("pool active", &pool_active, &sample("pool_active.json"));
    let full = raw.get(&lb_path).await.1;
    assert_shape(
        "lb with children",
        &full,
        &sample("loadbalancer_active_full.json"),
    );

    let members = format!("{pool_path}/members");
    let (status, member) = raw.post(&members, json!({"member": {"name": "m1", "address": "192.0.2.10", "protocol_port": 8080, "subnet_id": subnet}})).await;
    assert_eq!(status, 201);
    assert_shape(
        "member create",
        &member,
        &sample("member_create_response.json"),
    );
    let member_id = member["member"]["id"].as_str().unwrap().to_owned();
    // While the LB is PENDING_UPDATE: the real 409, the real pending list and status tree.
    let (status, busy) = raw
        .post(
            &members,
            json!({"member": {"name": "m2", "address": "192.0.2.20", "protocol_port": 8080}}),
        )
        .await;
    assert_eq!(status, 409);
    assert_shape(
        "409 while pending",
        &busy,
        &sample("member_create_while_lb_pending_update.json")["body"],
    );
    assert_eq!(
        busy["faultstring"],
        format!("Pool {pool_id} is immutable and cannot be updated.")
    );
    assert_shape(
        "member list pending",
        &raw.get(&members).await.1,
        &sample("member_list_while_pending.json"),
    );
    assert_shape(
        "status tree pending",
        &raw.get(&format!("{lb_path}/status")).await.1,
        &sample("status_tree_while_pending.json"),
    );

    // AmphoraV2: the LB is ACTIVE again while the member is still PENDING_CREATE.
    raw.wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    let member_path = format!("{members}/{member_id}");
    assert_eq!(
        raw.get(&member_path).await.1["member"]["provisioning_status"],
        "PENDING_CREATE"
    );
    let member_active = raw
        .wait_for(&member_path, "/member/provisioning_status", "ACTIVE")
        .await;
    assert_shape(
        "member active",
        &member_active,
        &sample("member_active.json"),
    );
    assert_shape(
        "member list",
        &raw.get(&members).await.1,
        &sample("member_list_active.json"),
    );
    assert_shape(
        "status tree",
        &raw.get(&format!("{lb_path}/status")).await.1,
        &sample("status_tree_active.json"),
    );

    let errors = sample("error_samples.json");
    let (status, duplicate) = raw
        .post(
            &members,
            json!({"member": {"name": "dup", "address": "192.0.2.10", "protocol_port": 8080}}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(duplicate, errors["member_duplicate"]["body"]);
    let (status, bad) = raw
        .post(
            &members,
            json!({"member": {"address": "not-an-ip", "protocol_port": 80}}),
        )
        .await;
    assert_eq!((status, &bad), (400, &errors["member_bad_address"]["body"]));
    let unknown = "00000000-0000-0000-0000-000000000000";
    let (status, body) = raw
        .get(&format!("/load-balancer/v2/lbaas/pools/{unknown}/members"))
        .await;
    assert_eq!(
        (status, &body),
        (404, &errors["member_list_unknown_pool"]["body"])
    );
    let (status, body) = raw.get(&format!("{members}/{unknown}")).await;
    assert_eq!(
        (status, &body),
        (404, &errors["member_get_unknown_member"]["body"])
    );
    let (status, body) = raw
        .get(&format!(
            "/load-balancer/v2/lbaas/loadbalancers/{unknown}/status"
        ))
        .await;
    assert_eq!(
        (status, &body),
        (404, &errors["status_tree_unknown_lb"]["body"])
    );

    // Delete: 204, PENDING_DELETE, then 404.
    let (status, _) = raw.call(reqwest::Method::DELETE, &member_path, None).await;
    assert_eq!(status, 204);
    assert_shape(
        "member pending delete",
        &raw.get(&member_path).await.1,
        &sample("member_get_while_pending_delete.json"),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let gone = loop {
        let (status, body) = raw.get(&member_path).await;
        if status == 404 {
            break body;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_shape("member 404", &gone, &sample("member_get_404.json")["body"]);

    // Injected ERROR: the member ends in ERROR, the LB back in ACTIVE.
    raw.wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    let (status, _) = raw
        .post(
            &members,
            json!({"member": {"name": "slow-1", "address": "192.0.2.201", "protocol_port": 81}}),
        )
        .await;
    assert_eq!(status, 201);
    raw.wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    sim.add_rule(Rule {
        kind: ObjectKind::Member,
        name: "bad-*".into(),
        effect: Effect::Error,
        times: None,
    });
    let (_, bad) = raw
        .post(
            &members,
            json!({"member": {"name": "bad-1", "address": "192.0.2.202", "protocol_port": 81}}),
        )
        .await;
    let bad_path = format!("{members}/{}", bad["member"]["id"].as_str().unwrap());
    let errored = raw
        .wait_for(&bad_path, "/member/provisioning_status", "ERROR")
        .await;
    assert_shape(
        "member error",
        &errored,
        &sample("member_error_via_fault_injection.json"),
    );
    raw.wait_for(&lb_path, "/loadbalancer/provisioning_status", "ACTIVE")
        .await;
    let tree = raw.get(&format!("{lb_path}/status")).await.1;
    assert_shape(
        "status tree with error",
        &tree,
        &sample("status_tree_with_error_member.json"),
    );
}

async fn connect(sim: &OpenStackSim, cloud: &str) -> (CloudClient, Registry) {
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let credentials = CloudCredentials {
        clouds_yaml: sim.clouds_yaml(),
        cacert: None,
        cloud_name: cloud.into(),
        region: None,
    };
    (clouds.connect(&credentials).await.unwrap(), registry)
}

#[tokio::test]
async fn the_cloud_layer_drives_the_simulator_through_keystone() {
    let sim = start(true, quick()).await;
    for cloud in ["sim", "sim-appcred"] {
        let (client, _) = connect(&sim, cloud).await;
        let subnets = client
            .neutron()
            .list_subnets(&Default::default())
            .await
            .unwrap();
        let lb = client
            .octavia()
            .create_load_balancer(&LoadBalancerSpec {
                name: format!("{cloud}-kubeapi"),
                vip_subnet_id: Some(subnets[0].id.clone()),
                tags: vec!["cluster-c1".into()],
                ..LoadBalancerSpec::default()
            })
            .await
            .unwrap();
        assert_eq!(lb.provisioning_status, ProvisioningStatus::PendingCreate);
        let busy = client
            .octavia()
            .create_listener(&ListenerSpec {
                name: "l".into(),
                loadbalancer_id: lb.id.clone(),
                protocol: "TCP".into(),
                protocol_port: 6443,
                ..ListenerSpec::default()
            })
            .await
            .unwrap_err();
        assert!(matches!(busy, CloudError::Busy(_)), "{busy:?}");
        let found = client
            .octavia()
            .list_load_balancers(&capo_provider::cloud::octavia::LoadBalancerFilter {
                name: None,
                tags: vec!["cluster-c1".into()],
            })
            .await
            .unwrap();
        assert!(found.iter().any(|l| l.id == lb.id));
    }
    assert!(sim.request_count("identity token_create") >= 2);
}

#[tokio::test]
async fn expired_tokens_get_401_and_the_client_reauthenticates() {
    let mut scenario = quick();
    scenario.timings = quick_timings();
    let sim = OpenStackSim::start(OpenStackSimConfig {
        settings: CloudSettings {
            token_lifetime: Duration::from_secs(3600),
            ..CloudSettings::default()
        },
        scenario,
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap();
    let (client, _) = connect(&sim, "sim").await;
    client.octavia().list_providers().await.unwrap();
    reqwest::Client::new()
        .post(format!("{}/_sim/keystone/revoke", sim.url()))
        .send()
        .await
        .unwrap();
    let providers = client.octavia().list_providers().await.unwrap();
    assert_eq!(providers.len(), 2);
    assert!(sim.request_count("identity token_create") >= 2);
    // Revoked again: the token the first re-authentication left is not traded in (Keystone
    // would refuse it), the credentials log in afresh.
    reqwest::Client::new()
        .post(format!("{}/_sim/keystone/revoke", sim.url()))
        .send()
        .await
        .unwrap();
    client.octavia().list_providers().await.unwrap();
    assert!(sim.request_count("identity token_create") >= 3);
}

// ---------------------------------------------------------------- faults, in virtual time

/// The cloud layer on the simulator in-process, on tokio's paused clock.
async fn in_process(scenario: Scenario) -> (OpenStackSim, CloudClient) {
    let sim = start(true, scenario).await;
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let client = clouds.client(sim.session());
    (sim, client)
}

/// An ACTIVE load balancer with a listener and a pool; returns (lb, pool).
async fn lb_with_pool(client: &CloudClient, name: &str) -> (String, String) {
    capo_sim::support::api_load_balancer(client, name)
        .await
        .unwrap()
}

/// Waits (in virtual time, bounded) until the load balancer is out of PENDING_*.
async fn wait_lb_active(client: &CloudClient, lb: &str) {
    tokio::time::timeout(
        Duration::from_secs(600),
        capo_sim::support::settle(client, lb),
    )
    .await
    .unwrap_or_else(|_| panic!("load balancer {lb} stayed pending"))
    .unwrap();
}

fn member(name: &str, last_octet: u8) -> MemberSpec {
    MemberSpec::new(name, format!("10.0.0.{last_octet}"), 6443)
}

fn rule(kind: ObjectKind, name: &str, effect: Effect) -> Rule {
    Rule {
        kind,
        name: name.into(),
        effect,
        times: None,
    }
}

#[tokio::test(start_paused = true)]
async fn member_delay_outlasts_the_load_balancer() {
    let mut scenario = quick();
    scenario.rules.push(rule(
        ObjectKind::Member,
        "cp-2",
        Effect::Delay(Delay::Fixed(30.0)),
    ));
    let (_sim, client) = in_process(scenario).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    let created = client
        .octavia()
        .create_member(&pool, &member("cp-2", 2))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client
            .octavia()
            .get_load_balancer(&lb)
            .await
            .unwrap()
            .provisioning_status,
        ProvisioningStatus::Active
    );
    let pending = client
        .octavia()
        .get_member(&pool, &created.id)
        .await
        .unwrap();
    assert_eq!(
        pending.provisioning_status,
        ProvisioningStatus::PendingCreate
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let done = client
        .octavia()
        .get_member(&pool, &created.id)
        .await
        .unwrap();
    assert_eq!(done.provisioning_status, ProvisioningStatus::Active);
}

#[tokio::test(start_paused = true)]
async fn stuck_members_stay_pending_until_the_rule_goes() {
    let mut scenario = quick();
    scenario
        .rules
        .push(rule(ObjectKind::Member, "stuck-*", Effect::Stuck));
    let (sim, client) = in_process(scenario).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    let created = client
        .octavia()
        .create_member(&pool, &member("stuck-1", 3))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let tree = client.octavia().status_tree(&lb).await.unwrap();
    assert_eq!(tree.provisioning_status, ProvisioningStatus::Active);
    assert_eq!(
        tree.listeners[0].pools[0].members[0].provisioning_status,
        ProvisioningStatus::PendingCreate
    );
    sim.clear_rules();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let member = client
        .octavia()
        .get_member(&pool, &created.id)
        .await
        .unwrap();
    assert_eq!(member.provisioning_status, ProvisioningStatus::Active);
}

#[tokio::test(start_paused = true)]
async fn error_injection_for_members_load_balancers_and_servers() {
    let mut scenario = quick();
    scenario
        .rules
        .push(rule(ObjectKind::Member, "bad", Effect::Error));
    scenario
        .rules
        .push(rule(ObjectKind::Loadbalancer, "broken", Effect::Error));
    scenario
        .rules
        .push(rule(ObjectKind::Server, "doomed", Effect::Error));
    let (_sim, client) = in_process(scenario).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    let bad = client
        .octavia()
        .create_member(&pool, &member("bad", 4))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client
            .octavia()
            .get_member(&pool, &bad.id)
            .await
            .unwrap()
            .provisioning_status,
        ProvisioningStatus::Error
    );
    assert_eq!(
        client
            .octavia()
            .get_load_balancer(&lb)
            .await
            .unwrap()
            .provisioning_status,
        ProvisioningStatus::Active
    );

    let broken = client
        .octavia()
        .create_load_balancer(&LoadBalancerSpec {
            name: "broken".into(),
            vip_network_id: Some("n".into()),
            ..LoadBalancerSpec::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client
            .octavia()
            .get_load_balancer(&broken.id)
            .await
            .unwrap()
            .provisioning_status,
        ProvisioningStatus::Error
    );

    let networks = client
        .neutron()
        .list_networks(&Default::default())
        .await
        .unwrap();
    let images = client
        .glance()
        .list_images(None, &["capi".into()])
        .await
        .unwrap();
    let flavor = client.nova().flavor_by_name("m1.small").await.unwrap();
    let spec = |name: &str| capo_provider::cloud::nova::ServerSpec {
        name: name.into(),
        flavor_ref: flavor.id.clone(),
        image_ref: images[0].id.clone(),
        networks: vec![capo_provider::cloud::nova::ServerNetwork {
            uuid: Some(networks[0].id.clone()),
            port: None,
        }],
        ..Default::default()
    };
    let doomed = client.nova().create_server(&spec("doomed")).await.unwrap();
    let fine = client.nova().create_server(&spec("fine")).await.unwrap();
    assert_eq!(
        client.nova().get_server(&fine.id).await.unwrap().status,
        "BUILD"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client.nova().get_server(&doomed.id).await.unwrap().status,
        "ERROR"
    );
    let fine = client.nova().get_server(&fine.id).await.unwrap();
    assert_eq!(fine.status, "ACTIVE");
    assert!(
        fine.addresses.to_string().contains("172.24.4."),
        "{}",
        fine.addresses
    );
    client.nova().delete_server(&fine.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        client
            .nova()
            .get_server(&fine.id)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(start_paused = true)]
async fn operating_status_follows_monitors_and_admin_overrides() {
    let (sim, client) = in_process(quick()).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    let created = client
        .octavia()
        .create_member(&pool, &member("m", 5))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client
            .octavia()
            .get_member(&pool, &created.id)
            .await
            .unwrap()
            .operating_status,
        OperatingStatus::NoMonitor
    );
    client
        .octavia()
        .create_health_monitor(&capo_provider::cloud::octavia::HealthMonitorSpec {
            name: "hm".into(),
            pool_id: pool.clone(),
            kind: "TCP".into(),
            delay: 5,
            timeout: 5,
            max_retries: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let offline = client
        .octavia()
        .get_member(&pool, &created.id)
        .await
        .unwrap();
    assert_eq!(offline.operating_status, OperatingStatus::Offline);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        client
            .octavia()
            .get_member(&pool, &created.id)
            .await
            .unwrap()
            .operating_status,
        OperatingStatus::Online
    );
    assert!(sim.set_operating_status("m", Some("ERROR")));
    let tree = client.octavia().status_tree(&lb).await.unwrap();
    assert_eq!(
        tree.listeners[0].pools[0].members[0].operating_status,
        OperatingStatus::Error
    );
    assert_eq!(tree.operating_status, OperatingStatus::Error);
}

#[tokio::test]
async fn rate_limits_server_errors_latency_and_keystone_outages() {
    let sim = start(true, quick()).await;
    let raw = Raw::new(&sim).await;
    let put = |scenario: Scenario| {
        let http = raw.http.clone();
        let url = format!("{}/_sim/scenario", sim.url());
        async move {
            let response = http
                .put(url)
                .body(serde_json::to_string(&scenario).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        }
    };
    put(Scenario {
        rate_limits: vec![RateLimitFault {
            service: Some("load-balancer".into()),
            above_per_second: Some(3),
            probability: None,
            retry_after: 2,
        }],
        ..quick()
    })
    .await;
    let mut limited = 0;
    for _ in 0..6 {
        let response = raw
            .http
            .get(format!("{}/load-balancer/v2/lbaas/providers", raw.base))
            .header("x-auth-token", &raw.token)
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            assert_eq!(response.headers()["retry-after"], "2");
            limited += 1;
        }
    }
    assert!((1..=3).contains(&limited), "{limited} limited");
    assert_eq!(
        raw.get("/network/v2.0/networks").await.0,
        200,
        "other services are not limited"
    );

    put(Scenario {
        rate_limits: vec![RateLimitFault {
            service: None,
            above_per_second: None,
            probability: Some(1.0),
            retry_after: 1,
        }],
        ..quick()
    })
    .await;
    assert_eq!(raw.get("/compute/v2.1/flavors").await.0, 429);

    put(Scenario {
        server_errors: vec![ServerErrorFault {
            service: Some("network".into()),
            probability: 1.0,
            status: 502,
        }],
        ..quick()
    })
    .await;
    assert_eq!(raw.get("/network/v2.0/networks").await.0, 502);
    assert_eq!(raw.get("/compute/v2.1/flavors").await.0, 200);

    put(Scenario {
        latency: vec![capo_sim::openstack::LatencyFault {
            service: Some("image".into()),
            delay: Delay::Fixed(0.3),
        }],
        ..quick()
    })
    .await;
    let started = std::time::Instant::now();
    assert_eq!(raw.get("/image/v2/images").await.0, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));

    put(Scenario {
        keystone_outages: vec![Outage {
            from: 0.0,
            until: 1e9,
        }],
        ..quick()
    })
    .await;
    let response = raw
        .http
        .post(format!("{}/auth/tokens", sim.auth_url()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);

    let log = raw
        .http
        .get(format!("{}/_sim/requests", sim.url()))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert!(
        log["by_operation"]["load-balancer loadbalancer_provider_list"]
            .as_u64()
            .unwrap()
            >= 6,
        "{log}"
    );
    assert!(log["by_status"]["429"].as_u64().unwrap() >= 2, "{log}");
    assert!(log["per_second"].as_object().is_some_and(|s| !s.is_empty()));
}

#[tokio::test(start_paused = true)]
async fn a_seed_makes_runs_repeatable() {
    let run = || async {
        let mut scenario = quick();
        scenario.seed = Some(42);
        scenario.timings.member_create = Delay::Uniform(1.0, 9.0);
        let (_sim, client) = in_process(scenario).await;
        let (lb, pool) = lb_with_pool(&client, "lb").await;
        let started = tokio::time::Instant::now();
        let created = client
            .octavia()
            .create_member(&pool, &member("m", 9))
            .await
            .unwrap();
        while client
            .octavia()
            .get_member(&pool, &created.id)
            .await
            .unwrap()
            .provisioning_status
            != ProvisioningStatus::Active
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (lb, created.id, started.elapsed())
    };
    let first = run().await;
    let second = run().await;
    assert_eq!(first, second);
}

#[tokio::test(start_paused = true)]
async fn batch_member_update_puts_every_member_in_pending_update() {
    let (_sim, client) = in_process(quick()).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    let octavia = client.octavia();
    octavia
        .create_member(&pool, &member("m1", 1))
        .await
        .unwrap();
    wait_lb_active(&client, &lb).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let session = _sim.session();
    use capo_provider::cloud::Session;
    let url = session
        .service_url(capo_provider::cloud::Service::LoadBalancer)
        .await
        .unwrap();
    let body = json!({"members": [{"name": "m1", "address": "10.0.0.1", "protocol_port": 6443}, {"name": "m2", "address": "10.0.0.2", "protocol_port": 6443}]});
    let request = http::Request::put(format!("{url}lbaas/pools/{pool}/members"))
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    assert_eq!(session.send(request).await.unwrap().status(), 202);
    let members = octavia.list_members(&pool).await.unwrap();
    assert_eq!(members.len(), 2);
    assert!(
        members.iter().all(|m| m.provisioning_status.is_pending()),
        "{members:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        octavia
            .list_members(&pool)
            .await
            .unwrap()
            .iter()
            .all(|m| m.provisioning_status == ProvisioningStatus::Active)
    );
}

#[tokio::test(start_paused = true)]
async fn cascade_delete_removes_the_tree() {
    let (_sim, client) = in_process(quick()).await;
    let (lb, pool) = lb_with_pool(&client, "lb").await;
    client
        .octavia()
        .create_member(&pool, &member("m1", 1))
        .await
        .unwrap();
    wait_lb_active(&client, &lb).await;
    let refused = client
        .octavia()
        .delete_load_balancer(&lb, false)
        .await
        .unwrap_err();
    assert!(matches!(refused, CloudError::BadRequest(_)), "{refused:?}");
    client
        .octavia()
        .delete_load_balancer(&lb, true)
        .await
        .unwrap();
    assert_eq!(
        client
            .octavia()
            .get_load_balancer(&lb)
            .await
            .unwrap()
            .provisioning_status,
        ProvisioningStatus::PendingDelete
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        client
            .octavia()
            .get_load_balancer(&lb)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        client
            .octavia()
            .list_members(&pool)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(start_paused = true)]
async fn a_thousand_load_balancers_with_three_members_each() {
    let (sim, client) = in_process(quick()).await;
    let mut last = None;
    for i in 0..1000u32 {
        let (lb, pool) = lb_with_pool(&client, &format!("lb-{i}")).await;
        for m in 0..3u8 {
            client
                .octavia()
                .create_member(
                    &pool,
                    &MemberSpec::new(
                        format!("m{m}"),
                        format!("10.{}.{}.{m}", i / 250, i % 250),
                        6443,
                    ),
                )
                .await
                .unwrap();
            wait_lb_active(&client, &lb).await;
        }
        last = Some(lb);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tree = client.octavia().status_tree(&last.unwrap()).await.unwrap();
    assert_eq!(tree.listeners[0].pools[0].members.len(), 3);
    assert!(
        tree.listeners[0].pools[0]
            .members
            .iter()
            .all(|m| m.provisioning_status == ProvisioningStatus::Active)
    );
    assert_eq!(sim.octavia_counts(), (1000, 3000));
}

/// `capo-rs sim openstack` standalone: a scenario file in, a clouds.yaml out, and plain HTTP
/// with a token from its Keystone (what `curl` does).
#[tokio::test]
async fn the_standalone_command_serves_curl_like_clients() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(
        &scenario,
        "seed: 3\nrules:\n  - {kind: member, name: \"cp-*\", effect: stuck}\n",
    )
    .unwrap();
    let clouds = dir.path().join("clouds.yaml");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_capo-rs"))
        .args([
            "sim",
            "openstack",
            "--listen",
            "127.0.0.1:0",
            "--clouds-yaml-out",
        ])
        .arg(&clouds)
        .arg("--scenario")
        .arg(&scenario)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Kept open until the end, so the child never writes to a closed pipe.
    let mut lines = std::io::BufReader::new(stderr).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.strip_prefix("simulated OpenStack on ").map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
        })
        .expect("the simulator prints its URL");
    let yaml = std::fs::read_to_string(&clouds).unwrap();
    assert!(
        yaml.contains(&format!("auth_url: {url}/identity/v3")),
        "{yaml}"
    );

    let http = reqwest::Client::new();
    let body = json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": "demo", "password": "secret", "domain": {"name": "Default"}}}}}});
    let response = http
        .post(format!("{url}/identity/v3/auth/tokens"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let token = response.headers()["x-subject-token"]
        .to_str()
        .unwrap()
        .to_owned();
    let catalog = response.json::<Value>().await.unwrap();
    assert_eq!(catalog["token"]["catalog"].as_array().unwrap().len(), 6);
    let providers = http
        .get(format!("{url}/load-balancer/v2/lbaas/providers"))
        .header("x-auth-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(providers.status(), 200);
    let scenario = http
        .get(format!("{url}/_sim/scenario"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(scenario["rules"][0]["effect"], "stuck");
    child.kill().unwrap();
    child.wait().unwrap();
}

// ---------------------------------------------------------------- Cinder, BDM, trunks

/// One request through an in-process session (with a token), as status and JSON.
async fn sim_call(
    sim: &OpenStackSim,
    service: capo_provider::cloud::Service,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    use capo_provider::cloud::Session;
    let session = sim.session();
    let url = session.service_url(service).await.unwrap();
    let body = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{url}{path}"))
        .body(body)
        .unwrap();
    let response = session.send(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        serde_json::from_slice(response.body()).unwrap_or(Value::Null),
    )
}

fn volume_spec(name: &str, size: u64) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        size,
        ..VolumeSpec::default()
    }
}

/// The first `capi` image, `m1.small` and the `public` network.
async fn server_inputs(client: &CloudClient) -> (String, String, String) {
    let images = client
        .glance()
        .list_images(None, &["capi".into()])
        .await
        .unwrap();
    let flavor = client.nova().flavor_by_name("m1.small").await.unwrap();
    let networks = client
        .neutron()
        .list_networks(&Default::default())
        .await
        .unwrap();
    (images[0].id.clone(), flavor.id, networks[0].id.clone())
}

/// Creates a volume and lets it become available (virtual time).
async fn available_volume(client: &CloudClient, spec: &VolumeSpec) -> String {
    let created = client.cinder().create_volume(spec).await.unwrap();
    assert_eq!(created.status, "creating");
    tokio::time::advance(Duration::from_secs(1)).await;
    let volume = client.cinder().get_volume(&created.id).await.unwrap();
    assert!(volume.is_available(), "{volume:?}");
    created.id
}

fn bad_request_saying(error: &CloudError, message: &str) {
    assert!(matches!(error, CloudError::BadRequest(_)), "{error:?}");
    assert_eq!(error.message(), message);
}

#[tokio::test(start_paused = true)]
async fn cinder_volumes_are_created_checked_and_deleted() {
    let (sim, client) = in_process(quick()).await;
    let cinder = client.cinder();
    let (image, _, _) = server_inputs(&client).await;
    let before = sim.object_counts();
    let id = available_volume(
        &client,
        &VolumeSpec {
            image_id: Some(image.clone()),
            volume_type: Some("ssd".into()),
            availability_zone: Some("nova".into()),
            ..volume_spec("root", 20)
        },
    )
    .await;
    let shown = sim.volume("root").unwrap();
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["bootable"], "true");
    assert_eq!(shown["volume_type"], "ssd");
    assert_eq!(shown["size"], 20);
    assert_eq!(shown["attachments"], json!([]));
    assert_eq!(
        shown["os-vol-tenant-attr:tenant_id"],
        CloudSettings::default().project_id.as_str()
    );
    let plain = available_volume(&client, &volume_spec("plain", 1)).await;
    let plain_shown = sim.volume(&plain).unwrap();
    assert_eq!(plain_shown["bootable"], "false");
    assert_eq!(plain_shown["volume_type"], "__DEFAULT__");
    assert_eq!(plain_shown["availability_zone"], "nova");
    assert_eq!(cinder.list_volumes_by_name("root").await.unwrap().len(), 1);
    assert!(cinder.list_volumes_by_name("roo").await.unwrap().is_empty());

    let refused = cinder
        .create_volume(&volume_spec("zero", 0))
        .await
        .unwrap_err();
    bad_request_saying(
        &refused,
        "Invalid input received: Volume size '0' must be an integer and greater than 0",
    );
    let refused = cinder
        .create_volume(&VolumeSpec {
            volume_type: Some("gold".into()),
            ..volume_spec("gold", 1)
        })
        .await
        .unwrap_err();
    assert!(refused.is_not_found(), "{refused:?}");
    assert_eq!(
        refused.message(),
        "Volume type with name gold could not be found."
    );
    let refused = cinder
        .create_volume(&VolumeSpec {
            image_id: Some("no-such-image".into()),
            ..volume_spec("imageless", 1)
        })
        .await
        .unwrap_err();
    bad_request_saying(
        &refused,
        "Invalid image identifier or unable to access requested image.",
    );
    let refused = cinder
        .create_volume(&VolumeSpec {
            availability_zone: Some("az9".into()),
            ..volume_spec("elsewhere", 1)
        })
        .await
        .unwrap_err();
    bad_request_saying(
        &refused,
        "Invalid input received: Availability zone 'az9' is invalid.",
    );
    assert_eq!(sim.object_counts()["volumes"], before["volumes"] + 2);

    cinder.delete_volume(&id).await.unwrap();
    assert!(cinder.get_volume(&id).await.unwrap().is_deleting());
    let again = cinder.delete_volume(&id).await.unwrap_err();
    assert!(
        again.message().starts_with(
            "Invalid volume: Volume status must be available or error or error_restoring"
        ),
        "{again:?}"
    );
    cinder.delete_volume(&plain).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(cinder.get_volume(&id).await.unwrap_err().is_not_found());
    assert_eq!(
        cinder.delete_volume(&id).await.unwrap_err().message(),
        format!("Volume {id} could not be found.")
    );
    assert_eq!(sim.object_counts(), before);
    assert_eq!(sim.request_count("block-storage volume_create"), 6);
}

#[tokio::test(start_paused = true)]
async fn booting_from_a_volume_attaches_it_and_the_server_takes_it_along() {
    use capo_provider::cloud::nova::{BlockDevice, ServerNetwork, ServerSpec};
    let (sim, client) = in_process(quick()).await;
    let (image, flavor, network) = server_inputs(&client).await;
    let before = sim.object_counts();
    let root = available_volume(
        &client,
        &VolumeSpec {
            image_id: Some(image.clone()),
            ..volume_spec("cp-0-root", 20)
        },
    )
    .await;
    let data = available_volume(&client, &volume_spec("cp-0-etcd", 5)).await;
    let volume = |uuid: &str, boot_index, delete_on_termination| BlockDevice {
        boot_index,
        uuid: Some(uuid.into()),
        source_type: "volume",
        destination_type: "volume",
        volume_size: None,
        delete_on_termination,
        tag: None,
    };
    let ephemeral = BlockDevice {
        boot_index: -1,
        uuid: None,
        source_type: "blank",
        destination_type: "local",
        volume_size: Some(1),
        delete_on_termination: true,
        tag: Some("scratch".into()),
    };
    let spec = |name: &str, block_devices: Vec<BlockDevice>| ServerSpec {
        name: name.into(),
        flavor_ref: flavor.clone(),
        networks: vec![ServerNetwork {
            uuid: Some(network.clone()),
            port: None,
        }],
        block_devices,
        ..ServerSpec::default()
    };

    // Refused creates change nothing.
    let counts = sim.object_counts();
    let no_image = client
        .nova()
        .create_server(&spec("no-image", vec![]))
        .await
        .unwrap_err();
    bad_request_saying(&no_image, "Missing imageRef attribute");
    let missing = client
        .nova()
        .create_server(&spec("missing", vec![volume("nope", 0, true)]))
        .await
        .unwrap_err();
    bad_request_saying(
        &missing,
        "Block Device Mapping is Invalid: failed to get volume nope.",
    );
    let not_bootable = client
        .nova()
        .create_server(&spec("not-bootable", vec![volume(&data, 0, true)]))
        .await
        .unwrap_err();
    bad_request_saying(
        &not_bootable,
        &format!("Block Device {data} is not bootable."),
    );
    let no_boot = client
        .nova()
        .create_server(&spec("no-boot", vec![volume(&data, -1, false)]))
        .await
        .unwrap_err();
    assert!(no_boot.message().contains("Boot sequence"), "{no_boot:?}");
    assert_eq!(sim.object_counts(), counts);

    let mut server_spec = spec(
        "cp-0",
        vec![
            volume(&root, 0, true),
            volume(&data, -1, false),
            ephemeral.clone(),
        ],
    );
    server_spec
        .scheduler_hints
        .insert("different_host".into(), json!(["x"]));
    let server = client.nova().create_server(&server_spec).await.unwrap();
    for id in [&root, &data] {
        let shown = sim.volume(id).unwrap();
        assert_eq!(shown["status"], "in-use", "{shown}");
        assert_eq!(shown["attachments"][0]["server_id"], server.id.as_str());
        assert_eq!(shown["attachments"][0]["volume_id"], id.as_str());
    }
    assert_eq!(
        sim.volume(&root).unwrap()["attachments"][0]["device"],
        "/dev/vda"
    );
    let body = sim.server("cp-0").unwrap();
    assert_eq!(body["image"], "", "volume-backed servers show no image");
    assert_eq!(
        body["os-extended-volumes:volumes_attached"],
        json!([{"id": root, "delete_on_termination": true},
               {"id": data, "delete_on_termination": false}])
    );

    // A volume in use cannot be deleted, nor booted by another server.
    let in_use = client.cinder().delete_volume(&root).await.unwrap_err();
    assert!(
        in_use
            .message()
            .starts_with("Invalid volume: Volume status must be available"),
        "{in_use:?}"
    );
    let taken = client
        .nova()
        .create_server(&spec("cp-1", vec![volume(&root, 0, true)]))
        .await
        .unwrap_err();
    bad_request_saying(
        &taken,
        &format!(
            "Invalid volume: volume '{root}' status must be 'available'. Currently in 'in-use'"
        ),
    );

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        client.nova().get_server(&server.id).await.unwrap().status,
        "ACTIVE"
    );
    client.nova().delete_server(&server.id).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        client
            .nova()
            .get_server(&server.id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        client
            .cinder()
            .get_volume(&root)
            .await
            .unwrap_err()
            .is_not_found(),
        "delete_on_termination"
    );
    let kept = client.cinder().get_volume(&data).await.unwrap();
    assert!(kept.is_available(), "{kept:?}");
    assert!(kept.attachments.is_empty());
    client.cinder().delete_volume(&data).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sim.object_counts(), before, "nothing leaked");
}

#[tokio::test(start_paused = true)]
async fn nova_makes_volumes_from_images_and_a_failed_build_gives_them_back() {
    use capo_provider::cloud::nova::{BlockDevice, ServerNetwork, ServerSpec};
    let mut scenario = quick();
    scenario
        .rules
        .push(rule(ObjectKind::Server, "doomed", Effect::Error));
    let (sim, client) = in_process(scenario).await;
    let (image, flavor, network) = server_inputs(&client).await;
    let before = sim.object_counts();
    let data = available_volume(&client, &volume_spec("doomed-data", 5)).await;
    let server = client
        .nova()
        .create_server(&ServerSpec {
            name: "doomed".into(),
            flavor_ref: flavor,
            networks: vec![ServerNetwork {
                uuid: Some(network),
                port: None,
            }],
            block_devices: vec![
                BlockDevice {
                    boot_index: 0,
                    uuid: Some(image),
                    source_type: "image",
                    destination_type: "volume",
                    volume_size: Some(20),
                    delete_on_termination: true,
                    tag: None,
                },
                BlockDevice {
                    boot_index: -1,
                    uuid: Some(data.clone()),
                    source_type: "volume",
                    destination_type: "volume",
                    volume_size: None,
                    delete_on_termination: true,
                    tag: None,
                },
            ],
            ..ServerSpec::default()
        })
        .await
        .unwrap();
    let attached = sim.server(&server.id).unwrap()["os-extended-volumes:volumes_attached"].clone();
    let root = attached[0]["id"].as_str().unwrap().to_owned();
    let made = sim.volume(&root).unwrap();
    assert_eq!(made["status"], "in-use");
    assert_eq!(made["bootable"], "true");
    assert_eq!(made["size"], 20);
    assert_eq!(sim.object_counts()["volumes"], before["volumes"] + 2);

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        client.nova().get_server(&server.id).await.unwrap().status,
        "ERROR"
    );
    for id in [&root, &data] {
        let volume = client.cinder().get_volume(id).await.unwrap();
        assert!(
            volume.is_available() && volume.attachments.is_empty(),
            "{volume:?}"
        );
    }
    client.nova().delete_server(&server.id).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        sim.object_counts(),
        before,
        "both volumes went with the server"
    );
}

#[tokio::test(start_paused = true)]
async fn volume_rules_fail_hold_or_slow_a_volume() {
    let mut scenario = quick();
    scenario
        .rules
        .push(rule(ObjectKind::Volume, "bad-*", Effect::Error));
    scenario
        .rules
        .push(rule(ObjectKind::Volume, "stuck-*", Effect::Stuck));
    scenario.rules.push(rule(
        ObjectKind::Volume,
        "slow",
        Effect::Delay(Delay::Fixed(30.0)),
    ));
    let (sim, client) = in_process(scenario).await;
    let cinder = client.cinder();
    let bad = cinder
        .create_volume(&volume_spec("bad-1", 1))
        .await
        .unwrap();
    let stuck = cinder
        .create_volume(&volume_spec("stuck-1", 1))
        .await
        .unwrap();
    let slow = cinder.create_volume(&volume_spec("slow", 1)).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(cinder.get_volume(&bad.id).await.unwrap().is_error());
    assert_eq!(
        cinder.get_volume(&slow.id).await.unwrap().status,
        "creating"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(cinder.get_volume(&slow.id).await.unwrap().is_available());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        cinder.get_volume(&stuck.id).await.unwrap().status,
        "creating"
    );
    let refused = cinder.delete_volume(&stuck.id).await.unwrap_err();
    assert!(matches!(refused, CloudError::BadRequest(_)), "{refused:?}");
    sim.clear_rules();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(cinder.get_volume(&stuck.id).await.unwrap().is_available());
    // A volume in error can be deleted.
    cinder.delete_volume(&bad.id).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(cinder.get_volume(&bad.id).await.unwrap_err().is_not_found());
}

#[tokio::test(start_paused = true)]
async fn trunk_parent_ports_are_guarded_and_port_attributes_echo() {
    use capo_provider::cloud::Service;
    use capo_provider::cloud::neutron::PortSpec;
    let (sim, client) = in_process(quick()).await;
    let neutron = client.neutron();
    let (_, _, network) = server_inputs(&client).await;
    let before = sim.object_counts();
    let mut value_specs = serde_json::Map::new();
    value_specs.insert("dns_name".into(), json!("cp-0"));
    let port = neutron
        .create_port(&PortSpec {
            name: "cp-0-trunk".into(),
            network_id: network.clone(),
            host_id: Some("compute-7".into()),
            profile: Some(json!({"capabilities": ["switchdev"]})),
            mac_address: Some("fa:16:3e:00:00:01".into()),
            propagate_uplink_status: Some(true),
            value_specs,
            ..PortSpec::default()
        })
        .await
        .unwrap();
    assert_eq!(port.mac_address, "fa:16:3e:00:00:01");
    let (_, shown) = sim_call(
        &sim,
        Service::Network,
        http::Method::GET,
        &format!("ports/{}", port.id),
        None,
    )
    .await;
    let shown = &shown["port"];
    // As Neutron shows a port to a project member: the binding's host, profile and VIF are
    // for administrators, and ML2 without the drivers that support it has no
    // propagate_uplink_status (the real tier's recorded answers).
    for hidden in [
        "binding:host_id",
        "binding:profile",
        "propagate_uplink_status",
    ] {
        assert!(shown.get(hidden).is_none(), "{hidden} shown: {shown}");
    }
    assert_eq!(shown["binding:vnic_type"], "normal");
    assert_eq!(shown["dns_name"], "cp-0");
    let duplicate_mac = neutron
        .create_port(&PortSpec {
            name: "twin".into(),
            network_id: network.clone(),
            mac_address: Some("fa:16:3e:00:00:01".into()),
            ..PortSpec::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(duplicate_mac, CloudError::Conflict(_)),
        "{duplicate_mac:?}"
    );

    let trunk = neutron
        .create_trunk("cp-0-trunk", &port.id, "", &["cluster-c1".into()])
        .await
        .unwrap();
    assert_eq!(trunk.port_id, port.id);
    let parent = neutron.get_port(&port.id).await.unwrap();
    assert_eq!(
        parent.trunk_details.as_ref().map(|d| d["trunk_id"].clone()),
        Some(json!(trunk.id))
    );
    let second = neutron
        .create_trunk("again", &port.id, "", &[])
        .await
        .unwrap_err();
    assert!(matches!(second, CloudError::Conflict(_)), "{second:?}");
    assert_eq!(
        second.message(),
        format!("Port {} is in use by another trunk.", port.id)
    );
    let orphan = neutron
        .create_trunk("orphan", "no-such-port", "", &[])
        .await
        .unwrap_err();
    assert!(orphan.is_not_found(), "{orphan:?}");
    let (status, body) = sim_call(
        &sim,
        Service::Network,
        http::Method::DELETE,
        &format!("ports/{}", port.id),
        None,
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        body,
        json!({"NeutronError": {"type": "PortInUseAsTrunkParent",
            "message": format!("Port {} is currently a parent port for trunk {}.", port.id, trunk.id),
            "detail": ""}})
    );
    assert_eq!(sim.object_counts()["trunks"], before["trunks"] + 1);

    neutron.delete_trunk(&trunk.id).await.unwrap();
    assert_eq!(
        neutron.get_port(&port.id).await.unwrap().trunk_details,
        None
    );
    neutron.delete_port(&port.id).await.unwrap();
    assert_eq!(sim.object_counts(), before);
}

/// Cinder over HTTP: in the catalog, under `v3/{project_id}/` too, with Cinder's error bodies,
/// its faults and its request-log names.
#[tokio::test]
async fn cinder_over_http_with_the_project_in_the_path() {
    let sim = start(true, quick()).await;
    let raw = Raw::new(&sim).await;
    let project = CloudSettings::default().project_id;
    let (status, created) = raw
        .post(
            &format!("/block-storage/v3/{project}/volumes"),
            json!({"volume": {"name": "v", "size": 1}}),
        )
        .await;
    assert_eq!(status, 202, "{created}");
    let id = created["volume"]["id"].as_str().unwrap().to_owned();
    assert_eq!(created["volume"]["status"], "creating");
    let path = format!("/block-storage/v3/volumes/{id}");
    raw.wait_for(&path, "/volume/status", "available").await;
    let (status, listed) = raw
        .get("/block-storage/v3/volumes?status=available&name=v")
        .await;
    assert_eq!(status, 200);
    assert_eq!(listed["volumes"][0]["id"], id.as_str());
    let (_, none) = raw
        .get("/block-storage/v3/volumes/detail?status=error")
        .await;
    assert_eq!(none["volumes"], json!([]));
    let (status, missing) = raw.get("/block-storage/v3/volumes/nope").await;
    assert_eq!(status, 404);
    assert_eq!(
        missing,
        json!({"itemNotFound": {"code": 404, "message": "Volume nope could not be found."}})
    );
    let (status, bad) = raw
        .post(
            "/block-storage/v3/volumes",
            json!({"volume": {"name": "x"}}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(bad["badRequest"]["code"], 400);
    assert!(
        bad["badRequest"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid input received:")
    );
    assert!(sim.request_count("block-storage volume_create") >= 2);
    assert!(sim.request_count("block-storage volume_get") >= 1);

    sim.set_scenario(Scenario {
        server_errors: vec![ServerErrorFault {
            service: Some("block-storage".into()),
            probability: 1.0,
            status: 503,
        }],
        ..quick()
    });
    assert_eq!(raw.get("/block-storage/v3/volumes").await.0, 503);
    assert_eq!(raw.get("/compute/v2.1/flavors").await.0, 200);
}

#[tokio::test(start_paused = true)]
async fn a_force_delete_removes_a_server_and_a_missing_one_is_not_found() {
    use capo_provider::cloud::nova::{ServerNetwork, ServerSpec};
    let (sim, client) = in_process(quick()).await;
    let (image, flavor, network) = server_inputs(&client).await;
    let server = client
        .nova()
        .create_server(&ServerSpec {
            name: "soft".into(),
            flavor_ref: flavor,
            image_ref: image,
            networks: vec![ServerNetwork {
                port: None,
                uuid: Some(network),
            }],
            ..ServerSpec::default()
        })
        .await
        .unwrap();
    client.nova().force_delete_server(&server.id).await.unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(sim.server(&server.id).is_none(), "gone");
    let missing = client
        .nova()
        .force_delete_server(&server.id)
        .await
        .unwrap_err();
    assert!(missing.is_not_found(), "{missing:?}");
}

// ---------------------------------------------------------------- Neutron in-use rules, Nova zones

/// One Neutron request in-process: status and JSON.
async fn net(
    sim: &OpenStackSim,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    sim_call(
        sim,
        capo_provider::cloud::Service::Network,
        method,
        path,
        body,
    )
    .await
}

/// The id of the one object a Neutron list returns.
async fn only_id(sim: &OpenStackSim, path: &str, key: &str) -> String {
    let (status, listed) = net(sim, http::Method::GET, path, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed[key].as_array().map(Vec::len),
        Some(1),
        "{path}: {listed}"
    );
    listed[key][0]["id"].as_str().unwrap().to_owned()
}

/// A project network with a /24 subnet: (network, subnet).
async fn project_network(sim: &OpenStackSim, name: &str, cidr: &str) -> (String, String) {
    let (status, network) = net(
        sim,
        http::Method::POST,
        "networks",
        Some(json!({"network": {"name": name}})),
    )
    .await;
    assert_eq!(status, 201, "{network}");
    let network = network["network"]["id"].as_str().unwrap().to_owned();
    let (status, subnet) = net(
        sim,
        http::Method::POST,
        "subnets",
        Some(json!({"subnet": {"name": format!("{name}-subnet"), "network_id": network, "cidr": cidr, "ip_version": 4}})),
    )
    .await;
    assert_eq!(status, 201, "{subnet}");
    (network, subnet["subnet"]["id"].as_str().unwrap().to_owned())
}

fn neutron_error(kind: &str, message: &str) -> Value {
    json!({"NeutronError": {"type": kind, "message": message, "detail": ""}})
}

#[tokio::test(start_paused = true)]
async fn routers_own_their_gateway_port_and_are_in_use_only_through_interfaces() {
    use http::Method;
    let (sim, _client) = in_process(quick()).await;
    let before = sim.object_counts();
    let public = only_id(&sim, "networks?name=public", "networks").await;
    let public_subnet = only_id(&sim, "subnets?name=public-subnet", "subnets").await;

    let (status, created) = net(
        &sim,
        Method::POST,
        "routers",
        Some(json!({"router": {"name": "r1", "external_gateway_info": {"network_id": public}}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let r1 = created["router"]["id"].as_str().unwrap().to_owned();
    let gateway = &created["router"]["external_gateway_info"];
    assert_eq!(gateway["network_id"], public.as_str());
    assert_eq!(gateway["enable_snat"], true);
    assert_eq!(
        gateway["external_fixed_ips"][0]["subnet_id"],
        public_subnet.as_str()
    );
    let gateway_ip = gateway["external_fixed_ips"][0]["ip_address"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(gateway_ip.starts_with("172.24.4."), "{gateway_ip}");
    let (_, ports) = net(
        &sim,
        Method::GET,
        &format!("ports?device_id={r1}&device_owner=network:router_gateway"),
        None,
    )
    .await;
    let port = &ports["ports"][0];
    assert_eq!(port["network_id"], public.as_str());
    assert_eq!(
        port["fixed_ips"],
        json!([{"subnet_id": public_subnet, "ip_address": gateway_ip}])
    );
    assert_eq!(ports["ports"].as_array().unwrap().len(), 1);

    // A chosen address, SNAT off; the same address again is taken; only external networks.
    let (status, r2) = net(
        &sim,
        Method::POST,
        "routers",
        Some(
            json!({"router": {"name": "r2", "external_gateway_info": {"network_id": public,
            "enable_snat": false, "external_fixed_ips": [{"ip_address": "172.24.4.100"}]}}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{r2}");
    assert_eq!(
        r2["router"]["external_gateway_info"],
        json!({"network_id": public, "enable_snat": false,
               "external_fixed_ips": [{"subnet_id": public_subnet, "ip_address": "172.24.4.100"}]})
    );
    let r2 = r2["router"]["id"].as_str().unwrap().to_owned();
    let (status, taken) = net(
        &sim,
        Method::POST,
        "routers",
        Some(
            json!({"router": {"name": "r3", "external_gateway_info": {"network_id": public,
            "external_fixed_ips": [{"subnet_id": public_subnet, "ip_address": "172.24.4.100"}]}}}),
        ),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        taken,
        neutron_error(
            "IpAddressAlreadyAllocated",
            &format!("IP address 172.24.4.100 already allocated in subnet {public_subnet}")
        )
    );
    let (private, private_subnet) = project_network(&sim, "private", "10.0.0.0/24").await;
    let (status, internal) = net(
        &sim,
        Method::POST,
        "routers",
        Some(json!({"router": {"name": "r4", "external_gateway_info": {"network_id": private}}})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        internal,
        neutron_error(
            "BadRequest",
            &format!("Bad router request: Network {private} is not an external network.")
        )
    );

    // Interfaces hold a router; its gateway does not.
    let (status, _) = net(
        &sim,
        Method::PUT,
        &format!("routers/{r1}/add_router_interface"),
        Some(json!({"subnet_id": private_subnet})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, refused) = net(&sim, Method::DELETE, &format!("routers/{r1}"), None).await;
    assert_eq!(status, 409);
    assert_eq!(
        refused,
        neutron_error("RouterInUse", &format!("Router {r1} still has ports"))
    );
    let (status, _) = net(
        &sim,
        Method::PUT,
        &format!("routers/{r1}/remove_router_interface"),
        Some(json!({"subnet_id": private_subnet})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        net(&sim, Method::DELETE, &format!("routers/{r1}"), None)
            .await
            .0,
        204
    );
    let (_, left) = net(&sim, Method::GET, &format!("ports?device_id={r1}"), None).await;
    assert_eq!(left["ports"], json!([]));

    // PUT clears and sets the gateway, the port going and coming with it.
    let (status, cleared) = net(
        &sim,
        Method::PUT,
        &format!("routers/{r2}"),
        Some(json!({"router": {"external_gateway_info": {}}})),
    )
    .await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(cleared["router"]["external_gateway_info"], Value::Null);
    let (_, left) = net(&sim, Method::GET, &format!("ports?device_id={r2}"), None).await;
    assert_eq!(left["ports"], json!([]));
    let (status, set) = net(
        &sim,
        Method::PUT,
        &format!("routers/{r2}"),
        Some(json!({"router": {"external_gateway_info": {"network_id": public}}})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["router"]["external_gateway_info"]["enable_snat"], true);
    let (_, gateway_ports) = net(&sim, Method::GET, &format!("ports?device_id={r2}"), None).await;
    assert_eq!(
        gateway_ports["ports"][0]["fixed_ips"][0]["ip_address"],
        set["router"]["external_gateway_info"]["external_fixed_ips"][0]["ip_address"]
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("routers/{r2}"), None)
            .await
            .0,
        204
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("networks/{private}"), None)
            .await
            .0,
        204
    );
    assert_eq!(sim.object_counts(), before);
}

#[tokio::test(start_paused = true)]
async fn security_groups_get_default_rules_refuse_duplicates_and_are_held_by_ports() {
    use http::Method;
    let (sim, client) = in_process(quick()).await;
    let before = sim.object_counts();
    let created = client
        .neutron()
        .create_security_group("web", "", &[])
        .await
        .unwrap();
    let web = created.id.clone();
    let rules: Vec<(String, Option<String>)> = created
        .security_group_rules
        .iter()
        .map(|r| (r.direction.clone(), r.ethertype.clone()))
        .collect();
    assert_eq!(
        rules,
        [
            ("egress".into(), Some("IPv4".into())),
            ("egress".into(), Some("IPv6".into()))
        ]
    );
    let (_, listed) = net(
        &sim,
        Method::GET,
        &format!("security-group-rules?security_group_id={web}"),
        None,
    )
    .await;
    for rule in listed["security_group_rules"].as_array().unwrap() {
        for field in [
            "protocol",
            "port_range_min",
            "port_range_max",
            "remote_ip_prefix",
            "remote_group_id",
        ] {
            assert_eq!(rule[field], Value::Null, "{field} of {rule}");
        }
    }
    let egress_v4 = created.security_group_rules[0].id.clone();
    let default = only_id(&sim, "security-groups?name=default", "security_groups").await;
    let (_, shown) = net(
        &sim,
        Method::GET,
        &format!("security-groups/{default}"),
        None,
    )
    .await;
    let shape: Vec<(Value, Value, Value)> = shown["security_group"]["security_group_rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["direction"].clone(),
                r["ethertype"].clone(),
                r["remote_group_id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (json!("ingress"), json!("IPv4"), json!(default)),
            (json!("egress"), json!("IPv4"), Value::Null),
            (json!("ingress"), json!("IPv6"), json!(default)),
            (json!("egress"), json!("IPv6"), Value::Null),
        ]
    );
    let (status, reserved) = net(
        &sim,
        Method::POST,
        "security-groups",
        Some(json!({"security_group": {"name": "default"}})),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        reserved["NeutronError"]["type"],
        "SecurityGroupDefaultAlreadyExists"
    );

    // A rule from another group; the same rule spelled differently is a duplicate.
    let rule = |protocol: &str| {
        json!({"security_group_rule": {"security_group_id": web, "direction": "ingress",
            "protocol": protocol, "port_range_min": 6443, "port_range_max": 6443, "remote_group_id": default}})
    };
    let (status, from_group) = net(
        &sim,
        Method::POST,
        "security-group-rules",
        Some(rule("tcp")),
    )
    .await;
    assert_eq!(status, 201, "{from_group}");
    assert_eq!(
        from_group["security_group_rule"]["remote_group_id"],
        default.as_str()
    );
    assert_eq!(from_group["security_group_rule"]["ethertype"], "IPv4");
    let first = from_group["security_group_rule"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, duplicate) =
        net(&sim, Method::POST, "security-group-rules", Some(rule("6"))).await;
    assert_eq!(status, 409);
    assert_eq!(
        duplicate,
        neutron_error(
            "SecurityGroupRuleExists",
            &format!("Security group rule already exists. Rule id is {first}.")
        )
    );
    let (status, duplicate) = net(
        &sim,
        Method::POST,
        "security-group-rules",
        Some(
            json!({"security_group_rule": {"security_group_id": web, "direction": "egress",
            "ethertype": "IPv4", "remote_ip_prefix": "0.0.0.0/0"}}),
        ),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        duplicate["NeutronError"]["message"],
        format!("Security group rule already exists. Rule id is {egress_v4}.")
    );
    let (status, other) = net(
        &sim,
        Method::POST,
        "security-group-rules",
        Some(json!({"security_group_rule": {"security_group_id": web, "direction": "ingress",
            "protocol": "tcp", "port_range_min": 6443, "port_range_max": 6443, "remote_ip_prefix": "10.0.0.7/24"}})),
    )
    .await;
    assert_eq!(status, 201, "{other}");
    assert_eq!(
        other["security_group_rule"]["normalized_cidr"],
        "10.0.0.0/24"
    );

    // A port holds its groups.
    let public = only_id(&sim, "networks?name=public", "networks").await;
    let (_, port) = net(
        &sim,
        Method::POST,
        "ports",
        Some(json!({"port": {"network_id": public, "security_groups": [web]}})),
    )
    .await;
    let port = port["port"]["id"].as_str().unwrap().to_owned();
    let (status, refused) = net(
        &sim,
        Method::DELETE,
        &format!("security-groups/{web}"),
        None,
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        refused,
        neutron_error(
            "SecurityGroupInUse",
            &format!("Security Group {web} in use.")
        )
    );
    client.neutron().delete_port(&port).await.unwrap();
    client.neutron().delete_security_group(&web).await.unwrap();
    let (_, left) = net(
        &sim,
        Method::GET,
        &format!("security-group-rules?security_group_id={web}"),
        None,
    )
    .await;
    assert_eq!(left["security_group_rules"], json!([]));
    assert_eq!(sim.object_counts(), before);
}

#[tokio::test(start_paused = true)]
async fn networks_and_subnets_in_use_are_refused_but_dhcp_ports_do_not_count() {
    use http::Method;
    let (sim, _client) = in_process(quick()).await;
    let before = sim.object_counts();
    let (network, subnet) = project_network(&sim, "n", "10.1.0.0/24").await;
    let (_, port) = net(
        &sim,
        Method::POST,
        "ports",
        Some(json!({"port": {"network_id": network}})),
    )
    .await;
    let port = port["port"]["id"].as_str().unwrap().to_owned();
    let (status, refused) = net(&sim, Method::DELETE, &format!("networks/{network}"), None).await;
    assert_eq!(status, 409);
    assert_eq!(
        refused,
        neutron_error(
            "NetworkInUse",
            &format!(
                "Unable to complete operation on network {network}. \
                 There are one or more ports still in use on the network, id for these ports \
                 is: {port}."
            )
        )
    );
    let (status, refused) = net(&sim, Method::DELETE, &format!("subnets/{subnet}"), None).await;
    assert_eq!(status, 409);
    assert_eq!(
        refused,
        neutron_error(
            "SubnetInUse",
            &format!(
                "Unable to complete operation on subnet {subnet}: \
                 One or more ports have an IP allocation from this subnet."
            )
        )
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("ports/{port}"), None)
            .await
            .0,
        204
    );

    // A router interface holds the subnet.
    let (_, router) = net(
        &sim,
        Method::POST,
        "routers",
        Some(json!({"router": {"name": "r"}})),
    )
    .await;
    let router = router["router"]["id"].as_str().unwrap().to_owned();
    let path = format!("routers/{router}/add_router_interface");
    assert_eq!(
        net(&sim, Method::PUT, &path, Some(json!({"subnet_id": subnet})))
            .await
            .0,
        200
    );
    let (status, refused) = net(&sim, Method::DELETE, &format!("subnets/{subnet}"), None).await;
    assert_eq!(status, 409);
    assert_eq!(refused["NeutronError"]["type"], "SubnetInUse");
    let path = format!("routers/{router}/remove_router_interface");
    assert_eq!(
        net(&sim, Method::PUT, &path, Some(json!({"subnet_id": subnet})))
            .await
            .0,
        200
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("routers/{router}"), None)
            .await
            .0,
        204
    );

    // Neutron's own DHCP port goes with the network, and so do the subnets.
    let (status, _) = net(
        &sim,
        Method::POST,
        "ports",
        Some(json!({"port": {"network_id": network, "device_owner": "network:dhcp", "device_id": "dhcp1"}})),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        net(&sim, Method::DELETE, &format!("networks/{network}"), None)
            .await
            .0,
        204
    );
    assert_eq!(sim.object_counts(), before);
}

#[tokio::test(start_paused = true)]
async fn floating_ips_associate_through_a_router_and_taken_addresses_conflict() {
    use http::Method;
    let (sim, client) = in_process(quick()).await;
    let neutron = client.neutron();
    let before = sim.object_counts();
    let public = only_id(&sim, "networks?name=public", "networks").await;
    let public_subnet = only_id(&sim, "subnets?name=public-subnet", "subnets").await;
    let (network, subnet) = project_network(&sim, "n", "10.2.0.0/24").await;
    let (_, router) = net(
        &sim,
        Method::POST,
        "routers",
        Some(json!({"router": {"name": "r", "external_gateway_info": {"network_id": public}}})),
    )
    .await;
    let router = router["router"]["id"].as_str().unwrap().to_owned();
    let path = format!("routers/{router}/add_router_interface");
    assert_eq!(
        net(&sim, Method::PUT, &path, Some(json!({"subnet_id": subnet})))
            .await
            .0,
        200
    );
    let (_, port) = net(
        &sim,
        Method::POST,
        "ports",
        Some(json!({"port": {"network_id": network}})),
    )
    .await;
    let fixed = port["port"]["fixed_ips"][0]["ip_address"]
        .as_str()
        .unwrap()
        .to_owned();
    let port = port["port"]["id"].as_str().unwrap().to_owned();

    let fip = neutron.create_floating_ip(&public, None, "").await.unwrap();
    assert_eq!(
        (fip.status.as_str(), fip.port_id.as_deref()),
        ("DOWN", None)
    );
    let associated = neutron
        .associate_floating_ip(&fip.id, Some(&port))
        .await
        .unwrap();
    assert_eq!(associated.status, "ACTIVE");
    assert_eq!(associated.fixed_ip_address.as_deref(), Some(fixed.as_str()));
    let (_, shown) = net(&sim, Method::GET, &format!("floatingips/{}", fip.id), None).await;
    assert_eq!(shown["floatingip"]["router_id"], router.as_str());
    assert_eq!(shown["floatingip"]["port_id"], port.as_str());

    // The router's gateway is pinned while the floating IP goes through it.
    let (status, pinned) = net(
        &sim,
        Method::PUT,
        &format!("routers/{router}"),
        Some(json!({"router": {"external_gateway_info": {}}})),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        pinned["NeutronError"]["type"],
        "RouterExternalGatewayInUseByFloatingIp"
    );

    let released = neutron.associate_floating_ip(&fip.id, None).await.unwrap();
    assert_eq!(released.status, "DOWN");
    assert_eq!((released.port_id, released.fixed_ip_address), (None, None));
    let (_, shown) = net(&sim, Method::GET, &format!("floatingips/{}", fip.id), None).await;
    assert_eq!(shown["floatingip"]["router_id"], Value::Null);

    // Made on the port in one request (Neutron attaches it in the create's transaction); a
    // second on the same fixed IP is refused, and the refusal allocates nothing.
    let on_port = neutron
        .create_tagged_floating_ip(&public, None, Some(&port), "", &[])
        .await
        .unwrap();
    assert_eq!(on_port.status, "ACTIVE");
    assert_eq!(on_port.fixed_ip_address.as_deref(), Some(fixed.as_str()));
    let (_, shown) = net(
        &sim,
        Method::GET,
        &format!("floatingips/{}", on_port.id),
        None,
    )
    .await;
    assert_eq!(shown["floatingip"]["router_id"], router.as_str());
    let allocated = neutron
        .list_floating_ips(&Filter::default())
        .await
        .unwrap()
        .len();
    let twice = neutron
        .create_tagged_floating_ip(&public, None, Some(&port), "", &[])
        .await
        .unwrap_err();
    assert!(matches!(twice, CloudError::Conflict(_)), "{twice:?}");
    assert_eq!(
        neutron
            .list_floating_ips(&Filter::default())
            .await
            .unwrap()
            .len(),
        allocated
    );
    neutron.delete_floating_ip(&on_port.id).await.unwrap();

    // A chosen address: once; not one that is out of the network's subnets.
    let chosen = neutron
        .create_floating_ip(&public, Some("172.24.4.50"), "")
        .await
        .unwrap();
    assert_eq!(chosen.floating_ip_address, "172.24.4.50");
    let (status, taken) = net(
        &sim,
        Method::POST,
        "floatingips",
        Some(json!({"floatingip": {"floating_network_id": public, "floating_ip_address": "172.24.4.50"}})),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(
        taken,
        neutron_error(
            "IpAddressAlreadyAllocated",
            &format!("IP address 172.24.4.50 already allocated in subnet {public_subnet}")
        )
    );
    let taken = neutron
        .create_floating_ip(&public, Some(&fip.floating_ip_address), "")
        .await
        .unwrap_err();
    assert!(matches!(taken, CloudError::Conflict(_)), "{taken:?}");
    let (status, outside) = net(
        &sim,
        Method::POST,
        "floatingips",
        Some(json!({"floatingip": {"floating_network_id": public, "floating_ip_address": "192.0.2.9"}})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(outside["NeutronError"]["type"], "InvalidIpForNetwork");

    // Deleting the port frees the floating IP.
    neutron
        .associate_floating_ip(&chosen.id, Some(&port))
        .await
        .unwrap();
    neutron.delete_port(&port).await.unwrap();
    let (_, shown) = net(
        &sim,
        Method::GET,
        &format!("floatingips/{}", chosen.id),
        None,
    )
    .await;
    assert_eq!(
        (
            &shown["floatingip"]["port_id"],
            &shown["floatingip"]["fixed_ip_address"]
        ),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(shown["floatingip"]["status"], "DOWN");
    assert_eq!(shown["floatingip"]["router_id"], Value::Null);

    for id in [&fip.id, &chosen.id] {
        neutron.delete_floating_ip(id).await.unwrap();
    }
    let path = format!("routers/{router}/remove_router_interface");
    assert_eq!(
        net(&sim, Method::PUT, &path, Some(json!({"subnet_id": subnet})))
            .await
            .0,
        200
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("routers/{router}"), None)
            .await
            .0,
        204
    );
    assert_eq!(
        net(&sim, Method::DELETE, &format!("networks/{network}"), None)
            .await
            .0,
        204
    );
    assert_eq!(sim.object_counts(), before);
}

#[tokio::test(start_paused = true)]
async fn nova_lists_the_configured_availability_zones_and_boots_only_into_them() {
    use capo_provider::cloud::Service;
    use capo_provider::cloud::nova::{ServerNetwork, ServerSpec};
    let (plain, _) = in_process(quick()).await;
    let (_, zones) = sim_call(
        &plain,
        Service::Compute,
        http::Method::GET,
        "os-availability-zone",
        None,
    )
    .await;
    assert_eq!(
        zones,
        json!({"availabilityZoneInfo": [{"zoneName": "nova", "zoneState": {"available": true}, "hosts": null}]})
    );

    let sim = OpenStackSim::start(OpenStackSimConfig {
        settings: CloudSettings {
            availability_zones: vec!["az1".into(), "az2".into()],
            ..CloudSettings::default()
        },
        scenario: quick(),
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap();
    let (_, zones) = sim_call(
        &sim,
        Service::Compute,
        http::Method::GET,
        "os-availability-zone",
        None,
    )
    .await;
    assert_eq!(
        zones,
        json!({"availabilityZoneInfo": [
            {"zoneName": "az1", "zoneState": {"available": true}, "hosts": null},
            {"zoneName": "az2", "zoneState": {"available": true}, "hosts": null}]})
    );
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let client = clouds.client(sim.session());
    let (image, flavor, network) = server_inputs(&client).await;
    let spec = |zone: &str| ServerSpec {
        name: format!("in-{zone}"),
        flavor_ref: flavor.clone(),
        image_ref: image.clone(),
        availability_zone: Some(zone.into()),
        networks: vec![ServerNetwork {
            port: None,
            uuid: Some(network.clone()),
        }],
        ..ServerSpec::default()
    };
    let server = client.nova().create_server(&spec("az2")).await.unwrap();
    assert_eq!(
        sim.server(&server.id).unwrap()["OS-EXT-AZ:availability_zone"],
        "az2"
    );
    let refused = client
        .nova()
        .create_server(&spec("nova"))
        .await
        .unwrap_err();
    bad_request_saying(&refused, "The requested availability zone is not available");
}

/// The VIP port Octavia made in Neutron goes with its load balancer, whether the delete takes
/// a while or no time.
#[tokio::test(start_paused = true)]
async fn a_cascade_delete_releases_the_vip_port() {
    for delete_delay in [0.0, 0.05] {
        let mut scenario = quick();
        scenario.timings.lb_delete = Delay::Fixed(delete_delay);
        let (sim, client) = in_process(scenario).await;
        let before = sim.object_counts();
        let public = only_id(&sim, "networks?name=public", "networks").await;
        let lb = client
            .octavia()
            .create_load_balancer(&LoadBalancerSpec {
                name: "vip".into(),
                vip_network_id: Some(public),
                ..LoadBalancerSpec::default()
            })
            .await
            .unwrap();
        let vip_port = format!("ports/{}", lb.vip_port_id.clone().unwrap());
        let (_, vip) = net(&sim, http::Method::GET, &vip_port, None).await;
        assert_eq!(vip["port"]["name"], "octavia-lb-vip");
        assert_eq!(vip["port"]["device_owner"], "Octavia");
        assert_eq!(
            vip["port"]["fixed_ips"][0]["ip_address"],
            json!(lb.vip_address)
        );
        wait_lb_active(&client, &lb.id).await;
        client
            .octavia()
            .create_listener(&ListenerSpec {
                name: "l".into(),
                loadbalancer_id: lb.id.clone(),
                protocol: "TCP".into(),
                protocol_port: 6443,
                ..ListenerSpec::default()
            })
            .await
            .unwrap();
        wait_lb_active(&client, &lb.id).await;
        client
            .octavia()
            .delete_load_balancer(&lb.id, true)
            .await
            .unwrap();
        if delete_delay > 0.0 {
            let (status, _) = net(&sim, http::Method::GET, &vip_port, None).await;
            assert_eq!(status, 200, "the VIP port stays while the delete runs");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let (status, _) = net(&sim, http::Method::GET, &vip_port, None).await;
        assert_eq!(
            status, 404,
            "VIP port released (delete delay {delete_delay})"
        );
        assert_eq!(sim.object_counts(), before);
    }
}

/// The LB list's fast path (only row fields asked for, no filters) answers what the full
/// rendering, trimmed to those fields, answers.
#[tokio::test(start_paused = true)]
async fn lb_rows_are_the_full_list_trimmed() {
    let (sim, client) = in_process(quick()).await;
    for name in ["rows-a", "rows-b", "rows-c"] {
        lb_with_pool(&client, name).await;
    }
    let service = capo_provider::cloud::Service::LoadBalancer;
    let fields = [
        "id",
        "name",
        "provisioning_status",
        "operating_status",
        "updated_at",
    ];
    let query: Vec<String> = fields.iter().map(|f| format!("fields={f}")).collect();
    let (status, rows) = sim_call(
        &sim,
        service,
        http::Method::GET,
        &format!("lbaas/loadbalancers?{}", query.join("&")),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (_, full) = sim_call(
        &sim,
        service,
        http::Method::GET,
        "lbaas/loadbalancers",
        None,
    )
    .await;
    let trimmed: Vec<Value> = full["loadbalancers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lb| {
            Value::Object(
                fields
                    .iter()
                    .map(|f| ((*f).to_owned(), lb[*f].clone()))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(rows["loadbalancers"], Value::Array(trimmed));
    assert_eq!(rows["loadbalancers"].as_array().map(Vec::len), Some(3));
}

/// A cloud with a page size below 1,000 answers short pages that are not the last: the rows
/// list follows them to the end, and stops early only once every wanted LB was listed.
#[tokio::test(start_paused = true)]
async fn lb_rows_follow_a_smaller_page_size_to_the_end() {
    let sim = OpenStackSim::start(OpenStackSimConfig {
        settings: CloudSettings {
            octavia_page_max: 2,
            ..CloudSettings::default()
        },
        scenario: quick(),
        ..OpenStackSimConfig::default()
    })
    .await
    .unwrap();
    let registry = Registry::new();
    let clouds = Clouds::new(CloudOptions::default(), &registry, CancellationToken::new()).unwrap();
    let client = clouds.client(sim.session());
    let mut ids = Vec::new();
    for name in ["page-a", "page-b", "page-c", "page-d", "page-e"] {
        ids.push(lb_with_pool(&client, name).await.0);
    }
    let before = sim.request_count("load-balancer loadbalancer_list");
    let rows = client.octavia().list_load_balancer_rows().await.unwrap();
    let listed: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(listed, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        sim.request_count("load-balancer loadbalancer_list") - before,
        3,
        "2 + 2 + 1"
    );
    let wanted: std::collections::HashSet<String> = ids[..2].iter().cloned().collect();
    let before = sim.request_count("load-balancer loadbalancer_list");
    client
        .octavia()
        .list_load_balancer_rows_covering(Some(&wanted))
        .await
        .unwrap();
    assert_eq!(
        sim.request_count("load-balancer loadbalancer_list") - before,
        1,
        "both wanted LBs were on the first page"
    );
}

/// What gophercloud (CAPO v0.14.7's client) reads before anything else, answered as the real
/// tier's services answer it (checked against it on 2026-11-28): each service's versions
/// (Neutron's and Octavia's 200, Glance's 300 Multiple Choices, Nova's v2.1 document with its
/// microversion), the token validated again with `GET /v3/auth/tokens`, Neutron's extension
/// list; and Neutron's rule that a floating IP update without a `port_id` disassociates it
/// (CAPO 0.14 disassociates with `{"floatingip": {}}`; Neutron's `_check_and_get_fip_assoc`).
#[tokio::test]
async fn what_gophercloud_reads_first_is_answered_as_the_real_tier_answers_it() {
    let sim = start(false, quick()).await;
    let raw = Raw::new(&sim).await;
    let (status, network) = raw.get("/network/").await;
    assert_eq!(
        (status, &network["versions"][0]["id"]),
        (200, &json!("v2.0"))
    );
    assert_eq!(raw.get("/image/").await.0, 300);
    let (status, compute) = raw.get("/compute/v2.1/").await;
    assert_eq!(status, 200);
    assert_eq!(compute["version"]["min_version"], "2.1");
    assert!(
        compute["version"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("2."))
    );
    let (status, lb) = raw.get("/load-balancer/").await;
    assert_eq!((status, lb["versions"].is_array()), (200, true));

    let validate = |token: &str| {
        raw.http
            .get(format!("{}/auth/tokens", sim.auth_url()))
            .header("x-auth-token", token)
            .header("x-subject-token", token)
            .send()
    };
    let validated = validate(&raw.token).await.unwrap();
    assert_eq!(validated.status(), 200);
    assert_eq!(validated.headers()["x-subject-token"], raw.token.as_str());
    let body: Value = validated.json().await.unwrap();
    assert_eq!(body["token"]["project"]["name"], "demo");
    assert!(body["token"]["catalog"].is_array());
    assert_eq!(validate("gAAAAAforged").await.unwrap().status(), 404);

    let (status, extensions) = raw.get("/network/v2.0/extensions").await;
    assert_eq!(status, 200);
    let aliases: Vec<&str> = (extensions["extensions"].as_array().unwrap().iter())
        .filter_map(|e| e["alias"].as_str())
        .collect();
    assert!(aliases.contains(&"trunk"), "{aliases:?}");

    let fip = associated_floating_ip(&raw).await;
    let path = format!("/network/v2.0/floatingips/{fip}");
    let put = |body: Value| raw.call(reqwest::Method::PUT, &path, Some(body));
    let (status, refused) = put(json!({"floatingip": {"fixed_ip_address": "10.9.0.5"}})).await;
    assert_eq!(status, 400, "{refused}");
    let (status, updated) = put(json!({"floatingip": {}})).await;
    assert_eq!(status, 200);
    let updated = &updated["floatingip"];
    assert_eq!(
        (&updated["port_id"], &updated["fixed_ip_address"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(updated["status"], "DOWN");
}

/// A floating IP on `public`, associated with a port behind a router: its id.
async fn associated_floating_ip(raw: &Raw) -> String {
    let id = |(status, body): (u16, Value), key: &str| -> String {
        assert!(status < 300, "{key}: {status} {body}");
        body[key]["id"].as_str().unwrap().to_owned()
    };
    let (_, public) = raw.get("/network/v2.0/networks?name=public").await;
    let public = public["networks"][0]["id"].as_str().unwrap().to_owned();
    let network = id(
        raw.post("/network/v2.0/networks", json!({"network": {"name": "n"}}))
            .await,
        "network",
    );
    let subnet = json!({"subnet": {"network_id": network, "cidr": "10.9.0.0/24", "ip_version": 4}});
    let subnet = id(raw.post("/network/v2.0/subnets", subnet).await, "subnet");
    let router = json!({"router": {"name": "r", "external_gateway_info": {"network_id": public}}});
    let router = id(raw.post("/network/v2.0/routers", router).await, "router");
    let interface = format!("/network/v2.0/routers/{router}/add_router_interface");
    let (status, _) = raw
        .call(
            reqwest::Method::PUT,
            &interface,
            Some(json!({"subnet_id": subnet})),
        )
        .await;
    assert_eq!(status, 200);
    let port = id(
        raw.post(
            "/network/v2.0/ports",
            json!({"port": {"network_id": network}}),
        )
        .await,
        "port",
    );
    let fip = json!({"floatingip": {"floating_network_id": public, "port_id": port}});
    id(
        raw.post("/network/v2.0/floatingips", fip).await,
        "floatingip",
    )
}
