//! The OpenStackCluster's pure planning: CAPO's names for what it creates, which ports the API
//! load balancer forwards, which CIDRs it allows, where the endpoint comes from, the failure
//! domains, and what the conditions say. No I/O here; every function is tested below.

use std::collections::BTreeMap;

use capo_api::OpenStackClusterSpec;
use capo_api::cluster::{ApiEndpoint, FailureDomain, ManagedLoadBalancer};

use crate::cloud::Owner;
use crate::cloud::octavia::{HealthMonitor, HealthMonitorSpec};

/// The API server port when `apiServer.port` is unset.
pub const DEFAULT_API_PORT: u16 = 6443;

/// The names CAPO gives what it creates for a cluster, so that capo-rs adopts what CAPO made
/// (and CAPO what capo-rs made).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// `<namespace>-<name>`: what CAPO calls the cluster's resource name.
    pub resource: String,
    /// Network, subnet and router.
    pub network: String,
    /// The API load balancer, `k8s-clusterapi-cluster-<resource>-kubeapi`; its listeners,
    /// pools and monitors add `-<port>`.
    pub load_balancer: String,
    /// The control plane's security group, `k8s-cluster-<resource>-secgroup-controlplane`.
    pub control_plane_group: String,
    /// The workers' security group, `k8s-cluster-<resource>-secgroup-worker`.
    pub worker_group: String,
    /// The bastion's security group, `k8s-cluster-<resource>-secgroup-bastion`.
    pub bastion_group: String,
    /// The bastion's OpenStackServer.
    pub bastion: String,
    /// The mark on what capo-rs creates for the cluster; a lookup by name takes only what
    /// carries it, so names that CAPO's scheme makes alike across namespaces (`a-b`/`c` and
    /// `a`/`b-c`) never share a resource.
    pub owner: Owner,
}

impl Names {
    /// The names for the cluster `cluster` in `namespace`.
    pub fn new(namespace: &str, cluster: &str) -> Self {
        let resource = format!("{namespace}-{cluster}");
        let group = |role: &str| format!("k8s-cluster-{resource}-secgroup-{role}");
        Names {
            network: format!("k8s-clusterapi-cluster-{resource}"),
            load_balancer: format!("k8s-clusterapi-cluster-{resource}-kubeapi"),
            control_plane_group: group("controlplane"),
            worker_group: group("worker"),
            bastion_group: group("bastion"),
            bastion: format!("{cluster}-bastion"),
            resource,
            owner: Owner::new("OpenStackCluster", namespace, cluster),
        }
    }

    /// A listener, pool or monitor of the API load balancer.
    pub fn lb_child(&self, port: u16) -> String {
        format!("{}-{port}", self.load_balancer)
    }

    /// The description of what CAPO creates with one (subnet, router, load balancer,
    /// floating IPs).
    pub fn description(&self) -> String {
        format!(
            "Created by cluster-api-provider-openstack cluster {}",
            self.resource
        )
    }

    /// CAPO's description with the owner mark: for the network, router and groups, which
    /// Neutron tags only after their create ([`Owner::describe`]).
    pub fn owned_description(&self) -> String {
        self.owner.describe(&self.description())
    }

    /// The Octavia member of a machine in the pool of `port`, as CAPO names it.
    pub fn member(&self, port: u16, machine: &str) -> String {
        format!("{}-{port}-{machine}", self.load_balancer)
    }
}

/// The API load balancer's settings, when it is enabled.
pub fn load_balancer(spec: &OpenStackClusterSpec) -> Option<&ManagedLoadBalancer> {
    spec.api_server
        .as_ref()
        .and_then(|a| a.managed_load_balancer.as_ref())
        .filter(|lb| lb.is_enabled())
}

/// The port the API server listens on (and the load balancer forwards).
pub fn api_port(spec: &OpenStackClusterSpec) -> u16 {
    spec.control_plane_endpoint
        .as_ref()
        .and_then(|e| e.port)
        .or_else(|| spec.api_server.as_ref().and_then(|a| a.port))
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_API_PORT)
}

/// Every port the load balancer forwards: the API port, then `additionalPorts`, each once.
pub fn lb_ports(spec: &OpenStackClusterSpec, lb: &ManagedLoadBalancer) -> Vec<u16> {
    let mut ports = vec![api_port(spec)];
    for port in &lb.additional_ports {
        if let Ok(port) = u16::try_from(*port)
            && port != 0
            && !ports.contains(&port)
        {
            ports.push(port);
        }
    }
    ports
}

/// Whether the API endpoint gets a floating IP: with an external network, unless
/// `apiServer.enableFloatingIP` is false.
pub fn api_floating_ip_wanted(spec: &OpenStackClusterSpec, has_external_network: bool) -> bool {
    has_external_network
        && spec
            .api_server
            .as_ref()
            .and_then(|a| a.enable_floating_ip)
            .unwrap_or(true)
}

/// The CIDRs a listener allows: nothing (everyone) when the spec names none; otherwise the
/// spec's, plus what the cluster itself needs to reach its API, as CAPO adds them: the
/// cluster's subnets, the router's external addresses (the nodes' traffic to the floating IP
/// leaves through it) and the bastion's addresses. Sorted and each once, so a comparison is
/// stable. `None` also for the ovn provider, which cannot filter.
pub fn allowed_cidrs(
    lb: &ManagedLoadBalancer,
    subnet_cidrs: &[String],
    router_ips: &[String],
    bastion_ips: &[String],
) -> Option<Vec<String>> {
    if lb.allowed_cidrs.is_empty() || lb.provider.as_deref() == Some("ovn") {
        return None;
    }
    let host = |ip: &String| {
        if ip.contains('/') {
            ip.clone()
        } else if ip.contains(':') {
            format!("{ip}/128")
        } else {
            format!("{ip}/32")
        }
    };
    let mut cidrs: Vec<String> = lb.allowed_cidrs.iter().map(host).collect();
    cidrs.extend(subnet_cidrs.iter().cloned());
    cidrs.extend(router_ips.iter().map(host));
    cidrs.extend(bastion_ips.iter().map(host));
    cidrs.sort();
    cidrs.dedup();
    Some(cidrs)
}

/// Where the API endpoint points, once its address is known: the spec's own endpoint wins;
/// otherwise the floating IP, else the load balancer's VIP, else `apiServer.fixedIP`.
pub fn endpoint(
    spec: &OpenStackClusterSpec,
    floating_ip: Option<&str>,
    vip: Option<&str>,
) -> Option<ApiEndpoint> {
    let port = i32::from(api_port(spec));
    if let Some(given) = &spec.control_plane_endpoint
        && given.host.as_deref().is_some_and(|h| !h.is_empty())
    {
        return Some(ApiEndpoint {
            host: given.host.clone(),
            port: Some(given.port.unwrap_or(port)),
        });
    }
    let fixed = spec.api_server.as_ref().and_then(|a| a.fixed_ip.as_deref());
    let host = floating_ip.or(vip).or(fixed)?;
    Some(ApiEndpoint {
        host: Some(host.to_owned()),
        port: Some(port),
    })
}

/// The failure domains: Nova's available zones, sorted. As CAPO: a non-empty
/// `controlPlaneAvailabilityZones` gives the control plane exactly the zones it names (it
/// wins over the omit flag); otherwise every zone takes control-plane machines unless
/// `controlPlaneOmitAvailabilityZone` leaves their placement to Nova.
pub fn failure_domains(spec: &OpenStackClusterSpec, zones: &[String]) -> Vec<FailureDomain> {
    let omit = spec.control_plane_omit_availability_zone == Some(true);
    let wanted = &spec.control_plane_availability_zones;
    let mut zones = zones.to_vec();
    zones.sort();
    zones.dedup();
    zones
        .into_iter()
        .map(|name| FailureDomain {
            control_plane: Some(if wanted.is_empty() {
                !omit
            } else {
                wanted.contains(&name)
            }),
            name,
            attributes: BTreeMap::new(),
        })
        .collect()
}

/// The zones the cluster's failure domains were made from, once there are any: as CAPO,
/// Nova's list is read only until then, so a zone that shows for a moment (a new compute
/// host's default `nova` zone) never adds a domain Cluster API would place machines in. The
/// control-plane flags still follow the spec.
pub fn known_zones(domains: &[FailureDomain]) -> Option<Vec<String>> {
    (!domains.is_empty()).then(|| domains.iter().map(|d| d.name.clone()).collect())
}

/// The tags on everything the cluster creates.
pub fn tags(spec: &OpenStackClusterSpec) -> Vec<String> {
    let mut tags = spec.tags.clone();
    tags.sort();
    tags.dedup();
    tags
}

/// The tags of what capo-rs creates for the cluster: the spec's and the owner mark.
pub fn owned_tags(spec: &OpenStackClusterSpec, names: &Names) -> Vec<String> {
    let mut tags = names.owner.with_tag(&spec.tags);
    tags.sort();
    tags.dedup();
    tags
}

/// The tags an existing resource should carry: the spec's, and the owner mark only if it
/// already has it (one CAPO made is taken over as it is, never marked).
pub fn kept_tags(spec: &OpenStackClusterSpec, names: &Names, have: &[String]) -> Vec<String> {
    if names.owner.marks(have) {
        owned_tags(spec, names)
    } else {
        tags(spec)
    }
}

/// What a pool's health monitor needs to become the wanted one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorChange {
    /// The monitor is as wanted: nothing to do.
    None,
    /// Timings or the HTTP request differ: a PUT changes them in place.
    Update,
    /// The type differs, which Octavia cannot change in place: delete, then create.
    Replace,
}

/// What `have`, the pool's monitor in Octavia, needs to become `wanted`; of the HTTP
/// fields (`url_path`, `expected_codes`) only those `wanted` sets are compared.
pub fn monitor_change(have: &HealthMonitor, wanted: &HealthMonitorSpec) -> MonitorChange {
    if !have.kind.eq_ignore_ascii_case(&wanted.kind) {
        return MonitorChange::Replace;
    }
    let timings = (
        have.delay,
        have.timeout,
        have.max_retries,
        have.max_retries_down,
    ) != (
        wanted.delay,
        wanted.timeout,
        wanted.max_retries,
        wanted.max_retries_down,
    );
    // Octavia shows TCP monitors' HTTP fields as null; only a wanted value is compared.
    let differs = |have: &Option<String>, wanted: &Option<String>| {
        wanted.as_ref().is_some_and(|w| have.as_ref() != Some(w))
    };
    let request = differs(&have.url_path, &wanted.url_path)
        || differs(&have.expected_codes, &wanted.expected_codes);
    if timings || request {
        MonitorChange::Update
    } else {
        MonitorChange::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capo_api::cluster::ApiServer;

    fn spec_with_lb(lb: ManagedLoadBalancer) -> OpenStackClusterSpec {
        OpenStackClusterSpec {
            api_server: Some(ApiServer {
                managed_load_balancer: Some(lb),
                ..ApiServer::default()
            }),
            ..OpenStackClusterSpec::default()
        }
    }

    #[test]
    fn names_follow_capo() {
        let names = Names::new("ns", "c1");
        assert_eq!(names.network, "k8s-clusterapi-cluster-ns-c1");
        assert_eq!(names.load_balancer, "k8s-clusterapi-cluster-ns-c1-kubeapi");
        assert_eq!(
            names.lb_child(6443),
            "k8s-clusterapi-cluster-ns-c1-kubeapi-6443"
        );
        assert_eq!(
            names.control_plane_group,
            "k8s-cluster-ns-c1-secgroup-controlplane"
        );
        assert_eq!(names.worker_group, "k8s-cluster-ns-c1-secgroup-worker");
        assert_eq!(names.bastion_group, "k8s-cluster-ns-c1-secgroup-bastion");
        assert_eq!(names.bastion, "c1-bastion");
        assert_eq!(
            names.member(6443, "cp-1"),
            "k8s-clusterapi-cluster-ns-c1-kubeapi-6443-cp-1"
        );
    }

    #[test]
    fn the_load_balancer_is_on_only_when_asked_for() {
        assert!(load_balancer(&OpenStackClusterSpec::default()).is_none());
        let on = spec_with_lb(ManagedLoadBalancer::default());
        assert!(load_balancer(&on).is_some(), "enabled defaults to true");
        let off = spec_with_lb(ManagedLoadBalancer {
            enabled: Some(false),
            ..ManagedLoadBalancer::default()
        });
        assert!(load_balancer(&off).is_none());
    }

    #[test]
    fn ports_are_the_api_port_then_the_additional_ones_each_once() {
        let lb = ManagedLoadBalancer {
            additional_ports: vec![8443, 6443, 0, 70000, 8443],
            ..ManagedLoadBalancer::default()
        };
        let spec = spec_with_lb(lb.clone());
        assert_eq!(lb_ports(&spec, &lb), [6443, 8443]);
        let mut custom = spec.clone();
        custom.api_server.as_mut().unwrap().port = Some(443);
        assert_eq!(lb_ports(&custom, &lb), [443, 8443, 6443]);
    }

    #[test]
    fn allowed_cidrs_add_what_the_cluster_needs_only_when_the_user_restricts() {
        let open = ManagedLoadBalancer::default();
        assert_eq!(
            allowed_cidrs(&open, &["10.6.0.0/24".into()], &[], &[]),
            None
        );
        let closed = ManagedLoadBalancer {
            allowed_cidrs: vec!["192.0.2.0/24".into(), "198.51.100.7".into()],
            ..ManagedLoadBalancer::default()
        };
        let cidrs = allowed_cidrs(
            &closed,
            &["10.6.0.0/24".into()],
            &["172.24.4.10".into()],
            &["172.24.4.20".into(), "10.6.0.3".into()],
        );
        assert_eq!(
            cidrs.unwrap(),
            [
                "10.6.0.0/24",
                "10.6.0.3/32",
                "172.24.4.10/32",
                "172.24.4.20/32",
                "192.0.2.0/24",
                "198.51.100.7/32"
            ]
        );
        let ovn = ManagedLoadBalancer {
            provider: Some("ovn".into()),
            ..closed
        };
        assert_eq!(
            allowed_cidrs(&ovn, &[], &[], &[]),
            None,
            "ovn cannot filter"
        );
    }

    #[test]
    fn the_endpoint_prefers_the_spec_then_the_floating_ip_then_the_vip_then_the_fixed_ip() {
        let mut spec = spec_with_lb(ManagedLoadBalancer::default());
        assert_eq!(endpoint(&spec, None, None), None);
        let at = |host: &str, port| ApiEndpoint {
            host: Some(host.into()),
            port: Some(port),
        };
        assert_eq!(
            endpoint(&spec, None, Some("10.6.0.5")),
            Some(at("10.6.0.5", 6443))
        );
        assert_eq!(
            endpoint(&spec, Some("172.24.4.3"), Some("10.6.0.5")),
            Some(at("172.24.4.3", 6443))
        );
        spec.api_server.as_mut().unwrap().fixed_ip = Some("10.6.0.9".into());
        assert_eq!(endpoint(&spec, None, None), Some(at("10.6.0.9", 6443)));
        spec.control_plane_endpoint = Some(at("api.example.com", 443));
        assert_eq!(
            endpoint(&spec, Some("172.24.4.3"), None),
            Some(at("api.example.com", 443))
        );
    }

    #[test]
    fn the_api_floating_ip_needs_an_external_network_and_is_on_by_default() {
        let mut spec = OpenStackClusterSpec::default();
        assert!(api_floating_ip_wanted(&spec, true));
        assert!(!api_floating_ip_wanted(&spec, false));
        spec.api_server = Some(ApiServer {
            enable_floating_ip: Some(false),
            ..ApiServer::default()
        });
        assert!(!api_floating_ip_wanted(&spec, true));
    }

    #[test]
    fn failure_domains_come_from_nova_and_the_spec_limits_the_control_plane() {
        let zones = vec!["az2".to_owned(), "az1".to_owned()];
        let mut spec = OpenStackClusterSpec::default();
        let domains = |spec: &OpenStackClusterSpec| -> Vec<(String, bool)> {
            failure_domains(spec, &zones)
                .into_iter()
                .map(|d| (d.name, d.control_plane.unwrap()))
                .collect()
        };
        let all = domains(&spec);
        assert_eq!(all, [("az1".into(), true), ("az2".into(), true)]);
        spec.control_plane_availability_zones = vec!["az2".into()];
        assert_eq!(
            domains(&spec),
            [("az1".into(), false), ("az2".into(), true)]
        );
        spec.control_plane_omit_availability_zone = Some(true);
        assert_eq!(
            domains(&spec),
            [("az1".into(), false), ("az2".into(), true)],
            "the zones named win over the omit flag, as in CAPO"
        );
        spec.control_plane_availability_zones.clear();
        assert_eq!(
            domains(&spec),
            [("az1".into(), false), ("az2".into(), false)]
        );
    }

    #[test]
    fn failure_domains_once_made_keep_their_zones() {
        assert_eq!(known_zones(&[]), None, "none yet: Nova is asked");
        let spec = OpenStackClusterSpec::default();
        let made = failure_domains(&spec, &["az2".to_owned(), "az1".to_owned()]);
        assert_eq!(known_zones(&made), Some(vec!["az1".into(), "az2".into()]));
    }

    fn monitor(kind: &str, url: Option<&str>) -> HealthMonitor {
        let text = serde_json::json!({
            "id": "hm", "type": kind, "provisioning_status": "ACTIVE",
            "operating_status": "ONLINE", "delay": 10, "timeout": 5, "max_retries": 5,
            "max_retries_down": 3, "url_path": url, "expected_codes": url.map(|_| "200"),
        });
        serde_json::from_value(text).expect("a monitor")
    }

    fn wanted(kind: &str) -> HealthMonitorSpec {
        let https = kind == "HTTPS";
        HealthMonitorSpec {
            kind: kind.into(),
            delay: 10,
            timeout: 5,
            max_retries: 5,
            max_retries_down: Some(3),
            http_method: https.then(|| "GET".into()),
            url_path: https.then(|| "/readyz".into()),
            expected_codes: https.then(|| "200".into()),
            ..HealthMonitorSpec::default()
        }
    }

    #[test]
    fn a_monitor_changes_in_place_unless_its_type_changes() {
        assert_eq!(
            monitor_change(&monitor("TCP", None), &wanted("TCP")),
            MonitorChange::None
        );
        assert_eq!(
            monitor_change(&monitor("HTTPS", Some("/readyz")), &wanted("HTTPS")),
            MonitorChange::None
        );
        assert_eq!(
            monitor_change(&monitor("HTTPS", Some("/healthz")), &wanted("HTTPS")),
            MonitorChange::Update,
            "another path is a PUT"
        );
        let mut slower = wanted("TCP");
        slower.delay = 30;
        assert_eq!(
            monitor_change(&monitor("TCP", None), &slower),
            MonitorChange::Update
        );
        assert_eq!(
            monitor_change(&monitor("TCP", None), &wanted("HTTPS")),
            MonitorChange::Replace,
            "Octavia refuses `type` on an update"
        );
        assert_eq!(
            monitor_change(&monitor("HTTPS", Some("/readyz")), &wanted("TCP")),
            MonitorChange::Replace
        );
    }
}
