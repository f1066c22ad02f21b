//! `/admin/blacklist`: lists, adds and removes blacklisted users and addresses in the fleet's
//! blacklist store. Changes go straight to the store (Redis), not through raft: nodes read them
//! from there, and any member may make them.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use safeguards::blacklist::Entry;
use serde::Deserialize;
use serde_json::json;

use super::{read_body, Refused};
use crate::context::Context;
use crate::http::body::{json, Body};

/// One blacklist change: `PUT` adds (for `ttl_s`, or until removed), `DELETE` removes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlacklistChange {
    /// `user:<id>` or `ip:<address>`.
    entry: String,
    ttl_s: Option<u64>,
}

/// Blacklist changes go straight to the store (Redis), not through raft: nodes read them from
/// there, and any member may make them.
pub(super) async fn change(member: &Context, request: Request<Incoming>) -> Result<Response<Body>, Refused> {
    let method = request.method().clone();
    let body = read_body(request).await?;
    let change: BlacklistChange = serde_json::from_slice(&body)
        .map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    let entry: Entry =
        change.entry.parse().map_err(|e: String| Refused::new(StatusCode::BAD_REQUEST, "bad_entry", e))?;
    if let Entry::User(user) = &entry {
        ledger::UserId::new(user).map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_entry", e.to_string()))?;
    }
    let unavailable = |e: safeguards::blacklist::StoreError| {
        Refused::new(StatusCode::SERVICE_UNAVAILABLE, "blacklist_unavailable", e.to_string())
    };
    let op = if method == Method::PUT { "blacklist_add" } else { "blacklist_remove" };
    let answer = if method == Method::PUT {
        if change.ttl_s == Some(0) {
            return Err(Refused::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "ttl_s must be above zero (omit it for no expiry)",
            ));
        }
        let ttl = change.ttl_s.map(std::time::Duration::from_secs);
        let version = member.blacklist().add(&entry, ttl).await.map_err(unavailable)?;
        json!({ "entry": entry.to_string(), "ttl_s": change.ttl_s, "version": version })
    } else {
        let removed = member.blacklist().remove(&entry).await.map_err(unavailable)?;
        json!({ "entry": entry.to_string(), "removed": removed })
    };
    tracing::info!(%entry, op, "admin change");
    metrics::counter!("seckill_coordinator_admin_changes_total", "member" => member.name().to_string(), "op" => op)
        .increment(1);
    Ok(json(StatusCode::OK, &answer))
}

pub(super) async fn list(member: &Context) -> Result<Response<Body>, Refused> {
    let snapshot = member
        .blacklist()
        .load()
        .await
        .map_err(|e| Refused::new(StatusCode::SERVICE_UNAVAILABLE, "blacklist_unavailable", e.to_string()))?;
    let entries: Vec<_> = snapshot
        .entries
        .iter()
        .map(|(entry, remaining)| json!({ "entry": entry.to_string(), "remaining_s": remaining.map(|r| r.as_secs()) }))
        .collect();
    Ok(json(StatusCode::OK, &json!({ "version": snapshot.version, "entries": entries })))
}
