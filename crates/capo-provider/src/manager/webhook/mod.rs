//! The webhook server: HTTPS (rustls), serving the CRDs' conversion webhook (`/convert`,
//! `ConversionReview` v1) and validating webhooks (`/validate/<resource>`, `AdmissionReview`
//! v1) for admission rules CEL cannot express.
//!
//! Every replica serves it, leader or not, from start-up to exit: while it is down the API
//! server cannot read a v1beta1 object stored as v1beta2 (or the other way round), and
//! every such read fails. The certificate is read again whenever its files change.

pub mod admission;
pub mod capo_rules;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

pub use admission::{Validator, Validators};
pub use tls::{CertificateStore, Reload};

/// How often `capo-rs run` looks at the certificate files: the kubelet refreshes a
/// Secret's volume within about a minute of a rotation, so this adds little to that.
pub const CERT_RELOAD_PERIOD: Duration = Duration::from_secs(10);

/// How the webhook server runs.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Where to listen.
    pub address: SocketAddr,
    /// The directory holding `tls.crt` and `tls.key`.
    pub cert_dir: std::path::PathBuf,
    /// How often the certificate files are looked at for a change.
    pub reload_every: Duration,
}

/// The webhook's metrics.
#[derive(Clone)]
pub struct WebhookMetrics {
    duration: HistogramVec,
    objects: IntCounterVec,
    reloads: IntCounterVec,
}

impl WebhookMetrics {
    /// Creates the webhook's request-duration histogram, converted-objects counter and
    /// certificate-loads counter, and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "capo_webhook_request_duration_seconds",
                "Time to answer one webhook request, by webhook (conversion, admission) and result (success, failure).",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1]),
            &["webhook", "result"],
        )?;
        let objects = IntCounterVec::new(
            Opts::new(
                "capo_webhook_converted_objects_total",
                "Objects converted by the conversion webhook, by kind and the version asked for.",
            ),
            &["kind", "to"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "capo_webhook_certificate_loads_total",
                "Times the serving certificate was loaded (result: loaded, error).",
            ),
            &["result"],
        )?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(objects.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        Ok(WebhookMetrics {
            duration,
            objects,
            reloads,
        })
    }
}

#[derive(Clone)]
struct Webhook {
    metrics: WebhookMetrics,
    validators: Arc<Validators>,
}

/// The webhook routes (plain HTTP; [`serve`] puts TLS in front).
pub fn router(metrics: WebhookMetrics, validators: Validators) -> Router {
    Router::new()
        .route(capo_api::crds::CONVERT_PATH, post(convert))
        .route("/validate/{resource}", post(validate))
        .with_state(Webhook {
            metrics,
            validators: Arc::new(validators),
        })
}

async fn convert(State(webhook): State<Webhook>, body: Bytes) -> Response {
    let started = Instant::now();
    let answer = match serde_json::from_slice::<Value>(&body) {
        Ok(review) => {
            let answer = capo_api::conversion::review(&review);
            count_objects(&webhook.metrics, &review, &answer);
            answer
        }
        Err(error) => json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "", "convertedObjects": [],
                         "result": {"status": "Failure", "message": format!("the request is not JSON: {error}")}},
        }),
    };
    let result = match answer["response"]["result"]["status"].as_str() {
        Some("Success") => "success",
        _ => {
            tracing::warn!(
                message = answer["response"]["result"]["message"]
                    .as_str()
                    .unwrap_or_default(),
                "conversion refused"
            );
            "failure"
        }
    };
    webhook
        .metrics
        .duration
        .with_label_values(&["conversion", result])
        .observe(started.elapsed().as_secs_f64());
    json_response(&answer)
}

fn count_objects(metrics: &WebhookMetrics, review: &Value, answer: &Value) {
    let to = review["request"]["desiredAPIVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or("");
    for object in answer["response"]["convertedObjects"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let kind = object["kind"].as_str().unwrap_or("");
        metrics.objects.with_label_values(&[kind, to]).inc();
    }
}

async fn validate(
    State(webhook): State<Webhook>,
    UrlPath(resource): UrlPath<String>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let answer = admission::review(&webhook.validators, &resource, &body);
    let result = if answer["response"]["allowed"] == true {
        "success"
    } else {
        "failure"
    };
    webhook
        .metrics
        .duration
        .with_label_values(&["admission", result])
        .observe(started.elapsed().as_secs_f64());
    json_response(&answer)
}

fn json_response(answer: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response()
}

/// Why the webhook server could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The listening socket could not be bound, or its bound address not read.
    #[error("webhook server cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for (`WebhookConfig::address`).
        address: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// rustls refused the server configuration (its safe default protocol versions with the
    /// crypto provider).
    #[error("webhook server TLS setup: {0}")]
    Tls(String),
}

/// Binds, loads the certificate (a missing one is waited for: the server answers no TLS
/// handshake until it appears) and serves until `shutdown`. Returns the bound address.
pub async fn serve(
    config: WebhookConfig,
    metrics: WebhookMetrics,
    validators: Validators,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), WebhookError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let store = Arc::new(CertificateStore::new(&config.cert_dir, provider.clone()));
    load(&store, &metrics);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| WebhookError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener =
        TcpListener::bind(config.address)
            .await
            .map_err(|source| WebhookError::Bind {
                address: config.address,
                source,
            })?;
    let bound = listener.local_addr().map_err(|source| WebhookError::Bind {
        address: config.address,
        source,
    })?;
    let app = router(metrics.clone(), validators);
    let tls_listener = TlsListener::start(listener, TlsAcceptor::from(Arc::new(tls)), &shutdown);
    let reloader = tokio::spawn(watch_certificate(
        store,
        metrics,
        config.reload_every,
        shutdown.clone(),
    ));
    let task = tokio::spawn(async move {
        let serving =
            axum::serve(tls_listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(error) = serving.await {
            tracing::error!(%error, "webhook server stopped");
        }
        reloader.abort();
    });
    tracing::info!(address = %bound, cert_dir = %config.cert_dir.display(), "webhook server listening (/convert, /validate)");
    Ok((bound, task))
}

fn load(store: &CertificateStore, metrics: &WebhookMetrics) {
    match store.reload() {
        Ok(Reload::Unchanged) => {}
        Ok(Reload::Loaded { fingerprint }) => {
            metrics.reloads.with_label_values(&["loaded"]).inc();
            tracing::info!(%fingerprint, dir = %store.dir().display(), "webhook certificate loaded");
        }
        Err(error) => {
            metrics.reloads.with_label_values(&["error"]).inc();
            tracing::warn!(%error, "webhook certificate not loaded; serving the previous one, if any");
        }
    }
}

/// Looks at the certificate files every `every` until `shutdown`.
async fn watch_certificate(
    store: Arc<CertificateStore>,
    metrics: WebhookMetrics,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => load(&store, &metrics),
        }
    }
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS connections for axum: handshakes run on their own tasks, so a slow client delays
/// nobody else.
struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn start(listener: TcpListener, acceptor: TlsAcceptor, shutdown: &CancellationToken) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (sender, ready) = mpsc::channel(64);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::debug!(%error, "webhook accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%error, %peer, "webhook TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "webhook TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The acceptor stopped (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
