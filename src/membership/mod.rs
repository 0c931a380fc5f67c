//! The membership engine (DESIGN.md §3-4): desired pool membership from the reconcilers, what
//! Octavia shows for every member, and the gate's verdicts. Pure logic (`model`, `verdict`,
//! `schedule`) is apart from the loop that polls (`engine`). It writes no Kubernetes objects.

pub mod engine;
pub mod metrics;
pub mod model;
pub mod schedule;
pub mod verdict;

pub use engine::{Change, Engine, EngineConfig, Snapshot, Strategy};
pub use model::{DesiredLb, DesiredMember, ObjectRef};
pub use schedule::ScheduleConfig;
pub use verdict::{Health, LbVerdict, MemberVerdict, Reason};
