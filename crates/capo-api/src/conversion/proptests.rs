//! The conversion's round trips on random objects of every kind and version, generated from
//! our CRDs' own schemas (as CAPO's fuzz conversion tests fill every field): v1beta1 →
//! v1beta2 → v1beta1 and v1beta2 → v1beta1 → v1beta2 give back the object, byte for byte.
//! `PROPTEST_CASES` sets how many objects per kind and version (default 64).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};

use super::{DATA_ANNOTATION, convert};

/// How deep optional fields are still filled; below, only required ones.
const DEPTH: usize = 7;

fn string(node: &Value) -> BoxedStrategy<Value> {
    if node["format"] == "date-time" {
        return prop_oneof![Just("2026-01-01T00:00:00Z"), Just("2026-11-24T10:20:30Z")]
            .prop_map(|s| json!(s))
            .boxed();
    }
    // Letters first: fits CamelCase reasons, names and most patterns.
    "[A-Za-z][A-Za-z0-9.-]{0,10}"
        .prop_map(Value::String)
        .boxed()
}

fn integer(node: &Value) -> BoxedStrategy<Value> {
    let low = node["minimum"].as_i64().unwrap_or(0);
    let high = node["maximum"].as_i64().unwrap_or(70_000).max(low);
    (low..=high).prop_map(|n| json!(n)).boxed()
}

/// A random value that `node` (a structural schema) accepts.
fn value(node: &Value, depth: usize) -> BoxedStrategy<Value> {
    if let Some(choices) = node["enum"].as_array().filter(|c| !c.is_empty()) {
        return prop::sample::select(choices.clone()).boxed();
    }
    if node["x-kubernetes-int-or-string"] == true
        || node["x-kubernetes-preserve-unknown-fields"] == true && node.get("properties").is_none()
    {
        return string(node);
    }
    match node["type"].as_str() {
        Some("string") => string(node),
        Some("integer") => integer(node),
        Some("number") => (0u32..1000).prop_map(|n| json!(n)).boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::Bool).boxed(),
        Some("array") => {
            let most = if depth >= DEPTH { 0 } else { 3 };
            let least = node["minItems"].as_u64().unwrap_or(0).min(1) as usize;
            prop::collection::vec(value(&node["items"], depth + 1), least..=most.max(least))
                .prop_map(Value::Array)
                .boxed()
        }
        _ => object(node, depth),
    }
}

fn object(node: &Value, depth: usize) -> BoxedStrategy<Value> {
    if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
        let most = if depth >= DEPTH { 0 } else { 2 };
        return prop::collection::btree_map(
            "[a-z][a-z0-9-]{0,6}",
            value(values, depth + 1),
            0..=most,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed();
    }
    let required: Vec<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = node["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| depth < DEPTH || required.contains(&name.as_str()))
        .map(|(name, child)| {
            let is_required = required.contains(&name.as_str());
            let name = name.clone();
            let field = value(child, depth + 1).prop_map(move |v| (name.clone(), v));
            if is_required {
                field.prop_map(Some).boxed()
            } else {
                prop::option::weighted(0.6, field).boxed()
            }
        })
        .collect();
    fields
        .prop_map(|fields| Value::Object(fields.into_iter().flatten().collect::<Map<_, _>>()))
        .boxed()
}

fn version_schema(kind: &str, version: &str) -> Value {
    let crd = crate::crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect("our kind");
    let crd = serde_json::to_value(crd).expect("JSON");
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .expect("served")
}

/// A whole object: random spec and status, metadata as the API server sends it.
fn objects(kind: &'static str, version: &'static str) -> impl Strategy<Value = Value> {
    let schema = version_schema(kind, version);
    let spec = value(&schema["properties"]["spec"], 1);
    let status = prop::option::of(value(&schema["properties"]["status"], 1));
    let annotations = prop::collection::btree_map(
        "[a-z]{1,5}\\.example\\.com/[a-z]{1,5}",
        "[ -~]{0,12}",
        0..=2,
    );
    (spec, status, 1i64..6, annotations).prop_map(move |(spec, status, generation, annotations)| {
        let mut object = json!({
            "apiVersion": format!("{}/{version}", crate::GROUP), "kind": kind,
            "metadata": {"name": "random", "namespace": "ns", "uid": "0d6a1b9e-8c2f-4e5d-9a7b-3c1e2f4a5b6d",
                         "generation": generation, "resourceVersion": "42"},
            "spec": spec,
        });
        if !annotations.is_empty() {
            object["metadata"]["annotations"] = json!(annotations);
        }
        if let Some(status) = status {
            object["status"] = status;
        }
        object
    })
}

fn round_trips(kind: &'static str, from: &'static str, via: &'static str) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let result = runner.run(&objects(kind, from), |object| {
        let target = format!("{}/{via}", crate::GROUP);
        let there = convert(&object, &target).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(there["apiVersion"].as_str(), Some(target.as_str()));
        let back = convert(&there, &format!("{}/{from}", crate::GROUP))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            &back,
            &object,
            "{} {} -> {} -> {} changed it",
            kind,
            from,
            via,
            from
        );
        prop_assert!(
            back["metadata"]["annotations"]
                .get(DATA_ANNOTATION)
                .is_none()
        );
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{kind} {from} -> {via} -> {from}: {failure}");
    }
}

macro_rules! both_ways {
    ($($name:ident: $kind:literal;)*) => {$(
        #[test]
        fn $name() {
            round_trips($kind, "v1beta1", "v1beta2");
            round_trips($kind, "v1beta2", "v1beta1");
        }
    )*};
}

both_ways! {
    clusters_round_trip: "OpenStackCluster";
    cluster_templates_round_trip: "OpenStackClusterTemplate";
    machines_round_trip: "OpenStackMachine";
    machine_templates_round_trip: "OpenStackMachineTemplate";
}

#[test]
fn single_version_kinds_convert_to_themselves() {
    round_trips("OpenStackServer", "v1alpha1", "v1alpha1");
    round_trips("OpenStackClusterIdentity", "v1alpha1", "v1alpha1");
}
