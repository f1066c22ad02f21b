//! `PUT /admin/skus/{sku}`: create, restock (and reprice), close and re-buffer a SKU, and `GET`
//! of one SKU; a striped SKU (`crate::stripes`) is read and changed as one. Each change goes to
//! the ledger first, then through raft, and is idempotent, so a retried call finishes a
//! half-done one.

use std::collections::BTreeMap;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use ledger::{Created, SkuId, SkuStatus};
use protocol::{Buffer, SkuTerms, TOTAL_MAX};
use serde::Deserialize;
use serde_json::json;

use super::{ledger_refusal, read_body, write_refusal, Refused};
use crate::context::{Context, WriteError};
use crate::http::body::{json, Body};
use crate::state::{Command, Outcome, Skipped};

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

pub(super) async fn change(member: &Context, sku: &str, request: Request<Incoming>) -> Result<Response<Body>, Refused> {
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
    let op = change.op();
    let (status, terms, ledger) = apply(member, &sku, change).await?;
    let terms = whole(member, &sku, terms);
    tracing::info!(%sku, op, ?terms, "admin change");
    metrics::counter!("seckill_coordinator_admin_changes_total", "member" => member.name().to_string(), "op" => op)
        .increment(1);
    Ok(json(status, &json!({ "sku": sku, "terms": terms, "ledger": ledger })))
}

/// What one change answers with: the status, the SKU's terms after it, the ledger's figures.
type Changed = (StatusCode, SkuTerms, SkuStatus);

impl Change {
    /// The change's name in logs and the `op` label of `seckill_coordinator_admin_changes_total`.
    fn op(&self) -> &'static str {
        match self {
            Change::Create { .. } => "create",
            Change::Restock { .. } => "restock",
            Change::Close => "close",
            Change::SetBuffer { .. } => "set_buffer",
        }
    }
}

/// Makes `change` on the leader: the ledger first, then raft.
async fn apply(member: &Context, sku: &SkuId, change: Change) -> Result<Changed, Refused> {
    match change {
        Change::Create(terms) => create(member, sku, terms).await,
        Change::Restock { total, price, currency, pay_timeout_s } => {
            let (status, terms, ledger) = restock(member, sku, total).await?;
            match (price, currency, pay_timeout_s) {
                (None, None, None) => Ok((status, terms, ledger)),
                (price, currency, pay_timeout_s) => {
                    let pricing = ledger::Pricing {
                        price: price.unwrap_or(terms.price),
                        currency: currency.unwrap_or(terms.currency),
                        pay_timeout_s: pay_timeout_s.unwrap_or(terms.pay_timeout_s),
                    };
                    Ok((status, set_pricing(member, sku, pricing).await?, ledger))
                }
            }
        }
        Change::Close => {
            let terms = defined_terms(member, sku)?;
            for index in 0..terms.stripes.max(1) {
                member.ledger().close(&sku.stripe(index)).await.map_err(ledger_refusal)?;
            }
            let terms = write_terms(member, Command::Close { sku: sku.clone() }).await?;
            Ok((StatusCode::OK, terms, ledger_status(member, sku).await?))
        }
        Change::SetBuffer { buffer } => {
            defined_terms(member, sku)?;
            let terms = write_terms(member, Command::SetBuffer { sku: sku.clone(), buffer }).await?;
            Ok((StatusCode::OK, terms, ledger_status(member, sku).await?))
        }
    }
}

async fn create(member: &Context, sku: &SkuId, terms: SkuTerms) -> Result<Changed, Refused> {
    if let Err(invalid) = terms.validate() {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", invalid.to_string()));
    }
    if terms.closed {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", "closed: a SKU is created open"));
    }
    if terms.stripes > 1 {
        return create_striped(member, sku, terms).await;
    }
    if let Some(existing) = member.applied_state().catalogue.terms(sku).cloned() {
        if existing == terms {
            let ledger = member.ledger().status(sku).await.map_err(ledger_refusal)?;
            return Ok((StatusCode::OK, existing, ledger));
        }
        return Err(Refused::new(
            StatusCode::CONFLICT,
            "sku_exists",
            "the SKU exists with other terms; use restock, close or set_buffer",
        ));
    }
    let ledger = create_ledger(member, sku, &terms).await?;
    let starting = starting_allotments(member, &terms);
    let command = Command::DefineSku { sku: sku.clone(), starting, terms: terms.clone() };
    member.write(command).await.map_err(write_refusal)?;
    Ok((StatusCode::CREATED, terms, ledger))
}

/// Creates the ledger of `sku` (a SKU or one stripe of it) on `terms`, or adopts the one a
/// half-done earlier create left.
async fn create_ledger(member: &Context, sku: &SkuId, terms: &SkuTerms) -> Result<SkuStatus, Refused> {
    Ok(match member.ledger().create_sku(sku, terms).await.map_err(ledger_refusal)? {
        Created::New(status) => status,
        // A retry after a create whose raft write failed finds its own ledger; anything else is
        // another sale's ledger and must not be adopted.
        Created::Existing(status)
            if status.total == terms.total
                && status.per_user_limit == terms.per_user_limit
                && status.require_token == terms.requires_token() =>
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
    })
}

/// Creates a striped SKU: the ledger of each stripe, then its catalogue entry, stripe by stripe
/// (`SkuTerms::stripe_terms`), so nodes see each stripe as a SKU. A retry defines the stripes a
/// half-done create left out; the SKU is the same if its terms and total are.
async fn create_striped(member: &Context, sku: &SkuId, terms: SkuTerms) -> Result<Changed, Refused> {
    let state = member.applied_state();
    let stripes = terms.stripe_terms();
    if let Some(existing) = state.catalogue.terms(sku) {
        // Until every stripe is defined, no transfer has moved a unit: stripe 0 is as created.
        let whole = (0..terms.stripes).all(|index| state.catalogue.contains(&sku.stripe(index)));
        let total = state.stripes.skus.get(sku).map_or(existing.total, |striped| striped.total);
        let same = if whole { (SkuTerms { total, ..existing.clone() }) == terms } else { existing == &stripes[0] };
        if !same {
            return Err(Refused::new(
                StatusCode::CONFLICT,
                "sku_exists",
                "the SKU exists with other terms; use restock, close or set_buffer",
            ));
        }
    }
    let mut status = StatusCode::OK;
    for (index, stripe_terms) in (0..).zip(stripes) {
        let stripe = sku.stripe(index);
        if state.catalogue.contains(&stripe) {
            continue;
        }
        create_ledger(member, &stripe, &stripe_terms).await?;
        let starting = starting_allotments(member, &stripe_terms);
        let command = Command::DefineSku { sku: stripe, starting, terms: stripe_terms };
        member.write(command).await.map_err(write_refusal)?;
        status = StatusCode::CREATED;
    }
    Ok((status, terms, ledger_status(member, sku).await?))
}

/// The ledger's figures of `sku`, summed over its stripes if it has several.
async fn ledger_status(member: &Context, sku: &SkuId) -> Result<SkuStatus, Refused> {
    Ok(crate::stripes::view(member, sku).await.map_err(ledger_refusal)?.ledger)
}

/// Whether a create's body names `price` (its value is checked by the terms' rules).
fn names_price(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|value| value.get("price").is_some())
}

/// Sets the terms later sales are priced on: the ledger first (its order events carry them from
/// the next sale on), then raft, so the catalogue the order services and nodes follow agrees.
async fn set_pricing(member: &Context, sku: &SkuId, pricing: ledger::Pricing) -> Result<SkuTerms, Refused> {
    let current = defined_terms(member, sku)?;
    let proposed = SkuTerms {
        price: pricing.price,
        currency: pricing.currency.clone(),
        pay_timeout_s: pricing.pay_timeout_s,
        ..current.clone()
    };
    if let Err(invalid) = proposed.validate() {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", invalid.to_string()));
    }
    for index in 0..current.stripes.max(1) {
        member.ledger().set_pricing(&sku.stripe(index), &pricing).await.map_err(ledger_refusal)?;
    }
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
fn starting_allotments(member: &Context, terms: &SkuTerms) -> BTreeMap<ledger::NodeId, u64> {
    let live: Vec<_> = member.applied_state().live_nodes().map(|(id, _)| id.clone()).collect();
    crate::policy::even_starting(terms.total, &live, terms.buffer)
}

async fn restock(member: &Context, sku: &SkuId, total: u64) -> Result<Changed, Refused> {
    let terms = defined_terms(member, sku)?;
    if terms.closed {
        return Err(Refused::new(StatusCode::CONFLICT, "closed", "the sale is closed"));
    }
    if total > TOTAL_MAX {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "bad_request", "total must be at most 2^53 - 1"));
    }
    if terms.stripes > 1 {
        return restock_striped(member, sku, total).await;
    }
    let current = member.ledger().status(sku).await.map_err(ledger_refusal)?;
    if total < current.total {
        return Err(Refused::new(
            StatusCode::CONFLICT,
            "total_below_current",
            format!("the total is {} already; restock only raises it", current.total),
        ));
    }
    let ledger = member.ledger().restock_to(sku, total).await.map_err(ledger_refusal)?;
    let terms = write_terms(member, Command::Restock { sku: sku.clone(), total }).await?;
    Ok((StatusCode::OK, terms, ledger))
}

/// Attempts at taking a transfer id while the leader's own transfers take them too.
const RESTOCK_ATTEMPTS: usize = 5;

/// Restocks a striped SKU to `total`: the units it adds go into stripe 0 as a transfer with no
/// source, recorded in raft before the ledger sees them, so a retried or half-done restock adds
/// them once (an absolute total per stripe would undo the transfers between stripes).
async fn restock_striped(member: &Context, sku: &SkuId, total: u64) -> Result<Changed, Refused> {
    for _ in 0..RESTOCK_ATTEMPTS {
        let state = member.applied_state();
        let current = state.stripes.skus.get(sku).map_or(0, |striped| striped.total);
        if total < current {
            return Err(Refused::new(
                StatusCode::CONFLICT,
                "total_below_current",
                format!("the total is {current} already; restock only raises it"),
            ));
        }
        if total == current {
            let terms = defined_terms(member, sku)?;
            return Ok((StatusCode::OK, terms, ledger_status(member, sku).await?));
        }
        let (id, units) = (state.stripes.next_id, total - current);
        match member.write(Command::RestockStarted { id, sku: sku.clone(), units }).await.map_err(write_refusal)? {
            Outcome::Transferred => credit(member, sku, id, units).await,
            // The leader's transfer loop took the id first: read the state again.
            Outcome::TransferSkipped(Skipped::Stale) => continue,
            other => return Err(Refused::new(StatusCode::CONFLICT, "not_striped", format!("refused: {other:?}"))),
        }
    }
    Err(Refused::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "transfer ids kept being taken; retry"))
}

/// Puts a recorded restock's units into stripe 0. A failure leaves the credit in flight, and the
/// leader's transfer loop finishes it within a tick; the total counts it already.
async fn credit(member: &Context, sku: &SkuId, id: u64, units: u64) {
    let credit = crate::state::Transfer { sku: sku.clone(), from: None, to: 0, most: units, debited: Some(units) };
    if let Err(e) = crate::stripes::finish(member, id, &credit).await {
        tracing::warn!(%sku, id, units, "restock credit left in flight: {e}");
    }
}

/// The terms of `sku` as its operators named them: a striped SKU's catalogue entries each hold
/// one stripe's total, the SKU's total is theirs and its units in flight together.
fn defined_terms(member: &Context, sku: &SkuId) -> Result<SkuTerms, Refused> {
    let terms = member
        .applied_state()
        .catalogue
        .terms(sku)
        .cloned()
        .ok_or_else(|| Refused::new(StatusCode::NOT_FOUND, "unknown_sku", format!("no SKU {sku} is defined")))?;
    Ok(whole(member, sku, terms))
}

/// `terms` of stripe 0 with the total of the whole SKU, if it is striped.
fn whole(member: &Context, sku: &SkuId, terms: SkuTerms) -> SkuTerms {
    match member.applied_state().stripes.skus.get(sku) {
        Some(striped) => SkuTerms { total: striped.total, ..terms },
        None => terms,
    }
}

/// `GET /admin/skus/{sku}`: the SKU's terms and ledger figures; a striped SKU's summed over its
/// stripes, with each stripe's figures, its units in flight and the transfers so far.
pub(super) async fn status(member: &Context, sku: &str) -> Result<Response<Body>, Refused> {
    let sku = SkuId::new(sku).map_err(|e| Refused::new(StatusCode::BAD_REQUEST, "bad_sku", e.to_string()))?;
    let terms = defined_terms(member, &sku)?;
    let view = crate::stripes::view(member, &sku).await.map_err(ledger_refusal)?;
    let ledger = &view.ledger;
    Ok(json(
        StatusCode::OK,
        &json!({
            "sku": sku, "terms": terms, "total": ledger.total, "sold": ledger.sold, "remaining": ledger.remaining,
            "released": ledger.released, "orders": ledger.orders, "closed": ledger.closed,
            "in_flight": view.in_flight, "transfers": view.transfers, "transferred_units": view.transferred_units,
            "stripes": view.stripes,
        }),
    ))
}

async fn write_terms(member: &Context, command: Command) -> Result<SkuTerms, Refused> {
    match member.write(command).await.map_err(write_refusal)? {
        Outcome::Terms(terms) => Ok(terms),
        Outcome::UnknownSku => Err(Refused::new(StatusCode::NOT_FOUND, "unknown_sku", "no such SKU is defined")),
        other => Err(Refused::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("unexpected {other:?}"))),
    }
}
