//! A member's HTTP server: raft RPC from peers (`/raft/*`) and the API nodes and operators use
//! (`/api/*`, locks under `/api/lock/*`), and the operators' API (`/admin/*`, see [`crate::admin`]).
//! Status codes: 200 with the outcome; 421 `not_leader` (with the leader's address)
//! from a follower; 503 when no leader is known or the write failed; 400 for a bad body.
//!
//! Every `/raft/*` and `/api/*` call must carry the cluster token (`Authorization: Bearer`,
//! see `protocol::credential`): without it the answer is 401 `unauthorized`, decided from the
//! headers alone, before the body is read, so nothing reaches raft. `/health` and `/metrics`
//! stay open (they tell nothing a token protects); `/admin/*` has its own token.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use protocol::locks::{LockAcquireRequest, LockExtendRequest, LockReleaseRequest};
use protocol::tls::Io;
use protocol::{HeartbeatRequest, LeaveRequest, Refusal, RegisterRequest, PROTOCOL_VERSION};

use crate::leases::NotRenewed;
use crate::member::{MemberInner, WriteError};
use crate::state::{Command, Outcome};

/// Body limits per route: each well above what its callers send, far below what would hurt.
/// A vote is a few hundred bytes.
const VOTE_BODY_BYTES_MAX: usize = 16 * 1024;
/// A node's message carries one report per SKU (~200 bytes each): room for thousands of SKUs.
const API_BODY_BYTES_MAX: usize = 1024 * 1024;
/// An append carries up to openraft's 300 entries per batch, each a heartbeat with its reports.
const APPEND_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// A snapshot chunk is at most openraft's 3 MiB, which JSON writes as up to 4 characters a byte.
const SNAPSHOT_BODY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Longest lock owner token accepted; ours are 32 hex digits.
const OWNER_BYTES_MAX: usize = 64;
/// Concurrent connections: peers and nodes, a few dozen at most.
const CONNECTIONS_MAX: usize = 1024;
/// Connections that have not yet presented the cluster token (probes, scrapes, strangers). Past
/// this (or past [`UNPROVEN_PER_ADDRESS_MAX`] from one address), new connections are closed at
/// once, so strangers can hold at most this many slots and [`CONNECTIONS_MAX`] − this stay for
/// members and nodes, whose proven connections are kept alive. hyper's header timeout also bounds
/// idleness (it runs while a connection waits for its next request), so a stranger's slot frees
/// within [`HEADER_TIMEOUT`].
const UNPROVEN_CONNECTIONS_MAX: usize = 256;
const _: () = assert!(UNPROVEN_CONNECTIONS_MAX * 2 <= CONNECTIONS_MAX);
/// A member or node sends its headers at once; a peer that dribbles them is cut off. hyper runs
/// the same timer while a keep-alive connection waits for its next request, so this is also the
/// idle limit: above any sane heartbeat period (nodes renew every `heartbeat_ms`, a third of a
/// lease or less), so a node's connection is not closed between two heartbeats.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest time to read a body: a 32 MiB snapshot chunk takes well under a second on any link
/// a raft group can live with.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type Body = Full<Bytes>;

/// Admin bodies are read within the same bound as the rest.
pub(crate) const ADMIN_BODY_TIMEOUT: Duration = BODY_TIMEOUT;

/// Connections from one address that have not yet presented the token: one host cannot take
/// the whole strangers' share.
const UNPROVEN_PER_ADDRESS_MAX: usize = 32;

/// The connections that have not proven themselves, in all and per address.
#[derive(Default)]
struct Strangers {
    /// Total and per-address counts. A std `Mutex`: held for a map update, never across `.await`.
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One connection's place among the strangers; released when the connection presents the
/// token or ends.
struct Unproven {
    strangers: Arc<Strangers>,
    addr: IpAddr,
    released: AtomicBool,
}

impl Strangers {
    fn admit(self: &Arc<Self>, addr: IpAddr) -> Option<Unproven> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_addr) = &mut *counts;
        let mine = by_addr.entry(addr).or_default();
        if *total >= UNPROVEN_CONNECTIONS_MAX || *mine >= UNPROVEN_PER_ADDRESS_MAX {
            return None;
        }
        *mine += 1;
        *total += 1;
        Some(Unproven { strangers: self.clone(), addr, released: AtomicBool::new(false) })
    }
}

impl Unproven {
    /// The connection presented the token: it no longer counts against strangers' share.
    fn release(&self) {
        if self.released.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut counts = self.strangers.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_addr) = &mut *counts;
        *total -= 1;
        if let Some(mine) = by_addr.get_mut(&self.addr) {
            *mine -= 1;
            if *mine == 0 {
                by_addr.remove(&self.addr);
            }
        }
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        self.release();
    }
}

/// Serves `listener` until `shutdown`; with `tls`, every connection must complete a mutual TLS
/// handshake (within [`HEADER_TIMEOUT`]) before a byte of HTTP is read.
pub async fn serve(
    member: Arc<MemberInner>,
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
            metrics::counter!("seckill_coordinator_connections_shed_total", "member" => member.name.clone())
                .increment(1);
            continue;
        };
        let stranger = Arc::new(stranger);
        let _ = stream.set_nodelay(true);
        let member = member.clone();
        let service = service_fn(move |request| {
            let (member, stranger) = (member.clone(), stranger.clone());
            async move { Ok::<_, Infallible>(route(&member, request, &stranger).await) }
        });
        let (http, tls) = (http.clone(), tls.clone());
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
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
        });
    }
}

async fn route(member: &MemberInner, request: Request<Incoming>, stranger: &Unproven) -> Response<Body> {
    let path = request.uri().path().to_string();
    if path.starts_with("/admin/") {
        return crate::admin::route(member, request)
            .await
            .unwrap_or_else(|| refusal(StatusCode::NOT_FOUND, "not_found", None));
    }
    let internal = path.starts_with("/raft/") || path.starts_with("/api/");
    if internal && !member.config.cluster.admits(request.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
        let kind = if path.starts_with("/raft/") { "raft" } else { "api" };
        metrics::counter!("seckill_coordinator_unauthorized_total", "member" => member.name.clone(), "kind" => kind)
            .increment(1);
        let mut response = refusal(StatusCode::UNAUTHORIZED, "unauthorized", None);
        response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        // The body is never read; closing spares reading it and frees the stranger's slot.
        response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    if internal {
        stranger.release();
    }
    match (request.method().clone(), path.as_str()) {
        (Method::POST, "/raft/append") => match read(request, APPEND_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.append_entries(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/raft/vote") => match read(request, VOTE_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.vote(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/raft/snapshot") => match read(request, SNAPSHOT_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.install_snapshot(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/api/register") => match read::<RegisterRequest>(request, API_BODY_BYTES_MAX).await {
            Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
            Ok(r) => {
                write(member, |now_ms, lease_ms| Command::Register {
                    node: r.node,
                    addr: r.addr,
                    instance: r.instance,
                    lease_until_ms: now_ms + lease_ms,
                })
                .await
            }
            Err(response) => response,
        },
        (Method::POST, "/api/heartbeat") => {
            let arrived = (Instant::now(), crate::member::now_ms());
            match read::<HeartbeatRequest>(request, API_BODY_BYTES_MAX).await {
                Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
                Ok(r) => renew(member, r, arrived).await,
                Err(response) => response,
            }
        }
        (Method::POST, "/api/leave") => match read::<LeaveRequest>(request, API_BODY_BYTES_MAX).await {
            Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
            Ok(r) => {
                let lease_until_ms = member.leases.lease_until_ms(&r.node, r.epoch).unwrap_or(0);
                write(member, |_, _| Command::Leave { node: r.node, epoch: r.epoch, lease_until_ms }).await
            }
            Err(response) => response,
        },
        (Method::POST, "/api/lock/acquire") => match read::<LockAcquireRequest>(request, API_BODY_BYTES_MAX).await {
            Ok(r) if !lock_request_ok(&r.name, &r.owner, Some(r.ttl_ms)) => bad_lock_request(),
            Ok(r) => {
                write(member, |now_ms, _| Command::AcquireLock {
                    name: r.name,
                    owner: r.owner,
                    hold: r.hold,
                    ttl_ms: r.ttl_ms,
                    now_ms,
                })
                .await
            }
            Err(response) => response,
        },
        (Method::POST, "/api/lock/release") => match read::<LockReleaseRequest>(request, API_BODY_BYTES_MAX).await {
            Ok(r) if !lock_request_ok(&r.name, &r.owner, None) => bad_lock_request(),
            Ok(r) => {
                write(member, |_, _| Command::ReleaseLock {
                    name: r.name,
                    owner: r.owner,
                    fence: r.fence,
                    hold: r.hold,
                })
                .await
            }
            Err(response) => response,
        },
        (Method::POST, "/api/lock/extend") => match read::<LockExtendRequest>(request, API_BODY_BYTES_MAX).await {
            Ok(r) if !lock_request_ok(&r.name, &r.owner, Some(r.ttl_ms)) => bad_lock_request(),
            Ok(r) => {
                write(member, |now_ms, _| Command::ExtendLock {
                    name: r.name,
                    owner: r.owner,
                    fence: r.fence,
                    ttl_ms: r.ttl_ms,
                    now_ms,
                })
                .await
            }
            Err(response) => response,
        },
        (Method::GET, "/api/state") => json(StatusCode::OK, &state_view(member)),
        (Method::POST, "/api/catalogue") => {
            let skus = member.store.read().state.catalogue.all_terms();
            json(StatusCode::OK, &protocol::fleet::CatalogueAnswer { skus })
        }
        (Method::GET, "/health") => json(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        (Method::GET, "/metrics") => match &member.metrics {
            Some(handle) => {
                crate::control::publish_gauges(member);
                let mut response = Response::new(Full::new(Bytes::from(handle.render())));
                response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
                response
            }
            None => refusal(StatusCode::SERVICE_UNAVAILABLE, "metrics_unavailable", None),
        },
        (_, "/raft/append" | "/raft/vote" | "/raft/snapshot" | "/api/register" | "/api/heartbeat" | "/api/leave")
        | (_, "/api/lock/acquire" | "/api/lock/release" | "/api/lock/extend") => {
            closing(refusal(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None))
        }
        (_, "/api/state" | "/health" | "/metrics") => {
            refusal(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None)
        }
        _ => refusal(StatusCode::NOT_FOUND, "not_found", None),
    }
}

/// This member's status for `/api/state`, without the lock owners' tokens: whoever holds an
/// owner token can release or extend that lock, so it stays with the holder. Every `owner`
/// field is dropped wherever it sits, so a change of the state's layout cannot bring one back.
fn state_view(member: &MemberInner) -> serde_json::Value {
    let mut view = serde_json::to_value(member.status()).unwrap_or_default();
    drop_owners(&mut view);
    view
}

fn drop_owners(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("owner");
            map.values_mut().for_each(drop_owners);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_owners),
        _ => {}
    }
}

/// Lock requests are bounded before they reach the log: a valid name, an owner token of at most
/// `OWNER_BYTES_MAX`, and a ttl within the lock bounds.
fn lock_request_ok(name: &str, owner: &str, ttl_ms: Option<u64>) -> bool {
    safeguards::LockName::new(name).is_ok()
        && !owner.is_empty()
        && owner.len() <= OWNER_BYTES_MAX
        && ttl_ms.is_none_or(|ms| safeguards::lock::check_ttl(std::time::Duration::from_millis(ms)).is_ok())
}

fn bad_lock_request() -> Response<Body> {
    refusal(StatusCode::BAD_REQUEST, "bad_lock_request", None)
}

/// Stamps the leader's time into the command and writes it through raft.
async fn write(member: &MemberInner, command: impl FnOnce(u64, u64) -> Command) -> Response<Body> {
    let command = command(crate::member::now_ms(), member.config.lease.as_millis() as u64);
    match member.write(command).await {
        // Nodes and lock clients read `protocol` answers, never raft outcomes.
        Ok(Outcome::Lease(answer)) => json(StatusCode::OK, &answer),
        Ok(Outcome::Leave(answer)) => json(StatusCode::OK, &answer),
        Ok(Outcome::Lock(answer)) => json(StatusCode::OK, &answer),
        Ok(other) => {
            tracing::error!("a node API write had the outcome {other:?}, which no node API route produces");
            refusal(StatusCode::INTERNAL_SERVER_ERROR, "internal", None)
        }
        Err(WriteError::NotLeader(leader)) => refusal(StatusCode::MISDIRECTED_REQUEST, "not_leader", leader),
        Err(WriteError::Unavailable(reason)) => {
            tracing::debug!("coordinator write failed: {reason}");
            refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable", None)
        }
    }
}

/// Renews a node's lease in the leader's memory (`crate::leases`), once a quorum has confirmed
/// this member's leadership after the heartbeat `arrived` (instant, wall-clock ms).
async fn renew(member: &MemberInner, r: HeartbeatRequest, arrived: (Instant, u64)) -> Response<Body> {
    if !member.is_leader() {
        return refusal(StatusCode::MISDIRECTED_REQUEST, "not_leader", member.leader_addr());
    }
    let (arrived, now_ms) = arrived;
    let round_max = member.config.election_timeout_max;
    match tokio::time::timeout(round_max, member.quorum.confirm_since(&member.raft, arrived)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!("not renewing: {e}");
            return refusal(StatusCode::MISDIRECTED_REQUEST, "not_leader", member.leader_addr());
        }
        Err(_) => return refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable", None),
    }
    let lease_ms = member.config.lease.as_millis() as u64;
    let renewed = member
        .store
        .inspect(|applied| member.leases.renew(&applied.state, &r.node, r.epoch, now_ms, lease_ms, r.reports));
    match renewed {
        Ok(answer) => json(StatusCode::OK, &answer),
        // The node has fenced itself already; it retries, and registers again once the expiry
        // is written.
        Err(NotRenewed::Expiring) => refusal(StatusCode::SERVICE_UNAVAILABLE, "lease_expiring", None),
    }
}

/// Reads a JSON body of at most `bytes_max` within [`BODY_TIMEOUT`]: 413 past the limit (a
/// declared length over it is refused before reading), 408 when it takes too long.
async fn read<T: DeserializeOwned>(request: Request<Incoming>, bytes_max: usize) -> Result<T, Response<Body>> {
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > bytes_max as u64) {
        return Err(closing(refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", None)));
    }
    let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(request.into_body(), bytes_max).collect()).await;
    let body = match collected {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            return Err(closing(refusal(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", None)))
        }
        Ok(Err(_)) => return Err(closing(refusal(StatusCode::BAD_REQUEST, "bad_body", None))),
        Err(_) => return Err(closing(refusal(StatusCode::REQUEST_TIMEOUT, "body_timeout", None))),
    };
    serde_json::from_slice(&body).map_err(|_| refusal(StatusCode::BAD_REQUEST, "bad_request", None))
}

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| br#"{"error":"internal"}"#.to_vec());
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn refusal(status: StatusCode, error: &str, leader: Option<String>) -> Response<Body> {
    json(status, &Refusal { leader, ..Refusal::new(error) })
}

/// Asks hyper to close the connection after this answer: its body was not (fully) read.
fn closing(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

fn unsupported_version(theirs: u32) -> Response<Body> {
    json(StatusCode::BAD_REQUEST, &Refusal::unsupported_version(theirs))
}
