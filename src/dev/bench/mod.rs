//! `seckill bench`: the cluster against the Redis-only approach, measured side by side in one
//! run on the same HTTP stack and the same Redis, so the ratios hold however noisy the machine.
//!
//! `compare` alternates cluster → redis-only → cluster → … over several rounds and reports each
//! ratio's min/median/max, plus three references measured in the same run: the ceiling of the
//! HTTP stack itself (a bare hyper handler with a fixed body, hit by the same load generator),
//! the engine without HTTP (decisions/s and confirmed sales/s, in process), and a capacity model
//! (how many requests/s one Redis could carry, from its CPU time per request).

pub mod auth;
pub mod binaries;
pub mod coordinator;
pub mod crowd;
pub mod durability;
pub mod hot_sku;
pub mod idle;
pub mod orders;
pub mod payments;
pub mod room_crowd;
pub mod safeguards;
pub mod sold_out;
pub mod traces;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use ledger::{IdempotencyKey, Ledger, NodeId, Purchase, Seller, SkuId, SkuTerms, UserId};
use node::{Mode, Node, NodeConfig, NodeOptions, PurchaseRequest, Shutdown, SkuConfig};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::dev::demo::{run_sale, Approach, SaleReport, SaleSetup};
use crate::dev::scenario::Scenario;
use testkit::load::{self, LoadPlan};

/// What `compare` measured.
#[derive(Debug, Serialize)]
pub struct Comparison {
    pub scenario: String,
    pub rounds: usize,
    pub concurrency: usize,
    pub cluster: Vec<SaleReport>,
    pub redis_only: Vec<SaleReport>,
    /// cluster / redis-only per round, then min, median, max.
    pub ratios: Vec<Ratio>,
    pub bare_hyper_rps: f64,
    pub engine: Engine,
    pub capacity: Capacity,
}

#[derive(Debug, Serialize)]
pub struct Ratio {
    pub metric: &'static str,
    /// What the ratio means: "cluster / redis-only" or its inverse, so that higher is better.
    pub direction: &'static str,
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

/// The engine without HTTP, against the same Redis.
#[derive(Debug, Serialize)]
pub struct Engine {
    /// `Node::purchase` calls per second with local allotments.
    pub local_decisions_per_s: f64,
    /// The same calls with one Lua call per request.
    pub lua_decisions_per_s: f64,
    /// Confirmed sales per second with batches of `ledger::BATCH_MAX`.
    pub batched_sales_per_s: f64,
    /// Confirmed sales per second with one script call per sale (64 concurrent callers).
    pub single_sales_per_s: f64,
}

/// How many requests/s one Redis could carry if its CPU were the only limit.
#[derive(Debug, Serialize)]
pub struct Capacity {
    pub cluster_redis_cpu_us_per_request: f64,
    pub redis_only_redis_cpu_us_per_request: f64,
    pub cluster_requests_per_redis_s: f64,
    pub redis_only_requests_per_redis_s: f64,
}

/// Runs the comparison.
pub async fn compare(
    scenario: Scenario,
    redis_url: &str,
    rounds: usize,
    concurrency: Option<usize>,
) -> anyhow::Result<Comparison> {
    let mut cluster = Vec::new();
    let mut redis_only = Vec::new();
    // Two sales per round, then the HTTP ceiling and the engine.
    let steps = testkit::progress::steps(rounds.max(1) as u64 * 2 + 2, "bench compare");
    for round in 0..rounds.max(1) {
        for approach in [Approach::Cluster, Approach::RedisOnly] {
            steps.set_message(format!("round {}/{}: {}", round + 1, rounds.max(1), approach.name()));
            let report =
                run_sale(SaleSetup { concurrency, ..SaleSetup::new(scenario, approach, Some(redis_url)) }).await?;
            tracing::debug!(round, ?approach, rps = report.rps, p50_ms = report.p50_ms, "round done");
            steps.inc(1);
            anyhow::ensure!(
                report.oversell == 0 && report.duplicates == 0,
                "{approach:?} broke an invariant: oversell {} duplicates {}",
                report.oversell,
                report.duplicates
            );
            match approach {
                Approach::Cluster => cluster.push(report),
                Approach::RedisOnly => redis_only.push(report),
            }
        }
    }
    let concurrency = concurrency.unwrap_or(scenario.concurrency);
    steps.set_message("HTTP stack ceiling");
    let bare_hyper_rps = bare_hyper(scenario, concurrency).await?;
    steps.inc(1);
    steps.set_message("engine without HTTP");
    let engine = engine(scenario, redis_url).await?;
    steps.finish_and_clear();
    let pairs: Vec<(&SaleReport, &SaleReport)> = cluster.iter().zip(&redis_only).collect();
    let ratio = |metric, direction, f: &dyn Fn(&SaleReport, &SaleReport) -> f64| {
        let (min, median, max) = spread(pairs.iter().map(|(c, r)| f(c, r)));
        Ratio { metric, direction, min, median, max }
    };
    let cmds = |r: &SaleReport| r.redis_commands_per_request.unwrap_or(0.0).max(1e-9);
    let cpu = |r: &SaleReport| r.redis_cpu_us_per_request.unwrap_or(0.0).max(1e-9);
    let ratios = vec![
        ratio("requests/s", "cluster / redis-only", &|c, r| c.rps / r.rps),
        ratio("p50 latency", "redis-only / cluster", &|c, r| r.p50_ms / c.p50_ms.max(1e-9)),
        ratio("p99 latency", "redis-only / cluster", &|c, r| r.p99_ms / c.p99_ms.max(1e-9)),
        ratio("Redis commands per request", "redis-only / cluster", &|c, r| cmds(r) / cmds(c)),
        ratio("Redis CPU per request", "redis-only / cluster", &|c, r| cpu(r) / cpu(c)),
    ];
    let cluster_cpu = median(&cluster, &|r| r.redis_cpu_us_per_request.unwrap_or(0.0));
    let redis_only_cpu = median(&redis_only, &|r| r.redis_cpu_us_per_request.unwrap_or(0.0));
    let capacity = Capacity {
        cluster_redis_cpu_us_per_request: cluster_cpu,
        redis_only_redis_cpu_us_per_request: redis_only_cpu,
        cluster_requests_per_redis_s: 1e6 / cluster_cpu.max(1e-9),
        redis_only_requests_per_redis_s: 1e6 / redis_only_cpu.max(1e-9),
    };
    Ok(Comparison {
        scenario: scenario.name.to_string(),
        rounds: rounds.max(1),
        concurrency,
        cluster,
        redis_only,
        ratios,
        bare_hyper_rps,
        engine,
        capacity,
    })
}

/// Min, median and max of per-round figures (at least one round).
pub(crate) fn spread(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match (values.first(), values.get(values.len() / 2), values.last()) {
        (Some(min), Some(median), Some(max)) => (*min, *median, *max),
        _ => (0.0, 0.0, 0.0),
    }
}

/// The median of one figure over a run's sale reports.
pub(crate) fn median(reports: &[SaleReport], figure: &dyn Fn(&SaleReport) -> f64) -> f64 {
    spread(reports.iter().map(figure)).1
}

/// The HTTP stack's ceiling: three bare hyper servers (one per node) answering every request
/// with a fixed 409 body, hit by the same load generator with the same plan.
pub async fn bare_hyper(scenario: Scenario, concurrency: usize) -> anyhow::Result<f64> {
    let stop = Shutdown::new();
    let mut targets = Vec::new();
    for _ in 0..scenario.nodes {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        targets.push(listener.local_addr()?);
        tokio::spawn(serve_fixed(listener, stop.clone()));
    }
    let plan = LoadPlan {
        targets,
        sku: "bare".into(),
        purchases: scenario.requests,
        users: scenario.users,
        concurrency,
        retries_max: 0,
        retry_pause: Duration::ZERO,
        seed: 1,
        rate_per_s: None,
        bearer: None,
    };
    let report = load::run(plan).await?;
    stop.trigger();
    Ok(report.requests as f64 / report.elapsed.as_secs_f64())
}

async fn serve_fixed(listener: TcpListener, stop: Shutdown) {
    const BODY: &[u8] = br#"{"error":"sold_out","message":"no units left"}"#;
    loop {
        let (stream, _): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
            () = stop.wait() => return,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_request| async {
                let mut response = Response::new(Full::new(Bytes::from_static(BODY)));
                *response.status_mut() = StatusCode::CONFLICT;
                Ok::<_, Infallible>(response)
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// Decisions made by `Node::purchase` called directly (no HTTP) for each mode, and confirmed
/// sales per second straight against the ledger, batched vs one call per sale.
pub async fn engine(scenario: Scenario, redis_url: &str) -> anyhow::Result<Engine> {
    /// Decisions per mode: enough to be stable; the Lua side gets fewer so it takes seconds.
    const LOCAL_DECISIONS: u64 = 1_000_000;
    const LUA_DECISIONS: u64 = 100_000;
    const CALLERS: usize = 64;
    /// Sales per confirm-rate measurement: ~200 batches of the largest size.
    const CONFIRM_UNITS: u64 = 51_200;
    let ledger =
        crate::cluster::build_ledger(&crate::config::Cluster::parse(&scenario.redis_only_toml("x", redis_url))?.ledger)
            .await?;
    // Ids are built before the clock starts: the callers measure the node, not `format!`.
    let users: Arc<Vec<String>> = Arc::new((0..scenario.users.max(1)).map(|u| format!("u{u}")).collect());
    let keys: Arc<Vec<String>> = Arc::new((0..LOCAL_DECISIONS).map(|n| format!("e{n}")).collect());
    let mut rates = Vec::new();
    for (mode, decisions) in [(Mode::Allotment, LOCAL_DECISIONS), (Mode::LedgerOnly, LUA_DECISIONS)] {
        let sku = SkuId::new(&format!("engine-{mode:?}-{}", std::process::id()).to_lowercase())?;
        let terms = SkuTerms { per_user_limit: 1, ..SkuTerms::new(scenario.stock) };
        ledger.create_sku(&sku, &terms).await?;
        let mut config = NodeConfig::new(NodeId::new("engine")?);
        config.mode = mode;
        let shutdown = Shutdown::new();
        let sku_config = SkuConfig::new(sku.clone(), terms, scenario.stock);
        let node = Node::start(config, vec![sku_config], ledger.clone(), NodeOptions::default(), shutdown.clone());
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = Instant::now();
        let callers: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (node, next, sku, users, keys) =
                    (node.clone(), next.clone(), sku.clone(), users.clone(), keys.clone());
                tokio::spawn(async move {
                    loop {
                        // Relaxed: hands out distinct decision numbers, nothing else.
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if n >= decisions {
                            return;
                        }
                        let request = PurchaseRequest {
                            sku: sku.as_str(),
                            user: &users[n as usize % users.len()],
                            qty: 1,
                            key: &keys[n as usize],
                            ip: std::net::Ipv4Addr::LOCALHOST.into(),
                            token: None,
                            ticket: None,
                            trace: telemetry::untraced(),
                        };
                        node.purchase(request).await;
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await?;
        }
        rates.push(decisions as f64 / started.elapsed().as_secs_f64());
        shutdown.trigger();
    }
    let (batched_sales_per_s, single_sales_per_s) = confirm_rates(&ledger, CONFIRM_UNITS).await?;
    Ok(Engine {
        local_decisions_per_s: rates[0],
        lua_decisions_per_s: rates[1],
        batched_sales_per_s,
        single_sales_per_s,
    })
}

/// Sells `units` twice straight through the ledger: in batches of `BATCH_MAX` from 4 callers, and
/// one sale per call from 64 callers. Returns sales/s for each.
pub(crate) async fn confirm_rates(ledger: &Arc<dyn Ledger>, units: u64) -> anyhow::Result<(f64, f64)> {
    let mut rates = Vec::new();
    for (batch, callers) in [(ledger::BATCH_MAX as u64, 4u64), (1, 64)] {
        let sku = SkuId::new(&format!("confirm-{batch}-{}", std::process::id()))?;
        ledger.create_sku(&sku, &SkuTerms::new(units)).await?;
        rates.push(sell_flat_out(ledger, &sku, units, batch, callers).await?);
    }
    Ok((rates[0], rates[1]))
}

/// Sells `units` of the existing `sku` straight through the ledger, in calls of `batch`
/// purchases from `callers` concurrent callers, one unit per distinct buyer; returns sales/s.
pub(crate) async fn sell_flat_out(
    ledger: &Arc<dyn Ledger>,
    sku: &SkuId,
    units: u64,
    batch: u64,
    callers: u64,
) -> anyhow::Result<f64> {
    let seller = Seller::new(NodeId::new("bench")?, 1);
    let per_caller = units / callers;
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (ledger, sku, seller) = (ledger.clone(), sku.clone(), seller.clone());
            tokio::spawn(async move {
                let mut next = 0;
                while next < per_caller {
                    let size = batch.min(per_caller - next);
                    let purchases = (next..next + size)
                        .map(|n| {
                            Ok(Purchase {
                                key: IdempotencyKey::new(&format!("c{caller}-{n}"))?,
                                user: UserId::new(&format!("c{caller}-{n}"))?,
                                qty: 1,
                                token: None,
                                order_id: None,
                            })
                        })
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    ledger.confirm(&sku, &seller, &purchases).await?;
                    next += size;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok((per_caller * callers) as f64 / started.elapsed().as_secs_f64())
}

impl Comparison {
    /// The side-by-side table.
    pub fn render(&self) -> String {
        let row = |name: &str, f: &dyn Fn(&SaleReport) -> f64, digits: usize| {
            format!("{name:<28} {:>14.digits$} {:>14.digits$}\n", median(&self.cluster, f), median(&self.redis_only, f))
        };
        let mut out = format!(
            "scenario {} · {} rounds alternating cluster → redis-only · {} concurrent buyers · medians\n\n{:<28} {:>14} {:>14}\n",
            self.scenario, self.rounds, self.concurrency, "", "cluster", "redis-only"
        );
        out += &row("requests/s", &|r| r.rps, 0);
        out += &row("p50 ms", &|r| r.p50_ms, 2);
        out += &row("p99 ms", &|r| r.p99_ms, 2);
        out += &row("p999 ms", &|r| r.p999_ms, 2);
        out += &row("purchased", &|r| r.purchased as f64, 0);
        out += &row("oversell", &|r| r.oversell as f64, 0);
        out += &row("undersell", &|r| r.undersell as f64, 0);
        out += &row("duplicates", &|r| r.duplicates as f64, 0);
        out += &row("Redis commands/request", &|r| r.redis_commands_per_request.unwrap_or(0.0), 3);
        out += &row("Redis CPU µs/request", &|r| r.redis_cpu_us_per_request.unwrap_or(0.0), 3);
        out += "\nratios (higher is better for the cluster)   min / median / max\n";
        for ratio in &self.ratios {
            out += &format!(
                "{:<28} {:<22} {:>7.2} / {:>7.2} / {:>7.2}\n",
                ratio.metric, ratio.direction, ratio.min, ratio.median, ratio.max
            );
        }
        let cluster_rps = median(&self.cluster, &|r| r.rps);
        out += &format!(
            "\nHTTP stack ceiling (bare hyper, fixed body, same load generator): {:.0} req/s; the cluster runs at {:.0}% of it\n",
            self.bare_hyper_rps,
            100.0 * cluster_rps / self.bare_hyper_rps.max(1e-9)
        );
        let e = &self.engine;
        out += &format!(
            "engine without HTTP: {:.0} decisions/s local vs {:.0} with per-request Lua ({:.1}x); \
             confirmed sales/s: {:.0} batched vs {:.0} one call per sale ({:.1}x)\n",
            e.local_decisions_per_s,
            e.lua_decisions_per_s,
            e.local_decisions_per_s / e.lua_decisions_per_s.max(1e-9),
            e.batched_sales_per_s,
            e.single_sales_per_s,
            e.batched_sales_per_s / e.single_sales_per_s.max(1e-9)
        );
        let c = &self.capacity;
        out += &format!(
            "capacity of one Redis (CPU-bound): cluster {:.0} req/s ({:.3} µs each) vs redis-only {:.0} req/s ({:.3} µs each): {:.0}x\n",
            c.cluster_requests_per_redis_s,
            c.cluster_redis_cpu_us_per_request,
            c.redis_only_requests_per_redis_s,
            c.redis_only_redis_cpu_us_per_request,
            c.cluster_requests_per_redis_s / c.redis_only_requests_per_redis_s.max(1e-9)
        );
        out
    }
}

/// Both approaches at several concurrency levels (cluster then redis-only at each level).
#[derive(Debug, Serialize)]
pub struct Sweep {
    pub scenario: String,
    pub levels: Vec<usize>,
    pub cluster: Vec<SaleReport>,
    pub redis_only: Vec<SaleReport>,
}

pub async fn sweep(scenario: Scenario, redis_url: &str, levels: &[usize]) -> anyhow::Result<Sweep> {
    let mut sweep =
        Sweep { scenario: scenario.name.into(), levels: levels.to_vec(), cluster: vec![], redis_only: vec![] };
    let steps = testkit::progress::steps(levels.len() as u64 * 2, "bench sweep");
    for &level in levels {
        for approach in [Approach::Cluster, Approach::RedisOnly] {
            steps.set_message(format!("{level} buyers: {}", approach.name()));
            let setup = SaleSetup { concurrency: Some(level), ..SaleSetup::new(scenario, approach, Some(redis_url)) };
            let report = run_sale(setup).await?;
            tracing::debug!(level, ?approach, rps = report.rps, "sweep point done");
            steps.inc(1);
            match approach {
                Approach::Cluster => sweep.cluster.push(report),
                Approach::RedisOnly => sweep.redis_only.push(report),
            }
        }
    }
    steps.finish_and_clear();
    Ok(sweep)
}

impl Sweep {
    /// Requests/s, p99 and Redis commands per request by concurrency, both approaches.
    pub fn svg(&self) -> String {
        let groups: Vec<String> = self.levels.iter().map(|l| format!("{l} buyers")).collect();
        let panel = |title, f: &dyn Fn(&SaleReport) -> f64| testkit::chart::Panel {
            title,
            groups: groups.clone(),
            series: vec![
                ("cluster", "#2b7bb9", self.cluster.iter().map(f).collect()),
                ("redis-only", "#d9822b", self.redis_only.iter().map(f).collect()),
            ],
        };
        testkit::chart::render(
            &format!("seckill vs Redis-only, scenario {} (one run per point)", self.scenario),
            &[
                panel("requests/s", &|r| r.rps),
                panel("p99 latency, ms", &|r| r.p99_ms),
                panel("Redis commands per request", &|r| r.redis_commands_per_request.unwrap_or(0.0)),
            ],
        )
    }
}
