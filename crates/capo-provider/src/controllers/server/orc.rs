//! Images named by ORC (`spec.image.imageRef`): an `Image` of the OpenStack Resource
//! Controller (`openstack.k-orc.cloud/v1alpha1`) in the server's namespace. ORC uploads or
//! imports the image and writes its Glance ID in `status.id`; a server waits until the
//! Image is `Available`, as CAPO does, and is woken by the Image's watch. capo-rs does not
//! run ORC: users who name images this way install it, as CAPO asks.

use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use serde_json::Value;

/// ORC's API group.
pub const GROUP: &str = "openstack.k-orc.cloud";
/// The version of ORC's Image that CAPO reads.
pub const VERSION: &str = "v1alpha1";

/// ORC's Image resource.
pub fn image_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "Image".into(),
        plural: "images".into(),
    }
}

/// Where an ORC Image stands, for a server that needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrcImage {
    /// Available: its Glance ID.
    Ready(String),
    /// Not yet (missing, uploading, or ORC not installed): why.
    Waiting(String),
    /// ORC gave up on it (a terminal reason on its current generation): ORC's message.
    Failed(String),
}

/// ORC's terminal `Progressing` reasons.
const TERMINAL: [&str; 2] = ["InvalidConfiguration", "UnrecoverableError"];

/// What an Image object (absent: `None`) says, as ORC's own helpers read it: `Available`
/// True means ready; a `Progressing` condition of the current generation with a terminal
/// reason means failed.
pub fn state(name: &str, image: Option<&Value>) -> OrcImage {
    let Some(image) = image else {
        return OrcImage::Waiting(format!("ORC Image {name} does not exist (yet)"));
    };
    let conditions = image["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c["type"] == type_).cloned();
    let available = condition("Available").is_some_and(|c| c["status"] == "True");
    let id = image["status"]["id"].as_str().filter(|id| !id.is_empty());
    if let (true, Some(id)) = (available, id) {
        return OrcImage::Ready(id.to_owned());
    }
    let generation = &image["metadata"]["generation"];
    let progressing = condition("Progressing").filter(|c| &c["observedGeneration"] == generation);
    let message = progressing
        .as_ref()
        .and_then(|c| c["message"].as_str())
        .unwrap_or("no progress reported")
        .to_owned();
    let terminal = progressing
        .as_ref()
        .and_then(|c| c["reason"].as_str())
        .is_some_and(|r| TERMINAL.contains(&r));
    if terminal {
        OrcImage::Failed(format!("ORC Image {name} failed: {message}"))
    } else {
        OrcImage::Waiting(format!("ORC Image {name} is not available yet: {message}"))
    }
}

/// Reads the Image `name` in `namespace`: a missing Image waits for it, a cluster without
/// ORC's CRD says so.
pub async fn image(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<OrcImage, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &image_resource());
    let label = format!("{namespace}/{name}");
    match api.get(name).await {
        Ok(found) => {
            let value = serde_json::to_value(found).unwrap_or_default();
            Ok(state(&label, Some(&value)))
        }
        // The object's 404 names it; the API server's own 404 (no such resource) does not.
        Err(kube::Error::Api(e)) if e.code == 404 && e.message.contains(&format!("\"{name}\"")) => {
            Ok(state(&label, None))
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(OrcImage::Waiting(format!(
            "ORC Image {label} cannot be read: is ORC (openstack.k-orc.cloud) installed?"
        ))),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn image(generation: i64, conditions: Value, id: Option<&str>) -> Value {
        json!({"metadata": {"generation": generation},
               "status": {"conditions": conditions, "id": id}})
    }

    #[test]
    fn an_available_image_gives_its_id_and_anything_else_waits_or_fails() {
        assert!(matches!(state("ns/i", None), OrcImage::Waiting(_)));
        let available = json!([{"type": "Available", "status": "True"},
                               {"type": "Progressing", "status": "False", "reason": "Success", "observedGeneration": 1}]);
        assert_eq!(
            state("ns/i", Some(&image(1, available, Some("3f1c")))),
            OrcImage::Ready("3f1c".into())
        );
        let uploading = json!([{"type": "Available", "status": "False"},
                               {"type": "Progressing", "status": "True", "reason": "Progressing",
                                "message": "downloading", "observedGeneration": 1}]);
        let waiting = state("ns/i", Some(&image(1, uploading, None)));
        assert!(
            matches!(&waiting, OrcImage::Waiting(m) if m.contains("downloading")),
            "{waiting:?}"
        );
        let broken = json!([{"type": "Progressing", "status": "False", "reason": "InvalidConfiguration",
                             "message": "bad URL", "observedGeneration": 2}]);
        let failed = state("ns/i", Some(&image(2, broken.clone(), None)));
        assert!(
            matches!(&failed, OrcImage::Failed(m) if m.contains("bad URL")),
            "{failed:?}"
        );
        assert!(
            matches!(
                state("ns/i", Some(&image(3, broken, None))),
                OrcImage::Waiting(_)
            ),
            "a terminal reason of an older generation is not the image's last word"
        );
    }
}
