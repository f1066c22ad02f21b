//! `seckill demo --scenario orders`: a flash sale followed through to its orders. Buyers take
//! the whole stock; 70% of them pay through the signed payment callback, the rest never do. Their
//! orders expire after a short pay window, the sweeper gives the units back, and a second wave
//! of buyers (arriving at a steady rate all along) buys them again and pays. A few of the
//! walk-aways pay late and are recorded as owed a refund. At the end the ledger and the order
//! store must reconcile, every unit must be paid for once, and nothing may be sold twice.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use orders::{OrderState, OrderStore};
use serde::Serialize;
use testkit::load;

use crate::dev::demo::sale::{wait_until, watch_resale, OrderSale, SaleSpec};
use crate::dev::scenario::Scenario;

/// Price of one unit, in cents.
const PRICE: u64 = 1999;
/// Seconds a buyer has to pay: short, so the demo shows expiry within seconds.
const PAY_TIMEOUT_S: u64 = 3;
/// Payment notifications the demo's provider sends at once.
const PAYMENTS_IN_FLIGHT: usize = 16;
/// Share of the first wave's buyers who pay.
const PAYING_SHARE: f64 = 0.7;
/// Walk-aways who pay after their order expired.
const LATE_PAYERS: usize = 5;
/// The second wave: attempts per second and for how long.
const SECOND_WAVE_RATE: u64 = 300;
const SECOND_WAVE_S: u64 = 12;
/// Longest the demo keeps buyers coming after the second wave, for units that came back late.
const LATE_WAVES_MAX_S: u64 = 30;
/// The shared secret the demo's "payment provider" signs with.
const PAYMENT_SECRET: &[u8] = b"demo-payment-provider-secret";

#[derive(Debug, Serialize)]
pub struct OrdersReport {
    pub scenario: String,
    pub ledger: String,
    pub store: String,
    pub stock: u64,
    /// Units sold by the first wave (the whole stock).
    pub first_wave_sold: u64,
    pub paid: u64,
    pub expired: u64,
    /// Units the ledger took back from expired orders.
    pub released: u64,
    /// Units sold again after a release.
    pub resold: u64,
    pub late_payments: u64,
    pub pending_at_end: u64,
    /// From the first unit given back until the first sale after it.
    pub expiry_to_resale_ms: Option<f64>,
    /// From the first wave's last answer until every one of its orders was in the store.
    pub orders_stored_ms: f64,
    pub oversell: u64,
    pub undersell: u64,
    pub reconciled: bool,
    pub problems: Vec<String>,
}

impl OrdersReport {
    pub fn ok(&self) -> bool {
        self.oversell == 0 && self.undersell == 0 && self.reconciled
    }

    pub fn render(&self) -> String {
        format!(
            "scenario      {} ({} ledger, {} order store)\n\
             stock         {} units at {}.{:02} each, {} s to pay\n\
             first wave    {} sold; every order stored {:.0} ms after the last answer\n\
             paid          {}\n\
             expired       {} (released {} units back to the ledger)\n\
             resold        {} units{}\n\
             late payments {} (paid after expiry: refunds owed, no unit sold twice)\n\
             pending       {} at the end\n\
             oversell      {}\n\
             undersell     {}\n\
             reconcile     {}\n\
             result        {}",
            self.scenario,
            self.ledger,
            self.store,
            self.stock,
            PRICE / 100,
            PRICE % 100,
            PAY_TIMEOUT_S,
            self.first_wave_sold,
            self.orders_stored_ms,
            self.paid,
            self.expired,
            self.released,
            self.resold,
            self.expiry_to_resale_ms
                .map(|ms| format!(", the first {ms:.0} ms after the first release"))
                .unwrap_or_default(),
            self.late_payments,
            self.pending_at_end,
            self.oversell,
            self.undersell,
            if self.reconciled { "OK".to_string() } else { format!("MISMATCH: {}", self.problems.join("; ")) },
            if self.ok() { "OK" } else { "FAILED" },
        )
    }
}

/// Runs the orders scenario on the embedded ledger and SQLite, or on Redis and PostgreSQL.
#[expect(clippy::too_many_lines, reason = "the orders demo's narrative in the order it runs; lab code")]
pub async fn run(
    scenario: Scenario,
    redis_url: Option<&str>,
    postgres_url: Option<&str>,
) -> anyhow::Result<OrdersReport> {
    let spec = SaleSpec {
        scenario,
        redis_url,
        postgres_url,
        sku_terms: format!("price = {PRICE}\npay_timeout_s = {PAY_TIMEOUT_S}\n"),
        orders_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        extra_toml: String::new(),
    };
    let sale = OrderSale::start(spec, |_, service| {
        service.payment_secret = Arc::from(PAYMENT_SECRET);
        Ok(())
    })
    .await?;
    let (ledger, store, sku, sku_id, run_id) = (&sale.ledger, &sale.store, &sale.sku, &sale.sku_id, sale.run_id);

    let first = load::run(sale.plan(run_id, None, scenario.requests)).await?;
    let first_done = Instant::now();
    let first_wave_sold = ledger.status(sku_id).await?.sold;
    wait_until("every first-wave order is stored", Duration::from_secs(30), || async {
        Ok(store.counts(sku).await?.orders >= first_wave_sold)
    })
    .await?;
    let orders_stored_ms = first_done.elapsed().as_secs_f64() * 1e3;

    // Who walks away: a fixed share of the first wave, chosen by the run's seed.
    let mut rng = fastrand::Rng::with_seed(run_id);
    let walk_aways: HashSet<String> =
        first.purchases.iter().filter(|_| rng.f64() >= PAYING_SHARE).map(|(_, order_id)| order_id.clone()).collect();
    let payer = Payer { api: sale.api, store: store.clone(), skip: walk_aways.clone(), paid: Arc::default() };
    let (stop_paying, payer_stop) = tokio::sync::watch::channel(false);
    let paying = tokio::spawn(payer.clone().run(payer_stop));

    // The second wave arrives at a steady rate from now on, as buyers keep refreshing.
    let second_plan = sale.plan(run_id ^ 0x5eed, Some(SECOND_WAVE_RATE), SECOND_WAVE_RATE * SECOND_WAVE_S);
    let second = tokio::spawn(load::run(second_plan));
    let resale = watch_resale(&**ledger, sku_id, first_wave_sold).await?;

    // A few walk-aways pay after all, too late.
    let mut late_payments = 0;
    for order_id in walk_aways.iter().take(LATE_PAYERS) {
        wait_until("a walk-away's order expires", Duration::from_secs(20), || async {
            Ok(store.get(order_id).await?.is_some_and(|o| o.state != OrderState::PendingPayment))
        })
        .await?;
        if payer.pay(order_id).await? == "paid_after_expiry" {
            late_payments += 1;
        }
    }
    second.await??;
    sale.sell_the_rest(Duration::from_secs(LATE_WAVES_MAX_S), SECOND_WAVE_RATE).await?;
    let _ = stop_paying.send(true);
    paying.await??;
    sale.wait_settled(Duration::from_secs(30)).await?;
    let report = orders::reconcile::check(&**ledger, &**store, sku_id).await.map_err(anyhow::Error::msg)?;
    let status = ledger.status(sku_id).await?;
    let counts = store.counts(sku).await?;
    sale.stop().await;
    let paid = counts.units_paid;
    Ok(OrdersReport {
        scenario: scenario.name.to_string(),
        ledger: if redis_url.is_some() { "redis" } else { "embedded" }.into(),
        store: if postgres_url.is_some() { "postgresql" } else { "sqlite" }.into(),
        stock: scenario.stock,
        first_wave_sold,
        paid,
        expired: counts.units_expired + counts.units_paid_after_expiry,
        released: status.released,
        resold: status.orders.saturating_sub(first_wave_sold),
        late_payments,
        pending_at_end: counts.units_pending,
        expiry_to_resale_ms: resale,
        orders_stored_ms,
        oversell: (paid + counts.units_pending).saturating_sub(scenario.stock)
            + status.sold.saturating_sub(scenario.stock),
        undersell: scenario.stock.saturating_sub(paid + counts.units_pending),
        reconciled: report.ok(),
        problems: report.problems,
    })
}

/// The payment provider: pays every pending order except the walk-aways', through the signed
/// callback, like a real provider's webhook.
#[derive(Clone)]
struct Payer {
    api: SocketAddr,
    store: Arc<dyn OrderStore>,
    skip: HashSet<String>,
    paid: Arc<Mutex<HashSet<String>>>,
}

impl Payer {
    async fn run(self, stop: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
        while !*stop.borrow() {
            let pending = self.store.due_for_expiry(i64::MAX as u64, 10_000).await?;
            let mut paying = tokio::task::JoinSet::new();
            for order in pending.iter().filter(|o| !self.skip.contains(&o.new.id)) {
                let fresh = self.paid.lock().map(|mut paid| paid.insert(order.new.id.clone())).unwrap_or(false);
                if !fresh {
                    continue;
                }
                // A provider notifies many payments at once; one at a time, a loaded machine
                // would let orders expire while their payment waits its turn.
                if paying.len() >= PAYMENTS_IN_FLIGHT {
                    if let Some(paid) = paying.join_next().await {
                        paid??;
                    }
                }
                let (payer, id) = (self.clone(), order.new.id.clone());
                paying.spawn(async move { payer.pay(&id).await });
            }
            while let Some(paid) = paying.join_next().await {
                paid??;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Pays one order in full; the outcome the order service answered.
    async fn pay(&self, order_id: &str) -> anyhow::Result<String> {
        let order = self.store.get(order_id).await?.with_context(|| format!("order {order_id} is not stored"))?;
        let body = serde_json::json!({
            "order_id": order_id,
            "reference": format!("pay-{order_id}"),
            "amount": order.new.amount(),
            "currency": order.new.currency,
        })
        .to_string();
        let now_s = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let signature = orders::signature::sign(PAYMENT_SECRET, now_s, body.as_bytes());
        let headers = [(orders::signature::SIGNATURE_HEADER, signature)];
        let (status, answer) = testkit::http::post_raw(
            self.api,
            "/v1/payments/callback",
            &headers,
            Bytes::from(body),
            Duration::from_secs(5),
        )
        .await?;
        anyhow::ensure!(status == 200, "payment of {order_id} answered {status}: {answer}");
        Ok(answer["outcome"].as_str().unwrap_or_default().to_string())
    }
}
