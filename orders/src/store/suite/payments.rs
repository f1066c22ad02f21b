//! Payments: each reference decides once (a repeat answers the first outcome), a wrong amount or
//! a second payment owes a refund, a payment may come before its order, and the money adds up.

use super::*;

/// Pending → paid once; the same reference again is a duplicate answering the first outcome; a
/// second reference is kept as already paid and changes nothing.
pub async fn a_payment_settles_a_pending_order_once(store: &dyn OrderStore, tag: &str) {
    let order = order("pay", tag, 1);
    insert(store, std::slice::from_ref(&order)).await;
    let first = payment(&order, &format!("ref-pay-{tag}"));
    assert_eq!(store.record_payment(&first).await.expect("pay"), PaymentOutcome::Paid);
    let paid = store.get(&order.id).await.expect("get").expect("stored");
    assert_eq!(paid.state, OrderState::Paid);
    assert_eq!(paid.payment_ref.as_deref(), Some(first.reference.as_str()));
    assert_eq!(paid.paid_at_ms, Some(first.received_at_ms));
    assert_eq!(
        store.record_payment(&first).await.expect("pay again"),
        PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::Paid) }
    );
    let second = payment(&order, &format!("ref-pay-second-{tag}"));
    assert_eq!(store.record_payment(&second).await.expect("second ref"), PaymentOutcome::AlreadyPaid);
    assert_eq!(
        store.record_payment(&second).await.expect("second ref again"),
        PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::AlreadyPaid) }
    );
    let after = store.get(&order.id).await.expect("get").expect("stored");
    assert_eq!(after, paid, "a second payment must not change a paid order");
}

/// A wrong amount or currency is recorded, owing a refund, and leaves the order pending; a
/// repeat of it answers the same; a right payment under its own reference then pays.
pub async fn a_mismatched_payment_is_recorded_as_a_refund_owed(store: &dyn OrderStore, tag: &str) {
    let order = NewOrder { qty: 3, ..order("mismatch", tag, 1) };
    insert(store, std::slice::from_ref(&order)).await;
    let expected = PaymentOutcome::Mismatch { expected_amount: PRICE * 3, expected_currency: "EUR".into() };
    let short = Payment { amount: PRICE, ..payment(&order, &format!("ref-mismatch-short-{tag}")) };
    assert_eq!(store.record_payment(&short).await.expect("short"), expected);
    assert_eq!(
        store.record_payment(&short).await.expect("short again"),
        PaymentOutcome::Duplicate { first: Box::new(expected.clone()) }
    );
    let dollars = Payment { currency: "USD".into(), ..payment(&order, &format!("ref-mismatch-usd-{tag}")) };
    assert_eq!(store.record_payment(&dollars).await.expect("usd"), expected);
    assert_eq!(state(store, &order.id).await, OrderState::PendingPayment, "a mismatch settles nothing");
    let recorded = store.payments_of(&order.id).await.expect("payments");
    assert_eq!(recorded.len(), 2, "both recorded: the money was taken");
    for record in &recorded {
        assert_eq!((record.outcome.as_str(), record.refund), ("mismatch", Some(RefundState::Owed)), "{record:?}");
        assert!(record.refund_reason.as_deref().is_some_and(|r| r.contains("for an order of")), "{record:?}");
    }
    let right = payment(&order, &format!("ref-mismatch-right-{tag}"));
    assert_eq!(store.record_payment(&right).await.expect("right"), PaymentOutcome::Paid);
    let owed: Vec<String> = store
        .refunds_owed(100_000)
        .await
        .expect("refunds owed")
        .into_iter()
        .filter(|record| record.order_id == order.id)
        .map(|record| record.reference)
        .collect();
    assert_eq!(owed, [short.reference.clone(), dollars.reference.clone()], "the right payment owes nothing");
}

/// A payment for an order not stored yet is recorded as waiting and settles the order when it
/// arrives (before it can expire); a second one for the same order then owes a refund.
pub async fn a_payment_before_its_order_waits_and_settles_when_it_arrives(store: &dyn OrderStore, tag: &str) {
    let order = order("early-payment", tag, 1);
    let early = payment(&order, &format!("ref-early-{tag}"));
    let twice = payment(&order, &format!("ref-early-twice-{tag}"));
    assert_eq!(store.record_payment(&early).await.expect("early"), PaymentOutcome::AwaitingOrder);
    assert_eq!(
        store.record_payment(&early).await.expect("early again"),
        PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::AwaitingOrder) }
    );
    let later = Payment { received_at_ms: early.received_at_ms + 1, ..twice.clone() };
    assert_eq!(store.record_payment(&later).await.expect("second"), PaymentOutcome::AwaitingOrder);
    let none_yet: Vec<_> = store
        .settle_awaiting(100_000)
        .await
        .expect("settle")
        .into_iter()
        .filter(|(r, _)| r.contains(tag) && r.contains("early"))
        .collect();
    assert!(none_yet.is_empty(), "nothing to settle before the order exists: {none_yet:?}");
    insert(store, std::slice::from_ref(&order)).await;
    // Past its deadline already (a consumer far behind): the sweeper must not expire it first.
    assert_eq!(
        store.expire(&order.id, FENCE, order.pay_deadline_ms + 1).await.expect("expire"),
        ExpireOutcome::NotPending
    );
    let settled: Vec<(String, PaymentOutcome)> = store
        .settle_awaiting(100_000)
        .await
        .expect("settle")
        .into_iter()
        .filter(|(r, _)| r.contains(tag) && r.contains("early"))
        .collect();
    assert_eq!(
        settled,
        [(early.reference.clone(), PaymentOutcome::Paid), (later.reference.clone(), PaymentOutcome::AlreadyPaid)]
    );
    let paid = store.get(&order.id).await.expect("get").expect("stored");
    assert_eq!((paid.state, paid.payment_ref.as_deref()), (OrderState::Paid, Some(early.reference.as_str())));
    let records = store.payments_of(&order.id).await.expect("payments");
    let summary: Vec<(&str, Option<RefundState>)> = records.iter().map(|r| (r.outcome.as_str(), r.refund)).collect();
    assert_eq!(summary, [("paid", None), ("already_paid", Some(RefundState::Owed))]);
    assert_eq!(
        store.record_payment(&early).await.expect("early, once more"),
        PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::Paid) }
    );
    assert!(store
        .settle_awaiting(100_000)
        .await
        .expect("settle")
        .iter()
        .all(|(r, _)| !r.contains(&format!("early-{tag}"))));
}

/// Every payment recorded against a SKU's orders is counted once: settled, or owing a refund.
pub async fn money_counts_add_up_per_sku(store: &dyn OrderStore, tag: &str) {
    let check = "money";
    assert_eq!(store.money_counts(&sku(check, tag)).await.expect("money"), SkuMoneyCounts::default());
    let (a, b, c) = (order(check, tag, 1), order(check, tag, 2), order(check, tag, 3));
    insert(store, &[a.clone(), b.clone(), c.clone()]).await;
    assert_eq!(
        store.record_payment(&payment(&a, &format!("ref-money-a-{tag}"))).await.expect("a"),
        PaymentOutcome::Paid
    );
    let twice = payment(&a, &format!("ref-money-a2-{tag}"));
    assert_eq!(store.record_payment(&twice).await.expect("a twice"), PaymentOutcome::AlreadyPaid);
    let short = Payment { amount: 1, ..payment(&b, &format!("ref-money-b-{tag}")) };
    assert!(matches!(store.record_payment(&short).await.expect("b"), PaymentOutcome::Mismatch { .. }));
    assert_eq!(store.expire(&c.id, FENCE, T0 + 70_000).await.expect("expire"), ExpireOutcome::Expired);
    let late = payment(&c, &format!("ref-money-c-{tag}"));
    assert_eq!(store.record_payment(&late).await.expect("c"), PaymentOutcome::PaidAfterExpiry);
    let money = store.money_counts(&sku(check, tag)).await.expect("money");
    assert_eq!(
        money,
        SkuMoneyCounts {
            payments: 4,
            settled: 1,
            refunds_owed: 3,
            refunds_pending: 0,
            refunded: 0,
            awaiting: 0,
            paid_orders: 1,
            paid_orders_released: 0,
            found_by_query: 0,
        }
    );
}

pub async fn a_reused_reference_is_refused(store: &dyn OrderStore, tag: &str) {
    let (a, b) = (order("reused-ref", tag, 1), order("reused-ref", tag, 2));
    insert(store, &[a.clone(), b.clone()]).await;
    let reference = format!("ref-reused-{tag}");
    assert_eq!(store.record_payment(&payment(&a, &reference)).await.expect("pay a"), PaymentOutcome::Paid);
    assert_eq!(store.record_payment(&payment(&b, &reference)).await.expect("pay b"), PaymentOutcome::ReferenceReused);
    assert_eq!(state(store, &b.id).await, OrderState::PendingPayment);
}
