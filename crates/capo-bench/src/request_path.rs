//! `capo-rs bench request-path`: what the request path costs per call, without the network.
//!
//! An in-memory session answers every request at once with a recorded Octavia member, so the
//! time measured is ours alone: the gate, the SDK's request building and response unwrapping,
//! classification, metrics, the debug event (filtered out) and JSON decoding.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use tokio_util::sync::CancellationToken;
use url::Url;

use capo_provider::cloud::{
    CloudOptions, Clouds, Operation, RateLimit, SendError, Service, Session, SessionScope,
};

/// A member as Octavia 19 returns it (from `octavia-samples/member_active.json`).
const MEMBER: &str = r#"{"member":{"id":"6e628d0e-e5fe-49e0-badc-595cc6f9036c","name":"m1","operating_status":"NO_MONITOR","provisioning_status":"ACTIVE","admin_state_up":true,"address":"192.0.2.10","protocol_port":8080,"weight":1,"backup":false,"subnet_id":"187269c8-2692-4390-8ee9-89f82ab3961b","project_id":"0123456789abcdef0123456789abcdef","created_at":"2026-11-22T06:33:55","updated_at":"2026-11-22T06:33:55","monitor_address":null,"monitor_port":null,"tags":[],"vnic_type":"normal","tenant_id":"0123456789abcdef0123456789abcdef"}}"#;

struct MemorySession {
    scope: SessionScope,
    sent: std::sync::Mutex<Vec<Instant>>,
}

impl MemorySession {
    fn new() -> Self {
        MemorySession {
            scope: SessionScope {
                auth_url: "memory".into(),
                region: String::new(),
                identity: String::new(),
            },
            sent: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn sent(&self) -> Vec<Instant> {
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        sent.sort();
        sent
    }
}

#[async_trait]
impl Session for MemorySession {
    fn scope(&self) -> &SessionScope {
        &self.scope
    }

    async fn service_url(&self, service: Service) -> Result<Url, SendError> {
        Url::parse(&format!("http://memory/{service}/v2/"))
            .map_err(|e| SendError::Other(e.to_string()))
    }

    async fn send(&self, _request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError> {
        if let Ok(mut sent) = self.sent.lock() {
            sent.push(Instant::now());
        }
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Bytes::from_static(MEMBER.as_bytes()))
            .map_err(|e| SendError::Other(e.to_string()))
    }
}

/// Figures of one run.
#[derive(Debug)]
pub struct Report {
    pub calls: u32,
    /// A typed call (`get_member`) end to end, decoding included.
    pub typed_call: Duration,
    /// The request path alone (`RequestPath::execute`), no SDK and no decoding.
    pub path_only: Duration,
}

impl Report {
    pub fn print(&self) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(self.calls);
        println!(
            "request path overhead, {} calls each, no network:",
            self.calls
        );
        println!(
            "  typed call (get_member, SDK query + decode): {:8.2} us/call",
            per(self.typed_call)
        );
        println!(
            "  request path only (gate, classify, metrics): {:8.2} us/call",
            per(self.path_only)
        );
    }
}

/// Figures of a pacing run.
#[derive(Debug)]
pub struct PacingReport {
    pub requests: u32,
    pub rate_limit: RateLimit,
    pub elapsed: Duration,
    /// The most requests that arrived within any one-second window.
    pub max_in_one_second: usize,
}

impl PacingReport {
    pub fn print(&self) {
        let RateLimit { qps, burst } = self.rate_limit;
        let expected = f64::from(self.requests.saturating_sub(burst.get())) / f64::from(qps.get());
        println!(
            "{} concurrent calls through one endpoint at qps {qps}, burst {burst}:",
            self.requests
        );
        println!(
            "  elapsed {:.2} s (the limiter allows no less than {expected:.2} s)",
            self.elapsed.as_secs_f64()
        );
        println!(
            "  achieved {:.1} calls/s",
            f64::from(self.requests) / self.elapsed.as_secs_f64()
        );
        println!(
            "  most calls in any 1 s window: {} (bound: burst + qps = {})",
            self.max_in_one_second,
            burst.get() + qps.get()
        );
    }
}

/// Sends `requests` calls at once through one endpoint and records when each was sent.
pub async fn rate_limit(requests: u32, mut options: CloudOptions) -> anyhow::Result<PacingReport> {
    options.path.max_gate_wait = Duration::from_secs(3600);
    let rate_limit = options.rate_limit;
    {
        let registry = prometheus::Registry::new();
        let clouds = Clouds::new(options, &registry, CancellationToken::new())?;
        let session = Arc::new(MemorySession::new());
        let client = clouds.client(session.clone());
        let started = Instant::now();
        let calls = (0..requests).map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .octavia()
                    .get_member(
                        "96c8a8b6-8923-4c1f-bbf4-0b44750cb5e6",
                        "6e628d0e-e5fe-49e0-badc-595cc6f9036c",
                    )
                    .await
            })
        });
        for call in futures::future::join_all(calls).await {
            call??;
        }
        let elapsed = started.elapsed();
        let sent = session.sent();
        let max_in_one_second = (0..sent.len())
            .map(|i| {
                sent[i..]
                    .iter()
                    .take_while(|t| **t - sent[i] < Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0);
        Ok(PacingReport {
            requests,
            rate_limit,
            elapsed,
            max_in_one_second,
        })
    }
}

/// Runs `calls` typed calls and `calls` bare request-path calls, one after the other in one
/// task.
pub async fn run(calls: u32) -> anyhow::Result<Report> {
    {
        let mut options = CloudOptions::default();
        // Far above what we send: measure the gate's bookkeeping, not its waits.
        let unlimited = NonZeroU32::new(1_000_000_000).unwrap_or(NonZeroU32::MAX);
        options.rate_limit = RateLimit {
            qps: unlimited,
            burst: unlimited,
        };
        let registry = prometheus::Registry::new();
        let clouds = Clouds::new(options, &registry, CancellationToken::new())?;
        let client = clouds.client(Arc::new(MemorySession::new()));
        let pool = "96c8a8b6-8923-4c1f-bbf4-0b44750cb5e6";
        let member = "6e628d0e-e5fe-49e0-badc-595cc6f9036c";

        let started = Instant::now();
        for _ in 0..calls {
            client.octavia().get_member(pool, member).await?;
        }
        let typed_call = started.elapsed();

        let op = Operation::new(Service::LoadBalancer, "loadbalancer_member_get");
        let url = Url::parse(&format!(
            "http://memory/load-balancer/v2/lbaas/pools/{pool}/members/{member}"
        ))?;
        let started = Instant::now();
        for _ in 0..calls {
            client
                .path()
                .execute(op, Method::GET, url.clone(), HeaderMap::new(), Vec::new())
                .await?;
        }
        let path_only = started.elapsed();
        Ok(Report {
            calls,
            typed_call,
            path_only,
        })
    }
}
