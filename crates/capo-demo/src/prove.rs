//! `capo-rs prove-dashboards`: the dashboards and alerts checked on real data. A real
//! Prometheus (Debian's `prometheus` package) scrapes `capo-rs demo --hold` every second for
//! the whole story, evaluating our alert rules; then every query of every dashboard panel,
//! its variables filled in, must return data through Prometheus' HTTP API, the stuck and
//! ERROR alerts must have fired, `promtool check rules` and `promtool check metrics` must be
//! clean, and the key panels are drawn as PNGs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::pictures;
use crate::prometheus_api::{PrometheusApi, Window};

/// The dashboards and rules as checked in.
pub const DASHBOARDS: [(&str, &str); 3] = [
    (
        "capo-rs-rollout-gating.json",
        include_str!("../../../dashboards/capo-rs-rollout-gating.json"),
    ),
    (
        "capo-rs-openstack-api.json",
        include_str!("../../../dashboards/capo-rs-openstack-api.json"),
    ),
    (
        "capo-rs-controllers.json",
        include_str!("../../../dashboards/capo-rs-controllers.json"),
    ),
];
pub const RULES: &str = include_str!("../../../deploy/prometheus/capo-rs.rules.yaml");
/// The alerts the story must fire.
pub const MUST_FIRE: [&str; 2] = ["CapoRsLBMemberStuck", "CapoRsLBMemberError"];
/// What `$__rate_interval` stands for at a 1 s scrape interval.
const RATE_INTERVAL: &str = "10s";
const SCRAPE: &str = "1s";
/// The line `capo-rs demo --hold` starts with once its story is over; the story's exit code
/// follows as `(exit code N)`.
pub const HOLDING: &str = "capo-rs demo: holding";

#[derive(Clone, Debug)]
pub struct ProveConfig {
    /// The `capo-rs` binary to run the demo with.
    pub capo_rs: PathBuf,
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
    pub speed: f64,
    /// Where the PNGs go.
    pub pictures: PathBuf,
    /// A TrueType font for the pictures' text.
    pub font: PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct PanelQuery {
    pub dashboard: String,
    pub panel: String,
    pub expr: String,
    /// Series the query returned over the story.
    pub series: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProofReport {
    pub demo_exit_code: Option<i32>,
    pub demo_seconds: f64,
    /// The demo's summary, as it printed it.
    pub demo_summary: String,
    pub panels: usize,
    pub queries: Vec<PanelQuery>,
    pub alerts_fired: Vec<String>,
    pub rules_check: String,
    pub metrics_check: String,
    pub pictures: Vec<PathBuf>,
    /// Everything that failed; empty when the proof holds.
    pub failures: Vec<String>,
}

/// Runs the whole proof; the report says what held and what did not.
pub async fn prove(config: &ProveConfig) -> anyhow::Result<ProofReport> {
    let work = tempfile::tempdir().context("a scratch directory")?;
    let rules = work.path().join("capo-rs.rules.yaml");
    std::fs::write(&rules, RULES)?;
    let mut failures = Vec::new();
    let rules_check = promtool(&config.promtool, &["check", "rules"], Some(&rules), None).await?;
    if !rules_check.0 {
        failures.push(format!("promtool check rules: {}", rules_check.1));
    }

    let demo_port = free_port()?;
    let prometheus_port = free_port()?;
    let mut prometheus = start_prometheus(config, work.path(), &rules, demo_port, prometheus_port)?;
    let api = PrometheusApi::new(prometheus_port);
    api.wait_ready(&mut prometheus).await?;

    let started_at = unix_now();
    let demo_started = Instant::now();
    let (mut demo, demo_summary, demo_exit_code) = run_demo(config, demo_port).await?;
    let demo_seconds = demo_started.elapsed().as_secs_f64();
    // Two more scrapes after the story, so that its last state is stored.
    let ended_at = unix_now();
    api.wait_scraped_after(ended_at + 2.0).await?;

    let metrics_text = reqwest::get(format!("http://127.0.0.1:{demo_port}/metrics"))
        .await?
        .text()
        .await?;
    let metrics_check = promtool(
        &config.promtool,
        &["check", "metrics"],
        None,
        Some(&metrics_text),
    )
    .await?;
    if !metrics_check.0 || !metrics_check.1.trim().is_empty() {
        failures.push(format!("promtool check metrics: {}", metrics_check.1));
    }

    let window = Window {
        start: started_at,
        end: unix_now(),
    };
    let (panels, queries) = query_panels(&api, &window).await?;
    for query in queries.iter().filter(|q| q.series == 0) {
        failures.push(format!(
            "no data for panel {:?} of {} ({})",
            query.panel, query.dashboard, query.expr
        ));
    }
    let alerts_fired = fired_alerts(&api, &window).await?;
    for alert in MUST_FIRE {
        if !alerts_fired.iter().any(|a| a == alert) {
            failures.push(format!("alert {alert} never fired"));
        }
    }
    let pictures = pictures::draw(&api, &window, &config.pictures, &config.font).await?;
    stop(&mut demo).await;
    if demo_exit_code != Some(0) {
        failures.push(format!("the demo exited with {demo_exit_code:?}"));
    }
    stop(&mut prometheus).await;
    Ok(ProofReport {
        demo_exit_code,
        demo_seconds,
        demo_summary,
        panels,
        queries,
        alerts_fired,
        rules_check: rules_check.1,
        metrics_check: metrics_check.1,
        pictures,
        failures,
    })
}

impl ProofReport {
    pub fn render(&self) -> String {
        let proven = self.queries.iter().filter(|q| q.series > 0).count();
        let mut out = format!(
            "demo: {:.1} s, exit code {:?}\npanels: {}, panel queries: {}, with data: {}\n",
            self.demo_seconds,
            self.demo_exit_code,
            self.panels,
            self.queries.len(),
            proven
        );
        for query in &self.queries {
            out.push_str(&format!(
                "  {:>4} series  {} / {}\n",
                query.series, query.dashboard, query.panel
            ));
        }
        out.push_str(&format!("alerts fired: {}\n", self.alerts_fired.join(", ")));
        out.push_str(&format!(
            "promtool check rules: {}\npromtool check metrics: {}\n",
            self.rules_check.trim(),
            if self.metrics_check.trim().is_empty() {
                "clean"
            } else {
                self.metrics_check.trim()
            }
        ));
        for picture in &self.pictures {
            out.push_str(&format!("picture: {}\n", picture.display()));
        }
        if self.failures.is_empty() {
            out.push_str("PROVEN\n");
        } else {
            for failure in &self.failures {
                out.push_str(&format!("FAILED: {failure}\n"));
            }
        }
        out
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Runs promtool on a file or on `stdin`; (success, what it printed).
async fn promtool(
    promtool: &Path,
    args: &[&str],
    file: Option<&Path>,
    stdin: Option<&str>,
) -> anyhow::Result<(bool, String)> {
    let mut command = Command::new(promtool);
    command.args(args);
    if let Some(file) = file {
        command.arg(file);
    }
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("running {} (apt install prometheus)", promtool.display()))?;
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        input.write_all(text.as_bytes()).await?;
    }
    let output = child.wait_with_output().await?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), printed))
}

fn start_prometheus(
    config: &ProveConfig,
    work: &Path,
    rules: &Path,
    demo_port: u16,
    port: u16,
) -> anyhow::Result<Child> {
    let configuration = work.join("prometheus.yml");
    std::fs::write(
        &configuration,
        format!(
            "global:\n  scrape_interval: {SCRAPE}\n  evaluation_interval: {SCRAPE}\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: capo-rs\n    static_configs:\n      - targets: ['127.0.0.1:{demo_port}']\n",
            rules.display()
        ),
    )?;
    Command::new(&config.prometheus)
        .arg(format!("--config.file={}", configuration.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (apt install prometheus)",
                config.prometheus.display()
            )
        })
}

/// Runs `capo-rs demo --hold` until it says it holds; returns it (still serving), the summary
/// it printed and its story's exit code.
async fn run_demo(config: &ProveConfig, port: u16) -> anyhow::Result<(Child, String, Option<i32>)> {
    let mut demo = Command::new(&config.capo_rs)
        .args(["demo", "--hold", "--plain", "--metrics-port"])
        .arg(port.to_string())
        .arg("--speed")
        .arg(config.speed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} demo", config.capo_rs.display()))?;
    let stdout = demo.stdout.take().context("the demo's output")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with(HOLDING) {
                return Ok(Some(line));
            }
            printed.push(line);
        }
        Ok::<Option<String>, std::io::Error>(None)
    };
    let held = tokio::time::timeout(Duration::from_secs(600), read)
        .await
        .context("the demo did not finish its story within 10 minutes")??;
    let Some(holding) = held else {
        let code = demo.wait().await?;
        bail!(
            "the demo ended ({code}) before holding:\n{}",
            printed.join("\n")
        );
    };
    // Keep draining its output so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let summary_start = printed
        .iter()
        .rposition(|l| l.starts_with("capo-rs demo summary"))
        .unwrap_or(0);
    Ok((
        demo,
        printed[summary_start..].join("\n"),
        story_exit_code(&holding),
    ))
}

/// The `N` of `(exit code N)` in the holding line.
fn story_exit_code(holding: &str) -> Option<i32> {
    let after = holding.split("(exit code ").nth(1)?;
    after.split(')').next()?.trim().parse().ok()
}

/// Kills a child (the held demo runs until told to stop) and reaps it.
async fn stop(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill().await;
    }
}

/// Every panel's every query, variables filled in, run over the window.
async fn query_panels(
    api: &PrometheusApi,
    window: &Window,
) -> anyhow::Result<(usize, Vec<PanelQuery>)> {
    let mut panels = 0;
    let mut queries = Vec::new();
    for (file, text) in DASHBOARDS {
        let dashboard: Value =
            serde_json::from_str(text).with_context(|| format!("dashboards/{file}"))?;
        for (title, exprs) in panel_queries(&dashboard) {
            panels += 1;
            for expr in exprs {
                let filled = fill_variables(&expr);
                let series = api
                    .range(&filled, window)
                    .await
                    .with_context(|| format!("panel {title:?} of {file}"))?
                    .len();
                queries.push(PanelQuery {
                    dashboard: file.to_owned(),
                    panel: title.clone(),
                    expr: filled,
                    series,
                });
            }
        }
    }
    Ok((panels, queries))
}

/// Each panel that queries (rows and text panels do not), with its expressions; panels
/// nested in collapsed rows included.
pub fn panel_queries(dashboard: &Value) -> Vec<(String, Vec<String>)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, Vec<String>)>) {
        for panel in panels {
            let exprs: Vec<String> = panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                .collect();
            if !exprs.is_empty() {
                let title = panel["title"].as_str().unwrap_or("(untitled)").to_owned();
                out.push((title, exprs));
            }
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"]
            .as_array()
            .map_or(&[][..], Vec::as_slice),
        &mut out,
    );
    out
}

/// A panel's query as Grafana sends it with the demo's cluster selected.
pub fn fill_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${namespace}", crate::NAMESPACE)
        .replace("$namespace", crate::NAMESPACE)
        .replace("${cluster}", crate::CLUSTER)
        .replace("$cluster", crate::CLUSTER)
}

async fn fired_alerts(api: &PrometheusApi, window: &Window) -> anyhow::Result<Vec<String>> {
    let fired: BTreeSet<String> = api
        .range("ALERTS{alertstate=\"firing\"}", window)
        .await?
        .iter()
        .filter_map(|series| series["metric"]["alertname"].as_str().map(str::to_owned))
        .collect();
    Ok(fired.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dashboard_is_current_grafana_json_with_the_variables_asked_for() {
        for (file, text) in DASHBOARDS {
            let dashboard: Value = serde_json::from_str(text).unwrap();
            assert!(dashboard["schemaVersion"].as_u64() >= Some(39), "{file}");
            let variables: Vec<&str> = dashboard["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v["name"].as_str())
                .collect();
            for wanted in ["datasource", "namespace", "cluster"] {
                assert!(variables.contains(&wanted), "{file} lacks ${wanted}");
            }
            let panels = panel_queries(&dashboard);
            assert!(!panels.is_empty(), "{file}");
            for (title, exprs) in panels {
                for expr in exprs {
                    assert!(
                        !fill_variables(&expr).contains('$'),
                        "{file} / {title}: a variable the proof does not fill: {expr}"
                    );
                    assert!(!expr.contains("vector(0)"), "{file} / {title} pads: {expr}");
                }
            }
        }
    }

    #[test]
    fn the_story_exit_code_is_read_from_the_holding_line() {
        let line = format!("{HOLDING} (exit code 1); /metrics on http://127.0.0.1:1/metrics");
        assert_eq!(story_exit_code(&line), Some(1));
        assert_eq!(story_exit_code(HOLDING), None);
    }

    #[test]
    fn the_prometheus_rule_carries_the_plain_rules_file() {
        let plain: serde_json::Value = serde_saphyr::from_str(RULES).unwrap();
        let wrapped: serde_json::Value = serde_saphyr::from_str(include_str!(
            "../../../deploy/prometheus/prometheusrule.yaml"
        ))
        .unwrap();
        assert_eq!(wrapped["kind"], "PrometheusRule");
        assert_eq!(wrapped["spec"]["groups"], plain["groups"]);
        for rule in plain["groups"][0]["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert!(
                rule["annotations"]["runbook"]
                    .as_str()
                    .is_some_and(|r| !r.is_empty()),
                "{name} has no runbook line"
            );
        }
        for name in MUST_FIRE {
            assert!(RULES.contains(name), "{name}");
        }
    }
}
