//! The query job: settles, with the provider's own word, every order whose payment started and
//! whose notification never came. Nothing is guessed: an unknown answer is asked again later,
//! and an order given up on (expired after `query_limit`) still has its payment closed at the
//! provider, which says whether the buyer paid first.

use std::sync::Arc;

use crate::model::{ExpireOutcome, Order, OrderState, Payment, PaymentOutcome, PaymentSource};
use crate::payments::{attempts, Clock, Payments};
use crate::provider::{PaymentStatus, ProviderError};
use crate::store::{OrderStore, StoreError};

/// What one pass of the query job did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChecksRound {
    /// Payments the provider said succeeded and no notification had brought.
    pub found_by_query: u64,
    /// Orders expired because their payment failed, was never made, or stayed unknown past
    /// `query_limit`.
    pub expired: u64,
    /// Payments closed at the provider after their order ended.
    pub closed: u64,
    /// Checks the provider left unknown (unreachable, or still pending): asked again later.
    pub deferred: u64,
    /// Expiries refused because a newer sweeper raised the fence.
    pub fenced_out: u64,
}

/// Asks the provider about every due check, at most `batch`, as the sweeper holding `fence`:
/// [`super::IN_FLIGHT`] at once, and none started after [`super::ROUND_BUDGET`], so a provider that
/// hangs delays the round's releases by one call's timeout at most, never by a batch of them.
pub async fn run(
    store: Arc<dyn OrderStore>,
    payments: &Payments,
    fence: u64,
    batch: usize,
    clock: impl Clock,
) -> Result<ChecksRound, StoreError> {
    let clock: Arc<dyn Clock> = Arc::new(clock);
    let mut round = ChecksRound::default();
    let due = store.payment_checks_due(clock.now_unix_ms(), batch).await?;
    let steps = super::bounded(due, |order| {
        let (store, payments, clock) = (store.clone(), payments.clone(), clock.clone());
        async move {
            match order.state {
                OrderState::PendingPayment => check_pending(&*store, &payments, &order, fence, &*clock).await,
                OrderState::Expired | OrderState::Cancelled => {
                    close_through(&*store, &payments, &order, order.payment_attempt, &*clock).await
                }
                // Paid: only earlier attempts, if any, are left to close.
                OrderState::Paid | OrderState::PaidAfterExpiry => {
                    let earlier = order.payment_attempt.saturating_sub(1);
                    match close_through(&*store, &payments, &order, earlier, &*clock).await? {
                        Step::Closed => Ok(Step::Settled),
                        step => Ok(step),
                    }
                }
            }
        }
    })
    .await;
    for step in steps {
        match step? {
            Step::Settled => {}
            Step::FoundByQuery => round.found_by_query += 1,
            Step::Expired => round.expired += 1,
            Step::Closed => round.closed += 1,
            Step::Deferred => round.deferred += 1,
            Step::FencedOut => round.fenced_out += 1,
        }
    }
    Ok(round)
}

enum Step {
    Settled,
    FoundByQuery,
    Expired,
    Closed,
    Deferred,
    FencedOut,
}

fn counted(outcome: &'static str) {
    metrics::counter!("seckill_orders_payment_checks_total", "outcome" => outcome).increment(1);
}

/// A pending order at its deadline: what became of its payment?
async fn check_pending(
    store: &dyn OrderStore,
    payments: &Payments,
    order: &Order,
    fence: u64,
    clock: &dyn Clock,
) -> Result<Step, StoreError> {
    let id = &order.new.id;
    let answer = payments.provider.query(&attempts::reference(id, order.payment_attempt)).await;
    let now = clock.now_unix_ms();
    let retry_at = payments.settings.retry_at(now, order.payment_checks);
    // Once the order ends, its earlier attempts (if any) are closed by its next check.
    let then_close_earlier = (order.payment_attempt > 1).then_some(now);
    match answer {
        Ok(PaymentStatus::Succeeded { reference, amount, currency }) => {
            let outcome = record(store, order, reference, amount, currency, now).await?;
            counted("paid");
            if outcome == PaymentOutcome::Paid {
                return Ok(Step::FoundByQuery);
            }
            // Taken, but not what the order asks (recorded with a refund owed), or already
            // known from its notification: the order expires if it is still unpaid (a no-op
            // otherwise). This attempt is settled; earlier ones are closed next.
            store.schedule_payment_check(id, then_close_earlier).await?;
            expire(store, id, fence, now).await
        }
        Ok(PaymentStatus::Failed { .. }) => {
            counted("failed");
            store.schedule_payment_check(id, then_close_earlier).await?;
            expire(store, id, fence, now).await
        }
        // Never reached the provider (or not yet: a create still in flight). The order
        // expires; its check stays, so the payment is closed should that create land later.
        Ok(PaymentStatus::NotFound) => {
            counted("failed");
            store.schedule_payment_check(id, Some(retry_at)).await?;
            expire(store, id, fence, now).await
        }
        Ok(PaymentStatus::Pending) | Err(_) => {
            if let Err(ProviderError::Refused(why)) = &answer {
                tracing::error!(order = %id, "the provider refuses to say what became of the payment: {why}");
            }
            store.schedule_payment_check(id, Some(retry_at)).await?;
            let limit = order.new.pay_deadline_ms.saturating_add(payments.settings.query_limit.as_millis() as u64);
            if now < limit {
                counted("unknown");
                return Ok(Step::Deferred);
            }
            // Unknown for too long: the unit goes back. The check stays, to close the payment;
            // a success learned then is refunded.
            counted("expired_unknown");
            tracing::warn!(order = %id, "payment still unknown {:?} after the deadline; the order expires and its payment is closed", payments.settings.query_limit);
            expire(store, id, fence, now).await
        }
    }
}

/// Closes, at the provider, the payment of every attempt of `order` up to `through`: all of
/// them once the order ended (expired or cancelled), the earlier ones once it is paid, so that
/// none can take money unseen.
async fn close_through(
    store: &dyn OrderStore,
    payments: &Payments,
    order: &Order,
    through: u32,
    clock: &dyn Clock,
) -> Result<Step, StoreError> {
    let now = clock.now_unix_ms();
    let mut closing = Closing::Closed;
    for reference in attempts::references(&order.new.id, through) {
        closing = closing.and(close_attempt(store, payments, order, &reference, now).await?);
    }
    settle_closing(store, payments, order, closing, now).await
}

/// The check after closing: none left once every attempt answered, else asked again later.
async fn settle_closing(
    store: &dyn OrderStore,
    payments: &Payments,
    order: &Order,
    closing: Closing,
    now: u64,
) -> Result<Step, StoreError> {
    let id = &order.new.id;
    if closing == Closing::Unknown {
        store.schedule_payment_check(id, Some(payments.settings.retry_at(now, order.payment_checks))).await?;
        return Ok(Step::Deferred);
    }
    store.schedule_payment_check(id, None).await?;
    Ok(match closing {
        Closing::FoundPaid => Step::FoundByQuery,
        Closing::Duplicate => Step::Settled,
        Closing::Closed | Closing::Unknown => Step::Closed,
    })
}

/// What closing one attempt's payment found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closing {
    /// Closed now or before, or never started.
    Closed,
    /// The buyer paid first, and the store already knew.
    Duplicate,
    /// The buyer paid first, and the payment is now recorded (a refund owed, unless it paid
    /// its order).
    FoundPaid,
    /// No answer, or still pending: asked again later.
    Unknown,
}

impl Closing {
    /// Two attempts' closings as one: unknown outweighs a find, a find a duplicate.
    fn and(self, other: Closing) -> Closing {
        use Closing::*;
        match (self, other) {
            (Unknown, _) | (_, Unknown) => Unknown,
            (FoundPaid, _) | (_, FoundPaid) => FoundPaid,
            (Duplicate, _) | (_, Duplicate) => Duplicate,
            (Closed, Closed) => Closed,
        }
    }
}

/// Closes the payment of `order` held under `reference` (one of its attempts); a success
/// found there is recorded, as its notification would have been.
pub(crate) async fn close_attempt(
    store: &dyn OrderStore,
    payments: &Payments,
    order: &Order,
    reference: &str,
    now: u64,
) -> Result<Closing, StoreError> {
    Ok(match payments.provider.close(reference).await {
        Ok(PaymentStatus::Succeeded { reference, amount, currency }) => {
            // The buyer paid before the close: recorded as paid after expiry (or a mismatch, or
            // a second payment), refund owed.
            let outcome = record(store, order, reference, amount, currency, now).await?;
            counted("paid_late");
            match outcome {
                PaymentOutcome::Duplicate { .. } => Closing::Duplicate,
                _ => Closing::FoundPaid,
            }
        }
        Ok(PaymentStatus::Failed { .. } | PaymentStatus::NotFound) => {
            counted("closed");
            Closing::Closed
        }
        Ok(PaymentStatus::Pending) | Err(_) => {
            counted("unknown");
            Closing::Unknown
        }
    })
}

/// Records a success the provider told us about, as its notification would have.
async fn record(
    store: &dyn OrderStore,
    order: &Order,
    reference: String,
    amount: u64,
    currency: String,
    now: u64,
) -> Result<PaymentOutcome, StoreError> {
    let payment = Payment {
        order_id: order.new.id.clone(),
        reference,
        amount,
        currency,
        received_at_ms: now,
        source: PaymentSource::Query,
    };
    // A repeat (its notification raced the query) changes nothing and counts nothing new.
    let outcome = store.record_payment(&payment).await?;
    metrics::counter!("seckill_orders_payments_total", "outcome" => outcome.label()).increment(1);
    match outcome {
        PaymentOutcome::Paid => metrics::counter!("seckill_orders_transitions_total", "to" => "paid").increment(1),
        PaymentOutcome::PaidAfterExpiry => {
            metrics::counter!("seckill_orders_transitions_total", "to" => "paid_after_expiry").increment(1)
        }
        _ => {}
    }
    if outcome.refund_owed() {
        metrics::counter!("seckill_orders_refunds_owed_total").increment(1);
    }
    tracing::info!(order = %order.new.id, outcome = outcome.label(), "payment found by asking the provider");
    Ok(outcome)
}

async fn expire(store: &dyn OrderStore, id: &str, fence: u64, now: u64) -> Result<Step, StoreError> {
    Ok(match store.expire(id, fence, now).await? {
        ExpireOutcome::Expired => {
            metrics::counter!("seckill_orders_transitions_total", "to" => "expired").increment(1);
            Step::Expired
        }
        ExpireOutcome::NotPending => Step::Settled,
        ExpireOutcome::StaleFence => Step::FencedOut,
    })
}
