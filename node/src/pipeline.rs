//! The purchase pipeline of one node (docs/http-api.md, "The order of the checks"): cheap checks
//! from memory first, the stock counter next, and the ledger only for requests that won a local
//! unit.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use auth::Authenticator;
use dashmap::DashMap;
use ledger::{IdempotencyKey, LedgerError, NodeId, Purchase, SalesLedger, Seller, SkuId, SubmitToken, UserId};
use tokio::sync::{mpsc, oneshot};

use crate::breaker::{Breaker, BreakerAdmission, BreakerState};
use crate::clock::{Clock, SystemClock};
use crate::config::{Mode, NodeConfig, SkuConfig};
use crate::confirmer;
use crate::gate::{Admission, Caller, Gate, OpenGate, Reason};
use crate::membership::{CoordinatorLink, Membership, Reports};
use crate::metrics::NodeMetrics;
use crate::order_ids::OrderIds;
use crate::outcome::{Code, Outcome};
use crate::shutdown::Shutdown;
use crate::sku::{
    Allotment, AllotmentState, AllotmentStats, HandOffRefused, KeyMemory, LedgerView, Pending, Selling, Sku,
};
use crate::stripes;

/// Order events read per ledger call, and calls per refresh: a node catches up on 10,000
/// sales per refresh without one call growing large.
const ORDER_PAGE: usize = 1_000;
const ORDER_PAGES_PER_REFRESH: usize = 10;
const _: () = assert!(ORDER_PAGE <= ledger::ORDER_EVENTS_MAX, "the ledger caps a page of order events");
/// Longest a refusal from memory waits for the order stream to be read through after the sale
/// ended; past it the buyer gets 503 and retries. One ledger round trip, with room for a slow one.
const CATCH_UP_MAX: std::time::Duration = std::time::Duration::from_millis(500);

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
}

/// What the stock page shows, from memory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StockPage {
    pub sku: SkuId,
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub local_remaining: u64,
    pub sold_out: bool,
    /// The sale was closed by an operator.
    pub closed: bool,
    /// The buffer the coordinator keeps for this SKU (`"10%"` or units per node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer: Option<String>,
    /// A striped SKU's stripes (the figures above are their sums); absent when unstriped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripes: Option<Vec<StripePage>>,
}

/// One stripe of a striped SKU on the stock page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StripePage {
    pub stripe: u32,
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    pub local_remaining: u64,
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

/// What a node is plugged into besides its config and ledger.
pub struct NodeOptions {
    pub clock: Arc<dyn Clock>,
    pub gate: Arc<dyn Gate>,
    /// The coordinator to register with; `None` sells the configured allotment, no leases.
    pub coordinator: Option<CoordinatorLink>,
    /// Who the buyer is (`[auth]`); `none` takes the body's `user`.
    pub authenticator: Authenticator,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            gate: Arc::new(OpenGate),
            coordinator: None,
            authenticator: Authenticator::none(),
        }
    }
}

impl Node {
    /// Builds the node and starts its background tasks (one confirmer per SKU, the status
    /// refresher, the membership task) on the current Tokio runtime; they stop when `shutdown`
    /// fires. With an ids directory it also starts the order-id thread, which ends when the last
    /// clone of the node is dropped.
    pub fn start(
        config: NodeConfig,
        skus: Vec<SkuConfig>,
        ledger: Arc<dyn SalesLedger>,
        options: NodeOptions,
        shutdown: Shutdown,
    ) -> Node {
        let metrics = Arc::new(NodeMetrics::new(config.id.as_str()));
        let membership = options.coordinator.map(|link| Arc::new(Membership::new(link)));
        let order_ids = OrderIds::new(config.id.clone(), config.order_ids_dir.clone());
        let breaker = Arc::new(Breaker::new(config.id.as_str(), config.breaker));
        let ticket_key = config.ticket_key.clone().unwrap_or_else(crate::ticket::TicketKey::random);
        let node = Node {
            inner: Arc::new(Inner {
                skus: DashMap::new(),
                ledger,
                clock: options.clock,
                gate: options.gate,
                metrics,
                ledger_reachable: AtomicBool::new(false),
                breaker,
                shutdown,
                config,
                membership: membership.clone(),
                order_ids,
                authenticator: options.authenticator,
                rooms: crate::room::Rooms::default(),
                ticket_key,
            }),
        };
        for sku in skus.into_iter().flat_map(stripes::expand) {
            node.add_sku(sku);
        }
        if membership.is_none() {
            // Without a coordinator the worker id is the node's place in the config.
            node.inner.order_ids.use_worker(node.inner.config.worker_id);
        }
        tokio::spawn(refresh_status(Arc::downgrade(&node.inner)));
        if let Some(membership) = membership {
            tokio::spawn(crate::membership::run(node.clone(), membership, node.shutdown_signal().clone()));
        }
        node
    }

    /// Starts selling a SKU: with its configured allotment, or, under a coordinator, with what
    /// the coordinator grants.
    pub fn add_sku(&self, sku: SkuConfig) {
        let inner = &self.inner;
        let initial_units = if inner.membership.is_some() { 0 } else { sku.allotment };
        let memory = KeyMemory { ttl_ms: inner.config.idempotency_ttl.as_millis() as u64, clock: inner.clock.clone() };
        let state = match inner.config.mode {
            Mode::LedgerOnly => Arc::new(Sku::new(sku, Selling::LedgerOnly).with_key_memory(memory)),
            Mode::Allotment => {
                let (tx, rx) = mpsc::channel(inner.config.confirm_queue_max);
                let selling = Selling::Allotment(Allotment::new(initial_units, tx));
                let state = Arc::new(Sku::new(sku, selling).with_key_memory(memory));
                let membership = inner.membership.clone();
                let epoch_now = move || membership.as_ref().map_or(0, |m| m.epoch());
                tokio::spawn(confirmer::run(
                    state.clone(),
                    inner.config.id.clone(),
                    epoch_now,
                    confirmer::LedgerPath {
                        ledger: inner.ledger.clone(),
                        metrics: inner.metrics.clone(),
                        breaker: inner.breaker.clone(),
                    },
                    rx,
                    inner.shutdown.clone(),
                ));
                state
            }
        };
        inner.skus.insert(state.id().clone(), state.clone());
        stripes::link(&inner.skus, &state);
    }

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
        self.confirm_local_win(sku, allotment, purchase).await
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
    async fn confirm_local_win(&self, sku: &Sku, allotment: &Allotment, purchase: Purchase) -> Outcome {
        let Some(_in_flight) = allotment.claim(&purchase.user, &purchase.key) else {
            allotment.give_back_unsent(purchase.qty);
            return Outcome::InProgress;
        };
        let (reply, verdict) = oneshot::channel();
        if let Err(refused) = allotment.hand_off(Pending { purchase, epoch: self.epoch(), reply }) {
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
        let read_through = self.read_after_arrival(sku).await;
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
    async fn read_after_arrival(&self, sku: &Sku) -> bool {
        let generation = sku.refusal_generation();
        let catch_up = async {
            let _turn = sku.catching_up().lock().await;
            if !sku.known_through(generation) {
                read_new_orders(&*self.inner.ledger, sku).await;
            }
        };
        let _ = tokio::time::timeout(CATCH_UP_MAX, catch_up).await;
        sku.known_through(generation)
    }

    /// The membership epoch sales are booked under; 0 without a coordinator.
    pub fn epoch(&self) -> u64 {
        self.inner.membership.as_ref().map_or(0, |m| m.epoch())
    }

    /// Empties every local allotment: the epoch that held them ended.
    pub(crate) fn drop_allotments(&self) {
        for sku in self.inner.skus.iter() {
            let Some(allotment) = sku.allotment() else { continue };
            let dropped = allotment.end_epoch();
            if dropped > 0 {
                tracing::warn!(node = %self.id(), sku = %sku.key(), dropped, "dropped the allotment of an ended epoch");
            }
        }
    }

    /// Takes in the terms the coordinator holds for every SKU: starts selling SKUs created at run
    /// time, and applies closes and buffer changes to known ones.
    pub(crate) fn apply_terms(&self, terms: &std::collections::BTreeMap<SkuId, protocol::SkuTerms>) {
        for (sku_id, terms) in terms {
            if self.sku(sku_id.as_str()).is_none() {
                tracing::info!(node = %self.id(), sku = %sku_id, ?terms, "selling a SKU defined by the coordinator");
                self.add_sku(SkuConfig::new(sku_id.clone(), terms.clone(), 0));
            }
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            if terms.closed && !sku.is_closed() {
                tracing::info!(node = %self.id(), sku = %sku_id, "the sale was closed");
                sku.close();
            }
            sku.set_buffer(terms.buffer);
        }
    }

    /// Order ids from now on come under this worker id (the coordinator's lease). Returns at
    /// once; the generator opens on the order-id thread, never on a runtime worker.
    pub(crate) fn use_worker_id(&self, worker_id: u16) {
        self.inner.order_ids.use_worker(worker_id);
    }

    /// Adds whatever part of the coordinator's cumulative grants is new.
    pub(crate) fn apply_grants(&self, granted: &std::collections::BTreeMap<SkuId, u64>) {
        for (sku_id, total) in granted {
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            // The baseline mode holds no allotment: a grant is nothing it could sell from.
            let Some(allotment) = sku.allotment() else { continue };
            let units = allotment.apply_grant(*total);
            if units > 0 {
                tracing::debug!(node = %self.id(), sku = %sku_id, units, "granted units");
            }
            // Units granted on a SKU the ledger said was empty: it was restocked, or units were
            // moved into this stripe. Read it now, so it sells again before the next refresh.
            if units > 0 && sku.is_sold_out() {
                self.stripe_reader().refresh(&sku, 0);
            }
        }
    }

    /// Gives back what an allotment holds beyond the leader's `hold_max` for its SKU.
    pub(crate) fn apply_hold_max(&self, hold_max: &std::collections::BTreeMap<SkuId, u64>) {
        for (sku_id, max) in hold_max {
            let Some(sku) = self.sku(sku_id.as_str()) else { continue };
            // The baseline mode holds no allotment: nothing to give back.
            let Some(allotment) = sku.allotment() else { continue };
            let returned = allotment.hold_at_most(*max);
            if returned > 0 {
                tracing::debug!(node = %self.id(), sku = %sku_id, returned, hold_max = max, "gave units back");
            }
        }
    }

    /// Per-SKU figures for the next heartbeat.
    pub fn reports(&self) -> Reports {
        self.inner
            .skus
            .iter()
            .map(|sku| {
                let figures = sku.allotment().map(Allotment::epoch_figures).unwrap_or_default();
                let report = protocol::SkuReport {
                    ledger_reachable: sku.ledger_reachable(),
                    local_remaining: figures.local_remaining,
                    applied: figures.applied,
                    sold: figures.sold,
                    requests: sku.requests(),
                    returned: figures.returned,
                };
                (sku.key().clone(), report)
            })
            .collect()
    }

    /// Hands the lease back to the coordinator (after the server drained), so the unsold
    /// allotment is reallocated at once.
    pub async fn leave(&self) {
        if let Some(membership) = &self.inner.membership {
            crate::membership::leave(self, membership).await;
        }
    }

    /// The stock page, from memory: a striped SKU as one SKU, its figures summed over the
    /// stripes this node holds, each stripe's own below them.
    pub fn stock_page(&self, sku: &str) -> Option<StockPage> {
        let state = self.buyer_sku(sku)?;
        let stripes: Vec<StripePage> = stripes::known(&state)
            .map(|(stripe, sku)| {
                let LedgerView { total, sold, remaining, .. } = sku.view();
                StripePage { stripe, total, sold, remaining, local_remaining: sku.local_remaining() }
            })
            .collect();
        let sum = |figure: fn(&StripePage) -> u64| stripes.iter().map(figure).sum::<u64>();
        let remaining = sum(|stripe| stripe.remaining);
        Some(StockPage {
            sku: state.id().clone(),
            total: sum(|stripe| stripe.total),
            sold: sum(|stripe| stripe.sold),
            remaining,
            local_remaining: sum(|stripe| stripe.local_remaining),
            sold_out: remaining == 0,
            closed: state.is_closed(),
            buffer: state.buffer().map(|buffer| buffer.to_string()),
            stripes: (state.stripe_count() > 1).then_some(stripes),
        })
    }

    /// The state of the ledger circuit breaker (`breaker.rs`), for `/ready`.
    pub fn ledger_breaker(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// Ready to sell: the ledger answered the last refresh and knows every SKU, the ledger
    /// circuit breaker is not open, and order ids can be issued.
    pub fn is_ready(&self) -> bool {
        // Relaxed: a readiness probe tolerates a reading one refresh old.
        self.inner.ledger_reachable.load(Ordering::Relaxed)
            && self.inner.breaker.state() != BreakerState::Open
            && self.inner.skus.iter().all(|sku| !sku.view().missing)
            && self.inner.order_ids.is_ready()
            && !self.inner.shutdown.is_triggered()
            && self.inner.membership.as_ref().is_none_or(|m| m.epoch() != 0 && m.can_sell())
    }

    /// Updates per-SKU gauges; called before `/metrics` renders.
    /// A striped SKU is published as one SKU, its stripes summed, and each stripe's units in
    /// `seckill_stripe_local_remaining`.
    pub fn publish_gauges(&self) {
        let node = self.inner.config.id.as_str();
        for sku in self.inner.skus.iter().filter(|sku| !sku.is_stripe()) {
            let (mut local_remaining, mut stats) = (0, AllotmentStats::default());
            for (stripe, state) in stripes::known(sku.value()) {
                let figures = state.allotment().map(Allotment::stats).unwrap_or_default();
                local_remaining += state.local_remaining();
                stats.exhausted_with_stock_left += figures.exhausted_with_stock_left;
                stats.refused_by_ledger += figures.refused_by_ledger;
                if sku.stripe_count() > 1 {
                    crate::metrics::publish_stripe(node, sku.key().as_str(), stripe, state.local_remaining());
                }
            }
            crate::metrics::publish_allotment(
                node,
                sku.key().as_str(),
                local_remaining,
                stats.exhausted_with_stock_left,
                stats.refused_by_ledger,
            );
        }
    }

    /// Every figure of the allotment of `sku`; `None` for an unknown SKU or one sold ledger-only.
    pub fn allotment_state(&self, sku: &str) -> Option<AllotmentState> {
        self.sku(sku)?.allotment().map(Allotment::state)
    }

    /// How well the allotment of `sku` fits the demand on this node (zeros in the baseline mode,
    /// which has none).
    pub fn allotment_stats(&self, sku: &str) -> Option<AllotmentStats> {
        Some(self.sku(sku)?.allotment().map(Allotment::stats).unwrap_or_default())
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

/// Pages through order events this node has not seen yet, into the SKU's sold keys; a read that
/// reaches the stream's end vouches for the sale's end seen before it started.
async fn read_new_orders(ledger: &dyn SalesLedger, sku: &Sku) {
    let generation = sku.final_generation();
    for _ in 0..ORDER_PAGES_PER_REFRESH {
        match ledger.orders(sku.id(), sku.orders_read(), ORDER_PAGE).await {
            Ok(events) => {
                let full = events.len() == ORDER_PAGE;
                sku.record_orders(events);
                if !full {
                    sku.stream_read_to_end(generation);
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(sku = %sku.id(), "order stream read failed: {e}");
                return;
            }
        }
    }
}

/// Keeps every SKU's cached ledger figures (and so the sold-out flag and readiness) fresh,
/// whether or not this node is selling. Holds the node weakly so a dropped node stops it.
async fn refresh_status(node: std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = node.upgrade() else { return };
        let skus: Vec<Arc<Sku>> = inner.skus.iter().map(|entry| entry.value().clone()).collect();
        let mut reachable = skus.is_empty() && inner.ledger.ping().await.is_ok();
        for sku in skus {
            match inner.ledger.status(sku.id()).await {
                Ok(status) => {
                    sku.observe_status(&status);
                    sku.observe_reachable(true);
                    sku.status_read_at(inner.clock.now_unix_ms());
                    reachable = true;
                    read_new_orders(&*inner.ledger, &sku).await;
                }
                Err(LedgerError::Missing(_)) => {
                    sku.observe_missing();
                    sku.observe_reachable(true);
                    reachable = true;
                }
                Err(e) => {
                    sku.observe_reachable(false);
                    tracing::debug!(sku = %sku.id(), "status refresh failed: {e}");
                }
            }
        }
        // Relaxed: see `is_ready`.
        inner.ledger_reachable.store(reachable, Ordering::Relaxed);
        let (period, shutdown) = (inner.config.status_refresh, inner.shutdown.clone());
        drop(inner);
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.wait() => return,
        }
    }
}

/// Membership reaches the node only through these calls.
impl crate::membership::Leaseholder for Node {
    fn id(&self) -> &NodeId {
        Node::id(self)
    }

    fn reports(&self) -> Reports {
        Node::reports(self)
    }

    fn drop_allotments(&self) {
        Node::drop_allotments(self)
    }

    fn use_worker_id(&self, worker_id: u16) {
        Node::use_worker_id(self, worker_id)
    }

    fn apply_terms(&self, terms: &std::collections::BTreeMap<SkuId, protocol::SkuTerms>) {
        Node::apply_terms(self, terms)
    }

    fn apply_grants(&self, granted: &std::collections::BTreeMap<SkuId, u64>) {
        Node::apply_grants(self, granted)
    }

    fn apply_hold_max(&self, hold_max: &std::collections::BTreeMap<SkuId, u64>) {
        Node::apply_hold_max(self, hold_max)
    }
}
