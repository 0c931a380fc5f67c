//! One watch per kind for the whole manager: a reflector store that reconcilers read instead
//! of asking the API server, and a broadcast of every object the watch sees to each
//! controller that kind wakes. Before, each controller watched what it needed on its own
//! (thirteen watches of six kinds) and read the rest with GETs: at 100 clusters, four reads
//! for every write.
//!
//! The store is filled before anything is broadcast, so a woken reconciler reads at least
//! what woke it. That holds for a (re)list too: kube-runtime's store takes a list's objects
//! only once the list is complete (`InitDone`), so they are broadcast then, not as they
//! arrive; broadcast earlier, a reconcile found no object in the store and was dropped, and
//! an object created while the watch was away (an API server restart, a 410) was never
//! reconciled (found on a real kube-apiserver). A subscriber that falls `BUFFER` objects
//! behind re-reads the whole store instead (so nothing is missed but a deletion, which the
//! objects' own requeues cover).
//!
//! Each object broadcast says where it came from ([`Origin`]): the watch's first list, a
//! later relist, or a watch event. The first list's objects are not news, which is what
//! `PriorityQueue` ([`crate::manager::priority`]) needs to reconcile them after changes.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::controllers::packed::StoredMeta;
use crate::manager::watch_backoff::WatchBackoffExt;

/// How far a subscriber may fall behind before it re-reads the store.
const BUFFER: usize = 1024;

/// A kind's one watch: its store, and the objects it sees for whoever subscribes.
pub struct SharedWatch<K>
where
    K: Resource<DynamicType = ()> + 'static,
{
    store: Store<K>,
    sender: broadcast::Sender<(Arc<K>, Origin)>,
}

/// Where a broadcast object came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The watch's first list: every object there is, none of it news.
    FirstList,
    /// A later list (after a 410 or an outage), or a re-read of the store by a subscriber
    /// that fell behind: what changed meanwhile is news, and `changed` passes only that.
    Relist,
    /// An event of the watch: a change.
    Watch,
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// The watch of `api`, each object trimmed by `modify` before it is stored, and the
    /// future that drives it: nothing is stored or seen until that runs. Subscribe first.
    pub fn new(
        api: Api<K>,
        config: watcher::Config,
        modify: impl FnMut(&mut K) + Send + 'static,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store();
        let (sender, _) = broadcast::channel(BUFFER);
        let events = reflector(writer, watcher(api, config).modify(modify)).watch_backoff();
        let driver = drive(events, store.clone(), sender.clone());
        (SharedWatch { store, sender }, driver)
    }

    /// A handle on the watch's store (the same store, not a copy): each object as last seen.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every object the watch sees from now on, applied or deleted, as the store holds it,
    /// with where it came from.
    pub fn subscribe(&self) -> impl Stream<Item = (Arc<K>, Origin)> + Send + 'static + use<K> {
        let store = self.store.clone();
        // Until something other than the first list arrives, a subscriber that falls behind
        // fell behind during the first list (controllers read nothing until every watch has
        // listed, so at scale they always do): its re-read of the store is the first list.
        let state = (self.sender.subscribe(), Origin::FirstList);
        futures::stream::unfold(state, move |(mut receiver, mut behind)| {
            let store = store.clone();
            async move {
                match receiver.recv().await {
                    Ok(seen) => {
                        if seen.1 != Origin::FirstList {
                            behind = Origin::Relist;
                        }
                        Some((vec![seen], (receiver, behind)))
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(
                            kind = %K::kind(&()),
                            missed,
                            "a controller fell behind its watch; it re-reads the store"
                        );
                        // Nothing missed is lost: the store holds the latest of each.
                        let _ = store.wait_until_ready().await;
                        let state = store.state().into_iter().map(|o| (o, behind));
                        Some((state.collect(), (receiver, behind)))
                    }
                    Err(broadcast::error::RecvError::Closed) => None,
                }
            }
        })
        .flat_map(futures::stream::iter)
    }
}

/// Broadcasts what the watch sees once the store holds it: each applied or deleted object as
/// it comes, and a (re)list's objects when the list is complete and the store swapped in.
async fn drive<K, S>(events: S, store: Store<K>, sender: broadcast::Sender<(Arc<K>, Origin)>)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let kind = K::kind(&());
    futures::pin_mut!(events);
    let mut listed = Origin::FirstList;
    while let Some(event) = events.next().await {
        // No subscriber (yet) is fine: sends that fail are dropped.
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                // The stored copy, not a second one; a deleted object is no longer stored.
                let shared = store
                    .get(&ObjectRef::from_obj(&object))
                    .unwrap_or_else(|| Arc::new(object));
                let _ = sender.send((shared, Origin::Watch));
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => {
                for object in store.state() {
                    let _ = sender.send((object, listed));
                }
                listed = Origin::Relist;
            }
            Err(error) => tracing::warn!(%kind, %error, "watch trouble; retrying"),
        }
    }
}

/// Only the objects whose `value` differs from when this stream last passed them, and the
/// deleted ones. `None` from `value` always passes.
pub fn changed<K>(
    objects: impl Stream<Item = (Arc<K>, Origin)> + Send + 'static,
    store: Store<K>,
    value: impl Fn(&K) -> Option<u64> + Send + 'static,
) -> impl Stream<Item = (Arc<K>, Origin)> + Send + 'static
where
    K: Resource<DynamicType = ()> + StoredMeta + Clone + Send + Sync + 'static,
{
    let mut seen: HashMap<u64, u64> = HashMap::new();
    objects.filter(move |(object, _)| {
        let identity = object.stored_identity();
        let stored = store.get(&ObjectRef::from_obj(object.as_ref())).is_some();
        let pass = if !stored {
            // Gone: wake, and forget it.
            seen.remove(&identity);
            if seen.len() * 4 < seen.capacity() {
                // After a mass deletion, give the room back.
                seen.shrink_to_fit();
            }
            true
        } else {
            match value(object) {
                Some(current) => seen.insert(identity, current) != Some(current),
                None => true,
            }
        };
        std::future::ready(pass)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::runtime::watcher::Event;

    fn config_map(name: &str, data: &str) -> ConfigMap {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = Some("ns".into());
        map.metadata.uid = Some(format!("uid-{name}"));
        map.data = Some([("k".to_owned(), data.to_owned())].into());
        map
    }

    impl StoredMeta for ConfigMap {}

    fn data_hash(map: &ConfigMap) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        map.data.hash(&mut hasher);
        Some(hasher.finish())
    }

    /// A relist (after a restart of the API server or a 410) wakes its objects only once the
    /// store holds them: a reconcile woken earlier found nothing and dropped the object.
    #[tokio::test]
    async fn a_relisted_object_is_broadcast_once_the_store_holds_it() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (sender, mut receiver) = broadcast::channel(BUFFER);
        let probe = sender.clone();
        let new = config_map("created-while-away", "1");
        let mut sent_before_the_list_was_stored = None;
        let relist = [Event::Init, Event::InitApply(new.clone()), Event::InitDone];
        // As `reflector` does: the store's writer sees each event before it is passed on.
        let events = futures::stream::iter(relist).map(|event| {
            if matches!(event, Event::InitDone) {
                sent_before_the_list_was_stored = Some(probe.len());
            }
            writer.apply_watcher_event(&event);
            Ok(event)
        });
        drive(events, store.clone(), sender).await;
        assert_eq!(
            sent_before_the_list_was_stored,
            Some(0),
            "nothing woken early"
        );
        let (woken, _) = receiver
            .recv()
            .await
            .expect("the relisted object is broadcast");
        assert_eq!(woken.name_any(), "created-while-away");
        assert!(store.get(&ObjectRef::from_obj(woken.as_ref())).is_some());
    }

    /// The first list is not news; a relist and a watch event are.
    #[tokio::test]
    async fn each_object_says_whether_it_came_from_the_first_list_a_relist_or_a_change() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (sender, mut receiver) = broadcast::channel(BUFFER);
        let listed = |name: &str| {
            [
                Event::Init,
                Event::InitApply(config_map(name, "1")),
                Event::InitDone,
            ]
        };
        let script = listed("a")
            .into_iter()
            .chain([Event::Apply(config_map("b", "1"))])
            .chain(listed("a"));
        let events = futures::stream::iter(script).map(|event| {
            writer.apply_watcher_event(&event);
            Ok(event)
        });
        drive(events, store, sender).await;
        let mut origins = Vec::new();
        while let Ok((object, origin)) = receiver.try_recv() {
            origins.push((object.name_any(), origin));
        }
        let expected = [
            ("a", Origin::FirstList),
            ("b", Origin::Watch),
            ("a", Origin::Relist),
        ];
        assert_eq!(origins, expected.map(|(n, o)| (n.to_owned(), o)));
    }

    #[tokio::test]
    async fn a_subscriber_sees_changes_once_and_deletions_always() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let a = config_map("a", "1");
        writer.apply_watcher_event(&Event::Apply(a.clone()));
        let a_again = Arc::new(a.clone());
        let a_changed = Arc::new(config_map("a", "2"));
        let objects = futures::stream::iter(
            [Arc::new(a.clone()), a_again, a_changed.clone()].map(|o| (o, Origin::Watch)),
        );
        // The store holds the object while it lives.
        writer.apply_watcher_event(&Event::Apply(config_map("a", "2")));
        let passed: Vec<_> = changed(objects, store.clone(), data_hash).collect().await;
        assert_eq!(passed.len(), 2, "the same content twice passes once");
        writer.apply_watcher_event(&Event::Delete(config_map("a", "2")));
        let deleted = futures::stream::iter(vec![(a_changed, Origin::Watch)]);
        let passed: Vec<_> = changed(deleted, store, data_hash).collect().await;
        assert_eq!(passed.len(), 1, "a deletion always passes");
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_reads_the_store_instead() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (sender, _) = broadcast::channel(BUFFER);
        let shared = SharedWatch {
            store: store.clone(),
            sender: sender.clone(),
        };
        let subscriber = shared.subscribe();
        writer.apply_watcher_event(&Event::Init);
        for i in 0..(BUFFER + 10) {
            let map = config_map(&format!("m{i}"), "x");
            writer.apply_watcher_event(&Event::InitApply(map.clone()));
            let _ = sender.send((Arc::new(map), Origin::FirstList));
        }
        writer.apply_watcher_event(&Event::InitDone);
        drop(sender);
        drop(shared);
        let seen: Vec<_> = subscriber.collect().await;
        let names: std::collections::BTreeSet<String> =
            seen.iter().map(|(m, _)| m.name_any()).collect();
        assert_eq!(names.len(), BUFFER + 10, "every object, from the store");
        assert!(
            seen.iter().all(|(_, origin)| *origin == Origin::FirstList),
            "behind during the first list, the re-read is the first list"
        );
    }

    #[tokio::test]
    async fn a_subscriber_behind_after_a_change_reads_the_store_as_a_relist() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (sender, _) = broadcast::channel(BUFFER);
        let shared = SharedWatch {
            store: store.clone(),
            sender: sender.clone(),
        };
        let mut subscriber = Box::pin(shared.subscribe());
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let _ = sender.send((Arc::new(config_map("first", "x")), Origin::Watch));
        assert_eq!(subscriber.next().await.map(|(_, o)| o), Some(Origin::Watch));
        for i in 0..(BUFFER + 10) {
            let map = config_map(&format!("m{i}"), "x");
            writer.apply_watcher_event(&Event::Apply(map.clone()));
            let _ = sender.send((Arc::new(map), Origin::Watch));
        }
        drop(sender);
        drop(shared);
        let (_, origin) = subscriber.next().await.expect("the store, re-read");
        assert_eq!(origin, Origin::Relist);
    }
}
