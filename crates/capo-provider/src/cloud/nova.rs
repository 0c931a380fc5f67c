//! Nova v2.1: servers, flavors, server groups. Requests carry microversion 2.53 (as CAPO
//! does), which gives server tags and UUID-based server groups.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::endpoint::Call;
use super::octavia::seg;
use super::{CloudError, Operation, RequestPath, Service};

const MICROVERSION: Microversion = Microversion {
    openstack: "compute 2.53",
    nova: "2.53",
};

/// The microversion a server is created at when a volume it boots with is multiattach (Queens;
/// Nova refuses such a volume below it). The answer to a create is the same at both.
const MULTIATTACH_MICROVERSION: Microversion = Microversion {
    openstack: "compute 2.60",
    nova: "2.60",
};

/// A microversion as each of Nova's two headers names it.
struct Microversion {
    openstack: &'static str,
    nova: &'static str,
}

/// A Nova server, as `GET /servers/{id}` returns it at microversion 2.53.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Server {
    /// The server's UUID.
    pub id: String,
    /// The server's name.
    #[serde(default)]
    pub name: String,
    /// BUILD, ACTIVE, ERROR, SHUTOFF, DELETED, ...
    #[serde(default)]
    pub status: String,
    /// The server's addresses by network name, as Nova returns them: per network, a list of
    /// `{addr, version, OS-EXT-IPS:type, ...}`, the type `fixed` or `floating`.
    #[serde(default)]
    pub addresses: Value,
    /// The server's metadata key-value pairs.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// The server's tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Nova's fault (`message`, `code`, ...) for a server in ERROR; otherwise None.
    #[serde(default)]
    pub fault: Option<Value>,
    /// The availability zone the server is in (`OS-EXT-AZ:availability_zone`).
    #[serde(default, rename = "OS-EXT-AZ:availability_zone")]
    pub availability_zone: Option<String>,
    /// When the server was created, as an RFC 3339 timestamp.
    #[serde(default)]
    pub created: Option<String>,
    /// `deleting` once a delete is under way.
    #[serde(default, rename = "OS-EXT-STS:task_state")]
    pub task_state: Option<String>,
}

impl Server {
    /// Nova's fault message, for a server in ERROR.
    pub fn fault_message(&self) -> Option<&str> {
        self.fault.as_ref()?.get("message")?.as_str()
    }

    /// Whether a delete is under way.
    pub fn is_deleting(&self) -> bool {
        self.task_state.as_deref() == Some("deleting")
            || matches!(self.status.as_str(), "DELETED" | "SOFT_DELETED")
    }
}

/// One entry of a new server's `block_device_mapping_v2`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockDevice {
    /// 0 for the boot disk, -1 for the others.
    pub boot_index: i32,
    /// The volume (or image) for `source_type` volume (or image).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// `volume`, `image` or `blank`.
    pub source_type: &'static str,
    /// `volume` or `local`.
    pub destination_type: &'static str,
    /// GiB, for a blank local disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_size: Option<u64>,
    /// Whether Nova deletes the volume with the server.
    pub delete_on_termination: bool,
    /// The device tag the guest sees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A network attachment of a new server.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerNetwork {
    /// UUID of an existing Neutron port to attach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// UUID of a network to attach, on which Nova creates the port (capo-rs passes ports instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// A server to create: the `server` object of `POST /servers`. `Debug` says how long the
/// user data is, never what it holds (bootstrap data carries the cluster's join secrets).
#[derive(Clone, Default, PartialEq, Serialize)]
pub struct ServerSpec {
    /// The server's name.
    pub name: String,
    /// ID of the flavor (`flavorRef`).
    #[serde(rename = "flavorRef")]
    pub flavor_ref: String,
    /// ID of the image to boot (`imageRef`); empty, and left out, when booting from a volume.
    #[serde(rename = "imageRef", skip_serializing_if = "String::is_empty")]
    pub image_ref: String,
    /// The network attachments, in order.
    pub networks: Vec<ServerNetwork>,
    /// Name of the Nova keypair whose public key is injected; None for none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    /// Metadata key-value pairs for the server; left out when empty.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Base64-encoded, as Nova requires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// The availability zone to place the server in; None lets Nova choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// The server's tags; left out when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Whether to attach a config drive; None leaves the cloud's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<bool>,
    /// Volumes and disks to attach (`block_device_mapping_v2`); left out when empty.
    #[serde(
        rename = "block_device_mapping_v2",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub block_devices: Vec<BlockDevice>,
    /// Not part of the `server` object: sent as a scheduler hint.
    #[serde(skip)]
    pub server_group_id: Option<String>,
    /// More scheduler hints, sent beside the server object.
    #[serde(skip)]
    pub scheduler_hints: serde_json::Map<String, Value>,
    /// A volume in `block_devices` is multiattach: Nova refuses it below microversion 2.60,
    /// so the create asks for 2.60 (CAPO's `NovaMultiAttachVolume`).
    #[serde(skip)]
    pub multiattach: bool,
}

impl std::fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user_data = self
            .user_data
            .as_ref()
            .map(|data| format!("<{} bytes, not shown>", data.len()));
        f.debug_struct("ServerSpec")
            .field("name", &self.name)
            .field("flavor_ref", &self.flavor_ref)
            .field("image_ref", &self.image_ref)
            .field("networks", &self.networks)
            .field("key_name", &self.key_name)
            .field("metadata", &self.metadata)
            .field("user_data", &user_data)
            .field("availability_zone", &self.availability_zone)
            .field("tags", &self.tags)
            .field("config_drive", &self.config_drive)
            .field("block_devices", &self.block_devices)
            .field("server_group_id", &self.server_group_id)
            .field("scheduler_hints", &self.scheduler_hints)
            .field("multiattach", &self.multiattach)
            .finish()
    }
}

/// A Nova flavor, as `GET /flavors/{id}` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Flavor {
    /// The flavor's ID.
    pub id: String,
    /// The flavor's name.
    pub name: String,
    /// Number of virtual CPUs.
    #[serde(default)]
    pub vcpus: u32,
    /// Memory in MiB.
    #[serde(default)]
    pub ram: u64,
    /// Root disk size in GiB; 0 when the flavor sets none (the disk then takes the image's size).
    #[serde(default)]
    pub disk: u64,
    /// GiB of ephemeral disk.
    #[serde(default, rename = "OS-FLV-EXT-DATA:ephemeral")]
    pub ephemeral: u64,
}

/// A Nova server group, as `GET /os-server-groups` returns it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ServerGroup {
    /// The group's UUID.
    pub id: String,
    /// The group's name.
    pub name: String,
    /// The group's policies (e.g. `anti-affinity`), as microversions before 2.64 report them.
    #[serde(default)]
    pub policies: Vec<String>,
    /// The group's policy, as microversion 2.64 and later report it; None at capo-rs's 2.53.
    #[serde(default)]
    pub policy: Option<String>,
}

const fn op(name: &'static str) -> Operation {
    Operation::new(Service::Compute, name)
}

fn versioned(call: Call) -> Call {
    at_microversion(call, MICROVERSION)
}

fn at_microversion(call: Call, microversion: Microversion) -> Call {
    call.header("openstack-api-version", microversion.openstack)
        .header("x-openstack-nova-api-version", microversion.nova)
}

/// Typed Nova calls.
pub struct Nova<'a> {
    path: &'a RequestPath,
}

impl<'a> Nova<'a> {
    pub(crate) fn new(path: &'a RequestPath) -> Self {
        Nova { path }
    }

    /// Creates a server, with its server group and extra scheduler hints in `os:scheduler_hints`.
    /// Nova answers with little more than the new ID; the build goes on in the background.
    pub async fn create_server(&self, spec: &ServerSpec) -> Result<Server, CloudError> {
        let mut body = json!({ "server": spec });
        let mut hints = spec.scheduler_hints.clone();
        if let Some(group) = &spec.server_group_id {
            hints.insert("group".into(), json!(group));
        }
        if !hints.is_empty() {
            body["os:scheduler_hints"] = Value::Object(hints);
        }
        let microversion = match spec.multiattach {
            true => MULTIATTACH_MICROVERSION,
            false => MICROVERSION,
        };
        let call = at_microversion(
            Call::post(op("server_create"), "servers", body),
            microversion,
        );
        self.path.fetch(call.key("server")).await
    }

    /// The server with this UUID.
    pub async fn get_server(&self, id: &str) -> Result<Server, CloudError> {
        let call = versioned(Call::get(op("server_get"), format!("servers/{}", seg(id))));
        self.path.fetch(call.key("server")).await
    }

    /// Servers whose name matches exactly and that carry all of `tags`. Nova's `name` filter
    /// is a regular expression, so the name is anchored and escaped, and the answer filtered
    /// again.
    pub async fn list_servers_by_name(
        &self,
        name: &str,
        tags: &[String],
    ) -> Result<Vec<Server>, CloudError> {
        let pattern = format!("^{}$", regex::escape(name));
        let mut call = Call::get(op("server_list"), "servers/detail").query("name", pattern);
        if !tags.is_empty() {
            call = call.query("tags", tags.join(","));
        }
        let servers: Vec<Server> = self.path.fetch_all(versioned(call).key("servers")).await?;
        Ok(servers
            .into_iter()
            .filter(|s| s.name == name && tags.iter().all(|t| s.tags.contains(t)))
            .collect())
    }

    /// Deletes a SOFT_DELETED server now rather than when the cloud reclaims it.
    pub async fn force_delete_server(&self, id: &str) -> Result<(), CloudError> {
        let call = versioned(Call::post(
            op("server_action"),
            format!("servers/{}/action", seg(id)),
            json!({ "forceDelete": null }),
        ));
        self.path.run(call).await
    }

    /// Asks Nova to delete a server; the delete completes in the background.
    pub async fn delete_server(&self, id: &str) -> Result<(), CloudError> {
        let call = versioned(Call::delete(
            op("server_delete"),
            format!("servers/{}", seg(id)),
        ));
        self.path.run(call).await
    }

    /// The flavor with this ID.
    pub async fn get_flavor(&self, id: &str) -> Result<Flavor, CloudError> {
        let call = versioned(Call::get(op("flavor_get"), format!("flavors/{}", seg(id))));
        self.path.fetch(call.key("flavor")).await
    }

    /// The flavor with this exact name; `NotFound` when there is none.
    pub async fn flavor_by_name(&self, name: &str) -> Result<Flavor, CloudError> {
        let call = versioned(Call::get(op("flavor_list"), "flavors/detail"));
        let flavors: Vec<Flavor> = self.path.fetch_all(call.key("flavors")).await?;
        flavors
            .into_iter()
            .find(|f| f.name == name)
            .ok_or_else(|| not_found(op("flavor_list"), format!("no flavor named {name:?}")))
    }

    /// The names of the availability zones that are available.
    pub async fn list_availability_zones(&self) -> Result<Vec<String>, CloudError> {
        #[derive(Deserialize)]
        struct ZoneState {
            #[serde(default)]
            available: bool,
        }
        #[derive(Deserialize)]
        struct Zone {
            #[serde(rename = "zoneName")]
            name: String,
            #[serde(rename = "zoneState")]
            state: ZoneState,
        }
        let call = versioned(Call::get(
            op("availability_zone_list"),
            "os-availability-zone",
        ));
        let zones: Vec<Zone> = self.path.fetch(call.key("availabilityZoneInfo")).await?;
        Ok(zones
            .into_iter()
            .filter(|z| z.state.available)
            .map(|z| z.name)
            .collect())
    }

    /// Server groups, optionally by exact name.
    pub async fn list_server_groups(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<ServerGroup>, CloudError> {
        let call = versioned(Call::get(op("server_group_list"), "os-server-groups"));
        let groups: Vec<ServerGroup> = self.path.fetch_all(call.key("server_groups")).await?;
        Ok(groups
            .into_iter()
            .filter(|g| name.is_none_or(|n| g.name == n))
            .collect())
    }
}

pub(crate) fn not_found(op: Operation, message: String) -> CloudError {
    CloudError::NotFound(super::ErrorContext {
        service: op.service,
        operation: op.name.to_owned(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_user_data() {
        let spec = ServerSpec {
            name: "m-0".into(),
            user_data: Some("am9pbi10b2tlbjogc2VjcmV0".into()),
            ..ServerSpec::default()
        };
        let shown = format!("{spec:?}");
        assert!(!shown.contains("am9pbi10b2tlbjogc2VjcmV0"), "{shown}");
        assert!(shown.contains("<24 bytes, not shown>"), "{shown}");
        assert!(shown.contains("m-0"), "{shown}");
    }
}
