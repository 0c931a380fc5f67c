//! Which load balancer to poll next, inside a request budget. Pure: the caller passes the time.
//!
//! - Urgent LBs (something pending, desired != observed) are polled first, every
//!   `urgent_initial` for the first `urgent_fresh` of a state (most members settle in that time,
//!   and this bounds how late we notice), then backing off by `urgent_backoff` to `urgent_max`
//!   while nothing changes (a stuck member costs little); a change (or new desired state) starts
//!   over. LBs a rollout waits on go before other urgent work, which still gets every fourth
//!   urgent poll when it is due.
//! - Settled LBs are re-checked for drift. Drift polls draw from a second bucket refilled at
//!   `drift_share` of the budget, so they never take more than that share; the interval
//!   stretches with the number of settled LBs (`n / (qps * share)`, at least `drift_min`).
//!   Overdue drift checks are served oldest first, so none starves: when the budget cannot
//!   honour `drift_max`, every LB is still checked, just that much later (the scheduler lag
//!   metric shows by how much).
//! - Once enough members have been seen to finish, polls for a member on its way aim at the
//!   times members have actually finished at on this endpoint ([`ProvisioningTimes`]): no
//!   faster than `urgent_initial` where finishes are common, up to `urgent_max` across stretches
//!   where none ever happened; once it has outlasted every one seen, as if nothing were known
//!   (fast for `urgent_fresh`, then backing off).

use std::collections::{HashMap, VecDeque};
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
    /// How long after new desired state a known LB is looked at.
    pub look_after_change: Duration,
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
            urgent_initial: Duration::from_millis(1500),
            look_after_change: Duration::from_millis(1500),
            urgent_fresh: Duration::from_secs(180),
            urgent_max: Duration::from_secs(10),
            urgent_backoff: 1.5,
            drift_min: Duration::from_secs(60),
            drift_max: Duration::from_secs(300),
        }
    }
}

/// What a poll found, as far as scheduling goes.
#[derive(Clone, Debug, Default)]
pub struct PollOutcome {
    /// The LB still needs watching closely.
    pub urgent: bool,
    /// The poll saw something new.
    pub changed: bool,
    /// A time the verdict changes by itself (a member turning stuck).
    pub deadline: Option<Instant>,
    /// For each member being created (LB ACTIVE, member not yet): how long since it was asked
    /// for.
    pub creating_for: Vec<Duration>,
}

/// How many recent provisioning times an endpoint remembers, and how many it needs before
/// trusting them.
const REMEMBERED: usize = 1000;
const ENOUGH_TO_LEARN: usize = 30;

/// When a member finished, as one poll saw it: between the poll before (`earliest`) and this
/// one (`latest`), counted from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finish {
    pub earliest: Duration,
    pub latest: Duration,
}

/// Recent member provisioning times (request -> ACTIVE) on one endpoint, as windows: a poll
/// only tells when a member finished to within the gap since the poll before. Polls aim at
/// window starts and keep the fast pace across each window, so a finish like one seen before is
/// noticed within about `urgent_initial` even where its window was wide.
/// (A window's edges are stamped when polls complete, a round trip late; the pace absorbs it.)
#[derive(Clone, Debug, Default)]
pub struct ProvisioningTimes {
    recent: VecDeque<Finish>,
    /// By `earliest`, with the latest `latest` so far alongside.
    sorted: Vec<(Finish, Duration)>,
}

impl ProvisioningTimes {
    pub fn record(&mut self, finish: Finish) {
        if self.recent.len() >= REMEMBERED
            && let Some(oldest) = self.recent.pop_front()
            && let Some(at) = self.sorted.iter().position(|(f, _)| *f == oldest)
        {
            self.sorted.remove(at);
        }
        self.recent.push_back(finish);
        let at = self.sorted.partition_point(|(f, _)| *f <= finish);
        self.sorted.insert(at, (finish, Duration::ZERO));
        let mut latest = Duration::ZERO;
        for (f, running) in &mut self.sorted {
            latest = latest.max(f.latest);
            *running = latest;
        }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// When a member on its way for `elapsed` could next finish, by the windows seen.
    pub fn next_finish(&self, elapsed: Duration) -> NextFinish {
        if self.sorted.len() < ENOUGH_TO_LEARN {
            return NextFinish::Unknown;
        }
        let started = self.sorted.partition_point(|(f, _)| f.earliest <= elapsed);
        if started > 0 && self.sorted[started - 1].1 > elapsed {
            return NextFinish::In(Duration::ZERO);
        }
        match self.sorted.get(started) {
            Some((next, _)) => NextFinish::In(next.earliest - elapsed),
            None => NextFinish::Outlasted,
        }
    }
}

/// What the learned windows say about a member on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextFinish {
    /// Too few windows known to say anything.
    Unknown,
    /// It could finish this long from now at the earliest (zero: inside a window).
    In(Duration),
    /// It has outlasted every window seen.
    Outlasted,
}

#[derive(Clone, Debug)]
struct Entry {
    due: Instant,
    /// When the current state began (the last change).
    state_since: Instant,
    urgent: bool,
    /// A rollout waits on this LB: it goes before other urgent work.
    rollout_waiting: bool,
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
    times: ProvisioningTimes,
    /// Rollout picks in a row while other urgent work was due.
    rollout_streak: u32,
}

/// How many rollout polls may go before other due urgent work, in a row.
const ROLLOUT_STREAK: u32 = 3;

impl Scheduler {
    pub fn new(config: ScheduleConfig, now: Instant) -> Self {
        Scheduler {
            tokens: config.burst,
            drift_tokens: (config.burst * config.drift_share).max(1.0),
            config,
            entries: HashMap::new(),
            refilled: now,
            times: ProvisioningTimes::default(),
            rollout_streak: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new LB (due now), or new desired state for a known one: urgent, due within
    /// `look_after_change`. New desired state follows a change in the cloud, and Octavia holds
    /// the LB PENDING_UPDATE for a moment after every change: a look at once would see only that.
    pub fn wake(&mut self, lb: &str, rollout_waiting: bool, now: Instant) {
        let first_look = self.config.look_after_change;
        let entry = match self.entries.entry(lb.to_owned()) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => new.insert(Entry {
                due: now,
                urgent: true,
                rollout_waiting,
                interval: self.config.urgent_initial,
                state_since: now,
                in_flight: false,
            }),
        };
        entry.urgent = true;
        entry.rollout_waiting = rollout_waiting;
        entry.interval = self.config.urgent_initial;
        entry.state_since = now;
        entry.due = entry.due.min(now + first_look);
    }

    pub fn remove(&mut self, lb: &str) {
        self.entries.remove(lb);
    }

    /// A member on this endpoint finished provisioning within `finish`.
    pub fn learn(&mut self, finish: Finish) {
        self.times.record(finish);
    }

    pub fn provisioning_times(&self) -> &ProvisioningTimes {
        &self.times
    }

    /// When to look again at members being created, from what finished before: the soonest
    /// any of them could finish (no sooner than the fast pace, no later than `urgent_max`), or
    /// `Outlasted` when one has outlasted every window. `Unknown` until enough are known.
    fn learned_wait(&self, creating_for: &[Duration]) -> NextFinish {
        let c = &self.config;
        let mut soonest: Option<Duration> = None;
        for elapsed in creating_for {
            match self.times.next_finish(*elapsed) {
                NextFinish::Unknown => return NextFinish::Unknown,
                NextFinish::Outlasted => return NextFinish::Outlasted,
                NextFinish::In(gap) => {
                    let gap = gap.min(c.urgent_max).max(c.urgent_initial);
                    soonest = Some(soonest.map_or(gap, |s| s.min(gap)));
                }
            }
        }
        soonest.map_or(NextFinish::Unknown, NextFinish::In)
    }

    /// A poll of `lb` finished with `outcome`.
    pub fn done(&mut self, lb: &str, outcome: &PollOutcome, now: Instant) {
        let PollOutcome {
            urgent,
            changed,
            deadline,
            ..
        } = *outcome;
        let settled_count =
            self.entries.values().filter(|e| !e.urgent).count() + usize::from(!urgent);
        let drift = self.drift_interval(settled_count);
        let learned = if urgent {
            self.learned_wait(&outcome.creating_for)
        } else {
            NextFinish::Unknown
        };
        let config = &self.config;
        let Some(entry) = self.entries.get_mut(lb) else {
            return;
        };
        entry.in_flight = false;
        let was_urgent = entry.urgent;
        entry.urgent = urgent;
        if urgent && (changed || !was_urgent) {
            entry.interval = config.urgent_initial;
            entry.state_since = now;
        }
        let fresh = now.saturating_duration_since(entry.state_since) < config.urgent_fresh;
        let wait = if !urgent {
            entry.interval = drift;
            drift
        } else if let NextFinish::In(learned) = learned {
            learned
        } else if changed || !was_urgent || fresh {
            // Nothing learnt applies (too little known, or a member outlasted everything
            // seen): watch a new state closely for a while.
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

    /// Polls that were in flight will not finish (their loop died): each LB is due now.
    pub fn abandon_in_flight(&mut self, now: Instant) {
        for entry in self.entries.values_mut().filter(|e| e.in_flight) {
            entry.in_flight = false;
            entry.due = entry.due.min(now);
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
        // Most overdue first within a class (ties by name), found in one pass. Rollouts go
        // before other urgent work, but every `ROLLOUT_STREAK + 1`th urgent pick goes to the
        // other work if any is due, so a busy rollout day cannot starve it.
        let mut best: [Option<(&String, Instant)>; 3] = [None; 3];
        for (lb, e) in &self.entries {
            if e.in_flight || e.due > now {
                continue;
            }
            let class = match (e.urgent, e.rollout_waiting) {
                (true, true) => 0,
                (true, false) => 1,
                (false, _) => 2,
            };
            let slot = &mut best[class];
            if slot.is_none_or(|(name, due)| (e.due, lb) < (due, name)) {
                *slot = Some((lb, e.due));
            }
        }
        let [rollout, other, settled] = best.map(|b| b.map(|(lb, _)| lb.clone()));
        let urgent = match (rollout, other) {
            (Some(rollout), Some(_)) if self.rollout_streak < ROLLOUT_STREAK => {
                self.rollout_streak += 1;
                Some(rollout)
            }
            (Some(rollout), None) => Some(rollout),
            (_, other) => {
                self.rollout_streak = 0;
                other
            }
        };
        let lb = match urgent {
            Some(lb) => lb,
            None if self.drift_tokens >= 1.0 => {
                let lb = settled?;
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
        let (mut urgent, mut settled): (Option<Instant>, Option<Instant>) = (None, None);
        for e in self.entries.values().filter(|e| !e.in_flight) {
            let slot = if e.urgent { &mut urgent } else { &mut settled };
            *slot = Some(slot.map_or(e.due, |due| due.min(e.due)));
        }
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

    fn outcome(urgent: bool, changed: bool, deadline: Option<Instant>) -> PollOutcome {
        PollOutcome {
            urgent,
            changed,
            deadline,
            creating_for: Vec::new(),
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn urgent_backs_off_while_nothing_changes_and_resets_on_change() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("lb", false, t0);
        let mut now = t0;
        let mut intervals = Vec::new();
        for changed in [false, false, false, false, false, false, false, true] {
            let pick = s.next(now).expect("due");
            assert_eq!(pick.lb, "lb");
            s.done("lb", &outcome(true, changed, None), now);
            let due = s.wake_at(now).unwrap();
            intervals.push(due - now);
            now = due;
        }
        assert_eq!(intervals[0], secs(1.5), "first poll of an urgent LB: 1.5 s");
        assert_eq!(intervals[1], secs(2.25));
        assert!(intervals[6] == secs(10.0), "{intervals:?}");
        assert_eq!(intervals[7], secs(1.5), "a change resets");
    }

    #[test]
    fn a_fresh_state_is_polled_at_the_initial_interval() {
        let t0 = Instant::now();
        let cfg = ScheduleConfig {
            urgent_fresh: secs(5.0),
            ..config(10.0)
        };
        let mut s = Scheduler::new(cfg, t0);
        s.wake("lb", false, t0);
        let mut now = t0;
        let mut intervals = Vec::new();
        for _ in 0..8 {
            s.next(now).unwrap();
            s.done("lb", &outcome(true, false, None), now);
            let due = s.wake_at(now).unwrap();
            intervals.push((due - now).as_secs_f64());
            now = due;
        }
        assert_eq!(intervals[..5], [1.5; 5]);
        assert!(intervals[6] > 1.5, "{intervals:?}");
    }

    #[test]
    fn pending_work_goes_first_and_drift_stays_within_its_share() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        for i in 0..100 {
            let lb = format!("settled-{i}");
            s.wake(&lb, false, t0);
            s.next(t0);
            s.done(&lb, &outcome(false, false, None), t0);
        }
        // 100 settled LBs at 5 drift polls/s: one check each every 20 s, but at least 60 s.
        assert_eq!(s.drift_interval(100), secs(60.0));
        assert_eq!(s.drift_interval(10_000), secs(300.0));
        s.wake("urgent", false, t0);
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
                    s.done(&pick.lb, &outcome(false, false, None), now);
                } else {
                    s.done(&pick.lb, &outcome(true, false, None), now);
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
            s.wake(&format!("lb-{i}"), false, t0);
        }
        let mut sent = Vec::new();
        let mut now = t0;
        while now < t0 + secs(60.0) {
            while let Some(pick) = s.next(now) {
                sent.push(now);
                s.done(&pick.lb, &outcome(true, false, None), now);
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
            s.wake(&lb, false, t0);
            s.next(t0 + secs(*offset));
            s.done(&lb, &outcome(false, false, None), t0 + secs(*offset));
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
    fn new_desired_state_is_looked_at_after_the_lock_not_at_once() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("lb", false, t0);
        assert_eq!(s.wake_at(t0), Some(t0), "a new LB: at once");
        s.next(t0).unwrap();
        s.done("lb", &outcome(false, false, None), t0);
        s.wake("lb", false, t0 + secs(5.0));
        assert_eq!(s.wake_at(t0 + secs(5.0)), Some(t0 + secs(6.5)));
    }

    #[test]
    fn rollouts_go_before_other_urgent_work() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(1.0), t0);
        s.wake("first-look", false, t0);
        s.wake("rollout", true, t0 + secs(0.5));
        s.wake("first-look-2", false, t0 + secs(0.6));
        let now = t0 + secs(10.0);
        let order: Vec<String> = (0..3)
            .filter_map(|k| s.next(now + secs(f64::from(k))).map(|p| p.lb))
            .collect();
        assert_eq!(order, ["rollout", "first-look", "first-look-2"]);
    }

    #[test]
    fn rollouts_cannot_starve_other_urgent_work() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(100.0), t0);
        for i in 0..20 {
            s.wake(&format!("rollout-{i}"), true, t0);
        }
        s.wake("other", false, t0);
        let picks: Vec<String> = (0..4).filter_map(|_| s.next(t0).map(|p| p.lb)).collect();
        assert_eq!(picks.len(), 4);
        assert_eq!(picks[3], "other", "{picks:?}");
    }

    #[test]
    fn a_fast_pace_slower_than_the_slowest_is_not_a_panic() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(
            ScheduleConfig {
                urgent_initial: secs(11.0),
                ..config(10.0)
            },
            t0,
        );
        for _ in 0..ENOUGH_TO_LEARN {
            s.learn(finish(2.0, 3.0));
        }
        s.wake("lb", true, t0);
        s.next(t0).unwrap();
        let outcome = PollOutcome {
            urgent: true,
            creating_for: vec![secs(0.5)],
            ..PollOutcome::default()
        };
        s.done("lb", &outcome, t0);
        assert_eq!(s.wake_at(t0), Some(t0 + secs(11.0)));
    }

    fn finish(earliest: f64, latest: f64) -> Finish {
        Finish {
            earliest: secs(earliest),
            latest: secs(latest),
        }
    }

    #[test]
    fn provisioning_times_point_at_the_next_window_a_member_could_finish_in() {
        let mut times = ProvisioningTimes::default();
        for k in 0..29 {
            times.record(finish(2.0 + f64::from(k), 3.5 + f64::from(k)));
        }
        assert_eq!(
            times.next_finish(secs(0.0)),
            NextFinish::Unknown,
            "too few to trust"
        );
        times.record(finish(118.5, 120.0));
        assert_eq!(times.next_finish(secs(0.0)), NextFinish::In(secs(2.0)));
        assert_eq!(
            times.next_finish(secs(10.2)),
            NextFinish::In(Duration::ZERO),
            "inside a window"
        );
        assert_eq!(times.next_finish(secs(40.0)), NextFinish::In(secs(78.5)));
        assert_eq!(
            times.next_finish(secs(119.0)),
            NextFinish::In(Duration::ZERO)
        );
        assert_eq!(times.next_finish(secs(121.0)), NextFinish::Outlasted);
        // Old windows are forgotten.
        for _ in 0..REMEMBERED {
            times.record(finish(5.0, 6.0));
        }
        assert_eq!(times.len(), REMEMBERED);
        assert_eq!(times.next_finish(secs(7.0)), NextFinish::Outlasted);
    }

    #[test]
    fn members_being_created_are_polled_where_members_finish() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        for _ in 0..ENOUGH_TO_LEARN {
            s.learn(finish(2.0, 3.5));
            s.learn(finish(28.5, 30.0));
        }
        s.wake("lb", true, t0);
        s.next(t0).unwrap();
        let creating = |elapsed: f64| PollOutcome {
            urgent: true,
            creating_for: vec![secs(elapsed)],
            ..PollOutcome::default()
        };
        let mut waits = Vec::new();
        let mut now = t0;
        for elapsed in [0.0, 2.0, 3.5, 13.5, 23.5, 28.5, 30.0, 40.0] {
            s.done("lb", &creating(elapsed), now);
            let due = s.wake_at(now).unwrap();
            waits.push((due - now).as_secs_f64());
            now = due;
            s.next(now).unwrap();
        }
        // Up to the first window, through it at the fast pace, across the quiet stretch at
        // most `urgent_max`, up to the next window, then the fast pace again once past them all
        // (the state is fresh: `config` sets no fresh period, so it backs off from there).
        assert_eq!(waits, [2.0, 1.5, 10.0, 10.0, 5.0, 1.5, 1.5, 2.25]);
    }

    #[test]
    fn deadlines_bring_polls_forward_and_defer_holds_them() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("lb", false, t0);
        s.next(t0);
        s.done("lb", &outcome(false, false, Some(t0 + secs(5.0))), t0);
        assert_eq!(s.wake_at(t0), Some(t0 + secs(5.0)));
        s.next(t0 + secs(5.0));
        s.defer("lb", t0 + secs(30.0));
        assert_eq!(s.wake_at(t0 + secs(5.0)), Some(t0 + secs(30.0)));
    }
}
