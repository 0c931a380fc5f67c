//! The Kubernetes client: found as kubectl finds one, named by a User-Agent, and held to
//! `--kube-api-qps` / `--kube-api-burst` as client-go's token bucket holds Cluster API's
//! controllers. kube-rs has no rate limiter of its own; its client is a tower stack, so one
//! layer in front of it waits for a slot before each request (a watch counts once, when it
//! starts, as in client-go). A failed connection says why (`unreachable`).

use std::future::Future;
use std::num::NonZeroU32;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::ManagerError;
use super::unreachable::ExplainLayer;

/// How the client talks to the API server.
#[derive(Clone, Debug)]
pub struct KubeClientOptions {
    /// Requests per second (client-go's QPS; Cluster API's default is 20).
    pub qps: f64,
    /// Requests at once before the rate applies (Cluster API's default is 30).
    pub burst: NonZeroU32,
    /// Sent as User-Agent; the API server names our field manager after its first word.
    pub user_agent: String,
    /// Counts every request sent, by verb (`capo_kube_requests_total`), when set.
    pub requests: Option<KubeRequests>,
}

/// `capo_kube_requests_total{verb}`: the requests this client sent to the API server (a
/// watch counts once, when it starts), whatever the server answered.
#[derive(Clone)]
pub struct KubeRequests(prometheus::IntCounterVec);

impl KubeRequests {
    /// The counter, registered in `registry`.
    pub fn register(registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let counter = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "capo_kube_requests_total",
                "Requests sent to the Kubernetes API server, by verb (a watch counts once).",
            ),
            &["verb"],
        )?;
        registry.register(Box::new(counter.clone()))?;
        Ok(KubeRequests(counter))
    }

    fn count<B>(&self, request: &http::Request<B>) {
        let watch = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let verb = match *request.method() {
            _ if watch => "watch",
            http::Method::GET => "get",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "other",
        };
        self.0.with_label_values(&[verb]).inc();
    }
}

impl std::fmt::Debug for KubeRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeRequests")
    }
}

impl Default for KubeClientOptions {
    fn default() -> Self {
        KubeClientOptions {
            qps: 20.0,
            burst: NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN),
            user_agent: format!("capo-rs/{}", env!("CARGO_PKG_VERSION")),
            requests: None,
        }
    }
}

/// A Kubernetes client from `kubeconfig`, or as kubectl finds one: `$KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account.
pub async fn connect(
    kubeconfig: Option<&Path>,
    options: &KubeClientOptions,
) -> Result<kube::Client, ManagerError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| ManagerError::Connect(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| ManagerError::Connect(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ManagerError::Connect(e.to_string()))?,
    };
    client(config, options)
}

/// A client for `config`, named and rate-limited as `options` say.
pub fn client(
    mut config: kube::Config,
    options: &KubeClientOptions,
) -> Result<kube::Client, ManagerError> {
    let user_agent = http::HeaderValue::from_str(&options.user_agent)
        .map_err(|e| ManagerError::Connect(format!("user agent: {e}")))?;
    config.headers.push((http::header::USER_AGENT, user_agent));
    // kube's default retries a 429, 503 or 504 up to 15 times inside the call, with backoff
    // growing to minutes: a status write to an API server whose etcd is gone (504 after 34 s)
    // would hold its worker for ten minutes, unseen. The reconcile sees the error instead:
    // counted, logged, and retried with its object's backoff (watches back off on their own).
    config.default_retry = false;
    let explain = ExplainLayer::new(&config.cluster_url.to_string());
    let builder =
        ClientBuilder::try_from(config).map_err(|e| ManagerError::Connect(e.to_string()))?;
    let layer = RateLimitLayer::new(options.qps, options.burst)?;
    let counted = tower::layer::util::Stack::new(
        tower::util::option_layer(options.requests.clone().map(CountLayer)),
        layer,
    );
    // Outermost: what leaves the client says why a connection failed.
    let stack = tower::layer::util::Stack::new(counted, explain);
    Ok(builder.with_layer(&stack).build())
}

/// Counts each request as it leaves (behind the rate limit: what the server receives).
#[derive(Clone)]
struct CountLayer(KubeRequests);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            requests: self.0.clone(),
        }
    }
}

struct Counted<S> {
    inner: S,
    requests: KubeRequests,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        self.requests.count(&request);
        self.inner.call(request)
    }
}

/// The tower layer that holds requests to a rate.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// A layer that lets `qps` requests a second through, and up to `burst` at once; an error
    /// when `qps` is not a positive finite number or is too high for the limiter.
    pub fn new(qps: f64, burst: NonZeroU32) -> Result<Self, ManagerError> {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(ManagerError::Connect(format!(
                "--kube-api-qps must be positive, not {qps}"
            )));
        }
        let period = Duration::from_secs_f64(1.0 / qps);
        let quota = Quota::with_period(period)
            .ok_or_else(|| ManagerError::Connect(format!("--kube-api-qps {qps} is too high")))?
            .allow_burst(burst);
        Ok(RateLimitLayer {
            limiter: Arc::new(RateLimiter::direct(quota)),
        })
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            waiting: None,
            admitted: false,
        }
    }
}

/// A service that takes a slot in `poll_ready` (so it works in front of kube's boxed,
/// uncloneable service) and spends it in `call`.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    admitted: bool,
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.admitted {
            if self.waiting.is_none() {
                if self.limiter.check().is_ok() {
                    self.admitted = true;
                } else {
                    let limiter = self.limiter.clone();
                    self.waiting = Some(Box::pin(async move { limiter.until_ready().await }));
                }
            }
            if let Some(waiting) = self.waiting.as_mut() {
                std::task::ready!(waiting.as_mut().poll(cx));
                self.waiting = None;
                self.admitted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.admitted = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn requests_beyond_the_burst_wait_for_the_rate() {
        let layer = RateLimitLayer::new(50.0, NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut service = tower::Layer::layer(
            &layer,
            tower::service_fn(|n: u32| async move { Ok::<u32, std::convert::Infallible>(n) }),
        );
        let started = std::time::Instant::now();
        for n in 0..15 {
            let answer = service.ready().await.map(|s| s.call(n));
            assert!(answer.is_ok());
        }
        // 5 at once, then 10 at 50/s: at least 180 ms (200 less one slot's rounding).
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(180), "{elapsed:?}");
        assert!(RateLimitLayer::new(0.0, NonZeroU32::MIN).is_err());
    }

    #[tokio::test]
    async fn every_request_is_counted_by_verb_a_watch_as_a_watch() {
        let registry = prometheus::Registry::new();
        let requests = KubeRequests::register(&registry).unwrap_or_else(|e| panic!("{e}"));
        let mut service = tower::Layer::layer(
            &CountLayer(requests),
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<(), std::convert::Infallible>(())
            }),
        );
        for (method, uri) in [
            ("GET", "/api/v1/namespaces/a/secrets/b"),
            ("GET", "/apis/g/v1/things?watch=true&resourceVersion=1"),
            ("PATCH", "/apis/g/v1/namespaces/a/things/b/status"),
            ("GET", "/apis/g/v1/things?limit=500"),
        ] {
            let request = http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap_or_else(|e| panic!("{e}"));
            let sent = service.ready().await.map(|s| s.call(request));
            assert!(sent.is_ok());
        }
        let counts: Vec<(String, u64)> = registry
            .gather()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| {
                (
                    m.get_label()[0].value().to_owned(),
                    m.get_counter().get_value() as u64,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [("get".into(), 2), ("patch".into(), 1), ("watch".into(), 1)]
        );
    }
}
