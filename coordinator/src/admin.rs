//! The operators' API: create, restock, close and re-buffer SKUs at run time, and read the whole
//! cluster. Served by every member; changes are made by the leader (a follower answers 421 with
//! the leader's address), ledger first, then raft, so a retried call finishes a half-done one:
//! every change is idempotent (restock names the new total, closing twice is closing once).
//!
//! `/admin/blacklist` lists, adds and removes blacklisted users and addresses in the fleet's
//! blacklist store (Redis next to a Redis ledger); nodes pick changes up within a sync period.
//!
//! Every call needs `Authorization: Bearer <token>`; the token comes from `SECKILL_ADMIN_TOKEN`
//! or `[coordinator] admin_token`. A missing or wrong token is 401 and changes nothing; without a
//! configured token the API is off (403).

use std::collections::BTreeMap;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use ledger::{Created, LedgerError, SkuId, SkuStatus};
use protocol::{Buffer, SkuTerms, TOTAL_MAX};
use serde::Deserialize;
use serde_json::json;

use safeguards::blacklist::Entry;

use crate::http::{json, Body, ADMIN_BODY_TIMEOUT};
use crate::member::{MemberInner, WriteError};
use crate::state::{Command, Outcome};

/// An admin body is a few hundred bytes; anything near this is not one.
const BODY_BYTES_MAX: usize = 16 * 1024;

/// One change to one SKU, `PUT /admin/skus/{sku}`.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Change {
    /// Defines the SKU on these terms (the same shape and rules as a `[[skus]]` table).
    Create(SkuTerms),
    /// Raises the total to `total`, and with any of `price`, `currency`, `pay_timeout_s` sets
    /// the terms later sales are priced on (orders already sold keep theirs).
    Restock {
        total: u64,
        #[serde(default)]
        price: Option<u64>,
        #[serde(default)]
        currency: Option<String>,
        #[serde(default)]
        pay_timeout_s: Option<u64>,
    },
    Close,
    SetBuffer {
        buffer: Buffer,
    },
}

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

/// Routes `/admin/*`; `None` for paths outside it.
pub async fn route(member: &MemberInner, request: Request<Incoming>) -> Option<Response<Body>> {
    let path = request.uri().path().to_string();
    let rest = path.strip_prefix("/admin/")?;
    if let Err(refused) = authorize(member, &request) {
        metrics::counter!("seckill_coordinator_admin_refused_total", "member" => member.name.clone()).increment(1);
        let mut response = refused.into_response();
        response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Some(response);
    }
    let method = request.method().clone();
    let result = match (method, rest) {
        (Method::GET, "cluster") => cluster(member).await,
        (Method::GET, "blacklist") => list_blacklist(member).await,
        (Method::PUT | Method::DELETE, "blacklist") => change_blacklist(member, request).await,
        (Method::PUT, _) if rest.starts_with("skus/") => change(member, &rest["skus/".len()..], request).await,
        (Method::PUT, _) if rest.starts_with("members/") => {
            change_member(member, &rest["members/".len()..], request).await
        }
        (_, "blacklist") => {
            Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use GET, PUT or DELETE"))
        }
        (_, "cluster") => Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use GET")),
        (_, _) if rest.starts_with("skus/") => {
            Err(Refused::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use PUT"))
        }
        _ => Err(Refused::new(StatusCode::NOT_FOUND, "not_found", "see README.md, \"Admin API\"")),
    };
    Some(result.unwrap_or_else(Refused::into_response))
}

fn authorize(member: &MemberInner, request: &Request<Incoming>) -> Result<(), Refused> {
    let Some(expected) = member.config.admin_token.as_ref() else {
        return Err(Refused::new(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "no admin token is configured; set SECKILL_ADMIN_TOKEN or [coordinator] admin_token",
        ));
    };
    let given = protocol::credential::bearer_of(request.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes));
    // Fixed-length digests compared in constant time: how long the check takes tells a caller
    // neither how much of the token it guessed right nor how long the token is.
    if protocol::credential::accepts(&[expected.digest()], given) {
        Ok(())
    } else {
        Err(Refused::new(StatusCode::UNAUTHORIZED, "unauthorized", "a valid Authorization: Bearer token is required"))
    }
}

async fn change(member: &MemberInner, sku: &str, request: Request<Incoming>) -> Result<Response<Body>, Refused> {
    let sku = SkuId::new(sku).map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_sku", e.to_string()))?;
    let body = read_body(request).await?;
    let change: Change = serde_json::from_slice(&body)
        .map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    // A price left out would silently be 0 and every order of the SKU free: a create names its
    // price, and 0 is then a giveaway someone chose.
    if matches!(change, Change::Create(_)) && !names_price(&body) {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            "price_required",
            "price: a created SKU names its price in minor units (0 for a giveaway)",
        ));
    }
    if !member.is_leader() {
        let leader = member.leader_addr();
        return Err(write_refusal(WriteError::NotLeader(leader)));
    }
    let op = match &change {
        Change::Create { .. } => "create",
        Change::Restock { .. } => "restock",
        Change::Close => "close",
        Change::SetBuffer { .. } => "set_buffer",
    };
    let (status, terms, ledger) = match change {
        Change::Create(terms) => create(member, &sku, terms).await?,
        Change::Restock { total, price, currency, pay_timeout_s } => {
            let (status, terms, ledger) = restock(member, &sku, total).await?;
            match (price, currency, pay_timeout_s) {
                (None, None, None) => (status, terms, ledger),
                (price, currency, pay_timeout_s) => {
                    let pricing = ledger::Pricing {
                        price: price.unwrap_or(terms.price),
                        currency: currency.unwrap_or(terms.currency),
                        pay_timeout_s: pay_timeout_s.unwrap_or(terms.pay_timeout_s),
                    };
                    (status, set_pricing(member, &sku, pricing).await?, ledger)
                }
            }
        }
        Change::Close => {
            defined_terms(member, &sku)?;
            let ledger = member.ledger.close(&sku).await.map_err(ledger_refusal)?;
            let terms = write_terms(member, Command::Close { sku: sku.clone() }).await?;
            (StatusCode::OK, terms, ledger)
        }
        Change::SetBuffer { buffer } => {
            defined_terms(member, &sku)?;
            let terms = write_terms(member, Command::SetBuffer { sku: sku.clone(), buffer }).await?;
            let ledger = member.ledger.status(&sku).await.map_err(ledger_refusal)?;
            (StatusCode::OK, terms, ledger)
        }
    };
    tracing::info!(%sku, op, ?terms, "admin change");
    metrics::counter!("seckill_coordinator_admin_changes_total", "member" => member.name.clone(), "op" => op)
        .increment(1);
    Ok(json(status, &json!({ "sku": sku, "terms": terms, "ledger": ledger })))
}

async fn create(
    member: &MemberInner,
    sku: &SkuId,
    terms: SkuTerms,
) -> Result<(StatusCode, SkuTerms, SkuStatus), Refused> {
    if let Err(invalid) = terms.validate() {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", invalid.to_string()));
    }
    if terms.closed {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", "closed: a SKU is created open"));
    }
    if let Some(existing) = member.store.read().state.catalogue.terms(sku).cloned() {
        if existing == terms {
            let ledger = member.ledger.status(sku).await.map_err(ledger_refusal)?;
            return Ok((StatusCode::OK, existing, ledger));
        }
        return Err(Refused::new(
            StatusCode::CONFLICT,
            "sku_exists",
            "the SKU exists with other terms; use restock, close or set_buffer",
        ));
    }
    let ledger = match member.ledger.create_sku(sku, &terms).await.map_err(ledger_refusal)? {
        Created::New(status) => status,
        // A retry after a create whose raft write failed finds its own ledger; anything else is
        // another sale's ledger and must not be adopted.
        Created::Existing(status)
            if status.total == terms.total
                && status.per_user_limit == terms.per_user_limit
                && status.require_token == terms.require_token =>
        {
            status
        }
        Created::Existing(_) => {
            return Err(Refused::new(
                StatusCode::CONFLICT,
                "ledger_exists",
                "the ledger already holds this SKU with other figures; it was left unchanged",
            ))
        }
    };
    let starting = starting_allotments(member, &terms);
    let command = Command::DefineSku { sku: sku.clone(), starting, terms: terms.clone() };
    member.write(command).await.map_err(write_refusal)?;
    Ok((StatusCode::CREATED, terms, ledger))
}

/// Whether a create's body names `price` (its value is checked by the terms' rules).
fn names_price(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|value| value.get("price").is_some())
}

/// Sets the terms later sales are priced on: the ledger first (its order events carry them from
/// the next sale on), then raft, so the catalogue the order services and nodes follow agrees.
async fn set_pricing(member: &MemberInner, sku: &SkuId, pricing: ledger::Pricing) -> Result<SkuTerms, Refused> {
    let current = defined_terms(member, sku)?;
    let proposed = SkuTerms {
        price: pricing.price,
        currency: pricing.currency.clone(),
        pay_timeout_s: pricing.pay_timeout_s,
        ..current
    };
    if let Err(invalid) = proposed.validate() {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", invalid.to_string()));
    }
    member.ledger.set_pricing(sku, &pricing).await.map_err(ledger_refusal)?;
    let command = Command::SetPricing {
        sku: sku.clone(),
        price: pricing.price,
        currency: pricing.currency,
        pay_timeout_s: pricing.pay_timeout_s,
    };
    write_terms(member, command).await
}

/// Splits the total evenly over the live nodes, each with its buffer on top; nodes that join
/// later are served by the leader's top-up.
fn starting_allotments(member: &MemberInner, terms: &SkuTerms) -> BTreeMap<ledger::NodeId, u64> {
    let live: Vec<_> = member.store.read().state.live_nodes().map(|(id, _)| id.clone()).collect();
    crate::policy::even_starting(terms.total, &live, terms.buffer)
}

async fn restock(member: &MemberInner, sku: &SkuId, total: u64) -> Result<(StatusCode, SkuTerms, SkuStatus), Refused> {
    let terms = defined_terms(member, sku)?;
    if terms.closed {
        return Err(Refused::new(StatusCode::CONFLICT, "closed", "the sale is closed"));
    }
    if total > TOTAL_MAX {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", "total must be at most 2^53 - 1"));
    }
    let current = member.ledger.status(sku).await.map_err(ledger_refusal)?;
    if total < current.total {
        return Err(Refused::new(
            StatusCode::CONFLICT,
            "total_below_current",
            format!("the total is {} already; restock only raises it", current.total),
        ));
    }
    let ledger = member.ledger.restock_to(sku, total).await.map_err(ledger_refusal)?;
    let terms = write_terms(member, Command::Restock { sku: sku.clone(), total }).await?;
    Ok((StatusCode::OK, terms, ledger))
}

fn defined_terms(member: &MemberInner, sku: &SkuId) -> Result<SkuTerms, Refused> {
    member
        .store
        .read()
        .state
        .catalogue
        .terms(sku)
        .cloned()
        .ok_or_else(|| Refused::new(StatusCode::NOT_FOUND, "unknown_sku", format!("no SKU {sku} is defined")))
}

async fn write_terms(member: &MemberInner, command: Command) -> Result<SkuTerms, Refused> {
    match member.write(command).await.map_err(write_refusal)? {
        Outcome::Terms(terms) => Ok(terms),
        Outcome::UnknownSku => Err(Refused::new(StatusCode::NOT_FOUND, "unknown_sku", "no such SKU is defined")),
        other => Err(Refused::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("unexpected {other:?}"))),
    }
}

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
async fn change_blacklist(member: &MemberInner, request: Request<Incoming>) -> Result<Response<Body>, Refused> {
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
        let version = member.blacklist.add(&entry, ttl).await.map_err(unavailable)?;
        json!({ "entry": entry.to_string(), "ttl_s": change.ttl_s, "version": version })
    } else {
        let removed = member.blacklist.remove(&entry).await.map_err(unavailable)?;
        json!({ "entry": entry.to_string(), "removed": removed })
    };
    tracing::info!(%entry, op, "admin change");
    metrics::counter!("seckill_coordinator_admin_changes_total", "member" => member.name.clone(), "op" => op)
        .increment(1);
    Ok(json(StatusCode::OK, &answer))
}

async fn list_blacklist(member: &MemberInner) -> Result<Response<Body>, Refused> {
    let snapshot = member
        .blacklist
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

/// `PUT /admin/members/{name}`: one step of replacing a member (see `crate::membership`).
async fn change_member(
    member: &MemberInner,
    name: &str,
    request: Request<Incoming>,
) -> Result<Response<Body>, Refused> {
    let body = read_body(request).await?;
    let change: crate::membership::MemberChange = serde_json::from_slice(&body).map_err(|e| {
        Refused::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{e}; expected {{\"op\": \"remove\" | \"add_learner\" | \"promote\"}}"),
        )
    })?;
    use crate::membership::ChangeError;
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
        tokio::time::timeout(ADMIN_BODY_TIMEOUT, Limited::new(request.into_body(), BODY_BYTES_MAX).collect()).await;
    let too_slow = || {
        Refused::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the body must arrive within {ADMIN_BODY_TIMEOUT:?}"),
        )
    };
    Ok(collected
        .map_err(|_| too_slow())?
        .map_err(|_| {
            Refused::new(StatusCode::BAD_REQUEST, "bad_body", format!("the body must be under {BODY_BYTES_MAX} bytes"))
        })?
        .to_bytes())
}

/// `GET /admin/cluster`: raft, nodes (epochs, leases, worker ids, grants, last reports) and
/// every SKU's terms with the ledger's figures.
async fn cluster(member: &MemberInner) -> Result<Response<Body>, Refused> {
    let status = member.status();
    let state = status.applied.state.clone();
    let mut skus = serde_json::Map::new();
    for (sku, entry) in &state.catalogue.skus {
        let ledger = match member.ledger.status(sku).await {
            Ok(status) => json!(status),
            Err(e) => json!({ "error": e.to_string() }),
        };
        let granted: u64 = state.live_nodes().filter_map(|(_, record)| record.granted.get(sku)).sum();
        skus.insert(
            sku.to_string(),
            json!({ "terms": entry.terms, "starting": entry.starting, "granted_to_live_nodes": granted, "ledger": ledger }),
        );
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
