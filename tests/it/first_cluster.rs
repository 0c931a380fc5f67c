//! `docs/first-cluster.md` as a newcomer pastes it: its blocks run by bash, as the page gives
//! them, against a real kube-apiserver with Cluster API v1.14.2's manager and capo-rs, on the
//! real OpenStack tier (its own project, `capo-rs-first`). From the credentials to the clean-up:
//! `clusterctl generate cluster` with the page's variables, the apply, every read the page
//! suggests while the cluster comes up, the control plane's rollout trigger, the delete, and the
//! `openstack` lists that find nothing left.
//!
//! What no test here can run is marked on the page: the image build and push, anything that
//! needs capo-rs's pods (the tiers run none), a workload cluster (kubeadm's controllers do not
//! run, so no machine boots), the internet (the template's download), or a terminal (`watch`).

use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::book::{book_block, paste};
use crate::capi_peers::{CapiManager, capi_peers};
use crate::capo_peers::{capo_peers, only_cloud};
use crate::clusterctl::{admin_kubeconfig, kubeadm_crds, pasting_path};
use crate::go_peer::until;
use crate::kube_world::{KubeWorld, real_kube};
use crate::real_cloud::real_cloud;
use crate::server_controller::spawn_manager;
use capo_provider::manager::ManagerConfig;

/// The tier's cloud (project) the page's cluster is built in.
const FIRST_CLOUD: &str = "capo-first";
/// The page's names.
const PAGE_CLOUD: &str = "mycloud";
const NAMESPACE: &str = "capo-rs-first";
const CLUSTER: &str = "capo-rs-first";

/// The kubeadm CRDs with the contract label their release's kustomize configuration adds:
/// Cluster API reads a referenced kind's contract from it.
pub(crate) fn kubeadm_crds_as_released(peers: &crate::capi_peers::CapiPeers) -> Vec<Value> {
    kubeadm_crds(peers)
        .into_iter()
        .map(|mut crd| {
            crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] = json!("v1beta2");
            crd
        })
        .collect()
}

/// The user's files beside the page's commands: `clouds.yaml` holding the tier's project as
/// the page's cloud, a CA file for the page's first `OPENSTACK_CLOUD_CACERT_B64`, and CAPO's
/// `cluster-template.yaml`. The page downloads CAPO main's; there is no internet here and CAPO
/// main's module cannot be fetched (DESIGN §11), so it is CAPO v0.14.7's, which takes the same
/// variables.
fn users_files(dir: &Path, clouds_yaml: &str, template: &Path) {
    let ours = only_cloud(clouds_yaml, FIRST_CLOUD).replace(FIRST_CLOUD, PAGE_CLOUD);
    std::fs::write(dir.join("clouds.yaml"), ours).unwrap();
    let bundle = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    std::fs::write(dir.join("my-ca.pem"), bundle).unwrap();
    std::fs::copy(template, dir.join("cluster-template.yaml")).expect("CAPO's template");
}

fn openstack_cluster(kube: &KubeWorld) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        "infrastructure.cluster.x-k8s.io",
        "v1beta2",
        "OpenStackCluster",
    );
    Api::namespaced_with(
        kube.client.clone(),
        NAMESPACE,
        &kube::core::ApiResource::from_gvk(&gvk),
    )
}

/// The kinds of `capo-rs-first.yaml`, with each object's replicas where it has some.
fn generated(objects: &[Value]) -> Vec<(String, String, Option<i64>)> {
    objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["spec"]["replicas"].as_i64(),
            )
        })
        .collect()
}

#[tokio::test]
async fn real_the_first_cluster_page_runs_as_pasted() {
    crate::rollout::init_test_log();
    let (Some(peers), Some(capo)) = (capi_peers(), capo_peers()) else {
        return;
    };
    let Some(real) = real_cloud() else {
        return;
    };
    if real_kube().is_none() {
        return;
    }
    // A management cluster as the page's step 2 leaves it (installation.md's steps are run as
    // pasted by their own tests): Cluster API's core running, kubeadm's kinds known, capo-rs
    // running and its webhooks answering.
    let kube = KubeWorld::own_real(&kubeadm_crds_as_released(&peers), "first-cluster-setup").await;
    kube.install_ours().await;
    let capi = CapiManager::start(&kube, &peers.release()).await;
    let (_registry, shutdown, _manager) =
        spawn_manager(&kube.manager_client, ManagerConfig::default());
    let _running = shutdown.drop_guard();
    let logs = || format!("Cluster API's manager:\n{}", capi.log_tail());

    let dir = tempfile::tempdir().unwrap();
    let template = capo.capo_src().join("templates/cluster-template.yaml");
    users_files(dir.path(), &real.clouds_yaml, &template);
    let venv = std::env::var("CAPO_OPENSTACK_VENV")
        .unwrap_or_else(|_| "/var/cache/capo-rs/openstack-venv".to_owned());
    let env = [
        ("HOME", dir.path().display().to_string()),
        ("KUBECONFIG", admin_kubeconfig(&kube)),
        ("PATH", format!("{venv}/bin:{}", pasting_path(&peers))),
        ("CLUSTERCTL_DISABLE_VERSIONCHECK", "true".to_owned()),
        // The user's openstack CLI, pointed at the cloud the page names.
        (
            "OS_CLIENT_CONFIG_FILE",
            dir.path().join("clouds.yaml").display().to_string(),
        ),
        ("OS_CLOUD", PAGE_CLOUD.to_owned()),
    ];
    let run = async |blocks: &[String]| paste(&blocks.join("\n"), dir.path(), &env).await;

    let started = Instant::now();
    // Step 3 and 4: the credentials and the cluster's manifest, in one shell as a user types
    // them (the exports carry over).
    let listed = run(&[
        book_block("first-cluster.md", "export OPENSTACK_CLOUD=mycloud"),
        book_block(
            "first-cluster.md",
            "clusterctl generate cluster capo-rs-first --from cluster-template.yaml --list-variables",
        ),
        book_block("first-cluster.md", "export OPENSTACK_SSH_KEY_NAME=my-key"),
    ])
    .await;
    assert!(
        listed.contains("OPENSTACK_EXTERNAL_NETWORK_ID"),
        "clusterctl listed the template's variables: {listed}"
    );
    let manifest = std::fs::read_to_string(dir.path().join("capo-rs-first.yaml"))
        .expect("the page's generate wrote capo-rs-first.yaml");
    let objects = capo_demo::template::objects(&manifest).expect("capo-rs-first.yaml parses");
    let kinds = generated(&objects);
    for (kind, replicas) in [
        ("KubeadmControlPlane", Some(3)),
        ("MachineDeployment", Some(1)),
    ] {
        assert!(
            kinds
                .iter()
                .any(|(k, ns, r)| k == kind && ns == NAMESPACE && *r == replicas),
            "a {kind} of {replicas:?} in {NAMESPACE}: {kinds:?}"
        );
    }

    // The external network's id came from the page's `openstack network show public`.
    let external = objects
        .iter()
        .find(|o| o["kind"] == "OpenStackCluster")
        .map(|o| o["spec"]["externalNetwork"]["id"].clone());
    assert!(
        external
            .as_ref()
            .and_then(Value::as_str)
            .is_some_and(|id| id.len() == 36),
        "the OpenStackCluster names the tier's external network by id: {external:?}"
    );

    // Step 5: applied; capo-rs builds the network, router, security groups and API load
    // balancer on the real tier.
    run(&[book_block(
        "first-cluster.md",
        "kubectl create namespace capo-rs-first",
    )])
    .await;
    let clusters = openstack_cluster(&kube);
    until(
        "the page's OpenStackCluster provisioned",
        Duration::from_secs(600),
        Duration::from_secs(2),
        &logs,
        async || {
            let found = clusters.get(CLUSTER).await.map_err(|e| e.to_string())?;
            let status = found.data["status"].clone();
            match status["initialization"]["provisioned"].as_bool() {
                Some(true) => Ok(()),
                _ => Err(format!("{status:#}")),
            }
        },
    )
    .await;

    let provisioned = started.elapsed();
    // Step 6: what the page reads while the cluster comes up.
    let wide = run(&[book_block(
        "first-cluster.md",
        "kubectl -n capo-rs-first get openstackcluster,openstackmachine -o wide",
    )])
    .await;
    assert!(wide.contains(CLUSTER), "{wide}");
    let gate = run(&[book_block(
        "first-cluster.md",
        "kubectl -n capo-rs-first get osc capo-rs-first -o jsonpath='{range .status.conditions[?(@.type==\"APIServerLoadBalancerReady\")]}{.status} {.reason}: {.message}{\"\\n\"}{end}'",
    )])
    .await;
    assert!(
        gate.starts_with("True ") || gate.starts_with("False "),
        "the gate's condition, as the page prints it: {gate:?}"
    );
    run(&[
        book_block(
            "first-cluster.md",
            "kubectl -n capo-rs-first get osc capo-rs-first -o jsonpath='{range .status.apiServerManagedLoadBalancer.members[*]}{.name}{\"\\t\"}{.provisioningStatus}{\"\\t\"}{.operatingStatus}{\"\\t\"}{.since}{\"\\n\"}{end}'",
        ),
        book_block("first-cluster.md", "clusterctl describe cluster capo-rs-first -n capo-rs-first --show-conditions all"),
        book_block(
            "first-cluster.md",
            "kubectl -n capo-rs-first get events --field-selector involvedObject.kind=OpenStackMachine --sort-by=.lastTimestamp",
        ),
    ])
    .await;

    // Step 7's rollout trigger is a patch the control plane's schema must take.
    run(&[book_block(
        "first-cluster.md",
        "kubectl -n capo-rs-first patch kcp capo-rs-first-control-plane --type merge -p \"{\\\"spec\\\":{\\\"rollout\\\":{\\\"after\\\":\\\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\\\"}}}\"",
    )])
    .await;

    // Step 9: the page's lists, which find the cluster's resources while it lives, find none
    // once it is deleted and waited for.
    let lists = async || {
        run(&[book_block(
            "first-cluster.md",
            "openstack server list --name capo-rs-first",
        )])
        .await
    };
    let made = lists().await;
    for name in [
        "k8s-clusterapi-cluster-capo-rs-first-capo-rs-first-kubeapi",
        "k8s-clusterapi-cluster-capo-rs-first-capo-rs-first",
        "k8s-cluster-capo-rs-first-capo-rs-first-secgroup-controlplane",
    ] {
        assert!(made.contains(name), "the page's lists show {name}:\n{made}");
    }
    let deleting = Instant::now();
    run(&[
        book_block(
            "first-cluster.md",
            "kubectl -n capo-rs-first delete cluster capo-rs-first --wait=false",
        ),
        book_block(
            "first-cluster.md",
            "kubectl -n capo-rs-first wait --for=delete cluster/capo-rs-first --timeout=30m",
        ),
    ])
    .await;
    let left = lists().await;
    assert!(
        !left.contains("k8s-clusterapi-cluster-capo-rs-first")
            && !left.contains("k8s-cluster-capo-rs-first"),
        "the page's lists found the cluster's resources after its delete:\n{left}"
    );
    eprintln!(
        "FIGURES first-cluster page: generated, applied and provisioned on the real tiers in {:.0} s; deleted with nothing left in {:.0} s",
        provisioned.as_secs_f64(),
        deleting.elapsed().as_secs_f64()
    );
}
