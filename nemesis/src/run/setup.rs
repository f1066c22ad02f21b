//! A schedule's start: the schedule drawn, a fresh fleet with the sale open, and the buyers,
//! the payer, the monitor and the run-time SKU's creation under way.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::SkuId;
use testkit::fleet::{self, Fleet, FleetSpec};
use tokio::task::JoinHandle;

use super::{
    fleet_spec, member_addrs, Buyers, Options, Sale, Selling, BUYERS, CREATE_SKU_MAX, KEYS_MAX, KEY_PATIENCE, MEMBERS,
    ORDER_SERVICES, REPEAT_CHANCE, REQUEST_TIMEOUT, REUSE_CHANCE, REUSE_MARGIN, SHARED_KEY_CHANCE, SKU, STARTUP_MAX,
    TIMINGS, UNITS,
};
use crate::checker;
use crate::history::{Clock, History};
use crate::monitor::{self, Monitor, Targets};
use crate::payer::{PayPlan, Payer};
use crate::room;
use crate::sales::{self, SaleSku};
use crate::schedule::Schedule;
use crate::workload::{SkuOpener, Workload, WorkloadPlan};

/// Draws schedule `seed`, starts its fleet and opens the sale; the buyers, the payer and the
/// monitor (and the room's waiters) are at work when it returns.
pub(super) async fn open(options: &Options, seed: u64) -> anyhow::Result<(Sale, Buyers)> {
    let phase_ms = options.fault_phase.as_millis() as u64;
    let schedule = Schedule::draw(seed, options.nodes, MEMBERS, ORDER_SERVICES, options.redis, phase_ms, TIMINGS);
    let spec = fleet_spec(options, &schedule.setup);
    let fleet = start_fleet(&spec, options.out.as_deref(), seed).await?;
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
    let sellings = first_sellings(main_sale, &sku, &targets, options.waiting_room)?;
    let ttl = schedule.setup.idempotency_ttl_s.map(Duration::from_secs);
    let bearer = spec.buyer_secret.as_ref().map(|secret| {
        Arc::new(auth::mint::Minter::hs256(secret.as_bytes(), fleet::BUYER_ISSUER, fleet::BUYER_AUDIENCE))
    });
    let paysim = fleet.paysim_addr().context("the fleet runs no sandbox provider")?;
    let prices = sales::prices();
    let payer = Payer::start(PayPlan { orders: fleet.orders_apis(), paysim, seed, bearer: bearer.clone(), prices });
    let clock = Clock::start();
    let history = History::new(clock);
    let monitor = Monitor::start(targets.clone(), clock)?;
    let plan = workload_plan(&fleet, seed, ttl, &payer, bearer.clone());
    let receipts = plan.receipts.clone();
    let workload = Workload::start(plan, history.clone(), schedule.demand_per_s);
    let waiters = options.waiting_room.then(|| {
        let nodes = fleet.node_addrs();
        room::Waiters::start(nodes, history.clone(), receipts, bearer.clone(), seed)
    });
    history.event(None, format!("sale open: {UNITS} units, {} attempts/s", schedule.demand_per_s));
    let setup_labels = schedule.setup.labels();
    if !setup_labels.is_empty() {
        history.event(None, format!("setup: {}", setup_labels.join(", ")));
    }
    let creating = schedule.setup.runtime_sku_at_ms.map(|at_ms| {
        let terms = sales::RUNTIME.striped(options.stripes);
        create_runtime_sku(at_ms, terms, workload.opener(), history.clone(), members.clone(), clock)
    });
    let sale = Sale {
        seed,
        stripes: options.stripes,
        schedule,
        sku,
        targets,
        sellings,
        ttl,
        paysim,
        clock,
        history,
        creating,
        fleet,
    };
    Ok((sale, Buyers { waiters, workload, monitor, payer }))
}

/// Starts the fleet and opens its sale. A fleet that would not is the error, with each
/// process's last log lines (and, with `out`, every log copied there).
async fn start_fleet(spec: &FleetSpec, out: Option<&Path>, seed: u64) -> anyhow::Result<Fleet> {
    let mut fleet = Fleet::start(spec).await?;
    if let Err(e) = open_sale(&mut fleet).await {
        let mut tails = String::new();
        for name in fleet.member_names().into_iter().chain(fleet.node_names()) {
            tails += &format!("\n---- {name} (last lines) ----\n{}", fleet.log_tail(&name, 10));
        }
        if let Some(out) = out {
            fleet.copy_logs(&out.join(format!("seed-{seed}")).join("logs"))?;
        }
        return Err(e.context(format!("the fleet did not open the sale{tails}")));
    }
    Ok(fleet)
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

/// The SKUs on sale from the start: the config's, and the waiting room's when the run has one.
fn first_sellings(
    main_sale: SaleSku,
    sku: &SkuId,
    targets: &Targets,
    waiting_room: bool,
) -> anyhow::Result<Vec<Selling>> {
    let mut sellings = vec![Selling {
        terms: main_sale,
        sku: sku.clone(),
        ledgers: targets.ledgers.clone(),
        created_ms: None,
        sold_out_ms: None,
    }];
    if waiting_room {
        let (sku, ledgers) = (SkuId::new(room::ROOM.id)?, room::ROOM.ledgers()?);
        sellings.push(Selling { terms: room::ROOM, sku, ledgers, created_ms: None, sold_out_ms: None });
    }
    Ok(sellings)
}

/// The buyers of the main SKU, on every node, handing what they buy to `payer`.
fn workload_plan(
    fleet: &Fleet,
    seed: u64,
    ttl: Option<Duration>,
    payer: &Payer,
    bearer: Option<Arc<auth::mint::Minter>>,
) -> WorkloadPlan {
    WorkloadPlan {
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
        bearer,
    }
}

/// Creates the run-time SKU through the admin API at `at_ms` on the schedule's clock and opens
/// it to the buyers; the task's answer is when it was created.
fn create_runtime_sku(
    at_ms: u64,
    terms: SaleSku,
    opener: SkuOpener,
    history: History,
    members: Vec<(String, SocketAddr)>,
    clock: Clock,
) -> JoinHandle<Result<u64, String>> {
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
}
