//! The floor under `bench membership`'s race: the fewest requests any poller could spend on the
//! same rollouts and still see every member finish within the lag target.
//!
//! The poller the floor prices is told more than any real one is: where finishes can fall
//! (anywhere in `first..=last` seconds after the create, or exactly at the slow members' fixed
//! time), though not where each member's falls. In the race a member's finish does not change
//! its LB's row, so no list shows it: only a look at the member (a status tree, or a GET of the
//! member) does. To see any finish in a window within `lag`, looks can be no more than `lag`
//! apart across it, the first no later than `first + lag`; looking at `first + lag`,
//! `first + 2 lag`, ... is as late as allowed at every step, so no schedule sees a given finish
//! with fewer looks. A member past the window costs every look across it and one at the slow
//! time; a stuck member the same (the poller knows nothing finishes later, and a stuck flag
//! needs a clock, not a look). Each verdict after a removal, and each LB's first verdict, need
//! one look: a verdict is said of what was seen.

/// Where a member's finish can fall, in seconds after its create, and the lag to see it in.
/// Slow members finish at one fixed time past `last`: one look there sees them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Windows {
    /// Normal members (and those ending in ERROR) finish anywhere in `first..=last`.
    pub first: f64,
    pub last: f64,
    /// Every finish must be seen within this many seconds.
    pub lag: f64,
}

/// A finish this close past a window's end still counts as inside it (clock rounding).
const ROUNDING: f64 = 1e-6;

impl Windows {
    /// Looks spaced `lag` apart across the normal window.
    fn across(&self) -> u64 {
        ((self.last - self.first) / self.lag).ceil().max(1.0) as u64
    }

    /// The fewest looks that see a member finishing `finish` seconds after its create within
    /// the lag (`None`: it never finishes).
    pub fn looks(&self, finish: Option<f64>) -> u64 {
        let across = self.across();
        match finish {
            Some(at) if at <= self.last + ROUNDING => {
                let needed = ((at - self.first - ROUNDING) / self.lag).ceil();
                (needed.max(1.0) as u64).min(across)
            }
            _ => across + 1,
        }
    }
}

/// What the rollouts asked of a poller: each member created (its finish, if any), each
/// removal waited on, each LB tracked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Asked {
    pub finishes: Vec<Option<f64>>,
    pub removals: u64,
    pub load_balancers: u64,
}

/// The fewest requests that serve `asked` under `windows`.
pub fn requests(windows: &Windows, asked: &Asked) -> u64 {
    let creations: u64 = asked.finishes.iter().map(|f| windows.looks(*f)).sum();
    creations + asked.removals + asked.load_balancers
}

#[cfg(test)]
mod tests {
    use super::*;

    const RACE: Windows = Windows {
        first: 2.0,
        last: 30.0,
        lag: 2.0,
    };

    #[test]
    fn a_finish_costs_the_looks_spaced_a_lag_apart_up_to_the_first_at_or_after_it() {
        assert_eq!(RACE.looks(Some(2.0)), 1);
        assert_eq!(RACE.looks(Some(4.0)), 1, "the look at 4 s sees it");
        assert_eq!(RACE.looks(Some(4.1)), 2);
        assert_eq!(RACE.looks(Some(29.9)), 14);
        assert_eq!(RACE.looks(Some(30.0)), 14);
    }

    #[test]
    fn a_slow_or_stuck_member_costs_every_look_across_the_window_and_one_more() {
        assert_eq!(RACE.looks(Some(120.0)), 15);
        assert_eq!(RACE.looks(None), 15);
    }

    #[test]
    fn finishes_spread_evenly_cost_half_the_window_in_lags_and_a_half() {
        let finishes: Vec<Option<f64>> =
            (0..2800).map(|i| Some(2.0 + f64::from(i) * 0.01)).collect();
        let asked = Asked {
            finishes,
            ..Asked::default()
        };
        let mean = requests(&RACE, &asked) as f64 / 2800.0;
        assert!((mean - 7.5).abs() < 0.01, "{mean}");
    }

    #[test]
    fn removals_and_load_balancers_cost_a_look_each() {
        let asked = Asked {
            finishes: vec![Some(5.0), None],
            removals: 1,
            load_balancers: 2,
        };
        assert_eq!(requests(&RACE, &asked), 2 + 15 + 1 + 2);
    }

    #[test]
    fn a_shorter_lag_costs_more_looks() {
        let tight = Windows { lag: 1.0, ..RACE };
        assert_eq!(tight.looks(Some(30.0)), 28);
        assert_eq!(tight.looks(None), 29);
    }
}
