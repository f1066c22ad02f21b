//! `seckill demo --scenario payments`: a flash sale whose buyers pay through a payment provider
//! that misbehaves on purpose. The sandbox provider (`paysim`) runs in process with its faults
//! on, the order service starts payments with it (`POST /v1/orders/{id}/pay`), and its query and
//! refund jobs settle what the notifications leave open. Among the first wave's buyers some pay,
//! some are declined, some start a payment and abandon it, some never press "pay", some pay
//! after their order expired, and a few pay through the shop's own checkout right after the
//! purchase, before the consumer has stored their order. Expired units sell again to later
//! waves. At the end every payment the provider took must be a paid order or a refund in the
//! store, and the ledger and the store must reconcile.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use orders::provider::wire;
use orders::{OrderState, OrderStore, RefundState};
use serde::Serialize;
use testkit::load;

use crate::dev::demo::sale::{wait_until, watch_resale, OrderSale, SaleSpec};
use crate::dev::scenario::Scenario;

mod buyers;

use buyers::{Buyers, Role};

/// Price of one unit, in cents.
const PRICE: u64 = 1999;
const CURRENCY: &str = "USD";
/// Seconds a buyer has to pay: short, so expiries come within seconds.
const PAY_TIMEOUT_S: u64 = 3;
/// `[payments] pay_grace_s` and `query_limit_s`: short for the same reason.
const PAY_GRACE_S: u64 = 1;
const QUERY_LIMIT_S: u64 = 1;
/// Longest pause between two questions to the provider about one payment or refund. The default
/// (a minute) suits a provider that is down; a demo of 30 s would end before the second retry.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// The secret the sandbox signs its notifications with, as the order service checks them.
const PAYMENT_SECRET: &[u8] = b"demo-payment-provider-secret";
/// Buyers who pay through the shop's checkout at once, racing the consumer.
const EARLY_BUYERS: usize = 16;
/// First-wave buyers who start a payment, wait until their order expired, then pay.
const LATE_PAYERS: usize = 8;
/// Shares of the first wave's other buyers: never press "pay", press it and never pay, have
/// their card declined. The rest pay.
const WALK_AWAY_SHARE: f64 = 0.08;
const ABANDON_SHARE: f64 = 0.08;
const DECLINE_SHARE: f64 = 0.05;
/// The second wave: attempts per second and for how long.
const SECOND_WAVE_RATE: u64 = 200;
const SECOND_WAVE_S: u64 = 8;
/// Longest the demo keeps buyers coming after the second wave, for units that came back late.
const LATE_WAVES_MAX_S: u64 = 12;
/// Longest the demo waits, once the buyers are done, for every payment, refund and release.
const SETTLE_MAX: Duration = Duration::from_secs(20);
/// How long one HTTP call of a buyer may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The provider's faults while the first wave buys. Callbacks are neither delayed nor held
/// yet: the early buyers' notifications must be able to overtake the consumer.
fn first_faults() -> paysim::Faults {
    paysim::Faults {
        duplicate_p: 0.2,
        drop_p: 0.15,
        decline_p: 0.05,
        unavailable_p: 0.1,
        answer_lost_p: 0.1,
        ..paysim::Faults::default()
    }
}

/// From the first wave's end on, callbacks are also delayed and reordered.
fn later_faults() -> paysim::FaultsPatch {
    paysim::FaultsPatch { callback_delay_ms: Some(200), reorder: Some(true), ..paysim::FaultsPatch::default() }
}

#[derive(Debug, Serialize)]
pub struct PaymentsReport {
    pub scenario: String,
    pub ledger: String,
    pub store: String,
    pub stock: u64,
    /// Units sold, resales included (order events in the ledger).
    pub sold: u64,
    pub first_wave_sold: u64,
    pub paid: u64,
    /// Units of orders that expired (paid after expiry included).
    pub expired: u64,
    /// Units the ledger took back from expired orders.
    pub released: u64,
    /// Units sold again after a release.
    pub resold: u64,
    /// Units left unsold when the buyers stopped coming.
    pub unsold: u64,
    pub pending_at_end: u64,
    /// From the first unit given back until the first sale after it.
    pub expiry_to_resale_ms: Option<f64>,
    /// What the buyers did.
    pub buyers: BuyerCounts,
    /// Payments the order service recorded, whatever they did.
    pub payments_recorded: u64,
    /// Notifications that came before their order was stored (answered 202, applied later).
    pub early_callbacks: u64,
    /// Payments the order service learned of by asking the provider: their notification was
    /// dropped, or came after the order was settled.
    pub found_by_query: u64,
    pub paid_after_expiry: u64,
    /// Payments that did not settle their order and owe the buyer the money back, ever.
    pub refunds_owed: u64,
    /// Of those, refunds the provider acknowledged.
    pub refunds_done: u64,
    /// Payments the provider holds as succeeded with neither a paid order nor a refund in the
    /// store: must be 0.
    pub lost_payments: u64,
    pub oversell: u64,
    pub reconcile_ok: bool,
    /// What the provider did, faults included (`GET /v1/stats`).
    pub provider: paysim::Stats,
    pub faults: paysim::Faults,
    pub elapsed_s: f64,
    /// Every broken promise, named.
    pub problems: Vec<String>,
}

/// What the demo's buyers did, by their intent.
#[derive(Debug, Default, Serialize)]
pub struct BuyerCounts {
    /// Paid through the shop's checkout right after the purchase.
    pub early: u64,
    pub paying: u64,
    pub declined: u64,
    pub abandoned: u64,
    pub walked_away: u64,
    /// Paid after their order had expired.
    pub paid_late: u64,
    /// Tried to pay late, and found the payment closed already.
    pub too_late: u64,
}

impl PaymentsReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn render(&self) -> String {
        let stats = &self.provider;
        format!(
            "scenario        {} ({} ledger, {} order store, sandbox provider in process)\n\
             stock           {} units at {}.{:02} {CURRENCY}, {PAY_TIMEOUT_S} s to pay (+{PAY_GRACE_S} s once paying)\n\
             faults          callbacks {:.0}% duplicated, {:.0}% dropped, delayed {} ms and reordered after the first wave; \
             {:.0}% declined; merchant calls {:.0}% unavailable, {:.0}% answers lost\n\
             buyers          {} early, {} paying, {} declined, {} abandoned, {} walked away, {} paid late ({} too late)\n\
             sold            {} (first wave {}, resold {}, unsold at the end {})\n\
             paid            {}\n\
             expired         {} (released {} units back to the ledger){}\n\
             payments        {} recorded: {} early callbacks, {} found by query, {} paid after expiry\n\
             provider        {} payments: {} succeeded, {} declined, {} closed; {} callbacks duplicated, {} dropped; \
             {} calls unavailable, {} answers lost\n\
             refunds         {} owed, {} done\n\
             lost payments   {}\n\
             reconcile       {}\n\
             result          {}",
            self.scenario,
            self.ledger,
            self.store,
            self.stock,
            PRICE / 100,
            PRICE % 100,
            self.faults.duplicate_p * 100.0,
            self.faults.drop_p * 100.0,
            self.faults.callback_delay_ms,
            self.faults.decline_p * 100.0,
            self.faults.unavailable_p * 100.0,
            self.faults.answer_lost_p * 100.0,
            self.buyers.early,
            self.buyers.paying,
            self.buyers.declined,
            self.buyers.abandoned,
            self.buyers.walked_away,
            self.buyers.paid_late,
            self.buyers.too_late,
            self.sold,
            self.first_wave_sold,
            self.resold,
            self.unsold,
            self.paid,
            self.expired,
            self.released,
            self.expiry_to_resale_ms
                .map(|ms| format!("; the first resale {ms:.0} ms after the first release"))
                .unwrap_or_default(),
            self.payments_recorded,
            self.early_callbacks,
            self.found_by_query,
            self.paid_after_expiry,
            stats.book.payments,
            stats.book.succeeded,
            stats.book.declined,
            stats.book.closed,
            stats.callbacks.callbacks_duplicated,
            stats.callbacks.callbacks_dropped,
            stats.unavailable_answers,
            stats.lost_answers,
            self.refunds_owed,
            self.refunds_done,
            self.lost_payments,
            if self.reconcile_ok { "OK" } else { "MISMATCH" },
            if self.ok() { "OK".to_string() } else { format!("FAILED: {}", self.problems.join("; ")) },
        )
    }
}

/// Runs the payments scenario on the embedded ledger and SQLite, or on Redis and PostgreSQL.
pub async fn run(
    scenario: Scenario,
    redis_url: Option<&str>,
    postgres_url: Option<&str>,
) -> anyhow::Result<PaymentsReport> {
    let started = Instant::now();
    let seed = fastrand::u64(..);
    let sandbox_config =
        paysim::Config { secret: Arc::from(PAYMENT_SECRET), faults: first_faults(), seed, private_network: false };
    let sandbox = paysim::Paysim::start(SocketAddr::from(([127, 0, 0, 1], 0)), sandbox_config).await?;
    // The provider is told where to notify with every payment, so the order API's address must
    // be known before it starts: a port picked now, as the coordinator's is.
    let orders_listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let spec = SaleSpec {
        scenario,
        redis_url,
        postgres_url,
        sku_terms: format!("price = {PRICE}\ncurrency = \"{CURRENCY}\"\npay_timeout_s = {PAY_TIMEOUT_S}\n"),
        orders_listen,
        extra_toml: format!(
            "\n[payments]\nprovider = \"sandbox\"\nurl = \"http://{}\"\npay_grace_s = {PAY_GRACE_S}\nquery_limit_s = {QUERY_LIMIT_S}\n",
            sandbox.addr
        ),
    };
    let sale = OrderSale::start(spec, |cluster, service| {
        service.payment_secret = Arc::from(PAYMENT_SECRET);
        let mut payments =
            cluster.payments.payments(cluster.orders.reached_at().as_deref())?.context("[payments] is on")?;
        payments.settings.retry_max = RETRY_MAX;
        service.payments = Some(payments);
        Ok(())
    })
    .await?;
    let outcome = drive(&sale, &sandbox).await;
    let stats = sandbox.stats();
    let faults = sandbox.faults();
    sale.stop().await;
    sandbox.stop().await;
    let mut report = outcome?;
    report.provider = stats;
    report.faults = faults;
    report.ledger = if redis_url.is_some() { "redis" } else { "embedded" }.into();
    report.store = if postgres_url.is_some() { "postgresql" } else { "sqlite" }.into();
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The sale, from the first wave to the audit.
#[expect(
    clippy::too_many_lines,
    reason = "the payments demo from the first wave to the audit, in the order it runs; lab code"
)]
async fn drive(sale: &OrderSale, sandbox: &paysim::Paysim) -> anyhow::Result<PaymentsReport> {
    let scenario = sale.scenario;
    let (ledger, store, sku, sku_id, run_id) = (&sale.ledger, &sale.store, &sale.sku, &sale.sku_id, sale.run_id);
    let buyers = Buyers {
        api: sale.api,
        sandbox: sandbox.addr,
        nodes: sale.running.addrs(),
        sku: sku.clone(),
        callback_url: format!("http://{}/v1/payments/callback", sale.api),
        store: store.clone(),
        roles: Arc::default(),
        handled: Arc::default(),
        tally: Arc::default(),
    };

    // The early buyers come with the first wave's rush, when the consumer is busiest.
    let (receipts, mut receipts_in) = tokio::sync::mpsc::channel(EARLY_BUYERS);
    let mut early = tokio::task::JoinSet::new();
    for n in 0..EARLY_BUYERS {
        let (buyer, receipts) = (buyers.clone(), receipts.clone());
        early.spawn(async move { buyer.early(run_id, n, receipts).await });
    }
    drop(receipts);
    let first = load::run(sale.plan(run_id, None, scenario.requests)).await?;
    // Every early buyer's order is known before anyone else acts on the first wave's orders.
    while receipts_in.recv().await.is_some() {}
    let first_wave_sold = ledger.status(sku_id).await?.sold;
    let faults = testkit::http::send_json(
        hyper::Method::PUT,
        sandbox.addr,
        "/v1/faults",
        &serde_json::to_value(later_faults())?,
        None,
        CALL_TIMEOUT,
    )
    .await?;
    anyhow::ensure!(faults.0 == 200, "the sandbox refused the faults: {}", faults.1);

    // Who does what: fixed shares of the first wave, chosen by the run's seed.
    let mut rng = fastrand::Rng::with_seed(run_id);
    let mut first_orders: Vec<&String> = first.purchases.iter().map(|(_, order_id)| order_id).collect();
    rng.shuffle(&mut first_orders);
    let mut roles = HashMap::new();
    for (n, order_id) in first_orders.into_iter().enumerate() {
        let draw = rng.f64();
        let role = if n < LATE_PAYERS {
            Role::Late
        } else if draw < WALK_AWAY_SHARE {
            Role::WalkAway
        } else if draw < WALK_AWAY_SHARE + ABANDON_SHARE {
            Role::Abandon
        } else if draw < WALK_AWAY_SHARE + ABANDON_SHARE + DECLINE_SHARE {
            Role::Decline
        } else {
            Role::Pay
        };
        roles.insert(order_id.clone(), role);
    }
    let buyers = Buyers { roles: Arc::new(roles), ..buyers };
    let (stop_paying, payer_stop) = tokio::sync::watch::channel(false);
    let paying = tokio::spawn(buyers.clone().pay_pending(payer_stop));

    // The second wave arrives at a steady rate from now on, as buyers keep refreshing.
    let second =
        tokio::spawn(load::run(sale.plan(run_id ^ 0x5eed, Some(SECOND_WAVE_RATE), SECOND_WAVE_RATE * SECOND_WAVE_S)));
    let resale = watch_resale(&**ledger, sku_id, first_wave_sold).await?;
    second.await??;
    while let Some(done) = early.join_next().await {
        done??;
    }
    sale.sell_the_rest(Duration::from_secs(LATE_WAVES_MAX_S), SECOND_WAVE_RATE).await?;

    let mut problems = Vec::new();
    if let Err(e) = settled(sale, sandbox).await {
        problems.push(e.to_string());
    }
    let _ = stop_paying.send(true);
    paying.await??;
    sale.wait_settled(Duration::from_secs(10)).await?;

    let reconciled = orders::reconcile::check(&**ledger, &**store, sku_id).await.map_err(anyhow::Error::msg)?;
    problems.extend(reconciled.problems.iter().map(|p| format!("reconcile: {p}")));
    let audit = audit(&**store, sandbox.addr).await?;
    if !audit.lost.is_empty() {
        problems.push(format!(
            "{} lost payments (the provider took the money; no paid order, no refund): {}",
            audit.lost.len(),
            audit.lost.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    problems.extend(audit.problems);
    let money = &reconciled.money;
    let refunds_owed = money.refunds_owed + money.refunds_pending + money.refunded;
    if money.refunded < refunds_owed {
        problems.push(format!("refunds: {} owed, only {} done", refunds_owed, money.refunded));
    }
    let status = ledger.status(sku_id).await?;
    let counts = store.counts(sku).await?;
    let oversell = (counts.units_paid + counts.units_pending).saturating_sub(scenario.stock)
        + status.sold.saturating_sub(scenario.stock);
    if oversell > 0 {
        problems.push(format!("oversell: {oversell} units"));
    }
    Ok(PaymentsReport {
        scenario: scenario.name.to_string(),
        ledger: String::new(),
        store: String::new(),
        stock: scenario.stock,
        sold: status.orders,
        first_wave_sold,
        paid: counts.units_paid,
        expired: counts.units_expired + counts.units_paid_after_expiry,
        released: status.released,
        resold: status.orders.saturating_sub(first_wave_sold),
        unsold: status.remaining,
        pending_at_end: counts.units_pending,
        expiry_to_resale_ms: resale,
        buyers: buyers.tally.counts(),
        payments_recorded: money.payments,
        early_callbacks: early_callbacks(sale.api).await?,
        found_by_query: money.found_by_query,
        paid_after_expiry: counts.units_paid_after_expiry,
        refunds_owed,
        refunds_done: money.refunded,
        lost_payments: audit.lost.len() as u64,
        oversell,
        reconcile_ok: reconciled.ok(),
        provider: paysim::Stats::default(),
        faults: paysim::Faults::default(),
        elapsed_s: 0.0,
        problems,
    })
}

/// Waits until nothing is left in flight: no notification on its way, no order pending, no
/// question to the provider or refund outstanding.
async fn settled(sale: &OrderSale, sandbox: &paysim::Paysim) -> anyhow::Result<()> {
    let store = &sale.store;
    wait_until("every payment, refund and release is settled", SETTLE_MAX, || async {
        let counts = store.counts(&sale.sku).await?;
        let money = store.money_counts(&sale.sku).await?;
        let checks = store.payment_checks_due(i64::MAX as u64, 1).await?;
        Ok(sandbox.stats().callbacks.callbacks_in_flight == 0
            && counts.units_pending == 0
            && counts.orders_unreleased == 0
            && money.refunds_owed + money.refunds_pending + money.awaiting == 0
            && checks.is_empty())
    })
    .await
}

/// The provider's books against the store's.
#[derive(Default)]
struct Audit {
    /// Succeeded payments with neither a paid order nor a refund in the store.
    lost: Vec<String>,
    problems: Vec<String>,
}

async fn audit(store: &dyn OrderStore, sandbox: SocketAddr) -> anyhow::Result<Audit> {
    let settlements: wire::Settlements =
        serde_json::from_value(testkit::http::get_json(sandbox, "/v1/settlements", CALL_TIMEOUT).await?)
            .context("the sandbox's settlements")?;
    let refunded: HashMap<&str, &wire::RefundAnswer> =
        settlements.refunds.iter().map(|refund| (refund.reference.as_str(), refund)).collect();
    let mut audit = Audit::default();
    for payment in settlements.payments.iter().filter(|p| p.status == wire::Status::Succeeded) {
        // The sandbox books a payment under its attempt's reference.
        let order_id = orders::payments::attempts::order_of(&payment.order_id);
        let records = store.payments_of(order_id).await?;
        let Some(record) = records.iter().find(|r| r.reference == payment.id) else {
            audit.lost.push(format!("{} of order {}", payment.id, payment.order_id));
            continue;
        };
        let at_provider = refunded.get(payment.id.as_str());
        match record.refund {
            Some(RefundState::Refunded) => {
                if !at_provider.is_some_and(|r| r.status == wire::RefundState::Succeeded && r.amount == payment.amount)
                {
                    audit.problems.push(format!("{}: refunded in the store, not at the provider", payment.id));
                }
            }
            // Owed or pending at the end: counted against refunds_done.
            Some(_) => {}
            None => {
                let order = store.get(order_id).await?;
                let settles = order.is_some_and(|o| {
                    o.state == OrderState::Paid && o.payment_ref.as_deref() == Some(payment.id.as_str())
                });
                if !settles {
                    audit.lost.push(format!("{} of order {} ({})", payment.id, payment.order_id, record.outcome));
                } else if at_provider.is_some() {
                    audit.problems.push(format!("{}: paid its order and was refunded too", payment.id));
                }
            }
        }
    }
    Ok(audit)
}

/// Notifications the order service answered "awaiting the order" (its own metric).
async fn early_callbacks(api: SocketAddr) -> anyhow::Result<u64> {
    let (status, body) = testkit::http::get(api, "/metrics", CALL_TIMEOUT).await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    let text = String::from_utf8_lossy(&body);
    let value = text
        .lines()
        .filter(|line| {
            line.starts_with("seckill_orders_payments_total{") && line.contains("outcome=\"awaiting_order\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Ok(value as u64)
}
