//! Sellers' epochs: sales counted per node and epoch, and an ended epoch fenced off, so a node
//! declared dead cannot sell on under its old epoch.

use super::*;

/// Sales are counted per node and per epoch: what a node sold before it was declared dead
/// stays apart from what it sells after rejoining.
pub async fn counts_sales_per_epoch(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("epochs", tag);
    create(ledger, &sku, 10, 0).await;
    let n1 = NodeId::new("n1").expect("valid");
    let (first, second) = (Seller::new(n1.clone(), 1), Seller::new(n1.clone(), 2));
    ledger.confirm(&sku, &first, &[buy("a", "u1", 2)]).await.unwrap();
    ledger.confirm(&sku, &second, &[buy("b", "u2", 3)]).await.unwrap();
    assert_eq!(ledger.sold_by(&sku, &first).await.unwrap(), 2);
    assert_eq!(ledger.sold_by(&sku, &second).await.unwrap(), 3);
    assert_eq!(ledger.sold_by(&sku, &Seller::new(n1.clone(), 3)).await.unwrap(), 0);
    assert_eq!(ledger.status(&sku).await.unwrap().sold_by_node.get(&n1), Some(&5), "per-node totals span epochs");
    let missing = ledger.sold_by(&SkuId::new(&format!("absent-{tag}")).expect("valid"), &first).await;
    assert!(matches!(missing, Err(LedgerError::Missing(_))));
}

/// Ending an epoch returns its final count and fences it: every later batch of that node with
/// that epoch or an older one is refused whole and changes nothing, while its next epoch and
/// other nodes sell on. Ending again, or ending an older epoch, changes nothing.
pub async fn an_ended_epoch_sells_nothing_more(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("fenced", tag);
    create(ledger, &sku, 10, 0).await;
    let (n1, n2) = (NodeId::new("n1").expect("valid"), NodeId::new("n2").expect("valid"));
    let (old, new) = (Seller::new(n1.clone(), 4), Seller::new(n1.clone(), 5));
    ledger.confirm(&sku, &old, &[buy("a", "u1", 2)]).await.unwrap();
    assert_eq!(ledger.end_epoch(&sku, &old).await.unwrap(), 2, "the final count of the ended epoch");
    for seller in [&old, &Seller::new(n1.clone(), 3)] {
        let refused = ledger.confirm(&sku, seller, &[buy("b", "u2", 1)]).await;
        assert!(matches!(refused, Err(LedgerError::EpochEnded(_))), "{seller:?}: {refused:?}");
    }
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 2, "a refused batch changes nothing");
    assert!(is_purchased(&ledger.confirm(&sku, &new, &[buy("b", "u2", 1)]).await.unwrap().verdicts[0]));
    assert!(is_purchased(&ledger.confirm(&sku, &Seller::new(n2, 4), &[buy("c", "u3", 1)]).await.unwrap().verdicts[0]));
    assert_eq!(ledger.end_epoch(&sku, &old).await.unwrap(), 2, "ending again changes nothing");
    assert_eq!(ledger.end_epoch(&sku, &Seller::new(n1.clone(), 1)).await.unwrap(), 0);
    assert!(
        is_purchased(&ledger.confirm(&sku, &new, &[buy("d", "u4", 1)]).await.unwrap().verdicts[0]),
        "5 still sells"
    );
    let missing = ledger.end_epoch(&SkuId::new(&format!("absent-{tag}")).expect("valid"), &old).await;
    assert!(matches!(missing, Err(LedgerError::Missing(_))));
}
