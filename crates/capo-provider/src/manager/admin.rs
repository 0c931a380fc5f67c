//! The admin HTTP server: `/healthz` and `/readyz` (from [`Health`]) for the kubelet, and
//! `/metrics` (the process's one registry: cloud, engine, controllers) only when asked for
//! plain metrics (`--insecure-metrics`, the demo); otherwise they are served over HTTPS to
//! callers the API server vouches for ([`super::metrics_server`]). Plain HTTP: the probes
//! carry nothing anyone could use.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::health::Health;

#[derive(Clone)]
struct Admin {
    registry: Registry,
    health: Arc<Health>,
}

/// Whether the admin server serves `/metrics` too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainMetrics {
    /// `/metrics` here, over plain HTTP, to anyone who reaches the port.
    Served,
    /// `/metrics` answers 404 here, saying where they are.
    Elsewhere,
}

/// The admin routes.
pub fn router(registry: Registry, health: Arc<Health>, plain: PlainMetrics) -> Router {
    let metrics_route = match plain {
        PlainMetrics::Served => get(metrics),
        PlainMetrics::Elsewhere => get(metrics_elsewhere),
    };
    Router::new()
        .route("/metrics", metrics_route)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Admin { registry, health })
}

/// Where to listen, as Go's flags write it: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every
/// address.
pub fn parse_address(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:8080 or :8080"))
}

/// Binds `address` (a clear error when it cannot) and serves until `shutdown`.
pub async fn serve(
    address: SocketAddr,
    registry: Registry,
    health: Arc<Health>,
    plain: PlainMetrics,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(address).await.map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("admin server cannot listen on {address}: {error}"),
        )
    })?;
    let bound = listener.local_addr()?;
    let app = router(registry, health, plain);
    let task = tokio::spawn(async move {
        let serving = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(error) = serving.await {
            tracing::error!(%error, "admin server stopped");
        }
    });
    let routes = match plain {
        PlainMetrics::Served => "/metrics, /healthz, /readyz",
        PlainMetrics::Elsewhere => "/healthz, /readyz",
    };
    tracing::info!(address = %bound, routes, "admin server listening");
    Ok((bound, task))
}

async fn metrics(State(admin): State<Admin>) -> Response {
    encode(&admin.registry)
}

async fn metrics_elsewhere() -> Response {
    let message = "metrics are served over HTTPS on --metrics-address to callers with a bearer \
                   token (or here with --insecure-metrics)\n";
    (StatusCode::NOT_FOUND, message).into_response()
}

/// The registry in Prometheus' text format.
pub(crate) fn encode(registry: &Registry) -> Response {
    match crate::exposition::text(registry) {
        Ok(body) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn healthz(State(admin): State<Admin>) -> Response {
    match admin.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(admin): State<Admin>) -> Response {
    match admin.health.readiness() {
        Ok(what) => (StatusCode::OK, format!("ok: {what}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_go_writes_them() {
        assert_eq!(
            parse_address(":8080"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 8080)))
        );
        assert_eq!(
            parse_address("127.0.0.1:9440"),
            Ok(SocketAddr::from(([127, 0, 0, 1], 9440)))
        );
        assert!(parse_address("[::1]:8080").is_ok());
        assert!(parse_address("localhost").is_err());
    }
}
