//! `capo-rs demo`: a cluster from a CAPO template, brought up and rolled on the embedded
//! simulators by the real manager, with a live view and a summary; and `capo-rs
//! prove-dashboards`, which checks the dashboards and alerts against a real Prometheus
//! scraping the demo and draws the key panels; and the other providers' ways of watching
//! members it plays against ours. Built only with the `demo` feature (on by default).

pub mod board;
pub mod pace;
pub mod pictures;
pub mod prometheus_api;
pub mod prove;
pub mod serve;
pub mod story;
pub mod strategies;
pub mod summary;
pub mod template;
pub mod view;
pub mod world;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capo_provider::manager::{self, Health};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

pub use pace::Pace;
pub use strategies::Strategy;
pub use summary::Summary;

/// The namespace and cluster the demo plays in.
pub const NAMESPACE: &str = "capo-rs-demo";
pub const CLUSTER: &str = "demo";

/// What `capo-rs demo` is told.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// How the membership engine reads members: `status-tree` (ours) or `lb-only` (trusting
    /// the load balancer's status, never the member's).
    pub strategy: Strategy,
    pub pace: Pace,
    /// Where `/metrics` is served (port 0 picks a free one).
    pub metrics_listen: SocketAddr,
    /// A real cluster's API instead of the embedded one.
    pub kubeconfig: Option<PathBuf>,
    /// Plain log lines even on a terminal.
    pub plain: bool,
}

/// Plays the story once and returns its summary; `/metrics` is served while it runs and
/// for as long as the returned [`Running`] lives.
pub async fn run(config: DemoConfig, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let started = Instant::now();
    let registry = Registry::new();
    let health = Arc::new(Health::new(&manager::CONTROLLERS));
    let metrics = serve::metrics(
        config.metrics_listen,
        registry.clone(),
        health.clone(),
        shutdown.child_token(),
    )
    .await
    .with_context(|| format!("serving /metrics on {}", config.metrics_listen))?;
    let mut view = view::View::new(config.plain, config.strategy);
    view.line(&format!(
        "capo-rs demo ({}): metrics on http://{}/metrics",
        strategy_words(config.strategy),
        metrics.addr
    ));
    let world = world::DemoWorld::start(&config, &registry, health, shutdown.child_token()).await?;
    view.line(&format!("Kubernetes: {}", world.kubernetes));
    let summary = story::play(&world, &config, &mut view, started).await;
    world.stop().await;
    let summary = summary?;
    view.finish();
    Ok(Running {
        summary,
        metrics: Arc::new(metrics),
    })
}

/// A finished story whose `/metrics` is still served.
pub struct Running {
    pub summary: Summary,
    pub metrics: Arc<serve::MetricsServer>,
}

fn strategy_words(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::LbOnly => "lb-only: trusting the load balancer's status, never the member's",
        Strategy::Provisioning => "provisioning: each member's provisioning_status, not its health",
        _ => "serving: each member ACTIVE and its health monitor reading ONLINE",
    }
}

/// How long to wait for one step of the story before giving up with an error.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(180);
