//! [`Clouds`]: the process-wide owner of sessions (one token per credential) and endpoint
//! gates (one limiter per auth URL, region and service). [`CloudClient`]: what callers hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::capabilities::Capabilities;
use super::credentials::{CloudCredentials, ResolvedCloud};
use super::error::ErrorContext;
use super::keystone::{Keystone, Tokens};
use super::limiter::{EndpointGate, GateKey, RateLimit};
use super::lookups::Lookups;
use super::metrics::ApiMetrics;
use super::path::{PathOptions, RequestPath, ServiceGates};
use super::session::{HttpSettings, SdkSession, SendError, Session, SessionScope};
use super::{CloudError, Operation, Service};

/// Tunables of OpenStack access.
#[derive(Clone, Debug)]
pub struct CloudOptions {
    /// Requests per second and burst per endpoint (`--openstack-qps`, `--openstack-burst`).
    pub rate_limit: RateLimit,
    /// Per-call limits: the request timeout, the longest wait at the gate, the retry policy.
    pub path: PathOptions,
    /// Renew a token this long before it expires (capped at a fifth of its lifetime, so a
    /// short-lived token is not renewed in a tight loop).
    pub token_renew_margin: Duration,
    /// A credential nobody used for this long loses its session (and its token renewal), so a
    /// rotated or removed Secret does not keep a token alive forever.
    pub session_idle_ttl: Duration,
    /// The CA bundle (PEM) trusted for a cloud whose Secret has no `cacert` (`--ca-certs`,
    /// as CAPO's flag of that name).
    pub default_cacert: Option<String>,
    /// Sessions kept at most (`--scope-cache-max-size`, as CAPO's): past it the one used
    /// longest ago is dropped; 0 keeps none, so every connection authenticates anew.
    pub session_cache_max: usize,
}

impl Default for CloudOptions {
    fn default() -> Self {
        CloudOptions {
            rate_limit: RateLimit::default(),
            path: PathOptions::default(),
            token_renew_margin: Duration::from_secs(300),
            session_idle_ttl: Duration::from_secs(3600),
            default_cacert: None,
            session_cache_max: 10,
        }
    }
}

/// One credential's session, opened once, dropped after `session_idle_ttl` without use.
#[derive(Default)]
struct SessionSlot {
    cell: Arc<OnceCell<Arc<SdkSession>>>,
    last_used: Option<tokio::time::Instant>,
}

/// Shared by every controller of the process.
pub struct Clouds {
    options: CloudOptions,
    metrics: ApiMetrics,
    gates: Mutex<HashMap<GateKey, Arc<EndpointGate>>>,
    sessions: Mutex<HashMap<String, SessionSlot>>,
    /// What each cloud (auth URL, region) offers, shared by its clients.
    capabilities: Mutex<HashMap<(String, String), Arc<Capabilities>>>,
    /// What each credential's names resolved to lately, shared by its clients.
    lookups: Mutex<HashMap<(String, String, String), Arc<Lookups>>>,
    cancel: CancellationToken,
}

const CONNECT: Operation = Operation::new(Service::Identity, "token_create");

impl Clouds {
    /// Registers the request path's metrics on `registry`; `cancel` stops every call in flight.
    pub fn new(
        options: CloudOptions,
        registry: &Registry,
        cancel: CancellationToken,
    ) -> Result<Arc<Self>, CloudError> {
        let metrics = ApiMetrics::register(registry)
            .map_err(|e| CloudError::Config(format!("cannot register metrics: {e}")))?;
        Ok(Arc::new(Clouds {
            options,
            metrics,
            gates: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            capabilities: Mutex::new(HashMap::new()),
            lookups: Mutex::new(HashMap::new()),
            cancel,
        }))
    }

    /// The options every client of this process is built with.
    pub fn options(&self) -> &CloudOptions {
        &self.options
    }

    /// A client for these credentials. The first call per credential authenticates; later calls
    /// reuse its token, which is renewed in the background before it expires.
    pub async fn connect(&self, credentials: &CloudCredentials) -> Result<CloudClient, CloudError> {
        let resolved = credentials.resolve()?;
        let cell = self.session_cell(&resolved.identity);
        self.forget_unused();
        let session = cell
            .get_or_try_init(|| {
                let cacert = credentials.cacert.as_deref();
                self.open_session(&resolved, cacert.or(self.options.default_cacert.as_deref()))
            })
            .await?
            .clone();
        Ok(self.client(session))
    }

    /// The cell holding the session of `identity`: kept (within the idle TTL and the cache's
    /// size), or a new one, which is not kept when the cache holds none.
    fn session_cell(&self, identity: &str) -> Arc<OnceCell<Arc<SdkSession>>> {
        let now = tokio::time::Instant::now();
        let ttl = self.options.session_idle_ttl;
        let max = self.options.session_cache_max;
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, slot| slot.last_used.is_none_or(|used| now - used < ttl));
        if max == 0 {
            return Arc::default();
        }
        let slot = sessions.entry(identity.to_owned()).or_default();
        slot.last_used = Some(now);
        let cell = slot.cell.clone();
        while sessions.len() > max {
            let oldest = sessions
                .iter()
                .filter(|(kept, _)| kept.as_str() != identity)
                .min_by_key(|(_, slot)| slot.last_used)
                .map(|(kept, _)| kept.clone());
            match oldest {
                Some(oldest) => sessions.remove(&oldest),
                None => break,
            };
        }
        cell
    }

    /// A client over any session (tests, the no-auth test stack).
    pub fn client(&self, session: Arc<dyn Session>) -> CloudClient {
        let scope = session.scope().clone();
        let gates = ServiceGates::build(|service| self.gate(&scope, service));
        CloudClient {
            path: RequestPath::new(
                session,
                Arc::new(gates),
                self.metrics.clone(),
                self.options.path.clone(),
                self.cancel.clone(),
                self.capabilities_of(&scope),
                self.lookups_of(&scope),
            ),
        }
    }

    /// Drops the gates, capabilities and lookups no client holds any more: each is keyed by
    /// what a clouds.yaml says (auth URL, region, credential), so every one ever seen would
    /// otherwise stay. What a new client needs is made again.
    fn forget_unused(&self) {
        fn held<K, V>(map: &Mutex<HashMap<K, Arc<V>>>) {
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, value| Arc::strong_count(value) > 1);
        }
        held(&self.gates);
        held(&self.capabilities);
        held(&self.lookups);
    }

    fn capabilities_of(&self, scope: &SessionScope) -> Arc<Capabilities> {
        let key = (scope.auth_url.clone(), scope.region.clone());
        let mut known = self.capabilities.lock().unwrap_or_else(|e| e.into_inner());
        known.entry(key).or_default().clone()
    }

    fn lookups_of(&self, scope: &SessionScope) -> Arc<Lookups> {
        let key = (
            scope.auth_url.clone(),
            scope.region.clone(),
            scope.identity.clone(),
        );
        let mut known = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
        known.entry(key).or_default().clone()
    }

    fn gate(&self, scope: &SessionScope, service: Service) -> Arc<EndpointGate> {
        let key = GateKey {
            auth_url: scope.auth_url.clone(),
            region: scope.region.clone(),
            service,
        };
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates
            .entry(key)
            .or_insert_with(|| Arc::new(EndpointGate::new(self.options.rate_limit)))
            .clone()
    }

    async fn open_session(
        &self,
        resolved: &ResolvedCloud,
        cacert: Option<&str>,
    ) -> Result<Arc<SdkSession>, CloudError> {
        let scope = SessionScope {
            auth_url: resolved.auth_url.clone(),
            region: resolved.region.clone(),
            identity: resolved.identity.clone(),
        };
        let gate = self.gate(&scope, Service::Identity);
        let started = tokio::time::Instant::now();
        let result = self.authenticate(resolved, cacert, &gate, scope).await;
        self.metrics
            .requests
            .with_label_values(&[CONNECT.name])
            .inc();
        self.metrics
            .duration
            .with_label_values(&[CONNECT.name])
            .observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            self.metrics
                .errors
                .with_label_values(&[CONNECT.name, error.kind()])
                .inc();
        }
        tracing::debug!(
            service = "identity",
            operation = CONNECT.name,
            auth_url = %resolved.auth_url,
            region = %resolved.region,
            status = match &result { Ok(_) => "ok", Err(e) => e.kind() },
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "openstack authentication"
        );
        result.map(Arc::new)
    }

    async fn authenticate(
        &self,
        resolved: &ResolvedCloud,
        cacert: Option<&str>,
        gate: &EndpointGate,
        scope: SessionScope,
    ) -> Result<SdkSession, CloudError> {
        let config = &resolved.config;
        if let Some(pem) = cacert {
            check_pem(pem)?;
        }
        let limits = &self.options.path;
        gate.admit(&scope.identity, limits.max_gate_wait)
            .await
            .map_err(|_| CloudError::RateLimited {
                ctx: connect_context("identity endpoint saturated; not sent".into()),
                retry_after: limits.max_gate_wait,
            })?;
        // A `cacert` path in the clouds.yaml, when the Secret brings no CA.
        let cacert_from_file = match (cacert, &config.cacert) {
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| CloudError::Config(format!("cacert {path}: {e}")))?,
            ),
            _ => None,
        };
        let http = HttpSettings {
            cacert_pem: cacert.or(cacert_from_file.as_deref()),
            verify: config.verify != Some(false),
            request_timeout: limits.request_timeout,
        }
        .client()
        .map_err(|e| CloudError::Config(e.to_string()))?;
        let keystone = Keystone::new(http.clone(), config.clone()).map_err(CloudError::Config)?;
        let tokens = tokio::select! {
            biased;
            () = self.cancel.cancelled() => {
                return Err(CloudError::Cancelled(connect_context("cancelled".into())));
            }
            outcome = tokio::time::timeout(limits.request_timeout * 2, Tokens::obtain(keystone)) => match outcome {
                Err(_) => return Err(CloudError::Transient(connect_context("Keystone did not answer in time".into()))),
                Ok(Err(error)) => return Err(connect_error(error)),
                Ok(Ok(tokens)) => tokens,
            },
        };
        let renewal =
            tokens.renew_in_background(self.options.token_renew_margin, self.cancel.child_token());
        Ok(SdkSession::new(tokens, http, scope, renewal))
    }
}

fn check_pem(pem: &str) -> Result<(), CloudError> {
    if pem.contains("-----BEGIN CERTIFICATE-----") {
        Ok(())
    } else {
        Err(CloudError::Config(
            "cacert holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ))
    }
}

fn connect_context(message: String) -> ErrorContext {
    ErrorContext {
        service: Service::Identity,
        operation: CONNECT.name.to_owned(),
        message,
    }
}

/// Keystone's refusal is terminal until someone fixes the Secret; anything else may pass.
fn connect_error(error: SendError) -> CloudError {
    match error {
        SendError::Auth(message) => CloudError::Unauthorized(connect_context(message)),
        SendError::Config(message) => CloudError::Config(message),
        other => CloudError::Transient(connect_context(other.to_string())),
    }
}

/// A client of one cloud: typed calls over the shared request path.
#[derive(Clone)]
pub struct CloudClient {
    path: RequestPath,
}

impl std::fmt::Debug for CloudClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudClient")
            .field("scope", self.path.session().scope())
            .finish_non_exhaustive()
    }
}

impl CloudClient {
    /// The same client, whose calls are also cancelled by `cancel`.
    pub fn with_cancel(&self, cancel: &CancellationToken) -> Self {
        CloudClient {
            path: self.path.with_cancel(cancel),
        }
    }

    /// The request path this client's calls go through (its session, gates and caches).
    pub fn path(&self) -> &RequestPath {
        &self.path
    }

    /// Octavia (load balancer) calls.
    pub fn octavia(&self) -> super::octavia::Octavia<'_> {
        super::octavia::Octavia::new(&self.path)
    }

    /// Neutron (network) calls.
    pub fn neutron(&self) -> super::neutron::Neutron<'_> {
        super::neutron::Neutron::new(&self.path)
    }

    /// Nova (compute) calls.
    pub fn nova(&self) -> super::nova::Nova<'_> {
        super::nova::Nova::new(&self.path)
    }

    /// Glance (image) calls.
    pub fn glance(&self) -> super::glance::Glance<'_> {
        super::glance::Glance::new(&self.path)
    }

    /// Cinder (block storage) calls.
    pub fn cinder(&self) -> super::cinder::Cinder<'_> {
        super::cinder::Cinder::new(&self.path)
    }
}
