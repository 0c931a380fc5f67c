//! Before any controller starts: every CRD the controllers watch must exist and be
//! Established, or the manager says which is missing and how to install it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// How a user installs our CRDs.
const HOW_TO_INSTALL: &str = "install them with `kubectl apply --server-side -f crds/` (or `capo-rs crds | kubectl apply --server-side -f -`)";

/// Why the CRDs the controllers watch cannot be used yet, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum CrdCheckError {
    /// These CRDs (`<plural>.<group>`) do not exist: someone must install them.
    #[error("CustomResourceDefinitions not installed: {}; {HOW_TO_INSTALL}", .0.join(", "))]
    Missing(Vec<String>),
    /// These CRDs exist but are not yet Established: the API server has not yet accepted
    /// their names.
    #[error("CustomResourceDefinitions not yet Established: {}; the API server has not accepted their names yet", .0.join(", "))]
    NotEstablished(Vec<String>),
    /// Reading the CRDs from the API server failed.
    #[error("reading CustomResourceDefinitions: {0}")]
    Kubernetes(#[from] kube::Error),
}

impl CrdCheckError {
    /// Whether waiting may cure it (the API server, or a CRD still being established).
    pub fn is_transient(&self) -> bool {
        !matches!(self, CrdCheckError::Missing(_))
    }
}

/// Checks that each CRD named (`<plural>.<group>`) exists and is Established.
pub async fn check_crds(client: &kube::Client, names: &[String]) -> Result<(), CrdCheckError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    let mut pending = Vec::new();
    for name in names {
        match api.get_opt(name).await? {
            None => missing.push(name.clone()),
            Some(crd) if !is_established(&crd) => pending.push(name.clone()),
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        return Err(CrdCheckError::Missing(missing));
    }
    if !pending.is_empty() {
        return Err(CrdCheckError::NotEstablished(pending));
    }
    Ok(())
}

fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd_with(established: Option<&str>) -> CustomResourceDefinition {
        let conditions = established
            .map(|status| {
                serde_json::json!([{"type": "Established", "status": status,
                    "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R", "message": ""}])
            })
            .unwrap_or(serde_json::json!([]));
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"}, "versions": []},
            "status": {"conditions": conditions}
        }))
        .unwrap_or_default()
    }

    #[test]
    fn only_an_established_true_condition_counts() {
        assert!(is_established(&crd_with(Some("True"))));
        assert!(!is_established(&crd_with(Some("False"))));
        assert!(!is_established(&crd_with(None)));
        assert!(CrdCheckError::NotEstablished(vec![]).is_transient());
        assert!(!CrdCheckError::Missing(vec![]).is_transient());
    }
}
