//! The order consumer: reads one SKU's order stream as a member of a consumer group and writes
//! each event into the store as an order, **then** acknowledges it. A consumer that dies between
//! the two leaves its entries pending; another consumer (or itself, restarted) claims them once
//! they have been idle for `claim_idle`, and the keyed insert makes the second write a no-op.
//!
//! Nothing is acknowledged unless it was stored or dead-lettered with a reason. An order's
//! identity is its order id: an event the store skips (its id or its seq already stored) is
//! acknowledged only when the stored row is that very sale (a redelivery); any other clash is a
//! sale with no order of its own, and goes to the dead letters at once, with what it clashed with.
//!
//! Two kinds of failure are kept apart:
//! - the store is unreachable: nothing is acknowledged and the same batch is retried here, with
//!   backoff, until it goes in; the entries stay pending under this consumer, so an outage does
//!   not count against them and the stream buffers the sale meanwhile;
//! - one entry cannot become an order (unreadable fields, a row the store refuses): it stays
//!   pending and is retried by the claim; once delivered more than `max_deliveries` times and
//!   still failing, it goes to the dead-letter table with its raw fields and is acknowledged,
//!   so it never blocks the entries behind it.
//!
//! An entry holds every order of one confirmed batch (`FeedEntry::events`). The group delivers
//! and acknowledges entries, but orders are settled one by one: an entry is acknowledged once
//! each of its orders is stored or dead-lettered; while one of them waits for a retry, the
//! whole entry stays pending (its stored orders are skipped on redelivery, by the keyed insert).
//! A dead letter is one order (its own stream seq, the entry's shared fields and its own), so
//! the reconciler accounts for every seq; only an entry that cannot be read at all is one dead
//! letter under the entry's seq (its last order's) with all its fields.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{FeedEntry, OrderFeed, SkuId, SkuTerms};
use tokio::sync::watch;

use crate::model::{DeadLetter, NewOrder};
use crate::store::{OrderStore, StoreError};
use crate::unix_ms;

/// How the consumers of one service read.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer group every order service shares: each entry goes to one of them.
    pub group: String,
    /// This consumer's name in the group; unique per process, stable across its restarts.
    pub consumer: String,
    /// Entries per read and per store write.
    pub batch: usize,
    /// Longest wait of one read for new entries.
    pub block: Duration,
    /// Entries pending this long are taken over: their consumer died or they keep failing.
    pub claim_idle: Duration,
    /// Deliveries after which a failing entry is dead-lettered.
    pub max_deliveries: u64,
    /// Newest stream entries kept for the nodes when trimming acknowledged ones.
    pub trim_retain: u64,
    /// How often the lag is published and acknowledged entries are trimmed.
    pub trim_every: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            group: "orders".into(),
            consumer: "orders-1".into(),
            batch: 500,
            block: Duration::from_millis(200),
            claim_idle: Duration::from_secs(5),
            max_deliveries: 5,
            // About 15 MB of stream per SKU on Redis: enough for any node's replay of a
            // recent retry, bounded whatever the sale's size.
            trim_retain: 100_000,
            trim_every: Duration::from_secs(1),
        }
    }
}

/// Longest pause between retries of a store write that failed for lack of a store.
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// One SKU's consumer, run until `stop` turns true.
pub struct SkuConsumer {
    pub sku: SkuId,
    pub terms: SkuTerms,
    pub ledger: Arc<dyn OrderFeed>,
    pub store: Arc<dyn OrderStore>,
    pub config: ConsumerConfig,
}

/// What happened to the entries of one batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Handled {
    /// Orders stored, of the entries acknowledged.
    pub stored: u64,
    /// Dead letters written: one per order that is no order, one per unreadable entry.
    pub dead_lettered: u64,
    /// Left pending for a later claim.
    pub deferred: u64,
}

/// Why one order is not stored, worst first: an entry whose orders have several problems waits
/// for the worst (a clash dead-letters at once, so only if nothing else is wrong).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Problem {
    /// Could not be checked now; retried without counting against the entry.
    Deferred,
    /// Could not become an order this time.
    Failed(String),
    /// Can never become an order as it is.
    Clash(String),
}

/// The readable entries of a batch and their orders (with the index of their entry), each
/// with the problem it met, if any.
struct Readable {
    entries: Vec<FeedEntry>,
    orders: Vec<(usize, NewOrder)>,
    problems: Vec<Option<Problem>>,
}

/// An entry some of whose orders (or, unreadable, the whole of it) cannot be stored now: the
/// seqs to dead-letter, why, and whether another delivery may still fix it.
struct Unsettled {
    entry: FeedEntry,
    /// Seq and reason of each order that is no order; the entry's own seq for an unreadable entry.
    letters: Vec<(u64, String)>,
    may_retry: bool,
    /// Its orders that did go in.
    stored: u64,
    /// Unreadable: lettered whole, with every field.
    whole: bool,
}

/// One batch on its way through [`SkuConsumer::handle`].
#[derive(Default)]
struct Batch {
    handled: Handled,
    /// Entry seqs to acknowledge: each of their orders stored or dead-lettered with a reason.
    acked: Vec<u64>,
    unsettled: Vec<Unsettled>,
}

impl SkuConsumer {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let labels = [("sku", self.sku.to_string())];
        // Registered at zero, so dashboards show the series before the first event.
        for counter in [
            "seckill_orders_consumed_total",
            "seckill_orders_dead_letters_total",
            "seckill_orders_store_retries_total",
            "seckill_orders_feed_errors_total",
        ] {
            metrics::counter!(counter, &labels).increment(0);
        }
        metrics::gauge!("seckill_orders_lag_entries", &labels).set(0.0);
        metrics::gauge!("seckill_orders_lag_seconds", &labels).set(0.0);
        let mut last_claim = Instant::now();
        let mut last_trim = Instant::now();
        let mut behind_since = None;
        // The first pass claims at once: a restarted consumer's own entries have been idle
        // since it died.
        let mut first = true;
        while !*stop.borrow() {
            if first || last_claim.elapsed() >= self.config.claim_idle / 2 {
                match self.claim().await {
                    Ok(entries) if !entries.is_empty() => {
                        self.handle(entries, &mut stop).await;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(sku = %self.sku, "claim failed: {e}"),
                }
                first = false;
                last_claim = Instant::now();
            }
            let read = self.ledger.feed_read(
                &self.sku,
                &self.config.group,
                &self.config.consumer,
                self.config.batch,
                self.config.block,
            );
            let entries = tokio::select! {
                read = read => read,
                () = stopped(&mut stop) => return,
            };
            match entries {
                Ok(entries) if !entries.is_empty() => {
                    self.handle(entries, &mut stop).await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(sku = %self.sku, "order stream read failed: {e}");
                    metrics::counter!("seckill_orders_feed_errors_total", &labels).increment(1);
                    pause(Duration::from_millis(200), &mut stop).await;
                }
            }
            if last_trim.elapsed() >= self.config.trim_every {
                last_trim = Instant::now();
                self.publish_lag(&mut behind_since).await;
                match self.ledger.feed_trim(&self.sku, &self.config.group, self.config.trim_retain).await {
                    Ok(trimmed) if trimmed > 0 => tracing::debug!(sku = %self.sku, trimmed, "trimmed the order stream"),
                    Ok(_) => {}
                    Err(e) => tracing::debug!(sku = %self.sku, "trim failed: {e}"),
                }
            }
        }
    }

    /// Takes over entries idle for `claim_idle`. This consumer's own work is never among them:
    /// it handles a batch to the end before it claims again.
    async fn claim(&self) -> Result<Vec<FeedEntry>, ledger::LedgerError> {
        let (group, consumer) = (&self.config.group, &self.config.consumer);
        self.ledger.feed_claim(&self.sku, group, consumer, self.config.claim_idle, self.config.batch).await
    }

    /// Entries not in the store yet, and for how long the stream has had such a backlog (the
    /// events carry no time, so "seconds behind" is the age of the current backlog, seen at
    /// this cadence).
    async fn publish_lag(&self, behind_since: &mut Option<Instant>) {
        let Ok(lag) = self.ledger.feed_lag(&self.sku, &self.config.group).await else { return };
        let entries = lag.undelivered + lag.pending;
        let since = match entries {
            0 => None,
            _ => Some(behind_since.unwrap_or_else(Instant::now)),
        };
        *behind_since = since;
        let labels = [("sku", self.sku.to_string())];
        metrics::gauge!("seckill_orders_lag_entries", &labels).set(entries as f64);
        let seconds = since.map_or(0.0, |since| since.elapsed().as_secs_f64());
        metrics::gauge!("seckill_orders_lag_seconds", &labels).set(seconds);
    }

    /// Stores a batch and acknowledges what went in or to the dead letters. Returns once every
    /// entry is settled or deferred, or when stopping.
    pub async fn handle(&self, entries: Vec<FeedEntry>, stop: &mut watch::Receiver<bool>) -> Handled {
        let now = unix_ms();
        let mut batch = Batch::default();
        let mut readable = Readable { entries: Vec::new(), orders: Vec::new(), problems: Vec::new() };
        for entry in entries {
            match entry.events() {
                Ok(events) => {
                    let at = readable.entries.len();
                    readable.orders.extend(events.into_iter().map(|event| (at, self.order_of(event, now))));
                    readable.entries.push(entry);
                }
                Err(reason) => batch.unsettled.push(Unsettled {
                    letters: vec![(entry.seq, format!("unreadable order event: {reason}"))],
                    entry,
                    may_retry: true,
                    stored: 0,
                    whole: true,
                }),
            }
        }
        readable.problems = vec![None; readable.orders.len()];
        if !self.store_orders(&mut readable, stop).await {
            return batch.handled;
        }
        settle(readable, &mut batch);
        self.dead_letter_or_defer(&mut batch, now).await;
        if batch.handled.stored > 0 {
            self.settle_early_payments().await;
        }
        // An ack lost here only means a redelivery, which the keyed insert absorbs.
        if let Err(e) = self.ledger.feed_ack(&self.sku, &self.config.group, &batch.acked).await {
            tracing::debug!(sku = %self.sku, "ack failed ({e}); the entries will be delivered again");
        }
        metrics::counter!("seckill_orders_consumed_total", "sku" => self.sku.to_string())
            .increment(batch.handled.stored);
        batch.handled
    }

    /// Stores the batch's orders, noting against their entries which failed and which clash
    /// with another sale. False when stopped before the store took them.
    async fn store_orders(&self, readable: &mut Readable, stop: &mut watch::Receiver<bool>) -> bool {
        let rows: Vec<NewOrder> = readable.orders.iter().map(|(_, order)| order.clone()).collect();
        match self.store_retrying(&rows, stop).await {
            Some(Ok(inserted)) if inserted == rows.len() as u64 => {}
            Some(Ok(inserted)) => {
                debug_assert!(inserted < rows.len() as u64, "the store inserted more orders than it was given");
                self.vet_skipped(readable).await;
            }
            Some(Err(e)) => {
                // One row spoils the batch: store them one by one to find it.
                tracing::warn!(sku = %self.sku, "batch refused by the store ({e}); storing one by one");
                for (at, (_, order)) in readable.orders.iter().enumerate() {
                    match self.store_retrying(std::slice::from_ref(order), stop).await {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            readable.problems[at] = Some(Problem::Failed(format!("the store refused the order: {e}")))
                        }
                        None => return false,
                    }
                }
            }
            None => return false,
        }
        true
    }

    /// Some rows of a batch were skipped: each must be a redelivery of what is stored, or it is
    /// a sale the store has no order for.
    async fn vet_skipped(&self, readable: &mut Readable) {
        for (at, (_, order)) in readable.orders.iter().enumerate() {
            let problem = match self.store.get(&order.id).await {
                Ok(Some(stored)) if stored.new.sku == order.sku && stored.new.stream_seq == order.stream_seq => {
                    continue
                }
                Ok(Some(stored)) => Problem::Clash(format!(
                    "order id {} is already stored for another sale ({} seq {})",
                    order.id, stored.new.sku, stored.new.stream_seq
                )),
                Ok(None) => Problem::Clash(format!(
                    "stream seq {} of {} is already stored as another order (the stream was reset, or \
                     a failover undid a sale); this sale has no order",
                    order.stream_seq, order.sku
                )),
                Err(e) => {
                    tracing::warn!(sku = %self.sku, seq = order.stream_seq, "could not check a skipped order ({e}); retried later");
                    Problem::Deferred
                }
            };
            readable.problems[at] = Some(problem);
        }
    }

    /// Entries with a failed order wait for another delivery while they have deliveries left;
    /// the rest, and every clash at once, have those orders dead-lettered, and are acknowledged
    /// once every letter is written.
    async fn dead_letter_or_defer(&self, batch: &mut Batch, now_ms: u64) {
        for Unsettled { entry, letters, may_retry, stored, whole } in std::mem::take(&mut batch.unsettled) {
            if may_retry && entry.deliveries <= self.config.max_deliveries {
                let reason = &letters.first().map_or("", |(_, reason)| reason.as_str());
                tracing::warn!(sku = %self.sku, seq = entry.seq, deliveries = entry.deliveries, "{reason}; retried later");
                batch.handled.deferred += 1;
                continue;
            }
            let mut written = 0;
            for (seq, reason) in &letters {
                // An unreadable entry is lettered whole, under its own seq.
                let fields = if whole { entry.fields.clone() } else { entry.fields_of_order(*seq) };
                let letter = DeadLetter {
                    sku: self.sku.to_string(),
                    stream_seq: *seq,
                    fields,
                    reason: reason.clone(),
                    deliveries: entry.deliveries,
                    at_ms: now_ms,
                };
                match self.store.dead_letter(&letter).await {
                    Ok(()) => {
                        tracing::error!(sku = %self.sku, seq, reason = %letter.reason, "order event dead-lettered");
                        metrics::counter!("seckill_orders_dead_letters_total", "sku" => self.sku.to_string())
                            .increment(1);
                        written += 1;
                    }
                    Err(e) => tracing::warn!(sku = %self.sku, seq, "dead letter not written ({e}); retried later"),
                }
            }
            if written == letters.len() {
                batch.acked.push(entry.seq);
                batch.handled.stored += stored;
                batch.handled.dead_lettered += written as u64;
            } else {
                batch.handled.deferred += 1;
            }
        }
    }

    /// Payments that arrived before these orders (the consumer was behind) settle now; the
    /// sweeper's rounds catch any this misses.
    async fn settle_early_payments(&self) {
        match self.store.settle_awaiting(self.config.batch).await {
            Ok(settled) if !settled.is_empty() => {
                tracing::info!(sku = %self.sku, settled = settled.len(), "applied payments that came before their orders");
                for (_, outcome) in &settled {
                    metrics::counter!("seckill_orders_early_payments_total", "outcome" => outcome.label()).increment(1);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(sku = %self.sku, "early payments not settled now ({e}); the sweeper will"),
        }
    }

    /// Inserts `rows`, retrying while the store is unreachable; `None` when stopped first,
    /// `Some(Err)` when the store refused the rows themselves.
    async fn store_retrying(
        &self,
        rows: &[NewOrder],
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Result<u64, StoreError>> {
        if rows.is_empty() {
            return Some(Ok(0));
        }
        let mut pause_for = Duration::from_millis(50);
        loop {
            match self.store.insert_batch(rows).await {
                Err(StoreError::Unavailable(e)) => {
                    tracing::warn!(sku = %self.sku, "order store unavailable ({e}); retrying");
                    metrics::counter!("seckill_orders_store_retries_total", "sku" => self.sku.to_string()).increment(1);
                    if !pause(pause_for, stop).await {
                        return None;
                    }
                    pause_for = (pause_for * 2).min(STORE_RETRY_MAX);
                }
                other => return Some(other),
            }
        }
    }

    fn order_of(&self, event: ledger::OrderEvent, now_ms: u64) -> NewOrder {
        // The sale's own time, so an order stored late (a backlog, a store outage) does not give
        // its buyer longer to pay; the consumer's clock for entries written without one.
        let sold_at = if event.at_ms > 0 { event.at_ms } else { now_ms };
        // The terms in force at the sale, as its event carries them; the SKU's current terms
        // only for events written before events carried them.
        let pricing = event.pricing.clone().unwrap_or_else(|| ledger::Pricing::of(&self.terms));
        NewOrder {
            id: event.order_id.0,
            sku: self.sku.to_string(),
            user: event.user.to_string(),
            qty: event.qty,
            node: event.node.to_string(),
            idempotency_key: event.key.to_string(),
            stream_seq: event.seq,
            unit_price: pricing.price,
            currency: pricing.currency,
            created_at_ms: sold_at,
            pay_deadline_ms: sold_at.saturating_add(pricing.pay_timeout_s.saturating_mul(1000)),
        }
    }
}

/// Sleeps `period` unless stopped first; says whether to go on.
/// Sorts a stored batch's entries: acknowledged (every order stored), pending (an order to check
/// again later), or unsettled (orders to dead-letter, now or after their last delivery).
fn settle(readable: Readable, batch: &mut Batch) {
    let count = readable.entries.len();
    let mut worst: Vec<Option<Problem>> = vec![None; count];
    let mut stored = vec![0u64; count];
    let mut letters: Vec<Vec<(u64, String)>> = vec![Vec::new(); count];
    for ((at, order), problem) in readable.orders.iter().zip(readable.problems) {
        match &problem {
            None => stored[*at] += 1,
            Some(Problem::Failed(reason) | Problem::Clash(reason)) => {
                letters[*at].push((order.stream_seq, reason.clone()))
            }
            Some(Problem::Deferred) => {}
        }
        if let Some(problem) = problem {
            if worst[*at].as_ref().is_none_or(|seen| problem < *seen) {
                worst[*at] = Some(problem);
            }
        }
    }
    let sorted = readable.entries.into_iter().zip(worst).zip(stored).zip(letters);
    for (((entry, worst), stored), letters) in sorted {
        let may_retry = match worst {
            None => {
                batch.acked.push(entry.seq);
                batch.handled.stored += stored;
                continue;
            }
            Some(Problem::Deferred) => {
                batch.handled.deferred += 1;
                continue;
            }
            Some(Problem::Failed(_)) => true,
            Some(Problem::Clash(_)) => false,
        };
        batch.unsettled.push(Unsettled { entry, letters, may_retry, stored, whole: false });
    }
}

pub(crate) async fn pause(period: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(period) => true,
        () = stopped(stop) => false,
    }
}

/// Returns once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The SKUs a service consumes, with the terms their orders are priced on.
pub type Catalogue = BTreeMap<SkuId, SkuTerms>;
