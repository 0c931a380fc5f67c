//! `/metrics` over HTTPS, to callers the API server vouches for ([`super::metrics_auth`]), as
//! CAPO's secure diagnostics serve them. The certificate is read from a directory (`tls.crt`,
//! `tls.key`, read again when they change) or, without one, made at start and signed by
//! itself, as controller-runtime does: Prometheus then scrapes without verifying it, the
//! token still decides who reads. The connections are bounded as the webhook's are.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::Registry;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::admin;
use super::https;
use super::metrics_auth::{Gatekeeper, Verdict};
use super::webhook::{CERT_RELOAD_PERIOD, CertificateStore, Reload};

/// How the metrics server runs.
#[derive(Clone, Debug)]
pub struct MetricsServerConfig {
    /// Where to listen.
    pub address: SocketAddr,
    /// The directory holding `tls.crt` and `tls.key`; None serves a certificate made at start.
    pub cert_dir: Option<PathBuf>,
}

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    /// The listening socket could not be bound, or its address not read.
    #[error("metrics server cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The certificate could not be made, or rustls refused the configuration.
    #[error("metrics server TLS setup: {0}")]
    Tls(String),
}

#[derive(Clone)]
struct Metrics {
    registry: Registry,
    gatekeeper: Arc<Gatekeeper>,
}

/// Binds and serves `/metrics` until `shutdown`. Returns the bound address.
pub async fn serve(
    config: MetricsServerConfig,
    registry: Registry,
    gatekeeper: Arc<Gatekeeper>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsServerError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| MetricsServerError::Tls(e.to_string()))?
        .with_no_client_auth();
    let mut reloader = None;
    let mut tls = match &config.cert_dir {
        Some(dir) => {
            let store = Arc::new(CertificateStore::new(dir, provider));
            reload(&store);
            reloader = Some(tokio::spawn(keep_reloading(
                store.clone(),
                shutdown.clone(),
            )));
            builder.with_cert_resolver(store)
        }
        None => {
            let (chain, key) = self_signed()?;
            builder
                .with_single_cert(chain, key)
                .map_err(|e| MetricsServerError::Tls(e.to_string()))?
        }
    };
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let bind_error = |source| MetricsServerError::Bind {
        address: config.address,
        source,
    };
    let listener = TcpListener::bind(config.address)
        .await
        .map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let app = router(registry, gatekeeper);
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let task = tokio::spawn(async move {
        https::accept_connections("metrics", listener, acceptor, app, shutdown).await;
        if let Some(reloader) = reloader {
            reloader.abort();
        }
    });
    tracing::info!(address = %bound, "metrics server listening (/metrics over HTTPS, TokenReview and SubjectAccessReview)");
    Ok((bound, task))
}

/// The metrics route behind the gatekeeper.
fn router(registry: Registry, gatekeeper: Arc<Gatekeeper>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(Metrics {
            registry,
            gatekeeper,
        })
}

async fn metrics(State(state): State<Metrics>, headers: HeaderMap) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match state.gatekeeper.check(authorization, "/metrics").await {
        Verdict::Allowed => admin::encode(&state.registry),
        Verdict::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            "Unauthorized: a bearer token the API server accepts is needed\n",
        )
            .into_response(),
        Verdict::Forbidden(user) => {
            tracing::debug!(%user, "refused /metrics");
            let message = format!("Forbidden: {user:?} may not get /metrics\n");
            (StatusCode::FORBIDDEN, message).into_response()
        }
        Verdict::Unavailable(why) => {
            tracing::warn!(error = %why, "cannot review a /metrics caller");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the API server could not review the caller\n",
            )
                .into_response()
        }
    }
}

/// A certificate for `localhost`, signed by itself, and its key.
fn self_signed()
-> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), MetricsServerError> {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .map_err(|e| MetricsServerError::Tls(format!("making a certificate: {e}")))?;
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    Ok((vec![made.cert.der().clone()], key.into()))
}

fn reload(store: &CertificateStore) {
    match store.reload() {
        Ok(Reload::Unchanged) => {}
        Ok(Reload::Loaded { fingerprint }) => {
            tracing::info!(%fingerprint, dir = %store.dir().display(), "metrics certificate loaded");
        }
        Err(error) => {
            tracing::warn!(%error, "metrics certificate not loaded; serving the previous one, if any");
        }
    }
}

async fn keep_reloading(store: Arc<CertificateStore>, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(CERT_RELOAD_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => reload(&store),
        }
    }
}
