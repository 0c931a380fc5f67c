//! Which log lines `capo-rs` writes (its `--log-level`). The operator's level is capo-rs's own: dependencies stay at
//! warnings unless a directive names them. The OpenStack SDK logs every request URL at info,
//! bodies at debug and authentication at trace; kube's client, hyper and h2 log requests and
//! frames at debug and trace. `--log-level=debug` must not turn those on, so the level alone
//! never reaches them; `--log-level=debug,openstack_sdk=debug` does, because it asks by name.

/// capo-rs's crates (`capo_<name>`): a bare level in the filter applies to these.
const OURS: &[&str] = &["rs", "provider", "api", "sim", "demo", "bench"];

/// Targets silenced unless a directive names them (or a module above them). kube's client
/// logs each failed request at error as `failed with error client error (Connect)`, without
/// its cause; the caller's own line says the same and why (`manager::unreachable`).
const QUIET: &[&str] = &["kube_client::client::builder"];

/// The levels tracing knows, least to most verbose.
const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// The `EnvFilter` directives for what the operator asked (`--log-level`, else `$RUST_LOG`),
/// or for `default_level` when nothing was asked. A bare level is capo-rs's; every other crate
/// logs at warnings, or less if the operator asked for less; a directive naming a target is
/// kept as written and wins for that target.
pub fn directives(asked: Option<&str>, default_level: &str) -> String {
    let mut level = default_level.to_owned();
    let mut named: Vec<&str> = Vec::new();
    for directive in asked.unwrap_or_default().split(',').map(str::trim) {
        if directive.is_empty() {
            continue;
        }
        if is_level(directive) {
            directive.clone_into(&mut level);
        } else {
            named.push(directive);
        }
    }
    let level = level.to_ascii_lowercase();
    let others = if rank(&level) < rank("warn") {
        level.as_str()
    } else {
        "warn"
    };
    let mut out = vec![others.to_owned()];
    for crate_name in OURS.iter().map(|name| format!("capo_{name}")) {
        if !named.iter().any(|d| target_of(d) == crate_name) {
            out.push(format!("{crate_name}={level}"));
        }
    }
    for quiet in QUIET {
        let asked_for = named.iter().any(|d| {
            let target = target_of(d);
            *quiet == target || quiet.starts_with(&format!("{target}::"))
        });
        if !asked_for {
            out.push(format!("{quiet}=off"));
        }
    }
    out.extend(named.into_iter().map(str::to_owned));
    out.join(",")
}

fn is_level(directive: &str) -> bool {
    LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive))
}

fn rank(level: &str) -> usize {
    LEVELS
        .iter()
        .position(|l| *l == level)
        .unwrap_or(LEVELS.len())
}

/// The target a directive names: `openstack_sdk::api` of `openstack_sdk::api[span]=debug`.
/// Only a directive for a whole crate replaces the bare level for it; one for a module within
/// it leaves the crate at the bare level.
fn target_of(directive: &str) -> &str {
    let end = directive.find(['=', '[']).unwrap_or(directive.len());
    &directive[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our crates at `level`, and the quiet targets off.
    fn ours_at(level: &str) -> String {
        OURS.iter()
            .map(|c| format!("capo_{c}={level}"))
            .chain(QUIET.iter().map(|q| format!("{q}=off")))
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn a_bare_level_is_capo_rs_s_and_dependencies_stay_at_warnings() {
        assert_eq!(
            directives(Some("trace"), "info"),
            format!("warn,{}", ours_at("trace"))
        );
        assert_eq!(
            directives(Some("DEBUG"), "info"),
            format!("warn,{}", ours_at("debug"))
        );
        assert_eq!(
            directives(None, "info"),
            format!("warn,{}", ours_at("info"))
        );
        // Asking for less than warnings quiets everyone.
        assert_eq!(
            directives(Some("error"), "info"),
            format!("error,{}", ours_at("error"))
        );
    }

    #[test]
    fn a_dependency_is_heard_only_when_asked_for_by_name() {
        let filter = directives(Some("info,openstack_sdk=debug"), "info");
        assert_eq!(
            filter,
            format!("warn,{},openstack_sdk=debug", ours_at("info"))
        );
        // A directive for a module of ours leaves the rest of the crate at the bare level; one
        // for the whole crate replaces it.
        let filter = directives(
            Some("warn,capo_provider::controllers::writes=debug"),
            "info",
        );
        assert!(filter.contains("capo_provider=warn,"), "{filter}");
        assert!(
            filter.ends_with(",capo_provider::controllers::writes=debug"),
            "{filter}"
        );
        let filter = directives(Some("info,capo_provider=trace"), "info");
        assert!(!filter.contains("capo_provider=info"), "{filter}");
        assert!(filter.ends_with(",capo_provider=trace"), "{filter}");
        // Naming kube's client, or the quiet module, hears it again.
        for asked in ["kube_client=debug", "kube_client::client::builder=error"] {
            let filter = directives(Some(asked), "info");
            assert!(!filter.contains("builder=off"), "{filter}");
            assert!(filter.ends_with(asked), "{filter}");
        }
    }

    #[test]
    fn every_result_is_a_filter_tracing_accepts() {
        for asked in [
            None,
            Some(""),
            Some("trace"),
            Some("info,kube_client=trace"),
            Some("off"),
        ] {
            let filter = directives(asked, "info");
            assert!(
                tracing_subscriber::EnvFilter::try_new(&filter).is_ok(),
                "{asked:?}: {filter}"
            );
        }
    }
}
