//! Why the API server could not be reached, said so that a person can act on it.
//!
//! kube's client reports a failed connection as `client error (Connect)`: the reason (a
//! refused port, a certificate rustls will not take) is deep in the error's sources, and
//! part of it inside an `io::Error`, whose `source()` skips what it wraps. A layer on the
//! client walks that chain once per failed request and puts the reason in the message.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::CertificateError;
use tower::BoxError;

/// A request that never reached the API server, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the Kubernetes API server at {server}: {cause}")]
pub struct Unreachable {
    /// The server's URL, as the kubeconfig gives it.
    pub server: String,
    /// Why, in words.
    pub cause: Cause,
    #[source]
    source: BoxError,
}

/// Why a connection to the API server failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The server presents a CA certificate as its own.
    CaAsServerCertificate,
    /// The server's certificate expired (at this Unix time, when known).
    Expired(Option<u64>),
    /// The server's certificate is not valid yet (until this Unix time, when known).
    NotYetValid(Option<u64>),
    /// No CA the client trusts signed the server's certificate.
    UnknownIssuer,
    /// A trusted CA has the issuer's name, but its key did not sign the certificate.
    WrongIssuerKey,
    /// The certificate does not name the host the client asked for.
    WrongName {
        /// The name the client asked for.
        expected: String,
        /// The names the certificate holds.
        presented: Vec<String>,
    },
    /// Another reason rustls refused the certificate.
    Certificate(String),
    /// The TLS handshake failed for a reason other than the certificate.
    Tls(String),
    /// Nothing listens at the address.
    Refused,
    /// The connection timed out.
    TimedOut,
    /// Something else: the error's whole chain.
    Other(String),
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::CaAsServerCertificate => f.write_str(
                "the server presents a CA certificate (basicConstraints CA:TRUE) as its own \
                 serving certificate. kubectl accepts that; capo-rs (rustls) refuses it. Give \
                 the API server a certificate signed by that CA with CA:FALSE, and keep the CA \
                 in the kubeconfig's certificate-authority-data",
            ),
            Cause::Expired(at) => write!(
                f,
                "the server's certificate expired{}: renew it",
                at.map(|at| format!(" at {}", utc(at))).unwrap_or_default()
            ),
            Cause::NotYetValid(from) => write!(
                f,
                "the server's certificate is not valid yet{}: check this machine's clock",
                from.map(|from| format!(" (from {})", utc(from)))
                    .unwrap_or_default()
            ),
            Cause::UnknownIssuer => f.write_str(
                "the server's certificate is not signed by a CA the kubeconfig trusts \
                 (certificate-authority-data): is the kubeconfig for this cluster, or was its \
                 CA replaced?",
            ),
            Cause::WrongIssuerKey => f.write_str(
                "the server's certificate names a CA the kubeconfig trusts as its issuer, but \
                 that CA's key did not sign it: was the cluster's CA replaced under the same \
                 name? Take the kubeconfig's certificate-authority-data from the cluster again",
            ),
            Cause::WrongName {
                expected,
                presented,
            } if presented.is_empty() => write!(
                f,
                "the server's certificate is not for {expected}: connect by a name the \
                 certificate holds, or set tls-server-name in the kubeconfig"
            ),
            Cause::WrongName {
                expected,
                presented,
            } => write!(
                f,
                "the server's certificate is for {} but not for {expected}: connect by a name \
                 the certificate holds, or set tls-server-name in the kubeconfig",
                presented.join(", ")
            ),
            Cause::Certificate(why) => write!(f, "the server's certificate is refused: {why}"),
            Cause::Tls(why) => write!(f, "the TLS handshake failed: {why}"),
            Cause::Refused => f.write_str(
                "connection refused: nothing listens there. Is the API server running, and are \
                 the kubeconfig's address and port right?",
            ),
            Cause::TimedOut => f.write_str(
                "the connection timed out: check the address, and any firewall or proxy between",
            ),
            Cause::Other(chain) => f.write_str(chain),
        }
    }
}

fn utc(unix_seconds: u64) -> String {
    i64::try_from(unix_seconds)
        .ok()
        .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
        .map_or_else(|| format!("{unix_seconds} s"), |at| at.to_rfc3339())
}

/// Why `error` kept a request from the server, when it failed to connect: `None` for
/// anything else (the server's own answers, an authentication plugin's error, a connection
/// lost mid-request, which may have reached the server).
pub fn explain(error: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    chain(error)
        .find_map(|e| e.downcast_ref::<hyper_util::client::legacy::Error>())
        .filter(|transport| transport.is_connect())?;
    Some(cause_in(error).unwrap_or_else(|| Cause::Other(whole_chain(error))))
}

/// The first reason in the chain that has a name.
fn cause_in(error: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    chain(error).flat_map(within_io).find_map(|e| {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(of_tls(tls));
        }
        match e.downcast_ref::<std::io::Error>()?.kind() {
            std::io::ErrorKind::ConnectionRefused => Some(Cause::Refused),
            std::io::ErrorKind::TimedOut => Some(Cause::TimedOut),
            _ => None,
        }
    })
}

/// `error`, and what it wraps when it is an `io::Error` (hyper-rustls wraps tokio-rustls's
/// `io::Error`, which wraps the `rustls::Error`): `io::Error::source` skips the error it
/// wraps, so the chain alone never reaches the certificate's reason.
fn within_io<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| {
        e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .map(|inner| inner as &(dyn std::error::Error + 'static))
    })
}

fn of_tls(error: &rustls::Error) -> Cause {
    let rustls::Error::InvalidCertificate(certificate) = error else {
        return Cause::Tls(error.to_string());
    };
    match certificate {
        CertificateError::Expired => Cause::Expired(None),
        CertificateError::ExpiredContext { not_after, .. } => {
            Cause::Expired(Some(not_after.as_secs()))
        }
        CertificateError::NotValidYet => Cause::NotYetValid(None),
        CertificateError::NotValidYetContext { not_before, .. } => {
            Cause::NotYetValid(Some(not_before.as_secs()))
        }
        CertificateError::UnknownIssuer => Cause::UnknownIssuer,
        CertificateError::BadSignature => Cause::WrongIssuerKey,
        CertificateError::NotValidForName => Cause::WrongName {
            expected: "the host asked for".to_owned(),
            presented: Vec::new(),
        },
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => Cause::WrongName {
            expected: server_name(expected),
            presented: presented.iter().map(|name| bare_name(name)).collect(),
        },
        CertificateError::Other(other)
            if matches!(
                other.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::CaUsedAsEndEntity)
            ) =>
        {
            Cause::CaAsServerCertificate
        }
        other => Cause::Certificate(other.to_string()),
    }
}

fn server_name(name: &rustls_pki_types::ServerName<'_>) -> String {
    match name {
        rustls_pki_types::ServerName::DnsName(dns) => dns.as_ref().to_owned(),
        rustls_pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

/// `example.com` of webpki's `DnsName("example.com")` (and `IpAddress(..)`), as presented
/// names come from rustls.
fn bare_name(presented: &str) -> String {
    presented
        .split_once('(')
        .and_then(|(_, inner)| inner.strip_suffix(')'))
        .map_or(presented, |inner| inner.trim_matches('"'))
        .to_owned()
}

fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| e.source())
}

/// Every message in the chain, outermost first, each once.
fn whole_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in chain(error).flat_map(within_io) {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// The tower layer that turns a transport failure into an [`Unreachable`].
#[derive(Clone)]
pub struct ExplainLayer {
    server: Arc<str>,
}

impl ExplainLayer {
    /// For a client of the API server at `server`.
    pub fn new(server: &str) -> Self {
        ExplainLayer {
            server: Arc::from(server),
        }
    }
}

impl<S> tower::Layer<S> for ExplainLayer {
    type Service = Explained<S>;

    fn layer(&self, inner: S) -> Explained<S> {
        Explained {
            inner,
            server: self.server.clone(),
        }
    }
}

/// A service whose transport failures say why.
pub struct Explained<S> {
    inner: S,
    server: Arc<str>,
}

impl<S, R> tower::Service<R> for Explained<S>
where
    S: tower::Service<R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let server = self.server.clone();
        self.inner
            .poll_ready(cx)
            .map_err(|error| explained(&server, error.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let server = self.server.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            answer
                .await
                .map_err(|error| explained(&server, error.into()))
        })
    }
}

fn explained(server: &str, error: BoxError) -> BoxError {
    match explain(error.as_ref()) {
        Some(cause) => Box::new(Unreachable {
            server: server.to_owned(),
            cause,
            source: error,
        }),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::OtherError;

    /// As hyper-rustls reports a refused certificate: an `io::Error` in an `io::Error`.
    fn handshake_failure(tls: rustls::Error) -> BoxError {
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        Box::new(std::io::Error::other(inner))
    }

    fn why(error: &(dyn std::error::Error + 'static)) -> Option<Cause> {
        cause_in(error)
    }

    #[test]
    fn a_ca_certificate_as_the_servers_is_named() {
        let error = handshake_failure(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(webpki::Error::CaUsedAsEndEntity)),
        )));
        let cause = why(error.as_ref());
        assert_eq!(cause, Some(Cause::CaAsServerCertificate));
        let said = cause.map(|c| c.to_string()).unwrap_or_default();
        assert!(
            said.contains("CA:TRUE") && said.contains("CA:FALSE"),
            "{said}"
        );
    }

    #[test]
    fn certificate_reasons_are_named_with_their_context() {
        let expired = handshake_failure(rustls::Error::InvalidCertificate(
            CertificateError::ExpiredContext {
                time: rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                    1_800_000_000,
                )),
                not_after: rustls_pki_types::UnixTime::since_unix_epoch(
                    std::time::Duration::from_secs(1_609_459_200),
                ),
            },
        ));
        let said = why(expired.as_ref()).map(|c| c.to_string());
        assert_eq!(
            said.as_deref(),
            Some("the server's certificate expired at 2021-01-01T00:00:00+00:00: renew it")
        );
        let unknown = handshake_failure(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        assert_eq!(why(unknown.as_ref()), Some(Cause::UnknownIssuer));
        let name = handshake_failure(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForNameContext {
                expected: rustls_pki_types::ServerName::try_from("127.0.0.1")
                    .map(|n| n.to_owned())
                    .unwrap_or_else(|e| panic!("{e}")),
                presented: vec!["DnsName(\"elsewhere.example\")".to_owned()],
            },
        ));
        let said = why(name.as_ref())
            .map(|c| c.to_string())
            .unwrap_or_default();
        assert!(
            said.contains("is for elsewhere.example but not for 127.0.0.1"),
            "{said}"
        );
    }

    #[test]
    fn a_refused_port_and_a_timeout_are_named() {
        let refused: BoxError =
            Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(why(refused.as_ref()), Some(Cause::Refused));
        let late: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(why(late.as_ref()), Some(Cause::TimedOut));
    }

    #[test]
    fn what_is_not_a_transport_failure_passes_unchanged() {
        let error: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        // No hyper client error in the chain: not ours to explain.
        assert_eq!(explain(error.as_ref()), None);
        let passed = explained("https://127.0.0.1:6443", error);
        assert!(passed.downcast_ref::<Unreachable>().is_none());
    }

    #[test]
    fn the_whole_chain_is_said_once_each() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("the reason"));
        assert_eq!(whole_chain(&error), "outer: the reason");
    }
}
