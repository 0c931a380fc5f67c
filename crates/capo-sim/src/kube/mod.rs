//! A simulated Kubernetes API server, faithful enough to run `kube::runtime::Controller`,
//! kube-rs clients and kubectl against over plain HTTP on loopback. Never used on a
//! production path: it exists for tests, the demo and benchmarks.
//!
//! What it does and what it leaves out is listed in docs/sim-kube.md (section "Simulated
//! Kubernetes API").

pub mod admission;
pub mod conversion;
pub mod errors;
pub mod managed;
pub mod openapi;
pub mod output;
pub mod patch;
pub mod protobuf;
pub mod resources;
pub mod selectors;
pub mod server;
pub mod store;
pub mod table;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use store::StoreConfig;

/// Errors starting or talking to the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A kube client could not be built for the simulator.
    #[error("cannot build a kube client: {0}")]
    Client(String),
    /// Objects given to [`KubeSim::install`] were refused.
    #[error("object refused: {0}")]
    Refused(#[from] errors::ApiError),
}

/// How to run the simulator.
#[derive(Clone, Debug)]
pub struct KubeSimConfig {
    /// Where to listen (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Storage tunables (watch history, watcher buffers).
    pub store: StoreConfig,
    /// How often watches that allow bookmarks receive one.
    pub bookmark_interval: Duration,
    /// How often the garbage collector finishes foreground deletions. As in a real
    /// cluster it works after the DELETE has answered, never inside it.
    pub garbage_collector_period: Duration,
}

impl Default for KubeSimConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            store: StoreConfig::default(),
            bookmark_interval: Duration::from_secs(10),
            garbage_collector_period: Duration::from_millis(100),
        }
    }
}

/// A running simulator. Dropping it stops the server.
pub struct KubeSim {
    addr: SocketAddr,
    shared: Arc<server::Shared>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl KubeSim {
    /// Binds and starts serving in the background.
    pub async fn start(config: KubeSimConfig) -> Result<Self, SimError> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| SimError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Bind {
            addr: config.listen,
            source,
        })?;
        let shutdown = CancellationToken::new();
        let shared = Arc::new(server::Shared {
            store: Mutex::new(store::Store::new(&config.store)),
            bookmark_interval: config.bookmark_interval,
            shutdown: shutdown.clone(),
            requests: Mutex::new(Vec::new()),
            converter: conversion::Converter::default(),
            status_write_faults: Mutex::new((0, Duration::ZERO)),
        });
        let app = server::router(shared.clone());
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let serving = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
            if let Err(error) = serving.await {
                tracing::error!(%error, "simulated Kubernetes API server stopped");
            }
        });
        let collector = tokio::spawn(collect_garbage(
            shared.clone(),
            config.garbage_collector_period,
            shutdown.clone(),
        ));
        tracing::info!(%addr, "simulated Kubernetes API server listening");
        Ok(Self {
            addr,
            shared,
            shutdown,
            tasks: vec![task, collector],
        })
    }

    /// Where conversion webhooks are reached (route a webhook Service here).
    pub fn converter(&self) -> &conversion::Converter {
        &self.shared.converter
    }

    /// The next `count` status writes (PATCH or PUT of a `/status` subresource) fail after
    /// `delay` with 504 Timeout, as kube-apiserver 1.35 answers them while etcd is stopped
    /// (there after 34 s). Only status writes fail: the rest of an etcd outage (gets by name
    /// and other writes time out too; watches go on from the watch cache) is not modelled.
    /// The request log records them.
    pub fn fail_status_writes(&self, count: u32, delay: Duration) {
        *self
            .shared
            .status_write_faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = (count, delay);
    }

    /// Status writes still to fail.
    pub fn status_write_faults_left(&self) -> u32 {
        self.shared
            .status_write_faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that kubectl and kube-rs accept.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url())
    }

    /// A kube-rs client for this server, default namespace `default`.
    pub fn client(&self) -> Result<kube::Client, SimError> {
        let uri = self
            .url()
            .parse()
            .map_err(|e: axum::http::uri::InvalidUri| SimError::Client(e.to_string()))?;
        kube::Client::try_from(kube::Config::new(uri)).map_err(|e| SimError::Client(e.to_string()))
    }

    /// Every resource request served so far, in order: the log an RBAC check reads.
    pub fn requests(&self) -> Vec<server::RequestRecord> {
        self.shared.requests()
    }

    /// Every change from now on, in order, in-process: a checker that must see each write
    /// the moment it happens (no watch, no HTTP, no virtual time passing in between).
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<Arc<store::Change>> {
        self.shared.store().subscribe()
    }

    /// Requests so far by client and verb (what `GET /_sim/requests` answers).
    pub fn request_summary(&self) -> Value {
        self.shared.request_summary()
    }

    /// Creates objects directly (e.g. CRDs before controllers start), as a client would.
    pub fn install(&self, objects: &[Value]) -> Result<(), SimError> {
        let mut store = self.shared.store();
        for object in objects {
            let (group, version) = match object.get("apiVersion").and_then(Value::as_str) {
                Some(av) => av.split_once('/').unwrap_or(("", av)),
                None => ("", "v1"),
            };
            let kind = object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let registry = store.registry();
            let def = registry
                .all
                .iter()
                .find(|r| r.key.group == group && r.kind == kind && r.version(version).is_some())
                .cloned()
                .ok_or_else(|| {
                    errors::ApiError::bad_request(format!(
                        "no resource serves {group}/{version} {kind}"
                    ))
                })?;
            let namespace = match def.namespaced {
                true => object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_owned(),
                false => String::new(),
            };
            let target = store::Target {
                def,
                version: version.to_owned(),
                namespace,
                asked: None,
            };
            store.create(&target, object.clone(), &store::WriteOptions::default())?;
        }
        Ok(())
    }

    /// Stops serving and ends every watch.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks) {
            // The tasks only end; a join error means one panicked, already logged.
            let _ = task.await;
        }
    }
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The garbage collector's loop: foreground deletions finish between requests.
async fn collect_garbage(shared: Arc<server::Shared>, period: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stop.cancelled() => return,
        }
        shared.store().collect_foreground();
    }
}

/// A kubeconfig pointing at `server`, context `capo-sim`, namespace `default`.
pub fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: capo-sim
  cluster:
    server: {server}
contexts:
- name: capo-sim
  context:
    cluster: capo-sim
    user: capo-sim
    namespace: default
current-context: capo-sim
users:
- name: capo-sim
  user: {{}}
"
    )
}
