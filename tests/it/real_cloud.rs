//! The real OpenStack test tier (`tests/openstack/up.sh`: Keystone, Glance, Placement, Nova,
//! Neutron, Cinder and Octavia of one release, on 127.0.0.1): what every real test shares.
//!
//! The tier is found through `CAPO_REAL_OPENSTACK_CLOUDS`, the clouds.yaml up.sh writes (clouds
//! `capo`, password; `capo-appcred`, an application credential; both the tenant `capo`).
//! Without it the `real_*` tests print a notice and pass, unless `CAPO_REQUIRE_REAL_OPENSTACK=1`
//! (set by `.ci/run`) makes a missing tier a failure. The tests share one cloud and its faults
//! (`tests/openstack/fault.sh`), so they run one at a time under [`REAL`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use capo_provider::cloud::{CloudClient, CloudCredentials, CloudOptions, Clouds, Service};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

/// The real tests share one cloud and its faults: one at a time.
pub static REAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The tenant's cloud with a password.
pub const PASSWORD_CLOUD: &str = "capo";
/// The tier's administrator (what Neutron's default policy keeps for admins: a port's
/// `binding:profile` and `trusted`).
pub const ADMIN_CLOUD: &str = "capo-admin";
/// The tenant's cloud with an application credential.
pub const APPCRED_CLOUD: &str = "capo-appcred";

/// The real tier's credentials.
pub struct RealCloud {
    pub clouds_yaml_path: PathBuf,
    pub clouds_yaml: String,
}

/// The real tier, or `None` (with a notice) when it is not running and not required.
pub fn real_cloud() -> Option<RealCloud> {
    let required = std::env::var("CAPO_REQUIRE_REAL_OPENSTACK").is_ok_and(|v| v == "1");
    let Some(path) = std::env::var_os("CAPO_REAL_OPENSTACK_CLOUDS").filter(|p| !p.is_empty())
    else {
        assert!(
            !required,
            "CAPO_REQUIRE_REAL_OPENSTACK=1 but CAPO_REAL_OPENSTACK_CLOUDS is unset: start the tier with tests/openstack/up.sh"
        );
        eprintln!(
            "NOTICE: CAPO_REAL_OPENSTACK_CLOUDS is unset; skipping the real OpenStack tier (tests/openstack/up.sh starts it)"
        );
        return None;
    };
    let path = PathBuf::from(path);
    let clouds_yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "CAPO_REAL_OPENSTACK_CLOUDS: cannot read {}: {e}",
            path.display()
        )
    });
    Some(RealCloud {
        clouds_yaml_path: path,
        clouds_yaml,
    })
}

impl RealCloud {
    pub fn credentials(&self, cloud: &str) -> CloudCredentials {
        CloudCredentials {
            clouds_yaml: self.clouds_yaml.clone(),
            cacert: None,
            cloud_name: cloud.to_owned(),
            region: None,
        }
    }

    /// A client of our own, authenticated through the real Keystone.
    pub async fn client(&self, cloud: &str) -> (CloudClient, Arc<Clouds>) {
        let clouds = Clouds::new(
            CloudOptions::default(),
            &Registry::new(),
            CancellationToken::new(),
        )
        .expect("clouds");
        let client = clouds
            .connect(&self.credentials(cloud))
            .await
            .unwrap_or_else(|e| panic!("authenticating as {cloud} on the real tier: {e}"));
        (client, clouds)
    }
}

fn fault_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openstack/fault.sh")
}

/// Runs the fault helper; a fault that cannot be set is a failed test, not a quiet one.
pub async fn fault(args: &[&str]) {
    fault_in_scope("", args).await;
}

/// `fault.sh` with `CAPO_FAULT_SCOPE=scope`: member faults that no other suite's `clear`
/// touches (an empty scope is the shared one).
pub async fn fault_in_scope(scope: &str, args: &[&str]) {
    let output = tokio::process::Command::new("bash")
        .arg(fault_script())
        .args(args)
        .env("CAPO_FAULT_SCOPE", scope)
        .output()
        .await
        .expect("run tests/openstack/fault.sh");
    assert!(
        output.status.success(),
        "fault.sh {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One GET through the client's authenticated session, as JSON.
pub async fn get_json(client: &CloudClient, service: Service, path: &str) -> serde_json::Value {
    try_get_json(client, service, path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`get_json`], with a failure (a service stopped meanwhile, an answer other than 200) as an
/// error that says what was asked.
pub async fn try_get_json(
    client: &CloudClient,
    service: Service,
    path: &str,
) -> Result<serde_json::Value, String> {
    let session = client.path().session();
    let base = session
        .service_url(service)
        .await
        .map_err(|e| format!("{service}'s URL: {e}"))?;
    let url = base.join(path).expect("a URL");
    let mut request = http::Request::get(url.as_str());
    if service == Service::BlockStorage {
        request = request.header("openstack-api-version", "volume 3.0");
    }
    let response = session
        .send(request.body(Vec::new()).expect("request"))
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if response.status() != 200 {
        return Err(format!("GET {url}: {}", response.status()));
    }
    serde_json::from_slice(response.body()).map_err(|e| format!("GET {url}: {e}"))
}

/// One DELETE through the client's authenticated session; its status.
pub async fn delete_path(client: &CloudClient, service: Service, path: &str) -> u16 {
    let session = client.path().session();
    let base = session
        .service_url(service)
        .await
        .unwrap_or_else(|e| panic!("{service}'s URL: {e}"));
    let url = base.join(path).expect("a URL");
    let request = http::Request::delete(url.as_str()).body(Vec::new());
    let response = session
        .send(request.expect("request"))
        .await
        .unwrap_or_else(|e| panic!("DELETE {url}: {e}"));
    response.status().as_u16()
}

/// What a project holds: per kind, each object's id and name.
pub type Census = BTreeMap<&'static str, BTreeMap<String, String>>;

/// What a project holds, by kind: the ids and names of its servers, ports, networks, subnets,
/// routers, security groups, floating IPs, volumes and load balancers, read through the real
/// APIs (a floating IP's "name" is its address).
pub async fn census(client: &CloudClient) -> Census {
    let kinds: [(&str, Service, &str, &str); 9] = [
        ("servers", Service::Compute, "servers", "servers"),
        ("ports", Service::Network, "ports", "ports"),
        ("networks", Service::Network, "networks", "networks"),
        ("subnets", Service::Network, "subnets", "subnets"),
        ("routers", Service::Network, "routers", "routers"),
        (
            "security groups",
            Service::Network,
            "security-groups",
            "security_groups",
        ),
        (
            "floating IPs",
            Service::Network,
            "floatingips",
            "floatingips",
        ),
        ("volumes", Service::BlockStorage, "volumes", "volumes"),
        (
            "load balancers",
            Service::LoadBalancer,
            "lbaas/loadbalancers",
            "loadbalancers",
        ),
    ];
    let mut census = BTreeMap::new();
    for (kind, service, path, key) in kinds {
        let body = get_json(client, service, path).await;
        let objects = body[key]
            .as_array()
            .unwrap_or_else(|| panic!("{path} lists {key}: {body}"))
            .iter()
            .filter_map(|item| {
                let id = item["id"].as_str()?.to_owned();
                let name = item["name"]
                    .as_str()
                    .or(item["floating_ip_address"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                Some((id, name))
            })
            .collect();
        census.insert(kind, objects);
    }
    census
}

/// What `after` holds that `before` did not, by kind, as `name (id)` (empty when nothing is
/// new).
pub fn new_objects(before: &Census, after: &Census) -> BTreeMap<&'static str, Vec<String>> {
    after
        .iter()
        .filter_map(|(kind, objects)| {
            let known = before.get(kind);
            let new: Vec<String> = objects
                .iter()
                .filter(|(id, _)| known.is_none_or(|k| !k.contains_key(*id)))
                .map(|(id, name)| format!("{name} ({id})"))
                .collect();
            (!new.is_empty()).then_some((*kind, new))
        })
        .collect()
}

/// Names that more than one new object of a kind carries: what a provider that lost track of
/// an object and made it again would leave.
pub fn duplicated_names(before: &Census, after: &Census) -> Vec<String> {
    let mut duplicated = Vec::new();
    for (kind, objects) in after {
        let mut seen = BTreeMap::<&str, usize>::new();
        for (id, name) in objects {
            if before.get(kind).is_some_and(|k| k.contains_key(id)) || name.is_empty() {
                continue;
            }
            *seen.entry(name).or_default() += 1;
        }
        duplicated.extend(
            seen.into_iter()
                .filter(|(_, n)| *n > 1)
                .map(|(name, n)| format!("{kind} {name:?} x{n}")),
        );
    }
    duplicated
}
