//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use capo_rs::api::crds;
use serde_json::Value;

/// `../shared/capo` beside the repository (or `$CAPO_SHARED_DIR/capo`), if present.
pub fn capo_reference_dir() -> Option<PathBuf> {
    let shared = std::env::var_os("CAPO_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let dir = shared.join("capo");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "NOTICE: {} is absent; skipping the CAPO compatibility checks",
            dir.display()
        );
        None
    }
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
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}
