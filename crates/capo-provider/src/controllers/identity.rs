//! From an object's `identityRef` to an OpenStack client: the Secret in the object's own
//! namespace, or, through an OpenStackClusterIdentity, a Secret elsewhere that the object's
//! namespace is allowed to use. Errors name objects and keys, never a Secret's contents.

use std::collections::BTreeMap;

use capo_api::OpenStackClusterIdentity;
use capo_api::common::{IdentityRef, IdentityRefType};
use capo_api::identity::LabelSelector;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::Context;
use super::credentials::{CredentialsError, CredentialsKey};
use super::error::{Categorized, ErrorCategory};
use crate::cloud::CloudClient;

/// Why an object's `identityRef` gave no OpenStack client.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading the Secret, the OpenStackClusterIdentity or the Namespace from the API
    /// server failed.
    #[error("reading {what}: {source}")]
    Kubernetes {
        /// What was being read, by kind and name (`Secret ns/name`).
        what: String,
        /// The API server's error.
        #[source]
        source: kube::Error,
    },
    /// The OpenStackClusterIdentity (named here) the `identityRef` refers to does not exist.
    #[error("OpenStackClusterIdentity {0} not found")]
    IdentityMissing(String),
    /// The OpenStackClusterIdentity's `namespaceSelector` does not select the object's
    /// namespace.
    #[error("OpenStackClusterIdentity {identity} does not allow namespace {namespace}")]
    NamespaceNotAllowed {
        /// The OpenStackClusterIdentity's name.
        identity: String,
        /// The namespace of the object that asked for it.
        namespace: String,
    },
    /// The credentials Secret is missing, or no client could be made from it.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

impl Categorized for IdentityError {
    fn category(&self) -> ErrorCategory {
        match self {
            IdentityError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            IdentityError::Credentials(error) => error.category(),
            IdentityError::IdentityMissing(_) | IdentityError::NamespaceNotAllowed { .. } => {
                ErrorCategory::Credentials
            }
        }
    }
}

fn reading(what: String) -> impl FnOnce(kube::Error) -> IdentityError {
    move |source| IdentityError::Kubernetes { what, source }
}

/// The client for `identity`, as used by an object in `namespace`.
pub async fn cloud_client(
    ctx: &Context,
    namespace: &str,
    identity: &IdentityRef,
) -> Result<CloudClient, IdentityError> {
    let (secret_namespace, secret_name) = match identity.kind() {
        IdentityRefType::Secret => (namespace.to_owned(), identity.name.clone()),
        IdentityRefType::ClusterIdentity => {
            cluster_identity_secret(ctx, namespace, &identity.name).await?
        }
    };
    let secret_label = format!("{secret_namespace}/{secret_name}");
    let key_at = |(uid, resource_version): (String, String)| CredentialsKey {
        secret: secret_label.clone(),
        uid,
        resource_version,
        cloud_name: identity.cloud_name.clone(),
        region: identity.region.clone(),
    };
    // The Secret watch covers the object's own namespace: a Secret read there before, and
    // not changed since, is known without a GET. (A ClusterIdentity's may be elsewhere.)
    let watched = identity.kind() == IdentityRefType::Secret;
    if let Some(client) = ctx
        .clouds
        .known_version(&secret_label)
        .filter(|_| watched)
        .and_then(|version| ctx.clouds.existing(&key_at(version)))
    {
        return Ok(client);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &secret_namespace);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(reading(format!("Secret {secret_label}")))?
        .ok_or_else(|| CredentialsError::SecretMissing {
            secret: secret_label.clone(),
        })?;
    let version = (
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default(),
    );
    let key = key_at(version.clone());
    let regarding = secret.object_ref(&());
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let client = ctx.clouds.client(&key, &data).await?;
    if watched {
        ctx.clouds.read_version(&secret_label, version.0, version.1);
    }
    if ctx.clouds.take_insecure(&secret_label) {
        let note = format!(
            "cloud {:?} of this Secret has verify: false in clouds.yaml: capo-rs does not check \
             the cloud's TLS certificate, so anyone on the path can read the credentials",
            identity.cloud_name
        );
        ctx.event(
            &regarding,
            EventType::Warning,
            INSECURE_SKIP_VERIFY,
            "Connect",
            note,
        )
        .await;
    }
    Ok(client)
}

/// The reason of the Warning event on a credentials Secret whose clouds.yaml turns TLS
/// verification off.
pub const INSECURE_SKIP_VERIFY: &str = "InsecureSkipVerify";

/// The client for cleaning up: as [`cloud_client`], but once the Secret is gone (deleted
/// before the objects that use it, as a namespace deletion does), the client this process
/// already made from it, so what was created can still be deleted.
pub async fn cleanup_client(
    ctx: &Context,
    namespace: &str,
    identity: &IdentityRef,
) -> Result<CloudClient, IdentityError> {
    match cloud_client(ctx, namespace, identity).await {
        Err(IdentityError::Credentials(CredentialsError::SecretMissing { secret })) => {
            let cached =
                ctx.clouds
                    .cached(&secret, &identity.cloud_name, identity.region.as_deref());
            match cached {
                Some(client) => {
                    tracing::warn!(
                        secret,
                        "credentials Secret gone; cleaning up with the client made from it"
                    );
                    Ok(client)
                }
                None => Err(CredentialsError::SecretMissing { secret }.into()),
            }
        }
        other => other,
    }
}

/// The Secret an OpenStackClusterIdentity names, if `namespace` may use it.
async fn cluster_identity_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<(String, String), IdentityError> {
    let identities: Api<OpenStackClusterIdentity> = Api::all(ctx.client.clone());
    let identity = identities
        .get_opt(name)
        .await
        .map_err(reading(format!("OpenStackClusterIdentity {name}")))?
        .ok_or_else(|| IdentityError::IdentityMissing(name.to_owned()))?;
    if let Some(selector) = &identity.spec.namespace_selector {
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        let labels = namespaces
            .get_opt(namespace)
            .await
            .map_err(reading(format!("Namespace {namespace}")))?
            .map(|ns| ns.meta().labels.clone().unwrap_or_default())
            .unwrap_or_default();
        if !selector_matches(selector, &labels) {
            return Err(IdentityError::NamespaceNotAllowed {
                identity: name.to_owned(),
                namespace: namespace.to_owned(),
            });
        }
    }
    let secret = &identity.spec.secret_ref;
    Ok((secret.namespace.clone(), secret.name.clone()))
}

/// Whether `labels` satisfy a Kubernetes label selector. An unknown operator matches
/// nothing, as the API server would refuse it.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value));
    let by_expressions = selector.match_expressions.iter().all(|requirement| {
        let value = labels.get(&requirement.key);
        match requirement.operator.as_str() {
            "In" => value.is_some_and(|v| requirement.values.contains(v)),
            "NotIn" => value.is_none_or(|v| !requirement.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::identity::LabelSelectorRequirement;

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn label_selectors_match_as_kubernetes_does() {
        let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let empty = LabelSelector::default();
        assert!(
            selector_matches(&empty, &labels),
            "empty selects everything"
        );
        let mut selector = LabelSelector {
            match_labels: BTreeMap::from([("team".to_owned(), "a".to_owned())]),
            ..LabelSelector::default()
        };
        assert!(selector_matches(&selector, &labels));
        selector.match_expressions = vec![requirement("env", "DoesNotExist", &[])];
        assert!(selector_matches(&selector, &labels));
        selector.match_expressions = vec![requirement("team", "NotIn", &["a", "b"])];
        assert!(!selector_matches(&selector, &labels));
        selector.match_expressions = vec![requirement("team", "In", &["b"])];
        assert!(!selector_matches(&selector, &labels));
        selector.match_expressions = vec![requirement("team", "Bogus", &[])];
        assert!(!selector_matches(&selector, &labels));
    }
}
