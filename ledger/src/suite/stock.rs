//! A SKU's stock: created once, sold down to exactly zero and never past it (in one batch, at
//! the top of the count range, under racing batches), raised by restock, ended by close.

use std::collections::HashSet;

use super::*;

/// Sells down to zero; the last buyer who asks for more than is left is refused, not shorted.
pub async fn sells_exactly_the_total(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("exact", tag);
    create(ledger, &sku, 5, 0).await;
    let outcome = ledger
        .confirm(&sku, &node("n1"), &[buy("a", "u1", 2), buy("b", "u2", 2), buy("c", "u3", 2), buy("d", "u4", 1)])
        .await
        .unwrap();
    let sold: Vec<bool> =
        outcome.verdicts.iter().map(|v| matches!(v, Verdict::Fresh(Decision::Purchased(_)))).collect();
    assert_eq!(sold, [true, true, false, true], "qty 2 with 1 left must be sold_out, qty 1 must still sell");
    assert_eq!(outcome.verdicts[2], Verdict::Fresh(Decision::SoldOut));
    assert_eq!((outcome.sold, outcome.remaining), (5, 0));
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.total, status.sold, status.remaining), (5, 5, 0));
    assert_eq!(status.sold_by_node.get(&node("n1").node), Some(&5));
    let orders = ledger.orders(&sku, 0, 100).await.unwrap();
    assert_eq!(orders.iter().map(|o| u64::from(o.qty)).sum::<u64>(), 5, "one order event per sale, same units");
    let ids: HashSet<_> = orders.iter().map(|o| o.order_id.clone()).collect();
    assert_eq!(ids.len(), orders.len(), "order ids are unique");
}

/// No ledger, no sale: a confirm, restock or status on an unknown SKU is refused.
pub async fn refuses_a_missing_sku(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("missing", tag);
    let confirm = ledger.confirm(&sku, &node("n1"), &[buy("k", "u", 1)]).await;
    assert!(matches!(confirm, Err(LedgerError::Missing(_))), "confirm on a missing SKU: {confirm:?}");
    assert!(matches!(ledger.restock_to(&sku, 5).await, Err(LedgerError::Missing(_))));
    assert!(matches!(ledger.close(&sku).await, Err(LedgerError::Missing(_))));
    assert!(matches!(ledger.status(&sku).await, Err(LedgerError::Missing(_))));
    assert!(
        matches!(ledger.status(&sku).await, Err(LedgerError::Missing(_))),
        "the refused calls must not have created it"
    );
}

/// Creating a SKU that exists returns it untouched, whatever total was asked for.
pub async fn never_overwrites_on_create(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("create", tag);
    create(ledger, &sku, 10, 0).await;
    ledger.confirm(&sku, &node("n1"), &[buy("k", "u", 3)]).await.unwrap();
    let terms = SkuTerms { require_token: true, ..SkuTerms::new(1000) };
    let again = ledger.create_sku(&sku, &terms).await.unwrap();
    let Created::Existing(status) = again else { panic!("second create must find the existing ledger: {again:?}") };
    assert_eq!((status.total, status.sold, status.remaining), (10, 3, 7));
    assert!(!status.require_token, "nor does it turn tokens on");
}

/// Restock raises total and remaining together; sold is untouched; a repeated or lower target
/// changes nothing.
pub async fn restock_raises_the_total(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("restock", tag);
    create(ledger, &sku, 2, 0).await;
    ledger.confirm(&sku, &node("n1"), &[buy("a", "u1", 2)]).await.unwrap();
    let status = ledger.restock_to(&sku, 5).await.unwrap();
    assert_eq!((status.total, status.sold, status.remaining), (5, 2, 3));
    let again = ledger.restock_to(&sku, 5).await.unwrap();
    assert_eq!((again.total, again.remaining), (5, 3), "a retried restock adds nothing");
    let lower = ledger.restock_to(&sku, 1).await.unwrap();
    assert_eq!((lower.total, lower.sold, lower.remaining), (5, 2, 3), "a lower target changes nothing");
    let outcome = ledger.confirm(&sku, &node("n1"), &[buy("b", "u2", 3)]).await.unwrap();
    assert!(matches!(outcome.verdicts[0], Verdict::Fresh(Decision::Purchased(_))));
}

/// A closed sale sells nothing more, whatever its stock; earlier sales and their replays stand,
/// and a purchase refused by the close replays as refused.
pub async fn close_ends_the_sale(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("close", tag);
    create(ledger, &sku, 10, 0).await;
    ledger.confirm(&sku, &node("n1"), &[buy("before", "u1", 1)]).await.unwrap();
    let closed = ledger.close(&sku).await.unwrap();
    assert!(closed.closed);
    assert_eq!(ledger.close(&sku).await.unwrap(), closed, "closing twice is closing once");
    let after = ledger.confirm(&sku, &node("n2"), &[buy("after", "u2", 1), buy("before", "u1", 1)]).await.unwrap();
    assert_eq!(after.verdicts[0], Verdict::Fresh(Decision::Ended));
    assert!(matches!(after.verdicts[1], Verdict::Replayed(Decision::Purchased(_))), "{:?}", after.verdicts[1]);
    let replay = ledger.confirm(&sku, &node("n1"), &[buy("after", "u2", 1)]).await.unwrap();
    assert_eq!(replay.verdicts, vec![Verdict::Replayed(Decision::Ended)]);
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.closed), (1, 9, true), "nothing sold after the close");
}

/// Verdicts come back in the batch's order, and per-node counts add up to sold.
pub async fn batch_decides_in_order(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("order", tag);
    create(ledger, &sku, 3, 0).await;
    let batch: Vec<_> = (0..5).map(|i| buy(&format!("k{i}"), &format!("u{i}"), 1)).collect();
    let outcome = ledger.confirm(&sku, &node("n1"), &batch).await.unwrap();
    assert_eq!(outcome.verdicts.len(), 5);
    assert!(outcome.verdicts[..3].iter().all(|v| matches!(v, Verdict::Fresh(Decision::Purchased(_)))));
    assert!(outcome.verdicts[3..].iter().all(|v| *v == Verdict::Fresh(Decision::SoldOut)));
    let orders = ledger.orders(&sku, 0, 100).await.unwrap();
    let keys: Vec<_> = orders.iter().map(|o| o.key.as_str().to_string()).collect();
    assert_eq!(keys, ["k0", "k1", "k2"], "events follow the batch order");
    let seqs: Vec<_> = orders.iter().map(|o| o.seq).collect();
    assert_eq!(seqs, [1, 2, 3], "seq numbers the sales from 1");
    let rest = ledger.orders(&sku, 1, 100).await.unwrap();
    assert_eq!(rest.iter().map(|o| o.seq).collect::<Vec<_>>(), [2, 3], "reading resumes after the given seq");
    assert_eq!(ledger.orders(&sku, 1, 1).await.unwrap().len(), 1, "limit caps the page");
    assert!(ledger.orders(&sku, 3, 100).await.unwrap().is_empty());
}

/// Totals are promised up to 2^53 - 1: counts near the top are stored and returned exactly (Lua
/// would print them as 9.007199254741e+15), and the ledger keeps selling after them.
pub async fn counts_stay_exact_at_the_top_of_the_range(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("huge", tag);
    let top = crate::TOTAL_MAX;
    create(ledger, &sku, top - 1_000, 0).await;
    assert_eq!(ledger.restock_to(&sku, top).await.unwrap().total, top, "a restock to the top adds exactly");
    let seller = Seller::new(NodeId::new("n1").expect("valid"), 1);
    for (at, key) in ["a", "b", "c"].iter().enumerate() {
        let outcome = ledger.confirm(&sku, &seller, &[buy(key, key, 3)]).await.unwrap();
        assert!(is_purchased(&outcome.verdicts[0]));
        let sold = 3 * (at as u64 + 1);
        assert_eq!((outcome.sold, outcome.remaining), (sold, top - sold), "exact after sale {at}");
    }
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.total, status.sold, status.remaining), (top, 9, top - 9));
    assert_eq!(ledger.sold_by(&sku, &seller).await.unwrap(), 9);
}

/// Many nodes confirming at once on a small stock: sold equals the total, never more, and the
/// per-node counts add up.
pub async fn concurrent_batches_never_oversell(ledger: Arc<dyn Ledger>, tag: &str) {
    let sku = sku("race", tag);
    create(&*ledger, &sku, 50, 0).await;
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let (ledger, sku) = (ledger.clone(), sku.clone());
            tokio::spawn(async move {
                let mut purchased = 0u64;
                for round in 0..5 {
                    let batch: Vec<_> =
                        (0..4).map(|i| buy(&format!("n{n}-r{round}-{i}"), &format!("u{n}-{round}-{i}"), 1)).collect();
                    let outcome = ledger.confirm(&sku, &node(&format!("n{n}")), &batch).await.unwrap();
                    purchased +=
                        outcome.verdicts.iter().filter(|v| matches!(v, Verdict::Fresh(Decision::Purchased(_)))).count()
                            as u64;
                }
                purchased
            })
        })
        .collect();
    let mut purchased = 0;
    for task in tasks {
        purchased += task.await.expect("confirm task panicked");
    }
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!(purchased, 50, "160 asks for 50 units must sell exactly 50");
    assert_eq!((status.sold, status.remaining), (50, 0));
    assert_eq!(status.sold_by_node.values().sum::<u64>(), 50, "per-node counts add up to sold");
}
