//! The Kubernetes half of a test world: the simulated API server, or the real one that
//! `tests/kube/up.sh` starts (kube-apiserver, etcd and kube-controller-manager v1.35).
//!
//! A scenario asks for [`KubeWorld::start`] and runs unchanged on either. On the real server
//! each world gets a namespace of its own (tests run side by side on one server), the tests
//! write as an admin, and the manager runs with a token of capo-rs's ServiceAccount bound to
//! the RBAC `deploy/` ships, so a missing rule fails the scenario.
//!
//! Which server: the simulator, unless `CAPO_TEST_KUBE=real` (set by `.ci/run` for its second
//! pass over the controller scenarios). Scenarios that also run on a real OpenStack use the real
//! server whenever `CAPO_REAL_KUBECONFIG` is set ([`KubeWorld::start_preferring_real`]).
//! `CAPO_REQUIRE_REAL_KUBE=1` turns a missing tier into a failure instead of a notice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use capo_sim::kube::{KubeSim, KubeSimConfig};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Runs `tests/kube/fault.sh ACTION COMPONENT`; only a world that has the server alone may.
pub(crate) async fn fault(world: &KubeWorld, action: &str, component: &str) {
    assert!(world.is_alone(), "a fault needs the real server to itself");
    let status = tokio::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kube/fault.sh"))
        .args([action, component])
        .status()
        .await
        .expect("fault.sh runs");
    assert!(status.success(), "fault.sh {action} {component}: {status}");
}

/// The namespace every simulated world uses.
pub(crate) const SIM_NAMESPACE: &str = "default";

/// The real tier's kubeconfigs, from `tests/kube/up.sh`'s output.
#[derive(Clone, Debug)]
pub(crate) struct RealKube {
    /// system:masters.
    pub(crate) admin: std::path::PathBuf,
    /// capo-rs's ServiceAccount (deploy/rbac.yaml).
    pub(crate) manager: std::path::PathBuf,
}

fn required() -> bool {
    std::env::var("CAPO_REQUIRE_REAL_KUBE").is_ok_and(|v| v == "1")
}

/// The real tier, if started; `None` with a notice (or a failure when it is required).
pub(crate) fn real_kube() -> Option<RealKube> {
    let admin = std::env::var_os("CAPO_REAL_KUBECONFIG").map(std::path::PathBuf::from);
    let manager = std::env::var_os("CAPO_REAL_KUBE_SA_KUBECONFIG").map(std::path::PathBuf::from);
    match (admin, manager) {
        (Some(admin), Some(manager)) if admin.exists() && manager.exists() => {
            Some(RealKube { admin, manager })
        }
        _ if required() => panic!(
            "CAPO_REQUIRE_REAL_KUBE=1 but CAPO_REAL_KUBECONFIG and CAPO_REAL_KUBE_SA_KUBECONFIG \
             do not name kubeconfigs: start the tier with tests/kube/up.sh"
        ),
        _ => {
            eprintln!(
                "NOTICE: the real Kubernetes tier is not started (tests/kube/up.sh sets \
                 CAPO_REAL_KUBECONFIG); skipping"
            );
            None
        }
    }
}

/// A client from a kubeconfig file.
pub(crate) async fn client_from(path: &std::path::Path) -> kube::Client {
    let kubeconfig =
        Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    kube::Client::try_from(config).expect("a client")
}

/// Which API server a scenario asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kube {
    /// The simulator, or the real server when `CAPO_TEST_KUBE=real`.
    AsTheEnvironmentSays,
    /// The real server whenever its tier is started.
    PreferReal,
    /// The simulator: the scenario uses a control only it has.
    Sim,
    /// A real server of the scenario's own, its namespace named so (Cluster API's real CRDs
    /// and manager run there, apart from the shared server's minimal ones).
    Own(&'static str),
}

impl Kube {
    pub(crate) async fn start(self, crds: &[Value]) -> KubeWorld {
        match self {
            Kube::AsTheEnvironmentSays => KubeWorld::start(crds).await,
            Kube::PreferReal => KubeWorld::start_preferring_real(crds).await,
            Kube::Sim => KubeWorld::sim(crds).await,
            Kube::Own(namespace) => KubeWorld::own_real(crds, namespace).await,
        }
    }
}

/// Which API server a world runs on.
pub(crate) enum Server {
    Sim(KubeSim),
    Real,
}

/// Worlds on the real server share it; a scenario that stops a component of the tier has it
/// alone ([`KubeWorld::real_alone`]) and waits until the others are done.
static SHARED: std::sync::LazyLock<Arc<RwLock<()>>> =
    std::sync::LazyLock::new(|| Arc::new(RwLock::new(())));

/// How a world holds the real server.
enum Hold {
    Sim,
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// An API server, a namespace on it, and the clients of the tests and of the manager.
pub(crate) struct KubeWorld {
    pub(crate) server: Server,
    hold: Hold,
    pub(crate) namespace: String,
    /// The tests' own client (an admin on the real server).
    pub(crate) client: kube::Client,
    /// The manager's client (capo-rs's ServiceAccount on the real server).
    pub(crate) manager_client: kube::Client,
    /// A tier this world started for itself ([`KubeWorld::own_real`]), stopped with it.
    own_tier: Option<OwnTier>,
}

impl KubeWorld {
    /// The server `CAPO_TEST_KUBE` names (the simulator by default), with `crds` installed.
    pub(crate) async fn start(crds: &[Value]) -> Self {
        if std::env::var("CAPO_TEST_KUBE").is_ok_and(|v| v == "real") {
            match real_kube() {
                Some(real) => return Self::real(real, crds).await,
                None => panic!("CAPO_TEST_KUBE=real but the real Kubernetes tier is not started"),
            }
        }
        Self::sim(crds).await
    }

    /// The real server when the tier is started, the simulator otherwise.
    pub(crate) async fn start_preferring_real(crds: &[Value]) -> Self {
        match real_kube() {
            Some(real) => Self::real(real, crds).await,
            None => Self::sim(crds).await,
        }
    }

    /// The simulator, whatever the environment says: for scenarios that need a control only
    /// the simulator has (its request log, its conversion router, a restart of the server).
    pub(crate) async fn sim(crds: &[Value]) -> Self {
        let sim = KubeSim::start(KubeSimConfig::default())
            .await
            .expect("the simulated API server");
        sim.install(crds).expect("CRDs install");
        let client = sim.client().expect("a client");
        KubeWorld {
            server: Server::Sim(sim),
            hold: Hold::Sim,
            namespace: SIM_NAMESPACE.to_owned(),
            manager_client: client.clone(),
            client,
            own_tier: None,
        }
    }

    /// The real server, `crds` applied and established, and a namespace of this world's own.
    pub(crate) async fn real(real: RealKube, crds: &[Value]) -> Self {
        let hold = Hold::Shared(SHARED.clone().read_owned().await);
        Self::real_holding(real, crds, hold).await
    }

    /// [`KubeWorld::real`], with the server to itself: no other world runs on it meanwhile, so
    /// the scenario may stop and start the tier's components (`tests/kube/fault.sh`).
    pub(crate) async fn real_alone(real: RealKube, crds: &[Value]) -> Self {
        let hold = Hold::Alone(SHARED.clone().write_owned().await);
        Self::real_holding(real, crds, hold).await
    }

    async fn real_holding(real: RealKube, crds: &[Value], hold: Hold) -> Self {
        let client = client_from(&real.admin).await;
        let manager_client = client_from(&real.manager).await;
        let crds: Vec<Value> = crds.iter().cloned().map(through_shared_webhook).collect();
        apply_crds(&client, &crds).await;
        apply_crds(&client, &admission_configuration()).await;
        let namespace = fresh_namespace(&client).await;
        KubeWorld {
            server: Server::Real,
            hold,
            namespace,
            client,
            manager_client,
            own_tier: None,
        }
    }

    /// A real server of this world's own: a second tier (`tests/kube/up.sh` in a run
    /// directory of its own, on free ports), stopped and purged with the world. For scenarios
    /// that replace cluster-wide state the shared server's other worlds rely on (CAPO 0.14's
    /// CRDs in place of ours, a storage migration). `crds` apply as they are: no conversion
    /// or admission of ours until the scenario installs them ([`KubeWorld::install`]).
    /// The world's namespace is named `namespace`.
    pub(crate) async fn own_real(crds: &[Value], namespace: &str) -> Self {
        Self::own_real_with(crds, namespace, &[]).await
    }

    /// [`KubeWorld::own_real`], its tier started with `env` too (`CAPO_KUBE_AUDIT=1`).
    pub(crate) async fn own_real_with(
        crds: &[Value],
        namespace: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let tier = OwnTier::start(env).await;
        let client = client_from(&tier.kubeconfigs.admin).await;
        let manager_client = client_from(&tier.kubeconfigs.manager).await;
        apply_crds(&client, crds).await;
        let namespace = create_namespace(&client, namespace.to_owned()).await;
        KubeWorld {
            server: Server::Real,
            hold: Hold::Sim,
            namespace,
            client,
            manager_client,
            own_tier: Some(tier),
        }
    }

    /// A server of its own, as real as this one, with a namespace of the same name (the
    /// cloud's resources carry it): [`KubeWorld::own_real`] beside a real world, a fresh
    /// simulator beside a simulated one.
    pub(crate) async fn own_server_like(&self, crds: &[Value]) -> Self {
        if self.is_real() {
            Self::own_real(crds, &self.namespace).await
        } else {
            Self::sim(crds).await
        }
    }

    /// Our CRDs (conversion through the shared webhook) and our ValidatingWebhookConfiguration,
    /// applied over what is installed, as `deploy/` with cert-manager's CA injection would.
    pub(crate) async fn install_ours(&self) {
        let ours: Vec<Value> = capo_api::crds::all()
            .iter()
            .map(|crd| serde_json::to_value(crd).expect("CRD"))
            .chain(admission_as_shipped())
            .collect();
        self.install(&ours).await;
    }

    /// The run directory of the tier this world started for itself.
    pub(crate) fn own_tier_dir(&self) -> Option<std::path::PathBuf> {
        self.own_tier.as_ref().map(|tier| tier.run.clone())
    }

    /// An admin kubeconfig of the real API server this world is on (none on the simulator).
    pub(crate) fn admin_kubeconfig(&self) -> Option<std::path::PathBuf> {
        match self.own_tier_dir() {
            _ if !self.is_real() => None,
            Some(run) => Some(run.join("admin.kubeconfig")),
            None => real_kube().map(|real| real.admin),
        }
    }

    pub(crate) fn is_real(&self) -> bool {
        matches!(self.server, Server::Real)
    }

    /// Whether this world has the real server to itself.
    pub(crate) fn is_alone(&self) -> bool {
        matches!(self.hold, Hold::Alone(_))
    }

    /// Every request the simulated API server answered, in order; `None` on the real server,
    /// which keeps no such log.
    pub(crate) fn sim_requests(&self) -> Option<Vec<capo_sim::kube::server::RequestRecord>> {
        match &self.server {
            Server::Sim(sim) => Some(sim.requests()),
            Server::Real => None,
        }
    }

    /// The simulator: only for scenarios that run on it alone.
    #[track_caller]
    pub(crate) fn simulator(&self) -> &KubeSim {
        match &self.server {
            Server::Sim(sim) => sim,
            Server::Real => panic!("this step needs the simulated API server"),
        }
    }

    /// An API of `K` in this world's namespace, as the tests' client.
    pub(crate) fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Installs more objects (CRDs, cluster-scoped or namespaced, JSON) as an admin.
    pub(crate) async fn install(&self, objects: &[Value]) {
        match &self.server {
            Server::Sim(sim) => sim.install(objects).expect("objects install"),
            Server::Real => self.apply(objects).await,
        }
    }

    /// Applies objects server-side as an admin, over what is installed (a CRD replaced).
    pub(crate) async fn apply(&self, objects: &[Value]) {
        match &self.server {
            Server::Sim(_) => apply_crds(&self.client, objects).await,
            Server::Real => {
                let objects: Vec<Value> = objects
                    .iter()
                    .cloned()
                    .map(through_shared_webhook)
                    .collect();
                apply_crds(&self.client, &objects).await
            }
        }
    }
}

impl Drop for KubeWorld {
    /// The real server's namespace goes with its world: kube-controller-manager empties it.
    fn drop(&mut self) {
        if !self.is_real() || self.own_tier.is_some() {
            return;
        }
        let (client, namespace) = (self.client.clone(), self.namespace.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let namespaces: Api<Namespace> = Api::all(client);
                let _ = namespaces
                    .delete(&namespace, &DeleteParams::background())
                    .await;
            });
        }
    }
}

/// A second real tier, on free ports in a run directory of its own; `down.sh --purge` when
/// dropped.
struct OwnTier {
    run: std::path::PathBuf,
    env: Vec<(String, String)>,
    kubeconfigs: RealKube,
}

impl OwnTier {
    async fn start(extra: &[(&str, &str)]) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let run = std::env::temp_dir().join(format!(
            "capo-kube-own-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let ports = free_ports(4);
        let mut env = vec![("CAPO_KUBE_RUN".to_owned(), run.display().to_string())];
        for (name, port) in [
            "CAPO_KUBE_ETCD_PORT",
            "CAPO_KUBE_ETCD_PEER_PORT",
            "CAPO_KUBE_APISERVER_PORT",
            "CAPO_KUBE_KCM_PORT",
        ]
        .into_iter()
        .zip(ports)
        {
            env.push((name.to_owned(), port.to_string()));
        }
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let tier = OwnTier {
            run: run.clone(),
            env,
            kubeconfigs: RealKube {
                admin: run.join("admin.kubeconfig"),
                manager: run.join("capo-rs.kubeconfig"),
            },
        };
        let started = tokio::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kube/up.sh"))
            .envs(tier.env.iter().cloned())
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .expect("up.sh runs");
        assert!(started.success(), "a tier of its own: up.sh {started}");
        tier
    }
}

impl Drop for OwnTier {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kube/down.sh"))
            .arg("--purge")
            .envs(self.env.iter().cloned())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `n` ports nothing listens on now (held together, so distinct).
fn free_ports(n: usize) -> Vec<u16> {
    // Below Linux's ephemeral range (32768 and up): a port picked there is free again once
    // released, and an outgoing connection of any test could take it before up.sh binds it
    // (kube-controller-manager, bound last, once lost its port that way). Each call starts
    // where the last one stopped, so two tiers of this process never share a port. The
    // shared tiers' own ports (tests/kube/lib.sh and .ci/run's second tier; the OpenStack
    // tier's are below 20000) stay theirs while a fault scenario has them stopped.
    static CURSOR: AtomicU64 = AtomicU64::new(0);
    const FIRST: u64 = 20_000;
    const SPAN: u64 = 12_000;
    const SHARED_TIERS: [u16; 8] = [20257, 21257, 22379, 22380, 23379, 23380, 26443, 27443];
    let offset = u64::from(std::process::id()) * 211 % SPAN;
    let mut held = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if held.len() == n {
            break;
        }
        let step = CURSOR.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + (offset + step) % SPAN).expect("a port below 32768");
        if SHARED_TIERS.contains(&port) {
            continue;
        }
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    assert_eq!(held.len(), n, "{n} free ports below the ephemeral range");
    held.iter()
        .map(|l| l.local_addr().expect("an address").port())
        .collect()
}

/// capo-rs's webhook server for every world on the real server in this test process: one
/// server on 127.0.0.1, on a thread of its own (it outlives each test's runtime). Every real
/// world's CRDs convert through it and our ValidatingWebhookConfiguration admits through it,
/// trusted by the CA bundle cert-manager's injector would put there.
pub(crate) struct SharedWebhook {
    pub(crate) base: String,
    pub(crate) ca_bundle: String,
    pub(crate) registry: prometheus::Registry,
}

pub(crate) fn shared_webhook() -> &'static SharedWebhook {
    static WEBHOOK: std::sync::LazyLock<SharedWebhook> = std::sync::LazyLock::new(|| {
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("real-kube-webhook".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    let webhook = crate::conversion::ServedWebhook::start_for_real().await;
                    let _ = sent.send(SharedWebhook {
                        base: webhook.url(""),
                        ca_bundle: webhook.certs.ca_bundle(),
                        registry: webhook.registry.clone(),
                    });
                    std::future::pending::<()>().await;
                    drop(webhook);
                });
            })
            .expect("the webhook's thread");
        received.recv().expect("the shared webhook starts")
    });
    &WEBHOOK
}

/// `object` (a CRD or a webhook configuration) pointing at the shared webhook by URL.
fn through_shared_webhook(object: Value) -> Value {
    let webhook = shared_webhook();
    through_webhook(object, &webhook.base, &webhook.ca_bundle)
}

/// `object` (a CRD converting through a webhook, or a ValidatingWebhookConfiguration) calling
/// the webhook at `base` (`https://127.0.0.1:PORT`) by URL, trusting `ca_bundle`.
pub(crate) fn through_webhook(mut object: Value, base: &str, ca_bundle: &str) -> Value {
    let client_config = |path: &str| json!({"url": format!("{base}{path}"), "caBundle": ca_bundle});
    if object["kind"] == "CustomResourceDefinition" {
        if object["spec"]["conversion"]["strategy"] == "Webhook" {
            let path = object["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or("/convert")
                .to_owned();
            object["spec"]["conversion"]["webhook"]["clientConfig"] = client_config(&path);
        }
    } else if object["kind"] == "ValidatingWebhookConfiguration" {
        for hook in object["webhooks"].as_array_mut().into_iter().flatten() {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            hook["clientConfig"] = client_config(&path);
        }
    }
    object
}

/// Our ValidatingWebhookConfiguration as `deploy/` has it (through its Service).
pub(crate) fn admission_as_shipped() -> Vec<Value> {
    capo_provider::manager::manifests::objects(capo_provider::manager::manifests::Flavor::Kustomize)
        .into_iter()
        .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .collect()
}

/// Our ValidatingWebhookConfiguration, through the shared webhook.
fn admission_configuration() -> Vec<Value> {
    admission_as_shipped()
        .into_iter()
        .map(through_shared_webhook)
        .collect()
}

/// Server-side applies each object (a CRD, or anything else the tests need cluster-wide) and
/// waits until every CRD among them is established.
pub(crate) async fn apply_crds(client: &kube::Client, objects: &[Value]) {
    let apply = PatchParams::apply("capo-rs-tests").force();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let dynamic = dynamic_api(client, object);
        replace_service_references(&dynamic, name, object).await;
        if kind != "CustomResourceDefinition" {
            dynamic
                .patch(name, &apply, &Patch::Apply(object))
                .await
                .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
            continue;
        }
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.patch(name, &apply, &Patch::Apply(object))
            .await
            .unwrap_or_else(|e| panic!("the real API server refused CRD {name}: {e}"));
        let established = kube::runtime::wait::await_condition(
            crds,
            name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not established within 30 s"))
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    }
}

/// Where an installed object (as `clusterctl init` leaves it) calls its webhooks through a
/// Service and `object` calls them by URL, the URL replaces the Service first, as one merge
/// patch: a server-side apply would keep the Service beside the URL, which the API server
/// refuses ("exactly one of url or service").
async fn replace_service_references(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    object: &Value,
) {
    // Only an object that calls its webhooks by URL can replace a Service reference: the rest
    // need no look at what is installed.
    let by_url = object
        .pointer("/spec/conversion/webhook/clientConfig/url")
        .is_some()
        || (object["webhooks"].as_array().into_iter().flatten())
            .any(|hook| hook.pointer("/clientConfig/url").is_some());
    if !by_url {
        return;
    }
    let Ok(Some(installed)) = api.get_opt(name).await else {
        return;
    };
    let installed = serde_json::to_value(installed).unwrap_or_default();
    let patch = match object["kind"].as_str() {
        Some("CustomResourceDefinition") => {
            let by_service = installed
                .pointer("/spec/conversion/webhook/clientConfig/service")
                .is_some();
            let mut conversion = object["spec"]["conversion"].clone();
            match conversion.pointer_mut("/webhook/clientConfig") {
                Some(config) if by_service && config.get("url").is_some() => {
                    config["service"] = Value::Null;
                }
                _ => return,
            }
            json!({"spec": {"conversion": conversion}})
        }
        Some(_) if object.get("webhooks").is_some() => {
            let by_service = installed["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|hook| hook.pointer("/clientConfig/service").is_some());
            if !by_service {
                return;
            }
            json!({"webhooks": object["webhooks"]})
        }
        _ => return,
    };
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("{name}: its webhook's Service replaced by a URL: {e}"));
}

/// A dynamic API for a JSON object's kind (namespaced when it names a namespace).
pub(crate) fn dynamic_api(client: &kube::Client, object: &Value) -> Api<kube::api::DynamicObject> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
    let lower = kind.to_ascii_lowercase();
    let plural = match lower.ends_with('s') {
        true => format!("{lower}es"),
        false => format!("{lower}s"),
    };
    let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, &plural);
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// A namespace no other world (of this run or an earlier one) has used.
async fn fresh_namespace(client: &kube::Client) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 1_000_000_000)
        .unwrap_or_default();
    let name = format!(
        "t{}-{started}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    create_namespace(client, name).await
}

async fn create_namespace(client: &kube::Client, name: String) -> String {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"capo-rs.test/world": "real"}},
    }))
    .expect("a namespace");
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
    name
}
