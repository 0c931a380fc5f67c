//! Who may read `/metrics`: the caller's bearer token is reviewed by the API server
//! (TokenReview), and the user it names must be allowed `get` on the non-resource URL
//! `/metrics` (SubjectAccessReview), as controller-runtime's secure metrics check it. So a
//! Prometheus bound to the `capo-rs-metrics-reader` ClusterRole reads them, and another pod
//! that reaches the port does not.
//!
//! Answers are remembered for a short while under the token's SHA-256 (never the token), in a
//! map of bounded size, so a scrape every 15 s costs the API server about two reviews a
//! minute, and a caller sending endless new tokens cannot grow the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// How long an answer that let the caller in (or refused a known user) is remembered.
pub const DECIDED_TTL: Duration = Duration::from_secs(60);
/// How long a token the API server did not accept is remembered.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Answers remembered at most; past this, the expired ones go, then all.
pub const MAX_REMEMBERED: usize = 1024;

/// What the API server says of a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A user allowed to read the path.
    Allowed,
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A user the API server knows, not allowed to read the path: 403.
    Forbidden(String),
    /// The API server could not be asked: 503, and nothing remembered.
    Unavailable(String),
}

/// The two reviews, asked of the API server (or, in tests, of a stand-in).
#[async_trait]
pub trait Reviews: Send + Sync {
    /// The user a token names, or None when the API server does not accept it.
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String>;
    /// Whether `user` may `get` the non-resource URL `path`.
    async fn authorize(&self, user: &UserInfo, path: &str) -> Result<bool, String>;
}

/// The reviews, asked of the API server with the manager's own client.
pub struct KubeReviews {
    client: kube::Client,
}

impl KubeReviews {
    /// Reviews through `client` (it needs `create` on `tokenreviews` and
    /// `subjectaccessreviews`).
    pub fn new(client: kube::Client) -> Self {
        KubeReviews { client }
    }
}

#[async_trait]
impl Reviews for KubeReviews {
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        Ok(status
            .authenticated
            .unwrap_or(false)
            .then_some(status.user)
            .flatten())
    }

    async fn authorize(&self, user: &UserInfo, path: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// Decides each request from its `Authorization` header, remembering answers a while.
pub struct Gatekeeper {
    reviews: Arc<dyn Reviews>,
    remembered: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
}

impl Gatekeeper {
    /// A gatekeeper asking `reviews`.
    pub fn new(reviews: Arc<dyn Reviews>) -> Self {
        Gatekeeper {
            reviews,
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict on a request to `path` with this `Authorization` header.
    pub async fn check(&self, authorization: Option<&str>, path: &str) -> Verdict {
        let Some(token) = bearer_token(authorization) else {
            return Verdict::Unauthenticated;
        };
        let key: [u8; 32] = Sha256::digest(format!("{path}\n{token}")).into();
        if let Some(known) = self.recall(&key) {
            return known;
        }
        let verdict = self.ask(token, path).await;
        let ttl = match verdict {
            Verdict::Allowed | Verdict::Forbidden(_) => Some(DECIDED_TTL),
            Verdict::Unauthenticated => Some(UNKNOWN_TTL),
            Verdict::Unavailable(_) => None,
        };
        if let Some(ttl) = ttl {
            self.remember(key, ttl, verdict.clone());
        }
        verdict
    }

    async fn ask(&self, token: &str, path: &str) -> Verdict {
        let user = match self.reviews.authenticate(token).await {
            Ok(Some(user)) => user,
            Ok(None) => return Verdict::Unauthenticated,
            Err(why) => return Verdict::Unavailable(why),
        };
        match self.reviews.authorize(&user, path).await {
            Ok(true) => Verdict::Allowed,
            Ok(false) => Verdict::Forbidden(user.username.unwrap_or_default()),
            Err(why) => Verdict::Unavailable(why),
        }
    }

    fn recall(&self, key: &[u8; 32]) -> Option<Verdict> {
        let remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        remembered
            .get(key)
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, verdict)| verdict.clone())
    }

    fn remember(&self, key: [u8; 32], ttl: Duration, verdict: Verdict) {
        let mut remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        if remembered.len() >= MAX_REMEMBERED {
            let now = Instant::now();
            remembered.retain(|_, (until, _)| now < *until);
        }
        if remembered.len() >= MAX_REMEMBERED {
            remembered.clear();
        }
        remembered.insert(key, (Instant::now() + ttl, verdict));
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.remembered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case), if there is one.
fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Tokens `reader-*` name users allowed `/metrics`, `other-*` users that are not,
    /// `down` fails; anything else is unknown.
    #[derive(Default)]
    struct Stand {
        asked: AtomicUsize,
    }

    #[async_trait]
    impl Reviews for Stand {
        async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if token == "down" {
                return Err("connection refused".into());
            }
            let known = token.starts_with("reader-") || token.starts_with("other-");
            Ok(known.then(|| UserInfo {
                username: Some(token.to_owned()),
                ..UserInfo::default()
            }))
        }

        async fn authorize(&self, user: &UserInfo, path: &str) -> Result<bool, String> {
            let name = user.username.as_deref().unwrap_or_default();
            Ok(path == "/metrics" && name.starts_with("reader-"))
        }
    }

    fn gatekeeper() -> (Arc<Stand>, Gatekeeper) {
        let stand = Arc::new(Stand::default());
        (stand.clone(), Gatekeeper::new(stand))
    }

    #[tokio::test]
    async fn a_reader_is_let_in_another_user_refused_and_no_token_unauthenticated() {
        let (_, gate) = gatekeeper();
        let check = |h: &'static str| gate.check(Some(h), "/metrics");
        assert_eq!(check("Bearer reader-1").await, Verdict::Allowed);
        assert_eq!(check("bearer  reader-1 ").await, Verdict::Allowed);
        assert_eq!(
            check("Bearer other-1").await,
            Verdict::Forbidden("other-1".into())
        );
        assert_eq!(check("Bearer nobody").await, Verdict::Unauthenticated);
        assert_eq!(check("Basic cmVhZGVy").await, Verdict::Unauthenticated);
        assert_eq!(check("Bearer ").await, Verdict::Unauthenticated);
        assert_eq!(gate.check(None, "/metrics").await, Verdict::Unauthenticated);
    }

    #[tokio::test]
    async fn answers_are_remembered_but_not_an_unavailable_api_server() {
        let (stand, gate) = gatekeeper();
        for _ in 0..5 {
            assert_eq!(
                gate.check(Some("Bearer reader-1"), "/metrics").await,
                Verdict::Allowed
            );
        }
        assert_eq!(stand.asked.load(Ordering::SeqCst), 1, "asked once");
        for _ in 0..2 {
            let verdict = gate.check(Some("Bearer down"), "/metrics").await;
            assert!(matches!(verdict, Verdict::Unavailable(_)), "{verdict:?}");
        }
        assert_eq!(
            stand.asked.load(Ordering::SeqCst),
            3,
            "asked again each time"
        );
    }

    #[tokio::test]
    async fn endless_new_tokens_do_not_grow_what_is_remembered() {
        let (_, gate) = gatekeeper();
        for n in 0..(MAX_REMEMBERED * 3) {
            let header = format!("Bearer stranger-{n}");
            gate.check(Some(&header), "/metrics").await;
            assert!(gate.remembered() <= MAX_REMEMBERED);
        }
    }

    #[tokio::test]
    async fn the_path_is_part_of_what_is_remembered() {
        let (_, gate) = gatekeeper();
        assert_eq!(
            gate.check(Some("Bearer reader-1"), "/metrics").await,
            Verdict::Allowed
        );
        assert_eq!(
            gate.check(Some("Bearer reader-1"), "/other").await,
            Verdict::Forbidden("reader-1".into())
        );
    }
}
