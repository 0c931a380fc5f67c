//! The engine's Prometheus metrics (names documented in the README).

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

#[derive(Clone, Debug)]
pub struct EngineMetrics {
    /// 1 for each member's current (provisioning, operating) pair.
    pub member_state: IntGaugeVec,
    /// 1 when the LB's gate is open (verdict Ready), else 0; `reason` on the verdict gauge.
    pub gate_ready: IntGaugeVec,
    pub gate_reason: IntGaugeVec,
    /// Desired members by verdict.
    pub members_by_verdict: IntGaugeVec,
    /// Requested -> first seen ACTIVE.
    pub provisioning_seconds: HistogramVec,
    /// Upper bound of how late a transition was noticed: time since the previous poll.
    pub detection_lag_seconds: HistogramVec,
    pub stuck_total: IntCounterVec,
    pub error_total: IntCounterVec,
    pub polls_total: IntCounterVec,
    /// How late polls ran against their due time.
    pub scheduler_lag_seconds: HistogramVec,
    /// Current drift interval per cloud endpoint.
    pub drift_interval_seconds: GaugeVec,
    pub learned_windows: GaugeVec,
}

impl EngineMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let seconds = |name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        };
        let lag_buckets = vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0];
        let metrics = EngineMetrics {
            member_state: IntGaugeVec::new(
                Opts::new(
                    "capo_lb_member_state",
                    "1 for the member's current provisioning and operating status",
                ),
                &[
                    "namespace",
                    "cluster",
                    "pool",
                    "member",
                    "provisioning_status",
                    "operating_status",
                ],
            )?,
            gate_ready: IntGaugeVec::new(
                Opts::new(
                    "capo_lb_gate_ready",
                    "1 when the API load balancer gate is open (every desired member ACTIVE)",
                ),
                &["namespace", "cluster", "loadbalancer"],
            )?,
            gate_reason: IntGaugeVec::new(
                Opts::new("capo_lb_gate_reason", "1 for the gate's current reason"),
                &["namespace", "cluster", "loadbalancer", "reason"],
            )?,
            members_by_verdict: IntGaugeVec::new(
                Opts::new("capo_lb_members", "Desired members by verdict"),
                &["verdict"],
            )?,
            provisioning_seconds: seconds(
                "capo_lb_member_provisioning_seconds",
                "Time from a member's request to its first ACTIVE observation",
                vec![
                    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                ],
                &["strategy"],
            )?,
            detection_lag_seconds: seconds(
                "capo_lb_member_detection_lag_seconds",
                "Upper bound of how late a member transition was seen: time since the previous poll",
                lag_buckets.clone(),
                &["strategy"],
            )?,
            stuck_total: IntCounterVec::new(
                Opts::new(
                    "capo_lb_member_stuck_total",
                    "Members that became stuck in PENDING_*",
                ),
                &["namespace", "cluster"],
            )?,
            error_total: IntCounterVec::new(
                Opts::new("capo_lb_member_error_total", "Members seen going to ERROR"),
                &["namespace", "cluster"],
            )?,
            polls_total: IntCounterVec::new(
                Opts::new(
                    "capo_lb_polls_total",
                    "Load balancer polls by strategy, kind (urgent or drift) and result",
                ),
                &["strategy", "kind", "result"],
            )?,
            scheduler_lag_seconds: seconds(
                "capo_lb_scheduler_lag_seconds",
                "How late polls ran against their due time",
                lag_buckets,
                &["kind"],
            )?,
            drift_interval_seconds: GaugeVec::new(
                Opts::new(
                    "capo_lb_drift_interval_seconds",
                    "How often settled load balancers are re-checked",
                ),
                &["endpoint"],
            )?,
            learned_windows: GaugeVec::new(
                Opts::new(
                    "capo_lb_learned_provisioning_windows",
                    "Member creations remembered to aim polls at (used from 30)",
                ),
                &["endpoint"],
            )?,
        };
        registry.register(Box::new(metrics.member_state.clone()))?;
        registry.register(Box::new(metrics.gate_ready.clone()))?;
        registry.register(Box::new(metrics.gate_reason.clone()))?;
        registry.register(Box::new(metrics.members_by_verdict.clone()))?;
        registry.register(Box::new(metrics.provisioning_seconds.clone()))?;
        registry.register(Box::new(metrics.detection_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.stuck_total.clone()))?;
        registry.register(Box::new(metrics.error_total.clone()))?;
        registry.register(Box::new(metrics.polls_total.clone()))?;
        registry.register(Box::new(metrics.scheduler_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.drift_interval_seconds.clone()))?;
        registry.register(Box::new(metrics.learned_windows.clone()))?;
        Ok(metrics)
    }
}
