//! OpenStack clients for the objects' `identityRef` Secrets, cached by what identifies the
//! credentials: the Secret's uid and resourceVersion, the cloud's name and the region. A
//! changed Secret is a new key, so it gets a new client and the old one is dropped. Nothing
//! here ever logs or returns a Secret's contents: errors name the Secret and the key only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::error::{Categorized, ErrorCategory};
use crate::cloud::{CloudClient, CloudCredentials, CloudError, Clouds};

/// The Secret key holding clouds.yaml, as CAPO reads it.
pub const CLOUDS_YAML_KEY: &str = "clouds.yaml";
/// The optional Secret key holding a PEM CA bundle.
pub const CACERT_KEY: &str = "cacert";

/// What identifies one set of credentials.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CredentialsKey {
    /// The Secret's `namespace/name`, for messages.
    pub secret: String,
    /// The Secret's uid: a Secret deleted and created again is new credentials.
    pub uid: String,
    /// The Secret's resourceVersion: any change to it is new credentials.
    pub resource_version: String,
    /// The entry of clouds.yaml to use (the `identityRef`'s `cloudName`).
    pub cloud_name: String,
    /// The region to use (the `identityRef`'s `region`), if one is set.
    pub region: Option<String>,
}

/// Why no OpenStack client could be made from a credentials Secret; messages name the
/// Secret and its keys, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The credentials Secret does not exist.
    #[error("Secret {secret} not found: create it with a {CLOUDS_YAML_KEY:?} key")]
    SecretMissing {
        /// The Secret's `namespace/name`.
        secret: String,
    },
    /// The Secret has no data under a key we need.
    #[error("Secret {secret} has no {key:?} key")]
    KeyMissing {
        /// The Secret's `namespace/name`.
        secret: String,
        /// The missing data key (`clouds.yaml`).
        key: &'static str,
    },
    /// A value in the Secret's data is not UTF-8.
    #[error("Secret {secret}: {key:?} is not UTF-8 text")]
    NotText {
        /// The Secret's `namespace/name`.
        secret: String,
        /// The data key whose value is not text (`clouds.yaml` or `cacert`).
        key: &'static str,
    },
    /// The credentials were read, but making a client from them failed (a bad clouds.yaml,
    /// an unknown cloud name, or Keystone refusing or unreachable).
    #[error("Secret {secret}: {source}")]
    Cloud {
        /// The Secret's `namespace/name`.
        secret: String,
        /// Why the client could not be made.
        #[source]
        source: CloudError,
    },
}

impl Categorized for CredentialsError {
    fn category(&self) -> ErrorCategory {
        match self {
            // Keystone down or slow is not the Secret's fault.
            CredentialsError::Cloud { source, .. } => match source.category() {
                category @ (ErrorCategory::Transient | ErrorCategory::RateLimited { .. }) => {
                    category
                }
                _ => ErrorCategory::Credentials,
            },
            _ => ErrorCategory::Credentials,
        }
    }
}

/// The credentials a Secret's data holds for `key`'s cloud and region.
pub fn credentials_from_secret(
    key: &CredentialsKey,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<CloudCredentials, CredentialsError> {
    let text = |name: &'static str| -> Result<Option<String>, CredentialsError> {
        data.get(name)
            .map(|bytes| {
                String::from_utf8(bytes.clone()).map_err(|_| CredentialsError::NotText {
                    secret: key.secret.clone(),
                    key: name,
                })
            })
            .transpose()
    };
    let clouds_yaml = text(CLOUDS_YAML_KEY)?.ok_or_else(|| CredentialsError::KeyMissing {
        secret: key.secret.clone(),
        key: CLOUDS_YAML_KEY,
    })?;
    Ok(CloudCredentials {
        clouds_yaml,
        // CAPO's template writes an empty line here when the cloud has no CA file, and CAPO
        // then trusts the host's roots: a blank `cacert` is no CA bundle.
        cacert: text(CACERT_KEY)?.filter(|pem| !pem.trim().is_empty()),
        cloud_name: key.cloud_name.clone(),
        region: key.region.clone(),
    })
}

/// One client per credentials key. A client unused for the cloud options'
/// `session_idle_ttl` (an hour by default) is dropped, with its session, when
/// another is made: a Secret seen once is not held for the life of the process.
pub struct ClientCache {
    clouds: Arc<Clouds>,
    clients: Mutex<HashMap<CredentialsKey, Cached>>,
    /// The version (uid, resourceVersion) of each credentials Secret (`namespace/name`) last
    /// read, while the Secret watch has shown no other: a reconcile that finds its Secret
    /// here needs no GET.
    versions: Mutex<HashMap<String, (String, String)>>,
    /// Secrets (`namespace/name`) whose new client skips TLS verification (`verify: false`),
    /// until the reconcile that made it has said so ([`ClientCache::take_insecure`]).
    insecure: Mutex<std::collections::HashSet<String>>,
}

impl ClientCache {
    /// An empty cache; clients are made with `clouds` on first use.
    pub fn new(clouds: Arc<Clouds>) -> Self {
        ClientCache {
            clouds,
            clients: Mutex::new(HashMap::new()),
            versions: Mutex::new(HashMap::new()),
            insecure: Mutex::default(),
        }
    }

    /// The Secret's version as last read, if the watch has shown no change since.
    pub fn known_version(&self, secret: &str) -> Option<(String, String)> {
        lock(&self.versions).get(secret).cloned()
    }

    /// The Secret was read at this version.
    pub fn read_version(&self, secret: &str, uid: String, resource_version: String) {
        lock(&self.versions).insert(secret.to_owned(), (uid, resource_version));
    }

    /// The Secret watch saw `secret` at this version (`None`: deleted): a version other than
    /// the one read means the next use reads it again.
    pub fn secret_seen(&self, secret: &str, version: Option<(&str, &str)>) {
        let mut versions = lock(&self.versions);
        let stale = match (versions.get(secret), version) {
            (Some((uid, rv)), Some((seen_uid, seen_rv))) => uid != seen_uid || rv != seen_rv,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if stale {
            versions.remove(secret);
        }
    }

    /// The client already made for `key`, if any.
    pub fn existing(&self, key: &CredentialsKey) -> Option<CloudClient> {
        self.lock().get_mut(key).map(Cached::used)
    }

    /// The client for `key`, connecting (and authenticating) on first use. `data` is the
    /// Secret's data, read only when the key is new.
    pub async fn client(
        &self,
        key: &CredentialsKey,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<CloudClient, CredentialsError> {
        if let Some(client) = self.lock().get_mut(key).map(Cached::used) {
            return Ok(client);
        }
        let credentials = credentials_from_secret(key, data)?;
        let insecure = credentials
            .resolve()
            .is_ok_and(|cloud| cloud.config.verify == Some(false));
        let client =
            self.clouds
                .connect(&credentials)
                .await
                .map_err(|source| CredentialsError::Cloud {
                    secret: key.secret.clone(),
                    source,
                })?;
        let mut clients = self.lock();
        // An older version of the same Secret, cloud and region is superseded; a client left
        // unused for the idle time goes.
        let idle = self.clouds.options().session_idle_ttl;
        clients.retain(|known, cached| {
            let superseded = known.uid == key.uid
                && known.cloud_name == key.cloud_name
                && known.region == key.region;
            !superseded && cached.last_used.elapsed() < idle
        });
        clients.insert(key.clone(), Cached::new(client.clone()));
        drop(clients);
        if insecure {
            tracing::warn!(
                secret = key.secret,
                cloud = key.cloud_name,
                "clouds.yaml says verify: false: the cloud's TLS certificate is not checked"
            );
            lock(&self.insecure).insert(key.secret.clone());
        }
        Ok(client)
    }

    /// Whether a client just made from `secret` skips TLS verification and nobody has said so
    /// yet: true once per such client.
    pub fn take_insecure(&self, secret: &str) -> bool {
        lock(&self.insecure).remove(secret)
    }

    /// A client already made for the Secret `secret` (`namespace/name`), cloud and region,
    /// whatever the Secret's version: what cleanup falls back to once the Secret is gone.
    pub fn cached(
        &self,
        secret: &str,
        cloud_name: &str,
        region: Option<&str>,
    ) -> Option<CloudClient> {
        self.lock()
            .iter()
            .find(|(key, _)| {
                key.secret == secret
                    && key.cloud_name == cloud_name
                    && key.region.as_deref() == region
            })
            .map(|(_, cached)| cached.client.clone())
    }

    /// Clients cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no client is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CredentialsKey, Cached>> {
        lock(&self.clients)
    }
}

/// A client and when it was last handed out.
struct Cached {
    client: CloudClient,
    last_used: tokio::time::Instant,
}

impl Cached {
    fn new(client: CloudClient) -> Self {
        Cached {
            client,
            last_used: tokio::time::Instant::now(),
        }
    }

    fn used(&mut self) -> CloudClient {
        self.last_used = tokio::time::Instant::now();
        self.client.clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CredentialsKey {
        CredentialsKey {
            secret: "ns/creds".into(),
            uid: "u1".into(),
            resource_version: "1".into(),
            cloud_name: "openstack".into(),
            region: None,
        }
    }

    #[test]
    fn the_secret_keys_capo_uses_become_credentials() {
        let data = BTreeMap::from([
            (CLOUDS_YAML_KEY.to_owned(), b"clouds: {}".to_vec()),
            (CACERT_KEY.to_owned(), b"PEM".to_vec()),
        ]);
        let credentials = credentials_from_secret(&key(), &data).unwrap();
        assert_eq!(credentials.clouds_yaml, "clouds: {}");
        assert_eq!(credentials.cacert.as_deref(), Some("PEM"));
        assert_eq!(credentials.cloud_name, "openstack");
    }

    #[test]
    fn a_blank_cacert_as_capos_template_writes_it_is_no_ca_bundle() {
        for blank in ["\n", "", "  \n"] {
            let data = BTreeMap::from([
                (CLOUDS_YAML_KEY.to_owned(), b"clouds: {}".to_vec()),
                (CACERT_KEY.to_owned(), blank.as_bytes().to_vec()),
            ]);
            let credentials = credentials_from_secret(&key(), &data).unwrap();
            assert_eq!(credentials.cacert, None, "{blank:?}");
        }
    }

    #[test]
    fn a_secret_without_clouds_yaml_or_with_binary_is_a_credentials_error_naming_no_content() {
        let missing = credentials_from_secret(&key(), &BTreeMap::new()).unwrap_err();
        assert_eq!(missing.category(), ErrorCategory::Credentials);
        assert_eq!(
            missing.to_string(),
            "Secret ns/creds has no \"clouds.yaml\" key"
        );
        let secret_bytes = vec![0xff, 0xfe, b's', b'3', b'c', b'r'];
        let data = BTreeMap::from([(CLOUDS_YAML_KEY.to_owned(), secret_bytes)]);
        let binary = credentials_from_secret(&key(), &data).unwrap_err();
        assert_eq!(binary.category(), ErrorCategory::Credentials);
        assert!(!binary.to_string().contains("s3cr"), "{binary}");
    }
}
