//! capo-rs's provider library: the OpenStack access layer ([`cloud`]), which knows nothing of
//! Kubernetes; the membership engine ([`membership`]), which writes no Kubernetes objects; and
//! what the reconcilers share ([`controllers`]: error categories, per-object backoff). The
//! reconcilers and the manager come next (docs/architecture.md).

#![warn(missing_docs)]

pub mod clock;
pub mod cloud;
pub mod controllers;
pub mod exposition;
pub mod manager;
pub mod membership;
