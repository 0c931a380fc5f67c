//! What the simulated server serves: the built-in resources, the resources that
//! CustomResourceDefinitions add, and the discovery documents that describe them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use kube::core::cel::CompiledSchema;
use serde_json::{Value, json};

use super::errors::{ApiError, Cause};
use capo_api::cel_cost::{self, FindingKind};

/// The group of CustomResourceDefinition itself.
pub const APIEXTENSIONS: &str = "apiextensions.k8s.io";

/// Storage identity of a resource: objects are kept per (group, plural), whatever version
/// a client uses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    /// API group, "" for core.
    pub group: String,
    /// Plural resource name.
    pub plural: String,
}

/// An additional printer column of a CRD version.
#[derive(Clone, Debug)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type: string, integer, number, boolean, date.
    pub type_: String,
    /// Optional format.
    pub format: String,
    /// Column description.
    pub description: String,
    /// 0 shows in the default view, more only with `-o wide`.
    pub priority: i64,
    /// Kubernetes JSONPath relative to the object.
    pub json_path: String,
}

/// One served version of a resource.
pub struct VersionDef {
    /// Version name, e.g. `v1beta2`.
    pub name: String,
    /// OpenAPI v3 schema (CRDs only): defaulting, pruning, validation.
    pub schema: Option<Value>,
    /// Compiled CEL rules of `schema`.
    pub cel: Option<CompiledSchema>,
    /// `schema` with the server's metadata schema: what field ownership follows.
    pub ownership_schema: Value,
    /// Whether `/status` is a subresource (and the main resource ignores status).
    pub status_subresource: bool,
    /// Printer columns for `kubectl get`.
    pub printer_columns: Vec<PrinterColumn>,
    /// Field paths usable in field selectors, beyond metadata.name/namespace.
    pub selectable_fields: Vec<String>,
}

/// A served resource.
pub struct ResourceDef {
    /// Storage identity.
    pub key: ResourceKey,
    /// Kind, e.g. `OpenStackCluster`.
    pub kind: String,
    /// List kind, e.g. `OpenStackClusterList`.
    pub list_kind: String,
    /// Singular name.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories for kubectl (`kubectl get cluster-api`).
    pub categories: Vec<String>,
    /// Served versions, in declaration order.
    pub versions: Vec<VersionDef>,
    /// Version objects are stored in.
    pub storage_version: String,
    /// Served from a CRD: generation is tracked and schemas apply.
    pub custom: bool,
    /// How objects change version (`spec.conversion`).
    pub conversion: super::conversion::Strategy,
}

impl ResourceDef {
    /// The named served version.
    pub fn version(&self, name: &str) -> Option<&VersionDef> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// `group/version` for a version of this resource.
    /// What converting an object of this resource to `version` needs.
    pub fn conversion_target(&self, version: &str) -> super::conversion::Target<'_> {
        super::conversion::Target {
            kind: &self.kind,
            api_version: self.api_version(version),
            strategy: &self.conversion,
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.key.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.key.group)
        }
    }

    /// Field paths accepted in field selectors for a version.
    pub fn selectable_fields(&self, version: &str) -> Vec<String> {
        let mut fields = vec!["metadata.name".to_owned()];
        if self.namespaced {
            fields.push("metadata.namespace".to_owned());
        }
        if let Some(v) = self.version(version) {
            fields.extend(v.selectable_fields.iter().cloned());
        }
        fields
    }

    fn builtin(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            key: ResourceKey {
                group: group.to_owned(),
                plural: plural.to_owned(),
            },
            kind: kind.to_owned(),
            list_kind: format!("{kind}List"),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            versions: vec![VersionDef {
                name: version.to_owned(),
                schema: None,
                cel: None,
                ownership_schema: super::managed::tracking_schema(None),
                status_subresource: false,
                printer_columns: Vec::new(),
                selectable_fields: Vec::new(),
            }],
            storage_version: version.to_owned(),
            custom: false,
            conversion: super::conversion::Strategy::None,
        }
    }

    fn with_status(mut self) -> Self {
        self.versions[0].status_subresource = true;
        self
    }

    fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    fn with_fields(mut self, fields: &[&str]) -> Self {
        self.versions[0].selectable_fields = fields.iter().map(|s| (*s).to_owned()).collect();
        self
    }
}

/// The resources every cluster has.
pub fn builtins() -> Vec<Arc<ResourceDef>> {
    let event_fields = [
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ];
    [
        ResourceDef::builtin("", "v1", "Namespace", "namespaces", false)
            .with_status()
            .with_short_names(&["ns"])
            .with_fields(&["status.phase"]),
        ResourceDef::builtin("", "v1", "Secret", "secrets", true).with_fields(&["type"]),
        ResourceDef::builtin("", "v1", "ConfigMap", "configmaps", true).with_short_names(&["cm"]),
        ResourceDef::builtin("", "v1", "Event", "events", true)
            .with_short_names(&["ev"])
            .with_fields(&event_fields),
        ResourceDef::builtin("events.k8s.io", "v1", "Event", "events", true)
            .with_short_names(&["ev"])
            .with_fields(&[
                "regarding.kind",
                "regarding.name",
                "regarding.namespace",
                "reason",
                "type",
            ]),
        ResourceDef::builtin("coordination.k8s.io", "v1", "Lease", "leases", true),
        // What a provider's manifests hold (kept, not acted on: no pods run).
        ResourceDef::builtin("", "v1", "ServiceAccount", "serviceaccounts", true)
            .with_short_names(&["sa"]),
        ResourceDef::builtin("", "v1", "Service", "services", true).with_short_names(&["svc"]),
        ResourceDef::builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
        )
        .with_status()
        .with_short_names(&["pdb"]),
        ResourceDef::builtin(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
        )
        .with_short_names(&["netpol"]),
        ResourceDef::builtin("apps", "v1", "Deployment", "deployments", true)
            .with_status()
            .with_short_names(&["deploy"]),
        ResourceDef::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
        ),
        ResourceDef::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        ),
        ResourceDef::builtin("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
        ResourceDef::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
        ),
        // Read by the simulated API server: it calls the webhooks they name.
        ResourceDef::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
        ),
        ResourceDef::builtin(
            APIEXTENSIONS,
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        )
        .with_status()
        .with_short_names(&["crd", "crds"]),
    ]
    .into_iter()
    .map(Arc::new)
    .collect()
}

/// The strings of a JSON array (none when it is absent or not an array).
pub fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.to_owned(),
        message: "Required value".to_owned(),
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.to_owned(),
        message: message.into(),
    }
}

fn printer_columns(version: &Value) -> Vec<PrinterColumn> {
    let Some(columns) = version
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    columns
        .iter()
        .map(|c| PrinterColumn {
            name: text(c, "/name").to_owned(),
            type_: text(c, "/type").to_owned(),
            format: text(c, "/format").to_owned(),
            description: text(c, "/description").to_owned(),
            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            json_path: text(c, "/jsonPath").to_owned(),
        })
        .collect()
}

fn version_def(version: &Value, at: &str, causes: &mut Vec<Cause>) -> VersionDef {
    let schema = version.pointer("/schema/openAPIV3Schema").cloned();
    if let Some(schema) = &schema {
        for problem in crate::structural::check_structural(schema) {
            causes.push(invalid(
                &format!("{at}.schema.openAPIV3Schema{}", dotted(&problem.path)),
                problem.message,
            ));
        }
    } else {
        causes.push(required(&format!("{at}.schema.openAPIV3Schema")));
    }
    let cel = schema.as_ref().map(kube::core::cel::compile_schema);
    VersionDef {
        ownership_schema: super::managed::tracking_schema(schema.as_ref()),
        name: text(version, "/name").to_owned(),
        status_subresource: version.pointer("/subresources/status").is_some(),
        printer_columns: printer_columns(version),
        selectable_fields: version
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|fields| {
                fields
                    .iter()
                    .map(|f| text(f, "/jsonPath").trim_start_matches('.').to_owned())
                    .collect()
            })
            .unwrap_or_default(),
        schema,
        cel,
    }
}

fn dotted(path: &str) -> String {
    if path.is_empty() || path.starts_with('[') {
        path.to_owned()
    } else {
        format!(".{path}")
    }
}

/// Reads a CustomResourceDefinition into the resource it serves, with the checks the real
/// server makes before accepting one. `old` is the stored CRD on an update.
pub fn from_crd(crd: &Value, old: Option<&Value>) -> Result<ResourceDef, Vec<Cause>> {
    let mut causes = Vec::new();
    let group = text(crd, "/spec/group");
    let plural = text(crd, "/spec/names/plural");
    let kind = text(crd, "/spec/names/kind");
    let scope = text(crd, "/spec/scope");
    for (value, field) in [
        (group, "spec.group"),
        (plural, "spec.names.plural"),
        (kind, "spec.names.kind"),
        (scope, "spec.scope"),
    ] {
        if value.is_empty() {
            causes.push(required(field));
        }
    }
    if !scope.is_empty() && scope != "Namespaced" && scope != "Cluster" {
        causes.push(invalid(
            "spec.scope",
            format!("Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    let name = text(crd, "/metadata/name");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(invalid(
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let declared = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if declared.is_empty() {
        causes.push(required("spec.versions"));
    }
    let storage: Vec<&str> = declared
        .iter()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .map(|v| text(v, "/name"))
        .collect();
    if !declared.is_empty() && storage.len() != 1 {
        causes.push(invalid(
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    let mut versions = Vec::new();
    for (i, v) in declared.iter().enumerate() {
        let def = version_def(v, &format!("spec.versions[{i}]"), &mut causes);
        if v.get("served") == Some(&Value::Bool(true)) {
            versions.push(def);
        }
    }
    let conversion = super::conversion::Strategy::from_crd(crd, &mut causes);
    // Like the real server, CEL rules are costed only once the schemas are sound.
    if causes.is_empty() {
        causes.extend(cel_cost_causes(crd, old));
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let names = crd.pointer("/spec/names").cloned().unwrap_or_default();
    Ok(ResourceDef {
        key: ResourceKey {
            group: group.to_owned(),
            plural: plural.to_owned(),
        },
        kind: kind.to_owned(),
        list_kind: match text(&names, "/listKind") {
            "" => format!("{kind}List"),
            list => list.to_owned(),
        },
        singular: match text(&names, "/singular") {
            "" => kind.to_lowercase(),
            singular => singular.to_owned(),
        },
        namespaced: scope == "Namespaced",
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        versions,
        storage_version: storage.first().copied().unwrap_or_default().to_owned(),
        custom: true,
        conversion,
    })
}

/// The API server's estimate of every CEL rule's cost, over its budget.
fn cel_cost_causes(crd: &Value, old: Option<&Value>) -> Vec<Cause> {
    cel_cost::check_crd(crd, old)
        .findings
        .into_iter()
        .map(|finding| {
            let (reason, prefix) = match finding.kind {
                FindingKind::Forbidden => ("FieldValueForbidden", "Forbidden"),
                FindingKind::Invalid => ("FieldValueInvalid", "Invalid value"),
            };
            Cause {
                reason,
                field: finding.field,
                message: format!("{prefix}: {}", finding.message),
            }
        })
        .collect()
}

/// Orders versions the way Kubernetes does: GA before beta before alpha, higher numbers
/// first, then anything else alphabetically.
pub fn version_priority(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 2, 0));
        }
        let (stage, minor) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else {
            (0, tail.strip_prefix("alpha")?)
        };
        Some((major, stage, minor.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((ma, sa, na)), Some((mb, sb, nb))) => sb.cmp(&sa).then(mb.cmp(&ma)).then(nb.cmp(&na)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Everything served, and lookups by URL coordinates.
#[derive(Default)]
pub struct Registry {
    /// Every served resource: built-ins first, then CRDs.
    pub all: Vec<Arc<ResourceDef>>,
}

impl Registry {
    /// Built-ins plus the given CRD-served resources.
    pub fn new(crds: impl IntoIterator<Item = Arc<ResourceDef>>) -> Self {
        let mut all = builtins();
        all.extend(crds);
        Self { all }
    }

    /// The resource served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.all
            .iter()
            .find(|r| {
                r.key.group == group && r.key.plural == plural && r.version(version).is_some()
            })
            .cloned()
    }

    /// The resource stored under a key.
    pub fn by_key(&self, key: &ResourceKey) -> Option<Arc<ResourceDef>> {
        self.all.iter().find(|r| &r.key == key).cloned()
    }

    /// Versions served per group, most preferred first.
    fn groups(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for r in &self.all {
            let versions = groups.entry(r.key.group.as_str()).or_default();
            for v in &r.versions {
                if !versions.contains(&v.name.as_str()) {
                    versions.push(&v.name);
                }
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by(|a, b| version_priority(a, b));
        }
        groups
    }

    /// `/apis/<group>` (an `APIGroup`), if the group is served.
    pub fn api_group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let versions = groups.get(group).filter(|_| !group.is_empty())?;
        Some(group_json(group, versions))
    }

    /// `/apis` (an `APIGroupList`).
    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .filter(|(g, _)| !g.is_empty())
            .map(|(g, versions)| group_json(g, versions))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/api/v1` or `/apis/<group>/<version>` (an `APIResourceList`), if served.
    pub fn api_resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for r in self.all.iter().filter(|r| r.key.group == group) {
            let Some(v) = r.version(version) else {
                continue;
            };
            resources.push(resource_json(r));
            if v.status_subresource {
                resources.push(json!({
                    "name": format!("{}/status", r.key.plural), "singularName": "",
                    "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"],
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let group_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": group_version, "resources": resources,
        }))
    }
}

fn group_json(group: &str, versions: &[&str]) -> Value {
    let listed: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": listed,
        "preferredVersion": listed.first().cloned().unwrap_or_default(),
    })
}

fn resource_json(r: &ResourceDef) -> Value {
    let mut resource = json!({
        "name": r.key.plural, "singularName": r.singular, "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    });
    if !r.short_names.is_empty() {
        resource["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        resource["categories"] = json!(r.categories);
    }
    resource
}

/// Checks a CRD before it is stored; `Invalid` lists what is wrong.
pub fn check_crd(crd: &Value, old: Option<&Value>) -> Result<ResourceDef, ApiError> {
    from_crd(crd, old).map_err(|causes| {
        ApiError::invalid(
            APIEXTENSIONS,
            "CustomResourceDefinition",
            text(crd, "/metadata/name"),
            causes,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_like_kubernetes() {
        let mut v = vec![
            "v1alpha1",
            "v1beta1",
            "v2",
            "v1",
            "v1beta2",
            "foo",
            "v10alpha3",
        ];
        v.sort_by(|a, b| version_priority(a, b));
        assert_eq!(
            v,
            [
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v10alpha3",
                "v1alpha1",
                "foo"
            ]
        );
    }

    fn crd(storage: bool) -> Value {
        json!({"metadata": {"name": "widgets.example.com"},
               "spec": {"group": "example.com", "scope": "Namespaced",
                        "names": {"plural": "widgets", "kind": "Widget"},
                        "versions": [{"name": "v1", "served": true, "storage": storage,
                                      "subresources": {"status": {}},
                                      "schema": {"openAPIV3Schema": {"type": "object"}}}]}})
    }

    #[test]
    fn a_crd_becomes_a_served_resource() {
        let def = from_crd(&crd(true), None).unwrap();
        assert_eq!(def.key.plural, "widgets");
        assert_eq!(def.list_kind, "WidgetList");
        assert_eq!(def.singular, "widget");
        assert!(def.namespaced && def.custom);
        assert!(def.versions[0].status_subresource);
        let registry = Registry::new([Arc::new(def)]);
        let list = registry.api_resource_list("example.com", "v1").unwrap();
        assert_eq!(list["resources"][1]["name"], "widgets/status");
        assert_eq!(
            registry.api_group("example.com").unwrap()["preferredVersion"]["version"],
            "v1"
        );
    }

    #[test]
    fn a_crd_without_a_storage_version_is_invalid() {
        let causes = from_crd(&crd(false), None).err().unwrap();
        assert_eq!(causes[0].field, "spec.versions");
    }
}
