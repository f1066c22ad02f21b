//! `seckill demo`: a whole flash sale in one process. Starts a cluster for a named scenario,
//! runs the virtual buyers against it, then checks the result against the ledger: oversell,
//! undersell and duplicate sales are counted from the ledger's own order stream, not from what
//! the buyers believe.

pub mod orders;
pub mod payments;
pub mod sale;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

use crate::cluster::{build_ledger, Options, RunningCluster, RunningNode};
use crate::config::Buffer;
use crate::config::Cluster;
use crate::dev::buyer_auth::BuyerAuth;
use crate::dev::scenario::Scenario;
use testkit::load::{self, LoadPlan};
use testkit::redis::RedisWork;

/// How the demo ends, in the figures every scenario run reports (docs/scenarios.md).
#[derive(Debug, Serialize)]
pub struct SaleReport {
    pub scenario: String,
    pub approach: Approach,
    pub ledger: String,
    /// How buyers proved who they were (`[auth]`).
    pub buyer_auth: BuyerAuth,
    pub concurrency: usize,
    pub stock: u64,
    /// HTTP purchase requests sent, retries included.
    pub requests: u64,
    /// Distinct purchase attempts (idempotency keys).
    pub attempts: u64,
    /// "purchased" answers that were fresh (not replays).
    pub purchased: u64,
    /// Units the ledger recorded as sold.
    pub ledger_sold: u64,
    pub oversell: u64,
    pub undersell: u64,
    pub duplicates: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub elapsed_s: f64,
    /// From the first intended send until every buyer had a final answer.
    pub all_answered_s: f64,
    /// From the first intended send until the last fresh purchase: the sell-out as buyers saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sale_s: Option<f64>,
    /// Open loop: sends that left later than their time (see `testkit::load::LATE_SEND`).
    pub late_sends: u64,
    pub max_send_lag_ms: f64,
    pub sold_per_node: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    /// What Redis did while the buyers ran (commands include those run inside scripts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisWork>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_commands_per_request: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_cpu_us_per_request: Option<f64>,
    /// The node crashed mid-sale, in failover scenarios.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed: Option<String>,
    /// From the crash until the coordinator revoked the node and granted its units to others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reallocation_ms: Option<f64>,
    /// What the buffer traded (surviving nodes): buyers turned away from an empty allotment
    /// while stock remained, and local winners the ledger refused.
    pub allotment: node::AllotmentStats,
    /// The order pipeline, when the sale ran one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders: Option<crate::dev::order_lag::PipelineReport>,
}

/// Which algorithm a sale runs (`--approach cluster|redis-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Approach {
    /// The design: local allotments granted by a coordinator, batched confirmation.
    Cluster,
    /// The baseline: every purchase one Lua call on Redis, same HTTP stack, same nodes.
    RedisOnly,
}

impl Approach {
    /// The name `--approach` takes.
    pub fn name(self) -> &'static str {
        match self {
            Approach::Cluster => "cluster",
            Approach::RedisOnly => "redis-only",
        }
    }
}

/// One sale to run.
#[derive(Debug, Clone, Copy)]
pub struct SaleSetup<'a> {
    pub scenario: Scenario,
    pub approach: Approach,
    /// Redis at this URL, or the embedded ledger (cluster only).
    pub redis_url: Option<&'a str>,
    /// Overrides the scenario's number of concurrent buyers.
    pub concurrency: Option<usize>,
    /// Overrides the SKU's buffer (cluster only).
    pub buffer: Option<Buffer>,
    /// A `[safeguards]` table (and its subtables) for the sale's config; `None`: the defaults.
    pub safeguards: Option<&'a str>,
    /// Lines added to the `[ledger]` table (e.g. `durability = "fsync"`); `None`: the defaults.
    pub ledger_settings: Option<&'a str>,
    /// Runs the order service beside the nodes with this store, and measures it
    /// ([`SaleReport::orders`]); `None`: no order service.
    pub orders_store: Option<&'a str>,
    /// With an order service: buyers pay every order through its callback route as soon as it
    /// is readable, during the sale ([`crate::dev::payers::SalePayers`]).
    pub pay_during_sale: bool,
    /// The SKU's unit price; `None`: the terms' default (0).
    pub price: Option<u64>,
    /// How buyers prove who they are (`[auth]`); every buyer presents a token of its own.
    pub buyer_auth: BuyerAuth,
    /// Stripes the SKU is split into (`stripes` in its `[[skus]]`; cluster only); 1: none.
    pub stripes: u32,
}

impl<'a> SaleSetup<'a> {
    /// `scenario` with `approach` on Redis at `redis_url` (or the embedded ledger), everything
    /// else as the scenario and the defaults say.
    pub fn new(scenario: Scenario, approach: Approach, redis_url: Option<&'a str>) -> SaleSetup<'a> {
        SaleSetup {
            scenario,
            approach,
            redis_url,
            concurrency: None,
            buffer: None,
            stripes: 1,
            safeguards: None,
            ledger_settings: None,
            orders_store: None,
            pay_during_sale: false,
            price: None,
            buyer_auth: BuyerAuth::None,
        }
    }
}

/// Runs `scenario` with the full design on the embedded ledger, or on Redis at `redis_url`
/// (under a fresh SKU name, so an existing sale on that Redis is never touched).
pub async fn run(
    scenario: Scenario,
    redis_url: Option<&str>,
    buyer_auth: BuyerAuth,
    stripes: u32,
) -> anyhow::Result<SaleReport> {
    run_sale(SaleSetup { buyer_auth, stripes, ..SaleSetup::new(scenario, Approach::Cluster, redis_url) }).await
}

/// Starts a cluster for the setup, runs the buyers, audits the result against the ledger and,
/// on Redis, measures the work Redis did while the buyers ran.
#[expect(
    clippy::too_many_lines,
    reason = "a whole sale from the cluster's start to the audit, in the order it runs; lab code"
)]
pub async fn run_sale(setup: SaleSetup<'_>) -> anyhow::Result<SaleReport> {
    let scenario = setup.scenario;
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let sku = format!("demo-{}-{run_id}", scenario.name);
    let data_dir = std::env::temp_dir().join(format!("seckill-demo-{}-{run_id}", std::process::id()));
    let ledger_url = setup.redis_url.unwrap_or("embedded");
    let text = match setup.approach {
        Approach::Cluster => scenario.cluster_toml_with_buffer(
            &sku,
            ledger_url,
            free_loopback_addr()?,
            &data_dir,
            setup.buffer.unwrap_or_default(),
        ),
        Approach::RedisOnly => scenario.redis_only_toml(&sku, ledger_url),
    } + "\n"
        + setup.safeguards.unwrap_or("");
    let text = with_ledger_settings(&text, ledger_url, setup.ledger_settings);
    let text = match setup.price {
        Some(price) => text.replacen("qty_max = 1\n", &format!("qty_max = 1\nprice = {price}\n"), 1),
        None => text,
    };
    anyhow::ensure!(
        setup.stripes == 1 || setup.approach == Approach::Cluster,
        "--stripes splits the cluster's SKU; the Redis-only approach has one key per SKU"
    );
    let text = match setup.stripes {
        1 => text,
        stripes => text.replacen("qty_max = 1\n", &format!("qty_max = 1\nstripes = {stripes}\n"), 1),
    };
    let text = match setup.orders_store {
        Some(store) => format!("{text}\n[orders]\nstore = {store:?}\n"),
        None => text,
    };
    let sale_auth = setup.buyer_auth.prepare(&data_dir)?;
    let text = match &sale_auth {
        Some(sale_auth) => format!("{text}\n{}", sale_auth.toml),
        None => text,
    };
    let cluster = Cluster::parse(&text).context("scenario config")?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let mut running = RunningCluster::start(&cluster, ledger.clone(), Options::default()).await?;
    let pipeline = match setup.orders_store {
        Some(_) => {
            Some(crate::dev::order_lag::Watched::start(&cluster, ledger.clone(), &sku, setup.pay_during_sale).await?)
        }
        None => None,
    };
    running.wait_ready(Duration::from_secs(10)).await?;
    let sku_id = ledger::SkuId::new(&sku)?;
    if setup.approach == Approach::Cluster {
        wait_for_allotments(&running, &sku_id, scenario.stock).await?;
    }
    if let Some(pipeline) = &pipeline {
        pipeline.wait_consuming().await?;
    }

    let plan = LoadPlan {
        targets: running.addrs(),
        sku: sku.clone(),
        purchases: scenario.requests,
        users: scenario.users,
        concurrency: setup.concurrency.unwrap_or(scenario.concurrency),
        retries_max: 5,
        retry_pause: Duration::from_millis(20),
        seed: run_id as u64,
        rate_per_s: scenario.rate_per_s,
        bearer: sale_auth.map(|sale_auth| sale_auth.minter),
    };
    let failover = scenario.kill_at_sold.filter(|_| !running.members.is_empty()).map(|share| {
        let victim = running.nodes.remove(0);
        let threshold = (scenario.stock as f64 * share).ceil() as u64;
        let probe = running.members[0].status_probe();
        tokio::spawn(kill_and_watch(victim, running.ledger.clone(), sku_id.clone(), threshold, probe))
    });
    let redis_before = redis_work(setup.redis_url).await?;
    let load = load::run(plan).await?;
    let redis_after = redis_work(setup.redis_url).await?;
    let pipeline = match pipeline {
        Some(pipeline) => Some(pipeline.finish().await?),
        None => None,
    };
    let reallocation = match failover {
        Some(watch) => Some(watch.await??),
        None => None,
    };
    let allotment = running.nodes.iter().filter_map(|n| n.node.allotment_stats(&sku)).fold(
        node::AllotmentStats::default(),
        |sum, stats| node::AllotmentStats {
            exhausted_with_stock_left: sum.exhausted_with_stock_left + stats.exhausted_with_stock_left,
            refused_by_ledger: sum.refused_by_ledger + stats.refused_by_ledger,
        },
    );
    running.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    let redis = match (redis_before, redis_after) {
        (Some(before), Some(after)) => Some(after.since(before)),
        _ => None,
    };

    // The SKU whole: every stripe's books and order stream.
    let status = ledger::sku_status(&*ledger, &sku_id, setup.stripes).await?;
    let mut orders = Vec::new();
    for stripe in 0..setup.stripes {
        orders.extend(ledger.orders(&sku_id.stripe(stripe), 0, ledger::ORDER_EVENTS_MAX).await?);
    }
    let mut sales_per_key: HashMap<&str, u64> = HashMap::new();
    for order in &orders {
        *sales_per_key.entry(order.key.as_str()).or_insert(0) += 1;
    }
    let ledger_duplicates: u64 = sales_per_key.values().map(|n| n - 1).sum();
    let mut orders_per_key: HashMap<&str, &str> = HashMap::new();
    let client_duplicates = load
        .purchases
        .iter()
        .filter(|(key, order)| *orders_per_key.entry(key).or_insert(order) != order.as_str())
        .count() as u64;
    let purchased = load.count("purchased");
    let demand_covers_stock = scenario.requests >= scenario.stock;
    Ok(SaleReport {
        scenario: scenario.name.to_string(),
        approach: setup.approach,
        ledger: if setup.redis_url.is_some() { "redis" } else { "embedded" }.to_string(),
        buyer_auth: setup.buyer_auth,
        concurrency: setup.concurrency.unwrap_or(scenario.concurrency),
        stock: scenario.stock,
        requests: load.requests,
        attempts: scenario.requests,
        purchased,
        ledger_sold: status.sold,
        oversell: status.sold.max(purchased).saturating_sub(scenario.stock),
        undersell: if demand_covers_stock { scenario.stock.saturating_sub(status.sold) } else { 0 },
        duplicates: ledger_duplicates + client_duplicates,
        rps: load.requests as f64 / load.elapsed.as_secs_f64(),
        p50_ms: load.latency_ms(0.5),
        p99_ms: load.latency_ms(0.99),
        p999_ms: load.latency_ms(0.999),
        elapsed_s: load.elapsed.as_secs_f64(),
        all_answered_s: load.all_answered.as_secs_f64(),
        last_sale_s: load.last_sale.map(|d| d.as_secs_f64()),
        late_sends: load.late_sends,
        max_send_lag_ms: load.max_send_lag.as_secs_f64() * 1e3,
        sold_per_node: status.sold_by_node.iter().map(|(node, sold)| (node.to_string(), *sold)).collect(),
        outcomes: load.outcomes,
        redis_commands_per_request: redis.map(|r| r.commands as f64 / load.requests.max(1) as f64),
        redis_cpu_us_per_request: redis.map(|r| r.cpu_seconds * 1e6 / load.requests.max(1) as f64),
        redis,
        killed: reallocation.as_ref().map(|r| r.killed.clone()),
        reallocation_ms: reallocation.as_ref().and_then(|r| r.reallocation_ms),
        allotment,
        orders: pipeline,
    })
}

/// `text` with `settings` added to its `[ledger]` table, right under the URL line the scenario
/// configs write.
pub(crate) fn with_ledger_settings(text: &str, ledger_url: &str, settings: Option<&str>) -> String {
    match settings {
        Some(settings) => {
            let url_line = format!("url = \"{ledger_url}\"\n");
            text.replacen(&url_line, &format!("{url_line}{}\n", settings.trim_end()), 1)
        }
        None => text.to_string(),
    }
}

/// Redis' work counters, read off the async runtime (the read is a blocking call).
async fn redis_work(url: Option<&str>) -> anyhow::Result<Option<RedisWork>> {
    let Some(url) = url.map(str::to_string) else { return Ok(None) };
    Ok(Some(tokio::task::spawn_blocking(move || RedisWork::read(&url)).await??))
}

/// A port that was free a moment ago, for the coordinator member.
fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Waits until the coordinator's grants have reached the nodes, so the sale starts with the
/// stock where it will be sold.
pub async fn wait_for_allotments(running: &RunningCluster, sku: &ledger::SkuId, stock: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: u64 =
            running.nodes.iter().filter_map(|n| n.node.stock_page(sku.as_str())).map(|p| p.local_remaining).sum();
        if held >= stock {
            return Ok(());
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "nodes hold {held} of {stock} units after 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the failover part of a run measured.
struct Reallocation {
    killed: String,
    reallocation_ms: Option<f64>,
}

/// Crashes `victim` once the ledger has sold `threshold` units, then measures how long until
/// the coordinator has revoked its allotment and granted units to the survivors.
async fn kill_and_watch(
    victim: RunningNode,
    ledger: Arc<dyn ledger::Ledger>,
    sku: ledger::SkuId,
    threshold: u64,
    coordinator: coordinator::StatusProbe,
) -> anyhow::Result<Reallocation> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ledger.status(&sku).await.map(|s| s.sold).unwrap_or(0) < threshold {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the sale never reached {threshold} sold");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let killed = victim.node.id().clone();
    let granted_to_survivors = |state: &coordinator::ClusterState| -> u64 {
        state.live_nodes().filter(|(id, _)| **id != killed).filter_map(|(_, r)| r.granted.get(&sku)).sum()
    };
    let before = granted_to_survivors(&coordinator.state());
    let killed_at = Instant::now();
    victim.crash();
    tracing::info!(node = %killed, "crashed a node at {threshold} units sold");
    let mut reallocation_ms = None;
    while killed_at.elapsed() < Duration::from_secs(30) {
        let state = coordinator.state();
        let revoked = state.fleet.nodes.get(&killed).is_some_and(|r| !r.live);
        if revoked && granted_to_survivors(&state) > before {
            reallocation_ms = Some(killed_at.elapsed().as_secs_f64() * 1000.0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Reallocation { killed: killed.to_string(), reallocation_ms })
}

impl SaleReport {
    /// Buyers told "purchased": on their first try, or on a retry that replayed the sale when
    /// the first answer was lost (a 503 after the ledger sold, under load). Every unit sold must
    /// reach one; `purchased` alone counts first answers only.
    pub fn told_purchased(&self) -> u64 {
        self.purchased + self.outcomes.get("replayed").copied().unwrap_or(0)
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        let per_node: Vec<String> = self.sold_per_node.iter().map(|(node, sold)| format!("{node}={sold}")).collect();
        let outcomes: Vec<String> = self.outcomes.iter().map(|(outcome, n)| format!("{outcome}={n}")).collect();
        let verdict = if self.oversell == 0 && self.undersell == 0 && self.duplicates == 0 { "OK" } else { "FAILED" };
        format!(
            "scenario      {} ({:?}, {} ledger, buyers: {})\n\
             stock         {}\n\
             requests      {} ({} purchase attempts, retries included)\n\
             purchased     {} (ledger sold {})\n\
             sold per node {}\n\
             oversell      {}\n\
             undersell     {}\n\
             duplicates    {}\n\
             throughput    {:.0} req/s over {:.2} s\n\
             latency       p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms\n\
             outcomes      {}\n\
             allotment     {} turned away while stock remained, {} local winners refused by the ledger\n\
             {}result        {verdict}",
            self.scenario,
            self.approach,
            self.ledger,
            self.buyer_auth.name(),
            self.stock,
            self.requests,
            self.attempts,
            self.purchased,
            self.ledger_sold,
            per_node.join(" "),
            self.oversell,
            self.undersell,
            self.duplicates,
            self.rps,
            self.elapsed_s,
            self.p50_ms,
            self.p99_ms,
            self.p999_ms,
            outcomes.join(" "),
            self.allotment.exhausted_with_stock_left,
            self.allotment.refused_by_ledger,
            match (&self.killed, self.reallocation_ms) {
                (Some(node), Some(ms)) =>
                    format!("failover      killed {node}; its allotment reallocated {ms:.0} ms later\n"),
                (Some(node), None) => format!("failover      killed {node}; no reallocation seen within 30 s\n"),
                _ => String::new(),
            },
        )
    }
}
