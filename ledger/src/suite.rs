//! The ledger contract as executable checks. Every implementation runs all of them (the
//! embedded ledger in this crate's tests, Redis in the workspace's integration tests), which is
//! what keeps the embedded ledger an honest stand-in for the Lua scripts.
//!
//! Each check creates its own SKU (named after the check plus `tag`), so one ledger can run
//! the whole suite, and a failed assertion names the broken rule.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::*;

mod room;
pub use room::*;

fn sku(name: &str, tag: &str) -> SkuId {
    SkuId::new(&format!("{name}-{tag}")).expect("suite SKU names are valid")
}

fn node(name: &str) -> Seller {
    Seller::new(NodeId::new(name).expect("suite node ids are valid"), 1)
}

fn buy(key: &str, user: &str, qty: u32) -> Purchase {
    Purchase {
        key: IdempotencyKey::new(key).expect("valid key"),
        user: UserId::new(user).expect("valid user"),
        qty,
        token: None,
        order_id: None,
    }
}

fn buy_with(key: &str, user: &str, token: &SubmitToken) -> Purchase {
    Purchase { token: Some(token.clone()), ..buy(key, user, 1) }
}

fn user(name: &str) -> UserId {
    UserId::new(name).expect("suite user ids are valid")
}

async fn create(ledger: &dyn Ledger, sku: &SkuId, total: u64, per_user_limit: u32) {
    create_terms(ledger, sku, SkuTerms { per_user_limit, ..SkuTerms::new(total) }).await;
}

/// A SKU whose purchases must present a submit token.
async fn create_with_tokens(ledger: &dyn Ledger, sku: &SkuId, total: u64, per_user_limit: u32) {
    create_terms(ledger, sku, SkuTerms { per_user_limit, require_token: true, ..SkuTerms::new(total) }).await;
}

async fn create_terms(ledger: &dyn Ledger, sku: &SkuId, terms: SkuTerms) {
    let created = ledger.create_sku(sku, &terms).await.expect("create_sku");
    assert!(matches!(created, Created::New(_)), "a fresh SKU must be created new, got {created:?}");
}

/// A token for `user` on `sku` that lives long enough for any check.
async fn token(ledger: &dyn Ledger, sku: &SkuId, user_name: &str) -> SubmitToken {
    ledger.issue_token(sku, &user(user_name), Duration::from_secs(60)).await.expect("issue_token").token
}

fn is_purchased(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Fresh(Decision::Purchased(_)))
}

/// Runs every check against `ledger`. `tag` keeps SKU names unique when a ledger is reused.
pub async fn run_all(ledger: Arc<dyn Ledger>, tag: &str) {
    sells_exactly_the_total(&*ledger, tag).await;
    replays_a_decided_key(&*ledger, tag).await;
    rejects_a_reused_key(&*ledger, tag).await;
    a_key_belongs_to_its_buyer(&*ledger, tag).await;
    holds_the_per_user_limit(&*ledger, tag).await;
    refuses_a_missing_sku(&*ledger, tag).await;
    never_overwrites_on_create(&*ledger, tag).await;
    restock_raises_the_total(&*ledger, tag).await;
    close_ends_the_sale(&*ledger, tag).await;
    batch_decides_in_order(&*ledger, tag).await;
    a_key_repeated_in_one_batch_is_decided_once(&*ledger, tag).await;
    one_buyers_purchases_add_up_within_and_across_batches(&*ledger, tag).await;
    counts_sales_per_epoch(&*ledger, tag).await;
    an_ended_epoch_sells_nothing_more(&*ledger, tag).await;
    counts_stay_exact_at_the_top_of_the_range(&*ledger, tag).await;
    a_token_is_spent_by_its_first_decision(&*ledger, tag).await;
    a_token_binds_its_user_and_its_sku(&*ledger, tag).await;
    an_expired_token_is_refused(&*ledger, tag).await;
    a_refused_purchase_spends_its_token_too(&*ledger, tag).await;
    a_buyer_holds_one_live_token_per_sku(&*ledger, tag).await;
    skus_without_tokens_ignore_them(&*ledger, tag).await;
    one_token_sells_once_under_concurrency(ledger.clone(), tag).await;
    a_replay_in_a_batch_leaves_the_token_to_a_fresh_purchase(&*ledger, tag).await;
    an_order_event_carries_the_pricing_of_its_sale(&*ledger, tag).await;
    a_release_gives_units_back_once(&*ledger, tag).await;
    a_release_needs_the_ledgers_record_of_the_sale(&*ledger, tag).await;
    concurrent_releases_of_one_order_release_once(ledger.clone(), tag).await;
    a_feed_delivers_each_entry_once_until_claimed(&*ledger, tag).await;
    a_feed_trims_only_what_was_acknowledged(&*ledger, tag).await;
    a_batchs_sales_read_alike_through_every_reader(&*ledger, tag).await;
    units_move_between_stripes_once_and_never_oversell(&*ledger, tag).await;
    a_stripe_is_a_ledger_like_any_other(&*ledger, tag).await;
    a_stripe_numbers_orders_apart_from_every_sku(&*ledger, tag).await;
    concurrent_transfers_never_take_sold_units(ledger.clone(), tag).await;
    a_room_draws_by_its_recorded_seed_and_admits_in_line_order(&*ledger, tag).await;
    a_ticket_sells_once_and_sold_out_shuts_the_room_until_units_come_back(&*ledger, tag).await;
    admissions_keep_the_rate_and_the_abandoned_leave(&*ledger, tag).await;
    concurrent_batches_never_oversell(ledger, tag).await;
}

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

/// Goal: the sales of one batch (one stream entry on Redis, one per sale embedded) read as the
/// same events through `orders` (whole, paged from the middle of the batch, page by page) and
/// through the feed, and trimming keeps every sale at or past what it must keep. Method: two
/// batches of three sales, then each reader.
pub async fn a_batchs_sales_read_alike_through_every_reader(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("batch-entry", tag);
    create(ledger, &sku, 20, 0).await;
    let quick = Duration::from_millis(10);
    let seller = node("n1");
    for batch in 0..2 {
        let purchases: Vec<Purchase> =
            (0..3).map(|n| buy(&format!("k{batch}-{n}"), &format!("u{batch}-{n}"), n + 1)).collect();
        let outcome = ledger.confirm(&sku, &seller, &purchases).await.expect("confirm");
        assert!(outcome.verdicts.iter().all(is_purchased), "{outcome:?}");
    }
    let all = ledger.orders(&sku, 0, 100).await.expect("orders");
    let seen: Vec<(u64, String, String, u32)> =
        all.iter().map(|e| (e.seq, e.key.to_string(), e.user.to_string(), e.qty)).collect();
    let expected: Vec<(u64, String, String, u32)> = (0..2u32)
        .flat_map(|batch| (0..3u32).map(move |n| (u64::from(batch * 3 + n + 1), batch, n)))
        .map(|(seq, batch, n)| (seq, format!("k{batch}-{n}"), format!("u{batch}-{n}"), n + 1))
        .collect();
    assert_eq!(seen, expected, "every sale of every batch, in seq order");
    assert!(all.iter().all(|e| e.node == seller.node && e.order_id.0 == format!("{sku}-{}", e.seq)));
    let seqs = |events: &[OrderEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&ledger.orders(&sku, 1, 100).await.unwrap()), [2, 3, 4, 5, 6], "after the batch's first");
    assert_eq!(seqs(&ledger.orders(&sku, 2, 2).await.unwrap()), [3, 4], "a page across two batches");
    let mut paged: Vec<OrderEvent> = Vec::new();
    loop {
        let page = ledger.orders(&sku, paged.last().map_or(0, |e| e.seq), 2).await.unwrap();
        assert!(page.len() <= 2, "a page holds at most its limit");
        if page.is_empty() {
            break;
        }
        paged.extend(page);
    }
    assert_eq!(paged, all, "pages of two, each resuming after the last seq seen");
    let fed = ledger.feed_read(&sku, "g", "c1", 100, quick).await.expect("feed");
    let fed_events: Vec<OrderEvent> = fed.iter().flat_map(|entry| entry.events().expect("events")).collect();
    assert_eq!(fed_events, all, "the feed carries the same events");
    assert_eq!(fed.last().map(|entry| entry.seq), Some(6), "an entry is numbered by its last sale");
    let entry_seqs: Vec<u64> = fed.iter().map(|entry| entry.seq).collect();
    ledger.feed_ack(&sku, "g", &entry_seqs).await.expect("ack");
    assert_eq!(ledger.feed_lag(&sku, "g").await.unwrap(), FeedLag::default());
    // Keep the newest two: seq 5 and 6, in the middle of the second batch.
    ledger.feed_trim(&sku, "g", 2).await.expect("trim");
    let left = seqs(&ledger.orders(&sku, 0, 100).await.unwrap());
    assert!(left.ends_with(&[5, 6]) && left.iter().all(|seq| *seq >= 4), "trimmed to {left:?}");
}

/// Waits until the wall clock is `before` short of a multiple of `window`; returns that
/// multiple (Unix ms).
async fn just_before_a_boundary(window: Duration, before: Duration) -> u64 {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let before_ms = u64::try_from(before.as_millis()).unwrap_or(0);
    let now = crate::unix_ms();
    let mut boundary = (now / window_ms + 1) * window_ms;
    if boundary - now < before_ms + 50 {
        boundary += window_ms;
    }
    tokio::time::sleep(Duration::from_millis(boundary - before_ms - crate::unix_ms())).await;
    boundary
}

/// Goal: a decision is found by a retry on the other side of a boundary of the idempotency
/// windows (on Redis, records are fields of one hash per window of `ttl`, by Redis's clock,
/// the machine's here), and a record still answers a different payload with `KeyReused`.
/// Method: on a ledger whose idempotency TTL is `ttl` (a second or two), decide a key just
/// before a boundary, replay it just after, and again at half the TTL; past the TTL the same
/// key is a new purchase (its record expired, whatever its window's expiry).
pub async fn a_decision_is_replayed_across_a_window_boundary(ledger: &dyn Ledger, tag: &str, ttl: Duration) {
    let sku = sku("window", tag);
    create(ledger, &sku, 10, 0).await;
    let seller = node("n1");
    let boundary = just_before_a_boundary(ttl, Duration::from_millis(150)).await;
    let first = ledger.confirm(&sku, &seller, &[buy("k1", "ann", 1)]).await.expect("confirm");
    let Verdict::Fresh(decision) = first.verdicts[0].clone() else { panic!("{first:?}") };
    assert!(crate::unix_ms() < boundary, "decided before the boundary");
    tokio::time::sleep(Duration::from_millis(boundary + 100 - crate::unix_ms().min(boundary))).await;
    for pause in [Duration::ZERO, ttl / 2 - Duration::from_millis(100)] {
        tokio::time::sleep(pause).await;
        let again = ledger.confirm(&sku, &node("n2"), &[buy("k1", "ann", 1), buy("k1", "ann", 2)]).await.unwrap();
        assert_eq!(again.verdicts, [Verdict::Replayed(decision.clone()), Verdict::KeyReused], "after {pause:?}");
        assert_eq!((again.sold, again.remaining), (1, 9), "a replay sells nothing");
    }
    // Past the TTL the key is a new purchase, though its window may still be kept.
    tokio::time::sleep(ttl / 2 + Duration::from_millis(300)).await;
    let reused = ledger.confirm(&sku, &seller, &[buy("k1", "ann", 1)]).await.unwrap();
    assert!(is_purchased(&reused.verdicts[0]), "a key reused after its TTL is a new purchase: {reused:?}");
}

/// Goal: a buyer's record under a shared key lives its own TTL, not the key's first buyer's: on
/// Redis the first buyer's record is filed under the key alone and a later buyer's under buyer
/// and key, so once the first expires the later one must still be found. Method: on a ledger
/// whose TTL is `ttl` (a second or two), mallory decides a key; half a TTL later ann decides it
/// too; once mallory's record expired (ann's has not), ann's retry replays and mallory's use of
/// the key is a new purchase.
pub async fn a_later_buyers_record_outlives_the_keys_first(ledger: &dyn Ledger, tag: &str, ttl: Duration) {
    let sku = sku("key-outlived", tag);
    create(ledger, &sku, 10, 0).await;
    let seller = node("n1");
    let first = ledger.confirm(&sku, &seller, &[buy("k", "mallory", 1)]).await.unwrap();
    assert!(is_purchased(&first.verdicts[0]), "{first:?}");
    tokio::time::sleep(ttl / 2).await;
    let anns = ledger.confirm(&sku, &seller, &[buy("k", "ann", 1)]).await.unwrap();
    let Verdict::Fresh(ann @ Decision::Purchased(_)) = anns.verdicts[0].clone() else { panic!("{anns:?}") };
    tokio::time::sleep(ttl / 2 + Duration::from_millis(200)).await;
    let later = ledger.confirm(&sku, &seller, &[buy("k", "ann", 1), buy("k", "mallory", 1)]).await.unwrap();
    assert_eq!(later.verdicts[0], Verdict::Replayed(ann), "ann's record is within its TTL");
    assert!(is_purchased(&later.verdicts[1]), "mallory's record expired: a new purchase, {later:?}");
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 3);
}

/// Goal: ledgers with different idempotency TTLs on the same books find each other's decisions
/// for as long as the TTL they were decided under (the window length is the SKU's, not the
/// caller's). Method: `short` (TTL `short_ttl`, a second) decides first and so fixes the
/// window; `long` (a TTL of three seconds or more) decides another key; after two seconds,
/// more than `short_ttl` and less than `long`'s, both replay `long`'s key, and `long` also
/// replays `short`'s within its own TTL.
pub async fn ledgers_with_different_ttls_find_each_others_decisions(
    short: &dyn Ledger,
    long: &dyn Ledger,
    tag: &str,
    short_ttl: Duration,
) {
    let sku = sku("mixed-ttl", tag);
    create(short, &sku, 10, 0).await;
    let seller = node("n1");
    let decide = |ledger: &'static str, verdict: &Verdict| match verdict {
        Verdict::Fresh(decision) => decision.clone(),
        other => panic!("{ledger} decided {other:?}"),
    };
    let by_short = short.confirm(&sku, &seller, &[buy("k-short", "ann", 1)]).await.unwrap();
    let by_short = decide("short", &by_short.verdicts[0]);
    let by_long = long.confirm(&sku, &seller, &[buy("k-long", "bob", 1)]).await.unwrap();
    let by_long = decide("long", &by_long.verdicts[0]);
    let replayed = long.confirm(&sku, &seller, &[buy("k-short", "ann", 1)]).await.unwrap();
    assert_eq!(replayed.verdicts, [Verdict::Replayed(by_short)], "within the short TTL");
    tokio::time::sleep(short_ttl + Duration::from_millis(1000)).await;
    for (name, ledger) in [("short", short), ("long", long)] {
        let replayed = ledger.confirm(&sku, &seller, &[buy("k-long", "bob", 1)]).await.unwrap();
        assert_eq!(replayed.verdicts, [Verdict::Replayed(by_long.clone())], "{name} finds the long TTL's decision");
    }
    assert_eq!(long.status(&sku).await.unwrap().sold, 2, "replays sell nothing");
}

/// Goal: every order event carries the price, currency and pay timeout in force at its sale,
/// through `orders` and through the feed alike, so a later change never reprices an order sold
/// before it. Method: sell, change the pricing, sell again; a SKU never created refuses it.
pub async fn an_order_event_carries_the_pricing_of_its_sale(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("pricing", tag);
    let terms = SkuTerms { price: 500, currency: "EUR".into(), pay_timeout_s: 600, ..SkuTerms::new(5) };
    create_terms(ledger, &sku, terms.clone()).await;
    assert!(is_purchased(&ledger.confirm(&sku, &node("n1"), &[buy("k1", "ann", 1)]).await.unwrap().verdicts[0]));
    let later = Pricing { price: 750, currency: "USD".into(), pay_timeout_s: 120 };
    ledger.set_pricing(&sku, &later).await.expect("set_pricing");
    assert!(is_purchased(&ledger.confirm(&sku, &node("n1"), &[buy("k2", "bob", 1)]).await.unwrap().verdicts[0]));
    let events = ledger.orders(&sku, 0, 10).await.expect("orders");
    let pricings: Vec<Option<Pricing>> = events.iter().map(|event| event.pricing.clone()).collect();
    assert_eq!(pricings, [Some(Pricing::of(&terms)), Some(later.clone())]);
    let fed = ledger.feed_read(&sku, "pricing-check", "c1", 10, Duration::from_millis(10)).await.expect("feed");
    let fed: Vec<Option<Pricing>> =
        fed.iter().flat_map(|entry| entry.events().expect("events")).map(|event| event.pricing).collect();
    assert_eq!(fed, pricings, "the feed carries the same terms");
    let missing = SkuId::new(&format!("pricing-missing-{tag}")).unwrap();
    assert!(matches!(ledger.set_pricing(&missing, &later).await, Err(LedgerError::Missing(_))));
}

/// Sells `qty` to `user` under `key` and returns the release that gives it back.
async fn sell_for_release(ledger: &dyn Ledger, sku: &SkuId, key: &str, user_name: &str, qty: u32) -> Release {
    let outcome = ledger.confirm(sku, &node("n1"), &[buy(key, user_name, qty)]).await.expect("confirm");
    let Some(Verdict::Fresh(Decision::Purchased(receipt))) = outcome.verdicts.first() else {
        panic!("the sale must go through, got {:?}", outcome.verdicts);
    };
    release_of(ledger, sku, &receipt.order_id, user_name, qty).await
}

/// The release of order `order_id`, with the sale's time as the ledger's order event has it.
async fn release_of(ledger: &dyn Ledger, sku: &SkuId, order_id: &OrderId, user_name: &str, qty: u32) -> Release {
    let events = ledger.orders(sku, 0, ORDER_EVENTS_MAX).await.expect("order events");
    let event = events.iter().find(|event| event.order_id == *order_id).expect("the sale's order event");
    Release { order_id: order_id.clone(), key: event.key.clone(), user: user(user_name), qty, sold_at_ms: event.at_ms }
}

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

/// A consumer group gets each entry once; unacknowledged entries are claimed by another
/// consumer once idle, with their delivery count; acknowledged ones are not.
pub async fn a_feed_delivers_each_entry_once_until_claimed(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("feed", tag);
    create(ledger, &sku, 10, 0).await;
    let quick = Duration::from_millis(10);
    assert!(ledger.feed_read(&sku, "g", "c1", 10, quick).await.unwrap().is_empty(), "nothing sold yet");
    for n in 0..3 {
        sell_for_release(ledger, &sku, &format!("k{n}"), &format!("u{n}"), 1).await;
    }
    let first = ledger.feed_read(&sku, "g", "c1", 2, quick).await.unwrap();
    assert_eq!(first.iter().map(|e| (e.seq, e.deliveries)).collect::<Vec<_>>(), [(1, 1), (2, 1)]);
    let events = first[0].events().expect("a confirm's entry reads as order events");
    let [event] = &events[..] else { panic!("one sale, one event: {events:?}") };
    assert_eq!((event.seq, event.user.as_str(), event.qty), (1, "u0", 1));
    let now_ms = crate::unix_ms();
    assert!(
        event.at_ms > now_ms.saturating_sub(60_000) && event.at_ms <= now_ms + 60_000,
        "an event carries when it sold, by the ledger's clock: {} vs now {now_ms}",
        event.at_ms
    );
    let rest = ledger.feed_read(&sku, "g", "c2", 10, quick).await.unwrap();
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), [3], "each entry goes to one consumer");
    ledger.feed_ack(&sku, "g", &[1, 3]).await.unwrap();
    assert_eq!(ledger.feed_lag(&sku, "g").await.unwrap(), FeedLag { undelivered: 0, pending: 1 });
    assert!(ledger.feed_claim(&sku, "g", "c2", Duration::from_secs(60), 10).await.unwrap().is_empty(), "not idle");
    tokio::time::sleep(Duration::from_millis(30)).await;
    let claimed = ledger.feed_claim(&sku, "g", "c2", quick, 10).await.unwrap();
    assert_eq!(claimed.iter().map(|e| (e.seq, e.deliveries)).collect::<Vec<_>>(), [(2, 2)]);
    ledger.feed_ack(&sku, "g", &[2]).await.unwrap();
    assert_eq!(ledger.feed_lag(&sku, "g").await.unwrap(), FeedLag::default());
    // Another group reads the same stream from its start.
    assert_eq!(ledger.feed_read(&sku, "other", "c1", 10, quick).await.unwrap().len(), 3);
}

/// Trimming drops acknowledged entries only, keeps the newest `retain` for the nodes, and the
/// stream goes on numbering from where it was.
pub async fn a_feed_trims_only_what_was_acknowledged(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("feed-trim", tag);
    create(ledger, &sku, 10, 0).await;
    let quick = Duration::from_millis(10);
    for n in 0..6 {
        sell_for_release(ledger, &sku, &format!("k{n}"), &format!("u{n}"), 1).await;
    }
    let read = ledger.feed_read(&sku, "g", "c1", 10, quick).await.unwrap();
    assert_eq!(read.len(), 6);
    ledger.feed_ack(&sku, "g", &[1, 2, 3, 5]).await.unwrap();
    ledger.feed_trim(&sku, "g", 0).await.unwrap();
    let left: Vec<u64> = ledger.orders(&sku, 0, 100).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(left, [4, 5, 6], "seq 4 is still pending, so it and everything after it stay");
    ledger.feed_ack(&sku, "g", &[4, 6]).await.unwrap();
    ledger.feed_trim(&sku, "g", 2).await.unwrap();
    let left: Vec<u64> = ledger.orders(&sku, 0, 100).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(left, [5, 6], "the newest `retain` stay for the nodes");
    sell_for_release(ledger, &sku, "k6", "u6", 1).await;
    let next = ledger.feed_read(&sku, "g", "c1", 10, quick).await.unwrap();
    assert_eq!(next.iter().map(|e| e.seq).collect::<Vec<_>>(), [7]);
    assert_eq!(ledger.orders(&sku, 6, 100).await.unwrap()[0].seq, 7);
}

/// The token life cycle on a SKU that requires tokens: no token, no sale (and no stock moves);
/// a live token sells once; the same key replays, token or not; a new key with the spent token
/// is refused, and that refusal is stored like any decision.
pub async fn a_token_is_spent_by_its_first_decision(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-once", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    assert!(ledger.status(&sku).await.unwrap().require_token, "status reports the SKU requires tokens");
    let bare = ledger.confirm(&sku, &node("n1"), &[buy("none", "u1", 1)]).await.unwrap();
    assert_eq!(bare.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "no token, no sale");
    assert_eq!((bare.sold, bare.remaining), (0, 10), "a refused purchase moves no stock");

    let token = token(ledger, &sku, "u1").await;
    let first = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &token)]).await.unwrap();
    let Verdict::Fresh(decision @ Decision::Purchased(_)) = first.verdicts[0].clone() else {
        panic!("a live token of the buyer must sell: {first:?}")
    };
    let replay = ledger.confirm(&sku, &node("n2"), &[buy_with("k1", "u1", &token)]).await.unwrap();
    assert_eq!(replay.verdicts, vec![Verdict::Replayed(decision.clone())], "same key, spent token: a replay");
    let without = ledger.confirm(&sku, &node("n2"), &[buy("k1", "u1", 1)]).await.unwrap();
    assert_eq!(without.verdicts, vec![Verdict::Replayed(decision)], "the token is not part of the fingerprint");

    let again = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u1", &token)]).await.unwrap();
    assert_eq!(again.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a new key cannot reuse the token");
    let stored = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u1", &token)]).await.unwrap();
    assert_eq!(stored.verdicts, vec![Verdict::Replayed(Decision::TokenInvalid)], "the refusal replays");
    // Two keys with one token in one batch: the first spends it.
    let fresh = self::token(ledger, &sku, "u2").await;
    let batch =
        ledger.confirm(&sku, &node("n1"), &[buy_with("b1", "u2", &fresh), buy_with("b2", "u2", &fresh)]).await.unwrap();
    assert!(is_purchased(&batch.verdicts[0]), "{:?}", batch.verdicts);
    assert_eq!(batch.verdicts[1], Verdict::Fresh(Decision::TokenInvalid));
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 2, "one sale per token");
}

/// A token works only for the user it was issued to and only on its SKU. A token presented by
/// someone else is refused and stays its owner's: a buyer holds one live token per SKU, so
/// spending it there would leave the owner handed a dead token until it expired, and anyone who
/// learned it could lock the owner out. Tokens are 128 random bits, so guessing one is hopeless.
pub async fn a_token_binds_its_user_and_its_sku(ledger: &dyn Ledger, tag: &str) {
    let (x, y) = (sku("token-x", tag), sku("token-y", tag));
    create_with_tokens(ledger, &x, 10, 0).await;
    create_with_tokens(ledger, &y, 10, 0).await;
    let alice = token(ledger, &x, "alice").await;
    let other_sku = ledger.confirm(&y, &node("n1"), &[buy_with("k1", "alice", &alice)]).await.unwrap();
    assert_eq!(other_sku.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a token of X on Y");
    let other_user = ledger.confirm(&x, &node("n1"), &[buy_with("k2", "bob", &alice)]).await.unwrap();
    assert_eq!(other_user.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "alice's token used by bob");
    let own = self::token(ledger, &x, "alice").await;
    assert_eq!(own, alice, "neither attempt took alice's token from her");
    let bought = ledger.confirm(&x, &node("n1"), &[buy_with("k3", "alice", &own)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "{bought:?}");
    assert_eq!((ledger.status(&x).await.unwrap().sold, ledger.status(&y).await.unwrap().sold), (1, 0));
    let missing = ledger.issue_token(&sku("token-absent", tag), &user("alice"), Duration::from_secs(60)).await;
    assert!(matches!(missing, Err(LedgerError::Missing(_))), "no token for a SKU the ledger lacks: {missing:?}");
    assert!(matches!(ledger.status(&sku("token-absent", tag)).await, Err(LedgerError::Missing(_))));
}

/// A buyer holds at most one live token per SKU: asking again gives back the token the buyer
/// holds (so a client inventing asks cannot stockpile tokens under one user) until a purchase
/// spends it or it expires; then the next ask gets a fresh one. Another buyer gets their own.
pub async fn a_buyer_holds_one_live_token_per_sku(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-held", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let ttl = Duration::from_secs(60);
    let issued = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap();
    assert_eq!(issued.expires_in, ttl, "a fresh token lives its whole TTL");
    let first = issued.token;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap();
    assert_eq!(again.token, first, "the same buyer asking again gets the same token");
    assert!(
        again.expires_in < ttl && again.expires_in > ttl - Duration::from_secs(5),
        "a held token comes with what is left of its life: {:?}",
        again.expires_in
    );
    let bob = token(ledger, &sku, "bob").await;
    assert_ne!(bob, first, "another buyer gets a token of their own");
    assert_eq!(token(ledger, &sku, "bob").await, bob);

    let bought = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "alice", &first)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "{bought:?}");
    let second = token(ledger, &sku, "alice").await;
    assert_ne!(second, first, "once a purchase spent it, the next ask is a fresh token");
    assert_eq!(token(ledger, &sku, "alice").await, second, "which the buyer then holds");
    let bought = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "alice", &second)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "the fresh token sells: {bought:?}");

    // A refused purchase spends the token too, and frees the buyer to ask again.
    let limited = self::sku("token-held-limit", tag);
    create_with_tokens(ledger, &limited, 10, 1).await;
    let once = token(ledger, &limited, "carol").await;
    let sold = ledger.confirm(&limited, &node("n1"), &[buy_with("c1", "carol", &once)]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]), "{sold:?}");
    let twice = token(ledger, &limited, "carol").await;
    let refused = ledger.confirm(&limited, &node("n1"), &[buy_with("c2", "carol", &twice)]).await.unwrap();
    assert_eq!(refused.verdicts, vec![Verdict::Fresh(Decision::UserLimit)]);
    assert_ne!(token(ledger, &limited, "carol").await, twice, "the refused attempt spent the held token");

    let brief = self::sku("token-held-ttl", tag);
    create_with_tokens(ledger, &brief, 10, 0).await;
    let short = ledger.issue_token(&brief, &user("dave"), Duration::from_millis(100)).await.unwrap().token;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = ledger.issue_token(&brief, &user("dave"), Duration::from_millis(100)).await.unwrap().token;
    assert_ne!(after, short, "once the held token expired, the next ask is a fresh one");
}

/// A buyer's repeated asks take one slot of the SKU's per-window cap: the cap bounds memory,
/// and a held token costs none more. Method: on a ledger built with `token_issue_max = cap`, one
/// buyer asks 1,000 times, then `cap - 1` other buyers get theirs and the next is refused.
/// The windows are one TTL long and aligned to the clock, so a check that straddles two windows
/// is run again on a fresh SKU.
pub async fn a_buyers_asks_take_one_slot_of_the_token_cap(ledger: &dyn Ledger, tag: &str, cap: u64) {
    assert!(cap >= 2, "the check needs room for the buyer and one other");
    let ttl = Duration::from_secs(3600);
    for attempt in 0..3 {
        let window = crate::token_window(crate::unix_ms(), ttl).0;
        let sku = sku(&format!("token-cap-{attempt}"), tag);
        create_with_tokens(ledger, &sku, 10, 0).await;
        let held = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token;
        for _ in 0..999 {
            assert_eq!(ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token, held);
        }
        for other in 1..cap {
            let issued = ledger.issue_token(&sku, &user(&format!("u{other}")), ttl).await;
            assert!(issued.is_ok(), "buyer {other} of a cap of {cap}: {issued:?}");
        }
        let over = ledger.issue_token(&sku, &user("over"), ttl).await;
        if crate::token_window(crate::unix_ms(), ttl).0 != window {
            continue;
        }
        assert!(matches!(over, Err(LedgerError::TokensExhausted { .. })), "the cap holds past it: {over:?}");
        assert_eq!(
            ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token,
            held,
            "a buyer who holds a token gets it back even once the window's tokens are all issued"
        );
        return;
    }
    panic!("three attempts each straddled two token windows");
}

/// A token past its TTL sells nothing. Waits in real time: both ledgers expire by their own
/// clock (Redis by its key expiry), which a test cannot pause.
pub async fn an_expired_token_is_refused(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-ttl", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let token = ledger.issue_token(&sku, &user("u1"), Duration::from_millis(100)).await.unwrap().token;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = ledger.confirm(&sku, &node("n1"), &[buy_with("k", "u1", &token)]).await.unwrap();
    assert_eq!(late.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)]);
    assert_eq!(late.sold, 0);
}

/// One token, one attempt: a purchase refused for its limit or for stock still spends its
/// token, so a buyer cannot keep one token and retry it under new keys until stock appears.
pub async fn a_refused_purchase_spends_its_token_too(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-refused", tag);
    create_with_tokens(ledger, &sku, 1, 0).await;
    let first = token(ledger, &sku, "u1").await;
    let sold = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &first)]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]));
    let second = token(ledger, &sku, "u2").await;
    let refused = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u2", &second)]).await.unwrap();
    assert_eq!(refused.verdicts, vec![Verdict::Fresh(Decision::SoldOut)], "a live token does not create stock");
    ledger.restock_to(&sku, 2).await.unwrap();
    let retried = ledger.confirm(&sku, &node("n1"), &[buy_with("k3", "u2", &second)]).await.unwrap();
    assert_eq!(retried.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "the sold_out attempt spent it");
}

/// A SKU that does not require tokens sells as it always did: with no token, and without
/// reading or spending a token that comes along.
pub async fn skus_without_tokens_ignore_them(ledger: &dyn Ledger, tag: &str) {
    let (open, guarded) = (sku("token-free", tag), sku("token-guarded", tag));
    create(ledger, &open, 10, 0).await;
    create_with_tokens(ledger, &guarded, 10, 0).await;
    assert!(!ledger.status(&open).await.unwrap().require_token);
    let bare = ledger.confirm(&open, &node("n1"), &[buy("k1", "u1", 1)]).await.unwrap();
    assert!(is_purchased(&bare.verdicts[0]), "{bare:?}");
    let issued = token(ledger, &open, "u1").await;
    let twice = [buy_with("k2", "u1", &issued), buy_with("k3", "u1", &issued)];
    let with = ledger.confirm(&open, &node("n1"), &twice).await.unwrap();
    assert!(with.verdicts.iter().all(is_purchased), "the token is neither needed nor spent: {with:?}");
    let unknown = SubmitToken::new("0123456789abcdef0123456789abcdef").expect("valid token");
    let made_up = ledger.confirm(&open, &node("n1"), &[buy_with("k4", "u1", &unknown)]).await.unwrap();
    assert!(is_purchased(&made_up.verdicts[0]), "a token that was never issued is not read either");
    let on_guarded = ledger.confirm(&guarded, &node("n1"), &[buy_with("k5", "u1", &issued)]).await.unwrap();
    assert_eq!(on_guarded.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "tokens are per SKU");
}

/// Goal: one token sells at most once however many purchases race with it. Method: 8 tasks
/// confirm concurrently, each under its own key with the same token; exactly one sells.
pub async fn one_token_sells_once_under_concurrency(ledger: Arc<dyn Ledger>, tag: &str) {
    let sku = sku("token-race", tag);
    create_with_tokens(&*ledger, &sku, 100, 0).await;
    let token = token(&*ledger, &sku, "u1").await;
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let (ledger, sku, token) = (ledger.clone(), sku.clone(), token.clone());
            tokio::spawn(async move {
                let outcome =
                    ledger.confirm(&sku, &node(&format!("n{n}")), &[buy_with(&format!("k{n}"), "u1", &token)]).await;
                outcome.unwrap().verdicts.remove(0)
            })
        })
        .collect();
    let mut verdicts = Vec::new();
    for task in tasks {
        verdicts.push(task.await.expect("confirm task panicked"));
    }
    assert_eq!(verdicts.iter().filter(|v| is_purchased(v)).count(), 1, "{verdicts:?}");
    assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Fresh(Decision::TokenInvalid)).count(), 7);
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1);
}

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

/// A retry with the same key and payload gets the stored decision, from any node, and sells
/// nothing more.
pub async fn replays_a_decided_key(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("replay", tag);
    create(ledger, &sku, 10, 0).await;
    let first = ledger.confirm(&sku, &node("n1"), &[buy("k", "u1", 1)]).await.unwrap();
    let Verdict::Fresh(decision) = first.verdicts[0].clone() else { panic!("first use must be fresh: {first:?}") };
    let again = ledger.confirm(&sku, &node("n2"), &[buy("k", "u1", 1)]).await.unwrap();
    assert_eq!(again.verdicts, vec![Verdict::Replayed(decision)], "the replay names the original node and order");
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1, "a replay sells nothing");
    // Duplicates inside one batch: the first decides, the second replays it.
    let batch = ledger.confirm(&sku, &node("n1"), &[buy("twice", "u2", 1), buy("twice", "u2", 1)]).await.unwrap();
    assert!(matches!(batch.verdicts[0], Verdict::Fresh(Decision::Purchased(_))));
    assert!(matches!(batch.verdicts[1], Verdict::Replayed(Decision::Purchased(_))));
    assert_eq!(batch.sold, 2);
}

/// The same buyer's key with a different payload changes nothing.
pub async fn rejects_a_reused_key(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("reuse", tag);
    create(ledger, &sku, 10, 0).await;
    ledger.confirm(&sku, &node("n1"), &[buy("k", "u1", 1)]).await.unwrap();
    let other_qty = ledger.confirm(&sku, &node("n1"), &[buy("k", "u1", 2)]).await.unwrap();
    assert_eq!(other_qty.verdicts, vec![Verdict::KeyReused]);
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1);
}

/// Goal: an idempotency key is its buyer's. Another buyer who sends a buyer's key first (a
/// guess, a leak, two clients drawing keys alike) buys on its own and takes nothing from the
/// key's other buyers: each buys under it once, each retry replays its own buyer's sale, and
/// each sale releases once, by its own buyer only. Method: mallory uses ann's key first, across
/// batches and within one; then retries, a different qty, releases, and the order stream.
pub async fn a_key_belongs_to_its_buyer(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("key-per-buyer", tag);
    // A per-user limit, so each buyer's count is read and kept apart from the key's.
    create(ledger, &sku, 10, 2).await;
    let decided = |outcome: &BatchOutcome| -> Decision {
        match outcome.verdicts.first() {
            Some(Verdict::Fresh(decision)) => decision.clone(),
            other => panic!("a buyer's first use of a key is fresh, got {other:?}"),
        }
    };
    let mallory = ledger.confirm(&sku, &node("n1"), &[buy("k", "mallory", 1)]).await.unwrap();
    let ann = ledger.confirm(&sku, &node("n2"), &[buy("k", "ann", 1)]).await.unwrap();
    let (mallory, ann) = (decided(&mallory), decided(&ann));
    let (Decision::Purchased(mallorys), Decision::Purchased(anns)) = (&mallory, &ann) else {
        panic!("both buy: {mallory:?} {ann:?}")
    };
    assert_ne!(mallorys.order_id, anns.order_id, "two buyers, two orders");
    let retries = [buy("k", "ann", 1), buy("k", "mallory", 1), buy("k", "ann", 2)];
    let retried = ledger.confirm(&sku, &node("n3"), &retries).await.unwrap();
    assert_eq!(
        retried.verdicts,
        [Verdict::Replayed(ann.clone()), Verdict::Replayed(mallory.clone()), Verdict::KeyReused],
        "each retry replays its own buyer's sale; the same buyer's key with another qty is reused"
    );
    // Within one batch, a key's buyers are told apart too.
    let batch = [buy("k2", "bob", 1), buy("k2", "carl", 1), buy("k2", "bob", 1), buy("k2", "carl", 2)];
    let batch = ledger.confirm(&sku, &node("n1"), &batch).await.unwrap();
    let (Verdict::Fresh(bobs @ Decision::Purchased(_)), Verdict::Fresh(Decision::Purchased(_))) =
        (&batch.verdicts[0], &batch.verdicts[1])
    else {
        panic!("two buyers of one key in one batch both buy: {:?}", batch.verdicts)
    };
    assert_eq!(batch.verdicts[2], Verdict::Replayed(bobs.clone()));
    assert_eq!(batch.verdicts[3], Verdict::KeyReused);
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.orders), (4, 4), "one sale per buyer and key");
    let users: Vec<String> =
        ledger.orders(&sku, 0, 100).await.unwrap().iter().map(|o| o.user.as_str().to_string()).collect();
    assert_eq!(users, ["mallory", "ann", "bob", "carl"], "each order event names its buyer");
    // A release is the sale's own buyer's, under the shared key.
    let anns_release = release_of(ledger, &sku, &anns.order_id, "ann", 1).await;
    let as_mallory = Release { user: user("mallory"), ..anns_release.clone() };
    assert_eq!(ledger.release(&sku, &as_mallory).await.unwrap(), ReleaseOutcome::NeverSold);
    assert!(matches!(ledger.release(&sku, &anns_release).await.unwrap(), ReleaseOutcome::Released { .. }));
    assert_eq!(ledger.release(&sku, &anns_release).await.unwrap(), ReleaseOutcome::AlreadyReleased);
    let mallorys_release = release_of(ledger, &sku, &mallorys.order_id, "mallory", 1).await;
    assert!(matches!(ledger.release(&sku, &mallorys_release).await.unwrap(), ReleaseOutcome::Released { .. }));
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.released), (2, 2));
}

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

/// Goal: a key that comes back later in the same batch is answered as a retry in a later batch
/// would be: the repeat replays the first decision (a refusal too), another payload under it is
/// refused as reused, and it sells once. Method: one batch repeats a sold key, a reused key and
/// a sold-out key among fresh ones; the verdicts, the order stream, the seller's count and later
/// batches must all show one decision per key.
pub async fn a_key_repeated_in_one_batch_is_decided_once(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("batch-keys", tag);
    create(ledger, &sku, 2, 0).await;
    let seller = node("n1");
    let batch = [
        buy("a", "u1", 1),
        buy("a", "u1", 1),
        buy("a", "u1", 2),
        buy("b", "u2", 2),
        buy("b", "u2", 2),
        buy("c", "u3", 1),
        buy("a", "u1", 1),
    ];
    let outcome = ledger.confirm(&sku, &seller, &batch).await.unwrap();
    let Verdict::Fresh(sold_a @ Decision::Purchased(_)) = outcome.verdicts[0].clone() else {
        panic!("the first use of a key decides it: {:?}", outcome.verdicts)
    };
    assert_eq!(outcome.verdicts[1], Verdict::Replayed(sold_a.clone()), "the repeat replays the sale");
    assert_eq!(outcome.verdicts[2], Verdict::KeyReused, "another qty under a key decided in this batch");
    assert_eq!(outcome.verdicts[3], Verdict::Fresh(Decision::SoldOut), "2 asked, 1 left");
    assert_eq!(outcome.verdicts[4], Verdict::Replayed(Decision::SoldOut), "a refusal replays too");
    assert!(is_purchased(&outcome.verdicts[5]), "the refusal left the last unit: {:?}", outcome.verdicts[5]);
    assert_eq!(outcome.verdicts[6], Verdict::Replayed(sold_a.clone()));
    assert_eq!((outcome.sold, outcome.remaining), (2, 0));
    let keys: Vec<_> = ledger.orders(&sku, 0, 100).await.unwrap().iter().map(|o| o.key.as_str().to_string()).collect();
    assert_eq!(keys, ["a", "c"], "one order event per sale");
    assert_eq!(ledger.sold_by(&sku, &seller).await.unwrap(), 2);
    let later = ledger.confirm(&sku, &node("n2"), &[buy("a", "u1", 1), buy("b", "u2", 2), buy("a", "u9", 1)]).await;
    let later = later.unwrap();
    assert_eq!(
        later.verdicts,
        [Verdict::Replayed(sold_a), Verdict::Replayed(Decision::SoldOut), Verdict::Fresh(Decision::SoldOut)],
        "another buyer's purchase under a decided key is a purchase of its own"
    );
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

/// Goal: a replay never touches a token, even when a fresh purchase in the same batch presents
/// the same one, and a purchase without a token in a batch of token purchases is refused alone.
/// Method: a key sold with one token is retried with a second token of the same buyer, next to
/// a fresh key with that second token and a fresh key without any.
pub async fn a_replay_in_a_batch_leaves_the_token_to_a_fresh_purchase(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("batch-token", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let first = token(ledger, &sku, "u1").await;
    let sold = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &first)]).await.unwrap();
    let Verdict::Fresh(sold_k1) = sold.verdicts[0].clone() else { panic!("fresh: {sold:?}") };
    let second = token(ledger, &sku, "u1").await;
    let batch = [buy_with("k1", "u1", &second), buy_with("k2", "u1", &second), buy("k3", "u1", 1), buy("k2", "u1", 1)];
    let outcome = ledger.confirm(&sku, &node("n1"), &batch).await.unwrap();
    assert_eq!(outcome.verdicts[0], Verdict::Replayed(sold_k1), "the retry replays");
    let Verdict::Fresh(sold_k2 @ Decision::Purchased(_)) = outcome.verdicts[1].clone() else {
        panic!("the replay left the token live: {:?}", outcome.verdicts)
    };
    assert_eq!(outcome.verdicts[2], Verdict::Fresh(Decision::TokenInvalid), "no token, no sale");
    assert_eq!(outcome.verdicts[3], Verdict::Replayed(sold_k2), "a repeat without the token replays");
    assert_eq!((outcome.sold, outcome.remaining), (2, 8));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn embedded_ledger_keeps_the_contract() {
        run_all(Arc::new(EmbeddedLedger::default()), "embedded").await;
        let capped = EmbeddedLedger::default().with_token_issue_max(3);
        a_buyers_asks_take_one_slot_of_the_token_cap(&capped, "embedded", 3).await;
        let short = Duration::from_secs(1);
        a_release_outlives_the_idempotency_record(&EmbeddedLedger::new(short), "embedded", short).await;
        a_decision_is_replayed_across_a_window_boundary(&EmbeddedLedger::new(short), "embedded", short).await;
        a_later_buyers_record_outlives_the_keys_first(&EmbeddedLedger::new(short), "embedded", short).await;
        // One ledger for both: embedded books are not shared between instances, and its
        // records are not filed in windows anyway.
        let one = EmbeddedLedger::new(short);
        let long = Duration::from_secs(4);
        a_sale_whose_key_is_reused_in_its_window_is_released(&one, &one, "embedded", short, long).await;
    }
}
