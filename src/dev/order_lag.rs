//! Measures the order pipeline during a sale (`seckill bench orders`): the order service runs
//! beside the nodes, and a sampler reads, every few milliseconds, how many order events the
//! ledger has appended and how many orders the store holds. From the two curves: orders stored
//! per second, the backlog at its largest, and for each sale the time from its event to its
//! order being readable (what `GET /v1/orders/{id}` would see), to the sampling period. With
//! payments on, the service also serves its order API and a pool of buyers pays each order
//! through the signed callback route as soon as it is readable, so payments and the burst meet
//! in the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::{Ledger, SkuId};
use orders::{OrderService, OrderStore};
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::config::Cluster;
use crate::dev::payers::{SalePayers, Visible};

/// Sampling period: the resolution of every latency below.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// Longest wait for the order service's consumer to start.
const CONSUMER_START_MAX: Duration = Duration::from_secs(10);

/// Longest wait, after the buyers are done, for the store to hold every order.
const DRAIN_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    pub store: String,
    pub orders: u64,
    /// Orders stored per second, from the first stored to the last.
    pub orders_per_s: f64,
    /// Sales per second the ledger confirmed, from the first to the last.
    pub sales_per_s: f64,
    /// The largest number of events not yet in the store at one sample.
    pub max_backlog: u64,
    /// From a sale's event to its order in the store, over every sale (sampling resolution).
    pub visible_p50_ms: f64,
    pub visible_p99_ms: f64,
    pub visible_max_ms: f64,
    /// What the payers did, when payments were on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payments: Option<crate::dev::payers::SalePayments>,
}

/// The order service and its sampler, running.
pub struct Watched {
    service: OrderService,
    sampler: JoinHandle<Vec<(Duration, u64, u64)>>,
    payers: Option<SalePayers>,
    stop: tokio::sync::watch::Sender<bool>,
    store: Arc<dyn OrderStore>,
    ledger: Arc<dyn Ledger>,
    sku: SkuId,
    kind: String,
}

impl Watched {
    /// `pay`: buyers pay every order as soon as it is readable ([`SalePayers`]).
    pub async fn start(cluster: &Cluster, ledger: Arc<dyn Ledger>, sku: &str, pay: bool) -> anyhow::Result<Watched> {
        let store = crate::order_service::open_store(cluster).await?;
        let service = if pay {
            let mut config = cluster.orders.service_config()?;
            config.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            config.payment_secret = Arc::from(crate::dev::payers::PAYMENT_SECRET);
            crate::order_service::start_with(cluster, ledger.clone(), store.clone(), config).await?
        } else {
            crate::order_service::start(cluster, ledger.clone(), store.clone()).await?
        };
        let (payers, visible) = match (pay, service.addr) {
            (false, _) => (None, None),
            (true, Some(addr)) => {
                let price = cluster.skus.iter().find(|s| s.id.as_str() == sku).map_or(0, |s| s.terms.price);
                let visible = Arc::new(Visible::default());
                (Some(SalePayers::start(addr, price, visible.clone())), Some(visible))
            }
            (true, None) => anyhow::bail!("the order service did not listen"),
        };
        let sku = SkuId::new(sku)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let sampler = tokio::spawn(sample(ledger.clone(), store.clone(), sku.clone(), visible, stopped));
        let kind = if cluster.orders.store.starts_with("postgres") { "postgresql" } else { "sqlite" };
        Ok(Watched { service, sampler, payers, stop, store, ledger, sku, kind: kind.into() })
    }

    /// Waits until the service's consumer for the SKU runs (it registers its lag gauge first).
    /// With a coordinator, the service learns the SKU from the catalogue it reads every second,
    /// starting before the coordinator answers: a sale started sooner would count up to that
    /// second as every early order's lag, which is start-up, not the pipeline keeping up.
    pub async fn wait_consuming(&self) -> anyhow::Result<()> {
        let series = format!("seckill_orders_lag_entries{{sku=\"{}\"}}", self.sku);
        let deadline = Instant::now() + CONSUMER_START_MAX;
        while !node::prometheus().is_some_and(|handle| handle.render().contains(&series)) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the order service's consumer did not start within {CONSUMER_START_MAX:?}"
            );
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        Ok(())
    }

    /// Waits for the store to catch up, stops everything and computes the report.
    pub async fn finish(self) -> anyhow::Result<PipelineReport> {
        let sold = self.ledger.status(&self.sku).await?.orders;
        let deadline = Instant::now() + DRAIN_MAX;
        while self.store.counts(self.sku.as_str()).await?.orders < sold {
            anyhow::ensure!(Instant::now() < deadline, "the order store did not catch up within {DRAIN_MAX:?}");
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        tokio::time::sleep(SAMPLE_EVERY * 2).await;
        // The sampler keeps showing the payers what the store holds until they are done.
        let payments = match self.payers {
            Some(payers) => Some(payers.finish(sold).await?),
            None => None,
        };
        let _ = self.stop.send(true);
        let samples = self.sampler.await.context("the sampler")?;
        self.service.stop().await;
        Ok(PipelineReport { payments, ..report(&self.kind, &samples) })
    }
}

async fn sample(
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    sku: SkuId,
    visible: Option<Arc<Visible>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(Duration, u64, u64)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    while !*stop.borrow() {
        let appended = ledger.status(&sku).await.map(|s| s.orders).unwrap_or(0);
        let stored = store.counts(sku.as_str()).await.map(|c| c.orders).unwrap_or(0);
        if let Some(visible) = &visible {
            // The nodes mint order ids: the payers learn them from the order stream, which
            // only the paying run reads here, so the run without pays nothing for it.
            if let Ok(events) = ledger.orders(&sku, visible.known(), ledger::ORDER_EVENTS_MAX).await {
                visible.learn(events.into_iter().map(|event| (event.seq, event.order_id.to_string())));
            }
            visible.set(stored);
        }
        samples.push((started.elapsed(), appended, stored));
        tokio::select! {
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    samples
}

/// The first time at which `count` reached each value `1..=total`.
fn reached(samples: &[(Duration, u64)], total: u64) -> Vec<Duration> {
    let mut times = Vec::with_capacity(total as usize);
    for (at, count) in samples {
        while (times.len() as u64) < (*count).min(total) {
            times.push(*at);
        }
    }
    times
}

fn report(kind: &str, samples: &[(Duration, u64, u64)]) -> PipelineReport {
    let total = samples.last().map_or(0, |s| s.1.min(s.2));
    let sold = reached(&samples.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(), total);
    let stored = reached(&samples.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(), total);
    let mut visible: Vec<f64> =
        sold.iter().zip(&stored).map(|(sold, stored)| stored.saturating_sub(*sold).as_secs_f64() * 1e3).collect();
    visible.sort_by(f64::total_cmp);
    let quantile =
        |q: f64| visible.get(((visible.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0);
    let rate = |times: &[Duration]| match (times.first(), times.last()) {
        (Some(first), Some(last)) if last > first => times.len() as f64 / (*last - *first).as_secs_f64(),
        _ => 0.0,
    };
    PipelineReport {
        store: kind.to_string(),
        orders: total,
        orders_per_s: rate(&stored),
        sales_per_s: rate(&sold),
        max_backlog: samples.iter().map(|s| s.1.saturating_sub(s.2)).max().unwrap_or(0),
        visible_p50_ms: quantile(0.5),
        visible_p99_ms: quantile(0.99),
        visible_max_ms: visible.last().copied().unwrap_or(0.0),
        payments: None,
    }
}
