//! Simulators for capo-rs's tests, demo and benchmarks, never part of the production build:
//! a Kubernetes API server ([`kube`]), an OpenStack cloud ([`openstack`]), the API server's
//! schema logic ([`structural`]), and builders tests and benchmarks share ([`support`]).

pub mod kube;
pub mod openstack;
pub mod structural;
pub mod support;
