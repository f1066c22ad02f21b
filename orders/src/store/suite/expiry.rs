//! The end of an unpaid order: cancelled by its owner only, expired under the sweeper's fence,
//! paid late all the same, and listed for the sweepers (due for expiry, units owed back).

use super::*;

/// After raise_fence(F), an expire with a lower fence is refused and changes nothing; the fence
/// never goes down.
pub async fn a_stale_fence_is_refused_after_raise_fence(store: &dyn OrderStore, tag: &str) {
    let order = order("stale-fence", tag, 1);
    insert(store, std::slice::from_ref(&order)).await;
    store.raise_fence(FENCE - 1).await.expect("raise");
    store.raise_fence(FENCE).await.expect("raise");
    store.raise_fence(FENCE - 5).await.expect("a lower raise is a no-op");
    assert_eq!(store.expire(&order.id, FENCE - 1, T0).await.expect("expire"), ExpireOutcome::StaleFence);
    assert_eq!(state(store, &order.id).await, OrderState::PendingPayment, "a stale sweeper changes nothing");
    assert_eq!(store.expire(&order.id, FENCE, T0).await.expect("expire"), ExpireOutcome::Expired);
    let expired = store.get(&order.id).await.expect("get").expect("stored");
    assert_eq!((expired.state, expired.expired_at_ms), (OrderState::Expired, Some(T0)));
}

/// A payment for an expired or cancelled order is kept as paid after expiry (its units still
/// owed back if not yet released); a further reference is already paid.
pub async fn a_late_payment_is_kept_as_paid_after_expiry(store: &dyn OrderStore, tag: &str) {
    let check = "late-payment";
    let (expired, cancelled) = (order(check, tag, 1), order(check, tag, 2));
    insert(store, &[expired.clone(), cancelled.clone()]).await;
    assert_eq!(store.expire(&expired.id, FENCE, T0 + 70_000).await.expect("expire"), ExpireOutcome::Expired);
    assert_eq!(
        store.cancel(&cancelled.id, &cancelled.user, T0 + 70_000).await.expect("cancel"),
        CancelOutcome::Cancelled
    );
    for order in [&expired, &cancelled] {
        let late = payment(order, &format!("ref-{}", order.id));
        assert_eq!(store.record_payment(&late).await.expect("late"), PaymentOutcome::PaidAfterExpiry);
        let stored = store.get(&order.id).await.expect("get").expect("stored");
        assert_eq!(stored.state, OrderState::PaidAfterExpiry);
        assert_eq!(stored.payment_ref.as_deref(), Some(late.reference.as_str()));
        assert_eq!(stored.paid_at_ms, Some(late.received_at_ms));
        assert_eq!(
            store.record_payment(&late).await.expect("again"),
            PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::PaidAfterExpiry) }
        );
        let another = payment(order, &format!("ref-another-{}", order.id));
        assert_eq!(store.record_payment(&another).await.expect("another"), PaymentOutcome::AlreadyPaid);
    }
    let counts = store.counts(&sku(check, tag)).await.expect("counts");
    assert_eq!((counts.units_paid_after_expiry, counts.orders_unreleased), (2, 2));
}

pub async fn cancel_takes_only_the_owners_pending_order(store: &dyn OrderStore, tag: &str) {
    let (order, paid) = (order("cancel", tag, 1), order("cancel", tag, 2));
    insert(store, &[order.clone(), paid.clone()]).await;
    let now = T0 + 5_000;
    assert_eq!(store.cancel(&order.id, "someone-else", now).await.expect("cancel"), CancelOutcome::UnknownOrder);
    assert_eq!(
        store.cancel(&format!("missing-{tag}"), &order.user, now).await.expect("cancel"),
        CancelOutcome::UnknownOrder
    );
    assert_eq!(state(store, &order.id).await, OrderState::PendingPayment, "another user's cancel changes nothing");
    assert_eq!(store.cancel(&order.id, &order.user, now).await.expect("cancel"), CancelOutcome::Cancelled);
    let cancelled = store.get(&order.id).await.expect("get").expect("stored");
    assert_eq!((cancelled.state, cancelled.cancelled_at_ms), (OrderState::Cancelled, Some(now)));
    assert_eq!(store.cancel(&order.id, &order.user, now).await.expect("cancel"), CancelOutcome::AlreadyCancelled);
    assert_eq!(
        store.record_payment(&payment(&paid, &format!("ref-cancel-{tag}"))).await.expect("pay"),
        PaymentOutcome::Paid
    );
    assert_eq!(
        store.cancel(&paid.id, &paid.user, now).await.expect("cancel"),
        CancelOutcome::NotPending { state: OrderState::Paid }
    );
}

pub async fn expire_takes_only_pending_orders(store: &dyn OrderStore, tag: &str) {
    let (order, paid) = (order("expire", tag, 1), order("expire", tag, 2));
    insert(store, &[order.clone(), paid.clone()]).await;
    assert_eq!(store.expire(&order.id, FENCE, T0 + 61_000).await.expect("expire"), ExpireOutcome::Expired);
    assert_eq!(store.expire(&order.id, FENCE, T0 + 62_000).await.expect("expire"), ExpireOutcome::NotPending);
    assert_eq!(store.get(&order.id).await.expect("get").expect("stored").expired_at_ms, Some(T0 + 61_000));
    assert_eq!(
        store.record_payment(&payment(&paid, &format!("ref-expire-{tag}"))).await.expect("pay"),
        PaymentOutcome::Paid
    );
    assert_eq!(store.expire(&paid.id, FENCE, T0 + 61_000).await.expect("expire"), ExpireOutcome::NotPending);
    assert_eq!(state(store, &paid.id).await, OrderState::Paid);
    assert_eq!(store.expire(&format!("missing-{tag}"), FENCE, T0).await.expect("expire"), ExpireOutcome::NotPending);
}

/// Pending orders at or past their deadline, oldest deadline first, at most `limit`. Uses
/// deadlines far below [`T0`] and expires its orders at the end.
pub async fn due_for_expiry_lists_pending_orders_by_deadline(store: &dyn OrderStore, tag: &str) {
    let check = "due";
    let mut batch = orders(check, tag, 4);
    for (order, deadline) in batch.iter_mut().zip([30, 10, 20, 40]) {
        order.pay_deadline_ms = deadline;
    }
    insert(store, &batch).await;
    // The order due at 20 is paid: no longer due.
    assert_eq!(
        store.record_payment(&payment(&batch[2], &format!("ref-due-{tag}"))).await.expect("pay"),
        PaymentOutcome::Paid
    );
    let ours = |orders: Vec<Order>| -> Vec<u64> {
        orders.into_iter().filter(|o| o.new.sku == sku(check, tag)).map(|o| o.new.pay_deadline_ms).collect()
    };
    assert_eq!(ours(store.due_for_expiry(30, 100).await.expect("due")), [10, 30], "due at or before now, by deadline");
    let first = store.due_for_expiry(30, 1).await.expect("due");
    assert_eq!(first.len(), 1, "at most the limit");
    assert_eq!(first[0].new.id, batch[1].id, "the oldest deadline first");
    for order in [&batch[0], &batch[1], &batch[3]] {
        assert_eq!(store.expire(&order.id, FENCE, 50).await.expect("expire"), ExpireOutcome::Expired);
    }
    assert!(ours(store.due_for_expiry(T0, 10_000).await.expect("due")).is_empty(), "expired orders are not due");
    for order in [&batch[0], &batch[1], &batch[3]] {
        assert!(store.mark_released(&order.id, 60).await.expect("release"));
    }
}

/// Expired, cancelled and paid-after-expiry orders are unreleased until marked, by deadline, and
/// a cursor walks on from where the last page ended; marking twice is false; an order marked
/// refused leaves the list, with its reason, and cannot be marked released after. Uses deadlines
/// far below [`T0`] and releases (or refuses) everything at the end.
pub async fn unreleased_lists_orders_owing_units_until_released(store: &dyn OrderStore, tag: &str) {
    let check = "unreleased";
    let mut batch = orders(check, tag, 6);
    // Deadlines in the reverse of the ids' order: the list goes by deadline.
    for (order, deadline) in batch.iter_mut().zip([40, 30, 20, 10, 5, 50]) {
        order.pay_deadline_ms = deadline;
    }
    insert(store, &batch).await;
    assert_eq!(store.expire(&batch[0].id, FENCE, 300).await.expect("expire"), ExpireOutcome::Expired);
    assert_eq!(store.cancel(&batch[1].id, &batch[1].user, 100).await.expect("cancel"), CancelOutcome::Cancelled);
    assert_eq!(store.expire(&batch[2].id, FENCE, 150).await.expect("expire"), ExpireOutcome::Expired);
    let late = Payment { received_at_ms: 200, ..payment(&batch[2], &format!("ref-unreleased-late-{tag}")) };
    assert_eq!(store.record_payment(&late).await.expect("late"), PaymentOutcome::PaidAfterExpiry);
    let paid = Payment { received_at_ms: 50, ..payment(&batch[3], &format!("ref-unreleased-paid-{tag}")) };
    assert_eq!(store.record_payment(&paid).await.expect("paid"), PaymentOutcome::Paid);
    // batch[4] stays pending.
    let ours = |orders: Vec<Order>| -> Vec<String> {
        orders.into_iter().filter(|o| o.new.sku == sku(check, tag)).map(|o| o.new.id).collect()
    };
    let expected = [batch[2].id.clone(), batch[1].id.clone(), batch[0].id.clone()];
    assert_eq!(ours(store.unreleased(None, 100_000).await.expect("unreleased")), expected, "by deadline");
    let first = store.unreleased(None, 1).await.expect("unreleased");
    assert_eq!(first.len(), 1, "at most the limit");
    assert_eq!(first[0].new.id, batch[2].id);
    let next = store.unreleased(Some(&ReleaseCursor::after(&first[0])), 1).await.expect("unreleased");
    assert_eq!(next[0].new.id, batch[1].id, "the cursor walks on after the last one taken");
    assert_eq!(store.counts(&sku(check, tag)).await.expect("counts").orders_unreleased, 3);
    // batch[5] expires and the ledger refuses its release: it leaves the list, with its reason.
    assert_eq!(store.expire(&batch[5].id, FENCE, 300).await.expect("expire"), ExpireOutcome::Expired);
    assert!(store.mark_release_refused(&batch[5].id, "no record of this sale", 310).await.expect("refuse"));
    assert!(!store.mark_release_refused(&batch[5].id, "again", 311).await.expect("refuse again"), "once");
    assert!(
        !store.mark_release_refused(&batch[3].id, "paid", 311).await.expect("refuse paid"),
        "a paid order owes none"
    );
    let refused = store.get(&batch[5].id).await.expect("get").expect("stored");
    assert_eq!(refused.release_refused.as_deref(), Some("no record of this sale"));
    assert!(!store.mark_released(&batch[5].id, 320).await.expect("release refused"), "refused stays refused");
    let counts = store.counts(&sku(check, tag)).await.expect("counts");
    assert_eq!((counts.orders_unreleased, counts.units_release_refused), (3, 1));
    assert_eq!(ours(store.unreleased(None, 100_000).await.expect("unreleased")), expected, "refused left out");
    assert!(store.mark_released(&batch[1].id, 400).await.expect("release"));
    assert!(!store.mark_released(&batch[1].id, 401).await.expect("release again"), "marking twice is false");
    assert_eq!(store.get(&batch[1].id).await.expect("get").expect("stored").released_at_ms, Some(400));
    assert!(!store.mark_released(&batch[3].id, 400).await.expect("release paid"), "a paid order owes no units");
    assert!(!store.mark_released(&batch[4].id, 400).await.expect("release pending"), "a pending order owes no units");
    assert!(store.mark_released(&batch[0].id, 400).await.expect("release"));
    assert!(store.mark_released(&batch[2].id, 400).await.expect("release"));
    assert!(ours(store.unreleased(None, 100_000).await.expect("unreleased")).is_empty());
    assert_eq!(store.counts(&sku(check, tag)).await.expect("counts").orders_unreleased, 0);
    // A payment after the units went back keeps them released: nothing is owed twice.
    assert_eq!(store.cancel(&batch[4].id, &batch[4].user, 500).await.expect("cancel"), CancelOutcome::Cancelled);
    assert!(store.mark_released(&batch[4].id, 510).await.expect("release"));
    let after = Payment { received_at_ms: 520, ..payment(&batch[4], &format!("ref-unreleased-after-{tag}")) };
    assert_eq!(store.record_payment(&after).await.expect("late"), PaymentOutcome::PaidAfterExpiry);
    assert!(ours(store.unreleased(None, 100_000).await.expect("unreleased")).is_empty());
}
