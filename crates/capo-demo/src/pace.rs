//! The story's timings. At speed 1 they are already compressed from a real cloud (an amphora
//! member takes 2-30 s there, a stuck one is flagged after 10 minutes) so that the whole demo
//! takes about two and a half minutes; `--speed` divides every one of them further (`capo-rs
//! demo` plays at 2 unless told: about a minute and a half).

use std::time::Duration;

use capo_sim::openstack::{Delay, Timings};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    speed: f64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace { speed: 1.0 }
    }
}

impl Pace {
    /// `speed` > 0; larger is faster.
    pub fn new(speed: f64) -> Result<Self, String> {
        if speed.is_finite() && (0.05..=20.0).contains(&speed) {
            Ok(Pace { speed })
        } else {
            Err(format!("speed {speed} is outside 0.05..=20"))
        }
    }

    pub fn speed(self) -> f64 {
        self.speed
    }

    /// `seconds` of story time, in real time.
    pub fn of(self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds / self.speed)
    }

    fn delay(self, low: f64, high: f64) -> Delay {
        Delay::Uniform(low / self.speed, high / self.speed)
    }

    /// The simulated cloud: AmphoraV2's race, where a member outlasts its LB's unlock.
    pub fn timings(self) -> Timings {
        Timings {
            lb_create: self.delay(1.0, 1.5),
            lb_update: self.delay(0.1, 0.3),
            lb_delete: self.delay(0.3, 0.5),
            child_create: self.delay(0.1, 0.2),
            member_create: self.delay(1.5, 3.0),
            member_update: self.delay(0.5, 1.0),
            member_delete: self.delay(0.5, 1.0),
            member_online: Delay::Fixed(1.0 / self.speed),
            server_build: self.delay(1.5, 2.5),
            server_delete: self.delay(0.5, 1.0),
            volume_create: self.delay(0.5, 1.0),
            volume_delete: self.delay(0.3, 0.5),
            lb_waits_for_members: false,
        }
    }

    /// A PENDING member older than this is stuck (production: 10 minutes).
    /// It counts from the member's request (once its machine has an address, before its
    /// server is up), as production does.
    pub fn stuck_after(self) -> Duration {
        self.of(14.0)
    }

    /// The slow member of the rollout (slow, but not stuck).
    pub fn slow_member(self) -> f64 {
        8.0 / self.speed
    }

    /// How long the stuck member stays stuck once capo-rs has flagged it.
    pub fn stuck_shown(self) -> Duration {
        self.of(4.0)
    }

    /// How long each burst of 429s or 503s lasts.
    pub fn burst(self) -> Duration {
        self.of(4.0)
    }

    /// How long a member must read ONLINE to serve (production: 15 s, one monitor cycle).
    pub fn serving_settle(self) -> Duration {
        self.of(1.5)
    }

    /// An ACTIVE member not serving this long is flagged MemberNotServing (production: 5 min).
    pub fn not_serving_after(self) -> Duration {
        self.of(8.0)
    }

    /// How long a leaving member drains at weight 0 (production: 30 s).
    pub fn drain_period(self) -> Duration {
        self.of(2.0)
    }

    /// How long the API that does not serve stays down once capo-rs has flagged it.
    pub fn not_serving_shown(self) -> Duration {
        self.of(4.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_divides_every_timing() {
        let double = Pace::new(2.0).unwrap();
        assert_eq!(double.of(10.0), Duration::from_secs(5));
        assert_eq!(double.timings().server_build, Delay::Uniform(0.75, 1.25));
        assert!(Pace::new(0.0).is_err() && Pace::new(f64::NAN).is_err());
    }

    #[test]
    fn members_outlast_the_lb_unlock_as_with_amphora_v2() {
        let timings = Pace::default().timings();
        let (Delay::Uniform(_, lb_slowest), Delay::Uniform(member_fastest, _)) =
            (timings.lb_update, timings.member_create)
        else {
            panic!("uniform delays");
        };
        assert!(member_fastest > lb_slowest);
    }
}
