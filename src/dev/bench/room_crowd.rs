//! `seckill bench crowd --waiting-room`: the flash crowd of `bench crowd`, open loop, sent
//! through a SKU's waiting room instead of straight at the purchase route.
//!
//! **What is offered.** As `bench crowd` does, the run first measures Redis-only's saturation
//! rate (closed loop, same Redis, `crowd::redis_only_saturation`); each point then
//! offers a multiple of it (1×, 2×, 4×, 8× by default) to a fresh SKU behind a room on the
//! in-process cluster (3 nodes, a one-member coordinator, the private Redis). Arrival `n` is due
//! at `n / rate`; every figure counts from that *intended* time, so a slow answer shows as the
//! queue it is.
//!
//! **A waiter** is what one buyer's page does: one join (its press: `POST /v1/room/{sku}/join`
//! on the node its number picks, round robin, from a pool of keep-alive connections opened
//! before the clock starts, as a load balancer's would be), then the event stream of its place
//! on that node (`GET /v1/room/{sku}/events`, its own connection, held open: it is the waiter's
//! heartbeat), until the stream says `admitted` or `sold_out`. Admitted, it closes the stream and
//! buys once with its ticket (`Ticket` header, one Idempotency-Key, retried with the same key on
//! 503/502/504 or a lost connection on the next node) on a warm keep-alive connection: a pool of
//! 64 per node opened before the clock starts, more opened when all are busy, as a browser
//! reuses the connection its page came on and a load balancer its upstream pool. A stream is a
//! new connection each, as a load balancer needs one upstream per stream it relays. A stream that
//! breaks is reopened after the 1 s its `retry:` line asks; `left` (dropped from the line) joins
//! again. Nothing else: no status polling.
//!
//! **Measured per rate.**
//! - The latency of the requests the crowd makes to the nodes, joins and purchases together (the
//!   headline p50/p99/p999) and apart: a join from its intended send, a purchase from the moment
//!   its waiter heard `admitted` (a retry from its own send). The stream's opening is a request
//!   too, but its answer is only headers; its p99 is reported apart and not in the headline.
//!   Each p99 is also given as a ratio to the 1× point of the same run (target: ≤ 2).
//! - The sale: `sold == total` from the ledger's books, oversell, and keys sold twice (the order
//!   stream's keys, and any key two answers gave two order ids).
//! - The last sale: the latest order event's time on the ledger's clock (Redis `TIME`, the same
//!   machine's clock as the waiters'). For every waiter whose join put it in line and who had
//!   not been admitted by then, the time from that last sale until its stream said `sold_out`:
//!   max and p99 (target: every one within 1 s), and how many never heard it (cut off 10 s after
//!   the ledger showed nothing left).
//! - Admissions/s from the room's own log (ledger clock), tickets used (admitted waiters that
//!   sent a purchase with theirs), and Redis' CPU while the crowd ran.
//!
//! **Sizes, scaled down.** A 2-core box holds neither 100k streams nor 8× a saturation rate for
//! long: every waiter holds a connection whose two ends both live in this process (two file
//! descriptors), and its node names it to the ledger every 250 ms. So the crowd arrives in one
//! short burst: `--arrival-s` defaults to what gives the largest rate `--waiters-max` waiters
//! (12,000, or fewer if the process's descriptor limit holds fewer; raise it with `ulimit -n`),
//! the same arrival time for every rate, so waiters grow with the rate as a crowd does. The SKU
//! has `--units` (default: half the smallest rate's waiters, so that some are still in line when
//! it sells out), and the room admits `--admit-per-s` (default: the units over 2 s): the
//! purchases it lets through come at that rate whatever the crowd, a small fraction of what the
//! nodes sell closed loop (tens of thousands a second), so the purchase path is never what is
//! overloaded. Every other room rule is the product's default (`admit_factor` 1.5, tickets
//! 30 s, abandon 20 s); the rate the room really reaches is measured, not assumed. The nodes
//! take `connections_max` = every waiter plus the pools, so no stream waits for a permit, and
//! `connections_per_address = 0` (loopback is exempt from it anyway).
//!
//! **The sale is open when the crowd comes** (no `starts_at`): every join queues FIFO and the
//! room admits while joins still arrive, so purchases share the cores with the join burst. A
//! crowd gathered before the start would join the pre-queue instead, drawn in one call at the
//! start, and its purchases would come after the burst: the easier case, not measured here.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use node::Shutdown;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::cluster::{build_ledger, Options, RunningCluster};
use crate::config::Cluster;
use crate::dev::demo::wait_for_allotments;
use crate::dev::scenario::Scenario;
use testkit::redis::RedisWork;

/// Offered rates when `--rates` is not given.
pub const DEFAULT_RATES: [f64; 4] = [1.0, 2.0, 4.0, 8.0];

/// The largest rate's waiters when neither `--waiters-max` nor `--arrival-s` says otherwise
/// (and the descriptor limit allows): about what two cores keep streaming at once.
pub const WAITERS_MAX_DEFAULT: u64 = 12_000;

/// The default admission rate sells the units over this long.
const SALE_S: f64 = 2.0;

/// File descriptors per waiter: its stream's client end and the node's end, both here.
const FDS_PER_WAITER: u64 = 2;
/// Descriptors kept for everything else: Redis connections, the coordinator, the purchases'
/// pool, files.
const FDS_RESERVE: u64 = 2_048;

/// Warm keep-alive connections per node that purchases take turns on (more open as needed).
const PURCHASE_POOL_PER_NODE: usize = 64;

/// Retries of a join or a purchase that decided nothing (503, 502, 504, a lost connection).
const RETRIES_MAX: u32 = 5;
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// A request no node answers within this counts as a connection error.
const CALL_MAX: Duration = Duration::from_secs(30);
/// What an event stream's `retry:` line asks a browser to wait before reconnecting.
const STREAM_RETRY: Duration = Duration::from_secs(1);

/// The target: every waiter in line at the last sale hears `sold_out` within this.
pub const HEARD_WITHIN_MS: f64 = 1_000.0;
/// The target: every rate's p99 within this multiple of the 1× p99.
pub const P99_RATIO_MAX: f64 = 2.0;
/// Waiters still untold this long after the ledger showed nothing left are cut off, untold.
const UNTOLD_AFTER_SOLD_OUT: Duration = Duration::from_secs(10);

/// What to offer (`bench crowd --waiting-room`); `None`s are sized from the run's saturation.
#[derive(Debug, Clone)]
pub struct RoomCrowdPlan {
    pub scenario: Scenario,
    /// Offered rates, as multiples of Redis-only's saturation rate; must include 1.
    pub multipliers: Vec<f64>,
    pub arrival_s: Option<f64>,
    pub waiters_max: Option<u64>,
    pub units: Option<u64>,
    pub admit_per_s: Option<u32>,
    /// Connections' worth of joins in flight at most (one keep-alive connection per node each).
    pub concurrency: usize,
}

/// The plan once Redis-only's saturation rate is known.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sizing {
    pub arrival_s: f64,
    /// Per multiplier, in the plan's order.
    pub offered_rps: Vec<u64>,
    pub waiters: Vec<u64>,
    pub units: u64,
    pub admit_per_s: u32,
    /// The most waiters this process's descriptor limit holds; `None`: no limit.
    pub waiters_fit: Option<u64>,
}

impl RoomCrowdPlan {
    /// What can be checked before anything runs; each error names its flag. `fd_limit` is the
    /// process's open-file limit (`None`: unlimited).
    pub fn validate(&self, fd_limit: Option<u64>) -> anyhow::Result<()> {
        anyhow::ensure!(!self.multipliers.is_empty(), "--rates needs at least one multiple");
        for &m in &self.multipliers {
            anyhow::ensure!(m.is_finite() && m > 0.0, "--rates: {m} is not a multiple above 0");
        }
        anyhow::ensure!(
            self.multipliers.contains(&1.0),
            "--rates must include 1 with --waiting-room: every p99 is compared with the 1× point's"
        );
        if let Some(arrival_s) = self.arrival_s {
            anyhow::ensure!(arrival_s.is_finite() && arrival_s > 0.0, "--arrival-s must be above 0");
        }
        anyhow::ensure!(self.concurrency > 0, "--concurrency must be at least 1");
        if let Some(units) = self.units {
            anyhow::ensure!(units > 0, "--units must be at least 1");
        }
        if let Some(admit) = self.admit_per_s {
            anyhow::ensure!(
                (1..=protocol::room::ADMIT_PER_S_MAX).contains(&admit),
                "--admit-per-s must be between 1 and {}",
                protocol::room::ADMIT_PER_S_MAX
            );
        }
        let fit = self.waiters_fit(fd_limit);
        if let Some(max) = self.waiters_max {
            anyhow::ensure!(max > 0, "--waiters-max must be at least 1");
            if let (Some(fit), Some(limit)) = (fit, fd_limit) {
                anyhow::ensure!(
                    max <= fit,
                    "--waiters-max {max}: this process may open {limit} files, which hold {fit} waiters \
                     ({FDS_PER_WAITER} descriptors each, both ends of its stream live here, besides the join \
                     pool's); lower --waiters-max or raise the limit (ulimit -n)"
                );
            }
        }
        anyhow::ensure!(
            fit != Some(0),
            "this process may open {} files: not enough for the join pool of --concurrency {} and any waiter; \
             lower --concurrency or raise the limit (ulimit -n)",
            fd_limit.unwrap_or(0),
            self.concurrency
        );
        Ok(())
    }

    /// The most waiters `fd_limit` holds beside the join pool and the reserve.
    fn waiters_fit(&self, fd_limit: Option<u64>) -> Option<u64> {
        let pool = 2 * (self.concurrency as u64).saturating_mul(self.scenario.nodes as u64);
        fd_limit.map(|limit| limit.saturating_sub(FDS_RESERVE + pool) / FDS_PER_WAITER)
    }

    /// Sizes the crowd from Redis-only's saturation rate (requests/s); each error names the
    /// flag to change.
    pub fn size(&self, saturation_rps: f64, fd_limit: Option<u64>) -> anyhow::Result<Sizing> {
        self.validate(fd_limit)?;
        anyhow::ensure!(saturation_rps.is_finite() && saturation_rps > 0.0, "Redis-only's saturation rate is 0");
        let fit = self.waiters_fit(fd_limit);
        let largest = self.multipliers.iter().copied().fold(0.0, f64::max);
        let offered_rps: Vec<u64> =
            self.multipliers.iter().map(|m| (saturation_rps * m).round().max(1.0) as u64).collect();
        let top_rps = offered_rps.iter().copied().max().unwrap_or(1) as f64;
        let arrival_s = match self.arrival_s {
            Some(arrival_s) => arrival_s,
            None => {
                let max = self.waiters_max.unwrap_or(fit.map_or(WAITERS_MAX_DEFAULT, |f| f.min(WAITERS_MAX_DEFAULT)));
                max as f64 / top_rps
            }
        };
        let waiters: Vec<u64> =
            offered_rps.iter().map(|rps| (*rps as f64 * arrival_s).round().max(1.0) as u64).collect();
        let most = waiters.iter().copied().max().unwrap_or(0);
        if let (Some(fit), Some(limit)) = (fit, fd_limit) {
            anyhow::ensure!(
                most <= fit,
                "--arrival-s {arrival_s} gives the {largest}× rate {most} waiters, more than the {fit} this process's \
                 limit of {limit} open files holds ({FDS_PER_WAITER} descriptors each); lower --arrival-s or raise \
                 the limit (ulimit -n)"
            );
        }
        if let Some(max) = self.waiters_max {
            anyhow::ensure!(
                most <= max,
                "--arrival-s {arrival_s} gives the {largest}× rate {most} waiters, more than --waiters-max {max}"
            );
        }
        let fewest = waiters.iter().copied().min().unwrap_or(0);
        let units = match self.units {
            Some(units) => units,
            None => default_units(fewest),
        };
        anyhow::ensure!(
            units < fewest,
            "--units {units}: the smallest rate brings only {fewest} waiters; a sale needs more waiters than \
             units, so that some are still in line when it sells out (lower --units, or raise --arrival-s or \
             --waiters-max)"
        );
        let admit_per_s = match self.admit_per_s {
            Some(admit) => admit,
            None => ((units as f64 / SALE_S).ceil() as u32).clamp(1, protocol::room::ADMIT_PER_S_MAX),
        };
        Ok(Sizing { arrival_s, offered_rps, waiters, units, admit_per_s, waiters_fit: fit })
    }
}

/// Half the smallest rate's waiters, in round hundreds once there are a few hundred.
fn default_units(fewest_waiters: u64) -> u64 {
    let half = fewest_waiters / 2;
    if half >= 200 {
        half / 100 * 100
    } else {
        half.max(1)
    }
}

/// The soft limit on open files of this process (`/proc/self/limits`); `None` if unlimited or
/// unknown.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

/// One rate's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RoomPoint {
    pub multiplier: f64,
    pub offered_rps: u64,
    pub waiters: u64,
    /// Joins answered per second over the arrivals (first intended send to last join answer).
    pub achieved_join_rps: f64,
    /// Joins and purchases together, from each one's intended send.
    pub requests: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p99_ratio_to_1x: f64,
    pub join_p50_ms: f64,
    pub join_p99_ms: f64,
    pub join_p999_ms: f64,
    pub join_p99_ratio_to_1x: f64,
    /// `None` when no purchase was sent.
    pub purchase_p50_ms: Option<f64>,
    pub purchase_p99_ms: Option<f64>,
    pub purchase_p999_ms: Option<f64>,
    pub purchase_p99_ratio_to_1x: Option<f64>,
    /// Streams' answers (headers), from the request.
    pub stream_open_p99_ms: Option<f64>,
    /// The ledger's books at the end.
    pub sold: u64,
    pub total: u64,
    pub oversell: u64,
    pub duplicates: u64,
    /// Fresh `purchased` answers the waiters got.
    pub purchased: u64,
    /// From the first intended join until the last sale (ledger clock).
    pub last_sale_ms: Option<f64>,
    /// Waiters in line (not admitted) at the last sale, and how many of them never heard
    /// `sold_out`.
    pub waiting_at_last_sale: u64,
    pub waiters_untold: u64,
    /// Over the waiters in line at the last sale: the time from it until each heard `sold_out`.
    /// `None` when nobody was waiting, or (max) when someone never heard it.
    pub sold_out_heard_max_ms: Option<f64>,
    pub sold_out_heard_p99_ms: Option<f64>,
    pub admissions: u64,
    /// Room calls (joins, nodes' ticks) that admitted someone, told apart by their ledger ms.
    pub admitting_calls: u64,
    /// Admissions from the first to the last, per second of the ledger's clock.
    pub admissions_per_s: Option<f64>,
    /// From the room admitting a waiter (ledger clock) until the waiter heard `admitted`.
    pub admission_heard_p50_ms: Option<f64>,
    pub admission_heard_p99_ms: Option<f64>,
    /// Admitted waiters that sent a purchase with their ticket.
    pub tickets_used: u64,
    pub join_outcomes: BTreeMap<String, u64>,
    pub purchase_outcomes: BTreeMap<String, u64>,
    /// Joins that left more than 2 ms after their time (every pooled connection busy).
    pub late_joins: u64,
    pub stream_reconnects: u64,
    pub rejoins: u64,
    /// Waiters still at work when the run cut them off.
    pub cut_off: u64,
    pub redis_cpu_s: Option<f64>,
    pub redis_commands: Option<u64>,
}

/// What the run measured.
#[derive(Debug, Serialize)]
pub struct RoomCrowd {
    pub scenario: String,
    pub nodes: usize,
    pub redis_only_saturation_rps: f64,
    pub arrival_s: f64,
    pub units: u64,
    pub admit_per_s: u32,
    pub admit_factor: f64,
    pub ticket_ttl_s: u64,
    pub concurrency: usize,
    pub open_files_limit: Option<u64>,
    pub waiters_fit: Option<u64>,
    /// What is smaller than the flash crowd the issue describes, in words.
    pub scaled_down: String,
    pub points: Vec<RoomPoint>,
}

/// Runs the plan against Redis at `redis_url`.
pub async fn run(plan: &RoomCrowdPlan, redis_url: &str) -> anyhow::Result<RoomCrowd> {
    let fd_limit = open_files_limit();
    plan.validate(fd_limit)?;
    let steps = testkit::progress::steps(1 + plan.multipliers.len() as u64, "bench crowd --waiting-room");
    steps.set_message("redis-only saturation (closed loop)");
    let saturation = super::crowd::redis_only_saturation(plan.scenario, redis_url).await?;
    steps.inc(1);
    let sizing = plan.size(saturation, fd_limit)?;
    let rules = protocol::RoomRules { admit_per_s: sizing.admit_per_s, ..protocol::RoomRules::default() };
    let mut points = Vec::new();
    for (at, &multiplier) in plan.multipliers.iter().enumerate() {
        let (offered_rps, waiters) = (sizing.offered_rps[at], sizing.waiters[at]);
        steps.set_message(format!("{multiplier}× ({offered_rps}/s, {waiters} waiters)"));
        let setup = PointSetup { plan, rules: &rules, units: sizing.units, multiplier, offered_rps, waiters };
        points.push(point(setup, redis_url).await?);
        steps.inc(1);
    }
    steps.finish_and_clear();
    fill_ratios(&mut points);
    let largest = sizing.waiters.iter().copied().max().unwrap_or(0);
    let why = match (plan.arrival_s, plan.waiters_max, sizing.waiters_fit, fd_limit) {
        (Some(_), _, _, _) => "from --arrival-s".to_string(),
        (None, Some(_), _, _) => "--waiters-max".to_string(),
        (None, None, Some(fit), Some(limit)) if fit < WAITERS_MAX_DEFAULT => {
            format!("what this process's limit of {limit} open files holds, 2 per waiter")
        }
        _ => "the default".to_string(),
    };
    let scaled_down = format!(
        "the crowd arrives in {:.0} ms at every rate, {largest} waiters at the largest ({why}), for {} units \
         admitted at {}/s; a real flash crowd is 100k+ buyers over seconds, but here one stream per waiter, the \
         load generator, the nodes and Redis share two cores",
        sizing.arrival_s * 1e3,
        sizing.units,
        sizing.admit_per_s
    );
    Ok(RoomCrowd {
        scenario: plan.scenario.name.to_string(),
        nodes: plan.scenario.nodes,
        redis_only_saturation_rps: saturation,
        arrival_s: sizing.arrival_s,
        units: sizing.units,
        admit_per_s: sizing.admit_per_s,
        admit_factor: rules.admit_factor,
        ticket_ttl_s: rules.ticket_ttl_s,
        concurrency: plan.concurrency,
        open_files_limit: fd_limit,
        waiters_fit: sizing.waiters_fit,
        scaled_down,
        points,
    })
}

/// Each point's p99s over the 1× point's.
fn fill_ratios(points: &mut [RoomPoint]) {
    let Some(base) = points.iter().find(|p| p.multiplier == 1.0).cloned() else { return };
    let ratio = |value: f64, base: f64| value / base.max(1e-9);
    for point in points.iter_mut() {
        point.p99_ratio_to_1x = ratio(point.p99_ms, base.p99_ms);
        point.join_p99_ratio_to_1x = ratio(point.join_p99_ms, base.join_p99_ms);
        point.purchase_p99_ratio_to_1x = match (point.purchase_p99_ms, base.purchase_p99_ms) {
            (Some(value), Some(base)) => Some(ratio(value, base)),
            _ => None,
        };
    }
}

struct PointSetup<'a> {
    plan: &'a RoomCrowdPlan,
    rules: &'a protocol::RoomRules,
    units: u64,
    multiplier: f64,
    offered_rps: u64,
    waiters: u64,
}

/// One rate: a fresh cluster and SKU, the crowd, the audit.
async fn point(setup: PointSetup<'_>, redis_url: &str) -> anyhow::Result<RoomPoint> {
    let plan = setup.plan;
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let sku = format!("room-crowd-{run_id}");
    let data_dir = std::env::temp_dir().join(format!("seckill-room-crowd-{}-{run_id}", std::process::id()));
    let scenario = Scenario { stock: setup.units, ..plan.scenario };
    let coordinator = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let connections_max = setup.waiters as usize + plan.concurrency + 1_000;
    let text = room_toml(&scenario.cluster_toml(&sku, redis_url, coordinator, &data_dir), setup.rules, connections_max);
    let cluster = Cluster::parse(&text).context("the room crowd's config")?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let running = RunningCluster::start(&cluster, ledger.clone(), Options::default()).await?;
    running.wait_ready(Duration::from_secs(10)).await?;
    let sku_id = ledger::SkuId::new(&sku)?;
    wait_for_allotments(&running, &sku_id, setup.units).await?;

    let redis_before = redis_work(redis_url).await;
    let crowd = CrowdSpec {
        targets: running.addrs(),
        sku: sku.clone(),
        rate: setup.offered_rps as f64,
        waiters: setup.waiters,
        concurrency: plan.concurrency,
        run: run_id as u64,
        // Cut-off if the sale never sells out: the arrivals, every admission the room could
        // make at its rate, twice, and a margin.
        deadline: Duration::from_secs_f64(
            setup.waiters as f64 / setup.offered_rps as f64
                + 2.0 * setup.units as f64 * setup.rules.admit_factor / f64::from(setup.rules.admit_per_s)
                + 20.0,
        ),
    };
    let heard = run_crowd(crowd, ledger.clone(), sku_id.clone()).await;
    let redis_after = redis_work(redis_url).await;
    running.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    let heard = heard?;

    // The books.
    let status = ledger.status(&sku_id).await?;
    let orders = ledger.orders(&sku_id, 0, ledger::ORDER_EVENTS_MAX).await?;
    let mut per_key: HashMap<&str, u64> = HashMap::new();
    for order in &orders {
        *per_key.entry(order.key.as_str()).or_insert(0) += 1;
    }
    let ledger_duplicates: u64 = per_key.values().map(|n| n - 1).sum();
    let mut order_of_key: HashMap<&str, &str> = HashMap::new();
    let client_duplicates = heard
        .records
        .iter()
        .flat_map(|r| r.orders.iter().map(move |order| (r.key.as_str(), order.as_str())))
        .filter(|(key, order)| *order_of_key.entry(key).or_insert(order) != *order)
        .count() as u64;
    let last_sale_unix_ms = orders.iter().map(|o| o.at_ms).max().filter(|at| *at > 0);
    let last_sale_ms = match last_sale_unix_ms {
        Some(at) => Some(at as f64 - heard.started_unix_ms),
        None => heard.last_purchase_ms,
    };
    let admissions = all_admissions(&*ledger, &sku_id).await?;
    let admissions_per_s = match (admissions.first(), admissions.last()) {
        (Some(first), Some(last)) if last.at_ms > first.at_ms => {
            Some((admissions.len() - 1) as f64 * 1000.0 / (last.at_ms - first.at_ms) as f64)
        }
        _ => None,
    };

    let purchased = heard.records.iter().filter(|r| r.purchase.as_deref() == Some("purchased")).count() as u64;
    let admitted_at: HashMap<&str, f64> =
        admissions.iter().map(|a| (a.user.as_str(), a.at_ms as f64 - heard.started_unix_ms)).collect();
    let told = last_sale_ms.map(|at| sold_out_heard(&lines(&heard.records, &admitted_at), at));
    // From the room's admission (ledger clock) until its waiter heard it.
    let mut admission_heard: Vec<f64> =
        heard.records.iter().filter_map(|r| Some(r.admitted_ms? - admitted_at.get(r.user.as_str())?)).collect();
    admission_heard.sort_by(f64::total_cmp);
    let admitting_calls = admissions.iter().map(|a| a.at_ms).collect::<std::collections::BTreeSet<_>>().len() as u64;
    let join_ms = sorted_ms(&heard.join_latency_us);
    let purchase_us: Vec<u64> = heard.records.iter().flat_map(|r| r.purchase_latency_us.iter().copied()).collect();
    let purchase_ms = sorted_ms(&purchase_us);
    let all_ms = sorted_ms(&[heard.join_latency_us.as_slice(), purchase_us.as_slice()].concat());
    let stream_us: Vec<u64> = heard.records.iter().flat_map(|r| r.stream_open_us.iter().copied()).collect();
    let mut purchase_outcomes = BTreeMap::new();
    for record in &heard.records {
        if let Some(outcome) = &record.purchase {
            *purchase_outcomes.entry(outcome.clone()).or_insert(0) += 1;
        }
    }
    let redis = match (redis_before, redis_after) {
        (Some(before), Some(after)) => Some(after.since(before)),
        _ => None,
    };
    let q = |sorted: &[f64], at: f64| quantile(sorted, at).unwrap_or(0.0);
    Ok(RoomPoint {
        multiplier: setup.multiplier,
        offered_rps: setup.offered_rps,
        waiters: setup.waiters,
        achieved_join_rps: heard.joins_answered as f64 / heard.joins_done_s.max(1e-9),
        requests: all_ms.len() as u64,
        p50_ms: q(&all_ms, 0.5),
        p99_ms: q(&all_ms, 0.99),
        p999_ms: q(&all_ms, 0.999),
        p99_ratio_to_1x: 0.0,
        join_p50_ms: q(&join_ms, 0.5),
        join_p99_ms: q(&join_ms, 0.99),
        join_p999_ms: q(&join_ms, 0.999),
        join_p99_ratio_to_1x: 0.0,
        purchase_p50_ms: quantile(&purchase_ms, 0.5),
        purchase_p99_ms: quantile(&purchase_ms, 0.99),
        purchase_p999_ms: quantile(&purchase_ms, 0.999),
        purchase_p99_ratio_to_1x: None,
        stream_open_p99_ms: quantile(&sorted_ms(&stream_us), 0.99),
        sold: status.sold,
        total: status.total,
        oversell: status.sold.max(purchased).saturating_sub(status.total),
        duplicates: ledger_duplicates + client_duplicates,
        purchased,
        last_sale_ms,
        waiting_at_last_sale: told.as_ref().map_or(0, |t| t.waiting),
        waiters_untold: told.as_ref().map_or(0, |t| t.untold),
        sold_out_heard_max_ms: told.as_ref().and_then(|t| t.max_ms),
        sold_out_heard_p99_ms: told.as_ref().and_then(|t| t.p99_ms),
        admissions: admissions.len() as u64,
        admitting_calls,
        admissions_per_s,
        admission_heard_p50_ms: quantile(&admission_heard, 0.5),
        admission_heard_p99_ms: quantile(&admission_heard, 0.99),
        tickets_used: heard.records.iter().filter(|r| r.purchase.is_some()).count() as u64,
        join_outcomes: heard.join_outcomes,
        purchase_outcomes,
        late_joins: heard.late_joins,
        stream_reconnects: heard.records.iter().map(|r| u64::from(r.reconnects)).sum(),
        rejoins: heard.records.iter().map(|r| u64::from(r.rejoins)).sum(),
        cut_off: heard.records.iter().filter(|r| r.cut_off).count() as u64,
        redis_cpu_s: redis.map(|r| r.cpu_seconds),
        redis_commands: redis.map(|r| r.commands),
    })
}

/// The scenario's config with the SKU behind a room under `rules`, and nodes that take
/// `connections_max` connections (every stream of the crowd fits; loopback is exempt from the
/// per-address bound, which is lifted too).
fn room_toml(text: &str, rules: &protocol::RoomRules, connections_max: usize) -> String {
    let room = format!(
        "qty_max = 1\nwaiting_room = {{ admit_per_s = {}, admit_factor = {:?}, ticket_ttl_s = {}, abandon_s = {} }}\n",
        rules.admit_per_s, rules.admit_factor, rules.ticket_ttl_s, rules.abandon_s
    );
    text.replacen("qty_max = 1\n", &room, 1).replacen(
        "[node_settings]\n",
        &format!("[node_settings]\nconnections_max = {connections_max}\nconnections_per_address = 0\n"),
        1,
    )
}

async fn redis_work(url: &str) -> Option<RedisWork> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || RedisWork::read(&url).ok()).await.ok().flatten()
}

/// The room's whole admission log.
async fn all_admissions(ledger: &dyn ledger::Ledger, sku: &ledger::SkuId) -> anyhow::Result<Vec<ledger::Admission>> {
    let mut all: Vec<ledger::Admission> = Vec::new();
    loop {
        let after = all.last().map_or(0, |a| a.seq);
        let page = ledger.room_admissions(sku, after, 1_000).await?;
        if page.is_empty() {
            return Ok(all);
        }
        all.extend(page);
    }
}

/// Sorted milliseconds from microseconds.
fn sorted_ms(us: &[u64]) -> Vec<f64> {
    let mut ms: Vec<f64> = us.iter().map(|us| *us as f64 / 1e3).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// The `q` quantile of ascending `sorted` (nearest rank); `None` if empty.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// A waiter as the sold-out measure sees it, in ms from the first intended join.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Line {
    /// Its join put it in line (`waiting` or `pre_queue`).
    queued: bool,
    /// When the room admitted it.
    admitted_ms: Option<f64>,
    sold_out_heard_ms: Option<f64>,
}

/// Each waiter's line, admitted when the room's log says (ledger clock, ms from the start): one
/// admitted just before the last sale may hear it only after, and is no waiter then.
fn lines(records: &[WaiterRecord], admitted_at: &HashMap<&str, f64>) -> Vec<Line> {
    records
        .iter()
        .map(|r| Line {
            queued: r.queued,
            admitted_ms: admitted_at.get(r.user.as_str()).copied(),
            sold_out_heard_ms: r.sold_out_heard_ms,
        })
        .collect()
}

/// What the waiters in line at the last sale heard.
#[derive(Debug, Clone, PartialEq)]
struct Told {
    waiting: u64,
    untold: u64,
    /// `None` if nobody waited, or someone never heard.
    max_ms: Option<f64>,
    /// Untold waiters count as never: `None` if the p99 falls on one (or nobody waited).
    p99_ms: Option<f64>,
}

/// For every waiter in line when the last unit sold at `last_sale_ms` (queued by its join, not
/// admitted before then): how long after it the waiter heard `sold_out`.
fn sold_out_heard(lines: &[Line], last_sale_ms: f64) -> Told {
    let waiting: Vec<&Line> =
        lines.iter().filter(|l| l.queued && l.admitted_ms.is_none_or(|at| at > last_sale_ms)).collect();
    let mut delays: Vec<f64> =
        waiting.iter().map(|l| l.sold_out_heard_ms.map_or(f64::INFINITY, |heard| heard - last_sale_ms)).collect();
    delays.sort_by(f64::total_cmp);
    let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
    Told {
        waiting: waiting.len() as u64,
        untold: delays.iter().filter(|d| d.is_infinite()).count() as u64,
        max_ms: finite(delays.last().copied()),
        p99_ms: finite(quantile(&delays, 0.99)),
    }
}

// ---------------------------------------------------------------------------------------------
// The crowd.

struct CrowdSpec {
    targets: Vec<SocketAddr>,
    sku: String,
    rate: f64,
    waiters: u64,
    concurrency: usize,
    run: u64,
    /// From the first intended join: waiters still at work then are cut off.
    deadline: Duration,
}

/// What one waiter did, in ms from the first intended join.
#[derive(Debug, Default)]
struct WaiterRecord {
    user: String,
    key: String,
    /// Its first join put it in line.
    queued: bool,
    admitted_ms: Option<f64>,
    sold_out_heard_ms: Option<f64>,
    /// The purchase's last answer, and when a `purchased` one came.
    purchase: Option<String>,
    purchased_ms: Option<f64>,
    /// Order ids the purchase's answers carried.
    orders: Vec<String>,
    purchase_latency_us: Vec<u64>,
    stream_open_us: Vec<u64>,
    reconnects: u32,
    rejoins: u32,
    cut_off: bool,
}

/// What the crowd heard.
struct Heard {
    records: Vec<WaiterRecord>,
    join_latency_us: Vec<u64>,
    join_outcomes: BTreeMap<String, u64>,
    joins_answered: u64,
    /// From the first intended join until the last join's answer.
    joins_done_s: f64,
    late_joins: u64,
    started_unix_ms: f64,
    /// The last fresh `purchased` answer, if the ledger's clock is unknown.
    last_purchase_ms: Option<f64>,
}

struct Crowd {
    spec: CrowdSpec,
    hosts: Vec<HeaderValue>,
    /// Per node: idle keep-alive connections for purchases.
    purchase_pool: Vec<std::sync::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
    started: Instant,
    stop: Shutdown,
    records: mpsc::UnboundedSender<WaiterRecord>,
    spawned: AtomicU64,
}

impl Crowd {
    fn since_start_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// An idle pooled connection to `node`, if one is open.
    fn take_connection(&self, node: usize) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.purchase_pool[node].lock().unwrap_or_else(|p| p.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn give_connection(&self, node: usize, sender: SendRequest<Full<Bytes>>) {
        self.purchase_pool[node].lock().unwrap_or_else(|p| p.into_inner()).push(sender);
    }
}

/// What the join pool's workers report.
#[derive(Default)]
struct JoinerReport {
    latency_us: Vec<u64>,
    outcomes: BTreeMap<String, u64>,
    answered: u64,
    late: u64,
    last_answer: Duration,
}

/// Runs the crowd to the end: every waiter bought, heard `sold_out`, or was cut off.
async fn run_crowd(spec: CrowdSpec, ledger: Arc<dyn ledger::Ledger>, sku: ledger::SkuId) -> anyhow::Result<Heard> {
    anyhow::ensure!(!spec.targets.is_empty(), "no nodes");
    let hosts: Vec<HeaderValue> =
        spec.targets.iter().map(|addr| HeaderValue::from_str(&addr.to_string())).collect::<Result<_, _>>()?;
    // The pool is open before the clock starts: a load balancer's connections to its nodes are.
    let mut pools = Vec::with_capacity(spec.concurrency);
    for _ in 0..spec.concurrency {
        let mut pool = Vec::with_capacity(spec.targets.len());
        for addr in &spec.targets {
            pool.push(Some(testkit::load::connect(*addr).await.context("opening the join pool")?));
        }
        pools.push(pool);
    }
    let mut purchase_pool = Vec::with_capacity(spec.targets.len());
    for addr in &spec.targets {
        let mut idle = Vec::with_capacity(PURCHASE_POOL_PER_NODE);
        for _ in 0..PURCHASE_POOL_PER_NODE {
            idle.push(testkit::load::connect(*addr).await.context("opening the purchases' pool")?);
        }
        purchase_pool.push(std::sync::Mutex::new(idle));
    }
    let (records, mut received) = mpsc::unbounded_channel();
    let started = Instant::now() + Duration::from_millis(20);
    let started_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0) + 20.0;
    let deadline = started + spec.deadline;
    let waiters = spec.waiters;
    let crowd = Arc::new(Crowd {
        spec,
        hosts,
        purchase_pool,
        started,
        stop: Shutdown::new(),
        records,
        spawned: AtomicU64::new(0),
    });
    let next = Arc::new(AtomicU64::new(0));
    let bar = testkit::progress::counter(waiters, "waiters joining");
    let following = testkit::progress::follow(&bar, next.clone());
    let joiners: Vec<_> =
        pools.into_iter().map(|pool| tokio::spawn(joiner(crowd.clone(), pool, next.clone()))).collect();
    let mut joins = JoinerReport::default();
    for joiner in joiners {
        let report = joiner.await?;
        joins.latency_us.extend(report.latency_us);
        for (outcome, n) in report.outcomes {
            *joins.outcomes.entry(outcome).or_insert(0) += n;
        }
        joins.answered += report.answered;
        joins.late += report.late;
        joins.last_answer = joins.last_answer.max(report.last_answer);
    }
    drop(following);
    bar.finish_and_clear();

    // Every waiter's record, until the deadline, or 10 s after the ledger shows nothing left.
    let spawned = crowd.spawned.load(Ordering::Relaxed);
    let mut all = Vec::with_capacity(spawned as usize);
    let mut cut_off_at = deadline;
    let mut sold_out_seen = false;
    let mut next_look = Instant::now();
    while (all.len() as u64) < spawned && Instant::now() < cut_off_at {
        if !sold_out_seen && Instant::now() >= next_look {
            next_look = Instant::now() + Duration::from_millis(100);
            if ledger.status(&sku).await.is_ok_and(|s| s.remaining == 0) {
                sold_out_seen = true;
                cut_off_at = cut_off_at.min(Instant::now() + UNTOLD_AFTER_SOLD_OUT);
            }
        }
        if let Ok(Some(record)) = tokio::time::timeout(Duration::from_millis(50), received.recv()).await {
            all.push(record);
        }
    }
    crowd.stop.trigger();
    while (all.len() as u64) < spawned {
        match tokio::time::timeout(Duration::from_secs(5), received.recv()).await {
            Ok(Some(record)) => all.push(record),
            _ => break,
        }
    }
    let last_purchase_ms = all.iter().filter_map(|r| r.purchased_ms).reduce(f64::max);
    Ok(Heard {
        records: all,
        join_latency_us: joins.latency_us,
        join_outcomes: joins.outcomes,
        joins_answered: joins.answered,
        joins_done_s: joins.last_answer.as_secs_f64(),
        late_joins: joins.late,
        started_unix_ms,
        last_purchase_ms,
    })
}

/// One worker of the join pool: takes the next arrival, sends its join when due, and hands the
/// waiter its own task.
async fn joiner(
    crowd: Arc<Crowd>,
    mut pool: Vec<Option<SendRequest<Full<Bytes>>>>,
    next: Arc<AtomicU64>,
) -> JoinerReport {
    let mut report = JoinerReport::default();
    let spec = &crowd.spec;
    loop {
        // Relaxed: hands out distinct arrival numbers, nothing else.
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= spec.waiters {
            return report;
        }
        let due = crowd.started + Duration::from_secs_f64(n as f64 / spec.rate);
        tokio::time::sleep_until(due.into()).await;
        if Instant::now().saturating_duration_since(due) > testkit::load::LATE_SEND {
            report.late += 1;
        }
        let user = format!("w{n}");
        let mut node = n as usize % spec.targets.len();
        for attempt in 0..=RETRIES_MAX {
            let sent = if attempt == 0 { due } else { Instant::now() };
            let answer = join(&crowd, &mut pool[node], node, &user).await;
            report.latency_us.push(sent.elapsed().as_micros().max(1) as u64);
            let outcome = match &answer {
                Ok((status, _)) if *status == StatusCode::OK => "ok".to_string(),
                Ok((status, body)) => error_code(*status, body),
                Err(_) => {
                    pool[node] = None;
                    "connection_error".to_string()
                }
            };
            *report.outcomes.entry(outcome).or_insert(0) += 1;
            match answer {
                Ok((status, body)) if status == StatusCode::OK => {
                    report.answered += 1;
                    report.last_answer = report.last_answer.max(crowd.started.elapsed());
                    let place: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    crowd.spawned.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(waiter(crowd.clone(), user.clone(), node, place));
                    break;
                }
                Ok((status, _)) if !undecided(status) => break,
                _ => {}
            }
            node = (node + 1) % spec.targets.len();
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// 503 decided nothing; 502 and 504 (a proxy's) may not have: a retry is safe either way.
fn undecided(status: StatusCode) -> bool {
    matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT)
}

/// The `error` of an error body, or the status when there is none.
fn error_code(status: StatusCode, body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| status.as_u16().to_string())
}

/// `POST /v1/room/{sku}/join` for `user` on `slot` (reopened if closed).
async fn join(
    crowd: &Crowd,
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    node: usize,
    user: &str,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let body = Bytes::from(format!(r#"{{"user":"{user}"}}"#));
    let request = Request::post(format!("/v1/room/{}/join", crowd.spec.sku))
        .header(HOST, crowd.hosts[node].clone())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    exchange(slot, crowd.spec.targets[node], request).await
}

/// Sends `request` on `slot`, opening a connection to `addr` first if it has none.
async fn exchange(
    slot: &mut Option<SendRequest<Full<Bytes>>>,
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let call = async {
        if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
            *slot = Some(testkit::load::connect(addr).await?);
        }
        let sender = slot.as_mut().context("no connection")?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    match tokio::time::timeout(CALL_MAX, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => {
            *slot = None;
            Err(e)
        }
        Err(_) => {
            *slot = None;
            anyhow::bail!("no answer within {CALL_MAX:?}")
        }
    }
}

/// One waiter's life after its join; its record goes to the crowd however it ends.
async fn waiter(crowd: Arc<Crowd>, user: String, node: usize, place: serde_json::Value) {
    let mut record = WaiterRecord {
        user: user.clone(),
        key: format!("room-{}-{user}", crowd.spec.run),
        queued: matches!(place["state"].as_str(), Some("waiting" | "pre_queue")),
        ..WaiterRecord::default()
    };
    tokio::select! {
        () = live(&crowd, &mut record, &user, node, place) => {}
        () = crowd.stop.wait() => record.cut_off = true,
    }
    let _ = crowd.records.send(record);
}

async fn live(crowd: &Crowd, record: &mut WaiterRecord, user: &str, node: usize, mut place: serde_json::Value) {
    loop {
        match place["state"].as_str() {
            Some("admitted") => {
                record.admitted_ms = Some(crowd.since_start_ms());
                let ticket = place["ticket"].as_str().unwrap_or_default().to_string();
                buy(crowd, record, user, node, &ticket).await;
                return;
            }
            Some("waiting" | "pre_queue") => {
                let handle = place["waiter"].as_str().unwrap_or_default().to_string();
                place = listen(crowd, record, node, &handle).await;
            }
            Some("left") => {
                record.rejoins += 1;
                let mut slot = None;
                place = loop {
                    match join(crowd, &mut slot, node, user).await {
                        Ok((status, body)) if status == StatusCode::OK => {
                            break serde_json::from_slice(&body).unwrap_or_default()
                        }
                        _ => tokio::time::sleep(STREAM_RETRY).await,
                    }
                };
            }
            // sold_out, ended, or something unknown: nothing more to wait for.
            _ => {
                record.sold_out_heard_ms = Some(crowd.since_start_ms());
                return;
            }
        }
    }
}

/// Listens on `node`'s event stream for `handle` until the place is one to act on (admitted,
/// sold out, ended, left); reconnects as a browser's EventSource does when the stream breaks.
async fn listen(crowd: &Crowd, record: &mut WaiterRecord, node: usize, handle: &str) -> serde_json::Value {
    let addr = crowd.spec.targets[node];
    let mut first = true;
    loop {
        if !first {
            record.reconnects += 1;
            tokio::time::sleep(STREAM_RETRY).await;
        }
        first = false;
        let opened = Instant::now();
        let Ok(mut sender) = testkit::load::connect(addr).await else { continue };
        let Ok(request) = Request::get(format!("/v1/room/{}/events?waiter={handle}", crowd.spec.sku))
            .header(HOST, crowd.hosts[node].clone())
            .body(Full::new(Bytes::new()))
        else {
            return serde_json::json!({"state": "left"});
        };
        let Ok(response) = sender.send_request(request).await else { continue };
        match response.status() {
            StatusCode::OK => {}
            // A handle the node does not take: join again.
            StatusCode::FORBIDDEN => return serde_json::json!({"state": "left"}),
            _ => continue,
        }
        record.stream_open_us.push(opened.elapsed().as_micros().max(1) as u64);
        let mut body = response.into_body();
        let mut text = String::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else { continue };
            text.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: ")) else { continue };
                // Most events only move the place; the state decides whether to parse the rest.
                if ["\"state\":\"waiting\"", "\"state\":\"pre_queue\""].iter().any(|s| data.contains(s)) {
                    continue;
                }
                if let Ok(place) = serde_json::from_str::<serde_json::Value>(data) {
                    return place;
                }
            }
        }
    }
}

/// Buys once with `ticket`: one key, retried with it on the next node while nothing is decided.
async fn buy(crowd: &Crowd, record: &mut WaiterRecord, user: &str, node: usize, ticket: &str) {
    let spec = &crowd.spec;
    let body = Bytes::from(format!(r#"{{"sku":"{}","user":"{user}","qty":1}}"#, spec.sku));
    let mut node = node;
    let heard = Instant::now();
    for attempt in 0..=RETRIES_MAX {
        let sent = if attempt == 0 { heard } else { Instant::now() };
        let request = Request::post("/v1/purchase")
            .header(HOST, crowd.hosts[node].clone())
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", record.key.as_str())
            .header(node::TICKET_HEADER, ticket)
            .body(Full::new(body.clone()));
        let Ok(request) = request else {
            record.purchase = Some("bad_request".into());
            return;
        };
        let mut slot = crowd.take_connection(node);
        let answer = exchange(&mut slot, spec.targets[node], request).await;
        record.purchase_latency_us.push(sent.elapsed().as_micros().max(1) as u64);
        if let Some(sender) = slot {
            crowd.give_connection(node, sender);
        }
        let retry = match answer {
            Ok((status, body)) if status == StatusCode::OK => {
                let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if let Some(order) = parsed["order_id"].as_str() {
                    record.orders.push(order.to_string());
                }
                record.purchase = Some("purchased".into());
                record.purchased_ms = Some(crowd.since_start_ms());
                false
            }
            Ok((status, body)) => {
                record.purchase = Some(error_code(status, &body));
                undecided(status)
            }
            Err(_) => {
                record.purchase = Some("connection_error".into());
                true
            }
        };
        if !retry {
            return;
        }
        node = (node + 1) % spec.targets.len();
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

impl RoomCrowd {
    /// The table: one line per rate, then the targets.
    pub fn render(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut out = format!(
            "scenario {} ({} nodes), SKU behind a waiting room; redis-only saturation {:.0} req/s (closed loop)\n\
             room: admit_per_s {}, admit_factor {}, tickets {} s; {} units; crowd arriving over {:.0} ms at each rate; \
             {} joins in flight at most\n\
             scaled down: {}\n\
             latency counts from each request's intended time: a join's from its arrival, a purchase's from when \
             its waiter heard `admitted`; p99 ×1× is the ratio to the 1× point's\n\n\
             {:<14} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>7} {:>11} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8}\n",
            self.scenario,
            self.nodes,
            self.redis_only_saturation_rps,
            self.admit_per_s,
            self.admit_factor,
            self.ticket_ttl_s,
            self.units,
            self.arrival_s * 1e3,
            self.concurrency,
            self.scaled_down,
            "offered",
            "waiters",
            "joins/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "×1×",
            "join p99",
            "buy p99",
            "buy ×1×",
            "sold/total",
            "last sale",
            "waiting",
            "heard max",
            "heard p99",
            "admits/s",
            "tickets"
        );
        for p in &self.points {
            out.push_str(&format!(
                "{:<14} {:>7} {:>8.0} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>9.1} {:>9} {:>7} {:>11} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8}\n",
                format!("{}× {}/s", p.multiplier, p.offered_rps),
                p.waiters,
                p.achieved_join_rps,
                p.p50_ms,
                p.p99_ms,
                p.p999_ms,
                p.p99_ratio_to_1x,
                p.join_p99_ms,
                ms(p.purchase_p99_ms),
                p.purchase_p99_ratio_to_1x.map_or("-".to_string(), |r| format!("{r:.2}")),
                format!("{}/{}", p.sold, p.total),
                p.last_sale_ms.map_or("-".to_string(), |v| format!("{:.2} s", v / 1e3)),
                p.waiting_at_last_sale,
                if p.waiters_untold > 0 { format!("{} untold", p.waiters_untold) } else { ms(p.sold_out_heard_max_ms) },
                ms(p.sold_out_heard_p99_ms),
                p.admissions_per_s.map_or("-".to_string(), |v| format!("{v:.0}")),
                p.tickets_used
            ));
        }
        out.push_str(
            "\nheard: ms from the last sale (ledger clock) until each waiter still in line heard `sold_out` on its \
             stream; waiting: how many were in line then\n",
        );
        for p in &self.points {
            let outcomes = |map: &BTreeMap<String, u64>| {
                map.iter().map(|(outcome, n)| format!("{outcome}={n}")).collect::<Vec<_>>().join(" ")
            };
            out.push_str(&format!(
                "{}×: joins {} · purchases {} · oversell {} · keys sold twice {} · late joins {} · stream reconnects {} \
                 · rejoins {} · cut off {} · stream open p99 {} ms · {} admissions in {} room calls, heard after p50 {} / \
                 p99 {} ms · Redis CPU {} s\n",
                p.multiplier,
                outcomes(&p.join_outcomes),
                outcomes(&p.purchase_outcomes),
                p.oversell,
                p.duplicates,
                p.late_joins,
                p.stream_reconnects,
                p.rejoins,
                p.cut_off,
                ms(p.stream_open_p99_ms),
                p.admissions,
                p.admitting_calls,
                ms(p.admission_heard_p50_ms),
                ms(p.admission_heard_p99_ms),
                p.redis_cpu_s.map_or("-".to_string(), |s| format!("{s:.2}")),
            ));
        }
        let worst_ratio = self.points.iter().map(|p| p.p99_ratio_to_1x).fold(0.0, f64::max);
        let all_sold = self.points.iter().all(|p| p.sold == p.total && p.oversell == 0 && p.duplicates == 0);
        let heard_in_time = self
            .points
            .iter()
            .all(|p| p.waiters_untold == 0 && p.sold_out_heard_max_ms.is_none_or(|max| max <= HEARD_WITHIN_MS));
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        out.push_str(&format!(
            "\ntargets: p99 within {P99_RATIO_MAX}× of 1× at every rate: {} (worst {worst_ratio:.2}×); every unit sold, \
             none twice: {}; every waiter heard sold out within {HEARD_WITHIN_MS:.0} ms of the last sale: {}\n",
            verdict(worst_ratio <= P99_RATIO_MAX),
            verdict(all_sold),
            verdict(heard_in_time)
        ));
        out
    }

    /// p99 by kind, sold-out heard, and admissions per rate.
    pub fn svg(&self) -> String {
        let groups: Vec<String> =
            self.points.iter().map(|p| format!("{}× ({}/s)", p.multiplier, p.offered_rps)).collect();
        let values = |f: &dyn Fn(&RoomPoint) -> f64| self.points.iter().map(f).collect::<Vec<f64>>();
        testkit::chart::render(
            &format!(
                "Open-loop flash crowd through a waiting room, {} units: offered rate as multiples of redis-only's \
                 saturation ({:.0}/s)",
                self.units, self.redis_only_saturation_rps
            ),
            &[
                testkit::chart::Panel {
                    title: "p99 from intended send, ms",
                    groups: groups.clone(),
                    series: vec![
                        ("joins + purchases", "#2b7bb9", values(&|p| p.p99_ms)),
                        ("purchases", "#d9822b", values(&|p| p.purchase_p99_ms.unwrap_or(0.0))),
                    ],
                },
                testkit::chart::Panel {
                    title: "sold out heard after the last sale, ms",
                    groups: groups.clone(),
                    series: vec![
                        ("max", "#2b7bb9", values(&|p| p.sold_out_heard_max_ms.unwrap_or(0.0))),
                        ("p99", "#d9822b", values(&|p| p.sold_out_heard_p99_ms.unwrap_or(0.0))),
                    ],
                },
                testkit::chart::Panel {
                    title: "admissions/s",
                    groups,
                    series: vec![("admitted", "#2b7bb9", values(&|p| p.admissions_per_s.unwrap_or(0.0)))],
                },
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(multipliers: &[f64]) -> RoomCrowdPlan {
        RoomCrowdPlan {
            scenario: crate::dev::scenario::find("standard").expect("standard"),
            multipliers: multipliers.to_vec(),
            arrival_s: None,
            waiters_max: None,
            units: None,
            admit_per_s: None,
            concurrency: 512,
        }
    }

    fn error(result: anyhow::Result<impl std::fmt::Debug>) -> String {
        format!("{:#}", result.expect_err("an error"))
    }

    /// Goal: bad input is refused before anything runs, each error naming its flag. Method:
    /// one plan per mistake.
    #[test]
    fn bad_plans_are_refused_naming_the_flag() {
        let limit = Some(65_536);
        assert!(plan(&DEFAULT_RATES).validate(limit).is_ok());
        assert!(error(plan(&[]).validate(limit).map(|_| ())).contains("--rates"));
        assert!(error(plan(&[1.0, -2.0]).validate(limit)).contains("--rates"));
        assert!(error(plan(&[1.0, f64::NAN]).validate(limit)).contains("--rates"));
        assert!(error(plan(&[2.0, 4.0]).validate(limit)).contains("must include 1"));
        let bad = |edit: &dyn Fn(&mut RoomCrowdPlan)| {
            let mut p = plan(&DEFAULT_RATES);
            edit(&mut p);
            error(p.validate(limit))
        };
        assert!(bad(&|p| p.arrival_s = Some(0.0)).contains("--arrival-s"));
        assert!(bad(&|p| p.concurrency = 0).contains("--concurrency"));
        assert!(bad(&|p| p.units = Some(0)).contains("--units"));
        assert!(bad(&|p| p.admit_per_s = Some(0)).contains("--admit-per-s"));
        assert!(bad(&|p| p.admit_per_s = Some(100_001)).contains("--admit-per-s"));
        assert!(bad(&|p| p.waiters_max = Some(0)).contains("--waiters-max"));
        assert!(bad(&|p| p.waiters_max = Some(40_000)).contains("ulimit -n"), "65,536 files hold ~31k waiters");
        let mut tight = plan(&DEFAULT_RATES);
        tight.concurrency = 11_000;
        assert!(error(tight.validate(limit)).contains("--concurrency"), "the pool alone takes 66,000 files");
    }

    /// Goal: the sizing gives every rate the same arrival time, the largest rate the most waiters
    /// that fit, units that leave waiters in line, and names the flag when a choice cannot work.
    #[test]
    fn the_crowd_is_sized_from_the_saturation_rate_and_the_descriptor_limit() {
        let sized = plan(&DEFAULT_RATES).size(10_000.0, Some(1_048_576)).expect("sized");
        assert_eq!(sized.offered_rps, [10_000, 20_000, 40_000, 80_000]);
        assert_eq!(sized.waiters, [1_500, 3_000, 6_000, 12_000], "12,000 at 8×, the same 150 ms for each");
        assert!((sized.arrival_s - 0.15).abs() < 1e-9);
        assert_eq!(sized.units, 700, "half of 1×'s 1,500, in hundreds");
        assert_eq!(sized.admit_per_s, 350, "the units over 2 s");
        // A tight limit: 20,000 files less the pool (3,072) and the reserve hold 7,440 waiters.
        let tight = plan(&DEFAULT_RATES).size(10_000.0, Some(20_000)).expect("sized");
        assert_eq!(sized.waiters_fit, Some((1_048_576 - 2_048 - 3_072) / 2));
        assert_eq!(tight.waiters.last(), Some(&7_440));
        let mut explicit = plan(&DEFAULT_RATES);
        explicit.arrival_s = Some(1.0);
        assert!(error(explicit.size(10_000.0, Some(20_000))).contains("--arrival-s"));
        explicit.arrival_s = Some(0.05);
        explicit.units = Some(500);
        assert!(error(explicit.size(10_000.0, None)).contains("--units 500"), "1× brings 500 waiters");
        explicit.units = Some(100);
        explicit.admit_per_s = Some(1_000);
        let sized = explicit.size(10_000.0, None).expect("sized");
        assert_eq!((sized.units, sized.admit_per_s, sized.waiters[0]), (100, 1_000, 500));
    }

    /// Goal: the sold-out figures count exactly the waiters in line at the last sale, and a
    /// waiter that never heard makes the max unknown rather than small.
    #[test]
    fn sold_out_heard_counts_the_waiters_in_line_at_the_last_sale() {
        let line = |queued, admitted_ms, sold_out_heard_ms| Line { queued, admitted_ms, sold_out_heard_ms };
        let mut lines = vec![
            line(true, Some(500.0), None),    // admitted before the last sale: not waiting then
            line(false, None, Some(2_100.0)), // its join already said sold out
            line(true, None, Some(1_250.0)),  // heard 250 ms after
            line(true, None, Some(1_900.0)),  // heard 900 ms after
            line(true, None, Some(1_950.0)),  // heard 950 ms after
        ];
        lines.extend((0..197).map(|_| line(true, None, Some(1_100.0))));
        let told = sold_out_heard(&lines, 1_000.0);
        assert_eq!((told.waiting, told.untold), (200, 0));
        assert_eq!(told.max_ms, Some(950.0));
        assert_eq!(told.p99_ms, Some(250.0), "nearest rank: the 198th of 200 sorted");
        lines.push(line(true, None, None));
        let told = sold_out_heard(&lines, 1_000.0);
        assert_eq!((told.waiting, told.untold, told.max_ms), (201, 1, None));
        assert_eq!(told.p99_ms, Some(900.0), "the 199th of 201: the untold one is past the p99's rank");
        assert_eq!(sold_out_heard(&[], 1_000.0), Told { waiting: 0, untold: 0, max_ms: None, p99_ms: None });
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), Some(500.0));
        assert_eq!(quantile(&values, 0.99), Some(990.0));
        assert_eq!(quantile(&values, 0.999), Some(999.0));
        assert_eq!(quantile(&values, 1.0), Some(1000.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_config_puts_the_sku_behind_the_room_and_lifts_the_connection_bounds() {
        let scenario = Scenario { stock: 300, ..crate::dev::scenario::find("standard").expect("standard") };
        let dir = std::path::Path::new("/tmp/x");
        let text = room_toml(
            &scenario.cluster_toml("s", "redis://127.0.0.1:1", "127.0.0.1:9".parse().expect("addr"), dir),
            &protocol::RoomRules { admit_per_s: 150, ..protocol::RoomRules::default() },
            20_000,
        );
        let cluster = Cluster::parse(&text).expect("a valid config");
        let node = &cluster.nodes[0].0;
        assert_eq!(node.http.connections_max, 20_000);
        let skus = cluster.sku_configs_for(&node.id);
        let room = skus[0].terms.waiting_room.clone().expect("a room");
        assert_eq!((room.admit_per_s, room.admit_factor, skus[0].terms.total), (150, 1.5, 300));
    }
}
