//! The webhook's serving certificate, read from a directory (`tls.crt`, `tls.key`: the
//! Secret cert-manager writes, mounted as a volume) and read again when it changes, so a
//! rotated certificate is served without a restart. The kubelet swaps a Secret volume's
//! files atomically; a half-written pair that does not parse is ignored until it does.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// The certificate chain's file in the directory.
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file in the directory.
pub const KEY_FILE: &str = "tls.key";

/// Why a certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file of the pair could not be read (missing, or not yet mounted).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file: `tls.crt` or `tls.key` in the directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate that parses.
    #[error("{path} holds no PEM certificate")]
    NoCertificate {
        /// The certificate file (`tls.crt` in the directory).
        path: PathBuf,
    },
    /// The private key does not parse as PEM, or does not match the certificate.
    #[error("{path}: {reason}")]
    Key {
        /// The key file (`tls.key` in the directory).
        path: PathBuf,
        /// What is wrong with the key, with the parser's or rustls' error.
        reason: String,
    },
}

/// What was loaded, and from which bytes (to see a change without parsing).
struct Loaded {
    source: Vec<u8>,
    key: Arc<CertifiedKey>,
}

/// Serves the most recently loaded certificate to every TLS client.
pub struct CertificateStore {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Option<Loaded>>,
}

impl std::fmt::Debug for CertificateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What [`CertificateStore::reload`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are what is served already.
    Unchanged,
    /// A new certificate is served; its leaf's SHA-256, shortened.
    Loaded {
        /// The first 8 bytes of the leaf certificate's SHA-256, as 16 lower-case hex digits.
        fingerprint: String,
    },
}

impl CertificateStore {
    /// A store for `dir`, empty until [`reload`](Self::reload) succeeds.
    pub fn new(dir: &Path, provider: Arc<CryptoProvider>) -> Self {
        CertificateStore {
            dir: dir.to_owned(),
            provider,
            current: RwLock::new(None),
        }
    }

    /// The directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the files; a pair that differs from the one served and parses replaces it.
    /// On an error the previous certificate stays served.
    pub fn reload(&self) -> Result<Reload, CertError> {
        let read = |name: &str| {
            let path = self.dir.join(name);
            std::fs::read(&path).map_err(|source| CertError::Read { path, source })
        };
        let (chain, key) = (read(CERT_FILE)?, read(KEY_FILE)?);
        let source = [chain.as_slice(), b"\0", key.as_slice()].concat();
        if self.read_current(|loaded| loaded.is_some_and(|l| l.source == source)) {
            return Ok(Reload::Unchanged);
        }
        let certified = self.parse(&chain, &key)?;
        let fingerprint = certified
            .cert
            .first()
            .map(|leaf| hex(&Sha256::digest(leaf.as_ref())[..8]))
            .unwrap_or_default();
        let loaded = Loaded {
            source,
            key: Arc::new(certified),
        };
        match self.current.write() {
            Ok(mut current) => *current = Some(loaded),
            Err(poisoned) => *poisoned.into_inner() = Some(loaded),
        }
        Ok(Reload::Loaded { fingerprint })
    }

    fn read_current<T>(&self, f: impl FnOnce(Option<&Loaded>) -> T) -> T {
        match self.current.read() {
            Ok(current) => f(current.as_ref()),
            Err(poisoned) => f(poisoned.into_inner().as_ref()),
        }
    }

    fn parse(&self, chain: &[u8], key: &[u8]) -> Result<CertifiedKey, CertError> {
        let cert_path = self.dir.join(CERT_FILE);
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
            .filter_map(Result::ok)
            .collect();
        if certs.is_empty() {
            return Err(CertError::NoCertificate { path: cert_path });
        }
        let key_path = self.dir.join(KEY_FILE);
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| CertError::Key {
            path: key_path.clone(),
            reason: format!("no PEM private key: {e}"),
        })?;
        CertifiedKey::from_der(certs, key, &self.provider).map_err(|e| CertError::Key {
            path: key_path,
            reason: format!("the key does not sign for the certificate: {e}"),
        })
    }
}

impl CertificateStore {
    /// [`reload`](Self::reload), logged for `server`: the outcome's label (`loaded`,
    /// `error`) when something happened, None when the files are what is served.
    pub fn reload_logged(&self, server: &'static str) -> Option<&'static str> {
        match self.reload() {
            Ok(Reload::Unchanged) => None,
            Ok(Reload::Loaded { fingerprint }) => {
                tracing::info!(%fingerprint, dir = %self.dir.display(), server, "certificate loaded");
                Some("loaded")
            }
            Err(error) => {
                tracing::warn!(%error, server, "certificate not loaded; serving the previous one, if any");
                Some("error")
            }
        }
    }

    /// [`reload_logged`](Self::reload_logged) every `every` until `shutdown`; `counted`
    /// hears each outcome's label.
    pub async fn keep_reloading(
        self: Arc<Self>,
        server: &'static str,
        every: Duration,
        shutdown: CancellationToken,
        counted: impl Fn(&'static str) + Send,
    ) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {
                    if let Some(label) = self.reload_logged(server) {
                        counted(label);
                    }
                }
            }
        }
    }
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.read_current(|loaded| loaded.map(|l| l.key.clone()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
