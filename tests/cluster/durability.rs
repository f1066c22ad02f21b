//! `[ledger] durability` against real Redis processes: `fsync` refuses a Redis that does not
//! fsync every write, `replica` answers a sale only once a replica has it, and a replica that
//! falls behind turns purchases into 503s whose retries replay the stored decision; the order
//! service stores no order event a replica lacks.

use std::sync::Arc;
use std::time::Duration;

use ledger::{
    CatalogueLedger, Durability, IdempotencyKey, Ledger, LedgerError, LedgerReads, NodeId, OrderFeed, Purchase,
    RedisLedger, RedisLedgerConfig, SalesLedger, Seller, SkuId, SkuTerms, UserId,
};
use orders::OrderServiceConfig;
use redis::Commands;
use seckill::cluster::{build_ledger, Options};
use testkit::redis::RedisServer;

use crate::harness::{buy, cluster_config, eventually, get, purchase, start_cluster};

fn redis(fsync: &'static str) -> RedisServer {
    RedisServer::start_with(fsync).expect("a private redis-server (scripts/test installs it)")
}

fn replica_of(master: &RedisServer) -> RedisServer {
    RedisServer::start_replica_of(master).expect("a replica redis-server")
}

fn connection(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url()).and_then(|c| c.get_connection()).expect("connect to test Redis")
}

/// Goal: `durability = "fsync"` starts only on a Redis that fsyncs every write, and the refusal
/// names the setting that is wrong. Method: build the ledger from a config, as every command
/// does, over Redis with `appendfsync everysec`, then over one with `always`.
#[tokio::test]
async fn fsync_durability_refuses_redis_without_appendfsync_always() {
    let everysec = redis("everysec");
    let cluster = cluster_config(&everysec.url(), 1, "", "durability = \"fsync\"");
    let refused = build_ledger(&cluster.ledger).await.err().expect("a Redis without appendfsync always is refused");
    let message = format!("{refused:#}");
    assert!(message.contains("appendfsync always") && message.contains("everysec"), "{message}");

    let always = redis("always");
    let cluster = cluster_config(&always.url(), 1, "", "durability = \"fsync\"");
    build_ledger(&cluster.ledger).await.expect("a Redis with appendfsync always is accepted");
}

/// Goal: when `CONFIG` is renamed away, `fsync` durability cannot be checked and says so.
/// Method: `CONFIG SET` cannot rename commands, so deny the ledger's user `CONFIG` instead: the
/// same refusal reaches the ledger.
#[tokio::test]
async fn fsync_durability_says_so_when_config_is_refused() {
    let server = redis("always");
    let url = server.add_user("noconfig", "pw").expect("ACL user");
    let _: String =
        server.query(redis::cmd("ACL").arg("SETUSER").arg("noconfig").arg("-config")).expect("deny CONFIG to the user");
    let mut config = RedisLedgerConfig::new(url);
    config.durability = Durability::Fsync;
    let refused = RedisLedger::connect(config).unwrap().check_durability().await;
    assert!(
        matches!(&refused, Err(LedgerError::Misconfigured(m)) if m.contains("CONFIG") && m.contains("refused")),
        "{refused:?}"
    );
}

const REPLICA_SETTINGS: &str = "durability = \"replica\"\nreplicas = 1\nreplica_timeout_ms = 300\n\
                                call_timeout_ms = 2000\n[node_settings]\nconfirm_timeout_ms = 3000";

/// Goal: with `durability = "replica"`, every sale a buyer hears about is already on the replica.
/// Method: a master and one live replica; sell through HTTP, then read the replica at once (no
/// waiting for it to catch up): every purchased key's stored decision and the sold count are
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_durability_sells_and_every_receipt_is_on_the_replica() {
    let master = redis("always");
    let replica = replica_of(&master);
    let cluster = cluster_config(&master.url(), 2, "[[skus]]\nid = \"rep\"\ntotal = 20\nbuffer = 0", REPLICA_SETTINGS);
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();
    let mut bought = Vec::new();
    for n in 0..12 {
        let key = format!("r{n}");
        let answer = purchase(addrs[n % 2], &key, "rep", &format!("u{n}"), 1).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        bought.push(key);
    }
    let mut on_replica = connection(&replica);
    let sold: u64 = on_replica.hget("seckill:{rep}:meta", "sold").expect("meta on the replica");
    assert_eq!(sold, 12, "the replica has every acknowledged sale");
    for key in &bought {
        let stored = crate::harness::holds_record(&mut on_replica, "rep", key);
        assert!(stored, "the decision of {key} is on the replica");
    }
    running.stop().await;
}

/// Goal: a replica that stops acknowledging turns purchases into 503 with `Retry-After`, the
/// decision stays stored on the master, and after the replica resumes the retry with the same
/// key replays that decision without selling a second unit. Method: SIGSTOP the replica, buy,
/// check the master's books, SIGCONT, wait for the replica to sync, retry the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_answers_503_and_the_retry_replays_the_stored_decision() {
    let master = redis("always");
    let replica = replica_of(&master);
    let cluster = cluster_config(&master.url(), 1, "[[skus]]\nid = \"lag\"\ntotal = 10\nbuffer = 0", REPLICA_SETTINGS);
    let running = start_cluster(&cluster, Options::default()).await;
    let addr = running.addrs()[0];
    let sku = SkuId::new("lag").unwrap();
    assert_eq!(purchase(addr, "warm", "lag", "w", 1).await.status, 200);

    replica.signal("-STOP").expect("SIGSTOP the replica");
    let answer = purchase(addr, "slow", "lag", "s", 1).await;
    assert_eq!((answer.status.as_u16(), answer.error()), (503, "unavailable"), "{answer:?}");
    assert!(answer.headers.contains_key("retry-after"), "503 must say when to retry: {answer:?}");
    assert!(answer.body["message"].as_str().unwrap_or("").contains("replicas"), "{answer:?}");
    let stored = running.ledger.status(&sku).await.unwrap();
    assert_eq!(stored.sold, 2, "the decision stays stored on the master");

    replica.signal("-CONT").expect("SIGCONT the replica");
    replica.wait_synced().expect("the replica syncs again");
    // The node's breaker or a slow re-sync may still answer 503 for a moment: poll.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let retry = loop {
        let answer = purchase(addr, "slow", "lag", "s", 1).await;
        if answer.status == 200 || std::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retry.status, 200, "the retry gets the stored decision: {retry:?}");
    assert!(retry.replayed(), "the retry replays the first decision: {retry:?}");
    let after = running.ledger.status(&sku).await.unwrap();
    assert_eq!(after.sold, 2, "no second unit was taken for the same key");
    let page = get(addr, "/v1/skus/lag").await;
    running.stop().await;
    assert!(page.status == 200, "{page:?}");
}

/// Goal: `WAIT` counts replicas, so asking for more than exist fails every write as not
/// replicated, while the write itself stands. Method: one replica, `replicas = 2`, straight on the
/// ledger.
#[tokio::test]
async fn more_replicas_than_exist_is_not_replicated_and_the_write_stands() {
    let master = redis("always");
    let _replica = replica_of(&master);
    let mut config = RedisLedgerConfig::new(master.url());
    config.durability = Durability::Replica { replicas: 2, timeout: Duration::from_millis(100) };
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(config).unwrap());
    let sku = SkuId::new("two").unwrap();
    let created = ledger.create_sku(&sku, &SkuTerms::new(5)).await;
    assert!(matches!(created, Err(LedgerError::NotReplicated { acked: 1, wanted: 2 })), "{created:?}");
    let purchase = buy("k", "u");
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    let first = ledger.confirm(&sku, &seller, std::slice::from_ref(&purchase)).await;
    assert!(matches!(first, Err(LedgerError::NotReplicated { .. })), "{first:?}");
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1, "the write stands on the master");
    let again = ledger.confirm(&sku, &seller, &[purchase]).await;
    assert!(matches!(again, Err(LedgerError::NotReplicated { .. })), "{again:?}");
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1, "a retry replays; it never sells twice");
}

/// Goal: under `durability = "replica"` nothing the master has and its replicas lack reaches
/// anyone, whichever connection asks. A decision another node stored but could not replicate
/// is not answered as a replay, and its order event is not handed to a stream reader or to the
/// order consumer: each would act on a sale a failover can still undo (a 200 the new master
/// never heard of, an order for a unit sold again). Method: a master and a replica, two ledgers
/// (two clients, as two nodes are). The replica is SIGSTOPped, so the first ledger's sale stays
/// on the master only (`NotReplicated`); the second ledger, whose last write the replica has, asks for a replay of that key, reads the order stream and reads it through
/// a consumer group: each is refused. After SIGCONT all three see the sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_replicas_lack_is_answered_to_no_connection() {
    let master = redis("always");
    let replica = replica_of(&master);
    let ledger = |connections| {
        let mut config = RedisLedgerConfig::new(master.url());
        config.durability = Durability::Replica { replicas: 1, timeout: Duration::from_millis(200) };
        config.connections = connections;
        RedisLedger::connect(config).unwrap()
    };
    let (seller_node, other_node) = (ledger(1), ledger(1));
    let sku = SkuId::new("fenced").unwrap();
    seller_node.create_sku(&sku, &SkuTerms::new(5)).await.expect("create");
    let purchase = buy("k", "u");
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    // The other node has sold before (and so loaded the script): its last write is one the
    // replica has.
    other_node.confirm(&sku, &seller, &[buy("warm", "u")]).await.expect("a sale while the replica is live");

    replica.signal("-STOP").expect("SIGSTOP the replica");
    let sold = seller_node.confirm(&sku, &seller, std::slice::from_ref(&purchase)).await;
    let replayed = other_node.confirm(&sku, &seller, std::slice::from_ref(&purchase)).await;
    let read = other_node.orders(&sku, 0, 10).await;
    let consumed = other_node.feed_read(&sku, "orders", "c1", 10, Duration::from_millis(10)).await;
    replica.signal("-CONT").expect("SIGCONT the replica");
    assert!(matches!(sold, Err(LedgerError::NotReplicated { .. })), "{sold:?}");
    assert!(
        matches!(replayed, Err(LedgerError::NotReplicated { .. })),
        "a replay of an unreplicated sale: {replayed:?}"
    );
    assert!(matches!(read, Err(LedgerError::NotReplicated { .. })), "the order stream past the replicas: {read:?}");
    assert!(matches!(consumed, Err(LedgerError::NotReplicated { .. })), "a group read past the replicas: {consumed:?}");

    replica.wait_synced().expect("the replica syncs again");
    let replayed = other_node.confirm(&sku, &seller, std::slice::from_ref(&purchase)).await.expect("replay");
    assert!(matches!(replayed.verdicts[..], [ledger::Verdict::Replayed(_)]), "{replayed:?}");
    assert_eq!(other_node.orders(&sku, 0, 10).await.expect("read").len(), 2);
    // The group read above delivered the entry before its wait failed: it is pending for `c1`
    // (the consumer takes such entries over), so a fresh read finds nothing new and a claim has it.
    let claimed = other_node.feed_claim(&sku, "orders", "c2", Duration::ZERO, 10).await.expect("claim");
    assert_eq!(claimed.iter().map(|entry| entry.seq).collect::<Vec<_>>(), [1, 2]);
}

/// Goal: the order service never stores an order event the replicas lack: a failover could undo
/// the event and give its sequence number to another sale, leaving the store with an order the
/// ledger does not have (the nemesis found this on Redis Cluster, where the order consumers'
/// own ledger handles were built without the config's durability). Method: a sale written to
/// the master alone while its replica is frozen (through a handle without the fence, as a
/// master holds a sale it took just before a failover); the order service, configured with
/// `durability = "replica"`, must not store it while the replica lags, and stores it once the
/// replica is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_service_stores_no_event_the_replicas_lack() {
    let master = redis("always");
    let replica = replica_of(&master);
    let cluster =
        cluster_config(&master.url(), 1, "[[skus]]\nid = \"lagging\"\ntotal = 5\nbuffer = 0", REPLICA_SETTINGS);
    let sku = SkuId::new("lagging").unwrap();
    let unfenced = RedisLedger::connect(RedisLedgerConfig::new(master.url())).unwrap();
    unfenced.create_sku(&sku, &SkuTerms::new(5)).await.expect("create");
    replica.signal("-STOP").expect("SIGSTOP the replica");
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    unfenced.confirm(&sku, &seller, &[buy("k", "u")]).await.expect("a sale on the master alone");

    let dir = tempfile::tempdir().unwrap();
    let store = orders::store::open(&format!("sqlite:{}", dir.path().join("orders.db").display())).await.unwrap();
    let mut config = OrderServiceConfig { sweep: false, ..OrderServiceConfig::default() };
    // Entries a refused read delivered stay pending until claimed: claim them soon.
    config.consumer.claim_idle = Duration::from_millis(500);
    let ledger = build_ledger(&cluster.ledger).await.expect("ledger");
    let service = seckill::order_service::start_with(&cluster, ledger, store.clone(), config).await.expect("start");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stored_while_lagging = store.counts("lagging").await.expect("counts").orders;
    replica.signal("-CONT").expect("SIGCONT the replica");
    assert_eq!(stored_while_lagging, 0, "an order event only the master has was stored");

    let store = &*store;
    eventually("the order is stored once the replica has it", Duration::from_secs(15), || async move {
        store.counts("lagging").await.is_ok_and(|counts| counts.orders == 1)
    })
    .await;
    service.stop().await;
}

/// Goal: every write script keeps the ledger contract when it rides in a pipeline with `WAIT`
/// (script errors, NOSCRIPT reloads, replies). Method: the whole contract suite on a master
/// with a live replica and `replicas = 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_contract_holds_with_replica_durability() {
    let master = redis("always");
    let _replica = replica_of(&master);
    let mut config = RedisLedgerConfig::new(master.url());
    config.durability = Durability::Replica { replicas: 1, timeout: Duration::from_millis(400) };
    ledger::suite::run_all(Arc::new(RedisLedger::connect(config).unwrap()), "redis-replica").await;
}

/// Not a check: the price of `replica` durability, printed. Alternates `none` and `replica`
/// (one live replica on loopback) in the same run, one-purchase calls and batches of 64, with 16
/// callers each. Run: `cargo test --release --test cluster replica_durability_cost -- --ignored
/// --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn replica_durability_cost() {
    const CALLERS: usize = 16;
    const CALLS_PER_CALLER: usize = 200;
    let master = redis("everysec");
    let _replica = replica_of(&master);
    let seller = Seller::new(NodeId::new("n1").unwrap(), 0);
    println!("| round | durability | batch | calls/s | sales/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    for round in 0..3 {
        for (name, durability) in [
            ("none", Durability::None),
            ("replica", Durability::Replica { replicas: 1, timeout: Duration::from_millis(100) }),
        ] {
            for batch in [1usize, 64] {
                let mut config = RedisLedgerConfig::new(master.url());
                config.durability = durability;
                let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(config).unwrap());
                let sku = SkuId::new(&format!("cost-{round}-{name}-{batch}")).unwrap();
                let total = (CALLERS * CALLS_PER_CALLER * batch) as u64;
                let _ = ledger.create_sku(&sku, &SkuTerms::new(total)).await;
                let started = std::time::Instant::now();
                let mut tasks = Vec::new();
                for caller in 0..CALLERS {
                    let (ledger, sku, seller) = (ledger.clone(), sku.clone(), seller.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut latencies = Vec::with_capacity(CALLS_PER_CALLER);
                        for call in 0..CALLS_PER_CALLER {
                            let purchases: Vec<Purchase> = (0..batch)
                                .map(|at| Purchase {
                                    key: IdempotencyKey::new(&format!("k{caller}-{call}-{at}")).unwrap(),
                                    user: UserId::new(&format!("u{caller}-{call}-{at}")).unwrap(),
                                    qty: 1,
                                    token: None,
                                    order_id: None,
                                })
                                .collect();
                            let sent = std::time::Instant::now();
                            ledger.confirm(&sku, &seller, &purchases).await.expect("confirm");
                            latencies.push(sent.elapsed());
                        }
                        latencies
                    }));
                }
                let mut latencies = Vec::new();
                for task in tasks {
                    latencies.extend(task.await.unwrap());
                }
                let took = started.elapsed().as_secs_f64();
                latencies.sort();
                let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
                let calls = latencies.len() as f64;
                println!(
                    "| {round} | {name} | {batch} | {:.0} | {:.0} | {:.2} | {:.2} |",
                    calls / took,
                    calls * batch as f64 / took,
                    at(0.5),
                    at(0.99)
                );
            }
        }
    }
}
