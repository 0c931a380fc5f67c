//! The sweep that hands settled objects back to their controller when their next complete
//! pass is due (`controllers::settled`): every `ControllerConfig::settled_sweep`, the controller's store is read
//! and the objects its [`SettledBook`](crate::controllers::settled::SettledBook) says are due
//! are triggered, as `reconcile_on` triggers. It ends with the controller that polls it.

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
    futures::stream::unfold(ticks, |mut ticks| async move {
        ticks.tick().await;
        Some(((), ticks))
    })
    .flat_map(move |()| futures::stream::iter(due_now(&ctx, controller, &store)))
}

fn due_now<K>(ctx: &Context, controller: &'static str, store: &Store<K>) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let objects = store.state();
    let live: Vec<u64> = objects
        .iter()
        .map(|object| key_digest(&object_key(controller, object.as_ref())))
        .collect();
    ctx.take_due(controller, &live)
        .into_iter()
        .filter_map(|position| objects.get(position))
        .map(|object| ObjectRef::from_obj(object.as_ref()))
        .collect()
}
