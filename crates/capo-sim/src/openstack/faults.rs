//! Timing and fault injection: what a scenario file (YAML or JSON) and the `/_sim/scenario`
//! admin endpoint describe. Pure data plus the matching and sampling rules.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A delay: fixed, or drawn from a distribution (seconds).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Delay {
    Fixed(f64),
    /// Uniform between the two bounds.
    Uniform(f64, f64),
    /// Exponential with this mean.
    Exponential(f64),
}

impl Delay {
    pub fn fixed(seconds: f64) -> Self {
        Delay::Fixed(seconds)
    }

    /// Draws one value; `unit` is uniform in [0, 1).
    pub fn sample(&self, unit: f64) -> Duration {
        let seconds = match *self {
            Delay::Fixed(s) => s,
            Delay::Uniform(low, high) => low + (high - low) * unit,
            Delay::Exponential(mean) => -mean * (1.0 - unit).max(f64::MIN_POSITIVE).ln(),
        };
        Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX)
    }
}

/// Default transition times, per kind of object.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timings {
    /// Load balancer PENDING_CREATE -> ACTIVE.
    pub lb_create: Delay,
    /// Load balancer (and listener, pool) PENDING_UPDATE -> ACTIVE after any change under it.
    pub lb_update: Delay,
    /// Load balancer PENDING_DELETE -> gone.
    pub lb_delete: Delay,
    /// Listener, pool and health monitor PENDING_CREATE -> ACTIVE.
    pub child_create: Delay,
    /// Member PENDING_CREATE -> ACTIVE (AmphoraV2: may outlast the LB's own update).
    pub member_create: Delay,
    /// Member PENDING_UPDATE -> ACTIVE.
    pub member_update: Delay,
    /// Member PENDING_DELETE -> gone.
    pub member_delete: Delay,
    /// Member with a health monitor: OFFLINE -> ONLINE after it is ACTIVE.
    pub member_online: Delay,
    /// Server BUILD -> ACTIVE.
    pub server_build: Delay,
    /// Server delete -> gone.
    pub server_delete: Delay,
    /// Volume creating -> available.
    pub volume_create: Delay,
    /// Volume deleting -> gone.
    pub volume_delete: Delay,
    /// The LB stays PENDING_UPDATE until the member change under it has settled, as Octavia's
    /// own flows order it (member, then pool, then LB). Off by default: members may outlast
    /// the LB's unlock, as with AmphoraV2 in production. A member held by a `stuck` rule never
    /// holds its LB.
    pub lb_waits_for_members: bool,
}

impl Default for Timings {
    /// Close to what a real Octavia with no-op drivers shows (octavia-samples/timings_*.json).
    fn default() -> Self {
        Timings {
            lb_create: Delay::Uniform(0.5, 0.8),
            lb_update: Delay::Uniform(0.1, 0.3),
            lb_delete: Delay::Uniform(0.2, 0.4),
            child_create: Delay::Uniform(0.1, 0.2),
            member_create: Delay::Uniform(0.2, 0.45),
            member_update: Delay::Uniform(0.2, 0.45),
            member_delete: Delay::Uniform(0.2, 0.45),
            member_online: Delay::Fixed(1.0),
            server_build: Delay::Uniform(1.0, 2.0),
            server_delete: Delay::Uniform(0.5, 1.0),
            volume_create: Delay::Uniform(0.3, 0.6),
            volume_delete: Delay::Uniform(0.2, 0.4),
            lb_waits_for_members: false,
        }
    }
}

/// Which objects a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Loadbalancer,
    Member,
    Server,
    /// A Cinder volume, by its name (an unnamed volume matches only `*`).
    Volume,
}

/// What happens to a matching object's next transition.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The transition takes this long instead of the default.
    Delay(Delay),
    /// The object stays PENDING_* (or BUILD, creating, deleting) until the rule is removed.
    Stuck,
    /// The transition ends in ERROR.
    Error,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub kind: ObjectKind,
    /// Glob on the object's name: `*` any run, `?` one character.
    #[serde(default = "any_name")]
    pub name: String,
    pub effect: Effect,
    /// Applies only to this many transitions, then the rule is spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

fn any_name() -> String {
    "*".to_owned()
}

/// 429s with Retry-After for one service (or all).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitFault {
    /// `load-balancer`, `compute`, `network`, `image`, `block-storage`, `identity`; absent =
    /// every service.
    #[serde(default)]
    pub service: Option<String>,
    /// Answer 429 to requests beyond this many in the current second.
    #[serde(default)]
    pub above_per_second: Option<u32>,
    /// Or answer 429 with this probability.
    #[serde(default)]
    pub probability: Option<f64>,
    /// The Retry-After value sent, in seconds.
    #[serde(default = "one")]
    pub retry_after: u64,
}

fn one() -> u64 {
    1
}

/// 5xx answers by probability.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerErrorFault {
    #[serde(default)]
    pub service: Option<String>,
    pub probability: f64,
    #[serde(default = "status_503")]
    pub status: u16,
}

fn status_503() -> u16 {
    503
}

/// Added latency before answering.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyFault {
    #[serde(default)]
    pub service: Option<String>,
    pub delay: Delay,
}

/// Keystone answers 503 during `[from, until)` seconds after the simulator started.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    pub from: f64,
    pub until: f64,
}

/// Everything injectable.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// Makes every random choice repeatable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    pub timings: Timings,
    pub rules: Vec<Rule>,
    pub rate_limits: Vec<RateLimitFault>,
    pub server_errors: Vec<ServerErrorFault>,
    pub latency: Vec<LatencyFault>,
    pub keystone_outages: Vec<Outage>,
}

impl Scenario {
    /// Parses YAML (JSON is YAML too).
    pub fn parse(text: &str) -> Result<Self, String> {
        from_yaml(text).map_err(|e| format!("invalid scenario: {e}"))
    }

    /// The effect for the next transition of `kind` named `name`; spends a counted rule.
    pub fn take_effect(&mut self, kind: ObjectKind, name: &str) -> Option<Effect> {
        let index = self
            .rules
            .iter()
            .position(|rule| rule.kind == kind && glob_match(&rule.name, name))?;
        let rule = &mut self.rules[index];
        let effect = rule.effect.clone();
        if let Some(times) = rule.times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                self.rules.remove(index);
            }
        }
        Some(effect)
    }

    /// Whether a `Stuck` rule still holds `kind` named `name`.
    pub fn is_stuck(&self, kind: ObjectKind, name: &str) -> bool {
        self.rules.iter().any(|rule| {
            rule.kind == kind && rule.effect == Effect::Stuck && glob_match(&rule.name, name)
        })
    }
}

/// Reads YAML (or JSON) through JSON's data model, so enums are written as one-key maps
/// (`{fixed: 0.5}`) rather than YAML tags.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Whether `service` matches a fault's optional service.
pub fn applies(fault_service: &Option<String>, service: &str) -> bool {
    fault_service.as_deref().is_none_or(|s| s == service)
}

/// `*` matches any run of characters, `?` exactly one.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    p = star + 1;
                    t = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("cp-*", "cp-2"));
        assert!(glob_match("*-control-plane-?", "c1-control-plane-3"));
        assert!(!glob_match("cp-?", "cp-22"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }

    #[test]
    fn delays_sample_within_their_distribution() {
        assert_eq!(Delay::Fixed(1.5).sample(0.3), Duration::from_millis(1500));
        assert_eq!(Delay::Uniform(1.0, 3.0).sample(0.5), Duration::from_secs(2));
        let exp = Delay::Exponential(2.0);
        assert_eq!(exp.sample(0.0), Duration::ZERO);
        assert!(exp.sample(0.99) > Duration::from_secs(9));
        assert_eq!(Delay::Fixed(-1.0).sample(0.0), Duration::ZERO);
    }

    #[test]
    fn scenario_file_parses_and_counted_rules_are_spent() {
        let mut scenario = Scenario::parse(
            r#"
seed: 7
timings:
  member_create: {uniform: [0.5, 1.0]}
rules:
  - {kind: member, name: "cp-2*", effect: stuck}
  - {kind: member, name: "cp-3*", effect: error, times: 1}
  - {kind: loadbalancer, effect: {delay: {fixed: 30}}}
rate_limits:
  - {service: load-balancer, above_per_second: 5, retry_after: 2}
server_errors:
  - {probability: 0.1}
keystone_outages:
  - {from: 10, until: 20}
"#,
        )
        .unwrap();
        assert_eq!(scenario.seed, Some(7));
        assert_eq!(scenario.timings.member_create, Delay::Uniform(0.5, 1.0));
        assert!(scenario.is_stuck(ObjectKind::Member, "cp-2-abc"));
        assert_eq!(
            scenario.take_effect(ObjectKind::Member, "cp-3"),
            Some(Effect::Error)
        );
        assert_eq!(scenario.take_effect(ObjectKind::Member, "cp-3"), None);
        assert_eq!(
            scenario.take_effect(ObjectKind::Loadbalancer, "lb"),
            Some(Effect::Delay(Delay::Fixed(30.0)))
        );
        assert_eq!(scenario.server_errors[0].status, 503);
        assert!(Scenario::parse("rules: [{kind: member, effect: explode}]").is_err());
    }
}
