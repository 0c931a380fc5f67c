//! The v1beta1 schema, derived from the v1beta2 schema with the same field table the
//! conversion uses ([`super::fields`]): what is not listed there is the same in both
//! versions, so it is shared, and a field added to v1beta2 appears in v1beta1 too (and
//! survives a round trip through it).

use serde_json::{Map, Value, json};

use super::fields::{
    CLUSTER_SPEC, CLUSTER_STATUS, Field, HUB_CONTAINERS, MACHINE_SPEC, MACHINE_STATUS,
};

/// `schema` (a v1beta2 `openAPIV3Schema` of `kind`) rewritten as v1beta1. The caller adds
/// the CEL rules that name fields (they were written for v1beta2's names).
pub fn spoke_schema(kind: &str, schema: &Value) -> Value {
    let mut schema = schema.clone();
    let root = &mut schema["properties"];
    match kind {
        "OpenStackCluster" => {
            cluster_spec(&mut root["spec"]);
            cluster_status(&mut root["status"]);
        }
        "OpenStackClusterTemplate" => {
            let template = &mut root["spec"]["properties"]["template"];
            cluster_spec(&mut template["properties"]["spec"]);
            remove_property(template, "metadata");
        }
        "OpenStackMachine" => {
            machine_spec(&mut root["spec"]);
            machine_status(&mut root["status"]);
        }
        "OpenStackMachineTemplate" => {
            machine_spec(&mut root["spec"]["properties"]["template"]["properties"]["spec"]);
            if let Some(conditions) = root.pointer_mut("/status/properties/conditions") {
                *conditions = spoke_conditions();
            }
        }
        _ => {}
    }
    if let Some(spec) = schema.pointer_mut("/properties/spec") {
        as_v1beta1_declared_it(spec, "spec");
    }
    schema
}

/// Strings that keep `minLength: 1` in v1beta1 (v1beta2 added it to many more).
const KEEPS_MIN_LENGTH: &[&str] = &[
    "tags[]",
    "tagsAny[]",
    "notTags[]",
    "notTagsAny[]",
    "identityRef.cloudName",
    "identityRef.name",
    "availabilityZone.name",
    "schedulerHintAdditionalProperties[].name",
    "value.string",
    "spec.flavor",
    "spec.flavorID",
];

/// Fields v1beta1 requires (Go fields without `omitempty`, all defaulted).
const V1BETA1_REQUIRED: &[(&str, &str)] = &[
    ("identityRef", "type"),
    ("apiServerLoadBalancer", "enabled"),
    ("managedSecurityGroups", "allowAllInClusterTraffic"),
];

/// The spec's validation as CAPO's v1beta1 declares it, where it differs from v1beta2's
/// beyond the moved fields: integers without `format: int32` (v1beta1 used Go `int`), fewer
/// `minLength: 1`, no enum on a block device's storage type, a few required fields, and
/// Cluster API v1beta1's looser `controlPlaneEndpoint`.
fn as_v1beta1_declared_it(node: &mut Value, path: &str) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    let endpoint_port = path.ends_with("controlPlaneEndpoint.port");
    if map.get("format") == Some(&json!("int32")) && !endpoint_port {
        map.remove("format");
    }
    if map.get("minLength") == Some(&json!(1))
        && !KEEPS_MIN_LENGTH.iter().any(|k| path.ends_with(k))
    {
        map.remove("minLength");
    }
    if endpoint_port {
        map.remove("minimum");
        map.remove("maximum");
    }
    if path.ends_with("storage.type") {
        map.remove("enum");
    }
    if path.ends_with("externalRouterIPs") {
        map.remove("minItems");
    }
    for (at, name) in V1BETA1_REQUIRED {
        if path.ends_with(at)
            && map
                .get("properties")
                .is_some_and(|p| p.get(*name).is_some())
        {
            let required = map.entry("required").or_insert(json!([]));
            if let Value::Array(required) = required
                && !required.contains(&json!(name))
            {
                required.push(json!(name));
            }
        }
    }
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        for (name, child) in properties.iter_mut() {
            as_v1beta1_declared_it(child, &format!("{path}.{name}"));
        }
    }
    if let Some(items) = map.get_mut("items") {
        as_v1beta1_declared_it(items, &format!("{path}[]"));
    }
}

fn cluster_spec(spec: &mut Value) {
    move_fields(spec, CLUSTER_SPEC);
    if let Some(Value::Object(properties)) = spec.get_mut("properties") {
        for name in HUB_CONTAINERS {
            let emptied = properties
                .get(*name)
                .is_some_and(|c| c["properties"].as_object().is_none_or(Map::is_empty));
            if emptied {
                properties.remove(*name);
            }
        }
    }
    if let Some(bastion) = spec.pointer_mut("/properties/bastion/properties/spec") {
        machine_spec(bastion);
    }
}

fn machine_spec(spec: &mut Value) {
    move_fields(spec, MACHINE_SPEC);
    if let Some(port) = spec.pointer_mut("/properties/ports/items")
        && let Some(map) = port.as_object_mut()
    {
        let rules = map.entry("x-kubernetes-validations").or_insert(json!([]));
        if let Value::Array(rules) = rules {
            rules.push(json!({
                "rule": "has(self.disablePortSecurity) && self.disablePortSecurity && has(self.securityGroups) ? size(self.securityGroups) == 0 : true",
                "message": "securityGroups cannot be set when disablePortSecurity is true",
            }));
        }
    }
    let Some(properties) = spec["properties"].as_object_mut() else {
        return;
    };
    properties.insert(
        "flavor".into(),
        json!({"type": "string", "minLength": 1, "description": "The name of the flavor to boot the server with (v1beta2: flavor.filter.name). Give flavor or flavorID."}),
    );
    properties.insert(
        "flavorID".into(),
        json!({"type": "string", "minLength": 1, "description": "The ID of the flavor to boot the server with; it wins over flavor (v1beta2: flavor.id)."}),
    );
    remove_required(spec, "flavor");
}

fn cluster_status(status: &mut Value) {
    move_fields(status, CLUSTER_STATUS);
    v1beta1_status(status);
    if let Some(domains) = status.pointer_mut("/properties/failureDomains") {
        let mut entry = domains["items"].clone();
        remove_property(&mut entry, "name");
        remove_required(&mut entry, "name");
        *domains = json!({
            "type": "object",
            "description": "The OpenStack availability zones the cluster may use, by name.",
            "additionalProperties": entry,
        });
    }
}

fn machine_status(status: &mut Value) {
    move_fields(status, MACHINE_STATUS);
    v1beta1_status(status);
}

/// What every v1beta1 status has: CAPI v1beta1 conditions, `ready` (required) and the
/// failure fields.
fn v1beta1_status(status: &mut Value) {
    let Some(properties) = status["properties"].as_object_mut() else {
        return;
    };
    properties.insert("conditions".into(), spoke_conditions());
    properties.insert(
        "ready".into(),
        json!({"type": "boolean", "description": "True when the Ready condition is True (derived on conversion)."}),
    );
    properties.insert(
        "failureReason".into(),
        json!({"type": "string", "description": "A terminal problem, as CAPO 0.14 reported it (not written by capo-rs)."}),
    );
    properties.insert(
        "failureMessage".into(),
        json!({"type": "string", "description": "A terminal problem, in words (not written by capo-rs)."}),
    );
    let required = status
        .as_object_mut()
        .map(|s| s.entry("required").or_insert(json!([])));
    if let Some(Value::Array(required)) = required
        && !required.contains(&json!("ready"))
    {
        required.push(json!("ready"));
    }
}

/// Cluster API v1beta1's `Conditions`.
fn spoke_conditions() -> Value {
    json!({
        "type": "array",
        "description": "Observations of the object's state, in Cluster API v1beta1's shape.",
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "status", "type"],
            "properties": {
                "type": {"type": "string", "minLength": 1, "maxLength": 256},
                "status": {"type": "string"},
                "severity": {"type": "string", "maxLength": 32},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string", "minLength": 1, "maxLength": 256},
                "message": {"type": "string", "minLength": 1, "maxLength": 10240},
            },
        },
    })
}

/// Moves each field's schema from its v1beta2 place to its v1beta1 place.
fn move_fields(section: &mut Value, fields: &[Field]) {
    for field in fields {
        let Some(container) = node_at(section, field.at) else {
            continue;
        };
        let Some(mut node) = take_property(container, field.hub) else {
            continue;
        };
        if field.flip {
            node["description"] = json!(field.doc);
        }
        if let Some(properties) = container["properties"].as_object_mut() {
            properties.insert(field.spoke.to_owned(), node);
        }
        // A rule naming the v1beta2 field cannot compile here; the kind restates it.
        let hub_name = format!("self.{}", field.hub);
        if let Some(Value::Array(rules)) = container.get_mut("x-kubernetes-validations") {
            rules.retain(|r| !r["rule"].as_str().is_some_and(|r| r.contains(&hub_name)));
        }
    }
}

/// The schema node at a dotted path of properties (`[]`: the list's items).
fn node_at<'v>(schema: &'v mut Value, at: &str) -> Option<&'v mut Value> {
    let mut node = schema;
    for segment in at.split('.').filter(|s| !s.is_empty()) {
        let (name, each) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        node = node.get_mut("properties")?.get_mut(name)?;
        if each {
            node = node.get_mut("items")?;
        }
    }
    Some(node)
}

/// Removes the property at a dotted path (and its name from its parent's `required`).
fn take_property(schema: &mut Value, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => {
            remove_required(schema, path);
            schema.get_mut("properties")?.as_object_mut()?.remove(path)
        }
        Some((head, rest)) => take_property(schema.get_mut("properties")?.get_mut(head)?, rest),
    }
}

fn remove_property(schema: &mut Value, name: &str) {
    if let Some(properties) = schema["properties"].as_object_mut() {
        properties.remove(name);
    }
    remove_required(schema, name);
}

fn remove_required(schema: &mut Value, name: &str) {
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|r| r != name);
        if required.is_empty()
            && let Some(map) = schema.as_object_mut()
        {
            map.remove("required");
        }
    }
}
