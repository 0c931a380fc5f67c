//! `PriorityQueue`: a controller reconciles what changed before what it only re-reads.
//!
//! kube-runtime's scheduler runs the objects it is handed in the order they became due. When
//! the manager starts (or takes over as leader), each watch's first list hands a controller
//! every object at once, and the objects' related kinds hand them again; a change a user makes
//! a moment later is due after all of them, so at 1,000 clusters it waits for thousands of
//! reconciles. CAPO's gate of this name switches controller-runtime to a queue that serves
//! such unchanged objects after everything else (`WithLowPriorityWhenUnchanged`).
//!
//! capo-rs does it in front of the scheduler: objects from a first list, and the periodic
//! passes over settled objects, go to a low lane ([`Lanes`]) that lets at most `limit` of them
//! into the scheduler at a time (a permit each, given back when their reconcile ends; a permit
//! held past [`PERMIT_BOUND`] is taken back, so a lost result cannot stop the lane). Changes
//! go straight in, and while a change waits for its reconcile to start the low lane lets
//! nothing in: once kube-runtime's runner is busy, what waits for a free slot is served in no
//! particular order (a hash set), so a low object admitted beside a change would win half the
//! time, and a change could lose to every object of the list in turn. A change then waits for
//! at most the low objects already admitted, not for the list. With the gate off, everything
//! goes straight in, as before.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{Lookup, ObjectRef};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::manager::shared::Origin;

/// How long an admitted object may hold its permit, and a change may wait for its reconcile
/// to start, before the low lane stops waiting for it.
pub const PERMIT_BOUND: Duration = Duration::from_secs(30);

/// One controller's two lanes. Cheap to clone: every trigger stream takes a handle.
pub struct Lanes<K: Lookup> {
    /// `None` when the gate is off: everything is a change.
    low: Option<UnboundedSender<ObjectRef<K>>>,
    admitted: Arc<Admitted<K>>,
}

impl<K: Lookup> Clone for Lanes<K> {
    fn clone(&self) -> Self {
        Lanes {
            low: self.low.clone(),
            admitted: self.admitted.clone(),
        }
    }
}

/// The objects let through the low lane whose reconcile has not ended, with their permits,
/// and the changes sent straight in whose reconcile has not started, by namespace and name
/// (a failed reconcile names its object without its kind).
struct Admitted<K> {
    permits: Arc<Semaphore>,
    held: Mutex<HashMap<Key, (OwnedSemaphorePermit, Instant)>>,
    /// Since when each change has waited.
    news: Mutex<HashMap<Key, Instant>>,
    news_started: Notify,
    kind: std::marker::PhantomData<fn() -> K>,
}

type Key = (Option<String>, String);

fn key_of<K: Lookup>(object: &ObjectRef<K>) -> Key {
    (object.namespace.clone(), object.name.clone())
}

impl<K> Lanes<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Default + Eq + Hash + Send + Sync,
{
    /// The lanes of a controller that runs `limit` reconciles at once, and the low lane's
    /// stream for its `reconcile_on` (empty when `enabled` is false).
    pub fn new(
        enabled: bool,
        limit: usize,
    ) -> (Self, impl Stream<Item = ObjectRef<K>> + Send + 'static) {
        let admitted = Arc::new(Admitted {
            permits: Arc::new(Semaphore::new(limit.max(1))),
            held: Mutex::new(HashMap::new()),
            news: Mutex::new(HashMap::new()),
            news_started: Notify::new(),
            kind: std::marker::PhantomData,
        });
        let (sender, receiver) = unbounded();
        let lanes = Lanes {
            low: enabled.then_some(sender),
            admitted: admitted.clone(),
        };
        (lanes, low_lane(receiver, admitted))
    }

    /// The controller's own objects: the first list's go to the low lane, the rest pass.
    pub fn own(
        &self,
        objects: impl Stream<Item = (Arc<K>, Origin)> + Send + 'static,
    ) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let lanes = self.clone();
        objects.filter_map(move |(object, origin)| {
            let passed = lanes
                .to_low_lane(origin, || vec![ObjectRef::from_obj(object.as_ref())])
                .then_some(object);
            std::future::ready(passed)
        })
    }

    /// The objects `mapper` picks for each related object: a first list's picks go to the
    /// low lane, the rest pass.
    pub fn related<X>(
        &self,
        objects: impl Stream<Item = (Arc<X>, Origin)> + Send + 'static,
        mapper: impl Fn(Arc<X>) -> Vec<ObjectRef<K>> + Send + 'static,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let lanes = self.clone();
        objects.flat_map(move |(object, origin)| {
            let picked = mapper(object);
            let passed = lanes.to_low_lane(origin, || picked.clone());
            futures::stream::iter(if passed { picked } else { Vec::new() })
        })
    }

    /// Objects that are never news (periodic passes): all to the low lane.
    pub fn low(
        &self,
        objects: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let lanes = self.clone();
        objects.filter(move |object| {
            let passed = lanes.to_low_lane(Origin::FirstList, || vec![object.clone()]);
            std::future::ready(passed)
        })
    }

    /// Objects that are always news (the engine's wake-ups): they pass, and the low lane
    /// waits for their reconciles to start.
    pub fn news(
        &self,
        objects: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let lanes = self.clone();
        objects.inspect(move |object| {
            lanes.to_low_lane(Origin::Watch, || vec![object.clone()]);
        })
    }

    /// `reconcile`, telling the lanes when each reconcile starts.
    pub fn starting<C, F, R>(&self, reconcile: R) -> impl FnMut(Arc<K>, C) -> F + use<C, F, R, K>
    where
        R: Fn(Arc<K>, C) -> F,
    {
        let lanes = self.clone();
        move |object, ctx| {
            lanes.started(&key_of(&ObjectRef::from_obj(object.as_ref())));
            reconcile(object, ctx)
        }
    }

    /// A reconcile of the object ended: its permit, if it holds one, is given back.
    pub fn finished(&self, namespace: Option<&str>, name: &str) {
        self.admitted
            .lock()
            .remove(&(namespace.map(str::to_owned), name.to_owned()));
    }

    /// The object will not be reconciled (it is gone from the store): no change of it waits.
    pub fn not_found(&self, namespace: Option<&str>, name: &str) {
        self.started(&(namespace.map(str::to_owned), name.to_owned()));
        self.finished(namespace, name);
    }

    fn started(&self, key: &Key) {
        if self.low.is_some() && self.admitted.news().remove(key).is_some() {
            self.admitted.news_started.notify_waiters();
        }
    }

    /// Sends `objects()` to the low lane when the gate is on and `origin` is not news; true
    /// when they should pass straight on instead (noted as news when the gate is on).
    fn to_low_lane(&self, origin: Origin, objects: impl FnOnce() -> Vec<ObjectRef<K>>) -> bool {
        let Some(low) = self.low.as_ref() else {
            return true;
        };
        if origin != Origin::FirstList {
            let now = Instant::now();
            let mut news = self.admitted.news();
            for object in objects() {
                news.entry(key_of(&object)).or_insert(now);
            }
            return true;
        }
        for object in objects() {
            // Closed only when the low lane's stream is gone with its controller.
            let _ = low.unbounded_send(object);
        }
        false
    }
}

impl<K> Admitted<K> {
    fn holds(&self, key: &Key) -> bool {
        self.lock().contains_key(key)
    }

    fn hold(&self, key: Key, permit: OwnedSemaphorePermit, now: Instant) {
        self.lock().insert(key, (permit, now));
    }

    /// Permits held longer than [`PERMIT_BOUND`] are taken back.
    fn take_back_stale(&self, now: Instant) {
        self.lock()
            .retain(|_, (_, since)| now.duration_since(*since) < PERMIT_BOUND);
    }

    /// A permit, taking back stale ones while none is free.
    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            tokio::select! {
                permit = self.permits.clone().acquire_owned() => return permit.ok(),
                () = tokio::time::sleep(PERMIT_BOUND / 4) => self.take_back_stale(Instant::now()),
            }
        }
    }

    /// A permit once no change waits for its reconcile to start (changes that waited past
    /// [`PERMIT_BOUND`] are no longer waited for: their start may have gone unseen).
    async fn admission(&self) -> Option<OwnedSemaphorePermit> {
        let permit = self.permit().await?;
        loop {
            let started = self.news_started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            let now = Instant::now();
            let waiting = {
                let mut news = self.news();
                news.retain(|_, since| now.duration_since(*since) < PERMIT_BOUND);
                !news.is_empty()
            };
            if !waiting {
                return Some(permit);
            }
            tokio::select! {
                () = started => {}
                () = tokio::time::sleep(PERMIT_BOUND / 4) => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (OwnedSemaphorePermit, Instant)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn news(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Instant>> {
        self.news.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The low lane: objects wait in arrival order (each once) and go on one per free permit.
fn low_lane<K>(
    receiver: UnboundedReceiver<ObjectRef<K>>,
    admitted: Arc<Admitted<K>>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + Send + Sync,
{
    let waiting = Waiting {
        order: VecDeque::new(),
        queued: HashSet::new(),
    };
    futures::stream::unfold(
        (receiver, waiting, admitted, false),
        |(mut receiver, mut waiting, admitted, mut closed)| async move {
            loop {
                if closed && waiting.order.is_empty() {
                    return None;
                }
                tokio::select! {
                    biased;
                    arrived = receiver.next(), if !closed => match arrived {
                        Some(object) if !admitted.holds(&key_of(&object)) => waiting.push(object),
                        Some(_) => {}
                        None => closed = true,
                    },
                    permit = admitted.admission(), if !waiting.order.is_empty() => {
                        let (Some(permit), Some(object)) = (permit, waiting.pop()) else {
                            return None;
                        };
                        admitted.hold(key_of(&object), permit, Instant::now());
                        return Some((object, (receiver, waiting, admitted, closed)));
                    }
                }
            }
        },
    )
}

/// Objects waiting in the low lane, each once, oldest first.
struct Waiting<K: Lookup>
where
    K::DynamicType: Eq + Hash,
{
    order: VecDeque<ObjectRef<K>>,
    queued: HashSet<ObjectRef<K>>,
}

impl<K: Lookup> Waiting<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn push(&mut self, object: ObjectRef<K>) {
        if self.queued.insert(object.clone()) {
            self.order.push_back(object);
        }
    }

    fn pop(&mut self) -> Option<ObjectRef<K>> {
        let object = self.order.pop_front()?;
        self.queued.remove(&object);
        Some(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn named(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("ns")
    }

    fn map(name: &str) -> Arc<ConfigMap> {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = Some("ns".into());
        Arc::new(map)
    }

    /// What the stream has ready now, without waiting.
    fn ready_now(lane: &mut (impl Stream<Item = ObjectRef<ConfigMap>> + Unpin)) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(Some(object)) = lane.next().now_or_never() {
            out.push(object.name);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_list_waits_in_the_low_lane_and_changes_pass_at_once() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 2);
        let mut low = Box::pin(low);
        let seen = [
            (map("a"), Origin::FirstList),
            (map("b"), Origin::FirstList),
            (map("c"), Origin::FirstList),
            (map("d"), Origin::Watch),
            (map("e"), Origin::Relist),
        ];
        let passed: Vec<String> = lanes
            .own(futures::stream::iter(seen))
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect()
            .await;
        assert_eq!(passed, ["d", "e"], "changes go straight on");
        assert!(
            ready_now(&mut low).is_empty(),
            "nothing is admitted while a change waits to start"
        );
        let mut reconcile = lanes.starting(|_: Arc<ConfigMap>, (): ()| ());
        reconcile(map("d"), ());
        assert!(ready_now(&mut low).is_empty(), "e has not started");
        reconcile(map("e"), ());
        tokio::task::yield_now().await;
        assert_eq!(ready_now(&mut low), ["a", "b"], "two permits, two admitted");
        lanes.finished(Some("ns"), "a");
        assert_eq!(
            ready_now(&mut low),
            ["c"],
            "a finished reconcile lets the next in"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_never_starts_holds_the_low_lane_only_until_the_bound() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 1);
        let mut low = Box::pin(low);
        let _: Vec<_> = lanes
            .low(futures::stream::iter([named("a")]))
            .collect()
            .await;
        let _: Vec<_> = lanes
            .news(futures::stream::iter([named("woken")]))
            .collect()
            .await;
        assert!(ready_now(&mut low).is_empty());
        tokio::time::sleep(PERMIT_BOUND / 2).await;
        assert!(ready_now(&mut low).is_empty(), "still within the bound");
        tokio::time::sleep(PERMIT_BOUND).await;
        assert_eq!(
            ready_now(&mut low),
            ["a"],
            "the lost start is no longer waited for"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_to_an_object_gone_from_the_store_does_not_hold_the_low_lane() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 1);
        let mut low = Box::pin(low);
        let _: Vec<_> = lanes
            .own(futures::stream::iter([
                (map("a"), Origin::FirstList),
                (map("gone"), Origin::Watch),
            ]))
            .collect()
            .await;
        assert!(ready_now(&mut low).is_empty());
        lanes.not_found(Some("ns"), "gone");
        tokio::task::yield_now().await;
        assert_eq!(ready_now(&mut low), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_not_given_back_is_taken_back_after_the_bound() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 1);
        let mut low = Box::pin(low);
        let due = futures::stream::iter([named("a"), named("b")]);
        let passed: Vec<_> = lanes.low(due).collect().await;
        assert!(passed.is_empty());
        assert_eq!(ready_now(&mut low), ["a"]);
        tokio::time::sleep(PERMIT_BOUND + PERMIT_BOUND / 4).await;
        assert_eq!(
            ready_now(&mut low),
            ["b"],
            "a's result never came; the lane went on"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_waits_once_and_is_not_queued_again_while_admitted() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 1);
        let mut low = Box::pin(low);
        let twice = futures::stream::iter([named("a"), named("a"), named("b"), named("b")]);
        let _: Vec<_> = lanes.low(twice).collect().await;
        assert_eq!(ready_now(&mut low), ["a"]);
        let _: Vec<_> = lanes
            .low(futures::stream::iter([named("a")]))
            .collect()
            .await;
        assert!(ready_now(&mut low).is_empty(), "one permit, held by a");
        lanes.finished(Some("ns"), "a");
        assert_eq!(
            ready_now(&mut low),
            ["b"],
            "a, admitted when it came again, was not queued"
        );
        lanes.finished(Some("ns"), "b");
        assert!(ready_now(&mut low).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn related_objects_of_a_first_list_wait_and_their_changes_pass() {
        let (lanes, low) = Lanes::<ConfigMap>::new(true, 4);
        let mut low = Box::pin(low);
        let related =
            futures::stream::iter([(map("x"), Origin::FirstList), (map("y"), Origin::Watch)]);
        let owner = |o: Arc<ConfigMap>| {
            vec![named(&format!(
                "of-{}",
                o.metadata.name.clone().unwrap_or_default()
            ))]
        };
        let passed: Vec<String> = lanes
            .related(related, owner)
            .map(|o| o.name)
            .collect()
            .await;
        assert_eq!(passed, ["of-y"]);
        assert!(ready_now(&mut low).is_empty(), "of-y has not started");
        lanes.starting(|_: Arc<ConfigMap>, (): ()| ())(map("of-y"), ());
        tokio::task::yield_now().await;
        assert_eq!(ready_now(&mut low), ["of-x"]);
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_gate_off_everything_passes_and_the_low_lane_stays_empty() {
        let (lanes, low) = Lanes::<ConfigMap>::new(false, 1);
        let mut low = Box::pin(low);
        let passed: Vec<_> = lanes
            .own(futures::stream::iter([
                (map("a"), Origin::FirstList),
                (map("b"), Origin::FirstList),
            ]))
            .collect()
            .await;
        assert_eq!(passed.len(), 2);
        let due: Vec<_> = lanes
            .low(futures::stream::iter([named("c")]))
            .collect()
            .await;
        assert_eq!(due.len(), 1);
        assert!(ready_now(&mut low).is_empty());
    }
}
