//! Reconcile metrics under controller-runtime's names, so the CAPI dashboards people already
//! have show capo-rs's controllers too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::error::ErrorCategory;

/// How one reconcile ended, as controller-runtime labels `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    /// Done without error and with nothing to poll for (settled, paused, deleted, unreadable).
    Success,
    /// Failed, in this category; a terminal one also counts as a terminal error.
    Error(ErrorCategory),
    /// Requeued at once.
    Requeue,
    /// Requeued after a delay.
    RequeueAfter,
}

impl ReconcileResult {
    fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error(_) => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }
}

/// The reconcile metrics (controller-runtime's, `workqueue_depth`, and our load balancer
/// gate latency and member drain histograms); clones share the same series.
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    total: IntCounterVec,
    errors: IntCounterVec,
    terminal_errors: IntCounterVec,
    time: HistogramVec,
    active_workers: IntGaugeVec,
    max_concurrent: IntGaugeVec,
    gate_latency: HistogramVec,
    member_drain: Histogram,
    queue_depth: IntGaugeVec,
    /// OpenStackClusters whose new `membersAsOf` waits to be written.
    pub held_stamps: IntGauge,
    /// Objects waiting for a worker, by controller. kube-runtime's scheduler does not show its
    /// queue, so it is counted at its edges: a trigger adds its object (repeats merge, as in
    /// the scheduler), the start of the object's reconcile takes it out. Delayed requeues are
    /// not waiting, as in controller-runtime's workqueue.
    waiting: Arc<Mutex<HashMap<&'static str, HashSet<String>>>>,
}

impl ReconcileMetrics {
    /// Creates the metrics and registers them in `registry`; fails if any name is taken.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = ReconcileMetrics {
            total: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_total",
                    "Total number of reconciliations per controller",
                ),
                &["controller", "result"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_reconcile_errors_total",
                    "Total number of reconciliation errors per controller",
                ),
                &["controller"],
            )?,
            terminal_errors: IntCounterVec::new(
                Opts::new(
                    "controller_runtime_terminal_reconcile_errors_total",
                    "Total number of terminal reconciliation errors per controller",
                ),
                &["controller"],
            )?,
            time: HistogramVec::new(
                HistogramOpts::new(
                    "controller_runtime_reconcile_time_seconds",
                    "Length of time per reconciliation per controller",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ]),
                &["controller"],
            )?,
            active_workers: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_active_workers",
                    "Number of currently used workers per controller",
                ),
                &["controller"],
            )?,
            max_concurrent: IntGaugeVec::new(
                Opts::new(
                    "controller_runtime_max_concurrent_reconciles",
                    "Maximum number of concurrent reconciles per controller",
                ),
                &["controller"],
            )?,
            gate_latency: HistogramVec::new(
                HistogramOpts::new(
                    "capo_lb_gate_condition_latency_seconds",
                    "From the membership engine's observation of a verdict change to the \
                     OpenStackCluster's APIServerLoadBalancerReady condition written",
                )
                .buckets(vec![
                    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
                &["pass"],
            )?,
            member_drain: Histogram::with_opts(
                HistogramOpts::new(
                    "capo_lb_member_drain_seconds",
                    "How long a leaving control-plane member took new connections no more \
                     (weight 0) before it was deleted",
                )
                .buckets(vec![
                    1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
                ]),
            )?,
            queue_depth: IntGaugeVec::new(
                Opts::new(
                    "workqueue_depth",
                    "Objects waiting for a worker per controller",
                ),
                &["controller", "name"],
            )?,
            held_stamps: IntGauge::with_opts(Opts::new(
                "capo_lb_members_as_of_held",
                "OpenStackClusters whose new membersAsOf stamp waits to be written (alone, it \
                 waits 60 s; a graceful stop writes it)",
            ))?,
            waiting: Arc::default(),
        };
        registry.register(Box::new(metrics.held_stamps.clone()))?;
        registry.register(Box::new(metrics.queue_depth.clone()))?;
        registry.register(Box::new(metrics.gate_latency.clone()))?;
        registry.register(Box::new(metrics.member_drain.clone()))?;
        registry.register(Box::new(metrics.total.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        registry.register(Box::new(metrics.terminal_errors.clone()))?;
        registry.register(Box::new(metrics.time.clone()))?;
        registry.register(Box::new(metrics.active_workers.clone()))?;
        registry.register(Box::new(metrics.max_concurrent.clone()))?;
        Ok(metrics)
    }

    /// A verdict the engine observed at `observed` is now written on its cluster, by a pass
    /// of this kind (`gate`: the gate only; `complete`: over every cloud resource too).
    pub fn gate_written(&self, observed: std::time::Instant, pass: &str) {
        self.gate_latency
            .with_label_values(&[pass])
            .observe(observed.elapsed().as_secs_f64());
    }

    /// A drained member is being deleted, `drained` after its weight went to 0.
    pub fn member_drained(&self, drained: std::time::Duration) {
        self.member_drain.observe(drained.as_secs_f64());
    }

    /// A controller starts with this many workers.
    pub fn controller_started(&self, controller: &'static str, concurrency: usize) {
        self.max_concurrent
            .with_label_values(&[controller])
            .set(i64::try_from(concurrency).unwrap_or(i64::MAX));
        self.update_waiting(controller, |_| {});
        // Every series from zero, as controller-runtime starts them: the first error is then
        // an increase Prometheus sees, and dashboards show zero rather than nothing.
        for result in ["success", "error", "requeue", "requeue_after"] {
            self.total.with_label_values(&[controller, result]);
        }
        self.errors.with_label_values(&[controller]);
        self.terminal_errors.with_label_values(&[controller]);
        self.active_workers.with_label_values(&[controller]);
    }

    /// A trigger handed `controller` the object `key` (`<controller>/<namespace>/<name>`).
    pub fn queued(&self, controller: &'static str, key: String) {
        self.update_waiting(controller, |waiting| {
            waiting.insert(key);
        });
    }

    /// The object `key` left `controller`'s queue without a reconcile (it was gone).
    pub fn unqueued(&self, controller: &'static str, key: &str) {
        self.update_waiting(controller, |waiting| {
            waiting.remove(key);
        });
    }

    fn update_waiting(&self, controller: &'static str, change: impl FnOnce(&mut HashSet<String>)) {
        let mut all = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = all.entry(controller).or_default();
        change(waiting);
        self.queue_depth
            .with_label_values(&[controller, controller])
            .set(i64::try_from(waiting.len()).unwrap_or(i64::MAX));
    }

    /// The reconcile of the object `key` begins; finish it with [`Reconciling::finish`].
    /// Dropped unfinished (a cancelled or panicking reconcile), it still frees its worker.
    pub fn reconciling(&self, controller: &'static str, key: &str) -> Reconciling {
        self.unqueued(controller, key);
        self.active_workers.with_label_values(&[controller]).inc();
        Reconciling {
            metrics: self.clone(),
            controller,
            started: Instant::now(),
            finished: false,
        }
    }
}

/// One reconcile in progress.
pub struct Reconciling {
    metrics: ReconcileMetrics,
    controller: &'static str,
    started: Instant,
    finished: bool,
}

impl Reconciling {
    /// Records how the reconcile ended: its time, its `result`, any error (terminal or
    /// not); frees its worker.
    pub fn finish(mut self, result: ReconcileResult) {
        self.finished = true;
        let m = &self.metrics;
        let controller = [self.controller];
        m.active_workers.with_label_values(&controller).dec();
        m.time
            .with_label_values(&controller)
            .observe(self.started.elapsed().as_secs_f64());
        m.total
            .with_label_values(&[self.controller, result.label()])
            .inc();
        if let ReconcileResult::Error(category) = result {
            m.errors.with_label_values(&controller).inc();
            if category.is_terminal() {
                m.terminal_errors.with_label_values(&controller).inc();
            }
        }
    }
}

impl Drop for Reconciling {
    fn drop(&mut self) {
        if !self.finished {
            self.metrics
                .active_workers
                .with_label_values(&[self.controller])
                .dec();
        }
    }
}

/// The sum over the series of metric `name` on `registry` whose labels include all of
/// `labels`: counters and gauges by value, histograms by sample count. For the demo's and the
/// benchmarks' own reading of the process's metrics.
pub fn value(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        .map(|m| {
            m.get_counter().get_value()
                + m.get_gauge().get_value()
                + m.get_histogram().get_sample_count() as f64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_depth_counts_each_waiting_object_once_until_its_reconcile_starts() {
        let registry = Registry::new();
        let metrics = ReconcileMetrics::register(&registry).unwrap();
        let depth = [
            ("controller", "openstackmachine"),
            ("name", "openstackmachine"),
        ];
        metrics.controller_started("openstackmachine", 10);
        assert_eq!(value(&registry, "workqueue_depth", &depth), 0.0);
        for key in ["m/ns/a", "m/ns/b", "m/ns/a"] {
            metrics.queued("openstackmachine", key.to_owned());
        }
        assert_eq!(
            value(&registry, "workqueue_depth", &depth),
            2.0,
            "two triggers of one object are one reconcile"
        );
        let started = metrics.reconciling("openstackmachine", "m/ns/a");
        metrics.unqueued("openstackmachine", "m/ns/b");
        assert_eq!(value(&registry, "workqueue_depth", &depth), 0.0);
        metrics.queued("openstackmachine", "m/ns/a".to_owned());
        assert_eq!(
            value(&registry, "workqueue_depth", &depth),
            1.0,
            "a trigger during its reconcile waits for the next one"
        );
        started.finish(ReconcileResult::Success);
    }

    #[test]
    fn reconciles_are_counted_under_controller_runtimes_names() {
        let registry = Registry::new();
        let metrics = ReconcileMetrics::register(&registry).unwrap();
        metrics.controller_started("openstackserver", 10);
        let first = metrics.reconciling("openstackserver", "openstackserver/ns/a");
        let second = metrics.reconciling("openstackserver", "openstackserver/ns/b");
        let workers = [("controller", "openstackserver")];
        assert_eq!(
            value(&registry, "controller_runtime_active_workers", &workers),
            2.0
        );
        first.finish(ReconcileResult::Success);
        second.finish(ReconcileResult::Error(ErrorCategory::InvalidSpec));
        let cancelled = metrics.reconciling("openstackserver", "openstackserver/ns/c");
        drop(cancelled);
        assert_eq!(
            value(&registry, "controller_runtime_active_workers", &workers),
            0.0,
            "finished and dropped reconciles free their workers"
        );
        let by = |result| [("controller", "openstackserver"), ("result", result)];
        assert_eq!(
            value(
                &registry,
                "controller_runtime_reconcile_total",
                &by("success")
            ),
            1.0
        );
        assert_eq!(
            value(
                &registry,
                "controller_runtime_reconcile_total",
                &by("error")
            ),
            1.0
        );
        assert_eq!(
            value(
                &registry,
                "controller_runtime_reconcile_errors_total",
                &workers
            ),
            1.0
        );
        assert_eq!(
            value(
                &registry,
                "controller_runtime_terminal_reconcile_errors_total",
                &workers
            ),
            1.0
        );
        assert_eq!(
            value(
                &registry,
                "controller_runtime_reconcile_time_seconds",
                &workers
            ),
            2.0
        );
        assert_eq!(
            value(
                &registry,
                "controller_runtime_max_concurrent_reconciles",
                &workers
            ),
            10.0
        );
    }
}
