//! The demo's admin server: `capo-rs run`'s own (`/metrics` from the one registry every part
//! of the manager registers on, `/healthz`, `/readyz`), owned for as long as the demo holds.

use std::net::SocketAddr;
use std::sync::Arc;

use capo_provider::manager::{Health, admin};
use prometheus::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `registry` and `health` on `listen` until `stop` (or the server is dropped).
pub async fn metrics(
    listen: SocketAddr,
    registry: Registry,
    health: Arc<Health>,
    stop: CancellationToken,
) -> std::io::Result<MetricsServer> {
    let plain = admin::PlainMetrics::Served;
    let (addr, task) = admin::serve(listen, registry, health, plain, stop.clone()).await?;
    Ok(MetricsServer {
        addr,
        stop,
        task: Some(task),
    })
}
