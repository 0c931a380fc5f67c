//! Where v1beta1 and v1beta2 put the same information, as data: one table of moved, renamed
//! and inverted fields that both the object conversion and the v1beta1 schema are built
//! from, so that the two cannot disagree.

use serde_json::{Map, Value};

/// One field that lives at `spoke` in v1beta1 and at `hub` in v1beta2, both relative to
/// `at` (a dotted path in which `[]` visits every element of a list).
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// The container both paths are relative to ("" for the section itself).
    pub at: &'static str,
    /// Dotted path in v1beta1.
    pub spoke: &'static str,
    /// Dotted path in v1beta2.
    pub hub: &'static str,
    /// A boolean whose meaning flips (`disableX` in v1beta1, `enableX` in v1beta2).
    pub flip: bool,
    /// The v1beta1 field's description, for the generated schema.
    pub doc: &'static str,
}

const fn moved(at: &'static str, spoke: &'static str, hub: &'static str) -> Field {
    Field {
        at,
        spoke,
        hub,
        flip: false,
        doc: "",
    }
}

const fn flipped(
    at: &'static str,
    spoke: &'static str,
    hub: &'static str,
    doc: &'static str,
) -> Field {
    Field {
        flip: true,
        doc,
        ..moved(at, spoke, hub)
    }
}

/// A machine's spec (OpenStackMachine, the template's, the bastion's).
pub const MACHINE_SPEC: &[Field] = &[flipped(
    "ports[]",
    "disablePortSecurity",
    "enablePortSecurity",
    "Turns port security off for this port (v1beta2: enablePortSecurity, inverted).",
)];

/// A cluster's spec (OpenStackCluster and the template's), apart from the bastion's
/// machine spec.
pub const CLUSTER_SPEC: &[Field] = &[
    moved("", "networkMTU", "managedNetwork.mtu"),
    flipped(
        "",
        "disablePortSecurity",
        "managedNetwork.enablePortSecurity",
        "Turns port security off on the managed network (v1beta2: managedNetwork.enablePortSecurity, inverted).",
    ),
    flipped(
        "",
        "disableExternalNetwork",
        "enableExternalNetwork",
        "Builds the cluster without an external network: no router, no floating IPs (v1beta2: enableExternalNetwork, inverted).",
    ),
    moved("", "externalRouterIPs", "managedRouter.externalIPs"),
    moved("", "apiServerLoadBalancer", "apiServer.managedLoadBalancer"),
    flipped(
        "",
        "disableAPIServerFloatingIP",
        "apiServer.enableFloatingIP",
        "Gives the API server no floating IP (v1beta2: apiServer.enableFloatingIP, inverted).",
    ),
    moved("", "apiServerFloatingIP", "apiServer.floatingIP"),
    moved("", "apiServerFixedIP", "apiServer.fixedIP"),
    moved("", "apiServerPort", "apiServer.port"),
    moved(
        "managedSecurityGroups",
        "allNodesSecurityGroupRules",
        "clusterNodesSecurityGroupRules",
    ),
];

/// v1beta2 containers that exist only to group moved fields; v1beta1 has no such object.
pub const HUB_CONTAINERS: &[&str] = &["managedNetwork", "managedRouter", "apiServer"];

/// An OpenStackCluster's status.
pub const CLUSTER_STATUS: &[Field] = &[
    moved("", "apiServerLoadBalancer", "apiServerManagedLoadBalancer"),
    flipped(
        "bastion.resolved.ports[]",
        "disablePortSecurity",
        "enablePortSecurity",
        "Port security is off for this port (v1beta2: enablePortSecurity, inverted).",
    ),
];

/// An OpenStackMachine's status.
pub const MACHINE_STATUS: &[Field] = &[flipped(
    "resolved.ports[]",
    "disablePortSecurity",
    "enablePortSecurity",
    "Port security is off for this port (v1beta2: enablePortSecurity, inverted).",
)];

/// Which way a conversion goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// v1beta1 to v1beta2.
    Up,
    /// v1beta2 to v1beta1.
    Down,
}

/// Applies `fields` to `section` (a spec or a status, as JSON) in `direction`.
pub fn apply(section: &mut Value, fields: &[Field], direction: Direction) {
    for field in fields {
        for container in containers(section, field.at) {
            let Value::Object(map) = container else {
                continue;
            };
            let (from, to) = match direction {
                Direction::Up => (field.spoke, field.hub),
                Direction::Down => (field.hub, field.spoke),
            };
            let Some(mut value) = take(map, from) else {
                continue;
            };
            if field.flip
                && let Value::Bool(b) = value
            {
                value = Value::Bool(!b);
            }
            put(map, to, value);
        }
    }
}

/// Every node at `at` (dotted, `[]` for each element of a list), or the root for "".
pub fn containers<'v>(root: &'v mut Value, at: &str) -> Vec<&'v mut Value> {
    let mut nodes = vec![root];
    for segment in at.split('.').filter(|s| !s.is_empty()) {
        let (name, each) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        nodes = nodes
            .into_iter()
            .filter_map(|node| node.get_mut(name))
            .flat_map(|node| match (each, node) {
                (true, Value::Array(items)) => items.iter_mut().collect(),
                (true, _) => Vec::new(),
                (false, node) => vec![node],
            })
            .collect();
    }
    nodes
}

/// Removes and returns the value at a dotted path; parents left empty stay (see
/// [`drop_empty`]).
fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => map.remove(path),
        Some((head, rest)) => match map.get_mut(head) {
            Some(Value::Object(child)) => take(child, rest),
            _ => None,
        },
    }
}

/// Sets the value at a dotted path, creating parent objects. A parent that exists and is
/// not an object is left alone (and the value dropped): conversion never overwrites data.
fn put(map: &mut Map<String, Value>, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            map.insert(path.to_owned(), value);
        }
        Some((head, rest)) => {
            let child = map
                .entry(head.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(child) = child {
                put(child, rest, value);
            }
        }
    }
}

/// Removes the named members of `map` that are empty objects.
pub fn drop_empty(map: &mut Map<String, Value>, names: &[&str]) {
    for name in names {
        if map
            .get(*name)
            .is_some_and(|v| v.as_object().is_some_and(Map::is_empty))
        {
            map.remove(*name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_flipped_field_moves_and_inverts_both_ways() {
        let mut spec = json!({"disableAPIServerFloatingIP": true, "apiServerPort": 6443});
        apply(&mut spec, CLUSTER_SPEC, Direction::Up);
        assert_eq!(
            spec,
            json!({"apiServer": {"enableFloatingIP": false, "port": 6443}})
        );
        apply(&mut spec, CLUSTER_SPEC, Direction::Down);
        let Value::Object(map) = &mut spec else {
            unreachable!()
        };
        drop_empty(map, HUB_CONTAINERS);
        assert_eq!(
            spec,
            json!({"disableAPIServerFloatingIP": true, "apiServerPort": 6443})
        );
    }

    #[test]
    fn list_elements_are_each_converted() {
        let mut spec =
            json!({"ports": [{"disablePortSecurity": false}, {}, {"disablePortSecurity": true}]});
        apply(&mut spec, MACHINE_SPEC, Direction::Up);
        assert_eq!(
            spec,
            json!({"ports": [{"enablePortSecurity": true}, {}, {"enablePortSecurity": false}]})
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_moved_unchanged_never_lost() {
        let mut spec = json!({"disableExternalNetwork": "yes", "apiServer": 3});
        apply(&mut spec, CLUSTER_SPEC, Direction::Up);
        assert_eq!(spec["enableExternalNetwork"], json!("yes"));
        assert_eq!(spec["apiServer"], json!(3));
    }
}
