//! One order service: a consumer per SKU, the sweeper, the HTTP API and the gauges, started
//! together and stopped together. `seckill orders` runs one as a process; `seckill up` and
//! `seckill demo` run one in process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use auth::Authenticator;
use ledger::Ledger;
use protocol::Secret;
use safeguards::{DistributedLock, LockBackend};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::consumer::{pause, Catalogue, ConsumerConfig, SkuConsumer};
use crate::http::{ApiLimits, OrdersApi};
use crate::model::OrderState;
use crate::store::OrderStore;
use crate::sweeper::{Sweeper, SweeperConfig};

/// Opens a ledger handle of its own for one consumer: a blocking stream read holds its
/// connection for the wait, so consumers must not share the one sales and releases use.
pub type FeedLedgers = Arc<dyn Fn() -> Result<Arc<dyn Ledger>, String> + Send + Sync>;

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
    /// Renders the process's metrics for `GET /metrics`.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// Who the buyer is on the order routes (`[auth]`).
    pub authenticator: Authenticator,
    /// The operators' token, which reads any order and any buyer's list.
    pub admin_token: Option<Secret>,
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
            metrics: None,
            authenticator: Authenticator::none(),
            admin_token: None,
        }
    }
}

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
        ledger: Arc<dyn Ledger>,
        feed_ledgers: FeedLedgers,
        store: Arc<dyn OrderStore>,
        lock_backend: Arc<dyn LockBackend>,
        catalogue: Catalogue,
        config: OrderServiceConfig,
    ) -> Result<OrderService, String> {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        for (sku, terms) in catalogue {
            let consumer = SkuConsumer {
                sku,
                terms,
                ledger: feed_ledgers()?,
                store: store.clone(),
                config: config.consumer.clone(),
            };
            tasks.push(tokio::spawn(consumer.run(stopped.clone())));
        }
        if config.sweep {
            let lock = DistributedLock::new(lock_backend).map_err(|e| format!("sweeper lock: {e}"))?;
            let sweeper =
                Sweeper { ledger: ledger.clone(), store: store.clone(), lock, config: config.sweeper.clone() };
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
                metrics: config.metrics.clone(),
                authenticator: config.authenticator.clone(),
                admin: config.admin_token.as_ref().map(Secret::digest),
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

async fn publish_gauges(store: Arc<dyn OrderStore>, mut stop: watch::Receiver<bool>) {
    loop {
        if let Ok(counts) = store.state_counts().await {
            for (sku, state, orders) in counts {
                metrics::gauge!("seckill_orders", "sku" => sku, "state" => state.as_str()).set(orders as f64);
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
        "unknown_order",
        "bad_signature",
    ] {
        metrics::counter!("seckill_orders_payments_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["released", "never_sold"] {
        metrics::counter!("seckill_orders_releases_total", "outcome" => outcome).increment(0);
    }
}
