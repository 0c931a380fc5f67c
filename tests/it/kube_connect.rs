//! Connecting to the API server with a kubeconfig that cannot work: capo-rs says why, in the
//! words of the certificate or socket at fault, rather than `client error (Connect)`.
//!
//! The server is a TLS listener on 127.0.0.1 that answers `/version` as kube-apiserver does;
//! its certificate is what each case needs. Where the real tier's kubectl is at hand, it is
//! held to the same kubeconfigs, so what kubectl accepts and capo-rs refuses is shown, not
//! assumed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use capo_provider::manager::{self, KubeClientOptions};
use capo_sim::certs::{Flaw, WebhookCerts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::packaging::Replica;

const VERSION: &str = r#"{"major":"1","minor":"35","gitVersion":"v1.35.4","gitCommit":"x","gitTreeState":"clean","buildDate":"2026-01-01T00:00:00Z","goVersion":"go1.26","compiler":"gc","platform":"linux/amd64"}"#;

/// A TLS server on 127.0.0.1 with `certs`, answering every request with [`VERSION`].
struct FakeApiServer {
    port: u16,
    stop: CancellationToken,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(certs: &WebhookCerts) -> FakeApiServer {
    let tls = certs.server_config().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let cancelled = stop.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                () = cancelled.cancelled() => return,
                accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => return },
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                answer_version(&mut stream).await;
            });
        }
    });
    FakeApiServer { port, stop }
}

/// Reads one request's head and answers it with the version, closing the connection.
async fn answer_version(stream: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin)) {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{VERSION}",
        VERSION.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A kubeconfig for `https://<host>:<port>` trusting `certs`' CA.
fn kubeconfig(dir: &Path, name: &str, host: &str, port: u16, certs: &WebhookCerts) -> PathBuf {
    let ca = certs.ca_bundle();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{host}:{port}\n    certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: not-a-secret\n"
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// What capo-rs's client says when it asks the server for its version.
async fn capo_rs_says(kubeconfig: &Path) -> Result<String, String> {
    let client = manager::connect(Some(kubeconfig), &KubeClientOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let asked = tokio::time::timeout(Duration::from_secs(30), client.apiserver_version())
        .await
        .map_err(|_| "no answer in 30 s".to_owned())?;
    asked
        .map(|info| info.git_version)
        .map_err(|e| e.to_string())
}

/// Whether the real tier's kubectl reads `/version` with `kubeconfig` (else what it said);
/// `None` without it. Asynchronous: the server answering it runs on this test's runtime.
async fn kubectl_reads(kubeconfig: &Path) -> Option<Result<(), String>> {
    let bin = std::env::var_os("CAPO_REAL_KUBE_BIN")?;
    let kubectl = Path::new(&bin).join("kubectl");
    if !kubectl.exists() {
        return None;
    }
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "--raw", "/version", "--request-timeout=10s"])
        .output()
        .await
        .ok()?;
    Some(if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    })
}

fn names(hosts: &[&str]) -> Vec<String> {
    hosts.iter().map(|h| (*h).to_owned()).collect()
}

#[tokio::test]
async fn a_sound_certificate_connects_and_each_flaw_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // The control: a server certificate signed by the CA the kubeconfig trusts.
    let sound = WebhookCerts::issue(&names(&["127.0.0.1"])).unwrap();
    let server = serve(&sound).await;
    let good = kubeconfig(dir.path(), "good", "127.0.0.1", server.port, &sound);
    assert_eq!(capo_rs_says(&good).await, Ok("v1.35.4".to_owned()));
    if let Some(read) = kubectl_reads(&good).await {
        assert_eq!(
            read,
            Ok(()),
            "kubectl reads /version with the sound kubeconfig"
        );
    }
    // A certificate for another host name, served at 127.0.0.1.
    let elsewhere = WebhookCerts::issue(&names(&["api.elsewhere.example"])).unwrap();
    let other = serve(&elsewhere).await;
    let wrong_name = kubeconfig(dir.path(), "name", "127.0.0.1", other.port, &elsewhere);
    let said = capo_rs_says(&wrong_name).await.unwrap_err();
    assert!(
        said.contains("is for api.elsewhere.example but not for 127.0.0.1"),
        "{said}"
    );
    assert!(said.contains("tls-server-name"), "{said}");
    if let Some(read) = kubectl_reads(&wrong_name).await {
        assert!(read.is_err(), "kubectl refuses the wrong name too");
    }

    let cases: [(Flaw, &[&str]); 4] = [
        (
            Flaw::Expired,
            &["the server's certificate expired at 2021-01-01T00:00:00+00:00"],
        ),
        (
            Flaw::UntrustedCa,
            &["not signed by a CA the kubeconfig trusts"],
        ),
        (Flaw::ReplacedCa, &["replaced under the same name"]),
        (Flaw::SelfSignedCa, &["CA:TRUE", "kubectl accepts that"]),
    ];
    for (flaw, words) in cases {
        let certs = WebhookCerts::flawed(&names(&["127.0.0.1"]), flaw).unwrap();
        let server = serve(&certs).await;
        let file = kubeconfig(
            dir.path(),
            &format!("{flaw:?}"),
            "127.0.0.1",
            server.port,
            &certs,
        );
        let said = capo_rs_says(&file).await.unwrap_err();
        assert!(
            said.contains(&format!(
                "cannot reach the Kubernetes API server at https://127.0.0.1:{}",
                server.port
            )),
            "{flaw:?}: {said}"
        );
        for word in words {
            assert!(said.contains(word), "{flaw:?}: {said}");
        }
        // kubectl takes a self-signed CA as the server's certificate; the rest it refuses.
        if let Some(read) = kubectl_reads(&file).await {
            assert_eq!(
                read.is_ok(),
                flaw == Flaw::SelfSignedCa,
                "kubectl with {flaw:?}: {read:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_refused_connection_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let sound = WebhookCerts::issue(&names(&["127.0.0.1"])).unwrap();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let file = kubeconfig(dir.path(), "refused", "127.0.0.1", port, &sound);
    let said = capo_rs_says(&file).await.unwrap_err();
    assert!(
        said.contains("connection refused: nothing listens there"),
        "{said}"
    );
}

/// What a user saw: `capo-rs run` logged `client error (Connect)` every 10 s. Now the
/// process says why, and with `--crd-wait 0` exits with it.
#[tokio::test]
async fn run_with_a_ca_certificate_as_the_servers_says_so_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let certs = WebhookCerts::flawed(&names(&["127.0.0.1"]), Flaw::SelfSignedCa).unwrap();
    let server = serve(&certs).await;
    let file = kubeconfig(dir.path(), "ca", "127.0.0.1", server.port, &certs);
    let mut replica = Replica::spawn(&file, "ca-as-server", &["--crd-wait", "0"]);
    assert_eq!(replica.exit_code(Duration::from_secs(60)).await, Some(1));
    let log = replica.log_text();
    let error = log
        .lines()
        .find(|line| line.contains("Error: "))
        .unwrap_or_else(|| panic!("no error line: {log}"));
    assert!(error.contains("CA:TRUE"), "{error}");
    // kube's own line without the cause is gone.
    assert!(!log.contains("failed with error"), "{log}");
}
