//! The webhook server: HTTPS (rustls), serving the CRDs' conversion webhook (`/convert`,
//! `ConversionReview` v1) and validating webhooks (`/validate/<resource>`, `AdmissionReview`
//! v1) for admission rules CEL cannot express.
//!
//! Every replica serves it, leader or not, from start-up to exit: while it is down the API
//! server cannot read a v1beta1 object stored as v1beta2 (or the other way round), and
//! every such read fails. The certificate is read again whenever its files change.
//!
//! Any pod that reaches the port can call it, so nothing a caller sends may stall the
//! process (its Lease renewal and `/healthz` share the runtime) or exhaust its memory:
//! bounded TLS handshakes, header reads and requests; a cap on connections, in all and per
//! peer address; body limits per route and a budget for all the bodies held at once; and the
//! work itself (conversion, CEL) on the blocking pool, a few at a time, under a deadline.

pub mod admission;
pub mod capo_rules;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::https;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use super::https::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER};
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

/// The largest `ConversionReview` accepted. A real API server converts a whole list in one
/// review: 5,000 OpenStackMachines as it sends them (managed fields, owner, status) come to
/// 17.7 MB (tests/it/hostile.rs measures it), so this leaves room for objects 2.7 times that.
pub const MAX_CONVERSION_BODY: usize = 48 << 20;
/// The largest `AdmissionReview` accepted: an object (etcd holds at most 1.5 MiB) and its old
/// self, with room for the envelope.
pub const MAX_ADMISSION_BODY: usize = 4 << 20;
/// The request bodies held at once, in all: one whole conversion list, with room beside it.
/// The answer is about as large as the request, so the webhook's peak (about twice this)
/// stays within the Deployment's 256 MiB limit beside the controllers.
const BODY_BUDGET: usize = 64 << 20;
/// How long a request may wait for room in the body budget before it is refused (503).
const BODY_BUDGET_WAIT: Duration = Duration::from_secs(5);
/// Conversions and admission checks running at once, on the blocking pool.
const CONCURRENT_WORK: usize = 4;
/// How long a conversion or an admission check may take; the API server gives up on a
/// webhook after 30 s at most (10 s by default for admission), so later answers help nobody.
const WORK_DEADLINE: Duration = Duration::from_secs(25);

#[derive(Clone)]
struct Webhook {
    metrics: WebhookMetrics,
    validators: Arc<Validators>,
    work: Arc<Semaphore>,
}

/// The webhook routes (plain HTTP; [`serve`] puts TLS in front).
pub fn router(metrics: WebhookMetrics, validators: Validators) -> Router {
    let budget = Arc::new(Semaphore::new(BODY_BUDGET >> 10));
    let limited = |max: usize| {
        (
            DefaultBodyLimit::max(max),
            axum::middleware::from_fn_with_state((budget.clone(), max), hold_body_budget),
        )
    };
    let (convert_limit, convert_budget) = limited(MAX_CONVERSION_BODY);
    let (admission_limit, admission_budget) = limited(MAX_ADMISSION_BODY);
    Router::new()
        .route(
            capo_api::crds::CONVERT_PATH,
            post(convert)
                .route_layer(convert_budget)
                .route_layer(convert_limit),
        )
        .route(
            "/validate/{resource}",
            post(validate)
                .route_layer(admission_budget)
                .route_layer(admission_limit),
        )
        .with_state(Webhook {
            metrics,
            validators: Arc::new(validators),
            work: Arc::new(Semaphore::new(CONCURRENT_WORK)),
        })
}

/// Reserves room in the body budget for the request's body (its Content-Length, or the
/// route's limit when it names none) before the body is read, until the answer is made.
async fn hold_body_budget(
    State((budget, max)): State<(Arc<Semaphore>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if length.is_some_and(|length| length > max) {
        return refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {max} bytes"),
        );
    }
    let kib = u32::try_from(length.unwrap_or(max).min(max) / 1024 + 1).unwrap_or(u32::MAX);
    let reserved = tokio::time::timeout(BODY_BUDGET_WAIT, budget.acquire_many_owned(kib)).await;
    let Ok(Ok(_held)) = reserved else {
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many large requests at once; try again".into(),
        );
    };
    next.run(request).await
}

fn refusal(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

/// Runs `work` on the blocking pool, a few at a time, and waits at most [`WORK_DEADLINE`]
/// for it. Work that overruns keeps its slot until it ends, so runaway requests cannot pile
/// up; the runtime (Lease renewal, health, the controllers) never waits for any of it.
async fn off_the_runtime<T: Send + 'static>(
    webhook: &Webhook,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, &'static str> {
    let started = tokio::time::Instant::now();
    let slot = tokio::time::timeout(WORK_DEADLINE, webhook.work.clone().acquire_owned())
        .await
        .map_err(|_| "the webhook is busy")?
        .map_err(|_| "the webhook is stopping")?;
    let left = WORK_DEADLINE.saturating_sub(started.elapsed());
    let task = tokio::task::spawn_blocking(move || {
        let _slot: OwnedSemaphorePermit = slot;
        work()
    });
    match tokio::time::timeout(left, task).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(_)) => Err("the webhook failed on this request"),
        Err(_) => Err("the webhook ran out of time on this request"),
    }
}

async fn convert(State(webhook): State<Webhook>, body: Bytes) -> Response {
    let started = Instant::now();
    let reviewed = off_the_runtime(&webhook, move || capo_api::conversion::review_bytes(&body))
        .await
        .unwrap_or_else(capo_api::conversion::review_failed);
    let result = match &reviewed.outcome {
        Ok(converted) => {
            for (kind, count) in &converted.kinds {
                webhook
                    .metrics
                    .objects
                    .with_label_values(&[kind, &converted.to])
                    .inc_by(*count);
            }
            "success"
        }
        Err(message) => {
            tracing::warn!(%message, "conversion refused");
            "failure"
        }
    };
    webhook
        .metrics
        .duration
        .with_label_values(&["conversion", result])
        .observe(started.elapsed().as_secs_f64());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        reviewed.answer,
    )
        .into_response()
}

async fn validate(
    State(webhook): State<Webhook>,
    UrlPath(resource): UrlPath<String>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let validators = webhook.validators.clone();
    let answer = off_the_runtime(&webhook, move || {
        admission::review(&validators, &resource, &body)
    })
    .await
    .unwrap_or_else(admission::refused);
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
    let reloads = metrics.reloads.clone();
    let reloader = tokio::spawn(store.keep_reloading(
        "webhook",
        config.reload_every,
        shutdown.clone(),
        move |label| reloads.with_label_values(&[label]).inc(),
    ));
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let task = tokio::spawn(async move {
        https::accept_connections("webhook", listener, acceptor, app, shutdown).await;
        reloader.abort();
    });
    tracing::info!(address = %bound, cert_dir = %config.cert_dir.display(), "webhook server listening (/convert, /validate)");
    Ok((bound, task))
}

fn load(store: &CertificateStore, metrics: &WebhookMetrics) {
    if let Some(label) = store.reload_logged("webhook") {
        metrics.reloads.with_label_values(&[label]).inc();
    }
}
