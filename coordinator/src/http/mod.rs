//! A member's HTTP server, split by caller: raft RPC from peers (`/raft/*`, [`raft`]), the API
//! nodes use (`/api/*`, [`node_api`]; locks under `/api/lock/*`, [`locks`]), the operators' API
//! (`/admin/*`, [`admin`]) and what probes and scrapers read (`/health`, `/metrics`, [`probes`]).
//! This module accepts connections, authenticates callers and dispatches; the handlers answer.
//! Status codes: 200 with the outcome; 421 `not_leader` (with the leader's address)
//! from a follower; 503 when no leader is known or the write failed; 400 for a bad body.
//!
//! Every `/raft/*` and `/api/*` call must carry the cluster token (`Authorization: Bearer`,
//! see `protocol::credential`): without it the answer is 401 `unauthorized`, decided from the
//! headers alone, before the body is read, so nothing reaches raft. `/health` and `/metrics`
//! stay open (they tell nothing a token protects); `/admin/*` has its own token.
//!
//! Imports point one way: `mod` → the handlers → `command`, `body`; everything here reads the
//! member through `crate::context`.

mod admin;
mod body;
mod command;
mod locks;
mod node_api;
mod probes;
mod raft;
mod strangers;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use protocol::tls::Io;

use self::body::{not_found, refusal, Body};
use self::strangers::{Strangers, Unproven, UNPROVEN_CONNECTIONS_MAX};
use crate::context::Context;

/// Concurrent connections: peers and nodes, a few dozen at most.
const CONNECTIONS_MAX: usize = 1024;
const _: () = assert!(UNPROVEN_CONNECTIONS_MAX * 2 <= CONNECTIONS_MAX);
/// A member or node sends its headers at once; a peer that dribbles them is cut off. hyper runs
/// the same timer while a keep-alive connection waits for its next request, so this is also the
/// idle limit: above any sane heartbeat period (nodes renew every `heartbeat_ms`, a third of a
/// lease or less), so a node's connection is not closed between two heartbeats.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `listener` until `shutdown`; with `tls`, every connection must complete a mutual TLS
/// handshake (within [`HEADER_TIMEOUT`]) before a byte of HTTP is read.
pub async fn serve(
    member: Arc<Context>,
    listener: TcpListener,
    tls: Option<protocol::tls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let strangers = Arc::new(Strangers::default());
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (stream, peer): (_, SocketAddr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("coordinator accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // An IPv6 host holds a whole /64: its share is per block, not per address.
        let source = safeguards::client_ip::subject(peer.ip(), safeguards::client_ip::IPV6_PREFIX_DEFAULT);
        let Some(stranger) = strangers.admit(source) else {
            metrics::counter!("seckill_coordinator_connections_shed_total", "member" => member.name().to_string())
                .increment(1);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let accepted = Accepted { stream, peer, stranger, permit };
        tokio::spawn(connection(member.clone(), accepted, http.clone(), tls.clone(), shutdown.clone()));
    }
}

/// A connection taken off the listener, with its place among the connections and strangers.
struct Accepted {
    stream: TcpStream,
    peer: SocketAddr,
    stranger: Unproven,
    /// Held until the connection ends.
    permit: OwnedSemaphorePermit,
}

/// Serves one connection until it ends or `stop`, after its TLS handshake if the member runs TLS.
async fn connection(
    member: Arc<Context>,
    accepted: Accepted,
    http: http1::Builder,
    tls: Option<protocol::tls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let Accepted { stream, peer, stranger, permit } = accepted;
    let stranger = Arc::new(stranger);
    let service = service_fn(move |request| {
        let (member, stranger) = (member.clone(), stranger.clone());
        async move { Ok::<_, Infallible>(route(&member, request, &stranger).await) }
    });
    let io: Box<dyn Io> = match tls {
        None => Box::new(stream),
        Some(acceptor) => match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => Box::new(stream),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake from {peer} refused: {e}");
                return;
            }
            Err(_) => return,
        },
    };
    let connection = http.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = connection => {}
        _ = stop.wait_for(|stop| *stop) => {}
    }
    drop(permit);
}

/// Authenticates the caller of `/raft/*` and `/api/*` by the cluster token, then hands the
/// request to the handlers of its caller.
async fn route(member: &Context, request: Request<Incoming>, stranger: &Unproven) -> Response<Body> {
    let path = request.uri().path().to_string();
    if let Some(rest) = path.strip_prefix("/admin/") {
        return admin::route(member, rest, request).await;
    }
    let internal = if path.starts_with("/raft/") {
        Some("raft")
    } else if path.starts_with("/api/") {
        Some("api")
    } else {
        None
    };
    if let Some(kind) = internal {
        if !member.admits_peer(request.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
            return unauthorized(member, kind);
        }
        stranger.release();
    }
    if let Some(rpc) = path.strip_prefix("/raft/") {
        return raft::route(member, rpc, request).await;
    }
    if let Some(op) = path.strip_prefix("/api/lock/") {
        return locks::route(member, op, request).await;
    }
    if let Some(call) = path.strip_prefix("/api/") {
        return node_api::route(member, call, request).await;
    }
    match path.as_str() {
        "/health" => probes::health(request.method()),
        "/metrics" => probes::metrics(member, request.method()),
        "/ops" => probes::ops_page(&path, request.method()),
        _ if path.starts_with(web::ASSET_PREFIX) => probes::ops_page(&path, request.method()),
        _ => not_found(),
    }
}

/// 401 for a `kind` (`raft` or `api`) call without the cluster token.
fn unauthorized(member: &Context, kind: &'static str) -> Response<Body> {
    metrics::counter!("seckill_coordinator_unauthorized_total", "member" => member.name().to_string(), "kind" => kind)
        .increment(1);
    let mut response = refusal(StatusCode::UNAUTHORIZED, "unauthorized", None);
    response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    // The body is never read; closing spares reading it and frees the stranger's slot.
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}
