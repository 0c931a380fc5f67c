//! Simulators for capo-rs's tests, demo and benchmarks, never part of the production build:
//! a Kubernetes API server ([`kube`]), an OpenStack cloud ([`openstack`]), the API server's
//! schema logic ([`structural`]), builders tests and benchmarks share ([`support`]), and a
//! small Cluster API actor that plays CAPI's controllers through the API ([`capi`]).

pub mod capi;
pub mod certs;
pub mod kube;
pub mod openstack;
pub mod structural;
pub mod support;
