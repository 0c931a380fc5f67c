//! The sweep that hands settled objects back to their controller when their next complete
//! pass is due (`controllers::settled`): every `ControllerConfig::settled_sweep`, the controller's store is read
//! and the objects its [`SettledBook`](crate::controllers::settled::SettledBook) says are due
//! are triggered, as `reconcile_on` triggers. It ends with the controller that polls it.
//! Every [`PRUNE_EVERY`] sweeps, it also prunes the context's per-object state of objects no
//! longer in the store.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::time::MissedTickBehavior;

use crate::controllers::settled::key_digest;
use crate::controllers::{Context, object_key};

/// `controller`'s settled objects in `store`, each as its next complete pass comes due.
pub fn due_passes<K>(
    ctx: Arc<Context>,
    controller: &'static str,
    store: Store<K>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let mut ticks = tokio::time::interval(ctx.config.settled_sweep);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    futures::stream::unfold((ticks, 0_u32), |(mut ticks, swept)| async move {
        ticks.tick().await;
        Some((swept, (ticks, swept.wrapping_add(1))))
    })
    .flat_map(move |swept| {
        let prune = swept % PRUNE_EVERY == PRUNE_EVERY - 1;
        futures::stream::iter(due_now(&ctx, controller, &store, prune))
    })
}

/// Sweeps between two prunings of the per-object state (5 minutes at the default 10 s).
pub const PRUNE_EVERY: u32 = 30;

fn due_now<K>(
    ctx: &Context,
    controller: &'static str,
    store: &Store<K>,
    prune: bool,
) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let objects = store.state();
    let key = |object: &std::sync::Arc<K>| object_key(controller, object.as_ref());
    let live: Vec<u64> = objects.iter().map(|o| key_digest(&key(o))).collect();
    // An empty store may be one not listed yet (the API server unreachable): nothing to
    // learn from it, and forgetting everything would cost every backoff.
    if prune && !objects.is_empty() {
        ctx.prune(controller, &objects.iter().map(key).collect());
    }
    ctx.take_due(controller, &live)
        .into_iter()
        .filter_map(|position| objects.get(position))
        .map(|object| ObjectRef::from_obj(object.as_ref()))
        .collect()
}
