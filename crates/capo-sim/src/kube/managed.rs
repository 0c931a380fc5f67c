//! Field ownership (`metadata.managedFields`) and server-side apply, the way
//! kube-apiserver's structured-merge-diff does them, on JSON and the CRD schema:
//!
//! - every write records which fields its manager set: an *Update* manager (PUT, merge or
//!   JSON patch) owns what it changed, an *Apply* manager owns exactly what it applied;
//! - an apply that would change a field another manager owns is refused with 409 Conflict
//!   naming the manager and the field, unless `force=true` takes the field over;
//! - a field an applier stops applying is removed, unless another manager still owns it;
//! - lists follow their `x-kubernetes-list-type`: `atomic` lists are owned whole, `set`
//!   items by value, `map` items by key.
//!
//! Not modelled: version conversion of field sets (our CRDs serve one schema per version),
//! the cap of ten Update managers, and `x-kubernetes-map-type: atomic` on metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use serde_json::{Map, Value, json};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// An object field or a map key.
    Field(String),
    /// A `map` list item, by its key fields (canonical JSON object, keys sorted).
    Key(String),
    /// A `set` list item, by its value (JSON).
    Value(String),
}

/// A path from the object's root.
pub type Path = Vec<Step>;
/// The fields a manager owns.
pub type FieldSet = BTreeSet<Path>;

/// `Apply` or `Update`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The manager's name.
    pub manager: String,
    /// How it wrote.
    pub operation: Operation,
    /// The API version it wrote with.
    pub api_version: String,
    /// When its set last changed (RFC 3339).
    pub time: String,
    /// `status` for writes to the status subresource.
    pub subresource: Option<String>,
    /// What it owns.
    pub fields: FieldSet,
}

impl Entry {
    /// Entries with the same identity are the same manager (appliers whatever their
    /// version, as the API server has it).
    fn same_manager(&self, other: &Self) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    /// How a conflict names the manager: `"a"`, or `"a" using v1 at <time>` for an updater.
    fn display(&self) -> String {
        match self.operation {
            Operation::Apply => format!("{:?}", self.manager),
            Operation::Update => format!(
                "{:?} using {} at {}",
                self.manager, self.api_version, self.time
            ),
        }
    }
}

/// Which writer a request is, and through which endpoint.
#[derive(Clone, Debug)]
pub struct Manager {
    /// `fieldManager`, or what the API server derives from the User-Agent.
    pub name: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The request's group/version.
    pub api_version: String,
    /// `status` for the status subresource.
    pub subresource: Option<String>,
}

impl Manager {
    fn entry(&self, fields: FieldSet, time: &str) -> Entry {
        Entry {
            manager: self.name.clone(),
            operation: self.operation,
            api_version: self.api_version.clone(),
            time: time.to_owned(),
            subresource: self.subresource.clone(),
            fields,
        }
    }
}

/// An apply that would change fields other managers own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflicts(pub Vec<(String, String)>);

impl Conflicts {
    /// kube-apiserver's message: `Apply failed with 1 conflict: conflict with "a": .spec.size`.
    pub fn message(&self) -> String {
        if let [(manager, path)] = self.0.as_slice() {
            return format!("Apply failed with 1 conflict: conflict with {manager}: {path}");
        }
        let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (manager, path) in &self.0 {
            by_manager.entry(manager).or_default().push(path);
        }
        let mut parts: Vec<String> = by_manager
            .iter()
            .map(|(manager, paths)| format!("conflicts with {manager}:\n- {}", paths.join("\n- ")))
            .collect();
        parts.sort();
        format!(
            "Apply failed with {} conflicts: {}",
            self.0.len(),
            parts.join("\n")
        )
    }
}

// ---------------------------------------------------------------------------------------
// Schema navigation

/// What the server tracks of `metadata`.
static METADATA_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    json!({"type": "object", "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uid"], "items": {"type": "object", "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"},
                "uid": {"type": "string"}, "controller": {"type": "boolean"},
                "blockOwnerDeletion": {"type": "boolean"}}}},
        "generateName": {"type": "string"}}})
});

/// Metadata fields the server never tracks (it sets or owns them itself).
const TRACKED_METADATA: [&str; 5] = [
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "generateName",
];

#[derive(Clone, Copy)]
struct Schema<'a>(Option<&'a Value>);

enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

impl<'a> Schema<'a> {
    fn declares(self, name: &str) -> bool {
        self.0
            .and_then(|s| s.get("properties"))
            .is_some_and(|p| p.get(name).is_some())
    }

    fn child(self, name: &str) -> Schema<'a> {
        let Some(schema) = self.0 else {
            return Schema(None);
        };
        if let Some(field) = schema.get("properties").and_then(|p| p.get(name)) {
            return Schema(Some(field));
        }
        Schema(schema.get("additionalProperties").filter(|a| a.is_object()))
    }

    fn items(self) -> Schema<'a> {
        Schema(self.0.and_then(|s| s.get("items")))
    }

    fn atomic_map(self) -> bool {
        self.0
            .and_then(|s| s.get("x-kubernetes-map-type"))
            .and_then(Value::as_str)
            == Some("atomic")
    }

    fn list_kind(self) -> ListKind {
        let schema = self.0.unwrap_or(&Value::Null);
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListKind::Set,
            Some("map") => ListKind::Map(
                schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| {
                        k.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            // CRD lists without a list type, and lists of unknown schema, are atomic.
            _ => ListKind::Atomic,
        }
    }
}

/// The schema ownership is computed against: the resource's, with the server's own for
/// metadata.
pub fn tracking_schema(resource_schema: Option<&Value>) -> Value {
    let mut root = resource_schema
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    if !root.get("properties").is_some_and(Value::is_object) {
        root["properties"] = json!({});
    }
    root["properties"]["metadata"] = METADATA_SCHEMA.clone();
    root
}

/// The part of an object ownership is about: no `apiVersion`, `kind` or server-set
/// metadata; for a resource with a status subresource, only `status` through `/status`
/// and everything but `status` through the main resource.
pub fn trackable(object: &Value, status_subresource: bool, via_status: bool) -> Value {
    let mut view = object.clone();
    let Some(map) = view.as_object_mut() else {
        return Value::Object(Map::new());
    };
    map.remove("apiVersion");
    map.remove("kind");
    if let Some(Value::Object(metadata)) = map.get_mut("metadata") {
        metadata.retain(|k, _| TRACKED_METADATA.contains(&k.as_str()));
        if metadata.is_empty() {
            map.remove("metadata");
        }
    }
    if status_subresource {
        if via_status {
            map.retain(|k, _| k == "status");
        } else {
            map.remove("status");
        }
    }
    view
}

// ---------------------------------------------------------------------------------------
// Paths and field sets

fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, String> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let parts: Vec<String> = sorted
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::String((*k).clone())))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn item_key(item: &Value, keys: &[String]) -> Step {
    let mut fields = Map::new();
    for key in keys {
        if let Some(v) = item.get(key) {
            fields.insert(key.clone(), v.clone());
        }
    }
    Step::Key(canonical(&Value::Object(fields)))
}

fn child_path(path: &Path, step: Step) -> Path {
    let mut p = path.clone();
    p.push(step);
    p
}

/// The fields an applied configuration sets (structured-merge-diff's `ToFieldSet`): leaf
/// values, atomic lists, list items, map entries, and object fields set to null or `{}`.
pub fn applied_fields(config: &Value, schema: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    applied_into(config, Schema(Some(schema)), &Path::new(), &mut set);
    set
}

fn applied_into(value: &Value, schema: Schema<'_>, path: &Path, set: &mut FieldSet) {
    match value {
        Value::Object(map) if !schema.atomic_map() => {
            for (key, child) in map {
                let p = child_path(path, Step::Field(key.clone()));
                applied_into(child, schema.child(key), &p, set);
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !schema.declares(key) {
                    set.insert(p);
                }
            }
        }
        Value::Array(items) => match schema.list_kind() {
            ListKind::Atomic => {
                set.insert(path.clone());
            }
            ListKind::Set => {
                for item in items {
                    set.insert(child_path(path, Step::Value(canonical(item))));
                }
            }
            ListKind::Map(keys) => {
                for item in items {
                    let p = child_path(path, item_key(item, &keys));
                    applied_into(item, schema.items(), &p, set);
                    set.insert(p);
                }
            }
        },
        _ => {
            set.insert(path.clone());
        }
    }
}

/// Every node of an object below the root, with its value.
fn nodes<'v>(
    value: &'v Value,
    schema: Schema<'_>,
    path: &Path,
    out: &mut BTreeMap<Path, &'v Value>,
) {
    match value {
        Value::Object(map) if !schema.atomic_map() => {
            for (key, child) in map {
                let p = child_path(path, Step::Field(key.clone()));
                out.insert(p.clone(), child);
                nodes(child, schema.child(key), &p, out);
            }
        }
        Value::Array(items) => match schema.list_kind() {
            ListKind::Atomic => {}
            ListKind::Set => {
                for item in items {
                    out.insert(child_path(path, Step::Value(canonical(item))), item);
                }
            }
            ListKind::Map(keys) => {
                for item in items {
                    let p = child_path(path, item_key(item, &keys));
                    out.insert(p.clone(), item);
                    nodes(item, schema.items(), &p, out);
                }
            }
        },
        _ => {}
    }
}

/// Whether a node's value is compared as a whole (it has no tracked children).
fn is_leaf(value: &Value, schema: Schema<'_>) -> bool {
    match value {
        Value::Object(map) => map.is_empty() || schema.atomic_map(),
        Value::Array(_) => matches!(schema.list_kind(), ListKind::Atomic),
        _ => true,
    }
}

/// What changed between two states: (modified, added, removed).
fn compare(old: &Value, new: &Value, schema: &Value) -> (FieldSet, FieldSet, FieldSet) {
    let schema_of = |path: &Path| {
        let mut s = Schema(Some(schema));
        for step in path {
            s = match step {
                Step::Field(name) => s.child(name),
                Step::Key(_) | Step::Value(_) => s.items(),
            };
        }
        s
    };
    let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
    nodes(old, Schema(Some(schema)), &Path::new(), &mut before);
    nodes(new, Schema(Some(schema)), &Path::new(), &mut after);
    let mut modified = FieldSet::new();
    let mut added = FieldSet::new();
    for (path, value) in &after {
        match before.get(path) {
            None => {
                added.insert(path.clone());
            }
            Some(old_value) => {
                let s = schema_of(path);
                let leaf_changed =
                    (is_leaf(value, s) || is_leaf(old_value, s)) && old_value != value;
                if leaf_changed {
                    modified.insert(path.clone());
                }
            }
        }
    }
    let removed = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .cloned()
        .collect();
    (modified, added, removed)
}

// ---------------------------------------------------------------------------------------
// Merging and removing

/// The applied configuration merged into the live object: objects and maps field by field,
/// `map` lists item by key, `set` lists by value, anything else replaced.
pub fn merge(live: &Value, config: &Value, schema: &Value) -> Value {
    merge_at(live, config, Schema(Some(schema)))
}

fn merge_at(live: &Value, config: &Value, schema: Schema<'_>) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !schema.atomic_map() => {
            let mut out = l.clone();
            for (key, value) in c {
                let merged = match l.get(key) {
                    Some(existing) => merge_at(existing, value, schema.child(key)),
                    None => value.clone(),
                };
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(c)) => match schema.list_kind() {
            ListKind::Atomic => config.clone(),
            ListKind::Set => {
                let mut out = l.clone();
                for item in c {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            ListKind::Map(keys) => {
                let mut out = l.clone();
                for item in c {
                    let key = item_key(item, &keys);
                    match out.iter_mut().find(|i| item_key(i, &keys) == key) {
                        Some(existing) => *existing = merge_at(existing, item, schema.items()),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
        },
        _ => config.clone(),
    }
}

/// Removes the node at `path`, if present.
fn remove_path(value: &mut Value, path: &[Step], schema: Schema<'_>) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match (first, value) {
        (Step::Field(name), Value::Object(map)) => {
            if rest.is_empty() {
                map.remove(name);
            } else if let Some(child) = map.get_mut(name) {
                remove_path(child, rest, schema.child(name));
            }
        }
        (step @ (Step::Key(_) | Step::Value(_)), Value::Array(items)) => {
            let keys = match schema.list_kind() {
                ListKind::Map(keys) => keys,
                _ => Vec::new(),
            };
            let matches = |item: &Value| match step {
                Step::Key(_) => &item_key(item, &keys) == step,
                _ => &Step::Value(canonical(item)) == step,
            };
            if rest.is_empty() {
                items.retain(|i| !matches(i));
            } else if let Some(item) = items.iter_mut().find(|i| matches(i)) {
                remove_path(item, rest, schema.items());
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// managedFields in and out

fn step_from_v1(key: &str) -> Option<Step> {
    let (kind, rest) = key.split_once(':')?;
    match kind {
        "f" => Some(Step::Field(rest.to_owned())),
        "k" => serde_json::from_str::<Value>(rest)
            .ok()
            .map(|v| Step::Key(canonical(&v))),
        "v" => serde_json::from_str::<Value>(rest)
            .ok()
            .map(|v| Step::Value(canonical(&v))),
        _ => None,
    }
}

fn step_to_v1(step: &Step) -> String {
    match step {
        Step::Field(name) => format!("f:{name}"),
        Step::Key(key) => format!("k:{key}"),
        Step::Value(value) => format!("v:{value}"),
    }
}

/// How a conflict names a path: `.spec.ports[name="a"].port`, `.metadata.finalizers[="x"]`.
pub fn display_path(path: &Path) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Step::Key(key) => {
                let fields: Vec<String> = serde_json::from_str::<Map<String, Value>>(key)
                    .unwrap_or_default()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                out.push_str(&format!("[{}]", fields.join(",")));
            }
            Step::Value(value) => out.push_str(&format!("[={value}]")),
        }
    }
    out
}

/// A field set in the API's `FieldsV1` form.
pub fn fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn render(node: &Node) -> Value {
        let mut map = Map::new();
        if node.member && !node.children.is_empty() {
            map.insert(".".into(), json!({}));
        }
        for (key, child) in &node.children {
            map.insert(key.clone(), render(child));
        }
        Value::Object(map)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for step in path {
            node = node.children.entry(step_to_v1(step)).or_default();
        }
        node.member = true;
    }
    // As the API server's field manager strips it (`stripmeta.go`): `metadata` itself is never
    // a member of a set, only the fields under it (recorded from a v1.35 server).
    if let Some(metadata) = root.children.get_mut("f:metadata") {
        metadata.member = false;
    }
    render(&root)
}

fn parse_fields_v1(value: &Value, path: &Path, set: &mut FieldSet) {
    let Some(map) = value.as_object() else {
        return;
    };
    for (key, child) in map {
        if key == "." {
            set.insert(path.clone());
            continue;
        }
        let Some(step) = step_from_v1(key) else {
            continue;
        };
        let p = child_path(path, step);
        if child.as_object().is_some_and(Map::is_empty) {
            set.insert(p.clone());
        }
        parse_fields_v1(child, &p, set);
    }
}

/// The entries recorded on an object.
pub fn read_entries(object: &Value) -> Vec<Entry> {
    let Some(entries) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
            let operation = match text("operation")?.as_str() {
                "Apply" => Operation::Apply,
                _ => Operation::Update,
            };
            let mut fields = FieldSet::new();
            parse_fields_v1(
                e.get("fieldsV1").unwrap_or(&Value::Null),
                &Path::new(),
                &mut fields,
            );
            Some(Entry {
                manager: text("manager").unwrap_or_default(),
                operation,
                api_version: text("apiVersion").unwrap_or_default(),
                time: text("time").unwrap_or_default(),
                subresource: text("subresource"),
                fields,
            })
        })
        .collect()
}

/// Writes entries into `metadata.managedFields`, sorted as the API server sorts them.
pub fn write_entries(object: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| {
        a.operation
            .cmp(&b.operation)
            .then_with(|| a.time.cmp(&b.time))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    let rendered: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = json!({"manager": e.manager, "operation": e.operation.as_str(),
                "apiVersion": e.api_version, "time": e.time, "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(&e.fields)});
            if let Some(sub) = &e.subresource {
                v["subresource"] = json!(sub);
            }
            v
        })
        .collect();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if rendered.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".into(), Value::Array(rendered));
        }
    }
}

/// Keeps an entry's old time when its fields did not change, so that a write that changes
/// nothing stays a no-op.
fn keep_times(new: &mut [Entry], old: &[Entry]) {
    for entry in new {
        if let Some(before) = old
            .iter()
            .find(|o| o.same_manager(entry) && o.fields == entry.fields)
        {
            entry.time.clone_from(&before.time);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The two operations

/// Ownership after an ordinary write (create, PUT, merge or JSON patch): the writer owns
/// what it changed, others lose it, and removed fields are owned by nobody.
pub fn record_update(
    old: &Value,
    new: &Value,
    schema: &Value,
    entries: &[Entry],
    manager: &Manager,
    now: &str,
) -> Vec<Entry> {
    let (modified, added, removed) = compare(old, new, schema);
    let changed: FieldSet = modified.union(&added).cloned().collect();
    let me = manager.entry(FieldSet::new(), now);
    let mut out: Vec<Entry> = Vec::new();
    let mut mine = FieldSet::new();
    for entry in entries {
        if entry.same_manager(&me) {
            mine.clone_from(&entry.fields);
            continue;
        }
        let mut e = entry.clone();
        e.fields
            .retain(|p| !changed.contains(p) && !removed.contains(p));
        out.push(e);
    }
    mine.retain(|p| !removed.contains(p));
    mine.extend(changed);
    out.push(manager.entry(mine, now));
    keep_times(&mut out, entries);
    out
}

/// The outcome of an apply: the new object and its ownership.
#[derive(Debug)]
pub struct Applied {
    /// Live object with the configuration merged in and abandoned fields removed.
    pub object: Value,
    /// managedFields after the apply.
    pub entries: Vec<Entry>,
}

/// Server-side apply of `config` (already cut to what the endpoint may change) onto `live`
/// (None when the object does not exist yet). `live_view` and `config_view` are the
/// trackable parts ([`trackable`]); the merge happens on the whole objects.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    schema: &Value,
    entries: &[Entry],
    manager: &Manager,
    force: bool,
    view: &dyn Fn(&Value) -> Value,
    now: &str,
) -> Result<Applied, Conflicts> {
    let empty = json!({});
    let live_object = live.unwrap_or(&empty);
    let mut entries = entries.to_vec();
    if live.is_some() && entries.is_empty() {
        // An object nobody has managed yet: its present fields belong to a stand-in
        // manager, so that an apply conflicts with them like with any other writer.
        let stand_in = Manager {
            name: "before-first-apply".into(),
            operation: Operation::Update,
            ..manager.clone()
        };
        entries = record_update(&empty, &view(live_object), schema, &[], &stand_in, now);
    }
    let mut object = merge(live_object, config, schema);
    let mine = manager.entry(applied_fields(&view(config), schema), now);
    let last = entries
        .iter()
        .find(|e| e.same_manager(&mine))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    entries.retain(|e| !e.same_manager(&mine));
    entries.push(mine.clone());

    // Fields this manager applied before and no longer does, and nobody else owns.
    let owned: FieldSet = entries
        .iter()
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    for path in last.difference(&owned) {
        let still_owned_below = owned.iter().any(|o| o.starts_with(path));
        if !still_owned_below {
            remove_path(&mut object, path, Schema(Some(schema)));
        }
    }

    let (modified, added, removed) = compare(&view(live_object), &view(&object), schema);
    let changed: FieldSet = modified.union(&added).cloned().collect();
    let mut conflicts = Vec::new();
    for entry in entries.iter_mut().filter(|e| !e.same_manager(&mine)) {
        let taken: Vec<Path> = entry.fields.intersection(&changed).cloned().collect();
        if force {
            entry.fields.retain(|p| !changed.contains(p));
        } else {
            conflicts.extend(taken.iter().map(|p| (entry.display(), display_path(p))));
        }
    }
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts));
    }
    for entry in &mut entries {
        entry.fields.retain(|p| !removed.contains(p));
    }
    let old_entries = read_entries(live_object);
    keep_times(&mut entries, &old_entries);
    Ok(Applied { object, entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        tracking_schema(Some(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}}}})))
    }

    fn manager(name: &str, operation: Operation) -> Manager {
        Manager {
            name: name.into(),
            operation,
            api_version: "example.test/v1".into(),
            subresource: None,
        }
    }

    fn apply_as(
        live: Option<&Value>,
        config: Value,
        entries: &[Entry],
        who: &str,
        force: bool,
    ) -> Result<Applied, Conflicts> {
        apply(
            live,
            &config,
            &schema(),
            entries,
            &manager(who, Operation::Apply),
            force,
            &|v: &Value| trackable(v, true, false),
            "2026-01-01T00:00:00Z",
        )
    }

    #[test]
    fn an_applier_owns_what_it_applied_and_others_conflict() {
        let first = apply_as(None, json!({"spec": {"size": 1}}), &[], "a", false).unwrap();
        assert_eq!(
            fields_v1(&first.entries[0].fields),
            json!({"f:spec": {"f:size": {}}})
        );
        let conflict = apply_as(
            Some(&first.object),
            json!({"spec": {"size": 2}}),
            &first.entries,
            "b",
            false,
        )
        .unwrap_err();
        assert_eq!(
            conflict.message(),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.size"
        );
        // The same value is shared, not a conflict.
        let shared = apply_as(
            Some(&first.object),
            json!({"spec": {"size": 1}}),
            &first.entries,
            "b",
            false,
        )
        .unwrap();
        assert_eq!(shared.entries.len(), 2);
        let forced = apply_as(
            Some(&first.object),
            json!({"spec": {"size": 2}}),
            &first.entries,
            "b",
            true,
        )
        .unwrap();
        assert_eq!(forced.object["spec"]["size"], 2);
        let managers: Vec<&str> = forced
            .entries
            .iter()
            .filter(|e| !e.fields.is_empty())
            .map(|e| e.manager.as_str())
            .collect();
        assert_eq!(managers, ["b"]);
    }

    #[test]
    fn fields_an_applier_drops_are_removed_unless_someone_else_owns_them() {
        let first = apply_as(
            None,
            json!({"spec": {"size": 1, "tags": ["x"]}}),
            &[],
            "a",
            false,
        )
        .unwrap();
        let dropped = apply_as(
            Some(&first.object),
            json!({"spec": {"size": 1}}),
            &first.entries,
            "a",
            false,
        )
        .unwrap();
        assert_eq!(dropped.object["spec"], json!({"size": 1}));

        let shared = apply_as(
            Some(&first.object),
            json!({"spec": {"tags": ["x"]}}),
            &first.entries,
            "b",
            false,
        )
        .unwrap();
        let kept = apply_as(
            Some(&shared.object),
            json!({"spec": {"size": 1}}),
            &shared.entries,
            "a",
            false,
        )
        .unwrap();
        assert_eq!(kept.object["spec"]["tags"], json!(["x"]));
    }

    #[test]
    fn map_lists_merge_by_key_and_conflict_per_item_field() {
        let first = apply_as(
            None,
            json!({"spec": {"ports": [{"name": "http", "port": 80}]}}),
            &[],
            "a",
            false,
        )
        .unwrap();
        let second = apply_as(
            Some(&first.object),
            json!({"spec": {"ports": [{"name": "https", "port": 443}]}}),
            &first.entries,
            "b",
            false,
        )
        .unwrap();
        assert_eq!(second.object["spec"]["ports"].as_array().unwrap().len(), 2);
        let conflict = apply_as(
            Some(&second.object),
            json!({"spec": {"ports": [{"name": "http", "port": 8080}]}}),
            &second.entries,
            "b",
            false,
        )
        .unwrap_err();
        assert_eq!(
            conflict.0,
            vec![(
                "\"a\"".to_owned(),
                ".spec.ports[name=\"http\"].port".to_owned()
            )]
        );
    }

    #[test]
    fn an_update_takes_what_it_changed() {
        let old = json!({"spec": {"size": 1}});
        let created = record_update(
            &json!({}),
            &old,
            &schema(),
            &[],
            &manager("kubectl", Operation::Update),
            "t1",
        );
        assert_eq!(
            fields_v1(&created[0].fields),
            json!({"f:spec": {".": {}, "f:size": {}}})
        );
        let new = json!({"spec": {"size": 2, "tags": ["a"]}});
        let updated = record_update(
            &old,
            &new,
            &schema(),
            &created,
            &manager("editor", Operation::Update),
            "t2",
        );
        let editor = updated.iter().find(|e| e.manager == "editor").unwrap();
        assert_eq!(
            fields_v1(&editor.fields),
            json!({"f:spec": {"f:size": {}, "f:tags": {}}})
        );
        let kubectl = updated.iter().find(|e| e.manager == "kubectl").unwrap();
        assert_eq!(fields_v1(&kubectl.fields), json!({"f:spec": {}}));
    }

    #[test]
    fn managed_fields_round_trip() {
        let mut set = FieldSet::new();
        set.insert(vec![Step::Field("spec".into())]);
        set.insert(vec![Step::Field("spec".into()), Step::Field("size".into())]);
        set.insert(vec![
            Step::Field("metadata".into()),
            Step::Field("finalizers".into()),
            Step::Value("\"x\"".into()),
        ]);
        let entry = Entry {
            manager: "m".into(),
            operation: Operation::Update,
            api_version: "v1".into(),
            time: "t".into(),
            subresource: None,
            fields: set.clone(),
        };
        let mut object = json!({"metadata": {}});
        write_entries(&mut object, vec![entry.clone()]);
        assert_eq!(read_entries(&object), vec![entry]);
    }
}
