//! One gate per (auth URL, region, service): a governor rate limiter running on tokio's clock
//! (so paused-clock tests measure virtual time) plus the endpoint's Retry-After pause.

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

/// The gate of one endpoint: its rate limiter and any Retry-After pause, shared by
/// every client that calls it.
pub struct EndpointGate {
    limiter: Limiter,
    clock: TokioClock,
    paused_until: Mutex<Option<Instant>>,
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
            paused_until: Mutex::new(None),
        }
    }

    /// Waits for the pause to end and for a limiter slot, up to `max_wait` in all; returns how
    /// long it waited. The wait is a tokio sleep, so dropping the future cancels it.
    pub async fn admit(&self, max_wait: Duration) -> Result<Duration, Refused> {
        let start = Instant::now();
        loop {
            let waited = start.elapsed();
            if let Some(remaining) = self.pause_remaining() {
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

    /// Holds every request to this endpoint for `duration` (a Retry-After). A shorter pause
    /// never cuts a longer one short.
    pub fn pause_for(&self, duration: Duration) {
        // Retry-After is held to MAX_RETRY_AFTER where it is read; a longer pause from
        // anywhere else is the longest the clock can hold, never a panic.
        let now = Instant::now();
        let until = now
            .checked_add(duration)
            .unwrap_or_else(|| now + super::error::MAX_RETRY_AFTER);
        let mut paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if paused.is_none_or(|current| current < until) {
            *paused = Some(until);
        }
    }

    /// How long the current Retry-After pause still lasts.
    pub fn pause_remaining(&self) -> Option<Duration> {
        let paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = (*paused)?;
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
            assert_eq!(gate.admit(Duration::MAX).await, Ok(Duration::ZERO));
        }
        gate.admit(Duration::MAX).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn pause_holds_requests_and_refuses_when_too_long() {
        let gate = gate(100, 100);
        gate.pause_for(Duration::from_secs(3));
        gate.pause_for(Duration::from_secs(1));
        assert_eq!(
            gate.admit(Duration::from_secs(1)).await,
            Err(Refused::Paused {
                remaining: Duration::from_secs(3)
            })
        );
        let start = Instant::now();
        gate.admit(Duration::from_secs(10)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_beyond_the_wait_limit_is_refused() {
        let gate = gate(1, 1);
        gate.admit(Duration::ZERO).await.unwrap();
        assert!(matches!(
            gate.admit(Duration::from_millis(10)).await,
            Err(Refused::Saturated { .. })
        ));
    }
}
