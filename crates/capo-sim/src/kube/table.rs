//! Server-side printing: the `Table` form `kubectl get` asks for (`Accept: ...;as=Table`),
//! with a CRD's additional printer columns evaluated from their JSONPath.

use serde_json::{Value, json};

use super::resources::{PrinterColumn, ResourceDef};

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    /// Nothing.
    None,
    /// The object's metadata, as `PartialObjectMetadata` (the server's default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the query parameter.
    pub fn parse(text: Option<&str>) -> Self {
        match text {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

fn column(name: &str, type_: &str, json_path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.to_owned(),
        type_: type_.to_owned(),
        format: String::new(),
        description: String::new(),
        priority: 0,
        json_path: json_path.to_owned(),
    }
}

/// Columns after Name: the CRD's own, or what `kubectl get` shows for built-ins.
fn columns(def: &ResourceDef, version: &str) -> Vec<PrinterColumn> {
    if let Some(v) = def.version(version)
        && !v.printer_columns.is_empty()
    {
        return v.printer_columns.clone();
    }
    let age = column("Age", "date", ".metadata.creationTimestamp");
    match (def.key.group.as_str(), def.key.plural.as_str()) {
        ("", "namespaces") => vec![column("Status", "string", ".status.phase"), age],
        ("", "secrets") => vec![column("Type", "string", ".type"), age],
        ("coordination.k8s.io", "leases") => {
            vec![column("Holder", "string", ".spec.holderIdentity"), age]
        }
        ("", "events") => vec![
            column("Type", "string", ".type"),
            column("Reason", "string", ".reason"),
            column("Message", "string", ".message"),
            age,
        ],
        _ => vec![age],
    }
}

/// The `columnDefinitions` of a table.
pub fn column_definitions(def: &ResourceDef, version: &str) -> Vec<Value> {
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace.",
    })];
    definitions.extend(columns(def, version).iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": c.format,
               "description": c.description, "priority": c.priority})
    }));
    definitions
}

/// One row for an object (already presented in the requested version).
pub fn row(def: &ResourceDef, version: &str, object: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![
        object
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or_default(),
    ];
    for c in columns(def, version) {
        let found = evaluate(&c.json_path, object).into_iter().next().cloned();
        cells.push(match (found, c.type_.as_str()) {
            (Some(Value::String(t)), "date") => Value::String(age(&t)),
            (Some(v), _) => v,
            (None, _) => Value::Null,
        });
    }
    let mut row = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                   "metadata": object.get("metadata").cloned().unwrap_or_default()});
        }
        IncludeObject::Object => row["object"] = object.clone(),
    }
    row
}

/// A whole table.
pub fn table(
    def: &ResourceDef,
    version: &str,
    objects: &[Value],
    list_metadata: Value,
    include: IncludeObject,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| row(def, version, o, include))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_metadata,
           "columnDefinitions": column_definitions(def, version), "rows": rows})
}

/// Time since an RFC 3339 timestamp, as Kubernetes prints ages (`5m3s`, `3h`, `12d`).
fn age(timestamp: &str) -> String {
    match timestamp.parse::<k8s_openapi::jiff::Timestamp>() {
        Ok(t) => {
            let seconds = k8s_openapi::jiff::Timestamp::now().as_second() - t.as_second();
            human_duration(seconds)
        }
        Err(_) => "<invalid>".into(),
    }
}

/// Kubernetes' `duration.HumanDuration`.
pub fn human_duration(seconds: i64) -> String {
    let with = |major: i64, unit: &str, minor: i64, minor_unit: &str| {
        if minor == 0 {
            format!("{major}{unit}")
        } else {
            format!("{major}{unit}{minor}{minor_unit}")
        }
    };
    let (minutes, hours) = (seconds / 60, seconds / 3600);
    let days = hours / 24;
    match seconds {
        s if s < -1 => "<invalid>".into(),
        s if s < 0 => "0s".into(),
        s if s < 120 => format!("{s}s"),
        _ if minutes < 10 => with(minutes, "m", seconds % 60, "s"),
        _ if minutes < 180 => format!("{minutes}m"),
        _ if hours < 8 => with(hours, "h", minutes % 60, "m"),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 24 * 8 => with(days, "d", hours % 24, "h"),
        _ if days < 365 * 2 => format!("{days}d"),
        _ if days < 365 * 8 => with(days / 365, "y", days % 365, "d"),
        _ => format!("{}y", days / 365),
    }
}

#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
    All,
    Filter {
        path: Vec<String>,
        value: Value,
        negated: bool,
    },
}

/// Parses the Kubernetes JSONPath subset printer columns use: `.a.b`, `['k\.y']`, `[0]`,
/// `[*]` and `[?(@.x=="y")]`. `None` when the expression is outside that subset.
fn parse(path: &str) -> Option<Vec<Step>> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut steps = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end > 0 {
                steps.push(Step::Key(after[..end].to_owned()));
            }
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = closing_bracket(after)?;
            steps.push(bracket(&after[..end])?);
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(steps)
}

/// Index of the `]` that closes a bracket, skipping quoted text.
fn closing_bracket(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (_, _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, ']') => return Some(i),
            _ => {}
        }
    }
    None
}

fn unquote(text: &str) -> Option<String> {
    let text = text.trim();
    let inner = text
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))?;
    Some(inner.replace("\\.", "."))
}

fn bracket(inner: &str) -> Option<Step> {
    let inner = inner.trim();
    if inner == "*" {
        return Some(Step::All);
    }
    if let Ok(i) = inner.parse() {
        return Some(Step::Index(i));
    }
    if let Some(key) = unquote(inner) {
        return Some(Step::Key(key));
    }
    let condition = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (lhs, rhs, negated) = match condition.split_once("!=") {
        Some((l, r)) => (l, r, true),
        None => {
            let (l, r) = condition.split_once("==")?;
            (l, r, false)
        }
    };
    let path = lhs
        .trim()
        .strip_prefix("@.")?
        .split('.')
        .map(str::to_owned)
        .collect();
    let value = match unquote(rhs) {
        Some(s) => Value::String(s),
        None => serde_json::from_str(rhs.trim()).ok()?,
    };
    Some(Step::Filter {
        path,
        value,
        negated,
    })
}

/// Every value a printer-column path selects (none for paths outside the subset).
pub fn evaluate<'a>(path: &str, object: &'a Value) -> Vec<&'a Value> {
    let Some(steps) = parse(path) else {
        return Vec::new();
    };
    let mut current = vec![object];
    for step in &steps {
        current = current
            .into_iter()
            .flat_map(|v| -> Vec<&'a Value> {
                match step {
                    Step::Key(k) => v.get(k.as_str()).into_iter().collect(),
                    Step::Index(i) => v.get(*i).into_iter().collect(),
                    Step::All => match v {
                        Value::Array(a) => a.iter().collect(),
                        Value::Object(m) => m.values().collect(),
                        _ => Vec::new(),
                    },
                    Step::Filter {
                        path,
                        value,
                        negated,
                    } => v
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|item| {
                            let found = path.iter().try_fold(*item, |at, k| at.get(k.as_str()));
                            (found == Some(value)) != *negated
                        })
                        .collect(),
                }
            })
            .collect();
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_evaluate() {
        let object = json!({
            "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "Other", "status": "False"}]},
            "spec": {"ports": [1, 2]},
        });
        let first = |p: &str| evaluate(p, &object).first().copied().cloned();
        assert_eq!(
            first(r".metadata.labels['cluster\.x-k8s\.io/cluster-name']"),
            Some(json!("c1"))
        );
        assert_eq!(
            first(r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(json!("True"))
        );
        assert_eq!(
            first(r#".status.conditions[?(@.type!="Ready")].type"#),
            Some(json!("Other"))
        );
        assert_eq!(first(".spec.ports[1]"), Some(json!(2)));
        assert_eq!(evaluate(".spec.ports[*]", &object).len(), 2);
        assert_eq!(first(".status.missing"), None);
        assert_eq!(first("not a path"), None);
    }

    #[test]
    fn ages_print_like_kubectl() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (183, "3m3s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 3600, "3d1h"),
            (40 * 86400, "40d"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(human_duration(seconds), expected);
        }
    }
}
