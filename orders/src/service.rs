//! One order service: a consumer per SKU, the sweeper, the HTTP API and the gauges, started
//! together and stopped together. `seckill orders` runs one as a process; `seckill up` and
//! `seckill demo` run one in process.
//!
//! The SKUs it consumes come from one catalogue ([`CatalogueFeed`]): with a coordinator, the
//! raft catalogue, read every second, so a SKU created at run time gets its consumer within
//! about a second, as nodes get it by heartbeat; without one, the config's `[[skus]]`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use auth::Authenticator;
use ledger::OrderFeed;
use protocol::{CoordinatorClient, Secret};
use safeguards::{DistributedLock, LockBackend};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::consumer::{pause, Catalogue, ConsumerConfig, SkuConsumer};
use crate::http::{ApiLimits, OrdersApi};
use crate::model::OrderState;
use crate::payments::Payments;
use crate::store::OrderStore;
use crate::sweeper::{Sweeper, SweeperConfig};
use ledger::SkuId;

/// Opens a ledger handle of its own for one consumer: a blocking stream read holds its
/// connection for the wait, so consumers must not share the one sales and releases use.
pub type FeedLedgers = Arc<dyn Fn() -> Result<Arc<dyn OrderFeed>, String> + Send + Sync>;

#[derive(Clone)]
pub struct OrderServiceConfig {
    pub consumer: ConsumerConfig,
    pub sweeper: SweeperConfig,
    /// Runs the sweeper here. Every service may: the lock lets one sweep at a time.
    pub sweep: bool,
    /// Where the HTTP API listens; `None`: no API (an embedded run reads the store directly).
    pub listen: Option<SocketAddr>,
    /// What clients can make the HTTP API hold: connections in all and per address, the write
    /// timeout.
    pub http: ApiLimits,
    pub payment_secret: Arc<[u8]>,
    /// How far a payment callback's signed time may be from this server's clock, in seconds.
    pub callback_window_s: u64,
    /// Renders the process's metrics for `GET /metrics`.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// Who the buyer is on the order routes (`[auth]`).
    pub authenticator: Authenticator,
    /// The operators' token, which reads any order and any buyer's list.
    pub admin_token: Option<Secret>,
    /// The payment provider: the pay route and the query and refund jobs. `None`: payments are
    /// only notified (the callback route), as by a provider whose checkout is elsewhere.
    pub payments: Option<Payments>,
}

impl Default for OrderServiceConfig {
    fn default() -> Self {
        Self {
            consumer: ConsumerConfig::default(),
            sweeper: SweeperConfig::default(),
            sweep: true,
            listen: None,
            http: ApiLimits::default(),
            payment_secret: Arc::from(&b""[..]),
            callback_window_s: crate::signature::TOLERANCE_S,
            metrics: None,
            authenticator: Authenticator::none(),
            admin_token: None,
            payments: None,
        }
    }
}

/// Where a service learns which SKUs to consume.
#[derive(Clone)]
pub enum CatalogueFeed {
    /// A fixed set: the config's `[[skus]]` when there is no coordinator.
    Fixed(Catalogue),
    /// The coordinator's raft catalogue, read every `every` (any member answers).
    Coordinator { client: Arc<CoordinatorClient>, every: Duration },
}

/// How often a service following the coordinator reads its catalogue.
pub const CATALOGUE_EVERY: Duration = Duration::from_secs(1);

/// How often the orders-by-state gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(2);

pub struct OrderService {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Where the HTTP API listens, if it does.
    pub addr: Option<SocketAddr>,
}

impl OrderService {
    pub async fn start(
        ledger: Arc<dyn OrderFeed>,
        feed_ledgers: FeedLedgers,
        store: Arc<dyn OrderStore>,
        lock_backend: Arc<dyn LockBackend>,
        catalogue: CatalogueFeed,
        config: OrderServiceConfig,
    ) -> Result<OrderService, String> {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut consumers = Consumers {
            feed_ledgers,
            store: store.clone(),
            config: config.consumer.clone(),
            stop: stopped.clone(),
            running: BTreeMap::new(),
        };
        match catalogue {
            CatalogueFeed::Fixed(skus) => {
                consumers.follow(skus)?;
                tasks.push(tokio::spawn(consumers.wait()));
            }
            CatalogueFeed::Coordinator { client, every } => {
                tasks.push(tokio::spawn(consumers.follow_coordinator(client, every)));
            }
        }
        if config.sweep {
            let lock = DistributedLock::new(lock_backend).map_err(|e| format!("sweeper lock: {e}"))?;
            let sweeper = Sweeper::new(ledger.clone(), store.clone(), lock, config.sweeper.clone())
                .with_payments(config.payments.clone());
            tasks.push(tokio::spawn(sweeper.run(stopped.clone())));
        }
        tasks.push(tokio::spawn(publish_gauges(store.clone(), stopped.clone())));
        let mut addr = None;
        if let Some(listen) = config.listen {
            let listener = TcpListener::bind(listen)
                .await
                .map_err(|e| format!("[orders] listen = \"{listen}\": cannot bind: {e}"))?;
            addr = listener.local_addr().ok();
            let api = OrdersApi {
                store,
                payment_secret: config.payment_secret.clone(),
                callback_window_s: config.callback_window_s,
                metrics: config.metrics.clone(),
                authenticator: config.authenticator.clone(),
                admin: config.admin_token.as_ref().map(Secret::digest),
                payments: config.payments.clone(),
            };
            tasks.push(tokio::spawn(crate::http::serve(api, listener, config.http.clone(), stopped)));
        }
        Ok(OrderService { stop, tasks, addr })
    }

    /// Stops every task and waits for them (the HTTP API drains open requests first).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// The consumers of one service, one per SKU of the catalogue it follows.
struct Consumers {
    feed_ledgers: FeedLedgers,
    store: Arc<dyn OrderStore>,
    config: ConsumerConfig,
    stop: watch::Receiver<bool>,
    running: BTreeMap<SkuId, JoinHandle<()>>,
}

impl Consumers {
    /// Starts a consumer for every SKU of `catalogue` that has none. A SKU leaves no consumer
    /// behind it: a closed sale's orders still need storing, so its consumer keeps reading.
    fn follow(&mut self, catalogue: Catalogue) -> Result<(), String> {
        for (sku, terms) in catalogue {
            if self.running.contains_key(&sku) {
                continue;
            }
            let consumer = SkuConsumer {
                sku: sku.clone(),
                terms,
                ledger: (self.feed_ledgers)()?,
                store: self.store.clone(),
                config: self.config.clone(),
            };
            tracing::info!(%sku, "consuming the SKU's order stream");
            self.running.insert(sku, tokio::spawn(consumer.run(self.stop.clone())));
        }
        Ok(())
    }

    async fn follow_coordinator(mut self, client: Arc<CoordinatorClient>, every: Duration) {
        let mut stop = self.stop.clone();
        loop {
            let answer = tokio::select! {
                answer = client.catalogue() => answer,
                () = crate::consumer::stopped(&mut stop) => break,
            };
            match answer {
                Ok(answer) => {
                    if let Err(e) = self.follow(answer.skus) {
                        tracing::warn!("a consumer could not start ({e}); tried again next read");
                    }
                }
                Err(e) => tracing::warn!("the coordinator's catalogue could not be read ({e}); tried again"),
            }
            if !pause(every, &mut stop).await {
                break;
            }
        }
        self.wait().await;
    }

    /// Waits for every consumer (they end when the service stops).
    async fn wait(self) {
        for (_, task) in self.running {
            let _ = task.await;
        }
    }
}

async fn publish_gauges(store: Arc<dyn OrderStore>, mut stop: watch::Receiver<bool>) {
    loop {
        if let Ok(counts) = store.state_counts().await {
            let skus: std::collections::BTreeSet<String> = counts.iter().map(|(sku, _, _)| sku.clone()).collect();
            for (sku, state, orders) in counts {
                metrics::gauge!("seckill_orders", "sku" => sku, "state" => state.as_str()).set(orders as f64);
            }
            // Units the ledger refused to take back stay until an operator acts, and refunds not
            // yet acknowledged until the provider pays them back: levels, not rates.
            for sku in skus {
                if let Ok(sku_counts) = store.counts(&sku).await {
                    metrics::gauge!("seckill_orders_release_refused_units", "sku" => sku.clone())
                        .set(sku_counts.units_release_refused as f64);
                }
                if let Ok(money) = store.money_counts(&sku).await {
                    metrics::gauge!("seckill_orders_refunds", "sku" => sku.clone(), "state" => "owed")
                        .set(money.refunds_owed as f64);
                    metrics::gauge!("seckill_orders_refunds", "sku" => sku, "state" => "pending")
                        .set(money.refunds_pending as f64);
                }
            }
        }
        if !pause(GAUGES_EVERY, &mut stop).await {
            return;
        }
    }
}

/// Registers the counters so they render as 0 before the first event.
pub fn register_metrics() {
    for to in [OrderState::Paid, OrderState::Expired, OrderState::Cancelled, OrderState::PaidAfterExpiry] {
        metrics::counter!("seckill_orders_transitions_total", "to" => to.as_str()).increment(0);
    }
    for outcome in [
        "paid",
        "paid_after_expiry",
        "duplicate",
        "already_paid",
        "mismatch",
        "reference_reused",
        "awaiting_order",
        "bad_signature",
    ] {
        metrics::counter!("seckill_orders_payments_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("seckill_orders_refunds_owed_total").increment(0);
    for outcome in ["paid", "already_paid", "mismatch"] {
        metrics::counter!("seckill_orders_early_payments_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["released", "never_sold", "failed"] {
        metrics::counter!("seckill_orders_releases_total", "outcome" => outcome).increment(0);
    }
    crate::payments::register_metrics();
}
