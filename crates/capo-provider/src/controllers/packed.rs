//! Objects kept packed in the shared stores. A stored object keeps, decoded, only what
//! kube-runtime and the wake-up mappers read of it: its name, namespace, resourceVersion,
//! generation and deletion; its owners as the kind, name and uid digest the mappers follow; its
//! uid as a digest (kube-runtime copies a `meta()`'s uid into every store key and every queued
//! reconcile); and its labels and annotations, which are interned, so that the thousands of
//! objects of one cluster share one copy of each set.
//! The whole object is kept as JSON deflated against another object of its kind
//! (`dictionary.rs`) and decoded when a reconciler reads it. An
//! OpenStackServer decoded takes about 6 KB of heap; packed, a fraction of that
//! (docs/memory.md). Like kube's `DeserializeGuard`, an object that does not decode is kept
//! with its error, so one bad object never stalls a watch.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::dictionary::Deflated;

/// A kind the stores keep packed: what of it is dropped before it is packed.
pub trait Packable: Resource + Serialize + DeserializeOwned + 'static {
    /// Drops what no reader needs (kept as it is by default).
    fn trim(&mut self) {}
}

/// An object of kind `K`, packed: its identity and interned tags, and the whole of it
/// deflated (or why it does not decode).
pub struct Packed<K> {
    /// Name, namespace, resourceVersion, generation and deletion: labels and annotations are
    /// in `tags`, the owners in `owners`, the uid in `identity`, the rest in `body`.
    metadata: ObjectMeta,
    tags: Arc<Tags>,
    owners: Box<[StoredOwner]>,
    /// See [`identity_of`].
    identity: u64,
    body: Result<Deflated, Arc<str>>,
    kind: PhantomData<fn() -> K>,
}

/// An object's labels and annotations, shared by every stored object that has the same.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
struct Tags {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// An owner reference as a packed object keeps it: the kind and name the mappers follow, and
/// the owner's uid as a digest. The four strings of an `OwnerReference` took about 270 bytes
/// an object; most objects have one owner, and no two the same (docs/memory.md).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoredOwner {
    kind: Cow<'static, str>,
    name: Box<str>,
    uid: u64,
}

/// The kinds that own the objects this provider watches, kept without an allocation each.
const OWNER_KINDS: &[&str] = &[
    "Cluster",
    "Machine",
    "MachineSet",
    "MachinePool",
    "KubeadmControlPlane",
    "OpenStackCluster",
    "OpenStackMachine",
    "OpenStackServer",
    "OpenStackFloatingIPPool",
];

impl StoredOwner {
    fn of(reference: &OwnerReference) -> Self {
        let kind = OWNER_KINDS
            .iter()
            .find(|kind| **kind == reference.kind)
            .map_or_else(
                || Cow::Owned(reference.kind.clone()),
                |kind| Cow::Borrowed(*kind),
            );
        StoredOwner {
            kind,
            name: reference.name.as_str().into(),
            uid: digest(&reference.uid),
        }
    }

    /// The owner's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The owner's name (in the owned object's namespace).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A digest of the owner's uid: a new owner of the same name is another one.
    pub fn uid(&self) -> u64 {
        self.uid
    }
}

fn owners_of(meta: &ObjectMeta) -> Box<[StoredOwner]> {
    meta.owner_references
        .iter()
        .flatten()
        .map(StoredOwner::of)
        .collect()
}

/// Where stored objects find their tags: each distinct set once.
struct Interner {
    sets: HashSet<Arc<Tags>>,
    /// The set count at which sets no object holds any more are dropped.
    prune_at: usize,
}

static INTERNER: LazyLock<Mutex<Interner>> = LazyLock::new(|| {
    Mutex::new(Interner {
        sets: HashSet::new(),
        prune_at: 1024,
    })
});

/// The shared copy of `tags`.
fn intern(tags: Tags) -> Arc<Tags> {
    // A panic elsewhere while the lock was held leaves the sets whole: each is inserted or not.
    let mut interner = INTERNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(shared) = interner.sets.get(&tags) {
        return shared.clone();
    }
    if interner.sets.len() >= interner.prune_at {
        // Sets of objects gone (a deleted cluster's, a changed label's) go here: held by
        // the interner alone.
        interner.sets.retain(|set| Arc::strong_count(set) > 1);
        interner.prune_at = (interner.sets.len() * 2).max(1024);
    }
    let shared = Arc::new(tags);
    interner.sets.insert(shared.clone());
    shared
}

/// Which object `meta` is: a digest of its namespace, name and uid (a new object of the same
/// name is another one). A digest, not the three strings: the change filters keep one per
/// object per subscriber. Two objects sharing a 64-bit digest would share an entry; the odds
/// are nil at any number of objects a controller watches.
pub fn identity_of(meta: &ObjectMeta) -> u64 {
    digest(&(&meta.namespace, &meta.name, &meta.uid))
}

/// A digest of `meta`'s resourceVersion: it differs when the object changed.
pub fn version_of(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_ref().map(digest)
}

fn digest(value: &impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Packed {
            metadata: self.metadata.clone(),
            tags: self.tags.clone(),
            owners: self.owners.clone(),
            identity: self.identity,
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body.as_ref().map(Deflated::size);
        f.debug_struct("Packed")
            .field("name", &self.metadata.name)
            .field("namespace", &self.metadata.namespace)
            .field("packed_bytes", &body)
            .finish()
    }
}

/// What the store keeps of an object's metadata: no reader needs its field managers or the
/// copy `kubectl apply` leaves, which are often most of its bytes.
pub fn strip_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The annotation `kubectl apply` keeps its last input in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// `meta` split into the identity a packed object keeps decoded, its interned tags and its
/// owners.
fn split(meta: &ObjectMeta) -> (ObjectMeta, Arc<Tags>, Box<[StoredOwner]>) {
    let kept = ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        // kube-runtime's watcher resumes from the last event's resourceVersion, read from the
        // object this type decodes to: without it, every event is `NoResourceVersion` and a
        // fresh list.
        resource_version: meta.resource_version.clone(),
        generation: meta.generation,
        deletion_timestamp: meta.deletion_timestamp.clone(),
        ..ObjectMeta::default()
    };
    let tags = Tags {
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
    };
    (kept, intern(tags), owners_of(meta))
}

impl<K: Packable> Packed<K> {
    /// Packs `object`, trimmed as its kind is stored.
    pub fn pack(mut object: K) -> Self {
        strip_metadata(object.meta_mut());
        object.trim();
        let (metadata, tags, owners) = split(object.meta());
        let identity = identity_of(object.meta());
        let body = serde_json::to_vec(&object)
            .map_err(std::io::Error::from)
            .and_then(|json| Deflated::new(TypeId::of::<K>(), &json))
            .map_err(|error| Arc::from(error.to_string()));
        Packed {
            metadata,
            tags,
            owners,
            identity,
            body,
            kind: PhantomData,
        }
    }

    /// Kept with the reason it does not decode, and its uid (the one place it is read from:
    /// the error a reconcile reports).
    fn invalid(mut invalid: InvalidObject) -> Self {
        strip_metadata(&mut invalid.metadata);
        let (mut metadata, tags, owners) = split(&invalid.metadata);
        metadata.uid = invalid.metadata.uid;
        metadata.owner_references = invalid.metadata.owner_references;
        let identity = identity_of(&metadata);
        Packed {
            metadata,
            tags,
            owners,
            identity,
            body: Err(Arc::from(invalid.error)),
            kind: PhantomData,
        }
    }

    /// The object, decoded; or why it does not decode.
    pub fn unpack(&self) -> Result<K, Box<InvalidObject>> {
        let invalid = |error: String| {
            Box::new(InvalidObject {
                error,
                metadata: self.metadata_with_tags(),
            })
        };
        let body = self
            .body
            .as_ref()
            .map_err(|error| invalid(error.to_string()))?;
        let json = body.inflate().map_err(|error| invalid(error.to_string()))?;
        serde_json::from_slice(&json).map_err(|error| invalid(error.to_string()))
    }

    /// Whether the object decoded when it was stored.
    pub fn is_valid(&self) -> bool {
        self.body.is_ok()
    }
}

impl<K> Packed<K> {
    /// The object's labels (interned; `meta()` holds none).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.tags.labels
    }

    /// The object's annotations (interned; `meta()` holds none).
    pub fn annotations(&self) -> &BTreeMap<String, String> {
        &self.tags.annotations
    }

    fn metadata_with_tags(&self) -> ObjectMeta {
        let some = |map: &BTreeMap<String, String>| (!map.is_empty()).then(|| map.clone());
        ObjectMeta {
            labels: some(&self.tags.labels),
            annotations: some(&self.tags.annotations),
            ..self.metadata.clone()
        }
    }
}

impl<'de, K: Packable> Deserialize<'de> for Packed<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let DeserializeGuard(decoded) = DeserializeGuard::<K>::deserialize(deserializer)?;
        Ok(match decoded {
            Ok(object) => Packed::pack(object),
            Err(invalid) => Packed::invalid(invalid),
        })
    }
}

/// What a store's readers read of an object beside `meta()`'s name, namespace, generation and
/// deletion: its tags (in its metadata, or interned beside a packed object's), its owners, and
/// digests of its identity (a packed object keeps no more of its uid) and resourceVersion.
/// Mappers and filters read stored objects through this, so that a packed object's tags and
/// owners are not read as empty nor its recreation missed.
pub trait StoredMeta: Resource {
    /// The object's labels.
    fn stored_labels(&self) -> &BTreeMap<String, String> {
        self.meta().labels.as_ref().unwrap_or(&NO_TAGS)
    }
    /// The object's annotations.
    fn stored_annotations(&self) -> &BTreeMap<String, String> {
        self.meta().annotations.as_ref().unwrap_or(&NO_TAGS)
    }
    /// The objects that own it.
    fn stored_owners(&self) -> Cow<'_, [StoredOwner]> {
        Cow::Owned(owners_of(self.meta()).into_vec())
    }
    /// Which object this is (see [`identity_of`]).
    fn stored_identity(&self) -> u64 {
        identity_of(self.meta())
    }
    /// A digest of its resourceVersion.
    fn stored_version(&self) -> Option<u64> {
        version_of(self.meta())
    }
}

static NO_TAGS: BTreeMap<String, String> = BTreeMap::new();

impl<K: Resource> StoredMeta for Packed<K> {
    fn stored_labels(&self) -> &BTreeMap<String, String> {
        self.labels()
    }

    fn stored_annotations(&self) -> &BTreeMap<String, String> {
        self.annotations()
    }

    fn stored_owners(&self) -> Cow<'_, [StoredOwner]> {
        Cow::Borrowed(&self.owners)
    }

    fn stored_identity(&self) -> u64 {
        self.identity
    }
}

/// Objects kept decoded: all of it is in their metadata.
impl<K: Resource> StoredMeta for DeserializeGuard<K> {}
impl StoredMeta for capo_api::capi::Cluster {}
impl StoredMeta for capo_api::ipam::IPAddressClaim {}

impl<K: Resource> Resource for Packed<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What a shared watch stores of an object of kind `K`: the object itself (kube's
/// `DeserializeGuard`) or [`Packed`]. Either may hold an object that does not decode.
pub trait Stored<K: Clone>: Resource {
    /// The object (borrowed where it is kept decoded); or why it does not decode.
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>>;
}

impl<K: Resource + Clone> Stored<K> for DeserializeGuard<K> {
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>> {
        self.0
            .as_ref()
            .map(Cow::Borrowed)
            .map_err(|invalid| Box::new(invalid.clone()))
    }
}

impl<K: Packable + Clone> Stored<K> for Packed<K> {
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>> {
        self.unpack().map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::ObjectRef;
    use serde_json::json;

    impl Packable for ConfigMap {}

    fn config_map(name: &str, cluster: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "resourceVersion": "7", "finalizers": ["f"],
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                "annotations": {"a": "b"},
                "managedFields": [{"manager": "kubectl"}],
            },
            "data": {"k": "v"},
        }))
        .unwrap()
    }

    #[test]
    fn objects_with_the_same_tags_share_one_copy_and_unpack_whole() {
        let a = Packed::pack(config_map("a", "one"));
        let b = Packed::pack(config_map("b", "one"));
        let c = Packed::pack(config_map("c", "two"));
        assert!(
            Arc::ptr_eq(&a.tags, &b.tags),
            "one cluster's objects share their tags"
        );
        assert!(!Arc::ptr_eq(&a.tags, &c.tags));
        assert_eq!(a.labels()["cluster.x-k8s.io/cluster-name"], "one");
        assert_eq!(a.annotations()["a"], "b");
        // Kept decoded: identity only; the store's readers go through `StoredMeta`.
        assert_eq!(a.meta().labels, None);
        assert_eq!(a.meta().finalizers, None);
        assert_eq!(a.meta().name.as_deref(), Some("a"));
        assert_eq!(a.stored_labels(), a.labels());
        // Unpacked: the whole object, less its field managers.
        let mut expected = config_map("a", "one");
        expected.metadata.managed_fields = None;
        assert_eq!(a.unpack().unwrap(), expected);
    }

    #[test]
    fn the_uid_is_a_digest_that_still_tells_objects_and_changes_apart() {
        let a = Packed::pack(config_map("a", "one"));
        // kube-runtime copies `meta()`'s uid into every store key and every queued
        // reconcile: a packed object's carry none. Its watcher reads the resourceVersion of
        // each object it decodes to resume from, so that stays.
        let key = ObjectRef::from_obj(&a);
        assert_eq!(key.extra.uid, None);
        assert_eq!(a.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(a.unpack().unwrap().metadata.uid.as_deref(), Some("uid-a"));

        let mut recreated = config_map("a", "one");
        recreated.metadata.uid = Some("uid-a-again".into());
        let recreated = Packed::pack(recreated);
        assert_ne!(a.stored_identity(), recreated.stored_identity());
        assert_eq!(a.stored_version(), recreated.stored_version());

        let mut changed = config_map("a", "one");
        changed.metadata.resource_version = Some("8".into());
        let changed = Packed::pack(changed);
        assert_eq!(a.stored_identity(), changed.stored_identity());
        assert_ne!(a.stored_version(), changed.stored_version());

        // The same digests as the object kept decoded would give.
        let decoded = DeserializeGuard(Ok(config_map("a", "one")));
        assert_eq!(decoded.stored_identity(), a.stored_identity());
        assert_eq!(decoded.stored_version(), a.stored_version());
    }

    #[test]
    fn owners_are_kept_compact_and_read_as_the_decoded_object_reads_them() {
        let owner = |kind: &str, name: &str, uid: &str| OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut object = config_map("a", "one");
        object.metadata.owner_references = Some(vec![
            owner("Machine", "m-1", "uid-m"),
            owner("Widget", "w", "uid-w"),
        ]);
        let packed = Packed::pack(object.clone());
        let decoded = DeserializeGuard(Ok(object.clone()));

        let owners = packed.stored_owners();
        assert_eq!(owners, decoded.stored_owners());
        assert_eq!((owners[0].kind(), owners[0].name()), ("Machine", "m-1"));
        assert_eq!((owners[1].kind(), owners[1].name()), ("Widget", "w"));
        assert!(matches!(packed.owners[0].kind, Cow::Borrowed(_)));
        // Kept decoded: none (readers go through `StoredMeta`); unpacked: all of each.
        assert_eq!(packed.meta().owner_references, None);
        assert_eq!(
            packed.unpack().unwrap().metadata.owner_references,
            object.metadata.owner_references
        );

        let mut adopted = object.clone();
        adopted.metadata.owner_references = Some(vec![owner("Machine", "m-1", "uid-m-again")]);
        let adopted = Packed::pack(adopted);
        assert_ne!(
            adopted.stored_owners()[0].uid(),
            owners[0].uid(),
            "a new owner of the same name is another one"
        );
    }

    #[test]
    fn an_object_that_does_not_decode_keeps_its_uid_for_the_error() {
        let mut object = serde_json::to_value(config_map("bad", "one")).unwrap();
        object["data"] = json!("not a map");
        let bad: Packed<ConfigMap> = serde_json::from_value(object).unwrap();
        assert!(!bad.is_valid());
        let error = bad.unpack().unwrap_err();
        assert_eq!(error.metadata.uid.as_deref(), Some("uid-bad"));
        assert_eq!(
            error.metadata.labels,
            config_map("bad", "one").metadata.labels
        );
    }

    #[test]
    fn tags_no_object_holds_are_dropped_as_the_sets_grow() {
        let gone = Arc::downgrade(&Packed::pack(config_map("x", "deleted-cluster")).tags);
        let kept: Vec<_> = (0..3000)
            .map(|i| Packed::pack(config_map("y", &format!("cluster-{i}"))))
            .collect();
        assert!(
            gone.upgrade().is_none(),
            "a deleted cluster's tags are let go"
        );
        assert_eq!(
            kept[0].labels()["cluster.x-k8s.io/cluster-name"],
            "cluster-0"
        );
    }

    #[test]
    fn an_object_packs_smaller_and_unpacks_the_same() {
        let data: std::collections::BTreeMap<String, String> = (0..20)
            .map(|i| (format!("key-{i}"), "a value that repeats itself".to_owned()))
            .collect();
        let object: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns", "labels": {"l": "v"}},
            "data": data,
        }))
        .unwrap();
        let packed = Packed::pack(object.clone());
        let json = serde_json::to_vec(&object.data).unwrap().len();
        let bytes = packed.body.as_ref().map(Deflated::size).unwrap();
        assert!(bytes * 3 < json, "{bytes} packed bytes of {json}");
        assert_eq!(packed.meta().name.as_deref(), Some("a"));
        assert_eq!(packed.unpack().unwrap(), object);
    }

    #[test]
    fn an_object_that_does_not_decode_keeps_its_name_and_error() {
        let packed: Packed<ConfigMap> = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns"},
            "data": "not a map",
        }))
        .unwrap();
        assert!(!packed.is_valid());
        assert_eq!(packed.meta().name.as_deref(), Some("bad"));
        let invalid = packed.unpack().unwrap_err();
        assert_eq!(invalid.metadata.name.as_deref(), Some("bad"));
        assert!(
            invalid.error.contains("Expected a map"),
            "{}",
            invalid.error
        );
    }
}
