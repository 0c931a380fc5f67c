//! The simulated server's storage and the rules the real API server applies on every
//! write: system metadata, optimistic concurrency, the status subresource, schema
//! defaulting/pruning/validation, finalizers and graceful deletion, namespaces,
//! CustomResourceDefinitions and owner-reference garbage collection. Everything here is
//! synchronous and runs under one lock; the HTTP layer only parses and presents.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use regex::Regex;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::errors::{ApiError, Cause};
use super::managed::{self, Entry, Manager, Operation};
use super::resources::{self, APIEXTENSIONS, Registry, ResourceDef, ResourceKey, VersionDef};
use crate::structural;

/// Namespaces every cluster starts with; the first three may not be deleted.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";
/// Snapshots kept for paginated lists; older continue tokens get 410.
const LIST_SNAPSHOTS: usize = 256;

/// What a watcher is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created (or, in initial events, existing).
    Added,
    /// Changed.
    Modified,
    /// Gone.
    Deleted,
}

impl EventType {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, as kept for watches.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// Which resource.
    pub key: ResourceKey,
    /// Namespace ("" when cluster-scoped).
    pub namespace: String,
    /// Kind of change.
    pub kind: EventType,
    /// The object after the change (the last state, for deletions), in storage form.
    pub object: Arc<Value>,
    /// The object before the change, for watchers whose selector it used to match.
    pub previous: Option<Arc<Value>>,
}

/// How to treat fields the schema does not know (`fieldValidation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (the server's default).
    #[default]
    Warn,
    /// Refuse the request.
    Strict,
}

/// Options shared by writes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: run every check, store nothing.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// Who writes (`fieldManager`, or the User-Agent's product); empty reads as `unknown`.
    pub field_manager: String,
}

impl WriteOptions {
    fn manager(&self, target: &Target, operation: Operation, status: bool) -> Manager {
        Manager {
            name: if self.field_manager.is_empty() {
                "unknown".into()
            } else {
                self.field_manager.clone()
            },
            operation,
            api_version: target
                .def
                .api_version(target.asked.as_deref().unwrap_or(&target.version)),
            subresource: status.then(|| "status".to_owned()),
        }
    }
}

/// How a write records field ownership.
enum Ownership {
    /// As an Update by the request's manager: it owns what it changed.
    Record,
    /// As computed by server-side apply.
    Keep(Vec<Entry>),
}

/// Which resource, at which version, in which namespace ("" when cluster-scoped).
#[derive(Clone)]
pub struct Target {
    /// The resource.
    pub def: Arc<ResourceDef>,
    /// The version the client speaks.
    pub version: String,
    /// Namespace from the URL.
    pub namespace: String,
    /// The version the request was made in, when the write reaches the store converted to
    /// another: `managedFields` name the request's version, as the API server's field manager
    /// works in it.
    pub asked: Option<String>,
}

impl Target {
    fn key(&self, name: &str) -> ObjKey {
        (
            self.def.key.clone(),
            self.namespace.clone(),
            name.to_owned(),
        )
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.def.key.group, &self.def.key.plural, name)
    }

    fn version_def(&self) -> Option<&VersionDef> {
        self.def.version(&self.version)
    }

    fn has_status(&self) -> bool {
        self.version_def().is_some_and(|v| v.status_subresource)
    }

    /// The part of `object` field ownership is about, through the main resource or `/status`.
    fn trackable(&self, object: &Value, status: bool) -> Value {
        managed::trackable(object, self.has_status(), status)
    }

    fn ownership_schema(&self) -> &Value {
        static NONE: LazyLock<Value> = LazyLock::new(|| managed::tracking_schema(None));
        self.version_def().map_or(&*NONE, |v| &v.ownership_schema)
    }
}

/// The result of a write.
#[derive(Debug)]
pub struct Written {
    /// The object as stored (storage version).
    pub object: Arc<Value>,
    /// `Warning` headers to send.
    pub warnings: Vec<String>,
    /// Whether the write created the object (201 rather than 200).
    pub created: bool,
}

/// What happens to an object's dependents when it is deleted (`propagationPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    /// The object goes at once; the garbage collector removes dependents afterwards.
    #[default]
    Background,
    /// The object stays, with the `foregroundDeletion` finalizer, until the garbage
    /// collector has removed its blocking dependents.
    Foreground,
    /// Dependents are left alone.
    Orphan,
}

/// Delete options from the body or query.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `propagationPolicy` (or the deprecated `orphanDependents`).
    pub propagation: Propagation,
    /// `orphanDependents` as sent: `false` makes a pending deletion answer 202.
    pub orphan_dependents: Option<bool>,
    /// `dryRun=All`.
    pub dry_run: bool,
}

/// The outcome of a DELETE.
#[derive(Debug)]
pub enum Deletion {
    /// The object is gone (or, with dryRun, would be); this is its last state.
    Gone(Arc<Value>),
    /// The object stays, marked for deletion, until its finalizers are removed.
    Pending(Arc<Value>),
}

impl Deletion {
    /// The object, gone or pending.
    pub fn object(self) -> Arc<Value> {
        match self {
            Self::Gone(o) | Self::Pending(o) => o,
        }
    }
}

/// The finalizer that holds an object deleted in the foreground.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// What a list asks for.
#[derive(Clone, Copy)]
pub struct ListQuery<'a> {
    /// Only this namespace; all when None.
    pub namespace: Option<&'a str>,
    /// Label and field selectors.
    pub filter: &'a dyn Fn(&Value) -> bool,
    /// Page size.
    pub limit: Option<usize>,
    /// Token from the previous page.
    pub continue_token: Option<&'a str>,
    /// `resourceVersion`.
    pub resource_version: Option<&'a str>,
    /// `resourceVersionMatch=Exact`.
    pub exact: bool,
}

/// A page of a list.
#[derive(Debug)]
pub struct ListPage {
    /// The objects, in storage form.
    pub items: Vec<Arc<Value>>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// How many items the remaining pages hold.
    pub remaining: Option<usize>,
}

/// What a new watch starts with.
pub struct WatchStart {
    /// Events to send before live ones: synthetic ADDED for current state, or history
    /// after the requested resourceVersion.
    pub initial: Vec<Arc<Change>>,
    /// Live changes.
    pub live: broadcast::Receiver<Arc<Change>>,
    /// resourceVersion at the start.
    pub rv: u64,
    /// The requested resourceVersion is no longer in the history (send 410 and stop).
    pub expired: Option<ApiError>,
}

struct Snapshot {
    id: u64,
    rv: u64,
    items: Vec<Arc<Value>>,
}

type ObjKey = (ResourceKey, String, String);

/// Tunables.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Changes kept for watches that resume from a resourceVersion; older ones get 410.
    pub history: usize,
    /// Capacity of the live change channel; a watcher that falls this far behind gets 410.
    pub watch_buffer: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            history: 10_000,
            watch_buffer: 16_384,
        }
    }
}

/// All objects and the resources that serve them.
pub struct Store {
    registry: Arc<Registry>,
    crds: BTreeMap<String, Arc<ResourceDef>>,
    objects: BTreeMap<ObjKey, Arc<Value>>,
    /// Objects read into the storage version that the next write must store (see
    /// [`Store::reencode`]).
    reencoded: HashSet<ObjKey>,
    uids: HashMap<String, ObjKey>,
    orphaning: HashSet<String>,
    /// Objects deleted in the foreground, for the garbage collector to finish.
    foreground: BTreeSet<ObjKey>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    compacted_through: u64,
    /// The resourceVersion at which each custom resource began to be served: a real server's
    /// watch cache for it starts there, so a watch from before is 410 Gone (recorded).
    served_since: HashMap<ResourceKey, u64>,
    changes: broadcast::Sender<Arc<Change>>,
    snapshots: VecDeque<Snapshot>,
    next_snapshot: u64,
    removed: Vec<Arc<Value>>,
    validator: kube::core::cel::Validator,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn finalizers(object: &Value) -> Vec<String> {
    resources::strings(object.pointer("/metadata/finalizers"))
}

fn is_deleting(object: &Value) -> bool {
    object.pointer("/metadata/deletionTimestamp").is_some()
}

/// The ownerReference of `object` naming the owner `uid`.
fn owner_reference<'a>(object: &'a Value, uid: &str) -> Option<&'a Value> {
    object
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
}

fn owner_uids(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

static SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("static regex")
});
static LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("static regex"));
static LABEL_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").expect("static regex")
});

/// Whether a schema holds a CEL rule anywhere.
fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            map.contains_key("x-kubernetes-validations") || map.values().any(has_rules)
        }
        Value::Array(items) => items.iter().any(has_rules),
        _ => false,
    }
}

fn cause(reason: &'static str, field: &str, message: impl Into<String>) -> Cause {
    Cause {
        reason,
        field: field.to_owned(),
        message: message.into(),
    }
}

/// Checks the name and labels the way the API server does.
fn metadata_causes(object: &Value, dns_label_name: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = meta_str(object, "name").unwrap_or_default();
    let (re, max, what) = if dns_label_name {
        (&*LABEL, 63, "a lowercase RFC 1123 label")
    } else {
        (&*SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain")
    };
    if !re.is_match(name) || name.len() > max {
        causes.push(cause(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: {name:?}: {what} must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    if let Some(labels) = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        for (key, value) in labels {
            let (prefix, short) = key.rsplit_once('/').unwrap_or(("", key));
            let key_ok = LABEL_VALUE.is_match(short)
                && !short.is_empty()
                && short.len() <= 63
                && (prefix.is_empty() || (SUBDOMAIN.is_match(prefix) && prefix.len() <= 253));
            if !key_ok {
                causes.push(cause(
                    "FieldValueInvalid",
                    "metadata.labels",
                    format!("Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.'"),
                ));
            }
            let value_ok = value
                .as_str()
                .is_some_and(|v| v.len() <= 63 && LABEL_VALUE.is_match(v));
            if !value_ok {
                causes.push(cause(
                    "FieldValueInvalid",
                    "metadata.labels",
                    format!("Invalid value: {value}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                ));
            }
        }
    }
    causes
}

/// The object as a client of `version` sees it: that apiVersion, and the version's schema
/// defaults applied (the real server defaults on every read).
pub fn present(def: &ResourceDef, version: &str, stored: &Value) -> Value {
    let mut object = stored.clone();
    object["apiVersion"] = Value::String(def.api_version(version));
    object["kind"] = Value::String(def.kind.clone());
    if let Some(schema) = def.version(version).and_then(|v| v.schema.as_ref()) {
        structural::apply_defaults(&mut object, schema);
    }
    object
}

/// An object a DELETE holds (finalizers, or a foreground deletion) as the generic
/// registry's `markAsDeleting` leaves it: `deletionTimestamp` and
/// `deletionGracePeriodSeconds: 0` set once, `generation` bumped by one that first time
/// (objects with a generation: custom resources and CRDs), the `foregroundDeletion`
/// finalizer added for a foreground deletion. `None` when nothing changes.
fn marked_for_deletion(def: &ResourceDef, old: &Value, foreground: bool) -> Option<Value> {
    let mut list = finalizers(old);
    let add_finalizer = foreground && !list.iter().any(|f| f == FOREGROUND_FINALIZER);
    if is_deleting(old) && !add_finalizer {
        return None;
    }
    let mut marked = old.clone();
    if add_finalizer {
        list.push(FOREGROUND_FINALIZER.to_owned());
        metadata_mut(&mut marked).insert("finalizers".into(), json!(list));
    }
    if !is_deleting(old) {
        let metadata = metadata_mut(&mut marked);
        metadata.insert("deletionTimestamp".into(), now().into());
        metadata.insert("deletionGracePeriodSeconds".into(), 0.into());
        if let Some(generation) = metadata
            .get("generation")
            .and_then(Value::as_i64)
            .filter(|g| *g > 0)
        {
            metadata.insert("generation".into(), (generation + 1).into());
        }
        if def.key == namespace_key() {
            marked["status"]["phase"] = "Terminating".into();
        }
        if def.key == crd_key() {
            set_condition(
                &mut marked,
                "Terminating",
                "True",
                "InstanceDeletionInProgress",
            );
        }
    }
    Some(marked)
}

/// The part of an object whose change bumps `generation`.
fn generation_view(object: &Value, ignore_status: bool) -> Value {
    let mut view = object.clone();
    if let Some(map) = view.as_object_mut() {
        map.remove("metadata");
        if ignore_status {
            map.remove("status");
        }
    }
    view
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

impl Store {
    /// An empty cluster with the initial namespaces.
    pub fn new(config: &StoreConfig) -> Self {
        let (changes, _) = broadcast::channel(config.watch_buffer.max(1));
        let mut store = Self {
            registry: Arc::new(Registry::new([])),
            crds: BTreeMap::new(),
            objects: BTreeMap::new(),
            reencoded: HashSet::new(),
            uids: HashMap::new(),
            orphaning: HashSet::new(),
            foreground: BTreeSet::new(),
            rv: 0,
            history: VecDeque::new(),
            history_limit: config.history.max(1),
            compacted_through: 0,
            served_since: HashMap::new(),
            changes,
            snapshots: VecDeque::new(),
            next_snapshot: 0,
            removed: Vec::new(),
            validator: kube::core::cel::Validator::new(),
        };
        let namespaces = store.registry.all[0].clone();
        for name in INITIAL_NAMESPACES {
            let target = Target {
                def: namespaces.clone(),
                version: "v1".into(),
                namespace: String::new(),
                asked: None,
            };
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            if let Err(e) = store.create(&target, body, &WriteOptions::default()) {
                unreachable!("initial namespace {name} refused: {e}");
            }
        }
        store
    }

    /// What is served now.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn commit(&mut self, key: ObjKey, mut object: Value, kind: EventType) -> Arc<Value> {
        self.reencoded.remove(&key);
        self.rv += 1;
        metadata_mut(&mut object).insert("resourceVersion".into(), self.rv.to_string().into());
        let object = Arc::new(object);
        let previous = if kind == EventType::Deleted {
            self.objects.remove(&key)
        } else {
            self.objects.insert(key.clone(), object.clone())
        };
        if let Some(uid) = meta_str(&object, "uid") {
            if kind == EventType::Deleted {
                self.uids.remove(uid);
                self.removed.push(object.clone());
            } else {
                self.uids.insert(uid.to_owned(), key.clone());
            }
        }
        let change = Arc::new(Change {
            rv: self.rv,
            namespace: key.1.clone(),
            key: key.0,
            kind,
            object: object.clone(),
            previous,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_through = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.changes.send(change);
        object
    }

    /// Replaces a stored object, still encoded in an older version, by its conversion to the
    /// storage version (`was` must still be what is stored), without a write: the next write
    /// stores it even when it changes nothing, as the real server re-encodes on update.
    pub fn reencode(&mut self, target: &Target, name: &str, was: &Value, now: Value) {
        let key = target.key(name);
        let unchanged = self.objects.get(&key).is_some_and(|o| **o == *was);
        if unchanged {
            self.objects.insert(key.clone(), Arc::new(now));
            self.reencoded.insert(key);
        }
    }

    /// Every stored object of a resource, in every namespace.
    pub fn all_of(&self, group: &str, plural: &str) -> Vec<Arc<Value>> {
        // A range of the map, not a scan of it: admission reads the webhook configurations
        // on every write, and at 3,000 clusters a scan of every object was a third of the
        // simulated API server's time.
        let key = ResourceKey {
            group: group.to_owned(),
            plural: plural.to_owned(),
        };
        self.objects_of(&key, None).cloned().collect()
    }

    /// Checks an object against the schema and CEL rules of the version it was sent in, with
    /// the old object (in that version) for transition rules: the API server validates a
    /// request in its own version, before it converts it for storage.
    pub fn check_in_version(
        &self,
        target: &Target,
        object: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let causes = self.validation_causes(target, object, old);
        if causes.is_empty() {
            return Ok(());
        }
        let name = meta_str(object, "name").unwrap_or_default();
        Err(ApiError::invalid(
            &target.def.key.group,
            &target.def.kind,
            name,
            causes,
        ))
    }

    /// What the schema and then the CEL rules of `target.version` find wrong (CEL only when
    /// the schema finds nothing, as the API server skips rules on an invalid object).
    fn validation_causes(
        &self,
        target: &Target,
        object: &Value,
        old: Option<&Value>,
    ) -> Vec<Cause> {
        let mut causes = Vec::new();
        let version = target.def.version(&target.version);
        // CRD validation ratcheting (GA in 1.33): an update's error on a value it left as
        // it was does not count.
        let schema = version.and_then(|v| v.schema.as_ref());
        let stands = |path: &str| match (old, schema) {
            (Some(old), Some(schema)) => !structural::ratcheted(path, object, old, schema),
            _ => true,
        };
        if let Some(schema) = schema {
            for e in structural::validate(object, schema) {
                if stands(&e.path) {
                    causes.push(cause(e.reason, &e.path, e.message));
                }
            }
            // A real server says so when the schema's errors kept its CEL rules from running.
            if !causes.is_empty() && has_rules(schema) {
                causes.push(cause(
                    "FieldValueInvalid",
                    "<nil>",
                    "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                ));
            }
        }
        if causes.is_empty()
            && let Some(cel) = version.and_then(|v| v.cel.as_ref())
            && let Err(errors) = self.validator.validate_compiled(cel, object, old)
        {
            for e in errors.into_vec() {
                let field = e.field_path.trim_start_matches('.').to_owned();
                if !stands(&field) {
                    continue;
                }
                causes.push(cause(
                    "FieldValueInvalid",
                    &field,
                    format!("Invalid value: {}", e.message),
                ));
            }
        }
        causes
    }

    /// Reads one object.
    pub fn get(&self, target: &Target, name: &str) -> Result<Arc<Value>, ApiError> {
        self.objects
            .get(&target.key(name))
            .cloned()
            .ok_or_else(|| target.not_found(name))
    }

    fn objects_of<'a>(
        &'a self,
        key: &'a ResourceKey,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.objects
            .range((key.clone(), String::new(), String::new())..)
            .take_while(move |((k, _, _), _)| k == key)
            .filter(move |((_, ns, _), _)| namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v)
    }

    /// Lists objects (all namespaces when `namespace` is None) that pass `filter`, one page
    /// at a time when `limit` is set. Pages after the first come from a snapshot taken at
    /// the first, as etcd's consistent continuation does.
    pub fn list(&mut self, key: &ResourceKey, query: &ListQuery<'_>) -> Result<ListPage, ApiError> {
        let ListQuery {
            namespace,
            filter,
            limit,
            continue_token,
            resource_version,
            exact,
        } = *query;
        let (snapshot_id, rv, items, offset) = match continue_token.filter(|t| !t.is_empty()) {
            Some(token) => {
                if resource_version.is_some_and(|rv| !rv.is_empty()) {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let (id, offset) = decode_continue(token)?;
                let snapshot = self.snapshots.iter().find(|s| s.id == id).ok_or_else(|| {
                    ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.")
                })?;
                (Some(id), snapshot.rv, snapshot.items.clone(), offset)
            }
            None => {
                self.check_read_version(resource_version, exact)?;
                let items: Vec<Arc<Value>> = self
                    .objects_of(key, namespace)
                    .filter(|o| filter(o))
                    .cloned()
                    .collect();
                (None, self.rv, items, 0)
            }
        };
        let rest = items.len().saturating_sub(offset);
        let page_size = limit.filter(|l| *l > 0).unwrap_or(usize::MAX).min(rest);
        let page: Vec<Arc<Value>> = items.iter().skip(offset).take(page_size).cloned().collect();
        let remaining = rest - page_size;
        let continue_token = if remaining > 0 {
            let id = snapshot_id.unwrap_or_else(|| self.keep_snapshot(rv, items));
            Some(encode_continue(id, offset + page_size))
        } else {
            None
        };
        Ok(ListPage {
            items: page,
            rv,
            continue_token,
            remaining: (remaining > 0).then_some(remaining),
        })
    }

    fn keep_snapshot(&mut self, rv: u64, items: Vec<Arc<Value>>) -> u64 {
        self.next_snapshot += 1;
        let id = self.next_snapshot;
        self.snapshots.push_back(Snapshot { id, rv, items });
        while self.snapshots.len() > LIST_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        id
    }

    /// Only the current state is kept: an older exact version is gone, a newer one does
    /// not exist yet.
    fn check_read_version(&self, requested: Option<&str>, exact: bool) -> Result<(), ApiError> {
        let Some(text) = requested.filter(|t| !t.is_empty() && *t != "0") else {
            return Ok(());
        };
        let requested: u64 = text
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {text:?}")))?;
        if requested > self.rv {
            return Err(ApiError::too_large_resource_version(requested, self.rv));
        }
        if exact && requested != self.rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {requested} ({})",
                self.rv
            )));
        }
        Ok(())
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Starts a watch of one resource. With no resourceVersion (or "0", or
    /// `send_initial`), the current objects come first as ADDED; with a resourceVersion,
    /// every change after it is replayed, or 410 if it has been compacted away.
    pub fn watch(
        &self,
        key: &ResourceKey,
        namespace: Option<&str>,
        resource_version: Option<&str>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let live = self.changes.subscribe();
        let requested = resource_version.filter(|t| !t.is_empty() && *t != "0");
        let mut start = WatchStart {
            initial: Vec::new(),
            live,
            rv: self.rv,
            expired: None,
        };
        match requested {
            Some(text) if !send_initial => {
                let from: u64 = text.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version {text:?}"))
                })?;
                if from > self.rv {
                    return Err(ApiError::too_large_resource_version(from, self.rv));
                }
                let oldest = self
                    .compacted_through
                    .max(self.served_since.get(key).copied().unwrap_or(0));
                if from < oldest {
                    start.expired = Some(ApiError::expired(format!(
                        "too old resource version: {from} ({})",
                        oldest + 1
                    )));
                    return Ok(start);
                }
                start.initial = self
                    .history
                    .iter()
                    .filter(|c| c.rv > from && &c.key == key)
                    .cloned()
                    .collect();
            }
            _ => {
                start.initial = self
                    .objects_of(key, namespace)
                    .map(|o| {
                        Arc::new(Change {
                            rv: meta_str(o, "resourceVersion")
                                .and_then(|rv| rv.parse().ok())
                                .unwrap_or_default(),
                            key: key.clone(),
                            namespace: meta_str(o, "namespace").unwrap_or_default().to_owned(),
                            kind: EventType::Added,
                            object: o.clone(),
                            previous: None,
                        })
                    })
                    .collect();
            }
        }
        Ok(start)
    }

    fn check_namespace(&self, target: &Target, name: &str) -> Result<(), ApiError> {
        if !target.def.namespaced {
            return Ok(());
        }
        let ns_key = (namespace_key(), String::new(), target.namespace.clone());
        match self.objects.get(&ns_key) {
            None => Err(ApiError::not_found("", "namespaces", &target.namespace)),
            Some(ns) if is_deleting(ns) => Err(ApiError::forbidden(
                &target.def.key.group,
                &target.def.key.plural,
                name,
                &format!(
                    "unable to create new content in namespace {} because it is being terminated",
                    target.namespace
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    fn crd_terminating(&self, def: &ResourceDef) -> bool {
        let crd_name = format!("{}.{}", def.key.plural, def.key.group);
        def.custom
            && self
                .objects
                .get(&(crd_key(), String::new(), crd_name))
                .is_some_and(|crd| is_deleting(crd))
    }

    /// Shape checks on a request body: an object whose apiVersion/kind, if given, are the
    /// target's, and whose namespace, if given, is the URL's.
    fn check_body(&self, target: &Target, body: &mut Value) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        let expected = target.def.api_version(&target.version);
        if let Some(api_version) = body.get("apiVersion").and_then(Value::as_str)
            && api_version != expected
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({expected})"
            )));
        }
        if let Some(kind) = body.get("kind").and_then(Value::as_str)
            && kind != target.def.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                target.def.kind
            )));
        }
        let metadata = metadata_mut(body);
        if target.def.namespaced {
            match metadata.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    metadata.insert("namespace".into(), target.namespace.clone().into());
                }
                Some(ns) if ns != target.namespace => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                Some(_) => {}
            }
        } else {
            metadata.remove("namespace");
        }
        Ok(())
    }

    /// Pruning, defaulting and validation against the target version's schema (custom
    /// resources), plus CEL rules with the old object for transition rules.
    fn admit(
        &mut self,
        target: &Target,
        object: &mut Value,
        old: Option<&Value>,
        opts: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        let name = meta_str(object, "name").unwrap_or_default().to_owned();
        let mut causes = metadata_causes(object, target.def.key.plural == "namespaces");
        let mut warnings = Vec::new();
        let version = target.def.version(&target.version);
        if let Some(schema) = version.and_then(|v| v.schema.as_ref()) {
            structural::drop_nulls(object, schema);
            let unknown = structural::prune(object, schema);
            match opts.field_validation {
                FieldValidation::Strict if !unknown.is_empty() => {
                    let listed: Vec<String> = unknown
                        .iter()
                        .map(|f| format!("unknown field {f:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        listed.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|f| format!("unknown field {f:?}")));
                }
                _ => {}
            }
            structural::apply_defaults(object, schema);
        }
        causes.extend(self.validation_causes(target, object, old));
        if causes.is_empty() {
            Ok(warnings)
        } else {
            Err(ApiError::invalid(
                &target.def.key.group,
                &target.def.kind,
                &name,
                causes,
            ))
        }
    }

    /// Creates an object (POST).
    pub fn create(
        &mut self,
        target: &Target,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.create_owned(target, body, opts, Ownership::Record)
    }

    fn create_owned(
        &mut self,
        target: &Target,
        mut body: Value,
        opts: &WriteOptions,
        ownership: Ownership,
    ) -> Result<Written, ApiError> {
        self.check_body(target, &mut body)?;
        let def = target.def.clone();
        let metadata = metadata_mut(&mut body);
        let name = match metadata.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => match metadata.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    let name = format!("{prefix}{}", random_suffix());
                    metadata.insert("name".into(), name.clone().into());
                    name
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def.key.group,
                        &def.kind,
                        "",
                        vec![cause(
                            "FieldValueRequired",
                            "metadata.name",
                            "Required value: name or generateName is required",
                        )],
                    ));
                }
            },
        };
        for system in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
            "selfLink",
        ] {
            metadata.remove(system);
        }
        self.check_namespace(target, &name)?;
        if self.crd_terminating(&def) {
            return Err(ApiError::method_not_allowed());
        }
        if self.objects.contains_key(&target.key(&name)) {
            return Err(ApiError::already_exists(
                &def.key.group,
                &def.key.plural,
                &name,
            ));
        }
        if def
            .version(&target.version)
            .is_some_and(|v| v.status_subresource)
            && let Some(map) = body.as_object_mut()
        {
            map.remove("status");
        }
        let warnings = self.admit(target, &mut body, None, opts)?;
        let crd = self.prepare_builtin_create(&def, &mut body)?;
        let entries = match ownership {
            Ownership::Record => managed::record_update(
                &json!({}),
                &target.trackable(&body, false),
                target.ownership_schema(),
                &[],
                &opts.manager(target, Operation::Update, false),
                &now(),
            ),
            Ownership::Keep(entries) => entries,
        };
        managed::write_entries(&mut body, entries);
        let metadata = metadata_mut(&mut body);
        metadata.insert("uid".into(), uuid::Uuid::new_v4().to_string().into());
        metadata.insert("creationTimestamp".into(), now().into());
        if def.custom || crd.is_some() {
            metadata.insert("generation".into(), 1.into());
        }
        body["apiVersion"] = Value::String(def.api_version(&def.storage_version));
        body["kind"] = Value::String(def.kind.clone());
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(body),
                warnings,
                created: true,
            });
        }
        let object = self.commit(target.key(&name), body, EventType::Added);
        if let Some(resource) = crd {
            self.serve_crd(&name, Some(resource));
        }
        Ok(Written {
            object,
            warnings,
            created: true,
        })
    }

    /// Server-set fields of built-in kinds on create; for a CRD, the resource it serves.
    fn prepare_builtin_create(
        &self,
        def: &ResourceDef,
        body: &mut Value,
    ) -> Result<Option<ResourceDef>, ApiError> {
        match (def.key.group.as_str(), def.key.plural.as_str()) {
            ("", "namespaces") => {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
                body["status"] = json!({"phase": "Active"});
                Ok(None)
            }
            ("", "secrets") => {
                if body
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .is_empty()
                {
                    body["type"] = "Opaque".into();
                }
                fold_string_data(body);
                Ok(None)
            }
            (APIEXTENSIONS, "customresourcedefinitions") => {
                let resource = resources::check_crd(body, None)?;
                let mut list = finalizers(body);
                if !list.iter().any(|f| f == CRD_CLEANUP_FINALIZER) {
                    list.push(CRD_CLEANUP_FINALIZER.to_owned());
                }
                metadata_mut(body).insert("finalizers".into(), json!(list));
                body["status"] = crd_status(body, &resource, None, Vec::new(), true);
                Ok(Some(resource))
            }
            _ => Ok(None),
        }
    }

    /// Replaces an object (PUT, or a merge or JSON patch), or only its status (`status` = the
    /// `/status` subresource).
    pub fn update(
        &mut self,
        target: &Target,
        name: &str,
        body: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.update_owned(target, name, body, status, opts, Ownership::Record)
    }

    fn update_owned(
        &mut self,
        target: &Target,
        name: &str,
        mut body: Value,
        status: bool,
        opts: &WriteOptions,
        ownership: Ownership,
    ) -> Result<Written, ApiError> {
        self.check_body(target, &mut body)?;
        let def = target.def.clone();
        let key = target.key(name);
        let old = self.get(target, name)?;
        let body_name = meta_str(&body, "name").unwrap_or_default();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta_str(&body, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(&def.key.group, &def.key.plural, name));
        }
        let has_status = def
            .version(&target.version)
            .is_some_and(|v| v.status_subresource);
        let old_view = present(&def, &target.version, &old);
        // A client may send managedFields to replace them; without, the stored ones carry on.
        let sent_entries = body
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .is_some_and(|entries| !entries.is_empty());
        let base_entries = managed::read_entries(if sent_entries { &body } else { &old });
        // `/status` takes only status from the body; the main resource keeps the old one.
        let mut new = if status {
            let mut new = old_view.clone();
            copy_status(body.get("status"), &mut new);
            new
        } else {
            if has_status {
                copy_status(old_view.get("status"), &mut body);
            }
            body
        };
        let old_meta = old_view.get("metadata").cloned().unwrap_or_default();
        let metadata = metadata_mut(&mut new);
        for system in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(system) {
                Some(v) => metadata.insert(system.into(), v.clone()),
                None => metadata.remove(system),
            };
        }
        metadata.remove("managedFields");
        metadata.remove("selfLink");
        metadata.insert(
            "resourceVersion".into(),
            old_meta.get("resourceVersion").cloned().unwrap_or_default(),
        );
        if is_deleting(&old) {
            let before = finalizers(&old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                // Go's `%#v` of a []string; a real server's two validators (object meta and
                // the resource's strategy) both report it, so the cause comes twice.
                let quoted: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
                let forbidden = || {
                    cause(
                        "FieldValueForbidden",
                        "metadata.finalizers",
                        format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                            quoted.join(", ")
                        ),
                    )
                };
                return Err(ApiError::invalid(
                    &def.key.group,
                    &def.kind,
                    name,
                    vec![forbidden(), forbidden()],
                ));
            }
        }
        let warnings = self.admit(target, &mut new, Some(&old_view), opts)?;
        let crd = self.prepare_builtin_update(&def, &mut new, &old_view, status)?;
        let entries = match ownership {
            Ownership::Record => managed::record_update(
                &target.trackable(&old_view, status),
                &target.trackable(&new, status),
                target.ownership_schema(),
                &base_entries,
                &opts.manager(target, Operation::Update, status),
                &now(),
            ),
            Ownership::Keep(entries) => entries,
        };
        managed::write_entries(&mut new, entries);
        if (def.custom || crd.is_some())
            && generation_view(&new, has_status) != generation_view(&old_view, has_status)
        {
            let generation = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            metadata_mut(&mut new).insert("generation".into(), (generation + 1).into());
        }
        new["apiVersion"] = Value::String(def.api_version(&def.storage_version));
        let finished = is_deleting(&new) && finalizers(&new).is_empty();
        if new == *old && !finished && !self.reencoded.contains(&key) {
            return Ok(Written {
                object: old,
                warnings,
                created: false,
            });
        }
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(new),
                warnings,
                created: false,
            });
        }
        let object = if finished {
            self.commit(key, new, EventType::Deleted)
        } else {
            self.commit(key, new, EventType::Modified)
        };
        if let Some(resource) = crd {
            self.serve_crd(name, (!finished).then_some(resource));
        }
        self.settle();
        Ok(Written {
            object,
            warnings,
            created: false,
        })
    }

    /// Server-side apply (`application/apply-patch+yaml`): merges `config` into the object,
    /// creating it when missing, with field ownership, conflicts and `force` as the API
    /// server has them (see [`managed`]).
    pub fn apply(
        &mut self,
        target: &Target,
        name: &str,
        mut config: Value,
        status: bool,
        opts: &WriteOptions,
        force: bool,
    ) -> Result<Written, ApiError> {
        self.check_body(target, &mut config)?;
        match meta_str(&config, "name") {
            None | Some("") => {
                metadata_mut(&mut config).insert("name".into(), name.into());
            }
            Some(other) if other != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({other}) does not match the name on the URL ({name})"
                )));
            }
            Some(_) => {}
        }
        let warnings = self.prune_applied(target, &mut config, opts)?;
        // What this endpoint may not change is not applied, and not owned.
        if target.has_status()
            && let Some(map) = config.as_object_mut()
        {
            if status {
                map.retain(|k, _| {
                    matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")
                });
            } else {
                map.remove("status");
            }
        }
        let live = match self.get(target, name) {
            Ok(object) => Some(present(&target.def, &target.version, &object)),
            Err(e) if e.code == 404 && !status => None,
            Err(e) => return Err(e),
        };
        let entries = live.as_ref().map(managed::read_entries).unwrap_or_default();
        let applied = managed::apply(
            live.as_ref(),
            &config,
            target.ownership_schema(),
            &entries,
            &opts.manager(target, Operation::Apply, status),
            force,
            &|v: &Value| target.trackable(v, status),
            &now(),
        )
        .map_err(|conflicts| ApiError::apply_conflict(&conflicts))?;
        // Unknown fields were dealt with above.
        let inner = WriteOptions {
            field_validation: FieldValidation::Ignore,
            ..opts.clone()
        };
        let ownership = Ownership::Keep(applied.entries);
        let mut written = match live {
            None => self.create_owned(target, applied.object, &inner, ownership)?,
            Some(_) => {
                self.update_owned(target, name, applied.object, status, &inner, ownership)?
            }
        };
        written.warnings.extend(warnings);
        Ok(written)
    }

    /// Drops fields the schema does not know from an applied configuration, as
    /// `fieldValidation` says, before they could be owned.
    fn prune_applied(
        &self,
        target: &Target,
        config: &mut Value,
        opts: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        let Some(schema) = target.version_def().and_then(|v| v.schema.as_ref()) else {
            return Ok(Vec::new());
        };
        let unknown = structural::prune(config, schema);
        match opts.field_validation {
            FieldValidation::Strict if !unknown.is_empty() => {
                let listed: Vec<String> = unknown
                    .iter()
                    .map(|f| format!(".{f}: field not declared in schema"))
                    .collect();
                Err(ApiError::bad_request(listed.join(", ")))
            }
            FieldValidation::Warn => Ok(unknown
                .iter()
                .map(|f| format!("unknown field {f:?}"))
                .collect()),
            _ => Ok(Vec::new()),
        }
    }

    fn prepare_builtin_update(
        &self,
        def: &ResourceDef,
        new: &mut Value,
        old: &Value,
        status: bool,
    ) -> Result<Option<ResourceDef>, ApiError> {
        if def.key.group.is_empty() && def.key.plural == "secrets" {
            fold_string_data(new);
        }
        if def.key.group == APIEXTENSIONS && def.key.plural == "customresourcedefinitions" {
            let resource = resources::check_crd(new, Some(old))?;
            // Through /status the client's storedVersions stand unchecked (how a storage
            // migration ends); an update of the CRD keeps the old ones, adds the storage
            // version, and refuses to drop a version still stored.
            let stored = resources::strings(new.pointer("/status/storedVersions"));
            if !status {
                check_stored_versions(new, &stored)?;
            }
            new["status"] = crd_status(new, &resource, Some(old), stored, !status);
            return Ok(Some(resource));
        }
        Ok(None)
    }

    /// Deletes an object: gracefully (deletionTimestamp set, object kept) while it has
    /// finalizers or is deleted in the foreground, at once otherwise. Namespaces and CRDs
    /// take their content with them.
    pub fn delete(
        &mut self,
        target: &Target,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deletion, ApiError> {
        let def = target.def.clone();
        let old = self.get(target, name)?;
        check_preconditions(&def, name, &old, opts)?;
        let is_namespace = def.key == namespace_key();
        if is_namespace && INITIAL_NAMESPACES[..3].contains(&name) {
            return Err(ApiError::forbidden(
                "",
                "namespaces",
                name,
                "this namespace may not be deleted",
            ));
        }
        let foreground = opts.propagation == Propagation::Foreground;
        let graceful = !finalizers(&old).is_empty() || is_namespace || foreground;
        if opts.dry_run {
            // The API server runs the marking update dry, and answers what it would store.
            return Ok(if graceful {
                Deletion::Pending(
                    marked_for_deletion(&target.def, &old, foreground).map_or(old, Arc::new),
                )
            } else {
                Deletion::Gone(old)
            });
        }
        if opts.propagation == Propagation::Orphan
            && let Some(uid) = meta_str(&old, "uid")
        {
            self.orphaning.insert(uid.to_owned());
        }
        let deletion = if !graceful {
            Deletion::Gone(self.commit(target.key(name), (*old).clone(), EventType::Deleted))
        } else {
            Deletion::Pending(self.mark_deleting(target, name, &old, foreground))
        };
        if is_namespace {
            self.empty_namespace(name);
        }
        if def.key == crd_key()
            && let Some(resource) = self.crds.get(name).cloned()
        {
            self.delete_all(&resource.key, None);
        }
        self.settle();
        Ok(deletion)
    }

    /// Sets deletionTimestamp (once) and, for a foreground deletion, its finalizer.
    fn mark_deleting(
        &mut self,
        target: &Target,
        name: &str,
        old: &Arc<Value>,
        foreground: bool,
    ) -> Arc<Value> {
        if foreground {
            self.foreground.insert(target.key(name));
        }
        match marked_for_deletion(&target.def, old, foreground) {
            Some(marked) => self.commit(target.key(name), marked, EventType::Modified),
            None => old.clone(),
        }
    }

    /// The garbage collector's part in foreground deletion, run by the server's collector
    /// task (not inside the DELETE, as in a real cluster): delete the dependents of every
    /// object deleted in the foreground, and let the object go once none of its blocking
    /// dependents (`blockOwnerDeletion: true`) is left. Returns whether anything changed.
    pub fn collect_foreground(&mut self) -> bool {
        // Forget objects that went, or lost the finalizer some other way.
        let objects = &self.objects;
        self.foreground.retain(|key| {
            objects.get(key).is_some_and(|o| {
                is_deleting(o) && finalizers(o).iter().any(|f| f == FOREGROUND_FINALIZER)
            })
        });
        let owners: Vec<(ObjKey, String)> = self
            .foreground
            .iter()
            .filter_map(|k| Some((k.clone(), meta_str(self.objects.get(k)?, "uid")?.to_owned())))
            .collect();
        let mut changed = false;
        for (key, uid) in owners {
            let dependents: Vec<(ObjKey, bool, bool)> = self
                .objects
                .iter()
                .filter_map(|(k, o)| {
                    let reference = owner_reference(o, &uid)?;
                    let blocking = reference.get("blockOwnerDeletion") == Some(&Value::Bool(true));
                    Some((k.clone(), blocking, is_deleting(o)))
                })
                .collect();
            for (dependent, _, deleting) in &dependents {
                if !deleting {
                    changed |= self.delete_by_key(dependent, Propagation::Foreground);
                }
            }
            let blocked = dependents
                .iter()
                .any(|(k, blocking, _)| *blocking && self.objects.contains_key(k));
            if !blocked {
                changed |= self.drop_finalizer(&key, FOREGROUND_FINALIZER);
            }
        }
        if changed {
            self.settle();
        }
        changed
    }

    fn delete_by_key(&mut self, key: &ObjKey, propagation: Propagation) -> bool {
        let Some(def) = self.registry.by_key(&key.0) else {
            return false;
        };
        let target = Target {
            version: def.storage_version.clone(),
            def,
            namespace: key.1.clone(),
            asked: None,
        };
        let opts = DeleteOptions {
            propagation,
            ..DeleteOptions::default()
        };
        self.delete(&target, &key.2, &opts).is_ok()
    }

    /// Removes one finalizer, finishing the deletion when it was the last.
    fn drop_finalizer(&mut self, key: &ObjKey, finalizer: &str) -> bool {
        let Some(object) = self.objects.get(key) else {
            return false;
        };
        let mut updated = (**object).clone();
        let remaining: Vec<String> = finalizers(&updated)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        let done = remaining.is_empty() && is_deleting(&updated);
        let metadata = metadata_mut(&mut updated);
        if remaining.is_empty() {
            metadata.remove("finalizers");
        } else {
            metadata.insert("finalizers".into(), json!(remaining));
        }
        let kind = if done {
            EventType::Deleted
        } else {
            EventType::Modified
        };
        self.commit(key.clone(), updated, kind);
        true
    }

    /// Deletes every object matching `filter` (DELETE on a collection).
    pub fn delete_collection(
        &mut self,
        target: &Target,
        namespace: Option<&str>,
        filter: &dyn Fn(&Value) -> bool,
        opts: &DeleteOptions,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let names: Vec<(String, String)> = self
            .objects_of(&target.def.key, namespace)
            .filter(|o| filter(o))
            .map(|o| {
                (
                    meta_str(o, "namespace").unwrap_or_default().to_owned(),
                    meta_str(o, "name").unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let mut deleted = Vec::new();
        for (ns, name) in names {
            let at = Target {
                namespace: ns,
                ..target.clone()
            };
            match self.delete(&at, &name, opts) {
                Ok(deletion) => deleted.push(deletion.object()),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    fn delete_all(&mut self, key: &ResourceKey, namespace: Option<&str>) {
        let Some(def) = self.registry.by_key(key) else {
            return;
        };
        let victims: Vec<(String, String)> = self
            .objects_of(key, namespace)
            .filter(|o| !is_deleting(o))
            .map(|o| {
                (
                    meta_str(o, "namespace").unwrap_or_default().to_owned(),
                    meta_str(o, "name").unwrap_or_default().to_owned(),
                )
            })
            .collect();
        for (ns, name) in victims {
            let target = Target {
                def: def.clone(),
                version: def.storage_version.clone(),
                namespace: ns,
                asked: None,
            };
            // The object may already be gone through an earlier cascade.
            let _ = self.delete(&target, &name, &DeleteOptions::default());
        }
    }

    fn empty_namespace(&mut self, namespace: &str) {
        let namespaced: Vec<ResourceKey> = self
            .registry
            .all
            .iter()
            .filter(|r| r.namespaced)
            .map(|r| r.key.clone())
            .collect();
        for key in namespaced {
            self.delete_all(&key, Some(namespace));
        }
    }

    /// Follow-ups of removals, until nothing changes: garbage-collect dependents whose
    /// owners are all gone, finish terminating namespaces and CRDs that are now empty.
    fn settle(&mut self) {
        loop {
            let removed = std::mem::take(&mut self.removed);
            let mut progressed = !removed.is_empty();
            for object in &removed {
                self.collect_dependents(object);
            }
            progressed |= self.finish_namespaces();
            progressed |= self.finish_crds();
            if !progressed && self.removed.is_empty() {
                break;
            }
        }
    }

    fn collect_dependents(&mut self, owner: &Value) {
        let Some(uid) = meta_str(owner, "uid") else {
            return;
        };
        if self.orphaning.remove(uid) {
            return;
        }
        let orphans: Vec<ObjKey> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                let owners = owner_uids(o);
                owners.iter().any(|u| u == uid) && owners.iter().all(|u| !self.uids.contains_key(u))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (key, namespace, name) in orphans {
            if let Some(def) = self.registry.by_key(&key) {
                let target = Target {
                    version: def.storage_version.clone(),
                    def,
                    namespace,
                    asked: None,
                };
                let _ = self.delete(&target, &name, &DeleteOptions::default());
            }
        }
    }

    fn finish_namespaces(&mut self) -> bool {
        let done: Vec<(ObjKey, Value)> = self
            .objects_of(&namespace_key(), None)
            .filter(|ns| is_deleting(ns) && finalizers(ns).is_empty())
            .filter(|ns| {
                let name = meta_str(ns, "name").unwrap_or_default();
                !self.objects.keys().any(|(_, n, _)| n == name)
            })
            .map(|ns| {
                let name = meta_str(ns, "name").unwrap_or_default().to_owned();
                ((namespace_key(), String::new(), name), (**ns).clone())
            })
            .collect();
        let progressed = !done.is_empty();
        for (key, ns) in done {
            self.commit(key, ns, EventType::Deleted);
        }
        progressed
    }

    fn finish_crds(&mut self) -> bool {
        let done: Vec<(String, Value)> = self
            .objects_of(&crd_key(), None)
            .filter(|crd| is_deleting(crd))
            .filter(|crd| finalizers(crd).iter().any(|f| f == CRD_CLEANUP_FINALIZER))
            .filter_map(|crd| {
                let name = meta_str(crd, "name")?.to_owned();
                let served = self.crds.get(&name)?;
                let empty = self.objects_of(&served.key, None).next().is_none();
                empty.then(|| (name, (**crd).clone()))
            })
            .collect();
        let progressed = !done.is_empty();
        for (name, mut crd) in done {
            let remaining: Vec<String> = finalizers(&crd)
                .into_iter()
                .filter(|f| f != CRD_CLEANUP_FINALIZER)
                .collect();
            metadata_mut(&mut crd).insert("finalizers".into(), json!(remaining));
            let key = (crd_key(), String::new(), name.clone());
            if remaining.is_empty() {
                self.commit(key, crd, EventType::Deleted);
                self.serve_crd(&name, None);
            } else {
                self.commit(key, crd, EventType::Modified);
            }
        }
        progressed
    }

    /// Starts, changes or stops serving the resource of a CRD. Objects of a resource that
    /// stops being served are dropped.
    fn serve_crd(&mut self, crd_name: &str, resource: Option<ResourceDef>) {
        match resource {
            Some(resource) => {
                self.served_since
                    .entry(resource.key.clone())
                    .or_insert(self.rv);
                self.crds.insert(crd_name.to_owned(), Arc::new(resource));
            }
            None => {
                if let Some(old) = self.crds.remove(crd_name) {
                    self.objects.retain(|(k, _, _), _| k != &old.key);
                    self.served_since.remove(&old.key);
                }
            }
        }
        self.registry = Arc::new(Registry::new(self.crds.values().cloned()));
    }
}

/// `preconditions` of a delete: the object must still be the one the client saw. The API
/// server checks them before the deletion itself and names the object by its kind there.
/// A Secret's `stringData` is write-only: the API server folds it into `data` (base64, over
/// any key of the same name) and never stores it.
fn fold_string_data(secret: &mut Value) {
    use base64::Engine as _;
    let Some(Value::Object(strings)) = secret.as_object_mut().and_then(|o| o.remove("stringData"))
    else {
        return;
    };
    if !secret.get("data").is_some_and(Value::is_object) {
        secret["data"] = json!({});
    }
    for (key, value) in strings {
        let text = value.as_str().unwrap_or_default();
        secret["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

fn check_preconditions(
    def: &ResourceDef,
    name: &str,
    current: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let fail = |why: String| ApiError::precondition_failed(&def.key.group, &def.kind, name, &why);
    let uid = meta_str(current, "uid").unwrap_or_default();
    if let Some(wanted) = &opts.uid
        && wanted != uid
    {
        return Err(fail(format!(
            "the UID in the precondition ({wanted}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
        )));
    }
    let rv = meta_str(current, "resourceVersion").unwrap_or_default();
    if let Some(wanted) = &opts.resource_version
        && wanted != rv
    {
        return Err(fail(format!(
            "the ResourceVersion in the precondition ({wanted}) does not match the ResourceVersion in record ({rv}). The object might have been modified"
        )));
    }
    Ok(())
}

/// Makes `to`'s status `status`, or removes it when there is none.
fn copy_status(status: Option<&Value>, to: &mut Value) {
    match (status, to.as_object_mut()) {
        (Some(s), _) => to["status"] = s.clone(),
        (None, Some(map)) => {
            map.remove("status");
        }
        (None, None) => {}
    }
}

fn namespace_key() -> ResourceKey {
    ResourceKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn crd_key() -> ResourceKey {
    ResourceKey {
        group: APIEXTENSIONS.into(),
        plural: "customresourcedefinitions".into(),
    }
}

fn set_condition(object: &mut Value, type_: &str, status: &str, reason: &str) {
    let mut conditions: Vec<Value> = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some(type_));
    conditions.push(json!({"type": type_, "status": status, "reason": reason,
                           "message": "", "lastTransitionTime": now()}));
    if !object.get("status").is_some_and(Value::is_object) {
        object["status"] = json!({});
    }
    object["status"]["conditions"] = Value::Array(conditions);
}

/// A CRD's status as the apiextensions server keeps it: names accepted, established, and
/// every version ever used for storage.
fn crd_status(
    crd: &Value,
    resource: &ResourceDef,
    old: Option<&Value>,
    mut stored: Vec<String>,
    add_storage_version: bool,
) -> Value {
    if add_storage_version && !stored.contains(&resource.storage_version) {
        stored.push(resource.storage_version.clone());
    }
    let mut names = crd.pointer("/spec/names").cloned().unwrap_or_default();
    names["singular"] = resource.singular.clone().into();
    names["listKind"] = resource.list_kind.clone().into();
    let kept = old
        .and_then(|o| o.pointer("/status/conditions"))
        .cloned()
        .filter(|c| c.is_array());
    let mut status = json!({"acceptedNames": names, "storedVersions": stored});
    match kept {
        Some(conditions) => status["conditions"] = conditions,
        None => {
            let mut holder = json!({"status": status});
            set_condition(&mut holder, "NamesAccepted", "True", "NoConflicts");
            set_condition(&mut holder, "Established", "True", "InitialNamesAccepted");
            status = holder["status"].take();
        }
    }
    status
}

/// apiextensions' `ValidateCustomResourceDefinitionStoredVersions` on an update: a version
/// objects may still be stored in cannot leave `spec.versions`.
fn check_stored_versions(crd: &Value, stored: &[String]) -> Result<(), ApiError> {
    let declared: Vec<&str> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    let causes: Vec<Cause> = stored
        .iter()
        .enumerate()
        .filter(|(_, v)| !declared.contains(&v.as_str()))
        .map(|(i, v)| {
            cause(
                "FieldValueInvalid",
                &format!("status.storedVersions[{i}]"),
                format!(
                    "Invalid value: {v:?}: missing from spec.versions; {v} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {v} and removes {v} from status.storedVersions"
                ),
            )
        })
        .collect();
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        APIEXTENSIONS,
        "CustomResourceDefinition",
        meta_str(crd, "name").unwrap_or_default(),
        causes,
    ))
}

fn encode_continue(id: u64, offset: usize) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"snapshot": id, "offset": offset}).to_string())
}

fn decode_continue(token: &str) -> Result<(u64, usize), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let id = value
        .get("snapshot")
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    let offset = value
        .get("offset")
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    Ok((id, usize::try_from(offset).map_err(|_| bad())?))
}
