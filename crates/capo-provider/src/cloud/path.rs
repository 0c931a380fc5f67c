//! The one request path: gate, send, classify, retry, measure, log.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::capabilities::Capabilities;
use super::error::{CloudError, ErrorContext, classify_response};
use super::limiter::{EndpointGate, Refused};
use super::lookups::Lookups;
use super::metrics::ApiMetrics;
use super::retry::{RetryPolicy, is_retryable};
use super::session::{SendError, Session};
use super::{Operation, Service};

/// Per-call limits of the request path.
#[derive(Clone, Debug)]
pub struct PathOptions {
    /// Longest wait for one attempt's answer (`--openstack-timeout`, 30 s by default);
    /// an attempt without one fails as `Transient`.
    pub request_timeout: Duration,
    /// Longest a call waits at the gate (limiter or Retry-After) before giving up with
    /// `RateLimited`, so a reconcile never blocks for long: it requeues instead.
    pub max_gate_wait: Duration,
    /// Which failures are retried, how many times and with what backoff.
    pub retry: RetryPolicy,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions {
            request_timeout: Duration::from_secs(30),
            max_gate_wait: Duration::from_secs(10),
            retry: RetryPolicy::default(),
        }
    }
}

/// The gates of one session's services; clients of the same endpoint share them.
#[derive(Clone, Debug)]
pub(crate) struct ServiceGates {
    pub(crate) identity: Arc<EndpointGate>,
    pub(crate) compute: Arc<EndpointGate>,
    pub(crate) network: Arc<EndpointGate>,
    pub(crate) image: Arc<EndpointGate>,
    pub(crate) load_balancer: Arc<EndpointGate>,
    pub(crate) block_storage: Arc<EndpointGate>,
}

impl ServiceGates {
    pub(crate) fn build(mut gate: impl FnMut(Service) -> Arc<EndpointGate>) -> Self {
        ServiceGates {
            identity: gate(Service::Identity),
            compute: gate(Service::Compute),
            network: gate(Service::Network),
            image: gate(Service::Image),
            load_balancer: gate(Service::LoadBalancer),
            block_storage: gate(Service::BlockStorage),
        }
    }

    pub(crate) fn get(&self, service: Service) -> &EndpointGate {
        match service {
            Service::Identity => &self.identity,
            Service::Compute => &self.compute,
            Service::Network => &self.network,
            Service::Image => &self.image,
            Service::LoadBalancer => &self.load_balancer,
            Service::BlockStorage => &self.block_storage,
        }
    }
}

/// Every OpenStack request goes through here.
#[derive(Clone)]
pub struct RequestPath {
    session: Arc<dyn Session>,
    gates: Arc<ServiceGates>,
    metrics: ApiMetrics,
    options: PathOptions,
    cancel: CancellationToken,
    call_cancel: Option<CancellationToken>,
    capabilities: Arc<Capabilities>,
    lookups: Arc<Lookups>,
}

/// One HTTP request, kept whole so it can be sent again.
struct Prepared {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Prepared {
    fn to_request(&self) -> Result<Request<Vec<u8>>, http::Error> {
        let mut builder = Request::builder()
            .method(self.method.clone())
            .uri(self.url.as_str());
        if let Some(headers) = builder.headers_mut() {
            headers.clone_from(&self.headers);
        }
        builder.body(self.body.clone())
    }
}

impl RequestPath {
    pub(crate) fn new(
        session: Arc<dyn Session>,
        gates: Arc<ServiceGates>,
        metrics: ApiMetrics,
        options: PathOptions,
        cancel: CancellationToken,
        capabilities: Arc<Capabilities>,
        lookups: Arc<Lookups>,
    ) -> Self {
        RequestPath {
            session,
            gates,
            metrics,
            options,
            cancel,
            call_cancel: None,
            capabilities,
            lookups,
        }
    }

    /// What this cloud was found to offer.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Names these credentials resolved to IDs lately.
    pub fn lookups(&self) -> &Lookups {
        &self.lookups
    }

    /// The same path, cancelled by `cancel` as well as by the client's own token.
    pub fn with_cancel(&self, cancel: &CancellationToken) -> Self {
        let mut path = self.clone();
        path.call_cancel = Some(cancel.clone());
        path
    }

    /// The session requests are sent through.
    pub fn session(&self) -> &Arc<dyn Session> {
        &self.session
    }

    pub(crate) async fn service_url(&self, op: Operation) -> Result<Url, CloudError> {
        self.session
            .service_url(op.service)
            .await
            .map_err(|e| CloudError::Config(format!("{}: {e}", op.service)))
    }

    /// Runs one logical call; on success the response status is 2xx.
    pub async fn execute(
        &self,
        op: Operation,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Response<Bytes>, CloudError> {
        let prepared = Prepared {
            method,
            url,
            headers,
            body,
        };
        let started = Instant::now();
        let (result, gate_wait) = self.attempts(op, &prepared, started).await;
        self.record(op, started.elapsed().saturating_sub(gate_wait), &result);
        result
    }

    async fn attempts(
        &self,
        op: Operation,
        prepared: &Prepared,
        started: Instant,
    ) -> (Result<Response<Bytes>, CloudError>, Duration) {
        let gate = self.gates.get(op.service);
        let policy = &self.options.retry;
        let mut gate_wait = Duration::ZERO;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.admit(op, gate).await {
                Ok(waited) => gate_wait += waited,
                Err(error) => return (Err(error), gate_wait),
            }
            let error = match self.attempt(op, prepared, attempt).await {
                Ok(response) => return (Ok(response), gate_wait),
                Err(error) => error,
            };
            if let CloudError::RateLimited { retry_after, .. } = &error {
                gate.pause_for(&self.session.scope().identity, *retry_after);
            }
            if !is_retryable(&prepared.method, &error) {
                return (Err(error), gate_wait);
            }
            let elapsed = started.elapsed();
            let delay = match &error {
                // The gate holds the next attempt for the pause.
                CloudError::RateLimited { retry_after, .. } => policy
                    .allows_pause(attempt, elapsed, *retry_after)
                    .then_some(Duration::ZERO),
                _ => policy.backoff(attempt, elapsed, fastrand::f64()),
            };
            let Some(delay) = delay else {
                return (Err(error), gate_wait);
            };
            self.metrics
                .retries
                .with_label_values(&[op.name, error.kind()])
                .inc();
            if self.cancellable(tokio::time::sleep(delay)).await.is_none() {
                return (Err(self.cancelled(op)), gate_wait);
            }
        }
    }

    async fn admit(&self, op: Operation, gate: &EndpointGate) -> Result<Duration, CloudError> {
        let admitted = self
            .cancellable(gate.admit(&self.session.scope().identity, self.options.max_gate_wait))
            .await
            .ok_or_else(|| self.cancelled(op))?;
        let waited = admitted.map_err(|refused| {
            let (retry_after, why) = match refused {
                Refused::Paused { remaining } => (remaining, "paused by the cloud's Retry-After"),
                Refused::Saturated { wait } => (wait, "client rate limit saturated"),
            };
            CloudError::RateLimited {
                ctx: context(op, format!("endpoint {why}; not sent")),
                retry_after,
            }
        })?;
        self.metrics
            .ratelimit_wait
            .with_label_values(&[op.service.as_str()])
            .observe(waited.as_secs_f64());
        Ok(waited)
    }

    /// One send, with timeout and cancellation, classified; logs one debug event.
    async fn attempt(
        &self,
        op: Operation,
        prepared: &Prepared,
        attempt: u32,
    ) -> Result<Response<Bytes>, CloudError> {
        let request = prepared
            .to_request()
            .map_err(|e| CloudError::BadRequest(context(op, e.to_string())))?;
        let sent = Instant::now();
        let sending =
            tokio::time::timeout(self.options.request_timeout, self.session.send(request));
        let outcome = match self.cancellable(sending).await {
            None => return Err(self.cancelled(op)),
            Some(Err(_elapsed)) => Err(CloudError::Transient(context(
                op,
                format!("no answer within {:?}", self.options.request_timeout),
            ))),
            Some(Ok(Err(send_error))) => Err(send_failure(op, send_error)),
            Some(Ok(Ok(response))) if response.status().is_success() => Ok(response),
            Some(Ok(Ok(response))) => Err(classify_response(
                response.status(),
                response.headers(),
                response.body(),
                op.service,
                op.name,
                SystemTime::now(),
            )),
        };
        let status = match &outcome {
            Ok(response) => response.status().as_u16().to_string(),
            Err(error) => error.kind().to_owned(),
        };
        let request_id = outcome
            .as_ref()
            .ok()
            .and_then(|response| response.headers().get("x-openstack-request-id"))
            .and_then(|id| id.to_str().ok())
            .unwrap_or_default();
        tracing::debug!(
            service = op.service.as_str(),
            operation = op.name,
            method = %prepared.method,
            path = prepared.url.path(),
            status,
            attempt,
            request_id,
            duration_ms = sent.elapsed().as_secs_f64() * 1000.0,
            "openstack request"
        );
        outcome
    }

    fn record(
        &self,
        op: Operation,
        duration: Duration,
        result: &Result<Response<Bytes>, CloudError>,
    ) {
        self.metrics.requests.with_label_values(&[op.name]).inc();
        self.metrics
            .duration
            .with_label_values(&[op.name])
            .observe(duration.as_secs_f64());
        if let Err(error) = result
            && !error.is_not_found()
        {
            self.metrics
                .errors
                .with_label_values(&[op.name, error.kind()])
                .inc();
        }
    }

    async fn cancellable<F: Future>(&self, future: F) -> Option<F::Output> {
        let call_cancelled = async {
            match &self.call_cancel {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => None,
            () = call_cancelled => None,
            output = future => Some(output),
        }
    }

    fn cancelled(&self, op: Operation) -> CloudError {
        CloudError::Cancelled(context(op, "the caller cancelled the call".into()))
    }
}

fn context(op: Operation, message: String) -> ErrorContext {
    ErrorContext {
        service: op.service,
        operation: op.name.to_owned(),
        message,
    }
}

fn send_failure(op: Operation, error: SendError) -> CloudError {
    match error {
        SendError::Auth(message) => CloudError::Unauthorized(context(op, message)),
        SendError::Config(message) => CloudError::Config(message),
        other => CloudError::Transient(context(op, other.to_string())),
    }
}

/// The request path seen through `openstack_sdk`'s client traits, for one operation, so the
/// SDK's query and pagination helpers run on our path.
pub(crate) struct OpClient<'a> {
    pub(crate) path: &'a RequestPath,
    pub(crate) op: Operation,
}

impl openstack_sdk_core::api::RestClient for OpClient<'_> {
    type Error = CloudError;

    fn get_current_project(&self) -> Option<openstack_sdk_auth_core::types::Project> {
        None
    }
}

#[async_trait]
impl openstack_sdk_core::api::AsyncClient for OpClient<'_> {
    async fn rest_async(
        &self,
        request: http::request::Builder,
        body: Vec<u8>,
    ) -> Result<Response<Bytes>, openstack_sdk_core::api::ApiError<CloudError>> {
        let method = request.method_ref().cloned().unwrap_or(Method::GET);
        let uri = request
            .uri_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let url = Url::parse(&uri)
            .map_err(|e| sdk_error(CloudError::BadRequest(context(self.op, e.to_string()))))?;
        let headers = request.headers_ref().cloned().unwrap_or_default();
        self.path
            .execute(self.op, method, url, headers, body)
            .await
            .map_err(sdk_error)
    }

    async fn rest_read_body_async(
        &self,
        _request: http::request::Builder,
        _body: openstack_sdk_core::types::BoxedAsyncRead,
    ) -> Result<Response<Bytes>, openstack_sdk_core::api::ApiError<CloudError>> {
        Err(sdk_error(unsupported(self.op)))
    }

    async fn download_async(
        &self,
        _request: http::request::Builder,
        _body: Vec<u8>,
    ) -> Result<
        (HeaderMap, openstack_sdk_core::types::BoxedAsyncRead),
        openstack_sdk_core::api::ApiError<CloudError>,
    > {
        Err(sdk_error(unsupported(self.op)))
    }

    async fn get_service_endpoint(
        &self,
        _service_type: &openstack_sdk_core::types::ServiceType,
        _version: Option<&openstack_sdk_core::types::ApiVersion>,
    ) -> Result<
        openstack_sdk_core::catalog::ServiceEndpoint,
        openstack_sdk_core::api::ApiError<CloudError>,
    > {
        let url = self.path.service_url(self.op).await.map_err(sdk_error)?;
        Ok(openstack_sdk_core::catalog::ServiceEndpoint::new(
            url,
            openstack_sdk_core::types::ApiVersion::new(2, 0),
        ))
    }
}

fn unsupported(op: Operation) -> CloudError {
    CloudError::BadRequest(context(op, "streaming bodies are not used".into()))
}

fn sdk_error(error: CloudError) -> openstack_sdk_core::api::ApiError<CloudError> {
    openstack_sdk_core::api::ApiError::Client { source: error }
}

/// Turns the SDK's error back into ours: our own errors come back out of `Client`; anything
/// else the SDK raised after a 2xx is a response we could not read.
pub(crate) fn from_sdk(
    op: Operation,
    error: openstack_sdk_core::api::ApiError<CloudError>,
) -> CloudError {
    match error {
        openstack_sdk_core::api::ApiError::Client { source } => source,
        other => CloudError::Decode(context(op, other.to_string())),
    }
}
