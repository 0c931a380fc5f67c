//! glibc's allocator, set by the binary itself: two arenas rather than eight per core, and
//! blocks of 128 KiB and more (a list page's text) mapped on their own and given back when
//! freed (docs/memory.md). The image sets these through `GLIBC_TUNABLES`; a binary run any
//! other way (built with cargo, a distribution's package) sets them from here.
//!
//! glibc reads its tunables once, as a process starts, and capo-rs has no unsafe code to call
//! `mallopt`: so the binary, finding the variable without them, executes itself again at once
//! with them added (the same process, the same PID, before any thread or log). A
//! `GLIBC_TUNABLES` that names a `glibc.malloc` tunable is the operator's choice, and wins.

/// The settings, as `GLIBC_TUNABLES` spells them (the Dockerfile's, `tests/it/packaging.rs`).
pub const TUNABLES: &str = "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072";

/// Set on the second start, so that a glibc that drops the variable (a setuid start) cannot
/// make the binary execute itself for ever.
pub const TUNED_MARK: &str = "CAPO_RS_ALLOCATOR_TUNED";

/// The `GLIBC_TUNABLES` the process should start with, given the one it has: none to change
/// when it names a malloc tunable already.
pub fn wanted(current: Option<&str>) -> Option<String> {
    match current {
        Some(given) if given.contains("glibc.malloc.") => None,
        Some(given) if !given.is_empty() => Some(format!("{given}:{TUNABLES}")),
        _ => Some(TUNABLES.to_owned()),
    }
}

/// What [`ensure`] did.
#[derive(Debug)]
pub enum Tuning {
    /// The settings are in force: the variable had them, or this is the second start.
    InForce,
    /// The operator's own malloc tunables are in force.
    Operators,
    /// The binary could not execute itself again; it runs with glibc's defaults.
    Failed(std::io::Error),
    /// Not glibc: nothing to set.
    NotGlibc,
}

/// Executes this binary again with [`TUNABLES`] unless they (or the operator's malloc
/// tunables) are in force already. Call it first in `main`; it returns only when the process
/// goes on as it is.
pub fn ensure() -> Tuning {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return Tuning::NotGlibc;
    }
    if std::env::var_os(TUNED_MARK).is_some() {
        return Tuning::InForce;
    }
    let current = std::env::var("GLIBC_TUNABLES").ok();
    let Some(tunables) = wanted(current.as_deref()) else {
        return match current.as_deref() {
            Some(given) if given.contains(TUNABLES) => Tuning::InForce,
            _ => Tuning::Operators,
        };
    };
    Tuning::Failed(execute_again(&tunables))
}

#[cfg(unix)]
fn execute_again(tunables: &str) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => return error,
    };
    std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", tunables)
        .env(TUNED_MARK, "1")
        .exec()
}

#[cfg(not(unix))]
fn execute_again(_: &str) -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_are_added_unless_the_operator_set_malloc_tunables() {
        assert_eq!(wanted(None).as_deref(), Some(TUNABLES));
        assert_eq!(wanted(Some("")).as_deref(), Some(TUNABLES));
        assert_eq!(
            wanted(Some("glibc.pthread.rseq=0")),
            Some(format!("glibc.pthread.rseq=0:{TUNABLES}"))
        );
        assert_eq!(wanted(Some("glibc.malloc.arena_max=4")), None);
        assert_eq!(wanted(Some(TUNABLES)), None);
    }
}
