//! What a cloud offers beyond the core APIs (Neutron extensions, Octavia's API version), read
//! when first needed and kept for a while: a cloud does not change them between two
//! reconciles, and asking before every create would double the requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long an answer is kept: an operator who enables an extension sees it used within this.
const FRESH_FOR: Duration = Duration::from_secs(600);

/// The answers of one cloud (auth URL and region), shared by every client of it.
#[derive(Debug, Default)]
pub struct Capabilities {
    answers: Mutex<HashMap<String, (Instant, Answer)>>,
}

/// One thing a cloud was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Whether the cloud offers something, such as a Neutron extension (asked by its alias).
    Present(bool),
    /// Octavia's current API version, `(major, minor)`.
    Version(Option<(u32, u32)>),
}

impl Capabilities {
    /// The answer to `question`, if asked less than `FRESH_FOR` ago.
    pub fn known(&self, question: &str) -> Option<Answer> {
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers
            .get(question)
            .filter(|(at, _)| at.elapsed() < FRESH_FOR)
            .map(|(_, answer)| answer.clone())
    }

    /// Records `answer` to `question` as of now; [`Capabilities::known`] returns it for a while.
    pub fn remember(&self, question: &str, answer: Answer) {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.insert(question.to_owned(), (Instant::now(), answer));
    }
}

/// `"v2.12"` (or `"2.12"`) as `(2, 12)`.
pub fn parse_version(id: &str) -> Option<(u32, u32)> {
    let (major, minor) = id.trim_start_matches('v').split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_octavia_writes_them() {
        assert_eq!(parse_version("v2.12"), Some((2, 12)));
        assert_eq!(parse_version("2.27"), Some((2, 27)));
        assert_eq!(parse_version("v2"), None);
        assert!(
            parse_version("v2.9") < parse_version("v2.12"),
            "compared as numbers"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_kept_for_a_while_then_asked_again() {
        let capabilities = Capabilities::default();
        capabilities.remember("trunk", Answer::Present(true));
        assert_eq!(capabilities.known("trunk"), Some(Answer::Present(true)));
        tokio::time::advance(FRESH_FOR).await;
        assert_eq!(capabilities.known("trunk"), None);
    }
}
