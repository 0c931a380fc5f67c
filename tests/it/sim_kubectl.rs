//! kubectl against the simulated API server: what an operator does by hand must work.
//! Skips, with a notice, when kubectl is not installed.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use capo_api::crds;
use capo_sim::kube::{KubeSim, KubeSimConfig};
use serde_json::Value;

fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/kubectl"));
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "NOTICE: {} not found; skipping the kubectl tests",
            path.display()
        );
        None
    }
}

/// A simulator with a kubeconfig and a private discovery cache on disk.
struct Harness {
    sim: KubeSim,
    kubectl: PathBuf,
    dir: tempfile::TempDir,
}

impl Harness {
    async fn start(with_our_crds: bool) -> Option<Self> {
        let kubectl = kubectl_path()?;
        let sim = KubeSim::start(KubeSimConfig::default())
            .await
            .expect("simulator");
        if with_our_crds {
            let ours: Vec<Value> = crds::all()
                .iter()
                .map(|c| serde_json::to_value(c).expect("CRD json"))
                .collect();
            sim.install(&ours).expect("CRDs install");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("kubeconfig"), sim.kubeconfig()).expect("kubeconfig");
        Some(Self { sim, kubectl, dir })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.kubectl);
        command
            .args(args)
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("KUBECACHEDIR", self.dir.path().join("cache"))
            .env("HOME", self.dir.path());
        command
    }

    /// Runs kubectl off the async runtime (the simulator needs it to answer).
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = self.command(args);
        tokio::task::spawn_blocking(move || command.output().expect("kubectl runs"))
            .await
            .expect("kubectl thread")
    }

    async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    async fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(!output.status.success(), "kubectl {args:?} should fail");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write manifest");
        path
    }
}

async fn next_line(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(std::time::Duration::from_secs(20), lines.recv())
        .await
        .expect("a watch line in time")
        .expect("watch still running")
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_installs_our_crds_and_applies_capo_samples() {
    let Some(h) = Harness::start(false).await else {
        return;
    };
    let crd_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/crds");
    let applied = h.ok(&["apply", "-f", crd_dir]).await;
    assert_eq!(
        applied.matches(" created").count(),
        capo_api::crds::all().len(),
        "{applied}"
    );
    let resources = h
        .ok(&[
            "api-resources",
            "--api-group=infrastructure.cluster.x-k8s.io",
            "-o",
            "name",
        ])
        .await;
    for plural in [
        "openstackclusters",
        "openstackclustertemplates",
        "openstackmachines",
        "openstackmachinetemplates",
        "openstackservers",
        "openstackclusteridentities",
    ] {
        assert!(resources.contains(plural), "{plural} in {resources}");
    }
    let again = h.ok(&["apply", "-f", crd_dir]).await;
    assert_eq!(
        again.matches(" unchanged").count(),
        capo_api::crds::all().len(),
        "{again}"
    );

    let Some(samples) = common::sample_documents() else {
        return;
    };
    // Several templates reuse a name with another spec; on one server, each file's
    // objects get their own names so none updates another.
    let files: Vec<String> = samples.iter().map(|(file, _)| file.clone()).collect();
    let documents: Vec<Value> = samples
        .into_iter()
        .map(|(file, mut doc)| {
            let index = files.iter().position(|f| *f == file).unwrap_or_default();
            let name = format!(
                "{}-{index}",
                doc["metadata"]["name"].as_str().unwrap_or("x")
            );
            doc["metadata"]["name"] = Value::String(name);
            doc
        })
        .collect();
    let stream: Vec<String> = documents
        .iter()
        .map(|d| serde_saphyr::to_string(d).expect("yaml"))
        .collect();
    let manifest = h.write("samples.yaml", &stream.join("---\n"));
    h.ok(&["apply", "-f", path_arg(&manifest)]).await;
    for doc in &documents {
        let kind = doc["kind"].as_str().expect("kind").to_lowercase();
        let name = doc["metadata"]["name"].as_str().expect("name");
        h.ok(&["get", &kind, name]).await;
    }
    let unchanged = h.ok(&["apply", "-f", path_arg(&manifest)]).await;
    assert!(
        !unchanged.contains(" created"),
        "re-apply creates nothing: {unchanged}"
    );
    eprintln!(
        "{} CAPO sample documents applied with kubectl",
        documents.len()
    );
}

const CLUSTER: &str = "apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: OpenStackCluster
metadata:
  name: demo
  labels:
    cluster.x-k8s.io/cluster-name: demo
spec:
  identityRef:
    name: demo-cloud-config
    cloudName: openstack
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_watches_patches_status_and_deletes() {
    let Some(h) = Harness::start(true).await else {
        return;
    };
    let manifest = h.write("cluster.yaml", CLUSTER);
    h.ok(&["apply", "-f", path_arg(&manifest)]).await;
    let table = h.ok(&["get", "openstackclusters"]).await;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "CLUSTER", "READY", "PROVISIONED", "AGE"] {
        assert!(header.contains(column), "{column} in {header}");
    }
    assert!(table.contains("demo"), "{table}");
    let defaulted = h
        .ok(&[
            "get",
            "osc",
            "demo",
            "-o",
            "jsonpath={.status.observedGeneration} {.spec.identityRef.type}",
        ])
        .await;
    assert_eq!(defaulted, "-1 Secret", "status and nested spec defaults");

    let mut watch = h
        .command(&[
            "get",
            "osc",
            "-w",
            "--output-watch-events",
            "-o",
            "jsonpath={.type} {.object.metadata.name} {.object.status.initialization.provisioned}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(next_line(&mut lines).await.trim_end(), "ADDED demo");

    h.ok(&[
        "patch",
        "osc",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"initialization":{"provisioned":true}}}"#,
    ])
    .await;
    assert_eq!(next_line(&mut lines).await, "MODIFIED demo true");
    let provisioned = h.ok(&["get", "osc", "demo"]).await;
    assert!(
        provisioned
            .lines()
            .nth(1)
            .unwrap_or_default()
            .contains("true"),
        "{provisioned}"
    );

    h.ok(&[
        "patch",
        "osc",
        "demo",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ])
    .await;
    assert_eq!(next_line(&mut lines).await, "MODIFIED demo true");
    h.ok(&["delete", "osc", "demo", "--wait=false"]).await;
    assert_eq!(
        next_line(&mut lines).await,
        "MODIFIED demo true",
        "deletionTimestamp set"
    );
    let marked = h
        .ok(&[
            "get",
            "osc",
            "demo",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ])
        .await;
    assert!(!marked.is_empty(), "held by its finalizer");
    let refused = h
        .fails(&[
            "patch",
            "osc",
            "demo",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["example.com/hold","example.com/new"]}}"#,
        ])
        .await;
    assert!(refused.contains("no new finalizers"), "{refused}");
    h.ok(&[
        "patch",
        "osc",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .await;
    assert_eq!(next_line(&mut lines).await, "DELETED demo true");
    let gone = h.fails(&["get", "osc", "demo"]).await;
    assert!(
        gone.contains("NotFound") || gone.contains("not found"),
        "{gone}"
    );

    h.ok(&["apply", "-f", path_arg(&manifest)]).await;
    assert_eq!(next_line(&mut lines).await.trim_end(), "ADDED demo");
    h.ok(&["delete", "-f", path_arg(&manifest)]).await;
    assert_eq!(
        next_line(&mut lines).await.trim_end(),
        "DELETED demo",
        "no finalizer: gone at once"
    );
    watch.kill().expect("stop kubectl get -w");
    let _ = watch.wait();
    drop(h.sim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_built_ins_from_protobuf_bodies() {
    let Some(h) = Harness::start(false).await else {
        return;
    };
    h.ok(&["create", "namespace", "capo-system"]).await;
    h.ok(&[
        "create",
        "secret",
        "generic",
        "cloud-config",
        "-n",
        "capo-system",
        "--from-literal=clouds.yaml=clouds: {}",
    ])
    .await;
    h.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "capo-system",
        "--from-literal=qps=10",
    ])
    .await;
    let secret = h
        .ok(&[
            "get",
            "secret",
            "cloud-config",
            "-n",
            "capo-system",
            "-o",
            "jsonpath={.type} {.data.clouds\\.yaml}",
        ])
        .await;
    assert_eq!(secret, "Opaque Y2xvdWRzOiB7fQ==");
    let qps = h
        .ok(&[
            "get",
            "configmap",
            "settings",
            "-n",
            "capo-system",
            "-o",
            "jsonpath={.data.qps}",
        ])
        .await;
    assert_eq!(qps, "10");
    h.ok(&["delete", "namespace", "capo-system"]).await;
    let gone = h.fails(&["get", "namespace", "capo-system"]).await;
    assert!(gone.contains("not found"), "{gone}");
}
