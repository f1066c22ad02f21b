//! Idempotency keys: a decided key replays its decision, a changed payload is refused, a key is
//! its buyer's, and a decision is found for as long as the TTL it was made under.

use super::*;

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
