//! The validating webhook's rules: CAPO's admission decisions that the CRDs' CEL rules do
//! not cover.
//!
//! - The rules a CRD cannot state ([`capo_api::admission::webhook_rules`]), on either version.
//! - For a v1beta1 request, the v1beta2 CEL rules. The API server checks a request's object
//!   against the schema of the version it was sent in, and v1beta1's schema restates only a
//!   few of them; CAPO's webhooks see every request converted to v1beta2. Registered for
//!   v1beta2 with `matchPolicy: Equivalent`, we are sent the converted objects too, and run
//!   the stored version's rules on them here, so that both versions admit the same edits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::core::cel::{CompiledSchema, Validator as CelValidator, compile_schema};
use serde_json::Value;

use super::admission::Validators;

/// The kinds CAPO validates, by plural, with their stored version's compiled CEL rules.
pub fn capo_validators() -> Validators {
    let mut validators = Validators::default();
    for (plural, rules) in stored_rules() {
        let rules = Arc::new(Mutex::new(rules));
        let name = plural.clone();
        let check = move |request: &Value| check(&name, request, &rules);
        validators = validators.with(&plural, check);
    }
    validators
}

/// A compiled schema and its evaluator (which is `Send`, not `Sync`: hence the mutex), and
/// the schema as written, whose bounds are checked before any rule runs.
struct StoredRules {
    schema: CompiledSchema,
    cel: CelValidator,
    bounds: Value,
}

/// The plurals CAPO has webhooks for, with the stored version's rules of each.
fn stored_rules() -> BTreeMap<String, StoredRules> {
    capo_api::crds::all()
        .into_iter()
        .filter(|crd| capo_api::admission::VALIDATED.contains(&crd.spec.names.plural.as_str()))
        .filter_map(|crd| {
            let stored = crd.spec.versions.iter().find(|v| v.storage)?;
            let schema = stored.schema.as_ref()?.open_api_v3_schema.as_ref()?;
            let schema = serde_json::to_value(schema).ok()?;
            let rules = StoredRules {
                schema: compile_schema(&schema),
                cel: CelValidator::new(),
                bounds: schema,
            };
            Some((crd.spec.names.plural.clone(), rules))
        })
        .collect()
}

fn check(plural: &str, request: &Value, rules: &Mutex<StoredRules>) -> Result<(), String> {
    if sent_as_spoke(request) {
        let old = request.get("oldObject").filter(|old| !old.is_null());
        let rules = rules
            .lock()
            .map_err(|_| "admission rules unavailable".to_owned())?;
        // The API server enforces these before its own rules run; a caller other than the API
        // server skips that, and a rule's cost grows with the lists it walks. The old object
        // is not held to them: a stored object may predate a tightened bound (ratcheting).
        within_bounds(&rules.bounds, &request["object"], "")?;
        rules
            .cel
            .validate_compiled(&rules.schema, &request["object"], old)
            .map_err(|errors| {
                errors
                    .into_vec()
                    .iter()
                    .map(|e| {
                        format!(
                            "{}: Invalid value: {}",
                            e.field_path.trim_start_matches('.'),
                            e.message
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
    }
    capo_api::admission::webhook_rules(plural, request)
}

/// Whether `value` keeps the schema's `maxItems`, `maxLength` and `maxProperties`, in
/// every field the schema describes: the first bound broken, by path, as the API server says it.
fn within_bounds(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let most = |key: &str| schema[key].as_u64().and_then(|n| usize::try_from(n).ok());
    let too_many = |what: &str, limit: usize| {
        Err(format!(
            "{}: Too many: must have at most {limit} {what}",
            path.trim_start_matches('.')
        ))
    };
    match value {
        Value::String(text) => match most("maxLength") {
            Some(limit) if text.chars().count() > limit => too_many("characters", limit),
            _ => Ok(()),
        },
        Value::Array(items) => {
            if let Some(limit) = most("maxItems").filter(|limit| items.len() > *limit) {
                return too_many("items", limit);
            }
            let item = &schema["items"];
            items
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| within_bounds(item, v, &format!("{path}[{i}]")))
        }
        Value::Object(fields) => {
            if let Some(limit) = most("maxProperties").filter(|limit| fields.len() > *limit) {
                return too_many("properties", limit);
            }
            fields.iter().try_for_each(|(name, v)| {
                let field = match &schema["properties"][name] {
                    Value::Null => &schema["additionalProperties"],
                    known => known,
                };
                if field.is_object() {
                    within_bounds(field, v, &format!("{path}.{name}"))
                } else {
                    Ok(())
                }
            })
        }
        _ => Ok(()),
    }
}

/// Whether the client sent the request in v1beta1 (the API server checked its object against
/// v1beta1's schema, not v1beta2's rules).
fn sent_as_spoke(request: &Value) -> bool {
    request["requestKind"]["version"] == capo_api::conversion::SPOKE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounds_are_checked_in_every_field_the_schema_describes() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "subnets": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
                "cidr": {"type": "string", "maxLength": 5}}}},
            "labels": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string", "maxLength": 3}},
        }}}});
        let ok = json!({"spec": {"subnets": [{"cidr": "a"}], "labels": {"k": "abc"}, "other": [1, 2, 3]}});
        assert_eq!(within_bounds(&schema, &ok, ""), Ok(()));
        let cases = [
            (
                json!({"spec": {"subnets": [{}, {}, {}]}}),
                "spec.subnets: Too many: must have at most 2 items",
            ),
            (
                json!({"spec": {"subnets": [{"cidr": "abcdef"}]}}),
                "spec.subnets[0].cidr: Too many: must have at most 5 characters",
            ),
            (
                json!({"spec": {"labels": {"a": "x", "b": "y"}}}),
                "spec.labels: Too many: must have at most 1 properties",
            ),
            (
                json!({"spec": {"labels": {"a": "long"}}}),
                "spec.labels.a: Too many: must have at most 3 characters",
            ),
        ];
        for (object, said) in cases {
            assert_eq!(
                within_bounds(&schema, &object, ""),
                Err(said.to_owned()),
                "{object}"
            );
        }
    }

    /// A list far past its `maxItems`, sent straight to the webhook (no API server to check the
    /// schema first), is refused by its bound before any CEL rule walks it.
    #[test]
    fn a_list_past_its_bound_is_refused_before_any_rule_runs() {
        let validators = capo_validators();
        let subnets: Vec<Value> = (0..20_000)
            .map(|i| json!({"cidr": format!("10.{}.{}.0/24", i / 256, i % 256)}))
            .collect();
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "operation": "UPDATE",
            "requestKind": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta1", "kind": "OpenStackCluster"},
            "object": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
                       "metadata": {"name": "c"}, "spec": {"managedSubnets": subnets.clone()}},
            "oldObject": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
                          "metadata": {"name": "c"}, "spec": {"managedSubnets": subnets}},
        }});
        let started = std::time::Instant::now();
        let answer = super::super::admission::review(
            &validators,
            "openstackclusters",
            review.to_string().as_bytes(),
        );
        let took = started.elapsed();
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("spec.managedSubnets: Too many"),
            "{message}"
        );
        eprintln!("FIGURES a 20,000-item list refused by its bound in {took:?}");
    }
}
