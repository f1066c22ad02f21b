//! The ledger kept in process memory: the zero-setup default, and the reference the Redis
//! scripts are checked against (both run [`crate::suite`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::types::stored;
use crate::*;

/// Stored decisions beyond this many trigger a sweep of expired ones, so memory stays bounded by
/// the decisions made within one TTL. After a sweep the next one waits until the map has doubled,
/// so sweeping stays amortized O(1) per decision even when nothing has expired yet.
const DECISIONS_SWEEP_AT: usize = 100_000;

/// The same rule for unspent submit tokens: memory stays bounded by the tokens issued within one
/// token TTL.
const TOKENS_SWEEP_AT: usize = 100_000;

/// One SKU's books. Invariant: `sold + remaining == total`.
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
    /// Idempotency key → (fingerprint, encoded decision, expiry).
    decisions: HashMap<IdempotencyKey, (String, String, Instant)>,
    /// Size of `decisions` at which the next sweep runs.
    next_sweep_at: usize,
    /// Unspent submit tokens → (the user it was issued to, expiry).
    tokens: HashMap<SubmitToken, (UserId, Instant)>,
    /// Size of `tokens` at which the next sweep runs.
    next_token_sweep_at: usize,
    /// The token window being counted and the tokens issued in it (the same bound as Redis').
    token_window: (u64, u64),
    orders: Vec<OrderEvent>,
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
        }
    }

    fn check_invariant(&self) -> Result<(), LedgerError> {
        if self.sold + self.remaining != self.total {
            return Err(LedgerError::Corrupt("sold + remaining ~= total".into()));
        }
        Ok(())
    }

    fn decide(&mut self, sku: &SkuId, seller: &Seller, purchase: &Purchase, ttl: Duration, now: Instant) -> Verdict {
        let fingerprint = purchase.fingerprint();
        if let Some((stored_fingerprint, decision, expires_at)) = self.decisions.get(&purchase.key) {
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
            self.remaining -= qty;
            self.sold += qty;
            self.order_seq += 1;
            let node = &seller.node;
            *self.sold_by_node.entry(node.clone()).or_insert(0) += qty;
            *self.sold_by_epoch.entry(seller.epoch_key()).or_insert(0) += qty;
            *self.bought_by_user.entry(purchase.user.clone()).or_insert(0) += qty;
            let receipt = Receipt {
                order_id: purchase.order_id.clone().unwrap_or_else(|| OrderId(format!("{sku}-{}", self.order_seq))),
                node: node.clone(),
                qty: purchase.qty,
            };
            self.orders.push(OrderEvent {
                seq: self.order_seq,
                order_id: receipt.order_id.clone(),
                key: purchase.key.clone(),
                user: purchase.user.clone(),
                qty: purchase.qty,
                node: node.clone(),
            });
            Decision::Purchased(receipt)
        };
        if self.decisions.len() >= self.next_sweep_at {
            self.decisions.retain(|_, (_, _, expires_at)| *expires_at > now);
            self.next_sweep_at = (self.decisions.len() * 2).max(DECISIONS_SWEEP_AT);
        }
        self.decisions.insert(purchase.key.clone(), (fingerprint, stored::encode(&decision), now + ttl));
        Verdict::Fresh(decision)
    }

    /// Removes the purchase's token and says whether it was live and issued to its user; removed
    /// either way, as `GETDEL` in `confirm.lua` does.
    fn spend_token(&mut self, purchase: &Purchase, now: Instant) -> bool {
        let Some(token) = &purchase.token else { return false };
        self.tokens.remove(token).is_some_and(|(user, expires_at)| expires_at > now && user == purchase.user)
    }

    /// Stores a token unless one with the same text is live; says whether it stored it.
    fn store_token(&mut self, token: &SubmitToken, user: &UserId, expires_at: Instant, now: Instant) -> bool {
        if self.tokens.get(token).is_some_and(|(_, live_until)| *live_until > now) {
            return false;
        }
        if self.tokens.len() >= self.next_token_sweep_at {
            self.tokens.retain(|_, (_, live_until)| *live_until > now);
            self.next_token_sweep_at = (self.tokens.len() * 2).max(TOKENS_SWEEP_AT);
        }
        self.tokens.insert(token.clone(), (user.clone(), expires_at));
        true
    }
}

/// The in-process ledger. One std `Mutex` guards all books: every operation is a short
/// in-memory step with no `.await` inside, and holding it is what makes a batch atomic.
pub struct EmbeddedLedger {
    books: Mutex<HashMap<SkuId, Book>>,
    idempotency_ttl: Duration,
}

impl EmbeddedLedger {
    pub fn new(idempotency_ttl: Duration) -> Self {
        Self { books: Mutex::new(HashMap::new()), idempotency_ttl }
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
impl Ledger for EmbeddedLedger {
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
            require_token: terms.require_token,
            order_seq: 0,
            sold_by_node: BTreeMap::new(),
            sold_by_epoch: HashMap::new(),
            ended: HashMap::new(),
            bought_by_user: HashMap::new(),
            decisions: HashMap::new(),
            next_sweep_at: DECISIONS_SWEEP_AT,
            tokens: HashMap::new(),
            next_token_sweep_at: TOKENS_SWEEP_AT,
            token_window: (0, 0),
            orders: Vec::new(),
        };
        let status = book.status();
        books.insert(sku.clone(), book);
        Ok(Created::New(status))
    }

    async fn restock_to(&self, sku: &SkuId, total: u64) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| {
            if total > book.total {
                book.remaining += total - book.total;
                book.total = total;
            }
            Ok(book.status())
        })
    }

    async fn close(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| {
            book.closed = true;
            Ok(book.status())
        })
    }

    async fn issue_token(&self, sku: &SkuId, user: &UserId, ttl: Duration) -> Result<SubmitToken, LedgerError> {
        let ttl = ttl.min(TOKEN_TTL_MAX);
        for _ in 0..TOKEN_DRAWS_MAX {
            let token = SubmitToken::generate()
                .map_err(|e| LedgerError::Unavailable(format!("no secure random source for a token: {e}")))?;
            let now = Instant::now();
            let (window, retry_after_ms) = crate::token_window(crate::unix_ms(), ttl);
            let stored = self.with_book(sku, |book| {
                if book.token_window.0 != window {
                    book.token_window = (window, 0);
                }
                book.token_window.1 += 1;
                if book.token_window.1 > crate::TOKEN_ISSUE_MAX_DEFAULT {
                    return Err(LedgerError::TokensExhausted { retry_after_ms });
                }
                Ok(book.store_token(&token, user, now + ttl, now))
            })?;
            if stored {
                return Ok(token);
            }
        }
        Err(LedgerError::Corrupt(
            "fresh submit tokens keep colliding with stored ones; is the random source broken?".into(),
        ))
    }

    async fn confirm(&self, sku: &SkuId, seller: &Seller, purchases: &[Purchase]) -> Result<BatchOutcome, LedgerError> {
        assert!(purchases.len() <= BATCH_MAX, "confirm takes at most BATCH_MAX purchases");
        let now = Instant::now();
        let ttl = self.idempotency_ttl;
        self.with_book(sku, |book| {
            if seller.epoch > 0 && book.ended.get(&seller.node).is_some_and(|ended| *ended >= seller.epoch) {
                return Err(LedgerError::EpochEnded(format!("{} was ended by the coordinator", seller.epoch_key())));
            }
            let verdicts = purchases.iter().map(|purchase| book.decide(sku, seller, purchase, ttl, now)).collect();
            Ok(BatchOutcome { verdicts, sold: book.sold, remaining: book.remaining })
        })
    }

    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.with_book(sku, |book| Ok(book.status()))
    }

    async fn end_epoch(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.with_book(sku, |book| {
            let ended = book.ended.entry(seller.node.clone()).or_insert(0);
            *ended = (*ended).max(seller.epoch);
            Ok(book.sold_by_epoch.get(&seller.epoch_key()).copied().unwrap_or(0))
        })
    }

    async fn sold_by(&self, sku: &SkuId, seller: &Seller) -> Result<u64, LedgerError> {
        self.with_book(sku, |book| Ok(book.sold_by_epoch.get(&seller.epoch_key()).copied().unwrap_or(0)))
    }

    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        let limit = limit.min(ORDER_EVENTS_MAX);
        // Events are stored in seq order, starting at 1, so seq n sits at index n - 1.
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        self.with_book(sku, |book| Ok(book.orders.iter().skip(start).take(limit).cloned().collect()))
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        Ok(())
    }
}
