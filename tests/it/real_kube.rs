//! What only the real Kubernetes tier (`tests/kube/up.sh`) can show: our CRDs accepted by a
//! real kube-apiserver 1.35, the conversion webhook called by it through the CRD's
//! `caBundle`, ownerReferences collected by the real garbage collector, and `deploy/` applied
//! server-side. The controller scenarios themselves run here through [`crate::kube_world`]
//! (`CAPO_TEST_KUBE=real`).
//!
//! A real server here reaches a webhook by URL (`https://127.0.0.1:<port>`): it has no route
//! to a Service's address without kube-proxy, and an Endpoints object may not name a loopback
//! address. What that leaves unproven: the Service routing in `deploy/`.

use std::time::{Duration, Instant};

use capo_api::conversion::{HUB, SPOKE};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

use crate::conversion::{resource, spoke_machine};
use crate::kube_world::{KubeWorld, real_kube, shared_webhook};

/// Our CRDs and Cluster API's (minimal), as JSON.
fn crds() -> Vec<Value> {
    capo_api::crds::all()
        .iter()
        .chain(capo_api::capi::crds().iter())
        .map(|crd| serde_json::to_value(crd).expect("CRD"))
        .collect()
}

/// p50 and p99 (bucket upper bounds, seconds) of the webhook's request durations.
fn webhook_quantiles(registry: &prometheus::Registry, webhook: &str) -> (u64, f64, f64) {
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    let mut count = 0;
    for family in registry.gather() {
        if family.name() != "capo_webhook_request_duration_seconds" {
            continue;
        }
        for metric in family.get_metric() {
            let named = metric
                .get_label()
                .iter()
                .any(|l| l.name() == "webhook" && l.value() == webhook);
            if !named {
                continue;
            }
            let histogram = metric.get_histogram();
            count += histogram.get_sample_count();
            for (i, bucket) in histogram.get_bucket().iter().enumerate() {
                match buckets.get_mut(i) {
                    Some(b) => b.1 += bucket.cumulative_count(),
                    None => buckets.push((bucket.upper_bound(), bucket.cumulative_count())),
                }
            }
        }
    }
    let quantile = |q: f64| {
        let wanted = (count as f64 * q).ceil() as u64;
        buckets
            .iter()
            .find(|(_, c)| *c >= wanted)
            .map_or(f64::INFINITY, |(bound, _)| *bound)
    };
    (count, quantile(0.5), quantile(0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_serves_our_crds_established_and_says_its_version() {
    let Some(real) = real_kube() else { return };
    let crds: Vec<Value> = capo_api::crds::all()
        .iter()
        .chain(capo_api::capi::crds().iter())
        .chain(capo_api::ipam::crds().iter())
        .map(|crd| serde_json::to_value(crd).expect("CRD"))
        .collect();
    // Applying them waits for each to be Established: a refusal fails here, naming the CRD.
    let world = KubeWorld::real(real, &crds).await;
    let version = world.client.apiserver_version().await.expect("/version");
    assert!(version.git_version.starts_with("v1.35."), "{version:?}");
}

/// The real server calls `/convert` for every read and write in v1beta1 (the storage version
/// is v1beta2): get, list (1,000 objects), watch, and a patch; the figures say how fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_converts_v1beta1_through_our_webhook_for_get_list_watch_and_patch() {
    let Some(real) = real_kube() else { return };
    let world = KubeWorld::real(real, &crds()).await;
    let webhook = shared_webhook();
    let (calls_before, _, _) = webhook_quantiles(&webhook.registry, "conversion");
    let spoke: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        &world.namespace,
        &resource("OpenStackMachine", SPOKE),
    );
    let hub: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        &world.namespace,
        &resource("OpenStackMachine", HUB),
    );
    const MACHINES: usize = 1_000;
    let started = Instant::now();
    futures::stream::iter(0..MACHINES)
        .map(|i| {
            let spoke = spoke.clone();
            let mut object = spoke_machine(&format!("m-{i}"));
            object["metadata"]["namespace"] = json!(world.namespace);
            async move {
                let object: DynamicObject = serde_json::from_value(object).expect("an object");
                spoke.create(&PostParams::default(), &object).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("1,000 v1beta1 OpenStackMachines created");
    let created_in = started.elapsed();

    let started = Instant::now();
    let listed = spoke
        .list(&ListParams::default())
        .await
        .expect("a v1beta1 list");
    let listed_in = started.elapsed();
    assert_eq!(listed.items.len(), MACHINES);
    assert!(listed.items.iter().all(|m| {
        m.types
            .as_ref()
            .is_some_and(|t| t.api_version.ends_with(SPOKE))
    }));

    // The hub reads what the spoke wrote: v1beta1's image filter is v1beta2's too.
    let stored = hub.get("m-7").await.expect("read in v1beta2");
    assert_eq!(
        stored.data["spec"]["image"]["filter"]["name"], "ubuntu",
        "{stored:?}"
    );
    let flavor = spoke.get("m-7").await.expect("read in v1beta1").data["spec"]["flavor"].clone();
    assert_eq!(flavor, "m1.medium");

    // A watch in v1beta1 sees a v1beta1 patch, converted both ways.
    let version = listed
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");
    let mut events = spoke
        .watch(&WatchParams::default().timeout(30), &version)
        .await
        .expect("a v1beta1 watch")
        .boxed();
    let patch = json!({"metadata": {"labels": {"patched": "yes"}}, "spec": {"providerID": "openstack:///m-7"}});
    spoke
        .patch("m-7", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("a v1beta1 merge patch");
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.try_next().await.expect("watch events") {
            if let WatchEvent::Modified(object) = event {
                return object;
            }
        }
        panic!("the watch ended without the patch")
    })
    .await
    .expect("the patch seen within 30 s");
    assert_eq!(seen.data["spec"]["providerID"], "openstack:///m-7");
    assert!(
        seen.types
            .as_ref()
            .is_some_and(|t| t.api_version.ends_with(SPOKE))
    );
    assert_eq!(
        hub.get("m-7").await.expect("v1beta2").data["spec"]["providerID"],
        "openstack:///m-7"
    );

    let (calls, p50, p99) = webhook_quantiles(&webhook.registry, "conversion");
    let calls = calls - calls_before;
    assert!(calls > 0, "the real server called the webhook");
    eprintln!(
        "FIGURES real-kube conversion: {MACHINES} v1beta1 OpenStackMachines created in {:.1} s, \
         listed in {:.2} s; webhook answered {calls} reviews, p50 <= {p50} s, p99 <= {p99} s",
        created_in.as_secs_f64(),
        listed_in.as_secs_f64(),
    );
}

/// The real garbage collector (kube-controller-manager) removes what an object owns once it
/// is gone: the machine controller's OpenStackServer with its OpenStackMachine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_collects_an_owned_server_after_its_owner() {
    let Some(real) = real_kube() else { return };
    let world = KubeWorld::real(real, &crds()).await;
    let machines: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        &world.namespace,
        &resource("OpenStackMachine", HUB),
    );
    let mut owner = spoke_machine("owner");
    owner["apiVersion"] = json!(format!("{}/{HUB}", capo_api::GROUP));
    owner["metadata"]["namespace"] = json!(world.namespace);
    owner["spec"] = json!({"flavor": {"filter": {"name": "m1.small"}}, "image": {"filter": {"name": "ubuntu"}}});
    let owner: DynamicObject = serde_json::from_value(owner).expect("an object");
    let owner = machines
        .create(&PostParams::default(), &owner)
        .await
        .expect("the owner");
    let servers: Api<capo_api::OpenStackServer> = world.api();
    let mut server = crate::server_controller::server_manifest("owned");
    server["metadata"]["namespace"] = json!(world.namespace);
    server["metadata"]["ownerReferences"] = json!([{
        "apiVersion": format!("{}/{HUB}", capo_api::GROUP), "kind": "OpenStackMachine",
        "name": "owner", "uid": owner.metadata.uid, "controller": true, "blockOwnerDeletion": true,
    }]);
    servers
        .create(
            &PostParams::default(),
            &serde_json::from_value(server).expect("a server"),
        )
        .await
        .expect("the owned server");
    machines
        .delete("owner", &Default::default())
        .await
        .expect("the owner deleted");
    crate::real_provider::wait_gone(&servers, "owned", Duration::from_secs(30)).await;
}

/// CAPO's webhook cases on the real server, whose CEL (cel-go, its cost budget, ratcheting)
/// and admission chain decide, with our webhook registered as `deploy/` registers it: every
/// verdict is CAPO's, and the simulator's (kube's CEL evaluator) is the same, refused by the
/// same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_gives_every_case_of_capos_webhook_tests_capos_verdict_and_the_simulators() {
    let Some(real) = real_kube() else { return };
    let world = KubeWorld::real(real, &crds()).await;
    let on_real = crate::admission::replay(&world.client, &world.namespace).await;
    let (table, disagreements) = crate::admission::table(&on_real);
    println!("{table}");
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    let simulated = crate::admission::admitting_world().await;
    let on_sim = crate::admission::replay(&simulated.client, "takeover").await;
    let differences: Vec<String> = on_real
        .iter()
        .zip(&on_sim)
        .filter(|(real, sim)| {
            real.ours != sim.ours
                || crate::admission::refused_by(real) != crate::admission::refused_by(sim)
        })
        .map(|(real, sim)| {
            format!(
                "{}: real {} ({}), simulator {} ({})\n  real: {}\n  sim:  {}",
                real.case,
                real.ours,
                crate::admission::refused_by(real),
                sim.ours,
                crate::admission::refused_by(sim),
                real.why,
                sim.why
            )
        })
        .collect();
    eprintln!(
        "FIGURES real-kube admission: {} cases, {} verdicts differ from the simulator's",
        on_real.len(),
        differences.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// The install command, `kubectl apply --server-side -k deploy/`, on the real server over
/// cert-manager's own CRDs (`tests/kube/up.sh` installs them from cert-manager's published
/// module), as a server-side dry run: every object of `deploy/` passes the server's schemas,
/// cert-manager's included. Not persisted: `deploy/`'s ValidatingWebhookConfiguration routes to
/// a Service no pod serves here and would refuse every other scenario's writes.
/// Applied as the tests' own field manager, which holds the CRDs and that configuration with
/// their webhooks by URL: applied by another, the server merges its Service into the URL the
/// tests own and refuses both ("exactly one of url or service"), which on a new cluster cannot
/// happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_accepts_every_object_of_deploy_applied_server_side() {
    let Some(real) = real_kube() else { return };
    let _world = KubeWorld::real(real.clone(), &crds()).await;
    let kubectl = std::env::var_os("CAPO_REAL_KUBE_BIN")
        .map(|dir| std::path::PathBuf::from(dir).join("kubectl"))
        .expect("CAPO_REAL_KUBE_BIN (tests/kube/up.sh prints it)");
    // The namespaced install, as a user's overlay adds it: the base and its component.
    let overlay = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        concat!(env!("CARGO_MANIFEST_DIR"), "/deploy"),
        overlay.path().join("deploy"),
    )
    .unwrap();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        "resources:\n- deploy\ncomponents:\n- deploy/namespaced\n",
    )
    .unwrap();
    let namespaced = overlay.path().display().to_string();
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy").to_owned();
    for (dir, path) in [("deploy", base), ("deploy/namespaced", namespaced)] {
        let rendered = tokio::process::Command::new(&kubectl)
            .args(["kustomize", &path])
            .output()
            .await
            .expect("kubectl kustomize runs");
        let rendered = String::from_utf8_lossy(&rendered.stdout).into_owned();
        let objects = rendered.lines().filter(|l| l.starts_with("kind: ")).count();
        let output = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&real.admin)
            .args(["apply", "--server-side", "--dry-run=server"])
            .args(["--field-manager", "capo-rs-tests", "-k", &path])
            .output()
            .await
            .expect("kubectl apply runs");
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{dir}: {said}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let applied = said
            .lines()
            .filter(|l| l.ends_with("(server dry run)"))
            .count();
        assert!(objects > 10, "kustomize rendered {dir}: {objects} objects");
        assert_eq!(applied, objects, "every object of {dir} applied:\n{said}");
        if dir == "deploy/namespaced" {
            the_namespaced_install_grants_its_namespace_alone(&rendered);
        }
    }
}

/// The namespaced render: no ClusterRole grants a namespaced object (a Secret least of all),
/// the manager's Role is in the watched namespace, and the manager watches it alone.
fn the_namespaced_install_grants_its_namespace_alone(rendered: &str) {
    use capo_provider::manager::manifests::{ACCOUNT, NAMESPACED_EXAMPLE, WORKLOAD_RULES};
    let namespaced: Vec<&str> = WORKLOAD_RULES
        .iter()
        .flat_map(|rule| rule.resources.iter().copied())
        .collect();
    let objects = crate::common::yaml_documents(rendered);
    let of = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
    for role in of("ClusterRole") {
        let rules = role["rules"].as_array().into_iter().flatten();
        for resource in rules.flat_map(|r| r["resources"].as_array().into_iter().flatten()) {
            assert!(
                !namespaced.contains(&resource.as_str().unwrap_or("")),
                "{} grants {resource} cluster-wide",
                role["metadata"]["name"]
            );
        }
    }
    let role = of("Role")
        .find(|r| r["metadata"]["name"] == ACCOUNT)
        .expect("the manager's Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACED_EXAMPLE);
    let args =
        of("Deployment").next().expect("the Deployment")["spec"]["template"]["spec"]["containers"]
            [0]["args"]
            .clone();
    assert!(
        args.as_array()
            .is_some_and(|a| a.contains(&json!(format!("--namespace={NAMESPACED_EXAMPLE}")))),
        "{args}"
    );
}

/// The manager's pod, as `deploy/manager.yaml` runs it, meets the Pod Security Standard
/// `restricted` that `deploy/namespace.yaml` enforces there: the real server's PodSecurity
/// admission admits it (a server-side dry run), and refuses the same pod given more privilege.
#[tokio::test]
async fn real_kube_the_manager_pod_meets_pod_security_restricted_in_its_namespace() {
    let Some(real) = real_kube() else { return };
    let client = crate::kube_world::client_from(&real.admin).await;
    let read = |file: &str| -> Value {
        let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let namespace = read("namespace.yaml");
    crate::kube_world::apply_crds(&client, std::slice::from_ref(&namespace)).await;
    let name = namespace["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let manager = read("manager.yaml");
    let pod = |privileged: bool| -> k8s_openapi::api::core::v1::Pod {
        let mut spec = manager["spec"]["template"]["spec"].clone();
        // The ServiceAccount admission would refuse first where deploy/rbac.yaml is not applied.
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("serviceAccountName");
        }
        if privileged {
            // Not `privileged: true`: this server refuses that by its own flag first.
            spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
            spec["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_ADMIN"]);
        }
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "pod-security-check"}, "spec": spec}))
        .expect("a Pod")
    };
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, &name);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    pods.create(&dry_run, &pod(false))
        .await
        .unwrap_or_else(|e| panic!("the manager's pod is refused in {name}: {e}"));
    let refused = pods
        .create(&dry_run, &pod(true))
        .await
        .expect_err("a privileged pod");
    assert!(
        refused
            .to_string()
            .contains("violates PodSecurity \"restricted"),
        "{refused}"
    );
}

/// Our OpenStackCluster CRD as an older release might have shipped it: without the bastion's
/// CEL rule and the conditions' reason pattern (and no conversion, v1beta2 alone is used).
fn osc_crd(tightened: bool) -> Value {
    let crd = capo_api::crds::all()
        .into_iter()
        .map(|crd| serde_json::to_value(crd).expect("CRD"))
        .find(|crd| crd["spec"]["names"]["kind"] == "OpenStackCluster")
        .expect("our OpenStackCluster CRD");
    if tightened {
        return crd;
    }
    let mut crd = crd;
    crd["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("conversion");
    for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
        let schema = &mut version["schema"]["openAPIV3Schema"]["properties"];
        if let Some(bastion) = schema["spec"]["properties"]["bastion"].as_object_mut() {
            bastion.remove("x-kubernetes-validations");
        }
        let reason =
            &mut schema["status"]["properties"]["conditions"]["items"]["properties"]["reason"];
        if let Some(reason) = reason.as_object_mut() {
            reason.remove("pattern");
        }
    }
    crd
}

fn condition(type_: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
           "lastTransitionTime": "2026-11-26T00:00:00Z"})
}

/// CRD validation ratcheting (GA in 1.33): after a rule tightens, an update that leaves a
/// now-invalid value as it was is accepted, value by value (object fields by name, `map`
/// list items by key); one that changes it, or a create, is refused. The same steps on the
/// simulator and on a real API server of the test's own (the CRD is replaced).
async fn rules_ratchet_on_what_an_update_leaves_unchanged(world: KubeWorld) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        &world.namespace,
        &resource("OpenStackCluster", HUB),
    );
    let cluster = |name: &str| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": format!("{}/{HUB}", capo_api::GROUP), "kind": "OpenStackCluster",
            "metadata": {"name": name},
            "spec": {"identityRef": {"cloudName": "openstack", "name": "cloud"},
                     "bastion": {"enabled": true}},
        }))
        .expect("an object")
    };
    api.create(&PostParams::default(), &cluster("old"))
        .await
        .expect("valid before the rule");
    let merge = |patch: Value| Patch::Merge(patch);
    let pp = PatchParams::default();
    let stored_reason = "was fine then";
    api.patch_status(
        "old",
        &pp,
        &merge(json!({"status": {"conditions": [condition("Ready", stored_reason, "up")]}})),
    )
    .await
    .expect("a reason the old schema took");

    world.apply(&[osc_crd(true)]).await;
    rule_in_force(&api, &cluster("probe")).await;

    let accepted = [
        (
            "another field of spec",
            json!({"spec": {"controlPlaneAvailabilityZones": ["az1"]}}),
            false,
        ),
        (
            "another condition beside the old one",
            json!({"status": {"conditions": [condition("Ready", stored_reason, "up"), condition("Other", "Fine", "")]}}),
            true,
        ),
        (
            "the old condition's message, its reason kept",
            json!({"status": {"conditions": [condition("Ready", stored_reason, "still up"), condition("Other", "Fine", "")]}}),
            true,
        ),
    ];
    for (what, patch, status) in accepted {
        let written = match status {
            true => api.patch_status("old", &pp, &merge(patch)).await,
            false => api.patch("old", &pp, &merge(patch)).await,
        };
        written.unwrap_or_else(|e| panic!("{what}: ratcheted, so accepted; got {e}"));
    }
    let refused = [
        (
            "the bastion edited, still without a spec",
            json!({"spec": {"bastion": {"enabled": true, "availabilityZone": "az1"}}}),
            false,
            "spec must be set while the bastion is enabled",
        ),
        (
            "the old reason replaced by another invalid one",
            json!({"status": {"conditions": [condition("Ready", "still not fine", "up")]}}),
            true,
            "status.conditions[0].reason",
        ),
    ];
    for (what, patch, status, says) in refused {
        let written = match status {
            true => api.patch_status("old", &pp, &merge(patch)).await,
            false => api.patch("old", &pp, &merge(patch)).await,
        };
        let Err(kube::Error::Api(e)) = written else {
            panic!("{what}: refused, got {written:?}");
        };
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{what}");
        assert!(e.message.contains(says), "{what}: {}", e.message);
    }
    let Err(kube::Error::Api(e)) = api.create(&PostParams::default(), &cluster("new")).await else {
        panic!("a create is never ratcheted");
    };
    assert!(
        e.message
            .contains("spec must be set while the bastion is enabled"),
        "{}",
        e.message
    );
}

/// A replaced CRD stays established, and a real API server takes its new schema into its
/// handler asynchronously: a dry-run create the tightened rule refuses says it is in force.
async fn rule_in_force(api: &Api<DynamicObject>, refused: &DynamicObject) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let no_logs = || String::new();
    crate::go_peer::until(
        "the tightened rule in force",
        Duration::from_secs(30),
        Duration::from_millis(50),
        &no_logs,
        async || match api.create(&dry_run, refused).await {
            Err(kube::Error::Api(e)) if e.code == 422 => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "created"))),
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_rules_ratchet_on_what_an_update_leaves_unchanged() {
    if real_kube().is_none() {
        return;
    }
    let world = KubeWorld::own_real(&[osc_crd(false)], "ratchet").await;
    rules_ratchet_on_what_an_update_leaves_unchanged(world).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_kube_rules_ratchet_on_what_an_update_leaves_unchanged() {
    let world = KubeWorld::sim(&[osc_crd(false)]).await;
    rules_ratchet_on_what_an_update_leaves_unchanged(world).await;
}

/// The book's three kustomize overlays, pasted as a user pastes them (bash, `kubectl` the
/// tier's, on an API server of their own, so the webhook configuration `deploy/` ships is
/// applied for real): `docs/installation.md`'s overlay naming the user's image, its namespaced
/// install, and `docs/metrics.md`'s ServiceMonitor (the Prometheus Operator's CRD installed by
/// `tests/kube/up.sh`). Each runs beside a checkout, as the pages say: a directory holding
/// `deploy` and `capo-rs` (this repository) links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_the_books_overlays_install_capo_rs_as_pasted() {
    if real_kube().is_none() {
        return;
    }
    let kube = KubeWorld::own_real(&[], "overlays").await;
    let admin = kube
        .own_tier_dir()
        .expect("a tier of its own")
        .join("admin.kubeconfig");
    let beside = tempfile::tempdir().unwrap();
    let repository = env!("CARGO_MANIFEST_DIR");
    std::os::unix::fs::symlink(format!("{repository}/deploy"), beside.path().join("deploy"))
        .unwrap();
    std::os::unix::fs::symlink(repository, beside.path().join("capo-rs")).unwrap();
    let kubectl = std::env::var("CAPO_REAL_KUBE_BIN").expect("CAPO_REAL_KUBE_BIN");
    let path = format!("{kubectl}:{}", std::env::var("PATH").unwrap_or_default());
    let blocks = [
        (
            "installation.md",
            crate::book::book_block(
                "installation.md",
                "kubectl apply --server-side -k capo-rs-overlay/",
            ),
        ),
        (
            "installation.md",
            crate::book::book_block(
                "installation.md",
                "mkdir capo-rs-namespaced && cd capo-rs-namespaced",
            ),
        ),
        (
            "metrics.md",
            crate::book::book_block(
                "metrics.md",
                "mkdir capo-rs-monitored && cd capo-rs-monitored",
            ),
        ),
        (
            "metrics.md",
            crate::book::book_block(
                "metrics.md",
                "kubectl create clusterrolebinding prometheus-reads-capo-rs --clusterrole=capo-rs-metrics-reader --serviceaccount=monitoring:prometheus-k8s",
            ),
        ),
    ];
    for (page, block) in blocks {
        let env = [
            ("KUBECONFIG", admin.display().to_string()),
            ("PATH", path.clone()),
        ];
        crate::book::paste(&block, beside.path(), &env).await;
        the_manager_runs_the_users_image(&kube, page).await;
    }
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(kube.client.clone());
    for crd in capo_api::crds::all() {
        let name = crd.metadata.name.unwrap_or_default();
        assert!(crds.get_opt(&name).await.unwrap().is_some(), "{name}");
    }
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(kube.client.clone(), "default");
    assert!(
        roles.get_opt("capo-rs-manager").await.unwrap().is_some(),
        "the namespaced install's Role in the watched namespace"
    );
    let monitors = crate::kube_world::dynamic_api(
        &kube.client,
        &json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": {"name": "capo-rs-controller-manager", "namespace": "capo-rs-system"}}),
    );
    assert!(
        monitors
            .get_opt("capo-rs-controller-manager")
            .await
            .unwrap()
            .is_some(),
        "the ServiceMonitor"
    );
}

async fn the_manager_runs_the_users_image(kube: &KubeWorld, page: &str) {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.client.clone(), "capo-rs-system");
    let image = deployments
        .get("capo-rs-controller-manager")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image);
    assert_eq!(
        image.as_deref(),
        Some("registry.example.com/capo-rs:0.1.0"),
        "after {page}'s block, the manager runs the image the overlay names"
    );
}

/// A CRD of the world's own (its group named after the world's namespace, so that no other
/// world lists its objects): `v1alpha1` served or not, `v1` stored.
fn widget_crd(group: &str, v1alpha1_served: bool) -> Value {
    let version = |name: &str, served: bool, storage: bool| {
        json!({"name": name, "served": served, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                   "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
                 "versions": [version("v1alpha1", v1alpha1_served, false), version("v1", true, true)]},
    })
}

/// The migration's CleanupManagedFields phase, as Cluster API's migrator runs it: once a
/// version is no longer served, every entry of `managedFields` recorded in it is dropped; an
/// object left with none gets one owning `metadata.name` alone, in the storage version; an
/// object with nothing to drop is not written. Once per CRD generation, marked on the CRD.
async fn managed_fields_of_a_version_no_longer_served_are_dropped(world: KubeWorld) {
    use capo_provider::manager::migration::{self, MigrationMetrics, OBSERVED_GENERATION};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let group = format!("{}.capo-rs.test", world.namespace);
    let crd_name = format!("widgets.{group}");
    world.apply(&[widget_crd(&group, true)]).await;
    let at = |version: &str| {
        let resource = kube::discovery::ApiResource {
            group: group.clone(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        Api::<DynamicObject>::namespaced_with(world.client.clone(), &world.namespace, &resource)
    };
    let widget = |name: &str, version: &str| -> DynamicObject {
        serde_json::from_value(
            json!({"apiVersion": format!("{group}/{version}"), "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": 1}}),
        )
        .expect("a widget")
    };
    let by = |manager: &str| PostParams {
        field_manager: Some(manager.into()),
        ..PostParams::default()
    };
    // a: written in v1alpha1, then in v1 by another manager; b: in v1alpha1 alone; c: in v1.
    at("v1alpha1")
        .create(&by("old-tool"), &widget("a", "v1alpha1"))
        .await
        .expect("a");
    at("v1")
        .patch(
            "a",
            &PatchParams {
                field_manager: Some("new-tool".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"colour": "red"}})),
        )
        .await
        .expect("a, edited in v1");
    at("v1alpha1")
        .create(&by("old-tool"), &widget("b", "v1alpha1"))
        .await
        .expect("b");
    at("v1")
        .create(&by("new-tool"), &widget("c", "v1"))
        .await
        .expect("c");
    let entries =
        |object: &DynamicObject| object.metadata.managed_fields.clone().unwrap_or_default();
    let before_a = entries(&at("v1").get("a").await.expect("a"));
    let before_c = at("v1").get("c").await.expect("c");
    let versions: Vec<_> = before_a.iter().map(|e| e.api_version.clone()).collect();
    assert!(
        versions.contains(&Some(format!("{group}/v1alpha1")))
            && versions.contains(&Some(format!("{group}/v1"))),
        "{}: the server records each write's version: {versions:?}",
        world.namespace
    );

    world.apply(&[widget_crd(&group, false)]).await;
    let registry = prometheus::Registry::new();
    let metrics = MigrationMetrics::register(&registry).expect("metrics");
    let cleaned = migration::clean_managed_fields(&world.client, &crd_name, &metrics)
        .await
        .expect("cleaned");
    assert_eq!(cleaned, Some(2), "a and b");

    let a = entries(&at("v1").get("a").await.expect("a"));
    let kept: Vec<_> = before_a
        .into_iter()
        .filter(|e| e.api_version.as_deref() == Some(&format!("{group}/v1")))
        .collect();
    assert_eq!(a, kept, "a keeps its v1 entry as it was");
    let b = entries(&at("v1").get("b").await.expect("b"));
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(
        (
            b[0].manager.as_deref(),
            b[0].operation.as_deref(),
            b[0].api_version.clone()
        ),
        (
            Some("old-tool"),
            Some("Update"),
            Some(format!("{group}/v1"))
        ),
    );
    assert_eq!(
        b[0].fields_v1.as_ref().map(|f| f.0.clone()),
        Some(json!({"f:metadata": {"f:name": {}}}))
    );
    let c = at("v1").get("c").await.expect("c");
    assert_eq!(
        c.metadata.resource_version, before_c.metadata.resource_version,
        "c had nothing to drop: not written"
    );
    assert_eq!(
        crate::server_controller::metric_sum(&registry, "capo_crd_managed_fields_cleaned_total"),
        2.0
    );
    let crds: Api<CustomResourceDefinition> = Api::all(world.client.clone());
    let crd = crds.get(&crd_name).await.expect("the CRD");
    assert_eq!(
        crd.metadata
            .annotations
            .unwrap_or_default()
            .get(OBSERVED_GENERATION),
        crd.metadata.generation.map(|g| g.to_string()).as_ref(),
        "the generation cleaned is marked"
    );
    assert_eq!(
        migration::clean_managed_fields(&world.client, &crd_name, &metrics)
            .await
            .expect("runs"),
        None,
        "once per generation"
    );
    // b is whole: a server-side apply by its old manager takes it over in v1.
    at("v1")
        .patch(
            "b",
            &PatchParams::apply("old-tool"),
            &Patch::Apply(
                json!({"apiVersion": format!("{group}/v1"), "kind": "Widget",
                "metadata": {"name": "b"}, "spec": {"size": 2}}),
            ),
        )
        .await
        .expect("an apply after the cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kube_managed_fields_of_a_version_no_longer_served_are_dropped() {
    let Some(real) = real_kube() else { return };
    let world = KubeWorld::real(real, &[]).await;
    managed_fields_of_a_version_no_longer_served_are_dropped(world).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_kube_managed_fields_of_a_version_no_longer_served_are_dropped() {
    let world = KubeWorld::sim(&[]).await;
    managed_fields_of_a_version_no_longer_served_are_dropped(world).await;
}
