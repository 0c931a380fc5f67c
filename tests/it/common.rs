//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use capo_api::{GROUP, crds};
use serde_json::Value;

/// `<part>` of the reference material, which is not part of the repository: `$CAPO_SHARED_DIR`,
/// or a `shared` directory beside the clone (as on CI), if present; a notice naming what is skipped otherwise.
pub fn shared_reference(part: &str, skipping: &str) -> Option<PathBuf> {
    let shared = std::env::var_os("CAPO_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let path = shared.join(part);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("NOTICE: {} is absent; skipping {skipping}", path.display());
        None
    }
}

/// The `capo/` part of the reference material (see [`shared_reference`]), if present.
pub fn capo_reference_dir() -> Option<PathBuf> {
    shared_reference("capo", "the CAPO compatibility checks")
}

/// Our generated CRD for `kind`, as JSON.
pub fn our_crd(kind: &str) -> Value {
    let crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect("we generate a CRD for every kind");
    serde_json::to_value(crd).expect("CRDs serialise")
}

/// The OpenAPI schema of the storage version of a CRD in JSON form.
pub fn storage_schema(crd: &Value) -> Value {
    crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .find(|v| v["storage"] == Value::Bool(true))
        .expect("a storage version")["schema"]["openAPIV3Schema"]
        .clone()
}

/// Our schema for `kind`.
pub fn our_schema(kind: &str) -> Value {
    storage_schema(&our_crd(kind))
}

/// Parses a multi-document YAML stream into JSON values, skipping empty documents.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
        .expect("valid YAML")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Our kinds with the API version their sample documents must use.
pub const KINDS: [(&str, &str); 7] = [
    ("OpenStackCluster", "v1beta2"),
    ("OpenStackClusterTemplate", "v1beta2"),
    ("OpenStackMachine", "v1beta2"),
    ("OpenStackMachineTemplate", "v1beta2"),
    ("OpenStackServer", "v1alpha1"),
    ("OpenStackClusterIdentity", "v1alpha1"),
    ("OpenStackFloatingIPPool", "v1alpha1"),
];

/// Replaces `${VAR}` and `${VAR:=default}` with the default or a plausible value.
pub fn substitute(text: &str) -> String {
    let re = regex::Regex::new(r"\$\{([A-Z0-9_]+)(?::=([^}]*))?\}").expect("valid regex");
    re.replace_all(text, |c: &regex::Captures| match c.get(2) {
        Some(default) => default.as_str().to_owned(),
        None => plausible(&c[1]),
    })
    .into_owned()
}

fn plausible(var: &str) -> String {
    let value = if var.ends_with("_ID") {
        "3c1f0a52-8f4e-4c8a-b6a4-0d7f6e2b9c11"
    } else if var.contains("NAMESERVERS") {
        "192.0.2.53"
    } else if var.ends_with("_COUNT") {
        "3"
    } else if var.ends_with("_B64") {
        "Y2xvdWRzOiB7fQ=="
    } else if var.contains("VERSION") {
        "v1.33.4"
    } else {
        return var.to_lowercase().replace('_', "-");
    };
    value.to_owned()
}

/// The `.yaml` files of a directory, in name order.
pub fn yaml_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document of ours in CAPO's sample templates, with the file it came from.
pub fn sample_documents() -> Option<Vec<(String, Value)>> {
    let dir = capo_reference_dir()?.join("templates");
    let mut docs = Vec::new();
    for path in &yaml_files(&dir) {
        let text = substitute(&std::fs::read_to_string(path).expect("readable template"));
        for doc in yaml_documents(&text) {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let api_version = doc["apiVersion"].as_str().unwrap_or_default();
            if KINDS
                .iter()
                .any(|(k, v)| *k == kind && api_version == format!("{GROUP}/{v}"))
            {
                docs.push((
                    path.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    doc,
                ));
            }
        }
    }
    Some(docs)
}

/// A cluster's API load balancer as a reconciler would desire it: pool on 6443, these members
/// (name, address, member id if known), requested now, a rollout waiting.
pub fn desired_lb(
    lb: &str,
    pool: &str,
    members: &[(&str, &str, Option<&str>)],
) -> capo_provider::membership::DesiredLb {
    use capo_provider::membership::{DesiredLb, DesiredMember, ObjectName};
    DesiredLb {
        lb_id: lb.into(),
        cluster: ObjectName::new("default", "c1"),
        pools: std::collections::BTreeMap::from([(6443, pool.into())]),
        members: members
            .iter()
            .map(|(name, address, id)| DesiredMember {
                owner: ObjectName::new("default", *name),
                name: (*name).into(),
                address: (*address).into(),
                port: 6443,
                requested_at: tokio::time::Instant::now(),
                member_id: id.map(str::to_owned),
                served: false,
            })
            .collect(),
        rollout_waiting: true,
        leaving: Vec::new(),
    }
}

/// The next change from the engine; a re-sync fails the test (these subscribers keep up).
pub async fn next_change(
    changes: &mut capo_provider::membership::Changes,
) -> Option<capo_provider::membership::Change> {
    match changes.recv().await? {
        capo_provider::membership::Notice::Changed(change) => Some(change),
        capo_provider::membership::Notice::Resync { missed } => {
            panic!("the test's subscriber fell {missed} changes behind")
        }
    }
}
