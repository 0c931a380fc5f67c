//! `capo-rs bench store-memory`: what one object of each watched kind costs in the manager's
//! stores, as the production watches keep it: decoded from its JSON (the owned kinds packed,
//! as their watches keep them), trimmed by the same functions, and stored behind the store's
//! key. Each kind is measured in a process of its
//! own, so that one kind's allocations do not pad another's: the process decodes and stores
//! N objects shaped as `bench scale` makes them, and its resident memory grows by what they
//! cost, allocator slack included.

use std::path::Path;

use anyhow::Context as _;
use capo_api::capi::{Cluster, Machine};
use capo_provider::controllers::packed::Packed;
use capo_provider::controllers::{cluster, machine, server};
use capo_provider::manager::controllers::{packed_as_is, strip_for_cache};
use kube::runtime::reflector::{self, Lookup};
use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::scale::proc_sample;

/// The kinds the manager's shared watches store, with how many of each `bench scale
/// --clusters 1000` watches.
pub const KINDS: [(&str, u64); 5] = [
    ("Cluster", 1000),
    ("Machine", 6000),
    ("OpenStackCluster", 1000),
    ("OpenStackMachine", 6000),
    ("OpenStackServer", 6000),
];

/// One kind's figures.
#[derive(Clone, Debug, Serialize)]
pub struct KindFigure {
    pub kind: String,
    /// One object's JSON as the API server sends it (without managedFields).
    pub json_bytes: usize,
    /// Resident memory per stored object.
    pub bytes_per_object: f64,
    /// How many of them `bench scale --clusters 1000` watches.
    pub at_1000_clusters: u64,
}

/// Measures every kind, each in a child process (`binary bench store-memory --kind K`).
pub fn run(binary: &Path, objects: u32) -> anyhow::Result<Vec<KindFigure>> {
    KINDS
        .iter()
        .map(|(kind, at_1000_clusters)| {
            let output = std::process::Command::new(binary)
                .args(["bench", "store-memory", "--objects", &objects.to_string()])
                .args(["--kind", kind])
                .output()
                .with_context(|| format!("running {}", binary.display()))?;
            anyhow::ensure!(
                output.status.success(),
                "measuring {kind}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let text = String::from_utf8_lossy(&output.stdout);
            let bytes_per_object: f64 = text
                .trim()
                .parse()
                .with_context(|| format!("reading {kind}'s figure from {text:?}"))?;
            Ok(KindFigure {
                kind: (*kind).to_owned(),
                json_bytes: sample(kind, 0)?.to_string().len(),
                bytes_per_object,
                at_1000_clusters: *at_1000_clusters,
            })
        })
        .collect()
}

/// In this process: stores `objects` objects of `kind` and returns the resident memory they
/// added, per object.
pub fn measure_here(kind: &str, objects: u32) -> anyhow::Result<f64> {
    match kind {
        "Cluster" => fill::<Cluster>(kind, objects, strip_for_cache::<Cluster>),
        "Machine" => fill::<Packed<Machine>>(kind, objects, packed_as_is::<Packed<Machine>>),
        "OpenStackCluster" => {
            fill::<cluster::Watched>(kind, objects, packed_as_is::<cluster::Watched>)
        }
        "OpenStackMachine" => {
            fill::<machine::Watched>(kind, objects, packed_as_is::<machine::Watched>)
        }
        "OpenStackServer" => {
            fill::<server::Watched>(kind, objects, packed_as_is::<server::Watched>)
        }
        other => anyhow::bail!(
            "no kind {other}: one of {}",
            KINDS.map(|(kind, _)| kind).join(", ")
        ),
    }
}

/// Decodes each object from its JSON text, trims it and stores it as the shared watch does
/// (the store keeps its own copy; the decoded one is dropped).
fn fill<K>(kind: &str, objects: u32, trim: fn(&mut K)) -> anyhow::Result<f64>
where
    K: Lookup<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    let texts: Vec<Vec<u8>> = (0..objects)
        .map(|i| Ok(serde_json::to_vec(&sample(kind, i)?)?))
        .collect::<anyhow::Result<_>>()?;
    let (store, mut writer) = reflector::store::<K>();
    let before = proc_sample(std::process::id()).rss;
    for text in &texts {
        let mut object: K = serde_json::from_slice(text)?;
        trim(&mut object);
        writer.apply_watcher_event(&Event::Apply(object));
    }
    let after = proc_sample(std::process::id()).rss;
    anyhow::ensure!(
        store.state().len() == objects as usize,
        "stored {} of {objects}",
        store.state().len()
    );
    Ok(after.saturating_sub(before) as f64 / f64::from(objects))
}

/// A unique id for object `i` of a kind, shaped as the API server's.
fn uid(kind: &str, i: u32) -> String {
    let tag = kind.len() as u32;
    format!("{tag:08x}-5a30-4afa-980d-{i:012x}")
}

/// Object `i` of `kind`, as `bench scale` leaves it at steady state: a control-plane machine
/// (of cluster `i / 6`), its server, or cluster `i`.
pub fn sample(kind: &str, i: u32) -> anyhow::Result<Value> {
    // Six machines to a cluster; the cluster kinds' object `i` is cluster `i`.
    let cluster_index = if kind.ends_with("Cluster") { i } else { i / 6 };
    let cluster = format!("scale-{cluster_index:04}");
    let machine = format!("{cluster}-control-plane-{i:05}");
    let meta = |name: &str, generation: u32| {
        json!({
            "creationTimestamp": "2026-11-25T19:01:31Z",
            "generation": generation,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
            "name": name,
            "namespace": "default",
            "resourceVersion": (1000 + i).to_string(),
            "uid": uid(kind, i),
        })
    };
    let owner = |api_version: &str, owner_kind: &str, name: &str| {
        json!([{
            "apiVersion": api_version, "blockOwnerDeletion": true, "controller": true,
            "kind": owner_kind, "name": name, "uid": uid(owner_kind, i),
        }])
    };
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "lastTransitionTime": "2026-11-25T19:01:38Z", "message": message,
            "observedGeneration": 2, "reason": reason, "status": status, "type": type_,
        })
    };
    let address = format!("10.{}.{}.{}", (i / 65536) % 256, (i / 256) % 256, i % 256);
    let instance = uid("server", i);
    let provider_id = format!("openstack:///{instance}");
    let resolved = json!({
        "flavorID": "2",
        "imageID": "d3b31dc9-0717-4085-b878-a1d07d0065d6",
        "ports": [{
            "description": format!("Created by cluster-api-provider-openstack cluster {cluster}"),
            "name": format!("{machine}-0"),
            "networkID": uid("network", i / 6),
            "securityGroups": [uid("secgroup", i / 6)],
        }],
    });
    let instance_status = |conditions: Value| {
        json!({
            "addresses": [{"address": address, "type": "InternalIP"}],
            "conditions": conditions,
            "initialization": {"provisioned": true},
            "instanceID": instance,
            "instanceState": "ACTIVE",
            "observedGeneration": 2,
            "resolved": resolved,
            "resources": {"ports": [{"id": uid("port", i)}]},
        })
    };
    let object = match kind {
        "Cluster" => json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": meta(&cluster, 2),
            "spec": {
                "controlPlaneEndpoint": {"host": address, "port": 6443},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                      "kind": "OpenStackCluster", "name": cluster},
            },
            "status": {"initialization": {"infrastructureProvisioned": true}},
        }),
        "Machine" => {
            let mut metadata = meta(&machine, 3);
            metadata["finalizers"] = json!(["machine.cluster.x-k8s.io"]);
            metadata["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
            json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": metadata,
                "spec": {
                    "bootstrap": {"dataSecretName": format!("{machine}-bootstrap")},
                    "clusterName": cluster,
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "OpenStackMachine", "name": machine},
                    "providerID": provider_id,
                    "version": "v1.33.4",
                },
                "status": {
                    "initialization": {"bootstrapDataSecretCreated": true,
                                       "infrastructureProvisioned": true},
                    "nodeRef": {"name": machine},
                    "phase": "Running",
                },
            })
        }
        "OpenStackMachine" => {
            let mut metadata = meta(&machine, 2);
            metadata["finalizers"] = json!(["openstackmachine.infrastructure.cluster.x-k8s.io"]);
            metadata["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
            metadata["ownerReferences"] = owner("cluster.x-k8s.io/v1beta2", "Machine", &machine);
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                "kind": "OpenStackMachine",
                "metadata": metadata,
                "spec": {
                    "flavor": {"filter": {"name": "m1.small"}},
                    "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
                    "providerID": provider_id,
                },
                "status": instance_status(json!([
                    condition("Ready", "True", "Ready", ""),
                    condition("Paused", "False", "NotPaused", ""),
                    condition("InstanceReady", "True", "Ready", ""),
                    condition("APIServerLoadBalancerMemberReady", "True", "Ready",
                              "member ACTIVE and serving"),
                    condition("APIServerIngressReady", "True", "Ready", ""),
                    condition("OpenStackAuthenticationSucceeded", "True", "Ready", ""),
                ])),
            })
        }
        "OpenStackServer" => {
            let mut metadata = meta(&machine, 1);
            metadata["finalizers"] = json!(["openstackserver.infrastructure.cluster.x-k8s.io"]);
            metadata["ownerReferences"] = owner(
                "infrastructure.cluster.x-k8s.io/v1beta2",
                "OpenStackMachine",
                &machine,
            );
            let mut status = instance_status(json!([
                condition("Ready", "True", "Ready", ""),
                condition("Paused", "False", "NotPaused", ""),
                condition("InstanceReady", "True", "Ready", ""),
                condition("OpenStackAuthenticationSucceeded", "True", "Ready", ""),
            ]));
            status["initialization"] = json!({"provisioned": true});
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "OpenStackServer",
                "metadata": metadata,
                "spec": {
                    "flavor": "m1.small",
                    "identityRef": {"cloudName": "sim", "name": "cloud-config", "type": "Secret"},
                    "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
                    "ports": [{"network": {"id": uid("network", i / 6)},
                               "securityGroups": [{"id": uid("secgroup", i / 6)}]}],
                    "sshKeyName": "",
                    "userDataRef": {"name": format!("{machine}-bootstrap")},
                },
                "status": status,
            })
        }
        "OpenStackCluster" => open_stack_cluster(&cluster, i, meta(&cluster, 2), &condition),
        other => anyhow::bail!("no kind {other}"),
    };
    Ok(object)
}

fn open_stack_cluster(
    cluster: &str,
    i: u32,
    mut metadata: Value,
    condition: &dyn Fn(&str, &str, &str, &str) -> Value,
) -> Value {
    let network_name = format!("k8s-clusterapi-cluster-default-{cluster}");
    metadata["finalizers"] = json!(["openstackcluster.infrastructure.cluster.x-k8s.io"]);
    metadata["ownerReferences"] = json!([{
        "apiVersion": "cluster.x-k8s.io/v1beta2", "blockOwnerDeletion": true,
        "controller": true, "kind": "Cluster", "name": cluster, "uid": uid("Cluster", i),
    }]);
    let member = |n: u32| {
        json!({
            "address": format!("10.6.0.{}", 4 + n), "id": uid("member", i * 3 + n),
            "name": format!("{cluster}-control-plane-{n}"), "operatingStatus": "ONLINE",
            "pool": uid("pool", i), "port": 6443, "provisioningStatus": "ACTIVE",
            "since": "2026-11-25T19:01:41Z",
        })
    };
    let group = |role: &str| json!({"id": uid(role, i), "name": format!("k8s-cluster-default-{cluster}-secgroup-{role}")});
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": metadata,
        "spec": {
            "apiServer": {"enableFloatingIP": false, "managedLoadBalancer": {"enabled": true}},
            "controlPlaneEndpoint": {"host": "10.6.0.2", "port": 6443},
            "enableExternalNetwork": false,
            "identityRef": {"cloudName": "sim", "name": "cloud-config", "type": "Secret"},
            "managedSecurityGroups": {"allowAllInClusterTraffic": true},
            "managedSubnets": [{"cidr": "10.6.0.0/24"}],
        },
        "status": {
            "apiServerManagedLoadBalancer": {
                "id": uid("lb", i), "internalIP": "10.6.0.2", "ip": "10.6.0.2",
                "loadBalancerNetwork": {"id": uid("network", i), "name": network_name,
                    "subnets": [{"cidr": "10.6.0.0/24", "id": uid("subnet", i), "name": network_name}]},
                "members": [member(0), member(1), member(2)],
                "membersAsOf": "2026-11-25T19:01:31",
                "name": format!("{network_name}-kubeapi"),
                "pools": [{"listenerID": uid("listener", i), "monitorID": uid("monitor", i),
                           "poolID": uid("pool", i), "port": 6443}],
            },
            "conditions": [
                condition("Ready", "True", "Ready", ""),
                condition("Paused", "False", "NotPaused", ""),
                condition("NetworkReady", "True", "Ready", &format!("network {network_name} (10.6.0.0/24)")),
                condition("SecurityGroupsReady", "True", "Ready", "managed security groups and their rules in place"),
                condition("APIServerLoadBalancerReady", "True", "Ready", "load balancer ACTIVE and all 3 members ACTIVE and serving"),
                condition("APIServerLoadBalancerHealthy", "True", "Healthy", ""),
                condition("APIEndpointReady", "True", "Ready", "10.6.0.2:6443"),
                condition("OpenStackAuthenticationSucceeded", "True", "Ready", ""),
                condition("RouterReady", "True", "Ready", &format!("network {network_name} (10.6.0.0/24)")),
            ],
            "controlPlaneSecurityGroup": group("controlplane"),
            "workerSecurityGroup": group("worker"),
            "initialization": {"provisioned": true},
            "network": {"id": uid("network", i), "name": network_name,
                        "subnets": [{"cidr": "10.6.0.0/24", "id": uid("subnet", i), "name": network_name}]},
            "observedGeneration": 2,
        },
    })
}

/// The table `capo-rs bench store-memory` prints.
pub fn print(figures: &[KindFigure]) {
    println!(
        "{:<18} {:>10} {:>16} {:>14} {:>12}",
        "kind", "JSON B", "stored B/object", "at 1,000", "MiB there"
    );
    let mut total = 0.0;
    for figure in figures {
        let there = figure.bytes_per_object * figure.at_1000_clusters as f64 / 1048576.0;
        total += there;
        println!(
            "{:<18} {:>10} {:>16.0} {:>14} {:>12.1}",
            figure.kind, figure.json_bytes, figure.bytes_per_object, figure.at_1000_clusters, there
        );
    }
    println!(
        "{:<18} {:>10} {:>16} {:>14} {:>12.1}",
        "all stores", "", "", "", total
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackServer};

    #[test]
    fn every_sample_decodes_as_the_kind_the_store_holds() {
        for (kind, _) in KINDS {
            for i in [0, 5, 6, 9999] {
                let value = sample(kind, i).unwrap();
                let decoded = match kind {
                    "Cluster" => serde_json::from_value::<Cluster>(value).is_ok(),
                    "Machine" => serde_json::from_value::<Machine>(value).is_ok(),
                    "OpenStackCluster" => serde_json::from_value::<OpenStackCluster>(value).is_ok(),
                    "OpenStackMachine" => serde_json::from_value::<OpenStackMachine>(value).is_ok(),
                    _ => serde_json::from_value::<OpenStackServer>(value).is_ok(),
                };
                assert!(decoded, "{kind} {i} does not decode");
            }
        }
    }

    #[test]
    fn every_kind_is_stored_whole_and_an_unknown_kind_is_refused() {
        for (kind, _) in KINDS {
            // `fill` fails unless the store holds every object.
            measure_here(kind, 20).unwrap();
        }
        let refused = measure_here("Pod", 1).unwrap_err().to_string();
        assert!(refused.contains("OpenStackServer"), "{refused}");
    }
}
