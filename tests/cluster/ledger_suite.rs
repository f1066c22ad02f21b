//! The ledger contract (`ledger::suite`) on real Redis, the same checks the embedded ledger
//! passes in its crate's tests, plus what only Redis has: key TTLs and the key layout.

use std::sync::Arc;
use std::time::Duration;

use ledger::{
    IdempotencyKey, Ledger, LedgerError, NodeId, Purchase, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms,
    UserId,
};
use redis::Commands;

use crate::harness::{buy, redis_ledger, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ledger_keeps_the_contract() {
    let redis = RedisServer::start();
    ledger::suite::run_all(redis_ledger(&redis), "redis").await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.token_issue_max = 3;
    let capped = RedisLedger::connect(config).unwrap();
    ledger::suite::a_buyers_asks_take_one_slot_of_the_token_cap(&capped, "redis", 3).await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.idempotency_ttl = Duration::from_secs(1);
    let short = RedisLedger::connect(config).unwrap();
    ledger::suite::a_release_outlives_the_idempotency_record(&short, "redis", Duration::from_secs(1)).await;
    ledger::suite::a_decision_is_replayed_across_a_window_boundary(&short, "redis", Duration::from_secs(1)).await;
    ledger::suite::a_later_buyers_record_outlives_the_keys_first(&short, "redis", Duration::from_secs(1)).await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.idempotency_ttl = Duration::from_secs(4);
    let long = RedisLedger::connect(config).unwrap();
    ledger::suite::ledgers_with_different_ttls_find_each_others_decisions(
        &short,
        &long,
        "redis",
        Duration::from_secs(1),
    )
    .await;
    let (one, four) = (Duration::from_secs(1), Duration::from_secs(4));
    ledger::suite::a_sale_whose_key_is_reused_in_its_window_is_released(&short, &long, "redis", one, four).await;
}

/// Goal: a rolling upgrade. Books written by the script before batch entries and window
/// records (one stream entry per order, one `SET` per decision) read on: its decisions replay
/// through today's script and its entries read, with today's batch entries after them, through
/// `orders` and the feed. Method: the older script's text (kept beside this test) confirms a
/// batch, today's script another, then every reader.
#[tokio::test]
async fn books_of_the_script_before_batch_entries_read_on() {
    use ledger::{CatalogueLedger, LedgerReads, OrderFeed, SalesLedger};
    let redis = RedisServer::start();
    let ledger = RedisLedger::connect(RedisLedgerConfig::new(redis.url())).unwrap();
    let before = redis::Script::new(include_str!("confirm_before_batch_entries.lua"));
    let sku = SkuId::new("upgrade").unwrap();
    ledger.create_sku(&sku, &SkuTerms::new(10)).await.unwrap();
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    let old = ledger
        .confirm_by(&before, ledger::ArgumentShape::KeysPerPurchase, &sku, &seller, &[buy("a", "ann"), buy("b", "bob")])
        .await
        .unwrap();
    let new = ledger.confirm(&sku, &seller, &[buy("c", "cat"), buy("a", "ann"), buy("d", "dan")]).await.unwrap();
    let ledger::Verdict::Fresh(first) = old.verdicts[0].clone() else { panic!("{old:?}") };
    assert_eq!(new.verdicts[1], ledger::Verdict::Replayed(first), "an older record replays");
    assert_eq!((new.sold, new.remaining), (4, 6));
    let events = ledger.orders(&sku, 0, 100).await.unwrap();
    let read: Vec<(u64, &str)> = events.iter().map(|e| (e.seq, e.key.as_str())).collect();
    assert_eq!(read, [(1, "a"), (2, "b"), (3, "c"), (4, "d")]);
    assert_eq!(ledger.orders(&sku, 3, 100).await.unwrap(), events[3..], "after, inside the batch entry");
    let fed = ledger.feed_read(&sku, "g", "c1", 10, Duration::from_millis(10)).await.unwrap();
    assert_eq!(fed.iter().map(|entry| entry.seq).collect::<Vec<_>>(), [1, 2, 4], "two old entries, one new");
    let fed: Vec<ledger::OrderEvent> = fed.iter().flat_map(|entry| entry.events().unwrap()).collect();
    assert_eq!(fed, events);
    // An order of each script releases once: the older sale's record is in its sales hash, the
    // newer one's is its idempotency record.
    for event in [&events[0], &events[2]] {
        let release = ledger::Release {
            order_id: event.order_id.clone(),
            key: event.key.clone(),
            user: event.user.clone(),
            qty: event.qty,
            sold_at_ms: event.at_ms,
        };
        let outcome = ledger.release(&sku, &release).await.unwrap();
        assert!(matches!(outcome, ledger::ReleaseOutcome::Released { .. }), "{release:?}: {outcome:?}");
        assert_eq!(ledger.release(&sku, &release).await.unwrap(), ledger::ReleaseOutcome::AlreadyReleased);
    }
    assert_eq!(ledger.status(&sku).await.unwrap().released, 2);
}

/// Goal: a rolling upgrade to keys per buyer. The script before it (kept beside this test)
/// holds a key as one buyer's; today's gives each buyer its own purchase under a key. Mixed,
/// they never sell one buyer's key twice: a record either script filed answers its buyer
/// through today's script, and the older script answers any buyer but the key's first
/// `key_reused`, never a second sale. Method: the older script sells ann's key; today's sells
/// it to mallory too; retries of both buyers go through both scripts.
#[tokio::test]
async fn records_of_the_script_before_buyer_records_belong_to_their_buyer() {
    use ledger::{CatalogueLedger, LedgerReads, SalesLedger, Verdict};
    let redis = RedisServer::start();
    let ledger = RedisLedger::connect(RedisLedgerConfig::new(redis.url())).unwrap();
    let before = redis::Script::new(include_str!("confirm_before_buyer_records.lua"));
    let sku = SkuId::new("upgrade-buyers").unwrap();
    ledger.create_sku(&sku, &SkuTerms::new(10)).await.unwrap();
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    let old = |purchases: Vec<Purchase>| {
        let (ledger, before, sku, seller) = (&ledger, &before, &sku, &seller);
        async move { ledger.confirm_by(before, ledger::ArgumentShape::Current, sku, seller, &purchases).await.unwrap() }
    };
    let anns = old(vec![buy("k", "ann")]).await;
    let Verdict::Fresh(ann) = anns.verdicts[0].clone() else { panic!("{anns:?}") };
    let mallorys = ledger.confirm(&sku, &seller, &[buy("k", "mallory"), buy("k", "ann")]).await.unwrap();
    let Verdict::Fresh(mallory @ ledger::Decision::Purchased(_)) = mallorys.verdicts[0].clone() else {
        panic!("another buyer of an older record's key buys on its own: {mallorys:?}")
    };
    assert_eq!(mallorys.verdicts[1], Verdict::Replayed(ann.clone()), "the older record replays to its buyer");
    let retried_old = old(vec![buy("k", "ann"), buy("k", "mallory")]).await;
    assert_eq!(
        retried_old.verdicts,
        [Verdict::Replayed(ann.clone()), Verdict::KeyReused],
        "the older script replays the key's first buyer and refuses any other, never selling twice"
    );
    let retried = ledger.confirm(&sku, &seller, &[buy("k", "mallory"), buy("k", "ann")]).await.unwrap();
    assert_eq!(retried.verdicts, [Verdict::Replayed(mallory), Verdict::Replayed(ann)]);
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.orders), (2, 2), "one sale per buyer of the key");
}

/// Goal: stored decisions expire, so Redis memory stays bounded over a long sale, and every key
/// of a SKU shares its hash tag, so the scripts run unchanged on Redis Cluster.
#[tokio::test]
async fn idempotency_records_expire_and_keys_share_the_sku_hash_tag() {
    let redis = RedisServer::start();
    let mut config = RedisLedgerConfig::new(redis.url());
    config.idempotency_ttl = Duration::from_secs(60);
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(config).unwrap());
    let sku = SkuId::new("ttl").unwrap();
    ledger.create_sku(&sku, &SkuTerms::new(5)).await.unwrap();
    let purchase = Purchase {
        key: IdempotencyKey::new("k1").unwrap(),
        user: UserId::new("u").unwrap(),
        qty: 1,
        token: None,
        order_id: None,
    };
    ledger.confirm(&sku, &Seller::new(NodeId::new("n1").unwrap(), 0), std::slice::from_ref(&purchase)).await.unwrap();

    let mut con = redis.connection();
    // The record is a field of its window's hash (window = the TTL), which lives one more
    // window past its end: more than the TTL, at most twice it.
    let windows: Vec<String> = con.keys("seckill:{ttl}:ids:60000:*").unwrap();
    let [window] = &windows[..] else { panic!("one window of records: {windows:?}") };
    let recorded: Option<String> = con.hget(window, "k1").unwrap();
    assert!(recorded.is_some(), "the decision is a field of its window");
    // A window holding a sale keeps it for the sale record TTL (what a release checks).
    let ttl: i64 = con.ttl(window).unwrap();
    let sale_ttl = i64::try_from(ledger::SALE_RECORD_TTL_DEFAULT.as_secs()).unwrap();
    assert!((sale_ttl - 5..=sale_ttl).contains(&ttl), "a window with a sale lives {sale_ttl} s, got {ttl}");
    // One without lives one more window past its end: more than the TTL, at most twice it.
    let unsold = SkuId::new("ttl-unsold").unwrap();
    ledger.create_sku(&unsold, &SkuTerms::new(0)).await.unwrap();
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    let refused = [Purchase { key: IdempotencyKey::new("k2").unwrap(), ..purchase }];
    ledger.confirm(&unsold, &seller, &refused).await.unwrap();
    let windows: Vec<String> = con.keys("seckill:{ttl-unsold}:ids:60000:*").unwrap();
    let [window] = &windows[..] else { panic!("one window of records: {windows:?}") };
    let ttl: i64 = con.ttl(window).unwrap();
    assert!((60..=120).contains(&ttl), "the window must outlive the configured TTL, got {ttl}");
    let keys: Vec<String> = con.keys("*").unwrap();
    assert!(!keys.is_empty());
    for key in &keys {
        let tagged = key.starts_with("seckill:{ttl}:") || key.starts_with("seckill:{ttl-unsold}:");
        assert!(tagged, "{key} lacks its SKU's hash tag");
    }
}

/// Goal: the ledger survives Redis forgetting its scripts (a restart or `SCRIPT FLUSH`): the
/// next call reloads the script on NOSCRIPT instead of failing the sale.
#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let redis = RedisServer::start();
    let ledger = redis_ledger(&redis);
    let sku = SkuId::new("flush").unwrap();
    ledger.create_sku(&sku, &SkuTerms::new(5)).await.unwrap();
    let node = Seller::new(NodeId::new("n1").unwrap(), 0);
    let buy = |key: &str| Purchase {
        key: IdempotencyKey::new(key).unwrap(),
        user: UserId::new("u").unwrap(),
        qty: 1,
        token: None,
        order_id: None,
    };
    ledger.confirm(&sku, &node, &[buy("a")]).await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut redis.connection()).unwrap();
    let outcome = ledger.confirm(&sku, &node, &[buy("b")]).await.expect("confirm after SCRIPT FLUSH");
    assert_eq!(outcome.sold, 2);
}

/// Goal: a batch that meets a buyer count it cannot read is refused whole, so a corrupt count
/// never leaves a batch half written (a sale streamed and recorded but not counted in meta).
/// Method: plant a count that is not a number for the second buyer of a batch; the confirm must
/// report corrupt data, and the first buyer's sale must have left no trace.
#[tokio::test]
async fn an_unreadable_buyer_count_refuses_the_batch_whole() {
    let redis = RedisServer::start();
    let ledger = redis_ledger(&redis);
    let sku = SkuId::new("count").unwrap();
    // Counts are read only for a SKU with a per-user limit.
    ledger.create_sku(&sku, &SkuTerms { per_user_limit: 2, ..SkuTerms::new(5) }).await.unwrap();
    let mut con = redis.connection();
    let _: () = con.hset("seckill:{count}:by_user", "bob", "many").unwrap();
    let node = Seller::new(NodeId::new("n1").unwrap(), 1);
    let refused = ledger.confirm(&sku, &node, &[buy("a", "ann"), buy("b", "bob")]).await;
    assert!(matches!(refused, Err(LedgerError::Corrupt(_))), "{refused:?}");
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.sold, status.remaining, status.orders), (0, 5, 0));
    assert!(ledger.orders(&sku, 0, 10).await.unwrap().is_empty(), "no order event");
    assert!(!con.exists::<_, bool>("seckill:{count}:key:a").unwrap(), "no record of ann's purchase");
    let windows: Vec<String> = con.keys("seckill:{count}:ids:*").unwrap();
    assert!(windows.is_empty(), "no window of records: {windows:?}");
    assert_eq!(ledger.sold_by(&sku, &node).await.unwrap(), 0);
}

/// Goal: a restock checks the books before it writes, as every script that moves units does:
/// a ledger whose sold + remaining no longer equals its total is refused as corrupt, and left
/// as it was. Method: plant a remaining one too high, then restock.
#[tokio::test]
async fn a_restock_refuses_books_that_do_not_balance() {
    let redis = RedisServer::start();
    let ledger = redis_ledger(&redis);
    let sku = SkuId::new("restock-corrupt").unwrap();
    ledger.create_sku(&sku, &SkuTerms::new(5)).await.unwrap();
    let mut con = redis.connection();
    let _: () = con.hset("seckill:{restock-corrupt}:meta", "remaining", 6).unwrap();
    let refused = ledger.restock_to(&sku, 10).await;
    assert!(matches!(refused, Err(LedgerError::Corrupt(_))), "{refused:?}");
    let total: u64 = con.hget("seckill:{restock-corrupt}:meta", "total").unwrap();
    assert_eq!(total, 5, "nothing written");
}

/// Goal: a stripe's keys carry the stripe's own hash tag (`{s/1}`: another slot than `{s}`, so
/// a Redis Cluster may put it on another master), and its transfer records never expire, so a
/// transfer retried however late is still recognized. Method: a debit and a credit on stripe 1
/// of a SKU, then every key and its TTL.
#[tokio::test]
async fn a_stripes_keys_carry_its_own_hash_tag_and_its_transfers_never_expire() {
    use ledger::{CatalogueLedger, LedgerReads};
    let redis = RedisServer::start();
    let ledger = RedisLedger::connect(RedisLedgerConfig::new(redis.url())).unwrap();
    let sku = SkuId::new("hot").unwrap();
    let stripe = sku.stripe(1);
    ledger.create_sku(&sku, &SkuTerms::new(5)).await.unwrap();
    ledger.create_sku(&stripe, &SkuTerms::new(5)).await.unwrap();
    assert_eq!(ledger.transfer_out(&stripe, 1, 2).await.unwrap(), 2);
    ledger.transfer_in(&sku, 1, 2).await.unwrap();
    ledger.transfer_in(&stripe, 2, 1).await.unwrap();
    let mut con = redis.connection();
    let keys: Vec<String> = con.keys("seckill:{hot/1}:*").unwrap();
    assert_eq!(keys.len(), 2, "meta and transfers: {keys:?}");
    let records: std::collections::BTreeMap<String, String> = con.hgetall("seckill:{hot/1}:transfers").unwrap();
    assert_eq!(records, [("in:2".to_string(), "1".to_string()), ("out:1".to_string(), "2".to_string())].into());
    assert_eq!(con.ttl::<_, i64>("seckill:{hot/1}:transfers").unwrap(), -1, "transfer records never expire");
    let status = ledger.status(&stripe).await.unwrap();
    assert_eq!((status.total, status.remaining, status.transferred_out, status.transferred_in), (4, 4, 2, 1));
}
