//! The order service as a process (`seckill orders`) on a private Redis and PostgreSQL, killed
//! with SIGKILL mid-stream: every sale must still become exactly one order.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{IdempotencyKey, Ledger, Purchase, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms, UserId};
use testkit::postgres::PostgresServer;
use testkit::redis::RedisServer;

use crate::SERIAL;

const SKU_ID: &str = "tv";
const SALES: u64 = 3_000;

fn config(redis: &RedisServer, postgres: &PostgresServer, consumer: &str) -> String {
    format!(
        "[ledger]\nurl = \"{}\"\n\n[orders]\nstore = \"{}\"\nconsumer = \"{consumer}\"\nclaim_idle_ms = 500\nbatch = 200\n\n\
         [[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[skus]]\nid = \"{SKU_ID}\"\ntotal = {SALES}\nprice = 500\npay_timeout_s = 600\n",
        redis.url(),
        postgres.url()
    )
}

fn spawn_orders(config: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["orders", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("seckill orders starts")
}

fn sigkill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sells `SALES` units, one per buyer, in batches of 20, pausing a little between batches so
/// the consumers have something to be killed in the middle of.
async fn sell(ledger: Arc<dyn Ledger>, sku: SkuId) {
    let seller = Seller::new(ledger::NodeId::new("n1").unwrap(), 0);
    for batch in 0..SALES / 20 {
        let purchases: Vec<Purchase> = (0..20)
            .map(|i| {
                let n = batch * 20 + i;
                Purchase {
                    key: IdempotencyKey::new(&format!("k{n}")).unwrap(),
                    user: UserId::new(&format!("u{n}")).unwrap(),
                    qty: 1,
                    token: None,
                    order_id: None,
                }
            })
            .collect();
        ledger.confirm(&sku, &seller, &purchases).await.expect("confirm");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// Goal: a consumer killed mid-stream loses no order and duplicates none. Method: 3,000 sales
/// while `seckill orders` is SIGKILLed twice and restarted (same consumer name), and a second
/// service under another name is SIGKILLed for good: the survivors claim its pending entries.
/// Every stream entry must end as exactly one order, and reconciliation must be clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_order_consumer_loses_and_duplicates_nothing() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().expect("a private redis-server");
    let postgres = PostgresServer::start().expect("a private PostgreSQL (scripts/test installs it)");
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("orders-a.toml"), dir.path().join("orders-b.toml"));
    std::fs::write(&first, config(&redis, &postgres, "orders-a")).unwrap();
    std::fs::write(&second, config(&redis, &postgres, "orders-b")).unwrap();
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).unwrap());
    let sku = SkuId::new(SKU_ID).unwrap();
    // The terms the config gives: the ledger's are what each order event carries.
    let terms = SkuTerms { price: 500, pay_timeout_s: 600, ..SkuTerms::new(SALES) };
    ledger.create_sku(&sku, &terms).await.unwrap();

    let mut a = spawn_orders(&first);
    let mut b = Some(spawn_orders(&second));
    let selling = tokio::spawn(sell(ledger.clone(), sku.clone()));
    let sold =
        |ledger: Arc<dyn Ledger>, sku: SkuId| async move { ledger.status(&sku).await.map(|s| s.sold).unwrap_or(0) };
    for (round, at) in [(1, SALES / 4), (2, SALES / 2)] {
        while sold(ledger.clone(), sku.clone()).await < at {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sigkill(&mut a);
        if let Some(mut other) = b.take().filter(|_| round == 1) {
            // The other service dies for good: its pending entries must be claimed.
            sigkill(&mut other);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        a = spawn_orders(&first);
    }
    selling.await.unwrap();

    let store = orders::store::open(&postgres.url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.counts(SKU_ID).await.unwrap().orders < SALES {
        assert!(Instant::now() < deadline, "orders stored: {:?}", store.counts(SKU_ID).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sigkill(&mut a);
    let counts = store.counts(SKU_ID).await.unwrap();
    assert_eq!(counts.orders, SALES, "every sale is exactly one order");
    let seqs = store.stored_seqs(SKU_ID, 1, SALES).await.unwrap();
    assert_eq!(seqs, (1..=SALES).collect::<Vec<_>>(), "each stream entry once");
    assert_eq!(counts.units_pending, SALES);
    let order = store.get(&format!("{SKU_ID}-1")).await.unwrap().expect("the first sale's order");
    assert_eq!((order.new.user.as_str(), order.new.unit_price, order.new.qty), ("u0", 500, 1));
    let report = orders::reconcile::check(&*ledger, &*store, &sku).await.unwrap();
    assert!(report.ok(), "{report:?}");
    assert!(store.dead_letters(10).await.unwrap().is_empty(), "a crash is not a poison entry");
}

/// Goal: an order service that listens for payment callbacks refuses to start without the
/// payment secret, naming it (issue 23: it only warned, then refused every callback, and the
/// provider gave up on payments buyers had made).
#[test]
fn a_listening_order_service_without_the_payment_secret_refuses_to_start() {
    let redis = RedisServer::start().expect("a private redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cluster.toml");
    let port = testkit::redis::free_port().expect("a free port");
    std::fs::write(
        &config,
        format!(
            "[ledger]\nurl = \"{}\"\n\n[orders]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [[nodes]]\nid = \"n1\"\nlisten = \"127.0.0.1:0\"\n\n[[skus]]\nid = \"{SKU_ID}\"\ntotal = 5\n",
            redis.url()
        ),
    )
    .expect("config");
    let run = |secret: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
        command.args(["orders", "--config"]).arg(&config).env_remove("SECKILL_PAYMENT_SECRET");
        if let Some(secret) = secret {
            command.env("SECKILL_PAYMENT_SECRET", secret);
        }
        command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("seckill orders")
    };
    let refused = run(None).wait_with_output().expect("seckill orders exits");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "it must not start: {stderr}");
    assert!(stderr.contains("SECKILL_PAYMENT_SECRET") && stderr.contains("[orders] listen"), "{stderr}");
    // With the secret it starts and listens.
    let mut started = run(Some("a-payment-secret-of-some-length"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the order service did not listen with the secret set");
        assert!(started.try_wait().expect("try_wait").is_none(), "it exited with the secret set");
        std::thread::sleep(Duration::from_millis(100));
    }
    sigkill(&mut started);
}
