//! Label and field selectors, parsed and matched as the API server does.

use std::collections::BTreeSet;

use serde_json::Value;

use super::errors::ApiError;

#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelRequirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

/// A parsed `labelSelector`. Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// Splits on commas that are not inside a `(...)` value set.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(text: &str) -> Option<BTreeSet<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

fn parse_requirement(text: &str) -> Option<LabelRequirement> {
    let text = text.trim();
    if let Some(key) = text.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key).then(|| LabelRequirement::NotExists(key.to_owned()));
    }
    let mut words = text.splitn(2, char::is_whitespace);
    let first = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    for (operator, negated) in [("notin", true), ("in", false)] {
        if let Some(set) = rest.strip_prefix(operator)
            && valid_key(first)
        {
            let values = parse_set(set)?;
            let key = first.to_owned();
            return Some(if negated {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            });
        }
    }
    for (operator, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = text.split_once(operator) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) {
                return None;
            }
            let (key, value) = (key.to_owned(), value.to_owned());
            return Some(if negated {
                LabelRequirement::NotEquals(key, value)
            } else {
                LabelRequirement::Equals(key, value)
            });
        }
    }
    valid_key(text).then(|| LabelRequirement::Exists(text.to_owned()))
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),!h`.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        split_top_level(text)
            .into_iter()
            .map(|part| {
                parse_requirement(part).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "unable to parse requirement: {:?}: invalid label selector",
                        part.trim()
                    ))
                })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::NotExists(k) => label(k).is_none(),
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => label(k).is_some_and(|l| set.contains(l)),
            LabelRequirement::NotIn(k, set) => label(k).is_none_or(|l| !set.contains(l)),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldRequirement {
    /// The selectable field, e.g. `metadata.name`.
    field: String,
    value: String,
    negated: bool,
}

/// A parsed `fieldSelector`. Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<FieldRequirement>);

/// Splits on separators not escaped with a backslash, dropping the backslash of an escaped
/// separator (other escapes stay for [`unescape`]).
fn split_escaped(text: &str, separator: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    if next != separator {
                        current.push('\\');
                    }
                    current.push(next);
                }
            }
            c if c == separator => parts.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    parts.push(current);
    parts
}

fn unescape(text: &str) -> String {
    text.replace("\\=", "=")
        .replace("\\,", ",")
        .replace("\\\\", "\\")
}

impl FieldSelector {
    /// Parses `metadata.name=a,metadata.namespace!=b`, allowing only `selectable` fields
    /// (the server's per-kind list).
    pub fn parse(text: &str, selectable: &[String]) -> Result<Self, ApiError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut requirements = Vec::new();
        for part in split_escaped(text, ',') {
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            let field = field.trim().to_owned();
            if !selectable.contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            requirements.push(FieldRequirement {
                field,
                value: unescape(value.trim()),
                negated,
            });
        }
        Ok(Self(requirements))
    }

    /// Whether the object's fields satisfy every requirement. A missing field reads as "".
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = field_value(object, &r.field);
            (actual == r.value) != r.negated
        })
    }

    /// The name this selector pins with `metadata.name=`, if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.field == "metadata.name" && !r.negated)
            .map(|r| r.value.as_str())
    }
}

/// A field's value as a selector compares it: strings as they are, other scalars printed.
pub fn field_value(object: &Value, dotted: &str) -> String {
    let pointer: String = dotted.split('.').map(|s| format!("/{s}")).collect();
    match object.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selectors_match_like_the_server() {
        let obj = labelled(json!({"app": "web", "tier": "front"}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app", true),
            ("!app", false),
            ("missing!=x", true),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier in (back),app", false),
            ("app=web,tier=front", true),
            ("missing notin (a)", true),
        ];
        for (selector, expected) in cases {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&obj), expected, "{selector}");
        }
    }

    #[test]
    fn bad_label_selectors_are_bad_requests() {
        for bad in ["a b", "=x", "a in b", "a in (b"] {
            let err = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(err.code, 400, "{bad}");
        }
    }

    #[test]
    fn field_selectors_allow_only_selectable_fields() {
        let selectable = vec!["metadata.name".to_owned(), "metadata.namespace".to_owned()];
        let obj = json!({"metadata": {"name": "a", "namespace": "ns"}});
        let sel =
            FieldSelector::parse("metadata.name=a,metadata.namespace!=x", &selectable).unwrap();
        assert!(sel.matches(&obj));
        assert_eq!(sel.pinned_name(), Some("a"));
        assert!(
            !FieldSelector::parse("metadata.name==b", &selectable)
                .unwrap()
                .matches(&obj)
        );
        let err = FieldSelector::parse("spec.x=1", &selectable).unwrap_err();
        assert_eq!(err.code, 400);
        let escaped = FieldSelector::parse(r"metadata.name=a\,b", &selectable).unwrap();
        assert!(escaped.matches(&json!({"metadata": {"name": "a,b"}})));
    }
}
