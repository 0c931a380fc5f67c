//! Certificates for the webhook server in tests and the demo, as cert-manager would issue
//! them: a CA, and a serving certificate it signs for the webhook Service's DNS names.

use std::path::Path;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::Value;

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

impl WebhookCerts {
    /// A new CA, and a certificate for `dns_names` signed by it.
    pub fn issue(dns_names: &[String]) -> Result<Self, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "capo-rs test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(dns_names.to_vec())?;
        params.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().cloned().unwrap_or_default(),
        );
        let cert = params.signed_by(&key, &issuer)?;
        Ok(WebhookCerts {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
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
