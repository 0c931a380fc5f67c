//! Prometheus' HTTP API as the dashboards' proof and its pictures read it: a query over a
//! window of time, and waiting until Prometheus is ready and has scraped the demo.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::Value;
use tokio::process::Child;

/// A span of time, in Unix seconds.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: f64,
    pub end: f64,
}

/// Prometheus' HTTP API.
pub struct PrometheusApi {
    base: String,
    http: reqwest::Client,
}

impl PrometheusApi {
    pub(crate) fn new(port: u16) -> Self {
        PrometheusApi {
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        }
    }

    pub(crate) async fn wait_ready(&self, prometheus: &mut Child) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            if let Ok(Some(status)) = prometheus.try_wait() {
                bail!("Prometheus exited at start: {status}");
            }
            let ready = self.http.get(format!("{}/-/ready", self.base)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("Prometheus was not ready within 60 s");
            }
        }
    }

    /// Waits until Prometheus holds a scrape of the demo taken after `unix` seconds.
    pub(crate) async fn wait_scraped_after(&self, unix: f64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            let latest = self
                .instant("max(timestamp(up{job=\"capo-rs\"}))")
                .await
                .ok()
                .and_then(|result| first_value(&result));
            if latest.is_some_and(|at| at >= unix) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("Prometheus did not scrape the demo within 60 s");
            }
        }
    }

    pub(crate) async fn instant(&self, query: &str) -> anyhow::Result<Vec<Value>> {
        self.get("/api/v1/query", &[("query", query.to_owned())])
            .await
    }

    /// `query` over `window` at 1 s steps: each series with its `[time, "value"]` pairs.
    pub async fn range(&self, query: &str, window: &Window) -> anyhow::Result<Vec<Value>> {
        self.get(
            "/api/v1/query_range",
            &[
                ("query", query.to_owned()),
                ("start", format!("{:.3}", window.start)),
                ("end", format!("{:.3}", window.end)),
                ("step", "1".to_owned()),
            ],
        )
        .await
    }

    async fn get(&self, path: &str, params: &[(&str, String)]) -> anyhow::Result<Vec<Value>> {
        let answer: Value = self
            .http
            .get(format!("{}{path}", self.base))
            .query(params)
            .send()
            .await?
            .json()
            .await?;
        if answer["status"] != "success" {
            bail!("Prometheus refused {params:?}: {answer}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

fn first_value(result: &[Value]) -> Option<f64> {
    result.first()?["value"][1].as_str()?.parse().ok()
}
