//! The live view: on a terminal, a board redrawn in place (indicatif) with a progress bar for
//! the rollout; otherwise one plain line per change, for logs and CI.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::Strategy;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::board::{self, Board, Stage};

pub struct View {
    started: Instant,
    shown: Board,
    live: Option<Live>,
    strategy: Strategy,
}

struct Live {
    _bars: MultiProgress,
    board: ProgressBar,
    rollout: ProgressBar,
}

impl View {
    /// Live on a terminal unless `plain`.
    pub fn new(plain: bool, strategy: Strategy) -> Self {
        let live = (!plain && std::io::stdout().is_terminal()).then(Live::new);
        View {
            started: Instant::now(),
            shown: Board::default(),
            live,
            strategy,
        }
    }

    /// A line above the board (or in the log).
    pub fn line(&self, text: &str) {
        match &self.live {
            Some(live) => live.board.println(text),
            None => println!("{text}"),
        }
    }

    pub fn show(&mut self, board: &Board) {
        let elapsed = self.started.elapsed();
        match &self.live {
            Some(live) => {
                live.board
                    .set_message(render(board, elapsed, self.strategy));
                let (done, all) = board.phase.rollout_steps;
                if all > 0 {
                    live.rollout.set_length(all);
                    live.rollout.set_position(done);
                }
                live.rollout.set_message(board.phase.stage.words());
            }
            None => {
                for change in board::changes(&self.shown, board) {
                    println!("[{:6.1}s] {change}", elapsed.as_secs_f64());
                }
            }
        }
        self.shown = board.clone();
    }

    /// Leaves the last board on the screen.
    pub fn finish(&mut self) {
        if let Some(live) = self.live.take() {
            live.rollout.finish();
            live.board.finish();
        }
    }
}

impl Live {
    fn new() -> Self {
        let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stdout_with_hz(10));
        let board = bars.add(ProgressBar::new_spinner());
        board.set_style(
            ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        let rollout = bars.add(ProgressBar::new(9));
        rollout.set_style(
            ProgressStyle::with_template("rollout [{bar:30.cyan/blue}] {pos}/{len} steps  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Live {
            _bars: bars,
            board,
            rollout,
        }
    }
}

/// The board as text: the gate, one line per machine, the API pool, the latest events.
pub fn render(board: &Board, elapsed: Duration, strategy: Strategy) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "capo-rs demo  {:>6.1}s  strategy {}  {}",
        elapsed.as_secs_f64(),
        strategy.as_str(),
        board.phase.stage.words()
    );
    match &board.gate {
        Some(gate) => {
            let state = if gate.ready { "OPEN" } else { "HOLDING" };
            let _ = writeln!(
                out,
                "gate {state:<8} {}  {}",
                gate.reason,
                clip(&gate.message, 90)
            );
        }
        None => out.push_str("gate -        (no load balancer yet)\n"),
    }
    let _ = writeln!(
        out,
        "API pool: {} of {} members ACTIVE, {} serving (ACTIVE and ONLINE)",
        board.pool_active, board.pool_members, board.pool_serving
    );
    let _ = writeln!(
        out,
        "{:<32} {:<6} {:<9} {:<22} {:<9} GATE",
        "MACHINE", "ROLE", "SERVER", "MEMBER", "RELEASED"
    );
    for machine in &board.machines {
        let role = if machine.control_plane {
            "cp"
        } else {
            "worker"
        };
        let member = match (&machine.member, &machine.operating) {
            (Some(member), Some(operating)) => format!("{member}/{operating}"),
            (Some(member), None) => member.clone(),
            _ => "-".to_owned(),
        };
        let released = if machine.released { "yes" } else { "held" };
        let mut gate = machine.gate_reason.clone().unwrap_or_default();
        if machine.repairs > 0 {
            let _ = write!(gate, " (repaired {}x)", machine.repairs);
        }
        if machine.deleting {
            gate.push_str(" [deleting]");
        }
        let _ = writeln!(
            out,
            "{:<32} {role:<6} {:<9} {member:<22} {released:<9} {gate}",
            machine.name, machine.server
        );
    }
    if !board.phase.note.is_empty() {
        let _ = writeln!(out, "story: {}", board.phase.note);
    }
    for event in &board.events {
        let _ = writeln!(out, "  {}", clip(event, 110));
    }
    if board.phase.stage == Stage::Done {
        out.push_str("done\n");
    }
    out.trim_end().to_owned()
}

fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
    clipped.push('…');
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Gate, MachineRow, Phase};

    #[test]
    fn the_board_shows_the_gate_each_machine_and_its_member() {
        let board = Board {
            phase: Phase {
                stage: Stage::RollingOut,
                rollout_steps: (4, 9),
                note: "the next member will be stuck".into(),
            },
            gate: Some(Gate {
                ready: false,
                reason: "MemberStuck".into(),
                message: "member x PENDING_CREATE for 9s".into(),
            }),
            machines: vec![MachineRow {
                name: "demo-control-plane-abcde".into(),
                control_plane: true,
                deleting: false,
                server: "ACTIVE".into(),
                member: Some("PENDING_CREATE".into()),
                operating: Some("OFFLINE".into()),
                released: false,
                gate_reason: Some("MemberStuck".into()),
                repairs: 1,
            }],
            pool_active: 3,
            pool_members: 4,
            pool_serving: 2,
            events: vec!["Warning MemberStuck: x".into()],
        };
        let text = render(&board, Duration::from_secs(42), Strategy::StatusTree);
        assert!(text.contains("gate HOLDING  MemberStuck"), "{text}");
        assert!(
            text.contains("API pool: 3 of 4 members ACTIVE, 2 serving"),
            "{text}"
        );
        assert!(text.contains("PENDING_CREATE/OFFLINE held"), "{text}");
        assert!(text.contains("MemberStuck (repaired 1x)"), "{text}");
        assert!(text.contains("Warning MemberStuck: x"), "{text}");
    }
}
