//! The engine's series that grow with the clusters: a member's state, an LB's gate, a cluster's
//! counters. They are kept as plain rows and turned into samples only when scraped.
//!
//! A prometheus `*Vec` child owns a whole copy of its metric's description (name, help, label
//! names) beside its label pairs: about 1.5 KB for a member's seven labels, 9,400 children at
//! 1,000 clusters. A row here holds its label values and nothing else. The scrape builds the
//! same samples a `*Vec` would (names, help, types, labels sorted by name).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::model::ObjectName;
use super::verdict::{MemberVerdictKind, Reason};

/// One member as `capo_lb_member_state` shows it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemberRow {
    /// The pool's name.
    pub pool: String,
    /// The member's name in its pool.
    pub member: String,
    /// The OpenStackMachine that wants the member.
    pub machine: String,
    /// Octavia's `provisioning_status`, or `ABSENT`.
    pub provisioning: &'static str,
    /// Octavia's `operating_status`.
    pub operating: &'static str,
}

/// A cluster's counters: they start at zero when its LB is tracked, so that the first
/// increase is one Prometheus can see, and go with it.
#[derive(Clone, Copy, Debug, Default)]
struct ClusterCounts {
    stuck: u64,
    error: u64,
    not_serving: u64,
    holds: u64,
}

/// One LB: its cluster, the gate's reason once published, its members' rows.
#[derive(Debug)]
struct LbRow {
    cluster: ObjectName,
    reason: Option<Reason>,
    members: Vec<MemberRow>,
}

#[derive(Debug, Default)]
struct Rows {
    clusters: HashMap<ObjectName, ClusterCounts>,
    lbs: HashMap<String, LbRow>,
}

/// The families (name, help, type), in the order [`Collector::desc`] gives them.
pub const FAMILIES: [(&str, &str, MetricType); 7] = [
    (
        "capo_lb_member_state",
        "1 for the member's current provisioning and operating status",
        MetricType::GAUGE,
    ),
    (
        "capo_lb_gate_ready",
        "1 when the API load balancer gate is open (every desired member ACTIVE)",
        MetricType::GAUGE,
    ),
    (
        "capo_lb_gate_reason",
        "1 for the gate's current reason",
        MetricType::GAUGE,
    ),
    (
        "capo_lb_member_stuck_total",
        "Members that became stuck in PENDING_*",
        MetricType::COUNTER,
    ),
    (
        "capo_lb_member_error_total",
        "Members seen going to ERROR",
        MetricType::COUNTER,
    ),
    (
        "capo_lb_member_not_serving_total",
        "Members ACTIVE whose health monitor did not see their API serve past the not-serving threshold",
        MetricType::COUNTER,
    ),
    (
        "capo_lb_gate_holds_total",
        "Times a cluster's API load balancer gate closed and began to hold its rollout",
        MetricType::COUNTER,
    ),
];

/// Each family's index in [`FAMILIES`] and [`LABELS`].
const MEMBER_STATE: usize = 0;
const GATE_READY: usize = 1;
const GATE_REASON: usize = 2;
const STUCK: usize = 3;
const ERROR: usize = 4;
const NOT_SERVING: usize = 5;
const HOLDS: usize = 6;

/// The label names of each family, in [`FAMILIES`]' order.
pub const LABELS: [&[&str]; 7] = [
    &[
        "namespace",
        "cluster",
        "pool",
        "member",
        "machine",
        "provisioning_status",
        "operating_status",
    ],
    &["namespace", "cluster", "loadbalancer"],
    &["namespace", "cluster", "loadbalancer", "reason"],
    &["namespace", "cluster"],
    &["namespace", "cluster"],
    &["namespace", "cluster"],
    &["namespace", "cluster"],
];

/// The per-cluster and per-LB series; clones share the rows. Registered once per engine.
#[derive(Clone, Debug)]
pub struct LbSeries {
    rows: Arc<Mutex<Rows>>,
    descs: Arc<Vec<Desc>>,
}

impl LbSeries {
    /// Empty rows; an error only if a family's name or labels are not valid (they are).
    pub fn new() -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .zip(LABELS)
            .map(|((name, help, _), labels)| {
                let labels = labels.iter().map(|l| l.to_string()).collect();
                Desc::new(name.to_string(), help.to_string(), labels, HashMap::new())
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(LbSeries {
            rows: Arc::default(),
            descs: Arc::new(descs),
        })
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        // A panic elsewhere while the lock was held leaves rows that are still whole.
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cluster's LB is tracked: its counters show, at zero if they are new.
    pub fn track_cluster(&self, cluster: &ObjectName) {
        self.rows().clusters.entry(cluster.clone()).or_default();
    }

    /// A cluster's LB is no longer tracked: its counters go.
    pub fn forget_cluster(&self, cluster: &ObjectName) {
        self.rows().clusters.remove(cluster);
    }

    /// A member's verdict became `kind`: counts the ones people are paged for.
    pub fn member_became(&self, cluster: &ObjectName, kind: MemberVerdictKind) {
        self.count(cluster, |counts| match kind {
            MemberVerdictKind::Stuck => Some(&mut counts.stuck),
            MemberVerdictKind::Error => Some(&mut counts.error),
            MemberVerdictKind::NotServing => Some(&mut counts.not_serving),
            _ => None,
        });
    }

    /// A hold of the cluster's gate began.
    pub fn hold_began(&self, cluster: &ObjectName) {
        self.count(cluster, |counts| Some(&mut counts.holds));
    }

    fn count(
        &self,
        cluster: &ObjectName,
        pick: impl FnOnce(&mut ClusterCounts) -> Option<&mut u64>,
    ) {
        let mut rows = self.rows();
        // As a `*Vec` does, counting for a cluster no longer tracked shows it again.
        let counts = rows.clusters.entry(cluster.clone()).or_default();
        if let Some(counter) = pick(counts) {
            *counter += 1;
        }
    }

    /// The gate of `lb` reads `reason`.
    pub fn set_gate(&self, cluster: &ObjectName, lb: &str, reason: Reason) {
        let mut rows = self.rows();
        let row = lb_row(&mut rows, cluster, lb);
        row.reason = Some(reason);
    }

    /// The members of `lb` now read `members` (duplicates show once, as one series).
    pub fn set_members(&self, cluster: &ObjectName, lb: &str, mut members: Vec<MemberRow>) {
        members.sort();
        members.dedup();
        members.shrink_to_fit();
        let mut rows = self.rows();
        lb_row(&mut rows, cluster, lb).members = members;
    }

    /// `lb` is no longer tracked: its gate and members go.
    pub fn forget_lb(&self, lb: &str) {
        self.rows().lbs.remove(lb);
    }

    /// Every sample, borrowed from the rows.
    fn samples<'a>(rows: &'a Rows) -> Samples<'a> {
        let mut samples = Samples::default();
        for (lb, row) in &rows.lbs {
            let lb = lb.as_str();
            let (namespace, cluster) = (row.cluster.namespace.as_str(), row.cluster.name.as_str());
            for m in &row.members {
                samples.members.push((
                    [
                        cluster,
                        m.machine.as_str(),
                        m.member.as_str(),
                        namespace,
                        m.operating,
                        m.pool.as_str(),
                        m.provisioning,
                    ],
                    1.0,
                ));
            }
            if let Some(reason) = row.reason {
                let ready = f64::from(u8::from(reason == Reason::Ready));
                samples.gates.push(([cluster, lb, namespace], ready));
                samples
                    .reasons
                    .push(([cluster, lb, namespace, reason.as_str()], 1.0));
            }
        }
        for (cluster, counts) in &rows.clusters {
            let labels = [cluster.name.as_str(), cluster.namespace.as_str()];
            let values = [counts.stuck, counts.error, counts.not_serving, counts.holds];
            for (family, value) in samples.counts.iter_mut().zip(values) {
                family.push((labels, value as f64));
            }
        }
        samples
    }

    /// The families with at least one sample, each as its `*Vec` would show it.
    fn families(&self) -> Vec<MetricFamily> {
        let rows = self.rows();
        let samples = Self::samples(&rows);
        let [stuck, error, not_serving, holds] = &samples.counts;
        let type_of = |family: usize| FAMILIES[family].2;
        let metrics: [Vec<Metric>; 7] = [
            metrics(MEMBER_LABELS, &samples.members, type_of(MEMBER_STATE)),
            metrics(GATE_LABELS, &samples.gates, type_of(GATE_READY)),
            metrics(REASON_LABELS, &samples.reasons, type_of(GATE_REASON)),
            metrics(COUNT_LABELS, stuck, type_of(STUCK)),
            metrics(COUNT_LABELS, error, type_of(ERROR)),
            metrics(COUNT_LABELS, not_serving, type_of(NOT_SERVING)),
            metrics(COUNT_LABELS, holds, type_of(HOLDS)),
        ];
        drop(rows);
        FAMILIES
            .iter()
            .zip(metrics)
            .filter(|(_, metrics)| !metrics.is_empty())
            .map(|((name, help, kind), metrics)| {
                let mut family = MetricFamily::default();
                family.set_name(name.to_string());
                family.set_help(help.to_string());
                family.set_field_type(*kind);
                family.set_metric(metrics);
                family
            })
            .collect()
    }

    /// The families in Prometheus' text format, as prometheus' registry and encoder write them
    /// (families by name, samples by label values), without building a message per sample.
    pub fn write_text(&self, out: &mut Vec<u8>) {
        let rows = self.rows();
        let mut samples = Self::samples(&rows);
        let [stuck, error, not_serving, holds] = &mut samples.counts;
        // In the families' name order, as the registry sorts them (a test holds the order).
        write_family(out, HOLDS, COUNT_LABELS, holds);
        write_family(out, GATE_READY, GATE_LABELS, &mut samples.gates);
        write_family(out, GATE_REASON, REASON_LABELS, &mut samples.reasons);
        write_family(out, ERROR, COUNT_LABELS, error);
        write_family(out, NOT_SERVING, COUNT_LABELS, not_serving);
        write_family(out, MEMBER_STATE, MEMBER_LABELS, &mut samples.members);
        write_family(out, STUCK, COUNT_LABELS, stuck);
    }
}

/// Each family's label names sorted, as a `*Vec`'s samples carry them.
const MEMBER_LABELS: [&str; 7] = [
    "cluster",
    "machine",
    "member",
    "namespace",
    "operating_status",
    "pool",
    "provisioning_status",
];
const GATE_LABELS: [&str; 3] = ["cluster", "loadbalancer", "namespace"];
const REASON_LABELS: [&str; 4] = ["cluster", "loadbalancer", "namespace", "reason"];
const COUNT_LABELS: [&str; 2] = ["cluster", "namespace"];

/// Label values (in their names' sorted order) and the value of each sample.
type Family<'a, const N: usize> = Vec<([&'a str; N], f64)>;

#[derive(Default)]
struct Samples<'a> {
    members: Family<'a, 7>,
    gates: Family<'a, 3>,
    reasons: Family<'a, 4>,
    /// Stuck, ERROR, not serving, holds.
    counts: [Family<'a, 2>; 4],
}

fn metrics<const N: usize>(
    names: [&str; N],
    samples: &Family<'_, N>,
    kind: MetricType,
) -> Vec<Metric> {
    samples
        .iter()
        .map(|(values, value)| {
            let labels: Vec<(&str, &str)> =
                names.iter().copied().zip(values.iter().copied()).collect();
            if kind == MetricType::COUNTER {
                counter(&labels, *value)
            } else {
                gauge(&labels, *value)
            }
        })
        .collect()
}

/// One family as text, its samples sorted by label values as prometheus' registry sorts them;
/// nothing when it has no sample.
fn write_family<const N: usize>(
    out: &mut Vec<u8>,
    family: usize,
    names: [&str; N],
    samples: &mut Family<'_, N>,
) {
    use std::io::Write as _;
    if samples.is_empty() {
        return;
    }
    samples.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let (name, help, kind) = FAMILIES[family];
    let kind = if kind == MetricType::COUNTER {
        "counter"
    } else {
        "gauge"
    };
    out.extend_from_slice(
        format!(
            "# HELP {name} {}\n# TYPE {name} {kind}\n",
            escape(help, false)
        )
        .as_bytes(),
    );
    for (values, value) in samples.iter() {
        out.extend_from_slice(name.as_bytes());
        for (i, (label, text)) in names.iter().zip(values).enumerate() {
            out.extend_from_slice(if i == 0 { b"{" } else { b"," });
            out.extend_from_slice(label.as_bytes());
            out.extend_from_slice(b"=\"");
            out.extend_from_slice(escape(text, true).as_bytes());
            out.push(b'"');
        }
        // Writing to a Vec does not fail.
        let _ = writeln!(out, "}} {value}");
    }
}

/// A label value (`quote`) or help text as the text format escapes it: `\`, a new line, and in
/// a label value `"`, each behind a backslash.
fn escape(text: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    let special = |c: char| c == '\\' || c == '\n' || (quote && c == '"');
    if !text.contains(special) {
        return text.into();
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => escaped.push_str("\\n"),
            c if special(c) => {
                escaped.push('\\');
                escaped.push(c);
            }
            c => escaped.push(c),
        }
    }
    escaped.into()
}

fn lb_row<'a>(rows: &'a mut Rows, cluster: &ObjectName, lb: &str) -> &'a mut LbRow {
    let row = rows.lbs.entry(lb.to_string()).or_insert_with(|| LbRow {
        cluster: cluster.clone(),
        reason: None,
        members: Vec::new(),
    });
    if row.cluster != *cluster {
        row.cluster = cluster.clone();
    }
    row
}

/// Label pairs, given sorted by name (as a `*Vec` sorts them).
fn label_pairs(labels: &[(&str, &str)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            pair
        })
        .collect()
}

fn gauge(labels: &[(&str, &str)], value: f64) -> Metric {
    let mut gauge = Gauge::default();
    gauge.set_value(value);
    let mut metric = Metric::from_label(label_pairs(labels));
    metric.set_gauge(gauge);
    metric
}

fn counter(labels: &[(&str, &str)], value: f64) -> Metric {
    let mut counter = Counter::default();
    counter.set_value(value);
    let mut metric = Metric::from_label(label_pairs(labels));
    metric.set_counter(counter);
    metric
}

impl Collector for LbSeries {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // In a scrape, the text goes straight into it: no message per sample.
        if crate::exposition::write_direct(|out| self.write_text(out)) {
            return Vec::new();
        }
        self.families()
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

    use super::*;

    fn cluster(name: &str) -> ObjectName {
        ObjectName {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn member(machine: &str, provisioning: &'static str) -> MemberRow {
        MemberRow {
            pool: "pool-1".into(),
            member: format!("{machine}-6443"),
            machine: machine.into(),
            provisioning,
            operating: "ONLINE",
        }
    }

    fn scrape(registry: &Registry) -> String {
        let mut body = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut body)
            .expect("the text encoder writes to a Vec");
        String::from_utf8(body).expect("the exposition is UTF-8")
    }

    /// What the same story scraped from prometheus's own `*Vec`s, as the engine used to keep
    /// these series, shows.
    fn scraped_from_vecs() -> String {
        let registry = Registry::new();
        let opts = |family: usize| {
            let (name, help, _) = FAMILIES[family];
            Opts::new(name, help)
        };
        let gauge = |family: usize| {
            let gauge = IntGaugeVec::new(opts(family), LABELS[family]).expect("valid names");
            registry
                .register(Box::new(gauge.clone()))
                .expect("registers once");
            gauge
        };
        let counter = |family: usize| {
            let counter = IntCounterVec::new(opts(family), LABELS[family]).expect("valid names");
            registry
                .register(Box::new(counter.clone()))
                .expect("registers once");
            counter
        };
        let (member_state, gate_ready, gate_reason) =
            (gauge(MEMBER_STATE), gauge(GATE_READY), gauge(GATE_REASON));
        let (stuck, error, not_serving, holds) = (
            counter(STUCK),
            counter(ERROR),
            counter(NOT_SERVING),
            counter(HOLDS),
        );
        for (machine, provisioning) in [("m1", "ACTIVE"), ("m2", "PENDING_CREATE")] {
            member_state
                .with_label_values(&[
                    "default",
                    "c1",
                    "pool-1",
                    &format!("{machine}-6443"),
                    machine,
                    provisioning,
                    "ONLINE",
                ])
                .set(1);
        }
        gate_ready
            .with_label_values(&["default", "c1", "lb-1"])
            .set(0);
        gate_reason
            .with_label_values(&["default", "c1", "lb-1", "MembersPending"])
            .set(1);
        for counter in [&stuck, &error, &not_serving, &holds] {
            counter.with_label_values(&["default", "c1"]);
            counter.with_label_values(&["default", "c2"]);
        }
        error.with_label_values(&["default", "c1"]).inc();
        holds.with_label_values(&["default", "c1"]).inc();
        scrape(&registry)
    }

    /// Fresh series, registered as the engine registers them.
    fn registered() -> (LbSeries, Registry) {
        let series = LbSeries::new().expect("valid names");
        let registry = Registry::new();
        registry
            .register(Box::new(series.clone()))
            .expect("registers once");
        (series, registry)
    }

    #[test]
    fn the_scrape_reads_as_the_vecs_it_replaces_did() {
        let (series, registry) = registered();
        series.track_cluster(&cluster("c1"));
        series.track_cluster(&cluster("c2"));
        series.set_members(
            &cluster("c1"),
            "lb-1",
            vec![member("m2", "PENDING_CREATE"), member("m1", "ACTIVE")],
        );
        series.set_gate(&cluster("c1"), "lb-1", Reason::MembersPending);
        series.member_became(&cluster("c1"), MemberVerdictKind::Error);
        series.member_became(&cluster("c1"), MemberVerdictKind::Active);
        series.hold_began(&cluster("c1"));

        assert_eq!(scrape(&registry), scraped_from_vecs());
    }

    #[test]
    fn a_scrape_writes_the_text_the_encoder_writes_of_the_gathered_samples() {
        let (series, registry) = registered();
        for (lb, name) in [("lb-3", "c3"), ("lb-1", "c1"), ("lb-2", "c2")] {
            series.track_cluster(&cluster(name));
            series.set_gate(&cluster(name), lb, Reason::MembersPending);
            let mut odd = member("m-b", "ERROR");
            odd.pool = "pool \"quoted\" \\ and\nnew line".into();
            series.set_members(&cluster(name), lb, vec![odd, member("m-a", "ACTIVE")]);
        }
        series.set_gate(&cluster("c2"), "lb-2", Reason::Ready);
        series.member_became(&cluster("c3"), MemberVerdictKind::Stuck);
        series.hold_began(&cluster("c1"));

        let direct = crate::exposition::text(&registry).expect("encodes");
        let direct = String::from_utf8(direct).expect("UTF-8");
        assert!(
            direct.contains(r#"pool="pool \"quoted\" \\ and\nnew line""#),
            "{direct}"
        );
        assert_eq!(direct, scrape(&registry));
    }

    #[test]
    fn a_scrape_takes_the_rows_straight_and_gathers_no_sample_of_them() {
        let (series, registry) = registered();
        series.set_gate(&cluster("c1"), "lb-1", Reason::Ready);
        // Gathered, it would sort before every capo_lb_ family.
        let first = prometheus::IntCounter::new("a_first_total", "sorts first").expect("valid");
        registry.register(Box::new(first)).expect("registers once");

        let text = crate::exposition::text(&registry).expect("encodes");
        let text = String::from_utf8(text).expect("UTF-8");
        let position = |name: &str| {
            text.find(name)
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        assert!(
            position("capo_lb_gate_ready{") < position("a_first_total "),
            "{text}"
        );
    }

    #[test]
    fn a_forgotten_lb_and_cluster_leave_no_series() {
        let (series, registry) = registered();
        series.track_cluster(&cluster("c1"));
        series.set_members(&cluster("c1"), "lb-1", vec![member("m1", "ACTIVE")]);
        series.set_gate(&cluster("c1"), "lb-1", Reason::Ready);
        assert!(scrape(&registry).contains(
            r#"capo_lb_gate_ready{cluster="c1",loadbalancer="lb-1",namespace="default"} 1"#
        ));

        series.forget_lb("lb-1");
        series.forget_cluster(&cluster("c1"));
        assert_eq!(scrape(&registry), "");
    }

    #[test]
    fn a_new_reason_replaces_the_old_one_and_members_are_replaced_whole() {
        let (series, registry) = registered();
        series.set_gate(&cluster("c1"), "lb-1", Reason::MembersPending);
        series.set_gate(&cluster("c1"), "lb-1", Reason::Ready);
        series.set_members(&cluster("c1"), "lb-1", vec![member("m1", "PENDING_CREATE")]);
        series.set_members(
            &cluster("c1"),
            "lb-1",
            vec![member("m1", "ACTIVE"), member("m1", "ACTIVE")],
        );

        let text = scrape(&registry);
        assert!(!text.contains("MembersPending"), "{text}");
        assert!(text.contains(r#"reason="Ready"} 1"#), "{text}");
        assert!(!text.contains("PENDING_CREATE"), "{text}");
        assert_eq!(text.matches("capo_lb_member_state{").count(), 1, "{text}");
    }
}
