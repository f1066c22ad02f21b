//! Payments as a lifecycle, around a [`PaymentProvider`]: the buyer starts a payment
//! ([`start`], behind `POST /v1/orders/{id}/pay`), the provider notifies the result (the
//! callback route), and two jobs settle what the notifications leave open:
//!
//! - the **query job** ([`checks`]) asks the provider about every order whose payment started
//!   but whose notification never came, at its deadline: success → paid, failure → expired,
//!   unknown → asked again with backoff until `query_limit`, then expired; after an expiry or a
//!   cancel it closes the payment at the provider, so a success learned late is recorded and
//!   refunded, never lost and never guessed;
//! - the **refund job** ([`refunds`]) pays back every refund owed, under one refund id per
//!   payment, retried with backoff until the provider acknowledges it (`owed → pending →
//!   refunded`).
//!
//! Both run in the sweeper's rounds, under its lock and fence: one worker at a time, and a
//! stale one's expiries refused by the store. [`books`] holds the store against the provider's
//! settlement report, for `seckill reconcile`.

pub mod attempts;
pub mod books;
pub mod checks;
pub mod refunds;

use std::sync::Arc;
use std::time::Duration;

use crate::model::{OpenedPayment, Order, StartPayment};
use crate::provider::{CreatePayment, PaymentProvider, PaymentStatus, ProviderError, ProviderPayment};
use crate::store::{OrderStore, StoreError};

/// The provider and the lifecycle's settings, as the order service uses them.
#[derive(Clone)]
pub struct Payments {
    pub provider: Arc<dyn PaymentProvider>,
    /// Where the provider notifies this service: its `POST /v1/payments/callback`, as the
    /// provider reaches it.
    pub callback_url: String,
    pub settings: PaymentSettings,
}

#[derive(Debug, Clone)]
pub struct PaymentSettings {
    /// Added to an order's deadline once, when its payment starts: a buyer who pressed "pay"
    /// a second before the deadline still has time to finish.
    pub pay_grace: Duration,
    /// How long after the deadline an unknown payment (pending at the provider, or the provider
    /// unreachable) is asked about before the order expires anyway.
    pub query_limit: Duration,
    /// The first pause before asking the provider again, doubled each time up to `retry_max`.
    pub retry_first: Duration,
    pub retry_max: Duration,
}

impl Default for PaymentSettings {
    fn default() -> Self {
        Self {
            pay_grace: Duration::from_secs(60),
            query_limit: Duration::from_secs(300),
            retry_first: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

impl PaymentSettings {
    /// When to ask again after `attempts` tries, from `now_ms`.
    pub fn retry_at(&self, now_ms: u64, attempts: u32) -> u64 {
        let pause = self.retry_first.saturating_mul(1u32 << attempts.min(16)).min(self.retry_max);
        now_ms.saturating_add(pause.as_millis() as u64)
    }
}

/// What the buyer's "pay" did.
#[derive(Debug)]
pub enum Started {
    /// The provider holds a payment for the order: where the buyer pays, and the order with its
    /// (extended) deadline.
    Payment {
        order: Order,
        payment_id: String,
        pay_url: Option<String>,
        status: PaymentStatus,
    },
    /// Paid, expired, cancelled, or past its deadline.
    NotPending(Order),
    UnknownOrder,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider did not answer, or refused; the payment may exist (asking again is safe:
    /// create is idempotent by order id).
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

/// Starts the payment of `order_id`: the store notes it first (extending the deadline once and
/// setting a provider check due), then the provider creates it. In that order, so a payment
/// the provider holds always has a check that finds it, even if this process dies between the
/// two or the provider's answer is lost. When the provider holds the order's current attempt
/// for another amount, the order moves to its next attempt ([`attempts`]) and the other is
/// closed (its check closes it should this close go unanswered).
pub async fn start(
    store: &dyn OrderStore,
    payments: &Payments,
    order_id: &str,
    now_ms: u64,
) -> Result<Started, StartError> {
    let grace_ms = payments.settings.pay_grace.as_millis() as u64;
    let mut order = match store.start_payment(order_id, grace_ms, now_ms).await? {
        StartPayment::Started(order) => order,
        StartPayment::NotPending(order) => return Ok(Started::NotPending(order)),
        StartPayment::UnknownOrder => return Ok(Started::UnknownOrder),
    };
    loop {
        let request = CreatePayment {
            order_id: attempts::reference(order_id, order.payment_attempt).into_owned(),
            amount: order.new.amount(),
            currency: order.new.currency.clone(),
            callback_url: payments.callback_url.clone(),
        };
        let creating =
            tracing::Instrument::instrument(payments.provider.create(&request), telemetry::child("provider create"));
        match creating.await {
            Ok(created) => return Ok(opened(store, order, &request, created, now_ms).await),
            Err(ProviderError::ReferenceTaken(why)) => {
                order.payment_attempt = next_attempt(store, payments, &order, why, now_ms).await?;
            }
            // The provider cannot be reached, but it opened this order's payment before: the
            // buyer gets that one and pays at its page (which the provider serves, not this call).
            Err(ProviderError::Unavailable(reason)) => {
                return match store.opened_payment(order_id).await? {
                    Some(opened) if opened.amount == request.amount && opened.currency == request.currency => {
                        let (payment_id, pay_url) = (opened.payment_id, Some(opened.pay_url));
                        Ok(Started::Payment { order, payment_id, pay_url, status: PaymentStatus::Pending })
                    }
                    _ => Err(ProviderError::Unavailable(reason).into()),
                };
            }
            Err(refused) => return Err(refused.into()),
        }
    }
}

/// The provider holds `order`'s current attempt for another amount: the order's next attempt,
/// once the taken one is closed (or left to the order's check to close). Refused past
/// [`attempts::ATTEMPTS_MAX`], or when the order stopped being payable meanwhile.
async fn next_attempt(
    store: &dyn OrderStore,
    payments: &Payments,
    order: &Order,
    why: String,
    now_ms: u64,
) -> Result<u32, StartError> {
    let (order_id, current) = (order.new.id.as_str(), order.payment_attempt);
    if current >= attempts::ATTEMPTS_MAX {
        return Err(ProviderError::Refused(format!("{why} (attempt {current}, the last an order opens)")).into());
    }
    let Some(next) = store.next_payment_attempt(order_id, current, now_ms).await?.filter(|next| *next > current) else {
        return Err(ProviderError::Refused(format!("{why} (the order is no longer payable)")).into());
    };
    tracing::warn!(
        order = order_id,
        attempt = next,
        "the provider holds this order's payment for another amount; a new attempt opens and the other is closed"
    );
    metrics::counter!("seckill_orders_payment_attempts_total").increment(1);
    checks::close_attempt(store, payments, order, &attempts::reference(order_id, current), now_ms).await?;
    Ok(next)
}

/// The buyer's answer once the provider created (or found) the payment; remembered for an
/// outage's answer when the buyer can still pay it.
async fn opened(
    store: &dyn OrderStore,
    order: Order,
    request: &CreatePayment,
    created: ProviderPayment,
    now_ms: u64,
) -> Started {
    if let (Some(pay_url), PaymentStatus::Pending) = (&created.pay_url, &created.status) {
        let opened = OpenedPayment {
            order_id: order.new.id.clone(),
            payment_id: created.id.clone(),
            pay_url: pay_url.clone(),
            amount: request.amount,
            currency: request.currency.clone(),
            created_at_ms: now_ms,
        };
        // Only an answer for a later outage: the buyer gets this one either way.
        if let Err(e) = store.remember_opened(&opened).await {
            tracing::debug!(order = %order.new.id, "the opened payment was not remembered: {e}");
        }
    }
    Started::Payment { order, payment_id: created.id, pay_url: created.pay_url, status: created.status }
}

/// The wall clock the jobs read (Unix ms): the one every process shares, [`crate::unix_ms`]
/// (a `fn() -> u64` is a clock), or a benchmark's clock ahead of it.
pub use protocol::clock::Clock;

/// Provider calls one job keeps in flight at once.
pub const IN_FLIGHT: usize = 16;

/// How long a job keeps starting provider calls in one sweeper round. What is left waits for
/// the next round, untouched (no attempt counted): a slow or hanging provider then delays the
/// round's releases by this plus one call's timeout, never by a whole batch of timeouts.
pub const ROUND_BUDGET: Duration = Duration::from_secs(2);

/// Runs `work` on each item, [`IN_FLIGHT`] at once, starting none after [`ROUND_BUDGET`]; the
/// results of those it ran, in no particular order. A task that panicked is reported as the
/// store being unavailable, so the round fails loudly rather than forgetting it.
async fn bounded<T, R, F, Fut>(items: Vec<T>, work: F) -> Vec<Result<R, StoreError>>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<R, StoreError>> + Send + 'static,
{
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut results = Vec::with_capacity(items.len());
    let joined = |joined: Result<Result<R, StoreError>, tokio::task::JoinError>| {
        joined.unwrap_or_else(|e| Err(StoreError::Unavailable(format!("a payment job's task failed: {e}"))))
    };
    for item in items {
        if started.elapsed() >= ROUND_BUDGET {
            break;
        }
        if tasks.len() >= IN_FLIGHT {
            if let Some(done) = tasks.join_next().await {
                results.push(joined(done));
            }
        }
        tasks.spawn(work(item));
    }
    while let Some(done) = tasks.join_next().await {
        results.push(joined(done));
    }
    results
}

/// Registers the lifecycle's counters so they render as 0 before the first event.
pub fn register_metrics() {
    for outcome in ["paid", "failed", "unknown", "closed", "paid_late", "expired_unknown"] {
        metrics::counter!("seckill_orders_payment_checks_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["refunded", "pending", "unavailable", "refused"] {
        metrics::counter!("seckill_orders_refund_attempts_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["started", "not_pending", "unavailable", "refused"] {
        metrics::counter!("seckill_orders_payment_starts_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("seckill_orders_payment_attempts_total").increment(0);
}
