//! The ledger kept in process memory: the zero-setup default, and the reference the Redis
//! scripts are checked against (both run the contract `suite`).
//!
//! Each step that changes a SKU's books asserts, in debug builds, the invariants it could break
//! (listed on `Book`), so a broken step panics in tests at the step, not some calls later.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::types::stored;
use crate::*;

mod room;

/// Stored decisions beyond this many trigger a sweep of expired ones, so memory stays bounded by
/// the decisions made within one TTL. After a sweep the next one waits until the map has doubled,
/// so sweeping stays amortized O(1) per decision even when nothing has expired yet.
const DECISIONS_SWEEP_AT: usize = 100_000;

/// The same rule for unspent submit tokens: memory stays bounded by the tokens issued within one
/// token TTL.
const TOKENS_SWEEP_AT: usize = 100_000;

/// One SKU's books. Invariants, each asserted (`debug_assert!`) right after the step that
/// could break it, and the first also around every operation (`EmbeddedLedger::with_book`):
/// - `sold + remaining == total`; `remaining` never goes below zero (it is `u64`: a step that
///   takes more than is left is refused before it subtracts).
/// - every unit sold is counted once in `sold_by_epoch` and stays there:
///   `sum(sold_by_epoch) == sold + released`.
/// - a buyer's count never exceeds the per-user limit through a sale, and a release gives back
///   no more than the buyer's count holds.
/// - a sale's record is released at most once, and `released` is the sum of the release log.
/// - the order stream holds every sale's event from `orders_trimmed + 1` to `order_seq`.
/// - an ended epoch never comes back: `ended` only grows.
/// - a transfer moves unsold units only, once per id and side: `transferred_out` is the sum of
///   `transfers_out`, `transferred_in` of `transfers_in`, and neither touches `sold`.
struct Book {
    total: u64,
    sold: u64,
    remaining: u64,
    per_user_limit: u32,
    closed: bool,
    require_token: bool,
    order_seq: u64,
    sold_by_node: BTreeMap<NodeId, u64>,
    sold_by_epoch: HashMap<String, u64>,
    /// Per node, the highest epoch the coordinator ended: batches of it or older are refused.
    ended: HashMap<NodeId, u64>,
    bought_by_user: HashMap<UserId, u64>,
    /// (buyer, idempotency key) → (fingerprint, encoded decision, expiry). A key is its
    /// buyer's: another buyer's purchase under the same key is a purchase of its own.
    decisions: HashMap<(UserId, IdempotencyKey), (String, String, Instant)>,
    /// Size of `decisions` at which the next sweep runs.
    next_sweep_at: usize,
    /// Unspent submit tokens → (the user it was issued to, expiry).
    tokens: HashMap<SubmitToken, (UserId, Instant)>,
    /// The token each buyer holds → (token, expiry): `token.lua`'s holder keys.
    token_holders: HashMap<UserId, (SubmitToken, Instant)>,
    /// Size of `tokens` at which the next sweep runs.
    next_token_sweep_at: usize,
    /// The token window being counted and the tokens issued in it (the same bound as Redis').
    token_window: (u64, u64),
    /// The order stream from `orders_trimmed + 1` on: seq n sits at index n - 1 - orders_trimmed.
    orders: VecDeque<OrderEvent>,
    orders_trimmed: u64,
    released: u64,
    /// The terms order events carry (pricing.lua).
    pricing: Pricing,
    /// The ledger's record of every sale by order id, kept `sale_record_ttl` (on Redis, the
    /// sale's idempotency record, kept as long): what a release is checked against, and
    /// whether it happened.
    sales: HashMap<OrderId, SaleRecord>,
    /// Size of `sales` at which the next sweep of expired records runs.
    next_sales_sweep_at: usize,
    releases: Vec<ReleaseEvent>,
    /// Consumer groups of the order stream, by name.
    groups: HashMap<String, FeedGroup>,
    transferred_out: u64,
    transferred_in: u64,
    /// Transfer id → units it took out (`transfer_out.lua`'s `out:<id>` fields).
    transfers_out: HashMap<u64, u64>,
    /// Transfer id → units it put in (`transfer_in.lua`'s `in:<id>` fields).
    transfers_in: HashMap<u64, u64>,
    /// The SKU's waiting room (`room.lua`'s keys); empty for a SKU without one.
    room: room::Room,
}

/// What a release needs to know about one sale.
struct SaleRecord {
    /// The sale's idempotency key: a release names it, as the Redis ledger finds the record
    /// under it.
    key: IdempotencyKey,
    user: UserId,
    qty: u32,
    expires_at: Instant,
    released: bool,
}

/// One consumer group's place in the order stream, as Redis keeps it.
#[derive(Default)]
struct FeedGroup {
    last_delivered: u64,
    /// Delivered, not acknowledged: seq → (consumer, last delivery, deliveries).
    pending: BTreeMap<u64, (String, Instant, u64)>,
}

impl Book {
    fn status(&self) -> SkuStatus {
        SkuStatus {
            total: self.total,
            sold: self.sold,
            remaining: self.remaining,
            per_user_limit: self.per_user_limit,
            sold_by_node: self.sold_by_node.clone(),
            closed: self.closed,
            require_token: self.require_token,
            released: self.released,
            orders: self.order_seq,
            transferred_out: self.transferred_out,
            transferred_in: self.transferred_in,
        }
    }

    /// `transfer_out.lua`: the least of `most` and what remains (nothing once closed), once per id.
    fn transfer_out(&mut self, transfer: u64, most: u64) -> u64 {
        if let Some(taken) = self.transfers_out.get(&transfer) {
            return *taken;
        }
        let sold_before = self.sold;
        let taken = if self.closed { 0 } else { most.min(self.remaining) };
        self.remaining -= taken;
        self.total -= taken;
        self.transferred_out += taken;
        self.transfers_out.insert(transfer, taken);
        debug_assert_eq!(self.sold, sold_before, "a transfer never takes a sold unit");
        debug_assert_eq!(
            self.sold + self.remaining,
            self.total,
            "a transfer takes from remaining what it takes from total"
        );
        debug_assert_eq!(
            self.transfers_out.values().sum::<u64>(),
            self.transferred_out,
            "every unit transferred out is recorded under its transfer id, once"
        );
        taken
    }

    /// `transfer_in.lua`: `units` into total and remaining, once per id.
    fn transfer_in(&mut self, transfer: u64, units: u64) -> Result<(), LedgerError> {
        if self.transfers_in.contains_key(&transfer) {
            return Ok(());
        }
        let total = self.total.checked_add(units).filter(|total| *total <= TOTAL_MAX);
        let Some(total) = total else {
            return Err(LedgerError::Corrupt(format!(
                "a transfer of {units} units would lift the total past TOTAL_MAX"
            )));
        };
        let sold_before = self.sold;
        self.total = total;
        self.remaining += units;
        self.transferred_in += units;
        self.transfers_in.insert(transfer, units);
        debug_assert_eq!(self.sold, sold_before, "a transfer in never touches sold units");
        debug_assert_eq!(self.sold + self.remaining, self.total, "a transfer adds to remaining what it adds to total");
        debug_assert_eq!(
            self.transfers_in.values().sum::<u64>(),
            self.transferred_in,
            "every unit transferred in is recorded under its transfer id, once"
        );
        Ok(())
    }

    fn order(&self, seq: u64) -> Option<&OrderEvent> {
        let at = seq.checked_sub(self.orders_trimmed + 1)?;
        self.orders.get(usize::try_from(at).ok()?)
    }

    fn release(&mut self, release: &Release, now: Instant) -> Result<ReleaseOutcome, LedgerError> {
        let Some(record) = self.sales.get_mut(&release.order_id).filter(|record| record.expires_at > now) else {
            return Ok(ReleaseOutcome::NeverSold);
        };
        if record.user != release.user || record.qty != release.qty || record.key != release.key {
            return Ok(ReleaseOutcome::NeverSold);
        }
        if record.released {
            return Ok(ReleaseOutcome::AlreadyReleased);
        }
        let qty = u64::from(release.qty);
        if self.sold < qty {
            return Err(LedgerError::Corrupt("a release larger than what is sold".into()));
        }
        debug_assert!(
            self.bought_by_user.get(&release.user).is_some_and(|bought| *bought >= qty),
            "a release gives back no more than its buyer's count holds"
        );
        self.sold -= qty;
        self.remaining += qty;
        self.released += qty;
        if let Some(bought) = self.bought_by_user.get_mut(&release.user) {
            *bought = bought.saturating_sub(qty);
            if *bought == 0 {
                self.bought_by_user.remove(&release.user);
            }
        }
        debug_assert!(!record.released, "a sale's record is released at most once");
        record.released = true;
        let seq = self.releases.len() as u64 + 1;
        self.releases.push(ReleaseEvent {
            seq,
            order_id: release.order_id.clone(),
            user: release.user.clone(),
            qty: release.qty,
        });
        debug_assert_eq!(self.sold + self.remaining, self.total, "a release moves units from sold to remaining");
        debug_assert_eq!(
            self.releases.iter().map(|logged| u64::from(logged.qty)).sum::<u64>(),
            self.released,
            "every released unit is in the release log, once"
        );
        self.debug_assert_epochs_count_every_sale();
        Ok(ReleaseOutcome::Released { remaining: self.remaining })
    }

    fn feed_entry(&self, seq: u64, deliveries: u64) -> Option<FeedEntry> {
        let event = self.order(seq)?;
        let fields = vec![
            ("order_id".to_string(), event.order_id.to_string()),
            ("key".to_string(), event.key.to_string()),
            ("user".to_string(), event.user.to_string()),
            ("qty".to_string(), event.qty.to_string()),
            ("node".to_string(), event.node.to_string()),
            ("at".to_string(), event.at_ms.to_string()),
        ];
        let mut fields = fields;
        if let Some(pricing) = &event.pricing {
            fields.push(("price".to_string(), pricing.price.to_string()));
            fields.push(("currency".to_string(), pricing.currency.clone()));
            fields.push(("pay_timeout_s".to_string(), pricing.pay_timeout_s.to_string()));
        }
        Some(FeedEntry { seq, fields, deliveries, unreadable: None })
    }

    fn check_invariant(&self) -> Result<(), LedgerError> {
        if self.sold + self.remaining != self.total {
            return Err(LedgerError::Corrupt("sold + remaining ~= total".into()));
        }
        Ok(())
    }

    /// Every unit sold is in the count of the epoch that sold it, and stays there when it is
    /// released: what `end_epoch` answers the coordinator must add up to the sales. O(epochs),
    /// so debug builds only.
    fn debug_assert_epochs_count_every_sale(&self) {
        debug_assert_eq!(
            self.sold_by_epoch.values().sum::<u64>(),
            self.sold + self.released,
            "the epochs' counts add up to every unit sold, released or not"
        );
    }

    /// The order stream holds one event per sale from `orders_trimmed + 1` to `order_seq`.
    fn debug_assert_stream_holds_every_sale(&self) {
        debug_assert_eq!(
            self.orders_trimmed + self.orders.len() as u64,
            self.order_seq,
            "the order stream holds every untrimmed sale's event"
        );
    }

    fn decide(&mut self, sku: &SkuId, seller: &Seller, purchase: &Purchase, ttls: Ttls, now: Instant) -> Verdict {
        let fingerprint = purchase.fingerprint();
        let buyer_key = (purchase.user.clone(), purchase.key.clone());
        if let Some((stored_fingerprint, decision, expires_at)) = self.decisions.get(&buyer_key) {
            if *expires_at > now {
                if *stored_fingerprint != fingerprint {
                    return Verdict::KeyReused;
                }
                return match stored::decode(decision) {
                    Some(decision) => Verdict::Replayed(decision),
                    None => unreachable!("the embedded ledger only stores what it encoded"),
                };
            }
        }
        let qty = u64::from(purchase.qty);
        let bought = self.bought_by_user.get(&purchase.user).copied().unwrap_or(0);
        let decision = if self.require_token && !self.spend_token(purchase, now) {
            Decision::TokenInvalid
        } else if self.closed {
            Decision::Ended
        } else if self.per_user_limit > 0 && bought + qty > u64::from(self.per_user_limit) {
            Decision::UserLimit
        } else if self.remaining < qty {
            Decision::SoldOut
        } else {
            Decision::Purchased(self.sell(sku, seller, purchase, ttls, now))
        };
        if self.decisions.len() >= self.next_sweep_at {
            self.decisions.retain(|_, (_, _, expires_at)| *expires_at > now);
            self.next_sweep_at = (self.decisions.len() * 2).max(DECISIONS_SWEEP_AT);
        }
        self.decisions.insert(buyer_key, (fingerprint, stored::encode(&decision), now + ttls.idempotency));
        Verdict::Fresh(decision)
    }

    /// Sells `purchase` (every check passed): moves its units from remaining to sold, counts
    /// them for the seller's epoch and the buyer, appends its order event and records the sale
    /// for its release.
    fn sell(&mut self, sku: &SkuId, seller: &Seller, purchase: &Purchase, ttls: Ttls, now: Instant) -> Receipt {
        let qty = u64::from(purchase.qty);
        debug_assert!(qty <= self.remaining, "a sale takes no more than what remains");
        self.remaining -= qty;
        self.sold += qty;
        self.order_seq += 1;
        let node = &seller.node;
        *self.sold_by_node.entry(node.clone()).or_insert(0) += qty;
        *self.sold_by_epoch.entry(seller.epoch_key()).or_insert(0) += qty;
        let bought = self.bought_by_user.entry(purchase.user.clone()).or_insert(0);
        *bought += qty;
        debug_assert!(
            self.per_user_limit == 0 || *bought <= u64::from(self.per_user_limit),
            "a sale keeps its buyer within the per-user limit"
        );
        debug_assert_eq!(self.sold + self.remaining, self.total, "a sale moves units from remaining to sold");
        self.debug_assert_epochs_count_every_sale();
        let receipt = Receipt {
            order_id: purchase.order_id.clone().unwrap_or_else(|| OrderId::numbered(sku, self.order_seq)),
            node: node.clone(),
            qty: purchase.qty,
        };
        self.orders.push_back(OrderEvent {
            seq: self.order_seq,
            order_id: receipt.order_id.clone(),
            key: purchase.key.clone(),
            user: purchase.user.clone(),
            qty: purchase.qty,
            node: node.clone(),
            at_ms: crate::unix_ms(),
            pricing: Some(self.pricing.clone()),
        });
        self.debug_assert_stream_holds_every_sale();
        if self.sales.len() >= self.next_sales_sweep_at {
            self.sales.retain(|_, record| record.expires_at > now);
            self.next_sales_sweep_at = (self.sales.len() * 2).max(DECISIONS_SWEEP_AT);
        }
        let record = SaleRecord {
            key: purchase.key.clone(),
            user: purchase.user.clone(),
            qty: purchase.qty,
            expires_at: now + ttls.sale_record,
            released: false,
        };
        self.sales.insert(receipt.order_id.clone(), record);
        receipt
    }

    /// Spends the purchase's token if it is live and issued to its user, with the buyer's
    /// holder entry, and says whether it did; another user's token stays with its owner, as in
    /// `confirm.lua`.
    fn spend_token(&mut self, purchase: &Purchase, now: Instant) -> bool {
        let Some(token) = &purchase.token else { return false };
        let live_and_theirs =
            self.tokens.get(token).is_some_and(|(user, expires_at)| *expires_at > now && *user == purchase.user);
        if live_and_theirs {
            self.tokens.remove(token);
            self.token_holders.remove(&purchase.user);
            // A room's ticket is such a token: spent, it no longer counts as a live admission.
            self.room.ticket_spent(&purchase.user);
        }
        live_and_theirs
    }

    /// The live token `user` holds and the time it has left.
    fn held_token(&self, user: &UserId, now: Instant) -> Option<IssuedToken> {
        let (token, expires_at) = self.token_holders.get(user)?;
        let expires_in = expires_at.checked_duration_since(now).filter(|left| !left.is_zero())?;
        Some(IssuedToken { token: token.clone(), expires_in })
    }

    /// Stores a token, held by `user`, unless one with the same text is live; says whether it
    /// stored it.
    fn store_token(&mut self, token: &SubmitToken, user: &UserId, expires_at: Instant, now: Instant) -> bool {
        if self.tokens.get(token).is_some_and(|(_, live_until)| *live_until > now) {
            return false;
        }
        if self.tokens.len() >= self.next_token_sweep_at {
            self.tokens.retain(|_, (_, live_until)| *live_until > now);
            self.token_holders.retain(|_, (_, live_until)| *live_until > now);
            self.next_token_sweep_at = (self.tokens.len() * 2).max(TOKENS_SWEEP_AT);
        }
        self.tokens.insert(token.clone(), (user.clone(), expires_at));
        self.token_holders.insert(user.clone(), (token.clone(), expires_at));
        true
    }
}

/// How long the ledger keeps what it keeps per purchase.
#[derive(Clone, Copy)]
struct Ttls {
    /// A decision, answering retries of its key.
    idempotency: Duration,
    /// A sale's record, against which its release is checked.
    sale_record: Duration,
}

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
