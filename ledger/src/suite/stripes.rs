//! Striped SKUs: each stripe is a ledger of its own, and units move between stripes once per
//! transfer id, never a sold one, so the stripes together never sell more than the SKU holds.

use super::*;

/// A purchase naming its own order id, as nodes under a coordinator send them.
fn buy_order(key: &str, user: &str, qty: u32) -> Purchase {
    Purchase { order_id: Some(OrderId(format!("order-{key}"))), ..buy(key, user, qty) }
}

/// Creates `stripes` stripes of `name`, the i-th holding `totals[i]`.
async fn create_stripes(ledger: &dyn Ledger, name: &str, tag: &str, totals: &[u64], terms: SkuTerms) -> Vec<SkuId> {
    let base = sku(name, tag);
    let mut stripes = Vec::new();
    for (index, total) in (0u32..).zip(totals) {
        let stripe = base.stripe(index);
        assert_eq!(stripe.stripe_parent(), (base.clone(), index), "a stripe names its SKU and index");
        create_terms(ledger, &stripe, SkuTerms { total: *total, ..terms.clone() }).await;
        stripes.push(stripe);
    }
    stripes
}

/// Goal: an order the seller brought no id for is numbered by the ledger with an id no other
/// ledger gives and every reader takes: on stripe i of `s`, `s-i.<seq>` (never `s/i-<seq>`:
/// `/` is no order id character). Method: sell without an order id on stripe 1 and on a SKU
/// named like the stripe's numbering (`s-1`); both read back, with different ids.
pub async fn a_stripe_numbers_orders_apart_from_every_sku(ledger: &dyn Ledger, tag: &str) {
    let stripes = create_stripes(ledger, "numbered", tag, &[2, 2], SkuTerms::new(1)).await;
    let lookalike = sku(&format!("numbered-{tag}-1"), "x");
    create(ledger, &lookalike, 2, 0).await;
    let mut ids = Vec::new();
    for ledger_sku in [&stripes[1], &lookalike] {
        let sold = ledger.confirm(ledger_sku, &node("n1"), &[buy("n0", "nu", 1)]).await.expect("confirm");
        assert!(is_purchased(&sold.verdicts[0]), "{ledger_sku}: {sold:?}");
        let events = ledger.orders(ledger_sku, 0, 10).await.expect("orders");
        let [event] = &events[..] else { panic!("{ledger_sku}: one order event, got {events:?}") };
        assert!(OrderId::is_valid(&event.order_id.0), "{ledger_sku}: {:?}", event.order_id);
        ids.push(event.order_id.clone());
    }
    assert_eq!(ids[0], OrderId(format!("numbered-{tag}-1.1")));
    assert_ne!(ids[0], ids[1]);
}

/// Checks every stripe's books and that the stripes' totals plus what is in flight (taken out
/// of one stripe, not yet put into another) are the SKU's total; returns each stripe's status.
async fn stripes_add_up(ledger: &dyn Ledger, stripes: &[SkuId], sku_total: u64, when: &str) -> Vec<SkuStatus> {
    let mut statuses = Vec::new();
    for stripe in stripes {
        let status = ledger.status(stripe).await.expect("status of a stripe");
        assert_eq!(status.sold + status.remaining, status.total, "{when}: {stripe} {status:?}");
        statuses.push(status);
    }
    let totals: u64 = statuses.iter().map(|status| status.total).sum();
    let out: u64 = statuses.iter().map(|status| status.transferred_out).sum();
    let into: u64 = statuses.iter().map(|status| status.transferred_in).sum();
    assert!(out >= into, "{when}: more units arrived ({into}) than left ({out})");
    assert_eq!(totals + (out - into), sku_total, "{when}: Σ total + in flight must be the SKU's total");
    let (parent, _) = stripes[0].stripe_parent();
    let combined = crate::sku_status(ledger, &parent, stripes.len() as u32).await.expect("the SKU's books");
    assert_eq!(combined.total + combined.in_flight(), sku_total, "{when}: the SKU read whole: {combined:?}");
    assert_eq!(combined.sold + combined.remaining, combined.total, "{when}: {combined:?}");
    statuses
}

/// Sells `qty` one-unit purchases on `stripe` in one batch; returns how many sold.
async fn sell_units(ledger: &dyn Ledger, stripe: &SkuId, prefix: &str, qty: u32) -> usize {
    let batch: Vec<Purchase> =
        (0..qty).map(|n| buy_order(&format!("{prefix}{n}"), &format!("{prefix}u{n}"), 1)).collect();
    let outcome = ledger.confirm(stripe, &node("n1"), &batch).await.expect("confirm on a stripe");
    outcome.verdicts.iter().filter(|verdict| is_purchased(verdict)).count()
}

/// Goal: a SKU striped three ways (`s`, `s/1`, `s/2`) moves unsold units between its stripes
/// exactly once per transfer id: a debit takes no more than remains and never a sold unit, a
/// replay returns the same count and changes nothing (however remaining moved since), a credit
/// completes the move, and a stripe sells exactly its new remaining and no more.
/// Method: 10 units each; sell 7 on stripe 1, ask it for 5 (3 come), replay, put them into
/// stripe 2; move 4 from stripe 0 to stripe 1, which then sells 4 of 5 asks; the books add up
/// (Σ total + in flight == 30) at every step.
pub async fn units_move_between_stripes_once_and_never_oversell(ledger: &dyn Ledger, tag: &str) {
    let stripes = create_stripes(ledger, "striped", tag, &[10, 10, 10], SkuTerms::new(1)).await;
    assert_eq!(sell_units(ledger, &stripes[1], "a", 7).await, 7);
    assert_eq!(ledger.transfer_out(&stripes[1], 1, 5).await.expect("transfer_out"), 3, "only what remains");
    let statuses = stripes_add_up(ledger, &stripes, 30, "3 in flight").await;
    let [_, one, _] = &statuses[..] else { unreachable!("3 stripes") };
    assert_eq!((one.total, one.sold, one.remaining, one.transferred_out), (7, 7, 0, 3), "sold units stay sold");
    assert_eq!(ledger.transfer_out(&stripes[1], 1, 5).await.unwrap(), 3, "a replay answers the same count");
    let status = ledger.transfer_in(&stripes[2], 1, 3).await.expect("transfer_in");
    assert_eq!((status.total, status.remaining, status.transferred_in), (13, 13, 3));
    assert_eq!(ledger.transfer_in(&stripes[2], 1, 3).await.unwrap(), status, "a replayed credit adds nothing");
    stripes_add_up(ledger, &stripes, 30, "the first move done").await;
    assert_eq!(ledger.transfer_out(&stripes[0], 2, 4).await.unwrap(), 4);
    assert_eq!(sell_units(ledger, &stripes[0], "b", 1).await, 1, "stripe 0 sells from what is left");
    assert_eq!(ledger.transfer_out(&stripes[0], 2, 100).await.unwrap(), 4, "a replay after a sale changes nothing");
    assert_eq!(ledger.status(&stripes[0]).await.unwrap().remaining, 5);
    stripes_add_up(ledger, &stripes, 30, "4 in flight").await;
    let status = ledger.transfer_in(&stripes[1], 2, 4).await.unwrap();
    assert_eq!((status.total, status.sold, status.remaining), (11, 7, 4), "the credit completes the move");
    assert_eq!(sell_units(ledger, &stripes[1], "c", 5).await, 4, "the stripe sells its new remaining, no more");
    let refused = ledger.confirm(&stripes[1], &node("n1"), &[buy_order("late", "late", 1)]).await.unwrap();
    assert_eq!(refused.verdicts, [Verdict::Fresh(Decision::SoldOut)]);
    let statuses = stripes_add_up(ledger, &stripes, 30, "the end").await;
    let [zero, one, two] = &statuses[..] else { unreachable!("3 stripes") };
    assert_eq!([zero.sold, one.sold, two.sold], [1, 11, 0]);
    assert_eq!([zero.remaining, one.remaining, two.remaining], [5, 0, 13]);
    let unknown = stripes[0].stripe(7);
    assert!(matches!(ledger.transfer_out(&unknown, 1, 1).await, Err(LedgerError::Missing(_))));
    assert!(matches!(ledger.transfer_in(&unknown, 1, 1).await, Err(LedgerError::Missing(_))));
    assert!(matches!(ledger.status(&unknown).await, Err(LedgerError::Missing(_))), "nor did they create it");
}

/// Goal: a stripe's id works wherever a SKU's does: status, tokens (bound to their stripe),
/// orders, close; a closed stripe gives no units (recording 0 for the id) but still takes
/// units in, which it never sells. Method: a two-stripe SKU requiring tokens.
pub async fn a_stripe_is_a_ledger_like_any_other(ledger: &dyn Ledger, tag: &str) {
    let terms = SkuTerms { require_token: true, ..SkuTerms::new(1) };
    let stripes = create_stripes(ledger, "striped-tokens", tag, &[5, 5], terms).await;
    let stripe = &stripes[1];
    assert!(ledger.status(stripe).await.unwrap().require_token);
    let held = token(ledger, stripe, "ann").await;
    let elsewhere = ledger.confirm(&stripes[0], &node("n1"), &[buy_with("k0", "ann", &held)]).await.unwrap();
    assert_eq!(elsewhere.verdicts, [Verdict::Fresh(Decision::TokenInvalid)], "a stripe's token is its own");
    let held = token(ledger, stripe, "ann").await;
    let purchase = Purchase { order_id: Some(OrderId("o1".into())), ..buy_with("k1", "ann", &held) };
    let sold = ledger.confirm(stripe, &node("n1"), &[purchase]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]), "a token on a stripe sells there");
    let events = ledger.orders(stripe, 0, 10).await.expect("orders of a stripe");
    assert_eq!(events.iter().map(|event| event.order_id.0.as_str()).collect::<Vec<_>>(), ["o1"]);
    assert!(ledger.close(stripe).await.expect("close a stripe").closed);
    assert!(!ledger.status(&stripes[0]).await.unwrap().closed, "closing a stripe closes only it");
    assert_eq!(ledger.transfer_out(stripe, 9, 3).await.unwrap(), 0, "a closed stripe gives nothing");
    assert_eq!(ledger.transfer_out(stripe, 9, 3).await.unwrap(), 0);
    assert_eq!(ledger.transfer_out(&stripes[0], 9, 2).await.unwrap(), 2, "ids are per stripe");
    let status = ledger.transfer_in(stripe, 9, 2).await.expect("a closed stripe takes units in");
    assert_eq!((status.total, status.sold, status.remaining, status.closed), (7, 1, 6, true));
    let held = token(ledger, stripe, "bob").await;
    let after = ledger.confirm(stripe, &node("n1"), &[buy_with("k2", "bob", &held)]).await.unwrap();
    assert_eq!(after.verdicts, [Verdict::Fresh(Decision::Ended)], "and never sells them");
    stripes_add_up(ledger, &stripes, 10, "2 units moved into a closed stripe").await;
}

/// Goal: transfers racing sales on one stripe never take a sold unit nor drive remaining below
/// zero: every unit is sold once or moved once. Method: 40 units; four tasks sell one-unit
/// purchases while four ask for 4 units at a time under distinct ids; then every id replays
/// its count, the books add up, and the units taken, put into stripe 1, sell there exactly.
pub async fn concurrent_transfers_never_take_sold_units(ledger: Arc<dyn Ledger>, tag: &str) {
    let stripes = create_stripes(&*ledger, "striped-race", tag, &[40, 0], SkuTerms::new(40)).await;
    let sellers: Vec<_> = (0..4)
        .map(|n| {
            let (ledger, stripe) = (ledger.clone(), stripes[0].clone());
            tokio::spawn(async move {
                let mut sold = 0;
                for round in 0..5 {
                    sold += sell_units(&*ledger, &stripe, &format!("s{n}-{round}-"), 2).await;
                }
                sold as u64
            })
        })
        .collect();
    let movers: Vec<_> = (0..4u64)
        .map(|n| {
            let (ledger, stripe) = (ledger.clone(), stripes[0].clone());
            tokio::spawn(async move {
                let mut taken = Vec::new();
                for round in 0..3u64 {
                    let id = n * 10 + round;
                    taken.push((id, ledger.transfer_out(&stripe, id, 4).await.expect("transfer_out")));
                }
                taken
            })
        })
        .collect();
    let mut sold = 0;
    for seller in sellers {
        sold += seller.await.expect("seller task");
    }
    let mut taken = Vec::new();
    for mover in movers {
        taken.extend(mover.await.expect("transfer task"));
    }
    let moved: u64 = taken.iter().map(|(_, units)| units).sum();
    let status = ledger.status(&stripes[0]).await.unwrap();
    assert!(taken.iter().all(|(_, units)| *units <= 4), "a debit takes at most what it asks: {taken:?}");
    assert_eq!((status.sold, status.transferred_out), (sold, moved), "every unit sold once or moved once");
    assert_eq!((status.total, status.remaining), (40 - moved, 40 - moved - sold));
    for (id, units) in &taken {
        assert_eq!(ledger.transfer_out(&stripes[0], *id, 4).await.unwrap(), *units, "id {id} replays");
        ledger.transfer_in(&stripes[1], *id, *units).await.expect("transfer_in");
    }
    stripes_add_up(&*ledger, &stripes, 40, "every move done").await;
    assert_eq!(sell_units(&*ledger, &stripes[1], "t", 40).await as u64, moved, "the moved units sell once");
}
