//! How the manager's watches wait after an error, so that they resume within seconds of the
//! API server's return rather than up to a minute later, and a watch of a kind that is not
//! installed (ORC's Image, Cluster API's IPAM kinds) asks rarely instead of every second.
//!
//! kube-runtime's default is client-go's reflector backoff (0.8 s doubling to 30 s, with
//! jitter) in a stream that resets it on every event that is not an error. Measured on the
//! real tier (`rollout::real_kube_a_rollout_rides_out_the_api_server_gone_30_s_...`, debug log
//! of `kube_runtime`), that gives two faults:
//! - a watch whose resumption keeps failing (connection refused) grows to 30 s and more: a
//!   30 s outage left a watch asleep for 41.8 s after the server came back. client-go's cap
//!   protects a server from thousands of kubelets; the manager holds a handful of watches,
//!   so a cap of 8 s costs a restarting server one request per watch every few seconds;
//! - a watch whose list keeps failing (404: the CRD is not installed) never backs off at all,
//!   because the watcher emits `Event::Init` before each list and that resets the backoff: a
//!   404 every 0.6-1.6 s per missing kind, forever. Here only a successful list or a watch
//!   event resets it.
//!
//! A watch that the server answers with 410 Gone (its resource version compacted away,
//! typical right after the server restarts) must list again: that is the server working,
//! not failing, so the relist happens at once, at most once per `FREE_RELIST_EVERY` (30 s) so a
//! server that keeps answering 410 is still backed off.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

/// The first wait after an error.
const FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two attempts, before jitter.
const CAP: Duration = Duration::from_secs(8);
/// How often a 410 Gone may skip the backoff.
const FREE_RELIST_EVERY: Duration = Duration::from_secs(30);

/// Exponential backoff from `FIRST` (0.5 s) doubling to `CAP` (8 s), each wait lengthened by up to half
/// again at random so that the manager's watches do not retry in step. Reset by the stream on
/// any event that is not an error.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = (base * 2).min(CAP);
        Some(base + base.mul_f64(fastrand::f64() / 2.0))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// Whether the server said the watch's resource version is gone (410): list again.
fn is_expired(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// Which errors go to the backoff: all but a 410 Gone when no other 410 skipped it in the last
/// `FREE_RELIST_EVERY` (30 s).
#[derive(Debug, Default)]
struct FreeRelist {
    last: Option<Instant>,
}

impl FreeRelist {
    /// True when `error` is dropped from the stream, so the watcher (already reset to list
    /// again) is polled at once.
    fn takes(&mut self, error: &watcher::Error, now: Instant) -> bool {
        let allowed = self
            .last
            .is_none_or(|last| now.duration_since(last) >= FREE_RELIST_EVERY);
        if allowed && is_expired(error) {
            self.last = Some(now);
            return true;
        }
        false
    }
}

/// The manager's backoff around a watch stream: [`WatchBackoff`] after each error, reset by
/// a successful list or a watch event, and an immediate relist on 410 Gone.
pub fn watch_backoff<K, S>(events: S) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let state = (
        Box::pin(events),
        WatchBackoff::default(),
        FreeRelist::default(),
        None,
    );
    futures::stream::unfold(
        state,
        |(mut events, mut backoff, mut free, wait)| async move {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            loop {
                let event = events.next().await?;
                let wait = match &event {
                    Ok(Event::Init) => None,
                    Ok(_) => {
                        backoff.reset();
                        None
                    }
                    Err(error) if free.takes(error, Instant::now()) => {
                        tracing::debug!(%error, "the watch's resource version is gone; listing again at once");
                        continue;
                    }
                    Err(_) => backoff.next(),
                };
                return Some((event, (events, backoff, free, wait)));
            }
        },
    )
}

/// [`watch_backoff`] as a method on watch streams.
pub trait WatchBackoffExt<K>:
    Stream<Item = Result<Event<K>, watcher::Error>> + Sized + Send + 'static
where
    K: Send + 'static,
{
    /// The manager's backoff for this watch stream ([`watch_backoff`]).
    fn watch_backoff(self) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send {
        watch_backoff(self)
    }
}

impl<S, K> WatchBackoffExt<K> for S
where
    K: Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(Box::new(
            Status::failure("too old resource version", "Expired").with_code(410),
        ))
    }

    fn not_found() -> Result<Event<()>, watcher::Error> {
        let status = Status::failure("404 page not found", "NotFound").with_code(404);
        Err(watcher::Error::InitialListFailed(kube::Error::Api(
            Box::new(status),
        )))
    }

    /// Each item the stream yields, with the seconds (paused clock) since the previous one.
    async fn timed(script: Vec<Result<Event<()>, watcher::Error>>) -> Vec<(bool, f64)> {
        let mut stream = std::pin::pin!(watch_backoff(futures::stream::iter(script)));
        let mut last = Instant::now();
        let mut seen = Vec::new();
        while let Some(item) = stream.next().await {
            seen.push((item.is_ok(), last.elapsed().as_secs_f64()));
            last = Instant::now();
        }
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_keeps_failing_backs_off_further_each_time_until_one_succeeds() {
        let mut script = Vec::new();
        for _ in 0..5 {
            script.extend([Ok(Event::Init), not_found()]);
        }
        script.extend([
            Ok(Event::Init),
            Ok(Event::InitDone),
            not_found(),
            Ok(Event::Init),
        ]);
        let seen = timed(script).await;
        // The waits fall before the Init that follows each error.
        let waits: Vec<f64> = seen.iter().skip(2).step_by(2).map(|(_, s)| *s).collect();
        for (wait, base) in waits.iter().zip([0.5, 1.0, 2.0, 4.0, 8.0]) {
            assert!(
                (base..=base * 1.5).contains(wait),
                "waited {wait} s where {base} s was due: {seen:?}"
            );
        }
        let after_reset = seen.last().unwrap().1;
        assert!(
            (0.5..=0.75).contains(&after_reset),
            "a good list resets the backoff: {seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_410_relists_at_once_and_is_not_passed_on() {
        let seen = timed(vec![Ok(Event::InitDone), Err(gone()), Ok(Event::Init)]).await;
        assert_eq!(seen, vec![(true, 0.0), (true, 0.0)]);
    }

    #[test]
    fn waits_double_up_to_the_cap_with_at_most_half_again_of_jitter() {
        let mut backoff = WatchBackoff::default();
        let bases = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0];
        for base in bases {
            let wait = backoff.next().unwrap().as_secs_f64();
            assert!(
                (base..=base * 1.5).contains(&wait),
                "{wait} s for a base of {base} s"
            );
        }
        backoff.reset();
        assert!(backoff.next().unwrap() <= FIRST.mul_f64(1.5));
    }

    #[test]
    fn a_410_skips_the_backoff_once_per_period_and_other_errors_never_do() {
        let start = Instant::now();
        let mut free = FreeRelist::default();
        assert!(free.takes(&gone(), start));
        assert!(
            !free.takes(&gone(), start + Duration::from_secs(1)),
            "a second 410 at once is backed off"
        );
        assert!(free.takes(&gone(), start + FREE_RELIST_EVERY));
        let refused = watcher::Error::NoResourceVersion;
        assert!(!free.takes(&refused, start + FREE_RELIST_EVERY * 3));
        let forbidden =
            watcher::Error::WatchError(Box::new(Status::failure("no", "Forbidden").with_code(403)));
        assert!(!free.takes(&forbidden, start + FREE_RELIST_EVERY * 4));
    }
}
