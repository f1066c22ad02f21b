//! A sale that outlives its Redis master, shared by the Sentinel and the Redis Cluster failover
//! tests: buyers spread over a test cluster's nodes, each retrying 503 with its idempotency key
//! and paced so the sale is still running when the test kills the master; then the audit of
//! the books on the master that took over, of what the nodes show and of the orders the order
//! service made from the sale's stream across the failover.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{Ledger, SkuId};
use orders::{OrderService, OrderServiceConfig, OrderStore};
use redis::Commands;
use seckill::config::Cluster;
use tokio::task::JoinHandle;

use crate::harness::{eventually, get, purchase};

/// The SKU on sale.
pub const SKU: &str = "sale";
const TOTAL: u64 = 50;
const BUYERS: usize = 80;
/// Buyers sending at once; each works through its share of buyers one after the other.
const WORKERS: usize = 8;
/// Sales answered 200 before the master is killed: the sale is well under way, not done.
const SOLD_BEFORE_KILL: usize = 15;
/// How long one buyer keeps retrying 503s: a failover, the old master's return as a replica
/// (which `WAIT` on the new master needs) and the breaker's cool-downs fit well within it.
const BUYER_PATIENCE: Duration = Duration::from_secs(90);

/// `[ledger]` keys and `[node_settings]` for the sale: every write waits for one replica, and
/// a call may take the wait plus a redirect or two.
pub const SETTINGS: &str = "durability = \"replica\"\nreplicas = 1\nreplica_timeout_ms = 300\n\
                            call_timeout_ms = 1000\n[node_settings]\nconfirm_timeout_ms = 3000";

/// The `[[skus]]` table of the sale: no buffer, so nodes hold only what the ledger has.
pub fn skus_toml() -> String {
    format!("[[skus]]\nid = \"{SKU}\"\ntotal = {TOTAL}\nbuffer = 0")
}

/// The ledger's key of `SKU`'s `name` (`meta`, `orders`), under the default prefix.
pub fn sku_key(name: &str) -> String {
    format!("seckill:{{{SKU}}}:{name}")
}

/// One buyer's last status.
async fn buy_until_answered(addr: SocketAddr, buyer: usize) -> u16 {
    let deadline = Instant::now() + BUYER_PATIENCE;
    loop {
        let answer = purchase(addr, &format!("b{buyer}"), SKU, &format!("u{buyer}"), 1).await;
        if answer.status != 503 || Instant::now() > deadline {
            return answer.status.as_u16();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The buyers, running.
pub struct Buyers {
    workers: Vec<JoinHandle<BTreeMap<usize, u16>>>,
    /// Sales answered 200 so far.
    sold: Arc<AtomicUsize>,
}

impl Buyers {
    /// Starts the buyers over `addrs`, buyer `b` on node `b % addrs.len()`.
    pub fn start(addrs: &[SocketAddr]) -> Buyers {
        let sold = Arc::new(AtomicUsize::new(0));
        let workers = (0..WORKERS)
            .map(|worker| {
                let (addrs, sold) = (addrs.to_vec(), sold.clone());
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
        Buyers { workers, sold }
    }

    /// Returns once the sale is under way: time to kill the master.
    pub async fn wait_until_under_way(&self) {
        eventually("the sale is under way", Duration::from_secs(30), || {
            let sold = self.sold.clone();
            async move { sold.load(Ordering::Relaxed) >= SOLD_BEFORE_KILL }
        })
        .await;
    }

    /// Sales answered 200 so far.
    pub fn sold(&self) -> usize {
        // Relaxed: a progress count, read for a report.
        self.sold.load(Ordering::Relaxed)
    }

    /// Waits for every buyer's last answer and returns the keys answered 200. Fails the test if
    /// a buyer was still refused after [`BUYER_PATIENCE`].
    pub async fn receipts(self) -> BTreeSet<String> {
        let mut answers = BTreeMap::new();
        for worker in self.workers {
            answers.extend(worker.await.expect("a buyer task"));
        }
        let unanswered: Vec<_> = answers.iter().filter(|(_, status)| **status == 503).collect();
        assert!(unanswered.is_empty(), "buyers still refused after {BUYER_PATIENCE:?}: {unanswered:?}");
        answers.iter().filter(|(_, status)| **status == 200).map(|(buyer, _)| format!("b{buyer}")).collect()
    }
}

/// An order stream entry as `XRANGE` gives it: its id and its raw fields.
type StreamEntry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// Audits the books on the master at `url` (a `redis://` URL) against the buyers' `receipts`:
/// every 200's key is in the order stream and every stream entry's key got a 200; sequence
/// numbers run 1, 2, 3… with none reused; no key sold twice; `sold + remaining == total`,
/// `sold ≤ total` and equal to the stream's units. Returns the master's sold count.
pub fn assert_books_on(url: &str, receipts: &BTreeSet<String>) -> u64 {
    let mut con = redis::Client::open(url).and_then(|c| c.get_connection()).expect("connect to the new master");
    let meta: BTreeMap<String, String> = con.hgetall(sku_key("meta")).expect("meta on the new master");
    let count = |name: &str| -> u64 { meta.get(name).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{name}")) };
    let ledger_sold = count("sold");
    assert_eq!(ledger_sold + count("remaining"), count("total"), "sold + remaining == total: {meta:?}");
    // Entries hold a batch's orders each (`ledger::FeedEntry::events` reads both shapes).
    let entries: Vec<StreamEntry> =
        redis::cmd("XRANGE").arg(sku_key("orders")).arg("-").arg("+").query(&mut con).expect("the order stream");
    let mut stream_keys = BTreeSet::new();
    let mut units = 0;
    let mut seqs = 0;
    for (id, fields) in entries {
        let seq: u64 = id.strip_prefix("0-").and_then(|seq| seq.parse().ok()).expect("an entry id 0-<seq>");
        let events = ledger::FeedEntry::from_raw(seq, fields, 0).events().expect("an entry of order events");
        for event in events {
            seqs += 1;
            assert_eq!(event.seq, seqs, "sequence numbers run without gaps or reuse");
            assert!(stream_keys.insert(event.key.to_string()), "key {} sold twice", event.key);
            units += u64::from(event.qty);
        }
    }
    assert!(ledger_sold <= TOTAL, "oversold: {ledger_sold} of {TOTAL}");
    assert_eq!(units, ledger_sold, "the stream holds every unit sold");
    assert_eq!(receipts, &stream_keys, "every 200 is on the new master, and every sale there was answered 200");
    ledger_sold
}

/// Waits until every node's stock page shows `sold`: the nodes read the new master.
pub async fn assert_nodes_show(addrs: &[SocketAddr], sold: u64) {
    for addr in addrs {
        eventually("the node's stock page shows the new master's count", Duration::from_secs(30), || async move {
            let page = get(*addr, &format!("/v1/skus/{SKU}")).await;
            page.status == 200 && page.body["sold"].as_u64() == Some(sold)
        })
        .await;
    }
}

/// The order service beside the sale, its consumer reading the SKU's order stream through the
/// failover (over the ledger's own connection kind), on a SQLite store in a temp dir.
pub struct Orders {
    service: OrderService,
    store: Arc<dyn OrderStore>,
    _dir: tempfile::TempDir,
}

impl Orders {
    pub async fn start(cluster: &Cluster, ledger: Arc<dyn Ledger>) -> Orders {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite:{}", dir.path().join("orders.db").display());
        let store = orders::store::open(&url).await.expect("a SQLite order store");
        // No sweeper: the sale's orders stay pending, so every one of them is counted below.
        let config = OrderServiceConfig { sweep: false, ..OrderServiceConfig::default() };
        let service =
            seckill::order_service::start_with(cluster, ledger, store.clone(), config).await.expect("order service");
        Orders { service, store, _dir: dir }
    }

    /// Waits until the store holds one order per receipt, and none for a buyer refused; then
    /// `reconcile` finds the ledger and the store in agreement (no event missing, none stored
    /// as another order).
    pub async fn assert_one_order_per_receipt(self, ledger: &dyn Ledger, receipts: &BTreeSet<String>) {
        let sku = SkuId::new(SKU).expect("the SKU's name");
        let store = &*self.store;
        eventually("the consumer stores an order per sale", Duration::from_secs(30), || async move {
            store.counts(SKU).await.is_ok_and(|counts| counts.orders == receipts.len() as u64)
        })
        .await;
        for buyer in 0..BUYERS {
            let orders = store.by_user(&format!("u{buyer}"), 10).await.expect("the buyer's orders");
            let keys: Vec<&str> = orders.iter().map(|order| order.new.idempotency_key.as_str()).collect();
            let expected: Vec<String> = receipts.iter().filter(|key| **key == format!("b{buyer}")).cloned().collect();
            assert_eq!(keys, expected, "buyer {buyer}: one order per 200, none otherwise");
        }
        let report = orders::reconcile::check(ledger, store, &sku).await.expect("reconcile");
        assert!(report.ok(), "the ledger and the order store agree: {report:?}");
        self.service.stop().await;
    }
}
