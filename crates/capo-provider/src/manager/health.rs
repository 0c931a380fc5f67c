//! What `/healthz` and `/readyz` answer: the manager's phases, as its tasks report them.
//!
//! - **Live** (`/healthz`): the process answers and none of its long-running loops (the
//!   controllers, the engine's wake-up bridge) has ended on its own. A dead loop never comes
//!   back, so the kubelet should restart the pod.
//! - **Ready** (`/readyz`): the CRDs are installed and Established, and either this replica
//!   leads and every controller's cache has listed once, or it stands by for the Lease (a
//!   standby is healthy and ready to take over; it holds no caches until it leads).

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Where the manager is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the CRDs.
    WaitingForCrds,
    /// CRDs present; waiting for the Lease.
    Standby,
    /// Running the controllers.
    Leading,
    /// Shutting down (SIGTERM): not ready, still live.
    Stopping,
}

/// Shared by the manager (which reports) and the admin server (which answers).
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    expected: BTreeSet<&'static str>,
    synced: BTreeSet<&'static str>,
    dead: BTreeSet<&'static str>,
}

impl Health {
    /// A manager whose controllers are `controllers`, before anything has started.
    pub fn new(controllers: &[&'static str]) -> Self {
        Health {
            state: Mutex::new(State {
                phase: Phase::WaitingForCrds,
                expected: controllers.iter().copied().collect(),
                synced: BTreeSet::new(),
                dead: BTreeSet::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is a single assignment: a poisoned lock still holds whole data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records where the manager now is; `/readyz` answers from it.
    pub fn set_phase(&self, phase: Phase) {
        self.state().phase = phase;
    }

    /// Where the manager is now.
    pub fn phase(&self) -> Phase {
        self.state().phase
    }

    /// A controller's cache has listed once.
    pub fn synced(&self, controller: &'static str) {
        self.state().synced.insert(controller);
    }

    /// A loop ended while the manager was not stopping.
    pub fn died(&self, task: &'static str) {
        self.state().dead.insert(task);
    }

    /// `/healthz`: `Err` names the loops that died.
    pub fn liveness(&self) -> Result<(), String> {
        let state = self.state();
        if state.dead.is_empty() {
            return Ok(());
        }
        let dead: Vec<&str> = state.dead.iter().copied().collect();
        Err(format!("loops ended: {}", dead.join(", ")))
    }

    /// `/readyz`: `Err` says what is not ready yet.
    pub fn readiness(&self) -> Result<&'static str, String> {
        let state = self.state();
        match state.phase {
            Phase::WaitingForCrds => Err("waiting for the CustomResourceDefinitions".to_owned()),
            Phase::Stopping => Err("shutting down".to_owned()),
            Phase::Standby => Ok("standing by for the leader Lease"),
            Phase::Leading => {
                let waiting: Vec<&str> =
                    state.expected.difference(&state.synced).copied().collect();
                match waiting.is_empty() {
                    true => Ok("leading; caches synced"),
                    false => Err(format!("caches not synced: {}", waiting.join(", "))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_the_crds_are_there_and_every_cache_has_listed() {
        let health = Health::new(&["a", "b"]);
        assert!(health.readiness().is_err());
        health.set_phase(Phase::Standby);
        assert_eq!(health.readiness(), Ok("standing by for the leader Lease"));
        health.set_phase(Phase::Leading);
        health.synced("a");
        assert_eq!(health.readiness(), Err("caches not synced: b".to_owned()));
        health.synced("b");
        assert!(health.readiness().is_ok());
        health.set_phase(Phase::Stopping);
        assert!(health.readiness().is_err());
    }

    #[test]
    fn a_dead_loop_makes_the_process_unhealthy() {
        let health = Health::new(&["a"]);
        assert!(health.liveness().is_ok());
        health.died("a");
        assert_eq!(health.liveness(), Err("loops ended: a".to_owned()));
    }
}
