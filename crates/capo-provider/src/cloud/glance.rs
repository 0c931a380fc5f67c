//! Glance v2: images by name and tags.

use serde::Deserialize;

use super::endpoint::Call;
use super::{CloudError, Operation, RequestPath, Service};

/// A Glance image, as image list and show return it (the fields we read).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Image {
    /// The image's UUID, handed to Nova (or to Cinder for a root volume).
    pub id: String,
    /// Its name; empty if absent.
    #[serde(default)]
    pub name: String,
    /// queued, saving, active, killed, deleted, ...
    #[serde(default)]
    pub status: String,
    /// Its tags; a machine spec can select an image by them.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The image's `os_type` property (`linux`, `windows`), when it has one.
    #[serde(default)]
    pub os_type: Option<String>,
}

const fn op(name: &'static str) -> Operation {
    Operation::new(Service::Image, name)
}

/// Typed Glance calls.
pub struct Glance<'a> {
    path: &'a RequestPath,
}

impl<'a> Glance<'a> {
    pub(crate) fn new(path: &'a RequestPath) -> Self {
        Glance { path }
    }

    /// Images with this name (if given) and all of these tags.
    pub async fn list_images(
        &self,
        name: Option<&str>,
        tags: &[String],
    ) -> Result<Vec<Image>, CloudError> {
        let mut call = Call::get(op("image_list"), "images").query_opt("name", name);
        for tag in tags {
            call = call.query("tag", tag.clone());
        }
        self.path.fetch_all(call.key("images")).await
    }

    /// The image with this ID.
    pub async fn get_image(&self, id: &str) -> Result<Image, CloudError> {
        let call = Call::get(
            op("image_get"),
            format!("images/{}", super::octavia::seg(id)),
        );
        self.path.fetch(call).await
    }
}
