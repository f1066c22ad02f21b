//! The order state machine and the payment/refund lifecycle, as pure decisions: what a payment,
//! a cancel, an expiry or a refund does to an order, decided here once. The stores
//! ([`crate::store`]) only persist a decision atomically, in their own dialect, and report back
//! what they changed; both sides assert that the decision and the store's result agree.
//!
//! **The order's states.**
//! ```text
//!                  ┌── pay ─────────▶ paid                 (terminal)
//! pending_payment ─┼── cancel ──────▶ cancelled ─┐
//!                  └── expire ──────▶ expired ───┴─ pay ─▶ paid_after_expiry (terminal)
//! ```
//! **A recorded payment's refund.** `none` (it settled its order) or `owed → pending →
//! refunded`, `owed → refunded` when the first ask is acknowledged at once.
//!
//! **Invariants** (each asserted where it is decided and where it is persisted):
//! 1. Only the transitions drawn above happen ([`OrderState::may_become`]); `paid` and
//!    `paid_after_expiry` are terminal: a terminal order never changes state.
//! 2. A payment moves its order `pending_payment → paid` exactly when its outcome is
//!    [`PaymentOutcome::Paid`], and owes a refund exactly when its outcome says so
//!    ([`PaymentOutcome::refund_owed`]), with a reason.
//! 3. A payment is decided once per reference: a repeat answers what the first did.
//! 4. A refund is asked under one refund id per payment ([`PaymentRecord::refund_id`](crate::model::PaymentRecord::refund_id)) and
//!    acknowledged once; its state only moves forward ([`RefundState::may_become`]).
//! 5. An order's units go back at most once, and only from a state that gives them back.
//! 6. Money and unit counts are never negative, and no part exceeds its whole.

use crate::model::{
    CancelOutcome, ExpireOutcome, Order, OrderState, Payment, PaymentOutcome, RefundState, SkuMoneyCounts,
    SkuOrderCounts, StartPayment,
};

/// The reasons a refund is owed, as migration 3 also writes them for older rows.
pub const REFUND_AFTER_EXPIRY: &str = "paid after the order expired or was cancelled";
pub const REFUND_ALREADY_PAID: &str = "the order was already paid";

/// What a stored order looks like to a payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderFacts {
    pub state: OrderState,
    pub unit_price: u64,
    pub qty: u32,
    pub currency: String,
}

impl OrderFacts {
    /// What the buyer must pay: unit price × quantity.
    pub fn amount(&self) -> u64 {
        self.unit_price.saturating_mul(u64::from(self.qty))
    }
}

/// What a payment does to an order: the outcome, the order's new state (if it changes), and
/// the reason a refund is owed (if one is). Both stores apply it under their serialization
/// (SQLite's write lock, PostgreSQL's row lock), so one payment decides at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    pub outcome: PaymentOutcome,
    pub to: Option<OrderState>,
    pub refund_reason: Option<String>,
}

impl Settlement {
    /// The refund the payment's row starts with: owed when the payment did not settle its order.
    pub fn refund(&self) -> Option<RefundState> {
        self.refund_reason.as_ref().map(|_| RefundState::Owed)
    }
}

/// Decides what `payment` does to an order in `facts`'s state. A wrong amount or currency
/// changes no order; a right one pays a pending order, comes too late for an ended one, or
/// comes second to a paid one.
pub fn settle(facts: &OrderFacts, payment: &Payment) -> Settlement {
    let expected_amount = facts.amount();
    let settlement = if payment.amount != expected_amount || payment.currency != facts.currency {
        let reason = format!(
            "paid {} {} for an order of {expected_amount} {}",
            payment.amount, payment.currency, facts.currency
        );
        let outcome = PaymentOutcome::Mismatch { expected_amount, expected_currency: facts.currency.clone() };
        Settlement { outcome, to: None, refund_reason: Some(reason) }
    } else {
        match facts.state {
            OrderState::PendingPayment => {
                Settlement { outcome: PaymentOutcome::Paid, to: Some(OrderState::Paid), refund_reason: None }
            }
            OrderState::Expired | OrderState::Cancelled => Settlement {
                outcome: PaymentOutcome::PaidAfterExpiry,
                to: Some(OrderState::PaidAfterExpiry),
                refund_reason: Some(REFUND_AFTER_EXPIRY.into()),
            },
            OrderState::Paid | OrderState::PaidAfterExpiry => Settlement {
                outcome: PaymentOutcome::AlreadyPaid,
                to: None,
                refund_reason: Some(REFUND_ALREADY_PAID.into()),
            },
        }
    };
    debug_assert!(
        settlement.to.is_none_or(|to| facts.state.may_become(to)),
        "a payment moves an order {:?} → {:?}, which the state machine forbids",
        facts.state,
        settlement.to
    );
    debug_assert_eq!(
        settlement.outcome == PaymentOutcome::Paid,
        settlement.to == Some(OrderState::Paid),
        "a payment settles its order exactly when it pays it"
    );
    debug_assert_eq!(
        settlement.outcome.refund_owed(),
        settlement.refund_reason.is_some(),
        "a refund is owed exactly when the outcome says so, with a reason"
    );
    settlement
}

/// What a payment whose reference is already recorded answers: the reference reused for
/// another order changes nothing; for the same order, what the first record did (`first`,
/// read only then).
pub fn repeat<E>(
    first_order_id: &str,
    payment: &Payment,
    first: impl FnOnce() -> Result<PaymentOutcome, E>,
) -> Result<PaymentOutcome, E> {
    if first_order_id != payment.order_id {
        return Ok(PaymentOutcome::ReferenceReused);
    }
    let first = first()?;
    debug_assert!(
        !matches!(first, PaymentOutcome::Duplicate { .. } | PaymentOutcome::ReferenceReused),
        "a stored outcome is what a first notification did, never a repeat's answer"
    );
    Ok(PaymentOutcome::Duplicate { first: Box::new(first) })
}

/// What the buyer's "pay" answers, from the order as it stands after the store's
/// compare-and-set (started only while pending, before the deadline, once).
pub fn start_payment_outcome(order: Option<Order>, now_ms: u64) -> StartPayment {
    match order {
        None => StartPayment::UnknownOrder,
        Some(order)
            if order.state == OrderState::PendingPayment
                && order.payment_started_at_ms.is_some()
                && order.new.pay_deadline_ms > now_ms =>
        {
            StartPayment::Started(order)
        }
        Some(order) => StartPayment::NotPending(order),
    }
}

/// What a buyer's cancel answers when the compare-and-set changed `changed` rows, then found
/// the order in `state` (`None`: gone).
pub fn cancel_outcome(changed: u64, state: impl FnOnce() -> Option<OrderState>) -> CancelOutcome {
    debug_assert!(changed <= 1, "a cancel changed {changed} orders: the order id is the key");
    if changed == 1 {
        return CancelOutcome::Cancelled;
    }
    match state() {
        Some(OrderState::Cancelled) => CancelOutcome::AlreadyCancelled,
        Some(state) => CancelOutcome::NotPending { state },
        None => CancelOutcome::UnknownOrder,
    }
}

/// What an expiry answers when the compare-and-set changed `changed` rows: expired, or refused
/// because a newer sweeper's fence (`store_fence`) is above this one's, or because the order is
/// no longer pending (or a payment waits for it).
pub fn expire_outcome(changed: u64, fence: u64, store_fence: impl FnOnce() -> u64) -> ExpireOutcome {
    debug_assert!(changed <= 1, "an expiry changed {changed} orders: the order id is the key");
    if changed == 1 {
        return ExpireOutcome::Expired;
    }
    if fence < store_fence() {
        ExpireOutcome::StaleFence
    } else {
        ExpireOutcome::NotPending
    }
}

/// The store's result of a one-row compare-and-set (a release noted, a refund acknowledged, a
/// refusal noted): true when it changed the row, which happens at most once per row.
pub fn changed_once(changed: u64, what: &str) -> bool {
    debug_assert!(changed <= 1, "{what} changed {changed} rows: its key names one");
    changed == 1
}

/// Checks a SKU's money counts, as read, against invariant 6: every part within its whole. (A
/// paid order whose units were given back is the reconciler's to report, not a panic: it is
/// found in data an operator may have touched.)
pub fn check_money(counts: &SkuMoneyCounts) {
    debug_assert!(counts.settled <= counts.payments, "more payments settled than recorded: {counts:?}");
    debug_assert!(counts.awaiting <= counts.payments, "more payments awaiting than recorded: {counts:?}");
    debug_assert!(counts.found_by_query <= counts.payments, "more payments found than recorded: {counts:?}");
    let refunds = counts.refunds_owed.saturating_add(counts.refunds_pending).saturating_add(counts.refunded);
    debug_assert!(refunds <= counts.payments, "more refunds than payments: {counts:?}");
}

/// Checks a SKU's order counts, as read: the unreleased orders are among those that give units
/// back.
pub fn check_orders(counts: &SkuOrderCounts) {
    let giving_back = counts.units_expired + counts.units_cancelled + counts.units_paid_after_expiry;
    debug_assert!(counts.orders_unreleased <= counts.orders, "more orders unreleased than stored: {counts:?}");
    debug_assert!(
        counts.units_release_refused <= giving_back,
        "more units refused release than give units back: {counts:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PaymentSource;

    fn payment(amount: u64, currency: &str) -> Payment {
        Payment {
            order_id: "o-1".into(),
            reference: "pay-1".into(),
            amount,
            currency: currency.into(),
            received_at_ms: 5,
            source: PaymentSource::Callback,
        }
    }

    fn facts(state: OrderState) -> OrderFacts {
        OrderFacts { state, unit_price: 250, qty: 2, currency: "EUR".into() }
    }

    #[test]
    fn every_state_settles_a_payment_within_the_state_machine() {
        for state in OrderState::ALL {
            for (amount, currency) in [(500, "EUR"), (499, "EUR"), (500, "USD")] {
                let settlement = settle(&facts(state), &payment(amount, currency));
                assert!(settlement.to.is_none_or(|to| state.may_become(to)), "{state:?} {settlement:?}");
            }
        }
    }

    #[test]
    fn a_repeat_for_another_order_is_a_reused_reference() {
        let mut other = payment(500, "EUR");
        other.order_id = "o-2".into();
        let unread = || -> Result<PaymentOutcome, ()> { Err(()) };
        assert_eq!(repeat("o-1", &other, unread), Ok(PaymentOutcome::ReferenceReused));
        let same = payment(500, "EUR");
        assert_eq!(
            repeat("o-1", &same, || Ok::<_, ()>(PaymentOutcome::Paid)),
            Ok(PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::Paid) })
        );
    }
}
