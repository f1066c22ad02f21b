//! The ledger on a real Redis Cluster: three `redis-server --cluster-enabled yes` masters on
//! free loopback ports, joined by `redis-cli --cluster create`, reached through a
//! `redis+cluster://` URL. The contract suite, a sale whose SKUs live on every master, the demo,
//! and a master's restart.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{Ledger, LedgerError, NodeId, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms};
use seckill::cluster::Options;
use seckill::config::Cluster;
use testkit::load::{self, LoadPlan};
use testkit::redis::{RedisCluster, CLUSTER_MASTERS};

use crate::harness::{buy, eventually, start_cluster, start_redis_cluster};

/// The key prefix the ledger uses unless configured otherwise.
const KEY_PREFIX: &str = "seckill";

fn cluster_ledger(redis: &RedisCluster) -> Arc<dyn Ledger> {
    Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("a cluster ledger"))
}

/// The meta key of `sku`: the slot of every key of the SKU, since they share its hash tag.
pub(crate) fn meta_key(sku: &str) -> String {
    format!("{KEY_PREFIX}:{{{sku}}}:meta")
}

/// The first SKU names `<stem>-0`, `<stem>-1`, … until every master serves `per_master` of
/// them, with the port of the master that serves each, as the cluster itself reports
/// (`CLUSTER KEYSLOT` and `CLUSTER NODES`).
pub(crate) fn skus_on_every_master(redis: &RedisCluster, stem: &str, per_master: usize) -> Vec<(String, u16)> {
    let mut chosen: Vec<(String, u16)> = Vec::new();
    let mut per_port: BTreeMap<u16, usize> = BTreeMap::new();
    for n in 0..1_000 {
        let sku = format!("{stem}-{n}");
        let port = redis.master_of(&meta_key(&sku)).expect("the cluster names the master of a slot");
        let count = per_port.entry(port).or_insert(0);
        if *count < per_master {
            *count += 1;
            chosen.push((sku, port));
        }
        if chosen.len() == per_master * CLUSTER_MASTERS {
            return chosen;
        }
    }
    panic!("1,000 SKU names did not cover every master: {per_port:?}");
}

/// Goal: the ledger keeps its whole contract on a Redis Cluster, with its SKUs on every master.
/// Method: the shared suite (`ledger::suite`) over a `redis+cluster://` ledger, then each
/// master, asked directly, must hold some of the suite's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_ledger_keeps_the_contract() {
    let redis = start_redis_cluster();
    ledger::suite::run_all(cluster_ledger(&redis), "redis-cluster").await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.token_issue_max = 3;
    let capped = RedisLedger::connect(config).expect("a cluster ledger");
    ledger::suite::a_buyers_asks_take_one_slot_of_the_token_cap(&capped, "redis-cluster", 3).await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.idempotency_ttl = Duration::from_secs(1);
    let short = RedisLedger::connect(config).expect("a cluster ledger");
    ledger::suite::a_release_outlives_the_idempotency_record(&short, "redis-cluster", Duration::from_secs(1)).await;
    ledger::suite::a_decision_is_replayed_across_a_window_boundary(&short, "redis-cluster", Duration::from_secs(1))
        .await;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.idempotency_ttl = Duration::from_secs(4);
    let long = RedisLedger::connect(config).expect("a cluster ledger");
    let one = Duration::from_secs(1);
    ledger::suite::ledgers_with_different_ttls_find_each_others_decisions(&short, &long, "redis-cluster", one).await;
    let four = Duration::from_secs(4);
    ledger::suite::a_sale_whose_key_is_reused_in_its_window_is_released(&short, &long, "redis-cluster", one, four)
        .await;
    for (at, port) in redis.ports().into_iter().enumerate() {
        let keys: u64 = redis.node(at).query(&redis::cmd("DBSIZE")).unwrap();
        assert!(keys > 0, "the master on port {port} holds none of the suite's keys");
    }
}

/// Goal: a sale of several SKUs whose slots live on all three masters sells every SKU's stock
/// exactly, through the real cluster: no oversell, no undersell, no key sold twice, and every
/// SKU's books on the master that owns its slot.
/// Method: scenario `small`'s cluster (3 nodes, a coordinator, 1 unit per user) with one SKU
/// of `small`'s stock per master; `small`'s 20,000 attempts and 64 buyers split evenly across
/// the SKUs, all SKUs sold at once; then each SKU audited against the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_over_three_masters_sells_every_sku_exactly() {
    let redis = start_redis_cluster();
    let small = seckill::dev::scenario::find("small").unwrap();
    let skus = skus_on_every_master(&redis, "phone", 1);
    let owners: BTreeSet<u16> = skus.iter().map(|(_, port)| *port).collect();
    assert_eq!(owners, redis.ports().into_iter().collect(), "every master owns at least one SKU: {skus:?}");

    let data_dir = tempfile::tempdir().unwrap();
    let coordinator = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut text = small.cluster_toml(&skus[0].0, &redis.url(), coordinator, data_dir.path());
    for (sku, _) in &skus[1..] {
        text.push_str(&format!(
            "\n[[skus]]\nid = \"{sku}\"\ntotal = {}\nper_user_limit = 1\nqty_max = 1\n",
            small.stock
        ));
    }
    let cluster = Cluster::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let running = start_cluster(&cluster, Options::default()).await;
    for (sku, _) in &skus {
        seckill::dev::demo::wait_for_allotments(&running, &SkuId::new(sku).unwrap(), small.stock).await.unwrap();
    }

    let share = skus.len() as u64;
    let loads: Vec<_> = skus
        .iter()
        .enumerate()
        .map(|(at, (sku, _))| {
            tokio::spawn(load::run(LoadPlan {
                targets: running.addrs(),
                sku: sku.clone(),
                purchases: small.requests / share,
                users: small.users,
                concurrency: small.concurrency / skus.len(),
                retries_max: 5,
                retry_pause: Duration::from_millis(20),
                seed: 11 + at as u64,
                rate_per_s: None,
                bearer: None,
            }))
        })
        .collect();
    let mut reports = Vec::new();
    for load in loads {
        reports.push(load.await.unwrap().unwrap());
    }
    let mut books = Vec::new();
    for (sku, _) in &skus {
        let id = SkuId::new(sku).unwrap();
        books.push((running.ledger.status(&id).await.unwrap(), running.ledger.orders(&id, 0, 10_000).await.unwrap()));
    }
    running.stop().await;

    for ((sku, port), (report, (status, orders))) in skus.iter().zip(reports.iter().zip(&books)) {
        eprintln!(
            "{sku} (master :{port}): {} requests in {:.2} s, sold {} of {}, outcomes {:?}",
            report.requests,
            report.elapsed.as_secs_f64(),
            status.sold,
            status.total,
            report.outcomes
        );
        assert_eq!(
            report.count("purchased"),
            small.stock,
            "{sku}: buyers were told 'purchased' exactly stock times: {:?}",
            report.outcomes
        );
        assert_eq!((status.total, status.sold, status.remaining), (small.stock, small.stock, 0), "{sku}: the books");
        assert_eq!(status.sold_by_node.values().sum::<u64>(), small.stock, "{sku}: per-node sold adds up");
        let keys: HashSet<_> = orders.iter().map(|o| o.key.as_str()).collect();
        let order_ids: HashSet<_> = orders.iter().map(|o| o.order_id.0.as_str()).collect();
        assert_eq!(
            (orders.len() as u64, keys.len() as u64, order_ids.len() as u64),
            (small.stock, small.stock, small.stock),
            "{sku}: one order event per unit, no key sold twice, no order id reused"
        );
        let told: HashMap<&str, &str> = report.purchases.iter().map(|(k, o)| (k.as_str(), o.as_str())).collect();
        for order in orders {
            assert_eq!(
                told.get(order.key.as_str()),
                Some(&order.order_id.0.as_str()),
                "{sku}: every sale was reported to its buyer"
            );
        }
        let at = redis.ports().iter().position(|p| p == port).unwrap();
        let exists: bool = redis.node(at).query(redis::cmd("EXISTS").arg(meta_key(sku))).unwrap();
        assert!(exists, "{sku}: its books live on the master on port {port}, which owns its slot");
    }
}

/// Goal: `seckill demo --redis redis+cluster://…` runs scenario `small` exactly on a cluster and
/// measures Redis' work across its masters. Method: the CLI's code path, called as a library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_small_on_a_redis_cluster_is_exact() {
    let redis = start_redis_cluster();
    let scenario = seckill::dev::scenario::find("small").unwrap();
    let report = seckill::dev::demo::run(scenario, Some(&redis.url()), seckill::dev::buyer_auth::BuyerAuth::None, 1)
        .await
        .unwrap();
    eprintln!("{}", report.render());
    assert_eq!((report.told_purchased(), report.ledger_sold), (1000, 1000), "{}", report.render());
    assert_eq!((report.oversell, report.undersell, report.duplicates), (0, 0, 0), "{}", report.render());
    assert_eq!(report.sold_per_node.values().sum::<u64>(), 1000);
    let work = report.redis.expect("Redis work is measured on a cluster too");
    assert!(work.commands > 0, "{}", report.render());
}

/// Goal: losing a master costs only time: calls touching it fail fast as `Unavailable` (retry),
/// `ping` reports the cluster unreachable, and once the master is back (AOF and `nodes.conf`)
/// the same ledger sells again on top of the sales made before.
/// Method: sell one unit of a SKU, SIGKILL the master owning it, call, restart it, call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_calls_fast_and_its_sales_survive_its_restart() {
    let mut redis = start_redis_cluster();
    let ledger = cluster_ledger(&redis);
    let (sku, port) = skus_on_every_master(&redis, "restart", 1).remove(0);
    let sku = SkuId::new(&sku).unwrap();
    let seller = Seller::new(NodeId::new("n1").unwrap(), 1);
    ledger.create_sku(&sku, &SkuTerms::new(10)).await.unwrap();
    ledger.confirm(&sku, &seller, &[buy("before", "u1")]).await.unwrap();

    let at = redis.ports().iter().position(|p| *p == port).unwrap();
    redis.kill(at);
    let call_timeout = RedisLedgerConfig::new("").call_timeout;
    let started = Instant::now();
    let refused = ledger.confirm(&sku, &seller, &[buy("during", "u2")]).await;
    let gave_up_after = started.elapsed();
    eprintln!("a sale on a dead master was refused after {gave_up_after:?}: {refused:?}");
    assert!(matches!(refused, Err(LedgerError::Unavailable(_))), "a sale on a dead master: {refused:?}");
    assert!(gave_up_after < call_timeout * 3, "the call gave up after {gave_up_after:?}");
    assert!(ledger.ping().await.is_err(), "ping must fail while a master is down");

    redis.restart(at).unwrap();
    redis.wait_ready().unwrap();
    eventually("the ledger reaches the restarted master", Duration::from_secs(20), || async {
        ledger.ping().await.is_ok()
    })
    .await;
    let outcome = ledger.confirm(&sku, &seller, &[buy("after", "u3")]).await.unwrap();
    assert_eq!(outcome.sold, 2, "the sale before the kill survived it, and the one after counts");
    let keys: Vec<_> = ledger.orders(&sku, 0, 100).await.unwrap().into_iter().map(|o| o.key.to_string()).collect();
    assert!(!keys.contains(&"during".to_string()), "a refused call sold nothing: {keys:?}");
}

/// Goal: the ledger can be built while its cluster is down (a node starting before Redis), fails
/// calls as `Unavailable` meanwhile, and connects by itself once the cluster is up.
/// Method: stop every master, build a new ledger, call, restart the masters, call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_built_while_the_cluster_is_down_connects_once_it_is_up() {
    let mut redis = start_redis_cluster();
    let sku = SkuId::new("early").unwrap();
    cluster_ledger(&redis).create_sku(&sku, &SkuTerms::new(3)).await.unwrap();
    for at in 0..CLUSTER_MASTERS {
        redis.kill(at);
    }

    let ledger = cluster_ledger(&redis);
    assert!(matches!(ledger.ping().await, Err(LedgerError::Unavailable(_))), "no master is up yet");
    assert!(matches!(ledger.status(&sku).await, Err(LedgerError::Unavailable(_))), "no master is up yet");

    for at in 0..CLUSTER_MASTERS {
        redis.restart(at).unwrap();
    }
    redis.wait_ready().unwrap();
    eventually("the ledger connects to the cluster", Duration::from_secs(20), || async { ledger.ping().await.is_ok() })
        .await;
    let status = ledger.status(&sku).await.unwrap();
    assert_eq!((status.total, status.sold), (3, 0), "the SKU came back with the cluster's AOF");
}
