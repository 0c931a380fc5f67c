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

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
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

/// The tower layer that holds requests to a rate, each kind of resource to its own, as
/// controller-runtime does: its client makes one REST client per kind (and the event recorder
/// another), and client-go gives each REST client a token bucket of its own at the config's
/// QPS and burst. So CAPO's `--kube-api-qps 20` lets OpenStackClusters and OpenStackMachines
/// be written at 20 a second each, not 20 between them.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultKeyedRateLimiter<String>>,
}

impl RateLimitLayer {
    /// A layer that lets `qps` requests a second through for each kind, and up to `burst` at
    /// once; an error when `qps` is not a positive finite number or is too high for the limiter.
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
            limiter: Arc::new(RateLimiter::keyed(quota)),
        })
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            limiter: self.limiter.clone(),
        }
    }
}

/// A service that waits for its request's kind's slot in the future it returns, so a kind
/// waiting for its rate holds up no other kind. The inner service (kube's, not cloneable) is
/// shared behind a lock taken only to hand it the request.
pub struct RateLimited<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    limiter: Arc<DefaultKeyedRateLimiter<String>>,
}

type Sent<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for RateLimited<S>
where
    S: tower::Service<http::Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Sent<S::Response, S::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let kind = resource_kind(request.uri().path());
        let (inner, limiter) = (self.inner.clone(), self.limiter.clone());
        Box::pin(async move {
            limiter.until_key_ready(&kind).await;
            let sent = {
                let mut service = inner.lock().await;
                tower::ServiceExt::ready(&mut *service).await?.call(request)
            };
            sent.await
        })
    }
}

/// The kind a request's path addresses, as `group/version/resource` (`v1/secrets` for the
/// core group); its status and other subresources count with it, as they do in
/// controller-runtime. Discovery and anything else share one kind.
fn resource_kind(path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group_version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => (version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return "other".to_owned(),
    };
    let resource = match rest {
        ["namespaces", _, resource, ..] => resource,
        [resource, ..] => resource,
        [] => return "other".to_owned(),
    };
    format!("{group_version}/{resource}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    fn request(method: &str, uri: &str) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn requests_beyond_a_kinds_burst_wait_for_its_rate_and_hold_up_no_other_kind() {
        let layer = RateLimitLayer::new(10.0, NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut service = tower::Layer::layer(
            &layer,
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<(), std::convert::Infallible>(())
            }),
        );
        let mut send = async |method: &str, uri: &str| {
            let sent = service.ready().await.map(|s| s.call(request(method, uri)));
            let answer = match sent {
                Ok(sent) => sent.await,
                Err(never) => match never {},
            };
            assert!(answer.is_ok());
        };
        let status =
            "/apis/infrastructure.cluster.x-k8s.io/v1beta2/namespaces/a/openstackclusters/c/status";
        let started = std::time::Instant::now();
        for _ in 0..5 {
            send("PATCH", status).await;
        }
        // That kind's burst is spent; another kind has its own, so it is answered at once.
        send("GET", "/api/v1/namespaces/a/secrets/b").await;
        let other = started.elapsed();
        assert!(other < Duration::from_millis(50), "{other:?}");
        // The first kind's next five wait for its rate: 10/s, so at least 400 ms in all.
        for _ in 0..5 {
            send("PATCH", status).await;
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
        assert!(RateLimitLayer::new(0.0, NonZeroU32::MIN).is_err());
    }

    #[test]
    fn a_request_counts_against_the_kind_it_addresses() {
        for (path, kind) in [
            ("/api/v1/namespaces/a/secrets/b", "v1/secrets"),
            ("/api/v1/namespaces/a", "v1/namespaces"),
            ("/api/v1/nodes", "v1/nodes"),
            (
                "/apis/infrastructure.cluster.x-k8s.io/v1beta1/namespaces/a/openstackmachines/m/status",
                "infrastructure.cluster.x-k8s.io/v1beta1/openstackmachines",
            ),
            (
                "/apis/events.k8s.io/v1/namespaces/a/events",
                "events.k8s.io/v1/events",
            ),
            (
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x",
                "apiextensions.k8s.io/v1/customresourcedefinitions",
            ),
            ("/apis", "other"),
            ("/version", "other"),
        ] {
            assert_eq!(resource_kind(path), kind, "{path}");
        }
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
