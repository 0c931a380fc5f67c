//! Error categories. Every controller has its own error enum (keeping each `source`); its
//! `category()` decides the Event reason, the metric label and what happens next.

use std::time::Duration;

use capo_api::conditions::reasons;

use crate::cloud::CloudError;

/// What kind of failure a reconcile met, and so what happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// The cloud may answer next time: 5xx, timeouts, Keystone down, 409 Busy.
    Transient,
    /// The cloud asked us to slow down (429, or 503 with Retry-After).
    RateLimited {
        /// The least wait before the next try: the cloud's Retry-After (a default when a 429
        /// gives none, our own gate's wait when we held a request back); longer backoff wins.
        retry_after: Duration,
    },
    /// The spec cannot work as written (unknown image or flavor, bad CIDR): nothing changes
    /// until someone edits it, so there is no requeue; a spec change wakes the object.
    InvalidSpec,
    /// The credentials are missing or unusable (no Secret, unknown cloud, malformed
    /// clouds.yaml, refused authentication). A Secret change wakes the object.
    Credentials,
    /// An object the spec names does not exist yet (the user-data Secret): nothing to do
    /// until it appears, and its watch wakes the object then.
    Dependency,
    /// The Kubernetes API failed us (conflict, timeout): retry soon.
    Kubernetes,
    /// The reconcile panicked: a bug in capo-rs. The panic is caught, reported on the object
    /// and retried with backoff; the process and every other object carry on.
    Internal,
}

impl ErrorCategory {
    /// Whether retrying without a change anywhere can help.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ErrorCategory::InvalidSpec | ErrorCategory::Credentials | ErrorCategory::Dependency
        )
    }

    /// The condition and Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorCategory::Transient | ErrorCategory::RateLimited { .. } => {
                reasons::OPENSTACK_UNAVAILABLE
            }
            ErrorCategory::InvalidSpec => reasons::INVALID_SPEC,
            ErrorCategory::Credentials => reasons::INVALID_CREDENTIALS,
            ErrorCategory::Dependency => reasons::DEPENDENCY_MISSING,
            ErrorCategory::Kubernetes => reasons::KUBERNETES_UNAVAILABLE,
            ErrorCategory::Internal => reasons::INTERNAL_ERROR,
        }
    }

    /// The `category` label of error metrics.
    pub fn label(self) -> &'static str {
        match self {
            ErrorCategory::Transient => "transient",
            ErrorCategory::RateLimited { .. } => "rate_limited",
            ErrorCategory::InvalidSpec => "invalid_spec",
            ErrorCategory::Credentials => "credentials",
            ErrorCategory::Dependency => "dependency",
            ErrorCategory::Kubernetes => "kubernetes",
            ErrorCategory::Internal => "internal",
        }
    }
}

/// Implemented by each controller's error enum.
pub trait Categorized: std::error::Error {
    /// The category of this error, which decides its reason, metric label and retry.
    fn category(&self) -> ErrorCategory;
}

/// Implemented by each controller's error enum: the error of a reconcile that panicked, of
/// category [`ErrorCategory::Internal`].
pub trait FromPanic {
    /// `message` is what the panic said.
    fn from_panic(message: String) -> Self;
}

/// What a caught panic said: its `&str` or `String` payload, or a placeholder.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

impl Categorized for CloudError {
    fn category(&self) -> ErrorCategory {
        match self {
            CloudError::RateLimited { retry_after, .. } => ErrorCategory::RateLimited {
                retry_after: *retry_after,
            },
            CloudError::Busy(_) | CloudError::Transient(_) | CloudError::Cancelled(_) => {
                ErrorCategory::Transient
            }
            // A 404 or 409 during a reconcile means the world moved under us: look again.
            CloudError::NotFound(_) | CloudError::Conflict(_) | CloudError::Decode(_) => {
                ErrorCategory::Transient
            }
            CloudError::Unauthorized(_) | CloudError::Config(_) => ErrorCategory::Credentials,
            // 403 is policy or quota, 400 a request the spec made: both need a person.
            // 501: what the spec asks of this cloud is not implemented there.
            CloudError::Forbidden(_)
            | CloudError::BadRequest(_)
            | CloudError::NotImplemented(_) => ErrorCategory::InvalidSpec,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::{ErrorContext, Service};

    fn ctx() -> ErrorContext {
        ErrorContext {
            service: Service::Compute,
            operation: "server_create".into(),
            message: "from the test".into(),
        }
    }

    #[test]
    fn cloud_errors_fall_into_the_categories_their_cure_needs() {
        let retry_after = Duration::from_secs(7);
        let cases = [
            (
                CloudError::RateLimited {
                    ctx: ctx(),
                    retry_after,
                },
                ErrorCategory::RateLimited { retry_after },
            ),
            (CloudError::Busy(ctx()), ErrorCategory::Transient),
            (CloudError::Transient(ctx()), ErrorCategory::Transient),
            (CloudError::NotFound(ctx()), ErrorCategory::Transient),
            (CloudError::Unauthorized(ctx()), ErrorCategory::Credentials),
            (CloudError::Config("x".into()), ErrorCategory::Credentials),
            (CloudError::BadRequest(ctx()), ErrorCategory::InvalidSpec),
            (CloudError::Forbidden(ctx()), ErrorCategory::InvalidSpec),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
            // Retryable cloud errors are exactly the ones that are not terminal here, except
            // the world-moved ones (404, 409, decode) that a fresh look resolves.
            if error.is_retryable() {
                assert!(!category.is_terminal(), "{error}");
            }
        }
    }

    #[test]
    fn reasons_are_api_reasons_and_labels_are_distinct() {
        let all = [
            ErrorCategory::Transient,
            ErrorCategory::RateLimited {
                retry_after: Duration::ZERO,
            },
            ErrorCategory::InvalidSpec,
            ErrorCategory::Credentials,
            ErrorCategory::Dependency,
            ErrorCategory::Kubernetes,
            ErrorCategory::Internal,
        ];
        let labels: std::collections::HashSet<&str> = all.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), all.len());
        for category in all {
            assert!(
                category
                    .reason()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_uppercase()),
                "CamelCase reason"
            );
        }
        assert!(ErrorCategory::InvalidSpec.is_terminal());
        assert!(ErrorCategory::Credentials.is_terminal());
        assert!(!ErrorCategory::Transient.is_terminal());
        assert!(!ErrorCategory::Internal.is_terminal());
    }

    #[test]
    fn a_panic_says_what_it_said() {
        let caught = std::panic::catch_unwind(|| panic!("at {}", 3)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "at 3");
        let caught = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "static");
        let caught = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "a panic without a message");
    }
}
