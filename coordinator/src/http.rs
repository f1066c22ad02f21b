//! A member's HTTP server: raft RPC from peers (`/raft/*`) and the API nodes and operators use
//! (`/api/*`, locks under `/api/lock/*`), and the operators' API (`/admin/*`, see [`crate::admin`]).
//! Status codes: 200 with the outcome; 421 `not_leader` (with the leader's address)
//! from a follower; 503 when no leader is known or the write failed; 400 for a bad body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use protocol::locks::{LockAcquireRequest, LockExtendRequest, LockReleaseRequest};
use protocol::{HeartbeatRequest, LeaveRequest, Refusal, RegisterRequest, PROTOCOL_VERSION};

use crate::member::{MemberInner, WriteError};
use crate::state::{Command, Outcome};

/// Largest body accepted: raft batches and snapshots of a small state; far above what they need.
const BODY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Longest lock owner token accepted; ours are 32 hex digits.
const OWNER_BYTES_MAX: usize = 64;
/// Concurrent connections: peers and nodes, a few dozen at most.
const CONNECTIONS_MAX: usize = 1024;
/// Slow clients are cut off after this.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) type Body = Full<Bytes>;

pub async fn serve(member: Arc<MemberInner>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let (stream, _peer): (_, SocketAddr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("coordinator accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let member = member.clone();
        let service = service_fn(move |request| {
            let member = member.clone();
            async move { Ok::<_, Infallible>(route(&member, request).await) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
            drop(permit);
        });
    }
}

async fn route(member: &MemberInner, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    if path.starts_with("/admin/") {
        return crate::admin::route(member, request)
            .await
            .unwrap_or_else(|| refusal(StatusCode::NOT_FOUND, "not_found", None));
    }
    match (request.method().clone(), path.as_str()) {
        (Method::POST, "/raft/append") => match read(request).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.append_entries(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/raft/vote") => match read(request).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.vote(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/raft/snapshot") => match read(request).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft.install_snapshot(rpc).await),
            Err(response) => response,
        },
        (Method::POST, "/api/register") => match read::<RegisterRequest>(request).await {
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
        (Method::POST, "/api/heartbeat") => match read::<HeartbeatRequest>(request).await {
            Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
            Ok(r) => {
                write(member, |now_ms, lease_ms| Command::Heartbeat {
                    node: r.node,
                    epoch: r.epoch,
                    now_ms,
                    lease_until_ms: now_ms + lease_ms,
                    reports: r.reports,
                })
                .await
            }
            Err(response) => response,
        },
        (Method::POST, "/api/leave") => match read::<LeaveRequest>(request).await {
            Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
            Ok(r) => write(member, |_, _| Command::Leave { node: r.node, epoch: r.epoch }).await,
            Err(response) => response,
        },
        (Method::POST, "/api/lock/acquire") => match read::<LockAcquireRequest>(request).await {
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
        (Method::POST, "/api/lock/release") => match read::<LockReleaseRequest>(request).await {
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
        (Method::POST, "/api/lock/extend") => match read::<LockExtendRequest>(request).await {
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
        (Method::GET, "/api/state") => json(StatusCode::OK, &member.status()),
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
        _ => refusal(StatusCode::NOT_FOUND, "not_found", None),
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

async fn read<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, Response<Body>> {
    let body = Limited::new(request.into_body(), BODY_BYTES_MAX)
        .collect()
        .await
        .map_err(|_| refusal(StatusCode::BAD_REQUEST, "bad_body", None))?
        .to_bytes();
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

fn unsupported_version(theirs: u32) -> Response<Body> {
    json(StatusCode::BAD_REQUEST, &Refusal::unsupported_version(theirs))
}
