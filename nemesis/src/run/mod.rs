//! One schedule from start to verdict, and a run of many: start a fresh fleet, let the buyers
//! in, apply the faults on time, heal, let demand continue until the ledger sells out (or the
//! bound passes), drain the buyers, read the ledger, let the order service settle and read its
//! store, check, report.
//!
//! **Orders and payments.** The fleet runs two order services on a private PostgreSQL and the
//! sandbox payment provider; buyers pay for most orders ([`crate::payer`]), and every order
//! nobody pays expires after the SKU's short pay timeout and its units go back to the ledger,
//! whence the coordinator grants them to the nodes and they sell again. So the run exercises
//! consumption, payment, expiry and release under every fault, and the sale still sells out.
//!
//! **Setups** (`schedule::Setup`): a second SKU created at run time ([`crate::sales`]), sold
//! and judged like the first; a short `[ledger] idempotency_ttl_s` with buyers reusing keys
//! after it (and a key's patience cut below the TTL, so only a deliberate reuse comes after it);
//! the order services on skewed wall clocks (libfaketime, see `testkit::fleet`).
//!
//! **Stripes** (`--stripes K`): every SKU is created split into K stripes, and every read of its
//! books (the monitor's, the sell-out watch, the final read, the order store's) covers each
//! stripe's ledger; see [`crate::stripes`]. The final read waits, within its bound, for no units
//! to be in flight between stripes, as the coordinator completes a transfer after a fault.
//!
//! **Layout.** [`run_schedule`] runs its phases in order, each in a file of its own: `setup`
//! (the schedule drawn, the fleet started, the buyers let in), `fault_phase` (the faults on
//! time, then the heal), `after_heal` (the sell-out, the buyers drained, the books read) and
//! `judge` (the checks and the report). This file holds what they share.

mod after_heal;
mod fault_phase;
mod judge;
mod setup;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ledger::{RedisLedger, SkuId};
use testkit::fleet::{Fleet, FleetSpec, RedisLayout};
use tokio::task::JoinHandle;

use crate::checker::{self, Bounds, FinalLedger, OrderBooks};
use crate::faults::Window;
use crate::history::{Clock, History, Request};
use crate::money::MoneyBooks;
use crate::monitor::{Monitor, Sample, Targets};
use crate::payer::{PayCounts, Payer};
use crate::report::{RunReport, ScheduleError, ScheduleReport};
use crate::room;
use crate::sales::{self, SaleSku};
use crate::schedule::{LeaseTimings, Schedule, Setup};
use crate::workload::{Finished, Workload};

/// Coordinator members: three, so one may die or lose its disk and a majority remains.
pub const MEMBERS: usize = 3;

/// The SKU on sale from the start.
pub const SKU: &str = sales::MAIN.id;

/// Its units.
pub const UNITS: u64 = sales::MAIN.total;

/// `seckill orders` processes (`o1`, `o2`), each a consumer of the group and a sweeper.
pub const ORDER_SERVICES: usize = 2;

/// After the ledger's final read, the order service must have stored every order event and
/// expired and given back every unpaid order within this: a pay timeout, a sweep, and a
/// consumer's claim of a dead peer's entries, with room for PostgreSQL's crash recovery.
const ORDERS_SETTLE: Duration = Duration::from_secs(30);

/// `[orders]` keys of the fleet: a dead consumer's entries are claimed after a second, and
/// the sweeper looks often, so expiries follow the pay timeout closely.
const ORDERS_TOML: &str = "claim_idle_ms = 1000\nsweep_every_ms = 200\n";

/// `[payments]` grace and query limit, in seconds: short, so an order whose payment started
/// and never came still ends within the run.
const PAY_GRACE_S: u64 = 5;
const QUERY_LIMIT_S: u64 = 10;

/// After the buyers stop, paying buyers under way (one paying late waits out a pay timeout and
/// the grace) may go on this long.
const PAYERS_DRAIN: Duration = Duration::from_secs(20);

/// Lease timings of the fleet (written into its `[coordinator]`) and of the schedules.
pub const TIMINGS: LeaseTimings = LeaseTimings { lease_ms: 1_500, grace_ms: 300 };

/// Purchase attempts per second after the heal: sells the rest of the stock in a few seconds.
const RUSH_PER_S: u64 = 150;

/// Buyers sending at once.
const BUYERS: usize = 24;

/// Attempts per schedule at most: far beyond what a sell-out needs.
const KEYS_MAX: u64 = UNITS * 20;

/// A buyer's wait for one answer; longer than a node's confirmation timeout (2 s), so a live
/// node answers 503 before the buyer gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a buyer keeps retrying one key.
const KEY_PATIENCE: Duration = Duration::from_secs(20);

/// Chance a decided key is sent once more to a random node.
const REPEAT_CHANCE: f64 = 0.1;

/// Chance a new purchase is sent under another buyer's recent key (a key is its buyer's).
pub(crate) const SHARED_KEY_CHANCE: f64 = 0.05;

/// With a short idempotency TTL: chance a decided key is used again after it.
const REUSE_CHANCE: f64 = 0.3;

/// A reuse comes this long after the TTL has passed since the key's last answer: past the
/// checker's gap between uses (`USE_GAP_SLACK_MS`), so the reuse is judged as a use of its own.
const REUSE_MARGIN: Duration = Duration::from_millis(checker::USE_GAP_SLACK_MS + 1_000);

/// Longest the admin API may take to create the run-time SKU, from its due time.
const CREATE_SKU_MAX: Duration = Duration::from_secs(30);

/// After the heal the ledger must sell out within this (the `undersell` bound).
pub const SELL_OUT_AFTER_HEAL: Duration = Duration::from_secs(30);

/// After new keys stop, keys under way may retry this long.
const DRAIN: Duration = Duration::from_secs(10);

/// A fresh fleet must be ready and hold the whole stock within this.
const STARTUP_MAX: Duration = Duration::from_secs(30);

/// The checks' bounds. Stranded: 2 × lease + grace + 2 s, as a dead node's units are granted
/// elsewhere after lease + grace, or one lease later when most nodes lapse at once (the
/// leader's brake), plus a tick; the rest absorbs a loaded machine. A ledger call's deadline is
/// the fleet's default `call_timeout_ms`.
pub const BOUNDS: Bounds = Bounds {
    sell_out_after_heal_ms: SELL_OUT_AFTER_HEAL.as_millis() as u64,
    stranded_ms: 2 * TIMINGS.lease_ms + TIMINGS.grace_ms + 2_000,
    // A coordinator tick, a raft write and a node heartbeat (≈ 0.35 s measured on seed
    // 20261131's evidence), with room for a loaded machine.
    release_to_node_ms: 1_000,
    coordinator_settle_ms: 10_000,
    ledger_call_ms: 500,
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `seckill` binary the fleet runs.
    pub exe: PathBuf,
    /// Schedule `i` uses seed `seed + i`, so `--seed S --schedules 1` replays schedule S alone.
    pub seed: u64,
    pub schedules: usize,
    pub nodes: usize,
    pub fault_phase: Duration,
    /// Where histories, samples, ledgers and (for violating schedules) logs go.
    pub out: Option<PathBuf>,
    /// The ledger's Redis: one server, or a Sentinel group (master, replica, three sentinels)
    /// or a Redis Cluster (three masters with a replica each) with `durability = "replica"`,
    /// where Redis faults hit the SKU's master and kills are failovers (see `schedule`).
    pub redis: RedisLayout,
    /// Buyers prove who they are (`[auth] mode = "jwt"`, a secret drawn per schedule); off:
    /// `mode = "none"`, the body's user is believed.
    pub verified_buyers: bool,
    /// Stripes each SKU of the run is split into (`stripes` in its `[[skus]]` and in the admin
    /// API's create); 1: unstriped. Every read of a SKU's books covers each of its stripes.
    pub stripes: u32,
    /// A third SKU sold only through a waiting room, to waiters of its own ([`crate::room`]).
    pub waiting_room: bool,
}

/// Runs every schedule; `each` hears of each one as it ends.
pub async fn run(options: &Options, mut each: impl FnMut(&ScheduleReport)) -> anyhow::Result<RunReport> {
    anyhow::ensure!(options.nodes >= 2, "the nemesis needs at least 2 nodes");
    anyhow::ensure!(options.fault_phase >= Duration::from_secs(5), "the fault phase must last at least 5 s");
    let most = protocol::STRIPES_MAX.min(sales::RUNTIME.total.min(UNITS) as u32);
    anyhow::ensure!((1..=most).contains(&options.stripes), "--stripes must be 1 to {most}");
    let started = Instant::now();
    let bar = testkit::progress::steps(options.schedules as u64, "schedules");
    let mut reports = Vec::with_capacity(options.schedules);
    let mut errors = Vec::new();
    for at in 0..options.schedules {
        let seed = options.seed.wrapping_add(at as u64);
        // A fleet that would not start or heal is the machine's trouble, not a verdict: noted,
        // and the run goes on.
        match run_schedule(options, seed).await {
            Ok(report) => {
                each(&report);
                reports.push(report);
            }
            Err(e) => {
                tracing::warn!("schedule with seed {seed} could not run: {e:#}");
                errors.push(ScheduleError { seed, error: format!("{e:#}") });
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut report = RunReport::new(
        options.seed,
        options.nodes,
        options.redis,
        options.fault_phase.as_secs(),
        reports,
        started.elapsed().as_secs_f64(),
    );
    report.errors = errors;
    Ok(report)
}

/// A fresh HS256 secret for one schedule's buyers; a fixed one if the random source fails (the
/// fleet is private to the schedule, so the secret guards nothing outside it).
fn buyer_secret() -> String {
    auth::mint::generate_secret().unwrap_or_else(|_| "nemesis-buyer-secret-of-thirty-two-bytes".to_string())
}

fn fleet_spec(options: &Options, setup: &Setup) -> FleetSpec {
    let mut skus = sales::MAIN.striped(options.stripes).toml();
    if options.waiting_room {
        skus.push('\n');
        skus.push_str(&room::toml(orders::unix_ms()));
    }
    let mut spec = FleetSpec::new(&options.exe, MEMBERS, options.nodes, skus);
    if let Some(ttl) = setup.idempotency_ttl_s {
        // `sale_record_ttl_s` keeps its default (two days), which the config checks against
        // the pay timeout: releases never depend on the idempotency record.
        spec.ledger_toml = format!("idempotency_ttl_s = {ttl}\n");
    }
    spec.orders_clock_skew_s = setup.orders_clock_skew_s.clone();
    spec.proxied = true;
    spec.redis = options.redis;
    spec.order_ids = true;
    spec.orders = ORDER_SERVICES;
    spec.orders_toml = ORDERS_TOML.to_string();
    spec.payments = true;
    spec.payments_toml = format!("pay_grace_s = {PAY_GRACE_S}\nquery_limit_s = {QUERY_LIMIT_S}\n");
    spec.admin_token = Some(crate::faults::ADMIN_TOKEN.to_string());
    spec.buyer_secret = options.verified_buyers.then(buyer_secret);
    spec.coordinator_toml = format!(
        "heartbeat_ms = 150\nlease_ms = {}\ngrace_ms = {}\nfence_margin_ms = 200\n\
         election_timeout_min_ms = 150\nelection_timeout_max_ms = 300\n",
        TIMINGS.lease_ms, TIMINGS.grace_ms
    );
    spec
}

/// One SKU of a schedule as it sold (see [`crate::sales`]).
struct Selling {
    terms: SaleSku,
    sku: SkuId,
    /// The ledgers its stock is kept in: `[sku]`, or each of its stripes.
    ledgers: Vec<SkuId>,
    /// When the admin API created it; none for the SKU of the config.
    created_ms: Option<u64>,
    /// When the run first saw nothing left for sale in its ledgers (nor between them).
    sold_out_ms: Option<u64>,
}

/// What a schedule's phases share, from the sale's opening to the verdict.
struct Sale {
    seed: u64,
    /// `--stripes`: the run-time SKU is created split as the others.
    stripes: u32,
    schedule: Schedule,
    /// The SKU on sale from the start; the monitor samples it.
    sku: SkuId,
    targets: Targets,
    /// Every SKU judged; the run-time SKU joins once created.
    sellings: Vec<Selling>,
    /// The setup's short idempotency TTL, if it has one.
    ttl: Option<Duration>,
    paysim: SocketAddr,
    clock: Clock,
    history: History,
    /// The run-time SKU's creation, under way until the setup's time comes; it answers when the
    /// SKU was created.
    creating: Option<JoinHandle<Result<u64, String>>>,
    fleet: Fleet,
}

/// Who keeps the sale busy until it is over. Bound after the [`Sale`] in [`run_schedule`], so a
/// schedule that fails midway stops them (as they drop) before its fleet dies.
struct Buyers {
    waiters: Option<room::Waiters>,
    workload: Workload,
    monitor: Monitor,
    payer: Payer,
}

/// The faults as they ran, and when the heal was done.
struct Healed {
    windows: Vec<Window>,
    heal_ms: u64,
}

/// What the sale left once over: the evidence the judgement reads.
struct Ended {
    /// The connection that watched the sell-out; the room's admission log is read through it.
    watch: RedisLedger,
    /// When the buyers ran out of keys, if they did before every SKU sold out.
    demand_ended_ms: Option<u64>,
    /// What the room's waiters heard, and how the room ended.
    room: Option<(Vec<room::WaiterLog>, room::RoomEnd)>,
    keys: u64,
    finished: Finished,
    paying: PayCounts,
    samples: Vec<Sample>,
    /// Each selling's ledger, as read after the buyers stopped, in the order of the sellings.
    finals: Vec<FinalLedger>,
    coordinator: Result<(), String>,
    requests: Vec<Request>,
    /// Each selling's order books, in the order of the sellings.
    books: Vec<OrderBooks>,
    money: Result<MoneyBooks, String>,
}

/// One schedule: see the module docs.
pub async fn run_schedule(options: &Options, seed: u64) -> anyhow::Result<ScheduleReport> {
    let wall = Instant::now();
    let (mut sale, buyers) = setup::open(options, seed).await?;
    let healed = fault_phase::apply_and_heal(&mut sale).await?;
    let ended = after_heal::sell_out_and_read(&mut sale, buyers, healed.heal_ms).await?;
    judge::judge(options, &sale, healed, ended, wall).await
}

/// Every member's name and address.
fn member_addrs(fleet: &Fleet) -> anyhow::Result<Vec<(String, SocketAddr)>> {
    fleet.member_names().into_iter().map(|name| Ok((name.clone(), fleet.addr(&name)?))).collect()
}

/// Whether `request` bought `sku` (a history without SKUs sold the main one only).
fn sells(request: &Request, sku: &SkuId) -> bool {
    request.sku == sku.as_str() || (request.sku.is_empty() && sku.as_str() == SKU)
}
