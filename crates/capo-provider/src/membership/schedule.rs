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
//!   faster than `urgent_initial` where finishes are common, up to `learned_max` across
//!   stretches where none ever happened. One that has outlasted every finish seen is an outlier
//!   (most such are stuck): its polls back off by `urgent_backoff` to `outlasted_max`, and its
//!   stuck deadline brings a poll of its own, so it is flagged on time.
//! - A stretch "where none ever finished" must have been watched: polls of a member on its way
//!   are at most `unwatched_max` apart, except across ages through which at least
//!   `watched_enough` other members were seen still on their way. So the first slow members
//!   of an endpoint, before any like them finished, are noticed within `unwatched_max`, and
//!   backing off waits for evidence instead of assuming it. A member already flagged stuck is
//!   exempt: its verdict is said, and a recovery is seen within the slow pace. So is one on
//!   its way longer than `unwatched_for` (3 min): that late, it is an anomaly, most often
//!   stuck, and watching it every 4 s from 3 min to its 10-minute stuck deadline would cost
//!   up to a hundred looks.
//! - Where the cloud lets us list load balancers, one list ([`Target::List`], a request per
//!   1,000 LBs) watches every LB its identity sees: a settled LB gets a status tree only when
//!   its row (statuses, `updated_at`) changed since the last list, and otherwise a safety-net
//!   tree at `safety_share` of the budget (a member's operating status can change without
//!   its LB's row); a locked LB (PENDING_* in the list or its last tree) waits for the list
//!   to show it unlocked instead of being polled (a tree of a locked LB only says it is
//!   locked), and the list is read every `sweep_locked` while one waits, `sweep_settled`
//!   otherwise. A member still on its way under an ACTIVE LB (the ovn / amphora v2 race) is
//!   invisible to the list: that LB keeps its own fast polls. A list refused (403, 404) or
//!   failing three times in a row falls back to per-LB drift checks until `list_retry` later.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Later;

use super::metrics::ListCounts;
use crate::cloud::octavia::{LIST_PAGE, LoadBalancerRow, OperatingStatus, ProvisioningStatus};

/// How the engine paces its polls of one cloud endpoint: the request budget, the urgent and
/// drift paces, and the LB-list sweeps (see the module's description).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ScheduleConfig {
    /// Polls per second this engine may send to one cloud endpoint.
    pub budget_qps: f64,
    /// Polls it may send at once after a quiet spell.
    pub burst: f64,
    /// Share of the budget drift checks may use (0..=1).
    pub drift_share: f64,
    /// The fastest pace of urgent polls: the wait between polls of an LB in a new state.
    pub urgent_initial: Duration,
    /// How long after new desired state a known LB is looked at.
    pub look_after_change: Duration,
    /// How long after a reconciler changed the LB itself (made it, or a listener, pool or
    /// monitor under it) it is looked at. Octavia's LB-level flows settle in well under a
    /// second where the driver does little (ovn, amphora's no-op: 0.1-0.6 s on the real
    /// tier), and CAPO's inline wait looks at one second too; a slower driver's lock is then
    /// followed at `urgent_initial`.
    pub look_after_lb_change: Duration,
    /// How long a state is polled at `urgent_initial` before backing off.
    pub urgent_fresh: Duration,
    /// The longest wait between urgent polls once they have backed off.
    pub urgent_max: Duration,
    /// Polls aimed at learned provisioning times may be this far apart across a stretch where
    /// no member has finished.
    pub learned_max: Duration,
    /// Polls of a member that has outlasted every provisioning time seen back off to this.
    pub outlasted_max: Duration,
    /// Polls of a member on its way are at most this far apart across ages fewer than
    /// `watched_enough` other members were seen to reach still on their way (how late a
    /// finish unlike any seen before can be noticed).
    pub unwatched_max: Duration,
    /// How many other members must have been seen on their way past an age before polls
    /// may be further apart than `unwatched_max` there.
    pub watched_enough: usize,
    /// `unwatched_max` holds for members on their way less than this long; an older one's
    /// polls are not held to it (a member this late is an anomaly, most often stuck: past every
    /// finish seen it backs off to `outlasted_max` without evidence that others lived as long).
    pub unwatched_for: Duration,
    /// The factor by which the wait between urgent polls grows while nothing changes.
    pub urgent_backoff: f64,
    /// The shortest wait between drift checks of a settled LB, however few there are.
    pub drift_min: Duration,
    /// The longest wait between drift checks asked for; with many settled LBs and too small a
    /// budget, checks come later than this.
    pub drift_max: Duration,
    /// Watch load balancers through the LB list where the cloud allows it.
    pub list_sweep: bool,
    /// How often the list is read while every LB it covers is settled (drift is seen within
    /// this, plus one status tree).
    pub sweep_settled: Duration,
    /// How often it is read while an LB it covers is locked (how late an unlock is seen).
    pub sweep_locked: Duration,
    /// A locked LB is still looked at on its own this often (the list is a hint, not proof).
    pub locked_max: Duration,
    /// Share of the budget the safety-net trees of listed, settled LBs may use ...
    pub safety_share: f64,
    /// ... and no LB gets one more often than this.
    pub safety_min: Duration,
    /// How long after a refused or failing list it is tried again.
    pub list_retry: Duration,
    /// A settled LB whose last tree no list can vouch for (it was read within a second of its
    /// row's last change) gets another tree this long after, unless it changes again first.
    pub vouch_after: Duration,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            budget_qps: 10.0,
            burst: 20.0,
            drift_share: 0.5,
            urgent_initial: Duration::from_millis(1900),
            look_after_change: Duration::from_millis(1900),
            look_after_lb_change: Duration::from_millis(1000),
            urgent_fresh: Duration::from_secs(180),
            urgent_max: Duration::from_secs(10),
            learned_max: Duration::from_secs(60),
            outlasted_max: Duration::from_secs(60),
            unwatched_max: Duration::from_secs(4),
            watched_enough: 3,
            unwatched_for: Duration::from_secs(180),
            urgent_backoff: 1.5,
            drift_min: Duration::from_secs(60),
            drift_max: Duration::from_secs(300),
            list_sweep: true,
            sweep_settled: Duration::from_secs(30),
            sweep_locked: Duration::from_millis(1900),
            locked_max: Duration::from_secs(30),
            safety_share: 0.005,
            safety_min: Duration::from_secs(600),
            list_retry: Duration::from_secs(3600),
            vouch_after: Duration::from_secs(120),
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
    /// The LB itself was PENDING_* (locked): where a list covers it, the list watches for the
    /// unlock.
    pub lb_locked: bool,
    /// A member is flagged stuck: the verdict is said, so no lag bound holds its polls close.
    pub stuck: bool,
    /// The poll read the LB (a failed one did not).
    pub read: bool,
}

/// How many recent provisioning times an endpoint remembers, and how many it needs before
/// trusting them.
const REMEMBERED: usize = 1000;
const ENOUGH_TO_LEARN: usize = 30;

/// When a member finished, as one poll saw it: between the poll before (`earliest`) and this
/// one (`latest`), counted from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finish {
    /// How long after its request the member was last seen still on its way (the poll before).
    pub earliest: Duration,
    /// How long after its request it was first seen ACTIVE (this poll).
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
    /// Remembers one member's finish, forgetting the oldest once `REMEMBERED` (1,000) are kept.
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

    /// How many finishes are remembered.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether no finish is remembered yet.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `n` longest ages at which members that later finished were last seen on their way
    /// (the windows are sorted by `earliest`).
    fn longest_waits(&self, n: usize) -> impl Iterator<Item = Duration> + '_ {
        self.sorted.iter().rev().take(n).map(|(f, _)| f.earliest)
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

/// The age through which at least `enough` members were seen still on their way: the
/// `enough`-th longest of `waits`. `None` when fewer are known.
pub fn watched_through(
    waits: impl IntoIterator<Item = Duration>,
    enough: usize,
) -> Option<Duration> {
    if enough == 0 {
        return Some(Duration::MAX);
    }
    let mut waits: Vec<Duration> = waits.into_iter().collect();
    if waits.len() < enough {
        return None;
    }
    let at = waits.len() - enough;
    Some(*waits.select_nth_unstable(at).1)
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
    /// The list that covers this LB (its identity's), if any.
    list: Option<String>,
    /// Locked when last seen, and a working list watches for the unlock.
    parked: bool,
    /// Since when, while parked.
    parked_since: Option<Instant>,
    /// When the verdict changes by itself (a member turning stuck), from the last poll.
    deadline: Option<Instant>,
    /// The list showed a change while a tree was in flight: the tree may predate it.
    look_again: bool,
    /// When the tree in flight was sent.
    tree_sent: Option<Instant>,
    /// The last tree answered: when it was sent, and when it answered.
    last_tree: Option<(Instant, Instant)>,
    /// The row (`updated_at`) a list has shown the last tree to reflect.
    vouched: Option<String>,
    /// A state recalled from before a restart, as of this row: waits for the list to show
    /// the row unchanged (no tree needed) or not.
    recalled: Option<String>,
    /// How long its longest-waiting member being created had been on its way at the last
    /// read: evidence, for other LBs, that members live that long without finishing.
    creating_seen: Option<Duration>,
}

impl Entry {
    fn park(&mut self, now: Instant) {
        if !self.parked {
            self.parked_since = Some(now);
        }
        self.parked = true;
    }

    fn unpark(&mut self) {
        self.parked = false;
        self.parked_since = None;
    }

    /// The wait until the next poll while nothing changes: the current interval, which then
    /// grows by `factor` up to `max`.
    fn back_off(&mut self, factor: f64, max: Duration) -> Duration {
        let wait = self.interval;
        self.interval = self.interval.mul_f64(factor).min(max);
        wait
    }
}

/// What to send: one LB's status tree, or one identity's LB list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A status tree of the load balancer with this id.
    Lb(String),
    /// The LB list of this identity (the session scope's `identity`): every LB it sees.
    List(String),
}

/// A pick: what to poll, and how late it is against its due time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// What to send.
    pub target: Target,
    /// Whether it is urgent work; a list is always urgent.
    pub urgent: bool,
    /// How long after its due time it was picked (the scheduler lag).
    pub lag: Duration,
}

impl Pick {
    /// The LB picked for a status tree, if that is what was picked.
    pub fn lb(&self) -> Option<&str> {
        match &self.target {
            Target::Lb(lb) => Some(lb),
            Target::List(_) => None,
        }
    }
}

/// Whether an identity's list can be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListState {
    /// Not answered yet: LBs are polled as if there were no list.
    Untried,
    /// Its last read answered: it watches the LBs it covers.
    Working,
    /// Refused or failing: per-LB drift checks until then.
    Unavailable {
        /// When it is tried again.
        until: Instant,
    },
}

/// One identity's LB list.
#[derive(Clone, Debug)]
struct Sweep {
    due: Instant,
    in_flight: bool,
    state: ListState,
    /// Failures in a row.
    failures: u32,
    /// LBs it covers.
    covered: usize,
    /// Pages (requests) its last answer took.
    pages: usize,
    /// Each covered LB's row at the last list: statuses and `updated_at`, and since when
    /// lists have shown it.
    rows: HashMap<String, (LbRowMark, Instant)>,
    /// When the list in flight was sent.
    sent: Option<Instant>,
}

/// Octavia stamps `updated_at` to the second: a write in the same second as the last one
/// leaves the row as it was. A tree sent at least this long after a list first showed a row
/// has seen every write stamped with it.
const ROW_STAMP_RESOLUTION: Duration = Duration::from_secs(1);

/// What a list told about LBs beyond when to poll them: for the engine to act on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFindings {
    /// LBs with a recalled state: whether the list showed their row as recalled (then the
    /// recalled state holds, and the row's operating status is the LB's), or not (a tree is
    /// due).
    pub recalled: Vec<(String, Option<OperatingStatus>)>,
    /// LBs whose last tree, answered at that instant, the list shows to reflect this row.
    pub vouched: Vec<(String, Instant, String)>,
}

/// What of an LB's row tells that something under it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LbRowMark {
    provisioning: ProvisioningStatus,
    operating: OperatingStatus,
    updated_at: Option<String>,
}

/// Failed lists in a row before the LBs it covers fall back to their own drift checks.
const LIST_FAILURES: u32 = 3;
/// The fewest LBs a list must cover to be read.
const LIST_MIN_COVERED: usize = 2;

/// Decides which load balancer (or LB list) of one cloud endpoint to poll next, within the
/// endpoint's request budget.
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
    /// LB lists by identity.
    sweeps: HashMap<String, Sweep>,
}

/// How many rollout polls may go before other due urgent work, in a row.
const ROLLOUT_STREAK: u32 = 3;

impl Scheduler {
    /// A scheduler with nothing to poll yet and a full budget (`burst` tokens) at `now`.
    pub fn new(config: ScheduleConfig, now: Instant) -> Self {
        Scheduler {
            tokens: config.burst,
            drift_tokens: (config.burst * config.drift_share).max(1.0),
            config,
            entries: HashMap::new(),
            refilled: now,
            times: ProvisioningTimes::default(),
            rollout_streak: 0,
            sweeps: HashMap::new(),
        }
    }

    /// How many load balancers it schedules.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it schedules no load balancer.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A new LB (due now), or new desired state for a known one: urgent, due within
    /// `look_after_change`. New desired state follows a change in the cloud, and Octavia holds
    /// the LB PENDING_UPDATE for a moment after every change: a look at once would see only that.
    ///
    /// A known LB under a working list is parked instead: the change locks it, and the list,
    /// brought forward to `look_after_change`, shows when it is unlocked (one list for every
    /// LB changed meanwhile).
    pub fn wake(&mut self, lb: &str, rollout_waiting: bool, now: Instant) {
        let c = &self.config;
        let (first_look, urgent_initial, locked_max) =
            (c.look_after_change, c.urgent_initial, c.locked_max);
        let known = self.entries.contains_key(lb);
        let listed = self.listing(lb).map(str::to_owned);
        let entry = self.entries.entry(lb.to_owned()).or_insert(Entry {
            due: now,
            urgent: true,
            rollout_waiting,
            interval: urgent_initial,
            state_since: now,
            in_flight: false,
            list: None,
            parked: false,
            parked_since: None,
            deadline: None,
            look_again: false,
            tree_sent: None,
            last_tree: None,
            vouched: None,
            recalled: None,
            creating_seen: None,
        });
        entry.urgent = true;
        entry.rollout_waiting = rollout_waiting;
        entry.interval = urgent_initial;
        entry.state_since = now;
        match listed.filter(|_| known) {
            Some(list) => {
                entry.park(now);
                entry.due = entry.due.min(now + locked_max);
                if let Some(sweep) = self.sweeps.get_mut(&list) {
                    sweep.due = sweep.due.min(now + first_look);
                }
            }
            None => entry.due = entry.due.min(now + first_look),
        }
    }

    /// A reconciler has just changed `lb` itself ([`ScheduleConfig::look_after_lb_change`]).
    /// Octavia holds it locked this instant, so a look due sooner (a new LB's first) would
    /// only see the lock: the look, or the list that watches for the unlock, comes then.
    pub fn lb_changed(&mut self, lb: &str, rollout_waiting: bool, now: Instant) {
        self.wake(lb, rollout_waiting, now);
        let first_look = now + self.config.look_after_lb_change;
        let list = self.listing(lb).map(str::to_owned);
        let Some(entry) = self.entries.get_mut(lb).filter(|e| !e.in_flight) else {
            return;
        };
        match list.and_then(|list| self.sweeps.get_mut(&list)) {
            Some(sweep) => {
                entry.due = entry.due.max(first_look);
                sweep.due = sweep.due.min(first_look);
            }
            None => entry.due = first_look,
        }
    }

    /// `lb` is seen through `list` (its identity's LB list), or through none.
    pub fn cover(&mut self, lb: &str, list: Option<&str>, now: Instant) {
        if !self.config.list_sweep {
            return;
        }
        let Some(entry) = self.entries.get_mut(lb) else {
            return;
        };
        if entry.list.as_deref() == list {
            return;
        }
        let old = entry.list.take();
        entry.unpark();
        if entry.recalled.take().is_some() {
            entry.due = now;
        }
        entry.list = list.map(str::to_owned);
        if let Some(list) = list {
            let sweep = self.sweeps.entry(list.to_owned()).or_insert(Sweep {
                due: now,
                in_flight: false,
                state: ListState::Untried,
                failures: 0,
                covered: 0,
                pages: 1,
                rows: HashMap::new(),
                sent: None,
            });
            sweep.covered += 1;
        }
        if let Some(old) = old {
            self.uncover(lb, &old, now);
        }
    }

    /// `lb` no longer counts under `list`. A list left with no LB goes; one left with too few
    /// to be read ([`LIST_MIN_COVERED`]: a tree of that LB says more) sends the LBs it still
    /// covers back to drift checks, since nothing reads the list for them any more.
    fn uncover(&mut self, lb: &str, list: &str, now: Instant) {
        let Some(sweep) = self.sweeps.get_mut(list) else {
            return;
        };
        sweep.rows.remove(lb);
        sweep.covered = sweep.covered.saturating_sub(1);
        if sweep.covered == 0 {
            self.sweeps.remove(list);
        } else if sweep.covered < LIST_MIN_COVERED && sweep.state == ListState::Working {
            let settled = self.entries.values().filter(|e| !e.urgent).count();
            let drift = self.drift_interval(settled);
            for entry in self
                .entries
                .values_mut()
                .filter(|e| e.list.as_deref() == Some(list))
            {
                entry.unpark();
                entry.due = entry.due.min(now + drift);
            }
        }
    }

    /// Stops scheduling `lb`.
    pub fn remove(&mut self, lb: &str, now: Instant) {
        if let Some(list) = self.entries.remove(lb).and_then(|e| e.list) {
            self.uncover(lb, &list, now);
        }
    }

    /// The working list that covers `lb`, if any.
    fn listing(&self, lb: &str) -> Option<&str> {
        let list = self.entries.get(lb)?.list.as_deref()?;
        let working = self
            .sweeps
            .get(list)
            .is_some_and(|s| s.state == ListState::Working && s.covered >= LIST_MIN_COVERED);
        working.then_some(list)
    }

    /// How often a list is read while nothing it covers is locked: `sweep_settled`, stretched
    /// so that all lists in use stay within the drift share of the budget.
    fn sweep_interval(&self) -> Duration {
        self.paced(self.config.sweep_settled)
    }

    /// `floor`, or longer if reading every list in use that often would take more than the
    /// drift share of the budget.
    fn paced(&self, floor: Duration) -> Duration {
        let pages: usize = self
            .sweeps
            .values()
            .filter(|s| s.covered >= LIST_MIN_COVERED)
            .map(|s| s.pages)
            .sum();
        let rate = (self.config.budget_qps * self.config.drift_share).max(f64::MIN_POSITIVE);
        Duration::from_secs_f64(pages as f64 / rate).max(floor)
    }

    /// How `list` stands.
    pub fn list_state(&self, list: &str) -> Option<ListState> {
        self.sweeps.get(list).map(|s| s.state)
    }

    /// The LBs `list` covers.
    pub fn covered_by(&self, list: &str) -> std::collections::HashSet<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.list.as_deref() == Some(list))
            .map(|(lb, _)| lb.clone())
            .collect()
    }

    /// Lists read (covering enough LBs to be worth it), by state.
    pub fn list_counts(&self) -> ListCounts {
        let mut counts = ListCounts::default();
        for sweep in self
            .sweeps
            .values()
            .filter(|s| s.covered >= LIST_MIN_COVERED)
        {
            match sweep.state {
                ListState::Working => counts.working += 1,
                ListState::Untried => counts.untried += 1,
                ListState::Unavailable { .. } => counts.unavailable += 1,
            }
        }
        counts
    }

    /// A list answered with `rows` (every LB its identity sees): an LB whose row changed
    /// since the last list, or that it shows unlocked while parked, is due now; one it shows
    /// locked is parked; one it listed before and not now is due now, so its tree can tell
    /// whether it is gone. The pages after the first are charged to the budget now (the pick
    /// paid for one). Returns what the list confirms of recalled states and last trees.
    pub fn listed(&mut self, list: &str, rows: &[LoadBalancerRow], now: Instant) -> ListFindings {
        let mut findings = ListFindings::default();
        let Some(sweep) = self.sweeps.get_mut(list) else {
            return findings;
        };
        let list_sent = sweep.sent.take().unwrap_or(now);
        sweep.pages = rows.len().div_ceil(LIST_PAGE).max(1);
        self.tokens -= (sweep.pages - 1) as f64;
        sweep.in_flight = false;
        sweep.failures = 0;
        sweep.state = ListState::Working;
        let (locked_max, urgent_fresh) = (self.config.locked_max, self.config.urgent_fresh);
        let by_id: HashMap<&str, &LoadBalancerRow> =
            rows.iter().map(|row| (row.id.as_str(), row)).collect();
        let mut any_parked = false;
        for (lb, entry) in self
            .entries
            .iter_mut()
            .filter(|(_, e)| e.list.as_deref() == Some(list))
        {
            let Some(row) = by_id.get(lb.as_str()) else {
                if entry.recalled.take().is_some() {
                    findings.recalled.push((lb.clone(), None));
                    entry.due = entry.due.min(now);
                }
                // Listed before, gone now: its tree tells whether it is deleted. (One never
                // listed may be newer than the list; one gone stays unlisted: no tree each time.)
                if sweep.rows.remove(lb).is_some() {
                    entry.unpark();
                    entry.urgent = true;
                    entry.due = entry.due.min(now);
                }
                continue;
            };
            let mark = LbRowMark {
                provisioning: row.provisioning_status,
                operating: row.operating_status,
                updated_at: row.updated_at.clone(),
            };
            let before = sweep.rows.get(lb);
            let changed = before.is_some_and(|(before, _)| *before != mark);
            let row_since = match before {
                Some((before, since)) if *before == mark => *since,
                _ => now,
            };
            if let Some(recalled) = entry.recalled.take() {
                let holds = row.updated_at.as_deref() == Some(recalled.as_str())
                    && row.provisioning_status == ProvisioningStatus::Active;
                findings
                    .recalled
                    .push((lb.clone(), holds.then_some(row.operating_status)));
                if holds {
                    // Not picked before the engine has folded the recalled state in.
                    entry.vouched = Some(recalled);
                    entry.due = entry.due.max(now + locked_max);
                } else {
                    entry.due = entry.due.min(now);
                }
            } else if let Some(updated_at) = &row.updated_at
                && let Some((tree_sent, tree_answered)) = entry.last_tree
                && !entry.in_flight
                && !changed
                && !row.provisioning_status.is_pending()
                && list_sent >= tree_answered
                && tree_sent >= row_since + ROW_STAMP_RESOLUTION
                && entry.vouched.as_ref() != Some(updated_at)
            {
                entry.vouched = Some(updated_at.clone());
                findings
                    .vouched
                    .push((lb.clone(), tree_answered, updated_at.clone()));
            }
            if row.provisioning_status.is_pending() {
                // A tree would only show the lock; a deadline (a member turning stuck) still
                // brings its own poll.
                if !entry.parked && !entry.in_flight {
                    entry.park(now);
                    let parked_until = now + locked_max;
                    entry.due = entry
                        .deadline
                        .map_or(parked_until, |d| d.min(parked_until))
                        .max(entry.due);
                }
            } else if entry.parked || changed {
                entry.unpark();
                entry.urgent = true;
                entry.due = entry.due.min(now);
                entry.look_again |= entry.in_flight;
            }
            // A lock that lasts (a lost Octavia flow) stops setting the pace after
            // `urgent_fresh`; its LB still gets a tree every `locked_max`.
            any_parked |= entry
                .parked_since
                .is_some_and(|since| now.saturating_duration_since(since) < urgent_fresh);
            sweep.rows.insert(lb.clone(), (mark, row_since));
        }
        let pace = if any_parked {
            self.locked_interval()
        } else {
            self.sweep_interval()
        };
        if let Some(sweep) = self.sweeps.get_mut(list) {
            sweep.due = now + pace;
        }
        findings
    }

    /// A list was refused (403, 404: the policy does not allow it): the LBs it covers go
    /// back to their own polls until `list_retry` later.
    pub fn list_refused(&mut self, list: &str, now: Instant) {
        let until = now + self.config.list_retry;
        self.list_unavailable(list, until, now);
    }

    /// A list failed (5xx, timeout): tried again at the locked pace; after
    /// `LIST_FAILURES` in a row, as if refused.
    pub fn list_failed(&mut self, list: &str, now: Instant) {
        let (retry, pace) = (self.config.list_retry, self.config.sweep_locked);
        let Some(sweep) = self.sweeps.get_mut(list) else {
            return;
        };
        sweep.in_flight = false;
        sweep.failures += 1;
        if sweep.failures >= LIST_FAILURES {
            sweep.failures = 0;
            self.list_unavailable(list, now.later(retry), now);
        } else {
            sweep.due = now + pace;
        }
    }

    /// Holds a list until `until` (its endpoint asked us to slow down).
    pub fn defer_list(&mut self, list: &str, until: Instant) {
        if let Some(sweep) = self.sweeps.get_mut(list) {
            sweep.in_flight = false;
            sweep.due = sweep.due.max(until);
        }
    }

    fn list_unavailable(&mut self, list: &str, until: Instant, now: Instant) {
        let settled = self.entries.values().filter(|e| !e.urgent).count();
        let drift = self.drift_interval(settled);
        let Some(sweep) = self.sweeps.get_mut(list) else {
            return;
        };
        sweep.in_flight = false;
        sweep.state = ListState::Unavailable { until };
        sweep.due = until;
        sweep.rows.clear();
        for entry in self
            .entries
            .values_mut()
            .filter(|e| e.list.as_deref() == Some(list))
        {
            let back = if entry.urgent { now } else { now + drift };
            entry.unpark();
            entry.recalled = None;
            entry.due = entry.due.min(back);
        }
    }

    /// A member on this endpoint finished provisioning within `finish`.
    pub fn learn(&mut self, finish: Finish) {
        self.times.record(finish);
    }

    /// The member provisioning times this endpoint has learnt.
    pub fn provisioning_times(&self) -> &ProvisioningTimes {
        &self.times
    }

    /// When to look again at members being created, from what finished before: the soonest
    /// any of them could finish (no sooner than the fast pace, no later than `learned_max`), or
    /// `Outlasted` when every one has outlasted every window (an outlier beside a member still
    /// inside the windows does not slow the look that member needs). `Unknown` until enough
    /// are known.
    fn learned_wait(&self, creating_for: &[Duration]) -> NextFinish {
        let c = &self.config;
        let mut soonest: Option<Duration> = None;
        let mut outlasted = false;
        for elapsed in creating_for {
            match self.times.next_finish(*elapsed) {
                NextFinish::Unknown => return NextFinish::Unknown,
                NextFinish::Outlasted => outlasted = true,
                NextFinish::In(gap) => {
                    let gap = gap.min(c.learned_max).max(c.urgent_initial);
                    soonest = Some(soonest.map_or(gap, |s| s.min(gap)));
                }
            }
        }
        match soonest {
            Some(gap) => NextFinish::In(gap),
            None if outlasted => NextFinish::Outlasted,
            None => NextFinish::Unknown,
        }
    }

    /// The age through which `watched_enough` members other than `lb`'s were seen on their
    /// way: those that finished (their windows) and those still on theirs.
    fn watched_through_others(&self, lb: &str) -> Option<Duration> {
        let enough = self.config.watched_enough;
        let others = self
            .entries
            .iter()
            .filter(|(name, _)| name.as_str() != lb)
            .filter_map(|(_, e)| e.creating_seen);
        watched_through(self.times.longest_waits(enough).chain(others), enough)
    }

    /// The longest wait that keeps members on their way for `creating_for` within
    /// `unwatched_max` of any finish, except across ages others were `watched` through and
    /// past `unwatched_for`.
    fn evidence_cap(&self, creating_for: &[Duration], watched: Option<Duration>) -> Duration {
        // A pace set slower than the bound is the operator's choice.
        let floor = self.config.unwatched_max.max(self.config.urgent_initial);
        creating_for
            .iter()
            .filter(|elapsed| **elapsed < self.config.unwatched_for)
            .map(|elapsed| {
                let quiet = watched.and_then(|w| w.checked_sub(*elapsed));
                quiet.map_or(floor, |quiet| quiet.max(floor))
            })
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// A poll of `lb` finished with `outcome`.
    pub fn done(&mut self, lb: &str, outcome: &PollOutcome, now: Instant) {
        let PollOutcome {
            urgent,
            changed,
            deadline,
            ..
        } = *outcome;
        let listed = self.listing(lb).is_some();
        let settled_count =
            self.entries.values().filter(|e| !e.urgent).count() + usize::from(!urgent);
        let drift = if listed {
            let safety = self.safety_interval(settled_count);
            if outcome.read && !self.vouchable(lb) {
                safety.min(self.config.vouch_after)
            } else {
                safety
            }
        } else {
            self.drift_interval(settled_count)
        };
        let learned = if urgent {
            self.learned_wait(&outcome.creating_for)
        } else {
            NextFinish::Unknown
        };
        let evidence_cap = if urgent && !outcome.stuck && !outcome.creating_for.is_empty() {
            let watched = self.watched_through_others(lb);
            self.evidence_cap(&outcome.creating_for, watched)
        } else {
            Duration::MAX
        };
        let config = &self.config;
        let Some(entry) = self.entries.get_mut(lb) else {
            return;
        };
        entry.in_flight = false;
        let sent = entry.tree_sent.take();
        if outcome.read {
            entry.last_tree = sent.map(|sent| (sent, now));
            entry.vouched = None;
            entry.recalled = None;
            entry.creating_seen = outcome.creating_for.iter().max().copied();
        }
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
        } else if listed && outcome.lb_locked {
            entry.park(now);
            config.locked_max
        } else if let NextFinish::In(learned) = learned {
            learned.min(evidence_cap)
        } else if learned == NextFinish::Outlasted && !changed && was_urgent {
            // Slower than every member seen: most such are stuck, and the stuck deadline
            // brings its own poll.
            entry
                .back_off(config.urgent_backoff, config.outlasted_max)
                .min(evidence_cap)
        } else if changed || !was_urgent || fresh {
            // Too little known to aim: watch a new state closely for a while.
            config.urgent_initial
        } else {
            entry
                .back_off(config.urgent_backoff, config.urgent_max)
                .min(evidence_cap)
        };
        if !(urgent && listed && outcome.lb_locked) {
            entry.unpark();
        }
        entry.due = now + wait;
        if std::mem::take(&mut entry.look_again) {
            entry.urgent = true;
            entry.due = now;
        }
        entry.deadline = deadline;
        if let Some(deadline) = deadline {
            entry.due = entry.due.min(deadline.max(now));
        }
        if entry.parked
            && let Some(sweep) = entry.list.as_ref().and_then(|l| self.sweeps.get_mut(l))
        {
            sweep.due = sweep.due.min(now + config.sweep_locked);
        }
    }

    /// Whether a list could vouch for the tree of `lb` in flight: it was sent at least a
    /// second after a list first showed the LB's current row.
    fn vouchable(&self, lb: &str) -> bool {
        self.row_under_tree(lb).is_some()
    }

    /// The LB's row a list showed, settled, at least a second before the tree of `lb` in
    /// flight was sent: Octavia wrote nothing stamped with it after the tree was sent, so the
    /// row vouches for what the tree reads, without waiting for the next list. Were the LB
    /// written again after that list, the row is older than the tree: a restart that finds a
    /// newer row reads a tree again, so the stamp is never trusted for older members.
    pub fn row_before_tree(&self, lb: &str) -> Option<String> {
        let (mark, _) = self.row_under_tree(lb)?;
        if mark.provisioning.is_pending() {
            return None;
        }
        mark.updated_at.clone()
    }

    fn row_under_tree(&self, lb: &str) -> Option<&(LbRowMark, Instant)> {
        let entry = self.entries.get(lb)?;
        let sent = entry.tree_sent?;
        let list = entry.list.as_ref()?;
        let row = self.sweeps.get(list)?.rows.get(lb)?;
        (sent >= row.1 + ROW_STAMP_RESOLUTION).then_some(row)
    }

    /// `lb`'s state as of `updated_at` is recalled from before a restart: it waits for the
    /// list (brought forward) to show whether its row is unchanged, instead of a tree; if no
    /// list answers, a tree after `locked_max`.
    pub fn recall(&mut self, lb: &str, updated_at: &str, now: Instant) {
        let Some(list) = self.listing_or_untried(lb) else {
            return;
        };
        let (first_look, locked_max) = (self.config.look_after_change, self.config.locked_max);
        let Some(sweep) = self.sweeps.get_mut(&list) else {
            return;
        };
        sweep.due = sweep.due.min(now + first_look);
        // A list covering too few LBs is not read: unless another LB joins it soon, a tree.
        let wait = if sweep.covered >= LIST_MIN_COVERED {
            locked_max
        } else {
            first_look
        };
        if let Some(entry) = self.entries.get_mut(lb)
            && entry.last_tree.is_none()
            && !entry.in_flight
        {
            entry.recalled = Some(updated_at.to_owned());
            entry.due = now + wait;
        }
    }

    /// The list covering `lb` if it works or has not been tried yet (not refused or failing).
    fn listing_or_untried(&self, lb: &str) -> Option<String> {
        let list = self.entries.get(lb)?.list.clone()?;
        let sweep = self.sweeps.get(&list)?;
        matches!(sweep.state, ListState::Working | ListState::Untried).then_some(list)
    }

    /// How often lists are read while an LB they cover is locked: `sweep_locked`, stretched
    /// so that all lists in use stay within the drift share of the budget.
    fn locked_interval(&self) -> Duration {
        self.paced(self.config.sweep_locked)
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
        for sweep in self.sweeps.values_mut().filter(|s| s.in_flight) {
            sweep.in_flight = false;
            sweep.due = sweep.due.min(now);
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

    /// How often a settled LB a working list covers gets a whole status tree anyway, with
    /// `settled` settled LBs: within `safety_share` of the budget, at least `safety_min`.
    pub fn safety_interval(&self, settled: usize) -> Duration {
        let rate = (self.config.budget_qps * self.config.safety_share).max(f64::MIN_POSITIVE);
        Duration::from_secs_f64(settled as f64 / rate).max(self.config.safety_min)
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
        let list = self
            .sweeps
            .iter()
            .filter(|(_, s)| !s.in_flight && s.due <= now && s.covered >= LIST_MIN_COVERED)
            .min_by(|(a, x), (b, y)| (x.due, a).cmp(&(y.due, b)))
            .map(|(list, _)| list.clone());
        if let Some(list) = list
            && let Some(sweep) = self.sweeps.get_mut(&list)
        {
            self.tokens -= 1.0;
            sweep.in_flight = true;
            sweep.sent = Some(now);
            return Some(Pick {
                lag: now.saturating_duration_since(sweep.due),
                urgent: true,
                target: Target::List(list),
            });
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
        entry.tree_sent = Some(now);
        Some(Pick {
            lag: now.saturating_duration_since(entry.due),
            urgent: entry.urgent,
            target: Target::Lb(lb),
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
        for sweep in self
            .sweeps
            .values()
            .filter(|s| !s.in_flight && s.covered >= LIST_MIN_COVERED)
        {
            urgent = Some(urgent.map_or(sweep.due, |due| due.min(sweep.due)));
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

    /// The defaults at the 1.5 s pace these tests' arithmetic was written for.
    fn paced() -> ScheduleConfig {
        let pace = Duration::from_millis(1500);
        ScheduleConfig {
            urgent_initial: pace,
            look_after_change: pace,
            sweep_locked: pace,
            ..ScheduleConfig::default()
        }
    }

    fn config(qps: f64) -> ScheduleConfig {
        ScheduleConfig {
            budget_qps: qps,
            burst: qps,
            urgent_fresh: Duration::ZERO,
            ..paced()
        }
    }

    fn outcome(urgent: bool, changed: bool, deadline: Option<Instant>) -> PollOutcome {
        PollOutcome {
            urgent,
            changed,
            deadline,
            ..PollOutcome::default()
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
            assert_eq!(pick.lb(), Some("lb"));
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
        assert_eq!(first.lb(), Some("urgent"));
        assert!(first.urgent);
        // Over a long stretch, drift polls use at most half the budget.
        let mut drift = 0u32;
        let mut now = later;
        for _ in 0..2000 {
            now += secs(0.01);
            if let Some(pick) = s.next(now) {
                if !pick.urgent {
                    drift += 1;
                    s.done(pick.lb().unwrap(), &outcome(false, false, None), now);
                } else {
                    s.done(pick.lb().unwrap(), &outcome(true, false, None), now);
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
                ..paced()
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
                s.done(pick.lb().unwrap(), &outcome(true, false, None), now);
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
                    .and_then(|p| p.lb().map(str::to_owned))
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
    fn an_lb_the_reconciler_just_changed_is_looked_at_a_second_later() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        // Just made: its first look, due at once, would only see PENDING_CREATE.
        s.wake("lb", false, t0);
        s.lb_changed("lb", false, t0);
        assert_eq!(s.next(t0), None, "no look at the lock it was just given");
        assert_eq!(s.wake_at(t0), Some(t0 + secs(1.0)));
        s.next(t0 + secs(1.0)).expect("the first look");
        // Still locked (a slow driver): followed at the urgent pace from there.
        s.done("lb", &outcome(true, false, None), t0 + secs(1.0));
        assert_eq!(s.wake_at(t0 + secs(1.0)), Some(t0 + secs(2.5)));
        // A later change of its own brings the next look forward, to a second after it.
        s.next(t0 + secs(2.5)).expect("the second look");
        s.done("lb", &outcome(false, true, None), t0 + secs(2.5));
        s.lb_changed("lb", false, t0 + secs(9.0));
        assert_eq!(s.wake_at(t0 + secs(9.0)), Some(t0 + secs(10.0)));
    }

    #[test]
    fn an_lb_changed_under_a_working_list_is_seen_unlocked_by_the_list_a_second_later() {
        let t0 = Instant::now();
        let mut s = listed_and_settled_with(config(10.0), &["a", "b"], t0);
        let changed = t0 + secs(5.0);
        s.lb_changed("a", false, changed);
        assert_eq!(s.wake_at(changed), Some(changed + secs(1.0)));
        let pick = s.next(changed + secs(1.0)).expect("due");
        assert_eq!(
            pick.target,
            Target::List("me".into()),
            "the list, not a tree"
        );
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
            .filter_map(|k| {
                s.next(now + secs(f64::from(k)))
                    .and_then(|p| p.lb().map(str::to_owned))
            })
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
        let picks: Vec<String> = (0..4)
            .filter_map(|_| s.next(t0).and_then(|p| p.lb().map(str::to_owned)))
            .collect();
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

    /// A scheduler that learnt finishes at 2-3.5 s and 28.5-30 s, its LB "lb" polled at `t0`.
    fn learned_two_windows(t0: Instant) -> Scheduler {
        let mut s = Scheduler::new(config(10.0), t0);
        for _ in 0..ENOUGH_TO_LEARN {
            s.learn(finish(2.0, 3.5));
            s.learn(finish(28.5, 30.0));
        }
        s.wake("lb", true, t0);
        s.next(t0).unwrap();
        s
    }

    #[test]
    fn members_being_created_are_polled_where_members_finish() {
        let t0 = Instant::now();
        let mut s = learned_two_windows(t0);
        let creating = |elapsed: f64| PollOutcome {
            urgent: true,
            creating_for: vec![secs(elapsed)],
            ..PollOutcome::default()
        };
        let mut waits = Vec::new();
        let mut now = t0;
        for elapsed in [0.0, 2.0, 3.5, 28.5, 30.0, 31.5, 33.75] {
            s.done("lb", &creating(elapsed), now);
            let due = s.wake_at(now).unwrap();
            waits.push((due - now).as_secs_f64());
            now = due;
            s.next(now).unwrap();
        }
        // Up to the first window, through it at the fast pace, across the quiet stretch in one
        // wait, through the next window at the fast pace, then, once past every window seen,
        // backing off (an outlier: its stuck deadline brings a poll of its own).
        assert_eq!(waits, [2.0, 1.5, 25.0, 1.5, 1.5, 2.25, 3.375]);
    }

    #[test]
    fn an_outlier_beside_a_member_on_its_way_does_not_slow_that_members_polls() {
        // The waits between polls of one LB whose new member was requested at the first poll,
        // with or without an outlier on its way since `old` seconds before.
        let waits = |old: Option<f64>| {
            let t0 = Instant::now();
            let mut s = learned_two_windows(t0);
            let (mut now, mut waits) = (t0, Vec::new());
            for _ in 0..6 {
                let age = (now - t0).as_secs_f64();
                let creating_for = std::iter::once(age)
                    .chain(old.map(|old| old + age))
                    .map(secs)
                    .collect();
                let outcome = PollOutcome {
                    urgent: true,
                    creating_for,
                    ..PollOutcome::default()
                };
                s.done("lb", &outcome, now);
                let due = s.wake_at(now).unwrap();
                waits.push((due - now).as_secs_f64());
                now = due;
                s.next(now).unwrap();
            }
            waits
        };
        assert_eq!(waits(None), [2.0, 1.5, 25.0, 1.5, 1.5, 2.25]);
        assert_eq!(waits(Some(200.0)), waits(None));
    }

    #[test]
    fn a_member_past_every_finish_backs_off_only_as_far_as_others_were_watched() {
        let t0 = Instant::now();
        // A scheduler that learnt finishes at 2-3.5 s, its LB "a" woken at `t0`.
        let learned = || {
            let mut s = Scheduler::new(config(10.0), t0);
            for _ in 0..ENOUGH_TO_LEARN {
                s.learn(finish(2.0, 3.5));
            }
            s.wake("a", true, t0);
            s
        };
        let mut s = learned();
        let creating = |elapsed: f64, stuck: bool| PollOutcome {
            urgent: true,
            creating_for: vec![secs(elapsed)],
            stuck,
            read: true,
            ..PollOutcome::default()
        };
        // Walks "a" through `polls` reads of a member on its way since `since`: the waits.
        let walk = |s: &mut Scheduler, since: Instant, polls: usize, stuck: bool| {
            let due_a = |s: &Scheduler| s.entries.get("a").map(|e| e.due);
            let mut now = due_a(s).unwrap_or(t0).max(since);
            let mut waits = Vec::new();
            for _ in 0..polls {
                s.done("a", &creating((now - since).as_secs_f64(), stuck), now);
                let due = due_a(s).unwrap();
                waits.push((due - now).as_secs_f64());
                now = due;
            }
            waits
        };
        // Past every finish seen, and no member ever watched this long: polls stay within
        // `unwatched_max` while it is younger than `unwatched_for`.
        let waits = walk(&mut s, t0, 12, false);
        assert!(waits[2..].iter().all(|w| *w <= 4.0), "{waits:?}");
        assert_eq!(waits.last(), Some(&4.0), "{waits:?}");
        // Three other members have been seen on their way for 300 s: across ages up to
        // there, the outlier's polls back off.
        for other in ["b", "c", "d"] {
            s.wake(other, false, t0);
            s.done(other, &creating(300.0, false), t0);
        }
        let waits = walk(&mut s, t0, 4, false);
        assert!(waits.iter().any(|w| *w > 4.0), "{waits:?}");
        // Flagged stuck, it backs off with no evidence needed.
        let mut lone = learned();
        let waits = walk(&mut lone, t0, 12, true);
        assert!(waits.iter().any(|w| *w > 4.0), "{waits:?}");
        // Older than `unwatched_for`, it backs off to the slow pace with no evidence either.
        let mut late = learned();
        let (mut now, mut polls) = (t0, Vec::new());
        while polls.len() < 40 {
            let age = 150.0 + (now - t0).as_secs_f64();
            late.done("a", &creating(age, false), now);
            let due = late.entries.get("a").map(|e| e.due).unwrap();
            polls.push((age, (due - now).as_secs_f64()));
            now = due;
        }
        let (young, old): (Vec<_>, Vec<_>) = polls.iter().partition(|(age, _)| *age < 180.0);
        assert!(young.iter().all(|(_, wait)| *wait <= 4.0), "{polls:?}");
        assert!(old.iter().all(|(_, wait)| *wait > 30.0), "{polls:?}");
        assert_eq!(old.last().map(|(_, wait)| *wait), Some(60.0), "{polls:?}");
    }

    #[test]
    fn watched_through_is_the_age_enough_members_reached() {
        let waits = [10.0, 40.0, 20.0, 30.0].map(secs);
        assert_eq!(watched_through(waits, 3), Some(secs(20.0)));
        assert_eq!(watched_through(waits, 5), None);
        assert_eq!(watched_through(waits, 0), Some(Duration::MAX));
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

    // ------------------------------------------------------------------ the LB list

    fn row(lb: &str, status: ProvisioningStatus, updated_at: &str) -> LoadBalancerRow {
        LoadBalancerRow {
            id: lb.to_owned(),
            provisioning_status: status,
            operating_status: OperatingStatus::Online,
            updated_at: Some(updated_at.to_owned()),
        }
    }

    fn active_rows(lbs: &[&str], updated_at: &str) -> Vec<LoadBalancerRow> {
        lbs.iter()
            .map(|lb| row(lb, ProvisioningStatus::Active, updated_at))
            .collect()
    }

    /// A scheduler with `lbs` settled (each polled once) under one working list.
    fn listed_and_settled(lbs: &[&str], t0: Instant) -> Scheduler {
        listed_and_settled_with(config(10.0), lbs, t0)
    }

    fn listed_and_settled_with(cfg: ScheduleConfig, lbs: &[&str], t0: Instant) -> Scheduler {
        let mut s = Scheduler::new(cfg, t0);
        for lb in lbs {
            s.wake(lb, false, t0);
            s.cover(lb, Some("me"), t0);
        }
        let list = s.next(t0).expect("the list goes first");
        assert_eq!(list.target, Target::List("me".into()));
        s.listed("me", &active_rows(lbs, "t0"), t0);
        assert_eq!(s.list_state("me"), Some(ListState::Working));
        while let Some(pick) = s.next(t0) {
            s.done(pick.lb().expect("a tree"), &outcome(false, false, None), t0);
        }
        s
    }

    /// Every pick from `from` to `to`, answered: lists with `rows`, trees with `outcome`.
    fn run_until(
        s: &mut Scheduler,
        from: Instant,
        to: Instant,
        rows: &dyn Fn(Instant) -> Vec<LoadBalancerRow>,
        tree: &dyn Fn(&str) -> PollOutcome,
    ) -> Vec<(Instant, Target)> {
        let mut picks = Vec::new();
        let mut now = from;
        while now < to {
            while let Some(pick) = s.next(now) {
                match &pick.target {
                    Target::List(list) => {
                        s.listed(list, &rows(now), now);
                    }
                    Target::Lb(lb) => s.done(lb, &tree(lb), now),
                }
                picks.push((now, pick.target));
            }
            now = s.wake_at(now).unwrap_or(to).max(now + secs(0.001));
        }
        picks
    }

    #[test]
    fn settled_lbs_under_a_list_cost_one_list_per_sweep_and_a_rare_safety_tree() {
        let t0 = Instant::now();
        let lbs: Vec<String> = (0..100).map(|i| format!("lb-{i}")).collect();
        let names: Vec<&str> = lbs.iter().map(String::as_str).collect();
        let mut s = listed_and_settled(&names, t0);
        let hour = t0 + secs(3600.0);
        let rows = |_| active_rows(&names, "t0");
        let settled = |_: &str| outcome(false, false, None);
        run_until(&mut s, t0, hour, &rows, &settled);
        let picks = run_until(&mut s, hour, hour + secs(3600.0), &rows, &settled);
        let lists = picks
            .iter()
            .filter(|(_, t)| matches!(t, Target::List(_)))
            .count();
        let trees = picks.len() - lists;
        // A list every 30 s; the safety trees at 0.5% of 10/s: 100 LBs every 2,000 s.
        assert!((119..=121).contains(&lists), "{lists} lists in an hour");
        assert!(
            (170..=190).contains(&trees),
            "{trees} safety trees in an hour"
        );
        // Without the list: a drift tree per LB every 60 s.
        let mut plain = Scheduler::new(
            ScheduleConfig {
                list_sweep: false,
                ..config(10.0)
            },
            t0,
        );
        for lb in &names {
            plain.wake(lb, false, t0);
            plain.cover(lb, Some("me"), t0);
        }
        let plain_picks = run_until(&mut plain, t0, hour, &|_| Vec::new(), &|_| {
            outcome(false, false, None)
        });
        assert!(plain_picks.len() >= 100 * 59, "{}", plain_picks.len());
        assert!(plain_picks.iter().all(|(_, t)| matches!(t, Target::Lb(_))));
    }

    #[test]
    fn a_changed_row_brings_that_lb_alone_to_a_tree_at_the_next_list() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b", "c"], t0);
        let changed_at = t0 + secs(40.0);
        let picks = run_until(
            &mut s,
            t0,
            t0 + secs(100.0),
            &|now| {
                let mut rows = active_rows(&["a", "b", "c"], "t0");
                if now >= changed_at {
                    rows[1].updated_at = Some("t1".into());
                }
                rows
            },
            &|_| outcome(false, false, None),
        );
        let trees: Vec<(Instant, &Target)> = picks
            .iter()
            .filter(|(_, t)| matches!(t, Target::Lb(_)))
            .map(|(at, t)| (*at, t))
            .collect();
        assert_eq!(trees.len(), 1, "{trees:?}");
        assert_eq!(trees[0].1, &Target::Lb("b".into()));
        assert!(
            trees[0].0 - changed_at <= secs(30.0),
            "drift seen within a sweep"
        );
    }

    #[test]
    fn a_locked_lb_waits_for_the_list_to_show_it_unlocked() {
        let t0 = Instant::now();
        // Locks count for the pace for `urgent_fresh` (180 s by default).
        let cfg = ScheduleConfig {
            urgent_fresh: secs(180.0),
            ..config(10.0)
        };
        let mut s = listed_and_settled_with(cfg, &["a", "b"], t0);
        // New desired state for `a`: parked; the list is read within `look_after_change`.
        let woken = t0 + secs(5.0);
        s.wake("a", true, woken);
        let unlocked_at = woken + secs(60.0);
        let picks = run_until(
            &mut s,
            woken,
            woken + secs(90.0),
            &|now| {
                let a = if now < unlocked_at {
                    ProvisioningStatus::PendingUpdate
                } else {
                    ProvisioningStatus::Active
                };
                vec![
                    row("a", a, "t5"),
                    row("b", ProvisioningStatus::Active, "t0"),
                ]
            },
            &|_| outcome(false, true, None),
        );
        let trees: Vec<Instant> = picks
            .iter()
            .filter(|(_, t)| *t == Target::Lb("a".into()))
            .map(|(at, _)| *at)
            .collect();
        // No tree while locked but the one `locked_max` allows; one within a locked sweep
        // of the unlock.
        let while_locked = trees.iter().filter(|at| **at < unlocked_at).count();
        assert!(while_locked <= 2, "{trees:?}");
        let after = trees.iter().find(|at| **at >= unlocked_at).copied();
        assert!(
            after.is_some_and(|at| at - unlocked_at <= secs(1.5)),
            "{trees:?}"
        );
        let lists = picks
            .iter()
            .filter(|(at, t)| matches!(t, Target::List(_)) && *at < unlocked_at)
            .count();
        assert!((38..=42).contains(&lists), "{lists} lists while locked");
    }

    #[test]
    fn a_parked_lb_still_meets_its_deadline() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        s.wake("a", false, t0);
        let deadline = t0 + secs(4.0);
        // Its tree sees the LB locked with a member turning stuck at `deadline`.
        let locked = PollOutcome {
            urgent: true,
            deadline: Some(deadline),
            lb_locked: true,
            ..PollOutcome::default()
        };
        s.done("a", &locked, t0);
        let rows = vec![
            row("a", ProvisioningStatus::PendingUpdate, "t0"),
            row("b", ProvisioningStatus::Active, "t0"),
        ];
        let picks = run_until(&mut s, t0, t0 + secs(10.0), &|_| rows.clone(), &|_| {
            locked.clone()
        });
        let first_tree = picks
            .iter()
            .find(|(_, t)| *t == Target::Lb("a".into()))
            .map(|(at, _)| *at);
        assert_eq!(first_tree, Some(deadline));
    }

    #[test]
    fn a_refused_list_sends_its_lbs_back_to_drift_checks_and_is_tried_again_later() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        let at = t0 + secs(30.0);
        assert_eq!(
            s.next(at).map(|p| p.target),
            Some(Target::List("me".into()))
        );
        s.list_refused("me", at);
        assert!(matches!(
            s.list_state("me"),
            Some(ListState::Unavailable { .. })
        ));
        assert_eq!(s.list_counts().unavailable, 1);
        // Drift trees resume within the drift interval (60 s), not the safety interval.
        let picks = run_until(&mut s, at, at + secs(70.0), &|_| Vec::new(), &|_| {
            outcome(false, false, None)
        });
        assert_eq!(picks.len(), 2, "{picks:?}");
        assert!(picks.iter().all(|(_, t)| matches!(t, Target::Lb(_))));
        // Tried again after `list_retry`.
        let retry = at + secs(3600.0);
        assert_eq!(
            s.next(retry).map(|p| p.target),
            Some(Target::List("me".into()))
        );
    }

    #[test]
    fn three_failed_lists_in_a_row_fall_back() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        let mut now = t0 + secs(30.0);
        for _ in 0..2 {
            assert!(s.next(now).is_some_and(|p| p.lb().is_none()));
            s.list_failed("me", now);
            assert_eq!(s.list_state("me"), Some(ListState::Working));
            now += secs(1.5);
        }
        assert!(s.next(now).is_some_and(|p| p.lb().is_none()));
        s.list_failed("me", now);
        assert!(matches!(
            s.list_state("me"),
            Some(ListState::Unavailable { .. })
        ));
    }

    #[test]
    fn a_list_covering_one_lb_is_not_read() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("alone", false, t0);
        s.cover("alone", Some("me"), t0);
        assert_eq!(
            s.next(t0).map(|p| p.target),
            Some(Target::Lb("alone".into()))
        );
        assert_eq!(s.list_counts(), ListCounts::default());
    }

    #[test]
    fn every_page_of_a_list_is_paid_for() {
        let t0 = Instant::now();
        let names: Vec<String> = (0..2500).map(|i| format!("lb-{i}")).collect();
        let mut s = Scheduler::new(config(10.0), t0);
        for lb in &names {
            s.wake(lb, false, t0);
            s.cover(lb, Some("me"), t0);
        }
        let rows: Vec<LoadBalancerRow> = names
            .iter()
            .map(|lb| row(lb, ProvisioningStatus::Active, "t0"))
            .collect();
        assert!(s.next(t0).is_some_and(|p| p.lb().is_none()));
        s.listed("me", &rows, t0);
        // Burst 10, one paid at the pick, two more pages now: seven trees left at once.
        let trees = std::iter::from_fn(|| s.next(t0)).count();
        assert_eq!(trees, 7);
    }

    #[test]
    fn a_change_listed_while_a_tree_is_in_flight_gets_another_tree() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        // `a` has something on its way: its tree is due in 1.5 s, the list in 30 s.
        s.done("a", &outcome(true, true, None), t0);
        let at = t0 + secs(1.5);
        assert_eq!(
            s.next(at).and_then(|p| p.lb().map(str::to_owned)),
            Some("a".into())
        );
        // A list answers while that tree is in flight, showing `a` changed.
        let mut rows = active_rows(&["a", "b"], "t0");
        rows[0].updated_at = Some("t1".into());
        s.listed("me", &rows, at);
        s.done("a", &outcome(false, false, None), at);
        assert_eq!(
            s.next(at).and_then(|p| p.lb().map(str::to_owned)),
            Some("a".into())
        );
    }

    #[test]
    fn an_lb_gone_from_the_list_gets_one_tree_not_one_per_list() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b", "c"], t0);
        let picks = run_until(
            &mut s,
            t0,
            t0 + secs(300.0),
            &|_| active_rows(&["a", "b"], "t0"),
            &|_| outcome(false, false, None),
        );
        let trees: Vec<&Target> = picks
            .iter()
            .map(|(_, t)| t)
            .filter(|t| matches!(t, Target::Lb(_)))
            .collect();
        assert_eq!(trees, [&Target::Lb("c".into())]);
    }

    #[test]
    fn an_lb_left_alone_under_its_list_goes_back_to_drift_checks() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        s.remove("b", t0);
        assert_eq!(s.list_counts(), ListCounts::default(), "one LB: not read");
        let picks = run_until(&mut s, t0, t0 + secs(61.0), &|_| Vec::new(), &|_| {
            outcome(false, false, None)
        });
        assert_eq!(picks.len(), 1, "{picks:?}");
        assert_eq!(picks[0].1, Target::Lb("a".into()));
    }

    #[test]
    fn a_lock_that_lasts_stops_setting_the_list_pace() {
        let t0 = Instant::now();
        let cfg = ScheduleConfig {
            urgent_fresh: secs(180.0),
            ..config(10.0)
        };
        let mut s = listed_and_settled_with(cfg, &["a", "b"], t0);
        s.wake("a", true, t0);
        let locked = |_| {
            vec![
                row("a", ProvisioningStatus::PendingUpdate, "t0"),
                row("b", ProvisioningStatus::Active, "t0"),
            ]
        };
        let stuck = PollOutcome {
            urgent: true,
            lb_locked: true,
            ..PollOutcome::default()
        };
        let tree = |lb: &str| {
            if lb == "a" {
                stuck.clone()
            } else {
                outcome(false, false, None)
            }
        };
        let picks = run_until(&mut s, t0, t0 + secs(900.0), &locked, &tree);
        let lists_after = |from: f64| {
            picks
                .iter()
                .filter(|(at, t)| matches!(t, Target::List(_)) && *at >= t0 + secs(from))
                .count()
        };
        // Fast while the lock is fresh, then every 30 s; the LB itself every 30 s throughout.
        assert!(
            lists_after(0.0) - lists_after(180.0) >= 100,
            "{}",
            lists_after(0.0)
        );
        assert!(
            lists_after(200.0) <= 25,
            "{} lists after the lock went stale",
            lists_after(200.0)
        );
        let trees = picks
            .iter()
            .filter(|(_, t)| *t == Target::Lb("a".into()))
            .count();
        assert!((29..=32).contains(&trees), "{trees} trees of the locked LB");
    }

    #[test]
    fn an_lb_moving_to_another_identity_leaves_its_old_list_and_partner_covered() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        s.cover("a", Some("other"), t0);
        // `b` alone under "me": nothing reads that list for it any more, so drift checks.
        let picks = run_until(&mut s, t0, t0 + secs(61.0), &|_| Vec::new(), &|_| {
            outcome(false, false, None)
        });
        assert!(
            picks.iter().any(|(_, t)| *t == Target::Lb("b".into())),
            "{picks:?}"
        );
    }

    #[test]
    fn a_list_in_flight_when_its_loop_died_is_read_again() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        let at = t0 + secs(30.0);
        assert!(s.next(at).is_some_and(|p| p.lb().is_none()));
        s.abandon_in_flight(at);
        assert_eq!(
            s.next(at).map(|p| p.target),
            Some(Target::List("me".into()))
        );
    }

    // ------------------------------------------------------------------ vouching and recall

    fn read(urgent: bool) -> PollOutcome {
        PollOutcome {
            read: true,
            ..outcome(urgent, false, None)
        }
    }

    /// Answers the picks due at `now`: lists with `rows`, trees as settled reads. Returns the
    /// findings of the lists read.
    fn answer(s: &mut Scheduler, now: Instant, rows: &[LoadBalancerRow]) -> Vec<ListFindings> {
        let mut findings = Vec::new();
        while let Some(pick) = s.next(now) {
            match &pick.target {
                Target::List(list) => findings.push(s.listed(list, rows, now)),
                Target::Lb(lb) => s.done(lb, &read(false), now),
            }
        }
        findings
    }

    #[test]
    fn a_list_vouches_for_a_tree_read_a_second_after_it_first_showed_the_row() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        let rows = active_rows(&["a", "b"], "t0");
        // Something wakes `a`: the list shows it unchanged, and a tree reads it.
        let t1 = t0 + secs(5.0);
        s.wake("a", false, t1);
        let look = s.wake_at(t1).expect("the list is brought forward");
        assert_eq!(answer(&mut s, look, &rows), [ListFindings::default()]);
        let answered = look;
        // The next list shows the row unchanged since before the tree was sent: vouched once.
        let next = s.wake_at(look).expect("the next list");
        let found = answer(&mut s, next, &rows);
        assert_eq!(
            found[0].vouched,
            [("a".to_owned(), answered, "t0".to_owned())]
        );
        let later = s.wake_at(next).expect("the next list");
        assert_eq!(answer(&mut s, later, &rows), [ListFindings::default()]);
    }

    /// Answers the lists due at `now` with `rows` and sends the first tree due: its LB.
    fn send_tree(s: &mut Scheduler, now: Instant, rows: &[LoadBalancerRow]) -> String {
        while let Some(pick) = s.next(now) {
            match pick.target {
                Target::List(list) => {
                    s.listed(&list, rows, now);
                }
                Target::Lb(lb) => return lb,
            }
        }
        panic!("no tree due at {now:?}");
    }

    #[test]
    fn a_row_listed_a_second_before_a_tree_vouches_for_it_and_a_newer_or_locked_one_does_not() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        // `a` is woken; the list shows its row as it was for 5 s: the tree sent then is
        // vouched for by that row while it is in flight.
        let t1 = t0 + secs(5.0);
        s.wake("a", false, t1);
        let look = s.wake_at(t1).expect("the list is brought forward");
        assert_eq!(
            send_tree(&mut s, look, &active_rows(&["a", "b"], "t0")),
            "a"
        );
        assert_eq!(s.row_before_tree("a"), Some("t0".to_owned()));
        assert_eq!(s.row_before_tree("b"), None, "no tree of b in flight");
        s.done("a", &read(false), look);
        assert_eq!(s.row_before_tree("a"), None, "no tree in flight");
        // A new row, and the tree it brings at once: Octavia may still write under it.
        let t2 = look + secs(30.0);
        let mut rows = active_rows(&["a", "b"], "t0");
        rows[0].updated_at = Some("t2".into());
        assert_eq!(send_tree(&mut s, t2, &rows), "a");
        assert_eq!(
            s.row_before_tree("a"),
            None,
            "the row is under a second old"
        );
        s.done("a", &read(false), t2);
        // A row that shows the LB locked vouches for nothing, however old.
        let t3 = t2 + secs(30.0);
        rows[0].provisioning_status = ProvisioningStatus::PendingUpdate;
        s.wake("a", true, t3);
        let t4 = s.wake_at(t3).expect("the list");
        assert!(
            s.next(t4)
                .is_some_and(|p| p.target == Target::List("me".into()))
        );
        s.listed("me", &rows, t4);
        let t5 = t4 + secs(40.0);
        assert_eq!(
            send_tree(&mut s, t5, &rows),
            "a",
            "the lock is looked at on its own"
        );
        assert_eq!(s.row_before_tree("a"), None);
    }

    #[test]
    fn a_tree_read_within_a_second_of_its_row_changing_is_not_vouched_and_read_again_later() {
        let t0 = Instant::now();
        let mut s = listed_and_settled(&["a", "b"], t0);
        // `a` changes: the list shows a new row, and a tree reads it at once.
        let t1 = t0 + secs(30.0);
        let mut rows = active_rows(&["a", "b"], "t0");
        rows[0].updated_at = Some("t1".into());
        assert_eq!(answer(&mut s, t1, &rows), [ListFindings::default()]);
        // Octavia may have written the row again within that second: no list can vouch for
        // that tree, so `a` gets another one `vouch_after` later (and b none).
        let picks = run_until(
            &mut s,
            t1 + secs(0.001),
            t1 + secs(300.0),
            &|_| rows.clone(),
            &|_| read(false),
        );
        let trees: Vec<_> = picks
            .iter()
            .filter(|(_, t)| t != &Target::List("me".into()))
            .collect();
        assert_eq!(trees, [&(t1 + secs(120.0), Target::Lb("a".into()))]);
    }

    #[test]
    fn a_recalled_state_stands_without_a_tree_while_the_list_shows_its_row_unchanged() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        for lb in ["a", "b", "c"] {
            s.wake(lb, false, t0);
            s.cover(lb, Some("me"), t0);
            s.recall(lb, "t0", t0);
        }
        // The list goes first and confirms `a`; `b`'s row moved, `c` is not listed.
        let mut rows = active_rows(&["a", "b"], "t0");
        rows[1].updated_at = Some("t1".into());
        let found = answer(&mut s, t0, &rows);
        let mut recalled = found[0].recalled.clone();
        recalled.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            recalled,
            [
                ("a".to_owned(), Some(OperatingStatus::Online)),
                ("b".to_owned(), None),
                ("c".to_owned(), None),
            ]
        );
        // The engine folds `a`'s recalled state in, as settled.
        s.done("a", &outcome(false, false, None), t0);
        // b and c were read at once (by `answer`); `a` gets no tree for a long while.
        let picks = run_until(
            &mut s,
            t0 + secs(0.001),
            t0 + secs(600.0),
            &|_| rows.clone(),
            &|_| read(false),
        );
        assert!(
            !picks.iter().any(|(_, t)| t == &Target::Lb("a".into())),
            "{picks:?}"
        );
    }

    #[test]
    fn a_recalled_lb_gets_a_tree_when_the_list_is_refused() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        for lb in ["a", "b"] {
            s.wake(lb, false, t0);
            s.cover(lb, Some("me"), t0);
            s.recall(lb, "t0", t0);
        }
        let list = s.next(t0).expect("the list goes first");
        assert_eq!(list.target, Target::List("me".into()));
        s.list_refused("me", t0);
        let mut trees: Vec<String> = std::iter::from_fn(|| s.next(t0))
            .filter_map(|p| p.lb().map(str::to_owned))
            .collect();
        trees.sort();
        assert_eq!(trees, ["a", "b"]);
    }

    #[test]
    fn a_lone_recalled_lb_is_read_soon_since_no_list_is_read_for_it() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(config(10.0), t0);
        s.wake("a", false, t0);
        s.cover("a", Some("me"), t0);
        s.recall("a", "t0", t0);
        assert_eq!(s.next(t0), None, "a list of one LB is not read");
        let soon = t0 + secs(1.5);
        assert_eq!(
            s.next(soon).and_then(|p| p.lb().map(str::to_owned)),
            Some("a".into())
        );
    }
}
