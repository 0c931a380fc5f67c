//! The key panels drawn as PNGs from the same queries' results in Prometheus: no Grafana
//! here, so the book shows these. Gate state, members by provisioning status, and member
//! provisioning time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use serde_json::Value;

use crate::prometheus_api::{PrometheusApi, Window};

const SIZE: (u32, u32) = (960, 380);
const FONT: &str = "sans-serif";

/// Draws the pictures into `out`; returns their paths.
pub async fn draw(
    api: &PrometheusApi,
    window: &Window,
    out: &Path,
    font: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    register_font(font)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let selector = format!(
        "namespace=\"{}\", cluster=\"{}\"",
        crate::NAMESPACE,
        crate::CLUSTER
    );
    let reasons = api
        .range(
            &format!("max by (reason) (capo_lb_gate_reason{{{selector}}})"),
            window,
        )
        .await?;
    let members = api
        .range(
            &format!("sum by (provisioning_status) (capo_lb_member_state{{{selector}}})"),
            window,
        )
        .await?;
    let buckets = api
        .range(
            "sum by (le) (capo_lb_member_provisioning_seconds_bucket)",
            window,
        )
        .await?;
    let gate = out.join("gate-state.png");
    draw_gate(&series_by(&reasons, "reason"), window, &gate)?;
    let by_status = out.join("members-by-status.png");
    draw_members(
        &series_by(&members, "provisioning_status"),
        window,
        &by_status,
    )?;
    let provisioning = out.join("member-provisioning-time.png");
    draw_histogram(&last_buckets(&buckets), &provisioning)?;
    Ok(vec![gate, by_status, provisioning])
}

fn register_font(path: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| {
        format!(
            "reading the font {} (apt install fonts-dejavu-core, or pass --font)",
            path.display()
        )
    })?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT, FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a font plotters can read", path.display()))
}

/// Each series' points, `(seconds since the window's start, value)`, by one label.
pub fn series_by(result: &[Value], label: &str) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out = BTreeMap::new();
    for series in result {
        let name = series["metric"][label].as_str().unwrap_or("").to_owned();
        let points = series["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|pair| {
                let at = pair[0].as_f64()?;
                let value: f64 = pair[1].as_str()?.parse().ok()?;
                Some((at, value))
            })
            .collect();
        out.insert(name, points);
    }
    out
}

/// One point per second of the window: where a series has no sample, no member had that
/// status, so it reads 0 (a line drawn straight across the gap would say otherwise).
pub fn with_zeros(points: &[(f64, f64)], window: &Window) -> Vec<(f64, f64)> {
    let seconds = (window.end - window.start).max(0.0).floor() as usize;
    let mut out = Vec::with_capacity(seconds + 1);
    let mut known = points.iter().peekable();
    for step in 0..=seconds {
        let at = window.start + step as f64;
        while known.next_if(|(t, _)| *t < at - 0.5).is_some() {}
        let value = known
            .peek()
            .filter(|(t, _)| (*t - at).abs() <= 0.5)
            .map_or(0.0, |(_, v)| *v);
        out.push((at, value));
    }
    out
}

/// The histogram's buckets at the end: `(upper bound, members in that bucket)`.
pub fn last_buckets(result: &[Value]) -> Vec<(String, f64)> {
    let mut cumulative: Vec<(f64, String, f64)> = series_by(result, "le")
        .into_iter()
        .filter_map(|(le, points)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, le, points.last()?.1))
        })
        .collect();
    cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut previous = 0.0;
    cumulative
        .into_iter()
        .map(|(_, le, count)| {
            let in_bucket = (count - previous).max(0.0);
            previous = count;
            (le, in_bucket)
        })
        .collect()
}

fn color_of(name: &str) -> RGBColor {
    match name {
        "Ready" | "ACTIVE" => RGBColor(46, 160, 67),
        "MembersPending" | "PENDING_CREATE" | "PENDING_UPDATE" => RGBColor(230, 165, 20),
        "MembersMissing" => RGBColor(120, 160, 230),
        "MemberStuck" => RGBColor(200, 90, 200),
        "MemberError" | "ERROR" | "LoadBalancerError" => RGBColor(210, 45, 45),
        "PENDING_DELETE" => RGBColor(140, 140, 140),
        "LoadBalancerPending" => RGBColor(90, 200, 210),
        _ => RGBColor(60, 60, 60),
    }
}

fn span(window: &Window) -> f64 {
    (window.end - window.start).max(1.0)
}

fn draw_error<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow!("drawing: {error:?}")
}

/// The gate's reason over time: one coloured band per sample.
fn draw_gate(
    reasons: &BTreeMap<String, Vec<(f64, f64)>>,
    window: &Window,
    path: &Path,
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Gate state of cluster demo (capo_lb_gate_reason)",
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(20)
        // Room above the band for the legend.
        .build_cartesian_2d(0f64..span(window), 0f64..1.7f64)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("seconds into the demo")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    for (reason, points) in reasons {
        let color = color_of(reason);
        let bands = points
            .iter()
            .filter(|(_, value)| *value >= 1.0)
            .map(move |(at, _)| {
                let x = at - window.start;
                Rectangle::new([(x, 0.1), (x + 1.0, 0.9)], color.filled())
            });
        chart
            .draw_series(bands)
            .map_err(draw_error)?
            .label(reason.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    legend(&mut chart)?;
    root.present().map_err(draw_error)
}

/// Members of the cluster's pools by provisioning status over time.
fn draw_members(
    by_status: &BTreeMap<String, Vec<(f64, f64)>>,
    window: &Window,
    path: &Path,
) -> anyhow::Result<()> {
    let top = by_status
        .values()
        .flatten()
        .map(|(_, v)| *v)
        .fold(1.0, f64::max)
        + 1.0;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Load balancer members by provisioning_status (capo_lb_member_state)",
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..span(window), 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the demo")
        .y_desc("members")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    for (status, points) in by_status {
        let color = color_of(status);
        let line = with_zeros(points, window)
            .into_iter()
            .map(|(at, value)| (at - window.start, value));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(3)))
            .map_err(draw_error)?
            .label(status.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(3))
            });
    }
    legend(&mut chart)?;
    root.present().map_err(draw_error)
}

/// Members by how long they took from request to ACTIVE.
fn draw_histogram(buckets: &[(String, f64)], path: &Path) -> anyhow::Result<()> {
    let top = buckets.iter().map(|(_, n)| *n).fold(1.0, f64::max) + 1.0;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let labels: Vec<String> = buckets.iter().map(|(le, _)| format!("≤{le} s")).collect();
    let count = buckets.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Member provisioning time, request to ACTIVE (capo_lb_member_provisioning_seconds)",
            (FONT, 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(40)
        .build_cartesian_2d(0f64..count as f64, 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(count)
        .x_label_formatter(&|x| {
            let index = x.floor() as usize;
            labels.get(index).cloned().unwrap_or_default()
        })
        .y_desc("members")
        .label_style((FONT, 13))
        .draw()
        .map_err(draw_error)?;
    let bars = buckets.iter().enumerate().map(|(index, (_, members))| {
        let x = index as f64;
        Rectangle::new(
            [(x + 0.1, 0.0), (x + 0.9, *members)],
            RGBColor(70, 120, 200).filled(),
        )
    });
    chart.draw_series(bars).map_err(draw_error)?;
    root.present().map_err(draw_error)
}

type Plane = Cartesian2d<RangedCoordf64, RangedCoordf64>;

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Plane>,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gaps_in_a_series_read_as_zero() {
        let window = Window {
            start: 100.0,
            end: 104.0,
        };
        assert_eq!(
            with_zeros(&[(101.0, 2.0), (104.0, 1.0)], &window),
            [
                (100.0, 0.0),
                (101.0, 2.0),
                (102.0, 0.0),
                (103.0, 0.0),
                (104.0, 1.0)
            ]
        );
    }

    #[test]
    fn cumulative_buckets_become_counts_per_bucket_in_bound_order() {
        let result = vec![
            json!({"metric": {"le": "+Inf"}, "values": [[1.0, "4"]]}),
            json!({"metric": {"le": "5"}, "values": [[1.0, "1"], [2.0, "3"]]}),
            json!({"metric": {"le": "10"}, "values": [[2.0, "4"]]}),
        ];
        assert_eq!(
            last_buckets(&result),
            [
                ("5".to_owned(), 3.0),
                ("10".to_owned(), 1.0),
                ("+Inf".to_owned(), 0.0)
            ]
        );
    }
}
