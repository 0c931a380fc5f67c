//! The manager (`capo-rs run`): connects to Kubernetes, checks that our CRDs are served, and
//! runs the controllers. This first part holds the CRD check; the controllers join it next.

pub mod crds;

pub use crds::{CrdCheckError, check_crds};
