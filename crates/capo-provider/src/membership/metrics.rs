//! The engine's Prometheus metrics (names documented in docs/metrics.md). Label sets are built
//! here and only here: the engine calls typed methods.

use std::time::Duration;

use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};
use tokio::time::Instant;

use super::model::ObjectName;
use super::series::{LbSeries, MemberRow};
use super::verdict::{MemberVerdictKind, Reason};

/// The membership engine's Prometheus metrics, registered once per engine.
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    /// The series that grow with the clusters: each member's state, each LB's gate
    /// (`capo_lb_gate_ready`, `capo_lb_gate_reason`) and each cluster's counters of stuck,
    /// ERROR and not-serving members and of holds.
    series: LbSeries,
    /// Desired members by verdict.
    pub members_by_verdict: IntGaugeVec,
    /// Requested -> first seen ACTIVE.
    pub provisioning_seconds: HistogramVec,
    /// Upper bound of how late a transition was noticed: time since the previous poll.
    pub detection_lag_seconds: HistogramVec,
    /// Polls by observer (`strategy`), kind and result (`ok`, or the cloud error's kind).
    pub polls_total: IntCounterVec,
    /// How late polls ran against their due time.
    pub scheduler_lag_seconds: HistogramVec,
    /// Current drift interval per cloud endpoint.
    pub drift_interval_seconds: GaugeVec,
    /// Member provisioning windows each endpoint remembers (polls aim at them from 30 on).
    pub learned_windows: GaugeVec,
    /// LB lists per endpoint by state (`working`, `untried`, `unavailable`: refused or
    /// failing, its LBs polled on their own).
    pub lists: IntGaugeVec,
    /// Panics caught in the engine's tasks (`task`: `poll` or `loop`).
    pub panics_total: IntCounterVec,
    /// Change subscribers that fell behind and were told to re-sync.
    pub change_resyncs_total: IntCounter,
    /// Seconds gates held rollouts, by the reason that held them.
    pub gate_held_seconds: CounterVec,
    /// How long each finished hold lasted.
    pub gate_hold_duration: Histogram,
}

impl EngineMetrics {
    /// Creates every engine metric and registers it in `registry`; an error if one is already
    /// registered there.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let seconds = |name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        };
        let lag_buckets = vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0];
        let metrics = EngineMetrics {
            series: LbSeries::new()?,
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
            lists: IntGaugeVec::new(
                Opts::new(
                    "capo_lb_lists",
                    "Load balancer lists the engine reads, by state (unavailable: refused or failing; its load balancers are polled one by one)",
                ),
                &["endpoint", "state"],
            )?,
            learned_windows: GaugeVec::new(
                Opts::new(
                    "capo_lb_learned_provisioning_windows",
                    "Member creations remembered to aim polls at (used from 30)",
                ),
                &["endpoint"],
            )?,
            panics_total: IntCounterVec::new(
                Opts::new(
                    "capo_lb_engine_panics_total",
                    "Panics caught in the membership engine's tasks; the task is restarted",
                ),
                &["endpoint", "task"],
            )?,
            change_resyncs_total: IntCounter::new(
                "capo_lb_change_resyncs_total",
                "Times a change subscriber fell behind and was told to re-sync everything",
            )?,
            gate_held_seconds: CounterVec::new(
                Opts::new(
                    "capo_lb_gate_held_seconds_total",
                    "Seconds API load balancer gates held rollouts, by the reason that held them",
                ),
                &["reason"],
            )?,
            gate_hold_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "capo_lb_gate_hold_duration_seconds",
                    "How long each finished hold of an API load balancer gate lasted",
                )
                .buckets(vec![
                    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                ]),
            )?,
        };
        for kind in MemberVerdictKind::ALL {
            metrics
                .members_by_verdict
                .with_label_values(&[kind.as_str()]);
        }
        // Every reason that holds has a series from the start, so that `increase` sees its
        // first seconds too.
        for reason in Reason::ALL.into_iter().filter(|r| r.holds()) {
            metrics
                .gate_held_seconds
                .with_label_values(&[reason.as_str()]);
        }
        registry.register(Box::new(metrics.series.clone()))?;
        registry.register(Box::new(metrics.members_by_verdict.clone()))?;
        registry.register(Box::new(metrics.provisioning_seconds.clone()))?;
        registry.register(Box::new(metrics.detection_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.polls_total.clone()))?;
        registry.register(Box::new(metrics.scheduler_lag_seconds.clone()))?;
        registry.register(Box::new(metrics.drift_interval_seconds.clone()))?;
        registry.register(Box::new(metrics.learned_windows.clone()))?;
        registry.register(Box::new(metrics.lists.clone()))?;
        registry.register(Box::new(metrics.panics_total.clone()))?;
        registry.register(Box::new(metrics.change_resyncs_total.clone()))?;
        registry.register(Box::new(metrics.gate_held_seconds.clone()))?;
        registry.register(Box::new(metrics.gate_hold_duration.clone()))?;
        Ok(metrics)
    }

    /// The gate gauges of one LB: ready, and its reason (the previous reason's series goes).
    pub(crate) fn set_gate(&self, cluster: &ObjectName, lb: &str, reason: Reason) {
        self.series.set_gate(cluster, lb, reason);
    }

    /// A cluster's LB is tracked: its counters start at zero, so that the first stuck or
    /// ERROR member is an increase Prometheus can see.
    pub(crate) fn track_cluster(&self, cluster: &ObjectName) {
        self.series.track_cluster(cluster);
    }

    /// Counts what a [`GateClock`] measured.
    pub(crate) fn gate_time(&self, cluster: &ObjectName, time: &GateTime) {
        if let Some((reason, held)) = time.held {
            self.gate_held_seconds
                .with_label_values(&[reason.as_str()])
                .inc_by(held.as_secs_f64());
        }
        if time.hold_began {
            self.series.hold_began(cluster);
        }
        if let Some(lasted) = time.hold_ended {
            self.gate_hold_duration.observe(lasted.as_secs_f64());
        }
    }

    /// An LB is no longer tracked: its gate and member series go, and its cluster's
    /// counters.
    pub(crate) fn forget_lb(&self, cluster: &ObjectName, lb: &str) {
        self.series.forget_lb(lb);
        self.series.forget_cluster(cluster);
    }

    /// The members of `lb` now read `members`; the series of those no longer there go.
    pub(crate) fn set_members(&self, cluster: &ObjectName, lb: &str, members: Vec<MemberRow>) {
        self.series.set_members(cluster, lb, members);
    }

    /// A member's verdict became `kind`: counts the ones people are paged for.
    pub(crate) fn member_became(&self, cluster: &ObjectName, kind: MemberVerdictKind) {
        self.series.member_became(cluster, kind);
    }

    pub(crate) fn add_members_by_verdict(&self, kind: MemberVerdictKind, delta: i64) {
        if delta != 0 {
            self.members_by_verdict
                .with_label_values(&[kind.as_str()])
                .add(delta);
        }
    }

    pub(crate) fn member_active(&self, observer: &str, took: Duration, lag: Option<Duration>) {
        self.provisioning_seconds
            .with_label_values(&[observer])
            .observe(took.as_secs_f64());
        if let Some(lag) = lag {
            self.detection_lag_seconds
                .with_label_values(&[observer])
                .observe(lag.as_secs_f64());
        }
    }

    pub(crate) fn poll_started(&self, kind: PollKind, lag: Duration) {
        self.scheduler_lag_seconds
            .with_label_values(&[kind.as_str()])
            .observe(lag.as_secs_f64());
    }

    /// `result`: `ok`, or the cloud error's kind.
    pub(crate) fn poll_finished(&self, observer: &str, kind: PollKind, result: &str) {
        self.polls_total
            .with_label_values(&[observer, kind.as_str(), result])
            .inc();
    }

    pub(crate) fn endpoint_schedule(&self, endpoint: &str, drift: Duration, learned: usize) {
        self.drift_interval_seconds
            .with_label_values(&[endpoint])
            .set(drift.as_secs_f64());
        self.learned_windows
            .with_label_values(&[endpoint])
            .set(learned as f64);
    }

    /// How many of the endpoint's lists are in each state.
    pub(crate) fn endpoint_lists(&self, endpoint: &str, counts: ListCounts) {
        for (state, count) in [
            ("working", counts.working),
            ("untried", counts.untried),
            ("unavailable", counts.unavailable),
        ] {
            self.lists
                .with_label_values(&[endpoint, state])
                .set(count as i64);
        }
    }

    /// Removes an endpoint's series once its loop ends.
    pub(crate) fn clear_endpoint(&self, endpoint: &str) {
        for state in ["working", "untried", "unavailable"] {
            let _ = self.lists.remove_label_values(&[endpoint, state]);
        }
        let _ = self.drift_interval_seconds.remove_label_values(&[endpoint]);
        let _ = self.learned_windows.remove_label_values(&[endpoint]);
    }

    pub(crate) fn panicked(&self, endpoint: &str, task: EngineTask) {
        self.panics_total
            .with_label_values(&[endpoint, task.as_str()])
            .inc();
    }
}

/// An LB's gate over time: how long each reason held it, and how long each hold lasted. A
/// hold is any time the gate is closed on something known (not `Ready`, not
/// `LoadBalancerNotObserved`).
#[derive(Clone, Debug, Default)]
pub(crate) struct GateClock {
    /// The reason last seen, and when time was last counted for it.
    counted: Option<(Reason, Instant)>,
    /// When the current hold began.
    hold_began: Option<Instant>,
}

/// What a [`GateClock`] measured since its last reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct GateTime {
    /// Time held since the last reading, with the reason that held it.
    pub held: Option<(Reason, Duration)>,
    pub hold_began: bool,
    /// A hold ended after this long.
    pub hold_ended: Option<Duration>,
}

impl GateClock {
    /// The gate reads `reason` at `now`.
    pub(crate) fn advance(&mut self, reason: Reason, now: Instant) -> GateTime {
        let mut time = self.stop(now);
        match (self.hold_began, reason.holds()) {
            (None, true) => {
                self.hold_began = Some(now);
                time.hold_began = true;
            }
            (Some(began), false) => {
                self.hold_began = None;
                time.hold_ended = Some(now.saturating_duration_since(began));
            }
            _ => {}
        }
        self.counted = Some((reason, now));
        time
    }

    /// The time held up to `now` (the LB going away ends no hold: nothing reopened it).
    pub(crate) fn stop(&mut self, now: Instant) -> GateTime {
        let held = self
            .counted
            .take()
            .filter(|(reason, _)| reason.holds())
            .map(|(reason, since)| (reason, now.saturating_duration_since(since)));
        GateTime {
            held,
            ..GateTime::default()
        }
    }
}

/// LB lists of one endpoint by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListCounts {
    /// Lists whose last read answered.
    pub working: usize,
    /// Lists not read yet.
    pub untried: usize,
    /// Lists refused or failing: their LBs are polled one by one until the list is retried.
    pub unavailable: usize,
}

/// Why a poll ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollKind {
    /// Something on the LB is on its way.
    Urgent,
    /// A settled LB's periodic re-check.
    Drift,
    /// An observer that paces itself.
    Backoff,
    /// One identity's LB list (one request per 1,000 LBs).
    List,
}

impl PollKind {
    /// The `kind` label's value: `urgent`, `drift`, `backoff` or `list`.
    pub fn as_str(self) -> &'static str {
        match self {
            PollKind::Urgent => "urgent",
            PollKind::Drift => "drift",
            PollKind::Backoff => "backoff",
            PollKind::List => "list",
        }
    }
}

/// The engine's tasks, as panics are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineTask {
    /// A poll task (one LB's status tree or one LB list), `task="poll"`.
    Poll,
    /// An endpoint's loop, which picks polls and starts them, `task="loop"`.
    Loop,
}

impl EngineTask {
    /// The `task` label's value: `poll` or `loop`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineTask::Poll => "poll",
            EngineTask::Loop => "loop",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, seconds: u64) -> Instant {
        start + Duration::from_secs(seconds)
    }

    #[test]
    fn a_hold_counts_each_reason_and_its_whole_length() {
        let start = Instant::now();
        let mut clock = GateClock::default();
        let first = clock.advance(Reason::Ready, start);
        assert_eq!(first, GateTime::default(), "an open gate holds nothing");

        let began = clock.advance(Reason::MembersPending, at(start, 10));
        assert!(began.hold_began);
        assert_eq!(began.held, None, "the time before was Ready");

        let stuck = clock.advance(Reason::MemberStuck, at(start, 40));
        assert_eq!(
            stuck.held,
            Some((Reason::MembersPending, Duration::from_secs(30)))
        );
        assert!(
            !stuck.hold_began,
            "the same hold goes on under another reason"
        );

        let polled = clock.advance(Reason::MemberStuck, at(start, 45));
        assert_eq!(
            polled.held,
            Some((Reason::MemberStuck, Duration::from_secs(5)))
        );

        let open = clock.advance(Reason::Ready, at(start, 60));
        assert_eq!(
            open.held,
            Some((Reason::MemberStuck, Duration::from_secs(15)))
        );
        assert_eq!(open.hold_ended, Some(Duration::from_secs(50)));
    }

    #[test]
    fn not_observed_is_no_hold_and_a_forgotten_lb_ends_none() {
        let start = Instant::now();
        let mut clock = GateClock::default();
        assert!(!clock.advance(Reason::NotObserved, start).hold_began);
        assert_eq!(
            clock.advance(Reason::MembersMissing, at(start, 3)).held,
            None
        );
        let gone = clock.stop(at(start, 7));
        assert_eq!(
            gone.held,
            Some((Reason::MembersMissing, Duration::from_secs(4)))
        );
        assert_eq!(gone.hold_ended, None);
    }
}
