//! Turns what the spec names (image, flavor, server group, networks, subnets, security
//! groups, by ID or filter) into UUIDs, once: the result is kept in `status.resolved`, and the
//! spec is immutable. A filter that matches nothing, or more than one where one is needed, is
//! a spec problem, not a cloud one.

use capo_api::OpenStackServerSpec;
use capo_api::common::{
    IdOrFilter, NameFilter, NetworkStatusWithSubnets, NeutronFilter, PortOpts, ResolvedServerSpec,
    SubnetFilter, SubnetParam,
};

use super::plan::{ResolvedRefs, resolved_port};
use crate::cloud::neutron::Filter;
use crate::cloud::{CloudClient, CloudError};

/// Why something the spec names could not be turned into an ID.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The spec names something the cloud does not have, or names it ambiguously.
    #[error("{0}")]
    Spec(String),
    /// The lookup itself failed in the cloud.
    #[error("resolving {what}: {source}")]
    Cloud {
        /// What was being looked up (`the image`, `a subnet of port 0`).
        what: String,
        /// The cloud's error.
        #[source]
        source: CloudError,
    },
}

fn cloud(what: impl Into<String>) -> impl FnOnce(CloudError) -> ResolveError {
    let what = what.into();
    move |source| ResolveError::Cloud { what, source }
}

/// Exactly one match, or a spec problem naming `what`.
pub(crate) fn exactly_one<T>(
    what: &str,
    mut found: Vec<T>,
    id: impl Fn(&T) -> &str,
) -> Result<T, ResolveError> {
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(ResolveError::Spec(format!("no {what} matches"))),
        n => {
            let ids: Vec<&str> = found.iter().map(&id).collect();
            Err(ResolveError::Spec(format!(
                "{n} {what}s match, one is needed: {}",
                ids.join(", ")
            )))
        }
    }
}

/// Everything the spec names, as UUIDs.
pub async fn resolve(
    cloud_client: &CloudClient,
    server: &str,
    spec: &OpenStackServerSpec,
    cluster: Option<&str>,
) -> Result<ResolvedServerSpec, ResolveError> {
    let image_id = image(cloud_client, spec).await?;
    let flavor_id = flavor(cloud_client, spec).await?;
    let server_group_id = match &spec.server_group {
        Some(group) => Some(server_group(cloud_client, group).await?),
        None => None,
    };
    let default_groups = security_groups(cloud_client, &spec.security_groups).await?;
    let mut ports = Vec::with_capacity(spec.ports.len());
    for (index, port) in spec.ports.iter().enumerate() {
        let refs = port_refs(cloud_client, index, port, &default_groups).await?;
        ports.push(resolved_port(server, index, port, spec, cluster, refs));
    }
    Ok(ResolvedServerSpec {
        server_group_id,
        image_id: Some(image_id),
        flavor_id: Some(flavor_id),
        ports,
    })
}

async fn image(
    cloud_client: &CloudClient,
    spec: &OpenStackServerSpec,
) -> Result<String, ResolveError> {
    if let Some(id) = &spec.image.id {
        return Ok(id.clone());
    }
    let question = format!("image {:?}", spec.image.filter);
    remembered(cloud_client, question, async || {
        find_image(cloud_client, &spec.image).await.map(|i| i.id)
    })
    .await
}

/// `ask`'s answer to `question`, shared with the other servers of these credentials for a
/// while ([`crate::cloud::lookups`]): a burst of servers naming one image asks once.
async fn remembered(
    cloud_client: &CloudClient,
    question: String,
    ask: impl AsyncFnOnce() -> Result<String, ResolveError>,
) -> Result<String, ResolveError> {
    let lookups = cloud_client.path().lookups();
    if let Some(id) = lookups.known(&question) {
        return Ok(id);
    }
    let _turn = lookups.ask(&question).await;
    if let Some(id) = lookups.known(&question) {
        return Ok(id);
    }
    let id = ask().await?;
    lookups.remember(&question, &id);
    Ok(id)
}

/// The one image an image parameter names: by ID, or the one its filter matches.
pub async fn find_image(
    cloud_client: &CloudClient,
    param: &capo_api::common::ImageParam,
) -> Result<crate::cloud::glance::Image, ResolveError> {
    if let Some(id) = &param.id {
        return match cloud_client.glance().get_image(id).await {
            Ok(image) => Ok(image),
            Err(CloudError::NotFound(_)) => Err(ResolveError::Spec(format!("no image {id}"))),
            Err(source) => Err(cloud("the image")(source)),
        };
    }
    let filter = param.filter.clone().unwrap_or_default();
    let images = cloud_client
        .glance()
        .list_images(filter.name.as_deref(), &filter.tags)
        .await
        .map_err(cloud("the image"))?;
    let what = format!(
        "image (name {:?}, tags {:?})",
        filter.name.unwrap_or_default(),
        filter.tags
    );
    exactly_one(&what, images, |i| &i.id)
}

async fn flavor(
    cloud_client: &CloudClient,
    spec: &OpenStackServerSpec,
) -> Result<String, ResolveError> {
    if let Some(id) = &spec.flavor_id {
        return Ok(id.clone());
    }
    let Some(name) = &spec.flavor else {
        return Err(ResolveError::Spec(
            "neither flavor nor flavorID is set".into(),
        ));
    };
    remembered(
        cloud_client,
        format!("flavor {name}"),
        async || match cloud_client.nova().flavor_by_name(name).await {
            Ok(flavor) => Ok(flavor.id),
            Err(CloudError::NotFound(_)) => {
                Err(ResolveError::Spec(format!("no flavor named {name:?}")))
            }
            Err(source) => Err(ResolveError::Cloud {
                what: "the flavor".into(),
                source,
            }),
        },
    )
    .await
}

async fn server_group(
    cloud_client: &CloudClient,
    group: &IdOrFilter<NameFilter>,
) -> Result<String, ResolveError> {
    if let Some(id) = &group.id {
        return Ok(id.clone());
    }
    let name = group.filter.as_ref().and_then(|f| f.name.clone());
    let groups = cloud_client
        .nova()
        .list_server_groups(name.as_deref())
        .await
        .map_err(cloud("the server group"))?;
    let what = format!("server group named {:?}", name.unwrap_or_default());
    exactly_one(&what, groups, |g| &g.id).map(|g| g.id)
}

/// Security groups: IDs as given; each filter adds every group it matches (as CAPO does), and
/// must match at least one.
async fn security_groups(
    cloud_client: &CloudClient,
    groups: &[IdOrFilter<NeutronFilter>],
) -> Result<Vec<String>, ResolveError> {
    let mut ids: Vec<String> = Vec::new();
    for (index, group) in groups.iter().enumerate() {
        let found: Vec<String> = match (&group.id, &group.filter) {
            (Some(id), _) => vec![id.clone()],
            (None, filter) => {
                let filter = neutron_filter(filter.as_ref());
                let groups = cloud_client
                    .neutron()
                    .list_security_groups(&filter)
                    .await
                    .map_err(cloud("security groups"))?;
                if groups.is_empty() {
                    return Err(ResolveError::Spec(format!(
                        "security group {index} matches no security group"
                    )));
                }
                groups.into_iter().map(|g| g.id).collect()
            }
        };
        for id in found {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// A port's network, fixed IPs' subnets and security groups (the server's when the port
/// names none).
async fn port_refs(
    cloud_client: &CloudClient,
    index: usize,
    port: &PortOpts,
    default_groups: &[String],
) -> Result<ResolvedRefs, ResolveError> {
    let mut network_id = match &port.network {
        Some(IdOrFilter { id: Some(id), .. }) => Some(id.clone()),
        Some(IdOrFilter { filter, .. }) => {
            let filter = neutron_filter(filter.as_ref());
            let question = format!("network {filter:?}");
            let id = remembered(cloud_client, question, async || {
                let found = cloud_client
                    .neutron()
                    .list_networks(&filter)
                    .await
                    .map_err(cloud(format!("the network of port {index}")))?;
                let what = format!("network for port {index}");
                Ok(exactly_one(&what, found, |n| &n.id)?.id)
            })
            .await?;
            Some(id)
        }
        None => None,
    };
    let mut fixed_ips = Vec::with_capacity(port.fixed_ips.len());
    for fixed in &port.fixed_ips {
        let subnet = match &fixed.subnet {
            None => None,
            Some(IdOrFilter { id: Some(id), .. }) => Some(id.clone()),
            Some(IdOrFilter { filter, .. }) => {
                let mut filter = subnet_filter(filter.as_ref());
                if let Some(network) = &network_id {
                    filter = filter.with("network_id", network.clone());
                }
                let subnets = cloud_client
                    .neutron()
                    .list_subnets(&filter)
                    .await
                    .map_err(cloud(format!("a subnet of port {index}")))?;
                let subnet = exactly_one(&format!("subnet for port {index}"), subnets, |s| &s.id)?;
                // A port without a network lives on its first subnet's network.
                network_id.get_or_insert(subnet.network_id);
                Some(subnet.id)
            }
        };
        fixed_ips.push((subnet, fixed.ip_address.clone()));
    }
    let Some(network_id) = network_id else {
        return Err(ResolveError::Spec(format!(
            "port {index} has no network, and none follows from its fixed IPs' subnets"
        )));
    };
    let security_groups = if port.security_groups.is_empty() {
        // Without port security a port takes no security group.
        if port.enable_port_security == Some(false) {
            Vec::new()
        } else {
            default_groups.to_vec()
        }
    } else {
        security_groups(cloud_client, &port.security_groups).await?
    };
    Ok(ResolvedRefs {
        network_id,
        fixed_ips,
        security_groups,
    })
}

/// The cluster's primary subnet, as CAPO's `getPrimarySubnetID` picks it: `primarySubnet`
/// resolved on the cluster network (by ID it must be one of the cluster's subnets; a filter
/// must match exactly one there), else the first of the cluster's subnets. It takes the load
/// balancer's VIP and, when the load balancer sits on another network, its members.
pub async fn primary_subnet(
    cloud_client: &CloudClient,
    primary: Option<&SubnetParam>,
    network: &NetworkStatusWithSubnets,
) -> Result<Option<String>, ResolveError> {
    match primary {
        None => Ok(network.subnets.first().map(|s| s.id.clone())),
        Some(IdOrFilter { id: Some(id), .. }) => {
            if network.subnets.iter().any(|s| &s.id == id) {
                Ok(Some(id.clone()))
            } else {
                Err(ResolveError::Spec(format!(
                    "primarySubnet {id} is not one of the cluster network's subnets"
                )))
            }
        }
        Some(IdOrFilter { filter, .. }) => {
            let filter = subnet_filter(filter.as_ref()).with("network_id", network.id.clone());
            let found = cloud_client
                .neutron()
                .list_subnets(&filter)
                .await
                .map_err(cloud("primarySubnet"))?;
            exactly_one("primarySubnet on the cluster network", found, |s| &s.id)
                .map(|s| Some(s.id))
        }
    }
}

/// A CAPO Neutron filter as Neutron's query parameters.
pub fn neutron_filter(filter: Option<&NeutronFilter>) -> Filter {
    let Some(f) = filter else {
        return Filter::default();
    };
    Filter {
        name: f.name.clone(),
        description: f.description.clone(),
        project_id: f.project_id.clone(),
        tags: f.tags.clone(),
        tags_any: f.tags_any.clone(),
        not_tags: f.not_tags.clone(),
        not_tags_any: f.not_tags_any.clone(),
        ..Filter::default()
    }
}

/// A CAPO subnet filter as Neutron's query parameters.
pub fn subnet_filter(filter: Option<&SubnetFilter>) -> Filter {
    let Some(f) = filter else {
        return Filter::default();
    };
    let common = NeutronFilter {
        name: f.name.clone(),
        description: f.description.clone(),
        project_id: f.project_id.clone(),
        tags: f.tags.clone(),
        tags_any: f.tags_any.clone(),
        not_tags: f.not_tags.clone(),
        not_tags_any: f.not_tags_any.clone(),
    };
    let mut out = neutron_filter(Some(&common));
    let extras = [
        ("ip_version", f.ip_version.map(|v| v.to_string())),
        ("gateway_ip", f.gateway_ip.clone()),
        ("cidr", f.cidr.clone()),
        ("ipv6_address_mode", f.ipv6_address_mode.clone()),
        ("ipv6_ra_mode", f.ipv6_ra_mode.clone()),
    ];
    for (key, value) in extras {
        if let Some(value) = value {
            out = out.with(key, value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_carry_every_attribute_and_tag_kind() {
        let filter = SubnetFilter {
            name: Some("s".into()),
            ip_version: Some(4),
            cidr: Some("10.0.0.0/24".into()),
            tags: vec!["a".into()],
            not_tags_any: vec!["b".into()],
            ..SubnetFilter::default()
        };
        let out = subnet_filter(Some(&filter));
        assert_eq!(out.name.as_deref(), Some("s"));
        assert_eq!(out.tags, ["a"]);
        assert_eq!(out.not_tags_any, ["b"]);
        assert_eq!(
            out.extra,
            [
                ("ip_version", "4".to_owned()),
                ("cidr", "10.0.0.0/24".to_owned())
            ]
        );
    }

    #[test]
    fn one_match_is_needed_and_the_message_names_the_candidates() {
        let none = exactly_one("network", Vec::<String>::new(), |s| s).unwrap_err();
        assert_eq!(none.to_string(), "no network matches");
        let two = exactly_one("network", vec!["a".to_owned(), "b".to_owned()], |s| s).unwrap_err();
        assert_eq!(two.to_string(), "2 networks match, one is needed: a, b");
        assert_eq!(
            exactly_one("network", vec!["a".to_owned()], |s| s).unwrap(),
            "a"
        );
    }
}
