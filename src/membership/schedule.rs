//! Which load balancer to poll next, inside a request budget. Pure: the caller passes the time.
//!
//! - Urgent LBs (something pending, desired != observed, a rollout waiting) are polled first,
//!   every `urgent_initial` for the first `urgent_fresh` of a state (most members settle in
//!   that time, and this bounds how late we notice), then backing off by `urgent_backoff` to
//!   `urgent_max` while nothing changes (a stuck member costs little); a change (or new desired
//!   state) starts over.
//! - Settled LBs are re-checked for drift. Drift polls draw from a second bucket refilled at
//!   `drift_share` of the budget, so they never take more than that share; the interval
//!   stretches with the number of settled LBs (`n / (qps * share)`, at least `drift_min`).
//!   Overdue drift checks are served oldest first, so none starves: when the budget cannot
//!   honour `drift_max`, every LB is still checked, just that much later (the scheduler lag
//!   metric shows by how much).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ScheduleConfig {
    /// Polls per second this engine may send to one cloud endpoint.
    pub budget_qps: f64,
    /// Polls it may send at once after a quiet spell.
    pub burst: f64,
    /// Share of the budget drift checks may use (0..=1).
    pub drift_share: f64,
    pub urgent_initial: Duration,
    /// How long a state is polled at `urgent_initial` before backing off.
    pub urgent_fresh: Duration,
    pub urgent_max: Duration,
    pub urgent_backoff: f64,
    pub drift_min: Duration,
    pub drift_max: Duration,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            budget_qps: 10.0,
            burst: 20.0,
            drift_share: 0.5,
            urgent_initial: Duration::from_secs(1),
            urgent_fresh: Duration::from_secs(180),
            urgent_max: Duration::from_secs(10),
            urgent_backoff: 1.5,
            drift_min: Duration::from_secs(60),
            drift_max: Duration::from_secs(300),
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    due: Instant,
    /// When the current state began (the last change).
    state_since: Instant,
    urgent: bool,
    interval: Duration,
    in_flight: bool,
}

/// A pick: which LB, and how late it is against its due time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub lb: String,
    pub urgent: bool,
    pub lag: Duration,
}

#[derive(Debug)]
pub struct Scheduler {
    config: ScheduleConfig,
    entries: HashMap<String, Entry>,
    tokens: f64,
    drift_tokens: f64,
    refilled: Instant,
}

impl Scheduler {
    pub fn new(config: ScheduleConfig, now: Instant) -> Self {
        Scheduler {
            tokens: config.burst,
            drift_tokens: (config.burst * config.drift_share).max(1.0),
            config,
            entries: HashMap::new(),
            refilled: now,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new LB, or new desired state for a known one: urgent, due now.
    pub fn wake(&mut self, lb: &str, now: Instant) {
        let entry = self.entries.entry(lb.to_owned()).or_insert(Entry {
            due: now,
            urgent: true,
            interval: self.config.urgent_initial,
            state_since: now,
            in_flight: false,
        });
        entry.urgent = true;
        entry.interval = self.config.urgent_initial;
        entry.state_since = now;
        entry.due = entry.due.min(now);
    }

    pub fn remove(&mut self, lb: &str) {
        self.entries.remove(lb);
    }

    /// A poll finished. `urgent`: the LB still needs watching closely; `changed`: the poll saw
    /// something new; `deadline`: a time the verdict changes by itself (a member turning stuck).
    pub fn done(
        &mut self,
        lb: &str,
        urgent: bool,
        changed: bool,
        deadline: Option<Instant>,
        now: Instant,
    ) {
        let settled_count =
            self.entries.values().filter(|e| !e.urgent).count() + usize::from(!urgent);
        let drift = self.drift_interval(settled_count);
        let config = &self.config;
        let Some(entry) = self.entries.get_mut(lb) else {
            return;
        };
        entry.in_flight = false;
        let was_urgent = entry.urgent;
        entry.urgent = urgent;
        let wait = if !urgent {
            entry.interval = drift;
            drift
        } else if changed || !was_urgent {
            entry.interval = config.urgent_initial;
            entry.state_since = now;
            config.urgent_initial
        } else if now.saturating_duration_since(entry.state_since) < config.urgent_fresh {
            config.urgent_initial
        } else {
            let wait = entry.interval;
            entry.interval = entry
                .interval
                .mul_f64(config.urgent_backoff)
                .min(config.urgent_max);
            wait
        };
        entry.due = now + wait;
        if let Some(deadline) = deadline {
            entry.due = entry.due.min(deadline.max(now));
        }
    }

    /// Holds an LB until `until` (its endpoint asked us to slow down).
    pub fn defer(&mut self, lb: &str, until: Instant) {
        if let Some(entry) = self.entries.get_mut(lb) {
            entry.in_flight = false;
            entry.due = entry.due.max(until);
        }
    }

    /// How often settled LBs are re-checked with `settled` of them.
    pub fn drift_interval(&self, settled: usize) -> Duration {
        let rate = (self.config.budget_qps * self.config.drift_share).max(f64::MIN_POSITIVE);
        let needed = Duration::from_secs_f64(settled as f64 / rate);
        needed
            .max(self.config.drift_min)
            .min(self.config.drift_max.max(self.config.drift_min))
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        let c = &self.config;
        self.tokens = (self.tokens + elapsed * c.budget_qps).min(c.burst);
        let drift_burst = (c.burst * c.drift_share).max(1.0);
        self.drift_tokens =
            (self.drift_tokens + elapsed * c.budget_qps * c.drift_share).min(drift_burst);
    }

    /// The next LB to poll now, if one is due and the budget allows; spends the budget.
    pub fn next(&mut self, now: Instant) -> Option<Pick> {
        self.refill(now);
        if self.tokens < 1.0 {
            return None;
        }
        let earliest = |urgent: bool| {
            self.entries
                .iter()
                .filter(|(_, e)| e.urgent == urgent && !e.in_flight && e.due <= now)
                .min_by_key(|(lb, e)| (e.due, (*lb).clone()))
                .map(|(lb, _)| lb.clone())
        };
        let lb = match earliest(true) {
            Some(lb) => lb,
            None if self.drift_tokens >= 1.0 => {
                let lb = earliest(false)?;
                self.drift_tokens -= 1.0;
                lb
            }
            None => return None,
        };
        self.tokens -= 1.0;
        let entry = self.entries.get_mut(&lb)?;
        entry.in_flight = true;
        Some(Pick {
            lag: now.saturating_duration_since(entry.due),
            urgent: entry.urgent,
            lb,
        })
    }

    /// When `next` may have something: the earliest due time, pushed back while the budget
    /// is empty. `None` when nothing is scheduled.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        let c = &self.config;
        let waiting: Vec<&Entry> = self.entries.values().filter(|e| !e.in_flight).collect();
        let urgent = waiting.iter().filter(|e| e.urgent).map(|e| e.due).min();
        let settled = waiting.iter().filter(|e| !e.urgent).map(|e| e.due).min();
        // At least a millisecond ahead: a wait rounded down to nothing would make the caller
        // spin without time passing (timers have millisecond resolution).
        let token_at = |have: f64, rate: f64| {
            if have >= 1.0 {
                now
            } else {
                let wait = Duration::from_secs_f64((1.0 - have) / rate.max(f64::MIN_POSITIVE));
                now + wait.max(Duration::from_millis(1))
            }
        };
        let budget = token_at(self.tokens, c.budget_qps);
        let drift_budget = token_at(self.drift_tokens, c.budget_qps * c.drift_share).max(budget);
        [
            urgent.map(|due| due.max(budget)),
            settled.map(|due| due.max(drift_budget)),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(qps: f64) -> ScheduleConfig {
        ScheduleConfig {
            budget_qps: qps,
            burst: qps,
            urgent_fresh: Duration::ZERO,
            ..ScheduleConfig::default()
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn urgent_backs_off_while_nothing_changes_and_resets_on_change() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("lb", t0);
        let mut now = t0;
        let mut intervals = Vec::new();
        for changed in [false, false, false, false, false, false, false, true] {
            let pick = s.next(now).expect("due");
            assert_eq!(pick.lb, "lb");
            s.done("lb", true, changed, None, now);
            let due = s.wake_at(now).unwrap();
            intervals.push(due - now);
            now = due;
        }
        assert_eq!(intervals[0], secs(1.0), "first poll of an urgent LB: 1 s");
        assert_eq!(intervals[1], secs(1.5));
        assert!(intervals[6] == secs(10.0), "{intervals:?}");
        assert_eq!(intervals[7], secs(1.0), "a change resets");
    }

    #[test]
    fn a_fresh_state_is_polled_at_the_initial_interval() {
        let t0 = Instant::now();
        let cfg = ScheduleConfig {
            urgent_fresh: secs(5.0),
            ..config(10.0)
        };
        let mut s = Scheduler::new(cfg, t0);
        s.wake("lb", t0);
        let mut now = t0;
        let mut intervals = Vec::new();
        for _ in 0..8 {
            s.next(now).unwrap();
            s.done("lb", true, false, None, now);
            let due = s.wake_at(now).unwrap();
            intervals.push((due - now).as_secs_f64());
            now = due;
        }
        assert_eq!(intervals[..5], [1.0; 5]);
        assert!(intervals[6] > 1.0, "{intervals:?}");
    }

    #[test]
    fn pending_work_goes_first_and_drift_stays_within_its_share() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        for i in 0..100 {
            let lb = format!("settled-{i}");
            s.wake(&lb, t0);
            s.next(t0);
            s.done(&lb, false, false, None, t0);
        }
        // 100 settled LBs at 5 drift polls/s: one check each every 20 s, but at least 60 s.
        assert_eq!(s.drift_interval(100), secs(60.0));
        assert_eq!(s.drift_interval(10_000), secs(300.0));
        s.wake("urgent", t0);
        let later = t0 + secs(3600.0);
        let first = s.next(later).unwrap();
        assert_eq!(first.lb, "urgent");
        assert!(first.urgent);
        // Over a long stretch, drift polls use at most half the budget.
        let mut drift = 0u32;
        let mut now = later;
        for _ in 0..2000 {
            now += secs(0.01);
            if let Some(pick) = s.next(now) {
                if !pick.urgent {
                    drift += 1;
                    s.done(&pick.lb, false, false, None, now);
                } else {
                    s.done(&pick.lb, true, false, None, now);
                }
            }
        }
        let elapsed = (now - later).as_secs_f64();
        assert!(
            f64::from(drift) <= 5.0 * elapsed + 5.0 + 1.0,
            "{drift} drift polls in {elapsed} s"
        );
    }

    #[test]
    fn total_polls_never_exceed_the_budget() {
        let t0 = Instant::now();
        let qps = 20.0;
        let mut s = Scheduler::new(
            ScheduleConfig {
                budget_qps: qps,
                burst: 40.0,
                ..ScheduleConfig::default()
            },
            t0,
        );
        for i in 0..500 {
            s.wake(&format!("lb-{i}"), t0);
        }
        let mut sent = Vec::new();
        let mut now = t0;
        while now < t0 + secs(60.0) {
            while let Some(pick) = s.next(now) {
                sent.push(now);
                s.done(&pick.lb, true, false, None, now);
            }
            now = s.wake_at(now).unwrap().max(now + secs(0.001));
        }
        for (i, at) in sent.iter().enumerate() {
            let window = sent[i..]
                .iter()
                .take_while(|t| **t - *at < secs(1.0))
                .count();
            assert!(window as f64 <= qps + 40.0, "{window} polls in one second");
        }
        let total = sent.len() as f64;
        assert!(total <= 40.0 + qps * 60.0 + 1.0, "{total} polls in 60 s");
        assert!(total >= qps * 55.0, "the budget is used: {total}");
    }

    #[test]
    fn overdue_settled_lbs_are_served_oldest_first() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(1.0), t0);
        for (i, offset) in [30.0, 10.0, 20.0].iter().enumerate() {
            let lb = format!("lb-{i}");
            s.wake(&lb, t0);
            s.next(t0 + secs(*offset));
            s.done(&lb, false, false, None, t0 + secs(*offset));
        }
        let order: Vec<String> = (0..3)
            .filter_map(|k| {
                s.next(t0 + secs(1000.0 + f64::from(k) * 10.0))
                    .map(|p| p.lb)
            })
            .collect();
        assert_eq!(order, ["lb-1", "lb-2", "lb-0"]);
    }

    #[test]
    fn deadlines_bring_polls_forward_and_defer_holds_them() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("lb", t0);
        s.next(t0);
        s.done("lb", false, false, Some(t0 + secs(5.0)), t0);
        assert_eq!(s.wake_at(t0), Some(t0 + secs(5.0)));
        s.next(t0 + secs(5.0));
        s.defer("lb", t0 + secs(30.0));
        assert_eq!(s.wake_at(t0 + secs(5.0)), Some(t0 + secs(30.0)));
    }
}
