//! Raft RPC from the other members (`/raft/append`, `/raft/vote`, `/raft/snapshot`), the
//! server side of `crate::network`.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::body::{closing, json, method_not_allowed, not_found, read, Body};
use crate::context::Context;

/// Body limits per RPC: each well above what a peer sends, far below what would hurt.
/// A vote is a few hundred bytes.
const VOTE_BODY_BYTES_MAX: usize = 16 * 1024;
/// An append carries up to openraft's 300 entries per batch, each a heartbeat with its reports.
const APPEND_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// A snapshot chunk is at most openraft's 3 MiB, which JSON writes as up to 4 characters a byte.
const SNAPSHOT_BODY_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Routes `/raft/{rpc}`.
pub(super) async fn route(member: &Context, rpc: &str, request: Request<Incoming>) -> Response<Body> {
    let post = request.method() == Method::POST;
    match rpc {
        "append" if post => match read(request, APPEND_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft().append_entries(rpc).await),
            Err(response) => response,
        },
        "vote" if post => match read(request, VOTE_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft().vote(rpc).await),
            Err(response) => response,
        },
        "snapshot" if post => match read(request, SNAPSHOT_BODY_BYTES_MAX).await {
            Ok(rpc) => json(StatusCode::OK, &member.raft().install_snapshot(rpc).await),
            Err(response) => response,
        },
        "append" | "vote" | "snapshot" => closing(method_not_allowed()),
        _ => not_found(),
    }
}
