//! Releases: an unpaid order's units go back once, only for a sale the ledger's record shows,
//! and the record outlives the idempotency record that decided the sale.

use super::*;

/// A release puts the units back into `remaining` (and `sold` down, `released` up), lowers the
/// buyer's count so the buyer may buy again, is logged, and a second release changes nothing.
/// The released units sell again.
pub async fn a_release_gives_units_back_once(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("release-once", tag);
    create(ledger, &sku, 3, 2).await;
    let release = sell_for_release(ledger, &sku, "k1", "ann", 2).await;
    let _other = sell_for_release(ledger, &sku, "k2", "bob", 1).await;
    let before = ledger.status(&sku).await.unwrap();
    assert_eq!((before.sold, before.remaining, before.released, before.orders), (3, 0, 0, 2));
    assert_eq!(ledger.release(&sku, &release).await.unwrap(), ReleaseOutcome::Released { remaining: 2 });
    let after = ledger.status(&sku).await.unwrap();
    assert_eq!((after.sold, after.remaining, after.released, after.orders), (1, 2, 2, 2));
    assert!(after.progress() > before.progress(), "a release must count as progress");
    assert_eq!(after.sold_by_node.values().sum::<u64>(), 3, "per-seller counts keep what each seller sold");
    assert_eq!(ledger.release(&sku, &release).await.unwrap(), ReleaseOutcome::AlreadyReleased);
    assert_eq!(ledger.status(&sku).await.unwrap().remaining, 2, "a second release gives nothing back");
    let log = ledger.releases(&sku, 0, 100).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].seq, &log[0].order_id, log[0].qty), (1, &release.order_id, 2));
    assert!(ledger.releases(&sku, 1, 100).await.unwrap().is_empty());
    // Ann's count went back to 0: with a limit of 2 she may buy 2 again.
    let again = ledger.confirm(&sku, &node("n1"), &[buy("k3", "ann", 2)]).await.unwrap();
    assert!(is_purchased(&again.verdicts[0]), "released units sell again, to the same buyer too");
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.orders), (3, 0, 3));
}

/// The ledger gives back only what it sold: another user, another qty or another order id are
/// refused, and so is the order id a purchase that did not sell would have had.
pub async fn a_release_needs_the_ledgers_record_of_the_sale(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("release-guard", tag);
    create(ledger, &sku, 1, 0).await;
    let sold = sell_for_release(ledger, &sku, "k1", "ann", 1).await;
    let refused = ledger.confirm(&sku, &node("n1"), &[buy("k2", "bob", 1)]).await.unwrap();
    assert_eq!(refused.verdicts[0], Verdict::Fresh(Decision::SoldOut));
    let never_sold = [
        Release { user: user("bob"), ..sold.clone() },
        Release { qty: 2, ..sold.clone() },
        Release { key: IdempotencyKey::new("another-key").expect("valid key"), ..sold.clone() },
        Release { order_id: OrderId("made-up".into()), ..sold.clone() },
        Release { order_id: OrderId(format!("{sku}-2")), user: user("bob"), ..sold.clone() },
    ];
    for release in never_sold {
        assert_eq!(ledger.release(&sku, &release).await.unwrap(), ReleaseOutcome::NeverSold, "{release:?}");
    }
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.released), (1, 0, 0), "refusals change nothing");
    let missing = SkuId::new(&format!("release-missing-{tag}")).unwrap();
    assert!(matches!(ledger.release(&missing, &sold).await, Err(LedgerError::Missing(_))));
}

/// Goal: a key reused after its idempotency record expired is a new purchase that becomes its
/// own order, and both orders can still be released: a release checks the ledger's record of
/// the sale, which outlives the idempotency record.
/// Method: on a ledger whose idempotency TTL is `ttl`, sell key k1, wait out the TTL, sell k1
/// again, then release both orders.
pub async fn a_release_outlives_the_idempotency_record(ledger: &dyn Ledger, tag: &str, ttl: Duration) {
    let sku = sku("release-after-ttl", tag);
    create(ledger, &sku, 2, 0).await;
    let first = sell_for_release(ledger, &sku, "k1", "ann", 1).await;
    tokio::time::sleep(ttl + Duration::from_millis(600)).await;
    let second = sell_for_release(ledger, &sku, "k1", "ann", 1).await;
    assert_ne!(first.order_id, second.order_id, "a key reused after its TTL is a new order");
    for release in [&first, &second] {
        let outcome = ledger.release(&sku, release).await.expect("release");
        assert!(matches!(outcome, ReleaseOutcome::Released { .. }), "{release:?}: {outcome:?}");
        assert_eq!(ledger.release(&sku, release).await.unwrap(), ReleaseOutcome::AlreadyReleased);
    }
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.released, status.orders), (0, 2, 2, 2));
}

/// Goal: a sale stays releasable when its key is decided afresh in the same idempotency window
/// (on Redis the record of the first sale would be overwritten: the window is the SKU's, fixed
/// by the first caller, so a caller with a shorter TTL can reuse a key inside one window).
/// Method: `long` (TTL `long_ttl`) decides first and so fixes the window; right after a window
/// boundary `short` (TTL `short_ttl`, at most a third of `long_ttl`) sells k1, waits out its
/// TTL and sells k1 again; both orders release once.
pub async fn a_sale_whose_key_is_reused_in_its_window_is_released(
    short: &dyn Ledger,
    long: &dyn Ledger,
    tag: &str,
    short_ttl: Duration,
    long_ttl: Duration,
) {
    let sku = sku("reuse-in-window", tag);
    create(long, &sku, 2, 0).await;
    let closed_first = long.confirm(&sku, &node("n1"), &[buy("fixes-the-window", "zed", 3)]).await.unwrap();
    assert!(matches!(closed_first.verdicts[0], Verdict::Fresh(Decision::SoldOut)), "{closed_first:?}");
    just_before_a_boundary(long_ttl, Duration::ZERO).await;
    let first = sell_for_release(short, &sku, "k1", "ann", 1).await;
    tokio::time::sleep(short_ttl + Duration::from_millis(300)).await;
    let second = sell_for_release(short, &sku, "k1", "ann", 1).await;
    assert_ne!(first.order_id, second.order_id, "a key reused after its TTL is a new order");
    for release in [&first, &second] {
        let outcome = short.release(&sku, release).await.expect("release");
        assert!(matches!(outcome, ReleaseOutcome::Released { .. }), "{release:?}: {outcome:?}");
        assert_eq!(short.release(&sku, release).await.unwrap(), ReleaseOutcome::AlreadyReleased);
    }
    let status = short.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.released), (0, 2, 2));
}

/// Many releases of one order at once (two sweepers, a retry): exactly one gives units back.
pub async fn concurrent_releases_of_one_order_release_once(ledger: Arc<dyn Ledger>, tag: &str) {
    let sku = sku("release-race", tag);
    create(&*ledger, &sku, 5, 0).await;
    let release = sell_for_release(&*ledger, &sku, "k1", "ann", 1).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (ledger, sku, release) = (ledger.clone(), sku.clone(), release.clone());
            tokio::spawn(async move { ledger.release(&sku, &release).await.unwrap() })
        })
        .collect();
    let mut released = 0;
    for task in tasks {
        if matches!(task.await.expect("release task"), ReleaseOutcome::Released { .. }) {
            released += 1;
        }
    }
    assert_eq!(released, 1, "one order, one release");
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.released), (0, 5, 1));
}
