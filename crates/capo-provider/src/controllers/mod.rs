//! What every reconciler shares: how errors are categorised ([`error`]) and how an object
//! that keeps failing backs off ([`backoff`]). Pure: no Kubernetes or OpenStack calls here.
//! The reconcilers themselves (observe -> plan -> apply -> status) come next beside them.

pub mod backoff;
pub mod error;

pub use backoff::{Backoff, BackoffPolicy};
pub use error::{Categorized, ErrorCategory};
