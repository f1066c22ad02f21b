//! What the order-lifecycle demos (`--scenario orders`, `--scenario payments`) share: a sale
//! started in process with its order service beside the nodes, its buyers in waves, and the
//! waits for the books to settle before they are audited.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ledger::{Ledger, SkuId};
use orders::{OrderService, OrderServiceConfig, OrderStore};
use testkit::load::{self, LoadPlan};

use crate::cluster::{build_ledger, Options, RunningCluster};
use crate::config::Cluster;
use crate::dev::demo::wait_for_allotments;
use crate::dev::scenario::Scenario;

/// The sale to start.
pub struct SaleSpec<'a> {
    pub scenario: Scenario,
    /// Redis at this URL as the ledger, or the embedded one.
    pub redis_url: Option<&'a str>,
    /// PostgreSQL at this URL as the order store, or SQLite in memory.
    pub postgres_url: Option<&'a str>,
    /// Lines added to the SKU's table: its price, currency and pay timeout.
    pub sku_terms: String,
    /// Where the order API listens.
    pub orders_listen: SocketAddr,
    /// Tables appended to the config, after `[orders]`.
    pub extra_toml: String,
}

/// A sale running in process: nodes, a one-member coordinator, the ledger and the order service.
pub struct OrderSale {
    pub run_id: u64,
    pub scenario: Scenario,
    pub sku: String,
    pub sku_id: SkuId,
    pub ledger: Arc<dyn Ledger>,
    pub store: Arc<dyn OrderStore>,
    pub running: RunningCluster,
    pub orders: OrderService,
    /// The order API.
    pub api: SocketAddr,
    data_dir: PathBuf,
}

impl OrderSale {
    /// Starts the sale `spec` describes; `configure` sets what the config cannot say (a demo
    /// signs its own payments, so the secret is the demo's).
    pub async fn start(
        spec: SaleSpec<'_>,
        configure: impl FnOnce(&Cluster, &mut OrderServiceConfig) -> anyhow::Result<()>,
    ) -> anyhow::Result<OrderSale> {
        let scenario = spec.scenario;
        let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) as u64;
        let sku = format!("demo-{}-{run_id}", scenario.name);
        let data_dir = std::env::temp_dir().join(format!("seckill-demo-{}-{run_id}", std::process::id()));
        let ledger_url = spec.redis_url.unwrap_or("embedded");
        let store_url = spec.postgres_url.unwrap_or(orders::store::MEMORY_STORE);
        let coordinator: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let text = scenario.cluster_toml(&sku, ledger_url, coordinator, &data_dir).replacen(
            "qty_max = 1\n",
            &format!("qty_max = 1\n{}", spec.sku_terms),
            1,
        ) + &format!(
            "\n[orders]\nstore = {store_url:?}\nlisten = \"{}\"\nsweep_every_ms = 100\nclaim_idle_ms = 1000\n{}",
            spec.orders_listen, spec.extra_toml
        );
        let cluster = Cluster::parse(&text).with_context(|| format!("{} scenario config", scenario.name))?;
        let ledger = build_ledger(&cluster.ledger).await?;
        let store = crate::order_service::open_store(&cluster).await?;
        let mut service = cluster.orders.service_config()?;
        configure(&cluster, &mut service)?;
        let running = RunningCluster::start(&cluster, ledger.clone(), Options::default()).await?;
        let orders = crate::order_service::start_with(&cluster, ledger.clone(), store.clone(), service).await?;
        let api = orders.addr.context("the order API did not start")?;
        running.wait_ready(Duration::from_secs(10)).await?;
        let sku_id = SkuId::new(&sku)?;
        wait_for_allotments(&running, &sku_id, scenario.stock).await?;
        Ok(OrderSale { run_id, scenario, sku, sku_id, ledger, store, running, orders, api, data_dir })
    }

    /// `purchases` attempts of the scenario's buyers, at `rate` per second or as fast as answers
    /// come.
    pub fn plan(&self, seed: u64, rate: Option<u64>, purchases: u64) -> LoadPlan {
        LoadPlan {
            targets: self.running.addrs(),
            sku: self.sku.clone(),
            purchases,
            users: self.scenario.users,
            concurrency: self.scenario.concurrency,
            retries_max: 5,
            retry_pause: Duration::from_millis(20),
            seed,
            rate_per_s: rate,
            bearer: None,
        }
    }

    /// Units that came back late (a payment that lost its race with the expiry, a payment
    /// declined) are bought by one more short wave of `rate` attempts each, until nothing is
    /// left to sell and no order is open, or `within` has passed.
    pub async fn sell_the_rest(&self, within: Duration, rate: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let mut wave = 0;
        while Instant::now() < deadline {
            let remaining = self.ledger.status(&self.sku_id).await?.remaining;
            let open = self.store.counts(&self.sku).await?.units_pending;
            if remaining == 0 && open == 0 {
                break;
            }
            if remaining > 0 {
                wave += 1;
                let seed = self.run_id ^ (0x5eed + wave);
                load::run(self.plan(seed, Some(rate), rate)).await?;
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Waits until the order service has stored every order and given back every unit of an
    /// ended order.
    pub async fn wait_settled(&self, within: Duration) -> anyhow::Result<()> {
        wait_until("every order is stored and every expired unit given back", within, || async {
            let status = self.ledger.status(&self.sku_id).await?;
            let counts = self.store.counts(&self.sku).await?;
            Ok(counts.max_stream_seq >= status.orders && counts.orders_unreleased == 0)
        })
        .await
    }

    pub async fn stop(self) {
        self.orders.stop().await;
        self.running.stop().await;
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Waits for the first release, then for the first sale after it; the time between.
pub async fn watch_resale(ledger: &dyn Ledger, sku: &SkuId, sold_before: u64) -> anyhow::Result<Option<f64>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let released_at = loop {
        if ledger.status(sku).await?.released > 0 {
            break Instant::now();
        }
        anyhow::ensure!(Instant::now() < deadline, "no unit came back within 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    while Instant::now() < deadline {
        if ledger.status(sku).await?.orders > sold_before {
            return Ok(Some(released_at.elapsed().as_secs_f64() * 1e3));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(None)
}

pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + within;
    while !done().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out after {within:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
