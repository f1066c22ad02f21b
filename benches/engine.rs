//! Micro-benchmarks of the allotment path: the CAS every purchase races on, the batch confirm
//! script on a real Redis (a private `redis-server` this bench starts), and the purchase
//! pipeline without the network. `cargo bench`; the HTTP-level comparison is `seckill bench`.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ledger::{
    EmbeddedLedger, IdempotencyKey, Ledger, NodeId, Purchase, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms,
    UserId,
};
use node::{LocalStock, Node, NodeConfig, NodeOptions, PurchaseRequest, Shutdown, SkuConfig};
use testkit::redis::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// The allotment counter: one thread, and two threads contending for the same cache line.
fn local_stock(c: &mut Criterion) {
    let mut group = c.benchmark_group("local_stock_take");
    group.throughput(Throughput::Elements(1));
    let stock = LocalStock::new(u64::MAX / 2);
    group.bench_function("1 thread", |b| {
        b.iter(|| {
            assert!(stock.take(1));
            stock.give_back(1);
        })
    });
    group.bench_function("2 threads", |b| {
        b.iter_custom(|iters| {
            let stock = Arc::new(LocalStock::new(u64::MAX / 2));
            let started = Instant::now();
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    let stock = stock.clone();
                    scope.spawn(move || {
                        for _ in 0..iters {
                            assert!(stock.take(1));
                            stock.give_back(1);
                        }
                    });
                }
            });
            // Two threads did `iters` each: report time per operation.
            started.elapsed() / 2
        })
    });
    group.finish();
}

/// The confirm script on a real Redis at batch sizes 1, 8 and 64.
fn confirm_batch(c: &mut Criterion) {
    let redis = RedisServer::start_with("everysec").expect("a private redis-server (scripts/test installs it)");
    let rt = runtime();
    // The Redis connection manager spawns onto the runtime it is built in.
    let _entered = rt.enter();
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("ledger"));
    let sku = SkuId::new("bench").expect("id");
    rt.block_on(ledger.create_sku(&sku, &SkuTerms::new(1_000_000_000_000))).expect("sku");
    let seller = Seller::new(NodeId::new("bench").expect("id"), 1);
    let next = AtomicU64::new(0);
    let mut group = c.benchmark_group("confirm_batch_redis");
    group.measurement_time(Duration::from_secs(4));
    for size in [1u64, 8, 64] {
        group.throughput(Throughput::Elements(size));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt).iter(|| {
                let first = next.fetch_add(size, Ordering::Relaxed);
                let purchases: Vec<Purchase> = (first..first + size)
                    .map(|n| Purchase {
                        key: IdempotencyKey::new(&format!("k{n}")).expect("key"),
                        user: UserId::new(&format!("u{n}")).expect("user"),
                        qty: 1,
                        token: None,
                        order_id: None,
                    })
                    .collect();
                let (ledger, sku, seller) = (ledger.clone(), sku.clone(), seller.clone());
                async move { ledger.confirm(&sku, &seller, &purchases).await.expect("confirm") }
            })
        });
    }
    group.finish();
}

/// `Node::purchase` without HTTP on the embedded ledger: the sold-out path (the bulk of a burst)
/// and the winning path (CAS, confirmer queue, ledger, reply).
fn purchase_pipeline(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("purchase_pipeline");
    group.throughput(Throughput::Elements(1));
    for (name, total) in [("sold_out", 1u64), ("local_win", 1_000_000_000_000)] {
        let node = rt.block_on(async {
            let ledger: Arc<dyn Ledger> = Arc::new(EmbeddedLedger::default());
            let (sku, terms) = (SkuId::new(name).expect("id"), SkuTerms::new(total));
            ledger.create_sku(&sku, &terms).await.expect("sku");
            let sku = SkuConfig::new(sku, terms, total);
            let config = NodeConfig::new(NodeId::new("bench").expect("id"));
            let node = Node::start(config, vec![sku], ledger, NodeOptions::default(), Shutdown::new());
            if total == 1 {
                let (user, key) = ids(0);
                node.purchase(request(name, &user, &key)).await;
            }
            node
        });
        let next = AtomicU64::new(1);
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| {
                let (user, key) = ids(next.fetch_add(1, Ordering::Relaxed));
                let node = node.clone();
                async move { node.purchase(request(name, &user, &key)).await }
            })
        });
    }
    group.finish();
}

/// A fresh user and key per purchase, as a burst of distinct buyers has.
fn ids(n: u64) -> (String, String) {
    (format!("u{n}"), format!("k{n}"))
}

fn request<'a>(sku: &'a str, user: &'a str, key: &'a str) -> PurchaseRequest<'a> {
    PurchaseRequest {
        sku,
        user,
        qty: 1,
        key,
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        token: None,
        ticket: None,
        trace: telemetry::untraced(),
    }
}

criterion_group!(benches, local_stock, confirm_batch, purchase_pipeline);
criterion_main!(benches);
