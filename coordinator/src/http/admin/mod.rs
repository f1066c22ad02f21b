//! The operators' API: create, restock, close and re-buffer SKUs at run time, read one SKU (a
//! striped SKU as one, with its stripes), and read the whole cluster. Served by every member;
//! changes are made by the leader (a follower answers 421 with the leader's address), ledger
//! first, then raft, so a retried call finishes a half-done one: every change is idempotent
//! (restock names the new total, closing twice is closing once).
//!
//! `/admin/blacklist` lists, adds and removes blacklisted users and addresses in the fleet's
//! blacklist store (Redis next to a Redis ledger); nodes pick changes up within a sync period.
//!
//! Every call needs `Authorization: Bearer <token>`; the token comes from `SECKILL_ADMIN_TOKEN`
//! or `[coordinator] admin_token`. A missing or wrong token is 401 and changes nothing; without a
//! configured token the API is off (403).
//!
//! Layout: this module authenticates, routes, reads bodies and answers refusals; [`skus`] changes
//! the catalogue (ledger first, then raft), [`blacklist`] the blacklist store; membership
//! changes go to `crate::membership`.

mod blacklist;
mod orders;
mod skus;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use ledger::LedgerError;
use serde_json::json;

use super::body::{json, Body, BODY_TIMEOUT};
use crate::context::{AdminAccess, Context, WriteError};
use crate::membership::{ChangeError, MemberChange};

/// An admin body is a few hundred bytes; anything near this is not one.
const BODY_BYTES_MAX: usize = 16 * 1024;

/// A refusal: status, a stable code, a sentence for the operator, and for 421 the leader's
/// address (so a client can send the call there without parsing the sentence).
struct Refused(StatusCode, &'static str, String, Option<String>);

impl Refused {
    fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Refused(status, error, message.into(), None)
    }

    fn into_response(self) -> Response<Body> {
        match self.3 {
            Some(leader) => json(self.0, &json!({ "error": self.1, "message": self.2, "leader": leader })),
            None => json(self.0, &json!({ "error": self.1, "message": self.2 })),
        }
    }
}

fn ledger_refusal(e: LedgerError) -> Refused {
    match e {
        LedgerError::Missing(sku) => {
            Refused::new(StatusCode::CONFLICT, "ledger_missing", format!("the ledger has no record of {sku}"))
        }
        other => Refused::new(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable", other.to_string()),
    }
}

fn write_refusal(e: WriteError) -> Refused {
    match e {
        WriteError::NotLeader(leader) => Refused(
            StatusCode::MISDIRECTED_REQUEST,
            "not_leader",
            leader
                .as_ref()
                .map_or("no leader is known yet; retry".to_string(), |addr| format!("send it to the leader at {addr}")),
            leader,
        ),
        WriteError::Unavailable(reason) => Refused::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", reason),
    }
}

/// Routes `/admin/{rest}`.
pub(super) async fn route(member: &Context, rest: &str, request: Request<Incoming>) -> Response<Body> {
    if let Err(refused) = authorize(member, &request) {
        metrics::counter!("seckill_coordinator_admin_refused_total", "member" => member.name().to_string())
            .increment(1);
        let mut response = refused.into_response();
        response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let method = request.method().clone();
    let result = match (method, rest) {
        (Method::GET, "cluster") => cluster(member).await,
        (Method::GET, "blacklist") => blacklist::list(member).await,
        (Method::PUT | Method::DELETE, "blacklist") => blacklist::change(member, request).await,
        (Method::PUT, _) if rest.starts_with("skus/") => skus::change(member, &rest["skus/".len()..], request).await,
        (Method::GET, _) if rest.starts_with("skus/") => skus::status(member, &rest["skus/".len()..]).await,
        (Method::PUT, _) if rest.starts_with("members/") => {
            change_member(member, &rest["members/".len()..], request).await
        }
        (_, "blacklist") => {
            Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use GET, PUT or DELETE"))
        }
        (_, "cluster") => Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use GET")),
        (_, _) if rest.starts_with("skus/") => {
            Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use GET or PUT"))
        }
        _ => Err(Refused::new(StatusCode::NOT_FOUND, "not_found", "see README.md, \"Admin API\"")),
    };
    result.unwrap_or_else(Refused::into_response)
}

fn authorize(member: &Context, request: &Request<Incoming>) -> Result<(), Refused> {
    match member.admin_access(request.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
        AdminAccess::Granted => Ok(()),
        AdminAccess::Disabled => Err(Refused::new(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "no admin token is configured; set SECKILL_ADMIN_TOKEN or [coordinator] admin_token",
        )),
        AdminAccess::Unauthorized => Err(Refused::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid Authorization: Bearer token is required",
        )),
    }
}

/// `PUT /admin/members/{name}`: one step of replacing a member (see `crate::membership`).
async fn change_member(member: &Context, name: &str, request: Request<Incoming>) -> Result<Response<Body>, Refused> {
    let body = read_body(request).await?;
    let change: MemberChange = serde_json::from_slice(&body).map_err(|e| {
        Refused::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{e}; expected {{\"op\": \"remove\" | \"add_learner\" | \"promote\"}}"),
        )
    })?;
    match crate::membership::change(member, name, change).await {
        Ok(membership) => {
            tracing::warn!(member = name, ?change, ?membership, "coordinator membership changed");
            Ok(json(StatusCode::OK, &json!({ "member": name, "membership": membership })))
        }
        Err(ChangeError::UnknownMember(_)) => Err(Refused::new(
            StatusCode::NOT_FOUND,
            "unknown_member",
            format!("{name} is not in [coordinator] members"),
        )),
        Err(ChangeError::NotLeader(leader)) => Err(write_refusal(WriteError::NotLeader(leader))),
        Err(ChangeError::Refused(reason)) => Err(Refused::new(StatusCode::CONFLICT, "refused", reason)),
        Err(ChangeError::Unavailable(reason)) => {
            Err(Refused::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", reason))
        }
    }
}

async fn read_body(request: Request<Incoming>) -> Result<bytes::Bytes, Refused> {
    let collected =
        tokio::time::timeout(BODY_TIMEOUT, Limited::new(request.into_body(), BODY_BYTES_MAX).collect()).await;
    let too_slow = || {
        Refused::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the body must arrive within {BODY_TIMEOUT:?}"),
        )
    };
    Ok(collected
        .map_err(|_| too_slow())?
        .map_err(|_| {
            Refused::new(StatusCode::BAD_REQUEST, "bad_body", format!("the body must be under {BODY_BYTES_MAX} bytes"))
        })?
        .to_bytes())
}

/// A SKU's waiting room for operators: its line, admissions and live tickets, and the draw.
async fn room_view(member: &Context, sku: &protocol::SkuId) -> serde_json::Value {
    match member.ledger().room_figures(sku).await {
        Ok(Some(room)) => json!({
            "line": room.waiting,
            "admitted": room.admitted,
            "live_tickets": room.live,
            "draw": room.draw.map(|draw| json!({ "seed": draw.seed, "at_ms": draw.at_ms, "placed": draw.placed })),
        }),
        Ok(None) => json!({ "line": 0, "admitted": 0, "live_tickets": 0, "draw": null }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// `GET /admin/cluster`: raft, nodes (epochs, leases, worker ids, grants, last reports) and
/// every SKU's terms with the ledger's figures.
async fn cluster(member: &Context) -> Result<Response<Body>, Refused> {
    let status = member.status();
    let state = status.applied.state.clone();
    let orders = match member.orders_api() {
        Some(addr) => Some(orders::orders_by_state(addr).await),
        None => None,
    };
    let mut skus = serde_json::Map::new();
    for (sku, entry) in &state.catalogue.skus {
        let ledger = match member.ledger().status(sku).await {
            Ok(status) => json!(status),
            Err(e) => json!({ "error": e.to_string() }),
        };
        let granted: u64 = state.live_nodes().filter_map(|(_, record)| record.granted.get(sku)).sum();
        let mut view = json!({ "terms": entry.terms, "starting": entry.starting, "granted_to_live_nodes": granted, "ledger": ledger });
        if entry.terms.waiting_room.is_some() {
            view["room"] = room_view(member, sku).await;
        }
        // What the fleet's live nodes were asked for it since they started; the page shows the
        // rate between two reads.
        let requests: u64 = state
            .live_nodes()
            .filter_map(|(_, record)| record.reports.get(sku))
            .map(|report| report.requests)
            .fold(0, u64::wrapping_add);
        view["requests_total"] = json!(requests);
        match &orders {
            Some(Ok(orders)) => view["orders_by_state"] = json!(orders.get(sku.as_str()).cloned().unwrap_or_default()),
            Some(Err(e)) => view["orders_by_state"] = json!({ "error": e }),
            None => {}
        }
        skus.insert(sku.to_string(), view);
    }
    let body = json!({
        "member": status.member,
        "leader": status.leader,
        "membership": crate::membership::view(member),
        "term": status.term,
        "last_log_index": status.last_log_index,
        "nodes": state.fleet.nodes,
        "skus": skus,
    });
    Ok(json(StatusCode::OK, &body))
}
