//! `capo-rs bench webhook`: the conversion webhook's latency per conversion, as the API
//! server sees it (one object per ConversionReview, over HTTPS with a kept-alive
//! connection), and the conversion alone (in process, no I/O). Both directions of a
//! control-plane OpenStackMachine and of an OpenStackCluster made from CAPO's default
//! template. And the validating webhook's latency per AdmissionReview: an OpenStackMachine
//! update sent as v1beta2 (the rules CEL cannot state) and as v1beta1 (those plus the stored
//! version's CEL rules, evaluated on the converted objects).

use std::time::{Duration, Instant};

use capo_provider::manager::webhook::{self, WebhookConfig, WebhookMetrics};
use capo_sim::certs::WebhookCerts;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Latency percentiles of one measurement, in microseconds.
#[derive(Debug, Serialize)]
pub struct Latency {
    pub what: String,
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

fn latency(what: &str, mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Latency {
        what: what.to_owned(),
        samples: samples.len(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        max_us: at(1.0),
    }
}

fn cluster() -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackCluster",
        "metadata": {"name": "bench", "namespace": "default", "uid": "8e2d5c33-1b7a-4c5e-9d51-7b0f0e2f9a10", "generation": 2},
        "spec": {
            "identityRef": {"name": "bench-cloud-config", "cloudName": "openstack"},
            "apiServerLoadBalancer": {"enabled": true},
            "externalNetwork": {"id": "8a2c1c2a-6d7e-4a1f-9f3e-0c1e6a1e0a11"},
            "managedSubnets": [{"cidr": "10.6.0.0/24", "dnsNameservers": ["8.8.8.8"]}],
            "managedSecurityGroups": {"allNodesSecurityGroupRules": [
                {"name": "BGP (calico)", "direction": "ingress", "etherType": "IPv4", "portRangeMin": 179, "portRangeMax": 179, "protocol": "tcp", "remoteManagedGroups": ["controlplane", "worker"]},
                {"name": "IP-in-IP (calico)", "direction": "ingress", "etherType": "IPv4", "protocol": "4", "remoteManagedGroups": ["controlplane", "worker"]}]},
            "bastion": {"enabled": true, "spec": {"flavor": "m1.small", "image": {"filter": {"name": "ubuntu-2404"}}, "sshKeyName": "key"}},
        },
        "status": {
            "ready": true,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "failureDomains": {"nova": {"controlPlane": true}},
            "network": {"id": "b2f6b8e4-0d0e-4b5e-8d3c-6f0f1a2b3c4d", "name": "k8s-clusterapi-cluster-default-bench"},
            "apiServerLoadBalancer": {"id": "c3d4e5f6-1111-2222-3333-444455556666", "name": "k8s-clusterapi-cluster-default-bench-kubeapi", "ip": "203.0.113.10", "internalIP": "10.6.0.10"},
        },
    })
}

fn machine() -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackMachine",
        "metadata": {"name": "bench-control-plane-x7k2p", "namespace": "default", "uid": "0f5b0c9e-2d1a-4f7b-8c6d-5e4f3a2b1c0d", "generation": 1,
                     "labels": {"cluster.x-k8s.io/cluster-name": "bench", "cluster.x-k8s.io/control-plane": ""}},
        "spec": {"flavor": "m1.medium", "image": {"filter": {"name": "ubuntu-2404"}}, "sshKeyName": "key",
                 "providerID": "openstack:///6b1d3c0a-9e8f-4a7b-b6c5-d4e3f2a1b0c9", "ports": [{"disablePortSecurity": false}]},
        "status": {"ready": true, "instanceID": "6b1d3c0a-9e8f-4a7b-b6c5-d4e3f2a1b0c9", "instanceState": "ACTIVE",
                   "addresses": [{"type": "InternalIP", "address": "10.6.0.21"}],
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                                  {"type": "InstanceReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    })
}

fn review(object: &Value, desired: &str, uid: usize) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
           "request": {"uid": format!("bench-{uid}"), "desiredAPIVersion": desired, "objects": [object]}, "response": {}})
}

/// The four conversions measured: each kind, each direction.
fn cases() -> anyhow::Result<Vec<(String, Value, String)>> {
    let hub =
        |o: &Value| capo_api::conversion::convert(o, "infrastructure.cluster.x-k8s.io/v1beta2");
    let (cluster, machine) = (cluster(), machine());
    Ok(vec![
        (
            "OpenStackCluster v1beta1->v1beta2".into(),
            cluster.clone(),
            "infrastructure.cluster.x-k8s.io/v1beta2".into(),
        ),
        (
            "OpenStackCluster v1beta2->v1beta1".into(),
            hub(&cluster)?,
            "infrastructure.cluster.x-k8s.io/v1beta1".into(),
        ),
        (
            "OpenStackMachine v1beta1->v1beta2".into(),
            machine.clone(),
            "infrastructure.cluster.x-k8s.io/v1beta2".into(),
        ),
        (
            "OpenStackMachine v1beta2->v1beta1".into(),
            hub(&machine)?,
            "infrastructure.cluster.x-k8s.io/v1beta1".into(),
        ),
    ])
}

/// Runs `requests` conversions of each case over HTTPS, and as many in process.
pub async fn run(requests: usize) -> anyhow::Result<Vec<Latency>> {
    let host = "capo-rs-webhook-service.capo-rs-system.svc".to_owned();
    let certs = WebhookCerts::issue(std::slice::from_ref(&host))?;
    let dir = tempfile::tempdir()?;
    certs.write(dir.path())?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (address, _task) = webhook::serve(
        WebhookConfig {
            address: "127.0.0.1:0".parse()?,
            cert_dir: dir.path().to_owned(),
            reload_every: webhook::CERT_RELOAD_PERIOD,
        },
        WebhookMetrics::register(&prometheus::Registry::new())?,
        webhook::capo_rules::capo_validators(),
        stop,
    )
    .await?;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(certs.ca_pem.as_bytes())?)
        .resolve(&host, address)
        .http1_only()
        .build()?;
    let url = format!("https://{host}:{}/convert", address.port());
    let mut results = Vec::new();
    for (what, object, desired) in cases()? {
        let mut over_https = Vec::with_capacity(requests);
        let mut in_process = Vec::with_capacity(requests);
        for i in 0..requests + requests / 10 {
            let body = review(&object, &desired, i);
            let started = Instant::now();
            let answer: Value = client.post(&url).json(&body).send().await?.json().await?;
            let took = started.elapsed();
            anyhow::ensure!(
                answer["response"]["result"]["status"] == "Success",
                "{what}: {answer}"
            );
            let started = Instant::now();
            let answer = capo_api::conversion::review(&body);
            let pure = started.elapsed();
            anyhow::ensure!(
                answer["response"]["result"]["status"] == "Success",
                "{what}: {answer}"
            );
            // The first tenth warms the connection and the allocator up.
            if i >= requests / 10 {
                over_https.push(took);
                in_process.push(pure);
            }
        }
        results.push(latency(&format!("{what} over HTTPS"), over_https));
        results.push(latency(&format!("{what} in process"), in_process));
    }
    for (what, review) in admission_cases()? {
        let url = format!(
            "https://{host}:{}/validate/openstackmachines",
            address.port()
        );
        let mut over_https = Vec::with_capacity(requests);
        for i in 0..requests + requests / 10 {
            let started = Instant::now();
            let answer: Value = client.post(&url).json(&review).send().await?.json().await?;
            let took = started.elapsed();
            anyhow::ensure!(answer["response"]["allowed"] == true, "{what}: {answer}");
            if i >= requests / 10 {
                over_https.push(took);
            }
        }
        results.push(latency(&format!("{what} over HTTPS"), over_https));
    }
    Ok(results)
}

/// An OpenStackMachine update (its ports' allowedAddressPairs) sent in each version: in
/// v1beta1 the webhook also runs the stored version's CEL rules on the converted objects.
fn admission_cases() -> anyhow::Result<Vec<(String, Value)>> {
    let old = capo_api::conversion::convert(&machine(), "infrastructure.cluster.x-k8s.io/v1beta2")?;
    let mut new = old.clone();
    new["spec"]["ports"][0]["allowedAddressPairs"] = json!([{"ipAddress": "10.6.0.250"}]);
    let review = |sent_in: &str| {
        let kind = |version: &str| json!({"group": "infrastructure.cluster.x-k8s.io", "version": version, "kind": "OpenStackMachine"});
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "bench", "operation": "UPDATE", "kind": kind("v1beta2"),
                           "resource": {"group": "infrastructure.cluster.x-k8s.io", "version": "v1beta2", "resource": "openstackmachines"},
                           "requestKind": kind(sent_in), "object": new, "oldObject": old, "dryRun": false}})
    };
    Ok(vec![
        (
            "admission: machine update sent as v1beta2".into(),
            review("v1beta2"),
        ),
        (
            "admission: machine update sent as v1beta1 (+CEL)".into(),
            review("v1beta1"),
        ),
    ])
}

/// A table of the figures.
pub fn print(results: &[Latency]) {
    println!(
        "{:<58} {:>8} {:>10} {:>10} {:>10}",
        "review (one object each)", "samples", "p50 µs", "p99 µs", "max µs"
    );
    for r in results {
        println!(
            "{:<58} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            r.what, r.samples, r.p50_us, r.p99_us, r.max_us
        );
    }
}
