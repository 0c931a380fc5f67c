//! The simulator judges CRDs as a real kube-apiserver does, CEL cost included. The CRDs
//! capo-rs shipped at commit 3c0beee (kept in `tests/fixtures/crds-3c0beee`) are refused
//! with the paths and factors a real v1.35.3 server gave; the CRDs we generate now are
//! accepted; CAPO's and Cluster API's are accepted. Where the reference recording
//! `kube-real-answers` is present (`common::shared_reference`), every message is compared with the recorded one word for word.

use std::path::{Path, PathBuf};

use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind, Status};
use serde_json::Value;

use capo_sim::kube::{KubeSim, KubeSimConfig};

use super::{common, within};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    common::yaml_documents(&text)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// How kubectl prints an `Invalid` Status: `The <Kind> "<name>" is invalid: <causes>`.
fn kubectl_message(status: &Status) -> String {
    let details = status
        .details
        .as_ref()
        .expect("an Invalid Status has details");
    let causes: Vec<String> = details
        .causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let causes = match causes.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!(
        "The {} {:?} is invalid: {causes}",
        details.kind, details.name
    )
}

/// Creates a CRD through the API; the message kubectl would print when it is refused.
async fn verdict(client: &Client, crd: &Value) -> Verdict {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let object: DynamicObject = serde_json::from_value(crd.clone()).expect("a CRD object");
    match within("CRD create", api.create(&PostParams::default(), &object)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
            Err(kubectl_message(&status))
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

/// Every CRD in `dir` with the simulator's verdict, by file name.
async fn verdicts(dir: &Path) -> Vec<(String, Verdict)> {
    // A fresh, empty server per source: CAPO's CRDs and ours share names.
    let sim = KubeSim::start(KubeSimConfig::default())
        .await
        .expect("simulator starts");
    let client = sim.client().expect("client");
    let mut out = Vec::new();
    for file in yaml_files(dir) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for crd in yaml_documents(&file) {
            out.push((name.clone(), verdict(&client, &crd).await));
        }
    }
    out
}

/// Accepted, or the message kubectl prints.
type Verdict = Result<(), String>;

/// The recorded verdicts of a real server: source, file name, verdict.
fn recorded() -> Option<Vec<(String, String, Verdict)>> {
    let file = common::shared_reference(
        "kube-real-answers/crd-verdicts.json",
        "the comparison with a real server's CRD verdicts",
    )?;
    let text = std::fs::read_to_string(&file).ok()?;
    let json: Value = serde_json::from_str(&text).expect("verdicts are JSON");
    let entries = json["crds"].as_array().expect("a crds list");
    Some(
        entries
            .iter()
            .map(|e| {
                let verdict = if e["accepted"] == Value::Bool(true) {
                    Ok(())
                } else {
                    Err(e["message"].as_str().unwrap_or_default().to_owned())
                };
                (
                    e["source"].as_str().unwrap_or_default().to_owned(),
                    e["file"].as_str().unwrap_or_default().to_owned(),
                    verdict,
                )
            })
            .collect(),
    )
}

fn compare_with_recorded(source: &str, ours: &[(String, Verdict)]) {
    let Some(recorded) = recorded() else {
        return;
    };
    let mut compared = 0;
    for (recorded_source, file, expected) in &recorded {
        if recorded_source != source {
            continue;
        }
        let got = ours
            .iter()
            .find(|(name, _)| name == file)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("{source} {file}: not judged"));
        assert_eq!(got, expected, "{source} {file}");
        compared += 1;
    }
    assert!(compared > 0, "recorded verdicts for {source}");
    eprintln!("{source}: {compared} verdicts equal the recorded real-server answers");
}

#[tokio::test]
async fn the_crds_we_once_shipped_are_refused_as_a_real_server_refused_them() {
    let ours = verdicts(&manifest_dir().join("tests/fixtures/crds-3c0beee")).await;
    assert_eq!(ours.len(), 6);
    for (file, verdict) in &ours {
        if file.contains("openstackclusteridentities") {
            assert_eq!(verdict, &Ok(()), "{file}");
            continue;
        }
        let message = verdict.as_ref().expect_err("refused");
        assert!(
            message.contains(".properties[ports].items.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of 1.048576x (try simplifying the rule"),
            "{file}: {message}"
        );
        assert!(
            message.starts_with("The CustomResourceDefinition \"openstack"),
            "{message}"
        );
    }
    compare_with_recorded("capo-rs", &ours);
}

#[tokio::test]
async fn the_crds_we_generate_now_are_accepted() {
    let ours = verdicts(&manifest_dir().join("crds")).await;
    assert_eq!(ours.len(), capo_api::crds::all().len());
    for (file, verdict) in ours {
        assert_eq!(verdict, Ok(()), "{file}");
    }
}

#[tokio::test]
async fn capo_and_cluster_api_crds_are_accepted() {
    let Some(shared) = common::shared_reference(".", "the CAPO and Cluster API CRDs") else {
        return;
    };
    for (source, dir) in [("CAPO", "capo/crds"), ("CAPI", "capi/crds")] {
        let judged = verdicts(&shared.join(dir)).await;
        assert!(!judged.is_empty(), "{dir} holds CRDs");
        for (file, verdict) in &judged {
            assert_eq!(verdict, &Ok(()), "{source} {file}");
        }
        compare_with_recorded(source, &judged);
    }
}
