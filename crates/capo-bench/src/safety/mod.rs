//! `capo-rs bench rollout-safety`: randomized whole-stack rollouts, each on its own paused
//! (virtual-time) runtime, with eight invariants checked at every write and every cloud
//! transition. Run `i` plays seed `seed + i`, so `--runs 1 --seed <that seed>` replays it.

pub mod check;
pub mod draw;
pub mod run;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Strategy;

pub use check::{Invariant, Violation};
pub use draw::Draw;
pub use run::{Outcome, RunReport};

#[derive(Clone, Debug, Serialize)]
pub struct SafetyConfig {
    pub runs: u64,
    /// The first run's seed.
    pub seed: u64,
    /// Runs played at once, one OS thread each.
    pub threads: usize,
    /// How the engine observes members: `status-tree` (production); `lb-only` trusts the
    /// load balancer as CAPO does, to show the checker catching what that breaks.
    #[serde(serialize_with = "strategy_name")]
    pub strategy: Strategy,
}

fn strategy_name<S: serde::Serializer>(strategy: &Strategy, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(strategy.as_str())
}

/// A violation, with the seed that replays it.
#[derive(Clone, Debug, Serialize)]
pub struct SeededViolation {
    pub seed: u64,
    #[serde(flatten)]
    pub violation: Violation,
}

#[derive(Clone, Debug, Serialize)]
pub struct SafetyReport {
    pub config: SafetyConfig,
    pub violations: Vec<SeededViolation>,
    pub outcomes: BTreeMap<Outcome, u64>,
    pub wall_seconds: f64,
    pub virtual_seconds: f64,
    /// The slowest run's wall time, and its seed.
    pub slowest_run: (f64, u64),
    pub cloud_requests: u64,
    pub kube_requests: u64,
    pub worst_errors_per_object_minute: f64,
    /// Runs whose draw had each kind of trouble.
    pub coverage: BTreeMap<&'static str, u64>,
    /// Seconds from a control-plane member's first ACTIVE to its machine's release, over
    /// every release: (median, count).
    pub release_wait: (f64, usize),
    /// Seconds from a leaving member's weight 0 to its being gone: (median, count).
    pub drain: (f64, usize),
    /// The longest a member passing its monitor stayed at weight 0 while nothing served, and
    /// the seed.
    pub longest_held_out: (f64, u64),
}

fn median(values: &mut [f64]) -> (f64, usize) {
    values.sort_by(f64::total_cmp);
    (
        values.get(values.len() / 2).copied().unwrap_or(0.0),
        values.len(),
    )
}

thread_local! {
    /// Panics on this thread since the last run began (every task of a run is on its thread).
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Counts panics per thread, then lets the usual hook print them.
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|panics| panics.borrow_mut().push(info.to_string()));
            previous(info);
        }));
    });
}

/// Plays one seed on a fresh paused runtime; a panic anywhere in it is a violation.
pub fn play_seed(seed: u64, strategy: Strategy) -> (RunReport, Duration) {
    count_panics();
    PANICS.with(|panics| panics.borrow_mut().clear());
    let started = Instant::now();
    let draw = Draw::from_seed(seed);
    let played = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(runtime.block_on(run::play(&draw, strategy)))
    }));
    let mut report = match played {
        Ok(Ok(report)) => report,
        Ok(Err(error)) => failed(&draw, format!("no runtime: {error}")),
        Err(_) => failed(&draw, "the run panicked".to_owned()),
    };
    for panic in PANICS.with(|panics| std::mem::take(&mut *panics.borrow_mut())) {
        report.violations.push(Violation {
            invariant: Invariant::PanicOrStorm,
            at: report.virtual_seconds,
            detail: panic,
        });
    }
    (report, started.elapsed())
}

fn failed(draw: &Draw, detail: String) -> RunReport {
    RunReport {
        draw: draw.clone(),
        outcome: Outcome::Hung,
        violations: vec![Violation {
            invariant: Invariant::PanicOrStorm,
            at: 0.0,
            detail,
        }],
        virtual_seconds: 0.0,
        cloud_requests: 0,
        kube_requests: 0,
        worst_errors_per_object_minute: 0.0,
        release_waits: Vec::new(),
        drains: Vec::new(),
        longest_held_out: 0.0,
    }
}

/// Plays every run, `threads` at a time; `progress(done, total)` after each.
pub fn run(config: &SafetyConfig, progress: &(dyn Fn(u64, u64) + Sync)) -> SafetyReport {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let results: Mutex<Vec<(RunReport, Duration)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..config.threads.max(1) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= config.runs {
                        return;
                    }
                    let played = play_seed(config.seed.wrapping_add(index), config.strategy);
                    results
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(played);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, config.runs);
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|(report, _)| report.draw.seed);
    summarize(config, &results, started.elapsed())
}

fn summarize(
    config: &SafetyConfig,
    results: &[(RunReport, Duration)],
    wall: Duration,
) -> SafetyReport {
    let mut report = SafetyReport {
        config: config.clone(),
        violations: Vec::new(),
        outcomes: BTreeMap::new(),
        wall_seconds: wall.as_secs_f64(),
        virtual_seconds: 0.0,
        slowest_run: (0.0, config.seed),
        cloud_requests: 0,
        kube_requests: 0,
        worst_errors_per_object_minute: 0.0,
        coverage: BTreeMap::new(),
        release_wait: (0.0, 0),
        drain: (0.0, 0),
        longest_held_out: (0.0, config.seed),
    };
    let mut waits = Vec::new();
    let mut drains = Vec::new();
    for (run, took) in results {
        waits.extend_from_slice(&run.release_waits);
        drains.extend_from_slice(&run.drains);
        let seed = run.draw.seed;
        *report.outcomes.entry(run.outcome).or_default() += 1;
        report
            .violations
            .extend(run.violations.iter().map(|violation| SeededViolation {
                seed,
                violation: violation.clone(),
            }));
        report.virtual_seconds += run.virtual_seconds;
        if took.as_secs_f64() > report.slowest_run.0 {
            report.slowest_run = (took.as_secs_f64(), seed);
        }
        if run.longest_held_out > report.longest_held_out.0 {
            report.longest_held_out = (run.longest_held_out, seed);
        }
        report.cloud_requests += run.cloud_requests;
        report.kube_requests += run.kube_requests;
        report.worst_errors_per_object_minute = report
            .worst_errors_per_object_minute
            .max(run.worst_errors_per_object_minute);
        for (kind, present) in coverage(&run.draw) {
            if present {
                *report.coverage.entry(kind).or_default() += 1;
            }
        }
    }
    report.release_wait = median(&mut waits);
    report.drain = median(&mut drains);
    report
}

fn coverage(draw: &Draw) -> [(&'static str, bool); 13] {
    [
        ("control plane of 1", draw.control_plane == 1),
        ("control plane of 5", draw.control_plane == 5),
        ("LB unlocks before its member", !draw.lb_waits_for_members),
        (
            "member stuck, released later",
            draw.stuck.is_some_and(|s| s.released_after.is_some()),
        ),
        (
            "member stuck for good",
            draw.stuck.is_some_and(|s| s.released_after.is_none()),
        ),
        (
            "member ERROR, repaired",
            draw.error.is_some_and(|e| e.times <= 3),
        ),
        (
            "member ERROR beyond repairs",
            draw.error.is_some_and(|e| e.times > 3),
        ),
        ("LB ERROR", draw.lb_error),
        ("429 storm", draw.rate_limits.is_some()),
        (
            "5xx burst or Keystone outage",
            draw.server_errors.is_some() || draw.keystone_outage.is_some(),
        ),
        ("controller restart", draw.restart.is_some()),
        (
            "a new node's API never serves",
            draw.api
                .is_some_and(|a| a.kind == draw::ApiTroubleKind::NeverServes),
        ),
        (
            "a new node's API flaps",
            draw.api
                .is_some_and(|a| matches!(a.kind, draw::ApiTroubleKind::Flapping { .. })),
        ),
    ]
}

impl SafetyReport {
    pub fn violation_count(&self) -> usize {
        self.violations.len()
    }

    pub fn print(&self) {
        let runs = self.config.runs;
        let last = self.config.seed.wrapping_add(runs.saturating_sub(1));
        println!(
            "rollout-safety ({}): {runs} runs, seeds {}..={last}, {} threads",
            self.config.strategy.as_str(),
            self.config.seed,
            self.config.threads
        );
        println!(
            "wall {:.1} s ({:.2} s per run; slowest {:.1} s, seed {}); {:.1} virtual hours played",
            self.wall_seconds,
            self.wall_seconds * self.config.threads as f64 / runs.max(1) as f64,
            self.slowest_run.0,
            self.slowest_run.1,
            self.virtual_seconds / 3600.0,
        );
        println!(
            "requests served: {} OpenStack, {} Kubernetes; worst reconcile errors per object per minute: {:.1} (storm above {})",
            self.cloud_requests,
            self.kube_requests,
            self.worst_errors_per_object_minute,
            check::STORM_ERRORS_PER_OBJECT_MINUTE
        );
        println!(
            "per machine (median, virtual time): {:.1} s from its member ACTIVE to its release ({} releases); {:.1} s drained at weight 0 before deletion ({} drains)",
            self.release_wait.0, self.release_wait.1, self.drain.0, self.drain.1
        );
        println!(
            "longest a member passing its monitor was kept at weight 0 while no member served: {:.1} s (seed {}; allowed {} s)",
            self.longest_held_out.0,
            self.longest_held_out.1,
            check::HELD_OUT_ALLOWANCE.as_secs()
        );
        println!(
            "\n{:<3} {:<44} {:>10}  seeds",
            "#", "invariant", "violations"
        );
        for invariant in Invariant::ALL {
            let seeds: Vec<String> = self
                .violations
                .iter()
                .filter(|v| v.violation.invariant == invariant)
                .map(|v| v.seed.to_string())
                .collect();
            let mut shown = seeds.clone();
            shown.dedup();
            shown.truncate(10);
            println!(
                "{:<3} {:<44} {:>10}  {}",
                invariant.number(),
                invariant.title(),
                seeds.len(),
                shown.join(" ")
            );
        }
        println!("\n{:<26} {:>8}", "outcome", "runs");
        for (outcome, count) in &self.outcomes {
            println!("{:<26} {:>8}", outcome.words(), count);
        }
        println!("\n{:<32} {:>8}", "trouble drawn", "runs");
        for (kind, count) in &self.coverage {
            println!("{kind:<32} {count:>8}");
        }
        for violation in self.violations.iter().take(20) {
            println!(
                "\nseed {} at {:.1} s: invariant {} ({}): {}\n  replay: capo-rs bench rollout-safety --runs 1 --seed {} --strategy {}",
                violation.seed,
                violation.violation.at,
                violation.violation.invariant.number(),
                violation.violation.invariant.title(),
                violation.violation.detail,
                violation.seed,
                self.config.strategy.as_str()
            );
        }
    }
}
