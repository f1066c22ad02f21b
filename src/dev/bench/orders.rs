//! `seckill bench orders`: what the order pipeline costs and whether it keeps up. The same sale
//! (cluster approach, one private Redis) runs without an order service, with one on SQLite (a
//! WAL file) and with one on PostgreSQL (a private server), alternating over rounds. Per run:
//! the purchase path's requests/s and latency, and the pipeline's orders stored per second
//! against the sales confirmed per second, its largest backlog, and how long after its sale an
//! order became readable (p50/p99/max, to the sampler's 10 ms). After each drain, every drained
//! order is paid through the real callback path (signed HTTP callbacks into the order API, one
//! store transaction each), 32 callers at once: payments/s recorded.
//!
//! With payments on: per store and round, the same sale runs a second time while a pool of
//! buyers pays each order through the service's own callback route as soon as it is readable
//! (before or after the run without, alternating by round), for the order-visible lag with and
//! without payments and the payments/s achieved meanwhile. Then the payment jobs' cost on a fresh
//! store (`crate::dev::bench::payments`): the query job's checks/s, its closes, the refund job's
//! refunds/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{Ledger, RedisLedger, RedisLedgerConfig, SkuId, SkuTerms};
use orders::consumer::{ConsumerConfig, SkuConsumer};
use serde::Serialize;
use testkit::postgres::PostgresServer;

use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;

/// One store's runs (`none`: no order service).
#[derive(Debug, Serialize)]
pub struct StoreRuns {
    pub store: &'static str,
    pub sales: Vec<SaleReport>,
    /// Per round, the same sale with buyers paying every order as soon as it is readable
    /// (`orders.payments` in each); empty for `none`.
    #[serde(default)]
    pub paying_sales: Vec<SaleReport>,
    /// Per round, the query and refund jobs' cost on a fresh store; empty for `none`.
    #[serde(default)]
    pub jobs: Vec<crate::dev::bench::payments::JobsCost>,
    /// Per round: a backlog of 20,000 order events confirmed through the ledger in
    /// batches (sales/s), then drained into the store by one consumer (orders/s).
    pub drains: Vec<Drain>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Drain {
    pub confirmed_sales_per_s: f64,
    pub stored_orders_per_s: f64,
    /// Signed payment callbacks answered 200 `paid` per second, every drained order paid once.
    pub payments_per_s: f64,
}

/// The SKU's unit price in every sale, so a payment has something to pay.
const PRICE: u64 = 100;

/// Order events in a drain measurement.
const DRAIN_UNITS: u64 = 20_000;
/// Longest a drain may take.
const DRAIN_MAX: Duration = Duration::from_secs(120);

#[derive(Debug, Serialize)]
pub struct OrdersCost {
    pub scenario: String,
    pub rounds: usize,
    pub stores: Vec<StoreRuns>,
}

/// Runs each variant `rounds` times, alternating. `redis_url`: the sale's Redis;
/// `postgres_url`: a PostgreSQL to use instead of a private one.
pub async fn measure(
    scenario: Scenario,
    rounds: usize,
    redis_url: &str,
    postgres_url: Option<&str>,
) -> anyhow::Result<OrdersCost> {
    let rounds = rounds.max(1);
    let private = match postgres_url {
        Some(_) => None,
        None => Some(PostgresServer::start()?),
    };
    let postgres = postgres_url.map(str::to_string).or_else(|| private.as_ref().map(PostgresServer::url));
    let dir = std::env::temp_dir().join(format!("seckill-bench-orders-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut stores: Vec<StoreRuns> = ["none", "sqlite", "postgresql"]
        .into_iter()
        .map(|store| StoreRuns { store, sales: vec![], paying_sales: vec![], drains: vec![], jobs: vec![] })
        .collect();
    // Per round: `none`'s sale, then per store two sales, a drain and the jobs.
    let steps = testkit::progress::steps((rounds * 9) as u64, "bench orders");
    let pid = std::process::id();
    for round in 0..rounds {
        for runs in &mut stores {
            let step = |what: &str| steps.set_message(format!("round {}/{rounds}: {} {what}", round + 1, runs.store));
            let url = match runs.store {
                "sqlite" => Some(format!("sqlite:{}", dir.join(format!("orders-{round}.db")).display())),
                "postgresql" => postgres.clone(),
                _ => None,
            };
            let Some(url) = url else {
                step("sale");
                runs.sales.push(sale(scenario, redis_url, None, false).await?);
                steps.inc(1);
                continue;
            };
            // Which sale goes first alternates, so neither always meets the warmer machine.
            for paying in [round % 2 == 1, round % 2 == 0] {
                step(if paying { "sale, paying" } else { "sale" });
                let sale_url = match runs.store {
                    "sqlite" if paying => format!("sqlite:{}", dir.join(format!("orders-{round}-paying.db")).display()),
                    _ => url.clone(),
                };
                let report = sale(scenario, redis_url, Some(&sale_url), paying).await?;
                if paying { &mut runs.paying_sales } else { &mut runs.sales }.push(report);
                steps.inc(1);
            }
            step("drain");
            let tag = format!("{}-{round}-{pid}", runs.store);
            runs.drains.push(drain(redis_url, &url, &tag).await?);
            steps.inc(1);
            step("payment jobs");
            let jobs_url = match (runs.store, &private) {
                ("sqlite", _) => format!("sqlite:{}", dir.join(format!("jobs-{round}.db")).display()),
                (_, Some(server)) => {
                    let database = format!("jobs_{round}");
                    server.create_database(&database)?;
                    server.url_of(&database)
                }
                // A PostgreSQL named on the command line: the jobs take its checks as theirs.
                (_, None) => url.clone(),
            };
            runs.jobs.push(crate::dev::bench::payments::measure(&jobs_url, &tag).await?);
            steps.inc(1);
        }
    }
    steps.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(OrdersCost { scenario: scenario.name.to_string(), rounds, stores })
}

/// One sale of the scenario, orders in `store` if any, buyers paying during it if `paying`.
async fn sale(scenario: Scenario, redis_url: &str, store: Option<&str>, paying: bool) -> anyhow::Result<SaleReport> {
    let report = run_sale(SaleSetup {
        orders_store: store,
        pay_during_sale: paying,
        price: Some(PRICE),
        ..SaleSetup::new(scenario, Approach::Cluster, Some(redis_url))
    })
    .await?;
    anyhow::ensure!(
        report.oversell == 0 && report.duplicates == 0,
        "the sale with orders in {store:?} broke an invariant"
    );
    Ok(report)
}

/// Confirms `DRAIN_UNITS` sales of a fresh SKU in batches (4 callers, `BATCH_MAX` each), then
/// lets one consumer drain them into the store.
async fn drain(redis_url: &str, store_url: &str, tag: &str) -> anyhow::Result<Drain> {
    let ledger: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis_url))?);
    let sku = SkuId::new(&format!("drain-{tag}"))?;
    let price = 100;
    let terms = SkuTerms { price, ..SkuTerms::new(DRAIN_UNITS) };
    ledger.create_sku(&sku, &terms).await?;
    let confirmed_sales_per_s =
        crate::dev::bench::sell_flat_out(&ledger, &sku, DRAIN_UNITS, ledger::BATCH_MAX as u64, 4).await?;
    let store = orders::store::open(store_url).await?;
    let feed: Arc<dyn Ledger> = Arc::new(RedisLedger::connect(RedisLedgerConfig::new(redis_url))?);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let consumer = SkuConsumer {
        sku: sku.clone(),
        terms,
        ledger: feed,
        store: store.clone(),
        config: ConsumerConfig { consumer: format!("drain-{tag}"), ..ConsumerConfig::default() },
    };
    let started = Instant::now();
    let running = tokio::spawn(consumer.run(stopped));
    while store.counts(sku.as_str()).await?.orders < DRAIN_UNITS {
        anyhow::ensure!(
            started.elapsed() < DRAIN_MAX,
            "the consumer did not drain {DRAIN_UNITS} events in {DRAIN_MAX:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stored_orders_per_s = DRAIN_UNITS as f64 / started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    let _ = running.await;
    let payments_per_s = pay_every_order(store, &sku, price).await?;
    Ok(Drain { confirmed_sales_per_s, stored_orders_per_s, payments_per_s })
}

/// Pays each of the SKU's `DRAIN_UNITS` orders (ledger-numbered `sku-1` …) once, through an
/// order API on a loopback port; returns payments per second.
async fn pay_every_order(store: Arc<dyn orders::OrderStore>, sku: &SkuId, price: u64) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api = orders::http::OrdersApi {
        store,
        payment_secret: Arc::from(crate::dev::payers::PAYMENT_SECRET),
        callback_window_s: orders::signature::TOLERANCE_S,
        metrics: None,
        authenticator: auth::Authenticator::none(),
        admin: None,
        payments: None,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(orders::http::serve(api, listener, orders::http::ApiLimits::default(), stopped));
    let paid = crate::dev::payers::pay_all(addr, sku.as_str(), DRAIN_UNITS, price).await;
    let _ = stop.send(true);
    let _ = server.await;
    paid
}

impl OrdersCost {
    /// One line per store: medians over rounds, requests/s against `none` in the same run.
    pub fn render(&self) -> String {
        let median = |values: Vec<f64>| crate::dev::bench::spread(values.into_iter()).1;
        let baseline =
            self.stores.first().map(|runs| median(runs.sales.iter().map(|r| r.rps).collect())).unwrap_or(0.0);
        let mut out = format!(
            "scenario {}, {} rounds alternating, medians\n\n{:<11} {:>18} {:>8} {:>8} {:>11} {:>11} {:>8} {:>24}\n",
            self.scenario,
            self.rounds,
            "orders in",
            "requests/s",
            "p50 ms",
            "p99 ms",
            "sales/s",
            "orders/s",
            "backlog",
            "visible p50/p99/max ms"
        );
        for runs in &self.stores {
            let rps = median(runs.sales.iter().map(|r| r.rps).collect());
            let pipeline = |f: fn(&crate::dev::order_lag::PipelineReport) -> f64| {
                median(runs.sales.iter().filter_map(|r| r.orders.as_ref()).map(f).collect())
            };
            let has_pipeline = runs.sales.iter().any(|r| r.orders.is_some());
            let pipeline_text = if has_pipeline {
                format!(
                    "{:>11.0} {:>11.0} {:>8.0} {:>24}",
                    pipeline(|p| p.sales_per_s),
                    pipeline(|p| p.orders_per_s),
                    pipeline(|p| p.max_backlog as f64),
                    format!(
                        "{:.0}/{:.0}/{:.0}",
                        pipeline(|p| p.visible_p50_ms),
                        pipeline(|p| p.visible_p99_ms),
                        pipeline(|p| p.visible_max_ms)
                    )
                )
            } else {
                format!("{:>11} {:>11} {:>8} {:>24}", "-", "-", "-", "-")
            };
            let drain_text = if runs.drains.is_empty() {
                String::new()
            } else {
                format!(
                    "   drain: {:.0} orders/s stored vs {:.0} sales/s confirmed batched; {:.0} payments/s through the callback path",
                    median(runs.drains.iter().map(|d| d.stored_orders_per_s).collect()),
                    median(runs.drains.iter().map(|d| d.confirmed_sales_per_s).collect()),
                    median(runs.drains.iter().map(|d| d.payments_per_s).collect())
                )
            };
            out.push_str(&format!(
                "{:<11} {:>10.0} ({:>4.2}×) {:>8.2} {:>8.2} {pipeline_text}{drain_text}\n",
                runs.store,
                rps,
                rps / baseline.max(1e-9),
                median(runs.sales.iter().map(|r| r.p50_ms).collect()),
                median(runs.sales.iter().map(|r| r.p99_ms).collect()),
            ));
        }
        out.push_str(&self.render_paying());
        out.push_str(&self.render_jobs());
        out
    }

    /// Per store and round, the sale with payments on next to the one without.
    fn render_paying(&self) -> String {
        let mut out = format!(
            "\nwith payments on: every order paid through the callback route as soon as readable, per round\n{:<11} {:>5} {:>16} {:>16} {:>8} {:>8} {:>11} {:>9} {:>14} {:>10}\n",
            "orders in",
            "round",
            "visible without",
            "visible with",
            "p99 ×",
            "max ×",
            "payments/s",
            "paid",
            "paid by stored",
            "pay lag p99"
        );
        let lag = |p: &crate::dev::order_lag::PipelineReport| {
            format!("{:.0}/{:.0}/{:.0}", p.visible_p50_ms, p.visible_p99_ms, p.visible_max_ms)
        };
        for runs in self.stores.iter().filter(|runs| !runs.paying_sales.is_empty()) {
            for (round, (without, with)) in runs.sales.iter().zip(&runs.paying_sales).enumerate() {
                let (Some(without), Some(with)) = (&without.orders, &with.orders) else { continue };
                let Some(paid) = &with.payments else { continue };
                out.push_str(&format!(
                    "{:<11} {:>5} {:>16} {:>16} {:>8.2} {:>8.2} {:>11.0} {:>9} {:>14} {:>8.0}ms\n",
                    runs.store,
                    round + 1,
                    lag(without),
                    lag(with),
                    with.visible_p99_ms / without.visible_p99_ms.max(1.0),
                    with.visible_max_ms / without.visible_max_ms.max(1.0),
                    paid.payments_per_s,
                    paid.payments,
                    paid.paid_when_stored,
                    paid.pay_lag_p99_ms,
                ));
            }
        }
        out
    }

    /// Per store, the payment jobs: medians over rounds, the query job against the callback path
    /// measured in the same rounds.
    fn render_jobs(&self) -> String {
        let median = |values: Vec<f64>| crate::dev::bench::spread(values.into_iter()).1;
        let orders = self.stores.iter().flat_map(|runs| &runs.jobs).map(|jobs| jobs.orders).next().unwrap_or(0);
        let mut out = format!(
            "\npayment jobs, {orders} orders each, as the sweeper runs them ({} provider calls at once), medians (mean provider call ms)\n{:<11} {:>26} {:>11} {:>26} {:>26} {:>26}\n",
            orders::payments::IN_FLIGHT,
            "orders in",
            "query checks/s",
            "× callback",
            "closes/s",
            "closes paid late/s",
            "refunds/s"
        );
        let rate =
            |runs: &StoreRuns,
             f: fn(&crate::dev::bench::payments::JobsCost) -> crate::dev::bench::payments::JobRate| {
                let values = |g: fn(&crate::dev::bench::payments::JobRate) -> f64| {
                    median(runs.jobs.iter().map(|jobs| g(&f(jobs))).collect())
                };
                format!("{:.0} ({:.2})", values(|r| r.per_s), values(|r| r.provider_ms))
            };
        for runs in self.stores.iter().filter(|runs| !runs.jobs.is_empty()) {
            let callbacks = median(runs.drains.iter().map(|d| d.payments_per_s).collect());
            let checks = median(runs.jobs.iter().map(|jobs| jobs.query.per_s).collect());
            out.push_str(&format!(
                "{:<11} {:>26} {:>10.2}× {:>26} {:>26} {:>26}\n",
                runs.store,
                rate(runs, |jobs| jobs.query),
                checks / callbacks.max(1e-9),
                rate(runs, |jobs| jobs.close),
                rate(runs, |jobs| jobs.paid_late),
                rate(runs, |jobs| jobs.refund),
            ));
        }
        out
    }
}
