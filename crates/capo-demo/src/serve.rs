//! `/metrics` for Prometheus, in its text format, from the one registry every part of the
//! demo's manager registers on (cloud, engine, controllers).

use std::net::SocketAddr;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
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

/// Serves `registry` on `listen` until `stop` (or the server is dropped).
pub async fn metrics(
    listen: SocketAddr,
    registry: Registry,
    stop: CancellationToken,
) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move { render(&registry) }
        }),
    );
    let until = stop.clone();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(until.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the /metrics server stopped");
        }
    });
    Ok(MetricsServer {
        addr,
        stop,
        task: Some(task),
    })
}

fn render(registry: &Registry) -> axum::response::Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => ([(CONTENT_TYPE, encoder.format_type().to_owned())], body).into_response(),
        Err(error) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {error}"),
        )
            .into_response(),
    }
}
