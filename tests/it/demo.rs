//! `capo-rs demo` and `capo-rs prove-dashboards`, run as a user runs them: the built binary,
//! its output and its exit code.
//!
//! The proof needs Debian's `prometheus` package (Prometheus and promtool) and a TrueType
//! font (`fonts-dejavu-core`); without them its test prints a notice and passes, unless
//! `CAPO_REQUIRE_PROMETHEUS=1` (set by `.ci/run`, which installs both).

use std::path::Path;
use std::process::{Command, Output};

use capo_sim::kube::{KubeSim, KubeSimConfig};
use serde_json::Value;

const CAPO_RS: &str = env!("CARGO_BIN_EXE_capo-rs");
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn run(args: &[&str]) -> Output {
    Command::new(CAPO_RS)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap_or_else(|e| panic!("running capo-rs {args:?}: {e}"))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn summary(output: &Output) -> String {
    let text = stdout(output);
    let start = text.find("capo-rs demo summary").unwrap_or(0);
    text[start..].to_owned()
}

fn prometheus_available() -> bool {
    let found = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    found("prometheus") && found("promtool") && Path::new(FONT).exists()
}

#[test]
fn the_dashboards_and_alerts_hold_on_a_real_prometheus_scraping_the_demo() {
    if !prometheus_available() {
        let required = std::env::var("CAPO_REQUIRE_PROMETHEUS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "CAPO_REQUIRE_PROMETHEUS=1 but prometheus, promtool or {FONT} is missing \
             (apt install prometheus fonts-dejavu-core)"
        );
        eprintln!(
            "skipped: no prometheus/promtool or {FONT} (apt install prometheus fonts-dejavu-core)"
        );
        return;
    }
    let pictures = tempfile::tempdir().unwrap();
    let output = run(&[
        "prove-dashboards",
        "--json",
        "--speed",
        "2",
        "--out",
        pictures.path().to_str().unwrap(),
    ]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let queries = report["queries"].as_array().unwrap();
    let empty: Vec<String> = queries
        .iter()
        .filter(|q| q["series"] == 0)
        .map(|q| format!("{} / {}: {}", q["dashboard"], q["panel"], q["expr"]))
        .collect();
    eprintln!(
        "prove-dashboards: {} panels, {} queries, {} without data; alerts fired: {}; demo {:.1} s",
        report["panels"],
        queries.len(),
        empty.len(),
        report["alerts_fired"],
        report["demo_seconds"].as_f64().unwrap_or_default()
    );
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
    assert!(queries.len() >= 40, "every panel's query was run");
    let fired: Vec<&str> = report["alerts_fired"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for alert in ["CapoRsLBMemberStuck", "CapoRsLBMemberError"] {
        assert!(fired.contains(&alert), "{alert} fired: {fired:?}");
    }
    assert_eq!(report["metrics_check"].as_str().map(str::trim), Some(""));
    assert!(report["rules_check"].as_str().unwrap().contains("SUCCESS"));
    assert_eq!(report["demo_exit_code"], 0, "{}", report["demo_summary"]);
    for picture in report["pictures"].as_array().unwrap() {
        let bytes = std::fs::read(picture.as_str().unwrap()).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{picture} is a PNG");
        assert!(bytes.len() > 10_000, "{picture} has a chart in it");
    }
    assert_eq!(report["failures"], Value::Array(Vec::new()));
    assert!(output.status.success());
}

/// A newcomer's `cargo run --release -- demo` builds no benchmark: the default build, asked
/// for one, says how to get them and exits 2; the `bench` feature's build has them.
#[test]
fn the_benchmarks_come_with_the_bench_feature_only() {
    let output = run(&["bench", "--help"]);
    let said = String::from_utf8_lossy(&output.stderr);
    if cfg!(feature = "bench") {
        assert!(output.status.success(), "{said}");
        assert!(
            stdout(&output).contains("rollout-safety"),
            "{}",
            stdout(&output)
        );
    } else {
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(
            said.contains("cargo run --release --features bench -- bench"),
            "{said}"
        );
    }
}

#[test]
fn trusting_the_lb_the_demo_says_the_api_went_down_and_fails() {
    let output = run(&[
        "demo",
        "--strategy",
        "lb-only",
        "--plain",
        "--metrics-port",
        "0",
        "--speed",
        "2",
    ]);
    let summary = summary(&output);
    eprintln!("{summary}");
    assert_eq!(output.status.code(), Some(1), "{summary}");
    assert!(summary.contains("THE CLUSTER'S API WENT DOWN"), "{summary}");
    // How the outage shows depends on which member the rollout reaches first, which two busy
    // cores can reorder: the pool empties of ACTIVE members, or keeps one that does not serve.
    let no_active =
        summary.contains("had no ACTIVE member for") && summary.contains("min ACTIVE members  0");
    let none_serving = summary.contains("min serving members 0");
    assert!(no_active || none_serving, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_plays_on_another_api_server_given_its_kubeconfig() {
    // A bare API server: the demo installs the CRDs it needs.
    let kube = KubeSim::start(KubeSimConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let path = kubeconfig.to_str().unwrap().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        run(&[
            "demo",
            "--kubeconfig",
            &path,
            "--plain",
            "--metrics-port",
            "0",
            "--speed",
            "2",
        ])
    })
    .await
    .unwrap();
    let text = stdout(&output);
    assert!(
        text.contains(&format!(
            "Kubernetes: the cluster of {}",
            kubeconfig.display()
        )),
        "{text}"
    );
    assert_eq!(output.status.code(), Some(0), "{}", summary(&output));
    assert!(summary(&output).contains("stayed up"));
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(kube.client().unwrap());
    for name in [
        "openstackclusters.infrastructure.cluster.x-k8s.io",
        "machines.cluster.x-k8s.io",
    ] {
        assert!(
            crds.get_opt(name).await.unwrap().is_some(),
            "{name} installed"
        );
    }
    // The whole story, seen by the API server: what the manager asked for (its User-Agent)
    // is exactly what deploy/'s RBAC grants.
    crate::packaging::assert_least_privilege(&kube.requests());
}
