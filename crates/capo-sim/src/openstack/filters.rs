//! List filters as OpenStack services read them from the query string.

use serde_json::Value;

/// Parameters that shape a list rather than filter it.
const NOT_FILTERS: &[&str] = &[
    "limit",
    "marker",
    "page_reverse",
    "sort",
    "sort_key",
    "sort_dir",
    "fields",
    "cascade",
];

/// Whether `item` passes every filter. A field named several times matches any of the values;
/// `tags` (all of), `tags-any`, `not-tags`, `not-tags-any` take comma-separated lists. A filter
/// on a field the object does not have is ignored, as Neutron and Octavia ignore it.
pub fn matches(item: &Value, query: &[(String, String)]) -> bool {
    let tags: Vec<&str> = item["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut keys: Vec<&str> = query.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter().all(|key| {
        let values = query
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str());
        let listed = |v: &str| v.split(',').map(str::to_owned).collect::<Vec<_>>();
        let has = |t: &String| tags.contains(&t.as_str());
        match key {
            k if NOT_FILTERS.contains(&k) => true,
            "tags" => values.into_iter().all(|v| listed(v).iter().all(has)),
            "tags-any" => values.into_iter().all(|v| listed(v).iter().any(has)),
            "not-tags" => values.into_iter().all(|v| !listed(v).iter().all(has)),
            "not-tags-any" => values.into_iter().all(|v| !listed(v).iter().any(has)),
            field => match item.get(field) {
                None => true,
                Some(actual) => values.into_iter().any(|v| scalar_equals(actual, v)),
            },
        }
    })
}

fn scalar_equals(actual: &Value, wanted: &str) -> bool {
    match actual {
        Value::String(s) => s == wanted,
        Value::Number(n) => n.to_string() == wanted,
        Value::Bool(b) => b.to_string() == wanted.to_ascii_lowercase(),
        Value::Null => wanted.is_empty() || wanted == "null",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn fields_tags_and_repeats() {
        let item = json!({"id": "a", "name": "n", "admin_state_up": true, "tags": ["x", "y"]});
        assert!(matches(&item, &q(&[("name", "n"), ("tags", "x,y")])));
        assert!(matches(&item, &q(&[("id", "b"), ("id", "a")])));
        assert!(!matches(&item, &q(&[("name", "m")])));
        assert!(matches(&item, &q(&[("admin_state_up", "True")])));
        assert!(!matches(&item, &q(&[("tags", "x,z")])));
        assert!(matches(&item, &q(&[("tags-any", "z,y")])));
        assert!(!matches(&item, &q(&[("not-tags-any", "y")])));
        assert!(matches(&item, &q(&[("not-tags", "x,z"), ("limit", "1")])));
    }
}
