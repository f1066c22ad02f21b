//! The unpaid-order sweeper: expires orders past their pay deadline and gives their units back
//! to the ledger, so they sell again. With a payment provider it also runs the payment jobs
//! (`crate::payments`): an order whose payment started is expired only by the query job, on
//! the provider's word, and refunds owed are paid back.
//!
//! One sweeper at a time across the fleet: each round runs under the project's distributed lock.
//! The lock alone is not enough (a paused holder can wake after its lock expired), so each round
//! first raises the store's fence to the lock's fencing token and every expiry is written with
//! it: a stale sweeper's expiries are refused by the store. Releases need no lock at all: the
//! ledger releases an order at most once and only what it sold, whoever asks.
//!
//! The store is the source of truth for what must go back: an order is expired (or cancelled, or
//! paid after expiry) first, and released after, so a crash between the two leaves an order
//! marked "unreleased", which the next round (or `seckill reconcile --repair`) completes.
//!
//! No order holds back another. Releases are walked in (deadline, id) order with a cursor that
//! wraps around, so orders failing for a while (their SKU's master down) are passed over, not
//! retried at the head of every round; one the ledger refuses outright (it has no record of that
//! sale) is marked with the reason and leaves the queue for an operator.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledger::{IdempotencyKey, OrderFeed, OrderId, Release, ReleaseOutcome, SkuId, UserId};
use safeguards::{DistributedLock, LockName};
use tokio::sync::watch;

use crate::consumer::pause;
use crate::model::{ExpireOutcome, Order, ReleaseCursor};
use crate::payments::checks::{self, ChecksRound};
use crate::payments::refunds::{self, RefundsRound};
use crate::payments::Payments;
use crate::store::OrderStore;
use crate::unix_ms;

/// The lock every sweeper of a deployment takes.
pub const SWEEPER_LOCK: &str = "orders-sweeper";

#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Pause between rounds.
    pub every: Duration,
    /// Orders expired or released per round, at most.
    pub batch: usize,
    /// The sweeper lock's ttl; the lock's watchdog renews it while a round runs.
    pub lock_ttl: Duration,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        Self { every: Duration::from_millis(500), batch: 500, lock_ttl: Duration::from_secs(10) }
    }
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Another sweeper held the lock: nothing was done.
    pub busy: bool,
    pub expired: u64,
    pub released: u64,
    /// Releases the ledger refused as never sold: reconciliation reports them.
    pub refused: u64,
    /// Releases that failed (the ledger did not answer for that SKU, or the order is malformed):
    /// retried next round, and never in the way of the others.
    pub failed: u64,
    /// Expiries refused because a newer sweeper had raised the fence.
    pub fenced_out: u64,
    /// Payments that had come before their orders, applied this round.
    pub early_payments: u64,
    /// The query job's pass (orders whose payment started).
    pub checks: ChecksRound,
    /// The refund job's pass.
    pub refunds: RefundsRound,
}

pub struct Sweeper {
    ledger: Arc<dyn OrderFeed>,
    store: Arc<dyn OrderStore>,
    lock: DistributedLock,
    config: SweeperConfig,
    /// Where the walk over unreleased orders goes on next round; `None`: from the first.
    cursor: Mutex<Option<ReleaseCursor>>,
    /// The provider, for the query and refund jobs; `None`: payments are notified only.
    payments: Option<Payments>,
}

/// What the sweeper notes on an order the ledger will not release.
pub const NEVER_SOLD_REASON: &str = "the ledger has no record of this sale (never sold, another buyer or quantity, \
     or sold longer ago than [ledger] sale_record_ttl_s)";

impl Sweeper {
    pub fn new(
        ledger: Arc<dyn OrderFeed>,
        store: Arc<dyn OrderStore>,
        lock: DistributedLock,
        config: SweeperConfig,
    ) -> Self {
        Self { ledger, store, lock, config, cursor: Mutex::new(None), payments: None }
    }

    /// Runs the query and refund jobs in every round too, against `payments`' provider.
    pub fn with_payments(mut self, payments: Option<Payments>) -> Self {
        self.payments = payments;
        self
    }

    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            match self.round().await {
                Ok(round) if round.expired + round.released + round.checks.expired + round.refunds.refunded > 0 => {
                    tracing::info!(?round, "sweep")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("sweep failed: {e}"),
            }
            if !pause(self.config.every, &mut stop).await {
                return;
            }
        }
    }

    /// One round under the lock: expire what is due, then release what is unreleased.
    pub async fn round(&self) -> Result<Round, String> {
        let name = LockName::new(SWEEPER_LOCK).map_err(|e| e.to_string())?;
        let Some(guard) = self.lock.try_acquire(&name, self.config.lock_ttl).await.map_err(|e| e.to_string())? else {
            return Ok(Round { busy: true, ..Round::default() });
        };
        let fence = guard.fence().0;
        self.store.raise_fence(fence).await.map_err(|e| e.to_string())?;
        let mut round = Round::default();
        // A payment recorded before its order was stored settles before that order can be
        // found due: the buyer paid in time even if the consumer was late.
        let settled = self.store.settle_awaiting(self.config.batch).await.map_err(|e| e.to_string())?;
        round.early_payments = settled.len() as u64;
        let due = self.store.due_for_expiry(unix_ms(), self.config.batch).await.map_err(|e| e.to_string())?;
        for order in due {
            if guard.is_lost() {
                break;
            }
            match self.store.expire(&order.new.id, fence, unix_ms()).await.map_err(|e| e.to_string())? {
                ExpireOutcome::Expired => {
                    round.expired += 1;
                    metrics::counter!("seckill_orders_transitions_total", "to" => "expired").increment(1);
                }
                ExpireOutcome::NotPending => {}
                ExpireOutcome::StaleFence => {
                    round.fenced_out += 1;
                    break;
                }
            }
        }
        if let Some(payments) = &self.payments {
            if !guard.is_lost() {
                let checks = checks::run(self.store.clone(), payments, fence, self.config.batch, unix_ms);
                round.checks = checks.await.map_err(|e| e.to_string())?;
            }
        }
        self.release_unreleased(&mut round).await?;
        if let Some(payments) = &self.payments {
            let refunds = refunds::run(self.store.clone(), payments, self.config.batch, unix_ms);
            round.refunds = refunds.await.map_err(|e| e.to_string())?;
        }
        guard.release().await.map_err(|e| e.to_string())?;
        Ok(round)
    }

    async fn release_unreleased(&self, round: &mut Round) -> Result<(), String> {
        let cursor = self.cursor.lock().map_err(|_| "sweeper cursor poisoned".to_string())?.clone();
        let unreleased = self.store.unreleased(cursor.as_ref(), self.config.batch).await.map_err(|e| e.to_string())?;
        // A short page is the end of the walk: the next round starts from the first again.
        let next = match unreleased.len() < self.config.batch {
            true => None,
            false => unreleased.last().map(ReleaseCursor::after),
        };
        *self.cursor.lock().map_err(|_| "sweeper cursor poisoned".to_string())? = next;
        for order in unreleased {
            let started = Instant::now();
            // One order's failure (its SKU's Redis master down, the SKU gone from the ledger)
            // must not hold back every other order and SKU: it is counted and retried.
            let outcome = match release(&*self.ledger, &*self.store, &order).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    round.failed += 1;
                    metrics::counter!("seckill_orders_releases_total", "outcome" => "failed").increment(1);
                    tracing::warn!(order = %order.new.id, sku = %order.new.sku, "release failed, retried next round: {e}");
                    continue;
                }
            };
            match outcome {
                ReleaseOutcome::Released { .. } | ReleaseOutcome::AlreadyReleased => {
                    round.released += 1;
                    metrics::counter!("seckill_orders_releases_total", "outcome" => "released").increment(1);
                    metrics::histogram!("seckill_orders_release_seconds").record(started.elapsed().as_secs_f64());
                }
                ReleaseOutcome::NeverSold => {
                    round.refused += 1;
                    metrics::counter!("seckill_orders_releases_total", "outcome" => "never_sold").increment(1);
                    tracing::error!(order = %order.new.id, sku = %order.new.sku, "{NEVER_SOLD_REASON}; not released (see seckill reconcile)");
                    if let Err(e) = self.store.mark_release_refused(&order.new.id, NEVER_SOLD_REASON, unix_ms()).await {
                        tracing::warn!(order = %order.new.id, "could not note the refused release ({e}); tried again next round");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Gives one order's units back and notes it in the store; the ledger's own guards make a
/// repeat (two sweepers, a retry after a crash) harmless.
pub async fn release(ledger: &dyn OrderFeed, store: &dyn OrderStore, order: &Order) -> Result<ReleaseOutcome, String> {
    debug_assert!(
        order.state.gives_units_back(),
        "order {} is {}: only an ended order's units go back",
        order.new.id,
        order.state.as_str()
    );
    let request = release_of(order)?;
    // The ledger the order was sold on: a SKU, or a stripe of one (`s/i`), which users cannot name.
    let sku = SkuId::from_wire(&order.new.sku).map_err(|e| format!("order {}: bad sku: {e}", order.new.id))?;
    let outcome = ledger.release(&sku, &request).await.map_err(|e| e.to_string())?;
    if matches!(outcome, ReleaseOutcome::Released { .. } | ReleaseOutcome::AlreadyReleased) {
        store.mark_released(&order.new.id, unix_ms()).await.map_err(|e| e.to_string())?;
    }
    Ok(outcome)
}

fn release_of(order: &Order) -> Result<Release, String> {
    let bad = |what: &str| format!("order {} has a bad {what}", order.new.id);
    Ok(Release {
        order_id: OrderId(order.new.id.clone()),
        key: IdempotencyKey::new(&order.new.idempotency_key).map_err(|_| bad("idempotency key"))?,
        user: UserId::new(&order.new.user).map_err(|_| bad("user"))?,
        qty: order.new.qty,
        sold_at_ms: order.new.created_at_ms,
    })
}
