//! The pure middle of the OpenStackServer reconciler: names, requests and the next step, from
//! the spec, what it resolved to and what the cloud shows. No I/O here; the tests below need
//! no server.

use std::time::Duration;

use capo_api::OpenStackServerSpec;
use capo_api::common::{
    BlockDeviceType, MachineAddress, PortOpts, ResolvedPortSpec, ResolvedServerSpec,
    SchedulerHintValueType, VolumeAvailabilityZone, VolumeAzSource,
};
use capo_api::conditions::{Desired, Status, reasons, types};
use serde_json::{Value, json};

use crate::cloud::Owner;
use crate::cloud::cinder::{Volume, VolumeSpec};
use crate::cloud::neutron::{FixedIp, PortSpec};
use crate::cloud::nova::{BlockDevice, Server, ServerNetwork, ServerSpec};

/// What is wrong with a spec before any call is made.
pub fn validate(spec: &OpenStackServerSpec) -> Result<(), SpecProblem> {
    if spec.ports.is_empty() {
        return Err(SpecProblem::Invalid(
            "spec.ports is empty: a server needs at least one port".into(),
        ));
    }
    Ok(())
}

/// Why a spec is refused before any cloud call (see [`validate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecProblem {
    /// The spec cannot work as written (it asks for no port); the message says why.
    Invalid(String),
}

/// A port's name, as CAPO names it: `<server>-<nameSuffix>`, or `<server>-<index>`.
pub fn port_name(server: &str, index: usize, port: &PortOpts) -> String {
    match port.name_suffix.as_deref().filter(|s| !s.is_empty()) {
        Some(suffix) => format!("{server}-{suffix}"),
        None => format!("{server}-{index}"),
    }
}

/// The names of every port the spec asks for, in order.
pub fn port_names(server: &str, spec: &OpenStackServerSpec) -> Vec<String> {
    spec.ports
        .iter()
        .enumerate()
        .map(|(index, port)| port_name(server, index, port))
        .collect()
}

/// The description of what we create, unless the spec gives one: CAPO's, so that ports
/// read the same whichever provider made them.
pub fn default_description(cluster: Option<&str>) -> String {
    format!(
        "Created by cluster-api-provider-openstack cluster {}",
        cluster.unwrap_or_default()
    )
}

/// What a port resolved to, once its network, subnets and security groups are UUIDs.
pub struct ResolvedRefs {
    /// Neutron's ID of the port's network.
    pub network_id: String,
    /// (subnet id, address) per requested fixed IP.
    pub fixed_ips: Vec<(Option<String>, Option<String>)>,
    /// Neutron's IDs of the port's security groups.
    pub security_groups: Vec<String>,
}

/// The resolved form of port `index`: the spec's attributes, the server's tags before the
/// port's own, the server's trunk flag unless the port has one.
pub fn resolved_port(
    server: &str,
    index: usize,
    port: &PortOpts,
    spec: &OpenStackServerSpec,
    cluster: Option<&str>,
    refs: ResolvedRefs,
) -> ResolvedPortSpec {
    ResolvedPortSpec {
        name: port_name(server, index, port),
        description: Some(
            port.description
                .clone()
                .unwrap_or_else(|| default_description(cluster)),
        ),
        network_id: refs.network_id,
        fixed_ips: refs
            .fixed_ips
            .into_iter()
            .map(|(subnet, ip_address)| capo_api::common::ResolvedFixedIp { subnet, ip_address })
            .collect(),
        security_groups: refs.security_groups,
        tags: port_tags(spec, index),
        trunk: port.trunk.or(spec.trunk),
        allowed_address_pairs: port.allowed_address_pairs.clone(),
        host_id: port.host_id.clone(),
        vnic_type: port.vnic_type.clone(),
        profile: port.profile.clone(),
        admin_state_up: port.admin_state_up,
        mac_address: port.mac_address.clone(),
        propagate_uplink_status: port.propagate_uplink_status,
        enable_port_security: port.enable_port_security,
        value_specs: port.value_specs.clone(),
    }
}

/// Port `index`'s tags: the server's, then the port's own.
pub fn port_tags(spec: &OpenStackServerSpec, index: usize) -> Vec<String> {
    let mut tags = spec.tags.clone();
    for tag in spec
        .ports
        .get(index)
        .map(|p| p.tags.as_slice())
        .unwrap_or(&[])
    {
        if !tags.contains(tag) {
            tags.push(tag.clone());
        }
    }
    tags
}

/// The owner mark of what an OpenStackServer creates.
pub fn owner(namespace: &str, name: &str) -> Owner {
    Owner::new("OpenStackServer", namespace, name)
}

/// The Neutron extension that gives a port its own `trusted` attribute.
pub const PORT_TRUSTED_VIF: &str = "port-trusted-vif";

/// Whether the port asks for a trusted VF.
pub fn asks_trusted_vf(port: &ResolvedPortSpec) -> bool {
    port.profile
        .as_ref()
        .is_some_and(|p| p.trusted_vf == Some(true))
}

/// The Neutron request for a resolved port, marked as `owner`'s. A trusted VF is the port's
/// `trusted` attribute where Neutron has [`PORT_TRUSTED_VIF`] (`trusted_vif_attribute`), and
/// `binding:profile`'s `trusted` elsewhere, as CAPO does (#3120).
pub fn port_request(
    port: &ResolvedPortSpec,
    owner: &Owner,
    trusted_vif_attribute: bool,
) -> PortSpec {
    let trusted = asks_trusted_vf(port);
    let profile = port.profile.as_ref().and_then(|p| {
        let mut profile = serde_json::Map::new();
        if p.ovs_hw_offload == Some(true) {
            profile.insert("capabilities".into(), json!(["switchdev"]));
        }
        if trusted && !trusted_vif_attribute {
            profile.insert("trusted".into(), json!(true));
        }
        (!profile.is_empty()).then_some(Value::Object(profile))
    });
    let pairs = neutron_address_pairs(&port.allowed_address_pairs);
    PortSpec {
        name: port.name.clone(),
        network_id: port.network_id.clone(),
        description: port.description.clone().unwrap_or_default(),
        fixed_ips: port
            .fixed_ips
            .iter()
            .map(|ip| FixedIp {
                subnet_id: ip.subnet.clone(),
                ip_address: ip.ip_address.clone(),
            })
            .collect(),
        security_groups: (!port.security_groups.is_empty()).then(|| port.security_groups.clone()),
        admin_state_up: port.admin_state_up,
        port_security_enabled: port.enable_port_security,
        vnic_type: port.vnic_type.clone(),
        allowed_address_pairs: (!pairs.is_empty()).then_some(pairs),
        host_id: port.host_id.clone(),
        profile,
        trusted: (trusted && trusted_vif_attribute).then_some(true),
        mac_address: port.mac_address.clone(),
        propagate_uplink_status: port.propagate_uplink_status,
        value_specs: port
            .value_specs
            .iter()
            .map(|v| (v.key.clone(), json!(v.value)))
            .collect(),
        tags: owner.with_tag(&port.tags),
    }
}

/// The Cinder request for a wanted volume, marked as `owner`'s.
pub fn volume_request(want: &VolumeWant, owner: &Owner) -> VolumeSpec {
    VolumeSpec {
        metadata: owner.metadata(),
        ..want.request.clone()
    }
}

/// A Cinder volume the server needs.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeWant {
    /// The Cinder create request: name, size (GiB), type, zone, and the image of a root volume.
    pub request: VolumeSpec,
    /// The root volume (boot index 0).
    pub boot: bool,
    /// The device tag the guest sees (additional block devices).
    pub tag: Option<String>,
}

impl VolumeWant {
    /// The volume's name (`<server>-root`, `<server>-<device>`).
    pub fn name(&self) -> &str {
        &self.request.name
    }
}

/// Whether a volume's Cinder `attachments` name one of these servers.
pub fn attached_to_any(attachments: &[Value], servers: &[String]) -> bool {
    attachments.iter().any(|attachment| {
        attachment["server_id"]
            .as_str()
            .is_some_and(|id| servers.iter().any(|s| s == id))
    })
}

/// The names of the volumes the spec asks for: `<server>-root` and `<server>-<device>`.
pub fn volume_names(server: &str, spec: &OpenStackServerSpec) -> Vec<String> {
    wanted_volumes(server, spec, None)
        .into_iter()
        .map(|v| v.request.name)
        .collect()
}

/// The Cinder volumes to create before the server, as CAPO creates them (so their type and
/// zone can be chosen), handed to Nova as volumes that die with the server.
pub fn wanted_volumes(
    server: &str,
    spec: &OpenStackServerSpec,
    image_id: Option<&str>,
) -> Vec<VolumeWant> {
    let zone = |az: Option<&VolumeAvailabilityZone>| -> Option<String> {
        let az = az?;
        match az.from.unwrap_or_default() {
            VolumeAzSource::Name => az.name.clone(),
            VolumeAzSource::Machine => spec.availability_zone.clone(),
        }
    };
    let mut volumes = Vec::new();
    if let Some(root) = &spec.root_volume {
        volumes.push(VolumeWant {
            request: VolumeSpec {
                name: format!("{server}-root"),
                size: u64::try_from(root.size_gib).unwrap_or(1),
                description: format!("Root volume for {server}"),
                volume_type: root.type_.clone(),
                availability_zone: zone(root.availability_zone.as_ref()),
                image_id: image_id.map(str::to_owned),
                metadata: Default::default(),
            },
            boot: true,
            tag: None,
        });
    }
    for device in &spec.additional_block_devices {
        if device.storage.type_ != BlockDeviceType::Volume {
            continue;
        }
        let volume = device.storage.volume.as_ref();
        volumes.push(VolumeWant {
            request: VolumeSpec {
                name: format!("{server}-{}", device.name),
                size: u64::try_from(device.size_gib).unwrap_or(1),
                description: format!("Additional block device for {server}"),
                volume_type: volume.and_then(|v| v.type_.clone()),
                availability_zone: zone(volume.and_then(|v| v.availability_zone.as_ref())),
                image_id: None,
                metadata: Default::default(),
            },
            boot: false,
            tag: Some(device.name.clone()),
        });
    }
    volumes
}

/// Nova's block device mapping: the volumes (deleted with the server), local disks, and the
/// image as the boot disk when there is no root volume but other devices.
pub fn block_devices(
    spec: &OpenStackServerSpec,
    image_id: &str,
    volumes: &[(VolumeWant, String)],
) -> Vec<BlockDevice> {
    let mut devices: Vec<BlockDevice> = volumes
        .iter()
        .map(|(want, id)| BlockDevice {
            boot_index: if want.boot { 0 } else { -1 },
            uuid: Some(id.clone()),
            source_type: "volume",
            destination_type: "volume",
            volume_size: None,
            delete_on_termination: true,
            tag: want.tag.clone(),
        })
        .collect();
    devices.extend(
        spec.additional_block_devices
            .iter()
            .filter(|d| d.storage.type_ == BlockDeviceType::Local)
            .map(|device| BlockDevice {
                boot_index: -1,
                uuid: None,
                source_type: "blank",
                destination_type: "local",
                volume_size: u64::try_from(device.size_gib).ok(),
                delete_on_termination: true,
                tag: Some(device.name.clone()),
            }),
    );
    if !devices.is_empty() && spec.root_volume.is_none() {
        devices.insert(
            0,
            BlockDevice {
                boot_index: 0,
                uuid: Some(image_id.to_owned()),
                source_type: "image",
                destination_type: "local",
                volume_size: None,
                delete_on_termination: true,
                tag: None,
            },
        );
    }
    devices
}

/// The Nova request for the server.
pub fn server_request(
    name: &str,
    spec: &OpenStackServerSpec,
    resolved: &ResolvedServerSpec,
    port_ids: &[String],
    block_devices: Vec<BlockDevice>,
    user_data: Option<String>,
    owner: &Owner,
) -> ServerSpec {
    let image = resolved.image_id.clone().unwrap_or_default();
    ServerSpec {
        name: name.to_owned(),
        flavor_ref: resolved.flavor_id.clone().unwrap_or_default(),
        // Booting from a volume: the image is on the volume.
        image_ref: if spec.root_volume.is_some() {
            String::new()
        } else {
            image
        },
        networks: port_ids
            .iter()
            .map(|id| ServerNetwork {
                port: Some(id.clone()),
                uuid: None,
            })
            .collect(),
        key_name: Some(spec.ssh_key_name.clone()).filter(|k| !k.is_empty()),
        metadata: spec
            .server_metadata
            .iter()
            .map(|m| (m.key.clone(), m.value.clone()))
            .collect(),
        user_data,
        availability_zone: spec.availability_zone.clone(),
        tags: owner.with_tag(&spec.tags),
        config_drive: spec.config_drive,
        block_devices,
        server_group_id: resolved.server_group_id.clone(),
        scheduler_hints: spec
            .scheduler_hint_additional_properties
            .iter()
            .filter_map(|hint| {
                let value = &hint.value;
                let json = match value.type_ {
                    SchedulerHintValueType::Bool => json!(value.bool?),
                    SchedulerHintValueType::Number => json!(value.number?),
                    SchedulerHintValueType::String => json!(value.string.clone()?),
                };
                Some((hint.name.clone(), json))
            })
            .collect(),
        // Known once the volumes are made: the caller sets it from them.
        multiattach: false,
    }
}

/// The server as we found it.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerState {
    /// None exists (none recorded, none by name).
    Absent,
    /// It exists, as Nova shows it.
    Found(Box<Server>),
    /// The server we recorded is gone, and we did not delete it.
    Lost(String),
}

/// What the cloud holds for the server's parts, in the order of the resolved ports and the
/// wanted volumes.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Neutron's ID of each resolved port (`None`: not created yet).
    pub ports: Vec<Option<String>>,
    /// The trunk of each port that wants one (`None` for ports that do not).
    pub trunks: Vec<Option<String>>,
    /// Each wanted volume as Cinder shows it (`None`: not created yet).
    pub volumes: Vec<Option<Volume>>,
    /// Whether the server exists, and as what.
    pub server: ServerState,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Create the ports at these indices of the resolved ports.
    CreatePorts(Vec<usize>),
    /// Create a trunk on each port at these indices: they want one and have none.
    CreateTrunks(Vec<usize>),
    /// Create the wanted volumes at these indices.
    CreateVolumes(Vec<usize>),
    /// These volumes are still being created.
    WaitForVolumes(Vec<String>),
    /// This volume ended in ERROR.
    VolumeFailed(String),
    /// Every port and volume is ready: create the server.
    CreateServer,
    /// The server exists: report it.
    Report,
    /// The server we created is gone.
    Lost(String),
}

/// The next step, from what exists: ports, then their trunks, then volumes, then the server.
pub fn next_step(wants_trunk: &[bool], observed: &Observed) -> Next {
    match &observed.server {
        ServerState::Lost(id) => return Next::Lost(id.clone()),
        ServerState::Found(_) => return Next::Report,
        ServerState::Absent => {}
    }
    let missing = |items: Vec<bool>| -> Vec<usize> {
        items
            .into_iter()
            .enumerate()
            .filter_map(|(i, missing)| missing.then_some(i))
            .collect()
    };
    let ports = missing(observed.ports.iter().map(Option::is_none).collect());
    if !ports.is_empty() {
        return Next::CreatePorts(ports);
    }
    let trunks = missing(
        wants_trunk
            .iter()
            .enumerate()
            .map(|(i, wants)| *wants && observed.trunks.get(i).is_none_or(Option::is_none))
            .collect(),
    );
    if !trunks.is_empty() {
        return Next::CreateTrunks(trunks);
    }
    let volumes = missing(observed.volumes.iter().map(Option::is_none).collect());
    if !volumes.is_empty() {
        return Next::CreateVolumes(volumes);
    }
    let present = observed.volumes.iter().flatten();
    if let Some(failed) = present.clone().find(|v| v.is_error()) {
        return Next::VolumeFailed(failed.name.clone());
    }
    let creating: Vec<String> = present
        .filter(|v| !v.is_available())
        .map(|v| format!("{} ({})", v.name, v.status))
        .collect();
    if !creating.is_empty() {
        return Next::WaitForVolumes(creating);
    }
    Next::CreateServer
}

/// What a server's state means for the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceView {
    /// `InstanceReady`, as the server's state sets it.
    pub condition: Desired<'static>,
    /// ACTIVE: the infrastructure is provisioned (write-once).
    pub provisioned: bool,
    /// Needs a person (Nova ERROR, deleted behind our back): a Warning event.
    pub needs_attention: bool,
    /// Look again after this long; `None`: the state is settled.
    pub poll_after: Option<Duration>,
}

/// How soon a server in ERROR is looked at again (CAPO #3300): an operator may repair it in
/// place (reset its state, or rebuild it), and the machine should notice within a minute,
/// not at the next full resync.
pub const ERROR_RECHECK: Duration = Duration::from_secs(60);

/// The view of a server, `age` after Nova created it; `poll` says when to look again at
/// work on its way.
pub fn instance_view(
    server: &Server,
    age: Duration,
    poll: impl Fn(Duration) -> Duration,
) -> InstanceView {
    let ready = types::INSTANCE_READY;
    let view = |status, reason, message: String, needs_attention, poll_after| InstanceView {
        condition: Desired::new(ready, status, reason, message),
        provisioned: false,
        needs_attention,
        poll_after,
    };
    if server.is_deleting() || matches!(server.status.as_str(), "DELETED" | "SOFT_DELETED") {
        return view(
            Status::False,
            reasons::INSTANCE_DELETED,
            format!(
                "server {} is being deleted by someone other than capo-rs",
                server.id
            ),
            true,
            Some(poll(age)),
        );
    }
    match server.status.as_str() {
        "ACTIVE" => InstanceView {
            provisioned: true,
            ..view(Status::True, reasons::READY, String::new(), false, None)
        },
        _ if is_building(server) => view(
            Status::False,
            reasons::INSTANCE_BUILDING,
            // No duration: a message that moves each poll would be a status write each poll
            // (and one on the machine that copies it); Nova's `created` says since when.
            format!("Nova is building server {}", server.id),
            false,
            Some(poll(age)),
        ),
        "ERROR" => view(
            Status::False,
            reasons::INSTANCE_ERROR,
            format!(
                "server {} is in ERROR: {}",
                server.id,
                server
                    .fault_message()
                    .unwrap_or("Nova gave no fault message")
            ),
            true,
            Some(ERROR_RECHECK),
        ),
        other => view(
            Status::False,
            reasons::INSTANCE_NOT_ACTIVE,
            format!("server {} is {other}", server.id),
            false,
            Some(poll(Duration::MAX)),
        ),
    }
}

/// Whether Nova is still building the server (an empty status is taken as building too).
pub fn is_building(server: &Server) -> bool {
    matches!(server.status.as_str(), "BUILD" | "")
}

/// The server's addresses as Cluster API reports them: fixed IPs are internal, floating IPs
/// external.
pub fn addresses(server: &Server) -> Vec<MachineAddress> {
    let Some(networks) = server.addresses.as_object() else {
        return Vec::new();
    };
    let mut addresses = Vec::new();
    for entries in networks.values() {
        for entry in entries.as_array().into_iter().flatten() {
            let Some(address) = entry.get("addr").and_then(Value::as_str) else {
                continue;
            };
            let type_ = match entry.get("OS-EXT-IPS:type").and_then(Value::as_str) {
                Some("floating") => "ExternalIP",
                _ => "InternalIP",
            };
            addresses.push(MachineAddress {
                type_: type_.to_owned(),
                address: address.to_owned(),
            });
        }
    }
    addresses
}

/// How long ago an OpenStack timestamp was: Nova's RFC 3339 (`...Z`) or Cinder's zoneless UTC
/// (`2026-11-22T06:33:54.000000`). Unreadable or in the future: zero.
pub fn age(timestamp: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> Duration {
    let Some(text) = timestamp else {
        return Duration::ZERO;
    };
    let parsed = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").map(|t| t.and_utc())
        });
    parsed
        .ok()
        .and_then(|then| (now - then).to_std().ok())
        .unwrap_or(Duration::ZERO)
}

/// Whether `resolved` covers everything the spec names, so it need not be resolved again.
pub fn is_complete(spec: &OpenStackServerSpec, resolved: &ResolvedServerSpec) -> bool {
    resolved.image_id.is_some()
        && resolved.flavor_id.is_some()
        && resolved.ports.len() == spec.ports.len()
        && (spec.server_group.is_none() || resolved.server_group_id.is_some())
}

/// Allowed address pairs as Neutron takes them (no MAC: Neutron uses the port's own).
pub fn neutron_address_pairs(pairs: &[capo_api::common::AddressPair]) -> Vec<Value> {
    pairs
        .iter()
        .map(|pair| {
            let mut value = json!({ "ip_address": pair.ip_address });
            if let Some(mac) = &pair.mac_address {
                value["mac_address"] = json!(mac);
            }
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_is_attached_to_a_server_its_attachments_name() {
        let attachments = [json!({"server_id": "s1", "attachment_id": "a1"}), json!({})];
        assert!(attached_to_any(&attachments, &["s0".into(), "s1".into()]));
        assert!(!attached_to_any(&attachments, &["s2".into()]));
        assert!(!attached_to_any(&[], &["s1".into()]));
    }
    use capo_api::common::*;

    fn spec() -> OpenStackServerSpec {
        serde_json::from_value(json!({
            "flavor": "m1.small",
            "image": {"filter": {"name": "ubuntu"}},
            "sshKeyName": "",
            "identityRef": {"name": "creds", "cloudName": "sim"},
            "ports": [{"network": {"filter": {"name": "net"}}}, {"nameSuffix": "storage", "trunk": true}],
            "tags": ["capo"],
        }))
        .expect("a valid spec")
    }

    fn volume(name: &str, status: &str) -> Volume {
        Volume {
            id: format!("{name}-id"),
            name: name.into(),
            status: status.into(),
            size: 10,
            availability_zone: None,
            volume_type: None,
            multiattach: false,
            attachments: Vec::new(),
            created_at: None,
            metadata: Default::default(),
        }
    }

    fn server(status: &str) -> Server {
        serde_json::from_value(json!({"id": "s1", "name": "bastion", "status": status,
            "fault": {"code": 500, "message": "No valid host was found."},
            "addresses": {"net": [
                {"addr": "10.0.0.5", "OS-EXT-IPS:type": "fixed"},
                {"addr": "172.24.4.9", "OS-EXT-IPS:type": "floating"}]}}))
        .expect("a server")
    }

    #[test]
    fn ports_are_named_as_capo_names_them() {
        let spec = spec();
        assert_eq!(
            port_names("bastion", &spec),
            ["bastion-0", "bastion-storage"]
        );
    }

    #[test]
    fn no_port_is_refused_before_any_call_and_a_pool_or_an_orc_image_is_not() {
        let mut with_pool = spec();
        with_pool.floating_ip_pool_ref = Some(TypedLocalObjectReference {
            api_group: Some("infrastructure.cluster.x-k8s.io".into()),
            kind: "OpenStackFloatingIPPool".into(),
            name: "pool".into(),
        });
        assert_eq!(validate(&with_pool), Ok(()));
        let mut no_ports = spec();
        no_ports.ports.clear();
        assert!(matches!(validate(&no_ports), Err(SpecProblem::Invalid(_))));
        let mut orc = spec();
        orc.image = ImageParam {
            image_ref: Some(ResourceReference { name: "img".into() }),
            ..ImageParam::default()
        };
        assert_eq!(
            validate(&orc),
            Ok(()),
            "an ORC image is waited for, not refused"
        );
        assert_eq!(validate(&spec()), Ok(()));
    }

    #[test]
    fn a_resolved_port_carries_the_server_tags_first_and_inherits_trunk() {
        let mut spec = spec();
        spec.trunk = Some(false);
        spec.ports[0].tags = vec!["capo".into(), "mine".into()];
        let refs = ResolvedRefs {
            network_id: "n1".into(),
            fixed_ips: vec![(Some("s1".into()), None)],
            security_groups: vec!["sg".into()],
        };
        let port = resolved_port("bastion", 0, &spec.ports[0], &spec, Some("c1"), refs);
        assert_eq!(port.name, "bastion-0");
        assert_eq!(port.tags, ["capo", "mine"]);
        assert_eq!(port.trunk, Some(false), "inherited from the server");
        assert_eq!(
            port.description.as_deref(),
            Some("Created by cluster-api-provider-openstack cluster c1")
        );
        let owner = owner("ns", "bastion");
        let request = port_request(&port, &owner, false);
        assert_eq!(
            request.tags,
            ["capo", "mine", owner.tag()],
            "marked as ours"
        );
        assert_eq!(request.security_groups, Some(vec!["sg".to_owned()]));
        assert_eq!(request.fixed_ips[0].subnet_id.as_deref(), Some("s1"));
    }

    #[test]
    fn the_port_request_maps_profile_pairs_and_value_specs() {
        let port = ResolvedPortSpec {
            name: "p".into(),
            network_id: "n".into(),
            profile: Some(BindingProfile {
                ovs_hw_offload: Some(true),
                trusted_vf: Some(true),
            }),
            allowed_address_pairs: vec![AddressPair {
                ip_address: "10.0.0.9".into(),
                mac_address: None,
            }],
            value_specs: vec![ValueSpec {
                name: "a".into(),
                key: "dns_name".into(),
                value: "host".into(),
            }],
            ..ResolvedPortSpec::default()
        };
        let body = serde_json::to_value(port_request(&port, &owner("ns", "s"), false))
            .expect("serialises");
        assert_eq!(
            body["binding:profile"],
            json!({"capabilities": ["switchdev"], "trusted": true})
        );
        assert!(body.get("trusted").is_none(), "no port-trusted-vif: {body}");
        let with_extension =
            serde_json::to_value(port_request(&port, &owner("ns", "s"), true)).expect("serialises");
        assert_eq!(
            (
                &with_extension["binding:profile"],
                &with_extension["trusted"]
            ),
            (&json!({"capabilities": ["switchdev"]}), &json!(true)),
            "with port-trusted-vif, the port's own attribute"
        );
        assert_eq!(
            body["allowed_address_pairs"],
            json!([{"ip_address": "10.0.0.9"}])
        );
        assert_eq!(body["dns_name"], json!("host"));
        assert!(
            body.get("security_groups").is_none(),
            "Neutron's default then"
        );
    }

    #[test]
    fn volumes_are_named_sized_and_zoned_like_capo() {
        let mut spec = spec();
        spec.availability_zone = Some("az-2".into());
        spec.root_volume = Some(RootVolume {
            size_gib: 20,
            type_: Some("ssd".into()),
            availability_zone: Some(VolumeAvailabilityZone {
                from: Some(VolumeAzSource::Machine),
                name: None,
            }),
        });
        spec.additional_block_devices = vec![
            AdditionalBlockDevice {
                name: "etcd".into(),
                size_gib: 5,
                storage: BlockDeviceStorage {
                    type_: BlockDeviceType::Volume,
                    volume: None,
                },
            },
            AdditionalBlockDevice {
                name: "scratch".into(),
                size_gib: 2,
                storage: BlockDeviceStorage {
                    type_: BlockDeviceType::Local,
                    volume: None,
                },
            },
        ];
        let volumes = wanted_volumes("cp-0", &spec, Some("img"));
        assert_eq!(volume_names("cp-0", &spec), ["cp-0-root", "cp-0-etcd"]);
        assert_eq!(
            volumes[0].request.availability_zone.as_deref(),
            Some("az-2")
        );
        assert_eq!(volumes[0].request.image_id.as_deref(), Some("img"));
        assert_eq!(volumes[1].request.availability_zone, None, "no zone named");
        let mark = owner("ns", "cp-0");
        let marked = volume_request(&volumes[0], &mark);
        assert!(mark.marks_metadata(&marked.metadata), "marked as ours");
        assert_eq!(marked.name, "cp-0-root");
        let with_ids: Vec<(VolumeWant, String)> = volumes
            .into_iter()
            .map(|v| {
                let id = format!("{}-id", v.name());
                (v, id)
            })
            .collect();
        let devices = block_devices(&spec, "img", &with_ids);
        assert_eq!(devices.len(), 3);
        assert_eq!(
            (devices[0].boot_index, devices[0].source_type),
            (0, "volume")
        );
        assert_eq!(devices[1].tag.as_deref(), Some("etcd"));
        assert_eq!(
            (devices[2].source_type, devices[2].destination_type),
            ("blank", "local")
        );
        let resolved = ResolvedServerSpec {
            image_id: Some("img".into()),
            flavor_id: Some("2".into()),
            ..ResolvedServerSpec::default()
        };
        let owner = owner("ns", "cp-0");
        let request = server_request(
            "cp-0",
            &spec,
            &resolved,
            &["p".into()],
            devices,
            None,
            &owner,
        );
        assert_eq!(request.image_ref, "", "the image is on the root volume");
        assert!(owner.marks(&request.tags), "marked as ours");
    }

    #[test]
    fn without_a_root_volume_extra_devices_boot_from_the_image() {
        let mut spec = spec();
        spec.additional_block_devices = vec![AdditionalBlockDevice {
            name: "scratch".into(),
            size_gib: 2,
            storage: BlockDeviceStorage {
                type_: BlockDeviceType::Local,
                volume: None,
            },
        }];
        let devices = block_devices(&spec, "img", &[]);
        assert_eq!(devices[0].uuid.as_deref(), Some("img"));
        assert_eq!(
            (devices[0].source_type, devices[0].boot_index),
            ("image", 0)
        );
        assert!(
            block_devices(&self::spec(), "img", &[]).is_empty(),
            "plain boot: no mapping"
        );
    }

    #[test]
    fn scheduler_hints_keep_their_types() {
        let mut spec = spec();
        spec.scheduler_hint_additional_properties = serde_json::from_value(json!([
            {"name": "a", "value": {"type": "Bool", "bool": true}},
            {"name": "b", "value": {"type": "Number", "number": 3}},
            {"name": "c", "value": {"type": "String", "string": "x"}},
        ]))
        .expect("hints");
        let request = server_request(
            "s",
            &spec,
            &ResolvedServerSpec::default(),
            &[],
            vec![],
            None,
            &owner("ns", "s"),
        );
        assert_eq!(
            Value::Object(request.scheduler_hints),
            json!({"a": true, "b": 3, "c": "x"})
        );
    }

    fn observed(ports: Vec<Option<&str>>, volumes: Vec<Option<Volume>>) -> Observed {
        Observed {
            ports: ports.into_iter().map(|p| p.map(str::to_owned)).collect(),
            trunks: vec![None, None],
            volumes,
            server: ServerState::Absent,
        }
    }

    #[test]
    fn the_next_step_goes_ports_trunks_volumes_server() {
        let no_trunks = [false, false];
        let mut seen = observed(vec![Some("p0"), None], vec![None]);
        assert_eq!(next_step(&no_trunks, &seen), Next::CreatePorts(vec![1]));
        seen.ports[1] = Some("p1".into());
        assert_eq!(
            next_step(&[false, true], &seen),
            Next::CreateTrunks(vec![1])
        );
        assert_eq!(next_step(&no_trunks, &seen), Next::CreateVolumes(vec![0]));
        seen.volumes[0] = Some(volume("s-root", "creating"));
        assert_eq!(
            next_step(&no_trunks, &seen),
            Next::WaitForVolumes(vec!["s-root (creating)".into()])
        );
        seen.volumes[0] = Some(volume("s-root", "error"));
        assert_eq!(
            next_step(&no_trunks, &seen),
            Next::VolumeFailed("s-root".into())
        );
        seen.volumes[0] = Some(volume("s-root", "available"));
        assert_eq!(next_step(&no_trunks, &seen), Next::CreateServer);
        seen.server = ServerState::Found(Box::new(server("BUILD")));
        assert_eq!(next_step(&no_trunks, &seen), Next::Report);
        seen.server = ServerState::Lost("s1".into());
        assert_eq!(next_step(&no_trunks, &seen), Next::Lost("s1".into()));
    }

    #[test]
    fn server_states_become_conditions() {
        let poll = |age: Duration| age.min(Duration::from_secs(30)).max(Duration::from_secs(1));
        let active = instance_view(&server("ACTIVE"), Duration::from_secs(40), poll);
        assert!(active.provisioned);
        assert_eq!(active.condition.status, Status::True);
        assert_eq!(active.poll_after, None);
        let building = instance_view(&server("BUILD"), Duration::from_secs(3), poll);
        assert_eq!(building.condition.reason, reasons::INSTANCE_BUILDING);
        let no_status = instance_view(&server(""), Duration::from_secs(3), poll);
        assert_eq!(no_status.condition.reason, reasons::INSTANCE_BUILDING);
        assert!(is_building(&server("")) && is_building(&server("BUILD")));
        assert!(!is_building(&server("ACTIVE")) && !is_building(&server("ERROR")));
        assert_eq!(building.poll_after, Some(Duration::from_secs(3)));
        let error = instance_view(&server("ERROR"), Duration::ZERO, poll);
        assert_eq!(error.condition.reason, reasons::INSTANCE_ERROR);
        assert!(error.condition.message.contains("No valid host was found."));
        assert!(error.needs_attention && !error.provisioned);
        assert_eq!(
            error.poll_after,
            Some(ERROR_RECHECK),
            "looked at again, as CAPO #3300"
        );
        let off = instance_view(&server("SHUTOFF"), Duration::ZERO, poll);
        assert_eq!(off.condition.reason, reasons::INSTANCE_NOT_ACTIVE);
        assert_eq!(off.poll_after, Some(Duration::from_secs(30)));
    }

    #[test]
    fn ages_read_novas_and_cinders_timestamps() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-22T06:34:04Z")
            .expect("a time")
            .with_timezone(&chrono::Utc);
        assert_eq!(
            age(Some("2026-11-22T06:33:54Z"), now),
            Duration::from_secs(10)
        );
        assert_eq!(
            age(Some("2026-11-22T06:33:59.000000"), now),
            Duration::from_secs(5)
        );
        assert_eq!(age(Some("yesterday"), now), Duration::ZERO);
        assert_eq!(
            age(Some("2026-11-22T07:00:00Z"), now),
            Duration::ZERO,
            "future"
        );
        assert_eq!(age(None, now), Duration::ZERO);
    }

    #[test]
    fn fixed_addresses_are_internal_and_floating_external() {
        let addresses = addresses(&server("ACTIVE"));
        let pairs: Vec<(&str, &str)> = addresses
            .iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [("InternalIP", "10.0.0.5"), ("ExternalIP", "172.24.4.9")]
        );
    }
}
