//! What a scenario waited for and how long, so that one that runs out of time says where it
//! was (CI keeps a few hundred characters of a failure: "Elapsed(())" alone told nothing).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

struct Wait {
    what: String,
    began: Instant,
    took: Option<Duration>,
}

/// The waits of one scenario, shared by every future it joins.
#[derive(Clone, Default)]
pub(crate) struct Waits(Arc<Mutex<Vec<Wait>>>);

tokio::task_local! {
    static WAITS: Waits;
}

/// How many finished waits a summary names, the latest ones.
const FINISHED_SHOWN: usize = 6;

impl Waits {
    /// Runs `scenario` with its waits recorded here.
    pub(crate) async fn record<F: Future>(&self, scenario: F) -> F::Output {
        WAITS.scope(self.clone(), scenario).await
    }

    fn begin(&self, what: String) -> usize {
        let mut waits = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        waits.push(Wait {
            what,
            began: Instant::now(),
            took: None,
        });
        waits.len() - 1
    }

    fn end(&self, index: usize) {
        let mut waits = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(wait) = waits.get_mut(index) {
            wait.took = Some(wait.began.elapsed());
        }
    }
}

/// Awaits `future` as a wait named `what` of the scenario this task runs, if any.
pub(crate) async fn waited<T>(what: impl Into<String>, future: impl Future<Output = T>) -> T {
    let Ok(waits) = WAITS.try_with(Waits::clone) else {
        return future.await;
    };
    let index = waits.begin(what.into());
    let output = future.await;
    waits.end(index);
    output
}

/// One line: what was still being waited for (and since when), then the latest waits done.
impl fmt::Display for Waits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let waits = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let open: Vec<String> = waits
            .iter()
            .filter(|w| w.took.is_none())
            .map(|w| format!("{} ({} s)", w.what, w.began.elapsed().as_secs()))
            .collect();
        let done: Vec<String> = waits
            .iter()
            .filter_map(|w| {
                w.took
                    .map(|took| format!("{} {} s", w.what, took.as_secs()))
            })
            .collect();
        let latest = &done[done.len().saturating_sub(FINISHED_SHOWN)..];
        write!(
            f,
            "still waiting for: {}; {} waits done, the latest: {}",
            if open.is_empty() {
                "nothing named".to_owned()
            } else {
                open.join(", ")
            },
            done.len(),
            latest.join(", ")
        )
    }
}

#[tokio::test]
async fn a_summary_names_the_open_wait_first_and_the_latest_done() {
    let waits = Waits::default();
    let never = std::future::pending::<()>();
    let outcome = waits
        .record(async {
            waited("a provisioned", async {}).await;
            waited("b gone", async {}).await;
            tokio::time::timeout(Duration::from_millis(10), waited("c joined", never)).await
        })
        .await;
    assert!(outcome.is_err());
    let line = waits.to_string();
    assert!(
        line.starts_with("still waiting for: c joined (0 s); 2 waits done, the latest: a provisioned 0 s, b gone 0 s"),
        "{line}"
    );
}

#[tokio::test]
async fn outside_a_scenario_a_wait_is_only_awaited() {
    assert_eq!(waited("x", async { 7 }).await, 7);
}
