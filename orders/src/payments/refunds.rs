//! The refund job: pays back every refund owed, once. Each payment's refund is asked under one
//! refund id ([`PaymentRecord::refund_id`]), so a retry after an unknown answer, a crash, or
//! two sweepers one after the other cannot give the money back twice; the store marks it
//! refunded only when the provider says it is done.

use std::sync::Arc;

use crate::model::{PaymentRecord, RefundState};
use crate::payments::{Clock, Payments};
use crate::provider::{ProviderError, RefundRequest, RefundStatus};
use crate::store::{OrderStore, StoreError};

/// What one pass of the refund job did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefundsRound {
    pub refunded: u64,
    /// Asked and not yet acknowledged (no answer, "pending", or refused): asked again later.
    pub pending: u64,
}

/// Asks the provider for every refund due, at most `batch`, as the query job does: a few at
/// once, none started after the round's budget.
pub async fn run(
    store: Arc<dyn OrderStore>,
    payments: &Payments,
    batch: usize,
    clock: impl Clock,
) -> Result<RefundsRound, StoreError> {
    let clock: Arc<dyn Clock> = Arc::new(clock);
    let mut round = RefundsRound::default();
    let due = store.refunds_due(clock.now_unix_ms(), batch).await?;
    let done = super::bounded(due, |payment| {
        let (store, payments, clock) = (store.clone(), payments.clone(), clock.clone());
        async move {
            let span = telemetry::job_span("refund");
            telemetry::record(&span, "seckill.payment", payment.reference.clone());
            tracing::Instrument::instrument(refund_one(&*store, &payments, &payment, &*clock), span).await
        }
    })
    .await;
    for refunded in done {
        if refunded? {
            round.refunded += 1;
        } else {
            round.pending += 1;
        }
    }
    Ok(round)
}

/// One attempt; true when the provider acknowledged the refund.
async fn refund_one(
    store: &dyn OrderStore,
    payments: &Payments,
    payment: &PaymentRecord,
    clock: &dyn Clock,
) -> Result<bool, StoreError> {
    debug_assert!(
        payment.refund.is_some_and(|refund| refund.may_become(RefundState::Pending)),
        "payment {} is due a refund only while one is owed or pending, not {:?}",
        payment.reference,
        payment.refund
    );
    let request = RefundRequest {
        refund_id: payment.refund_id(),
        reference: payment.reference.clone(),
        amount: payment.amount,
        currency: payment.currency.clone(),
    };
    // Noted as asked before asking: a crash in between leaves it pending, to be asked again
    // under the same refund id.
    let retry_at = payments.settings.retry_at(clock.now_unix_ms(), payment.refund_attempts);
    store.refund_pending(&payment.reference, retry_at).await?;
    let asking =
        tracing::Instrument::instrument(payments.provider.refund(&request), telemetry::child("provider refund"));
    let outcome = match asking.await {
        Ok(RefundStatus::Succeeded) => "refunded",
        Ok(RefundStatus::Pending) => "pending",
        Ok(RefundStatus::Failed { reason }) => {
            tracing::error!(reference = %payment.reference, "the provider could not pay the refund back ({reason}); asked again later, an operator's to settle");
            "refused"
        }
        Err(ProviderError::Refused(why) | ProviderError::ReferenceTaken(why)) => {
            tracing::error!(reference = %payment.reference, "the provider refused the refund ({why}); asked again later, an operator's to settle");
            "refused"
        }
        Err(ProviderError::Unavailable(why)) => {
            tracing::debug!(reference = %payment.reference, "refund unanswered ({why}); asked again later");
            "unavailable"
        }
    };
    metrics::counter!("seckill_orders_refund_attempts_total", "outcome" => outcome).increment(1);
    if outcome != "refunded" {
        return Ok(false);
    }
    store.mark_refunded(&payment.reference, clock.now_unix_ms()).await?;
    tracing::info!(reference = %payment.reference, order = %payment.order_id, amount = payment.amount, "refunded");
    Ok(true)
}
