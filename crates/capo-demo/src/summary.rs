//! The story's summary: the figures, in words, and whether the cluster's API stayed up.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::Strategy;

use crate::board::Stats;

#[derive(Clone, Debug)]
pub struct Summary {
    pub strategy: Strategy,
    pub total: Duration,
    pub bring_up: Duration,
    pub rollout: Duration,
    pub machines_replaced: usize,
    /// Requests the simulated cloud served for the story.
    pub openstack_requests: u64,
    pub stats: Stats,
    /// Objects of each kind left in the cloud after the cluster was deleted.
    pub leaked: BTreeMap<String, i64>,
}

impl Summary {
    /// Whether the API pool stayed serving and every machine waited for its member to serve.
    pub fn api_stayed_up(&self) -> bool {
        self.stats.min_active.is_some_and(|min| min > 0)
            && self.stats.released_early.is_empty()
            && self.stats.released_not_serving.is_empty()
    }

    /// The process's exit code: 0 when the cluster's API stayed up and nothing leaked.
    pub fn exit_code(&self) -> u8 {
        if self.api_stayed_up() && self.leaked.is_empty() {
            0
        } else {
            1
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let stats = &self.stats;
        let _ = writeln!(
            out,
            "capo-rs demo summary ({})",
            match self.strategy {
                Strategy::LbOnly => "lb-only: trusting the load balancer",
                Strategy::Provisioning => "gated on each member's provisioning_status alone",
                _ => "gated on each member being ACTIVE and serving",
            }
        );
        let _ = writeln!(out, "  total time          {}", seconds(self.total));
        let _ = writeln!(
            out,
            "  bring-up            {} (3 control-plane machines, 2 workers)",
            seconds(self.bring_up)
        );
        let _ = writeln!(
            out,
            "  rollout             {} ({} control-plane machines replaced)",
            seconds(self.rollout),
            self.machines_replaced
        );
        let _ = writeln!(out, "  OpenStack requests  {}", self.openstack_requests);
        let min = stats
            .min_active
            .map_or_else(|| "never measured".to_owned(), |m| m.to_string());
        let _ = writeln!(
            out,
            "  min ACTIVE members  {min} in the API pool during the rollout"
        );
        let serving = stats
            .min_serving
            .map_or_else(|| "never measured".to_owned(), |m| m.to_string());
        let _ = writeln!(
            out,
            "  min serving members {serving} (ACTIVE and ONLINE) in the API pool during the rollout"
        );
        let _ = writeln!(out, "  gate held           {}", self.gate_words());
        let _ = writeln!(
            out,
            "  waiting to serve    {} per machine (median, from its member ACTIVE to its release)",
            stats
                .median_serving_wait()
                .map_or_else(|| "-".to_owned(), seconds)
        );
        let _ = writeln!(
            out,
            "  draining            {} per machine (median, from weight 0 to the member gone)",
            stats.median_drain().map_or_else(|| "-".to_owned(), seconds)
        );
        let _ = writeln!(out, "  members             {}", self.member_words());
        let leaks = if self.leaked.is_empty() {
            "nothing left in the cloud after the cluster was deleted".to_owned()
        } else {
            format!("LEFT IN THE CLOUD: {:?}", self.leaked)
        };
        let _ = writeln!(out, "  clean-up            {leaks}");
        out.push('\n');
        out.push_str(&self.verdict());
        out.push('\n');
        out
    }

    fn gate_words(&self) -> String {
        let stats = &self.stats;
        if stats.gate_held.is_empty() {
            return "never (nothing held the rollout)".to_owned();
        }
        let reasons: Vec<String> = stats
            .gate_held
            .iter()
            .map(|(reason, time)| format!("{reason} {}", seconds(*time)))
            .collect();
        format!(
            "{} in all: {}",
            seconds(stats.gate_held_total()),
            reasons.join(", ")
        )
    }

    fn member_words(&self) -> String {
        let stats = &self.stats;
        let repaired: u32 = stats.repairs.values().sum();
        format!(
            "{} flagged stuck, {} seen in ERROR, {} repair{}",
            stats.stuck.len(),
            stats.errored.len(),
            repaired,
            if repaired == 1 { "" } else { "s" }
        )
    }

    fn verdict(&self) -> String {
        let stats = &self.stats;
        if self.api_stayed_up() {
            return format!(
                "The cluster's API stayed up: at least {} API server{} served through the whole \
                 rollout, and no machine was handed to Cluster API before its load balancer \
                 member was ACTIVE and its API served.",
                stats.min_active.unwrap_or_default(),
                if stats.min_active == Some(1) { "" } else { "s" },
            );
        }
        let mut words = if stats.min_active == Some(0) || !stats.released_early.is_empty() {
            String::from("THE CLUSTER'S API WENT DOWN. ")
        } else {
            String::from("THE CLUSTER LOST CONTROL-PLANE CAPACITY. ")
        };
        if stats.min_active == Some(0) {
            let _ = write!(
                words,
                "The API load balancer had no ACTIVE member for {}: every request to the \
                 cluster's API failed. ",
                seconds(stats.zero_active)
            );
        }
        if !stats.released_not_serving.is_empty() {
            let names: Vec<&str> = stats
                .released_not_serving
                .iter()
                .map(String::as_str)
                .collect();
            let _ = write!(
                words,
                "{} control-plane machine{} got a providerID while {} API did not serve \
                 ({}): Cluster API counts {} and replaced a machine that served, so the cluster \
                 runs with less control-plane capacity than it thinks. ",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.len() == 1 { "its" } else { "their" },
                names.join(", "),
                if names.len() == 1 { "it" } else { "them" },
            );
        }
        if !stats.released_early.is_empty() {
            let names: Vec<&str> = stats.released_early.iter().map(String::as_str).collect();
            let _ = write!(
                words,
                "{} control-plane machine{} got a providerID while {} member was not ACTIVE \
                 ({}), so Cluster API went on to delete the machines that still served.",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.len() == 1 { "its" } else { "their" },
                names.join(", ")
            );
        }
        words
    }
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(strategy: Strategy, min_active: usize) -> Summary {
        let mut stats = Stats {
            min_active: Some(min_active),
            zero_active: Duration::from_millis(12_300),
            ..Stats::default()
        };
        stats
            .gate_held
            .insert("MemberStuck".into(), Duration::from_secs(6));
        if min_active == 0 {
            stats
                .released_early
                .insert("demo-control-plane-abcde".into());
        }
        Summary {
            strategy,
            total: Duration::from_secs(80),
            bring_up: Duration::from_secs(20),
            rollout: Duration::from_secs(50),
            machines_replaced: 3,
            openstack_requests: 900,
            stats,
            leaked: BTreeMap::new(),
        }
    }

    #[test]
    fn a_gated_rollout_that_kept_serving_exits_zero() {
        let gated = summary(Strategy::StatusTree, 2);
        assert_eq!(gated.exit_code(), 0);
        let text = gated.render();
        assert!(text.contains("stayed up"), "{text}");
        assert!(text.contains("MemberStuck 6.0 s"), "{text}");
    }

    #[test]
    fn an_empty_api_pool_is_said_in_plain_words_and_fails() {
        let trusting = summary(Strategy::LbOnly, 0);
        assert_eq!(trusting.exit_code(), 1);
        let text = trusting.render();
        assert!(text.contains("no ACTIVE member for 12.3 s"), "{text}");
        assert!(text.contains("demo-control-plane-abcde"), "{text}");
    }

    #[test]
    fn a_machine_released_whose_api_does_not_serve_is_lost_capacity_and_fails() {
        let mut provisioning = summary(Strategy::Provisioning, 2);
        provisioning
            .stats
            .released_not_serving
            .insert("demo-control-plane-xyz".into());
        assert_eq!(provisioning.exit_code(), 1);
        let text = provisioning.render();
        assert!(text.contains("LOST CONTROL-PLANE CAPACITY"), "{text}");
        assert!(text.contains("demo-control-plane-xyz"), "{text}");
    }

    #[test]
    fn a_leak_fails_even_when_the_api_stayed_up() {
        let mut leaky = summary(Strategy::StatusTree, 1);
        leaky.leaked.insert("ports".into(), 1);
        assert_eq!(leaky.exit_code(), 1);
    }
}
