//! The HTTPS servers' connection handling (the webhook's and the metrics server's): any pod
//! that reaches their ports can connect, so TLS handshakes, header reads and whole requests
//! are bounded in time, and connections are capped in all and per peer address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers: a slowloris client, or one that
/// sends nothing, is closed after this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take from its headers to its answer, its body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connections may take to finish their requests once the server is stopping.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Connections served at once; past this, new ones wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections served at once from one peer address; past this, a new one from it is closed
/// at once. One pod cannot take every connection from the API server (another address).
pub const MAX_CONNECTIONS_PER_PEER: usize = 128;

/// Accepts connections until `shutdown`, each served on a task of its own, then waits for
/// those in flight to finish.
pub(super) async fn accept_connections(
    what: &'static str,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers = Peers::default();
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = connections.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                tracing::debug!(%error, server = what, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(peer_slot) = peers.take(peer.ip()) else {
            tracing::debug!(%peer, server = what, "too many connections from this address; closed");
            continue;
        };
        let connection = serve_connection(
            what,
            tcp,
            peer,
            acceptor.clone(),
            app.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            connection.await;
            drop((slot, peer_slot));
        });
    }
    // Every connection holds a slot until it ends.
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE * 2, connections.acquire_many(all)).await;
}

/// One connection: the TLS handshake, then one HTTP/1.1 request, unless the client sends
/// none within the header timeout or the server stops.
async fn serve_connection(
    what: &'static str,
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            return tracing::debug!(%error, %peer, server = what, "TLS handshake failed");
        }
        Err(_) => return tracing::debug!(%peer, server = what, "TLS handshake timed out"),
    };
    let service = hyper::service::service_fn(move |request| {
        let app = app.clone();
        async move {
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, app.oneshot(request)).await;
            Ok::<_, std::convert::Infallible>(match answer {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => {
                    (StatusCode::REQUEST_TIMEOUT, "the request took too long").into_response()
                }
            })
        }
    });
    // One request per connection (answered with `connection: close`). hyper's header timeout
    // also closes a kept-alive connection idle for 10 s, while the API server's Go client keeps
    // idle connections for 90 s: a POST it wrote on one just as we closed it failed with a
    // broken pipe, and so did the user's create (CI at 1689af9, on a real kube-apiserver). A
    // TLS handshake per call is cheap at webhook and scrape rates.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false);
    let connection = http.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
    let mut connection = std::pin::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(SHUTDOWN_GRACE, connection.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%error, %peer, server = what, "connection ended");
    }
}

/// Connections per peer address; an address is forgotten when its last connection ends.
#[derive(Clone, Default)]
struct Peers(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection's place in its peer's count, given back when dropped.
struct PeerSlot {
    peers: Peers,
    address: IpAddr,
}

impl Peers {
    fn take(&self, address: IpAddr) -> Option<PeerSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(address).or_default();
        if *count >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: self.clone(),
            address,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.peers.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_of_connections_and_is_forgotten_after() {
        let peers = Peers::default();
        let one: IpAddr = [127, 0, 0, 2].into();
        let other: IpAddr = [127, 0, 0, 1].into();
        let held: Vec<PeerSlot> = (0..MAX_CONNECTIONS_PER_PEER)
            .map(|_| peers.take(one).expect("within its share"))
            .collect();
        assert!(peers.take(one).is_none(), "past its share");
        let theirs = peers.take(other).expect("another address is not held back");
        drop(held);
        drop(theirs);
        assert!(peers.0.lock().unwrap().is_empty(), "forgotten");
    }
}
