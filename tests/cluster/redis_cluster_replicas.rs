//! The ledger on a Redis Cluster whose masters have replicas
//! (`testkit::redis::RedisCluster::start_replicated`: three masters, one replica each, a 1 s
//! node timeout) under `durability = "replica"`: each write's `WAIT` covers it on its own shard,
//! and a master SIGKILLed mid-sale fails over to its replica without losing an answered sale.
//! Also `seckill reconcile` against a cluster target.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{
    Decision, Durability, Ledger, LedgerError, NodeId, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms, Verdict,
};
use redis::Commands;
use seckill::cluster::Options;
use testkit::redis::RedisCluster;

use crate::failover_sale::{assert_books_on, assert_nodes_show, sku_key, skus_toml, Buyers, Orders, SETTINGS};
use crate::harness::{assert_reconcile_repairs, buy, cluster_config, start_cluster, start_redis_cluster};
use crate::redis_cluster::{meta_key, skus_on_every_master};

fn start_replicated_cluster() -> RedisCluster {
    tokio::task::block_in_place(RedisCluster::start_replicated).unwrap_or_else(|e| {
        panic!("a private Redis Cluster with replicas did not start: {e:#}\n(scripts/test installs redis-server)")
    })
}

/// A connection to the node on `port` that may read while it is a replica (`READONLY`).
fn replica_connection(redis: &RedisCluster, port: u16) -> redis::Connection {
    let node = redis.node(redis.position(port).expect("a node of the cluster"));
    let mut con = redis::Client::open(node.url()).and_then(|c| c.get_connection()).expect("connect to the replica");
    let _: String = redis::cmd("READONLY").query(&mut con).expect("READONLY");
    con
}

/// Goal: under `durability = "replica"` on a cluster, a write's `WAIT` runs on the master that
/// ran the write, right after it on the same connection ("WAIT per shard"): every answered sale
/// is already on that shard's replica, a stalled replica refuses only its own shard's sales,
/// and the refused decision stays stored for the retry to replay.
/// Method: one SKU per master, 5 sales each one call at a time, each followed at once (no
/// waiting for replication) by a read of the record and the sold count on the shard's replica.
/// Then SIGSTOP the first shard's replica: its sale is `NotReplicated` yet counted on its
/// master, while sales on the other two shards are answered. After SIGCONT the retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_durability_on_a_cluster_waits_on_each_skus_own_shard() {
    const SALES: u64 = 5;
    let redis = start_replicated_cluster();
    let mut config = RedisLedgerConfig::new(redis.url());
    config.durability = Durability::Replica { replicas: 1, timeout: Duration::from_millis(300) };
    config.call_timeout = Duration::from_secs(2);
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(config).expect("a cluster ledger"));
    let seller = Seller::new(NodeId::new("n1").unwrap(), 1);
    let skus = skus_on_every_master(&redis, "shard", 1);

    for (sku, master) in &skus {
        let id = SkuId::new(sku).unwrap();
        ledger.create_sku(&id, &SkuTerms::new(10)).await.expect("create");
        let mut replica = replica_connection(&redis, redis.replica_of(*master).expect("the shard's replica"));
        for n in 1..=SALES {
            let key = format!("{sku}-{n}");
            let outcome = ledger.confirm(&id, &seller, &[buy(&key, &format!("u{n}"))]).await.expect("confirm");
            assert!(matches!(outcome.verdicts[0], Verdict::Fresh(Decision::Purchased(_))), "{outcome:?}");
            let sold: u64 = replica.hget(meta_key(sku), "sold").expect("meta on the replica");
            assert_eq!(sold, n, "{sku}: the replica has every answered sale");
            let stored = crate::harness::holds_record(&mut replica, sku, &key);
            assert!(stored, "{sku}: the decision of {key} is on the replica");
        }
    }

    let (stalled_sku, stalled_master) = &skus[0];
    let stalled = SkuId::new(stalled_sku).unwrap();
    let replica = redis.node(redis.position(redis.replica_of(*stalled_master).unwrap()).unwrap());
    replica.signal("-STOP").expect("SIGSTOP the replica");
    let refused = ledger.confirm(&stalled, &seller, &[buy("late", "late")]).await;
    assert!(matches!(refused, Err(LedgerError::NotReplicated { acked: 0, wanted: 1 })), "{refused:?}");
    assert_eq!(ledger.status(&stalled).await.unwrap().sold, SALES + 1, "the decision stays stored on its master");
    for (sku, _) in &skus[1..] {
        let id = SkuId::new(sku).unwrap();
        let other = ledger.confirm(&id, &seller, &[buy(&format!("{sku}-during"), "d")]).await;
        assert!(other.is_ok(), "{sku}: another shard's replica acknowledges its own writes: {other:?}");
    }
    replica.signal("-CONT").expect("SIGCONT the replica");
    tokio::task::block_in_place(|| redis.wait_ready()).expect("the replica is back");

    let deadline = Instant::now() + Duration::from_secs(10);
    let retry = loop {
        let retry = ledger.confirm(&stalled, &seller, &[buy("late", "late")]).await;
        if retry.is_ok() || Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let retry = retry.expect("the retry is answered once the replica acknowledges");
    assert!(matches!(retry.verdicts[0], Verdict::Replayed(Decision::Purchased(_))), "the retry replays: {retry:?}");
    assert_eq!(ledger.status(&stalled).await.unwrap().sold, SALES + 1, "no second unit for the same key");
}

/// Goal: with `durability = "replica"` on a Redis Cluster with replicas, SIGKILLing the master
/// of the SKU's shard mid-sale loses no answered sale and sells nothing twice; the nodes follow
/// the promoted replica without a restart. Method: as the Sentinel test (`failover_sale`): 80
/// buyers (each retrying 503 with its idempotency key) over two nodes buy 50 units; after 15
/// sales the shard's master is SIGKILLed; once the cluster has promoted its replica and reports
/// `cluster_state:ok`, the old master is restarted (the cluster turns it into the new master's
/// replica, which `WAIT 1` needs). Then, on the new master: every 200's key is in the order
/// stream and every stream entry's key got a 200, sequence numbers run 1, 2, 3… with none
/// reused, `sold ≤ total` and equals the stream's units; each node's stock page shows the new
/// master's count; the order service, consuming throughout, holds one order per 200 and
/// reconciles clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_survives_the_masters_death_through_cluster_failover() {
    let mut redis = start_replicated_cluster();
    let old_master = redis.master_of(&sku_key("meta")).expect("the master of the SKU's slot");
    let cluster = cluster_config(&redis.url(), 2, &skus_toml(), SETTINGS);
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let orders = Orders::start(&cluster, running.ledger.clone()).await;

    let buyers = Buyers::start(&addrs);
    buyers.wait_until_under_way().await;
    let old_at = redis.position(old_master).unwrap();
    redis.kill(old_at);
    let killed = Instant::now();
    let sold_before = buyers.sold();
    let new_master =
        tokio::task::block_in_place(|| redis.wait_failover_from(old_master, &sku_key("meta"))).expect("a failover");
    let promoted_after = killed.elapsed();
    // The old master returns; the cluster makes it the new master's replica.
    tokio::task::block_in_place(|| redis.restart(old_at)).expect("the old master restarts");

    let receipts = buyers.receipts().await;
    eprintln!(
        "{sold_before} sold before the kill, {} after; replica promoted {promoted_after:?} and every buyer answered \
         {:?} after the kill",
        receipts.len() - sold_before,
        killed.elapsed()
    );
    let sold = assert_books_on(&redis.node(redis.position(new_master).unwrap()).url(), &receipts);
    assert_nodes_show(&addrs, sold).await;
    orders.assert_one_order_per_receipt(&*running.ledger, &receipts).await;
    // Three masters again, the old one a replica in sync: the shard is whole.
    tokio::task::block_in_place(|| redis.wait_ready()).expect("the old master rejoins as a replica");
    running.stop().await;
}

/// Goal: `seckill reconcile` works against a Redis Cluster target: it reads each SKU's books
/// from the master that owns its slot, finds order events missing from the store, and
/// `--repair` replays them. Method: one SKU per master of a three-master cluster, 4 sales each
/// straight on the ledger and no order service, so the SQLite store is empty; then the binary,
/// as an operator runs it: a check (exit 1, 4 missing per SKU), `--repair` (exit 0, 4 replayed
/// per SKU), and a check again (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_checks_and_repairs_skus_on_every_master_of_a_cluster() {
    let redis = start_redis_cluster();
    let skus: Vec<String> = skus_on_every_master(&redis, "rec", 1).into_iter().map(|(sku, _)| sku).collect();
    assert_reconcile_repairs(&redis.url(), &skus).await;
}
