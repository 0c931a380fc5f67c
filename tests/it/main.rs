//! capo-rs's integration tests, linked into one binary: on two cores linking dominates, and one
//! binary links once. Run a part with a filter, for example `cargo test --test it real_octavia`.
//!
//! Shared builders live in [`common`] and in `capo_sim::support`; nothing here reaches into
//! production code that exists only for tests.

mod admission;
mod book;
mod capabilities;
mod capi_actor;
mod capi_peers;
mod capo_compat;
mod capo_peers;
mod capo_templates;
mod cloud;
mod cluster_class;
mod cluster_controller;
mod clusterctl;
mod common;
mod controllers;
mod conversion;
mod crds;
mod demo;
mod first_cluster;
mod floating_ip_pools;
mod fuzz_pass;
mod go_peer;
mod hostile;
mod kube_answers;
mod kube_connect;
mod kube_reviews;
mod kube_world;
mod membership;
mod operating_pages;
mod packaging;
mod real_answers;
mod real_cloud;
mod real_kube;
mod real_octavia;
mod real_provider;
mod rollout;
mod safety;
mod server_controller;
mod sim_kube;
mod sim_kubectl;
mod sim_openstack;
mod takeover;
mod topologies;
mod vs_capo;
mod waits;
mod walkthrough;
