//! The ledger behind Redis Sentinel (`redis+sentinel://` URLs), on real processes: a master, a
//! replica and three sentinels (`testkit::sentinel`), nodes that find the master through the
//! sentinels, a master SIGKILLed in the middle of a sale, and `seckill reconcile` through the
//! sentinels.

use seckill::cluster::Options;
use testkit::sentinel::SentinelGroup;

use crate::failover_sale::{assert_books_on, assert_nodes_show, skus_toml, Buyers, Orders, SETTINGS};
use crate::harness::{assert_reconcile_repairs, cluster_config, start_cluster};

/// Goal: with `durability = "replica"` behind Sentinel, SIGKILLing the master mid-sale loses no
/// answered sale and sells nothing twice; the nodes follow the promoted replica without a
/// restart. Method: 80 buyers (each retrying 503 with its idempotency key) over two nodes buy 50
/// units; after 15 sales the master is SIGKILLed; once the sentinels promote the replica the
/// old master is restarted (the sentinels turn it into the new master's replica, which the new
/// master's `min-replicas-to-write 1` waits for). Then, on the new master: every 200's key is in
/// the order stream and every stream entry's key got a 200, sequence numbers run 1, 2, 3… with
/// none reused, `sold ≤ total` and equals the stream's units; each node's stock page shows the
/// new master's count; the order service, consuming throughout, holds one order per 200 and
/// reconciles clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_survives_the_masters_death_through_sentinel_failover() {
    let mut group = tokio::task::block_in_place(|| SentinelGroup::start(1)).unwrap_or_else(|e| {
        panic!("a private Sentinel group did not start: {e:#} (scripts/test installs redis-server)")
    });
    let old_master = group.master_port().expect("the sentinels agree on a master");
    let cluster = cluster_config(&group.url(), 2, &skus_toml(), SETTINGS);
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let orders = Orders::start(&cluster, running.ledger.clone()).await;

    let buyers = Buyers::start(&addrs);
    buyers.wait_until_under_way().await;
    group.server_on(old_master).expect("the master").kill();
    let new_master = tokio::task::block_in_place(|| group.wait_failover_from(old_master)).expect("a failover");
    // The old master returns, alone; the sentinels make it the new master's replica.
    tokio::task::block_in_place(|| group.server_on(old_master).expect("the old master").restart())
        .expect("the old master restarts");

    let receipts = buyers.receipts().await;
    let sold = assert_books_on(&group.server_on(new_master).expect("the new master").url(), &receipts);
    assert_nodes_show(&addrs, sold).await;
    orders.assert_one_order_per_receipt(&*running.ledger, &receipts).await;
    running.stop().await;
}

/// Goal: `seckill reconcile` works against a Sentinel target: it finds the master through the
/// sentinels, finds order events missing from the store, and `--repair` replays them. Method:
/// the shared reconcile round trip (`assert_reconcile_repairs`) on a `redis+sentinel://` URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_checks_and_repairs_through_the_sentinels() {
    let group = tokio::task::block_in_place(|| SentinelGroup::start(1)).unwrap_or_else(|e| {
        panic!("a private Sentinel group did not start: {e:#} (scripts/test installs redis-server)")
    });
    assert_reconcile_repairs(&group.url(), &["rec".to_string()]).await;
}
