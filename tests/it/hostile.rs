//! Hostile peers at the webhook (issue 55): any pod that reaches its port can call it, so
//! nothing one sends may stall the process or exhaust its memory. Each scenario prints its
//! figures (`FIGURES`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capo_provider::manager::webhook::{MAX_CONNECTIONS_PER_PEER, MAX_CONVERSION_BODY};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::conversion::ServedWebhook;

/// A client that trusts the webhook's CA.
fn https(webhook: &ServedWebhook) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(webhook.certs.ca_pem.as_bytes()).expect("the CA"),
        )
        .timeout(Duration::from_secs(60))
        .build()
        .expect("a client")
}

/// `review` sent to the webhook's `/convert` over HTTPS, and its answer.
async fn convert_over_https(webhook: &ServedWebhook, review: Vec<u8>) -> Value {
    https(webhook)
        .post(webhook.url("/convert"))
        .header("content-type", "application/json")
        .body(review)
        .send()
        .await
        .expect("an answer")
        .json()
        .await
        .expect("JSON")
}

/// A TLS connector that trusts the webhook's CA.
fn connector(webhook: &ServedWebhook) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls_pki_types::pem::PemObject::from_pem_slice(webhook.certs.ca_pem.as_bytes())
        .expect("the CA");
    roots.add(ca).expect("a root");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all local).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// Raises this process's open-file limit to `wanted` (within the hard limit): the scenario
/// holds thousands of sockets, both ends of each.
fn raise_open_files(wanted: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current < wanted {
        limit.current = Some(limit.maximum.map_or(wanted, |most| most.min(wanted)));
        setrlimit(Resource::Nofile, limit).expect("the open-file limit raised");
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(now >= wanted, "open files limited to {now}");
}

/// A v1beta1 OpenStackMachine as a real API server sends it for a list: stored as v1beta2,
/// with its managed fields, owner, conditions, addresses and resolved resources.
fn stored_machine(i: usize) -> Value {
    let name = format!("cluster-a-md-0-{i:05}");
    let condition = |type_: &str| {
        json!({"type": type_, "status": "True", "reason": "Ready", "message": "",
               "lastTransitionTime": "2026-11-27T01:02:03Z", "observedGeneration": 2})
    };
    let managed = |manager: &str, operation: &str| {
        json!({"manager": manager, "operation": operation, "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
               "time": "2026-11-27T01:02:03Z", "fieldsType": "FieldsV1",
               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:cluster.x-k8s.io/cluster-name": {},
                 "f:cluster.x-k8s.io/deployment-name": {}}, "f:ownerReferences": {".": {}}},
                 "f:spec": {".": {}, "f:flavor": {}, "f:image": {}, "f:ports": {}, "f:sshKeyName": {},
                 "f:providerID": {}}, "f:status": {"f:addresses": {}, "f:conditions": {}, "f:resolved": {}}}})
    };
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
        "metadata": {
            "name": name, "namespace": "tenant-a", "uid": format!("6f1e2d3c-4b5a-4978-8a6b-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i), "generation": 2,
            "creationTimestamp": "2026-11-27T01:02:03Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "cluster-a", "cluster.x-k8s.io/deployment-name": "cluster-a-md-0",
                       "cluster.x-k8s.io/set-name": "cluster-a-md-0-7d9f8c6b5"},
            "annotations": {"cluster.x-k8s.io/cloned-from-name": "cluster-a-md-0",
                            "cluster.x-k8s.io/cloned-from-groupkind": "OpenStackMachineTemplate.infrastructure.cluster.x-k8s.io"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name,
                                 "uid": format!("0a1b2c3d-4e5f-4a6b-8c7d-{i:012}"), "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["openstackmachine.infrastructure.cluster.x-k8s.io"],
            "managedFields": [managed("manager", "Update"), managed("capo-rs", "Update"), managed("capo-rs", "Apply")],
        },
        "spec": {
            "providerID": format!("openstack:///9c8b7a6d-5e4f-4a3b-9c2d-{i:012}"),
            "flavor": "m1.medium", "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
            "sshKeyName": "cluster-a", "ports": [{"network": {"filter": {"name": "cluster-a-net"}}}],
            "securityGroups": [{"filter": {"name": "cluster-a-worker"}}], "tags": ["cluster-a", "md-0"],
        },
        "status": {
            "initialization": {"provisioned": true}, "instanceState": "ACTIVE",
            "addresses": [{"type": "InternalIP", "address": format!("10.6.{}.{}", i / 250, i % 250 + 2)},
                          {"type": "InternalDNS", "address": name}],
            "conditions": [condition("Ready"), condition("InstanceReady"), condition("APIServerLoadBalancerMemberReady")],
            "resolved": {"server": {"name": name, "imageID": "4d2f6a0e-9b1c-4e3d-8f7a-6b5c4d3e2f1a",
                                    "flavorID": "3", "ports": [{"networkID": "2a3b4c5d-6e7f-4081-9a2b-3c4d5e6f7a8b",
                                    "tags": ["cluster-a"], "trunk": false}], "tags": ["cluster-a", "md-0"]}},
            "resources": {"instanceID": format!("9c8b7a6d-5e4f-4a3b-9c2d-{i:012}")},
        },
    })
}

/// 5,000 OpenStackMachines listed in v1beta1 come to one ConversionReview: it fits the body
/// limit, converts whole over HTTPS, and its size and time are printed.
#[tokio::test]
async fn a_5000_object_conversion_list_fits_and_converts() {
    let webhook = ServedWebhook::start_for_real().await;
    let objects: Vec<Value> = (0..5000).map(stored_machine).collect();
    let review = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "list-5000", "desiredAPIVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                    "objects": objects}});
    let body = serde_json::to_vec(&review).expect("JSON");
    assert!(body.len() < MAX_CONVERSION_BODY, "{} bytes", body.len());
    let started = Instant::now();
    let answer = convert_over_https(&webhook, body.clone()).await;
    let took = started.elapsed();
    assert_eq!(
        answer["response"]["result"]["status"], "Success",
        "{}",
        answer["response"]["result"]
    );
    let converted = answer["response"]["convertedObjects"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(converted, 5000);
    assert_eq!(
        answer["response"]["convertedObjects"][4999]["apiVersion"],
        "infrastructure.cluster.x-k8s.io/v1beta1"
    );
    eprintln!(
        "FIGURES conversion of 5,000 OpenStackMachines: {:.1} MB request ({} bytes per object), limit {} MiB, answered in {took:?} over HTTPS",
        body.len() as f64 / 1e6,
        body.len() / 5000,
        MAX_CONVERSION_BODY >> 20
    );
}

/// A body past the route's limit is refused (413) by its Content-Length, before it is read.
#[tokio::test]
async fn a_body_past_the_limit_is_refused_before_it_is_read() {
    let webhook = ServedWebhook::start_for_real().await;
    let connector = connector(&webhook);
    let tcp = connect_from([127, 0, 0, 1], webhook.address)
        .await
        .expect("a connection");
    let mut tls = connector
        .connect(ServerName::try_from("127.0.0.1").expect("a name"), tcp)
        .await
        .expect("a handshake");
    let head = format!(
        "POST /convert HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        1u64 << 30
    );
    tls.write_all(head.as_bytes())
        .await
        .expect("the head is sent");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_buf(&mut tls, &mut answer),
    )
    .await;
    assert!(read.is_ok(), "answered without the 1 GiB body");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

/// 2,000 idle TLS connections from one address and a slowloris client from another: the
/// first address gets its share and no more, the slowloris is cut off, and a conversion from
/// a third (the API server) is answered within a second meanwhile, while a timer on the same
/// runtime (as the Lease renewal is) never runs late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_beside_2000_idle_connections_and_a_slowloris() {
    raise_open_files(8192);
    let webhook = ServedWebhook::start_for_real().await;
    let connector = connector(&webhook);
    let name = ServerName::try_from("127.0.0.1").expect("a name");

    let lateness = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let ticking = {
        let lateness = lateness.clone();
        tokio::spawn(async move {
            let mut expected = tokio::time::Instant::now();
            loop {
                expected += Duration::from_millis(50);
                tokio::time::sleep_until(expected).await;
                let late = tokio::time::Instant::now() - expected;
                let mut worst = lateness.lock().unwrap_or_else(|e| e.into_inner());
                *worst = (*worst).max(late);
            }
        })
    };

    let started = Instant::now();
    let mut handshakes = Vec::new();
    for _ in 0..2000 {
        let tcp = connect_from([127, 0, 0, 2], webhook.address)
            .await
            .expect("a connection");
        let (connector, name) = (connector.clone(), name.clone());
        handshakes.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await
        }));
    }
    let mut idle = Vec::new();
    for handshake in handshakes {
        if let Ok(Ok(Ok(stream))) = handshake.await {
            idle.push(stream);
        }
    }
    let opened = started.elapsed();

    let slowloris = {
        let (connector, name) = (connector.clone(), name.clone());
        let to = webhook.address;
        tokio::spawn(async move {
            let tcp = connect_from([127, 0, 0, 3], to)
                .await
                .expect("a connection");
            let mut tls = connector.connect(name, tcp).await.expect("a handshake");
            let began = Instant::now();
            let head = b"POST /convert HTTP/1.1\r\nhost: x\r\nx-slow: ";
            for byte in head.iter().chain(std::iter::repeat(&b'a')) {
                if tls.write_all(&[*byte]).await.is_err() || tls.flush().await.is_err() {
                    return began.elapsed();
                }
                if began.elapsed() > Duration::from_secs(60) {
                    return began.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            began.elapsed()
        })
    };

    let review = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                    "objects": [stored_machine(1)]}});
    let asked = Instant::now();
    let answer = convert_over_https(&webhook, review.to_string().into_bytes()).await;
    let answered_in = asked.elapsed();
    assert_eq!(answer["response"]["result"]["status"], "Success");
    assert!(
        answered_in < Duration::from_secs(1),
        "answered in {answered_in:?}"
    );
    assert!(
        idle.len() <= MAX_CONNECTIONS_PER_PEER,
        "{} idle connections from one address were served",
        idle.len()
    );

    let cut_off_after = slowloris.await.expect("the slowloris client");
    assert!(
        cut_off_after < Duration::from_secs(20),
        "a slowloris client was served for {cut_off_after:?}"
    );
    // An idle connection (no request ever sent) is closed by the server: read sees its end.
    let mut buffer = [0_u8; 64];
    let closed = match idle.first_mut() {
        Some(stream) => {
            let read = tokio::io::AsyncReadExt::read(stream, &mut buffer);
            tokio::time::timeout(Duration::from_secs(20), read).await
        }
        None => panic!("no idle connection was served at all"),
    };
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "an idle connection was kept open: {closed:?}"
    );
    ticking.abort();
    let worst = *lateness.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        worst < Duration::from_millis(500),
        "a timer ran {worst:?} late"
    );
    eprintln!(
        "FIGURES hostile webhook peers: 2,000 connections from one address in {opened:?}, {} served \
         (the rest closed at once); a conversion from another answered in {answered_in:?}; a \
         slowloris client cut off after {cut_off_after:?}; a 50 ms timer at most {worst:?} late",
        idle.len()
    );
    drop(idle);
}
