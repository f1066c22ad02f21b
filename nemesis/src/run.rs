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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::{RedisLedger, SkuId};
use testkit::fleet::{self, Fleet, FleetSpec, RedisLayout};

use crate::books;
use crate::checker::{self, Bounds, Evidence, FinalLedger};
use crate::faults::Injector;
use crate::history::{Clock, History, Request};
use crate::money;
use crate::monitor::{self, Monitor, Targets};
use crate::payer::{PayPlan, Payer};
use crate::report::{self, RunReport, SaleReport, ScheduleError, ScheduleReport};
use crate::room;
use crate::sales::{self, SaleSku};
use crate::schedule::{LeaseTimings, Schedule, Setup};
use crate::stripes;
use crate::workload::{Workload, WorkloadPlan};

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

/// One schedule: see the module docs.
pub async fn run_schedule(options: &Options, seed: u64) -> anyhow::Result<ScheduleReport> {
    let wall = Instant::now();
    let phase_ms = options.fault_phase.as_millis() as u64;
    let schedule = Schedule::draw(seed, options.nodes, MEMBERS, ORDER_SERVICES, options.redis, phase_ms, TIMINGS);
    let setup = &schedule.setup;
    let spec = fleet_spec(options, setup);
    let mut fleet = Fleet::start(&spec).await?;
    if let Err(e) = open_sale(&mut fleet).await {
        let mut tails = String::new();
        for name in fleet.member_names().into_iter().chain(fleet.node_names()) {
            tails += &format!("\n---- {name} (last lines) ----\n{}", fleet.log_tail(&name, 10));
        }
        if let Some(out) = &options.out {
            fleet.copy_logs(&out.join(format!("seed-{seed}")).join("logs"))?;
        }
        return Err(e.context(format!("the fleet did not open the sale{tails}")));
    }
    let sku = SkuId::new(SKU)?;
    let members = member_addrs(&fleet)?;
    let main_sale = sales::MAIN.striped(options.stripes);
    let targets = Targets {
        sku: sku.clone(),
        ledgers: main_sale.ledgers()?,
        redis_url: fleet.ledger_url(),
        key_prefix: "seckill".into(),
        members: members.clone(),
        cluster_token: testkit::fleet::TEST_CLUSTER_TOKEN.to_string(),
        nodes: monitor::NodeList::new(fleet.node_addrs()),
    };
    let mut sellings = vec![Selling {
        terms: main_sale,
        sku: sku.clone(),
        ledgers: targets.ledgers.clone(),
        created_ms: None,
        sold_out_ms: None,
    }];
    if options.waiting_room {
        let (sku, ledgers) = (SkuId::new(room::ROOM.id)?, room::ROOM.ledgers()?);
        sellings.push(Selling { terms: room::ROOM, sku, ledgers, created_ms: None, sold_out_ms: None });
    }
    let ttl = setup.idempotency_ttl_s.map(Duration::from_secs);
    let bearer = spec.buyer_secret.as_ref().map(|secret| {
        Arc::new(auth::mint::Minter::hs256(secret.as_bytes(), fleet::BUYER_ISSUER, fleet::BUYER_AUDIENCE))
    });
    let paysim = fleet.paysim_addr().context("the fleet runs no sandbox provider")?;
    let prices = sales::prices();
    let payer = Payer::start(PayPlan { orders: fleet.orders_apis(), paysim, seed, bearer: bearer.clone(), prices });
    let clock = Clock::start();
    let history = History::new(clock);
    let monitor = Monitor::start(targets.clone(), clock)?;
    let plan = WorkloadPlan {
        skus: vec![SKU.into()],
        nodes: fleet.node_addrs(),
        users: UNITS,
        buyers: BUYERS,
        keys_max: KEYS_MAX,
        request_timeout: REQUEST_TIMEOUT,
        // Every retry of one use of a key must come within the TTL of its sale (the checker
        // judges a use as one purchase): patience plus a last answer and a repeat's.
        key_patience: ttl.map_or(KEY_PATIENCE, |ttl| {
            let room = ttl.saturating_sub(2 * REQUEST_TIMEOUT + Duration::from_millis(checker::USE_GAP_SLACK_MS));
            room.min(KEY_PATIENCE)
        }),
        repeat_chance: REPEAT_CHANCE,
        reuse_after: ttl.map(|ttl| ttl + REUSE_MARGIN),
        reuse_chance: REUSE_CHANCE,
        shared_key_chance: SHARED_KEY_CHANCE,
        receipts: Some(payer.receipts()),
        seed,
        bearer: bearer.clone(),
    };
    let receipts = plan.receipts.clone();
    let workload = Workload::start(plan, history.clone(), schedule.demand_per_s);
    let waiters = options.waiting_room.then(|| {
        let nodes = fleet.node_addrs();
        room::Waiters::start(nodes, history.clone(), receipts, bearer.clone(), seed)
    });
    history.event(None, format!("sale open: {UNITS} units, {} attempts/s", schedule.demand_per_s));
    let setup_labels = setup.labels();
    if !setup_labels.is_empty() {
        history.event(None, format!("setup: {}", setup_labels.join(", ")));
    }
    let creating = setup.runtime_sku_at_ms.map(|at_ms| {
        let (opener, history, members) = (workload.opener(), history.clone(), members.clone());
        let terms = sales::RUNTIME.striped(options.stripes);
        tokio::spawn(async move {
            tokio::time::sleep_until(clock.instant_at(at_ms).into()).await;
            history.event(None, format!("admin create {}: {} units", terms.id, terms.total));
            let created = sales::create(&members, crate::faults::ADMIN_TOKEN, &terms, CREATE_SKU_MAX).await;
            match &created {
                Ok(by) => {
                    history.event(None, format!("{} created by {by}; buyers may buy it", terms.id));
                    opener.open(terms.id);
                }
                Err(e) => history.event(None, format!("{} not created: {e}", terms.id)),
            }
            created.map(|_| clock.now_ms())
        })
    });

    let (windows, heal_ms) = {
        let sku_key = format!("{}:{{{SKU}}}", targets.key_prefix);
        let mut injector = Injector::new(&mut fleet, history.clone(), sku_key);
        let mut steps: Vec<(u64, bool, usize)> = Vec::new();
        for fault in &schedule.faults {
            steps.push((fault.start_ms, true, fault.id));
            steps.push((fault.end_ms, false, fault.id));
        }
        // Ends before starts at the same moment: a target is free again before it is reused.
        steps.sort_by_key(|(at, start, id)| (*at, *start, *id));
        for (at, start, id) in steps {
            tokio::time::sleep_until(clock.instant_at(at).into()).await;
            if start {
                injector.start(&schedule.faults[id]).await?;
            } else {
                injector.end(id).await?;
            }
        }
        tokio::time::sleep_until(clock.instant_at(phase_ms).into()).await;
        injector.heal().await?;
        (injector.windows().to_vec(), clock.now_ms())
    };
    if let Some(creating) = creating {
        let created_ms = creating.await.context("the run-time SKU's creation")?;
        let created_ms = created_ms.map_err(|e| anyhow::anyhow!("the run-time SKU: {e}"))?;
        let terms = sales::RUNTIME.striped(options.stripes);
        let (sku, ledgers) = (SkuId::new(terms.id)?, terms.ledgers()?);
        sellings.push(Selling { terms, sku, ledgers, created_ms: Some(created_ms), sold_out_ms: None });
    }

    workload.set_rate(RUSH_PER_S);
    let deadline = clock.instant_at(heal_ms) + SELL_OUT_AFTER_HEAL;
    let mut demand_ended_ms = None;
    let watch = books::watch_ledger(&targets)?;
    while Instant::now() < deadline {
        for selling in sellings.iter_mut().filter(|s| s.sold_out_ms.is_none()) {
            // The monitor reads the main SKU every tick; the others are asked here.
            let remaining = if selling.sku == sku {
                monitor.latest().and_then(|s| s.ledger).map(|l| l.unsold())
            } else {
                books::unsold(&watch, &selling.ledgers).await
            };
            if remaining == Some(0) {
                selling.sold_out_ms = Some(clock.now_ms());
            }
        }
        if sellings.iter().all(|s| s.sold_out_ms.is_some()) {
            break;
        }
        if workload.exhausted() {
            demand_ended_ms = Some(clock.now_ms());
            break;
        }
        tokio::time::sleep(monitor::TICK / 2).await;
    }
    // Waiters still listening get their bound to hear the sell-out before they stop.
    let room_logs = match waiters {
        Some(waiters) => {
            let room_sku = SkuId::new(room::ROOM.id)?;
            let end = room_settles(&watch, &room_sku, &clock).await;
            history.event(
                None,
                match end.sold_out_since_ms {
                    Some(since) => format!("{}: sold out since {since} ms; its waiters stop", room::ROOM.id),
                    None => format!("{}: units left; its waiters stop", room::ROOM.id),
                },
            );
            Some((waiters.finish().await, end))
        }
        None => None,
    };
    history.event(None, "new keys stop; keys under way drain");
    let keys = workload.keys();
    let finished = workload.finish(DRAIN).await;
    let paying = payer.finish(PAYERS_DRAIN).await;
    history.event(None, format!("buyers stopped paying: {paying:?}"));
    let samples = monitor.stop().await;
    let mut finals = Vec::new();
    for selling in &sellings {
        finals.push(books::read_final(&targets.with_sku(selling.sku.clone(), selling.ledgers.clone()), clock).await);
    }
    history.event(None, "ledger read");
    let members_now = member_addrs(&fleet)?;
    let settle_ms = Duration::from_millis(BOUNDS.coordinator_settle_ms);
    let coordinator = books::agreement(&members_now, testkit::fleet::TEST_CLUSTER_TOKEN, settle_ms).await;
    history.event(None, format!("members agree on a leader: {}", coordinator.is_ok()));
    let requests = history.requests();
    // A clock behind expires orders later by as much; a started payment stretches its order's
    // deadline by the grace and then the queries.
    let behind_s = setup.orders_clock_skew_s.iter().map(|skew| (-skew).max(0) as u64).max().unwrap_or(0);
    let settle = ORDERS_SETTLE + Duration::from_secs(behind_s + PAY_GRACE_S + QUERY_LIMIT_S);
    let mut books = Vec::new();
    for selling in &sellings {
        let targets = targets.with_sku(selling.sku.clone(), selling.ledgers.clone());
        let sold: Vec<Request> = requests.iter().filter(|r| sells(r, &selling.sku)).cloned().collect();
        let order_books = books::read_order_books(fleet.store_url().as_deref(), &targets, &sold, settle).await;
        history.event(None, format!("{}: order store read; settled: {:?}", selling.sku, order_books.settled));
        books.push(order_books);
    }

    let released: BTreeSet<String> = books
        .iter()
        .filter_map(|b| b.releases.as_ref().ok())
        .flat_map(|(log, _)| log.iter().map(|r| r.order_id.0.clone()))
        .collect();
    let money = books::read_money(fleet.store_url().as_deref(), paysim, released, settle).await;
    history.event(
        None,
        format!(
            "money read: {}",
            money.as_ref().map_or_else(|e| e.clone(), |m| format!("{} payments taken", m.taken().count()))
        ),
    );

    let events = history.events();
    let nodes = fleet.node_names();
    let mut violations = Vec::new();
    let mut sale_reports = Vec::new();
    let mut untold_sales = 0;
    for ((selling, final_ledger), order_books) in sellings.iter().zip(&finals).zip(&books) {
        let main = selling.sku == sku;
        let sold: Vec<Request> = requests.iter().filter(|r| sells(r, &selling.sku)).cloned().collect();
        let sold_out_ms = match main {
            true => samples.iter().find(|s| s.ledger.is_some_and(|l| l.unsold() == 0)).map(|s| s.at_ms),
            false => selling.sold_out_ms,
        };
        let sold_out_ms = sold_out_ms.or_else(|| {
            let unsold = |s: &&ledger::SkuStatus| stripes::unsold(s.remaining, s.transferred_out, s.transferred_in);
            final_ledger.status.as_ref().ok().filter(|s| unsold(s) == 0).map(|_| final_ledger.at_ms)
        });
        let evidence = Evidence {
            total: selling.terms.total,
            per_user_limit: selling.terms.per_user_limit,
            nodes: &nodes,
            requests: &sold,
            // The monitor samples the main SKU: the rules on samples judge it alone.
            samples: if main { &samples } else { &[] },
            windows: &windows,
            ledger: final_ledger,
            heal_ms,
            sold_out_ms,
            demand_ended_ms,
            // Once per schedule, with the main SKU.
            truncated: main && history.truncated(),
            coordinator: if main { coordinator.clone() } else { Ok(()) },
            bounds: BOUNDS,
            order_books: Some(order_books),
            idempotency_ttl_ms: ttl.unwrap_or(ledger::IDEMPOTENCY_TTL_DEFAULT).as_millis() as u64,
            clock_origin_unix_ms: clock.origin_unix_ms(),
        };
        for mut violation in checker::check(&evidence) {
            if !main {
                violation.detail = format!("{}: {}", selling.sku, violation.detail);
            }
            violations.push(violation);
        }
        let told: BTreeSet<&str> =
            sold.iter().filter(|r| r.is_purchase()).filter_map(|r| r.order_id.as_deref()).collect();
        untold_sales += final_ledger
            .orders
            .as_ref()
            .map(|orders| orders.iter().filter(|o| !told.contains(o.order_id.0.as_str())).count() as u64)
            .unwrap_or(0);
        sale_reports.push(SaleReport {
            sku: selling.sku.to_string(),
            total: selling.terms.total,
            sold: final_ledger.status.as_ref().ok().map(|s| s.sold),
            created_ms: selling.created_ms,
            sold_out_ms,
        });
    }
    violations.extend(money::check(&money));
    let room_read = match &room_logs {
        Some((logs, end)) => Some(judge_room(logs, *end, &watch, &sellings, &finals, heal_ms).await?),
        None => None,
    };
    if let Some((found, _)) = &room_read {
        violations.extend(found.iter().cloned());
    }
    let main_sold_out_ms = sale_reports.first().and_then(|s| s.sold_out_ms);
    let heal_times = report::heal_times(&requests, &windows, heal_ms, main_sold_out_ms);
    let mut outcomes = BTreeMap::new();
    for request in &requests {
        *outcomes.entry(request.outcome.clone()).or_insert(0) += 1;
    }
    let details = report::details(seed, &violations, &events, &requests, &samples);
    let report = ScheduleReport {
        seed,
        faults: windows,
        setup: setup_labels,
        heal_ms,
        time_to_heal_ms: heal_times.heal,
        fault_recovery_ms: heal_times.faults,
        node_recovery_ms: heal_times.nodes,
        sold_out_ms: main_sold_out_ms,
        total: UNITS,
        sold: sale_reports.first().and_then(|s| s.sold),
        sales: sale_reports,
        requests: requests.len() as u64,
        keys,
        reused_keys: finished.reused_keys,
        payments: money.as_ref().map_or(0, |m| m.taken().count() as u64),
        paying,
        outcomes,
        untold_sales,
        unresolved_keys: finished.unresolved_keys,
        violations,
        details,
        wall_ms: wall.elapsed().as_millis() as u64,
    };
    if let Some(out) = &options.out {
        let dir = out.join(format!("seed-{seed}"));
        let ledgers: Vec<(&SkuId, &FinalLedger)> = sellings.iter().map(|s| &s.sku).zip(&finals).collect();
        write_out(&dir, &schedule, &report, &events, &requests, &samples, &ledgers)?;
        if let (Some((logs, _)), Some((_, admissions))) = (&room_logs, &room_read) {
            let room = serde_json::json!({ "waiters": logs, "admissions": admissions.as_ref().ok().map(|log| {
                log.iter().map(|a| (a.seq, a.position, a.user.clone(), a.at_ms, a.remaining, a.live)).collect::<Vec<_>>()
            }) });
            std::fs::write(dir.join("room.json"), serde_json::to_vec_pretty(&room)?)?;
        }
        if !report.violations.is_empty() {
            fleet.copy_logs(&dir.join("logs"))?;
        }
    }
    Ok(report)
}

/// The room SKU's rules ([`room::check`]) on what its waiters heard, the ledger's admission
/// log and its sales; with the log as read, for `--out`.
async fn judge_room(
    logs: &[room::WaiterLog],
    end: room::RoomEnd,
    watch: &RedisLedger,
    sellings: &[Selling],
    finals: &[FinalLedger],
    heal_ms: u64,
) -> anyhow::Result<(Vec<checker::Violation>, Result<Vec<ledger::Admission>, String>)> {
    let sku = SkuId::new(room::ROOM.id)?;
    let at = sellings.iter().position(|selling| selling.sku == sku).context("the room SKU was not sold")?;
    let mut admissions = Vec::new();
    let admissions = loop {
        match ledger::SalesLedger::room_admissions(watch, &sku, admissions.len() as u64, 1000).await {
            Ok(page) if page.is_empty() => break Ok(admissions),
            Ok(page) => admissions.extend(page),
            Err(e) => break Err(e.to_string()),
        }
    };
    let bought_by_user = finals[at].orders.clone().map(|orders| {
        let mut bought = BTreeMap::new();
        for order in orders {
            *bought.entry(order.user.as_str().to_string()).or_insert(0) += u64::from(order.qty);
        }
        bought
    });
    let evidence =
        room::RoomEvidence { waiters: logs, admissions: &admissions, bought_by_user: &bought_by_user, end, heal_ms };
    let found = room::check(&evidence).into_iter().map(|mut v| {
        v.detail = format!("{}: {}", room::ROOM.id, v.detail);
        v
    });
    Ok((found.collect(), admissions))
}

/// Every member's name and address.
fn member_addrs(fleet: &Fleet) -> anyhow::Result<Vec<(String, std::net::SocketAddr)>> {
    fleet.member_names().into_iter().map(|name| Ok((name.clone(), fleet.addr(&name)?))).collect()
}

/// Whether `request` bought `sku` (a history without SKUs sold the main one only).
fn sells(request: &Request, sku: &SkuId) -> bool {
    request.sku == sku.as_str() || (request.sku.is_empty() && sku.as_str() == SKU)
}

/// Longest the run waits for the room SKU to stay sold out before its waiters stop: units that
/// expired orders give back can reopen the line more than once.
const ROOM_SETTLE_MAX: Duration = Duration::from_secs(20);

/// Waits until the room SKU has stayed sold out for the bound its waiters have to hear it (or
/// [`ROOM_SETTLE_MAX`] passed): the waiters then stop on a sell-out they all should know of.
async fn room_settles(watch: &RedisLedger, sku: &SkuId, clock: &Clock) -> room::RoomEnd {
    let give_up = Instant::now() + ROOM_SETTLE_MAX;
    let mut sold_out_since_ms = None;
    loop {
        let now_ms = clock.now_ms();
        match books::unsold(watch, std::slice::from_ref(sku)).await {
            Some(0) => {
                let since = *sold_out_since_ms.get_or_insert(now_ms);
                if now_ms >= since + room::SOLD_OUT_HEARD_WITHIN_MS {
                    break;
                }
            }
            // Units back, or a read that failed: the stretch is not known to be unbroken.
            _ => sold_out_since_ms = None,
        }
        if Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    room::RoomEnd { sold_out_since_ms, stopped_ms: clock.now_ms() }
}

/// Starts every process and waits until every node is ready and their allotments add up to
/// the whole stock: the sale is fully open.
async fn open_sale(fleet: &mut Fleet) -> anyhow::Result<()> {
    fleet.start_all()?;
    fleet.wait_ready(STARTUP_MAX).await?;
    let deadline = Instant::now() + STARTUP_MAX;
    loop {
        let held = crate::monitor::stock_held(fleet.node_addrs().into_iter().map(|(_, addr)| addr), SKU).await;
        if held >= UNITS {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the nodes hold {held} of {UNITS} units after {STARTUP_MAX:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write_out(
    dir: &Path,
    schedule: &Schedule,
    report: &ScheduleReport,
    events: &[crate::history::Event],
    requests: &[crate::history::Request],
    samples: &[crate::monitor::Sample],
    ledgers: &[(&SkuId, &FinalLedger)],
) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let json_lines = |name: &str, lines: Vec<String>| -> anyhow::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(dir.join(name))?);
        for line in lines {
            writeln!(file, "{line}")?;
        }
        Ok(file.flush()?)
    };
    std::fs::write(dir.join("schedule.json"), serde_json::to_string_pretty(schedule)?)?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(report)?)?;
    json_lines("timeline.jsonl", events.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect())?;
    json_lines("history.jsonl", requests.iter().map(|r| serde_json::to_string(r).unwrap_or_default()).collect())?;
    json_lines("samples.jsonl", samples.iter().map(|s| serde_json::to_string(s).unwrap_or_default()).collect())?;
    for (at, (sku, ledger)) in ledgers.iter().enumerate() {
        let mut ledger_json = serde_json::json!({
            "sku": sku,
            "status": ledger.status.as_ref().map_err(|e| e.clone()),
            "orders": ledger.orders.as_ref().map_err(|e| e.clone()),
            "releases": ledger.releases.as_ref().map_err(|e| e.clone()),
            "sellers": ledger.sellers,
            "at_ms": ledger.at_ms,
        });
        if !ledger.stripes.is_empty() {
            ledger_json["stripes"] = serde_json::to_value(&ledger.stripes)?;
        }
        // The main SKU's keeps the name it always had.
        let name = if at == 0 { "ledger.json".to_string() } else { format!("ledger-{sku}.json") };
        std::fs::write(dir.join(name), serde_json::to_string_pretty(&ledger_json)?)?;
    }
    if !report.details.is_empty() {
        std::fs::write(dir.join("violations.txt"), report.details.join("\n"))?;
    }
    Ok(())
}
