//! The store's side of the payment provider: a started payment extends the deadline once and
//! hands the order to the query job, a refund goes out once, the payment the provider opened is
//! remembered, and one found by query is counted as such.

use super::*;

/// Pay grace the payment checks use.
const GRACE_MS: u64 = 30_000;

fn listed(orders: &[Order], id: &str) -> bool {
    orders.iter().any(|order| order.new.id == id)
}

pub async fn starting_a_payment_extends_the_deadline_once_and_hands_expiry_to_the_query_job(
    store: &dyn OrderStore,
    tag: &str,
) {
    let [a, late] = [order("start-pay", tag, 1), order("start-pay", tag, 2)];
    insert(store, &[a.clone(), late.clone()]).await;
    let extended = a.pay_deadline_ms + GRACE_MS;
    let StartPayment::Started(started) = store.start_payment(&a.id, GRACE_MS, T0 + 1_000).await.expect("start") else {
        panic!("a pending order before its deadline starts its payment");
    };
    assert_eq!(started.new.pay_deadline_ms, extended, "the first start extends the deadline by the grace");
    assert_eq!((started.payment_started_at_ms, started.payment_check_at_ms), (Some(T0 + 1_000), Some(extended)));
    let StartPayment::Started(again) = store.start_payment(&a.id, GRACE_MS, T0 + 2_000).await.expect("again") else {
        panic!("a second start of a pending order answers it started");
    };
    assert_eq!(again.new.pay_deadline_ms, extended, "only the first start extends the deadline");
    assert_eq!(again.payment_started_at_ms, Some(T0 + 1_000));
    let far = T0 + 10_000_000;
    assert!(
        !listed(&store.due_for_expiry(far, INSERT_BATCH_MAX).await.expect("due"), &a.id),
        "an order whose payment started is expired by the query job, never blind"
    );
    assert!(!listed(&store.payment_checks_due(extended - 1, INSERT_BATCH_MAX).await.expect("checks"), &a.id));
    assert!(listed(&store.payment_checks_due(extended, INSERT_BATCH_MAX).await.expect("checks"), &a.id));
    store.schedule_payment_check(&a.id, Some(extended + 5_000)).await.expect("schedule");
    let checked = store.get(&a.id).await.expect("get").expect("stored");
    assert_eq!((checked.payment_checks, checked.payment_check_at_ms), (1, Some(extended + 5_000)));
    assert!(!listed(&store.payment_checks_due(extended + 4_999, INSERT_BATCH_MAX).await.expect("checks"), &a.id));
    store.redrive_payments(extended + 1_000).await.expect("redrive");
    assert!(listed(&store.payment_checks_due(extended + 1_000, INSERT_BATCH_MAX).await.expect("checks"), &a.id));
    store.schedule_payment_check(&a.id, Some(extended + 5_000)).await.expect("schedule again");
    assert_eq!(store.expire(&a.id, FENCE, extended + 6_000).await.expect("expire"), ExpireOutcome::Expired);
    assert!(
        listed(&store.payment_checks_due(extended + 6_000, INSERT_BATCH_MAX).await.expect("checks"), &a.id),
        "an expired order's payment is still to be closed at the provider"
    );
    store.schedule_payment_check(&a.id, None).await.expect("done");
    assert!(!listed(&store.payment_checks_due(far, INSERT_BATCH_MAX).await.expect("checks"), &a.id));

    match store.start_payment(&late.id, GRACE_MS, late.pay_deadline_ms).await.expect("late") {
        StartPayment::NotPending(order) => {
            assert_eq!(order.new.pay_deadline_ms, late.pay_deadline_ms, "a late start extends nothing");
            assert_eq!(order.payment_started_at_ms, None);
        }
        other => panic!("a start at the deadline is too late, got {other:?}"),
    }
    let unknown = format!("start-pay-none-{tag}");
    assert_eq!(store.start_payment(&unknown, GRACE_MS, T0).await.expect("unknown"), StartPayment::UnknownOrder);
    store.schedule_payment_check(&late.id, None).await.expect("tidy");
    assert_eq!(store.expire(&late.id, FENCE, far).await.expect("expire late"), ExpireOutcome::Expired);
    store.mark_released(&a.id, far).await.expect("release a");
    store.mark_released(&late.id, far).await.expect("release late");
}

pub async fn a_cancel_or_a_payment_settles_the_payment_check(store: &dyn OrderStore, tag: &str) {
    let [cancelled, paid] = [order("pay-check", tag, 1), order("pay-check", tag, 2)];
    insert(store, &[cancelled.clone(), paid.clone()]).await;
    for order in [&cancelled, &paid] {
        assert!(matches!(store.start_payment(&order.id, GRACE_MS, T0).await.expect("start"), StartPayment::Started(_)));
    }
    assert_eq!(store.cancel(&cancelled.id, &cancelled.user, T0 + 500).await.expect("cancel"), CancelOutcome::Cancelled);
    let due = store.payment_checks_due(T0 + 500, INSERT_BATCH_MAX).await.expect("checks");
    assert!(listed(&due, &cancelled.id), "a cancelled order's started payment is closed at once, not at the deadline");
    assert_eq!(
        store.record_payment(&payment(&paid, &format!("ref-pay-check-{tag}"))).await.expect("pay"),
        PaymentOutcome::Paid
    );
    let settled = store.get(&paid.id).await.expect("get").expect("stored");
    assert_eq!(settled.payment_check_at_ms, None, "a paid order has nothing left to ask the provider");
    store.schedule_payment_check(&cancelled.id, None).await.expect("done");
    store.mark_released(&cancelled.id, T0 + 600).await.expect("release");
}

pub async fn a_refund_goes_owed_pending_refunded_once(store: &dyn OrderStore, tag: &str) {
    let a = order("refund-flow", tag, 1);
    insert(store, std::slice::from_ref(&a)).await;
    let reference = format!("ref-refund-flow-{tag}");
    // Received long before every other check's payments, so it heads the list however many
    // refunds they leave owed.
    let short = Payment { amount: 1, received_at_ms: T0 / 2, ..payment(&a, &reference) };
    assert!(matches!(store.record_payment(&short).await.expect("pay"), PaymentOutcome::Mismatch { .. }));
    let mine = |due: Vec<PaymentRecord>| due.into_iter().find(|p| p.reference == reference);
    let owed = mine(store.refunds_due(T0 + 200_000, INSERT_BATCH_MAX).await.expect("due")).expect("owed is due");
    assert_eq!((owed.refund, owed.refund_attempts), (Some(RefundState::Owed), 0));
    assert_eq!(owed.refund_id(), format!("rf_{reference}"), "one refund id per payment, however often it is asked");
    store.refund_pending(&reference, T0 + 300_000).await.expect("pending");
    assert!(mine(store.refunds_due(T0 + 299_999, INSERT_BATCH_MAX).await.expect("due")).is_none(), "backoff holds");
    let pending = mine(store.refunds_due(T0 + 300_000, INSERT_BATCH_MAX).await.expect("due")).expect("due again");
    assert_eq!((pending.refund, pending.refund_attempts), (Some(RefundState::Pending), 1));
    let (_, refunds) = store.redrive_payments(T0 + 200_000).await.expect("redrive");
    assert!(refunds >= 1, "a refund waiting out its backoff is made due now");
    let redriven = mine(store.refunds_due(T0 + 200_000, INSERT_BATCH_MAX).await.expect("due")).expect("due now");
    assert_eq!(redriven.refund, Some(RefundState::Pending));
    assert!(store.mark_refunded(&reference, T0 + 300_100).await.expect("refunded"));
    assert!(!store.mark_refunded(&reference, T0 + 300_200).await.expect("twice"), "a refund is done once");
    assert!(mine(store.refunds_due(u64::MAX >> 2, INSERT_BATCH_MAX).await.expect("due")).is_none());
    let money = store.money_counts(&a.sku).await.expect("money");
    assert_eq!((money.refunds_owed, money.refunds_pending, money.refunded), (0, 0, 1));
}

pub async fn a_payment_found_by_query_is_counted_as_such(store: &dyn OrderStore, tag: &str) {
    let a = order("by-query", tag, 1);
    insert(store, std::slice::from_ref(&a)).await;
    let found = Payment { source: PaymentSource::Query, ..payment(&a, &format!("ref-by-query-{tag}")) };
    assert_eq!(store.record_payment(&found).await.expect("pay"), PaymentOutcome::Paid);
    assert_eq!(store.payments_of(&a.id).await.expect("payments")[0].source, PaymentSource::Query);
    assert_eq!(store.money_counts(&a.sku).await.expect("money").found_by_query, 1);
}

/// The payment opened for an order is remembered, the first one only, and read back whole.
pub async fn the_first_opened_payment_of_an_order_is_remembered(store: &dyn OrderStore, tag: &str) {
    let order = order("opened", tag, 1);
    insert(store, std::slice::from_ref(&order)).await;
    assert_eq!(store.opened_payment(&order.id).await.expect("read"), None);
    let opened = OpenedPayment {
        order_id: order.id.clone(),
        payment_id: "pay_1".into(),
        pay_url: "http://provider/pay/pay_1".into(),
        amount: 1999,
        currency: "USD".into(),
        created_at_ms: 1_700_000_000_000,
    };
    store.remember_opened(&opened).await.expect("remembered");
    let other = OpenedPayment { payment_id: "pay_2".into(), ..opened.clone() };
    store.remember_opened(&other).await.expect("a second is no error");
    assert_eq!(store.opened_payment(&order.id).await.expect("read"), Some(opened), "the first one is kept");
}

/// A pending order moves to its next payment attempt once per attempt seen: two callers who
/// saw the same attempt get the same next one; an ended order moves no more. An order paid
/// after more than one attempt keeps a check due, to close the earlier attempts.
pub async fn a_payment_attempt_moves_on_once_per_attempt_seen(store: &dyn OrderStore, tag: &str) {
    let paid = order("attempts-paid", tag, 1);
    insert(store, std::slice::from_ref(&paid)).await;
    assert!(matches!(store.start_payment(&paid.id, GRACE_MS, T0).await.expect("start"), StartPayment::Started(_)));
    assert_eq!(store.next_payment_attempt(&paid.id, 1, T0 + 1).await.expect("next"), Some(2));
    let payment = payment(&paid, &format!("ref-attempts-{tag}"));
    let at = payment.received_at_ms;
    assert_eq!(store.record_payment(&payment).await.expect("pay"), PaymentOutcome::Paid);
    let settled = store.get(&paid.id).await.expect("get").expect("stored");
    assert_eq!(settled.payment_check_at_ms, Some(at), "the earlier attempt is still to be closed");
    assert!(listed(&store.payment_checks_due(at, INSERT_BATCH_MAX).await.expect("checks"), &paid.id));
    store.schedule_payment_check(&paid.id, None).await.expect("closed");

    let a = order("attempts", tag, 1);
    insert(store, std::slice::from_ref(&a)).await;
    assert_eq!(store.get(&a.id).await.expect("get").expect("stored").payment_attempt, 1, "the first attempt");
    assert_eq!(store.next_payment_attempt(&a.id, 1, T0 + 1).await.expect("next"), Some(2));
    assert_eq!(store.next_payment_attempt(&a.id, 1, T0 + 2).await.expect("raced"), Some(2), "moved once");
    assert_eq!(store.next_payment_attempt(&a.id, 2, T0 + 3).await.expect("next"), Some(3));
    assert_eq!(store.get(&a.id).await.expect("get").expect("stored").payment_attempt, 3);
    assert_eq!(store.expire(&a.id, FENCE, a.pay_deadline_ms).await.expect("expire"), ExpireOutcome::Expired);
    assert_eq!(store.next_payment_attempt(&a.id, 3, T0 + 4).await.expect("ended"), Some(3), "an ended order stays");
    let unknown = format!("attempts-none-{tag}");
    assert_eq!(store.next_payment_attempt(&unknown, 1, T0).await.expect("unknown"), None);
}
