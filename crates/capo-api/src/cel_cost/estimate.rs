//! The worst-case cost of one evaluation of a CEL rule, computed the way kube-apiserver
//! computes it when it validates a CRD: cel-go's static cost estimator (as of cel-go
//! v0.26, the version in Kubernetes 1.35) with Kubernetes' size estimator (sizes from the
//! schema's bounds) and its library cost rules, and presence tests (`has()`) free.
//!
//! The walk follows cel-go's order on purpose: sizes and field paths are recorded as
//! expressions are costed, and later lookups depend on what was recorded before.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr,
    SelectExpr,
};

use super::check::{Ty, Types};
use super::decl::{DeclKind, DeclType, MAP_KEY};

const SELECT_AND_IDENT_COST: u64 = 1;
const LIST_CREATE_BASE_COST: u64 = 10;
const MAP_CREATE_BASE_COST: u64 = 30;
const STRUCT_CREATE_BASE_COST: u64 = 40;
const STRING_TRAVERSAL_COST_FACTOR: f64 = 0.1;
const REGEX_STRING_LENGTH_COST_FACTOR: f64 = 0.25;
/// The Kubernetes environment keeps `has()` free, as it was before cel-go 0.17.7.
const PRESENCE_TEST_COST: Estimate = Estimate { min: 0, max: 0 };
/// The most characters of a `format.named` format string (Kubernetes' limit).
const MAX_FORMAT_SIZE: u64 = 64;

/// A range of sizes or costs; arithmetic saturates at `u64::MAX` like cel-go's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Lower bound.
    pub min: u64,
    /// Upper bound.
    pub max: u64,
}

const ZERO: Estimate = Estimate { min: 0, max: 0 };
const UNKNOWN: Estimate = Estimate {
    min: 0,
    max: u64::MAX,
};

fn fixed(value: u64) -> Estimate {
    Estimate {
        min: value,
        max: value,
    }
}

impl Estimate {
    fn add(self, other: Self) -> Self {
        Self {
            min: self.min.saturating_add(other.min),
            max: self.max.saturating_add(other.max),
        }
    }

    fn multiply(self, other: Self) -> Self {
        Self {
            min: self.min.saturating_mul(other.min),
            max: self.max.saturating_mul(other.max),
        }
    }

    fn union(self, other: Self) -> Self {
        Self {
            min: self.min.min(other.min),
            max: self.max.max(other.max),
        }
    }

    /// Times a cost factor, rounded up.
    fn by_factor(self, factor: f64) -> Self {
        Self {
            min: multiply_by_cost_factor(self.min, factor),
            max: multiply_by_cost_factor(self.max, factor),
        }
    }
}

/// cel-go's `multiplyByCostFactor`: the product rounded up, saturating.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn multiply_by_cost_factor(x: u64, factor: f64) -> u64 {
    let x = x as f64;
    if x > 0.0 && factor > 0.0 && x > u64::MAX as f64 / factor {
        return u64::MAX;
    }
    let product = (x * factor).ceil();
    if product >= 18_446_744_073_709_551_616.0 {
        return u64::MAX;
    }
    product as u64
}

/// The container an entry-size estimate describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Container {
    List,
    Map,
}

/// Sizes of the keys (indices) and values of a list or map built in the expression.
#[derive(Clone, Copy, Debug)]
struct EntrySize {
    container: Container,
    key: Estimate,
    val: Estimate,
}

impl EntrySize {
    fn union(self, other: Self) -> Self {
        Self {
            container: self.container,
            key: self.key.union(other.key),
            val: self.val.union(other.val),
        }
    }
}

/// A comprehension or bound variable.
#[derive(Clone, Debug)]
struct LocalVar {
    path: Vec<String>,
    size: Option<Estimate>,
    entry: Option<EntrySize>,
}

/// What a function's cost rule knows of an argument (cel-go's `AstNode`).
#[derive(Clone, Debug)]
struct Node {
    /// Field path from a variable, when the value comes straight from the schema.
    path: Option<Vec<String>>,
    ty: Ty,
    /// The size known from the expression itself.
    size: Option<Estimate>,
    /// The value of an integer literal (`split` reads its limit argument).
    literal_int: Option<u64>,
}

struct CallEstimate {
    cost: Estimate,
    result_size: Option<Estimate>,
}

impl CallEstimate {
    fn cost(cost: Estimate) -> Self {
        Self {
            cost,
            result_size: None,
        }
    }
}

/// Which implementation of a function a call resolves to, where the cost rules tell them
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Overload {
    FormatString,
    StringToBytes,
    BytesToString,
    QuoteString,
    StartsWith,
    EndsWith,
    InList,
    InMap,
    MatchesString,
    ContainsString,
    LogicalAnd,
    LogicalOr,
    Conditional,
    AddString,
    AddBytes,
    AddList,
    CompareSized,
    Equals,
    IndexList,
    IndexMap,
    CidrIp,
    CidrContainsIpString,
    CidrContainsCidrString,
    Other,
}

/// The worst-case cost (`max`) and best case (`min`) of one evaluation of `expr`, whose
/// `self` is described by `root`.
pub fn cost(expr: &IdedExpr, types: &Types, root: &Arc<DeclType>) -> Estimate {
    let mut coster = Coster {
        types,
        root,
        paths: HashMap::new(),
        locals: HashMap::new(),
        sizes: HashMap::new(),
        entry_sizes: HashMap::new(),
    };
    coster.cost(expr)
}

struct Coster<'a> {
    types: &'a Types,
    root: &'a Arc<DeclType>,
    /// Field paths of expressions that read the schema (`["self", "spec", "@items"]`).
    paths: HashMap<u64, Vec<String>>,
    locals: HashMap<String, Vec<LocalVar>>,
    sizes: HashMap<u64, Estimate>,
    entry_sizes: HashMap<u64, EntrySize>,
}

fn is_accumulator(name: &str) -> bool {
    name == "@result" || name == "__result__"
}

impl Coster<'_> {
    fn ty(&self, e: &IdedExpr) -> Ty {
        self.types.get(&e.id).cloned().unwrap_or(Ty::Dyn)
    }

    fn cost(&mut self, e: &IdedExpr) -> Estimate {
        match &e.expr {
            Expr::Literal(_) | Expr::Unspecified => ZERO,
            Expr::Ident(name) => {
                let path = match self.peek(name) {
                    Some(local) => local.path.clone(),
                    None => vec![name.clone()],
                };
                self.paths.insert(e.id, path);
                fixed(SELECT_AND_IDENT_COST)
            }
            Expr::Select(select) => self.cost_select(e, select),
            Expr::Call(call) => self.cost_call(e, call),
            Expr::List(list) => self.cost_list(e, list),
            Expr::Map(map) => self.cost_map(e, map),
            Expr::Struct(s) => {
                let mut sum = ZERO;
                for entry in &s.entries {
                    if let EntryExpr::StructField(field) = &entry.expr {
                        sum = sum.add(self.cost(&field.value));
                    }
                }
                sum.add(fixed(STRUCT_CREATE_BASE_COST))
            }
            Expr::Comprehension(c) => self.cost_comprehension(e, c),
        }
    }

    fn cost_select(&mut self, e: &IdedExpr, select: &SelectExpr) -> Estimate {
        if select.test {
            return PRESENCE_TEST_COST.add(self.cost(&select.operand));
        }
        let mut sum = self.cost(&select.operand);
        if matches!(self.ty(&select.operand), Ty::Object(_) | Ty::Map(..)) {
            sum = sum.add(fixed(SELECT_AND_IDENT_COST));
        }
        let mut path = self.path_of(&select.operand);
        path.push(select.field.clone());
        self.paths.insert(e.id, path);
        sum
    }

    fn cost_call(&mut self, e: &IdedExpr, call: &CallExpr) -> Estimate {
        if call.func_name == "dyn" && call.target.is_none() && call.args.len() == 1 {
            let arg_cost = self.cost(&call.args[0]);
            if let Some(size) = self.compute_size(&call.args[0]) {
                self.sizes.insert(e.id, size);
            }
            if let Some(entry) = self.entry_size(&call.args[0]) {
                self.entry_sizes.insert(e.id, entry);
            }
            return fixed(1).add(arg_cost);
        }
        let mut arg_costs = Vec::with_capacity(call.args.len());
        let mut args = Vec::with_capacity(call.args.len());
        for arg in &call.args {
            arg_costs.push(self.cost(arg));
            args.push(self.node(arg));
        }
        let mut sum = ZERO;
        let mut target = None;
        if let Some(t) = call.target.as_deref() {
            sum = sum.add(self.cost(t));
            target = Some(self.node(t));
        }
        let mut fn_cost = Estimate {
            min: u64::MAX,
            max: 0,
        };
        let mut result_size: Option<Estimate> = None;
        for overload in overloads(&call.func_name, target.as_ref(), &args) {
            let estimate = self.function_cost(
                e,
                &call.func_name,
                overload,
                target.as_ref(),
                &call.args,
                &args,
                &arg_costs,
            );
            fn_cost = fn_cost.union(estimate.cost);
            if let Some(size) = estimate.result_size {
                result_size = Some(result_size.map_or(size, |r| r.union(size)));
            }
            let subpath = match overload {
                Overload::IndexList => Some("@items"),
                Overload::IndexMap => Some("@values"),
                _ => None,
            };
            if let (Some(subpath), Some(container)) = (subpath, call.args.first()) {
                result_size = self.entry_size(container).map(|s| s.val);
                let mut path = self.path_of(container);
                path.push(subpath.into());
                self.paths.insert(e.id, path);
            }
            if result_size.is_none() {
                result_size = self.compute_size(e);
            }
        }
        if let Some(size) = result_size {
            self.sizes.insert(e.id, size);
        }
        sum.add(fn_cost)
    }

    fn cost_list(&mut self, e: &IdedExpr, list: &ListExpr) -> Estimate {
        let mut sum = ZERO;
        let mut item = Estimate {
            min: if list.elements.is_empty() {
                0
            } else {
                u64::MAX
            },
            max: 0,
        };
        for element in &list.elements {
            sum = sum.add(self.cost(element));
            item = item.union(self.size_or_unknown(element));
        }
        self.entry_sizes.insert(
            e.id,
            EntrySize {
                container: Container::List,
                key: fixed(1),
                val: item,
            },
        );
        sum.add(fixed(LIST_CREATE_BASE_COST))
    }

    fn cost_map(&mut self, e: &IdedExpr, map: &MapExpr) -> Estimate {
        let mut sum = ZERO;
        let empty_min = if map.entries.is_empty() { 0 } else { u64::MAX };
        let mut key = Estimate {
            min: empty_min,
            max: 0,
        };
        let mut val = key;
        for entry in &map.entries {
            if let EntryExpr::MapEntry(entry) = &entry.expr {
                sum = sum.add(self.cost(&entry.key));
                sum = sum.add(self.cost(&entry.value));
                key = key.union(self.size_or_unknown(&entry.key));
                val = val.union(self.size_or_unknown(&entry.value));
            }
        }
        self.entry_sizes.insert(
            e.id,
            EntrySize {
                container: Container::Map,
                key,
                val,
            },
        );
        sum.add(fixed(MAP_CREATE_BASE_COST))
    }

    fn cost_comprehension(&mut self, e: &IdedExpr, c: &ComprehensionExpr) -> Estimate {
        let mut sum = self.cost(&c.iter_range);
        sum = sum.add(self.cost(&c.accu_init));
        self.push_local(&c.accu_var, &c.accu_init);
        match &c.iter_var2 {
            Some(second) => {
                self.push_iter_var(&c.iter_var, &c.iter_range, IterRole::Key);
                self.push_iter_var(second, &c.iter_range, IterRole::Value);
            }
            None => self.push_iter_var(&c.iter_var, &c.iter_range, IterRole::Single),
        }
        let loop_cost = self.cost(&c.loop_cond);
        let step_cost = self.cost(&c.loop_step);
        self.pop(&c.iter_var);
        if let Some(second) = &c.iter_var2 {
            self.pop(second);
        }
        sum = sum.add(self.cost(&c.result));
        self.pop(&c.accu_var);
        let range_count = self.size_or_unknown(&c.iter_range);
        sum = sum.add(range_count.multiply(step_cost.add(loop_cost)));
        match &c.accu_init.expr {
            Expr::Literal(_) => {
                if let Some(size) = self.compute_size(&c.accu_init) {
                    self.sizes.insert(e.id, size);
                }
            }
            Expr::List(_) | Expr::Map(_) => {
                self.sizes.insert(e.id, range_count);
                if let Some(entry) = self.entry_size(&c.loop_step) {
                    self.entry_sizes.insert(e.id, entry);
                }
            }
            _ => {}
        }
        sum
    }

    #[allow(clippy::too_many_arguments)]
    fn function_cost(
        &mut self,
        e: &IdedExpr,
        function: &str,
        overload: Overload,
        target: Option<&Node>,
        arg_exprs: &[IdedExpr],
        args: &[Node],
        arg_costs: &[Estimate],
    ) -> CallEstimate {
        let arg_sum = arg_costs.iter().fold(ZERO, |sum, c| sum.add(*c));
        if let Some(estimate) = self.library_cost(function, overload, target, args) {
            return CallEstimate {
                cost: estimate.cost.add(arg_sum),
                result_size: estimate.result_size,
            };
        }
        let size = |node: &Node| node.size.unwrap_or(UNKNOWN);
        match overload {
            Overload::FormatString if target.is_some() => {
                let target = target.map_or(UNKNOWN, size);
                return CallEstimate::cost(
                    target.by_factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                );
            }
            Overload::StringToBytes | Overload::BytesToString | Overload::QuoteString
                if args.len() == 1 =>
            {
                let sz = size(&args[0]);
                let result = match overload {
                    Overload::StringToBytes => Estimate {
                        min: sz.min,
                        max: sz.max.saturating_mul(4),
                    },
                    Overload::BytesToString => Estimate {
                        min: sz.min / 4,
                        max: sz.max,
                    },
                    _ => Estimate {
                        min: sz.min.saturating_add(2),
                        max: sz.max.saturating_mul(2).saturating_add(2),
                    },
                };
                return CallEstimate {
                    cost: sz.by_factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                    result_size: Some(result),
                };
            }
            Overload::StartsWith | Overload::EndsWith if args.len() == 1 => {
                return CallEstimate::cost(
                    size(&args[0])
                        .by_factor(STRING_TRAVERSAL_COST_FACTOR)
                        .add(arg_sum),
                );
            }
            Overload::InList if args.len() == 2 => {
                return CallEstimate::cost(size(&args[1]).by_factor(1.0).add(arg_sum));
            }
            Overload::MatchesString if target.is_some() && args.len() == 1 => {
                let string = target
                    .map_or(UNKNOWN, size)
                    .add(fixed(1))
                    .by_factor(STRING_TRAVERSAL_COST_FACTOR);
                let regex = size(&args[0]).by_factor(REGEX_STRING_LENGTH_COST_FACTOR);
                return CallEstimate::cost(string.multiply(regex).add(arg_sum));
            }
            Overload::ContainsString if target.is_some() && args.len() == 1 => {
                let string = target
                    .map_or(UNKNOWN, size)
                    .by_factor(STRING_TRAVERSAL_COST_FACTOR);
                let sub = size(&args[0]).by_factor(STRING_TRAVERSAL_COST_FACTOR);
                return CallEstimate::cost(string.multiply(sub).add(arg_sum));
            }
            Overload::LogicalAnd | Overload::LogicalOr => {
                let (lhs, rhs) = (arg_costs[0], arg_costs[1]);
                return CallEstimate::cost(Estimate {
                    min: lhs.min,
                    max: lhs.add(rhs).max,
                });
            }
            Overload::Conditional => {
                let result = size(&args[1]).union(size(&args[2]));
                if let (Some(a), Some(b)) = (
                    self.entry_size(&arg_exprs[1]),
                    self.entry_size(&arg_exprs[2]),
                ) {
                    self.entry_sizes.insert(e.id, a.union(b));
                }
                return CallEstimate {
                    cost: arg_costs[0].add(arg_costs[1].union(arg_costs[2])),
                    result_size: Some(result),
                };
            }
            Overload::AddString | Overload::AddBytes | Overload::AddList if args.len() == 2 => {
                let result = size(&args[0]).add(size(&args[1]));
                if let (Some(a), Some(b)) = (
                    self.entry_size(&arg_exprs[0]),
                    self.entry_size(&arg_exprs[1]),
                ) {
                    self.entry_sizes.insert(e.id, a.union(b));
                }
                let cost = if overload == Overload::AddList {
                    fixed(1).add(arg_sum)
                } else {
                    result.by_factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum)
                };
                return CallEstimate {
                    cost,
                    result_size: Some(result),
                };
            }
            Overload::CompareSized | Overload::Equals => {
                let smallest_max = size(&args[0]).max.min(size(&args[1]).max);
                let cost = Estimate {
                    min: u64::from(smallest_max > 0),
                    max: smallest_max,
                };
                return CallEstimate::cost(
                    cost.by_factor(STRING_TRAVERSAL_COST_FACTOR).add(arg_sum),
                );
            }
            _ => {}
        }
        // Everything else is O(1).
        CallEstimate::cost(fixed(1).add(arg_sum))
    }

    /// Kubernetes' own cost rules, keyed by function name (its `CostEstimator`); None where
    /// cel-go's rules apply.
    fn library_cost(
        &self,
        function: &str,
        overload: Overload,
        target: Option<&Node>,
        args: &[Node],
    ) -> Option<CallEstimate> {
        let size = |node: &Node| self.library_size(node);
        let traverse = |node: &Node| size(node).by_factor(STRING_TRAVERSAL_COST_FACTOR);
        let nominal = || Some(CallEstimate::cost(fixed(1)));
        match function {
            "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" => {
                let target = target?;
                let Some(element) = list_element(target) else {
                    return Some(CallEstimate::cost(traverse(target)));
                };
                let mut per_element = fixed(1);
                if matches!(element.ty, Ty::String | Ty::Bytes) {
                    per_element = per_element.add(traverse(&element));
                }
                Some(CallEstimate::cost(size(target).multiply(per_element)))
            }
            "url" | "jsonpatch.escapeKey" if args.len() == 1 => {
                let sz = size(&args[0]);
                Some(CallEstimate {
                    cost: sz.by_factor(STRING_TRAVERSAL_COST_FACTOR),
                    result_size: Some(sz),
                })
            }
            "lowerAscii" | "upperAscii" | "substring" | "trim" => {
                let sz = size(target?);
                Some(CallEstimate {
                    cost: sz.by_factor(STRING_TRAVERSAL_COST_FACTOR),
                    result_size: Some(sz),
                })
            }
            "replace" if args.len() >= 2 => {
                let target = target?;
                Some(replace_cost(size(target), size(&args[0]), size(&args[1])))
            }
            "split" => {
                let sz = size(target?);
                let max = args
                    .get(1)
                    .and_then(|limit| limit.literal_int)
                    .unwrap_or(sz.max);
                Some(CallEstimate {
                    cost: sz.by_factor(2.0 * STRING_TRAVERSAL_COST_FACTOR),
                    result_size: Some(Estimate { min: 0, max }),
                })
            }
            "join" => {
                let target = target?;
                let list = size(target);
                let mut sz = list_element(target).map_or(ZERO, |el| list.multiply(size(&el)));
                if let Some(separator) = args.first() {
                    let separators = Estimate {
                        min: list.min.saturating_sub(1),
                        max: list.max.saturating_sub(1),
                    };
                    sz = sz.add(size(separator).multiply(separators));
                }
                Some(CallEstimate {
                    cost: sz.by_factor(STRING_TRAVERSAL_COST_FACTOR),
                    result_size: Some(sz),
                })
            }
            "find" | "findAll" if !args.is_empty() => {
                let sz = size(target?);
                let string = sz.add(fixed(1)).by_factor(STRING_TRAVERSAL_COST_FACTOR);
                let regex = size(&args[0]).by_factor(REGEX_STRING_LENGTH_COST_FACTOR);
                Some(CallEstimate {
                    cost: string.multiply(regex),
                    result_size: Some(Estimate {
                        min: 0,
                        max: sz.max,
                    }),
                })
            }
            "cidr" | "isIP" | "isCIDR" | "quantity" | "isQuantity" | "semver" | "isSemver"
                if !args.is_empty() =>
            {
                Some(CallEstimate::cost(traverse(&args[0])))
            }
            "ip" if overload == Overload::CidrIp => nominal(),
            "ip" if !args.is_empty() => Some(CallEstimate::cost(traverse(&args[0]))),
            "ip.isCanonical" if !args.is_empty() => Some(CallEstimate::cost(
                size(&args[0]).by_factor(2.0 * STRING_TRAVERSAL_COST_FACTOR),
            )),
            "containsIP" | "containsCIDR" if !args.is_empty() => {
                let address = Estimate { min: 4, max: 16 };
                let mut cost = address.add(address).by_factor(STRING_TRAVERSAL_COST_FACTOR);
                if function == "containsCIDR" {
                    cost = cost
                        .add(address.by_factor(STRING_TRAVERSAL_COST_FACTOR))
                        .add(fixed(1));
                }
                if matches!(
                    overload,
                    Overload::CidrContainsIpString | Overload::CidrContainsCidrString
                ) {
                    cost = cost.add(traverse(&args[0]));
                }
                Some(CallEstimate::cost(cost))
            }
            "masked"
            | "prefixLength"
            | "family"
            | "isUnspecified"
            | "isLoopback"
            | "isLinkLocalMulticast"
            | "isLinkLocalUnicast"
            | "isGlobalUnicast"
            | "format.named"
            | "sign"
            | "asInteger"
            | "isInteger"
            | "asApproximateFloat"
            | "isGreaterThan"
            | "isLessThan"
            | "compareTo"
            | "add"
            | "sub"
            | "major"
            | "minor"
            | "patch"
            | "getScheme"
            | "getHostname"
            | "getHost"
            | "getPort"
            | "getEscapedPath"
            | "getQuery" => nominal(),
            "_==_" if args.len() == 2 => equal_library_types(&args[0], &args[1]),
            _ => None,
        }
    }

    /// The size Kubernetes' rules see: computed, else from the schema path, else unknown.
    fn library_size(&self, node: &Node) -> Estimate {
        node.size
            .or_else(|| node.path.as_deref().and_then(|p| self.estimate_size(p)))
            .unwrap_or(UNKNOWN)
    }

    fn node(&mut self, e: &IdedExpr) -> Node {
        let path = self.path_of(e);
        let path = (!path.first().is_some_and(|p| is_accumulator(p))).then_some(path);
        let literal_int = match &e.expr {
            Expr::Literal(LiteralValue::Int(i)) => u64::try_from(*i.inner()).ok(),
            _ => None,
        };
        Node {
            path,
            ty: self.ty(e),
            size: self.compute_size(e),
            literal_int,
        }
    }

    fn path_of(&self, e: &IdedExpr) -> Vec<String> {
        if let Expr::Ident(name) = &e.expr
            && let Some(local) = self.peek(name)
        {
            return local.path.clone();
        }
        self.paths.get(&e.id).cloned().unwrap_or_default()
    }

    fn size_or_unknown(&mut self, e: &IdedExpr) -> Estimate {
        self.compute_size(e).unwrap_or(UNKNOWN)
    }

    fn compute_size(&mut self, e: &IdedExpr) -> Option<Estimate> {
        if let Some(size) = self.sizes.get(&e.id) {
            return Some(*size);
        }
        if let Some(size) = literal_size(e) {
            return Some(size);
        }
        if let Some(size) = self.estimate_size(&self.path_of(e)) {
            self.sizes.insert(e.id, size);
            return Some(size);
        }
        if self.ty(e).is_scalar() {
            return Some(fixed(1));
        }
        if let Expr::Ident(name) = &e.expr {
            return self.peek(name).and_then(|local| local.size);
        }
        None
    }

    /// Kubernetes' size estimator: the bound of the schema node a path leads to. The first
    /// element names the variable and is skipped: every path starts at the rule's node.
    fn estimate_size(&self, path: &[String]) -> Option<Estimate> {
        if path.is_empty() {
            return None;
        }
        let mut node = self.root;
        for name in &path[1..] {
            node = match name.as_str() {
                "@items" | "@values" => node.elem()?,
                "@keys" => match node.kind {
                    DeclKind::Map(_) => &MAP_KEY,
                    _ => return None,
                },
                field => node.field(field)?,
            };
        }
        Some(Estimate {
            min: 0,
            max: u64::try_from(node.max_elements).unwrap_or(0),
        })
    }

    fn entry_size(&self, e: &IdedExpr) -> Option<EntrySize> {
        if let Some(entry) = self.entry_sizes.get(&e.id) {
            return Some(*entry);
        }
        if let Expr::Ident(name) = &e.expr {
            return self.peek(name).and_then(|local| local.entry);
        }
        None
    }

    fn peek(&self, name: &str) -> Option<&LocalVar> {
        self.locals.get(name).and_then(|stack| stack.last())
    }

    fn pop(&mut self, name: &str) {
        if let Some(stack) = self.locals.get_mut(name) {
            stack.pop();
        }
    }

    fn push_local(&mut self, name: &str, e: &IdedExpr) {
        let local = LocalVar {
            path: self.path_of(e),
            entry: self.entry_size(e),
            size: self.compute_size(e),
        };
        self.locals.entry(name.to_owned()).or_default().push(local);
    }

    fn push_iter_var(&mut self, name: &str, range: &IdedExpr, role: IterRole) {
        let entry = self.entry_size(range);
        let container = entry.map(|s| s.container).or(match self.ty(range) {
            Ty::List(_) => Some(Container::List),
            Ty::Map(..) => Some(Container::Map),
            _ => None,
        });
        let is_list = container == Some(Container::List);
        let (subpath, size) = match role {
            IterRole::Key if is_list => ("@indices", entry.map(|s| s.key)),
            IterRole::Key => ("@keys", entry.map(|s| s.key)),
            IterRole::Value if is_list => ("@items", entry.map(|s| s.val)),
            IterRole::Value => ("@values", entry.map(|s| s.val)),
            IterRole::Single if is_list => ("@items", entry.map(|s| s.val)),
            IterRole::Single => ("@keys", entry.map(|s| s.key)),
        };
        let mut path = self.path_of(range);
        path.push(subpath.into());
        self.locals
            .entry(name.to_owned())
            .or_default()
            .push(LocalVar {
                path,
                size,
                entry: None,
            });
    }
}

#[derive(Clone, Copy)]
enum IterRole {
    Single,
    Key,
    Value,
}

/// The element of a list argument, as Kubernetes' rules see it: the element type, with the
/// list's path plus `@items` so that a declared `maxLength` is found.
fn list_element(list: &Node) -> Option<Node> {
    let elem = match &list.ty {
        Ty::List(elem) => (**elem).clone(),
        Ty::Map(key, _) => (**key).clone(),
        _ => return None,
    };
    Some(Node {
        path: list.path.as_ref().map(|p| {
            let mut p = p.clone();
            p.push("@items".into());
            p
        }),
        ty: elem,
        size: None,
        literal_int: None,
    })
}

fn replace_cost(sz: Estimate, to_replace: Estimate, replace_with: Estimate) -> CallEstimate {
    let mut count = ZERO;
    let mut retained = ZERO;
    if to_replace.min == 0 {
        count.max = sz.max.saturating_add(1);
        retained.max = sz.max;
    } else if replace_with.max <= to_replace.min {
        retained.max = sz.max;
    } else {
        count.max = sz.max.div_ceil(to_replace.min);
    }
    if to_replace.max == 0 {
        count.min = sz.min.saturating_add(1);
        retained.min = sz.min;
    } else if to_replace.max <= replace_with.min {
        retained.min = sz.min;
    } else {
        count.min = sz.min.div_ceil(to_replace.max);
    }
    let size = count.multiply(replace_with).add(retained);
    CallEstimate {
        cost: sz.by_factor(2.0 * STRING_TRAVERSAL_COST_FACTOR),
        result_size: Some(size),
    }
}

/// Equality of two values of the same Kubernetes library type.
fn equal_library_types(lhs: &Node, rhs: &Node) -> Option<CallEstimate> {
    let (Ty::Opaque(a), Ty::Opaque(b)) = (&lhs.ty, &rhs.ty) else {
        return None;
    };
    if a != b {
        return None;
    }
    match *a {
        "IP" | "CIDR" | "Quantity" | "Semver" => Some(CallEstimate::cost(fixed(1))),
        "Format" => Some(CallEstimate::cost(
            Estimate {
                min: 1,
                max: MAX_FORMAT_SIZE,
            }
            .by_factor(STRING_TRAVERSAL_COST_FACTOR),
        )),
        "URL" => {
            // Kubernetes reads the right-hand size twice here; so do we.
            let size = rhs.size.unwrap_or(fixed(1));
            Some(CallEstimate::cost(
                Estimate {
                    min: 1,
                    max: size.max,
                }
                .by_factor(STRING_TRAVERSAL_COST_FACTOR),
            ))
        }
        _ => None,
    }
}

/// The size CEL knows from a literal itself: characters of a string, bytes, entries of a
/// list or map literal, 1 for other constants.
fn literal_size(e: &IdedExpr) -> Option<Estimate> {
    let size = match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => s.inner().chars().count() as u64,
        Expr::Literal(LiteralValue::Bytes(b)) => b.inner().len() as u64,
        Expr::Literal(_) => 1,
        Expr::List(list) => list.elements.len() as u64,
        Expr::Map(map) => map.entries.len() as u64,
        _ => return None,
    };
    Some(fixed(size))
}

fn is_sized(ty: &Ty) -> bool {
    matches!(ty, Ty::String | Ty::Bytes)
}

/// The implementations a call may resolve to. Where an operand is `dyn`, every
/// implementation it could reach counts, as cel-go's checker keeps them all.
fn overloads(function: &str, target: Option<&Node>, args: &[Node]) -> Vec<Overload> {
    let arg = |i: usize| args.get(i).map_or(Ty::Dyn, |a| a.ty.clone());
    let target_ty = target.map(|t| t.ty.clone());
    let string_target = matches!(target_ty, Some(Ty::String | Ty::Dyn));
    match function {
        "_&&_" => vec![Overload::LogicalAnd],
        "_||_" => vec![Overload::LogicalOr],
        "_?_:_" => vec![Overload::Conditional],
        "_==_" | "_!=_" => vec![Overload::Equals],
        "_<_" | "_<=_" | "_>_" | "_>=_" => {
            let (a, b) = (arg(0), arg(1));
            let sized = is_sized(&a) || is_sized(&b);
            let all_dyn = matches!(a, Ty::Dyn) && matches!(b, Ty::Dyn);
            match (sized, all_dyn) {
                (true, _) => vec![Overload::CompareSized],
                (false, true) => vec![Overload::CompareSized, Overload::Other],
                (false, false) => vec![Overload::Other],
            }
        }
        "_+_" => {
            let kinds = [arg(0), arg(1)];
            let definite = kinds.iter().find(|t| !matches!(t, Ty::Dyn));
            match definite {
                Some(Ty::String) => vec![Overload::AddString],
                Some(Ty::Bytes) => vec![Overload::AddBytes],
                Some(Ty::List(_)) => vec![Overload::AddList],
                Some(_) => vec![Overload::Other],
                None => vec![
                    Overload::AddString,
                    Overload::AddBytes,
                    Overload::AddList,
                    Overload::Other,
                ],
            }
        }
        "@in" => match arg(1) {
            Ty::List(_) => vec![Overload::InList],
            Ty::Map(..) => vec![Overload::InMap],
            _ => vec![Overload::InList, Overload::InMap],
        },
        "_[_]" => match arg(0) {
            Ty::List(_) => vec![Overload::IndexList],
            Ty::Map(..) => vec![Overload::IndexMap],
            _ => vec![Overload::IndexList, Overload::IndexMap],
        },
        "matches" if string_target => vec![Overload::MatchesString],
        "contains" if string_target => vec![Overload::ContainsString],
        "startsWith" if string_target => vec![Overload::StartsWith],
        "endsWith" if string_target => vec![Overload::EndsWith],
        "format" if string_target => vec![Overload::FormatString],
        "bytes" if matches!(arg(0), Ty::String) => vec![Overload::StringToBytes],
        "string" if matches!(arg(0), Ty::Bytes) => vec![Overload::BytesToString],
        "strings.quote" => vec![Overload::QuoteString],
        "ip" if matches!(target_ty, Some(Ty::Opaque("CIDR"))) => vec![Overload::CidrIp],
        "containsIP" if matches!(arg(0), Ty::String) => vec![Overload::CidrContainsIpString],
        "containsCIDR" if matches!(arg(0), Ty::String) => {
            vec![Overload::CidrContainsCidrString]
        }
        _ => vec![Overload::Other],
    }
}
