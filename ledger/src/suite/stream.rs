//! The order stream: every sale reads alike through `orders` and the feed, with the pricing of
//! its sale; a consumer group gets each entry once until claimed, and a trim keeps what is not
//! acknowledged.

use super::*;

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
