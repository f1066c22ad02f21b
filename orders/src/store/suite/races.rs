//! Races: many notifications of one payment at once, and a payment against an expiry of the
//! same order; each still decides once, whichever store connection gets there first.

use super::*;

/// Orders in the pay-versus-expire race.
const RACE_ORDERS: u64 = 1000;

/// Orders raced at once in the pay-versus-expire race (two tasks each), so a pool's wait stays
/// short on a slow disk.
const RACE_WAVE: u64 = 50;

/// Notifications of one reference sent at once in the duplicate race.
const DUPLICATES: usize = 16;

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
