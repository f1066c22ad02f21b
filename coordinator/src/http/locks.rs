//! The lock API (`/api/lock/acquire`, `/api/lock/release`, `/api/lock/extend`): coordinator-backed
//! locks with a fence, for `safeguards::LockBackend` clients.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use protocol::locks::{LockAcquireRequest, LockExtendRequest, LockReleaseRequest};

use super::body::{closing, method_not_allowed, not_found, read, refusal, Body};
use super::command::write;
use crate::context::Context;
use crate::state::Command;

/// A lock request is a few hundred bytes; it shares the node API's bound (`node_api`).
const LOCK_BODY_BYTES_MAX: usize = 1024 * 1024;
/// Longest lock owner token accepted; ours are 32 hex digits.
const OWNER_BYTES_MAX: usize = 64;

/// Routes `/api/lock/{op}`.
pub(super) async fn route(member: &Context, op: &str, request: Request<Incoming>) -> Response<Body> {
    let post = request.method() == Method::POST;
    match op {
        "acquire" if post => acquire(member, request).await,
        "release" if post => release(member, request).await,
        "extend" if post => extend(member, request).await,
        "acquire" | "release" | "extend" => closing(method_not_allowed()),
        _ => not_found(),
    }
}

async fn acquire(member: &Context, request: Request<Incoming>) -> Response<Body> {
    match read::<LockAcquireRequest>(request, LOCK_BODY_BYTES_MAX).await {
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
    }
}

async fn release(member: &Context, request: Request<Incoming>) -> Response<Body> {
    match read::<LockReleaseRequest>(request, LOCK_BODY_BYTES_MAX).await {
        Ok(r) if !lock_request_ok(&r.name, &r.owner, None) => bad_lock_request(),
        Ok(r) => {
            write(member, |_, _| Command::ReleaseLock { name: r.name, owner: r.owner, fence: r.fence, hold: r.hold })
                .await
        }
        Err(response) => response,
    }
}

async fn extend(member: &Context, request: Request<Incoming>) -> Response<Body> {
    match read::<LockExtendRequest>(request, LOCK_BODY_BYTES_MAX).await {
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
