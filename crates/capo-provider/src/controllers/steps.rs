//! Which steps of each object's complete pass over its cloud resources are fresh: done at the
//! object's current generation within the sync period. Between complete passes, a reconcile
//! skips fresh steps (and a wake-up from the engine only refreshes the gate). Pure: the
//! caller gives the clock and the sync period.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Per object key, which steps of its complete pass are fresh, and which objects have
/// begun their first pass since start.
#[derive(Default)]
pub struct StepBook {
    objects: HashMap<String, Steps>,
    /// Objects whose first pass since start has begun (see [`StepBook::settled_before`]).
    first_passes: HashSet<String>,
}

/// The fresh steps of one object.
struct Steps {
    generation: Option<i64>,
    /// The generation before our own spec write, which the pass that wrote still has.
    carried_from: Option<i64>,
    done: HashMap<&'static str, Instant>,
}

impl Steps {
    fn holds(&self, generation: Option<i64>) -> bool {
        self.generation == generation
            || (self.carried_from.is_some() && self.carried_from == generation)
    }
}

impl StepBook {
    /// Whether `step` of `key` at `generation` must run: never done, done for another
    /// generation, or `sync` or longer before `now`.
    pub fn due(
        &self,
        key: &str,
        step: &str,
        generation: Option<i64>,
        now: Instant,
        sync: Duration,
    ) -> bool {
        let Some(known) = self.objects.get(key).filter(|s| s.holds(generation)) else {
            return true;
        };
        known
            .done
            .get(step)
            .is_none_or(|at| now.saturating_duration_since(*at) >= sync)
    }

    /// `step` of `key` at `generation` found everything in place at `now`.
    pub fn done(&mut self, key: &str, step: &'static str, generation: Option<i64>, now: Instant) {
        let known = self.objects.entry(key.to_owned()).or_insert_with(|| Steps {
            generation,
            carried_from: None,
            done: HashMap::new(),
        });
        if !known.holds(generation) {
            known.generation = generation;
            known.carried_from = None;
            known.done.clear();
        }
        known.done.insert(step, now);
    }

    /// Our own spec write moved `key` from `from` to `to`: what was fresh stays fresh.
    pub fn carried(&mut self, key: &str, from: Option<i64>, to: Option<i64>) {
        if let Some(known) = self.objects.get_mut(key)
            && known.generation == from
        {
            known.generation = to;
            known.carried_from = from;
        }
    }

    /// Every step of `key` runs on its next pass (after an error: something moved).
    pub fn needed(&mut self, key: &str) {
        self.objects.remove(key);
    }

    /// `key` is gone.
    pub fn forget(&mut self, key: &str) {
        self.objects.remove(key);
        self.first_passes.remove(key);
    }

    /// Forgets every object but those `keep` keeps.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.objects.retain(|key, _| keep(key));
        self.first_passes.retain(|key| keep(key));
    }

    /// The first pass of `key` since this process started, for an object whose status says
    /// a complete pass at `generation` found everything in place (ours before a restart):
    /// `steps` count as done at `at`, which the caller draws at random within the last sync
    /// period. A restart then costs the cloud nothing for settled objects, and their next
    /// complete passes spread over a sync period instead of landing all at once. Only the
    /// first pass counts: later, the book knows better than the status.
    pub fn settled_before(
        &mut self,
        key: &str,
        steps: &[&'static str],
        generation: Option<i64>,
        at: Instant,
    ) {
        if self.objects.contains_key(key) || !self.first_passes.insert(key.to_owned()) {
            return;
        }
        let steps = Steps {
            generation,
            carried_from: None,
            done: steps.iter().map(|step| (*step, at)).collect(),
        };
        self.objects.insert(key.to_owned(), steps);
    }

    /// How long a settled `key` may wait before its next pass: until the complete pass that
    /// settled it is due, between `min` and `sync`. That pass is its newest step: steps done
    /// before it (a network made while the load balancer was still building) go stale
    /// first, but only a complete pass runs them again.
    pub fn settled_for(&self, key: &str, now: Instant, sync: Duration, min: Duration) -> Duration {
        let newest = self
            .objects
            .get(key)
            .and_then(|known| known.done.values().max().copied());
        match newest {
            Some(at) => sync
                .saturating_sub(now.saturating_duration_since(at))
                .max(min),
            None => sync,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYNC: Duration = Duration::from_secs(600);
    const MIN: Duration = Duration::from_secs(1);

    #[test]
    fn a_step_is_fresh_for_a_sync_period_at_its_generation() {
        let start = Instant::now();
        let mut book = StepBook::default();
        assert!(book.due("a", "network", Some(1), start, SYNC));
        book.done("a", "network", Some(1), start);
        assert!(!book.due("a", "network", Some(1), start + SYNC / 2, SYNC));
        assert!(book.due("a", "network", Some(1), start + SYNC, SYNC));
        assert!(book.due("a", "network", Some(2), start, SYNC));
        assert!(book.due("a", "other", Some(1), start, SYNC));
        book.needed("a");
        assert!(book.due("a", "network", Some(1), start, SYNC));
    }

    #[test]
    fn our_own_spec_write_keeps_steps_fresh_for_the_pass_that_wrote() {
        let start = Instant::now();
        let mut book = StepBook::default();
        book.done("a", "network", Some(1), start);
        book.carried("a", Some(1), Some(2));
        assert!(!book.due("a", "network", Some(2), start, SYNC));
        assert!(!book.due("a", "network", Some(1), start, SYNC));
        assert!(book.due("a", "network", Some(3), start, SYNC));
    }

    #[test]
    fn a_restart_spreads_settled_objects_over_the_sync_period() {
        let start = Instant::now() + SYNC;
        let mut book = StepBook::default();
        // Settled 400 s before the restart, by the draw: fresh now, due in 200 s.
        book.settled_before("a", &["complete", "network"], Some(3), start - SYNC * 2 / 3);
        assert!(!book.due("a", "complete", Some(3), start, SYNC));
        assert!(!book.due("a", "network", Some(3), start, SYNC));
        assert_eq!(
            book.settled_for("a", start, SYNC, MIN),
            Duration::from_secs(200)
        );
        assert!(book.due("a", "complete", Some(3), start + SYNC / 3, SYNC));
        // Not at another generation.
        assert!(book.due("a", "complete", Some(4), start, SYNC));
    }

    #[test]
    fn only_the_first_pass_since_start_trusts_the_status() {
        let start = Instant::now() + SYNC;
        let mut book = StepBook::default();
        book.settled_before("a", &["complete"], Some(1), start);
        // An error since: every step runs, whatever the status still says.
        book.needed("a");
        book.settled_before("a", &["complete"], Some(1), start);
        assert!(book.due("a", "complete", Some(1), start, SYNC));
        // A pass that ran is not overwritten either.
        book.done("b", "complete", Some(1), start);
        book.settled_before("b", &["complete"], Some(1), start - SYNC);
        assert!(!book.due("b", "complete", Some(1), start, SYNC));
        // A deleted object that comes back is a new one.
        book.forget("a");
        book.settled_before("a", &["complete"], Some(1), start);
        assert!(!book.due("a", "complete", Some(1), start, SYNC));
    }

    #[test]
    fn an_object_without_fresh_steps_waits_a_sync_period() {
        let now = Instant::now();
        let mut book = StepBook::default();
        assert_eq!(book.settled_for("none", now, SYNC, MIN), SYNC);
        book.done("a", "complete", None, now);
        assert_eq!(book.settled_for("a", now, SYNC, MIN), SYNC);
        assert_eq!(book.settled_for("a", now + SYNC * 2, SYNC, MIN), MIN);
    }

    #[test]
    fn a_step_done_before_the_complete_pass_does_not_hurry_the_next_one() {
        let start = Instant::now();
        let mut book = StepBook::default();
        // The network at the first pass; the load balancer took five more minutes, then
        // the complete pass settled.
        book.done("a", "network", Some(1), start);
        book.done("a", "complete", Some(1), start + SYNC / 2);
        // Past the network's sync period: the object waits for its complete pass, it does
        // not come back every second while the network is stale.
        let now = start + SYNC;
        assert_eq!(book.settled_for("a", now, SYNC, MIN), SYNC / 2);
    }
}
