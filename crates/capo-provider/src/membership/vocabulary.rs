//! Octavia's status words exist twice: in the API (what status fields may hold, without
//! UNKNOWN) and in the cloud layer (what Octavia may answer, with UNKNOWN for anything new).
//! These conversions join them, so neither spells the other's words.

use capo_api::cluster as api;

use crate::cloud::octavia::{OperatingStatus, ProvisioningStatus};

/// Octavia answered a status the API has no word for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Octavia status UNKNOWN has no API value")]
pub struct UnknownStatus;

impl From<api::ProvisioningStatus> for ProvisioningStatus {
    fn from(status: api::ProvisioningStatus) -> Self {
        match status {
            api::ProvisioningStatus::Active => Self::Active,
            api::ProvisioningStatus::PendingCreate => Self::PendingCreate,
            api::ProvisioningStatus::PendingUpdate => Self::PendingUpdate,
            api::ProvisioningStatus::PendingDelete => Self::PendingDelete,
            api::ProvisioningStatus::Deleted => Self::Deleted,
            api::ProvisioningStatus::Error => Self::Error,
        }
    }
}

impl TryFrom<ProvisioningStatus> for api::ProvisioningStatus {
    type Error = UnknownStatus;
    fn try_from(status: ProvisioningStatus) -> Result<Self, UnknownStatus> {
        Ok(match status {
            ProvisioningStatus::Active => Self::Active,
            ProvisioningStatus::PendingCreate => Self::PendingCreate,
            ProvisioningStatus::PendingUpdate => Self::PendingUpdate,
            ProvisioningStatus::PendingDelete => Self::PendingDelete,
            ProvisioningStatus::Deleted => Self::Deleted,
            ProvisioningStatus::Error => Self::Error,
            ProvisioningStatus::Unknown => return Err(UnknownStatus),
        })
    }
}

impl From<api::OperatingStatus> for OperatingStatus {
    fn from(status: api::OperatingStatus) -> Self {
        match status {
            api::OperatingStatus::Online => Self::Online,
            api::OperatingStatus::Draining => Self::Draining,
            api::OperatingStatus::Offline => Self::Offline,
            api::OperatingStatus::Degraded => Self::Degraded,
            api::OperatingStatus::Error => Self::Error,
            api::OperatingStatus::NoMonitor => Self::NoMonitor,
        }
    }
}

impl TryFrom<OperatingStatus> for api::OperatingStatus {
    type Error = UnknownStatus;
    fn try_from(status: OperatingStatus) -> Result<Self, UnknownStatus> {
        Ok(match status {
            OperatingStatus::Online => Self::Online,
            OperatingStatus::Draining => Self::Draining,
            OperatingStatus::Offline => Self::Offline,
            OperatingStatus::Degraded => Self::Degraded,
            OperatingStatus::Error => Self::Error,
            OperatingStatus::NoMonitor => Self::NoMonitor,
            OperatingStatus::Unknown => return Err(UnknownStatus),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spelled<T: serde::Serialize>(value: T) -> String {
        serde_json::to_value(value)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    #[test]
    fn every_api_provisioning_status_converts_both_ways_with_octavias_spelling() {
        use api::ProvisioningStatus::*;
        for status in [
            Active,
            PendingCreate,
            PendingUpdate,
            PendingDelete,
            Deleted,
            Error,
        ] {
            let cloud = ProvisioningStatus::from(status);
            assert_eq!(spelled(status), cloud.as_str());
            assert_eq!(api::ProvisioningStatus::try_from(cloud), Ok(status));
        }
        assert_eq!(
            api::ProvisioningStatus::try_from(ProvisioningStatus::Unknown),
            Err(UnknownStatus)
        );
    }

    #[test]
    fn every_api_operating_status_converts_both_ways_with_octavias_spelling() {
        use api::OperatingStatus::*;
        for status in [Online, Draining, Offline, Degraded, Error, NoMonitor] {
            let cloud = OperatingStatus::from(status);
            assert_eq!(spelled(status), cloud.as_str());
            assert_eq!(api::OperatingStatus::try_from(cloud), Ok(status));
        }
        assert_eq!(
            api::OperatingStatus::try_from(OperatingStatus::Unknown),
            Err(UnknownStatus)
        );
    }
}
