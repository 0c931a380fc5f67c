//! Cinder v3: the volumes a server boots from or carries as extra disks. They are created
//! before the server (so their type and availability zone can be chosen, as CAPO does) and
//! handed to Nova in its block device mapping.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::endpoint::Call;
use super::octavia::seg;
use super::{CloudError, Operation, RequestPath, Service};

/// A Cinder volume, as volume create, show and list return it (the fields we read).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Volume {
    /// The volume's UUID, handed to Nova in the block device mapping.
    pub id: String,
    /// Its name (empty if absent); a volume is found again by it.
    #[serde(default)]
    pub name: String,
    /// creating, available, in-use, deleting, error, ...
    #[serde(default)]
    pub status: String,
    /// GiB.
    #[serde(default)]
    pub size: u64,
    /// The Cinder availability zone it is in; None if Cinder gave none.
    #[serde(default)]
    pub availability_zone: Option<String>,
    /// The name of its volume type (the storage backend class); None if Cinder gave none.
    #[serde(default)]
    pub volume_type: Option<String>,
    /// Whether more than one server may attach it (its type's `multiattach` extra spec): a
    /// server booted with it must be created at Nova microversion 2.60 or later.
    #[serde(default)]
    pub multiattach: bool,
    /// Cinder's `attachments`, one object per server it is attached to, kept undecoded.
    #[serde(default)]
    pub attachments: Vec<serde_json::Value>,
    /// Cinder's timestamp, without a zone (UTC).
    #[serde(default)]
    pub created_at: Option<String>,
    /// Its metadata (string keys and values); capo-rs marks its own volumes here.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl Volume {
    /// Whether Nova can attach it now.
    pub fn is_available(&self) -> bool {
        self.status == "available"
    }

    /// Whether Cinder gave up on it.
    pub fn is_error(&self) -> bool {
        self.status.starts_with("error")
    }

    /// Whether a delete is already under way.
    pub fn is_deleting(&self) -> bool {
        self.status == "deleting"
    }
}

/// A volume to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VolumeSpec {
    /// The name to give the volume.
    pub name: String,
    /// GiB.
    pub size: u64,
    /// Free text for Cinder's `description`; left out of the request when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The volume type to create it with; Cinder's default type when None.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// The availability zone to create it in; Cinder's default when None.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// The image to copy onto the volume (a root volume).
    #[serde(rename = "imageRef", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Metadata to create it with (the owner mark); left out when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

const fn op(name: &'static str) -> Operation {
    Operation::new(Service::BlockStorage, name)
}

/// Typed Cinder calls.
pub struct Cinder<'a> {
    path: &'a RequestPath,
}

impl<'a> Cinder<'a> {
    pub(crate) fn new(path: &'a RequestPath) -> Self {
        Cinder { path }
    }

    /// Starts creating a volume; it reads `creating` until it is `available`.
    pub async fn create_volume(&self, spec: &VolumeSpec) -> Result<Volume, CloudError> {
        let call = Call::post(op("volume_create"), "volumes", json!({ "volume": spec }));
        self.path.fetch(call.key("volume")).await
    }

    /// The volume with this ID (`NotFound` once it is gone).
    pub async fn get_volume(&self, id: &str) -> Result<Volume, CloudError> {
        let call = Call::get(op("volume_get"), format!("volumes/{}", seg(id)));
        self.path.fetch(call.key("volume")).await
    }

    /// Volumes with exactly this name.
    pub async fn list_volumes_by_name(&self, name: &str) -> Result<Vec<Volume>, CloudError> {
        let call = Call::get(op("volume_list"), "volumes/detail").query("name", name);
        let volumes: Vec<Volume> = self.path.fetch_all(call.key("volumes")).await?;
        Ok(volumes.into_iter().filter(|v| v.name == name).collect())
    }

    /// Starts deleting the volume; it reads `deleting` until it is gone.
    pub async fn delete_volume(&self, id: &str) -> Result<(), CloudError> {
        let call = Call::delete(op("volume_delete"), format!("volumes/{}", seg(id)));
        self.path.run(call).await
    }
}
