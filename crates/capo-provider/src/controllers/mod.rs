//! The reconcilers and what they share: the [`Context`], how errors are categorised
//! ([`error`]), how an object that keeps failing backs off ([`backoff`]), OpenStack clients per
//! credentials ([`credentials`], [`identity`]), the Kubernetes writes ([`writes`]), and the
//! reconcile metrics CAPI dashboards know ([`metrics`]).
//!
//! Every reconciler has the same shape: observe (Kubernetes, then OpenStack) -> plan (pure) ->
//! apply (OpenStack changes, never waiting) -> status (one patch). [`server`] is the first.

pub mod backoff;
pub mod caches;
pub mod cluster;
pub mod context;
pub mod credentials;
pub mod dictionary;
pub mod error;
pub mod events;
pub mod floating_ip_pool;
pub mod gate;
pub mod identity;
pub mod machine;
pub mod machine_template;
pub mod metrics;
pub mod outcome;
pub mod packed;
pub mod server;
pub mod settled;
pub mod steps;
pub mod writes;

use std::collections::BTreeMap;
use std::sync::Arc;

use capo_api::capi::{self, Cluster};
use capo_api::conditions::{self, Desired, Status, reasons, types};
use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::{DeserializeGuard, NamespaceResourceScope, error_boundary::InvalidObject};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::Instrument;

pub use backoff::{Backoff, BackoffPolicy};
pub use caches::Caches;
pub use context::{Context, ControllerConfig};
pub use credentials::{ClientCache, CredentialsError, CredentialsKey};
pub use error::{Categorized, ErrorCategory, FromPanic};
pub use metrics::ReconcileMetrics;
pub use outcome::Outcome;

/// The Cluster an object belongs to, by its `cluster.x-k8s.io/cluster-name` label: `None`
/// without the label, or when no such Cluster exists (a server outside any cluster).
pub fn owning_cluster(
    ctx: &Context,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<Cluster> {
    let name = capi::cluster_name(labels)?;
    ctx.caches.cluster(namespace, name)
}

/// Whether the Cluster an object's `cluster.x-k8s.io/cluster-name` label names is missing
/// from the cache (yet): the object then waits for it, doing and writing nothing. The Cluster
/// says whether the object is paused, and a watch can bring an object before its Cluster: a
/// shard that a paused cluster is moved to sees the cluster's objects in the order their
/// watches deliver them, and must not take an object whose Cluster it has not seen as
/// unpaused. The Cluster's arrival wakes the objects labelled for it. A deleting object does
/// not wait: its Cluster may be gone for good.
pub fn waits_for_its_cluster(ctx: &Context, namespace: &str, meta: &kube::api::ObjectMeta) -> bool {
    if meta.deletion_timestamp.is_some() {
        return false;
    }
    let Some(cluster) = meta.labels.as_ref().and_then(capi::cluster_name) else {
        return false;
    };
    let unseen = ctx.caches.cluster(namespace, cluster).is_none();
    if unseen {
        tracing::debug!(%cluster, "its Cluster is not in the cache yet: waiting for it");
    }
    unseen
}

/// Sets `Ready` from the conditions it summarises.
pub fn set_ready(
    conditions: &mut Vec<Condition>,
    from: &[&str],
    generation: Option<i64>,
    now: Timestamp,
) {
    let summary = conditions::summarize_ready(conditions, from);
    let (status, reason, message) = (summary.status, summary.reason.to_owned(), summary.message);
    let ready = Desired::new(types::READY, status, &reason, message);
    conditions::set(conditions, &ready, generation, now);
}

/// An object that does not decode: say so on it (`Ready` False) and in a Warning event, and
/// go on with the others. The caller returns [`Outcome::Unreadable`].
pub async fn report_invalid<K>(
    object: &impl Resource<DynamicType = ()>,
    invalid: &InvalidObject,
    ctx: &Context,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    DeserializeGuard<K>: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let message = format!("cannot read this {}: {}", K::kind(&()), invalid.error);
    tracing::warn!(%message, "skipping an object that does not decode");
    let regarding = object.object_ref(&());
    ctx.event(
        &regarding,
        EventType::Warning,
        reasons::INVALID_SPEC,
        "Reconcile",
        message.clone(),
    )
    .await;
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    // Through the guard: the answer is the same object, which does not decode either.
    let api: Api<DeserializeGuard<K>> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut conditions = Vec::new();
    let ready = Desired::new(types::READY, Status::False, reasons::INVALID_SPEC, message);
    conditions::set(
        &mut conditions,
        &ready,
        object.meta().generation,
        Timestamp::now(),
    );
    let status = serde_json::json!({ "conditions": conditions });
    let name = object.meta().name.clone().unwrap_or_default();
    writes::patch_status(&api, &name, None, &status, &[]).await?;
    Ok(())
}

/// `controller/namespace/name`: an object's key in the context's per-object state.
pub fn object_key<K: ResourceExt>(controller: &str, object: &K) -> String {
    format!(
        "{controller}/{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// One reconcile of a watched object, as kube-runtime's `Controller` calls it; every
/// controller's entry. A span named for the object, the reconcile metrics, then `reconcile`
/// with the object's key in the context's per-object state; an object that does not decode is
/// reported instead (a Warning event and a condition; `write_failed` wraps a failed write).
/// The outcome sets the object's backoff and what kube-runtime does next ([`conclude`]);
/// after an error, [`back_off`] does.
pub async fn reconcile_watched<K, S, E>(
    controller: &'static str,
    object: Arc<S>,
    ctx: Arc<Context>,
    reconcile: impl AsyncFnOnce(&K, &Context, &str) -> Result<Outcome, E>,
    write_failed: impl FnOnce(kube::Error) -> E,
) -> Result<Action, E>
where
    E: Categorized + FromPanic,
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone,
    S: packed::Stored<K> + Resource<DynamicType = ()>,
    DeserializeGuard<K>: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let span = tracing::info_span!(
        "reconcile",
        controller,
        namespace = %object.namespace().unwrap_or_default(),
        name = %object.name_any(),
        generation = object.meta().generation.unwrap_or_default(),
    );
    let key = object_key(controller, object.as_ref());
    let reconciling = ctx.metrics.reconciling(controller, &key);
    let result = async {
        match object.decoded() {
            Ok(inner) => {
                let attempt = std::panic::AssertUnwindSafe(reconcile(&inner, &ctx, &key));
                match attempt.catch_unwind().await {
                    Ok(result) => result,
                    Err(payload) => Err(report_panic(object.as_ref(), payload, &ctx).await),
                }
            }
            Err(invalid) => report_invalid::<K>(object.as_ref(), &invalid, &ctx)
                .await
                .map(|()| Outcome::Unreadable)
                .map_err(write_failed),
        }
    }
    .instrument(span)
    .await;
    conclude(&ctx, reconciling, controller, &key, result)
}

/// A reconcile that panicked (a bug of ours) is an error of this object alone: logged, said
/// in a Warning event on the object, and retried with backoff by the error policy. Left to
/// unwind, it would end the controller's stream, and with it every other object's reconciles.
/// The per-object state it held is behind mutexes that ignore poisoning.
async fn report_panic<E: FromPanic>(
    object: &impl Resource<DynamicType = ()>,
    payload: Box<dyn std::any::Any + Send>,
    ctx: &Context,
) -> E {
    let message = error::panic_message(payload.as_ref());
    tracing::error!(panic = %message, "the reconcile panicked; retrying with backoff");
    let note = format!("the reconcile panicked (a bug in capo-rs; please report it): {message}");
    let regarding = object.object_ref(&());
    ctx.event(
        &regarding,
        EventType::Warning,
        reasons::INTERNAL_ERROR,
        "Reconcile",
        note,
    )
    .await;
    E::from_panic(message)
}

/// Finishes a reconcile of `key`: records its metrics, resets the object's backoff on success
/// (or forgets it once the object is deleted), and turns the outcome into kube-runtime's next
/// [`Action`] ([`Context::next_action`]); an error is passed on for the error policy.
pub fn conclude<E: Categorized>(
    ctx: &Context,
    reconciling: metrics::Reconciling,
    controller: &'static str,
    key: &str,
    result: Result<Outcome, E>,
) -> Result<kube::runtime::controller::Action, E> {
    match &result {
        Ok(outcome) => {
            reconciling.finish(outcome.result());
            match outcome {
                Outcome::Deleted => ctx.forget(key),
                _ => ctx.succeeded(key),
            }
        }
        Err(error) => reconciling.finish(metrics::ReconcileResult::Error(error.category())),
    }
    result
        .map(|outcome| ctx.next_action(controller, key, outcome))
        .inspect_err(|_| ctx.unsettle(controller, key))
}

/// Every controller's error policy: the object backs off by its error's category (the
/// per-object backoff, or the cloud's Retry-After), or waits for a change.
pub fn back_off<S: ResourceExt>(
    controller: &str,
    object: &S,
    error: &impl Categorized,
    ctx: &Context,
) -> Action {
    ctx.after_error(&object_key(controller, object), error.category())
}
