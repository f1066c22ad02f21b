//! The API nodes use (`/api/register`, `/api/heartbeat`, `/api/leave`, `/api/catalogue`),
//! `/api/nodes`, which the load balancer's sync reads, and `/api/state`, which members and tools
//! read. Registrations and leaves are raft writes; a
//! heartbeat renews a lease in the leader's memory (`crate::leases`), never in the log.

use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use protocol::{HeartbeatRequest, LeaveRequest, RegisterRequest, PROTOCOL_VERSION};

use super::body::{closing, json, method_not_allowed, not_found, read, refusal, unsupported_version, Body};
use super::command::write;
use crate::context::{now_ms, Context, RenewRefusal};
use crate::state::Command;

/// A node's message carries one report per SKU (~200 bytes each): room for thousands of SKUs.
const API_BODY_BYTES_MAX: usize = 1024 * 1024;

/// Routes `/api/{call}` (locks aside: `super::locks`).
pub(super) async fn route(member: &Context, call: &str, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    match (method, call) {
        (Method::POST, "register") => register(member, request).await,
        (Method::POST, "heartbeat") => heartbeat(member, request).await,
        (Method::POST, "leave") => leave(member, request).await,
        (Method::GET, "state") => json(StatusCode::OK, &state_view(member)),
        (Method::POST, "catalogue") => {
            let skus = member.applied_state().catalogue.all_terms();
            json(StatusCode::OK, &protocol::fleet::CatalogueAnswer { skus })
        }
        (Method::POST, "nodes") => json(StatusCode::OK, &live_nodes(member)),
        (_, "register" | "heartbeat" | "leave") => closing(method_not_allowed()),
        (_, "state") => method_not_allowed(),
        _ => not_found(),
    }
}

async fn register(member: &Context, request: Request<Incoming>) -> Response<Body> {
    match read::<RegisterRequest>(request, API_BODY_BYTES_MAX).await {
        Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
        Ok(r) => {
            let max_live = Some(member.max_nodes() as u64);
            write(member, |now_ms, lease_ms| Command::Register {
                node: r.node,
                addr: r.addr,
                instance: r.instance,
                lease_until_ms: now_ms + lease_ms,
                max_live,
            })
            .await
        }
        Err(response) => response,
    }
}

async fn heartbeat(member: &Context, request: Request<Incoming>) -> Response<Body> {
    // Taken before the body is read: the quorum round that answers it must have started after.
    let arrived = (Instant::now(), now_ms());
    let heartbeat = match read::<HeartbeatRequest>(request, API_BODY_BYTES_MAX).await {
        Ok(r) if r.version != PROTOCOL_VERSION => return unsupported_version(r.version),
        Ok(r) => r,
        Err(response) => return response,
    };
    match member.renew_lease(heartbeat, arrived).await {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(RenewRefusal::NotLeader(leader)) => refusal(StatusCode::MISDIRECTED_REQUEST, "not_leader", leader),
        Err(RenewRefusal::Unavailable) => refusal(StatusCode::SERVICE_UNAVAILABLE, "unavailable", None),
        // The node has fenced itself already; it retries, and registers again once the expiry
        // is written.
        Err(RenewRefusal::Expiring) => refusal(StatusCode::SERVICE_UNAVAILABLE, "lease_expiring", None),
    }
}

async fn leave(member: &Context, request: Request<Incoming>) -> Response<Body> {
    match read::<LeaveRequest>(request, API_BODY_BYTES_MAX).await {
        Ok(r) if r.version != PROTOCOL_VERSION => unsupported_version(r.version),
        Ok(r) => {
            let lease_until_ms = member.renewed_until_ms(&r.node, r.epoch);
            write(member, |_, _| Command::Leave { node: r.node, epoch: r.epoch, lease_until_ms }).await
        }
        Err(response) => response,
    }
}

/// `/api/nodes`: the leased nodes of this member's applied state.
fn live_nodes(member: &Context) -> protocol::fleet::NodesAnswer {
    let state = member.applied_state();
    let nodes = state
        .live_nodes()
        .map(|(id, record)| protocol::fleet::LiveNode {
            id: id.clone(),
            addr: record.addr.clone(),
            epoch: record.epoch,
        })
        .collect();
    protocol::fleet::NodesAnswer { nodes }
}

/// This member's status for `/api/state`, without the lock owners' tokens: whoever holds an
/// owner token can release or extend that lock, so it stays with the holder. Every `owner`
/// field is dropped wherever it sits, so a change of the state's layout cannot bring one back.
fn state_view(member: &Context) -> serde_json::Value {
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
