//! OpenAPI documents, as much of them as clients use: kubectl reads the v3 documents to
//! learn that the server validates fields itself (`fieldValidation`), and reads the
//! schemas for `kubectl explain`-style lookups.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Value, json};

use super::resources::{Registry, ResourceDef};

/// `/openapi/v2`: an empty but valid Swagger document (clients fall back to v3).
pub fn v2() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.34.0"},
           "paths": {}, "definitions": {}})
}

fn group_versions(registry: &Registry) -> BTreeMap<String, Vec<(&ResourceDef, String)>> {
    let mut gvs: BTreeMap<String, Vec<(&ResourceDef, String)>> = BTreeMap::new();
    for def in &registry.all {
        for v in &def.versions {
            let path = if def.key.group.is_empty() {
                format!("api/{}", v.name)
            } else {
                format!("apis/{}/{}", def.key.group, v.name)
            };
            gvs.entry(path).or_default().push((def, v.name.clone()));
        }
    }
    gvs
}

/// `/openapi/v3`: where each group-version's document is.
pub fn v3_root(registry: &Registry) -> Value {
    let paths: serde_json::Map<String, Value> = group_versions(registry)
        .keys()
        .map(|gv| {
            let hash = v3_group_version(registry, gv).map(|doc| {
                let mut h = DefaultHasher::new();
                doc.to_string().hash(&mut h);
                format!("{:016X}", h.finish())
            });
            let url = format!("/openapi/v3/{gv}?hash={}", hash.unwrap_or_default());
            (gv.clone(), json!({"serverRelativeURL": url}))
        })
        .collect();
    json!({"paths": paths})
}

fn schema_name(def: &ResourceDef, version: &str) -> String {
    let group: Vec<&str> = def.key.group.split('.').rev().collect();
    format!("{}.{version}.{}", group.join("."), def.kind)
}

/// `/openapi/v3/<api/v1 | apis/group/version>`.
pub fn v3_group_version(registry: &Registry, group_version: &str) -> Option<Value> {
    let gvs = group_versions(registry);
    let resources = gvs.get(group_version)?;
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for (def, version) in resources {
        let gvk = json!([{"group": def.key.group, "version": version, "kind": def.kind}]);
        let name = schema_name(def, version);
        let reference = json!({"$ref": format!("#/components/schemas/{name}")});
        let mut schema = def
            .version(version)
            .and_then(|v| v.schema.clone())
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        schema["x-kubernetes-group-version-kind"] = gvk.clone();
        schemas.insert(name, schema);
        let write_params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        ]);
        let operation = |action: &str| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk[0],
                   "parameters": write_params,
                   "responses": {"200": {"content": {"application/json": {"schema": reference}}}}})
        };
        let scope = if def.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let collection = format!("/{group_version}/{scope}{}", def.key.plural);
        paths.insert(
            collection.clone(),
            json!({"get": operation("list"), "post": operation("post")}),
        );
        let item = json!({"get": operation("get"), "put": operation("put"),
                          "patch": operation("patch"), "delete": operation("delete")});
        paths.insert(format!("{collection}/{{name}}"), item.clone());
        if def.version(version).is_some_and(|v| v.status_subresource) {
            paths.insert(format!("{collection}/{{name}}/status"), item);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
