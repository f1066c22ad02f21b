//! One SKU as this node sells it: its terms, how it sells ([`Selling`]), the operator's close and
//! buffer, the ledger figures it last saw and the keys it knows have bought.
//!
//! Nothing here is a public field: every change goes through a named method whose doc says what
//! it keeps true, and each has one kind of caller:
//! - the pipeline takes units ([`Allotment::take`]), returns those it never sent
//!   ([`Allotment::give_back_unsent`]) and hands the rest to the confirmer
//!   ([`Allotment::hand_off`]);
//! - the confirmer settles them ([`Allotment::sold`], [`Allotment::unsold`], [`Sku::record_sale`])
//!   and records what the ledger answered ([`Sku::observe_confirm`], [`Sku::observe_missing`]);
//! - the status refresher records ledger reads ([`Sku::observe_status`], [`Sku::record_orders`]);
//! - the membership task, through `Node`, applies the coordinator's word ([`Sku::close`],
//!   [`Sku::set_buffer`], [`Allotment::apply_grant`], [`Allotment::end_epoch`]).
//!
//! **Invariants.**
//! - A ledger-only SKU has no stock, no confirm queue and no sold-out flag, and an allotment SKU
//!   has all three: [`Selling`] cannot be built otherwise, so the mode is never re-derived.
//! - The local stock never goes below zero ([`LocalStock`]). Units leave it only through
//!   `take` (to a request) or `end_epoch` (revoked), and come in only as units taken and not
//!   sold in the epoch that took them (`give_back_unsent`, `hand_off` when the queue refuses,
//!   `unsold`) or as new grants (`apply_grant`).
//! - `applied` is the part of the coordinator's cumulative grant already in the stock: it only
//!   grows within an epoch, and it, the stock and `sold_in_epoch` go to zero together when the
//!   epoch ends.
//! - The sold-out flag is up only while the ledger view says nothing remains and the ledger knows
//!   the SKU.
//! - A closed SKU never reopens.
//! - The ledger view only moves forward: a reading older than one already recorded is dropped.
//! - Every unit taken is settled exactly once: given back unsent, sold, unsold, or dropped with
//!   its ended epoch.
//!
//! Debug builds assert each of these where it must hold (`debug_assert!`; the first is the
//! type's shape), counting units taken and not settled to catch a unit settled twice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::DashMap;
use ledger::{IdempotencyKey, OrderEvent, Receipt, SkuId, SkuStatus, UserId};

use crate::config::SkuConfig;
use crate::tally::Tally;

mod allotment;

pub use allotment::{Allotment, AllotmentState, AllotmentStats, HandOffRefused, Pending};

/// The ledger's figures as this node last saw them.
#[derive(Debug, Clone)]
pub struct LedgerView {
    pub total: u64,
    pub sold: u64,
    pub remaining: u64,
    /// The ledger's [`ledger::SkuStatus::progress`] when it was read: only a reading with more
    /// progress (or another total) replaces it, so an older answer arriving late is dropped.
    pub progress: u64,
    /// Units given back by released orders, as last read. Once above zero, a sold-out SKU can
    /// sell again at any moment, so "sold out" is no longer final.
    pub released: u64,
    /// The ledger said it has no record of the SKU: sales stop until it comes back.
    pub missing: bool,
}

/// How long a node remembers which keys bought: the ledger's idempotency TTL, by the node's
/// clock against the sale's time.
#[derive(Clone)]
pub struct KeyMemory {
    pub ttl_ms: u64,
    pub clock: std::sync::Arc<dyn crate::clock::Clock>,
}

/// What a key bought, enough to replay the answer and to tell a reused key.
#[derive(Debug, Clone)]
pub struct SoldKey {
    pub user: UserId,
    pub qty: u32,
    pub receipt: Receipt,
}

/// How a SKU is sold; fixed when the SKU is added (the node's `mode`).
#[expect(
    clippy::large_enum_variant,
    reason = "one per SKU, inside its Arc: boxing would only add a pointer chase to every purchase"
)]
pub enum Selling {
    /// The design: a request must win a unit of the local allotment before it reaches the
    /// ledger, and local winners are confirmed in batches by the SKU's confirmer.
    Allotment(Allotment),
    /// The baseline: every purchase is one ledger call; no stock, no queue, no sold-out flag.
    LedgerOnly,
}

/// Everything a node knows about one SKU.
pub struct Sku {
    config: SkuConfig,
    selling: Selling,
    /// Closed by an operator (heard from the coordinator or read from the ledger): every purchase
    /// is answered `ended` from memory. Never cleared: a closed sale stays closed.
    closed: AtomicBool,
    /// The buffer the coordinator keeps for this SKU, for the stock page; `None` without one.
    /// std `Mutex`: held for a copy, never across an `.await`.
    buffer: Mutex<Option<protocol::Buffer>>,
    /// Every key that bought this SKU anywhere in the fleet, as far as this node has read the
    /// ledger's order stream (its own sales go in at once). The sold-out path looks here, so a
    /// buyer retrying a purchase whose answer was lost gets it replayed, not "sold out".
    /// Bounded by the units sold. Each with when it sold (Unix ms; 0: unknown), so a key is
    /// forgotten once the ledger forgets it ([`KeyMemory`]). A key is its buyer's: under one key,
    /// one sale per buyer (almost always one buyer; another who sent the key bought apart).
    sold_keys: DashMap<IdempotencyKey, Vec<(SoldKey, u64)>>,
    /// How long a sold key is remembered; `None`: for the node's life.
    key_memory: Option<KeyMemory>,
    /// The last order-stream `seq` read into `sold_keys`.
    orders_read: AtomicU64,
    /// Bumped each time this node sees the sale end (the ledger sold out, or it closed). From
    /// then on no key can be sold any more, so a refusal from memory is the key's final answer
    /// once the order stream was read to its end after the bump: `complete_generation`.
    final_generation: AtomicU64,
    /// The latest `final_generation` after which the order stream was read to its end.
    complete_generation: AtomicU64,
    /// One catch-up read of the order stream at a time; requests waiting for it share its
    /// result. Holds when the last one started, so the next keeps `sold_out_read_gap` after it.
    /// A tokio `Mutex`: held across the ledger call.
    catching_up: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Whether the last ledger call for this SKU (status, order stream or confirmation) got an
    /// answer; heartbeats report it, so the coordinator moves units a cut-off node cannot sell.
    ledger_reachable: AtomicBool,
    /// std `Mutex`: held for a few field copies, never across an `.await`.
    view: Mutex<LedgerView>,
    /// The SKU buyers name: this one, or the SKU this ledger is a stripe of.
    buyer_id: SkuId,
    /// Which stripe of `buyer_id` this is; 0 for the SKU itself.
    stripe_index: u32,
    /// Of a striped SKU's stripe 0 (the SKU itself): stripe i ≥ 1 in slot i - 1, filled as the
    /// node adds them. Set once and read without a lock, so routing a purchase is one load.
    stripes: Box<[OnceLock<Arc<Sku>>]>,
    /// Units moved out of and into this stripe at the ledger, as last read: while the stripes'
    /// sums differ, units are between stripes and none of them is sold out for good.
    transferred_out: AtomicU64,
    transferred_in: AtomicU64,
    /// When (node clock, Unix ms) the ledger's status of this SKU was last read, and whether a
    /// read outside the refresher is under way: a buyer on an empty stripe asks for fresh
    /// figures of the others, at most one read per stripe in flight and one per period.
    status_read_at_ms: AtomicU64,
    status_reading: AtomicBool,
    /// Purchase requests that named this SKU (as buyers name it: on the SKU, not its stripes)
    /// since the node started, for the operator's requests per second.
    requests: Tally,
}

impl Sku {
    pub fn new(config: SkuConfig, selling: Selling) -> Self {
        let total = config.terms.total;
        let (buyer_id, index) = config.sku.stripe_parent();
        let slots = if index == 0 { config.terms.stripes.saturating_sub(1) as usize } else { 0 };
        Self {
            buyer_id,
            stripe_index: index,
            stripes: (0..slots).map(|_| OnceLock::new()).collect(),
            transferred_out: AtomicU64::new(0),
            transferred_in: AtomicU64::new(0),
            status_read_at_ms: AtomicU64::new(0),
            status_reading: AtomicBool::new(false),
            config,
            selling,
            closed: AtomicBool::new(false),
            buffer: Mutex::new(None),
            sold_keys: DashMap::new(),
            key_memory: None,
            orders_read: AtomicU64::new(0),
            final_generation: AtomicU64::new(0),
            complete_generation: AtomicU64::new(0),
            catching_up: tokio::sync::Mutex::new(None),
            ledger_reachable: AtomicBool::new(true),
            requests: Tally::default(),
            view: Mutex::new(LedgerView { total, sold: 0, remaining: total, progress: 0, released: 0, missing: false }),
        }
    }

    pub fn id(&self) -> &SkuId {
        &self.config.sku
    }

    /// The id buyers know this SKU by: the SKU of which this ledger is a stripe.
    pub fn buyer_id(&self) -> &SkuId {
        &self.buyer_id
    }

    /// Whether this is a stripe past the first, which buyers never name.
    pub fn is_stripe(&self) -> bool {
        self.stripe_index > 0
    }

    /// How many stripes the SKU is split into, on its stripe 0; 1 for an unstriped SKU (and for
    /// the other stripes, which route nothing).
    pub fn stripe_count(&self) -> u32 {
        self.stripes.len() as u32 + 1
    }

    /// Stripe `index` (≥ 1) of this SKU, once the node has added it.
    pub fn stripe(&self, index: u32) -> Option<&Arc<Sku>> {
        self.stripes.get((index as usize).checked_sub(1)?)?.get()
    }

    /// Records stripe `index` (≥ 1) of this SKU; a second call for one slot changes nothing.
    pub fn link_stripe(&self, index: u32, stripe: Arc<Sku>) {
        if let Some(slot) = (index as usize).checked_sub(1).and_then(|at| self.stripes.get(at)) {
            let _ = slot.set(stripe);
        }
    }

    /// Units moved out of and into this ledger by transfers between stripes, as last read.
    pub fn transferred(&self) -> (u64, u64) {
        // Relaxed: figures of a status read; a stale pair only makes a buyer retry once more.
        (self.transferred_out.load(Ordering::Relaxed), self.transferred_in.load(Ordering::Relaxed))
    }

    /// Claims the one status read outside the refresher, if the last read is at least
    /// `period_ms` old at `now_ms` and none is under way; the caller must call
    /// [`status_read_done`](Self::status_read_done) when it ends.
    pub fn claim_status_read(&self, now_ms: u64, period_ms: u64) -> bool {
        // Relaxed: a hint that spaces out reads; two reads at once would only cost a call.
        let fresh = now_ms.saturating_sub(self.status_read_at_ms.load(Ordering::Relaxed)) < period_ms;
        !fresh && !self.status_reading.swap(true, Ordering::Acquire)
    }

    /// Ends a read claimed with [`claim_status_read`](Self::claim_status_read) at `now_ms`.
    pub fn status_read_done(&self, now_ms: u64) {
        self.status_read_at_ms.fetch_max(now_ms, Ordering::Relaxed);
        self.status_reading.store(false, Ordering::Release);
    }

    /// Records when the refresher read the status, so reads on demand do not repeat it.
    pub fn status_read_at(&self, now_ms: u64) {
        self.status_read_at_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// Whether the ledger said nothing is left: the sold-out flag, or, ledger-only (no flag),
    /// the last figures read.
    pub fn known_empty(&self) -> bool {
        match &self.selling {
            Selling::Allotment(allotment) => allotment.is_sold_out(),
            Selling::LedgerOnly => {
                let view = self.view();
                view.remaining == 0 && !view.missing
            }
        }
    }

    /// The SKU's terms; fixed for the SKU's life on this node.
    pub fn config(&self) -> &SkuConfig {
        &self.config
    }

    pub fn selling(&self) -> &Selling {
        &self.selling
    }

    /// The allotment, unless the SKU is sold ledger-only.
    pub fn allotment(&self) -> Option<&Allotment> {
        match &self.selling {
            Selling::Allotment(allotment) => Some(allotment),
            Selling::LedgerOnly => None,
        }
    }

    /// Whether the ledger said nothing is left. Always false ledger-only: that mode keeps no
    /// flag, every purchase asks the ledger.
    pub fn is_sold_out(&self) -> bool {
        self.allotment().is_some_and(Allotment::is_sold_out)
    }

    /// Units this node may still sell without asking anyone; 0 ledger-only.
    pub fn local_remaining(&self) -> u64 {
        self.allotment().map_or(0, Allotment::remaining)
    }

    pub fn is_closed(&self) -> bool {
        // Relaxed: a stale `false` costs one ledger call, which the ledger answers `ended`.
        self.closed.load(Ordering::Relaxed)
    }

    /// Closes the sale for good: there is no way to reopen it.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::Relaxed) {
            self.sale_ended();
        }
        debug_assert!(self.is_closed(), "a closed SKU never reopens");
    }

    /// The sale can sell no more (sold out or closed): refusals from memory wait for the order
    /// stream to be read to its end once more.
    fn sale_ended(&self) {
        // AcqRel: a reader that captures the new generation starts its read after this point.
        self.final_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The generation a stream read about to start will vouch for when it reaches the end.
    pub fn final_generation(&self) -> u64 {
        self.final_generation.load(Ordering::Acquire)
    }

    /// A stream read that started at `generation` reached the stream's end.
    pub fn stream_read_to_end(&self, generation: u64) {
        self.complete_generation.fetch_max(generation, Ordering::AcqRel);
    }

    /// Whether every sale made before `generation` began is in `sold_keys`: a read of the stream
    /// to its end started after it. While the sale goes on nothing is final, so nothing is
    /// claimed; after the end, once the stream was read through.
    pub fn known_through(&self, generation: u64) -> bool {
        self.complete_generation.load(Ordering::Acquire) >= generation
    }

    /// The generation a refusal from memory must see read through before it is final: a fresh
    /// one, so each refusal asks for a read of the order stream that starts after it arrived
    /// (one read answers every refusal that came before it started).
    ///
    /// The end a node saw is never final: an unpaid order's release, a buyer's cancel, a
    /// restock or a transfer into a stripe gives units back, and another node may sell them
    /// before this node's next refresh. Nemesis seed 13 (a retry told `sold_out` 3 ms after its
    /// key bought a released unit on another node) and seed 20261337 (the same with a unit
    /// transferred into a stripe) found the windows an older rule left, which trusted one read
    /// after the end until this node had itself seen units come back.
    pub fn refusal_generation(&self) -> u64 {
        // AcqRel: as in `sale_ended`.
        self.final_generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Serializes catch-up reads of the order stream; holds when the last one started.
    pub fn catching_up(&self) -> &tokio::sync::Mutex<Option<tokio::time::Instant>> {
        &self.catching_up
    }

    pub fn count_request(&self) {
        self.requests.bump();
    }

    pub fn requests(&self) -> u64 {
        self.requests.sum()
    }

    pub fn ledger_reachable(&self) -> bool {
        // Relaxed: a report for the coordinator, a heartbeat period stale at worst.
        self.ledger_reachable.load(Ordering::Relaxed)
    }

    /// Records whether a ledger call for this SKU got an answer.
    pub fn observe_reachable(&self, reachable: bool) {
        self.ledger_reachable.store(reachable, Ordering::Relaxed);
    }

    pub fn buffer(&self) -> Option<protocol::Buffer> {
        *self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the buffer the coordinator keeps for this SKU; only the stock page shows it.
    pub fn set_buffer(&self, buffer: protocol::Buffer) {
        *self.buffer.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(buffer);
    }

    pub fn view(&self) -> LedgerView {
        self.view.lock().map(|v| v.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// Records figures returned by a confirmation.
    pub fn observe_confirm(&self, outcome: &ledger::BatchOutcome) {
        let total = outcome.sold + outcome.remaining;
        self.observe(total, outcome.sold, outcome.remaining, outcome.released, outcome.progress());
    }

    /// Records a full status read (the periodic refresh), including a close the ledger knows of.
    pub fn observe_status(&self, status: &SkuStatus) {
        if status.closed {
            self.close();
        }
        // Relaxed: see `transferred`. Both only grow at the ledger.
        self.transferred_out.fetch_max(status.transferred_out, Ordering::Relaxed);
        self.transferred_in.fetch_max(status.transferred_in, Ordering::Relaxed);
        self.observe(status.total, status.sold, status.remaining, status.released, status.progress());
    }

    /// Sales and releases only add to `progress` between restocks, so a reading with less is an
    /// older one and is dropped; a release raises `remaining`, which clears the sold-out flag.
    fn observe(&self, total: u64, sold: u64, remaining: u64, released: u64, progress: u64) {
        debug_assert_eq!(sold + remaining, total, "the ledger's figures for {} must add up", self.id());
        self.update_view(|view| {
            let before = (view.progress, view.total);
            if progress >= view.progress || total != view.total {
                view.total = total;
                view.sold = sold;
                view.remaining = remaining;
                view.progress = progress;
                view.released = view.released.max(released);
            }
            view.missing = false;
            debug_assert!(
                view.progress >= before.0 || view.total != before.1,
                "the ledger view only moves forward (progress {} after {})",
                view.progress,
                before.0
            );
        });
    }

    /// Records that the ledger has no record of the SKU: the sold-out flag drops (nothing is
    /// known to be sold out) and readiness fails until the ledger knows it again.
    pub fn observe_missing(&self) {
        self.update_view(|view| view.missing = true);
    }

    /// Forgets each sold key once the ledger has (its idempotency TTL after the sale): a key
    /// reused after that is a new purchase at the ledger, so it must not be answered here with
    /// the old sale.
    pub fn with_key_memory(mut self, memory: KeyMemory) -> Self {
        self.key_memory = Some(memory);
        self
    }

    /// The purchase `user` made under `key`, if it bought this SKU within the key memory; a sale
    /// older than that is forgotten here and now.
    pub fn sold_key(&self, user: &str, key: &str) -> Option<SoldKey> {
        let (sale, sold_at_ms) = {
            let sales = self.sold_keys.get(key)?;
            sales.iter().find(|(sale, _)| sale.user.as_str() == user).cloned()?
        };
        if self.remembered(sold_at_ms) {
            return Some(sale);
        }
        if let Some(mut sales) = self.sold_keys.get_mut(key) {
            sales.retain(|(sale, at)| sale.user.as_str() != user || *at != sold_at_ms);
        }
        self.sold_keys.remove_if(key, |_, sales| sales.is_empty());
        None
    }

    /// Whether any buyer bought this SKU under `key` within the key memory: before the buyer is
    /// known, such a key is not answered from memory (its purchase is replayed to its buyer only).
    pub fn any_sold_under(&self, key: &str) -> bool {
        self.sold_keys.get(key).is_some_and(|sales| sales.iter().any(|(_, at)| self.remembered(*at)))
    }

    /// Whether a sale made at `sold_at_ms` is still within the key memory. An unknown sale time
    /// (an order event from before events carried one) is kept: a replay is safer than a second
    /// sale the ledger would refuse anyway.
    fn remembered(&self, sold_at_ms: u64) -> bool {
        let Some(memory) = &self.key_memory else { return true };
        sold_at_ms == 0 || memory.clock.now_unix_ms() < sold_at_ms.saturating_add(memory.ttl_ms)
    }

    /// Remembers a sale this node just made, so a retry of it is replayed from memory.
    pub fn record_sale(&self, key: IdempotencyKey, sale: SoldKey) {
        let now = self.key_memory.as_ref().map_or(0, |memory| memory.clock.now_unix_ms());
        self.remember(key, sale, now);
    }

    /// Files `sale` under its key for its buyer; a later sale of a key reused by its buyer
    /// replaces the earlier one, never the other way.
    fn remember(&self, key: IdempotencyKey, sale: SoldKey, sold_at_ms: u64) {
        let mut sales = self.sold_keys.entry(key).or_default();
        match sales.iter_mut().find(|(known, _)| known.user == sale.user) {
            Some(known) if known.1 <= sold_at_ms => *known = (sale, sold_at_ms),
            Some(_) => {}
            None => sales.push((sale, sold_at_ms)),
        }
    }

    /// Where to resume reading the order stream.
    pub fn orders_read(&self) -> u64 {
        // Acquire pairs with the Release in `record_orders`; only the refresher writes it.
        self.orders_read.load(Ordering::Acquire)
    }

    /// Records a page of the order stream; the resume point only moves forward.
    pub fn record_orders(&self, events: Vec<OrderEvent>) {
        let Some(last) = events.last().map(|e| e.seq) else { return };
        debug_assert!(
            events.windows(2).all(|pair| pair[0].seq < pair[1].seq),
            "a page of the order stream is in order"
        );
        for event in events {
            let receipt = Receipt { order_id: event.order_id, node: event.node, qty: event.qty };
            let sale = SoldKey { user: event.user, qty: event.qty, receipt };
            self.remember(event.key, sale, event.at_ms);
        }
        self.orders_read.fetch_max(last, Ordering::Release);
    }

    fn update_view(&self, change: impl FnOnce(&mut LedgerView)) {
        let mut view = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut view);
        if let Selling::Allotment(allotment) = &self.selling {
            // Relaxed: see `Allotment::is_sold_out`.
            let sold_out = view.remaining == 0 && !view.missing;
            if sold_out && !allotment.sold_out.swap(true, Ordering::Relaxed) {
                self.sale_ended();
            } else if !sold_out {
                allotment.sold_out.store(false, Ordering::Relaxed);
            }
            // Only here, under the view's lock, is the flag written.
            debug_assert_eq!(
                allotment.is_sold_out(),
                sold_out,
                "the sold-out flag is up exactly while the ledger view says nothing remains of a known SKU"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// Goal: the books of debug builds catch a winner settled twice (a unit kept and returned,
    /// or returned twice, would make stock out of nothing). Method: take one unit, settle it
    /// twice.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a unit settled twice or never taken")]
    fn a_unit_settled_twice_panics() {
        let (queue, _confirmer) = mpsc::channel(1);
        let allotment = Allotment::new(1, queue);
        assert!(allotment.take(1));
        allotment.sold(1);
        allotment.unsold(1, false);
    }

    /// Goal: every way a taken unit ends is one settlement, and the stock adds up after them.
    #[test]
    fn each_taken_unit_settles_once() {
        let (queue, _confirmer) = mpsc::channel(1);
        let allotment = Allotment::new(4, queue);
        assert!(allotment.take(1) && allotment.take(1) && allotment.take(1));
        allotment.give_back_unsent(1);
        allotment.sold(1);
        allotment.unsold(1, true);
        assert_eq!(allotment.remaining(), 3);
        assert_eq!(allotment.epoch_figures().sold, 1);
        assert_eq!(allotment.stats().refused_by_ledger, 1);
    }
}
