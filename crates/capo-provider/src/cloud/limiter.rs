//! One gate per (auth URL, region, service): a governor rate limiter running on tokio's clock
//! (so paused-clock tests measure virtual time) plus the Retry-After pauses of the identities
//! that call the endpoint: a 429 to one project holds that project's requests, not every
//! tenant's.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::ops::Add;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::clock::Later;

use super::Service;

/// Requests per second and burst for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Sustained requests per second (`--openstack-qps`, 10 by default).
    pub qps: NonZeroU32,
    /// Requests allowed at once before the per-second rate applies (`--openstack-burst`, 20).
    pub burst: NonZeroU32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            qps: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// Which endpoint a gate guards. Clients of the same cloud endpoint share one gate, whatever
/// credential they use: the cloud's limit is per endpoint, not per token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GateKey {
    /// The cloud's Keystone URL (`noauth:<url>` for a no-auth session).
    pub auth_url: String,
    /// The region; empty when the cloud names none.
    pub region: String,
    /// The service whose endpoint this is.
    pub service: Service,
}

/// Why a request did not get through the gate.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The endpoint is paused by Retry-After for longer than the caller may wait.
    Paused { remaining: Duration },
    /// The limiter's next slot is further away than the caller may wait.
    Saturated { wait: Duration },
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

/// The gate of one endpoint: its rate limiter, shared by every client that calls it, and the
/// Retry-After pause of each identity (a session scope's `identity`) that was told to wait.
pub struct EndpointGate {
    limiter: Limiter,
    clock: TokioClock,
    /// Only pauses that have not ended: pruned whenever one is added, so its size is the
    /// number of identities paused in the last [`MAX_RETRY_AFTER`](super::error::MAX_RETRY_AFTER).
    paused_until: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for EndpointGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointGate").finish_non_exhaustive()
    }
}

impl EndpointGate {
    /// A gate allowing `limit`, with no pause.
    pub fn new(limit: RateLimit) -> Self {
        let clock = TokioClock::default();
        let quota = Quota::per_second(limit.qps).allow_burst(limit.burst);
        EndpointGate {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            paused_until: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for `who`'s pause to end and for a limiter slot, up to `max_wait` in all; returns
    /// how long it waited. The wait is a tokio sleep, so dropping the future cancels it.
    pub async fn admit(&self, who: &str, max_wait: Duration) -> Result<Duration, Refused> {
        let start = Instant::now();
        loop {
            let waited = start.elapsed();
            if let Some(remaining) = self.pause_remaining(who) {
                if waited + remaining > max_wait {
                    return Err(Refused::Paused { remaining });
                }
                tokio::time::sleep(remaining).await;
                continue;
            }
            match self.limiter.check() {
                Ok(()) => return Ok(start.elapsed()),
                Err(not_until) => {
                    let wait: Duration = not_until.wait_time_from(self.clock.now());
                    if waited + wait > max_wait {
                        return Err(Refused::Saturated { wait });
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Holds `who`'s requests to this endpoint for `duration` (a Retry-After it was sent).
    /// A shorter pause never cuts a longer one short.
    pub fn pause_for(&self, who: &str, duration: Duration) {
        // Retry-After is held to MAX_RETRY_AFTER where it is read; a longer pause from
        // anywhere else is held to the clock's furthest deadline, never a panic.
        let now = Instant::now();
        let until = now.later(duration);
        let mut paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        paused.retain(|_, ends| *ends > now);
        let ends = paused.entry(who.to_owned()).or_insert(until);
        *ends = (*ends).max(until);
    }

    /// How long `who`'s Retry-After pause still lasts.
    pub fn pause_remaining(&self, who: &str) -> Option<Duration> {
        let paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = *paused.get(who)?;
        let now = Instant::now();
        (until > now).then(|| until - now)
    }
}

/// governor's clock on tokio time.
#[derive(Clone, Debug)]
struct TokioClock {
    origin: Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock {
            origin: Instant::now(),
        }
    }
}

/// Nanoseconds since the clock's origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct TokioInstant(u64);

impl Add<Nanos> for TokioInstant {
    type Output = TokioInstant;
    fn add(self, other: Nanos) -> TokioInstant {
        TokioInstant(self.0.saturating_add(other.as_u64()))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        Nanos::new(self.0.saturating_sub(earlier.0))
    }
    fn saturating_sub(&self, duration: Nanos) -> Self {
        TokioInstant(self.0.saturating_sub(duration.as_u64()))
    }
}

impl Clock for TokioClock {
    type Instant = TokioInstant;
    fn now(&self) -> TokioInstant {
        let nanos = self.origin.elapsed().as_nanos();
        TokioInstant(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(qps: u32, burst: u32) -> EndpointGate {
        EndpointGate::new(RateLimit {
            qps: NonZeroU32::new(qps).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn burst_passes_at_once_then_one_slot_per_interval() {
        let gate = gate(10, 5);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(gate.admit("p", Duration::MAX).await, Ok(Duration::ZERO));
        }
        gate.admit("p", Duration::MAX).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_holds_requests_and_refuses_when_too_long() {
        let gate = gate(100, 100);
        gate.pause_for("p", Duration::from_secs(3));
        gate.pause_for("p", Duration::from_secs(1));
        assert_eq!(
            gate.admit("p", Duration::from_secs(1)).await,
            Err(Refused::Paused {
                remaining: Duration::from_secs(3)
            })
        );
        let start = Instant::now();
        gate.admit("p", Duration::from_secs(10)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_beyond_the_wait_limit_is_refused() {
        let gate = gate(1, 1);
        gate.admit("p", Duration::ZERO).await.unwrap();
        assert!(matches!(
            gate.admit("p", Duration::from_millis(10)).await,
            Err(Refused::Saturated { .. })
        ));
    }

    /// One project's 429 holds that project's requests only: the endpoint's other tenants go
    /// on, and the pause is forgotten once it ends.
    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_only_the_identity_that_was_told_to_wait() {
        let gate = gate(100, 100);
        gate.pause_for("tenant-a", Duration::from_secs(30));
        assert_eq!(
            gate.admit("tenant-b", Duration::ZERO).await,
            Ok(Duration::ZERO)
        );
        assert_eq!(
            gate.admit("tenant-a", Duration::ZERO).await,
            Err(Refused::Paused {
                remaining: Duration::from_secs(30)
            })
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        gate.pause_for("tenant-b", Duration::from_secs(1));
        let paused = gate.paused_until.lock().unwrap();
        assert_eq!(
            paused.keys().collect::<Vec<_>>(),
            ["tenant-b"],
            "ended pauses are pruned"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_too_long_for_the_clock_is_no_panic() {
        let gate = gate(100, 100);
        gate.pause_for("p", Duration::MAX);
        assert_eq!(gate.pause_remaining("p"), Some(crate::clock::FAR));
    }
}
