//! CAPO's validating webhooks (`pkg/webhooks`), restated as CRD validation rules (CEL) on the
//! stored version, so that the API server decides them without a call to us.
//!
//! What CEL cannot state is decided by the provider's validating webhook
//! (`capo_provider::manager::webhook::capo_rules`) with [`webhook_rules`] from here:
//! - OpenStackMachineTemplate and OpenStackServer immutability, which CAPO lifts for Cluster
//!   API's topology dry-run (a dry-run request whose object carries
//!   `topology.cluster.x-k8s.io/dry-run`): a CRD rule sees neither the request's dry-run flag
//!   nor the object's annotations;
//! - a machine's ports and a cluster's subnets compared position by position: over lists
//!   without `maxItems`, more than a rule's cost budget.
//!
//! `tests/it/admission.rs` replays every case of CAPO's webhook unit tests against them.

use serde_json::{Value, json};

/// Adds a validation rule to a schema node.
pub(crate) fn add_rule(node: &mut Value, rule: String, message: &str) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    let rules = map.entry("x-kubernetes-validations").or_insert(json!([]));
    if let Some(rules) = rules.as_array_mut() {
        rules.push(json!({"rule": rule, "message": message}));
    }
}

/// Holds when `a.f` and `b.f` are both absent, or both present and equal.
fn same(a: &str, b: &str, f: &str) -> String {
    format!("(has({a}.{f}) ? has({b}.{f}) && {a}.{f} == {b}.{f} : !has({b}.{f}))")
}

/// A CEL expression that holds when property `f` is unchanged: present in both with the same
/// value, or absent in both.
fn unchanged(f: &str) -> String {
    same("self", "oldSelf", f)
}

/// The property names of an object schema node.
fn fields(node: &Value) -> Vec<String> {
    node["properties"]
        .as_object()
        .map(|fields| fields.keys().cloned().collect())
        .unwrap_or_default()
}

/// Holds when every property of `node` except `mutable` is the same in `a` and `b`.
/// Generated from the schema, so that a new field is immutable until a rule says otherwise.
fn same_except(node: &Value, a: &str, b: &str, mutable: &[&str]) -> String {
    let terms: Vec<String> = fields(node)
        .iter()
        .filter(|f| !mutable.contains(&f.as_str()))
        .map(|f| same(a, b, f))
        .collect();
    if terms.is_empty() {
        "true".into()
    } else {
        terms.join(" && ")
    }
}

/// [`same_except`] between `self` and `oldSelf`.
pub(crate) fn unchanged_except(node: &Value, mutable: &[&str]) -> String {
    same_except(node, "self", "oldSelf", mutable)
}

/// Holds when lists `a.l` and `b.l` are the same, position by position, in every item
/// property except `mutable`: each property is compared as a list of itself-or-nothing, so
/// that absent and present-but-empty stay different, as they are in CAPO's comparison.
fn same_items_except(items: &Value, a: &str, b: &str, l: &str, mutable: &[&str]) -> String {
    let per_field: Vec<String> = fields(items)
        .iter()
        .filter(|f| !mutable.contains(&f.as_str()))
        .map(|f| {
            let each = |list: &str| format!("{list}.{l}.map(x, has(x.{f}) ? [x.{f}] : [])");
            format!("{} == {}", each(a), each(b))
        })
        .collect();
    let sizes = format!("size({a}.{l}) == size({b}.{l})");
    let body = std::iter::once(sizes)
        .chain(per_field)
        .collect::<Vec<_>>()
        .join(" && ");
    format!("(has({a}.{l}) ? has({b}.{l}) && {body} : !has({b}.{l}))")
}

// --- OpenStackCluster -----------------------------------------------------------------

/// Spec fields with a rule of their own below; every other field is immutable.
const CLUSTER_RULED: &[&str] = &[
    "identityRef",
    "controlPlaneEndpoint",
    "bastion",
    "managedSecurityGroups",
    "managedSubnets",
    "apiServer",
    "controlPlaneAvailabilityZones",
    "controlPlaneOmitAvailabilityZone",
    "primarySubnet",
    "network",
    "subnets",
];

/// OpenStackCluster, as CAPO's cluster webhook decides (create and update).
pub(crate) fn cluster_rules(schema: &mut Value) {
    security_group_rule_exclusion(&mut schema["properties"]["spec"]);
    let spec = &mut schema["properties"]["spec"];
    let rule = unchanged_except(spec, CLUSTER_RULED);
    add_rule(
        spec,
        rule,
        "spec cannot be modified, except identityRef, bastion, the managed security group rules, \
         the managed subnets' dnsNameservers, the API load balancer's allowedCIDRs and monitor, \
         the control plane's availability zones and primarySubnet",
    );
    add_rule(
        spec,
        format!(
            "!has(oldSelf.controlPlaneEndpoint) || !has(oldSelf.controlPlaneEndpoint.host) || \
             oldSelf.controlPlaneEndpoint.host == '' || {}",
            unchanged("controlPlaneEndpoint")
        ),
        "controlPlaneEndpoint cannot be changed once its host is set",
    );
    add_rule(
        spec,
        "has(self.bastion) || !has(oldSelf.bastion) || \
         (has(oldSelf.bastion.enabled) && !oldSelf.bastion.enabled)"
            .into(),
        "bastion cannot be removed before disabling it (set bastion.enabled to false first)",
    );
    add_rule(
        spec,
        "has(self.managedSecurityGroups) || !has(oldSelf.managedSecurityGroups)".into(),
        "managedSecurityGroups cannot be removed",
    );
    managed_subnet_rules(spec);
    api_server_rules(schema);
    network_rules(schema);
}

/// Each managed security group rule names at most one remote: a managed group, a group ID or
/// an IP prefix.
fn security_group_rule_exclusion(spec: &mut Value) {
    let groups = &mut spec["properties"]["managedSecurityGroups"]["properties"];
    for list in [
        "clusterNodesSecurityGroupRules",
        "controlPlaneNodesSecurityGroupRules",
        "workerNodesSecurityGroupRules",
    ] {
        add_rule(
            &mut groups[list]["items"],
            "[has(self.remoteManagedGroups), has(self.remoteGroupID), has(self.remoteIPPrefix)]\
             .filter(x, x).size() <= 1"
                .into(),
            "only one of remoteManagedGroups, remoteGroupID, or remoteIPPrefix can be set",
        );
    }
}

/// Managed subnets (at most one, by the schema): none added or removed, the CIDR fixed, only
/// `dnsNameservers` may change.
fn managed_subnet_rules(spec: &mut Value) {
    let items = spec["properties"]["managedSubnets"]["items"].clone();
    let both = "has(self.managedSubnets) && has(oldSelf.managedSubnets)";
    add_rule(
        spec,
        format!(
            "has(self.managedSubnets) == has(oldSelf.managedSubnets) && \
             (!({both}) || size(self.managedSubnets) == size(oldSelf.managedSubnets))"
        ),
        "managedSubnets: cannot add or remove subnets",
    );
    add_rule(
        spec,
        format!(
            "!({both}) || self.managedSubnets.all(s, oldSelf.managedSubnets.exists(o, o.cidr == s.cidr))"
        ),
        "managedSubnets: cannot change a subnet's CIDR",
    );
    let rest = same_items_except(
        &items,
        "self",
        "oldSelf",
        "managedSubnets",
        &["dnsNameservers"],
    );
    add_rule(
        spec,
        rest,
        "managedSubnets: only dnsNameservers can be changed",
    );
}

/// `apiServer`, ruled at the root because one exception reads the status: a floating IP that
/// names the API load balancer's current address may be written into the spec.
fn api_server_rules(schema: &mut Value) {
    let api_server = schema["properties"]["spec"]["properties"]["apiServer"].clone();
    let (new, old) = ("self.spec", "oldSelf.spec");
    let has = |side: &str, f: &str| format!("(has({side}.apiServer) && has({side}.apiServer.{f}))");
    let same_field = |f: &str| {
        format!(
            "({n} ? {o} && {new}.apiServer.{f} == {old}.apiServer.{f} : !{o})",
            n = has(new, f),
            o = has(old, f)
        )
    };
    let lb_ip = "oldSelf.status.apiServerManagedLoadBalancer.ip";
    let floating_ip_is_lb = format!(
        "(has(oldSelf.status) && has(oldSelf.status.apiServerManagedLoadBalancer) && \
         ({n} ? {new}.apiServer.floatingIP : '') == {lb_ip})",
        n = has(new, "floatingIP")
    );
    let both = format!("(has({new}.apiServer) && has({old}.apiServer))");
    let old_floating_ip_off = format!(
        "({both} && has({old}.apiServer.enableFloatingIP) && !{old}.apiServer.enableFloatingIP)"
    );
    let only_floating_ip = |side: &str| {
        fields(&api_server)
            .iter()
            .filter(|f| *f != "floatingIP")
            .map(|f| format!("!has({side}.apiServer.{f})"))
            .collect::<Vec<_>>()
            .join(" && ")
    };
    let lb_rest = same_except(
        &api_server["properties"]["managedLoadBalancer"],
        &format!("{new}.apiServer.managedLoadBalancer"),
        &format!("{old}.apiServer.managedLoadBalancer"),
        &["allowedCIDRs", "monitor"],
    );
    let rules = [
        (
            format!(
                "has({new}.apiServer) == has({old}.apiServer) || ({floating_ip_is_lb} && \
                 (has({new}.apiServer) ? {} : {}))",
                only_floating_ip(new),
                only_floating_ip(old)
            ),
            "apiServer cannot be added or removed",
        ),
        (
            same_field("enableFloatingIP"),
            "apiServer.enableFloatingIP cannot be changed",
        ),
        (
            format!("{floating_ip_is_lb} || {}", same_field("floatingIP")),
            "apiServer.floatingIP cannot be changed, except to the API load balancer's current address",
        ),
        (
            format!(
                "({old_floating_ip_off} && (!has({old}.apiServer.fixedIP) || {old}.apiServer.fixedIP == '')) || {}",
                same_field("fixedIP")
            ),
            "apiServer.fixedIP cannot be changed, unless the API server has no floating IP and no fixed IP yet",
        ),
        (
            format!(
                "({old_floating_ip_off} && !has({old}.apiServer.port) && has({new}.apiServer.port)) || {}",
                same_field("port")
            ),
            "apiServer.port cannot be changed, unless the API server has no floating IP and no port yet",
        ),
        (
            format!(
                "({} && {} && {lb_rest}) || {}",
                has(new, "managedLoadBalancer"),
                has(old, "managedLoadBalancer"),
                same_field("managedLoadBalancer"),
            ),
            "apiServer.managedLoadBalancer cannot be added, removed or changed, except its allowedCIDRs and monitor",
        ),
    ];
    for (rule, message) in rules {
        add_rule(schema, rule, message);
    }
}

/// `network`, ruled at the root: once the status names the network, the spec may switch from
/// a filter to the ID the filter found. (`subnets`, the same for each subnet, is the webhook's:
/// pairing old and new subnets by position costs more than a CEL rule may.)
fn network_rules(schema: &mut Value) {
    let (new, old) = ("self.spec", "oldSelf.spec");
    let status = "oldSelf.status.network";
    let resolved = format!(
        "(has({new}.network) && has({old}.network) && has(oldSelf.status) && has({status}))"
    );
    add_rule(
        schema,
        format!(
            "({resolved} && (has({new}.network.id) ? {new}.network.id : '') == {status}.id) || {}",
            same(new, old, "network")
        ),
        "network cannot be changed, except to the ID of the network in status.network",
    );
}

// --- the other kinds --------------------------------------------------------------------

/// OpenStackClusterTemplate: `spec.template.spec` cannot change.
pub(crate) fn cluster_template_rules(schema: &mut Value) {
    let template = &mut schema["properties"]["spec"]["properties"]["template"];
    add_rule(
        template,
        unchanged("spec"),
        "spec.template.spec is immutable; create a new OpenStackClusterTemplate instead",
    );
}

/// OpenStackMachine: the spec is immutable, except `identityRef`, `providerID` (CAPO #3265
/// lets it change, so that a controller's retry is never refused) and the ports'
/// `allowedAddressPairs` (CAPO #3056: pushed to the existing ports).
pub(crate) fn machine_rules(schema: &mut Value) {
    let spec = &mut schema["properties"]["spec"];
    let rule = unchanged_except(spec, &["identityRef", "providerID", "ports"]);
    add_rule(
        spec,
        rule,
        "spec cannot be modified, except identityRef, providerID and the ports' allowedAddressPairs; \
         replace the machine instead",
    );
    add_rule(
        spec,
        "has(self.ports) == has(oldSelf.ports) && (!has(self.ports) || size(self.ports) == size(oldSelf.ports))"
            .into(),
        "ports cannot be added or removed; replace the machine instead",
    );
}

/// OpenStackMachineTemplate: a template never carries a providerID. (Its immutability is the
/// webhook's: see the module's documentation.)
pub(crate) fn machine_template_rules(schema: &mut Value) {
    let template_spec =
        &mut schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"];
    add_rule(
        template_spec,
        "!has(self.providerID)".into(),
        "providerID cannot be set in templates",
    );
}

/// The resources CAPO has validating webhooks for, each served by ours at
/// `/validate/<plural>`.
pub const VALIDATED: [&str; 5] = [
    "openstackclusters",
    "openstackclustertemplates",
    "openstackmachines",
    "openstackmachinetemplates",
    "openstackservers",
];

/// The annotation Cluster API's topology controller puts on the objects of its dry-run
/// requests; CAPO lets those requests change immutable templates and servers.
pub const TOPOLOGY_DRY_RUN: &str = "topology.cluster.x-k8s.io/dry-run";

/// Whether a request is Cluster API's topology dry-run: dry-run, and the object annotated.
pub fn is_topology_dry_run(request: &Value) -> bool {
    request["dryRun"] == true
        && request["object"]["metadata"]["annotations"]
            .get(TOPOLOGY_DRY_RUN)
            .is_some()
}

/// Whether an OpenStackMachineTemplate update keeps `spec.template.spec`, ignoring the ports'
/// `allowedAddressPairs` (CAPO #3056).
pub fn template_spec_unchanged(old: &Value, new: &Value) -> bool {
    let spec = |object: &Value| {
        let mut spec = object["spec"]["template"]["spec"].clone();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                port.remove("allowedAddressPairs");
            }
        }
        spec
    };
    spec(old) == spec(new)
}

/// Whether an OpenStackServer update keeps its spec (all of it: CAPO compares the whole spec,
/// `identityRef` included).
pub fn server_spec_unchanged(old: &Value, new: &Value) -> bool {
    old["spec"] == new["spec"]
}

/// Whether an OpenStackMachine update keeps its ports, ignoring their `allowedAddressPairs`
/// (CAPO #3056). The count is a CEL rule; pairing ports by position is over CEL's budget.
pub fn machine_ports_unchanged(old: &Value, new: &Value) -> bool {
    let ports = |object: &Value| {
        let mut ports = object["spec"]["ports"].clone();
        if let Some(ports) = ports.as_array_mut() {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                port.remove("allowedAddressPairs");
            }
        }
        ports
    };
    ports(old) == ports(new)
}

/// Whether an OpenStackCluster update keeps `spec.subnets`, or only switches subnets from a
/// filter to the ID of the subnet that filter found (`status.network.subnets`), each in its
/// place, as CAPO's webhook allows once the network is known.
pub fn cluster_subnets_allowed(old: &Value, new: &Value) -> bool {
    let (old_spec, new_spec) = (&old["spec"], &new["spec"]);
    if old_spec.get("subnets") == new_spec.get("subnets") {
        return true;
    }
    let found = &old["status"]["network"];
    if new_spec.get("network").is_none() || old_spec.get("network").is_none() || found.is_null() {
        return false;
    }
    let list = |spec: &Value| spec["subnets"].as_array().cloned().unwrap_or_default();
    let (old_subnets, new_subnets) = (list(old_spec), list(new_spec));
    let found_subnets = found["subnets"].as_array().cloned().unwrap_or_default();
    if old_subnets.len() != new_subnets.len() || found_subnets.is_empty() {
        return false;
    }
    old_subnets
        .iter()
        .zip(&new_subnets)
        .all(|(old, new)| subnet_switch_allowed(old, new, &found_subnets))
}

/// One subnet, old and new, by CAPO's rules: a filter may become the ID it found; an ID may
/// not become a filter; a filter's name and an ID may not change.
fn subnet_switch_allowed(old: &Value, new: &Value, found: &[Value]) -> bool {
    let filter_name = |subnet: &Value| {
        subnet["filter"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (old_filter, new_filter) = (old.get("filter").is_some(), new.get("filter").is_some());
    let (old_id, new_id) = (old.get("id"), new.get("id"));
    if old_filter && new_id.is_some() && !new_filter {
        let name = filter_name(old);
        let matches = |subnet: &&Value| {
            subnet["name"].as_str().unwrap_or_default() == name && subnet.get("id") == new_id
        };
        if !found.iter().any(|subnet| matches(&subnet)) {
            return false;
        }
    }
    if old_id.is_some() && new_filter {
        return false;
    }
    if old_filter && new_filter && filter_name(old) != filter_name(new) {
        return false;
    }
    !(old_id.is_some() && new_id.is_some() && old_id != new_id)
}

/// CAPO's update rules that a CRD cannot state (see the module's documentation), for one
/// `AdmissionReview` request on `plural` in the stored version: `Err` names the refusal.
pub fn webhook_rules(plural: &str, request: &Value) -> Result<(), String> {
    if request["operation"] != "UPDATE" {
        return Ok(());
    }
    let (old, new) = (&request["oldObject"], &request["object"]);
    let refuse = |ok: bool, message: &str| if ok { Ok(()) } else { Err(message.to_owned()) };
    match plural {
        "openstackclusters" => refuse(
            cluster_subnets_allowed(old, new),
            "spec.subnets: Forbidden: cannot be changed, except from a filter to the ID of the \
             subnet it found (status.network.subnets)",
        ),
        "openstackmachines" => refuse(
            machine_ports_unchanged(old, new),
            "spec.ports: Forbidden: cannot be modified, except their allowedAddressPairs; \
             replace the machine instead",
        ),
        "openstackmachinetemplates" => refuse(
            is_topology_dry_run(request) || template_spec_unchanged(old, new),
            "spec.template.spec: Invalid value: OpenStackMachineTemplate spec.template.spec is \
             immutable, except the ports' allowedAddressPairs; create a new template instead \
             (https://cluster-api.sigs.k8s.io/tasks/change-machine-template.html)",
        ),
        "openstackservers" => refuse(
            is_topology_dry_run(request) || server_spec_unchanged(old, new),
            "spec: Forbidden: OpenStackServer spec is immutable; create a new resource instead",
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchanged_except_lists_every_other_field() {
        let node = json!({"properties": {"a": {}, "b": {}, "c": {}}});
        let rule = unchanged_except(&node, &["b"]);
        assert!(rule.contains("self.a == oldSelf.a") && rule.contains("self.c == oldSelf.c"));
        assert!(!rule.contains("self.b"));
    }

    #[test]
    fn a_topology_dry_run_needs_both_the_flag_and_the_annotation() {
        let annotated = json!({"metadata": {"annotations": {TOPOLOGY_DRY_RUN: ""}}});
        assert!(is_topology_dry_run(
            &json!({"dryRun": true, "object": annotated})
        ));
        assert!(!is_topology_dry_run(
            &json!({"dryRun": false, "object": annotated})
        ));
        assert!(!is_topology_dry_run(
            &json!({"dryRun": true, "object": {"metadata": {}}})
        ));
    }

    #[test]
    fn allowed_address_pairs_are_the_templates_only_mutable_field() {
        let template = |pairs: Value, flavor: &str| {
            json!({"spec": {"template": {"spec": {"flavor": flavor,
                "ports": [{"allowedAddressPairs": pairs}]}}}})
        };
        let old = template(json!([{"ipAddress": "10.0.0.1"}]), "m1");
        assert!(template_spec_unchanged(
            &old,
            &template(json!([{"ipAddress": "10.0.0.2"}]), "m1")
        ));
        assert!(!template_spec_unchanged(
            &old,
            &template(json!([{"ipAddress": "10.0.0.1"}]), "m2")
        ));
    }
}
