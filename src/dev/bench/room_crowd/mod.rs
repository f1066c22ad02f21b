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

mod figures;
mod render;
mod waiters;

use self::figures::*;
use self::waiters::*;

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
#[expect(clippy::too_many_lines, reason = "one rate from a fresh cluster to the audit, in the order it runs; lab code")]
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
