//! The managed security groups' rules, as CAPO writes them, and the two-way comparison with
//! what Neutron has. Pure: the groups' IDs are passed in.

use std::collections::BTreeMap;

use capo_api::OpenStackClusterSpec;
use capo_api::cluster::{EtherType, ManagedGroupName, RuleDirection, SecurityGroupRuleSpec};

use crate::cloud::neutron::SecurityGroupRule;

/// The managed groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The control plane nodes' group (`controlplane`).
    ControlPlane,
    /// The worker nodes' group (`worker`).
    Worker,
    /// The bastion's group (`bastion`), only while the bastion is enabled.
    Bastion,
}

impl Role {
    /// Every role, in order.
    pub const ALL: [Role; 3] = [Role::ControlPlane, Role::Worker, Role::Bastion];

    /// The role as messages name it (`control plane`, `worker`, `bastion`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ControlPlane => "control plane",
            Role::Worker => "worker",
            Role::Bastion => "bastion",
        }
    }
}

impl From<ManagedGroupName> for Role {
    fn from(name: ManagedGroupName) -> Self {
        match name {
            ManagedGroupName::Controlplane => Role::ControlPlane,
            ManagedGroupName::Worker => Role::Worker,
            ManagedGroupName::Bastion => Role::Bastion,
        }
    }
}

/// What the rules are built from.
pub struct RuleInputs<'a> {
    /// The OpenStackCluster's spec: `managedSecurityGroups` and its extra rules.
    pub spec: &'a OpenStackClusterSpec,
    /// Each existing group's ID.
    pub ids: &'a BTreeMap<Role, String>,
    /// Whether the cluster has a bastion: the nodes then admit SSH from its group; without
    /// one, an extra rule naming the bastion group is a spec error.
    pub bastion_enabled: bool,
    /// The cluster subnets' IPv4 CIDRs (NodePorts are open to them).
    pub node_cidrs: &'a [String],
    /// Extra ports the API load balancer forwards.
    pub lb_additional_ports: &'a [u16],
}

fn rule(description: &str, protocol: Option<&str>, ports: Option<(u16, u16)>) -> SecurityGroupRule {
    SecurityGroupRule {
        id: String::new(),
        security_group_id: String::new(),
        direction: "ingress".into(),
        ethertype: Some("IPv4".into()),
        protocol: protocol.map(str::to_owned),
        port_range_min: ports.map(|p| p.0),
        port_range_max: ports.map(|p| p.1),
        remote_ip_prefix: None,
        remote_group_id: None,
        description: Some(description.into()),
    }
}

fn from_group(mut rule: SecurityGroupRule, group: &str) -> SecurityGroupRule {
    rule.remote_group_id = Some(group.to_owned());
    rule
}

/// Neutron's own egress rules, which CAPO also wants: kept, never deleted.
fn egress() -> [SecurityGroupRule; 2] {
    let open = |ethertype: &str| SecurityGroupRule {
        direction: "egress".into(),
        ethertype: Some(ethertype.into()),
        ..rule("Full open", None, None)
    };
    [open("IPv4"), open("IPv6")]
}

/// Every managed group's rules. A group not yet created gets none; neither do rules that
/// name it as their remote (they come once it exists).
pub fn desired_rules(
    inputs: &RuleInputs<'_>,
) -> Result<BTreeMap<Role, Vec<SecurityGroupRule>>, String> {
    let Some(managed) = &inputs.spec.managed_security_groups else {
        return Ok(BTreeMap::new());
    };
    let ids = inputs.ids;
    let id = |role: Role| ids.get(&role).map(String::as_str);
    let allow_all = managed.allow_all_in_cluster_traffic == Some(true);
    let mut rules: BTreeMap<Role, Vec<SecurityGroupRule>> = BTreeMap::new();
    let (Some(cp), Some(worker)) = (id(Role::ControlPlane), id(Role::Worker)) else {
        return Ok(rules);
    };

    let mut control_plane = egress().to_vec();
    control_plane.push(rule("Kubernetes API", Some("tcp"), Some((6443, 6443))));
    for port in inputs.lb_additional_ports {
        control_plane.push(rule("Additional port", Some("tcp"), Some((*port, *port))));
    }
    let mut workers = egress().to_vec();
    for cidr in inputs.node_cidrs {
        for protocol in ["tcp", "udp"] {
            let mut open = rule("Node Port Services", Some(protocol), Some((30000, 32767)));
            open.remote_ip_prefix = Some(cidr.clone());
            workers.push(open);
        }
    }
    for protocol in ["tcp", "udp"] {
        for group in [worker, cp] {
            let open = rule("Node Port Services", Some(protocol), Some((30000, 32767)));
            workers.push(from_group(open, group));
        }
    }
    if allow_all {
        for (own, other, list) in [(cp, worker, &mut control_plane), (worker, cp, &mut workers)] {
            for group in [own, other] {
                list.push(from_group(rule("In-cluster Ingress", None, None), group));
            }
        }
    } else {
        control_plane.push(from_group(
            rule("Etcd", Some("tcp"), Some((2379, 2380))),
            cp,
        ));
        for group in [cp, worker] {
            let kubelet = rule("Kubelet API", Some("tcp"), Some((10250, 10250)));
            control_plane.push(from_group(kubelet.clone(), group));
            workers.push(from_group(kubelet, group));
        }
    }
    if inputs.bastion_enabled
        && let Some(bastion) = id(Role::Bastion)
    {
        let ssh = from_group(rule("SSH", Some("tcp"), Some((22, 22))), bastion);
        control_plane.push(ssh.clone());
        workers.push(ssh);
        let mut own = egress().to_vec();
        own.push(rule("SSH", Some("tcp"), Some((22, 22))));
        rules.insert(Role::Bastion, own);
    }
    let extra = |specs: &[SecurityGroupRuleSpec]| expand(specs, ids, inputs.bastion_enabled);
    control_plane.extend(extra(&managed.control_plane_nodes_security_group_rules)?);
    workers.extend(extra(&managed.worker_nodes_security_group_rules)?);
    let common = extra(&managed.cluster_nodes_security_group_rules)?;
    control_plane.extend(common.iter().cloned());
    workers.extend(common);
    rules.insert(Role::ControlPlane, control_plane);
    rules.insert(Role::Worker, workers);
    Ok(rules)
}

/// The spec's extra rules: one copy per remote managed group.
fn expand(
    specs: &[SecurityGroupRuleSpec],
    ids: &BTreeMap<Role, String>,
    bastion_enabled: bool,
) -> Result<Vec<SecurityGroupRule>, String> {
    let mut out = Vec::new();
    for spec in specs {
        if spec.remote_group_id.is_some() && !spec.remote_managed_groups.is_empty() {
            return Err(format!(
                "security group rule {:?} sets both remoteGroupID and remoteManagedGroups",
                spec.name
            ));
        }
        let port = |p: Option<i32>| p.and_then(|p| u16::try_from(p).ok());
        let base = SecurityGroupRule {
            id: String::new(),
            security_group_id: String::new(),
            direction: match spec.direction {
                RuleDirection::Ingress => "ingress".into(),
                RuleDirection::Egress => "egress".into(),
            },
            ethertype: Some(match spec.ether_type {
                Some(EtherType::IPv6) => "IPv6".into(),
                _ => "IPv4".into(),
            }),
            protocol: spec.protocol.clone(),
            port_range_min: port(spec.port_range_min),
            port_range_max: port(spec.port_range_max),
            remote_ip_prefix: spec.remote_ip_prefix.clone(),
            remote_group_id: spec.remote_group_id.clone(),
            description: spec.description.clone(),
        };
        if spec.remote_managed_groups.is_empty() {
            out.push(base);
            continue;
        }
        for group in &spec.remote_managed_groups {
            let role = Role::from(*group);
            if role == Role::Bastion && !bastion_enabled {
                return Err(format!(
                    "security group rule {:?} names the bastion group, but the bastion is not enabled",
                    spec.name
                ));
            }
            // A group not created yet: its rules come on a later pass.
            if let Some(id) = ids.get(&role) {
                out.push(from_group(base.clone(), id));
            }
        }
    }
    Ok(out)
}

/// What makes two rules the same (the description does not).
fn key(rule: &SecurityGroupRule, own_group: &str) -> impl Ord + use<> {
    let remote_group = rule
        .remote_group_id
        .clone()
        .filter(|g| !g.is_empty())
        .map(|g| if g == own_group { "self".to_owned() } else { g });
    (
        rule.direction.to_lowercase(),
        rule.ethertype.clone().unwrap_or_else(|| "IPv4".into()),
        rule.protocol.clone().map(|p| p.to_lowercase()),
        rule.port_range_min,
        rule.port_range_max,
        rule.remote_ip_prefix.clone().filter(|p| !p.is_empty()),
        remote_group,
    )
}

/// What to create and what to delete (by ID) so that `existing` becomes `desired`.
pub fn changes<'a>(
    group: &str,
    desired: &'a [SecurityGroupRule],
    existing: &[SecurityGroupRule],
) -> (Vec<&'a SecurityGroupRule>, Vec<String>) {
    let wanted: Vec<_> = desired.iter().map(|r| key(r, group)).collect();
    let mut delete = Vec::new();
    let mut have = Vec::new();
    for rule in existing {
        let k = key(rule, group);
        if wanted.contains(&k) && !have.contains(&k) {
            have.push(k);
        } else {
            delete.push(rule.id.clone());
        }
    }
    let mut create = Vec::new();
    for rule in desired {
        let k = key(rule, group);
        if !have.contains(&k) {
            create.push(rule);
            have.push(k);
        }
    }
    (create, delete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::cluster::ManagedSecurityGroups;

    fn ids(bastion: bool) -> BTreeMap<Role, String> {
        let mut ids = BTreeMap::from([
            (Role::ControlPlane, "cp".to_owned()),
            (Role::Worker, "w".to_owned()),
        ]);
        if bastion {
            ids.insert(Role::Bastion, "b".into());
        }
        ids
    }

    fn spec(managed: ManagedSecurityGroups) -> OpenStackClusterSpec {
        OpenStackClusterSpec {
            managed_security_groups: Some(managed),
            ..OpenStackClusterSpec::default()
        }
    }

    fn described(rules: &[SecurityGroupRule]) -> Vec<String> {
        rules
            .iter()
            .map(|r| {
                format!(
                    "{} {} {:?} {:?}-{:?} {:?} {:?}",
                    r.direction,
                    r.description.clone().unwrap_or_default(),
                    r.protocol,
                    r.port_range_min,
                    r.port_range_max,
                    r.remote_ip_prefix,
                    r.remote_group_id
                )
            })
            .collect()
    }

    #[test]
    fn the_default_rules_are_capos() {
        let spec = spec(ManagedSecurityGroups::default());
        let ids = ids(false);
        let inputs = RuleInputs {
            spec: &spec,
            ids: &ids,
            bastion_enabled: false,
            node_cidrs: &["10.6.0.0/24".into()],
            lb_additional_ports: &[],
        };
        let rules = desired_rules(&inputs).unwrap();
        let cp = described(&rules[&Role::ControlPlane]);
        assert!(cp.contains(
            &r#"ingress Kubernetes API Some("tcp") Some(6443)-Some(6443) None None"#.to_owned()
        ));
        assert!(cp.contains(
            &r#"ingress Etcd Some("tcp") Some(2379)-Some(2380) None Some("cp")"#.to_owned()
        ));
        assert!(cp.contains(
            &r#"ingress Kubelet API Some("tcp") Some(10250)-Some(10250) None Some("w")"#.to_owned()
        ));
        assert_eq!(cp.iter().filter(|r| r.starts_with("egress")).count(), 2);
        let workers = described(&rules[&Role::Worker]);
        assert!(workers.contains(&r#"ingress Node Port Services Some("udp") Some(30000)-Some(32767) Some("10.6.0.0/24") None"#.to_owned()));
        assert!(!rules.contains_key(&Role::Bastion));
        assert!(!cp.iter().any(|r| r.contains("SSH")));
    }

    #[test]
    fn allow_all_replaces_etcd_and_kubelet_and_the_bastion_adds_ssh() {
        let spec = spec(ManagedSecurityGroups {
            allow_all_in_cluster_traffic: Some(true),
            ..ManagedSecurityGroups::default()
        });
        let ids = ids(true);
        let inputs = RuleInputs {
            spec: &spec,
            ids: &ids,
            bastion_enabled: true,
            node_cidrs: &[],
            lb_additional_ports: &[8443],
        };
        let rules = desired_rules(&inputs).unwrap();
        let cp = described(&rules[&Role::ControlPlane]);
        assert!(
            !cp.iter()
                .any(|r| r.contains("Etcd") || r.contains("Kubelet"))
        );
        assert_eq!(
            cp.iter()
                .filter(|r| r.contains("In-cluster Ingress"))
                .count(),
            2
        );
        assert!(
            cp.iter()
                .any(|r| r.contains("Additional port") && r.contains("8443"))
        );
        assert!(
            cp.contains(&r#"ingress SSH Some("tcp") Some(22)-Some(22) None Some("b")"#.to_owned())
        );
        let bastion = described(&rules[&Role::Bastion]);
        assert!(
            bastion.contains(&r#"ingress SSH Some("tcp") Some(22)-Some(22) None None"#.to_owned())
        );
    }

    #[test]
    fn extra_rules_expand_per_remote_managed_group_and_go_to_the_right_groups() {
        let calico = SecurityGroupRuleSpec {
            name: "BGP (Calico)".into(),
            description: Some("BGP".into()),
            direction: RuleDirection::Ingress,
            ether_type: Some(EtherType::IPv4),
            port_range_min: Some(179),
            port_range_max: Some(179),
            protocol: Some("tcp".into()),
            remote_group_id: None,
            remote_ip_prefix: None,
            remote_managed_groups: vec![ManagedGroupName::Controlplane, ManagedGroupName::Worker],
        };
        let only_cp = SecurityGroupRuleSpec {
            name: "cp only".into(),
            remote_managed_groups: vec![],
            remote_ip_prefix: Some("192.0.2.0/24".into()),
            ..calico.clone()
        };
        let calico_spec = spec(ManagedSecurityGroups {
            cluster_nodes_security_group_rules: vec![calico.clone()],
            control_plane_nodes_security_group_rules: vec![only_cp],
            ..ManagedSecurityGroups::default()
        });
        let ids = ids(false);
        let inputs = RuleInputs {
            spec: &calico_spec,
            ids: &ids,
            bastion_enabled: false,
            node_cidrs: &[],
            lb_additional_ports: &[],
        };
        let rules = desired_rules(&inputs).unwrap();
        let count = |role: Role, what: &str| {
            described(&rules[&role])
                .iter()
                .filter(|r| r.contains(what))
                .count()
        };
        assert_eq!(
            count(Role::ControlPlane, "BGP"),
            3,
            "two remotes + the cp-only rule"
        );
        assert_eq!(count(Role::Worker, "BGP"), 2);
        let bastion_remote = SecurityGroupRuleSpec {
            remote_managed_groups: vec![ManagedGroupName::Bastion],
            ..calico.clone()
        };
        let bad = spec(ManagedSecurityGroups {
            worker_nodes_security_group_rules: vec![bastion_remote],
            ..ManagedSecurityGroups::default()
        });
        let inputs = RuleInputs {
            spec: &bad,
            ..inputs
        };
        assert!(desired_rules(&inputs).unwrap_err().contains("bastion"));
        let both = SecurityGroupRuleSpec {
            remote_group_id: Some("x".into()),
            ..calico
        };
        assert!(expand(&[both], &ids, false).unwrap_err().contains("both"));
    }

    #[test]
    fn changes_add_what_is_missing_and_remove_what_is_not_wanted() {
        let wanted = vec![
            rule("Kubernetes API", Some("tcp"), Some((6443, 6443))),
            from_group(rule("Etcd", Some("tcp"), Some((2379, 2380))), "cp"),
        ];
        let mut have_api = rule("other words", Some("TCP"), Some((6443, 6443)));
        have_api.id = "r1".into();
        let mut have_old = rule("old", Some("tcp"), Some((22, 22)));
        have_old.id = "r2".into();
        let mut duplicate = have_api.clone();
        duplicate.id = "r3".into();
        let (create, delete) = changes("cp", &wanted, &[have_api, have_old, duplicate]);
        assert_eq!(create.len(), 1);
        assert_eq!(create[0].description.as_deref(), Some("Etcd"));
        assert_eq!(delete, ["r2", "r3"]);
        let (create, delete) = changes("cp", &wanted, &[]);
        assert_eq!((create.len(), delete.len()), (2, 0));
    }
}
