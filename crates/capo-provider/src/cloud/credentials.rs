//! Credentials as an `identityRef` Secret holds them: `clouds.yaml` text, an optional CA bundle,
//! the cloud's name and an optional region override. Parsed with `openstack_sdk`'s own config
//! types. Nothing here is ever logged: error messages name fields and positions, never values.

use std::fmt;

use openstack_sdk_core::config::{CloudConfig, ConfigFile, get_config_identity_hash};
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use super::CloudError;

/// The auth types we accept; others (websso, OIDC, TOTP, ...) need a human or a browser.
const AUTH_TYPES: &[&str] = &[
    "password",
    "v3password",
    "v3applicationcredential",
    "applicationcredential",
    "token",
    "v3token",
];

/// One cloud's credentials as the identity Secret holds them, with the cloud and region
/// `identityRef` names; `Debug` shows neither `clouds.yaml` nor the CA bundle.
#[derive(Clone)]
pub struct CloudCredentials {
    /// The Secret's `clouds.yaml` text, secrets included; never logged.
    pub clouds_yaml: String,
    /// PEM CA bundle, as the Secret's `cacert` key holds it.
    pub cacert: Option<String>,
    /// The entry of `clouds.yaml` to use (`identityRef.cloudName`).
    pub cloud_name: String,
    /// Overrides the cloud's `region_name` (`identityRef.region`).
    pub region: Option<String>,
}

impl fmt::Debug for CloudCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudCredentials")
            .field("cloud_name", &self.cloud_name)
            .field("region", &self.region)
            .field("clouds_yaml", &"<redacted>")
            .field("cacert", &self.cacert.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

/// A cloud entry ready for the SDK, with the facts we key caches and limiters by.
#[derive(Clone)]
pub struct ResolvedCloud {
    /// The `clouds.yaml` entry as the SDK takes it: region override and auth type applied,
    /// the identity endpoint named explicitly, the on-disk token cache off.
    pub config: CloudConfig,
    /// Keystone's URL (`auth.auth_url`); with the region, it keys the rate-limit gates.
    pub auth_url: String,
    /// The region (the override, else `region_name`); empty when neither names one.
    pub region: String,
    /// The auth type, `password` when `clouds.yaml` names none; always one we support.
    pub auth_type: String,
    /// Identifies the credential and its scope (a digest, never the secret itself): one session
    /// per identity, and the objects one identity lists are the objects every session of it
    /// sees.
    pub identity: String,
}

impl fmt::Debug for ResolvedCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedCloud")
            .field("auth_url", &self.auth_url)
            .field("region", &self.region)
            .field("auth_type", &self.auth_type)
            .finish_non_exhaustive()
    }
}

impl CloudCredentials {
    /// Parses and checks the clouds.yaml entry.
    pub fn resolve(&self) -> Result<ResolvedCloud, CloudError> {
        // A tenant writes this file: serde-saphyr (maintained, and bounded: a budget on
        // events, nesting and alias expansion) rather than the deprecated serde_yaml.
        let file: ConfigFile = serde_saphyr::from_str(&self.clouds_yaml).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" at line {} column {}", l.line(), l.column()))
                .unwrap_or_default();
            CloudError::Config(format!("clouds.yaml is not valid{at}"))
        })?;
        let mut config = file
            .get_cloud_config(&self.cloud_name)
            .map_err(|_| CloudError::Config(format!("cloud {:?} cannot be read", self.cloud_name)))?
            .ok_or_else(|| {
                let mut known = file.get_available_clouds();
                known.sort();
                CloudError::Config(format!(
                    "cloud {:?} is not in clouds.yaml (it has: {})",
                    self.cloud_name,
                    known.join(", ")
                ))
            })?;
        let auth_type = config
            .auth_type
            .clone()
            .unwrap_or_else(|| "password".to_owned());
        if !AUTH_TYPES.contains(&auth_type.as_str()) {
            return Err(CloudError::Config(format!(
                "auth_type {auth_type:?} is not supported (use one of: {})",
                AUTH_TYPES.join(", ")
            )));
        }
        config.auth_type = Some(auth_type.clone());
        let auth_url = config
            .auth
            .as_ref()
            .and_then(|auth| auth.auth_url.clone())
            .ok_or_else(|| CloudError::Config("auth.auth_url is missing".into()))?;
        url::Url::parse(&auth_url)
            .map_err(|e| CloudError::Config(format!("auth.auth_url is not a URL: {e}")))?;
        // The SDK registers auth_url as the *public* identity endpoint only, so a cloud with
        // `interface: internal` could not even authenticate. Naming it explicitly fixes that.
        config
            .options
            .entry("identity_endpoint_override".to_owned())
            .or_insert_with(|| config::Value::from(format!("{}/", auth_url.trim_end_matches('/'))));
        if let Some(region) = &self.region {
            config.region_name = Some(region.clone());
        }
        // Never read or write the SDK's on-disk token cache (~/.osc): tokens stay in memory.
        config.auth_cache = Some(false);
        let region = config.region_name.clone().unwrap_or_default();
        let identity = identity_of(&config, &auth_type, &region, self.cacert.as_deref());
        Ok(ResolvedCloud {
            config,
            auth_url,
            region,
            auth_type,
            identity,
        })
    }
}

/// The digest of everything that decides who a session acts as and what it sees: the user, the
/// scope (project or domain), the secret, the region, the interface and the trust settings.
/// The SDK's own identity hash leaves the scope and the secret out (it names a user for its
/// token cache), so on its own two clusters authenticating the same user into two projects
/// would share one session, and a rotated password would keep the old one.
fn identity_of(
    config: &CloudConfig,
    auth_type: &str,
    region: &str,
    cacert: Option<&str>,
) -> String {
    let mut digest = Sha256::new();
    let mut field = |name: &str, value: Option<&str>| {
        digest.update(name.as_bytes());
        digest.update([0]);
        if let Some(value) = value {
            digest.update(value.as_bytes());
        }
        digest.update([0xff]);
    };
    field("user", Some(&get_config_identity_hash(config)));
    if let Some(auth) = &config.auth {
        field("project_id", auth.project_id.as_deref());
        field("project_name", auth.project_name.as_deref());
        field("project_domain_id", auth.project_domain_id.as_deref());
        field("project_domain_name", auth.project_domain_name.as_deref());
        field("domain_id", auth.domain_id.as_deref());
        field("domain_name", auth.domain_name.as_deref());
        for (name, secret) in [
            ("password", &auth.password),
            ("token", &auth.token),
            (
                "application_credential_secret",
                &auth.application_credential_secret,
            ),
        ] {
            field(name, secret.as_ref().map(ExposeSecret::expose_secret));
        }
    }
    field("auth_type", Some(auth_type));
    field("region", Some(region));
    field(
        "interface",
        Some(config.interface.as_deref().unwrap_or("public")),
    );
    field(
        "verify",
        config.verify.map(|v| if v { "true" } else { "false" }),
    );
    field("cacert", cacert);
    digest.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOUDS: &str = r#"
clouds:
  openstack:
    auth:
      auth_url: https://keystone.example.com:5000/v3
      username: demo
      password: hunter2-secret
      project_name: demo
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: internal
    verify: false
  appcred:
    auth_type: v3applicationcredential
    auth:
      auth_url: https://keystone.example.com:5000/v3
      application_credential_id: abc
      application_credential_secret: s3cr3t-appcred
  sso:
    auth_type: v3websso
    auth:
      auth_url: https://keystone.example.com:5000/v3
"#;

    fn creds(cloud: &str, region: Option<&str>) -> CloudCredentials {
        CloudCredentials {
            clouds_yaml: CLOUDS.into(),
            cacert: None,
            cloud_name: cloud.into(),
            region: region.map(Into::into),
        }
    }

    #[test]
    fn password_cloud_resolves_with_its_region_and_interface() {
        let resolved = creds("openstack", None).resolve().unwrap();
        assert_eq!(resolved.auth_url, "https://keystone.example.com:5000/v3");
        assert_eq!(resolved.region, "RegionOne");
        assert_eq!(resolved.auth_type, "password");
        assert_eq!(resolved.config.interface.as_deref(), Some("internal"));
        assert_eq!(resolved.config.verify, Some(false));
        assert_eq!(resolved.config.auth_cache, Some(false));
        assert!(!resolved.identity.contains("hunter2"));
    }

    #[test]
    fn region_override_wins_and_changes_the_identity() {
        let base = creds("openstack", None).resolve().unwrap();
        let other = creds("openstack", Some("RegionTwo")).resolve().unwrap();
        assert_eq!(other.region, "RegionTwo");
        assert_ne!(base.identity, other.identity);
    }

    #[test]
    fn another_project_or_secret_is_another_identity_and_the_same_entry_the_same() {
        let other_project = CloudCredentials {
            clouds_yaml: CLOUDS.replace("project_name: demo", "project_name: other"),
            ..creds("openstack", None)
        };
        let rotated = CloudCredentials {
            clouds_yaml: CLOUDS.replace("hunter2-secret", "hunter3-secret"),
            ..creds("openstack", None)
        };
        let base = creds("openstack", None).resolve().unwrap().identity;
        assert_eq!(base, creds("openstack", None).resolve().unwrap().identity);
        assert_ne!(base, other_project.resolve().unwrap().identity);
        assert_ne!(base, rotated.resolve().unwrap().identity);
        let with_ca = CloudCredentials {
            cacert: Some("-----BEGIN CERTIFICATE-----".into()),
            ..creds("openstack", None)
        };
        assert_ne!(base, with_ca.resolve().unwrap().identity);
    }

    #[test]
    fn application_credentials_are_accepted() {
        let resolved = creds("appcred", None).resolve().unwrap();
        assert_eq!(resolved.auth_type, "v3applicationcredential");
    }

    #[test]
    fn bad_input_is_a_clear_config_error_without_secrets() {
        let missing = creds("nope", None).resolve().unwrap_err().to_string();
        assert!(
            missing.contains("\"nope\" is not in clouds.yaml"),
            "{missing}"
        );
        assert!(missing.contains("appcred, openstack, sso"), "{missing}");
        let sso = creds("sso", None).resolve().unwrap_err().to_string();
        assert!(sso.contains("v3websso"), "{sso}");
        let broken = CloudCredentials {
            clouds_yaml: "clouds: [password: hunter2-secret".into(),
            ..creds("openstack", None)
        };
        let message = broken.resolve().unwrap_err().to_string();
        assert!(message.contains("not valid at line"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!format!("{:?}", creds("openstack", None)).contains("hunter2"));
    }
}
