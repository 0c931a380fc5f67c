//! The flags that say how politely a command talks to OpenStack, shared by `capo-rs run` and
//! the development commands that call a cloud.

use std::num::NonZeroU32;
use std::time::Duration;

use capo_provider::cloud::{CloudOptions, PathOptions, RateLimit};

/// How politely we talk to OpenStack; shared by every command that does.
#[derive(Clone, Debug, clap::Args)]
pub struct OpenStackArgs {
    /// Requests per second to each OpenStack endpoint (auth URL, region and service).
    #[arg(long, default_value_t = NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN))]
    pub openstack_qps: NonZeroU32,
    /// Requests an endpoint may receive at once before the per-second rate applies.
    #[arg(long, default_value_t = NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN))]
    pub openstack_burst: NonZeroU32,
    /// Seconds to wait for one OpenStack answer.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub openstack_timeout: u64,
    /// A PEM CA bundle trusted for every cloud whose identity Secret has no `cacert` key (as
    /// CAPO's `--ca-certs`).
    #[arg(long)]
    pub ca_certs: Option<std::path::PathBuf>,
}

impl OpenStackArgs {
    /// The cloud options these flags describe; the CA bundle read and checked.
    pub fn options(&self) -> anyhow::Result<CloudOptions> {
        let defaults = CloudOptions::default();
        let default_cacert = match &self.ca_certs {
            None => None,
            Some(path) => Some(read_ca_bundle(path)?),
        };
        Ok(CloudOptions {
            default_cacert,
            rate_limit: RateLimit {
                qps: self.openstack_qps,
                burst: self.openstack_burst,
            },
            path: PathOptions {
                request_timeout: Duration::from_secs(self.openstack_timeout),
                ..defaults.path.clone()
            },
            ..defaults
        })
    }
}

/// A PEM CA bundle from `path`: refused at start-up, with the path, if unreadable or holding
/// no certificate, rather than failing every cloud call later.
fn read_ca_bundle(path: &std::path::Path) -> anyhow::Result<String> {
    let pem = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--ca-certs {}: {e}", path.display()))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        anyhow::bail!(
            "--ca-certs {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_bundle_without_a_certificate_is_refused_at_start_up_with_its_path() {
        let dir = tempfile::tempdir().expect("a directory");
        let garbage = dir.path().join("ca.pem");
        std::fs::write(&garbage, "not a certificate").expect("written");
        let error = read_ca_bundle(&garbage).expect_err("refused");
        assert!(error.to_string().contains("ca.pem"), "{error}");
        let missing = read_ca_bundle(&dir.path().join("missing.pem")).expect_err("refused");
        assert!(missing.to_string().contains("missing.pem"), "{missing}");
        let good = dir.path().join("good.pem");
        std::fs::write(
            &good,
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        )
        .expect("written");
        assert!(read_ca_bundle(&good).is_ok());
    }
}
