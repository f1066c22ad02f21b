//! The store held against the provider's books: the daily reconciliation a merchant runs on a
//! settlement report. The ledger-against-store check ([`crate::reconcile`]) cannot see money the
//! store never heard of; this can. For every payment the provider's report lists in a window:
//!
//! - a succeeded payment the store does not know, older than the bound, is money taken and
//!   unrecorded (its callback and every query missed it);
//! - a payment the store holds as `awaiting_order` beyond the bound names an order that never
//!   arrived: an operator's;
//! - a refund the store calls done must be a succeeded refund in the provider's books;
//! - a refund owed or pending beyond the bound is stuck;
//! - and per currency, what the provider holds net of refunds must equal what the store
//!   recorded net of its refunds, over the same payments.
//!
//! Payments younger than the bound are in flight (a callback still being retried), counted but
//! never findings.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::model::{PaymentRecord, RefundState};
use crate::provider::{PaymentProvider, SettledRefund};
use crate::store::OrderStore;

/// One disagreement between the books.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub order_id: String,
    pub reference: String,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The provider holds a succeeded payment the store does not know.
    UnrecordedPayment,
    /// The store holds a payment for an order it never stored.
    AwaitingOrder,
    /// The store calls a refund done that the provider did not make.
    RefundNotMade,
    /// A refund owed or pending for longer than the bound.
    RefundOverdue,
    /// A currency's net totals differ.
    TotalsDiffer,
}

impl FindingKind {
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::UnrecordedPayment => "unrecorded_payment",
            FindingKind::AwaitingOrder => "awaiting_order",
            FindingKind::RefundNotMade => "refund_not_made",
            FindingKind::RefundOverdue => "refund_overdue",
            FindingKind::TotalsDiffer => "totals_differ",
        }
    }
}

/// Net money of one currency, in minor units: succeeded payments less succeeded refunds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub provider: i128,
    pub store: i128,
}

/// What the comparison found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BooksCheck {
    pub from_ms: u64,
    pub to_ms: u64,
    /// Succeeded payments in the provider's report.
    pub payments: u64,
    /// Of them, younger than the bound: not judged yet.
    pub in_flight: u64,
    pub refunds: u64,
    pub totals: BTreeMap<String, Totals>,
    pub findings: Vec<Finding>,
}

impl BooksCheck {
    pub fn ok(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Compares the provider's report of payments created in `[from_ms, now_ms)` with the store.
/// `bound`: how long a callback, a refund or an order may take before its absence is a finding.
pub async fn check(
    store: &dyn OrderStore,
    provider: &dyn PaymentProvider,
    from_ms: u64,
    now_ms: u64,
    bound: Duration,
) -> Result<BooksCheck, String> {
    let report = provider.settlements(from_ms, now_ms).await.map_err(|e| e.to_string())?;
    let settled_before = now_ms.saturating_sub(bound.as_millis() as u64);
    let mut refunds: HashMap<&str, Vec<&SettledRefund>> = HashMap::new();
    for refund in &report.refunds {
        refunds.entry(refund.reference.as_str()).or_default().push(refund);
    }
    let mut check =
        BooksCheck { from_ms, to_ms: now_ms, refunds: report.refunds.len() as u64, ..BooksCheck::default() };
    let mut finding = |kind, order_id: &str, reference: &str, detail: String| {
        check.findings.push(Finding { kind, order_id: order_id.into(), reference: reference.into(), detail })
    };
    let mut totals: BTreeMap<String, Totals> = BTreeMap::new();
    let mut payments = 0;
    let mut in_flight = 0;
    for payment in report.payments.iter().filter(|payment| payment.succeeded) {
        payments += 1;
        if payment.at_ms > settled_before {
            in_flight += 1;
            continue;
        }
        let made: Vec<&&SettledRefund> =
            refunds.get(payment.reference.as_str()).into_iter().flatten().filter(|refund| refund.succeeded).collect();
        let provider_net =
            i128::from(payment.amount) - made.iter().map(|refund| i128::from(refund.amount)).sum::<i128>();
        totals.entry(payment.currency.clone()).or_default().provider += provider_net;
        // The provider books a payment under its attempt's reference (`super::attempts`).
        let order_id = super::attempts::order_of(&payment.order_id);
        let records = store.payments_of(order_id).await.map_err(|e| e.to_string())?;
        let Some(record) = records.iter().find(|record| record.reference == payment.reference) else {
            finding(
                FindingKind::UnrecordedPayment,
                order_id,
                &payment.reference,
                format!("the provider took {} {} the store does not know", payment.amount, payment.currency),
            );
            continue;
        };
        // A refund asked of the provider and made there, not yet acknowledged here, is money on
        // its way back in both books.
        let refunded = matches!(record.refund, Some(RefundState::Refunded))
            || (matches!(record.refund, Some(RefundState::Pending)) && !made.is_empty());
        let store_net = i128::from(record.amount) - if refunded { i128::from(record.amount) } else { 0 };
        totals.entry(record.currency.clone()).or_default().store += store_net;
        if let Some((kind, detail)) = judge(record, !made.is_empty(), record.received_at_ms <= settled_before, bound) {
            finding(kind, &record.order_id, &record.reference, detail);
        }
    }
    for (currency, sums) in &totals {
        if sums.provider != sums.store {
            finding(
                FindingKind::TotalsDiffer,
                "",
                "",
                format!("{currency}: the provider holds {} net, the store {}", sums.provider, sums.store),
            );
        }
    }
    check.payments = payments;
    check.in_flight = in_flight;
    check.totals = totals;
    Ok(check)
}

/// What a recorded payment that the provider holds as succeeded may still be wrong about: its
/// order never came, or its refund. `old`: recorded longer than `bound` ago.
fn judge(record: &PaymentRecord, refund_made: bool, old: bool, bound: Duration) -> Option<(FindingKind, String)> {
    if record.outcome == "awaiting_order" && old {
        return Some((FindingKind::AwaitingOrder, "a payment for an order the store never received".into()));
    }
    match record.refund {
        Some(RefundState::Refunded) if !refund_made => {
            Some((FindingKind::RefundNotMade, "the store calls the refund done; the provider made none".into()))
        }
        Some(state @ (RefundState::Owed | RefundState::Pending)) if old => {
            Some((FindingKind::RefundOverdue, format!("refund {} for longer than {bound:?}", state.as_str())))
        }
        _ => None,
    }
}
