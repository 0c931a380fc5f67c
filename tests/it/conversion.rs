//! v1beta1 beside v1beta2 through the conversion webhook, end to end: capo-rs's HTTPS
//! webhook server, called by the simulated API server as kube-apiserver calls it (through
//! the webhook Service, trusting the CA cert-manager's injector put in the CRDs); its
//! failures, its certificate rotation, the storedVersions rules, and the storage migration.

use std::time::Duration;

use capo_api::conversion::{DATA_ANNOTATION, HUB, SPOKE};
use capo_provider::manager::migration::{self, MigrationMetrics};
use capo_provider::manager::webhook::{self, WebhookConfig, WebhookMetrics};
use capo_sim::certs::WebhookCerts;
use capo_sim::kube::{KubeSim, KubeSimConfig};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "takeover";

/// The Service's DNS names, as the Certificate in `deploy/` lists them.
pub(crate) fn service_names() -> Vec<String> {
    let (namespace, name) = capo_api::crds::WEBHOOK_SERVICE;
    vec![
        format!("{name}.{namespace}.svc"),
        format!("{name}.{namespace}.svc.cluster.local"),
    ]
}

/// A simulated API server with our CRDs, and capo-rs's webhook server behind the webhook
/// Service.
pub struct WebhookWorld {
    pub sim: KubeSim,
    pub client: Client,
    pub webhook: ServedWebhook,
}

/// capo-rs's webhook server, serving with a fresh certificate, behind the simulated API
/// server's webhook Service.
pub struct ServedWebhook {
    pub certs: WebhookCerts,
    pub cert_dir: tempfile::TempDir,
    pub registry: prometheus::Registry,
    pub address: std::net::SocketAddr,
    pub stop: CancellationToken,
}

impl Drop for ServedWebhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ServedWebhook {
    /// Serving behind the simulated API server's webhook Service.
    pub async fn start(sim: &KubeSim) -> Self {
        let webhook = Self::serve(&service_names()).await;
        let (namespace, name) = capo_api::crds::WEBHOOK_SERVICE;
        sim.converter().route(namespace, name, webhook.address);
        webhook
    }

    /// Serving on 127.0.0.1 with a certificate for the Service's names and that address, as a
    /// real API server reaches it by URL (it has no route to a Service here: no kube-proxy).
    pub async fn start_for_real() -> Self {
        let mut names = service_names();
        names.push("127.0.0.1".into());
        Self::serve(&names).await
    }

    async fn serve(names: &[String]) -> Self {
        let certs = WebhookCerts::issue(names).expect("certificates");
        let cert_dir = tempfile::tempdir().expect("a temporary directory");
        certs.write(cert_dir.path()).expect("certificates written");
        let registry = prometheus::Registry::new();
        let stop = CancellationToken::new();
        let (address, _task) = webhook::serve(
            WebhookConfig {
                address: "127.0.0.1:0".parse().expect("an address"),
                cert_dir: cert_dir.path().to_owned(),
                reload_every: Duration::from_millis(20),
            },
            WebhookMetrics::register(&registry).expect("metrics"),
            webhook::capo_rules::capo_validators(),
            stop.clone(),
        )
        .await
        .expect("the webhook server starts");
        ServedWebhook {
            certs,
            cert_dir,
            registry,
            address,
            stop,
        }
    }

    /// `https://127.0.0.1:<port><path>`: where a real API server reaches this server.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.address)
    }

    /// Our CRDs applied over what is installed (server-side, taking the fields over), as
    /// cert-manager leaves them: the CA injected.
    pub async fn upgrade_crds(&self, client: &Client) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in our_crds(&self.certs) {
            let name = crd["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            crds.patch(
                &name,
                &PatchParams::apply("kubectl").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

impl WebhookWorld {
    /// Our CRDs installed (with `crds` in place of ours when given: CAPO 0.14's).
    pub async fn start(crds: Option<Vec<Value>>) -> Self {
        let sim = KubeSim::start(KubeSimConfig::default())
            .await
            .expect("simulator");
        let webhook = ServedWebhook::start(&sim).await;
        let crds = crds.unwrap_or_else(|| our_crds(&webhook.certs));
        sim.install(&crds).expect("CRDs installed");
        sim.install(&[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})])
            .expect("namespace");
        let client = sim.client().expect("client");
        WebhookWorld {
            sim,
            client,
            webhook,
        }
    }

    pub fn api(&self, kind: &str, version: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &resource(kind, version))
    }

    /// Conversions answered by the webhook so far.
    pub fn conversions(&self) -> u64 {
        self.sim.converter().calls()
    }
}

/// Our CRDs as cert-manager leaves them: the CA injected.
pub fn our_crds(certs: &WebhookCerts) -> Vec<Value> {
    capo_api::crds::all()
        .into_iter()
        .map(|crd| {
            let mut crd = serde_json::to_value(crd).expect("CRD as JSON");
            certs.inject_into(&mut crd);
            crd
        })
        .collect()
}

pub fn resource(kind: &str, version: &str) -> ApiResource {
    ApiResource {
        group: capo_api::GROUP.into(),
        version: version.into(),
        api_version: format!("{}/{version}", capo_api::GROUP),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

/// `doc` as the API server stores it in `version`: with that version's schema defaults.
pub fn defaulted(doc: &Value, version: &str) -> Value {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let crd = crate::common::our_crd(kind);
    let schema = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .expect("the version is served");
    let mut doc = doc.clone();
    capo_sim::structural::apply_defaults(&mut doc, &schema);
    doc
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a DynamicObject")
}

pub fn spoke_machine(name: &str) -> Value {
    json!({
        "apiVersion": format!("{}/{SPOKE}", capo_api::GROUP), "kind": "OpenStackMachine",
        "metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
        "spec": {"flavor": "m1.medium", "image": {"filter": {"name": "ubuntu"}},
                 "ports": [{"disablePortSecurity": false}], "sshKeyName": "key"},
    })
}

pub fn spoke_cluster(name: &str) -> Value {
    json!({
        "apiVersion": format!("{}/{SPOKE}", capo_api::GROUP), "kind": "OpenStackCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "identityRef": {"name": "cloud-config", "cloudName": "openstack"},
            "apiServerLoadBalancer": {"enabled": true},
            "disableAPIServerFloatingIP": false,
            "externalNetwork": {"id": "8a2c1c2a-6d7e-4a1f-9f3e-0c1e6a1e0a11"},
            "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["8.8.8.8"]}],
            "managedSecurityGroups": {"allNodesSecurityGroupRules": [{"name": "BGP", "direction": "ingress", "etherType": "IPv4", "portRangeMin": 179, "portRangeMax": 179, "protocol": "tcp", "remoteManagedGroups": ["controlplane", "worker"]}]},
            "bastion": {"enabled": true, "spec": {"flavor": "m1.small", "image": {"filter": {"name": "ubuntu"}}, "sshKeyName": "key"}},
        },
    })
}

#[tokio::test]
async fn a_v1beta1_manifest_is_stored_as_v1beta2_and_reads_back_the_same_in_v1beta1() {
    let world = WebhookWorld::start(None).await;
    for (kind, sent) in [
        ("OpenStackCluster", spoke_cluster("c")),
        ("OpenStackMachine", spoke_machine("m")),
    ] {
        let spoke = world.api(kind, SPOKE);
        let created = spoke
            .create(&PostParams::default(), &object(sent.clone()))
            .await
            .expect("created in v1beta1");
        let hub = world
            .api(kind, HUB)
            .get(created.metadata.name.as_deref().unwrap_or_default())
            .await
            .expect("read in v1beta2");
        let hub = serde_json::to_value(&hub).expect("JSON");
        match kind {
            "OpenStackCluster" => {
                assert_eq!(
                    hub["spec"]["apiServer"],
                    json!({"enableFloatingIP": true, "managedLoadBalancer": {"enabled": true}})
                );
                assert_eq!(
                    hub["spec"]["managedSecurityGroups"]["clusterNodesSecurityGroupRules"][0]["name"],
                    "BGP"
                );
                assert_eq!(
                    hub["spec"]["bastion"]["spec"]["flavor"],
                    json!({"filter": {"name": "m1.small"}})
                );
            }
            _ => {
                assert_eq!(
                    hub["spec"]["flavor"],
                    json!({"filter": {"name": "m1.medium"}})
                );
                assert_eq!(hub["spec"]["ports"], json!([{"enablePortSecurity": true}]));
            }
        }
        let back = serde_json::to_value(
            spoke
                .get(created.metadata.name.as_deref().unwrap_or_default())
                .await
                .expect("read in v1beta1"),
        )
        .expect("JSON");
        for (field, value) in defaulted(&sent, SPOKE)["spec"].as_object().expect("a spec") {
            assert_eq!(
                &back["spec"][field], value,
                "{kind} spec.{field} comes back as sent"
            );
        }
        assert!(
            back["metadata"]["annotations"]
                .get(DATA_ANNOTATION)
                .is_none(),
            "nothing was lost, nothing kept aside"
        );
    }
    assert!(
        world.conversions() >= 4,
        "the webhook converted: {}",
        world.conversions()
    );
}

#[tokio::test]
async fn lists_and_watches_in_the_other_version_convert_every_object() {
    let world = WebhookWorld::start(None).await;
    let spoke = world.api("OpenStackMachine", SPOKE);
    for name in ["a", "b", "c"] {
        spoke
            .create(&PostParams::default(), &object(spoke_machine(name)))
            .await
            .expect("created");
    }
    let listed = spoke
        .list(&ListParams::default())
        .await
        .expect("a v1beta1 list");
    assert_eq!(listed.items.len(), 3);
    assert!(
        listed
            .items
            .iter()
            .all(|m| m.data["spec"]["flavor"] == "m1.medium")
    );
    let mut events = spoke
        .watch(
            &WatchParams::default(),
            &listed.metadata.resource_version.clone().unwrap_or_default(),
        )
        .await
        .expect("a v1beta1 watch")
        .boxed();
    let hub = world.api("OpenStackMachine", HUB);
    hub.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
    )
    .await
    .expect("patched in v1beta2");
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event in time");
    let Some(Ok(WatchEvent::Modified(machine))) = event else {
        panic!("a MODIFIED event, got {event:?}");
    };
    assert_eq!(
        machine.types.as_ref().map(|t| t.api_version.as_str()),
        Some("infrastructure.cluster.x-k8s.io/v1beta1")
    );
    assert_eq!(machine.data["spec"]["flavor"], "m1.medium");
    assert_eq!(
        machine
            .metadata
            .labels
            .unwrap_or_default()
            .get("seen")
            .map(String::as_str),
        Some("yes")
    );
}

#[tokio::test]
async fn a_webhook_down_fails_reads_of_the_other_version_as_kube_apiserver_does() {
    let world = WebhookWorld::start(None).await;
    world
        .api("OpenStackMachine", SPOKE)
        .create(&PostParams::default(), &object(spoke_machine("m")))
        .await
        .expect("created");
    let (namespace, name) = capo_api::crds::WEBHOOK_SERVICE;
    world.sim.converter().unroute(namespace, name);
    let error = world
        .api("OpenStackMachine", SPOKE)
        .get("m")
        .await
        .expect_err("no webhook, no v1beta1");
    let kube::Error::Api(status) = error else {
        panic!("an API error, got {error:?}");
    };
    assert_eq!(status.code, 500);
    assert!(
        status.message.starts_with("conversion webhook for infrastructure.cluster.x-k8s.io/v1beta2, Kind=OpenStackMachine failed: Post \"https://capo-rs-webhook-service.capo-rs-system.svc:443/convert?timeout=30s\""),
        "{}",
        status.message
    );
    world
        .api("OpenStackMachine", HUB)
        .get("m")
        .await
        .expect("the stored version reads without the webhook");
    // The Service answers again, from a server that was stopped: connection refused.
    world.webhook.stop.cancel();
    world
        .sim
        .converter()
        .route(namespace, name, world.webhook.address);
    let error = loop {
        match world.api("OpenStackMachine", SPOKE).get("m").await {
            Err(kube::Error::Api(status)) if status.message.contains("onnection refused") => {
                break status;
            }
            Err(kube::Error::Api(status)) if status.code == 500 => tokio::task::yield_now().await,
            other => panic!("a refused connection, got {other:?}"),
        }
    };
    assert_eq!(error.code, 500);
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let world = WebhookWorld::start(None).await;
    let spoke = world.api("OpenStackMachine", SPOKE);
    spoke
        .create(&PostParams::default(), &object(spoke_machine("m")))
        .await
        .expect("created");
    // cert-manager renews with a new CA: the Secret's files change, then the injector
    // updates the CRDs.
    let rotated = WebhookCerts::issue(&service_names()).expect("new certificates");
    rotated
        .write(world.webhook.cert_dir.path())
        .expect("rotated files");
    let crds: Api<CustomResourceDefinition> = Api::all(world.client.clone());
    let name = "openstackmachines.infrastructure.cluster.x-k8s.io";
    let ca_bundle = json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": rotated.ca_bundle()}}}}});
    crds.patch(name, &PatchParams::default(), &Patch::Merge(&ca_bundle))
        .await
        .expect("CA injected");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match spoke.get("m").await {
            Ok(machine) => {
                assert_eq!(machine.data["spec"]["flavor"], "m1.medium");
                break;
            }
            // Until the server reloads, it presents the old certificate, which the new CA
            // does not trust.
            Err(kube::Error::Api(status))
                if status.code == 500 && tokio::time::Instant::now() < deadline =>
            {
                assert!(
                    status.message.contains("conversion webhook for"),
                    "{}",
                    status.message
                );
                tokio::task::yield_now().await;
            }
            Err(other) => panic!("the rotated certificate is served within 10 s: {other:?}"),
        }
    }
    let loads = world
        .webhook
        .registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "capo_webhook_certificate_loads_total");
    let loaded: f64 = loads
        .iter()
        .flat_map(|f| f.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == "loaded"))
        .map(|m| m.get_counter().get_value())
        .sum();
    assert_eq!(
        loaded, 2.0,
        "loaded at start and once more after the rotation"
    );
}

/// Our CRDs as CAPO 0.14 shipped its own: v1beta1 alone, served and stored.
pub fn v1beta1_only(crd: &Value) -> Value {
    let mut crd = crd.clone();
    if let Some(Value::Array(versions)) = crd.pointer_mut("/spec/versions") {
        versions.retain(|v| v["name"] != HUB);
        for v in versions.iter_mut() {
            v["storage"] = json!(true);
        }
    }
    if let Some(spec) = crd["spec"].as_object_mut() {
        spec.remove("conversion");
    }
    crd
}

#[tokio::test]
async fn a_crd_that_drops_a_version_still_stored_is_refused_until_storage_is_migrated() {
    let certs = WebhookCerts::issue(&service_names()).expect("certificates");
    let old: Vec<Value> = our_crds(&certs).iter().map(v1beta1_only).collect();
    let world = WebhookWorld::start(Some(old)).await;
    for name in ["a", "b"] {
        world
            .api("OpenStackMachine", SPOKE)
            .create(&PostParams::default(), &object(spoke_machine(name)))
            .await
            .expect("stored as v1beta1");
    }
    // The upgrade: v1beta2 stored, v1beta1 served. storedVersions now lists both.
    let ours = our_crds(&world.webhook.certs);
    let crds: Api<CustomResourceDefinition> = Api::all(world.client.clone());
    for crd in &ours {
        crds.patch(
            crd["metadata"]["name"].as_str().unwrap_or_default(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(crd),
        )
        .await
        .expect("the upgrade applies");
    }
    let name = "openstackmachines.infrastructure.cluster.x-k8s.io";
    let stored = |crd: CustomResourceDefinition| {
        crd.status
            .and_then(|s| s.stored_versions)
            .unwrap_or_default()
    };
    assert_eq!(
        stored(crds.get(name).await.expect("crd")),
        vec![SPOKE.to_owned(), HUB.to_owned()]
    );
    // A CRD serving v1beta2 alone is refused while objects may be stored in v1beta1.
    let mut hub_only = ours
        .iter()
        .find(|c| c["metadata"]["name"] == name)
        .expect("ours")
        .clone();
    if let Some(Value::Array(versions)) = hub_only.pointer_mut("/spec/versions") {
        versions.retain(|v| v["name"] == HUB);
    }
    let refused = crds
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&hub_only),
        )
        .await
        .expect_err("refused");
    let kube::Error::Api(status) = refused else {
        panic!("an API error, got {refused:?}");
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(
        status.message.contains(
            "status.storedVersions[0]: Invalid value: \"v1beta1\": missing from spec.versions"
        ),
        "{}",
        status.message
    );

    // The migration: every object written once, then storedVersions.
    let metrics = MigrationMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let before = world
        .api("OpenStackMachine", HUB)
        .list(&ListParams::default())
        .await
        .expect("list");
    let migrated = migration::migrate(&world.client, name, &metrics)
        .await
        .expect("migrated")
        .expect("something to do");
    assert_eq!((migrated.rewritten, migrated.skipped), (2, 0));
    assert_eq!(
        stored(crds.get(name).await.expect("crd")),
        vec![HUB.to_owned()]
    );
    let after = world
        .api("OpenStackMachine", HUB)
        .list(&ListParams::default())
        .await
        .expect("list");
    for (b, a) in before.items.iter().zip(&after.items) {
        assert_eq!(b.data["spec"], a.data["spec"], "the spec is untouched");
        assert_ne!(
            b.metadata.resource_version, a.metadata.resource_version,
            "the object was written again"
        );
        assert_eq!(b.metadata.generation, a.metadata.generation);
    }
    // Once the objects are all v1beta2, reading them needs no webhook, and the old
    // version may go.
    let calls = world.conversions();
    world
        .api("OpenStackMachine", HUB)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(
        world.conversions(),
        calls,
        "nothing stored in v1beta1 remains"
    );
    crds.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&hub_only),
    )
    .await
    .expect("now accepted");
    // Again: nothing to do.
    assert_eq!(
        migration::migrate(&world.client, name, &metrics)
            .await
            .expect("runs"),
        None
    );
}

/// Every CAPO v1beta1 template's infrastructure objects are accepted in v1beta1, stored as
/// v1beta2, valid there, and read back in v1beta1 as written.
#[tokio::test]
async fn every_capo_v1beta1_template_converts() {
    let Some(dir) =
        crate::common::shared_reference("capo/v0.14.7/templates", "CAPO 0.14's templates")
    else {
        return;
    };
    // With the validating webhook registered: each v1beta1 create, and an unchanged v1beta1
    // update, goes through CAPO's admission rules on the converted objects too.
    let world = crate::admission::admitting_world().await;
    let mut checked = 0;
    for path in crate::common::yaml_files(&dir) {
        let text = crate::common::substitute(&std::fs::read_to_string(&path).expect("template"));
        for doc in crate::common::yaml_documents(&text) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            if doc["apiVersion"] != format!("{}/{SPOKE}", capo_api::GROUP) {
                continue;
            }
            let mut doc = doc.clone();
            doc["metadata"]["namespace"] = json!(NS);
            let at = format!("{} {kind} {}", path.display(), doc["metadata"]["name"]);
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            world
                .api(&kind, SPOKE)
                .create(&PostParams::default(), &object(doc.clone()))
                .await
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            let hub = world
                .api(&kind, HUB)
                .get(&name)
                .await
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            let hub = serde_json::to_value(hub).expect("JSON");
            let schema = crate::common::our_schema(&kind);
            let errors = capo_sim::structural::validate(&hub, &schema);
            assert!(errors.is_empty(), "{at}: invalid as v1beta2: {errors:?}");
            let back = serde_json::to_value(
                world
                    .api(&kind, SPOKE)
                    .get(&name)
                    .await
                    .unwrap_or_else(|e| panic!("{at}: {e}")),
            )
            .expect("JSON");
            for (field, value) in defaulted(&doc, SPOKE)["spec"]
                .as_object()
                .into_iter()
                .flatten()
            {
                assert_eq!(&back["spec"][field], value, "{at}: spec.{field}");
            }
            world
                .api(&kind, SPOKE)
                .replace(&name, &PostParams::default(), &object(back.clone()))
                .await
                .unwrap_or_else(|e| panic!("{at}: an unchanged v1beta1 update: {e}"));
            world
                .api(&kind, HUB)
                .delete(&name, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "CAPO's templates hold v1beta1 objects of our kinds: {checked}"
    );
    eprintln!("{checked} CAPO v1beta1 template objects converted and admitted");
}
