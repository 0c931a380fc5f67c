//! A CEL type checker for rules on a schema node: it gives every expression the type the
//! cost estimator needs (is a select on an object or a map, is an operand a string or a
//! list, what a comprehension ranges over), and refuses what kube-apiserver's checker
//! refuses in the common cases: an undeclared variable, a field the schema does not
//! declare. Functions it does not know are reported as unsupported, never guessed.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, LiteralValue, SelectExpr};

use super::decl::{DeclKind, DeclType};

/// A CEL type, as far as cost estimation needs one.
#[derive(Clone, Debug)]
pub enum Ty {
    /// `bool`.
    Bool,
    /// `int`.
    Int,
    /// `uint`.
    Uint,
    /// `double`.
    Double,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// `null_type`.
    Null,
    /// `google.protobuf.Duration`.
    Duration,
    /// `google.protobuf.Timestamp`.
    Timestamp,
    /// Known only at run time (`x-kubernetes-int-or-string`, or an unknown element type).
    Dyn,
    /// A type value (`type(x)`, `string`).
    Type,
    /// A list.
    List(Box<Ty>),
    /// A map.
    Map(Box<Ty>, Box<Ty>),
    /// An object from the schema, whose fields can be selected.
    Object(Arc<DeclType>),
    /// A Kubernetes library type: `URL`, `IP`, `CIDR`, `Quantity`, `Semver`, `Format`.
    Opaque(&'static str),
    /// `optional_type(T)`.
    Optional(Box<Ty>),
}

impl Ty {
    /// The type CEL gives a schema node.
    pub fn from_decl(decl: &Arc<DeclType>) -> Self {
        match &decl.kind {
            DeclKind::Object(_) => Self::Object(decl.clone()),
            DeclKind::List(elem) => Self::List(Box::new(Self::from_decl(elem))),
            DeclKind::Map(elem) => {
                Self::Map(Box::new(Self::String), Box::new(Self::from_decl(elem)))
            }
            DeclKind::String => Self::String,
            DeclKind::Bytes => Self::Bytes,
            DeclKind::Int => Self::Int,
            DeclKind::Double => Self::Double,
            DeclKind::Bool => Self::Bool,
            DeclKind::Duration => Self::Duration,
            DeclKind::Timestamp => Self::Timestamp,
            DeclKind::Dyn => Self::Dyn,
        }
    }

    /// Whether a value of this type always has size 1 (CEL's notion of a scalar).
    pub fn is_scalar(&self) -> bool {
        match self {
            Self::Bool
            | Self::Double
            | Self::Duration
            | Self::Int
            | Self::Timestamp
            | Self::Uint => true,
            Self::Optional(inner) => inner.is_scalar(),
            _ => false,
        }
    }

    fn is_dyn(&self) -> bool {
        matches!(self, Self::Dyn)
    }

    fn name(&self) -> String {
        match self {
            Self::Bool => "bool".into(),
            Self::Int => "int".into(),
            Self::Uint => "uint".into(),
            Self::Double => "double".into(),
            Self::String => "string".into(),
            Self::Bytes => "bytes".into(),
            Self::Null => "null_type".into(),
            Self::Duration => "google.protobuf.Duration".into(),
            Self::Timestamp => "google.protobuf.Timestamp".into(),
            Self::Dyn => "dyn".into(),
            Self::Type => "type".into(),
            Self::List(elem) => format!("list({})", elem.name()),
            Self::Map(k, v) => format!("map({}, {})", k.name(), v.name()),
            Self::Object(_) => "object".into(),
            Self::Opaque(name) => (*name).into(),
            Self::Optional(inner) => format!("optional_type({})", inner.name()),
        }
    }
}

/// Why a rule could not be checked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// kube-apiserver would refuse the rule at compilation.
    #[error("{0}")]
    Compile(String),
    /// A construct this estimator does not model; refuse rather than guess.
    #[error("{0}")]
    Unsupported(String),
}

fn compile(message: impl Into<String>) -> CheckError {
    CheckError::Compile(message.into())
}

fn unsupported(message: impl Into<String>) -> CheckError {
    CheckError::Unsupported(message.into())
}

/// Types by expression id.
pub type Types = HashMap<u64, Ty>;

/// Types every expression of a rule whose `self` (and `oldSelf`) has type `self_ty`.
pub fn check(expr: &IdedExpr, self_ty: Ty, optional_old_self: bool) -> Result<Types, CheckError> {
    let old_self = if optional_old_self {
        Ty::Optional(Box::new(self_ty.clone()))
    } else {
        self_ty.clone()
    };
    let mut checker = Checker {
        types: HashMap::new(),
        scopes: vec![("self".into(), self_ty), ("oldSelf".into(), old_self)],
    };
    checker.check(expr)?;
    Ok(checker.types)
}

struct Checker {
    types: Types,
    /// Variables in scope, innermost last.
    scopes: Vec<(String, Ty)>,
}

const TYPE_NAMES: [&str; 10] = [
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
];

impl Checker {
    fn check(&mut self, e: &IdedExpr) -> Result<Ty, CheckError> {
        let ty = match &e.expr {
            Expr::Literal(literal) => literal_type(literal),
            Expr::Ident(name) => self.ident(name)?,
            Expr::Select(select) => self.select(select)?,
            Expr::Call(call) => {
                if call.func_name == "_?._" {
                    self.optional_select(&call.args)?
                } else {
                    let target = match &call.target {
                        Some(t) => Some(self.check(t)?),
                        None => None,
                    };
                    let args = call
                        .args
                        .iter()
                        .map(|a| self.check(a))
                        .collect::<Result<Vec<_>, _>>()?;
                    call_type(&call.func_name, target.as_ref(), &args)?
                }
            }
            Expr::List(list) => {
                let elems = list
                    .elements
                    .iter()
                    .map(|el| self.check(el))
                    .collect::<Result<Vec<_>, _>>()?;
                Ty::List(Box::new(common_type(&elems)))
            }
            Expr::Map(map) => {
                let mut keys = Vec::new();
                let mut values = Vec::new();
                for entry in &map.entries {
                    let cel::common::ast::EntryExpr::MapEntry(entry) = &entry.expr else {
                        return Err(unsupported("struct fields in a map literal"));
                    };
                    keys.push(self.check(&entry.key)?);
                    values.push(self.check(&entry.value)?);
                }
                Ty::Map(Box::new(common_type(&keys)), Box::new(common_type(&values)))
            }
            Expr::Comprehension(comprehension) => self.comprehension(comprehension)?,
            Expr::Struct(_) => return Err(unsupported("message construction")),
            Expr::Unspecified => return Err(compile("empty expression")),
        };
        self.types.insert(e.id, ty.clone());
        Ok(ty)
    }

    fn ident(&self, name: &str) -> Result<Ty, CheckError> {
        if let Some((_, ty)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return Ok(ty.clone());
        }
        if TYPE_NAMES.contains(&name) {
            return Ok(Ty::Type);
        }
        Err(compile(format!("undeclared reference to '{name}'")))
    }

    fn select(&mut self, select: &SelectExpr) -> Result<Ty, CheckError> {
        let operand = self.check(&select.operand)?;
        let field = select_field(&operand, &select.field)?;
        Ok(if select.test { Ty::Bool } else { field })
    }

    fn optional_select(&mut self, args: &[IdedExpr]) -> Result<Ty, CheckError> {
        let [operand, field] = args else {
            return Err(compile("malformed optional field selection"));
        };
        let operand = self.check(operand)?;
        let Expr::Literal(LiteralValue::String(name)) = &field.expr else {
            return Err(compile("malformed optional field selection"));
        };
        let inner = match operand {
            Ty::Optional(inner) => *inner,
            other => other,
        };
        Ok(Ty::Optional(Box::new(select_field(&inner, name.inner())?)))
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Result<Ty, CheckError> {
        let range = self.check(&c.iter_range)?;
        let (first, second) = match (&range, c.iter_var2.is_some()) {
            (Ty::List(elem), false) => ((**elem).clone(), None),
            (Ty::List(elem), true) => (Ty::Int, Some((**elem).clone())),
            (Ty::Map(key, _), false) => ((**key).clone(), None),
            (Ty::Map(key, value), true) => ((**key).clone(), Some((**value).clone())),
            (Ty::Dyn, _) => (Ty::Dyn, c.iter_var2.as_ref().map(|_| Ty::Dyn)),
            (other, _) => {
                return Err(compile(format!(
                    "expression of type '{}' cannot be range of a comprehension (must be list, map, or dynamic)",
                    other.name()
                )));
            }
        };
        let init = self.check(&c.accu_init)?;
        self.scopes.push((c.accu_var.clone(), init.clone()));
        self.scopes.push((c.iter_var.clone(), first));
        if let (Some(name), Some(ty)) = (&c.iter_var2, second) {
            self.scopes.push((name.clone(), ty));
        }
        let looped = self
            .check(&c.loop_cond)
            .and_then(|_| self.check(&c.loop_step));
        self.scopes
            .truncate(self.scopes.len() - 1 - usize::from(c.iter_var2.is_some()));
        let step = looped?;
        // An accumulator that starts as `[]` takes the type the step builds.
        if let (Ty::List(elem), Ty::List(_)) = (&init, &step)
            && elem.is_dyn()
            && let Some(accu) = self.scopes.last_mut()
        {
            accu.1 = step;
        }
        let result = self.check(&c.result);
        self.scopes.pop();
        result
    }
}

fn literal_type(literal: &LiteralValue) -> Ty {
    match literal {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::Null => Ty::Null,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) => Ty::Uint,
    }
}

/// The type of `operand.field`.
fn select_field(operand: &Ty, field: &str) -> Result<Ty, CheckError> {
    match operand {
        Ty::Object(decl) => decl
            .field(field)
            .map(Ty::from_decl)
            .ok_or_else(|| compile(format!("undefined field '{field}'"))),
        Ty::Map(_, value) => Ok((**value).clone()),
        Ty::Dyn => Ok(Ty::Dyn),
        other => Err(compile(format!(
            "type '{}' does not support field selection",
            other.name()
        ))),
    }
}

/// One type for a list of element types: theirs when they agree, `dyn` otherwise.
fn common_type(types: &[Ty]) -> Ty {
    match types.split_first() {
        Some((first, rest)) if rest.iter().all(|t| same_kind(t, first)) => first.clone(),
        _ => Ty::Dyn,
    }
}

fn same_kind(a: &Ty, b: &Ty) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The first operand that is not `dyn` (or null), else the first.
fn definite(args: &[Ty]) -> Ty {
    args.iter()
        .find(|t| !matches!(t, Ty::Dyn | Ty::Null))
        .or(args.first())
        .cloned()
        .unwrap_or(Ty::Dyn)
}

fn element_of(list: Option<&Ty>) -> Ty {
    match list {
        Some(Ty::List(elem)) => (**elem).clone(),
        _ => Ty::Dyn,
    }
}

const BOOL_FUNCTIONS: [&str; 37] = [
    "!_",
    "_&&_",
    "_||_",
    "@not_strictly_false",
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "@in",
    "matches",
    "startsWith",
    "endsWith",
    "contains",
    "isSorted",
    "isURL",
    "isIP",
    "isCIDR",
    "isQuantity",
    "isSemver",
    "isInteger",
    "isGreaterThan",
    "isLessThan",
    "containsIP",
    "containsCIDR",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "hasValue",
    "ip.isCanonical",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "bool",
];

const STRING_FUNCTIONS: [&str; 18] = [
    "lowerAscii",
    "upperAscii",
    "trim",
    "substring",
    "replace",
    "charAt",
    "format",
    "join",
    "strings.quote",
    "reverse",
    "find",
    "string",
    "getScheme",
    "getHostname",
    "getHost",
    "getPort",
    "getEscapedPath",
    "jsonpatch.escapeKey",
];

const INT_FUNCTIONS: [&str; 20] = [
    "size",
    "int",
    "indexOf",
    "lastIndexOf",
    "prefixLength",
    "family",
    "sign",
    "compareTo",
    "asInteger",
    "major",
    "minor",
    "patch",
    "getFullYear",
    "getMonth",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getHours",
    "getMinutes",
];

/// The result type of a call, or why it cannot be typed.
fn call_type(name: &str, target: Option<&Ty>, args: &[Ty]) -> Result<Ty, CheckError> {
    if BOOL_FUNCTIONS.contains(&name) {
        return Ok(Ty::Bool);
    }
    if STRING_FUNCTIONS.contains(&name) {
        return Ok(Ty::String);
    }
    if INT_FUNCTIONS.contains(&name) || matches!(name, "getSeconds" | "getMilliseconds") {
        // `getSeconds` of a duration is an int as well.
        return Ok(Ty::Int);
    }
    Ok(match name {
        "_?_:_" => definite(&args[1..]),
        "_+_" => match (args.first(), args.get(1)) {
            (Some(Ty::List(a)), Some(Ty::List(b))) => {
                Ty::List(Box::new(definite(&[(**a).clone(), (**b).clone()])))
            }
            _ => definite(args),
        },
        "_-_" => match (args.first(), args.get(1)) {
            (Some(Ty::Timestamp), Some(Ty::Timestamp)) => Ty::Duration,
            _ => definite(args),
        },
        "_*_" | "_/_" | "_%_" | "-_" => definite(args),
        "_[_]" => match args.first() {
            Some(Ty::List(elem)) => (**elem).clone(),
            Some(Ty::Map(_, value)) => (**value).clone(),
            Some(Ty::Dyn) => Ty::Dyn,
            Some(other) => {
                return Err(compile(format!(
                    "found no matching overload for '_[_]' applied to '({}, ...)'",
                    other.name()
                )));
            }
            None => Ty::Dyn,
        },
        "uint" => Ty::Uint,
        "double" | "asApproximateFloat" => Ty::Double,
        "bytes" => Ty::Bytes,
        "duration" => Ty::Duration,
        "timestamp" => Ty::Timestamp,
        "dyn" => Ty::Dyn,
        "type" => Ty::Type,
        "split" | "findAll" => Ty::List(Box::new(Ty::String)),
        "getQuery" => Ty::Map(
            Box::new(Ty::String),
            Box::new(Ty::List(Box::new(Ty::String))),
        ),
        "sum" | "min" | "max" => element_of(target),
        "url" => Ty::Opaque("URL"),
        "ip" => Ty::Opaque("IP"),
        "cidr" | "masked" => Ty::Opaque("CIDR"),
        "quantity" | "add" | "sub" => Ty::Opaque("Quantity"),
        "semver" => Ty::Opaque("Semver"),
        "orValue" | "value" => match target {
            Some(Ty::Optional(inner)) => (**inner).clone(),
            _ => Ty::Dyn,
        },
        "optional.of" | "optional.ofNonZeroValue" => {
            Ty::Optional(Box::new(args.first().cloned().unwrap_or(Ty::Dyn)))
        }
        "optional.none" => Ty::Optional(Box::new(Ty::Dyn)),
        other => {
            return Err(unsupported(format!(
                "the function '{other}' is not modelled by the simulator's cost estimator"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cel_cost::decl::schema_decl_type;

    fn check_rule(schema: serde_json::Value, rule: &str) -> Result<Types, CheckError> {
        let decl = schema_decl_type(&schema, false).unwrap();
        let expr = cel::parser::Parser::new().parse(rule).unwrap();
        check(&expr, Ty::from_decl(&decl), false)
    }

    #[test]
    fn a_field_the_schema_does_not_declare_is_a_compile_error() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert!(check_rule(schema.clone(), "self.a == 'x'").is_ok());
        assert_eq!(
            check_rule(schema.clone(), "has(self.b)").unwrap_err(),
            CheckError::Compile("undefined field 'b'".into())
        );
        assert_eq!(
            check_rule(schema, "other == 1").unwrap_err(),
            CheckError::Compile("undeclared reference to 'other'".into())
        );
    }

    #[test]
    fn comprehensions_type_their_variables() {
        let schema = json!({"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}});
        let types =
            check_rule(schema, "self.all(x, self.exists_one(y, x.name == y.name))").unwrap();
        assert!(types.values().any(|t| matches!(t, Ty::Object(_))));
    }

    #[test]
    fn unknown_functions_are_unsupported_not_guessed() {
        let schema = json!({"type": "string"});
        assert!(matches!(
            check_rule(schema, "self.frobnicate()").unwrap_err(),
            CheckError::Unsupported(_)
        ));
    }
}
