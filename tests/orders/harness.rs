//! What every order-service test shares: a private Redis and PostgreSQL per test, sales made
//! straight on the Redis ledger, consumers run as tasks, and polling with a deadline.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{
    Decision, IdempotencyKey, Ledger, NodeId, Purchase, RedisLedger, RedisLedgerConfig, Seller, SkuId, SkuTerms,
    UserId, Verdict,
};
use orders::consumer::{ConsumerConfig, SkuConsumer};
use orders::{OrderStore, Payment, PaymentOutcome};
use testkit::postgres::PostgresServer;
use testkit::redis::RedisServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The order group every consumer of these tests joins.
pub const GROUP: &str = "orders";

/// The ledger's key prefix ([`RedisLedgerConfig::new`]'s default).
pub const PREFIX: &str = "seckill";

/// How long a backlog of a few hundred orders may take to land in the store.
pub const SETTLE: Duration = Duration::from_secs(10);

pub struct Env {
    pub redis: RedisServer,
    pub postgres: PostgresServer,
    /// The handle sales, releases and checks go through.
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
}

impl Env {
    pub async fn start() -> Env {
        let redis = RedisServer::start().expect("a private redis-server (scripts/test installs it)");
        let postgres = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .expect("postgres start task")
            .expect("a private PostgreSQL (scripts/test installs it)");
        let store = orders::store::open(&postgres.url()).await.expect("the order store on PostgreSQL");
        let ledger = redis_ledger(&redis);
        Env { redis, postgres, ledger, store }
    }

    /// A ledger handle of its own: a consumer's blocking read holds its connection.
    pub fn feed_ledger(&self) -> Arc<dyn Ledger> {
        redis_ledger(&self.redis)
    }

    /// Creates `sku` with `terms`.
    pub async fn create(&self, sku: &str, terms: &SkuTerms) -> SkuId {
        let sku = SkuId::new(sku).expect("sku id");
        self.ledger.create_sku(&sku, terms).await.expect("create sku");
        sku
    }

    /// Runs one consumer of `sku` as a task.
    pub fn consumer(&self, sku: &SkuId, terms: &SkuTerms, name: &str, config: ConsumerConfig) -> Running {
        let consumer = SkuConsumer {
            sku: sku.clone(),
            terms: terms.clone(),
            ledger: self.feed_ledger(),
            store: self.store.clone(),
            config: ConsumerConfig { consumer: name.into(), ..config },
        };
        Running::spawn(|stop| consumer.run(stop))
    }
}

pub fn redis_ledger(redis: &RedisServer) -> Arc<dyn Ledger> {
    Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis.url())).expect("a Redis ledger"))
}

/// Consumer settings fast enough for tests: claims after 300 ms, dead letters after 2 deliveries.
pub fn fast_consumer() -> ConsumerConfig {
    ConsumerConfig {
        group: GROUP.into(),
        consumer: "orders-1".into(),
        batch: 100,
        block: Duration::from_millis(100),
        claim_idle: Duration::from_millis(300),
        max_deliveries: 2,
        trim_retain: 100_000,
        trim_every: Duration::from_millis(200),
    }
}

pub fn terms(total: u64, price: u64, pay_timeout_s: u64) -> SkuTerms {
    SkuTerms { price, pay_timeout_s, ..SkuTerms::new(total) }
}

/// A task stopped through its watch channel.
pub struct Running {
    stop: watch::Sender<bool>,
    pub task: JoinHandle<()>,
}

impl Running {
    pub fn spawn<F, Fut>(run: F) -> Running
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        Running { stop, task: tokio::spawn(run(stopped)) }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the task stops within 10 s")
            .expect("the task did not panic");
    }
}

/// One confirmed sale, as the test made it.
#[derive(Clone, Debug)]
pub struct Sale {
    pub order_id: String,
    pub user: String,
    pub key: String,
    pub qty: u32,
}

/// Sells one unit to each of `count` new users `<tag>-<i>`, in batches, and returns the sales
/// the ledger confirmed (fewer once sold out).
pub async fn sell(ledger: &dyn Ledger, sku: &SkuId, tag: &str, count: usize) -> Vec<Sale> {
    let seller = Seller::new(NodeId::new("n1").expect("node id"), 1);
    let mut sales = Vec::new();
    let purchases: Vec<Purchase> = (0..count)
        .map(|at| Purchase {
            key: IdempotencyKey::new(&format!("{tag}-k{at}")).expect("key"),
            user: UserId::new(&format!("{tag}-u{at}")).expect("user"),
            qty: 1,
            token: None,
            order_id: None,
        })
        .collect();
    for batch in purchases.chunks(50) {
        let outcome = ledger.confirm(sku, &seller, batch).await.expect("confirm");
        for (purchase, verdict) in batch.iter().zip(outcome.verdicts) {
            if let Verdict::Fresh(Decision::Purchased(receipt)) = verdict {
                sales.push(Sale {
                    order_id: receipt.order_id.0.clone(),
                    user: purchase.user.to_string(),
                    key: purchase.key.to_string(),
                    qty: receipt.qty,
                });
            }
        }
    }
    sales
}

/// Polls `check` every 50 ms until it passes; panics with its last complaint after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let complaint = match check().await {
            Ok(()) => return,
            Err(complaint) => complaint,
        };
        assert!(Instant::now() < deadline, "{what}: not within {within:?}: {complaint}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every sale is an order, then checks each against the ledger's own event: one
/// order per sale, none extra, with the event's seq, user, key, node and qty and the terms' price.
pub async fn assert_one_order_per_sale(env: &Env, sku: &SkuId, terms: &SkuTerms, sales: &[Sale]) {
    let store = env.store.clone();
    let expected = sales.len() as u64;
    eventually(SETTLE, "every sale becomes an order", || {
        let store = store.clone();
        let sku = sku.clone();
        async move {
            let counts = store.counts(sku.as_str()).await.map_err(|e| e.to_string())?;
            match counts.orders {
                n if n >= expected => Ok(()),
                n => Err(format!("{n} of {expected} orders stored")),
            }
        }
    })
    .await;
    let events = env.ledger.orders(sku, 0, 100_000).await.expect("order events");
    let sold: BTreeSet<&str> = sales.iter().map(|sale| sale.order_id.as_str()).collect();
    let counts = env.store.counts(sku.as_str()).await.expect("counts");
    assert_eq!(counts.orders, expected, "exactly one order per sale, none extra");
    let mut seen = 0;
    for event in events.iter().filter(|event| sold.contains(event.order_id.0.as_str())) {
        seen += 1;
        let order = env.store.get(&event.order_id.0).await.expect("get").expect("the sale's order");
        let new = &order.new;
        assert_eq!(new.stream_seq, event.seq, "{}", event.order_id);
        assert_eq!(new.sku, sku.as_str());
        assert_eq!(new.user, event.user.to_string());
        assert_eq!(new.idempotency_key, event.key.to_string());
        assert_eq!(new.node, event.node.to_string());
        assert_eq!(new.qty, event.qty);
        assert_eq!(new.unit_price, terms.price);
        assert_eq!(new.currency, terms.currency);
        assert!(new.pay_deadline_ms >= new.created_at_ms + terms.pay_timeout_s * 1000);
    }
    assert_eq!(seen, sales.len(), "every sale has its event in the stream");
    for sale in sales {
        let order = env.store.get(&sale.order_id).await.expect("get").expect("the sale's order");
        assert_eq!((order.new.user.as_str(), order.new.qty), (sale.user.as_str(), sale.qty));
        assert_eq!(order.new.idempotency_key, sale.key);
    }
}

/// Pays `order_id` in full with reference `reference`.
pub async fn pay(store: &dyn OrderStore, order_id: &str, reference: &str) -> PaymentOutcome {
    let order = store.get(order_id).await.expect("get").expect("the order to pay");
    let payment = Payment {
        order_id: order_id.into(),
        reference: reference.into(),
        amount: order.new.amount(),
        currency: order.new.currency.clone(),
        received_at_ms: orders::unix_ms(),
        source: orders::PaymentSource::Callback,
    };
    store.record_payment(&payment).await.expect("record payment")
}

/// `reconcile::check`, asserted clean.
pub async fn assert_reconciled(env: &Env, sku: &SkuId) -> orders::reconcile::SkuReport {
    let report = orders::reconcile::check(&*env.ledger, &*env.store, sku).await.expect("reconcile check");
    assert!(report.ok(), "reconcile:\n{}", orders::reconcile::table(std::slice::from_ref(&report)));
    report
}

/// A whole order service (consumers, sweeper, API on a free loopback port) for `sku` on `env`,
/// with `config` (its consumer and catalogue are set here, and its listen address unless
/// `config` names one).
pub async fn start_service(
    env: &Env,
    sku: &SkuId,
    terms: &SkuTerms,
    config: orders::OrderServiceConfig,
) -> (orders::OrderService, std::net::SocketAddr) {
    let url = env.redis.url();
    let feed_ledgers: orders::service::FeedLedgers = Arc::new(move || {
        let ledger = RedisLedger::connect(RedisLedgerConfig::new(url.clone())).map_err(|e| e.to_string())?;
        Ok(Arc::new(ledger) as Arc<dyn Ledger>)
    });
    let listen = config.listen.or(Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))));
    let config = orders::OrderServiceConfig { consumer: fast_consumer(), listen, ..config };
    let catalogue =
        orders::service::CatalogueFeed::Fixed(std::collections::BTreeMap::from([(sku.clone(), terms.clone())]));
    let service = orders::OrderService::start(
        env.ledger.clone(),
        feed_ledgers,
        env.store.clone(),
        Arc::new(safeguards::LocalLockBackend::new()),
        catalogue,
        config,
    )
    .await
    .expect("the order service starts");
    let addr = service.addr.expect("the API listens");
    (service, addr)
}
