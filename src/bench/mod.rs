//! `capo-rs bench ...`: measurements that print figures. Not on any production path.

pub mod membership;
pub mod request_path;
pub mod sim_status_tree;
