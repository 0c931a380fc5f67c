//! Per-object backoff for reconciles that fail transiently: exponential, capped, with jitter so
//! that objects failing together (a Keystone outage) do not come back together, and reset by
//! the first success. Pure: the caller passes the random fraction.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// How delays grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    /// The first retry's delay.
    pub initial: Duration,
    /// Growth per consecutive failure.
    pub factor: f64,
    /// No delay exceeds this.
    pub cap: Duration,
    /// Each delay is drawn from `[delay * (1 - jitter), delay]`.
    pub jitter: f64,
}

impl Default for BackoffPolicy {
    /// controller-runtime's per-item limiter starts at 5 ms; a cloud call is slower than
    /// that, so ours starts at 1 s and stops at 5 minutes.
    fn default() -> Self {
        BackoffPolicy {
            initial: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl BackoffPolicy {
    /// The delay after `failures` consecutive failures (1 for the first), for a random
    /// `fraction` in [0, 1).
    pub fn delay(&self, failures: u32, fraction: f64) -> Duration {
        let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        let grown = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exponent);
        let capped = grown.min(self.cap.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0) * fraction.clamp(0.0, 1.0);
        Duration::from_secs_f64(capped * (1.0 - jitter))
    }
}

/// Consecutive failures per object.
#[derive(Debug)]
pub struct Backoff<K> {
    policy: BackoffPolicy,
    failures: HashMap<K, u32>,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// No object failing yet; delays follow `policy`.
    pub fn new(policy: BackoffPolicy) -> Self {
        Backoff {
            policy,
            failures: HashMap::new(),
        }
    }

    /// Records a failure of `key`; the delay before its next try. A cloud's own Retry-After,
    /// if longer, wins.
    pub fn failed(&mut self, key: &K, retry_after: Option<Duration>, fraction: f64) -> Duration {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        *failures = failures.saturating_add(1);
        let delay = self.policy.delay(*failures, fraction);
        retry_after.map_or(delay, |asked| delay.max(asked))
    }

    /// `key` reconciled: its next failure starts from the beginning.
    pub fn succeeded(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// `key` is gone.
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// Forgets every object but those `keep` keeps.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.failures.retain(|key, _| keep(key));
    }

    /// Objects currently backing off.
    pub fn len(&self) -> usize {
        self.failures.len()
    }

    /// Whether no object is backing off.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let policy = BackoffPolicy::default();
        let delays: Vec<f64> = (1..=12).map(|n| secs(policy.delay(n, 0.0))).collect();
        assert_eq!(&delays[..5], &[1.0, 2.0, 4.0, 8.0, 16.0]);
        assert_eq!(delays[9], 300.0, "capped: {delays:?}");
        assert_eq!(delays[11], 300.0);
        assert_eq!(secs(policy.delay(u32::MAX, 0.0)), 300.0, "no overflow");
    }

    #[test]
    fn jitter_only_shortens_within_its_share() {
        let policy = BackoffPolicy::default();
        for fraction in [0.0, 0.25, 0.5, 0.99, 1.0, -3.0, 7.0] {
            let delay = secs(policy.delay(4, fraction));
            assert!((6.4..=8.0).contains(&delay), "{fraction}: {delay}");
        }
    }

    #[test]
    fn each_object_backs_off_on_its_own_and_success_resets_it() {
        let mut backoff = Backoff::new(BackoffPolicy::default());
        let (a, b) = ("ns/a".to_owned(), "ns/b".to_owned());
        assert_eq!(secs(backoff.failed(&a, None, 0.0)), 1.0);
        assert_eq!(secs(backoff.failed(&a, None, 0.0)), 2.0);
        assert_eq!(
            secs(backoff.failed(&b, None, 0.0)),
            1.0,
            "b is not slowed by a"
        );
        assert_eq!(secs(backoff.failed(&a, None, 0.0)), 4.0);
        backoff.succeeded(&a);
        assert_eq!(secs(backoff.failed(&a, None, 0.0)), 1.0);
        backoff.forget(&a);
        backoff.forget(&b);
        assert!(backoff.is_empty());
    }

    #[test]
    fn a_longer_retry_after_wins_and_a_shorter_one_does_not_hurry_us() {
        let mut backoff = Backoff::new(BackoffPolicy::default());
        let key = "ns/a".to_owned();
        let asked = Duration::from_secs(30);
        assert_eq!(backoff.failed(&key, Some(asked), 0.0), asked);
        for _ in 0..6 {
            backoff.failed(&key, None, 0.0);
        }
        assert_eq!(
            secs(backoff.failed(&key, Some(Duration::from_secs(1)), 0.0)),
            128.0
        );
    }
}
