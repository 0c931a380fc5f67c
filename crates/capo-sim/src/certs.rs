//! Certificates for the webhook server in tests and the demo, as cert-manager would issue
//! them: a CA, and a serving certificate it signs for the webhook Service's DNS names.

use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

/// The common name of the CAs made here.
const CA_NAME: &str = "capo-rs test CA";

/// A CA and the serving certificate it signed.
#[derive(Clone, Debug)]
pub struct WebhookCerts {
    /// The CA certificate (PEM): what cert-manager's CA injector puts in the CRDs.
    pub ca_pem: String,
    /// The serving certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
}

/// A serving certificate that a careful client refuses, for the client's error paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Self-signed and its own CA (`CA:TRUE`), as `openssl req -x509` makes one: kubectl
    /// accepts it, rustls does not.
    SelfSignedCa,
    /// Signed by the CA, but it expired in 2021.
    Expired,
    /// Signed by a CA other than the one handed out as `ca_pem`, of another name.
    UntrustedCa,
    /// Signed by a CA of the same name as the one handed out, but another key: a CA replaced
    /// under its old name.
    ReplacedCa,
}

impl WebhookCerts {
    /// A new CA, and a certificate for `dns_names` signed by it.
    pub fn issue(dns_names: &[String]) -> Result<Self, rcgen::Error> {
        Self::signed(dns_names, CA_NAME, |_| {})
    }

    /// A certificate for `dns_names` with `flaw`, and the CA a client is given to trust.
    pub fn flawed(dns_names: &[String], flaw: Flaw) -> Result<Self, rcgen::Error> {
        match flaw {
            Flaw::SelfSignedCa => {
                let key = KeyPair::generate()?;
                let mut params = server_params(dns_names)?;
                params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
                let cert = params.self_signed(&key)?;
                Ok(WebhookCerts {
                    ca_pem: cert.pem(),
                    cert_pem: cert.pem(),
                    key_pem: key.serialize_pem(),
                })
            }
            Flaw::Expired => Self::signed(dns_names, CA_NAME, |params| {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }),
            Flaw::UntrustedCa | Flaw::ReplacedCa => {
                let name = if flaw == Flaw::UntrustedCa {
                    "another CA"
                } else {
                    CA_NAME
                };
                let trusted = Self::issue(dns_names)?;
                Ok(WebhookCerts {
                    ca_pem: trusted.ca_pem,
                    ..Self::signed(dns_names, name, |_| {})?
                })
            }
        }
    }

    /// A new CA, and a certificate for `dns_names` signed by it after `adjust`.
    fn signed(
        dns_names: &[String],
        ca_name: &str,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Result<Self, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, ca_name);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let mut params = server_params(dns_names)?;
        adjust(&mut params);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(WebhookCerts {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A TLS server configuration presenting the serving certificate (HTTP/1.1 by ALPN), for
    /// a test's own server.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, String> {
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("the key: {e}"))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("a server configuration: {e}"))?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tls)
    }

    /// Writes `tls.crt`, `tls.key` and `ca.crt` into `dir`, as a Secret volume holds them.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("tls.crt"), &self.cert_pem)?;
        std::fs::write(dir.join("tls.key"), &self.key_pem)?;
        std::fs::write(dir.join("ca.crt"), &self.ca_pem)
    }

    /// The CA as a CRD's `caBundle` holds it (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// What cert-manager's CA injector does to a CRD that converts through a webhook: sets
    /// `spec.conversion.webhook.clientConfig.caBundle`.
    pub fn inject_into(&self, crd: &mut Value) {
        if crd["spec"]["conversion"]["strategy"] == "Webhook" {
            crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] =
                Value::String(self.ca_bundle());
        }
    }
}

/// A server certificate's parameters for `dns_names` (IP addresses become IP SANs), its
/// common name the first of them.
fn server_params(dns_names: &[String]) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    Ok(params)
}
