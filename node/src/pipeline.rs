//! The purchase pipeline of one node (docs/http-api.md, "The order of the checks"): cheap checks
//! from memory first, the stock counter next, and the ledger only for requests that won a local
//! unit. A purchase walks this file alone but for its deliberate calls out (the gate, the SKU's
//! counters, the confirmer); the node's other jobs live beside it: building it (`wiring`),
//! membership's side (`membership`), what it shows (`page`) and the refresher (`refresher`).

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use auth::Authenticator;
use dashmap::DashMap;
use ledger::{IdempotencyKey, NodeId, Purchase, SalesLedger, Seller, SkuId, SubmitToken, UserId};
use tokio::sync::oneshot;
use tracing::{Instrument, Span};

use crate::breaker::{Breaker, BreakerAdmission};
use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::confirmer;
use crate::gate::{Admission, Caller, Gate, Reason};
use crate::membership::Membership;
use crate::metrics::NodeMetrics;
use crate::order_ids::OrderIds;
use crate::outcome::{Code, Outcome};
use crate::shutdown::Shutdown;
use crate::sku::{Allotment, HandOffRefused, Pending, Selling, Sku};
use crate::stripes;

mod membership;
mod page;
mod refresher;
mod wiring;

pub use page::{StockPage, StripePage};
pub use wiring::NodeOptions;

/// Order events read per ledger call, and calls per refresh: a node catches up on 10,000
/// sales per refresh without one call growing large.
const ORDER_PAGE: usize = 1_000;
const ORDER_PAGES_PER_REFRESH: usize = 10;
const _: () = assert!(ORDER_PAGE <= ledger::ORDER_EVENTS_MAX, "the ledger caps a page of order events");
/// Longest a refusal from memory waits for the order stream to be read through after the sale
/// ended; past it the buyer gets 503 and retries. One ledger round trip, with room for a slow one.
const CATCH_UP_MAX: std::time::Duration = std::time::Duration::from_millis(500);
const _: () = assert!(
    crate::config::SOLD_OUT_READ_GAP_MAX.as_millis() * 4 <= CATCH_UP_MAX.as_millis(),
    "a refusal waits out a gap and a read or two before its bound"
);

/// A purchase request whose ids passed validation (`SkuId::validate` and friends), borrowed
/// from the request body: most requests are answered from memory and never need owned ids.
#[derive(Debug, Clone, Copy)]
pub struct PurchaseRequest<'a> {
    pub sku: &'a str,
    pub user: &'a str,
    pub qty: u32,
    pub key: &'a str,
    pub ip: IpAddr,
    /// The `Submit-Token` header, validated (`SubmitToken::validate`), if the client sent one.
    pub token: Option<&'a str>,
    /// The `Ticket` header, if the client sent one: on a SKU behind a waiting room, the token
    /// inside a valid ticket is the purchase's token (and the only one that counts).
    pub ticket: Option<&'a str>,
    /// The request's span when traced, else `Span::none()` (see `telemetry`): passed down
    /// rather than looked up, so an untraced request never asks for the current span.
    pub trace: &'a Span,
}

/// One inventory node. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    config: NodeConfig,
    skus: DashMap<SkuId, Arc<Sku>>,
    ledger: Arc<dyn SalesLedger>,
    clock: Arc<dyn Clock>,
    gate: Arc<dyn Gate>,
    metrics: Arc<NodeMetrics>,
    /// The last ledger call of the status refresher succeeded.
    ledger_reachable: AtomicBool,
    /// Fails winners fast while the ledger keeps failing; the confirmers feed it.
    breaker: Arc<Breaker>,
    shutdown: Shutdown,
    /// Present when a coordinator grants allotments and leases.
    membership: Option<Arc<Membership>>,
    order_ids: OrderIds,
    authenticator: Authenticator,
    rooms: crate::room::Rooms,
    ticket_key: crate::ticket::TicketKey,
}

impl Node {
    pub fn id(&self) -> &NodeId {
        &self.inner.config.id
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    pub(crate) fn metrics(&self) -> &NodeMetrics {
        &self.inner.metrics
    }

    pub(crate) fn ledger(&self) -> &dyn SalesLedger {
        &*self.inner.ledger
    }

    /// The room of `sku` (a buyer's SKU), started on its first use; `None` without one.
    pub(crate) fn room_hub(&self, sku: &Sku) -> Option<Arc<crate::room::hub::Hub>> {
        let inner = &self.inner;
        inner.rooms.hub(sku, &inner.ticket_key, inner.ledger.clone(), &inner.shutdown)
    }

    pub(crate) fn gate(&self) -> &dyn Gate {
        &*self.inner.gate
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        &*self.inner.clock
    }

    pub(crate) fn authenticator(&self) -> &Authenticator {
        &self.inner.authenticator
    }

    pub(crate) fn shutdown_signal(&self) -> &Shutdown {
        &self.inner.shutdown
    }

    pub(crate) fn sku(&self, sku: &str) -> Option<Arc<Sku>> {
        self.inner.skus.get(sku).map(|entry| entry.value().clone())
    }

    /// A SKU a buyer may name: never a stripe past the first, even if the id got through.
    pub(crate) fn buyer_sku(&self, sku: &str) -> Option<Arc<Sku>> {
        self.sku(sku).filter(|sku| !sku.is_stripe())
    }

    pub(crate) fn stripe_reader(&self) -> stripes::Reader<'_> {
        stripes::Reader { ledger: &self.inner.ledger, clock: &self.inner.clock }
    }

    /// The SKU's per-order maximum, for request validation; `None` for an unknown SKU.
    pub fn qty_max(&self, sku: &str) -> Option<u32> {
        self.inner.skus.get(sku).filter(|entry| !entry.is_stripe()).map(|entry| entry.config().terms.qty_max)
    }

    /// Runs the purchase pipeline. Never panics on bad input: everything the client sent was
    /// validated into `request` already, and every other failure is an [`Outcome`].
    pub async fn purchase(&self, request: PurchaseRequest<'_>) -> Outcome {
        if telemetry::traced(request.trace) {
            // Boxed: the untraced future, the one nearly every request polls, stays its size.
            return Box::pin(self.purchase_traced(request)).await;
        }
        self.purchase_counted(request).await
    }

    /// A traced purchase: its decision is a span of its own, under the request's.
    async fn purchase_traced(&self, request: PurchaseRequest<'_>) -> Outcome {
        let decision = telemetry::child_of(request.trace, "decision");
        telemetry::record(&decision, "seckill.sku", request.sku.to_string());
        let outcome =
            self.purchase_counted(PurchaseRequest { trace: &decision, ..request }).instrument(decision.clone()).await;
        telemetry::record(&decision, "seckill.outcome", outcome.code().as_str());
        outcome
    }

    /// Decides, then counts the outcome and the abuse it shows.
    async fn purchase_counted(&self, request: PurchaseRequest<'_>) -> Outcome {
        let caller = caller(&request);
        let outcome = self.decide(request).await;
        let code = outcome.code();
        self.inner.metrics.count(code);
        if matches!(code, Code::RateLimited | Code::KeyReused | Code::BadRequest) {
            self.inner.gate.observe_abuse(caller);
        }
        outcome
    }

    /// Finds the SKU and, if it is striped, the buyer's stripe, on which the rest decides.
    async fn decide(&self, request: PurchaseRequest<'_>) -> Outcome {
        let Some(parent) = self.buyer_sku(request.sku) else {
            self.inner.metrics.decided_locally.increment(1);
            return Outcome::UnknownSku;
        };
        parent.count_request();
        let Some(sku) = stripes::buyer_stripe(&parent, request.user) else {
            return Outcome::Unavailable {
                reason: "this node has not taken in every stripe of this SKU yet; retry with the same Idempotency-Key",
            };
        };
        match self.decide_on(&parent, sku, request).await {
            // The buyer named the SKU, not its stripe.
            Outcome::Purchased { receipt, replayed, .. } if sku.is_stripe() => {
                Outcome::Purchased { sku: parent.id().clone(), receipt, replayed }
            }
            outcome => outcome,
        }
    }

    /// Decides `request` on `sku`, the buyer's stripe of `parent` (the same SKU unless striped).
    async fn decide_on(&self, parent: &Arc<Sku>, sku: &Sku, request: PurchaseRequest<'_>) -> Outcome {
        let inner = &self.inner;
        if request.qty == 0 || request.qty > sku.config().terms.qty_max {
            return Outcome::BadRequest { reason: "qty must be between 1 and the SKU's per-order maximum" };
        }
        let mut request = request;
        if let Some(early) = self.decide_from_memory(sku, &mut request) {
            inner.metrics.decided_locally.increment(1);
            return match early {
                Outcome::SoldOut { replayed: false } => match self.stripe_retry(parent, sku, &request) {
                    Some(retry) => retry,
                    None => self.final_refusal(sku, &request, early).await,
                },
                Outcome::Ended => self.final_refusal(sku, &request, early).await,
                other => other,
            };
        }
        let outcome = match sku.selling() {
            Selling::Allotment(allotment) => self.sell_from_allotment(parent, sku, allotment, &request).await,
            Selling::LedgerOnly => self.sell_through_ledger(sku, &request).await,
        };
        self.ledger_sold_out_on_stripe(parent, sku, outcome)
    }

    /// For a buyer whose stripe is empty while another stripe of the SKU may still sell: 503
    /// `stripe_empty` (or this key's own purchase, replayed). `None` for an unstriped SKU, or
    /// when every stripe is empty: then "sold out" is the answer.
    fn stripe_retry(&self, parent: &Arc<Sku>, sku: &Sku, request: &PurchaseRequest<'_>) -> Option<Outcome> {
        if parent.stripe_count() <= 1 || !self.stripe_reader().others_may_sell(parent, sku) {
            return None;
        }
        Some(match sold_out_or_replay(sku, request) {
            Outcome::SoldOut { replayed: false } => Outcome::StripeEmpty { key_spent: false },
            known => known,
        })
    }

    /// The ledger decided this key sold out on its stripe (and stored that under the key):
    /// while another stripe may still sell, the buyer retries, with a new key.
    fn ledger_sold_out_on_stripe(&self, parent: &Arc<Sku>, sku: &Sku, outcome: Outcome) -> Outcome {
        let striped = parent.stripe_count() > 1;
        if striped
            && outcome == (Outcome::SoldOut { replayed: false })
            && self.stripe_reader().others_may_sell(parent, sku)
        {
            return Outcome::StripeEmpty { key_spent: true };
        }
        outcome
    }

    /// With `[auth]` on, the answers given before the buyer's credential is checked: the ones
    /// that are the same for every buyer and reveal nothing (not started, ended, sold out), so
    /// the burst against a sold-out SKU never pays for a signature check. A key that may have
    /// bought here (its purchase must be replayed to its own buyer only) is not answered here.
    ///
    /// A striped SKU's buyer is on a stripe of its own, known only with its credential, so only
    /// "not started" comes before it there.
    ///
    /// Sold out and ended are final only once the order stream was read after the request
    /// arrived (`read_after_arrival`); that read is shared by the burst, so it costs
    /// far less than a signature check per request.
    pub async fn refusal_before_identity(&self, sku: &str, key: &str) -> Option<Outcome> {
        let sku = self.buyer_sku(sku)?;
        let terms = &sku.config().terms;
        let now = self.inner.clock.now_unix_ms();
        let ended = terms.ends_at_ms.is_some_and(|end| now >= end) || sku.is_closed();
        let refusal = if terms.starts_at_ms.is_some_and(|start| now < start) {
            Outcome::NotStarted
        } else if sku.stripe_count() > 1 {
            return None;
        } else if (ended || sku.is_sold_out()) && self.read_after_arrival(&sku).await && !sku.any_sold_under(key) {
            if ended {
                Outcome::Ended
            } else {
                Outcome::SoldOut { replayed: false }
            }
        } else {
            return None;
        };
        sku.count_request();
        self.inner.metrics.decided_locally.increment(1);
        self.inner.metrics.count(refusal.code());
        Some(refusal)
    }

    /// Steps 5–7 in the design's mode: the fleet-wide limit, a local unit, then the confirmer.
    async fn sell_from_allotment(
        &self,
        parent: &Arc<Sku>,
        sku: &Sku,
        allotment: &Allotment,
        request: &PurchaseRequest<'_>,
    ) -> Outcome {
        debug_assert!(request.qty > 0, "qty was validated before the stock counter");
        debug_assert!(request.qty <= sku.config().terms.qty_max, "qty was validated before the stock counter");
        let inner = &self.inner;
        // The fleet-wide limit is a Redis call, so only for a request that could take a unit.
        let could_win = allotment.remaining() >= u64::from(request.qty);
        if let Some(refused) = self.refused_fleet_wide(request, could_win).await {
            inner.metrics.decided_locally.increment(1);
            return refused;
        }
        if !allotment.take(request.qty) {
            inner.metrics.decided_locally.increment(1);
            return match sold_out_or_replay(sku, request) {
                // The ledger may still sell this key elsewhere (it has stock, or a sale of it is
                // in flight on another node): "sold out" would be a decision this node cannot
                // make. The buyer retries, on another node or later, with the same key.
                Outcome::SoldOut { replayed: false } if !sku.is_sold_out() => Outcome::Unavailable {
                    reason: "this node has no units left right now while the ledger still has stock; retry with the same Idempotency-Key",
                },
                Outcome::SoldOut { replayed: false } => match self.stripe_retry(parent, sku, request) {
                    Some(retry) => retry,
                    None => self.final_refusal(sku, request, Outcome::SoldOut { replayed: false }).await,
                },
                other => other,
            };
        }
        // From here the request holds `qty` units: every path below hands them to the confirmer
        // or gives them back, with no `.await` before that.
        if let BreakerAdmission::Refuse { retry_after } = inner.breaker.admit() {
            allotment.give_back_unsent(request.qty);
            inner.metrics.decided_locally.increment(1);
            return Outcome::LedgerBreakerOpen { retry_after };
        }
        let purchase = match self.purchase_for_ledger(request) {
            Ok(purchase) => purchase,
            Err(refused) => {
                allotment.give_back_unsent(request.qty);
                return refused;
            }
        };
        inner.metrics.decided_by_ledger.increment(1);
        self.confirm_local_win(sku, allotment, purchase, request.trace).await
    }

    /// Steps 5 and 7 in the baseline mode: the fleet-wide limit, then one ledger call of its own.
    async fn sell_through_ledger(&self, sku: &Sku, request: &PurchaseRequest<'_>) -> Outcome {
        let inner = &self.inner;
        if let Some(refused) = self.refused_fleet_wide(request, true).await {
            inner.metrics.decided_locally.increment(1);
            return refused;
        }
        if let BreakerAdmission::Refuse { retry_after } = inner.breaker.admit() {
            inner.metrics.decided_locally.increment(1);
            return Outcome::LedgerBreakerOpen { retry_after };
        }
        let purchase = match self.purchase_for_ledger(request) {
            Ok(purchase) => purchase,
            Err(refused) => return refused,
        };
        inner.metrics.decided_by_ledger.increment(1);
        let seller = Seller::new(inner.config.id.clone(), self.epoch());
        let result = confirmer::confirm(
            sku,
            &seller,
            &*inner.ledger,
            &inner.metrics,
            &inner.breaker,
            std::slice::from_ref(&purchase),
            request.trace,
        )
        .await;
        match result {
            Ok(mut outcome) => Outcome::from_verdict(sku.id(), outcome.verdicts.swap_remove(0)),
            Err(e) => Outcome::from_ledger_error(&e),
        }
    }

    /// What goes to the ledger. Only here, on the way there, are owned ids built and an order id
    /// taken: the sold-out burst never pays for them.
    fn purchase_for_ledger(&self, request: &PurchaseRequest<'_>) -> Result<Purchase, Outcome> {
        let (Ok(key), Ok(user)) = (IdempotencyKey::new(request.key), UserId::new(request.user)) else {
            return Err(Outcome::BadRequest { reason: "the user or Idempotency-Key is not a valid id" });
        };
        let Ok(token) = request.token.map(SubmitToken::new).transpose() else {
            return Err(Outcome::BadRequest { reason: "the Submit-Token is not a valid token" });
        };
        let order_id = self.inner.order_ids.next().map_err(|e| {
            tracing::error!(node = %self.inner.config.id, "no order id: {e}");
            Outcome::Unavailable { reason: "this node cannot issue order ids right now; retry on another node" }
        })?;
        Ok(Purchase { key, user, qty: request.qty, token, order_id })
    }

    /// Steps 2–4 of the pipeline: everything that can say no from memory. On a SKU behind a
    /// waiting room the purchase's token becomes the one inside its ticket, opened only here,
    /// after the refusals that need none.
    fn decide_from_memory(&self, sku: &Sku, request: &mut PurchaseRequest<'_>) -> Option<Outcome> {
        let terms = &sku.config().terms;
        let now = self.inner.clock.now_unix_ms();
        if terms.starts_at_ms.is_some_and(|start| now < start) {
            return Some(Outcome::NotStarted);
        }
        if terms.ends_at_ms.is_some_and(|end| now >= end) || sku.is_closed() {
            return Some(Outcome::Ended);
        }
        if sku.is_sold_out() {
            return Some(sold_out_or_replay(sku, request));
        }
        // A forged, borrowed or expired ticket carries no token: `no_ticket` from memory.
        let refusal = if terms.waiting_room.is_some() {
            let ticket_key = &self.inner.ticket_key;
            request.token =
                request.ticket.and_then(|ticket| ticket_key.token_of(request.sku, request.user, ticket, now));
            Outcome::NoTicket
        } else {
            Outcome::TokenRequired
        };
        // The cheap half of the token check; the ledger does the authoritative half.
        if terms.requires_token() && request.token.is_none() {
            return Some(refusal_or_replay(sku, request, refusal));
        }
        if let Some(refused) = self.refused_by_gate(self.inner.gate.admit(caller(request))) {
            return Some(refused);
        }
        // Only an allotment is leased: the baseline sells nothing of its own.
        let leased = matches!(sku.selling(), Selling::Allotment(_));
        if leased && self.inner.membership.as_ref().is_some_and(|m| !m.can_sell()) {
            return Some(Outcome::Unavailable { reason: "this node holds no lease right now; retry on another node" });
        }
        None
    }

    pub(crate) fn refused_by_gate(&self, admission: Admission) -> Option<Outcome> {
        match admission {
            Admission::Admit => None,
            Admission::RateLimited { retry_after, reason } => {
                self.inner.metrics.gate_refused(reason);
                Some(Outcome::RateLimited { retry_after })
            }
            Admission::Blocked => {
                self.inner.metrics.gate_refused(Reason::Blacklist);
                Some(Outcome::Blocked)
            }
        }
    }

    /// The fleet-wide limit (one Redis call), asked only when the request `could_win` a unit.
    async fn refused_fleet_wide(&self, request: &PurchaseRequest<'_>, could_win: bool) -> Option<Outcome> {
        if !could_win {
            return None;
        }
        let check = self.inner.gate.admit_fleet_wide(caller(request))?;
        self.refused_by_gate(check.await)
    }

    /// Step 6–7 for a request holding `purchase.qty` local units: hand them to the confirmer
    /// and wait for the verdict. From `take` to `hand_off` there is no `.await`, so a request
    /// cancelled by a client hang-up cannot strand its units: either they are back in stock or
    /// the confirmer owns them.
    async fn confirm_local_win(&self, sku: &Sku, allotment: &Allotment, purchase: Purchase, trace: &Span) -> Outcome {
        let Some(_in_flight) = allotment.claim(&purchase.user, &purchase.key) else {
            allotment.give_back_unsent(purchase.qty);
            return Outcome::InProgress;
        };
        let (reply, verdict) = oneshot::channel();
        if let Err(refused) = allotment.hand_off(Pending { purchase, epoch: self.epoch(), reply, span: trace.clone() })
        {
            return Outcome::Unavailable {
                reason: match refused {
                    HandOffRefused::QueueFull => {
                        "this node's confirmation queue is full; retry with the same Idempotency-Key"
                    }
                    HandOffRefused::Closed => "this node is shutting down; retry with the same Idempotency-Key",
                },
            };
        }
        match tokio::time::timeout(self.inner.config.confirm_timeout, verdict).await {
            Ok(Ok(Ok(verdict))) => Outcome::from_verdict(sku.id(), verdict),
            Ok(Ok(Err(e))) => Outcome::from_ledger_error(&e),
            Ok(Err(_)) => {
                Outcome::Unavailable { reason: "this node is shutting down; retry with the same Idempotency-Key" }
            }
            Err(_) => Outcome::Unavailable {
                reason: "the ledger did not answer in time; retry with the same Idempotency-Key",
            },
        }
    }

    /// A refusal made from memory once the sale ended (sold out, closed, past its window) is the
    /// key's final answer only if this key did not buy: a buyer whose purchase succeeded on
    /// another node (its answer lost) and who retries here must get the purchase back. Units
    /// can come back and sell elsewhere at any moment (releases, restocks, transfers), so the
    /// refusal waits (bounded, shared with every request waiting) for a read of the order
    /// stream that started after it arrived; without one it is 503, never a wrong `sold_out`.
    async fn final_refusal(&self, sku: &Sku, request: &PurchaseRequest<'_>, refusal: Outcome) -> Outcome {
        if sku.sold_key(request.user, request.key).is_some() {
            return sold_out_or_replay(sku, request);
        }
        let read_through = if telemetry::traced(request.trace) {
            let read = telemetry::child_of(request.trace, "order stream read");
            Box::pin(self.read_after_arrival(sku).instrument(read)).await
        } else {
            self.read_after_arrival(sku).await
        };
        match sold_out_or_replay(sku, request) {
            Outcome::SoldOut { replayed: false } if read_through => refusal,
            Outcome::SoldOut { replayed: false } => Outcome::Unavailable {
                reason: "this node has not read every sale of this SKU yet; retry with the same Idempotency-Key",
            },
            known => known,
        }
    }

    /// Waits (bounded) for a read of the order stream to its end that started after this call:
    /// then every sale made before the call is in the sold keys. One read serves every caller
    /// that came before it started ([`Sku::refusal_generation`]). False if none finished in time.
    ///
    /// Reads start at least `sold_out_read_gap` apart: back to back, a crowd against a sold-out
    /// SKU kept one read in flight per node at all times, three in four of the cluster's Redis
    /// calls. With the gap, one read answers every refusal that arrived in the gap before it.
    async fn read_after_arrival(&self, sku: &Sku) -> bool {
        let generation = sku.refusal_generation();
        let gap = self.inner.config.sold_out_read_gap;
        let catch_up = async {
            let mut last_started = sku.catching_up().lock().await;
            if sku.known_through(generation) {
                return;
            }
            if let Some(due) = last_started.map(|started| started + gap) {
                if due > tokio::time::Instant::now() {
                    tokio::time::sleep_until(due).await;
                }
            }
            *last_started = Some(tokio::time::Instant::now());
            refresher::read_new_orders(&*self.inner.ledger, sku).await;
        };
        let _ = tokio::time::timeout(CATCH_UP_MAX, catch_up).await;
        sku.known_through(generation)
    }
}

fn caller<'a>(request: &PurchaseRequest<'a>) -> Caller<'a> {
    Caller { sku: request.sku, user: request.user, ip: request.ip }
}

/// The answer when this node has nothing to sell: "sold out", unless this buyer already bought
/// under this key, in which case it is retrying a purchase whose answer it lost and gets the
/// purchase back (another buyer's sale under the key is not this buyer's).
fn sold_out_or_replay(sku: &Sku, request: &PurchaseRequest<'_>) -> Outcome {
    match sku.sold_key(request.user, request.key) {
        None => Outcome::SoldOut { replayed: false },
        Some(sale) if sale.qty == request.qty => {
            Outcome::Purchased { sku: sku.id().clone(), receipt: sale.receipt, replayed: true }
        }
        Some(_) => Outcome::KeyReused,
    }
}

/// The answer to a purchase without a token on a SKU that requires one: `refusal`
/// (`token_required`, or `no_ticket` behind a waiting room), unless this key already bought (its
/// token was spent by that purchase, so a retry without it must still get the purchase back).
fn refusal_or_replay(sku: &Sku, request: &PurchaseRequest<'_>, refusal: Outcome) -> Outcome {
    match sold_out_or_replay(sku, request) {
        Outcome::SoldOut { replayed: false } => refusal,
        known => known,
    }
}
