//! The per-user limit: a buyer's purchases count against it across keys and batches, and a
//! release gives the count back.

use super::*;

/// A user reaches the limit and no further, and the refusal is stored like any decision.
pub async fn holds_the_per_user_limit(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("limit", tag);
    create(ledger, &sku, 100, 2).await;
    let outcome = ledger
        .confirm(&sku, &node("n1"), &[buy("a", "u", 1), buy("b", "u", 2), buy("c", "u", 1), buy("d", "u", 1)])
        .await
        .unwrap();
    let decisions: Vec<_> =
        outcome.verdicts.iter().map(|v| matches!(v, Verdict::Fresh(Decision::Purchased(_)))).collect();
    assert_eq!(decisions, [true, false, true, false], "limit 2: 1 ok, +2 refused, +1 ok, +1 refused");
    assert_eq!(outcome.verdicts[1], Verdict::Fresh(Decision::UserLimit));
    assert_eq!(outcome.sold, 2);
    let replay = ledger.confirm(&sku, &node("n2"), &[buy("d", "u", 1)]).await.unwrap();
    assert_eq!(replay.verdicts, vec![Verdict::Replayed(Decision::UserLimit)]);
}

/// Goal: the per-user limit counts a buyer's purchases in earlier batches and earlier in the
/// same batch alike, and what a batch leaves counted is what later batches and releases see.
/// Method: limit 3; one unit in a first batch, then a batch of the same buyer near the limit
/// mixed with another buyer; a later batch, and a release followed by purchases, probe the count.
pub async fn one_buyers_purchases_add_up_within_and_across_batches(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("batch-limit", tag);
    create(ledger, &sku, 100, 3).await;
    let seller = node("n1");
    assert!(is_purchased(&ledger.confirm(&sku, &seller, &[buy("k1", "u", 1)]).await.unwrap().verdicts[0]));
    let batch = [buy("k2", "u", 1), buy("k3", "u", 2), buy("k4", "v", 3), buy("k5", "u", 1), buy("k6", "u", 1)];
    let outcome = ledger.confirm(&sku, &seller, &batch).await.unwrap();
    let sold: Vec<bool> = outcome.verdicts.iter().map(is_purchased).collect();
    assert_eq!(sold, [true, false, true, true, false], "u: 1 + 1 ok, +2 refused, +1 ok, +1 refused; v: 3 ok");
    assert_eq!(outcome.verdicts[1], Verdict::Fresh(Decision::UserLimit));
    assert_eq!(outcome.verdicts[4], Verdict::Fresh(Decision::UserLimit));
    assert_eq!(outcome.sold, 6);
    assert_eq!(ledger.sold_by(&sku, &seller).await.unwrap(), 6, "the seller's count takes the batch's sales only");
    let later = ledger.confirm(&sku, &seller, &[buy("k7", "u", 1), buy("k8", "v", 1)]).await.unwrap();
    assert_eq!(later.verdicts, [Verdict::Fresh(Decision::UserLimit), Verdict::Fresh(Decision::UserLimit)]);
    let Verdict::Fresh(Decision::Purchased(receipt)) = &outcome.verdicts[3] else { unreachable!("checked above") };
    let release = release_of(ledger, &sku, &receipt.order_id, "u", 1).await;
    assert!(matches!(ledger.release(&sku, &release).await.unwrap(), ReleaseOutcome::Released { .. }));
    let after = ledger.confirm(&sku, &seller, &[buy("k9", "u", 2), buy("k10", "u", 1)]).await.unwrap();
    let sold: Vec<bool> = after.verdicts.iter().map(is_purchased).collect();
    assert_eq!(sold, [false, true], "after giving 1 back, u holds 2 of 3");
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.released, status.orders), (6, 94, 1, 5));
}
