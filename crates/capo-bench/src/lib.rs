//! `capo-rs bench ...`: measurements that print figures, and the comparison strategies they
//! run against ours. Never part of the production build.

pub mod floor;
pub mod membership;
pub mod request_path;
pub mod safety;
pub mod scale;
pub mod series_memory;
pub mod servers;
pub mod shards;
pub mod sim_status_tree;
pub mod store_memory;
pub mod webhook;

// The strategies compared live with the demo, which shows them without the benchmarks.
pub use capo_demo::strategies::Strategy;
