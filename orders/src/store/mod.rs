//! Where orders live: one trait, [`OrderStore`], and two implementations that pass one contract
//! suite (`suite`, feature `suite`: for tests only): PostgreSQL for production and SQLite (WAL) for zero-setup runs.
//!
//! What a payment, a cancel or an expiry does is decided once, in pure Rust
//! ([`crate::lifecycle`]); a store only persists the decision atomically and reports what it
//! changed. Every state change is one compare-and-set statement (`UPDATE … WHERE state =
//! 'pending_payment'`), written once for both dialects (`transitions.rs`), so two writers racing
//! on an order (a payment and the sweeper, two sweepers) cannot both win.
//!
//! Both implementations apply the versioned migrations in `migrations/` when they open (each
//! recorded in `schema_migrations`), and refuse a database whose schema is newer than this build
//! knows.

use crate::model::*;

mod codec;
pub mod postgres;
pub mod sqlite;
#[cfg(any(test, feature = "suite"))]
pub mod suite;
mod transitions;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// The in-memory SQLite store: zero setup, gone with the process (demos, `seckill up`).
pub const MEMORY_STORE: &str = "sqlite::memory:";

/// Opens the store a URL names: `sqlite::memory:`, `sqlite:<path>` (a WAL file, created if
/// missing) or `postgres://user@host:port/db`. Migrations run before it returns.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn OrderStore>, StoreError> {
    if url == MEMORY_STORE {
        return Ok(std::sync::Arc::new(SqliteStore::in_memory().await?));
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(StoreError::Invalid("a sqlite: store URL names a file: sqlite:orders.db".into()));
        }
        return Ok(std::sync::Arc::new(SqliteStore::open(path).await?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(PostgresStore::connect(url).await?));
    }
    Err(StoreError::Invalid(format!(
        "{:?} is not sqlite::memory:, sqlite:<path> or postgres://user@host:port/db",
        postgres::redact(url)
    )))
}

/// Most orders one [`OrderStore::insert_batch`] call takes.
pub const INSERT_BATCH_MAX: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or failed the statement; retrying may succeed.
    #[error("order store unavailable: {0}")]
    Unavailable(String),
    /// The store holds something this version cannot read (a newer schema, a corrupt row).
    #[error("order store corrupt or newer than this build: {0}")]
    Corrupt(String),
    /// The caller asked for something the contract forbids (too large a batch, …).
    #[error("invalid request to the order store: {0}")]
    Invalid(String),
}

#[async_trait::async_trait]
pub trait OrderStore: Send + Sync + 'static {
    /// Stores each order once: an order whose id is already stored (a redelivered event) is
    /// skipped, in the same statement or transaction as the rest of the batch. Returns how many
    /// were new. At most [`INSERT_BATCH_MAX`] orders.
    async fn insert_batch(&self, orders: &[NewOrder]) -> Result<u64, StoreError>;

    async fn get(&self, id: &str) -> Result<Option<Order>, StoreError>;

    /// The user's orders, newest first, at most `limit`.
    async fn by_user(&self, user: &str, limit: usize) -> Result<Vec<Order>, StoreError>;

    /// Records a payment, whatever it says, idempotent by `payment.reference`:
    /// `pending_payment → paid`; `expired | cancelled → paid_after_expiry` (refund owed); a
    /// second payment, or a wrong amount or currency, changes no order (refund owed); an order
    /// not stored yet makes it wait ([`PaymentOutcome::AwaitingOrder`]).
    async fn record_payment(&self, payment: &Payment) -> Result<PaymentOutcome, StoreError>;

    /// Payments waiting for an order that is now stored ([`PaymentOutcome::AwaitingOrder`]),
    /// applied to it as [`OrderStore::record_payment`] would, oldest first, at most `limit`;
    /// returns each one's reference and outcome. The consumer calls it after storing orders,
    /// the sweeper every round.
    async fn settle_awaiting(&self, limit: usize) -> Result<Vec<(String, PaymentOutcome)>, StoreError>;

    /// The payments recorded for `order_id`, oldest first.
    async fn payments_of(&self, order_id: &str) -> Result<Vec<PaymentRecord>, StoreError>;

    /// Payments whose refund is owed (not yet asked of the provider), oldest first.
    async fn refunds_owed(&self, limit: usize) -> Result<Vec<PaymentRecord>, StoreError>;

    /// The buyer starts paying: a pending order before its deadline notes when, and the first
    /// time only has its deadline extended by `grace_ms` and a provider check due at the new
    /// deadline (the query job's, [`OrderStore::payment_checks_due`]).
    async fn start_payment(&self, id: &str, grace_ms: u64, now_ms: u64) -> Result<StartPayment, StoreError>;

    /// Orders whose provider check is due at `now_ms`: pending ones at their deadline (what
    /// became of the payment?), expired or cancelled ones whose payment is still to be closed;
    /// soonest first, at most `limit`.
    async fn payment_checks_due(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError>;

    /// Counts one provider check made and sets the next (`None`: nothing more to ask).
    async fn schedule_payment_check(&self, id: &str, next_at_ms: Option<u64>) -> Result<(), StoreError>;

    /// Refunds owed or pending whose next attempt is due at `now_ms`, oldest payment first, at
    /// most `limit`.
    async fn refunds_due(&self, now_ms: u64, limit: usize) -> Result<Vec<PaymentRecord>, StoreError>;

    /// A refund asked of the provider and not acknowledged (no answer, or "pending"):
    /// `owed | pending → pending`, one more attempt, the next at `next_at_ms`.
    async fn refund_pending(&self, reference: &str, next_at_ms: u64) -> Result<(), StoreError>;

    /// The provider acknowledged the refund: `owed | pending → refunded`, once. False if it was
    /// refunded already (or owes none).
    async fn mark_refunded(&self, reference: &str, now_ms: u64) -> Result<bool, StoreError>;

    /// Makes every open provider check and every refund not yet acknowledged due at `now_ms`,
    /// whatever their backoff said (`seckill reconcile --repair` then runs a sweeper round).
    /// Returns how many of each.
    async fn redrive_payments(&self, now_ms: u64) -> Result<(u64, u64), StoreError>;

    /// The buyer's cancel: `pending_payment → cancelled` when `user` owns the order.
    async fn cancel(&self, id: &str, user: &str, now_ms: u64) -> Result<CancelOutcome, StoreError>;

    /// Pending orders whose deadline is at or before `now_ms` and whose payment was never
    /// started (a started one is the query job's to decide), oldest deadline first.
    async fn due_for_expiry(&self, now_ms: u64, limit: usize) -> Result<Vec<Order>, StoreError>;

    /// Raises the store's sweeper fence to `fence` (never lowers it). A sweeper calls it when it
    /// takes the lock, so every older holder's [`OrderStore::expire`] is refused from then on.
    async fn raise_fence(&self, fence: u64) -> Result<(), StoreError>;

    /// `pending_payment → expired`, only while `fence` is at least the store's sweeper fence and
    /// no recorded payment is waiting for the order (it is applied first, by
    /// [`OrderStore::settle_awaiting`]).
    async fn expire(&self, id: &str, fence: u64, now_ms: u64) -> Result<ExpireOutcome, StoreError>;

    /// Orders whose units must go back and have not been confirmed back yet (expired,
    /// cancelled or paid after expiry, `released_at_ms` unset, not refused by the ledger), in
    /// (deadline, id) order, starting after `after` (from the first when `None`), at most `limit`.
    async fn unreleased(&self, after: Option<&ReleaseCursor>, limit: usize) -> Result<Vec<Order>, StoreError>;

    /// Notes that the ledger refused to release the order, with its reason: the order leaves
    /// [`OrderStore::unreleased`]. Returns false if it was released or refused already.
    async fn mark_release_refused(&self, id: &str, reason: &str, now_ms: u64) -> Result<bool, StoreError>;

    /// Notes that the ledger has the order's units back. Returns false if it was already noted.
    async fn mark_released(&self, id: &str, now_ms: u64) -> Result<bool, StoreError>;

    /// Keeps an undeliverable event; a second letter for the same (sku, seq) changes nothing.
    async fn dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError>;

    /// The dead letters, oldest first, at most `limit`.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError>;

    /// One SKU's payments and paid orders, counted (all zero for a SKU with none).
    async fn money_counts(&self, sku: &str) -> Result<SkuMoneyCounts, StoreError>;

    /// One SKU's counts (all zero for a SKU with no orders).
    async fn counts(&self, sku: &str) -> Result<SkuOrderCounts, StoreError>;

    /// Stream seqs of `sku` stored as orders or dead letters within `from..=to`, ascending; the
    /// reconciler finds gaps with it.
    async fn stored_seqs(&self, sku: &str, from: u64, to: u64) -> Result<Vec<u64>, StoreError>;

    /// Orders of `sku` by state, counted (orders, not units), for the metrics.
    async fn state_counts(&self) -> Result<Vec<(String, OrderState, u64)>, StoreError>;

    /// Deletes one order (only the reconciliation tests use it, to inject a gap).
    async fn delete_for_test(&self, id: &str) -> Result<(), StoreError>;

    /// Remembers the payment the provider opened for an order; the first one kept wins (the
    /// provider answers the same payment to every create of an order).
    async fn remember_opened(&self, opened: &OpenedPayment) -> Result<(), StoreError>;

    /// The payment remembered for `order_id`, if any.
    async fn opened_payment(&self, order_id: &str) -> Result<Option<OpenedPayment>, StoreError>;

    /// Moves a pending order's payment from attempt `current` to the next (see
    /// [`crate::payments::attempts`]), once: a caller who also saw `current` finds it moved and
    /// gets the same attempt. The order's attempt after the call; `None` for an unknown order.
    async fn next_payment_attempt(&self, id: &str, current: u32, now_ms: u64) -> Result<Option<u32>, StoreError>;

    /// Succeeds when the store answers.
    async fn ping(&self) -> Result<(), StoreError>;
}
