//! What one randomized rollout is made of, drawn from its seed alone: the same seed always
//! draws the same run, so a violation's seed replays it.

use serde::Serialize;

/// A span of virtual seconds after the rollout starts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Window {
    pub from: f64,
    pub until: f64,
}

/// A member held in PENDING_CREATE.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StuckMember {
    /// Which new machine of the rollout (0 = the first).
    pub machine: usize,
    /// Seconds after that machine is created when the member moves on; `None`: never.
    pub released_after: Option<f64>,
}

/// A member whose creation ends in ERROR.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ErrorMember {
    pub machine: usize,
    /// How many creations in a row end in ERROR: more than the gate's repairs (3) holds the
    /// rollout with MemberError.
    pub times: u32,
}

/// 429 answers, with Retry-After, to a share of requests during a window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RateLimitStorm {
    pub window: Window,
    pub probability: f64,
    pub retry_after: u64,
}

/// 5xx answers to a share of requests during a window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServerErrorBurst {
    pub window: Window,
    pub probability: f64,
    pub status: u16,
}

/// How the controller is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartKind {
    /// SIGTERM: reconciles in flight finish first.
    Graceful,
    /// A crash: every task is dropped where it stands.
    Crash,
}

/// What a new machine's kube-apiserver does, as its health monitor sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiTroubleKind {
    /// Listens, but `/readyz` never answers 200.
    NeverServes,
    /// Up for `period` seconds, then down as long, and so on (a crash-looping API server).
    /// Through the monitor's rise and fall (checks 10 s apart, up after 5 passes, down after
    /// 3 failures) it reads up at first, then down; it reads up again only when a phase
    /// holds 5 checks.
    Flapping { period: f64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ApiTrouble {
    /// Which new machine of the rollout.
    pub machine: usize,
    pub kind: ApiTroubleKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Restart {
    /// Seconds after the rollout starts.
    pub at: f64,
    pub kind: RestartKind,
}

/// One run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Draw {
    pub seed: u64,
    /// Control-plane machines: 1, 3 or 5.
    pub control_plane: usize,
    /// How many of them the rollout replaces, oldest first.
    pub replacements: usize,
    /// Each new member's PENDING_CREATE -> ACTIVE, uniform in this range (seconds, 2-120).
    pub member_delay: (f64, f64),
    /// The LB stays locked until its member settles (Octavia's own order), or unlocks first
    /// and the member settles later (AmphoraV2's race).
    pub lb_waits_for_members: bool,
    pub stuck: Option<StuckMember>,
    pub error: Option<ErrorMember>,
    /// The LB's next transition after the rollout's first member ends in ERROR.
    pub lb_error: bool,
    pub rate_limits: Option<RateLimitStorm>,
    pub server_errors: Option<ServerErrorBurst>,
    /// Keystone answers 503.
    pub keystone_outage: Option<Window>,
    pub restart: Option<Restart>,
    /// A new machine whose API never serves, or flaps.
    pub api: Option<ApiTrouble>,
}

/// True with probability `p`.
fn chance(rng: &mut fastrand::Rng, p: f64) -> bool {
    rng.f64() < p
}

impl Draw {
    pub fn from_seed(seed: u64) -> Draw {
        let mut rng = fastrand::Rng::with_seed(seed);
        let control_plane = [1, 3, 5][rng.usize(0..3)];
        let replacements = rng.usize(1..=control_plane);
        let low = 2.0 + rng.f64() * 60.0;
        let high = low + rng.f64() * (120.0 - low);
        let window = |rng: &mut fastrand::Rng| {
            let from = rng.f64() * 240.0;
            Window {
                from,
                until: from + 10.0 + rng.f64() * 110.0,
            }
        };
        let lb_waits_for_members = rng.bool();
        let stuck = chance(&mut rng, 0.25).then(|| StuckMember {
            machine: rng.usize(0..replacements),
            released_after: rng.bool().then(|| 30.0 + rng.f64() * 570.0),
        });
        let error = chance(&mut rng, 0.2).then(|| ErrorMember {
            machine: rng.usize(0..replacements),
            times: if chance(&mut rng, 0.3) {
                4
            } else {
                rng.u32(1..=2)
            },
        });
        let lb_error = chance(&mut rng, 0.08);
        let rate_limits = chance(&mut rng, 0.3).then(|| RateLimitStorm {
            window: window(&mut rng),
            probability: 0.2 + rng.f64() * 0.7,
            retry_after: rng.u64(1..=10),
        });
        let server_errors = chance(&mut rng, 0.3).then(|| ServerErrorBurst {
            window: window(&mut rng),
            probability: 0.1 + rng.f64() * 0.5,
            status: [500, 502, 503, 504][rng.usize(0..4)],
        });
        let keystone_outage = chance(&mut rng, 0.2).then(|| window(&mut rng));
        let restart = chance(&mut rng, 0.5).then(|| Restart {
            at: rng.f64() * 300.0,
            kind: if rng.bool() {
                RestartKind::Graceful
            } else {
                RestartKind::Crash
            },
        });
        // Drawn last, so that every earlier part of a seed's draw stays what it was.
        let api = chance(&mut rng, 0.25).then(|| ApiTrouble {
            machine: rng.usize(0..replacements),
            kind: if rng.bool() {
                ApiTroubleKind::NeverServes
            } else {
                ApiTroubleKind::Flapping {
                    period: 20.0 + rng.f64() * 100.0,
                }
            },
        });
        Draw {
            seed,
            control_plane,
            replacements,
            member_delay: (low, high),
            lb_waits_for_members,
            stuck,
            error,
            lb_error,
            rate_limits,
            server_errors,
            keystone_outage,
            restart,
            api,
        }
    }

    /// Whether the rollout may be held for good rather than complete: a member stuck for
    /// ever, ERROR more often than the gate repairs, the LB itself in ERROR, or a new
    /// machine's API that never serves or flaps.
    pub fn may_hold(&self) -> bool {
        self.stuck.is_some_and(|s| s.released_after.is_none())
            || self.error.is_some_and(|e| e.times > 3)
            || self.lb_error
            || self.api.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_draws_the_same_run() {
        assert_eq!(Draw::from_seed(7), Draw::from_seed(7));
        assert_ne!(Draw::from_seed(7), Draw::from_seed(8));
    }

    #[test]
    fn draws_stay_in_their_ranges_and_cover_every_kind_of_trouble() {
        let draws: Vec<Draw> = (0..2000).map(Draw::from_seed).collect();
        for draw in &draws {
            assert!([1, 3, 5].contains(&draw.control_plane));
            assert!((1..=draw.control_plane).contains(&draw.replacements));
            let (low, high) = draw.member_delay;
            assert!((2.0..=120.0).contains(&low) && (low..=120.0).contains(&high));
            for machine in [draw.stuck.map(|s| s.machine), draw.error.map(|e| e.machine)]
                .into_iter()
                .flatten()
            {
                assert!(machine < draw.replacements);
            }
        }
        let share = |test: &dyn Fn(&Draw) -> bool| {
            draws.iter().filter(|d| test(d)).count() as f64 / draws.len() as f64
        };
        assert!(share(&|d| d.stuck.is_some()) > 0.15);
        assert!(share(&|d| d.stuck.is_some_and(|s| s.released_after.is_none())) > 0.05);
        assert!(share(&|d| d.error.is_some_and(|e| e.times > 3)) > 0.02);
        assert!(share(&|d| d.lb_error) > 0.03);
        let flapping = |d: &Draw| {
            d.api
                .is_some_and(|a| matches!(a.kind, ApiTroubleKind::Flapping { .. }))
        };
        assert!(share(&flapping) > 0.08);
        assert!(share(&|d| d.api.is_some() && !flapping(d)) > 0.08);
        assert!(share(&|d| d.rate_limits.is_some()) > 0.2);
        assert!(share(&|d| d.server_errors.is_some()) > 0.2);
        assert!(share(&|d| d.keystone_outage.is_some()) > 0.1);
        assert!(share(&|d| d.restart.is_some_and(|r| r.kind == RestartKind::Crash)) > 0.15);
        assert!(share(&|d| d.lb_waits_for_members) > 0.4);
        assert!(share(&|d| d.control_plane == 5) > 0.25);
    }
}
