//! capo-rs's provider library: the OpenStack access layer ([`cloud`]), which knows nothing of
//! Kubernetes, and the membership engine ([`membership`]), which writes no Kubernetes objects.
//! The controllers and the manager come next, beside them.

pub mod cloud;
pub mod membership;
