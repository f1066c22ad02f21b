//! The consumer on real Redis and PostgreSQL: every sale becomes exactly one order, entries a
//! dead consumer left pending are claimed, a poison entry is dead-lettered without blocking the
//! entries behind it, and a PostgreSQL outage only delays orders.

use std::time::Duration;

use crate::harness::*;

/// Goal: 500 sales over two SKUs become 500 orders carrying the ledger's ids, seqs, users and
/// quantities and the terms' price; method: two consumers (one per SKU) run while the sales go
/// on, then every order is compared with its stream event, and reconcile is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_sale_becomes_exactly_one_order() {
    let env = Env::start().await;
    let (terms_a, terms_b) = (terms(1000, 1250, 600), terms(1000, 99, 600));
    let sku_a = env.create("sku-a", &terms_a).await;
    // A SKU id with every character SKU ids allow: its ledger-numbered order ids carry them.
    let sku_b = env.create("sale_2.b:x", &terms_b).await;
    let consumers =
        [env.consumer(&sku_a, &terms_a, "c1", fast_consumer()), env.consumer(&sku_b, &terms_b, "c1", fast_consumer())];
    let (sales_a, sales_b) = tokio::join!(sell(&*env.ledger, &sku_a, "a", 300), sell(&*env.ledger, &sku_b, "b", 200));
    assert_eq!((sales_a.len(), sales_b.len()), (300, 200));
    assert_one_order_per_sale(&env, &sku_a, &terms_a, &sales_a).await;
    assert_one_order_per_sale(&env, &sku_b, &terms_b, &sales_b).await;
    for consumer in consumers {
        consumer.stop().await;
    }
    for sku in [&sku_a, &sku_b] {
        let report = assert_reconciled(&env, sku).await;
        assert_eq!(report.dead_letters, 0);
        let lag = env.ledger.feed_lag(sku, GROUP).await.expect("lag");
        assert_eq!((lag.undelivered, lag.pending), (0, 0), "{sku}: everything acknowledged");
    }
}

/// Goal: entries a dead consumer read and never acknowledged are taken over by the live ones,
/// and a consumer aborted mid-stream loses nothing either; method: a "dead" member reads 100
/// sales and vanishes; two consumer tasks run while sales go on, one is aborted halfway; the
/// survivor claims everything after `claim_idle` (300 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_consumers_pending_entries_are_claimed() {
    let env = Env::start().await;
    let terms = terms(1000, 500, 600);
    let sku = env.create("sku-c", &terms).await;
    let mut sales = sell(&*env.ledger, &sku, "first", 200).await;
    let dead = env.feed_ledger();
    // `sell` confirms batches of 50, one stream entry each: two entries hold 100 sales.
    let taken = dead.feed_read(&sku, GROUP, "dead", 2, Duration::from_millis(100)).await.expect("dead read");
    let held: usize = taken.iter().map(|entry| entry.events().expect("order events").len()).sum();
    assert_eq!((taken.len(), held), (2, 100), "the dead member holds 100 sales pending");
    let survivor = env.consumer(&sku, &terms, "alive", fast_consumer());
    let doomed = env.consumer(&sku, &terms, "doomed", fast_consumer());
    sales.extend(sell(&*env.ledger, &sku, "second", 150).await);
    doomed.task.abort();
    sales.extend(sell(&*env.ledger, &sku, "third", 150).await);
    assert_eq!(sales.len(), 500);
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    let ledger = env.ledger.clone();
    let sku_ = sku.clone();
    eventually(SETTLE, "nothing stays pending", || {
        let (ledger, sku) = (ledger.clone(), sku_.clone());
        async move {
            let lag = ledger.feed_lag(&sku, GROUP).await.map_err(|e| e.to_string())?;
            match lag.pending + lag.undelivered {
                0 => Ok(()),
                n => Err(format!("{n} entries pending or undelivered ({lag:?})")),
            }
        }
    })
    .await;
    survivor.stop().await;
    assert!(env.store.dead_letters(10).await.expect("dead letters").is_empty());
    assert_reconciled(&env, &sku).await;
}

/// Writes an entry with `fields` into `sku`'s order stream at the next seq and moves the
/// ledger's counter past it, as a corrupted write would leave the stream; returns its seq.
async fn plant(env: &Env, sku: &ledger::SkuId, fields: &[(&[u8], &[u8])]) -> u64 {
    let seq = env.ledger.status(sku).await.expect("status").orders + 1;
    let mut xadd = redis::cmd("XADD");
    xadd.arg(format!("{PREFIX}:{{{sku}}}:orders")).arg(format!("0-{seq}"));
    for (field, value) in fields {
        xadd.arg(*field).arg(*value);
    }
    let _: String = env.redis.query(&xadd).expect("XADD the poison entry");
    let meta = format!("{PREFIX}:{{{sku}}}:meta");
    let _: i64 = env.redis.query(redis::cmd("HINCRBY").arg(&meta).arg("order_seq").arg(1)).expect("HINCRBY");
    seq
}

/// Goal: an unreadable entry is dead-lettered after `max_deliveries` with its raw fields and a
/// reason, and the entries around it still become orders (and the nodes' reads of the stream
/// skip it); method: two entries the ledger could never have written (bad fields; bytes that
/// are not UTF-8) are planted in the stream between sales, and reconcile must count them and
/// flag them for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_entry_is_dead_lettered_and_blocks_nothing() {
    let env = Env::start().await;
    let terms = terms(1000, 500, 600);
    let sku = env.create("sku-p", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let mut sales = sell(&*env.ledger, &sku, "before", 20).await;
    let bad_fields = plant(&env, &sku, &[(b"order_id", b"not an id!"), (b"garbage", b"x")]).await;
    sales.extend(sell(&*env.ledger, &sku, "between", 15).await);
    let not_utf8 = plant(&env, &sku, &[(b"order_id", b"o-1"), (b"user", b"\xff\xfe")]).await;
    sales.extend(sell(&*env.ledger, &sku, "after", 15).await);
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    let store = env.store.clone();
    eventually(SETTLE, "both poison entries are dead-lettered", || {
        let store = store.clone();
        async move {
            match store.dead_letters(10).await.map_err(|e| e.to_string())?.len() {
                2 => Ok(()),
                n => Err(format!("{n} dead letters")),
            }
        }
    })
    .await;
    let mut letters = env.store.dead_letters(10).await.expect("dead letters");
    letters.sort_by_key(|letter| letter.stream_seq);
    let text = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(field, value)| (field.to_string(), value.to_string())).collect()
    };
    assert_eq!((letters[0].sku.as_str(), letters[0].stream_seq), (sku.as_str(), bad_fields));
    assert_eq!(letters[0].fields, text(&[("order_id", "not an id!"), ("garbage", "x")]));
    assert!(letters[0].reason.contains("unreadable"), "reason: {}", letters[0].reason);
    assert_eq!(letters[0].deliveries, 3, "dead-lettered on the first delivery past max_deliveries = 2");
    assert_eq!(letters[1].stream_seq, not_utf8);
    assert_eq!(letters[1].fields, text(&[("order_id", "o-1"), ("user", "\u{fffd}\u{fffd}")]));
    assert!(letters[1].reason.contains("not UTF-8"), "reason: {}", letters[1].reason);
    consumer.stop().await;
    let lag = env.ledger.feed_lag(&sku, GROUP).await.expect("lag");
    assert_eq!((lag.undelivered, lag.pending), (0, 0), "the poison entries were acknowledged");
    let report = orders::reconcile::check(&*env.ledger, &*env.store, &sku).await.expect("check");
    assert_eq!((report.events, report.stored, report.dead_letters, report.missing_count), (52, 50, 2, 0));
    assert!(
        report.problems.iter().any(|problem| problem.contains("dead letter")),
        "a dead letter is a gap an operator must see: {:?}",
        report.problems
    );
    assert_eq!(report.problems.len(), 1, "nothing else is wrong: {:?}", report.problems);
}

/// Goal: while PostgreSQL is down sales go on (the stream buffers), and once it is back the
/// backlog drains with nothing dead-lettered; method: stop PostgreSQL (fast shutdown) under a
/// running consumer, sell 200, restart it, wait for every order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_outage_only_delays_orders() {
    let mut env = Env::start().await;
    let terms = terms(1000, 500, 600);
    let sku = env.create("sku-o", &terms).await;
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let mut sales = sell(&*env.ledger, &sku, "before", 100).await;
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    tokio::task::block_in_place(|| env.postgres.stop()).expect("stop postgres");
    let during = sell(&*env.ledger, &sku, "during", 200).await;
    assert_eq!(during.len(), 200, "sales go on without the order store");
    sales.extend(during);
    // Let the consumer meet the outage (and back off) before the store returns.
    let lag = env.ledger.feed_lag(&sku, GROUP).await.expect("lag");
    assert!(lag.undelivered + lag.pending > 0, "the stream holds the backlog: {lag:?}");
    assert_eq!(env.store.counts(sku.as_str()).await.ok(), None, "the store is down");
    tokio::task::block_in_place(|| env.postgres.restart()).expect("restart postgres");
    assert_one_order_per_sale(&env, &sku, &terms, &sales).await;
    consumer.stop().await;
    assert!(env.store.dead_letters(10).await.expect("dead letters").is_empty(), "nothing dead-lettered");
    assert_reconciled(&env, &sku).await;
}

/// Goal: the consumer acknowledges only what it stored or dead-lettered with a reason (issue 23:
/// a row the store skipped was acknowledged anyway, and its sale had no order). Method: the
/// store already holds another order at stream seq 1 of the SKU (as after a stream reset); the
/// sale at seq 1 must be dead-lettered at once, naming the clash, and the sale at seq 2 stored.
/// Both sales are one confirm, so one stream entry: the letter is the clashing order alone,
/// under its own seq, and the entry is acknowledged (an entry used to be lettered whole, under
/// its last seq, leaving seq 1 unaccounted for).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_the_store_skips_is_dead_lettered_not_dropped() {
    let env = Env::start().await;
    let terms = terms(10, 300, 600);
    let sku = env.create("sku-clash", &terms).await;
    let squatter = orders::NewOrder {
        id: "from-an-older-stream-1".into(),
        sku: sku.to_string(),
        user: "someone".into(),
        qty: 1,
        node: "n1".into(),
        idempotency_key: "old-key".into(),
        stream_seq: 1,
        unit_price: 300,
        currency: terms.currency.clone(),
        created_at_ms: orders::unix_ms(),
        pay_deadline_ms: orders::unix_ms() + 600_000,
    };
    assert_eq!(env.store.insert_batch(std::slice::from_ref(&squatter)).await.expect("insert"), 1);
    let consumer = env.consumer(&sku, &terms, "c1", fast_consumer());
    let sales = sell(&*env.ledger, &sku, "clash", 2).await;
    let store = env.store.clone();
    let second = sales[1].order_id.clone();
    eventually(SETTLE, "the clash is dead-lettered and the next sale stored", || {
        let (store, second) = (store.clone(), second.clone());
        async move {
            let letters = store.dead_letters(100).await.map_err(|e| e.to_string())?;
            let stored = store.get(&second).await.map_err(|e| e.to_string())?.is_some();
            match (letters.len(), stored) {
                (1, true) => Ok(()),
                (letters, stored) => Err(format!("{letters} dead letters, second stored: {stored}")),
            }
        }
    })
    .await;
    consumer.stop().await;
    let letters = env.store.dead_letters(100).await.expect("dead letters");
    assert_eq!(letters[0].stream_seq, 1);
    assert!(letters[0].reason.contains("already stored as another order"), "{}", letters[0].reason);
    let names: Vec<&str> = letters[0].fields.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.contains(&"1") && !names.contains(&"2"), "the letter holds its own order alone: {names:?}");
    assert!(names.contains(&"node") && names.contains(&"at"), "and the entry's shared fields: {names:?}");
    assert!(env.store.get(&sales[0].order_id).await.expect("get").is_none(), "the clash stored nothing");
    let lag = env.ledger.feed_lag(&sku, GROUP).await.expect("lag");
    assert_eq!((lag.undelivered, lag.pending), (0, 0), "the entry is settled: stored or dead-lettered");
}
