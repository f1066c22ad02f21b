//! Retries and double clicks: one Idempotency-Key decides once, fleet-wide.

use std::collections::HashSet;

use ledger::SkuId;
use seckill::cluster::Options;

use std::time::Duration;

use crate::harness::{cluster_config, eventually, get, purchase, start_cluster, RedisServer};

/// Goal: the same key sent at the same moment to every node sells once, and every node answers
/// with the same body. Method: 40 keys, each fired concurrently at all 3 nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_on_every_node_at_once_sells_once_with_identical_replies() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 3, "[[skus]]\nid = \"twice\"\ntotal = 100", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    for n in 0..40 {
        let key = format!("click-{n}");
        let replies: Vec<_> = addrs
            .iter()
            .map(|addr| {
                let (addr, key) = (*addr, key.clone());
                tokio::spawn(async move { purchase(addr, &key, "twice", &format!("user-{n}"), 1).await })
            })
            .collect();
        let mut answers = Vec::new();
        for reply in replies {
            answers.push(reply.await.unwrap());
        }
        for answer in &answers {
            assert_eq!(answer.status, 200, "{answer:?}");
            assert_eq!(answer.raw, answers[0].raw, "every node must answer {key} with the same body");
        }
        let fresh = answers.iter().filter(|a| !a.replayed()).count();
        assert_eq!(fresh, 1, "exactly one answer decides {key}; the others are marked replayed");
    }
    let sku = SkuId::new("twice").unwrap();
    let status = running.ledger.status(&sku).await.unwrap();
    let orders = running.ledger.orders(&sku, 0, 1000).await.unwrap();
    running.stop().await;
    assert_eq!(status.sold, 40, "40 keys, 40 units, whatever the number of requests");
    let keys: HashSet<_> = orders.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys.len(), 40);
}

/// Goal: a key its buyer reuses for a different purchase is refused and changes nothing; the
/// original purchase still replays. A key is its buyer's: another buyer who sends it makes a
/// purchase of its own, and each buyer's retries replay their own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_payload_is_refused() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 2, "[[skus]]\nid = \"reuse\"\ntotal = 10\nqty_max = 3", "");
    let running = start_cluster(&cluster, Options::default()).await;
    let [a, b] = [running.addrs()[0], running.addrs()[1]];
    let first = purchase(a, "k", "reuse", "alice", 1).await;
    assert_eq!(first.status, 200);
    let other_qty = purchase(a, "k", "reuse", "alice", 2).await;
    assert_eq!((other_qty.status.as_u16(), other_qty.error()), (422, "key_reused"), "{other_qty:?}");
    let other_user = purchase(b, "k", "reuse", "bob", 1).await;
    assert_eq!((other_user.status.as_u16(), other_user.replayed()), (200, false), "{other_user:?}");
    assert_ne!(other_user.body["order_id"], first.body["order_id"], "bob's own order");
    for (answer, node) in [(&first, b), (&other_user, a)] {
        let user = if answer.raw == first.raw { "alice" } else { "bob" };
        let again = purchase(node, "k", "reuse", user, 1).await;
        assert_eq!(again.status, 200);
        assert!(again.replayed());
        assert_eq!(again.raw, answer.raw, "the replay is the buyer's own answer, from whichever node");
    }
    let status = running.ledger.status(&SkuId::new("reuse").unwrap()).await.unwrap();
    running.stop().await;
    assert_eq!(status.sold, 2);
}

/// Goal: a buyer whose purchase went through but whose answer was lost, retrying on a node that
/// has nothing left, gets the purchase back rather than "sold out".
/// Method: 1 unit, 2 nodes, no buffer, so n1 holds the unit and n2 none. Buy on n1, then retry
/// the same key on n2 until n2 has read the ledger's order stream (a refresh, 50 ms here); until
/// then n2 may only say 503 (retry), never "sold out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_node_without_stock_replays_the_purchase() {
    let redis = RedisServer::start();
    let skus = "[[skus]]\nid = \"one\"\ntotal = 1\nbuffer = 0";
    let cluster = cluster_config(&redis.url(), 2, skus, "[node_settings]\nstatus_refresh_ms = 50");
    let running = start_cluster(&cluster, Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];
    assert_eq!(get(n2, "/v1/skus/one").await.body["local_remaining"], 0, "n2 starts with nothing");

    let first = purchase(n1, "lost-answer", "one", "alice", 1).await;
    assert_eq!(first.status, 200, "{first:?}");
    eventually("n2 replays the purchase", Duration::from_secs(5), || async {
        let retry = purchase(n2, "lost-answer", "one", "alice", 1).await;
        match retry.status.as_u16() {
            200 => {
                assert!(retry.replayed());
                assert_eq!(retry.raw, first.raw, "the replay is the original answer");
                true
            }
            503 => false,
            _ => panic!("a key that bought must not be told anything else: {retry:?}"),
        }
    })
    .await;
    let other = purchase(n2, "someone-else", "one", "bob", 1).await;
    assert_eq!((other.status.as_u16(), other.error(), other.replayed()), (409, "sold_out", false));
    // Another buyer's purchase under the key is bob's own, and finds nothing left.
    let bobs = purchase(n2, "lost-answer", "one", "bob", 1).await;
    assert_eq!((bobs.status.as_u16(), bobs.error(), bobs.replayed()), (409, "sold_out", false));
    let status = running.ledger.status(&SkuId::new("one").unwrap()).await.unwrap();
    running.stop().await;
    assert_eq!(status.sold, 1);
}

/// Two nodes with a fixed, even split and no buffer, whose refresher (status and order stream)
/// runs once at start and then not for a minute: what each node knows of the other's sales is
/// only what a request makes it look up.
fn two_nodes_that_do_not_poll(redis: &RedisServer, sku: &str, total: u64) -> seckill::config::Cluster {
    let skus = format!("[[skus]]\nid = \"{sku}\"\ntotal = {total}\nbuffer = 0");
    cluster_config(&redis.url(), 2, &skus, "[node_settings]\nstatus_refresh_ms = 60000")
}

/// Goal: a purchase that succeeded on n1, retried at once with the same key on n2 whose
/// allotment is empty while the ledger still has stock, is never told "sold out" (it was not:
/// it bought). Method: empty n2's half, buy K on n1, send K to n2 straight away: it may say
/// 503 (it cannot rule K out: retry), never 409; the retry on n1 replays the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_node_without_units_is_never_told_sold_out() {
    let redis = RedisServer::start();
    let running = start_cluster(&two_nodes_that_do_not_poll(&redis, "split", 10), Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];
    for n in 0..5 {
        assert_eq!(purchase(n2, &format!("drain-{n}"), "split", &format!("d{n}"), 1).await.status, 200);
    }
    let bought = purchase(n1, "k", "split", "alice", 1).await;
    assert_eq!(bought.status, 200);
    let retried = purchase(n2, "k", "split", "alice", 1).await;
    assert!(
        retried.status == 503 || (retried.status == 200 && retried.body["order_id"] == bought.body["order_id"]),
        "a key that bought must not be told anything else: {retried:?}"
    );
    let again = purchase(n1, "k", "split", "alice", 1).await;
    assert_eq!((again.status.as_u16(), &again.body["order_id"]), (200, &bought.body["order_id"]));
    running.stop().await;
}

/// Goal: once the ledger is sold out, a node answers the burst from memory, but a key that
/// bought on another node just before still gets its purchase back. Method: 2 units, one per
/// node; K buys on n1; n2 sells the last unit (its confirmation says "sold out"); K sent to n2
/// at once must be replayed, then fresh keys on n2 are "sold out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sell_out_a_retry_of_a_key_bought_elsewhere_is_replayed() {
    let redis = RedisServer::start();
    let running = start_cluster(&two_nodes_that_do_not_poll(&redis, "last", 2), Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];
    let bought = purchase(n1, "k", "last", "alice", 1).await;
    assert_eq!(bought.status, 200);
    assert_eq!(purchase(n2, "x", "last", "bob", 1).await.status, 200, "the last unit");
    let retried = purchase(n2, "k", "last", "alice", 1).await;
    assert_eq!(retried.status, 200, "K bought on n1: {retried:?}");
    assert_eq!(retried.body["order_id"], bought.body["order_id"]);
    let fresh = purchase(n2, "y", "last", "carol", 1).await;
    assert_eq!(fresh.status, 409, "everything is sold: {fresh:?}");
    running.stop().await;
}

/// Goal: a crowd pressing buy on a sold-out SKU costs a node at most one read of the order
/// stream per `sold_out_read_gap_ms`, however many buyers press (back to back, the reads were
/// three in four of the cluster's Redis calls), and each answer is still final: a key that
/// bought on the other node is replayed in the middle of the crowd. Method: 2 units, one per
/// node, no polling, a 50 ms gap; K buys on n1, n2 sells the last unit; 16 buyers press n2 with
/// fresh keys for 500 ms (all 409), K among them; Redis counts the stream reads (`XRANGE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_crowd_costs_one_order_stream_read_per_gap() {
    const GAP_MS: u64 = 50;
    let redis = RedisServer::start();
    let skus = "[[skus]]\nid = \"gone\"\ntotal = 2\nbuffer = 0";
    let settings = format!("[node_settings]\nstatus_refresh_ms = 60000\nsold_out_read_gap_ms = {GAP_MS}");
    let running = start_cluster(&cluster_config(&redis.url(), 2, skus, &settings), Options::default()).await;
    let [n1, n2] = [running.addrs()[0], running.addrs()[1]];
    let bought = purchase(n1, "k", "gone", "alice", 1).await;
    assert_eq!(bought.status, 200);
    assert_eq!(purchase(n2, "x", "gone", "bob", 1).await.status, 200, "the last unit");
    let reads_before = stream_reads(&redis);
    let started = std::time::Instant::now();
    let crowd: Vec<_> = (0..16)
        .map(|buyer| {
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while started.elapsed() < Duration::from_millis(500) {
                    let key = format!("crowd-{buyer}-{}", statuses.len());
                    statuses.push(purchase(n2, &key, "gone", &format!("buyer-{buyer}"), 1).await.status.as_u16());
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let retried = purchase(n2, "k", "gone", "alice", 1).await;
    let mut answers = 0;
    for buyer in crowd {
        let statuses = buyer.await.expect("a buyer");
        assert!(statuses.iter().all(|status| *status == 409), "every fresh key is sold out: {statuses:?}");
        answers += statuses.len();
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let reads = stream_reads(&redis) - reads_before;
    assert_eq!((retried.status.as_u16(), &retried.body["order_id"]), (200, &bought.body["order_id"]), "{retried:?}");
    assert!(answers > 16, "the crowd pressed more than once each: {answers}");
    assert!(
        reads <= elapsed_ms / GAP_MS + 2,
        "{reads} reads of the order stream for {answers} refusals in {elapsed_ms} ms: more than one per {GAP_MS} ms"
    );
    running.stop().await;
}

/// Reads of an order stream Redis has run: the ledger reads a stream with `XRANGE` only.
fn stream_reads(redis: &RedisServer) -> u64 {
    crate::harness::command_calls(redis, "xrange")
}

/// Goal: a key reused after the ledger's idempotency TTL is a new purchase on every node, as it
/// is at the ledger: once the SKU is sold out, no node replays the old sale from memory
/// (the nemesis's `stale_replay`, seed 101). Within the TTL every node still replays it.
/// Method: a 1 s TTL, one unit; the key buys it, is replayed within the TTL on both nodes, then
/// sent again after the TTL to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_after_its_ttl_is_a_new_purchase_on_every_node() {
    let redis = RedisServer::start();
    let cluster = cluster_config(&redis.url(), 2, "[[skus]]\nid = \"ttl\"\ntotal = 1", "idempotency_ttl_s = 1");
    let running = start_cluster(&cluster, Options::default()).await;
    let [a, b] = [running.addrs()[0], running.addrs()[1]];
    let bought = purchase(a, "k-ttl", "ttl", "ann", 1).await;
    assert_eq!(bought.status, 200, "{bought:?}");
    eventually("node b sees the SKU sold out", Duration::from_secs(5), || async {
        purchase(b, "k-other", "ttl", "bob", 1).await.error() == "sold_out"
    })
    .await;
    for node in [a, b] {
        let retry = purchase(node, "k-ttl", "ttl", "ann", 1).await;
        assert!(retry.status == 200 && retry.replayed(), "within the TTL the sale is replayed: {retry:?}");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for node in [a, b] {
        let reused = purchase(node, "k-ttl", "ttl", "ann", 1).await;
        assert_eq!(reused.error(), "sold_out", "after the TTL the key is a new purchase, and none is left: {reused:?}");
    }
    running.stop().await;
}
