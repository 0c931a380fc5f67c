//! Just enough of Kubernetes' protobuf encoding to read what kubectl sends for built-in
//! kinds: `kubectl create namespace|configmap|secret` post protobuf bodies (answers stay
//! JSON, which kubectl also accepts). Other kinds in protobuf get 415.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::errors::ApiError;

const MAGIC: &[u8] = b"k8s\0";

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Iterates the fields of one message.
struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.buf.split_first()?;
            self.buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Wire<'a>), ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let malformed = || ApiError::bad_request("malformed protobuf body");
        let field = (|| {
            let key = self.varint()?;
            let wire = match key & 7 {
                0 => Wire::Varint(self.varint()?),
                1 => self.take(8).map(|_| Wire::Fixed)?,
                2 => {
                    let len = usize::try_from(self.varint()?).ok()?;
                    Wire::Bytes(self.take(len)?)
                }
                5 => self.take(4).map(|_| Wire::Fixed)?,
                _ => return None,
            };
            Some((key >> 3, wire))
        })();
        Some(field.ok_or_else(malformed))
    }
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf }
}

fn text(bytes: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::bad_request("protobuf string is not UTF-8"))
}

/// A `map<string, string|bytes>` entry.
fn map_entry(bytes: &[u8], binary: bool) -> Result<(String, Value), ApiError> {
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    for field in fields(bytes) {
        match field? {
            (1, Wire::Bytes(b)) => key = text(b)?,
            (2, Wire::Bytes(b)) if binary => {
                value = base64::engine::general_purpose::STANDARD.encode(b).into();
            }
            (2, Wire::Bytes(b)) => value = text(b)?.into(),
            _ => {}
        }
    }
    Ok((key, value))
}

fn insert_entry(
    object: &mut Value,
    field: &str,
    bytes: &[u8],
    binary: bool,
) -> Result<(), ApiError> {
    let (key, value) = map_entry(bytes, binary)?;
    if !object.get(field).is_some_and(Value::is_object) {
        object[field] = Value::Object(Map::new());
    }
    object[field][key] = value;
    Ok(())
}

fn push(object: &mut Value, field: &str, value: Value) {
    match object.get_mut(field).and_then(Value::as_array_mut) {
        Some(list) => list.push(value),
        None => object[field] = json!([value]),
    }
}

fn owner_reference(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut owner = json!({});
    for field in fields(bytes) {
        match field? {
            (1, Wire::Bytes(b)) => owner["kind"] = text(b)?.into(),
            (3, Wire::Bytes(b)) => owner["name"] = text(b)?.into(),
            (4, Wire::Bytes(b)) => owner["uid"] = text(b)?.into(),
            (5, Wire::Bytes(b)) => owner["apiVersion"] = text(b)?.into(),
            (6, Wire::Varint(v)) => owner["controller"] = (v != 0).into(),
            (7, Wire::Varint(v)) => owner["blockOwnerDeletion"] = (v != 0).into(),
            _ => {}
        }
    }
    Ok(owner)
}

/// The user-settable part of ObjectMeta (the server sets the rest).
fn object_meta(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut meta = json!({});
    for field in fields(bytes) {
        match field? {
            (1, Wire::Bytes(b)) => meta["name"] = text(b)?.into(),
            (2, Wire::Bytes(b)) => meta["generateName"] = text(b)?.into(),
            (3, Wire::Bytes(b)) => meta["namespace"] = text(b)?.into(),
            (6, Wire::Bytes(b)) => meta["resourceVersion"] = text(b)?.into(),
            (11, Wire::Bytes(b)) => insert_entry(&mut meta, "labels", b, false)?,
            (12, Wire::Bytes(b)) => insert_entry(&mut meta, "annotations", b, false)?,
            (13, Wire::Bytes(b)) => push(&mut meta, "ownerReferences", owner_reference(b)?),
            (14, Wire::Bytes(b)) => push(&mut meta, "finalizers", text(b)?.into()),
            _ => {}
        }
    }
    Ok(meta)
}

fn nested_strings(bytes: &[u8], wanted: u64) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for field in fields(bytes) {
        if let (n, Wire::Bytes(b)) = field?
            && n == wanted
        {
            out.push(text(b)?.into());
        }
    }
    Ok(out)
}

/// Decodes a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    // Only the kinds kubectl sends as protobuf are decoded; other bodies must be JSON or YAML.
    let unsupported =
        || ApiError::unsupported_media_type(&["application/json", "application/yaml"]);
    let envelope = body.strip_prefix(MAGIC).ok_or_else(unsupported)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for field in fields(envelope) {
        match field? {
            (1, Wire::Bytes(type_meta)) => {
                for f in fields(type_meta) {
                    match f? {
                        (1, Wire::Bytes(b)) => api_version = text(b)?,
                        (2, Wire::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut object = json!({"apiVersion": api_version, "kind": kind});
    for field in fields(raw) {
        let (number, wire) = field?;
        match (kind.as_str(), number, wire) {
            (_, 1, Wire::Bytes(b)) => object["metadata"] = object_meta(b)?,
            ("ConfigMap", 2, Wire::Bytes(b)) => insert_entry(&mut object, "data", b, false)?,
            ("ConfigMap", 3, Wire::Bytes(b)) => insert_entry(&mut object, "binaryData", b, true)?,
            ("ConfigMap", 4, Wire::Varint(v)) | ("Secret", 5, Wire::Varint(v)) => {
                object["immutable"] = (v != 0).into();
            }
            ("Secret", 2, Wire::Bytes(b)) => insert_entry(&mut object, "data", b, true)?,
            ("Secret", 3, Wire::Bytes(b)) => object["type"] = text(b)?.into(),
            ("Secret", 4, Wire::Bytes(b)) => insert_entry(&mut object, "stringData", b, false)?,
            ("Namespace", 2, Wire::Bytes(b)) => {
                object["spec"] = json!({"finalizers": nested_strings(b, 1)?});
            }
            ("ConfigMap" | "Secret" | "Namespace", _, _) => {}
            _ => return Err(unsupported()),
        }
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_field(number: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, u8::try_from(payload.len()).unwrap()];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn a_configmap_from_kubectl_create_decodes() {
        let meta = [bytes_field(1, b"cfg"), bytes_field(3, b"default")].concat();
        let entry = [bytes_field(1, b"k"), bytes_field(2, b"v")].concat();
        let raw = [bytes_field(1, &meta), bytes_field(2, &entry)].concat();
        let type_meta = [bytes_field(1, b"v1"), bytes_field(2, b"ConfigMap")].concat();
        let body = [
            MAGIC.to_vec(),
            bytes_field(1, &type_meta),
            bytes_field(2, &raw),
        ]
        .concat();
        let object = decode(&body).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cfg", "namespace": "default"}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn other_kinds_and_garbage_are_refused() {
        let type_meta = [bytes_field(1, b"v1"), bytes_field(2, b"Pod")].concat();
        let raw = bytes_field(2, b"x");
        let body = [
            MAGIC.to_vec(),
            bytes_field(1, &type_meta),
            bytes_field(2, &raw),
        ]
        .concat();
        assert_eq!(decode(&body).unwrap_err().code, 415);
        assert_eq!(decode(b"k8s\0\xff").unwrap_err().code, 400);
        assert_eq!(decode(b"{}").unwrap_err().code, 415);
    }
}
