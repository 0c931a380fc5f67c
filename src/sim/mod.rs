//! Simulators for tests, the demo and benchmarks (DESIGN.md §1): never on a production
//! path.

pub mod kube;
pub mod openstack;
