//! What an OpenStackMachineTemplate's status says, from its flavor and image (pure): the
//! capacity and node facts Cluster API's autoscaler reads to scale a MachineDeployment up
//! from zero, as CAPO's template controller writes them.

use std::collections::BTreeMap;

use capo_api::OpenStackMachine;
use capo_api::machine::{NodeInfo, OpenStackMachineSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use crate::cloud::glance::Image;
use crate::cloud::nova::Flavor;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// `cpu`, `memory`, `ephemeral-storage` and `storage` of a machine of this flavor (the root
/// volume's size stands in for the flavor's disk when the machine boots from a volume); a
/// resource the flavor has none of is left out.
pub fn capacity(flavor: &Flavor, spec: &OpenStackMachineSpec) -> BTreeMap<String, Quantity> {
    let mut capacity = BTreeMap::new();
    let mut put = |name: &str, quantity: Option<String>| {
        if let Some(quantity) = quantity {
            capacity.insert(name.to_owned(), Quantity(quantity));
        }
    };
    put("cpu", (flavor.vcpus > 0).then(|| flavor.vcpus.to_string()));
    put("memory", (flavor.ram > 0).then(|| binary(flavor.ram * MIB)));
    put(
        "ephemeral-storage",
        (flavor.ephemeral > 0).then(|| binary(flavor.ephemeral * GIB)),
    );
    let root_volume = spec
        .root_volume
        .as_ref()
        .map(|v| u64::try_from(v.size_gib).unwrap_or_default())
        .filter(|size| *size > 0);
    let disk = root_volume.or((flavor.disk > 0).then_some(flavor.disk));
    put("storage", disk.map(|gib| binary(gib * GIB)));
    capacity
}

/// A byte count as Kubernetes writes a binary quantity: the largest suffix that divides it
/// (`4Gi`, `512Mi`), or plain bytes.
pub fn binary(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1_u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// The node's operating system, from the image's `os_type` property (as CAPO reads it).
pub fn node_info(image: &Image) -> Option<NodeInfo> {
    let os = image.os_type.clone().filter(|os| !os.is_empty())?;
    Some(NodeInfo {
        operating_system: Some(os),
    })
}

/// What Cluster API writes on an object it cloned from a template: the template's name and
/// group-kind.
pub const CLONED_FROM_NAME: &str = "cluster.x-k8s.io/cloned-from-name";
/// See [`CLONED_FROM_NAME`].
pub const CLONED_FROM_GROUP_KIND: &str = "cluster.x-k8s.io/cloned-from-groupkind";

/// Whether Cluster API cloned `machine` from the template `name`.
pub fn cloned_from(annotations: &BTreeMap<String, String>, name: &str) -> bool {
    let says = |key: &str| annotations.get(key).map(String::as_str);
    says(CLONED_FROM_NAME) == Some(name)
        && says(CLONED_FROM_GROUP_KIND)
            == Some("OpenStackMachineTemplate.infrastructure.cluster.x-k8s.io")
}

/// The JSON patch that gives a machine's ports the template's `allowedAddressPairs` (CAPO
/// #3056: a template's pairs edit reaches the machines made from it, whose controller pushes
/// it to their ports); `None` when they already agree, or the ports do not pair up.
pub fn address_pairs_patch(
    template: &OpenStackMachineSpec,
    machine: &OpenStackMachine,
) -> Option<Value> {
    let (wanted, have) = (&template.ports, &machine.spec.ports);
    if wanted.len() != have.len() {
        return None;
    }
    let operations: Vec<Value> = wanted
        .iter()
        .zip(have)
        .enumerate()
        .filter(|(_, (wanted, have))| wanted.allowed_address_pairs != have.allowed_address_pairs)
        .map(|(i, (wanted, have))| {
            let path = format!("/spec/ports/{i}/allowedAddressPairs");
            if wanted.allowed_address_pairs.is_empty() {
                json!({"op": "remove", "path": path})
            } else if have.allowed_address_pairs.is_empty() {
                json!({"op": "add", "path": path, "value": wanted.allowed_address_pairs})
            } else {
                json!({"op": "replace", "path": path, "value": wanted.allowed_address_pairs})
            }
        })
        .collect();
    (!operations.is_empty()).then_some(Value::Array(operations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flavor(vcpus: u32, ram: u64, disk: u64, ephemeral: u64) -> Flavor {
        Flavor {
            id: "f".into(),
            name: "f".into(),
            vcpus,
            ram,
            disk,
            ephemeral,
        }
    }

    fn spec(root_volume_gib: Option<i32>) -> OpenStackMachineSpec {
        let mut spec: OpenStackMachineSpec = serde_json::from_value(serde_json::json!({
            "flavor": {"filter": {"name": "f"}}, "image": {"filter": {"name": "i"}}}))
        .expect("a spec");
        if let Some(size) = root_volume_gib {
            spec.root_volume = serde_json::from_value(serde_json::json!({"sizeGiB": size}))
                .expect("a root volume");
        }
        spec
    }

    fn quantities(capacity: &BTreeMap<String, Quantity>) -> Vec<(String, String)> {
        capacity
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect()
    }

    #[test]
    fn a_flavor_becomes_the_capacity_the_autoscaler_reads() {
        let capacity = capacity(&flavor(2, 4096, 40, 5), &spec(None));
        assert_eq!(
            quantities(&capacity),
            [
                ("cpu".into(), "2".into()),
                ("ephemeral-storage".into(), "5Gi".into()),
                ("memory".into(), "4Gi".into()),
                ("storage".into(), "40Gi".into()),
            ]
        );
    }

    #[test]
    fn a_root_volume_is_the_storage_and_what_the_flavor_lacks_is_left_out() {
        let capacity = capacity(&flavor(1, 1536, 0, 0), &spec(Some(50)));
        assert_eq!(
            quantities(&capacity),
            [
                ("cpu".into(), "1".into()),
                ("memory".into(), "1536Mi".into()),
                ("storage".into(), "50Gi".into()),
            ]
        );
    }

    #[test]
    fn binary_quantities_take_the_largest_exact_suffix() {
        assert_eq!(binary(512 * MIB), "512Mi");
        assert_eq!(binary(3 * GIB), "3Gi");
        assert_eq!(binary(1024 * GIB), "1Ti");
        assert_eq!(binary(1000), "1000");
    }

    #[test]
    fn a_templates_pairs_edit_becomes_a_patch_of_each_differing_port() {
        let template = |pairs: &[&str]| {
            let ports: Vec<Value> = vec![
                json!({}),
                json!({"allowedAddressPairs": pairs.iter().map(|ip| json!({"ipAddress": ip})).collect::<Vec<_>>()}),
            ];
            let spec: OpenStackMachineSpec = serde_json::from_value(json!({
                "flavor": {"filter": {"name": "f"}}, "image": {"filter": {"name": "i"}},
                "ports": ports}))
            .expect("a spec");
            spec
        };
        let machine = |pairs: &[&str]| OpenStackMachine::new("m", template(pairs));
        assert_eq!(
            address_pairs_patch(&template(&["10.0.0.1"]), &machine(&["10.0.0.1"])),
            None
        );
        assert_eq!(
            address_pairs_patch(&template(&["10.0.0.2"]), &machine(&["10.0.0.1"])),
            Some(
                json!([{"op": "replace", "path": "/spec/ports/1/allowedAddressPairs",
                         "value": [{"ipAddress": "10.0.0.2"}]}])
            )
        );
        assert_eq!(
            address_pairs_patch(&template(&[]), &machine(&["10.0.0.1"])),
            Some(json!([{"op": "remove", "path": "/spec/ports/1/allowedAddressPairs"}]))
        );
        let mut fewer = machine(&["10.0.0.1"]);
        fewer.spec.ports.pop();
        assert_eq!(
            address_pairs_patch(&template(&["10.0.0.2"]), &fewer),
            None,
            "ports that do not pair up"
        );
    }
}
