//! What a CEL rule sees of an OpenAPI schema, with the size bounds the API server's cost
//! estimator works from: the largest number of elements (characters, items, properties) a
//! value can hold, and the smallest size it can take in a JSON request. Mirrors
//! kube-apiserver's `SchemaDeclType`: declared bounds when the schema has them
//! (`maxLength` counts 4 bytes per character), otherwise what fits in one request.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

/// The largest request the API server accepts; unbounded sizes are estimated from it.
pub const MAX_REQUEST_SIZE_BYTES: i64 = 3 * 1024 * 1024;
/// A string with no `maxLength`: a whole request less its quotes.
const UNBOUNDED_STRING: i64 = MAX_REQUEST_SIZE_BYTES - 2;
/// RFC 3339 date-times and durations are at most this long, quotes included.
const MAX_DATETIME_SIZE_JSON: i64 = 32;
const MIN_DATETIME_SIZE_JSON: i64 = 21;
const JSON_DATE_SIZE: i64 = 12;
const MIN_DURATION_SIZE_JSON: i64 = 3;
/// metadata.name is a DNS subdomain.
const NAME_MAX_LENGTH: i64 = 253;

/// The shape of a value as CEL sees it.
#[derive(Debug)]
pub enum DeclKind {
    /// An object with known fields, keyed by their CEL (escaped) names.
    Object(BTreeMap<String, Arc<DeclType>>),
    /// A list of the element type.
    List(Arc<DeclType>),
    /// A map from strings to the element type (`additionalProperties`).
    Map(Arc<DeclType>),
    /// `type: string`.
    String,
    /// `format: byte`.
    Bytes,
    /// `type: integer`.
    Int,
    /// `type: number`.
    Double,
    /// `type: boolean`.
    Bool,
    /// `format: duration`.
    Duration,
    /// `format: date` or `date-time`.
    Timestamp,
    /// `x-kubernetes-int-or-string`.
    Dyn,
}

/// A schema node as a CEL declaration.
#[derive(Debug)]
pub struct DeclType {
    /// The shape.
    pub kind: DeclKind,
    /// Most elements (characters, items, properties) a value can hold; 0 for scalars and
    /// objects, as the API server has it.
    pub max_elements: i64,
    /// Fewest bytes the value takes in a JSON request.
    pub min_serialized_size: i64,
}

impl DeclType {
    fn new(kind: DeclKind, max_elements: i64, min_serialized_size: i64) -> Arc<Self> {
        Arc::new(Self {
            kind,
            max_elements,
            min_serialized_size,
        })
    }

    /// The element type of a list or map.
    pub fn elem(&self) -> Option<&Arc<DeclType>> {
        match &self.kind {
            DeclKind::List(elem) | DeclKind::Map(elem) => Some(elem),
            _ => None,
        }
    }

    /// A field of an object, by its CEL name.
    pub fn field(&self, name: &str) -> Option<&Arc<DeclType>> {
        match &self.kind {
            DeclKind::Object(fields) => fields.get(name),
            _ => None,
        }
    }
}

/// The key type of every map: a plain string whose size the API server does not bound
/// (its `max_elements` is 0, so sizes read through `@keys` come out as zero).
pub static MAP_KEY: LazyLock<Arc<DeclType>> =
    LazyLock::new(|| DeclType::new(DeclKind::String, 0, 2));

fn int_field(schema: &Value, key: &str) -> Option<i64> {
    schema.get(key).and_then(Value::as_i64).map(|v| v.max(0))
}

fn str_field<'a>(schema: &'a Value, key: &str) -> Option<&'a str> {
    schema.get(key).and_then(Value::as_str)
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key) == Some(&Value::Bool(true))
}

/// Whether the node is an embedded resource (its own root for `apiVersion`, `kind` and
/// `metadata`).
pub fn is_embedded_resource(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-embedded-resource")
}

/// The declaration of a schema node, or None when CEL cannot see it (no type, or a list or
/// map of values it cannot see). `resource_root` is true for the root of a custom resource
/// and for embedded resources.
pub fn schema_decl_type(schema: &Value, resource_root: bool) -> Option<Arc<DeclType>> {
    if flag(schema, "x-kubernetes-int-or-string") {
        let max = int_field(schema, "maxLength").map_or(UNBOUNDED_STRING, |m| m * 4);
        return Some(DeclType::new(DeclKind::Dyn, max, 1));
    }
    let owned;
    let schema = if resource_root {
        owned = with_type_and_object_meta(schema);
        &owned
    } else {
        schema
    };
    match str_field(schema, "type")? {
        "array" => {
            let items = schema.get("items")?;
            let elem = schema_decl_type(items, is_embedded_resource(items))?;
            let max = int_field(schema, "maxItems")
                .unwrap_or(UNBOUNDED_STRING / (elem.min_serialized_size + 1));
            Some(DeclType::new(DeclKind::List(elem), max, 2))
        }
        "object" => match schema.get("additionalProperties").filter(|a| a.is_object()) {
            Some(values) => {
                let elem = schema_decl_type(values, is_embedded_resource(values))?;
                // Per entry: the value, a key of at least `""`, a colon and a comma.
                let max = int_field(schema, "maxProperties")
                    .unwrap_or(UNBOUNDED_STRING / (elem.min_serialized_size + 6));
                Some(DeclType::new(DeclKind::Map(elem), max, 2))
            }
            None => Some(object_decl_type(schema)),
        },
        "string" => Some(string_decl_type(schema)),
        "boolean" => Some(DeclType::new(DeclKind::Bool, 0, 4)),
        "number" => Some(DeclType::new(DeclKind::Double, 0, 1)),
        "integer" => Some(DeclType::new(DeclKind::Int, 0, 1)),
        _ => None,
    }
}

fn object_decl_type(schema: &Value) -> Arc<DeclType> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields = BTreeMap::new();
    // `{}`, plus every required property without a default (the server fills defaults in).
    let mut min_size = 2;
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let Some(decl) = schema_decl_type(property, is_embedded_resource(property)) else {
                continue;
            };
            if required.contains(&name.as_str()) && property.get("default").is_none() {
                min_size += name.len() as i64 + decl.min_serialized_size + 4;
            }
            if let Some(escaped) = escape(name) {
                fields.insert(escaped, decl);
            }
        }
    }
    DeclType::new(DeclKind::Object(fields), 0, min_size)
}

fn string_decl_type(schema: &Value) -> Arc<DeclType> {
    let max_length = int_field(schema, "maxLength");
    match str_field(schema, "format") {
        Some("byte") => DeclType::new(DeclKind::Bytes, max_length.unwrap_or(UNBOUNDED_STRING), 2),
        Some("duration") => DeclType::new(
            DeclKind::Duration,
            MAX_DATETIME_SIZE_JSON,
            MIN_DURATION_SIZE_JSON,
        ),
        Some("date") => DeclType::new(DeclKind::Timestamp, JSON_DATE_SIZE, JSON_DATE_SIZE),
        Some("date-time") => DeclType::new(
            DeclKind::Timestamp,
            MAX_DATETIME_SIZE_JSON,
            MIN_DATETIME_SIZE_JSON,
        ),
        _ => {
            let longest_enum = schema.get("enum").and_then(Value::as_array).map(|values| {
                values
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| v.len() as i64)
                    .max()
                    .unwrap_or(0)
            });
            let max = match (max_length, longest_enum) {
                // maxLength counts characters; a character takes up to 4 bytes.
                (Some(max), _) => max * 4,
                (None, Some(longest)) => longest,
                (None, None) => UNBOUNDED_STRING,
            };
            DeclType::new(DeclKind::String, max, 2)
        }
    }
}

/// At a resource root CEL always sees `apiVersion`, `kind` and, of `metadata`, only `name`
/// and `generateName` (bounded by the name's maximum length).
fn with_type_and_object_meta(schema: &Value) -> Value {
    let is_string = |v: Option<&Value>| v.and_then(|v| str_field(v, "type")) == Some("string");
    let properties = schema.get("properties");
    let metadata_properties = properties
        .and_then(|p| p.get("metadata"))
        .and_then(|m| m.get("properties"));
    let complete = is_string(properties.and_then(|p| p.get("kind")))
        && is_string(properties.and_then(|p| p.get("apiVersion")))
        && properties
            .and_then(|p| p.get("metadata"))
            .and_then(|m| str_field(m, "type"))
            == Some("object")
        && is_string(metadata_properties.and_then(|m| m.get("name")))
        && is_string(metadata_properties.and_then(|m| m.get("generateName")));
    if complete {
        return schema.clone();
    }
    let capped = |field: &str, cap: i64| {
        let declared = metadata_properties
            .and_then(|m| m.get(field))
            .and_then(|f| int_field(f, "maxLength"))
            .map_or(cap, |m| m.min(cap));
        serde_json::json!({"type": "string", "maxLength": declared})
    };
    let mut result = schema.clone();
    let mut props = properties
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    props.insert("kind".into(), serde_json::json!({"type": "string"}));
    props.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
    props.insert(
        "metadata".into(),
        serde_json::json!({"type": "object", "properties": {
            "name": capped("name", NAME_MAX_LENGTH),
            // A generated name adds at least one character.
            "generateName": capped("generateName", NAME_MAX_LENGTH - 1),
        }}),
    );
    result["properties"] = Value::Object(props);
    result
}

const CEL_RESERVED: [&str; 21] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as a CEL identifier, the API server's way (`__dash__` for `-`, ...), or
/// None when it cannot be one (CEL then cannot see the property).
pub fn escape(name: &str) -> Option<String> {
    let first = name.chars().next()?;
    if first.is_ascii_digit() {
        return None;
    }
    if CEL_RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
    {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unbounded_sizes_come_from_the_request_size() {
        let strings = schema_decl_type(
            &json!({"type": "array", "items": {"type": "string"}}),
            false,
        )
        .unwrap();
        // `""` plus a comma per item.
        assert_eq!(strings.max_elements, (3 * 1024 * 1024 - 2) / 3);
        let bounded = schema_decl_type(&json!({"type": "string", "maxLength": 10}), false).unwrap();
        assert_eq!(bounded.max_elements, 40);
        let enumerated = schema_decl_type(
            &json!({"type": "string", "enum": ["Bool", "Number"]}),
            false,
        )
        .unwrap();
        assert_eq!(enumerated.max_elements, 6);
    }

    #[test]
    fn required_fields_without_defaults_raise_the_minimum_size() {
        let object = schema_decl_type(
            &json!({"type": "object", "required": ["type", "x"],
                    "properties": {"type": {"type": "string"}, "x": {"type": "integer", "default": 1}}}),
            false,
        )
        .unwrap();
        // {} + "type": "" (4 + 2 + 4)
        assert_eq!(object.min_serialized_size, 12);
    }

    #[test]
    fn a_resource_root_sees_only_name_and_generate_name_of_metadata() {
        let root = schema_decl_type(
            &json!({"type": "object", "properties": {"metadata": {"type": "object"}}}),
            true,
        )
        .unwrap();
        let metadata = root.field("metadata").unwrap();
        assert_eq!(metadata.field("name").unwrap().max_elements, 253 * 4);
        assert_eq!(
            metadata.field("generateName").unwrap().max_elements,
            252 * 4
        );
        assert!(metadata.field("labels").is_none());
        assert!(root.field("kind").is_some());
    }

    #[test]
    fn names_escape_like_the_api_servers() {
        assert_eq!(escape("foo-bar").as_deref(), Some("foo__dash__bar"));
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("x.y/z").as_deref(), Some("x__dot__y__slash__z"));
        assert_eq!(escape("1abc"), None);
        assert_eq!(escape("a b"), None);
    }
}
