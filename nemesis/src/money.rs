//! The money checks: the sandbox provider's settlement report (every payment and refund it
//! made, `GET /v1/settlements`) against the order store's payments and orders and the ledger's
//! release logs, read once the order service settled.
//!
//! | kind | the promise |
//! |---|---|
//! | `lost_payment` | every payment the sandbox took (`succeeded`) is recorded in the store under its reference and either paid its order (the order is `paid`) or is a refund (owed, pending or refunded); and a refund the store calls `refunded` was paid back by the sandbox |
//! | `paid_order_released` | no `paid` order was given back: not marked released in the store, not in any SKU's release log |
//! | `refunded_twice` | the sandbox paid each payment back at most once and never more than it took, and never a payment the store counts as paying its order |
//! | `payment_refused` | a buyer's pay is never answered 502 `payment_refused` (the provider's no), and after the shop's checkout opened the payment for the wrong amount, pay answers a new payment of the order's price, never the wrong one: the buyer can always finish paying |

use std::collections::{BTreeMap, BTreeSet};

use crate::checker::{Violation, ViolationKind};

/// A payment the sandbox made.
#[derive(Clone, Debug)]
pub struct ProviderPayment {
    pub id: String,
    pub order_id: String,
    pub amount: u64,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
}

/// A refund the sandbox made.
#[derive(Clone, Debug)]
pub struct ProviderRefund {
    pub refund_id: String,
    /// The payment it pays back.
    pub reference: String,
    pub amount: u64,
}

/// A payment as the store recorded it.
#[derive(Clone, Debug)]
pub struct RecordedPayment {
    pub order_id: String,
    /// `paid`, `paid_after_expiry`, `already_paid`, `mismatch` or `awaiting_order`.
    pub outcome: String,
    /// `owed`, `pending` or `refunded`, when it did not settle its order.
    pub refund: Option<String>,
}

/// An order as the money checks need it.
#[derive(Clone, Debug)]
pub struct MoneyOrder {
    pub state: String,
    /// The store marked its units given back.
    pub released: bool,
}

/// Both sides' books, read after the order service settled.
#[derive(Clone, Debug, Default)]
pub struct MoneyBooks {
    pub payments: Vec<ProviderPayment>,
    pub refunds: Vec<ProviderRefund>,
    /// The store's payments by reference.
    pub recorded: BTreeMap<String, RecordedPayment>,
    /// Every order a payment names, as stored (none: not stored).
    pub orders: BTreeMap<String, Option<MoneyOrder>>,
    /// Order ids in any SKU's release log.
    pub released: BTreeSet<String>,
}

impl MoneyBooks {
    /// Payments the sandbox took.
    pub fn taken(&self) -> impl Iterator<Item = &ProviderPayment> {
        self.payments.iter().filter(|p| p.status == "succeeded")
    }
}

/// Every money violation `books` shows; `books` unreadable is the history's incompleteness.
pub fn check(books: &Result<MoneyBooks, String>) -> Vec<Violation> {
    let books = match books {
        Ok(books) => books,
        Err(e) => {
            return vec![Violation::new(ViolationKind::HistoryIncomplete, format!("the money was unreadable: {e}"))]
        }
    };
    let mut found = Vec::new();
    let mut refunds: BTreeMap<&str, Vec<&ProviderRefund>> = BTreeMap::new();
    for refund in &books.refunds {
        refunds.entry(refund.reference.as_str()).or_default().push(refund);
    }
    for payment in books.taken() {
        let order = books.orders.get(&payment.order_id).cloned().flatten();
        let record = books.recorded.get(&payment.id);
        let paid_back = refunds.get(payment.id.as_str()).map_or(0, |r| r.iter().map(|r| r.amount).sum::<u64>());
        let pays_order = record.is_some_and(|r| r.outcome == "paid" && r.refund.is_none())
            && order.as_ref().is_some_and(|o| o.state == "paid");
        let lost = match record {
            None => Some("the store has no record of it".to_string()),
            Some(_) if pays_order => None,
            Some(RecordedPayment { refund: Some(refund), .. }) if refund == "refunded" && paid_back == 0 => {
                Some("the store calls it refunded, but the sandbox paid nothing back".to_string())
            }
            Some(RecordedPayment { refund: Some(_), .. }) => None,
            Some(record) => Some(format!(
                "the store recorded it as {} with no refund, and its order is {}",
                record.outcome,
                order.as_ref().map_or("not stored", |o| o.state.as_str())
            )),
        };
        if let Some(why) = lost {
            found.push(Violation::new(
                ViolationKind::LostPayment,
                format!(
                    "the sandbox took {} for order {} (payment {}): {why}",
                    payment.amount, payment.order_id, payment.id
                ),
            ));
        }
        let times = refunds.get(payment.id.as_str()).map_or(0, Vec::len);
        let problem = if times > 1 || paid_back > payment.amount {
            Some(format!("paid back {times} times, {paid_back} of {}", payment.amount))
        } else if times > 0 && pays_order {
            Some("paid back, yet the store counts it as paying its order".to_string())
        } else {
            None
        };
        if let Some(problem) = problem {
            found.push(Violation::new(
                ViolationKind::RefundedTwice,
                format!("payment {} of order {}: {problem}", payment.id, payment.order_id),
            ));
        }
    }
    for (id, order) in &books.orders {
        let Some(order) = order.as_ref().filter(|o| o.state == "paid") else { continue };
        if order.released || books.released.contains(id) {
            found.push(Violation::new(
                ViolationKind::PaidOrderReleased,
                format!(
                    "order {id} is paid, and its units went back (store: {}, a ledger release log: {})",
                    order.released,
                    books.released.contains(id)
                ),
            ));
        }
    }
    found
}

/// Whether every buyer could finish paying (`payment_refused`), from what the buyers met.
pub fn check_paying(paying: &crate::payer::PayCounts) -> Vec<Violation> {
    let mut found = Vec::new();
    if paying.refused_by_provider > 0 {
        found.push(Violation::new(
            ViolationKind::PaymentRefused,
            format!("{} presses of pay were answered 502 payment_refused", paying.refused_by_provider),
        ));
    }
    if paying.answered_wrong_payment > 0 {
        found.push(Violation::new(
            ViolationKind::PaymentRefused,
            format!(
                "{} presses of pay, after a wrong-amount checkout, answered a payment that cannot pay the order",
                paying.answered_wrong_payment
            ),
        ));
    }
    found
}

/// Reads the sandbox's settlement report (`GET /v1/settlements`'s JSON).
pub fn parse_settlements(report: &serde_json::Value) -> Result<(Vec<ProviderPayment>, Vec<ProviderRefund>), String> {
    let text = |value: &serde_json::Value, field: &str| {
        value[field].as_str().map(str::to_string).ok_or_else(|| format!("a settlement without {field}: {value}"))
    };
    let amount = |value: &serde_json::Value| value["amount"].as_u64().ok_or_else(|| format!("no amount: {value}"));
    let list = |field: &str| report[field].as_array().cloned().ok_or_else(|| format!("no {field} in {report}"));
    let payments = list("payments")?
        .iter()
        .map(|p| {
            Ok(ProviderPayment {
                id: text(p, "id")?,
                // The sandbox books a payment under its attempt's reference; the checks judge it
                // against its order.
                order_id: orders::payments::attempts::order_of(&text(p, "order_id")?).to_string(),
                amount: amount(p)?,
                status: text(p, "status")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let refunds = list("refunds")?
        .iter()
        .map(|r| {
            Ok(ProviderRefund {
                refund_id: text(r, "refund_id")?,
                reference: text(r, "reference")?,
                amount: amount(r)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((payments, refunds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(id: &str, order: &str) -> ProviderPayment {
        ProviderPayment { id: id.into(), order_id: order.into(), amount: 100, status: "succeeded".into() }
    }

    fn order(state: &str, released: bool) -> Option<MoneyOrder> {
        Some(MoneyOrder { state: state.into(), released })
    }

    fn recorded(order: &str, outcome: &str, refund: Option<&str>) -> RecordedPayment {
        RecordedPayment { order_id: order.into(), outcome: outcome.into(), refund: refund.map(str::to_string) }
    }

    /// o1 paid by pay1; o2 expired, its late payment pay2 refunded; pay3 started and never paid.
    fn clean() -> MoneyBooks {
        MoneyBooks {
            payments: vec![
                taken("pay1", "o1"),
                taken("pay2", "o2"),
                ProviderPayment { status: "pending".into(), ..taken("pay3", "o3") },
            ],
            refunds: vec![ProviderRefund { refund_id: "rf_pay2".into(), reference: "pay2".into(), amount: 100 }],
            recorded: [
                ("pay1".to_string(), recorded("o1", "paid", None)),
                ("pay2".to_string(), recorded("o2", "paid_after_expiry", Some("refunded"))),
            ]
            .into(),
            orders: [
                ("o1".to_string(), order("paid", false)),
                ("o2".to_string(), order("expired", true)),
                ("o3".to_string(), order("expired", true)),
            ]
            .into(),
            released: ["o2".to_string(), "o3".to_string()].into(),
        }
    }

    fn kinds(books: MoneyBooks) -> Vec<ViolationKind> {
        check(&Ok(books)).into_iter().map(|v| v.kind).collect()
    }

    #[test]
    fn paid_orders_and_refunded_late_payments_pass() {
        assert_eq!(kinds(clean()), []);
        // A refund still owed or under way is a refund.
        let mut owed = clean();
        owed.refunds.clear();
        owed.recorded.insert("pay2".into(), recorded("o2", "paid_after_expiry", Some("owed")));
        assert_eq!(kinds(owed), []);
    }

    #[test]
    fn money_taken_with_neither_a_paid_order_nor_a_refund_is_lost() {
        let mut unrecorded = clean();
        unrecorded.recorded.remove("pay1");
        assert_eq!(kinds(unrecorded), [ViolationKind::LostPayment]);
        let mut expired = clean();
        expired.orders.insert("o1".into(), order("expired", false));
        assert_eq!(kinds(expired), [ViolationKind::LostPayment]);
        let mut never_paid_back = clean();
        never_paid_back.refunds.clear();
        assert_eq!(kinds(never_paid_back), [ViolationKind::LostPayment]);
    }

    #[test]
    fn a_paid_order_given_back_is_caught_in_the_store_and_in_the_ledger() {
        let mut store = clean();
        store.orders.insert("o1".into(), order("paid", true));
        assert_eq!(kinds(store), [ViolationKind::PaidOrderReleased]);
        let mut ledger = clean();
        ledger.released.insert("o1".into());
        assert_eq!(kinds(ledger), [ViolationKind::PaidOrderReleased]);
    }

    #[test]
    fn a_payment_paid_back_twice_beyond_its_amount_or_while_it_pays_its_order_is_caught() {
        let mut twice = clean();
        twice.refunds.push(ProviderRefund { refund_id: "rf_other".into(), reference: "pay2".into(), amount: 100 });
        assert_eq!(kinds(twice), [ViolationKind::RefundedTwice]);
        let mut kept = clean();
        kept.refunds.push(ProviderRefund { refund_id: "rf_pay1".into(), reference: "pay1".into(), amount: 100 });
        assert_eq!(kinds(kept), [ViolationKind::RefundedTwice]);
    }

    #[test]
    fn the_settlement_report_is_read() {
        let report = serde_json::json!({
            "payments": [{"id": "pay1", "order_id": "o1", "amount": 100, "currency": "USD", "status": "succeeded"}],
            "refunds": [{"refund_id": "rf_pay1", "reference": "pay1", "amount": 100, "currency": "USD", "status": "succeeded"}],
        });
        let (payments, refunds) = parse_settlements(&report).unwrap();
        assert_eq!((payments.len(), refunds.len(), payments[0].status.as_str()), (1, 1, "succeeded"));
        assert!(parse_settlements(&serde_json::json!({})).is_err());
    }

    #[test]
    fn a_buyer_who_could_not_finish_paying_is_caught() {
        let fine = crate::payer::PayCounts { checkout_wrong: 3, ..Default::default() };
        assert!(check_paying(&fine).is_empty());
        let refused = crate::payer::PayCounts { refused_by_provider: 1, ..Default::default() };
        let wrong = crate::payer::PayCounts { answered_wrong_payment: 2, ..Default::default() };
        for counts in [refused, wrong] {
            let kinds: Vec<_> = check_paying(&counts).into_iter().map(|v| v.kind).collect();
            assert_eq!(kinds, [ViolationKind::PaymentRefused]);
        }
    }
}
