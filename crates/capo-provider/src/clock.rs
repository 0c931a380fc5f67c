//! Deadlines that never overflow. `now + wait` panics when `wait` is longer than the clock can
//! hold, and a wait can come from outside (a Retry-After, a flag, a Lease); a deadline out of
//! reach is as good as never, so [`Later::later`] holds it to [`FAR`] ahead.

use std::time::Duration;

/// The furthest deadline: longer than any wait capo-rs means (flags are held to it too), short
/// enough for any monotonic clock to add.
pub const FAR: Duration = Duration::from_secs(366 * 24 * 3600);

/// `self + by`, held to [`FAR`] ahead: never a panic.
pub trait Later: Copy {
    /// The instant `by` after this one, or [`FAR`] after it when `by` is longer.
    fn later(self, by: Duration) -> Self;
}

impl Later for std::time::Instant {
    fn later(self, by: Duration) -> Self {
        self.checked_add(by.min(FAR)).unwrap_or(self)
    }
}

impl Later for tokio::time::Instant {
    fn later(self, by: Duration) -> Self {
        self.checked_add(by.min(FAR)).unwrap_or(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_too_long_for_the_clock_is_held_to_far() {
        let now = tokio::time::Instant::now();
        assert_eq!(now.later(Duration::MAX), now + FAR);
        assert_eq!(now.later(Duration::from_secs(u64::MAX)), now + FAR);
        assert_eq!(
            now.later(Duration::from_secs(7)),
            now + Duration::from_secs(7)
        );
        let now = std::time::Instant::now();
        assert_eq!(now.later(Duration::MAX), now + FAR);
    }
}
