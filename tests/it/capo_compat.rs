//! Compatibility with CAPO: its sample manifests are accepted unchanged by our types and our
//! CRD schemas, and our spec field paths equal CAPO's. Skips (with a notice) when the
//! reference material (`capo/`, outside the repository: see `common::shared_reference`) is
//! absent.

use crate::common;

use std::collections::BTreeMap;

use capo_api::{
    OpenStackCluster, OpenStackClusterIdentity, OpenStackClusterTemplate, OpenStackFloatingIPPool,
    OpenStackMachine, OpenStackMachineTemplate, OpenStackServer,
};
use capo_sim::structural::{apply_defaults, prune, validate};
use common::{KINDS, capo_reference_dir, our_crd, our_schema, sample_documents, yaml_documents};
use kube::core::cel::Validator;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Parses strictly (any field our types do not know is an error) and re-serialises.
fn strict_round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let mut unknown = Vec::new();
    let typed: T = serde_ignored::deserialize(doc.clone(), |path| unknown.push(path.to_string()))
        .map_err(|e| e.to_string())?;
    // The derived root types write `apiVersion` and `kind` themselves; the round trip below
    // checks that they come back equal.
    unknown.retain(|path| path != "apiVersion" && path != "kind");
    if !unknown.is_empty() {
        return Err(format!("unknown fields: {unknown:?}"));
    }
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

fn round_trip(kind: &str, doc: &Value) -> Result<Value, String> {
    match kind {
        "OpenStackCluster" => strict_round_trip::<OpenStackCluster>(doc),
        "OpenStackClusterTemplate" => strict_round_trip::<OpenStackClusterTemplate>(doc),
        "OpenStackMachine" => strict_round_trip::<OpenStackMachine>(doc),
        "OpenStackMachineTemplate" => strict_round_trip::<OpenStackMachineTemplate>(doc),
        "OpenStackServer" => strict_round_trip::<OpenStackServer>(doc),
        "OpenStackClusterIdentity" => strict_round_trip::<OpenStackClusterIdentity>(doc),
        "OpenStackFloatingIPPool" => strict_round_trip::<OpenStackFloatingIPPool>(doc),
        other => Err(format!("not our kind: {other}")),
    }
}

#[test]
fn every_capo_sample_document_is_accepted_unchanged() {
    let Some(docs) = sample_documents() else {
        return;
    };
    assert!(
        !docs.is_empty(),
        "CAPO's templates hold documents of our kinds"
    );
    let mut problems = Vec::new();
    for (file, doc) in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let at = format!("{file}: {kind} {name}");
        match round_trip(kind, doc) {
            Ok(back) if &back == doc => {}
            Ok(back) => problems.push(format!(
                "{at}: round trip changed the document:\n{back:#}\nvs\n{doc:#}"
            )),
            Err(e) => problems.push(format!("{at}: {e}")),
        }
        let schema = our_schema(kind);
        let mut stored = doc.clone();
        apply_defaults(&mut stored, &schema);
        let pruned = prune(&mut stored, &schema);
        if !pruned.is_empty() {
            problems.push(format!("{at}: the schema would prune {pruned:?}"));
        }
        for e in validate(&stored, &schema) {
            problems.push(format!("{at}: {e}"));
        }
        if let Err(errors) = Validator::new().validate(&schema, &stored, None) {
            problems.extend(
                errors
                    .into_vec()
                    .into_iter()
                    .map(|e| format!("{at}: CEL {}: {}", e.field_path, e.message)),
            );
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!("{} CAPO sample documents accepted", docs.len());
}

/// What the parity check compares at each field path.
#[derive(Clone, Debug, PartialEq)]
struct FieldShape {
    type_: Value,
    required: bool,
    enum_: Value,
    default: Value,
    format: Value,
    list_type: Value,
    /// `x-kubernetes-map-type` (atomic): how a server-side apply merges the object.
    map_type: Value,
    /// maxItems, maxLength, maxProperties, minItems, minLength, minimum, maximum, pattern:
    /// the API server's CEL cost estimate depends on the upper bounds, and a bound tighter
    /// than CAPO's would refuse a manifest CAPO accepts.
    bounds: BTreeMap<&'static str, Value>,
}

const BOUNDS: [&str; 8] = [
    "maxItems",
    "maxLength",
    "maxProperties",
    "minItems",
    "minLength",
    "minimum",
    "maximum",
    "pattern",
];

/// Every field path below `spec` with its shape. `list_type` and `map_type` are compared only
/// where the reference declares one, so we may add markers CAPO lacks.
fn spec_fields(schema: &Value) -> BTreeMap<String, FieldShape> {
    let mut out = BTreeMap::new();
    walk(&schema["properties"]["spec"], "spec", false, &mut out);
    out
}

fn walk(node: &Value, path: &str, required: bool, out: &mut BTreeMap<String, FieldShape>) {
    out.insert(
        path.to_owned(),
        FieldShape {
            type_: node["type"].clone(),
            required,
            enum_: node["enum"].clone(),
            default: node["default"].clone(),
            format: node["format"].clone(),
            list_type: node["x-kubernetes-list-type"].clone(),
            map_type: node["x-kubernetes-map-type"].clone(),
            bounds: BOUNDS
                .iter()
                // Compared as numbers: our typed CRDs hold bounds as floats.
                .filter_map(|b| {
                    node.get(*b)
                        .map(|v| (*b, v.as_f64().map_or(v.clone(), |f| json!(f))))
                })
                .collect(),
        },
    );
    let required_names: Vec<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, child) in node["properties"].as_object().into_iter().flatten() {
        walk(
            child,
            &format!("{path}.{name}"),
            required_names.contains(&name.as_str()),
            out,
        );
    }
    if node.get("items").is_some() {
        walk(&node["items"], &format!("{path}[]"), false, out);
    }
    if node["additionalProperties"].is_object() {
        walk(
            &node["additionalProperties"],
            &format!("{path}{{}}"),
            false,
            out,
        );
    }
}

/// The schema of `version` in a CRD (as JSON), if it serves that version.
fn version_schema(crd: &Value, version: &str) -> Option<Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == version)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
}

#[test]
fn our_spec_field_paths_equal_capos() {
    let Some(dir) = capo_reference_dir() else {
        return;
    };
    let mut differences = Vec::new();
    let mut compared = 0;
    for (kind, _) in KINDS {
        // CAPO's files follow the same `<group>_<plural>.yaml` convention as ours.
        let ours_crd = our_crd(kind);
        let file = dir.join("crds").join(format!(
            "{}_{}.yaml",
            ours_crd["spec"]["group"].as_str().unwrap_or_default(),
            ours_crd["spec"]["names"]["plural"]
                .as_str()
                .unwrap_or_default()
        ));
        let reference = yaml_documents(&std::fs::read_to_string(&file).expect("CAPO CRD file"));
        let their_versions: Vec<String> = reference[0]["spec"]["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .map(|v| v["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        for version in &their_versions {
            let Some(our_schema) = version_schema(&ours_crd, version) else {
                differences.push(format!("{kind} {version}: not served"));
                continue;
            };
            let theirs = spec_fields(&version_schema(&reference[0], version).expect("listed"));
            let ours = spec_fields(&our_schema);
            differences.extend(compare_spec_fields(
                &format!("{kind} {version}"),
                &theirs,
                &ours,
            ));
            compared += theirs.len();
        }
        let served: Vec<&str> = ours_crd["spec"]["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(
            served, their_versions,
            "{kind}: the versions CAPO main serves"
        );
    }
    eprintln!("{compared} spec field paths compared over every served version");
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

fn compare_spec_fields(
    at: &str,
    theirs: &BTreeMap<String, FieldShape>,
    ours: &BTreeMap<String, FieldShape>,
) -> Vec<String> {
    assert!(theirs.len() > 1, "{at}: reference has spec fields");
    let mut differences = Vec::new();
    for (path, their_shape) in theirs {
        let Some(our_shape) = ours.get(path) else {
            differences.push(format!("{at} {path}: missing"));
            continue;
        };
        let comparable = FieldShape {
            list_type: if their_shape.list_type.is_null() {
                Value::Null
            } else {
                our_shape.list_type.clone()
            },
            map_type: if their_shape.map_type.is_null() {
                Value::Null
            } else {
                our_shape.map_type.clone()
            },
            // The root `spec` is required in our CRDs (see docs/api.md); CAPO leaves it optional.
            required: if path == "spec" {
                their_shape.required
            } else {
                our_shape.required
            },
            ..our_shape.clone()
        };
        if &comparable != their_shape {
            differences.push(format!(
                "{at} {path}: ours {our_shape:?} vs CAPO {their_shape:?}"
            ));
        }
    }
    differences.extend(
        ours.keys()
            .filter(|p| !theirs.contains_key(*p))
            .map(|p| format!("{at} {p}: not in CAPO")),
    );
    differences
}
