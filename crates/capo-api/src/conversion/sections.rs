//! The plain conversion of each kind's spec and status, without the annotation.

use serde_json::{Map, Value, json};

use super::fields::{
    self, CLUSTER_SPEC, CLUSTER_STATUS, Direction, HUB_CONTAINERS, MACHINE_SPEC, MACHINE_STATUS,
};

/// What a condition converted from v1beta1 says when v1beta1 gave no reason
/// (`metav1.Condition` requires one; CAPI v1beta1 leaves it empty on `True`).
pub const NO_REASON: &str = "NoReasonReported";

/// `object` (either version) with its spec and status converted in `direction`; metadata,
/// apiVersion and kind as they were.
pub fn convert(object: &Value, kind: &str, direction: Direction) -> Value {
    let mut out = object.clone();
    let generation = object["metadata"]["generation"].as_i64();
    if let Some(spec) = out.get_mut("spec") {
        match kind {
            "OpenStackCluster" => cluster_spec(spec, direction),
            "OpenStackMachine" => machine_spec(spec, direction),
            "OpenStackClusterTemplate" => cluster_template_spec(spec, direction),
            "OpenStackMachineTemplate" => {
                if let Some(inner) = spec.pointer_mut("/template/spec") {
                    machine_spec(inner, direction);
                }
            }
            _ => {}
        }
    }
    if let Some(status) = out.get_mut("status") {
        match kind {
            "OpenStackCluster" => {
                fields::apply(status, CLUSTER_STATUS, direction);
                failure_domains(status, direction);
                common_status(status, direction, generation, true);
            }
            "OpenStackMachine" => {
                fields::apply(status, MACHINE_STATUS, direction);
                common_status(status, direction, generation, true);
            }
            "OpenStackMachineTemplate" => common_status(status, direction, generation, false),
            _ => {}
        }
    }
    out
}

/// A cluster spec: its own fields and its bastion's machine spec.
pub fn cluster_spec(spec: &mut Value, direction: Direction) {
    fields::apply(spec, CLUSTER_SPEC, direction);
    if let Some(bastion) = spec.pointer_mut("/bastion/spec") {
        machine_spec(bastion, direction);
    }
    if direction == Direction::Down
        && let Value::Object(map) = spec
    {
        fields::drop_empty(map, HUB_CONTAINERS);
    }
}

fn cluster_template_spec(spec: &mut Value, direction: Direction) {
    if let Some(inner) = spec.pointer_mut("/template/spec") {
        cluster_spec(inner, direction);
    }
    // v1beta1 templates carry no metadata for the cluster they stamp out.
    if direction == Direction::Down
        && let Some(Value::Object(template)) = spec.get_mut("template")
    {
        template.remove("metadata");
    }
}

/// A machine spec: the flavor, and the ports' port security.
pub fn machine_spec(spec: &mut Value, direction: Direction) {
    fields::apply(spec, MACHINE_SPEC, direction);
    let Value::Object(map) = spec else {
        return;
    };
    match direction {
        Direction::Up => flavor_up(map),
        Direction::Down => flavor_down(map),
    }
}

/// v1beta1 names the flavor by `flavor` (a name) or `flavorID`; the ID wins when both are
/// given, as in CAPO.
fn flavor_up(map: &mut Map<String, Value>) {
    let id = map.remove("flavorID");
    let name = match map.get("flavor") {
        Some(Value::String(_)) | None => map.remove("flavor"),
        // Not a v1beta1 flavor: leave it as it is.
        Some(_) => None,
    };
    let flavor = match (id, name) {
        (Some(id), _) => json!({"id": id}),
        (None, Some(name)) => json!({"filter": {"name": name}}),
        (None, None) => return,
    };
    map.insert("flavor".into(), flavor);
}

fn flavor_down(map: &mut Map<String, Value>) {
    let Some(Value::Object(flavor)) = map.get("flavor") else {
        return;
    };
    let id = flavor.get("id").cloned();
    let name = flavor.get("filter").and_then(|f| f.get("name")).cloned();
    map.remove("flavor");
    match (id, name) {
        (Some(id), _) => {
            map.insert("flavorID".into(), id);
        }
        (None, Some(name)) => {
            map.insert("flavor".into(), name);
        }
        (None, None) => {}
    }
}

/// Conditions in each version's shape; v1beta1's `ready` (derived from `Ready`) and its
/// failure fields, which v1beta2 dropped.
fn common_status(
    status: &mut Value,
    direction: Direction,
    generation: Option<i64>,
    has_ready: bool,
) {
    let Value::Object(map) = status else {
        return;
    };
    if let Some(Value::Array(conditions)) = map.get_mut("conditions") {
        for condition in conditions.iter_mut().filter_map(Value::as_object_mut) {
            match direction {
                Direction::Up => condition_up(condition, generation),
                Direction::Down => condition_down(condition),
            }
        }
    }
    match direction {
        Direction::Up => {
            for name in ["ready", "failureReason", "failureMessage"] {
                map.remove(name);
            }
        }
        Direction::Down if has_ready => {
            let ready = map
                .get("conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            map.insert("ready".into(), Value::Bool(ready));
        }
        Direction::Down => {}
    }
}

fn condition_up(condition: &mut Map<String, Value>, generation: Option<i64>) {
    condition.remove("severity");
    if let Some(generation) = generation.filter(|g| *g > 0) {
        condition.insert("observedGeneration".into(), json!(generation));
    }
    if condition
        .get("reason")
        .is_none_or(|r| r.as_str() == Some(""))
    {
        condition.insert("reason".into(), json!(NO_REASON));
    }
    condition.entry("message").or_insert_with(|| json!(""));
}

fn condition_down(condition: &mut Map<String, Value>) {
    condition.remove("observedGeneration");
    for name in ["reason", "message"] {
        if condition.get(name).is_some_and(|m| m.as_str() == Some("")) {
            condition.remove(name);
        }
    }
}

/// v1beta1 keys failure domains by name; v1beta2 lists them sorted by name, each with an
/// explicit `controlPlane`.
fn failure_domains(status: &mut Value, direction: Direction) {
    let Value::Object(map) = status else {
        return;
    };
    match (direction, map.get("failureDomains")) {
        (Direction::Up, Some(Value::Object(domains))) => {
            let mut list: Vec<Value> = domains
                .iter()
                .map(|(name, domain)| {
                    let mut entry = domain.as_object().cloned().unwrap_or_default();
                    entry.insert("name".into(), json!(name));
                    entry.entry("controlPlane").or_insert(json!(false));
                    Value::Object(entry)
                })
                .collect();
            list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            map.insert("failureDomains".into(), Value::Array(list));
        }
        (Direction::Down, Some(Value::Array(list))) => {
            let mut domains = Map::new();
            for entry in list {
                let Some(mut entry) = entry.as_object().cloned() else {
                    return;
                };
                let Some(Value::String(name)) = entry.remove("name") else {
                    return;
                };
                if entry.get("controlPlane") == Some(&json!(false)) {
                    entry.remove("controlPlane");
                }
                domains.insert(name, Value::Object(entry));
            }
            map.insert("failureDomains".into(), Value::Object(domains));
        }
        _ => {}
    }
}
