//! Objects kept packed in the shared stores: the metadata as it is (what kube-runtime and the
//! wake-up mappers read), the rest as deflated JSON, decoded when a reconciler reads it. An
//! OpenStackServer decoded takes about 6 KB of heap; packed, about a third of that
//! (docs/memory.md). Like kube's `DeserializeGuard`, an object that does not decode is kept
//! with its error, so one bad object never stalls a watch.

use std::borrow::Cow;
use std::io::Read;
use std::marker::PhantomData;
use std::sync::Arc;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An object of kind `K`, packed: its metadata, and the rest of it deflated (or why it does
/// not decode).
pub struct Packed<K> {
    metadata: ObjectMeta,
    body: Result<Arc<[u8]>, Arc<str>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Packed {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body.as_ref().map(|bytes| bytes.len());
        f.debug_struct("Packed")
            .field("name", &self.metadata.name)
            .field("namespace", &self.metadata.namespace)
            .field("packed_bytes", &body)
            .finish()
    }
}

impl<K> Packed<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    /// Packs `object`; its metadata stays as it is.
    pub fn pack(mut object: K) -> Self {
        let metadata = std::mem::take(object.meta_mut());
        let body = deflate(&object).map_err(|error| Arc::from(error.to_string()));
        Packed {
            metadata,
            body,
            kind: PhantomData,
        }
    }

    /// The object, decoded; or why it does not decode.
    pub fn unpack(&self) -> Result<K, Box<InvalidObject>> {
        let invalid = |error: String| {
            Box::new(InvalidObject {
                error,
                metadata: self.metadata.clone(),
            })
        };
        let bytes = self
            .body
            .as_ref()
            .map_err(|error| invalid(error.to_string()))?;
        let mut object: K = inflate(bytes).map_err(|error| invalid(error.to_string()))?;
        *object.meta_mut() = self.metadata.clone();
        Ok(object)
    }

    /// Whether the object decoded when it was stored.
    pub fn is_valid(&self) -> bool {
        self.body.is_ok()
    }
}

fn deflate<K: Serialize>(object: &K) -> std::io::Result<Arc<[u8]>> {
    // Fast compression: an object is packed once per watch event.
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    serde_json::to_writer(&mut encoder, object)?;
    let bytes = encoder.finish()?;
    Ok(Arc::from(bytes.into_boxed_slice()))
}

fn inflate<K: DeserializeOwned>(bytes: &[u8]) -> std::io::Result<K> {
    let mut json = Vec::with_capacity(bytes.len() * 3);
    DeflateDecoder::new(bytes).read_to_end(&mut json)?;
    Ok(serde_json::from_slice(&json)?)
}

impl<'de, K> Deserialize<'de> for Packed<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let DeserializeGuard(decoded) = DeserializeGuard::<K>::deserialize(deserializer)?;
        Ok(match decoded {
            Ok(object) => Packed::pack(object),
            Err(invalid) => Packed {
                metadata: invalid.metadata,
                body: Err(Arc::from(invalid.error)),
                kind: PhantomData,
            },
        })
    }
}

impl<K: Resource> Resource for Packed<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What a shared watch stores of an object of kind `K`: the object itself (kube's
/// `DeserializeGuard`) or [`Packed`]. Either may hold an object that does not decode.
pub trait Stored<K: Clone>: Resource {
    /// The object (borrowed where it is kept decoded); or why it does not decode.
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>>;
}

impl<K: Resource + Clone> Stored<K> for DeserializeGuard<K> {
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>> {
        self.0
            .as_ref()
            .map(Cow::Borrowed)
            .map_err(|invalid| Box::new(invalid.clone()))
    }
}

impl<K> Stored<K> for Packed<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned,
{
    fn decoded(&self) -> Result<Cow<'_, K>, Box<InvalidObject>> {
        self.unpack().map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn an_object_packs_smaller_and_unpacks_the_same() {
        let data: std::collections::BTreeMap<String, String> = (0..20)
            .map(|i| (format!("key-{i}"), "a value that repeats itself".to_owned()))
            .collect();
        let object: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns", "labels": {"l": "v"}},
            "data": data,
        }))
        .unwrap();
        let packed = Packed::pack(object.clone());
        let json = serde_json::to_vec(&object.data).unwrap().len();
        let bytes = packed.body.as_ref().map(|b| b.len()).unwrap();
        assert!(bytes * 3 < json, "{bytes} packed bytes of {json}");
        assert_eq!(packed.meta().name.as_deref(), Some("a"));
        assert_eq!(packed.unpack().unwrap(), object);
    }

    #[test]
    fn an_object_that_does_not_decode_keeps_its_name_and_error() {
        let packed: Packed<ConfigMap> = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns"},
            "data": "not a map",
        }))
        .unwrap();
        assert!(!packed.is_valid());
        assert_eq!(packed.meta().name.as_deref(), Some("bad"));
        let invalid = packed.unpack().unwrap_err();
        assert_eq!(invalid.metadata.name.as_deref(), Some("bad"));
        assert!(
            invalid.error.contains("Expected a map"),
            "{}",
            invalid.error
        );
    }
}
