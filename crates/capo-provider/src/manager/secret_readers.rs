//! Which stored objects name a Secret, for the Secret watches' mappings.
//!
//! Each object's Secret names are read once per version of the object (its resourceVersion)
//! and kept as digests, so a Secret's event checks the objects of its namespace against them
//! instead of inflating and decoding each one. Decoding every OpenStackServer of a namespace on
//! every Secret event made bringing up 3,000 clusters in one namespace quadratic: each machine
//! brings a bootstrap Secret, and the controller spent its core in `Packed::unpack`.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::controllers::packed::StoredMeta;

/// What was read of one object: its version then, and the digests of the Secrets it names;
/// its namespace's digest, and the last pass over that namespace that found it.
struct Known {
    version: Option<u64>,
    names: Box<[u64]>,
    namespace: u64,
    pass: u64,
}

/// The Secret names of each stored object of a kind, read with `read` (which may decode the
/// object) once per version.
pub struct SecretReaders<K> {
    read: fn(&K) -> Vec<String>,
    known: Mutex<Passes>,
}

#[derive(Default)]
struct Passes {
    by_identity: HashMap<u64, Known>,
    passes: u64,
}

impl<K> SecretReaders<K>
where
    K: Resource<DynamicType = ()> + StoredMeta + Clone,
{
    /// Readers that take an object's Secret names from `read`.
    pub fn new(read: fn(&K) -> Vec<String>) -> Self {
        SecretReaders {
            read,
            known: Mutex::new(Passes::default()),
        }
    }

    /// The objects of `namespace` in `store` that name the Secret `secret`.
    pub fn naming(
        &self,
        store: &Store<K>,
        namespace: Option<String>,
        secret: &str,
    ) -> Vec<ObjectRef<K>> {
        let wanted = digest(secret);
        let in_namespace = digest(namespace.as_deref().unwrap_or_default());
        let mut guard = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let Passes {
            by_identity,
            passes,
        } = &mut *guard;
        *passes += 1;
        let pass = *passes;
        let mut named = Vec::new();
        for object in store.state().iter().filter(|o| o.namespace() == namespace) {
            let identity = object.stored_identity();
            let version = object.stored_version();
            let known = by_identity
                .entry(identity)
                .and_modify(|k| {
                    if version.is_none() || k.version != version {
                        k.version = version;
                        k.names = self.names_of(object);
                    }
                })
                .or_insert_with(|| Known {
                    version,
                    names: self.names_of(object),
                    namespace: in_namespace,
                    pass,
                });
            known.pass = pass;
            if known.names.contains(&wanted) {
                named.push(ObjectRef::from(object.as_ref()));
            }
        }
        // Objects of this namespace gone from the store were not found in this pass.
        by_identity.retain(|_, k| k.namespace != in_namespace || k.pass == pass);
        named
    }

    fn names_of(&self, object: &K) -> Box<[u64]> {
        (self.read)(object).iter().map(|n| digest(n)).collect()
    }

    /// How many objects' names are kept (for tests).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_identity
            .len()
    }
}

fn digest(name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::capi::Cluster;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static READS: AtomicUsize = AtomicUsize::new(0);

    /// The test's kind names the Secret in its `secret` label.
    fn read(cluster: &Cluster) -> Vec<String> {
        READS.fetch_add(1, Ordering::SeqCst);
        cluster
            .labels()
            .get("secret")
            .cloned()
            .into_iter()
            .collect()
    }

    fn cluster(namespace: &str, name: &str, secret: &str, version: &str) -> Cluster {
        let mut cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}"),
                         "resourceVersion": version, "labels": {"secret": secret}},
            "spec": {},
        }))
        .unwrap();
        cluster.metadata.uid = Some(format!("uid-{namespace}-{name}"));
        cluster
    }

    fn names(found: Vec<ObjectRef<Cluster>>) -> Vec<String> {
        let mut names: Vec<String> = found.into_iter().map(|o| o.name).collect();
        names.sort();
        names
    }

    #[test]
    fn a_secret_finds_the_objects_of_its_namespace_that_name_it_reading_each_version_once() {
        let mut writer: Writer<Cluster> = Writer::default();
        let store = writer.as_reader();
        for object in [
            cluster("a", "one", "creds", "1"),
            cluster("a", "two", "creds", "1"),
            cluster("a", "three", "other", "1"),
            cluster("b", "four", "creds", "1"),
        ] {
            writer.apply_watcher_event(&Event::Apply(object));
        }
        let readers = SecretReaders::new(read);
        let before = READS.load(Ordering::SeqCst);
        let ns = Some("a".to_owned());
        assert_eq!(
            names(readers.naming(&store, ns.clone(), "creds")),
            ["one", "two"]
        );
        assert_eq!(
            names(readers.naming(&store, ns.clone(), "other")),
            ["three"]
        );
        assert_eq!(
            READS.load(Ordering::SeqCst) - before,
            3,
            "each object read once"
        );
        // A new version is read again: it names another Secret now.
        writer.apply_watcher_event(&Event::Apply(cluster("a", "two", "other", "2")));
        assert_eq!(names(readers.naming(&store, ns.clone(), "creds")), ["one"]);
        assert_eq!(READS.load(Ordering::SeqCst) - before, 4);
        // A deleted object's entry goes.
        writer.apply_watcher_event(&Event::Delete(cluster("a", "one", "creds", "1")));
        assert!(readers.naming(&store, ns, "creds").is_empty());
        assert_eq!(readers.kept(), 2, "two left in namespace a");
    }
}
