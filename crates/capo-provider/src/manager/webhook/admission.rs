//! Validating webhooks, for the admission rules a CRD's CEL rules cannot express (a rule
//! that needs another object, or more than the cost budget allows). Each resource
//! (`/validate/<plural>`) has at most one [`Validator`]; an `AdmissionReview` for a
//! resource without one is allowed, and says so in a warning.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// Decides one admission request: `Err` refuses it with that message.
pub trait Validator: Send + Sync {
    /// `request` is the AdmissionReview's `request` (operation, object, oldObject...).
    fn validate(&self, request: &Value) -> Result<(), String>;
}

impl<F> Validator for F
where
    F: Fn(&Value) -> Result<(), String> + Send + Sync,
{
    fn validate(&self, request: &Value) -> Result<(), String> {
        self(request)
    }
}

/// The validators, by resource (plural).
#[derive(Clone, Default)]
pub struct Validators {
    by_resource: BTreeMap<String, Arc<dyn Validator>>,
}

impl Validators {
    /// Validates `resource` (a plural, e.g. `openstackclusters`) with `validator`.
    pub fn with(mut self, resource: &str, validator: impl Validator + 'static) -> Self {
        self.by_resource
            .insert(resource.to_owned(), Arc::new(validator));
        self
    }

    /// The resources validated.
    pub fn resources(&self) -> impl Iterator<Item = &str> {
        self.by_resource.keys().map(String::as_str)
    }
}

/// Answers an `AdmissionReview` (admission.k8s.io/v1) body for `resource`.
pub fn review(validators: &Validators, resource: &str, body: &[u8]) -> Value {
    let review: Value = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            return answer(
                &Value::Null,
                Err(format!("the request is not JSON: {error}")),
            );
        }
    };
    let request = &review["request"];
    let uid = &request["uid"];
    if review["kind"] != "AdmissionReview" || !uid.is_string() {
        return answer(
            uid,
            Err("expected an admission.k8s.io/v1 AdmissionReview with request.uid".into()),
        );
    }
    match validators.by_resource.get(resource) {
        Some(validator) => answer(uid, validator.validate(request)),
        None => {
            let mut allowed = answer(uid, Ok(()));
            allowed["response"]["warnings"] =
                json!([format!("capo-rs has no admission rule for {resource}")]);
            allowed
        }
    }
}

/// A refusal that names no request (the request could not be looked at): `message` says why.
pub fn refused(message: &str) -> Value {
    answer(&Value::Null, Err(message.to_owned()))
}

fn answer(uid: &Value, verdict: Result<(), String>) -> Value {
    let response = match verdict {
        Ok(()) => json!({"uid": uid, "allowed": true}),
        Err(message) => json!({"uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": message}}),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(object: Value) -> Vec<u8> {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u-7", "operation": "CREATE", "object": object}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_validator_allows_or_refuses_with_its_message() {
        let validators = Validators::default().with("openstackclusters", |request: &Value| {
            match request["object"]["spec"]["ok"].as_bool() {
                Some(true) => Ok(()),
                _ => Err("spec.ok must be true".to_owned()),
            }
        });
        let allowed = review(
            &validators,
            "openstackclusters",
            &body(json!({"spec": {"ok": true}})),
        );
        assert_eq!(allowed["response"], json!({"uid": "u-7", "allowed": true}));
        let refused = review(&validators, "openstackclusters", &body(json!({"spec": {}})));
        assert_eq!(refused["response"]["allowed"], false);
        assert_eq!(refused["response"]["uid"], "u-7");
        assert_eq!(
            refused["response"]["status"]["message"],
            "spec.ok must be true"
        );
    }

    #[test]
    fn an_unknown_resource_is_allowed_with_a_warning_and_garbage_is_refused() {
        let validators = Validators::default();
        let allowed = review(&validators, "openstackmachines", &body(json!({})));
        assert_eq!(allowed["response"]["allowed"], true);
        assert!(
            allowed["response"]["warnings"][0]
                .as_str()
                .unwrap()
                .contains("openstackmachines")
        );
        let garbage = review(&validators, "openstackmachines", b"{not json");
        assert_eq!(garbage["response"]["allowed"], false);
    }
}
