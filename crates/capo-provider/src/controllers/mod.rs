//! What every reconciler shares: how errors are categorised ([`error`]), how an object that
//! keeps failing backs off ([`backoff`]), OpenStack clients per credentials
//! ([`credentials`]), and the reconcile metrics CAPI dashboards know ([`metrics`]). The
//! reconcilers themselves (observe -> plan -> apply -> status) come next beside them.

pub mod backoff;
pub mod credentials;
pub mod error;
pub mod metrics;

pub use backoff::{Backoff, BackoffPolicy};
pub use credentials::{ClientCache, CredentialsError, CredentialsKey};
pub use error::{Categorized, ErrorCategory};
pub use metrics::ReconcileMetrics;
