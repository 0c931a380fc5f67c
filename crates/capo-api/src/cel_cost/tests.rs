//! The estimator against costs kube-apiserver 1.35 computes for the same rule and schema
//! (Kubernetes' own cost-estimation cases), and the CRD-level limits.

use serde_json::{Value, json};

use super::*;

fn with_bound(mut schema: Value, key: &str, bound: Option<i64>) -> Value {
    if let Some(b) = bound {
        schema[key] = json!(b);
    }
    schema
}

fn scalar(kind: &str) -> Value {
    match kind {
        "int-or-string" => json!({"x-kubernetes-int-or-string": true}),
        "duration" | "date" | "date-time" => json!({"type": "string", "format": kind}),
        other => json!({"type": other}),
    }
}

fn array_of(kind: &str) -> impl Fn(Option<i64>) -> Value {
    let item = scalar(kind);
    move |max| with_bound(json!({"type": "array", "items": item}), "maxItems", max)
}

fn map_of(item: Value) -> impl Fn(Option<i64>) -> Value {
    move |max| {
        with_bound(
            json!({"type": "object", "additionalProperties": item}),
            "maxProperties",
            max,
        )
    }
}

fn string_with(extra: Value) -> impl Fn(Option<i64>) -> Value {
    move |max| {
        let mut schema = json!({"type": "string"});
        for (k, v) in extra.as_object().into_iter().flatten() {
            schema[k] = v.clone();
        }
        with_bound(schema, "maxLength", max)
    }
}

fn required_and_optional() -> Value {
    json!({"type": "object", "required": ["required"],
           "properties": {"required": {"type": "string"}, "optional": {"type": "string"}}})
}

struct Case {
    rule: &'static str,
    schema: Box<dyn Fn(Option<i64>) -> Value>,
    /// Cost with no bounds declared (None: only known to exceed the 100M limit).
    unbounded: Option<u64>,
    bound: i64,
    bounded: u64,
}

fn case(
    schema: impl Fn(Option<i64>) -> Value + 'static,
    rule: &'static str,
    unbounded: Option<u64>,
    bound: i64,
    bounded: u64,
) -> Case {
    Case {
        rule,
        schema: Box::new(schema),
        unbounded,
        bound,
        bounded,
    }
}

#[allow(clippy::too_many_lines)]
fn kubernetes_cases() -> Vec<Case> {
    let array_of_arrays = |max: Option<i64>| {
        with_bound(
            json!({"type": "array", "items": {"type": "array", "items": {"type": "number"}}}),
            "maxItems",
            max,
        )
    };
    let objects = |max: Option<i64>| {
        with_bound(
            json!({"type": "array", "items": required_and_optional()}),
            "maxItems",
            max,
        )
    };
    let maps_in_array = |max: Option<i64>| {
        with_bound(
            json!({"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}}),
            "maxItems",
            max,
        )
    };
    let nested = |max: Option<i64>| {
        let mut values = json!({"type": "string"});
        let mut map = json!({"type": "object"});
        if let Some(m) = max {
            values["maxLength"] = json!(m);
            map["maxProperties"] = json!(m);
        }
        map["additionalProperties"] = values;
        map
    };
    let all_bounded = |max: Option<i64>| {
        let mut inner = required_and_optional();
        let mut item = json!({"type": "object"});
        let mut list = json!({"type": "array"});
        if let Some(m) = max {
            inner["maxProperties"] = json!(m);
            item["maxProperties"] = json!(m);
            list["maxItems"] = json!(m);
        }
        item["additionalProperties"] = inner;
        list["items"] = item;
        list
    };
    let one_bounded = |max: Option<i64>| {
        let item = with_bound(
            json!({"type": "object", "additionalProperties": required_and_optional()}),
            "maxProperties",
            max,
        );
        json!({"type": "array", "items": item})
    };
    let strings_list = |max: Option<i64>| {
        with_bound(
            json!({"type": "array", "items": with_bound(json!({"type": "string"}), "maxLength", max)}),
            "maxItems",
            max,
        )
    };
    let replace = |max: Option<i64>| {
        json!({"type": "object", "properties": {
            "str": with_bound(json!({"type": "string"}), "maxLength", max),
            "before": {"type": "string", "maxLength": 2},
            "after": {"type": "string", "maxLength": 4},
        }})
    };
    let split = |max: Option<i64>| {
        let s = with_bound(json!({"type": "string"}), "maxLength", max);
        json!({"type": "object", "properties": {"str": s, "separator": s}})
    };
    let int_or_string = |max: Option<i64>| {
        with_bound(
            json!({"x-kubernetes-int-or-string": true}),
            "maxLength",
            max,
        )
    };
    vec![
        case(
            array_of("number"),
            "self.all(x, true)",
            Some(4_718_591),
            10,
            32,
        ),
        case(
            array_of("string"),
            "self.all(x, true)",
            Some(3_145_727),
            20,
            62,
        ),
        case(
            array_of("boolean"),
            "self.all(x, true)",
            Some(1_887_437),
            5,
            17,
        ),
        case(
            array_of_arrays,
            "self.all(x, true)",
            Some(3_145_727),
            100,
            302,
        ),
        case(objects, "self.all(x, true)", Some(555_128), 50, 152),
        case(
            map_of(scalar("number")),
            "self.all(x, true)",
            Some(1_348_169),
            10,
            32,
        ),
        case(
            map_of(scalar("string")),
            "self.all(x, true)",
            Some(1_179_647),
            3,
            11,
        ),
        case(
            map_of(scalar("boolean")),
            "self.all(x, true)",
            Some(943_718),
            100,
            302,
        ),
        case(
            string_with(json!({})),
            "self.contains('test')",
            Some(314_574),
            10,
            5,
        ),
        case(
            string_with(json!({})),
            "self.startsWith('test')",
            Some(2),
            15,
            2,
        ),
        case(
            string_with(json!({})),
            "self.endsWith('test')",
            Some(2),
            30,
            2,
        ),
        case(
            string_with(json!({})),
            r#"size(self + "hello") > size("hello")"#,
            Some(314_578),
            4,
            7,
        ),
        case(array_of("number"), "self[1] == 0.0", Some(2), 5000, 2),
        case(
            array_of("string"),
            "self[1] == self[1]",
            Some(314_577),
            8,
            314_577,
        ),
        case(
            array_of("number"),
            "self.all(x, self.all(y, true))",
            None,
            10,
            352,
        ),
        case(
            array_of("number"),
            "self.all(x, self.all(y, self.all(z, true)))",
            None,
            10,
            3552,
        ),
        case(
            string_with(json!({})),
            r#"self.matches("x")"#,
            Some(314_574),
            50,
            22,
        ),
        case(
            string_with(json!({})),
            r#""".matches("(((((((((())))))))))[0-9]")"#,
            Some(7),
            10,
            7,
        ),
        case(
            string_with(json!({})),
            r#"self.matches("")"#,
            Some(1),
            100,
            1,
        ),
        case(
            nested,
            "self.all(x, x.contains(self[x]))",
            Some(2_752_507),
            10,
            72,
        ),
        case(array_of("number"), "self[3] == 0.0", Some(2), 0, 2),
        case(
            map_of(scalar("number")),
            r#"self["x"] == 0.0"#,
            Some(2),
            0,
            2,
        ),
        case(string_with(json!({})), r#"self == "x""#, Some(2), 0, 1),
        case(
            string_with(json!({"format": "byte"})),
            r#"self == b"x""#,
            Some(2),
            0,
            1,
        ),
        case(
            array_of("number"),
            "self.all(x, x == 0.0)",
            Some(6_291_454),
            3 * 1024 * 2048,
            25_165_826,
        ),
        case(
            all_bounded,
            r#"self.all(x, x["y"].required == "z")"#,
            Some(7_340_027),
            10,
            72,
        ),
        case(
            one_bounded,
            r#"self.all(x, x["y"].required == "z")"#,
            Some(7_340_027),
            10,
            7_340_027,
        ),
        case(
            array_of("int-or-string"),
            "self.all(x, true)",
            Some(4_718_591),
            10,
            32,
        ),
        case(array_of("int-or-string"), "self[0] == 5", Some(3), 10, 3),
        case(array_of("boolean"), "self[0] == false", Some(2), 25, 2),
        case(objects, "self[0] == null", Some(2), 422, 2),
        case(array_of_arrays, "self[0][0] == -1.0", Some(3), 51, 3),
        case(
            maps_in_array,
            "self.all(x, x.y == 25.2)",
            Some(6_291_452),
            12,
            74,
        ),
        case(maps_in_array, "self[0].x > 2.0", Some(4), 3000, 4),
        case(
            array_of("duration"),
            "self.all(x, true)",
            Some(2_359_295),
            5,
            17,
        ),
        case(
            array_of("duration"),
            "self[0].getHours() == 2",
            Some(4),
            525,
            4,
        ),
        case(array_of("date"), "self.all(x, true)", Some(725_936), 15, 47),
        case(
            array_of("date"),
            "self[2].getDayOfMonth() == 13",
            Some(4),
            42,
            4,
        ),
        case(
            array_of("date-time"),
            "self.all(x, true)",
            Some(428_963),
            25,
            77,
        ),
        case(
            array_of("date-time"),
            "self[2].getMinutes() == 45",
            Some(4),
            99,
            4,
        ),
        case(
            map_of(scalar("int-or-string")),
            "self.all(x, true)",
            Some(1_348_169),
            15,
            47,
        ),
        case(
            map_of(required_and_optional()),
            "self.all(x, true)",
            Some(428_963),
            20,
            62,
        ),
        case(
            map_of(json!({"type": "object", "additionalProperties": {"type": "number"}})),
            "self.all(x, true)",
            Some(1_179_647),
            10,
            32,
        ),
        case(
            map_of(json!({"type": "array", "items": {"type": "number"}})),
            "self.all(x, true)",
            Some(1_179_647),
            25,
            77,
        ),
        case(
            map_of(scalar("duration")),
            "self.all(x, true)",
            Some(1_048_577),
            5,
            17,
        ),
        case(
            map_of(scalar("date")),
            "self.all(x, true)",
            Some(524_288),
            10,
            32,
        ),
        case(
            map_of(scalar("date-time")),
            "self.all(x, true)",
            Some(349_526),
            25,
            77,
        ),
        case(
            string_with(json!({})),
            "self.find('[0-9]+') == ''",
            Some(629_147),
            10,
            11,
        ),
        case(
            strings_list,
            "self.join(' ') == 'aa bb'",
            Some(329_853_068_905),
            10,
            43,
        ),
        case(
            strings_list,
            "self.isSorted() == true",
            Some(329_854_432_052),
            10,
            52,
        ),
        case(
            replace,
            "self.str.replace(self.before, self.after) == 'does not matter'",
            Some(629_154),
            4,
            12,
        ),
        case(
            split,
            "self.str.split(self.separator) == []",
            Some(629_160),
            10,
            22,
        ),
        case(
            string_with(json!({})),
            "self.lowerAscii() == 'lower!'",
            Some(314_575),
            10,
            6,
        ),
        case(
            map_of(scalar("integer")),
            "oldSelf.size() == self.size()",
            Some(5),
            10,
            5,
        ),
        case(
            map_of(scalar("date-time")),
            r#"self["a"] == self["b"]"#,
            Some(8),
            7,
            8,
        ),
        case(
            map_of(scalar("duration")),
            r#"self["c"] == self["d"]"#,
            Some(8),
            42,
            8,
        ),
        case(
            string_with(json!({"enum": ["A", "B", "C", "LongValue"]})),
            "self.contains('A')",
            Some(2),
            1000,
            401,
        ),
        case(int_or_string, "isQuantity(self)", Some(314_574), 20, 9),
    ]
}

#[test]
fn per_call_costs_match_kubernetes() {
    let mut failures = Vec::new();
    for case in kubernetes_cases() {
        let unbounded = rule_cost(&(case.schema)(None), case.rule);
        let bounded = rule_cost(&(case.schema)(Some(case.bound)), case.rule);
        let unbounded_ok = match (case.unbounded, &unbounded) {
            (Some(expected), Ok(got)) => *got == expected,
            (None, Ok(got)) => *got >= SCHEMA_COST_LIMIT,
            (_, Err(_)) => false,
        };
        if !unbounded_ok || bounded.as_ref().ok() != Some(&case.bounded) {
            failures.push(format!(
                "{}: unbounded {:?} (want {:?}), bounded by {} {:?} (want {})",
                case.rule, unbounded, case.unbounded, case.bound, bounded, case.bounded
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn crd(versions: Vec<(&str, Value)>) -> Value {
    let versions: Vec<Value> = versions
        .into_iter()
        .map(|(name, schema)| {
            json!({"name": name, "served": true, "storage": name == "v1",
                   "schema": {"openAPIV3Schema": schema}})
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.test"},
           "spec": {"group": "example.test", "scope": "Namespaced",
                    "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions}})
}

/// A list of port-like objects, each with the rule capo-rs once shipped.
fn ports_schema(rule: &str, max_items: Option<i64>) -> Value {
    let port = json!({"type": "object",
        "properties": {"enablePortSecurity": {"type": "boolean"},
                       "securityGroups": {"type": "array", "items": {"type": "string"}}},
        "x-kubernetes-validations": [{"rule": rule}]});
    let ports = with_bound(
        json!({"type": "array", "items": port}),
        "maxItems",
        max_items,
    );
    json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"ports": ports}}}})
}

const PORT_RULE: &str = "!has(self.enablePortSecurity) || self.enablePortSecurity || !has(self.securityGroups) || size(self.securityGroups) == 0";

#[test]
fn a_rule_under_an_unbounded_list_runs_once_per_item_that_fits_a_request() {
    let report = check_crd(&crd(vec![("v1", ports_schema(PORT_RULE, None))]), None);
    let rule = &report.rules[0];
    // An empty object takes `{}` plus a comma: 3 MiB / 3 copies.
    assert_eq!((rule.per_call, rule.cardinality), (10, 1_048_576));
    assert_eq!(
        report.findings,
        vec![Finding {
            field: "spec.validation.openAPIV3Schema.properties[spec].properties[ports].items.x-kubernetes-validations[0].rule".into(),
            kind: FindingKind::Forbidden,
            message: "estimated rule cost exceeds budget by factor of 1.048576x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)".into(),
        }]
    );
    let bounded = check_crd(&crd(vec![("v1", ports_schema(PORT_RULE, Some(64)))]), None);
    assert!(bounded.findings.is_empty());
    assert_eq!(bounded.rules[0].cost, 640);
}

#[test]
fn the_same_logic_as_a_conditional_fits_without_a_bound() {
    let rule = "has(self.enablePortSecurity) && !self.enablePortSecurity && has(self.securityGroups) ? size(self.securityGroups) == 0 : true";
    let report = check_crd(&crd(vec![("v1", ports_schema(rule, None))]), None);
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert_eq!(report.rules[0].cost, 9 * 1_048_576);
}

#[test]
fn versions_with_different_schemas_are_checked_at_their_own_paths() {
    let cheap = ports_schema("true", None);
    let report = check_crd(
        &crd(vec![("v1", ports_schema(PORT_RULE, None)), ("v2", cheap)]),
        None,
    );
    assert_eq!(report.findings.len(), 1);
    assert!(
        report.findings[0]
            .field
            .starts_with("spec.versions[0].schema.openAPIV3Schema.properties[spec]")
    );
}

#[test]
fn an_unchanged_schema_keeps_its_rules_on_update() {
    let expensive = crd(vec![("v1", ports_schema(PORT_RULE, None))]);
    assert!(check_crd(&expensive, Some(&expensive)).findings.is_empty());
    let changed = crd(vec![("v1", ports_schema("true", None))]);
    assert_eq!(check_crd(&expensive, Some(&changed)).findings.len(), 1);
}

#[test]
fn the_schema_total_is_limited_and_its_largest_rules_named() {
    // Twelve rules of 9,437,184 each: every one fits, together they do not.
    let rule = "has(self.enablePortSecurity) && !self.enablePortSecurity && has(self.securityGroups) ? size(self.securityGroups) == 0 : true";
    let mut properties = serde_json::Map::new();
    for i in 0..12 {
        let ports = ports_schema(rule, None)["properties"]["spec"]["properties"]["ports"].clone();
        properties.insert(format!("ports{i:02}"), ports);
    }
    let schema = json!({"type": "object", "properties": properties});
    let report = check_crd(&crd(vec![("v1", schema)]), None);
    let named: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.message.starts_with("contributed to"))
        .collect();
    assert_eq!(named.len(), 4);
    let total = report.findings.last().unwrap();
    assert_eq!(total.field, "spec.validation.openAPIV3Schema");
    assert_eq!(
        total.message,
        over_budget_message(
            "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
            12 * 9 * 1_048_576,
            SCHEMA_COST_LIMIT
        )
    );
    assert!(total.message.contains("factor of 1.132462x"));
}

#[test]
fn bounds_above_multiply_and_a_map_without_max_properties_unbinds() {
    let item = json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 10}},
                      "x-kubernetes-validations": [{"rule": "self.a == 'x'"}]});
    let schema = json!({"type": "object", "properties": {
        "outer": {"type": "array", "maxItems": 5, "items": {"type": "array", "maxItems": 7, "items": item}},
        "byName": {"type": "object", "additionalProperties": item},
    }});
    let report = check_crd(&crd(vec![("v1", schema)]), None);
    let cardinality = |needle: &str| {
        report
            .rules
            .iter()
            .find(|r| r.field.contains(needle))
            .map(|r| r.cardinality)
    };
    assert_eq!(cardinality("properties[outer]"), Some(35));
    assert_eq!(cardinality("properties[byName]"), Some(3_145_728 / 3));
}

#[test]
fn factors_are_worded_like_kube_apiserver() {
    let m = |cost| over_budget_message("estimated rule cost", cost, RULE_COST_LIMIT);
    assert!(m(10_485_760).contains("factor of 1.048576x "));
    assert!(m(25_000_000).contains("factor of 2.5x "));
    assert!(m(2_000_000_000).contains("factor of more than 100x "));
}

#[test]
fn rules_that_do_not_compile_or_cannot_be_estimated_are_refused() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self.b == 'x'"}, {"rule": "self.a.frob()"}]});
    let report = check_crd(&crd(vec![("v1", schema)]), None);
    assert_eq!(report.findings.len(), 2);
    assert_eq!(report.findings[0].kind, FindingKind::Invalid);
    assert!(report.findings[0].message.contains("undefined field 'b'"));
    assert_eq!(report.findings[1].kind, FindingKind::Forbidden);
    assert!(report.findings[1].message.contains("frob"));
}

#[test]
fn the_resource_root_sees_metadata_name_only() {
    let schema = json!({"type": "object", "properties": {"metadata": {"type": "object"}},
        "x-kubernetes-validations": [{"rule": "self.metadata.name.size() < 64"}]});
    assert!(
        check_crd(&crd(vec![("v1", schema)]), None)
            .findings
            .is_empty()
    );
    let labels = json!({"type": "object", "properties": {"metadata": {"type": "object"}},
        "x-kubernetes-validations": [{"rule": "has(self.metadata.labels)"}]});
    assert_eq!(
        check_crd(&crd(vec![("v1", labels)]), None).findings.len(),
        1
    );
}
