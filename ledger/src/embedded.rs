//! The ledger kept in process memory: the zero-setup default, and the reference the Redis
//! scripts are checked against (both run the contract `suite`).
//!
//! Each step that changes a SKU's books asserts, in debug builds, the invariants it could break
//! (listed on `Book`), so a broken step panics in tests at the step, not some calls later.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::*;

mod book;
mod room;

use book::{Book, Ttls, DECISIONS_SWEEP_AT, TOKENS_SWEEP_AT};

/// The in-process ledger. One std `Mutex` guards all books: every operation is a short
/// in-memory step with no `.await` inside, and holding it is what makes a batch atomic.
pub struct EmbeddedLedger {
    books: Mutex<HashMap<SkuId, Book>>,
    ttls: Ttls,
    /// Fresh submit tokens per SKU and window, as `[ledger] token_issue_max` is for Redis.
    token_issue_max: u64,
    /// Wakes blocked feed readers when a sale appends an order event.
    appended: tokio::sync::Notify,
}

impl EmbeddedLedger {
    pub fn new(idempotency_ttl: Duration) -> Self {
        Self {
            books: Mutex::new(HashMap::new()),
            ttls: Ttls { idempotency: idempotency_ttl, sale_record: crate::SALE_RECORD_TTL_DEFAULT },
            token_issue_max: crate::TOKEN_ISSUE_MAX_DEFAULT,
            appended: tokio::sync::Notify::new(),
        }
    }

    /// The same ledger keeping each sale's record (what its release is checked against) for
    /// `ttl` (default [`crate::SALE_RECORD_TTL_DEFAULT`]).
    pub fn with_sale_record_ttl(mut self, ttl: Duration) -> Self {
        self.ttls.sale_record = ttl;
        self
    }

    /// The same ledger issuing at most `max` fresh submit tokens per SKU and window (default
    /// [`crate::TOKEN_ISSUE_MAX_DEFAULT`]).
    pub fn with_token_issue_max(mut self, max: u64) -> Self {
        self.token_issue_max = max;
        self
    }

    fn with_book<T>(&self, sku: &SkuId, f: impl FnOnce(&mut Book) -> Result<T, LedgerError>) -> Result<T, LedgerError> {
        // A poisoned lock means a thread panicked mid-update; the books may be half written, so
        // refusing to go on is the only safe answer.
        let mut books = self.books.lock().map_err(|_| LedgerError::Corrupt("ledger lock poisoned".into()))?;
        let book = books.get_mut(sku).ok_or_else(|| LedgerError::Missing(sku.clone()))?;
        book.check_invariant()?;
        let result = f(book);
        assert_eq!(book.sold + book.remaining, book.total, "embedded ledger broke sold + remaining == total for {sku}");
        result
    }
}

impl Default for EmbeddedLedger {
    fn default() -> Self {
        Self::new(IDEMPOTENCY_TTL_DEFAULT)
    }
}

#[async_trait::async_trait]
impl LedgerReads for EmbeddedLedger {
    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| Ok(book.status()))
    }

    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        let limit = limit.min(ORDER_EVENTS_MAX);
        self.with_book(sku, |book| {
            let start = usize::try_from(after.saturating_sub(book.orders_trimmed)).unwrap_or(usize::MAX);
            Ok(book.orders.iter().skip(start).take(limit).cloned().collect())
        })
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn room_figures(&self, sku: &SkuId) -> Result<Option<RoomFigures>, LedgerError> {
        self.with_book(sku, |book| Ok(book.room_figures(crate::unix_ms())))
    }
}

#[async_trait::async_trait]
impl SalesLedger for EmbeddedLedger {
    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<IssuedToken, LedgerError> {
        let ttl = ttl.min(TOKEN_TTL_MAX);
        for _ in 0..TOKEN_DRAWS_MAX {
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a token: {e}")))?;
            let now = Instant::now();
            let (window, retry_after_ms) = crate::token_window(crate::unix_ms(), ttl);
            let issued = self.with_book(sku, |book| {
                if let Some(held) = book.held_token(user, now) {
                    return Ok(Some(held));
                }
                if book.token_window.0 != window {
                    book.token_window = (window, 0);
                }
                book.token_window.1 += 1;
                if book.token_window.1 > self.token_issue_max {
                    return Err(LedgerError::TokensExhausted { retry_after_ms });
                }
                let stored = book.store_token(&token, user, now + ttl, now);
                Ok(stored.then(|| IssuedToken { token: token.clone(), expires_in: ttl }))
            })?;
            if let Some(issued) = issued {
                return Ok(issued);
            }
        }
        Err(LedgerError::Corrupt(
            "fresh submit tokens keep colliding with stored ones; is the random source broken?".into(),
        ))
    }

    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let now = Instant::now();
        let ttls = self.ttls;
        let outcome = self.with_book(sku, |book| {
            if seller.epoch > 0 && book.ended.get(&seller.node).is_some_and(|ended| *ended >= seller.epoch) {
                return Err(LedgerError::EpochEnded(format!("{} was ended by the coordinator", seller.epoch_key())));
            }
            let verdicts: Vec<Verdict> =
                purchases.iter().map(|purchase| book.decide(sku, seller, purchase, ttls, now)).collect();
            debug_assert_eq!(verdicts.len(), purchases.len(), "a batch decides every purchase, once");
            Ok(BatchOutcome { verdicts, sold: book.sold, remaining: book.remaining, released: book.released })
        })?;
        self.appended.notify_waiters();
        Ok(outcome)
    }

    async fn room_join(&self, sku: &SkuId, call: RoomCall<'_>, users: &[UserId]) -> Result<RoomView, LedgerError> {
        assert!(users.len() <= room::TICK_USERS_MAX, "a room call names at most ROOM_TICK_USERS_MAX buyers");
        self.with_book(sku, |book| book.room_call(call, true, users))
    }

    async fn room_tick(&self, sku: &SkuId, call: RoomCall<'_>, present: &[UserId]) -> Result<RoomView, LedgerError> {
        assert!(present.len() <= room::TICK_USERS_MAX, "a room call names at most ROOM_TICK_USERS_MAX buyers");
        self.with_book(sku, |book| book.room_call(call, false, present))
    }

    async fn room_admissions(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<Admission>, LedgerError> {
        self.with_book(sku, |book| Ok(book.room.admissions(after, limit)))
    }
}

#[async_trait::async_trait]
impl CatalogueLedger for EmbeddedLedger {
    async fn create_sku(&self, sku: &SkuId, terms: &SkuTerms) -> Result<Created, LedgerError> {
        let mut books = self.books.lock().map_err(|_| LedgerError::Corrupt("ledger lock poisoned".into()))?;
        if let Some(book) = books.get(sku) {
            return Ok(Created::Existing(book.status()));
        }
        let book = Book {
            total: terms.total,
            sold: 0,
            remaining: terms.total,
            per_user_limit: terms.per_user_limit,
            closed: false,
            require_token: terms.requires_token(),
            order_seq: 0,
            sold_by_node: BTreeMap::new(),
            sold_by_epoch: HashMap::new(),
            ended: HashMap::new(),
            bought_by_user: HashMap::new(),
            decisions: HashMap::new(),
            next_sweep_at: DECISIONS_SWEEP_AT,
            tokens: HashMap::new(),
            token_holders: HashMap::new(),
            next_token_sweep_at: TOKENS_SWEEP_AT,
            token_window: (0, 0),
            orders: VecDeque::new(),
            orders_trimmed: 0,
            released: 0,
            pricing: Pricing::of(terms),
            sales: HashMap::new(),
            next_sales_sweep_at: DECISIONS_SWEEP_AT,
            releases: Vec::new(),
            groups: HashMap::new(),
            transferred_out: 0,
            transferred_in: 0,
            transfers_out: HashMap::new(),
            transfers_in: HashMap::new(),
            room: room::Room::default(),
        };
        let status = book.status();
        books.insert(sku.clone(), book);
        Ok(Created::New(status))
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| {
            let total_before = book.total;
            if total > book.total {
                book.remaining += total - book.total;
                book.total = total;
            }
            debug_assert!(book.total >= total_before, "a restock never lowers the total");
            debug_assert_eq!(
                book.sold + book.remaining,
                book.total,
                "a restock adds to remaining what it adds to total"
            );
            Ok(book.status())
        })
    }

    async fn set_pricing(&self, sku: &SkuId, pricing: &Pricing) -> Result<(), LedgerError> {
        self.with_book(sku, |book| {
            book.pricing = pricing.clone();
            Ok(())
        })
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| {
            book.closed = true;
            Ok(book.status())
        })
    }

    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.with_book(sku, |book| {
            let ended = book.ended.entry(seller.node.clone()).or_insert(0);
            let ended_before = *ended;
            *ended = (*ended).max(seller.epoch);
            debug_assert!(*ended >= ended_before && *ended >= seller.epoch, "an ended epoch never comes back");
            Ok(book.sold_by_epoch.get(&seller.epoch_key()).copied().unwrap_or(0))
        })
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.with_book(sku, |book| Ok(book.sold_by_epoch.get(&seller.epoch_key()).copied().unwrap_or(0)))
    }

    async fn transfer_out(&self, stripe: &SkuId, transfer: u64, most: u64) -> Result<u64, LedgerError> {
        self.with_book(stripe, |book| Ok(book.transfer_out(transfer, most)))
    }

    async fn transfer_in(&self, stripe: &SkuId, transfer: u64, units: u64) -> Result<SkuStatus, LedgerError> {
        self.with_book(stripe, |book| {
            book.transfer_in(transfer, units)?;
            Ok(book.status())
        })
    }
}

#[async_trait::async_trait]
impl OrderFeed for EmbeddedLedger {
    async fn release(&self, sku: &SkuId, release: &Release) -> Result<ReleaseOutcome, LedgerError> {
        let now = Instant::now();
        self.with_book(sku, |book| book.release(release, now))
    }

    async fn releases(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<ReleaseEvent>, LedgerError> {
        let limit = limit.min(ORDER_EVENTS_MAX);
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        self.with_book(sku, |book| Ok(book.releases.iter().skip(start).take(limit).cloned().collect()))
    }

    async fn feed_read(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        let deadline = Instant::now() + block;
        loop {
            // Registered before the read, so a sale between the read and the wait still wakes it.
            let appended = self.appended.notified();
            let now = Instant::now();
            let entries = self.with_book(sku, |book| {
                let next_seq = book.order_seq;
                let first_kept = book.orders_trimmed + 1;
                let state = book.groups.entry(group.to_string()).or_default();
                let from = state.last_delivered.max(first_kept - 1) + 1;
                let to = next_seq.min(from.saturating_add(count as u64).saturating_sub(1));
                let seqs: Vec<u64> = (from..=to).collect();
                if let Some(last) = seqs.last() {
                    state.last_delivered = *last;
                }
                debug_assert!(state.last_delivered <= next_seq, "a group is never delivered past the stream's end");
                for seq in &seqs {
                    state.pending.insert(*seq, (consumer.to_string(), now, 1));
                }
                Ok(seqs.into_iter().filter_map(|seq| book.feed_entry(seq, 1)).collect::<Vec<_>>())
            })?;
            if !entries.is_empty() || now >= deadline {
                return Ok(entries);
            }
            let _ = tokio::time::timeout(deadline - now, appended).await;
        }
    }

    async fn feed_claim(
        &self,
        sku: &SkuId,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<FeedEntry>, LedgerError> {
        let now = Instant::now();
        self.with_book(sku, |book| {
            let first_kept = book.orders_trimmed + 1;
            let Some(state) = book.groups.get_mut(group) else { return Ok(Vec::new()) };
            // Trimmed entries leave the pending list, as XCLAIM drops deleted entries.
            state.pending.retain(|seq, _| *seq >= first_kept);
            let mut claimed = Vec::new();
            for (seq, (owner, delivered_at, deliveries)) in state.pending.iter_mut() {
                if claimed.len() >= count {
                    break;
                }
                if now.duration_since(*delivered_at) >= min_idle {
                    *owner = consumer.to_string();
                    *delivered_at = now;
                    *deliveries += 1;
                    claimed.push((*seq, *deliveries));
                }
            }
            Ok(claimed.into_iter().filter_map(|(seq, deliveries)| book.feed_entry(seq, deliveries)).collect())
        })
    }

    async fn feed_ack(&self, sku: &SkuId, group: &str, seqs: &[u64]) -> Result<(), LedgerError> {
        self.with_book(sku, |book| {
            if let Some(state) = book.groups.get_mut(group) {
                for seq in seqs {
                    state.pending.remove(seq);
                }
            }
            Ok(())
        })
    }

    async fn feed_lag(&self, sku: &SkuId, group: &str) -> Result<FeedLag, LedgerError> {
        self.with_book(sku, |book| {
            let (delivered, pending) =
                book.groups.get(group).map_or((0, 0), |state| (state.last_delivered, state.pending.len() as u64));
            Ok(FeedLag { undelivered: book.order_seq.saturating_sub(delivered.max(book.orders_trimmed)), pending })
        })
    }

    async fn feed_trim(&self, sku: &SkuId, group: &str, retain: u64) -> Result<u64, LedgerError> {
        self.with_book(sku, |book| {
            let Some(state) = book.groups.get(group) else { return Ok(0) };
            let acked_below = state.pending.keys().next().copied().unwrap_or(state.last_delivered + 1);
            let keep_from = acked_below.min(book.order_seq.saturating_sub(retain) + 1);
            let mut dropped = 0;
            while book.orders_trimmed + 1 < keep_from && book.orders.pop_front().is_some() {
                book.orders_trimmed += 1;
                dropped += 1;
            }
            debug_assert!(
                state.pending.keys().next().is_none_or(|oldest| *oldest > book.orders_trimmed),
                "a trim drops only what the group acknowledged"
            );
            book.debug_assert_stream_holds_every_sale();
            Ok(dropped)
        })
    }
}

#[cfg(test)]
mod tests {
    //! The pair assertions fire: a book broken behind the ledger's back panics at the first step
    //! that relies on what was broken (debug builds, where `debug_assert!` runs).

    use super::*;

    fn sku() -> SkuId {
        SkuId::new("pairs").unwrap()
    }

    fn buy(key: &str, user: &str) -> Purchase {
        Purchase {
            key: IdempotencyKey::new(key).unwrap(),
            user: UserId::new(user).unwrap(),
            qty: 1,
            token: None,
            order_id: Some(OrderId(format!("order-{key}"))),
        }
    }

    /// A ledger holding `sku()` with 10 units, where `break_book` has changed the books.
    async fn broken(break_book: impl FnOnce(&mut Book)) -> EmbeddedLedger {
        let ledger = EmbeddedLedger::default();
        ledger.create_sku(&sku(), &SkuTerms::new(10)).await.unwrap();
        let seller = Seller::new(NodeId::new("n1").unwrap(), 1);
        ledger.confirm(&sku(), &seller, &[buy("k1", "alice")]).await.unwrap();
        break_book(ledger.books.lock().unwrap().get_mut(&sku()).unwrap());
        ledger
    }

    #[cfg(debug_assertions)]
    #[tokio::test]
    #[should_panic(expected = "the epochs' counts add up to every unit sold")]
    async fn a_sale_on_books_whose_epoch_counts_lost_a_unit_panics() {
        let ledger = broken(|book| book.sold_by_epoch.clear()).await;
        let seller = Seller::new(NodeId::new("n1").unwrap(), 1);
        let _ = ledger.confirm(&sku(), &seller, &[buy("k2", "bob")]).await;
    }

    #[cfg(debug_assertions)]
    #[tokio::test]
    #[should_panic(expected = "every unit transferred out is recorded under its transfer id, once")]
    async fn a_transfer_on_books_that_lost_a_transfer_record_panics() {
        let ledger = broken(|book| {
            book.transferred_out = 1;
            book.total -= 1;
            book.remaining -= 1;
        })
        .await;
        let _ = ledger.transfer_out(&sku(), 7, 2).await;
    }

    #[cfg(debug_assertions)]
    #[tokio::test]
    #[should_panic(expected = "a release gives back no more than its buyer's count holds")]
    async fn a_release_beyond_the_buyers_count_panics() {
        let ledger = broken(|book| book.bought_by_user.clear()).await;
        let release = Release {
            order_id: OrderId("order-k1".into()),
            key: IdempotencyKey::new("k1").unwrap(),
            user: UserId::new("alice").unwrap(),
            qty: 1,
            sold_at_ms: crate::unix_ms(),
        };
        let _ = ledger.release(&sku(), &release).await;
    }
}
