//! What the consumer and the reconciler read back: dead letters for the events no order could
//! be made of, per-SKU counts, and the stream seqs stored, gaps included.

use std::collections::HashMap;

use super::*;

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
