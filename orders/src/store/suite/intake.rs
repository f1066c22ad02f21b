//! Storing orders: an order is its id (not its idempotency key nor a reused stream seq), a
//! redelivered or repeating batch stores each order once, and a bad batch stores nothing.

use super::*;

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
