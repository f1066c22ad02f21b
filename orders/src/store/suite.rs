//! The [`OrderStore`] contract as executable checks. Every implementation runs all of them
//! (SQLite in `tests/sqlite.rs`, a real PostgreSQL in `tests/postgres.rs`), so both keep the same
//! promises, races included.
//!
//! Each check uses its own SKU and order ids (named after the check plus `tag`), so one store can
//! run the whole suite, and again under another tag. The lists that span SKUs (due for expiry,
//! unreleased, dead letters) are checked with times far below the others' ([`T0`]), and the checks
//! of those lists leave nothing behind in them; every check that expires uses [`FENCE`], the
//! highest fence the suite ever raises.

use std::collections::HashMap;
use std::sync::Arc;

use super::{OrderStore, StoreError, INSERT_BATCH_MAX};
use crate::model::*;

/// The time most checks run at (Unix ms, 2023-11-14); the list checks use times below it.
pub const T0: u64 = 1_700_000_000_000;

/// The fence every expiring check presents: the stale-fence check raises the store's fence to it,
/// so it is never stale.
pub const FENCE: u64 = 1_000_000;

/// Price of one unit in every suite order (minor units).
const PRICE: u64 = 1999;

/// Orders in the pay-versus-expire race.
const RACE_ORDERS: u64 = 1000;

/// Orders raced at once in the pay-versus-expire race (two tasks each), so a pool's wait stays
/// short on a slow disk.
const RACE_WAVE: u64 = 50;

/// Notifications of one reference sent at once in the duplicate race.
const DUPLICATES: usize = 16;

fn sku(check: &str, tag: &str) -> String {
    format!("{check}-{tag}")
}

/// Order `n` of a check: stream seq `n`, user `user-{tag}`, one unit, created at `T0 + n`, due a
/// minute later.
fn order(check: &str, tag: &str, n: u64) -> NewOrder {
    NewOrder {
        id: format!("{check}-{tag}-{n}"),
        sku: sku(check, tag),
        user: format!("user-{tag}"),
        qty: 1,
        node: "node-a".into(),
        idempotency_key: format!("key-{n}"),
        stream_seq: n,
        unit_price: PRICE,
        currency: "EUR".into(),
        created_at_ms: T0 + n,
        pay_deadline_ms: T0 + 60_000 + n,
    }
}

fn orders(check: &str, tag: &str, count: u64) -> Vec<NewOrder> {
    (1..=count).map(|n| order(check, tag, n)).collect()
}

fn payment(order: &NewOrder, reference: &str) -> Payment {
    Payment {
        order_id: order.id.clone(),
        reference: reference.into(),
        amount: order.amount(),
        currency: order.currency.clone(),
        received_at_ms: T0 + 100_000,
        source: PaymentSource::Callback,
    }
}

async fn insert(store: &dyn OrderStore, orders: &[NewOrder]) {
    let inserted = store.insert_batch(orders).await.expect("insert_batch");
    assert_eq!(inserted, orders.len() as u64, "a batch of new orders must store every one");
}

async fn state(store: &dyn OrderStore, id: &str) -> OrderState {
    store.get(id).await.expect("get").unwrap_or_else(|| panic!("order {id} must be stored")).state
}

/// Runs every check against `store`. `tag` keeps SKUs and ids unique when a store is reused.
pub async fn run_all(store: Arc<dyn OrderStore>, tag: &str) {
    ping_answers(&*store).await;
    insert_stores_each_order_once(&*store, tag).await;
    an_orders_identity_is_its_id_not_its_key(&*store, tag).await;
    a_batch_with_a_duplicate_inside_stores_it_once(&*store, tag).await;
    an_oversized_batch_is_refused(&*store, tag).await;
    by_user_lists_newest_first(&*store, tag).await;
    a_payment_settles_a_pending_order_once(&*store, tag).await;
    a_mismatched_payment_is_recorded_as_a_refund_owed(&*store, tag).await;
    a_payment_before_its_order_waits_and_settles_when_it_arrives(&*store, tag).await;
    a_reused_reference_is_refused(&*store, tag).await;
    money_counts_add_up_per_sku(&*store, tag).await;
    a_stale_fence_is_refused_after_raise_fence(&*store, tag).await;
    a_late_payment_is_kept_as_paid_after_expiry(&*store, tag).await;
    cancel_takes_only_the_owners_pending_order(&*store, tag).await;
    expire_takes_only_pending_orders(&*store, tag).await;
    due_for_expiry_lists_pending_orders_by_deadline(&*store, tag).await;
    unreleased_lists_orders_owing_units_until_released(&*store, tag).await;
    a_dead_letter_twice_is_one(&*store, tag).await;
    counts_and_stored_seqs_cover_orders_and_dead_letters(&*store, tag).await;
    concurrent_duplicate_notifications_decide_once(store.clone(), tag).await;
    pay_and_expire_race_ends_each_order_in_one_state(store.clone(), tag).await;
    starting_a_payment_extends_the_deadline_once_and_hands_expiry_to_the_query_job(&*store, tag).await;
    a_cancel_or_a_payment_settles_the_payment_check(&*store, tag).await;
    a_refund_goes_owed_pending_refunded_once(&*store, tag).await;
    a_payment_found_by_query_is_counted_as_such(&*store, tag).await;
    the_first_opened_payment_of_an_order_is_remembered(&*store, tag).await;
}

pub async fn ping_answers(store: &dyn OrderStore) {
    store.ping().await.expect("ping");
}

/// Two sales under one idempotency key (the key reused after the ledger's TTL) are two orders;
/// a row at a seq already stored under another id is skipped (the consumer dead-letters it).
pub async fn an_orders_identity_is_its_id_not_its_key(store: &dyn OrderStore, tag: &str) {
    let check = "identity";
    let first = order(check, tag, 1);
    let again = NewOrder { id: format!("{check}-{tag}-again"), stream_seq: 2, ..first.clone() };
    insert(store, &[first.clone(), again.clone()]).await;
    assert_eq!(store.get(&again.id).await.expect("get").expect("stored").new, again, "one key, two orders");
    let squatter = NewOrder { id: format!("{check}-{tag}-squatter"), ..order(check, tag, 1) };
    assert_eq!(store.insert_batch(std::slice::from_ref(&squatter)).await.expect("insert"), 0, "seq 1 is taken");
    assert!(store.get(&squatter.id).await.expect("get").is_none());
    assert_eq!(store.counts(&sku(check, tag)).await.expect("counts").orders, 2);
}

/// A stored order reads back as written, pending; a redelivered batch inserts nothing.
pub async fn insert_stores_each_order_once(store: &dyn OrderStore, tag: &str) {
    let batch = orders("insert", tag, 3);
    insert(store, &batch).await;
    let stored = store.get(&batch[1].id).await.expect("get").expect("the order is stored");
    assert_eq!(stored.new, batch[1], "an order must read back as inserted");
    assert_eq!(stored.state, OrderState::PendingPayment);
    assert_eq!(stored.updated_at_ms, batch[1].created_at_ms);
    assert_eq!(
        (stored.payment_ref, stored.paid_at_ms, stored.expired_at_ms, stored.cancelled_at_ms, stored.released_at_ms),
        (None, None, None, None, None)
    );
    assert_eq!(store.insert_batch(&batch).await.expect("redelivery"), 0, "a redelivered batch must insert nothing");
    assert_eq!(store.insert_batch(&[]).await.expect("empty batch"), 0);
    assert_eq!(store.get(&format!("missing-{tag}")).await.expect("get"), None);
}

/// A batch repeating an order, or reusing a stored (sku, seq) under a new id, stores each order
/// once; a stored key under a new id and seq is a new order (the key reused after its TTL).
pub async fn a_batch_with_a_duplicate_inside_stores_it_once(store: &dyn OrderStore, tag: &str) {
    let check = "duplicate-inside";
    let (a, b) = (order(check, tag, 1), order(check, tag, 2));
    assert_eq!(store.insert_batch(&[a.clone(), b.clone(), a.clone()]).await.expect("insert"), 2);
    let same_seq = NewOrder { id: format!("{check}-{tag}-other-id"), idempotency_key: "fresh-key".into(), ..a.clone() };
    let same_key = NewOrder { id: format!("{check}-{tag}-third-id"), stream_seq: 99, ..b.clone() };
    let c = order(check, tag, 3);
    assert_eq!(
        store.insert_batch(&[same_seq.clone(), same_key.clone(), c]).await.expect("insert"),
        2,
        "a new id on a stored (sku, stream_seq) must be skipped; a reused key is its own order"
    );
    assert_eq!(store.get(&same_seq.id).await.expect("get"), None);
    assert!(store.get(&same_key.id).await.expect("get").is_some());
    assert_eq!(store.counts(&sku(check, tag)).await.expect("counts").orders, 4);
}

/// More than INSERT_BATCH_MAX orders are refused whole; a zero quantity too.
pub async fn an_oversized_batch_is_refused(store: &dyn OrderStore, tag: &str) {
    let check = "oversized";
    let batch = orders(check, tag, INSERT_BATCH_MAX as u64 + 1);
    let refused = store.insert_batch(&batch).await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))), "an oversized batch must be invalid, got {refused:?}");
    let zero = NewOrder { qty: 0, ..order(check, tag, 1) };
    let refused = store.insert_batch(&[order(check, tag, 2), zero]).await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))), "qty 0 must be invalid, got {refused:?}");
    assert_eq!(store.counts(&sku(check, tag)).await.expect("counts").orders, 0, "a refused batch stores nothing");
}

pub async fn by_user_lists_newest_first(store: &dyn OrderStore, tag: &str) {
    let check = "by-user";
    let mut batch = orders(check, tag, 4);
    let user = format!("buyer-{tag}");
    for order in &mut batch[..3] {
        order.user = user.clone();
    }
    insert(store, &batch).await;
    let listed: Vec<String> = store.by_user(&user, 2).await.expect("by_user").into_iter().map(|o| o.new.id).collect();
    assert_eq!(listed, [batch[2].id.clone(), batch[1].id.clone()], "newest first, at most the limit");
    assert_eq!(store.by_user(&user, 10).await.expect("by_user").len(), 3, "only the user's orders");
    assert!(store.by_user(&format!("nobody-{tag}"), 10).await.expect("by_user").is_empty());
}

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

/// A second letter for the same (sku, seq) changes nothing; letters read back oldest first.
pub async fn a_dead_letter_twice_is_one(store: &dyn OrderStore, tag: &str) {
    let check = "dead-letter";
    let letter = |seq: u64, at_ms: u64, reason: &str| DeadLetter {
        sku: sku(check, tag),
        stream_seq: seq,
        fields: vec![("order_id".into(), format!("o-{seq}")), ("qty".into(), "not a number".into())],
        reason: reason.into(),
        deliveries: 5,
        at_ms,
    };
    let (later, earlier) = (letter(7, 20, "bad qty"), letter(3, 10, "bad qty"));
    store.dead_letter(&later).await.expect("dead_letter");
    store.dead_letter(&letter(7, 30, "another reason")).await.expect("dead_letter again");
    store.dead_letter(&earlier).await.expect("dead_letter");
    let ours: Vec<DeadLetter> = store
        .dead_letters(100_000)
        .await
        .expect("dead_letters")
        .into_iter()
        .filter(|l| l.sku == sku(check, tag))
        .collect();
    assert_eq!(ours, [earlier, later], "one letter per (sku, seq), the first kept, oldest first");
    assert_eq!(store.dead_letters(1).await.expect("dead_letters").len(), 1, "at most the limit");
}

pub async fn counts_and_stored_seqs_cover_orders_and_dead_letters(store: &dyn OrderStore, tag: &str) {
    let check = "counts";
    let sku = sku(check, tag);
    assert_eq!(store.counts(&sku).await.expect("counts"), SkuOrderCounts::default(), "no orders: all zero");
    assert!(store.stored_seqs(&sku, 1, 100).await.expect("seqs").is_empty());
    let mut batch = orders(check, tag, 6);
    batch.remove(2); // seq 3 is missing: a gap.
    batch.remove(3); // seq 5 becomes a dead letter.
    for (order, qty) in batch.iter_mut().zip([1, 2, 3, 4]) {
        order.qty = qty;
    }
    insert(store, &batch).await; // seqs 1, 2, 4, 6 with qty 1, 2, 3, 4
    store
        .dead_letter(&DeadLetter {
            sku: sku.clone(),
            stream_seq: 5,
            fields: vec![],
            reason: "unreadable".into(),
            deliveries: 3,
            at_ms: T0,
        })
        .await
        .expect("dead_letter");
    assert_eq!(
        store.record_payment(&payment(&batch[0], &format!("ref-counts-{tag}"))).await.expect("pay"),
        PaymentOutcome::Paid
    );
    assert_eq!(store.expire(&batch[1].id, FENCE, T0 + 70_000).await.expect("expire"), ExpireOutcome::Expired);
    assert_eq!(store.cancel(&batch[2].id, &batch[2].user, T0 + 1).await.expect("cancel"), CancelOutcome::Cancelled);
    let counts = store.counts(&sku).await.expect("counts");
    assert_eq!(
        counts,
        SkuOrderCounts {
            orders: 4,
            units_pending: 4,
            units_paid: 1,
            units_expired: 2,
            units_cancelled: 3,
            units_paid_after_expiry: 0,
            orders_unreleased: 2,
            units_release_refused: 0,
            max_stream_seq: 6,
        }
    );
    assert_eq!(store.stored_seqs(&sku, 1, 10).await.expect("seqs"), [1, 2, 4, 5, 6], "orders and dead letters");
    assert_eq!(store.stored_seqs(&sku, 2, 5).await.expect("seqs"), [2, 4, 5], "within from..=to");
    let ours: HashMap<OrderState, u64> = store
        .state_counts()
        .await
        .expect("state_counts")
        .into_iter()
        .filter(|(counted, _, _)| *counted == sku)
        .map(|(_, state, count)| (state, count))
        .collect();
    let expected =
        [(OrderState::Paid, 1), (OrderState::Expired, 1), (OrderState::Cancelled, 1), (OrderState::PendingPayment, 1)];
    assert_eq!(ours, HashMap::from(expected), "orders (not units) by state");
    store.delete_for_test(&batch[1].id).await.expect("delete");
    assert_eq!(store.get(&batch[1].id).await.expect("get"), None);
    assert_eq!(store.stored_seqs(&sku, 1, 10).await.expect("seqs"), [1, 4, 5, 6], "a deleted order leaves a gap");
    for (order, expired) in [(&batch[1], true), (&batch[2], false)] {
        // Keep the list checks' view clean for a rerun: release what this check left owing.
        let released = store.mark_released(&order.id, T0).await.expect("release");
        assert_eq!(released, !expired, "the deleted order cannot be released");
    }
}

/// Many notifications of one reference at once: exactly one decides (paid), every other is a
/// duplicate answering that outcome.
pub async fn concurrent_duplicate_notifications_decide_once(store: Arc<dyn OrderStore>, tag: &str) {
    let check = "duplicate-race";
    let batch = orders(check, tag, 20);
    insert(&*store, &batch).await;
    for order in &batch {
        let notification = payment(order, &format!("ref-{}", order.id));
        let tasks: Vec<_> = (0..DUPLICATES)
            .map(|_| {
                let (store, notification) = (store.clone(), notification.clone());
                tokio::spawn(async move { store.record_payment(&notification).await })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("payment task").expect("record_payment"));
        }
        let deciding: Vec<_> = outcomes.iter().filter(|o| !matches!(o, PaymentOutcome::Duplicate { .. })).collect();
        assert_eq!(deciding, [&PaymentOutcome::Paid], "exactly one notification decides: {outcomes:?}");
        let duplicate = PaymentOutcome::Duplicate { first: Box::new(PaymentOutcome::Paid) };
        assert_eq!(outcomes.iter().filter(|o| **o == duplicate).count(), DUPLICATES - 1);
        assert_eq!(state(&*store, &order.id).await, OrderState::Paid);
    }
}

/// 1,000 pending orders, each paid and expired at the same moment by two tasks: every order ends
/// in exactly one state, consistent with both answers — paid (the expiry found it not pending),
/// or paid after expiry (the expiry won and the payment came second).
pub async fn pay_and_expire_race_ends_each_order_in_one_state(store: Arc<dyn OrderStore>, tag: &str) {
    let check = "pay-expire-race";
    let batch = orders(check, tag, RACE_ORDERS);
    for chunk in batch.chunks(INSERT_BATCH_MAX) {
        insert(&*store, chunk).await;
    }
    let (mut paid, mut late) = (0u64, 0u64);
    for wave in batch.chunks(RACE_WAVE as usize) {
        let mut tasks = Vec::new();
        for order in wave {
            let notification = payment(order, &format!("ref-{}", order.id));
            let (pay_store, expire_store, id) = (store.clone(), store.clone(), order.id.clone());
            let pay = tokio::spawn(async move { pay_store.record_payment(&notification).await });
            let expire = tokio::spawn(async move { expire_store.expire(&id, FENCE, T0 + 90_000).await });
            tasks.push((order.id.clone(), pay, expire));
        }
        for (id, pay, expire) in tasks {
            let pay = pay.await.expect("pay task").expect("record_payment");
            let expire = expire.await.expect("expire task").expect("expire");
            let stored = state(&*store, &id).await;
            match (&pay, expire, stored) {
                (PaymentOutcome::Paid, ExpireOutcome::NotPending, OrderState::Paid) => paid += 1,
                (PaymentOutcome::PaidAfterExpiry, ExpireOutcome::Expired, OrderState::PaidAfterExpiry) => late += 1,
                other => panic!("order {id} ended inconsistently: {other:?}"),
            }
        }
    }
    assert_eq!(paid + late, RACE_ORDERS);
    let counts = store.counts(&sku(check, tag)).await.expect("counts");
    assert_eq!((counts.units_paid, counts.units_paid_after_expiry), (paid, late));
    assert_eq!(counts.units_pending + counts.units_expired + counts.units_cancelled, 0);
    // Keep the list checks' view clean for a rerun.
    for order in &batch {
        let _ = store.mark_released(&order.id, T0).await.expect("release");
    }
}

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
