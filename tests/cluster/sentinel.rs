//! The ledger behind Redis Sentinel (`redis+sentinel://` URLs), on real processes: a master, a
//! replica and three sentinels (`testkit::sentinel`), nodes that find the master through the
//! sentinels, and a master SIGKILLed in the middle of a sale.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Commands;
use seckill::cluster::Options;
use testkit::sentinel::SentinelGroup;

use crate::harness::{cluster_config, eventually, get, purchase, start_cluster};

const TOTAL: u64 = 50;
const BUYERS: usize = 80;
/// Buyers sending at once; each works through its share of buyers one after the other.
const WORKERS: usize = 8;
/// Sales answered 200 before the master is killed: the sale is well under way, not done.
const SOLD_BEFORE_KILL: usize = 15;
/// How long one buyer keeps retrying 503s: a failover, the old master's return as a replica
/// (which the new master, with `min-replicas-to-write 1`, waits for) and the breaker's
/// cool-downs fit well within it.
const BUYER_PATIENCE: Duration = Duration::from_secs(90);

const SETTINGS: &str = "durability = \"replica\"\nreplicas = 1\nreplica_timeout_ms = 300\n\
                        call_timeout_ms = 1000\n[node_settings]\nconfirm_timeout_ms = 3000";

/// One buyer's last answer: status and, for a 200, nothing more is needed than its key.
async fn buy_until_answered(addr: SocketAddr, buyer: usize) -> u16 {
    let deadline = Instant::now() + BUYER_PATIENCE;
    loop {
        let answer = purchase(addr, &format!("b{buyer}"), "sale", &format!("u{buyer}"), 1).await;
        if answer.status != 503 || Instant::now() > deadline {
            return answer.status.as_u16();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Goal: with `durability = "replica"` behind Sentinel, SIGKILLing the master mid-sale loses no
/// answered sale and sells nothing twice; the nodes follow the promoted replica without a
/// restart. Method: 80 buyers (each retrying 503 with its idempotency key) over two nodes buy 50
/// units; after 15 sales the master is SIGKILLed; once the sentinels promote the replica the
/// old master is restarted (the sentinels turn it into the new master's replica, which the new
/// master's `min-replicas-to-write 1` waits for). Then, on the new master: every 200's key is in
/// the order stream and every stream entry's key got a 200, sequence numbers run 1, 2, 3… with
/// none reused, `sold ≤ total` and equals the stream's units; each node's stock page shows the
/// new master's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_survives_the_masters_death_through_sentinel_failover() {
    let mut group = tokio::task::block_in_place(|| SentinelGroup::start(1)).unwrap_or_else(|e| {
        panic!("a private Sentinel group did not start: {e:#} (scripts/test installs redis-server)")
    });
    let old_master = group.master_port().expect("the sentinels agree on a master");
    let skus = format!("[[skus]]\nid = \"sale\"\ntotal = {TOTAL}\nbuffer = 0");
    let cluster = cluster_config(&group.url(), 2, &skus, SETTINGS);
    let running = start_cluster(&cluster, Options::default()).await;
    let addrs = running.addrs();

    let sold = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let (addrs, sold) = (addrs.clone(), sold.clone());
            tokio::spawn(async move {
                let mut answers = BTreeMap::new();
                for buyer in (worker..BUYERS).step_by(WORKERS) {
                    let status = buy_until_answered(addrs[buyer % addrs.len()], buyer).await;
                    if status == 200 {
                        // Relaxed: a progress count for the test's own trigger.
                        sold.fetch_add(1, Ordering::Relaxed);
                    }
                    answers.insert(buyer, status);
                    // Paced, so the sale is still running when the master dies.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answers
            })
        })
        .collect();

    eventually("the sale is under way", Duration::from_secs(30), || {
        let sold = sold.clone();
        async move { sold.load(Ordering::Relaxed) >= SOLD_BEFORE_KILL }
    })
    .await;
    group.server_on(old_master).expect("the master").kill();
    let new_master = tokio::task::block_in_place(|| group.wait_failover_from(old_master)).expect("a failover");
    // The old master returns, alone; the sentinels make it the new master's replica.
    tokio::task::block_in_place(|| group.server_on(old_master).expect("the old master").restart())
        .expect("the old master restarts");

    let mut answers = BTreeMap::new();
    for worker in workers {
        answers.extend(worker.await.expect("a buyer task"));
    }
    let unanswered: Vec<_> = answers.iter().filter(|(_, status)| **status == 503).collect();
    assert!(unanswered.is_empty(), "buyers still refused after {BUYER_PATIENCE:?}: {unanswered:?}");
    let receipts: BTreeSet<String> =
        answers.iter().filter(|(_, status)| **status == 200).map(|(buyer, _)| format!("b{buyer}")).collect();

    let new_url = group.server_on(new_master).expect("the new master").url();
    let mut con = redis::Client::open(new_url).and_then(|c| c.get_connection()).expect("connect to the new master");
    let meta: BTreeMap<String, String> = con.hgetall("seckill:{sale}:meta").expect("meta on the new master");
    let ledger_sold: u64 = meta.get("sold").and_then(|s| s.parse().ok()).expect("sold");
    let entries: Vec<(String, BTreeMap<String, String>)> =
        redis::cmd("XRANGE").arg("seckill:{sale}:orders").arg("-").arg("+").query(&mut con).expect("the order stream");
    let mut stream_keys = BTreeSet::new();
    let mut units = 0;
    for (at, (id, fields)) in entries.iter().enumerate() {
        assert_eq!(id, &format!("0-{}", at + 1), "sequence numbers run without gaps or reuse");
        assert!(stream_keys.insert(fields["key"].clone()), "key {} sold twice", fields["key"]);
        units += fields["qty"].parse::<u64>().expect("qty");
    }
    assert!(ledger_sold <= TOTAL, "oversold: {ledger_sold} of {TOTAL}");
    assert_eq!(units, ledger_sold, "the stream holds every unit sold");
    assert_eq!(receipts, stream_keys, "every 200 is on the new master, and every sale there was answered 200");

    for addr in &addrs {
        eventually("the node's stock page shows the new master's count", Duration::from_secs(30), || async move {
            let page = get(*addr, "/v1/skus/sale").await;
            page.status == 200 && page.body["sold"].as_u64() == Some(ledger_sold)
        })
        .await;
    }
    running.stop().await;
}
