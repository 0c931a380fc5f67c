//! The managed security groups: created (or found again by CAPO's names: those whose IDs the
//! status recorded, CAPO's included, and those with our owner mark), tagged, and their rules
//! reconciled both ways.

use std::collections::BTreeMap;

use capo_api::OpenStackClusterSpec;
use capo_api::cluster::OpenStackClusterStatus;
use capo_api::common::SecurityGroupStatus;

use super::ClusterError;
use super::plan::{Names, kept_tags, owned_tags};
use super::rules::{self, Role, RuleInputs};
use crate::cloud::neutron::{Filter, SecurityGroup, SecurityGroupRule};
use crate::cloud::{CloudClient, CloudError};

/// The description CAPO gives its groups.
const DESCRIPTION: &str = "Cluster API managed group";

pub(super) fn group_name(names: &Names, role: Role) -> &str {
    match role {
        Role::ControlPlane => &names.control_plane_group,
        Role::Worker => &names.worker_group,
        Role::Bastion => &names.bastion_group,
    }
}

fn slot_of(status: &OpenStackClusterStatus, role: Role) -> &Option<SecurityGroupStatus> {
    match role {
        Role::ControlPlane => &status.control_plane_security_group,
        Role::Worker => &status.worker_security_group,
        Role::Bastion => &status.bastion_security_group,
    }
}

fn slot(status: &mut OpenStackClusterStatus, role: Role) -> &mut Option<SecurityGroupStatus> {
    match role {
        Role::ControlPlane => &mut status.control_plane_security_group,
        Role::Worker => &mut status.worker_security_group,
        Role::Bastion => &mut status.bastion_security_group,
    }
}

/// What changed, for the log and the request count.
#[derive(Debug, Default)]
pub struct RuleWork {
    pub created: usize,
    pub deleted: usize,
}

/// Brings the groups and their rules up to the spec, recording them in `status`.
pub async fn reconcile(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    bastion_enabled: bool,
    lb_additional_ports: &[u16],
    status: &mut OpenStackClusterStatus,
) -> Result<RuleWork, ClusterError> {
    if spec.managed_security_groups.is_none() {
        for role in Role::ALL {
            *slot(status, role) = None;
        }
        return Ok(RuleWork::default());
    }
    let mut groups: BTreeMap<Role, SecurityGroup> = BTreeMap::new();
    let mut found = find_all(cloud, names, status).await?;
    for role in Role::ALL {
        let wanted = role != Role::Bastion || bastion_enabled;
        let name = group_name(names, role).to_owned();
        let existing = only_one(&name, found.remove(&name).unwrap_or_default())?;
        match (wanted, existing) {
            (true, Some(group)) => {
                keep_tags(spec, names, cloud, &group).await?;
                groups.insert(role, group);
            }
            (true, None) => {
                let group = create(spec, names, cloud, &name).await?;
                groups.insert(role, group);
            }
            (false, Some(group)) => remove_unwanted(cloud, &group).await?,
            (false, None) => {}
        }
    }
    for role in Role::ALL {
        *slot(status, role) = groups.get(&role).map(|g| SecurityGroupStatus {
            name: g.name.clone(),
            id: g.id.clone(),
        });
    }
    let ids: BTreeMap<Role, String> = groups.iter().map(|(r, g)| (*r, g.id.clone())).collect();
    let node_cidrs: Vec<String> = status
        .network
        .iter()
        .flat_map(|n| &n.subnets)
        .map(|s| s.cidr.clone())
        .filter(|cidr| !cidr.contains(':'))
        .collect();
    let inputs = RuleInputs {
        spec,
        ids: &ids,
        bastion_enabled,
        node_cidrs: &node_cidrs,
        lb_additional_ports,
    };
    let desired = rules::desired_rules(&inputs).map_err(ClusterError::InvalidSpec)?;
    let mut work = RuleWork::default();
    for (role, group) in &groups {
        let wanted = desired.get(role).map(Vec::as_slice).unwrap_or_default();
        let (create, delete) = rules::changes(&group.id, wanted, &group.security_group_rules);
        for id in &delete {
            match cloud.neutron().delete_security_group_rule(id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => work.deleted += 1,
                Err(e) => return Err(ClusterError::cloud("deleting a security group rule")(e)),
            }
        }
        work.created += add_rules(cloud, *role, &group.id, wanted, create).await?;
    }
    if work.created + work.deleted > 0 {
        tracing::info!(
            created = work.created,
            deleted = work.deleted,
            "security group rules reconciled"
        );
    }
    Ok(work)
}

/// A group's missing rules, in one bulk request. Neutron refuses the whole request when the
/// group already has one of them (another pass, or someone else, added it meanwhile); then the
/// group's rules are read again and what is still missing is sent once more.
async fn add_rules(
    cloud: &CloudClient,
    role: Role,
    group_id: &str,
    wanted: &[SecurityGroupRule],
    missing: Vec<&SecurityGroupRule>,
) -> Result<usize, ClusterError> {
    let failed = || {
        ClusterError::cloud(format!(
            "adding rules to the {} security group",
            role.as_str()
        ))
    };
    let mut missing = in_group(group_id, missing);
    let mut reread = false;
    loop {
        if missing.is_empty() {
            return Ok(0);
        }
        match cloud.neutron().create_security_group_rules(&missing).await {
            Ok(made) => return Ok(made.len()),
            Err(CloudError::Conflict(_)) if !reread => {
                reread = true;
                let of_group = Filter::default().with("security_group_id", group_id);
                let existing = cloud
                    .neutron()
                    .list_security_group_rules(&of_group)
                    .await
                    .map_err(failed())?;
                missing = in_group(group_id, rules::changes(group_id, wanted, &existing).0);
            }
            Err(e) => return Err(failed()(e)),
        }
    }
}

fn in_group(group_id: &str, rules: Vec<&SecurityGroupRule>) -> Vec<SecurityGroupRule> {
    rules
        .into_iter()
        .map(|rule| SecurityGroupRule {
            security_group_id: group_id.to_owned(),
            ..rule.clone()
        })
        .collect()
}

/// Every group named as one of the cluster's, in one list (Neutron reads a repeated filter
/// as any of its values), by name: those the status recorded and those with our owner mark.
/// Another namespace's groups of the same name (CAPO's names collide for `a-b`/`c` and
/// `a`/`b-c`) are neither.
async fn find_all(
    cloud: &CloudClient,
    names: &Names,
    status: &OpenStackClusterStatus,
) -> Result<BTreeMap<String, Vec<SecurityGroup>>, ClusterError> {
    let recorded: Vec<&str> = Role::ALL
        .iter()
        .filter_map(|role| slot_of(status, *role).as_ref())
        .map(|group| group.id.as_str())
        .collect();
    let filter = Role::ALL.iter().fold(Filter::default(), |filter, role| {
        filter.with("name", group_name(names, *role))
    });
    let listed = cloud
        .neutron()
        .list_security_groups(&filter)
        .await
        .map_err(ClusterError::cloud("finding the security groups"))?;
    let mut by_name: BTreeMap<String, Vec<SecurityGroup>> = BTreeMap::new();
    let ours = listed
        .into_iter()
        .filter(|g| names.owner.owns(&g.tags, &g.description) || recorded.contains(&g.id.as_str()));
    for group in ours {
        by_name.entry(group.name.clone()).or_default().push(group);
    }
    Ok(by_name)
}

fn only_one(name: &str, found: Vec<SecurityGroup>) -> Result<Option<SecurityGroup>, ClusterError> {
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.into_iter().next()),
        n => Err(ClusterError::InvalidSpec(format!(
            "{n} security groups are named {name}: delete the extra ones"
        ))),
    }
}

async fn create(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    name: &str,
) -> Result<SecurityGroup, ClusterError> {
    let group = cloud
        .neutron()
        .create_security_group(
            name,
            &names.owner.describe(DESCRIPTION),
            &owned_tags(spec, names),
        )
        .await
        .map_err(ClusterError::cloud("creating a security group"))?;
    tracing::info!(group = %group.id, name, "created a security group");
    Ok(group)
}

/// Tags follow the spec on every pass, as CAPO does for groups; the owner mark stays where it
/// is (a group CAPO made is not marked).
async fn keep_tags(
    spec: &OpenStackClusterSpec,
    names: &Names,
    cloud: &CloudClient,
    group: &SecurityGroup,
) -> Result<(), ClusterError> {
    let wanted = kept_tags(spec, names, &group.tags);
    let mut have = group.tags.clone();
    have.sort();
    have.dedup();
    if have == wanted {
        return Ok(());
    }
    cloud
        .neutron()
        .set_tags("security-groups", &group.id, &wanted)
        .await
        .map_err(ClusterError::cloud("tagging a security group"))
}

/// The bastion group once the bastion is gone: deleted when nothing uses it any more.
async fn remove_unwanted(cloud: &CloudClient, group: &SecurityGroup) -> Result<(), ClusterError> {
    match cloud.neutron().delete_security_group(&group.id).await {
        Ok(()) | Err(CloudError::NotFound(_)) => Ok(()),
        // Still on the bastion's port: the bastion is on its way out; try next pass.
        Err(CloudError::Conflict(_)) => Ok(()),
        Err(e) => Err(ClusterError::cloud("deleting the bastion security group")(
            e,
        )),
    }
}
