//! What an OpenStackMachineTemplate's status says, from its flavor and image (pure): the
//! capacity and node facts Cluster API's autoscaler reads to scale a MachineDeployment up
//! from zero, as CAPO's template controller writes them.

use std::collections::BTreeMap;

use capo_api::machine::{NodeInfo, OpenStackMachineSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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
        if bytes >= unit && bytes % unit == 0 {
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
}
