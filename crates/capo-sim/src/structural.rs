//! What a Kubernetes API server does with a CRD's OpenAPI v3 schema, as pure functions on
//! JSON: check that the schema is *structural* (the server refuses CRDs that are not),
//! apply `default`s, prune unknown fields, and validate values. Used by the CRD tests and
//! by the simulated API server. CEL rules are compiled and checked for placement here;
//! `kube::core::cel::Validator` evaluates them.

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::{Map, Value};

/// One problem found at a field path (e.g. `spec.ports[0].network.id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the offending field.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// The API server's cause reason (`FieldValueInvalid`, `FieldValueTypeInvalid`, ...).
    pub reason: &'static str,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

fn error(path: &str, message: impl Into<String>) -> FieldError {
    let message = message.into();
    let reason = if message == "Required value" {
        "FieldValueRequired"
    } else {
        "FieldValueInvalid"
    };
    FieldError {
        path: path.to_owned(),
        message,
        reason,
    }
}

/// A JSON value's type as the API server's schema validator names it.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn props(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

fn str_field<'a>(schema: &'a Value, key: &str) -> Option<&'a str> {
    schema.get(key).and_then(Value::as_str)
}

fn is_int_or_string(schema: &Value) -> bool {
    schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

const LIST_TYPES: [&str; 3] = ["atomic", "set", "map"];
const SCALARS: [&str; 4] = ["string", "integer", "number", "boolean"];

/// Checks the rules a Kubernetes API server enforces before accepting a CRD schema:
/// every node typed, `properties`/`items` only where the type allows, well-formed
/// list-type markers, defaults that are valid against their own schema, and transition
/// rules (`oldSelf`) only where old and new values can be correlated.
pub fn check_structural(root: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check_node(root, "", true, false, &mut errors);
    errors
}

fn check_node(
    schema: &Value,
    path: &str,
    is_root: bool,
    uncorrelatable: bool,
    errors: &mut Vec<FieldError>,
) {
    let Some(obj) = schema.as_object() else {
        errors.push(error(path, "schema node is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "definitions",
        "$defs",
        "additionalItems",
        "patternProperties",
        "dependencies",
        "id",
    ] {
        if obj.contains_key(forbidden) {
            errors.push(error(
                path,
                format!("`{forbidden}` is not allowed in a structural schema"),
            ));
        }
    }
    for junction in ["anyOf", "oneOf", "allOf", "not"] {
        if let Some(branch) = obj.get(junction) {
            check_value_validation_only(
                branch,
                &child(path, junction),
                is_int_or_string(schema),
                errors,
            );
        }
    }
    let type_ = str_field(schema, "type");
    match type_ {
        None if is_int_or_string(schema) || preserves_unknown(schema) => {}
        None => errors.push(error(path, "type must be set")),
        Some(t) if !["object", "array", "string", "integer", "number", "boolean"].contains(&t) => {
            errors.push(error(path, format!("unknown type {t}")))
        }
        Some(_) => {}
    }
    if obj.contains_key("properties") && type_ != Some("object") {
        errors.push(error(path, "properties are only allowed on objects"));
    }
    if obj.contains_key("items") != (type_ == Some("array")) {
        errors.push(error(path, "items must be set exactly on arrays"));
    }
    if obj.contains_key("properties")
        && obj
            .get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
    {
        errors.push(error(
            path,
            "properties and additionalProperties are mutually exclusive",
        ));
    }
    check_list_markers(schema, path, errors);
    check_default(schema, path, is_root, errors);
    check_rules(schema, path, uncorrelatable, errors);
    if let Some(required) = obj.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !props(schema).is_some_and(|p| p.contains_key(name)) {
                errors.push(error(
                    path,
                    format!("required property {name} is not declared"),
                ));
            }
        }
    }

    if let Some(properties) = props(schema) {
        for (name, sub) in properties {
            // The server owns metadata's schema; CRDs may only say `type: object` there.
            if is_root && name == "metadata" {
                continue;
            }
            check_node(sub, &child(path, name), false, uncorrelatable, errors);
        }
    }
    if let Some(items) = obj.get("items") {
        let correlatable = str_field(schema, "x-kubernetes-list-type") == Some("map");
        check_node(
            items,
            &format!("{path}[]"),
            false,
            uncorrelatable || !correlatable,
            errors,
        );
    }
    if let Some(additional) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        check_node(
            additional,
            &format!("{path}{{}}"),
            false,
            uncorrelatable,
            errors,
        );
    }
}

/// Inside `anyOf`/`oneOf`/`allOf`/`not` only value validations may appear, never structure;
/// `type` is allowed only for the int-or-string idiom (`anyOf: [{type: integer}, {type: string}]`).
fn check_value_validation_only(
    branch: &Value,
    path: &str,
    int_or_string: bool,
    errors: &mut Vec<FieldError>,
) {
    let nodes: Vec<&Value> = match branch {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    for node in nodes {
        let type_ok =
            int_or_string && matches!(str_field(node, "type"), Some("integer" | "string"));
        if node.get("type").is_some() && !type_ok {
            errors.push(error(
                path,
                "`type` is not allowed inside a value validation",
            ));
        }
        for structural in [
            "properties",
            "items",
            "additionalProperties",
            "default",
            "nullable",
            "description",
        ] {
            if node.get(structural).is_some() {
                errors.push(error(
                    path,
                    format!("`{structural}` is not allowed inside a value validation"),
                ));
            }
        }
    }
}

fn check_list_markers(schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let list_type = schema.get("x-kubernetes-list-type");
    let keys = schema.get("x-kubernetes-list-map-keys");
    if list_type.is_none() && keys.is_none() {
        return;
    }
    if str_field(schema, "type") != Some("array") {
        errors.push(error(
            path,
            "x-kubernetes-list-type is only allowed on arrays",
        ));
        return;
    }
    let list_type = list_type.and_then(Value::as_str).unwrap_or("");
    if !LIST_TYPES.contains(&list_type) {
        errors.push(error(
            path,
            format!("x-kubernetes-list-type must be atomic, set or map, not {list_type:?}"),
        ));
    }
    let items = schema.get("items").unwrap_or(&Value::Null);
    let item_type = str_field(items, "type");
    match list_type {
        "set" if !item_type.is_some_and(|t| SCALARS.contains(&t)) => {
            errors.push(error(path, "a set's items must be scalars"));
        }
        "map" => check_map_keys(items, keys, path, errors),
        _ if keys.is_some() => errors.push(error(
            path,
            "x-kubernetes-list-map-keys needs x-kubernetes-list-type map",
        )),
        _ => {}
    }
}

fn check_map_keys(items: &Value, keys: Option<&Value>, path: &str, errors: &mut Vec<FieldError>) {
    if str_field(items, "type") != Some("object") {
        errors.push(error(path, "a map list's items must be objects"));
        return;
    }
    let Some(keys) = keys.and_then(Value::as_array).filter(|k| !k.is_empty()) else {
        errors.push(error(
            path,
            "x-kubernetes-list-map-keys must name at least one key",
        ));
        return;
    };
    let required: BTreeSet<&str> = items
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for key in keys {
        let Some(key) = key.as_str() else {
            errors.push(error(path, "map keys must be strings"));
            continue;
        };
        let Some(key_schema) = props(items).and_then(|p| p.get(key)) else {
            errors.push(error(
                path,
                format!("map key {key} is not a property of the items"),
            ));
            continue;
        };
        if !str_field(key_schema, "type").is_some_and(|t| SCALARS.contains(&t)) {
            errors.push(error(path, format!("map key {key} must be a scalar")));
        }
        if !required.contains(key) && key_schema.get("default").is_none() {
            errors.push(error(
                path,
                format!("map key {key} must be required or have a default"),
            ));
        }
    }
}

fn check_default(schema: &Value, path: &str, is_root: bool, errors: &mut Vec<FieldError>) {
    let Some(default) = schema.get("default") else {
        return;
    };
    if is_root {
        errors.push(error(path, "the root may not have a default"));
        return;
    }
    let mut value = default.clone();
    apply_defaults(&mut value, schema);
    for e in validate(&value, schema) {
        errors.push(error(path, format!("default is invalid: {e}")));
    }
    let pruned = prune(&mut value, schema);
    if !pruned.is_empty() {
        errors.push(error(
            path,
            format!(
                "default has fields the schema prunes: {}",
                pruned.join(", ")
            ),
        ));
    }
}

fn check_rules(schema: &Value, path: &str, uncorrelatable: bool, errors: &mut Vec<FieldError>) {
    let Some(rules) = schema.get("x-kubernetes-validations") else {
        return;
    };
    let Some(rules) = rules.as_array() else {
        errors.push(error(path, "x-kubernetes-validations must be a list"));
        return;
    };
    for rule in rules {
        let Some(text) = str_field(rule, "rule").filter(|t| !t.trim().is_empty()) else {
            errors.push(error(path, "every validation needs a non-empty rule"));
            continue;
        };
        if text.contains("oldSelf") && uncorrelatable {
            errors.push(error(
                path,
                format!("transition rule under a list that is not a map: {text}"),
            ));
        }
        if let Some(e) = compile_error(text) {
            errors.push(error(path, format!("rule does not compile: {e}")));
        }
    }
}

/// Whether a CEL rule compiles, with the Kubernetes CEL library (kube-cel).
fn compile_error(rule: &str) -> Option<String> {
    let compiled = kube::core::cel::compile_schema(
        &serde_json::json!({"x-kubernetes-validations": [{"rule": rule}]}),
    );
    compiled.compilation_errors().first().map(|e| e.to_string())
}

/// Applies `default`s the way the API server does: a missing property with a default gets
/// it (and the defaults inside it), existing values are descended into, and an existing
/// empty object is not filled from its parent's default.
pub fn apply_defaults(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(properties) = props(schema) {
                for (name, sub) in properties {
                    if !map.contains_key(name)
                        && let Some(default) = sub.get("default")
                    {
                        map.insert(name.clone(), default.clone());
                    }
                    if let Some(v) = map.get_mut(name) {
                        apply_defaults(v, sub);
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for v in map.values_mut() {
                    apply_defaults(v, additional);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for v in items {
                    apply_defaults(v, item_schema);
                }
            }
        }
        _ => {}
    }
}

/// Drops `null` values the schema does not mark `nullable`, as the API server does before
/// defaulting (so a null field then gets its default).
pub fn drop_nulls(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            let sub_schema = |name: &str| {
                props(schema)
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
            };
            map.retain(|name, v| {
                !v.is_null()
                    || sub_schema(name)
                        .is_some_and(|s| s.get("nullable") == Some(&Value::Bool(true)))
            });
            for (name, v) in map.iter_mut() {
                if let Some(sub) = sub_schema(name) {
                    drop_nulls(v, sub);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for v in items {
                    drop_nulls(v, item_schema);
                }
            }
        }
        _ => {}
    }
}

/// Root fields every object keeps whatever its schema says.
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Removes fields the schema does not declare (unless it preserves unknown fields) and
/// returns their paths. Root `metadata`, `apiVersion` and `kind` are the server's business.
pub fn prune(value: &mut Value, schema: &Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune_at(value, schema, "", &mut pruned);
    pruned
}

fn prune_at(value: &mut Value, schema: &Value, path: &str, pruned: &mut Vec<String>) {
    if preserves_unknown(schema) {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = props(schema) {
                map.retain(|k, _| {
                    let server_owned = path.is_empty() && ROOT_FIELDS.contains(&k.as_str());
                    let keep = properties.contains_key(k) || server_owned;
                    if !keep {
                        pruned.push(child(path, k));
                    }
                    keep
                });
                for (k, v) in map.iter_mut() {
                    if let Some(sub) = properties.get(k)
                        && !(path.is_empty() && k == "metadata")
                    {
                        prune_at(v, sub, &child(path, k), pruned);
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (k, v) in map.iter_mut() {
                    prune_at(v, additional, &child(path, k), pruned);
                }
            } else if str_field(schema, "type") == Some("object")
                && !map.is_empty()
                && path != "metadata"
            {
                pruned.extend(map.keys().map(|k| child(path, k)));
                map.clear();
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    prune_at(v, item_schema, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

/// Validates a value against a schema: types, required, enums, formats, lengths, ranges,
/// patterns, property counts and list-type uniqueness. Paths are `spec.a[0].b`.
pub fn validate(value: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_at(value, schema, "", &mut errors);
    errors
}

fn validate_at(value: &Value, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if !type_matches(value, schema) {
        // As a v1.35 server words it (recorded): the value's type, quoted, twice.
        let expected = str_field(schema, "type").unwrap_or("int or string");
        let actual = type_name(value);
        errors.push(FieldError {
            reason: "FieldValueTypeInvalid",
            ..error(
                path,
                format!("Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""),
            )
        });
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errors.push(error(
            path,
            format!(
                "unsupported value {value}: supported values: {}",
                list.join(", ")
            ),
        ));
    }
    match value {
        Value::String(s) => validate_string(s, schema, path, errors),
        Value::Number(n) => validate_number(n, schema, path, errors),
        Value::Array(items) => validate_array(items, schema, path, errors),
        Value::Object(map) => validate_object(map, schema, path, errors),
        _ => {}
    }
}

fn type_matches(value: &Value, schema: &Value) -> bool {
    if is_int_or_string(schema) {
        return value.is_string() || value.is_i64() || value.is_u64();
    }
    match str_field(schema, "type") {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    }
}

fn limit(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn validate_string(s: &str, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let len = s.chars().count() as f64;
    if let Some(min) = limit(schema, "minLength").filter(|m| len < *m) {
        errors.push(error(
            path,
            format!("must be at least {min} characters long"),
        ));
    }
    if let Some(max) = limit(schema, "maxLength").filter(|m| len > *m) {
        errors.push(error(
            path,
            format!("may not be more than {max} characters long"),
        ));
    }
    if let Some(pattern) = str_field(schema, "pattern") {
        match Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => {
                errors.push(error(path, format!("must match the pattern {pattern}")))
            }
            Ok(_) => {}
            Err(e) => errors.push(error(path, format!("schema pattern does not compile: {e}"))),
        }
    }
    if let Some(format) = str_field(schema, "format")
        && !format_matches(s, format)
    {
        errors.push(error(path, format!("must be a valid {format}")));
    }
}

fn format_matches(s: &str, format: &str) -> bool {
    match format {
        "uuid" => {
            let hex = |part: &str, n: usize| {
                part.len() == n && part.chars().all(|c| c.is_ascii_hexdigit())
            };
            let parts: Vec<&str> = s.split('-').collect();
            parts.len() == 5 && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(n, p)| hex(p, *n))
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "date-time" => s.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        _ => true,
    }
}

fn validate_number(
    n: &serde_json::Number,
    schema: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let v = n.as_f64().unwrap_or_default();
    if let Some(min) = limit(schema, "minimum").filter(|m| v < *m) {
        errors.push(error(
            path,
            format!("must be greater than or equal to {min}"),
        ));
    }
    if let Some(max) = limit(schema, "maximum").filter(|m| v > *m) {
        errors.push(error(path, format!("must be less than or equal to {max}")));
    }
    if str_field(schema, "format") == Some("int32")
        && n.as_i64().is_none_or(|i| i32::try_from(i).is_err())
    {
        errors.push(error(path, "must fit in a 32-bit integer"));
    }
}

fn validate_array(items: &[Value], schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let len = items.len() as f64;
    if let Some(min) = limit(schema, "minItems").filter(|m| len < *m) {
        errors.push(error(path, format!("must have at least {min} items")));
    }
    if let Some(max) = limit(schema, "maxItems").filter(|m| len > *m) {
        errors.push(FieldError {
            reason: "FieldValueTooMany",
            ..error(
                path,
                format!("Too many: {}: must have at most {max} items", items.len()),
            )
        });
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            validate_at(item, item_schema, &format!("{path}[{i}]"), errors);
        }
    }
    match str_field(schema, "x-kubernetes-list-type") {
        Some("set") => report_duplicates(items.iter().map(Value::to_string), path, errors),
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let key_of = |item: &Value| {
                keys.iter()
                    .map(|k| item.get(*k).map(Value::to_string).unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            report_duplicates(items.iter().map(key_of), path, errors);
        }
        _ => {}
    }
}

fn report_duplicates(keys: impl Iterator<Item = String>, path: &str, errors: &mut Vec<FieldError>) {
    let mut seen = BTreeSet::new();
    for (i, key) in keys.enumerate() {
        if !seen.insert(key.clone()) {
            errors.push(error(
                &format!("{path}[{i}]"),
                format!("duplicate entry {key}"),
            ));
        }
    }
}

fn validate_object(
    map: &Map<String, Value>,
    schema: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let count = map.len() as f64;
    if let Some(min) = limit(schema, "minProperties").filter(|m| count < *m) {
        errors.push(error(path, format!("must have at least {min} properties")));
    }
    if let Some(max) = limit(schema, "maxProperties").filter(|m| count > *m) {
        errors.push(error(path, format!("must have at most {max} properties")));
    }
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(name) {
            errors.push(error(&child(path, name), "Required value"));
        }
    }
    if let Some(properties) = props(schema) {
        for (name, v) in map {
            if path.is_empty() && name == "metadata" {
                continue;
            }
            if let Some(sub) = properties.get(name) {
                validate_at(v, sub, &child(path, name), errors);
            }
        }
    } else if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        for (name, v) in map {
            validate_at(v, additional, &child(path, name), errors);
        }
    }
}

/// Whether an update's error at `path` is ratcheted away (CRD validation ratcheting, GA in
/// 1.33): the value there, or at the deepest ancestor the old object correlates with, is
/// unchanged. As upstream correlates: object fields by name, items of a `map` list by their
/// keys; other lists' items and the root's `apiVersion`/`kind` not at all. A CEL rule's error
/// is judged at the path it reports, which differs from its node only with `fieldPath`.
pub fn ratcheted(path: &str, new: &Value, old: &Value, schema: &Value) -> bool {
    let (mut new, mut old, mut schema) = (new, old, schema);
    if new == old {
        return true;
    }
    for (depth, step) in path_steps(path).into_iter().enumerate() {
        let next = match step {
            Step::Field(name) if depth == 0 && (name == "apiVersion" || name == "kind") => None,
            Step::Field(name) => field_schema(schema, name)
                .and_then(|sub| Some((new.get(name)?, old.get(name)?, sub))),
            Step::Item(index) => schema.get("items").and_then(|items| {
                let item = new.get(index)?;
                Some((item, map_list_partner(schema, item, old)?, items))
            }),
        };
        let Some(next) = next else {
            return false;
        };
        (new, old, schema) = next;
        if new == old {
            return true;
        }
    }
    false
}

enum Step<'a> {
    Field(&'a str),
    Item(usize),
}

/// `spec.a[0].b` as steps; a bracket that holds no index ends the walk there.
fn path_steps(path: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let mut parts = segment.split('[');
        if let Some(name) = parts.next().filter(|n| !n.is_empty()) {
            steps.push(Step::Field(name));
        }
        for index in parts {
            match index.trim_end_matches(']').parse() {
                Ok(i) => steps.push(Step::Item(i)),
                Err(_) => return steps,
            }
        }
    }
    steps
}

fn field_schema<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    props(schema)
        .and_then(|p| p.get(name))
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

/// The old list's item with `item`'s keys, when the list is a `map` list.
fn map_list_partner<'a>(schema: &Value, item: &Value, old: &'a Value) -> Option<&'a Value> {
    if str_field(schema, "x-kubernetes-list-type") != Some("map") {
        return None;
    }
    let keys: Vec<&str> = schema
        .get("x-kubernetes-list-map-keys")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    old.as_array()?
        .iter()
        .find(|candidate| keys.iter().all(|k| candidate.get(*k) == item.get(*k)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
                        "id": {"type": "string", "format": "uuid"},
                        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                        "nested": {"type": "object", "properties": {"on": {"type": "boolean", "default": true}}}
                    }
                },
                "status": {
                    "type": "object",
                    "default": {"observedGeneration": -1},
                    "properties": {"observedGeneration": {"type": "integer", "format": "int64"}}
                }
            }
        })
    }

    #[test]
    fn defaults_fill_missing_fields_but_not_an_existing_empty_object() {
        let mut obj = json!({"spec": {"name": "x", "nested": {}}});
        apply_defaults(&mut obj, &schema());
        assert_eq!(obj["status"], json!({"observedGeneration": -1}));
        assert_eq!(obj["spec"]["mode"], "A");
        assert_eq!(obj["spec"]["nested"]["on"], true);

        let mut obj = json!({"spec": {"name": "x"}, "status": {}});
        apply_defaults(&mut obj, &schema());
        assert_eq!(obj["status"], json!({}), "status: {{}} is not re-defaulted");
    }

    #[test]
    fn validation_reports_each_problem_with_its_path() {
        let obj = json!({"spec": {"mode": "C", "id": "nope", "port": 0, "tags": ["a", "a"]}});
        let errors: Vec<String> = validate(&obj, &schema())
            .iter()
            .map(ToString::to_string)
            .collect();
        for expected in [
            "spec.name: Required value",
            "spec.mode: unsupported value",
            "spec.id: must be a valid uuid",
            "spec.port: must be greater",
            "spec.tags[1]: duplicate",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(expected)),
                "missing {expected:?} in {errors:#?}"
            );
        }
        assert!(
            validate(&json!({"spec": {"name": 5}}), &schema())[0]
                .message
                .contains("type string")
        );
    }

    #[test]
    fn prune_removes_and_reports_unknown_fields() {
        let mut obj = json!({"metadata": {"name": "m"}, "spec": {"name": "x", "bogus": 1}});
        assert_eq!(prune(&mut obj, &schema()), vec!["spec.bogus".to_owned()]);
        assert_eq!(
            obj,
            json!({"metadata": {"name": "m"}, "spec": {"name": "x"}})
        );
    }

    #[test]
    fn prune_keeps_the_root_fields_every_object_has() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object"}}});
        let mut obj =
            json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "m"}, "other": 1});
        assert_eq!(prune(&mut obj, &schema), vec!["other".to_owned()]);
        assert_eq!(
            obj,
            json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "m"}})
        );
    }

    #[test]
    fn structural_check_accepts_a_good_schema() {
        assert_eq!(check_structural(&schema()), vec![]);
    }

    #[test]
    fn structural_check_catches_each_broken_rule() {
        let cases = [
            (
                json!({"type": "object", "properties": {"a": {}}}),
                "type must be set",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array"}}}),
                "items must be set",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "default": 3}}}),
                "default is invalid",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "bag", "items": {"type": "string"}}}}),
                "must be atomic, set or map",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}}),
                "must be required or have a default",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "set",
                "items": {"type": "object"}}}}),
                "a set's items must be scalars",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "atomic",
                "items": {"type": "object", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}}),
                "transition rule",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-validations": [{"rule": "size(self > 1"}]}}}),
                "does not compile",
            ),
            (
                json!({"type": "object", "required": ["b"], "properties": {}}),
                "required property b",
            ),
            (
                json!({"type": "object", "anyOf": [{"properties": {"x": {"type": "string"}}}]}),
                "not allowed inside a value validation",
            ),
            (
                json!({"type": "object", "default": {}}),
                "root may not have a default",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "anyOf": [{"type": "integer"}]}}}),
                "`type` is not allowed",
            ),
        ];
        for (schema, expected) in cases {
            let errors = check_structural(&schema);
            assert!(
                errors.iter().any(|e| e.message.contains(expected)),
                "{expected:?} not in {errors:?} for {schema}"
            );
        }
    }

    #[test]
    fn transition_rules_under_map_lists_are_allowed() {
        let s = json!({"type": "object", "properties": {"a": {"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["k"],
            "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}},
                      "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}});
        assert_eq!(check_structural(&s), vec![]);
    }

    #[test]
    fn formats_are_checked() {
        assert!(format_matches(
            "2f1e5b8c-0b7d-4c1e-9a53-2f6f3d9a7c11",
            "uuid"
        ));
        assert!(!format_matches("2f1e5b8c", "uuid"));
        assert!(format_matches("10.0.0.1", "ipv4"));
        assert!(!format_matches("10.0.0.300", "ipv4"));
        assert!(format_matches("2026-11-22T10:00:00Z", "date-time"));
    }

    #[test]
    fn an_update_keeps_what_was_stored_before_a_rule_tightened_but_no_new_violation() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 3},
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["id"],
                "items": {"type": "object", "properties": {"id": {"type": "string"}, "x": {"type": "string", "maxLength": 1}}}},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 1}}}}}});
        let old =
            json!({"spec": {"name": "long", "ports": [{"id": "a", "x": "yy"}], "tags": ["zz"]}});
        // Only another field changed: every old violation ratchets.
        let mut new = old.clone();
        new["spec"]["other"] = json!(1);
        for path in ["spec.name", "spec.ports[0].x", "spec.tags[0]"] {
            assert!(ratcheted(path, &new, &old, &schema), "{path}");
        }
        // A changed value, a map-list item found by its key at another index: not, and yes.
        new["spec"]["name"] = json!("longer");
        new["spec"]["ports"] = json!([{"id": "b", "x": "ww"}, {"id": "a", "x": "yy"}]);
        assert!(!ratcheted("spec.name", &new, &old, &schema));
        assert!(ratcheted("spec.ports[1].x", &new, &old, &schema));
        assert!(!ratcheted("spec.ports[0].x", &new, &old, &schema));
        // Items of an atomic list correlate with nothing once the list changed.
        new["spec"]["tags"] = json!(["zz", "q"]);
        assert!(!ratcheted("spec.tags[0]", &new, &old, &schema));
        // The root's kind never ratchets.
        assert!(!ratcheted(
            "kind",
            &json!({"kind": 1, "a": 1}),
            &json!({"kind": 1}),
            &schema
        ));
    }
}
