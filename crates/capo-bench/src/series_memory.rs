//! `capo-rs bench series-memory`: what the engine's per-cluster and per-LB series cost, kept
//! as the engine keeps them (plain rows, `membership::series`) and as prometheus's own `*Vec`s
//! would keep the same series (how the engine kept them until issue 59). Each layout is
//! measured in a process of its own: it fills one load balancer per cluster (a gate, its
//! reason, its members, the cluster's four counters), and its resident memory grows by what
//! they cost, allocator slack included. Both layouts are scraped once, and their expositions
//! must be the same text.

use std::path::Path;

use anyhow::Context as _;
use capo_provider::membership::series::{FAMILIES, LABELS, LbSeries, MemberRow};
use capo_provider::membership::{MemberVerdictKind, ObjectName, Reason};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};

use crate::scale::proc_sample;

/// The two ways to keep the series.
pub const LAYOUTS: [&str; 2] = ["rows", "vecs"];

/// One layout's figures, as its own process measured them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LayoutFigure {
    pub layout: String,
    /// Series held (one sample each in the scrape).
    pub series: usize,
    /// Resident memory the series added, held between scrapes.
    pub bytes: u64,
    /// How far a scrape (gathering every sample, then the text) raised the peak above that.
    pub scrape_peak_bytes: u64,
    /// The scrape's size.
    pub scrape_bytes: usize,
    /// A digest of the scrape: equal across layouts when they expose the same text.
    pub scrape_digest: u64,
}

/// Measures each layout in a child process (`binary bench series-memory --layout L`) and
/// checks that both scrape the same text.
pub fn run(binary: &Path, clusters: u32, members: u32) -> anyhow::Result<Vec<LayoutFigure>> {
    let figures = LAYOUTS
        .iter()
        .map(|layout| child(binary, layout, clusters, members))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        figures
            .windows(2)
            .all(|w| w[0].scrape_digest == w[1].scrape_digest),
        "the layouts scrape differently: the comparison would not be of the same series"
    );
    Ok(figures)
}

fn child(binary: &Path, layout: &str, clusters: u32, members: u32) -> anyhow::Result<LayoutFigure> {
    let output = std::process::Command::new(binary)
        .args(["bench", "series-memory", "--layout", layout])
        .args(["--clusters", &clusters.to_string()])
        .args(["--members", &members.to_string()])
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "measuring {layout}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("reading {layout}'s figure from its output"))
}

/// In this process: fills `layout` with `clusters` LBs of `members` members each and prints
/// its report as JSON.
pub fn measure_here(layout: &str, clusters: u32, members: u32) -> anyhow::Result<String> {
    let registry = Registry::new();
    let before = proc_sample(std::process::id()).rss;
    match layout {
        "rows" => fill_rows(&registry, clusters, members)?,
        "vecs" => fill_vecs(&registry, clusters, members)?,
        other => anyhow::bail!("no layout {other}: one of {}", LAYOUTS.join(", ")),
    }
    // Sampled before anything is gathered: a scrape's samples are transient, measured apart.
    let held = proc_sample(std::process::id()).rss;
    // As `/metrics` writes it.
    let scrape = capo_provider::exposition::text(&registry)?;
    let scrape_peak = proc_sample(std::process::id()).peak_rss;
    let report = LayoutFigure {
        layout: layout.to_owned(),
        series: registry.gather().iter().map(|f| f.get_metric().len()).sum(),
        bytes: held.saturating_sub(before),
        scrape_peak_bytes: scrape_peak.saturating_sub(held),
        scrape_bytes: scrape.len(),
        scrape_digest: digest(&scrape),
    };
    Ok(serde_json::to_string(&report)?)
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Cluster `i`, its LB, and its members as the engine names them.
struct Fixture {
    cluster: ObjectName,
    lb: String,
    members: Vec<MemberRow>,
}

fn fixture(i: u32, members: u32) -> Fixture {
    let name = format!("scale-{i:04}");
    let members = (0..members)
        .map(|m| {
            let machine = format!("{name}-control-plane-{m:05}");
            MemberRow {
                pool: format!("k8s-clusterapi-cluster-default-{name}-kubeapi-6443"),
                member: format!("{machine}-6443"),
                machine,
                provisioning: "ACTIVE",
                operating: "ONLINE",
            }
        })
        .collect();
    Fixture {
        lb: format!("lb-{i:08x}-5a30-4afa-980d-000000000000"),
        cluster: ObjectName {
            namespace: "default".into(),
            name,
        },
        members,
    }
}

/// Every kind of series the engine keeps for a cluster: its gate and reason, its members, and
/// its counters, one of which has counted.
fn fill_rows(registry: &Registry, clusters: u32, members: u32) -> anyhow::Result<()> {
    let series = LbSeries::new()?;
    registry.register(Box::new(series.clone()))?;
    for i in 0..clusters {
        let f = fixture(i, members);
        series.track_cluster(&f.cluster);
        series.set_gate(&f.cluster, &f.lb, Reason::Ready);
        series.set_members(&f.cluster, &f.lb, f.members);
        series.member_became(&f.cluster, MemberVerdictKind::Stuck);
        series.hold_began(&f.cluster);
    }
    Ok(())
}

/// The same series as prometheus's `IntGaugeVec`s and `IntCounterVec`s hold them.
fn fill_vecs(registry: &Registry, clusters: u32, members: u32) -> anyhow::Result<()> {
    let opts = |i: usize| Opts::new(FAMILIES[i].0, FAMILIES[i].1);
    let gauges = (0..3)
        .map(|i| IntGaugeVec::new(opts(i), LABELS[i]))
        .collect::<prometheus::Result<Vec<_>>>()?;
    let counters = (3..7)
        .map(|i| IntCounterVec::new(opts(i), LABELS[i]))
        .collect::<prometheus::Result<Vec<_>>>()?;
    for g in &gauges {
        registry.register(Box::new(g.clone()))?;
    }
    for c in &counters {
        registry.register(Box::new(c.clone()))?;
    }
    for i in 0..clusters {
        let f = fixture(i, members);
        let (namespace, cluster) = (f.cluster.namespace.as_str(), f.cluster.name.as_str());
        for m in &f.members {
            gauges[0]
                .with_label_values(&[
                    namespace,
                    cluster,
                    &m.pool,
                    &m.member,
                    &m.machine,
                    m.provisioning,
                    m.operating,
                ])
                .set(1);
        }
        gauges[1]
            .with_label_values(&[namespace, cluster, &f.lb])
            .set(1);
        gauges[2]
            .with_label_values(&[namespace, cluster, &f.lb, Reason::Ready.as_str()])
            .set(1);
        for c in &counters {
            c.with_label_values(&[namespace, cluster]);
        }
        counters[0].with_label_values(&[namespace, cluster]).inc();
        counters[3].with_label_values(&[namespace, cluster]).inc();
    }
    Ok(())
}

/// The table `capo-rs bench series-memory` prints.
pub fn print(figures: &[LayoutFigure]) {
    println!(
        "{:<6} {:>8} {:>10} {:>12} {:>17} {:>12}",
        "layout", "series", "MiB held", "B/series", "scrape peak MiB", "scrape KiB"
    );
    for f in figures {
        println!(
            "{:<6} {:>8} {:>10.1} {:>12.0} {:>17.1} {:>12.0}",
            f.layout,
            f.series,
            f.bytes as f64 / 1_048_576.0,
            f.bytes as f64 / f.series.max(1) as f64,
            f.scrape_peak_bytes as f64 / 1_048_576.0,
            f.scrape_bytes as f64 / 1024.0,
        );
    }
    if let [rows, vecs] = figures
        && rows.bytes > 0
    {
        println!(
            "vecs / rows: {:.1}x the memory, the same scrape",
            vecs.bytes as f64 / rows.bytes as f64
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_hold_the_same_series_and_scrape_the_same_text() {
        let scrape = |layout: &str| {
            let text = measure_here(layout, 3, 2).expect("fills");
            serde_json::from_str::<LayoutFigure>(&text).expect("its report")
        };
        let (rows, vecs) = (scrape("rows"), scrape("vecs"));
        // Per cluster: 2 members, gate, reason, 4 counters.
        assert_eq!(rows.series, 3 * 8);
        assert_eq!(vecs.series, rows.series);
        assert_eq!(vecs.scrape_digest, rows.scrape_digest);
    }
}
