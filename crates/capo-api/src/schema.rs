//! Hand-written schema fragments for fields whose derived schema would not match the
//! Kubernetes conventions (`schemars(schema_with = ...)` targets).

use schemars::{Schema, SchemaGenerator, json_schema};

/// `status.conditions`: a list of `metav1.Condition` keyed by `type`, with the validation
/// the Kubernetes API applies to conditions.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "type": {
                    "type": "string",
                    "maxLength": 316,
                    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                },
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "message": {"type": "string", "maxLength": 32768}
            }
        }
    })
}

/// A TCP port number as CAPO declares `apiServer.port`: an integer without a format.
pub fn port_number(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 0, "maximum": 65535})
}

/// An integer as Go's `int` declares it: no format, no bounds.
pub fn plain_integer(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer"})
}

/// A map of resource quantities (`resource.Quantity` values), e.g. template capacity.
pub fn quantity_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true,
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
        }
    })
}

/// A timestamp (`metav1.Time`).
pub fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "date-time"})
}
