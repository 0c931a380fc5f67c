//! The CustomResourceDefinitions served by capo-rs, generated from the Rust types, plus the
//! few touches derive cannot express: the `status` default of the v1beta2 contract,
//! immutability rules that CAPO enforces in webhooks, and no `nullable` (we never write
//! null, and CAPO's schemas do not accept it either).

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::admission::{self, add_rule, unchanged_except};
use super::cel_cost;
use super::conversion;
use super::{
    OpenStackCluster, OpenStackClusterIdentity, OpenStackClusterTemplate, OpenStackFloatingIPPool,
    OpenStackMachine, OpenStackMachineTemplate, OpenStackServer,
};

/// Errors writing CRD files.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD could not be serialised.
    #[error("cannot serialise CRD {name}: {source}")]
    Serialize {
        /// CRD name.
        name: String,
        /// Cause.
        source: serde_saphyr::ser_error::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// File path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// Every CRD, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        finish(
            OpenStackCluster::crd(),
            &[admission::cluster_rules],
            Some(&[spoke_cluster_rules]),
        ),
        finish(
            OpenStackClusterTemplate::crd(),
            &[admission::cluster_template_rules],
            Some(&[
                spoke_cluster_template_rules,
                admission::cluster_template_rules,
            ]),
        ),
        finish(
            OpenStackMachine::crd(),
            &[admission::machine_rules],
            Some(&[admission::machine_rules, spoke_machine_rules]),
        ),
        finish(
            OpenStackMachineTemplate::crd(),
            &[admission::machine_template_rules],
            Some(&[
                spoke_machine_template_rules,
                admission::machine_template_rules,
            ]),
        ),
        finish(OpenStackServer::crd(), &[], None),
        finish(OpenStackClusterIdentity::crd(), &[], None),
        finish(OpenStackFloatingIPPool::crd(), &[], None),
    ]
}

/// The namespace and name of the cert-manager Certificate whose CA the conversion
/// webhook's clients trust (cert-manager's cainjector copies it into the CRDs).
pub const CERTIFICATE: (&str, &str) = ("capo-rs-system", "capo-rs-serving-cert");
/// The Service in front of the webhook server.
pub const WEBHOOK_SERVICE: (&str, &str) = ("capo-rs-system", "capo-rs-webhook-service");
/// The path the conversion webhook answers on.
pub const CONVERT_PATH: &str = "/convert";

/// Why kube-apiserver would refuse a CRD: a CEL rule over the cost budget, or one that does
/// not compile (see [`cel_cost`]). One line per finding, worded as `kubectl` shows it.
pub fn lint(crd: &CustomResourceDefinition) -> Vec<String> {
    cost_report(crd)
        .findings
        .iter()
        .map(|finding| {
            format!(
                "The CustomResourceDefinition {:?} is invalid: {finding}",
                crd.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

/// Every CEL rule of a CRD with its estimated cost, as the API server computes it.
pub fn cost_report(crd: &CustomResourceDefinition) -> cel_cost::Report {
    let value = serde_json::to_value(crd).expect("a CRD always serialises to JSON");
    cel_cost::check_crd(&value, None)
}

/// A table of every rule's cost against the per-rule budget, most expensive first.
pub fn cost_table(crds: &[CustomResourceDefinition]) -> String {
    let mut rows: Vec<(String, cel_cost::RuleCost)> = crds
        .iter()
        .flat_map(|crd| {
            let kind = crd.spec.names.kind.clone();
            cost_report(crd)
                .rules
                .into_iter()
                .map(move |rule| (kind.clone(), rule))
        })
        .collect();
    rows.sort_by(|a, b| {
        b.1.cost
            .cmp(&a.1.cost)
            .then_with(|| a.1.field.cmp(&b.1.field))
    });
    let mut out = format!(
        "{:<26} {:>8} {:>11} {:>12} {:>7}  rule at\n",
        "kind", "per call", "runs", "cost", "budget"
    );
    for (kind, rule) in rows {
        #[allow(clippy::cast_precision_loss)]
        let share = rule.cost as f64 * 100.0 / cel_cost::RULE_COST_LIMIT as f64;
        let at = short_rule_path(&rule.field);
        out.push_str(&format!(
            "{kind:<26} {:>8} {:>11} {:>12} {share:>6.1}%  {at}\n",
            rule.per_call, rule.cardinality, rule.cost
        ));
    }
    out
}

/// `.spec.ports[] rule 0` for the API server's
/// `spec.validation.openAPIV3Schema.properties[spec].properties[ports].items.x-kubernetes-validations[0].rule`.
fn short_rule_path(field: &str) -> String {
    let schema_path = field
        .split_once(".openAPIV3Schema")
        .map_or(field, |(_, rest)| rest);
    let (node, rule) = schema_path
        .rsplit_once(".x-kubernetes-validations[")
        .unwrap_or((schema_path, ""));
    let mut short = String::new();
    let mut rest = node;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix(".properties[") {
            let (name, tail) = after.split_once(']').unwrap_or((after, ""));
            short.push('.');
            short.push_str(name);
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix(".items") {
            short.push_str("[]");
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix(".additionalProperties") {
            short.push_str("{}");
            rest = tail;
        } else {
            let c = rest.chars().next().unwrap_or_default();
            short.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    let index = rule.split(']').next().unwrap_or_default();
    format!(
        "{} rule {index}",
        if short.is_empty() { "." } else { &short }
    )
}

/// `<group>_<plural>.yaml`, the conventional file name of a CRD.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// One YAML document.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    serde_saphyr::to_string(crd).map_err(|source| CrdError::Serialize {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// All CRDs as one multi-document YAML stream.
pub fn to_multi_yaml(crds: &[CustomResourceDefinition]) -> Result<String, CrdError> {
    let docs = crds.iter().map(to_yaml).collect::<Result<Vec<_>, _>>()?;
    Ok(docs.iter().map(|d| format!("---\n{d}")).collect())
}

/// Writes one file per CRD into `dir` (created if missing); returns the paths written.
pub fn write_dir(crds: &[CustomResourceDefinition], dir: &Path) -> Result<Vec<PathBuf>, CrdError> {
    std::fs::create_dir_all(dir).map_err(|source| CrdError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let write = |path: PathBuf, text: String| {
        std::fs::write(&path, text).map_err(|source| CrdError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    let mut written = crds
        .iter()
        .map(|crd| write(dir.join(file_name(crd)), to_yaml(crd)?))
        .collect::<Result<Vec<_>, CrdError>>()?;
    written.push(write(dir.join(KUSTOMIZATION), kustomization(crds))?);
    Ok(written)
}

/// The kustomization's file name in `crds/`: a name kustomize reads and `kubectl apply -f
/// crds/` skips (it reads only .yaml, .yml and .json files).
pub const KUSTOMIZATION: &str = "Kustomization";

/// A kustomization listing the CRD files, so that `deploy/` (and any overlay) can include
/// the directory as a base.
pub fn kustomization(crds: &[CustomResourceDefinition]) -> String {
    let mut text = String::from(
        "# Generated by `capo-rs crds --out crds`.\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
    );
    for crd in crds {
        text.push_str(&format!("- {}\n", file_name(crd)));
    }
    text
}

type SchemaEdit = fn(&mut Value);

/// Finishes a derived CRD: `edits` on the v1beta2 schema; with `spoke_edits`, a v1beta1
/// version beside it (served, not stored; its schema derived from v1beta2's, see
/// [`conversion::schema`]) and the conversion webhook.
fn finish(
    crd: CustomResourceDefinition,
    edits: &[SchemaEdit],
    spoke_edits: Option<&[SchemaEdit]>,
) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(&crd).expect("a CRD always serialises to JSON");
    if spoke_edits.is_some() {
        add_spoke_version(&mut value);
    }
    for version in value["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let is_spoke = version["name"] == conversion::SPOKE;
        let schema = &mut version["schema"]["openAPIV3Schema"];
        tidy(schema);
        add_type_meta(schema);
        if let Some(status) = schema.pointer_mut("/properties/status") {
            status["default"] = json!({"observedGeneration": -1});
            if status.pointer("/properties/ready").is_some() {
                // v1beta1 requires `ready`.
                status["default"]["ready"] = json!(false);
            }
        }
        let edits = if is_spoke {
            spoke_edits.unwrap_or_default()
        } else {
            edits
        };
        for edit in edits {
            edit(schema);
        }
    }
    // The label names the versions that satisfy Cluster API's v1beta2 contract: v1beta1 is
    // the v1beta1 contract's version, served only for its existing clients.
    let versions: Vec<&str> = value["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] != conversion::SPOKE)
        .filter_map(|v| v["name"].as_str())
        .collect();
    let contract = versions.join("_");
    value["metadata"]["labels"] = json!({ CONTRACT_LABEL: contract });
    serde_json::from_value(value).expect("an edited CRD is still a CRD")
}

/// Adds v1beta1 before v1beta2 (served, not stored), with its schema derived from
/// v1beta2's, and makes the API server convert between them through the webhook.
fn add_spoke_version(crd: &mut Value) {
    let kind = crd["spec"]["names"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let Some(hub) = crd["spec"]["versions"]
        .as_array()
        .and_then(|versions| versions.first())
        .cloned()
    else {
        return;
    };
    let mut spoke = hub.clone();
    spoke["name"] = json!(conversion::SPOKE);
    spoke["storage"] = json!(false);
    spoke["served"] = json!(true);
    let schema = &mut spoke["schema"]["openAPIV3Schema"];
    *schema = conversion::schema::spoke_schema(&kind, schema);
    if matches!(kind.as_str(), "OpenStackCluster" | "OpenStackMachine")
        && let Some(Value::Array(columns)) = spoke.get_mut("additionalPrinterColumns")
    {
        let at = columns.len().min(1);
        let what = if kind == "OpenStackCluster" {
            "Cluster infrastructure"
        } else {
            "Machine"
        };
        columns.insert(
            at,
            json!({"name": "Ready", "type": "string", "jsonPath": ".status.ready",
                   "description": format!("{what} is ready (v1beta1's status.ready)")}),
        );
    }
    if let Some(Value::Array(versions)) = crd.pointer_mut("/spec/versions") {
        versions.insert(0, spoke);
    }
    let (cert_ns, cert) = CERTIFICATE;
    crd["metadata"]["annotations"] =
        json!({"cert-manager.io/inject-ca-from": format!("{cert_ns}/{cert}")});
    let (namespace, name) = WEBHOOK_SERVICE;
    crd["spec"]["conversion"] = json!({
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": namespace, "name": name, "path": CONVERT_PATH, "port": 443}},
        },
    });
}

/// v1beta1 OpenStackCluster: the cluster spec's rules in v1beta1's field names.
fn spoke_cluster_rules(schema: &mut Value) {
    spoke_cluster_spec_rules(&mut schema["properties"]["spec"]);
    let spec = &mut schema["properties"]["spec"];
    add_rule(
        spec,
        "has(self.apiServerLoadBalancer) == has(oldSelf.apiServerLoadBalancer)".into(),
        "apiServerLoadBalancer cannot be added or removed",
    );
    let lb = &mut spec["properties"]["apiServerLoadBalancer"];
    let rule = unchanged_except(lb, &["allowedCIDRs", "monitor"]);
    add_rule(
        lb,
        rule,
        "apiServerLoadBalancer is immutable except allowedCIDRs and monitor",
    );
}

fn spoke_cluster_template_rules(schema: &mut Value) {
    spoke_cluster_spec_rules(
        &mut schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"],
    );
}

/// The rules v1beta2 states with `enableExternalNetwork` and `apiServer`, restated with
/// v1beta1's `disable*` fields; and the bastion's flavor.
fn spoke_cluster_spec_rules(spec: &mut Value) {
    if let Some(map) = spec.as_object_mut() {
        map.remove("x-kubernetes-validations");
    }
    let external_off = "has(self.disableExternalNetwork) && self.disableExternalNetwork";
    add_rule(
        spec,
        format!("{external_off} ? !has(self.bastion) || !has(self.bastion.floatingIP) : true"),
        "bastion.floatingIP needs the external network (disableExternalNetwork is true)",
    );
    add_rule(
        spec,
        format!(
            "{external_off} ? has(self.disableAPIServerFloatingIP) && self.disableAPIServerFloatingIP : true"
        ),
        "disableAPIServerFloatingIP must be true when disableExternalNetwork is true",
    );
    flavor_rule(&mut spec["properties"]["bastion"]["properties"]["spec"]);
}

/// v1beta1 OpenStackMachine: a flavor by name or ID.
fn spoke_machine_rules(schema: &mut Value) {
    flavor_rule(&mut schema["properties"]["spec"]);
}

fn spoke_machine_template_rules(schema: &mut Value) {
    flavor_rule(&mut schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"]);
}

fn flavor_rule(machine_spec: &mut Value) {
    add_rule(
        machine_spec,
        "has(self.flavor) || has(self.flavorID)".into(),
        "a flavor is needed: set flavor (a name) or flavorID",
    );
}

/// The label that maps Cluster API's contract to the CRD's versions that satisfy it
/// (underscore-separated); Cluster API and clusterctl read it to pick the version of a
/// reference.
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

/// Drops `nullable` and writes whole-number bounds as integers (`minimum: 1`, not `1.0`).
fn tidy(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            map.remove("nullable");
            for (key, value) in map.iter_mut() {
                let is_bound = matches!(key.as_str(), "minimum" | "maximum");
                match value.as_f64() {
                    Some(f) if is_bound && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                        *value = json!(f as i64)
                    }
                    _ => tidy(value),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Declares `apiVersion`, `kind` and `metadata` at the root, as `kubectl explain` expects.
fn add_type_meta(schema: &mut Value) {
    let properties = &mut schema["properties"];
    properties["apiVersion"] = json!({"type": "string", "description": "Versioned schema of this representation of an object."});
    properties["kind"] =
        json!({"type": "string", "description": "REST resource this object represents."});
    properties["metadata"] = json!({"type": "object"});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_the_group_plural_convention() {
        let names: Vec<String> = all().iter().map(file_name).collect();
        assert!(
            names.contains(&"infrastructure.cluster.x-k8s.io_openstackclusters.yaml".to_owned())
        );
        assert_eq!(names.len(), 7);
    }
}
