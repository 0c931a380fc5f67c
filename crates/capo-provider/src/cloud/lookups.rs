//! Names the cloud resolved to IDs (an image, a flavor, a network by filter), shared by every
//! caller with the same credentials: a rollout's servers name the same image, flavor and
//! network, and asking for each of them every time would be three of a server's eight
//! requests. An answer is kept for a short while, and forgotten at once when the cloud says
//! its ID is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long an answer is kept. Long enough for a burst of creates to share one lookup; short
/// enough that an image re-published under the same name is seen by the next rollout.
pub const FRESH_FOR: Duration = Duration::from_secs(60);

/// The answers of one credential (auth URL, region, identity).
#[derive(Debug, Default)]
pub struct Lookups {
    answers: Mutex<HashMap<String, (Instant, String)>>,
    /// One lock per question being asked: servers created together wait for the first one's
    /// answer instead of all asking at once.
    asking: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Lookups {
    /// The right to ask `question`, held while it is asked; a caller that waited for it finds
    /// the answer in [`Lookups::known`].
    pub async fn ask(&self, question: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
            // Locks nobody holds or waits for are dropped, so the map stays small.
            asking.retain(|_, lock| Arc::strong_count(lock) > 1);
            asking.entry(question.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// The ID `question` was answered with less than [`FRESH_FOR`] ago.
    pub fn known(&self, question: &str) -> Option<String> {
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers
            .get(question)
            .filter(|(at, _)| at.elapsed() < FRESH_FOR)
            .map(|(_, id)| id.clone())
    }

    /// Records that `question` resolved to `id`, dropping answers older than [`FRESH_FOR`].
    pub fn remember(&self, question: &str, id: &str) {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.retain(|_, (at, _)| at.elapsed() < FRESH_FOR);
        answers.insert(question.to_owned(), (Instant::now(), id.to_owned()));
    }

    /// Every answer naming one of `ids`: the cloud said it is gone.
    pub fn forget_ids(&self, ids: &[&str]) -> usize {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let before = answers.len();
        answers.retain(|_, (_, id)| !ids.contains(&id.as_str()));
        before - answers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_shared_until_it_expires() {
        let lookups = Lookups::default();
        lookups.remember("image name=ubuntu", "img-1");
        assert_eq!(lookups.known("image name=ubuntu").as_deref(), Some("img-1"));
        assert_eq!(lookups.known("image name=debian"), None);
        tokio::time::advance(FRESH_FOR).await;
        assert_eq!(lookups.known("image name=ubuntu"), None);
    }

    #[tokio::test]
    async fn callers_asking_together_wait_for_one_answer() {
        let lookups = Arc::new(Lookups::default());
        let first = lookups.ask("flavor m1.small").await;
        let waiting = tokio::spawn({
            let lookups = lookups.clone();
            async move {
                let _turn = lookups.ask("flavor m1.small").await;
                lookups.known("flavor m1.small")
            }
        });
        // Another question is not held up by this one.
        drop(lookups.ask("image name=ubuntu").await);
        lookups.remember("flavor m1.small", "fl-1");
        drop(first);
        assert_eq!(waiting.await.unwrap().as_deref(), Some("fl-1"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_the_cloud_lost_is_forgotten_under_every_question() {
        let lookups = Lookups::default();
        lookups.remember("image name=ubuntu", "img-1");
        lookups.remember("image tags=[k8s]", "img-1");
        lookups.remember("flavor m1.small", "fl-1");
        assert_eq!(lookups.forget_ids(&["img-1"]), 2);
        assert_eq!(lookups.known("image name=ubuntu"), None);
        assert_eq!(lookups.known("image tags=[k8s]"), None);
        assert_eq!(lookups.known("flavor m1.small").as_deref(), Some("fl-1"));
    }
}
