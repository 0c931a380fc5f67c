//! When to try a request again, and after how long. Pure: the request path feeds it outcomes
//! and a random number, it answers with a delay or "stop".

use std::time::Duration;

use http::Method;

use super::CloudError;

/// Bounds for retrying one call.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Backoff ceiling before jitter for the first retry; doubles each time.
    pub base_delay: Duration,
    /// Ceiling for a single backoff.
    pub max_delay: Duration,
    /// No retry starts after this much time has passed since the first attempt.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(30),
        }
    }
}

/// Whether repeating `method` cannot do anything twice. POST and PATCH are not: a POST that
/// timed out may have created the object, and a second one would create a duplicate.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::PUT | Method::OPTIONS
    )
}

/// Whether `error` after sending `method` may be retried at all. A 429 (and a 503 carrying
/// Retry-After) means the request was refused before it was processed, so even a POST is safe
/// to repeat after the pause; a 5xx or a timeout on a POST is not.
pub fn is_retryable(method: &Method, error: &CloudError) -> bool {
    match error {
        CloudError::RateLimited { .. } => true,
        CloudError::Transient(_) => is_idempotent(method),
        _ => false,
    }
}

impl RetryPolicy {
    /// The delay before attempt `attempt + 1` (attempts count from 1), or `None` when the
    /// policy is spent. `unit` is a uniform random number in [0, 1): full jitter, so a crowd of
    /// clients that failed together does not come back together.
    pub fn backoff(&self, attempt: u32, elapsed: Duration, unit: f64) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << exponent)
            .min(self.max_delay);
        let delay = ceiling.mul_f64(unit.clamp(0.0, 1.0));
        (elapsed.saturating_add(delay) <= self.max_elapsed).then_some(delay)
    }

    /// Whether a server-requested pause still fits the policy's time budget.
    pub fn allows_pause(&self, attempt: u32, elapsed: Duration, pause: Duration) -> bool {
        attempt < self.max_attempts && elapsed.saturating_add(pause) <= self.max_elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling_and_stops_at_the_bound() {
        let policy = RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
            max_elapsed: Duration::from_secs(60),
        };
        let full = |attempt| policy.backoff(attempt, Duration::ZERO, 0.999_999);
        assert_eq!(full(1).unwrap().as_millis(), 99);
        assert_eq!(full(2).unwrap().as_millis(), 199);
        assert_eq!(full(3).unwrap().as_millis(), 299);
        assert_eq!(full(5).unwrap().as_millis(), 299);
        assert_eq!(full(6), None);
        assert_eq!(policy.backoff(1, Duration::ZERO, 0.0), Some(Duration::ZERO));
    }

    #[test]
    fn backoff_respects_the_time_budget() {
        let policy = RetryPolicy {
            max_elapsed: Duration::from_secs(1),
            ..RetryPolicy::default()
        };
        assert!(policy.backoff(1, Duration::from_millis(900), 0.9).is_none());
        assert!(policy.backoff(1, Duration::from_millis(900), 0.1).is_some());
        assert!(!policy.allows_pause(1, Duration::ZERO, Duration::from_secs(2)));
        assert!(policy.allows_pause(1, Duration::ZERO, Duration::from_millis(500)));
    }

    #[test]
    fn post_is_retried_only_when_refused_by_rate_limiting() {
        let ctx = crate::cloud::ErrorContext {
            service: crate::cloud::Service::LoadBalancer,
            operation: "member_create".into(),
            message: String::new(),
        };
        let transient = CloudError::Transient(ctx.clone());
        let limited = CloudError::RateLimited {
            ctx: ctx.clone(),
            retry_after: Duration::from_secs(1),
        };
        assert!(!is_retryable(&Method::POST, &transient));
        assert!(is_retryable(&Method::POST, &limited));
        assert!(is_retryable(&Method::GET, &transient));
        assert!(is_retryable(&Method::DELETE, &transient));
        assert!(!is_retryable(&Method::GET, &CloudError::Busy(ctx.clone())));
        assert!(!is_retryable(&Method::GET, &CloudError::NotFound(ctx)));
    }
}
