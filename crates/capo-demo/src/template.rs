//! The cluster template: CAPO's default template's shape, its `${VARIABLES}` filled in as
//! clusterctl does (`${NAME:=default}` included), split into objects.

use std::collections::BTreeMap;

use serde_json::Value;

pub const CLUSTER_TEMPLATE: &str = include_str!("cluster-template.yaml");

/// `${NAME}` and `${NAME:=default}` replaced from `variables`; a variable with neither a
/// value nor a default is an error naming it. `${NAME%PATTERN}` and `${NAME%%PATTERN}` drop
/// the shortest and the longest end of the value that the glob `PATTERN` matches, as
/// clusterctl's envsubst does (`${KUBERNETES_VERSION%.*}` is `v1.33`). `$$` is a literal `$`,
/// as in clusterctl, so `$${NAME}` stays `${NAME}` for the machine to expand (Flatcar's
/// template does this).
pub fn substitute(text: &str, variables: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
            continue;
        }
        let Some(inner) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let end = inner
            .find('}')
            .ok_or_else(|| format!("unclosed variable at {:?}", &rest[dollar..]))?;
        let spec = &inner[..end];
        let (name, default, trim) = match (spec.split_once(":="), spec.split_once('%')) {
            (Some((name, default)), _) => (name, Some(default), None),
            (None, Some((name, pattern))) => (name, None, Some(pattern)),
            (None, None) => (spec, None, None),
        };
        let value = variables
            .get(name)
            .map(String::as_str)
            .or(default)
            .ok_or_else(|| format!("the template needs ${{{name}}}"))?;
        out.push_str(match trim {
            Some(pattern) => without_suffix(value, pattern),
            None => value,
        });
        rest = &inner[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `value` without the shortest end `pattern` matches (`%%pattern`: the longest); all of it
/// when none does.
fn without_suffix<'a>(value: &'a str, pattern: &str) -> &'a str {
    let (pattern, longest) = match pattern.strip_prefix('%') {
        Some(pattern) => (pattern, true),
        None => (pattern, false),
    };
    let matches =
        |i: &usize| value.is_char_boundary(*i) && glob(pattern.as_bytes(), &value.as_bytes()[*i..]);
    let start = match longest {
        true => (0..=value.len()).find(matches),
        false => (0..=value.len()).rev().find(matches),
    };
    start.map_or(value, |i| &value[..i])
}

/// Whether `text` matches the shell glob `pattern` (`*` and `?`; anything else literal).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.split_first(), text.split_first()) {
        (None, _) => text.is_empty(),
        (Some((b'*', rest)), _) => {
            glob(rest, text) || text.split_first().is_some_and(|(_, t)| glob(pattern, t))
        }
        (Some((b'?', rest)), Some((_, t))) => glob(rest, t),
        (Some((p, rest)), Some((c, t))) if p == c => glob(rest, t),
        _ => false,
    }
}

/// The objects of a multi-document YAML stream (empty documents skipped).
pub fn objects(text: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> = serde_saphyr::from_str_multiple(text).map_err(|e| e.to_string())?;
    Ok(documents.into_iter().filter(|v| !v.is_null()).collect())
}

/// The demo cluster's objects.
pub fn cluster_objects(
    cluster: &str,
    namespace: &str,
    clouds_yaml: &str,
) -> Result<Vec<Value>, String> {
    let variables = BTreeMap::from([
        ("CLUSTER_NAME", cluster.to_owned()),
        ("NAMESPACE", namespace.to_owned()),
        ("OPENSTACK_CLOUD", "sim".to_owned()),
        // A JSON string is a YAML scalar: the file's lines stay inside it.
        (
            "OPENSTACK_CLOUD_YAML",
            serde_json::to_string(clouds_yaml).map_err(|e| e.to_string())?,
        ),
        ("OPENSTACK_DNS_NAMESERVERS", "192.0.2.53".to_owned()),
        (
            "OPENSTACK_CONTROL_PLANE_MACHINE_FLAVOR",
            "m1.small".to_owned(),
        ),
        ("OPENSTACK_NODE_MACHINE_FLAVOR", "m1.small".to_owned()),
        (
            "OPENSTACK_IMAGE_NAME",
            "ubuntu-2404-kube-v1.33.4".to_owned(),
        ),
        ("OPENSTACK_SSH_KEY_NAME", "demo".to_owned()),
        ("CONTROL_PLANE_MACHINE_COUNT", "3".to_owned()),
        ("WORKER_MACHINE_COUNT", "2".to_owned()),
    ]);
    objects(&substitute(CLUSTER_TEMPLATE, &variables)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suffix_pattern_drops_the_shortest_or_longest_matching_end() {
        let vars = BTreeMap::from([("V", "v1.33.4".to_owned())]);
        let filled = substitute("${V%.*} ${V%%.*} ${V%.4} ${V%x*} $${V%.*}", &vars);
        assert_eq!(filled.as_deref(), Ok("v1.33 v1 v1.33 v1.33.4 ${V%.*}"));
        assert_eq!(substitute("${V%?}", &vars).as_deref(), Ok("v1.33."));
        assert!(substitute("${W%.*}", &vars).is_err());
    }

    #[test]
    fn variables_and_defaults_are_filled_in_and_a_missing_one_is_named() {
        let variables = BTreeMap::from([("A", "1".to_owned())]);
        assert_eq!(substitute("x${A}y${B:=2}z", &variables).unwrap(), "x1y2z");
        let missing = substitute("${C}", &variables).unwrap_err();
        assert!(missing.contains("${C}"), "{missing}");
        assert_eq!(
            substitute("name: $${HOST%.*} costs $5 and $$", &variables).unwrap(),
            "name: ${HOST%.*} costs $5 and $",
            "escaped and lone dollars are left for the machine"
        );
    }

    #[test]
    fn the_template_makes_the_objects_capo_serves() {
        let objects = cluster_objects("demo", "ns", "clouds:\n  sim: {}\n").unwrap();
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "Secret",
                "Cluster",
                "OpenStackCluster",
                "OpenStackMachineTemplate",
                "OpenStackMachineTemplate"
            ]
        );
        assert_eq!(
            objects[0]["stringData"]["clouds.yaml"],
            "clouds:\n  sim: {}\n"
        );
        // Every infrastructure object reads as our API types.
        let cluster: capo_api::OpenStackCluster =
            serde_json::from_value(objects[2].clone()).unwrap();
        assert!(cluster.spec.api_server.is_some());
        let template: capo_api::OpenStackMachineTemplate =
            serde_json::from_value(objects[3].clone()).unwrap();
        assert_eq!(
            template.spec.template.spec.ssh_key_name.as_deref(),
            Some("demo")
        );
    }
}
