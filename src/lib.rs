//! capo-rs: a Cluster API infrastructure provider for OpenStack that keeps a cluster's API
//! load balancer serving during control-plane rollouts.
//!
//! Module layout follows DESIGN.md §1: `api` holds the CRD types and pure helpers; the
//! OpenStack layer, the membership engine, controllers and simulators arrive in their own
//! modules.

pub mod api;
pub mod bench;
pub mod cli;
pub mod cloud;
pub mod membership;
pub mod sim;
pub mod watch_lb;
