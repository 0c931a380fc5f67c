//! The request path's Prometheus metrics. The first three keep CAPO's names and its `request`
//! label (`<resource>_<verb>`), so dashboards and alerts written for CAPO keep working.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The request path's Prometheus metrics, registered once by `Clouds` and shared by its clients.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    /// One per logical call, retries included in the one.
    pub requests: IntCounterVec,
    /// Time from the first attempt to the final answer, limiter waits excluded.
    pub duration: HistogramVec,
    /// Calls that ended in an error. A 404 is an answer, not an error (as CAPO counts it).
    pub errors: IntCounterVec,
    /// Time spent waiting for the endpoint's rate limiter or a Retry-After pause.
    pub ratelimit_wait: HistogramVec,
    /// Attempts after the first, by reason.
    pub retries: IntCounterVec,
}

impl ApiMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = ApiMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "capo_openstack_api_requests_total",
                    "Total number of OpenStack API calls",
                ),
                &["request"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "capo_openstack_api_request_duration_seconds",
                    "Latency of an OpenStack API call",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                &["request"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "capo_openstack_api_request_errors_total",
                    "Total number of errors for an OpenStack API call",
                ),
                &["request", "error"],
            )?,
            ratelimit_wait: HistogramVec::new(
                HistogramOpts::new(
                    "capo_openstack_api_ratelimit_wait_seconds",
                    "Time a call waited for the endpoint's rate limiter or Retry-After pause",
                )
                .buckets(vec![0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0]),
                &["service"],
            )?,
            retries: IntCounterVec::new(
                Opts::new(
                    "capo_openstack_api_retries_total",
                    "Attempts of an OpenStack API call after the first",
                ),
                &["request", "reason"],
            )?,
        };
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        registry.register(Box::new(metrics.ratelimit_wait.clone()))?;
        registry.register(Box::new(metrics.retries.clone()))?;
        Ok(metrics)
    }
}
