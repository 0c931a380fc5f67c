//! CAPO's feature gates (`--feature-gates`) and CRD migration phases
//! (`--skip-crd-migration-phases`), read as CAPO reads them.
//!
//! The gates and their defaults are CAPO main's (`feature/feature.go`, `e52de58`):
//! `PriorityQueue` (beta, on) and `AutoScaleFromZero` (alpha, off). The value is parsed as
//! Kubernetes' component-base parses it (`featuregate.Set`): comma-separated `Name=bool`
//! pairs, Go's boolean spellings, and an unknown name refused, so a typo stops the start.

/// What `--feature-gates` turns on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Accepted for CAPO's manifests; capo-rs's queue has no priorities to switch
    /// (`docs/capo-compatibility.md`).
    pub priority_queue: bool,
    /// Machine templates get the capacity and node info the cluster autoscaler reads to scale
    /// a MachineDeployment from zero.
    pub auto_scale_from_zero: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            priority_queue: true,
            auto_scale_from_zero: false,
        }
    }
}

/// The priority-queue gate's name, as CAPO spells it.
pub const PRIORITY_QUEUE: &str = "PriorityQueue";
/// The scale-from-zero gate's name, as CAPO spells it.
pub const AUTO_SCALE_FROM_ZERO: &str = "AutoScaleFromZero";

/// component-base's names for every alpha and every beta gate at once (`AllAlpha`,
/// `AllBeta`): they set the gates of their stage that the value does not name.
pub const ALL_ALPHA: &str = "AllAlpha";
/// See [`ALL_ALPHA`].
pub const ALL_BETA: &str = "AllBeta";

/// Parses `--feature-gates`, over the defaults. `AutoScaleFromZero` is alpha and
/// `PriorityQueue` beta, as in CAPO main.
pub fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let (mut priority_queue, mut auto_scale_from_zero) = (None, None);
    let (mut all_alpha, mut all_beta) = (None, None);
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("missing bool value for {pair}"));
        };
        let (name, value) = (name.trim(), value.trim());
        let enabled = go_bool(value)
            .ok_or_else(|| format!("invalid value of {name}={value}, err: not a boolean"))?;
        let slot = match name {
            PRIORITY_QUEUE => &mut priority_queue,
            AUTO_SCALE_FROM_ZERO => &mut auto_scale_from_zero,
            ALL_ALPHA => &mut all_alpha,
            ALL_BETA => &mut all_beta,
            _ => {
                return Err(format!(
                    "unrecognized feature gate: {name} (known: {PRIORITY_QUEUE}, {AUTO_SCALE_FROM_ZERO}, {ALL_ALPHA}, {ALL_BETA})"
                ));
            }
        };
        *slot = Some(enabled);
    }
    let defaults = FeatureGates::default();
    Ok(FeatureGates {
        priority_queue: priority_queue
            .or(all_beta)
            .unwrap_or(defaults.priority_queue),
        auto_scale_from_zero: auto_scale_from_zero
            .or(all_alpha)
            .unwrap_or(defaults.auto_scale_from_zero),
    })
}

/// Go's `strconv.ParseBool`.
fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The phases of Cluster API's CRD migrator that CAPO runs at start-up
/// (`--skip-crd-migration-phases`, `main.go`, v0.14.7 and main).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MigrationPhase {
    /// Every object rewritten in the storage version, then `status.storedVersions` trimmed.
    StorageVersionMigration,
    /// Managed fields of old API versions dropped from every object.
    CleanupManagedFields,
}

impl MigrationPhase {
    /// Every phase, in the order Cluster API's migrator runs them.
    pub const ALL: [MigrationPhase; 2] = [
        MigrationPhase::StorageVersionMigration,
        MigrationPhase::CleanupManagedFields,
    ];

    /// The name CAPO's flag takes.
    pub fn name(self) -> &'static str {
        match self {
            MigrationPhase::StorageVersionMigration => "StorageVersionMigration",
            MigrationPhase::CleanupManagedFields => "CleanupManagedFields",
        }
    }
}

/// Parses one `--skip-crd-migration-phases` value (the flag is repeated for more).
pub fn parse_migration_phase(text: &str) -> Result<MigrationPhase, String> {
    MigrationPhase::ALL
        .into_iter()
        .find(|phase| phase.name() == text)
        .ok_or_else(|| {
            format!("unknown CRD migration phase {text:?}: valid values are StorageVersionMigration, CleanupManagedFields")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_default_to_capo_mains() {
        assert_eq!(parse_feature_gates(""), Ok(FeatureGates::default()));
        assert!(FeatureGates::default().priority_queue);
        assert!(!FeatureGates::default().auto_scale_from_zero);
    }

    #[test]
    fn gates_read_as_component_base_reads_them() {
        let gates = parse_feature_gates("PriorityQueue=false, AutoScaleFromZero=T").unwrap();
        assert_eq!(
            gates,
            FeatureGates {
                priority_queue: false,
                auto_scale_from_zero: true,
            }
        );
        assert!(
            parse_feature_gates("AutoScaleFromZero=1")
                .unwrap()
                .auto_scale_from_zero
        );
        assert!(parse_feature_gates("AutoScaleFromZero=yes").is_err());
        assert!(parse_feature_gates("AutoScaleFromZero").is_err());
    }

    #[test]
    fn an_unknown_gate_is_refused_by_name() {
        let error = parse_feature_gates("AutoScaleFromZero=true,MachinePool=true").unwrap_err();
        assert!(
            error.contains("unrecognized feature gate: MachinePool"),
            "{error}"
        );
    }

    #[test]
    fn all_alpha_and_all_beta_set_the_gates_not_named() {
        let alpha = parse_feature_gates("AllAlpha=true").unwrap();
        assert!(alpha.auto_scale_from_zero && alpha.priority_queue);
        let named = parse_feature_gates("AllAlpha=true,AutoScaleFromZero=false").unwrap();
        assert!(!named.auto_scale_from_zero);
        assert!(!parse_feature_gates("AllBeta=false").unwrap().priority_queue);
    }

    #[test]
    fn phases_take_capos_names_only() {
        for phase in MigrationPhase::ALL {
            assert_eq!(parse_migration_phase(phase.name()), Ok(phase));
        }
        assert!(parse_migration_phase("storageversionmigration").is_err());
    }
}
