//! When each settled object's next complete pass is due, kept here rather than in
//! kube-runtime's scheduler. A requeue there holds two copies of the object's reference (its
//! map and its delay queue), about 600 bytes per object; at 1,000 clusters every settled
//! OpenStackCluster, OpenStackMachine and OpenStackServer waits there at once, 13,000 objects
//! and some 8 MB. Here an object costs a digest and an instant; a sweep of the store (every
//! `ControllerConfig::settled_sweep`) hands the due ones back to the controller
//! (`manager::sweep`). Pure: the caller gives the clock.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

/// An object key's 64-bit digest: how the per-object books know an object.
pub fn key_digest(key: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// One controller's settled objects, by key digest: when each one's next pass is due.
#[derive(Default)]
pub struct SettledBook {
    due: HashMap<u64, Instant>,
}

impl SettledBook {
    /// `key` settled: its next pass is due at `at`.
    pub fn settle(&mut self, key: u64, at: Instant) {
        self.due.insert(key, at);
    }

    /// `key` is not waiting here (it polls, backs off, waits for a change, or is gone).
    pub fn unsettle(&mut self, key: u64) {
        self.due.remove(&key);
    }

    /// Of the objects in the store (`live`, their key digests in store order), the positions
    /// of those due at `now`; their entries are taken, so each is handed back once. Entries
    /// of objects that left the store without a last pass are dropped once they outnumber the
    /// store.
    pub fn take_due(&mut self, live: &[u64], now: Instant) -> Vec<usize> {
        let due: Vec<usize> = live
            .iter()
            .enumerate()
            .filter(|(_, key)| self.due.get(key).is_some_and(|at| *at <= now))
            .map(|(position, _)| position)
            .collect();
        for position in &due {
            self.due.remove(&live[*position]);
        }
        if self.due.len() > live.len() {
            let live: HashSet<&u64> = live.iter().collect();
            self.due.retain(|key, _| live.contains(key));
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_settled_object_is_handed_back_once_when_due() {
        let mut book = SettledBook::default();
        let now = Instant::now();
        let (a, b, c) = (
            key_digest("osm/ns/a"),
            key_digest("osm/ns/b"),
            key_digest("osm/ns/c"),
        );
        book.settle(a, now + Duration::from_secs(600));
        book.settle(b, now + Duration::from_secs(30));
        let live = [a, b, c];
        assert!(book.take_due(&live, now).is_empty());
        assert_eq!(book.take_due(&live, now + Duration::from_secs(30)), [1]);
        assert!(
            book.take_due(&live, now + Duration::from_secs(60))
                .is_empty()
        );
        assert_eq!(book.take_due(&live, now + Duration::from_secs(600)), [0]);
        assert!(book.due.is_empty());
    }

    #[test]
    fn an_object_that_moves_on_is_not_handed_back() {
        let mut book = SettledBook::default();
        let now = Instant::now();
        let a = key_digest("osm/ns/a");
        book.settle(a, now);
        book.unsettle(a);
        assert!(
            book.take_due(&[a], now + Duration::from_secs(10))
                .is_empty()
        );
        // Settling again moves the due time; the last one counts.
        book.settle(a, now);
        book.settle(a, now + Duration::from_secs(600));
        assert!(
            book.take_due(&[a], now + Duration::from_secs(10))
                .is_empty()
        );
        assert_eq!(book.due.len(), 1);
    }

    #[test]
    fn objects_gone_from_the_store_do_not_pile_up() {
        let mut book = SettledBook::default();
        let later = Instant::now() + Duration::from_secs(600);
        let gone: Vec<u64> = (0..3)
            .map(|i| key_digest(&format!("osm/ns/gone-{i}")))
            .collect();
        for key in &gone {
            book.settle(*key, later);
        }
        let kept = key_digest("osm/ns/kept");
        book.settle(kept, later);
        assert!(book.take_due(&[kept], Instant::now()).is_empty());
        assert_eq!(
            book.due.len(),
            1,
            "only the object still in the store waits"
        );
    }
}
