//! The cost check kube-apiserver runs on a CRD's CEL rules before it accepts the CRD.
//!
//! Every `x-kubernetes-validations` rule gets a worst-case cost per evaluation (see
//! `estimate`), multiplied by the most times it can run in one object: the product of
//! the `maxItems`/`maxProperties` of the lists and maps above it, or, when one of them is
//! unbounded, as many copies of the rule's node as fit in a 3 MiB request. A rule over
//! 10,000,000 is refused, and so is a schema whose rules sum to over 100,000,000, with the
//! field paths and messages the real server gives.
//!
//! Used by the simulated API server (it refuses such CRDs as a real one does) and by
//! `capo-rs crds` (it refuses to generate them).

mod check;
mod decl;
mod estimate;

use serde_json::Value;

pub use check::CheckError;
use decl::{MAX_REQUEST_SIZE_BYTES, is_embedded_resource, schema_decl_type};

/// The most a single rule may cost (`StaticEstimatedCostLimit`).
pub const RULE_COST_LIMIT: u64 = 10_000_000;
/// The most all rules of one schema may cost together (`StaticEstimatedCRDCostLimit`).
pub const SCHEMA_COST_LIMIT: u64 = 100_000_000;
/// Rules below this share of the schema limit are not named when the total is exceeded.
const NAMED_CONTRIBUTOR_MIN: u64 = SCHEMA_COST_LIMIT / 100;
const NAMED_CONTRIBUTORS: usize = 4;

/// One rule's estimated cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleCost {
    /// Where the rule is, as the API server names it
    /// (`spec.validation.openAPIV3Schema.properties[spec]...x-kubernetes-validations[0].rule`).
    pub field: String,
    /// The rule.
    pub rule: String,
    /// Worst-case cost of one evaluation.
    pub per_call: u64,
    /// The most evaluations in one object.
    pub cardinality: u64,
    /// `per_call × cardinality`, the figure compared with [`RULE_COST_LIMIT`].
    pub cost: u64,
}

/// How a finding is reported (`field.ErrorType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FindingKind {
    /// `Forbidden`: over a cost limit.
    Forbidden,
    /// `Invalid`: the rule does not compile.
    Invalid,
}

/// A reason the API server refuses the CRD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Field path.
    pub field: String,
    /// Forbidden or Invalid.
    pub kind: FindingKind,
    /// The message after the type (`Forbidden: ` is not included).
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            FindingKind::Forbidden => "Forbidden",
            FindingKind::Invalid => "Invalid value",
        };
        write!(f, "{}: {kind}: {}", self.field, self.message)
    }
}

/// What the cost check found in a CRD.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Every rule, with its cost.
    pub rules: Vec<RuleCost>,
    /// Reasons to refuse the CRD; empty when it passes.
    pub findings: Vec<Finding>,
}

/// Checks a CRD (as JSON) the way kube-apiserver does on create, or on update when `old`
/// is the stored CRD: then a version whose schema did not change is exempt from the
/// per-rule limit (so a server upgrade never locks an existing CRD), not from the total.
pub fn check_crd(crd: &Value, old: Option<&Value>) -> Report {
    let mut report = Report::default();
    for (prefix, version, schema) in schemas(crd) {
        let unchanged = old.is_some_and(|old| {
            version_schema(old, &version).is_some_and(|old_schema| old_schema == schema)
        });
        let mut walk = Walk {
            suppress_rule_limit: unchanged,
            total: 0,
            most_expensive: Vec::new(),
            report: &mut report,
        };
        let root = format!("{prefix}.openAPIV3Schema");
        walk.node(schema, &root, Some(1), true);
        walk.check_total(&root);
    }
    report
}

/// The schemas the server validates, with the path it names them by: one at
/// `spec.validation` when every version has the same schema (the server then stores it
/// once), else one per version at `spec.versions[i].schema`.
fn schemas(crd: &Value) -> Vec<(String, String, &Value)> {
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let name_of = |v: &Value| {
        v.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let first = versions.first().and_then(schema_of);
    if let Some(first_schema) = first
        && versions.iter().all(|v| schema_of(v) == Some(first_schema))
    {
        return vec![(
            "spec.validation".into(),
            name_of(&versions[0]),
            first_schema,
        )];
    }
    versions
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            schema_of(v).map(|s| (format!("spec.versions[{i}].schema"), name_of(v), s))
        })
        .collect()
}

fn schema_of(version: &Value) -> Option<&Value> {
    version.pointer("/schema/openAPIV3Schema")
}

fn version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

/// The message kube-apiserver gives for a cost over a limit.
pub fn over_budget_message(what: &str, cost: u64, limit: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_owned()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

/// The cost of one evaluation of `rule` on a node with `schema`.
pub fn rule_cost(schema: &Value, rule: &str) -> Result<u64, CheckError> {
    let decl = schema_decl_type(schema, is_embedded_resource(schema))
        .ok_or_else(|| CheckError::Compile("the schema node is not visible to CEL".into()))?;
    estimate_expression(&decl, rule, false)
}

fn estimate_expression(
    decl: &std::sync::Arc<decl::DeclType>,
    expression: &str,
    optional_old_self: bool,
) -> Result<u64, CheckError> {
    let parsed = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(expression)
        .map_err(|e| CheckError::Compile(e.to_string()))?;
    let types = check::check(&parsed, check::Ty::from_decl(decl), optional_old_self)?;
    Ok(estimate::cost(&parsed, &types, decl).max)
}

struct Walk<'a> {
    suppress_rule_limit: bool,
    total: u64,
    most_expensive: Vec<(String, u64)>,
    report: &'a mut Report,
}

/// How many times each child of `schema` can occur per occurrence of `schema`; None when
/// a list or map has no bound.
fn child_multiplier(schema: &Value) -> Option<u64> {
    let bound = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_i64)
            .map(|v| u64::try_from(v).unwrap_or(0))
    };
    match schema.get("type").and_then(Value::as_str) {
        Some("object") if schema.get("additionalProperties").is_some() => bound("maxProperties"),
        Some("array") => bound("maxItems"),
        _ => Some(1),
    }
}

impl Walk<'_> {
    fn node(&mut self, schema: &Value, path: &str, cardinality: Option<u64>, is_root: bool) {
        let child_cardinality =
            cardinality.and_then(|c| child_multiplier(schema).map(|m| c.saturating_mul(m)));
        if let Some(values) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            self.node(
                values,
                &format!("{path}.additionalProperties"),
                child_cardinality,
                false,
            );
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            let mut names: Vec<&String> = properties.keys().collect();
            names.sort();
            for name in names {
                self.node(
                    &properties[name],
                    &format!("{path}.properties[{name}]"),
                    child_cardinality,
                    false,
                );
            }
        }
        if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
            self.node(items, &format!("{path}.items"), child_cardinality, false);
        }
        self.rules(schema, path, cardinality, is_root);
    }

    fn rules(&mut self, schema: &Value, path: &str, cardinality: Option<u64>, is_root: bool) {
        let Some(rules) = schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .filter(|r| !r.is_empty())
        else {
            return;
        };
        let Some(decl) = schema_decl_type(schema, is_root || is_embedded_resource(schema)) else {
            self.report.findings.push(Finding {
                field: format!("{path}.x-kubernetes-validations"),
                kind: FindingKind::Invalid,
                message: "internal error: failed to retrieve type information for x-kubernetes-validations".into(),
            });
            return;
        };
        // Unbounded: as many copies of this node as fit in one request.
        let cardinality = cardinality.unwrap_or_else(|| {
            let per_copy = u64::try_from(decl.min_serialized_size + 1).unwrap_or(1);
            u64::try_from(MAX_REQUEST_SIZE_BYTES).unwrap_or(0) / per_copy.max(1)
        });
        for (i, rule) in rules.iter().enumerate() {
            let at = format!("{path}.x-kubernetes-validations[{i}]");
            let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
            let optional_old_self = rule.get("optionalOldSelf") == Some(&Value::Bool(true));
            if !text.trim().is_empty() {
                self.rule(&decl, text, optional_old_self, &at, cardinality);
            }
            if let Some(message) = rule
                .get("messageExpression")
                .and_then(Value::as_str)
                .filter(|m| !m.trim().is_empty())
            {
                self.message_expression(&decl, message, &at);
            }
        }
    }

    fn rule(
        &mut self,
        decl: &std::sync::Arc<decl::DeclType>,
        text: &str,
        optional_old_self: bool,
        at: &str,
        cardinality: u64,
    ) {
        let field = format!("{at}.rule");
        let per_call = match estimate_expression(decl, text, optional_old_self) {
            Ok(cost) => cost,
            Err(error) => {
                self.refuse(&field, text, &error);
                return;
            }
        };
        let cost = if per_call == 0 {
            0
        } else {
            per_call.saturating_mul(cardinality)
        };
        if !self.suppress_rule_limit && cost > RULE_COST_LIMIT {
            self.report.findings.push(Finding {
                field: field.clone(),
                kind: FindingKind::Forbidden,
                message: over_budget_message("estimated rule cost", cost, RULE_COST_LIMIT),
            });
        }
        self.observe(&field, cost);
        self.report.rules.push(RuleCost {
            field,
            rule: text.to_owned(),
            per_call,
            cardinality,
            cost,
        });
    }

    fn message_expression(&mut self, decl: &std::sync::Arc<decl::DeclType>, text: &str, at: &str) {
        let field = format!("{at}.messageExpression");
        match estimate_expression(decl, text, false) {
            Ok(cost) => {
                if !self.suppress_rule_limit && cost > RULE_COST_LIMIT {
                    self.report.findings.push(Finding {
                        field: field.clone(),
                        kind: FindingKind::Forbidden,
                        message: over_budget_message(
                            "estimated messageExpression cost",
                            cost,
                            RULE_COST_LIMIT,
                        ),
                    });
                }
                self.observe(&field, cost);
            }
            Err(error) => self.refuse(&field, text, &error),
        }
    }

    fn refuse(&mut self, field: &str, text: &str, error: &CheckError) {
        let (kind, message) = match error {
            CheckError::Compile(why) => (
                FindingKind::Invalid,
                format!("{text:?}: compilation failed: ERROR: <input>: {why}"),
            ),
            CheckError::Unsupported(why) => (
                FindingKind::Forbidden,
                format!(
                    "the simulated API server cannot estimate the cost of this rule ({why}); it refuses it rather than accept what kube-apiserver might refuse"
                ),
            ),
        };
        self.report.findings.push(Finding {
            field: field.to_owned(),
            kind,
            message,
        });
    }

    fn observe(&mut self, field: &str, cost: u64) {
        self.total = self.total.saturating_add(cost);
        if cost < NAMED_CONTRIBUTOR_MIN {
            return;
        }
        self.most_expensive.push((field.to_owned(), cost));
        self.most_expensive
            .sort_by_key(|(_, cost)| std::cmp::Reverse(*cost));
        self.most_expensive.truncate(NAMED_CONTRIBUTORS);
    }

    fn check_total(&mut self, root: &str) {
        if self.total <= SCHEMA_COST_LIMIT {
            return;
        }
        for (field, _) in &self.most_expensive {
            self.report.findings.push(Finding {
                field: field.clone(),
                kind: FindingKind::Forbidden,
                message: "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema".into(),
            });
        }
        self.report.findings.push(Finding {
            field: root.to_owned(),
            kind: FindingKind::Forbidden,
            message: over_budget_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                self.total,
                SCHEMA_COST_LIMIT,
            ),
        });
    }
}

#[cfg(test)]
mod tests;
