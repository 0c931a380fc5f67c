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

/// A compiled schema and its evaluator (which is `Send`, not `Sync`: hence the mutex).
struct StoredRules {
    schema: CompiledSchema,
    cel: CelValidator,
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

/// Whether the client sent the request in v1beta1 (the API server checked its object against
/// v1beta1's schema, not v1beta2's rules).
fn sent_as_spoke(request: &Value) -> bool {
    request["requestKind"]["version"] == capo_api::conversion::SPOKE
}
