//! The nemesis on the Compose fleet (`seckill nemesis --docker`, and the Docker tests): the
//! fleet of `deploy/` as containers on their own network, broken at the container and network
//! level ([`inject`]) by schedules drawn from a seed or written by hand ([`plan`]), its buyers
//! buying and paying through nginx, and every schedule judged by the same checker as the
//! fleets of processes, on the same evidence: the history, the monitor's samples, the ledger,
//! the order store and the money.
//!
//! One fleet serves a whole run: each schedule sells a SKU of its own, created through the
//! admin API, so a run of 30 schedules starts the fleet once. A schedule heals everything and
//! waits for every container to be healthy before the next begins; a schedule that cannot run
//! (the fleet would not heal) brings a fresh fleet up for the rest.
//!
//! Layout: `plan` (what a schedule does) ← `inject` (doing and undoing it) ← this module
//! (the fleet's config, the schedule's sale and its verdict).

pub mod inject;
pub mod plan;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::SkuId;
use serde::Serialize;
use testkit::compose::{ComposeFleet, ComposeSpec};

use self::inject::{DockerInjector, JoinerGrant};
use self::plan::{DockerPlan, Start};
use crate::books;
use crate::checker::{self, Bounds, Evidence, FinalLedger, OrderBooks};
use crate::faults::Window;
use crate::history::{Clock, Event, History, Request};
use crate::money::MoneyBooks;
use crate::monitor::{self, Monitor, NodeList, Sample, Targets};
use crate::payer::{PayCounts, PayPlan, Payer};
use crate::report::{self, RunReport, SaleReport, ScheduleError, ScheduleReport};
use crate::sales::SaleSku;
use crate::workload::{Finished, Workload, WorkloadPlan};

/// The checks' bounds on the Compose fleet: the lease of its config ([`plan::LEASE_MS`]), and
/// room for containers on a loaded two-core machine.
pub const BOUNDS: Bounds = Bounds {
    sell_out_after_heal_ms: SELL_OUT_AFTER_HEAL.as_millis() as u64,
    stranded_ms: 2 * plan::LEASE_MS + plan::GRACE_MS + 3_000,
    release_to_node_ms: 1_500,
    coordinator_settle_ms: 15_000,
    ledger_call_ms: 500,
};

/// After the heal the ledger must sell out within this.
const SELL_OUT_AFTER_HEAL: Duration = Duration::from_secs(45);

/// Purchase attempts per second after the heal.
const RUSH_PER_S: u64 = 400;

/// Buyers sending at once, through nginx.
const BUYERS: usize = 32;

/// A buyer's wait for one answer: past nginx's own read timeout (5 s), so a buyer hears what
/// nginx says rather than giving up first.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// How long a buyer keeps retrying one key.
const KEY_PATIENCE: Duration = Duration::from_secs(30);

/// After new keys stop, keys under way may retry this long.
const DRAIN: Duration = Duration::from_secs(5);

/// Paying buyers under way may go on this long after the buyers stop.
const PAYERS_DRAIN: Duration = Duration::from_secs(20);

/// The order store must have every order and every unpaid one given back within this.
const ORDERS_SETTLE: Duration = Duration::from_secs(45);

/// A schedule's SKU must be held by the nodes within this of its creation.
const OPEN_MAX: Duration = Duration::from_secs(30);

/// Pay timeout of a schedule's SKU: short, so unpaid orders expire and sell again in the run,
/// and the books settle soon after the buyers stop (with the config's short payment grace and
/// query limit, a started payment stretches its order by 5 s more).
const PAY_TIMEOUT_S: u64 = 5;

/// What to run.
#[derive(Clone, Debug)]
pub struct DockerOptions {
    /// The repository, whose `deploy/` is brought up.
    pub repo: PathBuf,
    /// The server and lab binaries the images hold; none: `deploy/build-images` compiles them.
    pub server_binary: Option<PathBuf>,
    pub lab_binary: Option<PathBuf>,
    /// Schedule `i` uses seed `seed + i`.
    pub seed: u64,
    pub schedules: usize,
    pub nodes: usize,
    pub fault_phase: Duration,
    /// Where each schedule's history, samples and (on a violation) container logs go.
    pub out: Option<PathBuf>,
}

/// One schedule's report on the Compose fleet: the common one, and what only a container
/// fleet measures.
#[derive(Clone, Debug, Serialize)]
pub struct DockerReport {
    pub plan: String,
    pub schedule: ScheduleReport,
    /// Nodes added mid-sale, and when each first held stock.
    pub joiners: Vec<JoinerGrant>,
    /// Answers that were neither a decision nor a 503 (a buyer should hear nothing else).
    pub not_retryable: BTreeMap<String, u64>,
}

/// The config the fleet runs under the nemesis: `deploy/cluster.toml`, with the order
/// service's consumers and sweeper quick and a started payment's grace and queries short (2 s
/// and 3 s), so unpaid orders of a schedule expire, sell again and settle within it.
pub fn fleet_config(repo: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let path = repo.join("deploy/cluster.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        text.contains("\n[orders]\n") && text.contains("\n[payments]\n"),
        "{} changed shape",
        path.display()
    );
    let text = text
        .replace("\n[orders]\n", "\n[orders]\nclaim_idle_ms = 1000\nsweep_every_ms = 200\n")
        .replace("\n[payments]\n", "\n[payments]\npay_grace_s = 2\nquery_limit_s = 3\n");
    let config = dir.join("cluster.toml");
    std::fs::write(&config, text)?;
    Ok(config)
}

/// Brings the Compose fleet up under the nemesis's config.
pub fn start_fleet(options: &DockerOptions, project: &str, config_dir: &Path) -> anyhow::Result<ComposeFleet> {
    let spec = ComposeSpec {
        repo: options.repo.clone(),
        project: project.to_string(),
        server_binary: options.server_binary.clone(),
        lab_binary: options.lab_binary.clone(),
        nodes: options.nodes,
        config: Some(fleet_config(&options.repo, config_dir)?),
    };
    ComposeFleet::up(&spec)
}

/// Every schedule on one fleet (a fresh one after a schedule that could not run).
pub async fn run(options: &DockerOptions, mut each: impl FnMut(&DockerReport)) -> anyhow::Result<RunReport> {
    anyhow::ensure!(options.nodes >= 2, "the nemesis needs at least 2 nodes");
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let project = format!("seckill-nemesis-{}", std::process::id());
    let mut fleet = Some(start_fleet(options, &project, dir.path())?);
    let (mut reports, mut errors) = (Vec::new(), Vec::new());
    let phase_ms = options.fault_phase.as_millis() as u64;
    for at in 0..options.schedules {
        let seed = options.seed.wrapping_add(at as u64);
        let current = match fleet.take() {
            Some(fleet) => fleet,
            None => start_fleet(options, &project, dir.path())?,
        };
        let plan = DockerPlan::draw(seed, options.nodes, phase_ms);
        match run_plan(&current, &plan, seed, phase_ms, options.out.as_deref()).await {
            Ok(report) => {
                each(&report);
                reports.push(report.schedule);
                fleet = Some(current);
            }
            Err(e) => {
                tracing::warn!("schedule with seed {seed} could not run: {e:#}");
                errors.push(ScheduleError { seed, error: format!("{e:#}") });
                if let Some(out) = &options.out {
                    let _ = current.copy_logs(&out.join(format!("seed-{seed}")).join("logs"));
                }
                current.down()?;
            }
        }
    }
    if let Some(fleet) = fleet {
        fleet.down()?;
    }
    let phase_s = options.fault_phase.as_secs();
    let redis = testkit::fleet::RedisLayout::Sentinel;
    let mut report =
        RunReport::new(options.seed, options.nodes, redis, phase_s, reports, started.elapsed().as_secs_f64());
    report.errors = errors;
    Ok(report)
}

/// One schedule on a running fleet: a SKU of its own opened, buyers through nginx, the steps
/// applied on time (or on sales), everything healed, the rest sold, the books read and judged.
/// `phase_ms`: when the heal comes at the latest, whatever the steps.
pub async fn run_plan(
    fleet: &ComposeFleet,
    plan: &DockerPlan,
    seed: u64,
    phase_ms: u64,
    out: Option<&Path>,
) -> anyhow::Result<DockerReport> {
    let wall = Instant::now();
    let (sale, targets) = open_sale(fleet, plan, seed).await?;
    let paysim = fleet.paysim_addr()?;
    let prices = BTreeMap::from([(sale.id.to_string(), sale.price)]);
    let payer = Payer::start(PayPlan { orders: fleet.orders_apis()?, paysim, seed, bearer: None, prices });
    let clock = Clock::start();
    let history = History::new(clock);
    let monitor = Monitor::start(targets.clone(), clock)?;
    let workload = Workload::start(workload_plan(fleet, &sale, seed, &payer), history.clone(), plan.demand_per_s);
    history.event(
        None,
        format!("sale {} open: {} units, {} attempts/s through nginx", sale.id, sale.total, plan.demand_per_s),
    );

    let mut injector = DockerInjector::new(fleet, history.clone(), targets.nodes.clone(), sale.id)?;
    let heal_ms = apply_steps(&mut injector, plan, &monitor, &clock, phase_ms).await?;
    let windows = injector.windows().to_vec();

    workload.set_rate(RUSH_PER_S);
    let demand_ended_ms = sell_out(&mut injector, &monitor, &workload, clock, heal_ms).await?;
    history.event(None, "new keys stop; keys under way drain");
    let keys = workload.keys();
    let finished = workload.finish(DRAIN).await;
    let paying = payer.finish(PAYERS_DRAIN).await;
    let samples = monitor.stop().await;
    let books = read_books(fleet, &targets, &history, clock, paysim).await?;
    let record = Record { windows, heal_ms, demand_ended_ms, keys, finished, paying, samples, books };

    let nodes_seen: Vec<String> = injector.seen.iter().cloned().collect();
    let violations = check(&sale, &record, &nodes_seen, &history, clock);
    let events = history.events();
    let schedule = schedule_report(seed, plan, &sale, &record, violations, &events, wall);
    if let Some(out) = out {
        write_out(fleet, out, &schedule, &events, &record.books.requests)?;
    }
    let not_retryable = not_retryable(&record.books.requests);
    Ok(DockerReport { plan: plan.name.clone(), schedule, joiners: injector.joiners.clone(), not_retryable })
}

/// What a schedule left once its buyers stopped: what its judgement reads.
struct Record {
    windows: Vec<Window>,
    heal_ms: u64,
    /// When the buyers ran out of keys, if they did before the sell-out.
    demand_ended_ms: Option<u64>,
    keys: u64,
    finished: Finished,
    paying: PayCounts,
    samples: Vec<Sample>,
    books: Books,
}

/// The books read after the buyers stopped.
struct Books {
    final_ledger: FinalLedger,
    coordinator: Result<(), String>,
    requests: Vec<Request>,
    order_books: OrderBooks,
    money: Result<MoneyBooks, String>,
}

/// Creates the schedule's SKU through the admin API and waits until the nodes hold it; its
/// terms, and what the monitor and the books read.
async fn open_sale(fleet: &ComposeFleet, plan: &DockerPlan, seed: u64) -> anyhow::Result<(SaleSku, Targets)> {
    // One name per schedule for the run's life: the nemesis's SKU terms are constants elsewhere.
    let id: &'static str = Box::leak(format!("sale-{seed}-{}", plan.name.replace('_', "-")).into_boxed_str());
    let sale =
        SaleSku { id, total: plan.units, per_user_limit: 2, price: 100, pay_timeout_s: PAY_TIMEOUT_S, stripes: 1 };
    let sku = SkuId::new(sale.id)?;
    let members = fleet.member_addrs()?;
    let admin_token = fleet.secret("admin_token")?;
    let cluster_token = fleet.secret("cluster_token")?;
    crate::sales::create(&members, &admin_token, &sale, OPEN_MAX).await.map_err(|e| anyhow::anyhow!(e))?;
    wait_held(fleet, &sku, sale.total).await?;

    let nodes = NodeList::new(fleet.node_addrs()?);
    let targets = Targets {
        sku: sku.clone(),
        ledgers: vec![sku.clone()],
        redis_url: fleet.ledger_url()?,
        key_prefix: "seckill".into(),
        members,
        cluster_token,
        nodes,
    };
    Ok((sale, targets))
}

/// The buyers of `sale`, all through nginx, handing what they buy to `payer`.
fn workload_plan(fleet: &ComposeFleet, sale: &SaleSku, seed: u64, payer: &Payer) -> WorkloadPlan {
    WorkloadPlan {
        skus: vec![sale.id.to_string()],
        nodes: vec![("lb".to_string(), fleet.lb)],
        users: sale.total,
        buyers: BUYERS,
        keys_max: sale.total * 20,
        request_timeout: REQUEST_TIMEOUT,
        key_patience: KEY_PATIENCE,
        repeat_chance: 0.1,
        reuse_after: None,
        reuse_chance: 0.0,
        shared_key_chance: crate::run::SHARED_KEY_CHANCE,
        receipts: Some(payer.receipts()),
        seed,
        bearer: None,
    }
}

/// Watches until the SKU sold out, the buyers ran out of keys or the bound after the heal
/// passed, following the nodes as they change; returns when demand ended, if it ended on its
/// own.
async fn sell_out(
    injector: &mut DockerInjector<'_>,
    monitor: &Monitor,
    workload: &Workload,
    clock: Clock,
    heal_ms: u64,
) -> anyhow::Result<Option<u64>> {
    let deadline = clock.instant_at(heal_ms) + SELL_OUT_AFTER_HEAL;
    while Instant::now() < deadline {
        injector.refresh_nodes()?;
        if monitor.latest().and_then(|s| s.ledger).is_some_and(|l| l.unsold() == 0) {
            break;
        }
        if workload.exhausted() {
            return Ok(Some(clock.now_ms()));
        }
        tokio::time::sleep(monitor::TICK).await;
    }
    Ok(None)
}

/// The ledger's final read, the members' agreement, then the order store's and the money's
/// books once they settled.
async fn read_books(
    fleet: &ComposeFleet,
    targets: &Targets,
    history: &History,
    clock: Clock,
    paysim: SocketAddr,
) -> anyhow::Result<Books> {
    let final_ledger = books::read_final(targets, clock).await;
    let members_now = fleet.member_addrs()?;
    let settle = Duration::from_millis(BOUNDS.coordinator_settle_ms);
    let coordinator = books::agreement(&members_now, &targets.cluster_token, settle).await;
    let requests = history.requests();
    let store_url = fleet.store_url()?;
    let order_books = books::read_order_books(Some(&store_url), targets, &requests, ORDERS_SETTLE).await;
    let released = order_books
        .releases
        .as_ref()
        .map(|(log, _)| log.iter().map(|r| r.order_id.0.clone()).collect())
        .unwrap_or_default();
    let money = books::read_money(Some(&store_url), paysim, released, ORDERS_SETTLE).await;
    Ok(Books { final_ledger, coordinator, requests, order_books, money })
}

/// The checker's rules and the money's on the schedule's record, in check order.
fn check(
    sale: &SaleSku,
    record: &Record,
    nodes_seen: &[String],
    history: &History,
    clock: Clock,
) -> Vec<checker::Violation> {
    let books = &record.books;
    let evidence = Evidence {
        total: sale.total,
        per_user_limit: sale.per_user_limit,
        nodes: nodes_seen,
        requests: &books.requests,
        samples: &record.samples,
        windows: &record.windows,
        ledger: &books.final_ledger,
        heal_ms: record.heal_ms,
        sold_out_ms: sold_out_ms(&record.samples),
        demand_ended_ms: record.demand_ended_ms,
        truncated: history.truncated(),
        coordinator: books.coordinator.clone(),
        bounds: BOUNDS,
        order_books: Some(&books.order_books),
        idempotency_ttl_ms: ledger::IDEMPOTENCY_TTL_DEFAULT.as_millis() as u64,
        clock_origin_unix_ms: clock.origin_unix_ms(),
    };
    let mut violations = checker::check(&evidence);
    violations.extend(crate::money::check(&books.money));
    violations.extend(crate::money::check_paying(&record.paying));
    violations
}

/// When the monitor first saw nothing left for sale.
fn sold_out_ms(samples: &[Sample]) -> Option<u64> {
    samples.iter().find(|s| s.ledger.is_some_and(|l| l.unsold() == 0)).map(|s| s.at_ms)
}

/// The schedule's report: the verdict, the heal's timings and what the buyers did.
fn schedule_report(
    seed: u64,
    plan: &DockerPlan,
    sale: &SaleSku,
    record: &Record,
    violations: Vec<checker::Violation>,
    events: &[Event],
    wall: Instant,
) -> ScheduleReport {
    let (books, requests) = (&record.books, &record.books.requests);
    let mut outcomes = BTreeMap::new();
    for request in requests {
        *outcomes.entry(request.outcome.clone()).or_insert(0) += 1;
    }
    let sold_out_ms = sold_out_ms(&record.samples);
    let heal_times = report::heal_times(requests, &record.windows, record.heal_ms, sold_out_ms);
    let sold = books.final_ledger.status.as_ref().ok().map(|s| s.sold);
    ScheduleReport {
        seed,
        faults: record.windows.clone(),
        setup: vec![format!("compose fleet: {}", plan.name)],
        heal_ms: record.heal_ms,
        time_to_heal_ms: heal_times.heal,
        fault_recovery_ms: heal_times.faults,
        node_recovery_ms: heal_times.nodes,
        sold_out_ms,
        total: sale.total,
        sold,
        sales: vec![SaleReport { sku: sale.id.to_string(), total: sale.total, sold, created_ms: None, sold_out_ms }],
        requests: requests.len() as u64,
        keys: record.keys,
        reused_keys: record.finished.reused_keys,
        payments: books.money.as_ref().map_or(0, |m| m.taken().count() as u64),
        paying: record.paying,
        outcomes,
        untold_sales: 0,
        unresolved_keys: record.finished.unresolved_keys,
        details: report::details(seed, &violations, events, requests, &record.samples),
        violations,
        wall_ms: wall.elapsed().as_millis() as u64,
    }
}

/// Answers that were neither a decision nor a 503, by outcome.
fn not_retryable(requests: &[Request]) -> BTreeMap<String, u64> {
    let mut not_retryable = BTreeMap::new();
    for request in requests {
        if !request.is_decision() && request.status != Some(503) {
            *not_retryable.entry(request.outcome.clone()).or_insert(0) += 1;
        }
    }
    not_retryable
}

/// Applies every step when it is due, undoes each when its hold ends, heals at the end (once
/// every step has run, or at `phase_ms` after the sale opened, whichever is later for started
/// steps); returns when the heal happened.
async fn apply_steps(
    injector: &mut DockerInjector<'_>,
    plan: &DockerPlan,
    monitor: &Monitor,
    clock: &Clock,
    phase_ms: u64,
) -> anyhow::Result<u64> {
    let mut pending: Vec<&plan::Step> = plan.steps.iter().collect();
    let mut ending: Vec<(u64, usize)> = Vec::new();
    let give_up = clock.now_ms() + phase_ms.max(60_000);
    while !pending.is_empty() || !ending.is_empty() {
        let now = clock.now_ms();
        let sold_percent = monitor.latest().and_then(|s| s.ledger).map(|l| l.sold * 100 / l.total.max(1));
        let due: Vec<usize> = pending
            .iter()
            .enumerate()
            .filter(|(_, step)| match step.start {
                Start::AtMs(at) => now >= at,
                Start::AtSoldPercent(percent) => sold_percent.is_some_and(|sold| sold >= percent) || now >= give_up,
            })
            .map(|(at, _)| at)
            .collect();
        for at in due.into_iter().rev() {
            let step = pending.remove(at);
            injector.start(step).await?;
            ending.push((clock.now_ms() + step.hold_ms, step.id));
        }
        let (ended, still): (Vec<_>, Vec<_>) = ending.into_iter().partition(|(at, _)| clock.now_ms() >= *at);
        ending = still;
        for (_, id) in ended {
            injector.end(id).await?;
        }
        injector.refresh_nodes()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while clock.now_ms() < phase_ms.min(give_up) && plan.steps.iter().all(|s| matches!(s.start, Start::AtMs(_))) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    injector.heal().await?;
    Ok(clock.now_ms())
}

/// Waits until the running nodes hold the whole stock of `sku`: the sale is open everywhere.
async fn wait_held(fleet: &ComposeFleet, sku: &SkuId, total: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + OPEN_MAX;
    loop {
        let held =
            crate::monitor::stock_held(fleet.node_addrs()?.into_iter().map(|(_, addr)| addr), sku.as_str()).await;
        if held >= total {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the nodes hold {held} of {total} units of {sku} after {OPEN_MAX:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_out(
    fleet: &ComposeFleet,
    out: &Path,
    schedule: &ScheduleReport,
    events: &[crate::history::Event],
    requests: &[crate::history::Request],
) -> anyhow::Result<()> {
    let dir = out.join(format!("seed-{}", schedule.seed));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(schedule)?)?;
    let lines: Vec<String> = events.iter().map(|e| e.line()).chain(requests.iter().map(|r| r.line())).collect();
    std::fs::write(dir.join("history.txt"), lines.join("\n"))?;
    if !schedule.violations.is_empty() {
        fleet.copy_logs(&dir.join("logs"))?;
    }
    Ok(())
}
