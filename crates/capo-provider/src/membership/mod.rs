//! The membership engine: desired pool membership from the reconcilers, what Octavia shows for
//! every member, and the gate's verdicts (docs/architecture.md). Pure logic (`model`,
//! `verdict`, `schedule`) is apart from the loop that polls (`engine`) and the way it looks
//! (`observe`). It writes no Kubernetes objects.

pub mod changes;
pub mod engine;
pub mod metrics;
pub mod model;
pub mod observe;
pub mod schedule;
pub mod series;
pub mod verdict;
pub mod vocabulary;

pub use changes::{Change, Changes, Notice, OwnerKind};
pub use engine::{Engine, EngineConfig, EngineError, Snapshot};
pub use model::{
    DesiredLb, DesiredMember, MemberTrack, ObjectName, Presence, Recalled, SeenMember,
};
pub use observe::{Observer, Seen, StatusTreeObserver};
pub use schedule::ScheduleConfig;
pub use verdict::{
    GateRules, Health, LbVerdict, MemberVerdict, MemberVerdictKind, Reason, ServingRules,
};
