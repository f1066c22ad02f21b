//! `seckill bench hot-sku`: one SKU sold flat out through the ledger on a private Redis Cluster
//! of three masters, unstriped and striped, to see whether stripes spread a hot SKU's Redis
//! work over the masters.
//!
//! Per stripe count: the SKU's stripes are created (named so that each lands on its own
//! master, as an operator would place them; see `place`), callers confirm batches of
//! distinct buyers, each on the stripe [`protocol::stripe_for`] gives it, until every unit is
//! sold; a stripe the callers saw run dry is skipped (its buyers answered "retry", as nodes do)
//! until a transfer refills it. A rebalancer moves units from the richest stripe into an empty
//! one, transfer by transfer, as the coordinator does (`transfer_out` then `transfer_in`, one id
//! each), so the last units of any stripe still sell. Every unit must sell, none twice.
//!
//! Measured per master from `INFO cpu` and the stripes it serves: Redis CPU per sale, the
//! share of the sales. A two-core machine cannot run three masters flat out at once, so the
//! SKU's capacity is computed, not observed: the busiest master saturates first, so one SKU can
//! sell at most `sales / (CPU seconds of the busiest master)` per second, if each master had a
//! core of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ledger::{
    CatalogueLedger, Decision, IdempotencyKey, LedgerReads, NodeId, Purchase, RedisLedger, RedisLedgerConfig,
    SalesLedger, Seller, SkuId, SkuTerms, UserId, Verdict,
};
use serde::Serialize;
use testkit::redis::{RedisCluster, RedisWork};

/// What to run.
#[derive(Debug, Clone)]
pub struct HotSkuPlan {
    /// Stripe counts, one run each, in order.
    pub stripes: Vec<u32>,
    /// Units of the SKU per run.
    pub units: u64,
    /// Concurrent callers confirming batches.
    pub callers: usize,
    /// Purchases per confirm, as a node's confirmer batches them.
    pub batch: usize,
}

/// One master's part of a run.
#[derive(Debug, Serialize)]
pub struct MasterPart {
    pub addr: String,
    /// The stripes whose slots it serves.
    pub stripes: Vec<u32>,
    pub sales: u64,
    /// Its share of the run's sales (0–1).
    pub share: f64,
    /// Its CPU over the run's sales: what each sale of the SKU costs this master.
    pub cpu_us_per_sale: f64,
}

/// One stripe count's run.
#[derive(Debug, Serialize)]
pub struct HotSkuRun {
    pub stripes: u32,
    pub sold: u64,
    pub seconds: f64,
    pub sales_per_s: f64,
    /// Redis CPU over all masters per sale.
    pub redis_cpu_us_per_sale: f64,
    /// The largest share of the sales one master served (0–1).
    pub max_master_share: f64,
    pub transfers: u64,
    pub transfers_per_s: f64,
    /// Purchases answered "retry" because their stripe was dry while others had units.
    pub retries: u64,
    /// Sales per second the SKU could reach with a core per master (see the module doc).
    pub capacity_sales_per_s: f64,
    pub masters: Vec<MasterPart>,
}

#[derive(Debug, Serialize)]
pub struct HotSku {
    pub runs: Vec<HotSkuRun>,
    /// The largest stripe count's capacity over one stripe's (0 without a one-stripe run).
    pub capacity_ratio: f64,
}

impl HotSku {
    pub fn render(&self) -> String {
        let mut out = format!(
            "{:>7} {:>9} {:>10} {:>12} {:>11} {:>10} {:>8} {:>14}\n",
            "stripes", "sold", "sales/s", "cpu µs/sale", "max share", "transfers", "retries", "capacity/s"
        );
        for run in &self.runs {
            out.push_str(&format!(
                "{:>7} {:>9} {:>10.0} {:>12.2} {:>10.0}% {:>10} {:>8} {:>14.0}\n",
                run.stripes,
                run.sold,
                run.sales_per_s,
                run.redis_cpu_us_per_sale,
                100.0 * run.max_master_share,
                run.transfers,
                run.retries,
                run.capacity_sales_per_s
            ));
            for master in &run.masters {
                out.push_str(&format!(
                    "        master {} (stripes {:?}): {:.0}% of sales, {:.2} µs cpu per sale\n",
                    master.addr,
                    master.stripes,
                    100.0 * master.share,
                    master.cpu_us_per_sale
                ));
            }
        }
        out.push_str(&format!(
            "\ncapacity of one SKU, most stripes over one: {:.2}x (computed from each master's CPU per sale: \
             this machine cannot run three masters flat out at once)\n",
            self.capacity_ratio
        ));
        out
    }
}

/// Runs the plan on a private three-master cluster.
pub async fn run(plan: &HotSkuPlan) -> anyhow::Result<HotSku> {
    anyhow::ensure!(plan.batch > 0 && plan.callers > 0, "--batch and --callers must be at least 1");
    let cluster = RedisCluster::start_with("everysec").context("a private Redis Cluster")?;
    let mut config = RedisLedgerConfig::new(cluster.url());
    config.call_timeout = Duration::from_secs(5);
    let ledger = Arc::new(RedisLedger::connect(config)?);
    let mut runs = Vec::new();
    for &stripes in &plan.stripes {
        anyhow::ensure!(
            (1..=protocol::STRIPES_MAX).contains(&stripes) && u64::from(stripes) <= plan.units,
            "--stripes {stripes}: must be between 1 and 64 and at most --units"
        );
        runs.push(run_one(&cluster, &ledger, plan, stripes).await?);
    }
    let capacity = |stripes: u32| runs.iter().find(|run| run.stripes == stripes).map(|run| run.capacity_sales_per_s);
    let most = plan.stripes.iter().copied().max().unwrap_or(1);
    let capacity_ratio = match (capacity(most), capacity(1)) {
        (Some(most), Some(one)) if one > 0.0 => most / one,
        _ => 0.0,
    };
    Ok(HotSku { runs, capacity_ratio })
}

/// The shared state of one run's callers and rebalancer.
struct Sale {
    stripes: Vec<SkuId>,
    /// Per stripe: units the callers may still find (a hint: the ledger decides).
    left: Vec<AtomicU64>,
    sold: Vec<AtomicU64>,
    next_buyer: AtomicU64,
    retries: AtomicU64,
    transfers: AtomicU64,
    done: AtomicBool,
}

async fn run_one(
    cluster: &RedisCluster,
    ledger: &Arc<RedisLedger>,
    plan: &HotSkuPlan,
    stripes: u32,
) -> anyhow::Result<HotSkuRun> {
    let sku = place(cluster, stripes)?;
    let terms = SkuTerms { stripes, ..SkuTerms::new(plan.units) };
    let ledgers = protocol::ledgers_of(&sku, &terms);
    for (stripe, stripe_terms) in &ledgers {
        ledger.create_sku(stripe, stripe_terms).await?;
    }
    let sale = Arc::new(Sale {
        stripes: ledgers.iter().map(|(stripe, _)| stripe.clone()).collect(),
        left: ledgers.iter().map(|(_, terms)| AtomicU64::new(terms.total)).collect(),
        sold: ledgers.iter().map(|_| AtomicU64::new(0)).collect(),
        next_buyer: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        transfers: AtomicU64::new(0),
        done: AtomicBool::new(false),
    });
    let masters = cluster.masters()?;
    let before =
        masters.iter().map(|m| RedisWork::read(&format!("redis://{}", m.addr))).collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let callers: Vec<_> =
        (0..plan.callers).map(|caller| tokio::spawn(sell(ledger.clone(), sale.clone(), caller, plan.batch))).collect();
    let rebalanced = rebalance(ledger, &sale, plan.units).await;
    sale.done.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await??;
    }
    rebalanced?;
    let seconds = started.elapsed().as_secs_f64();
    let after =
        masters.iter().map(|m| RedisWork::read(&format!("redis://{}", m.addr))).collect::<Result<Vec<_>, _>>()?;
    let sold = check_books(ledger, &sale, plan.units).await?;
    let mut parts = Vec::new();
    for ((master, before), after) in masters.iter().zip(before).zip(after) {
        let served: Vec<u32> = (0..stripes)
            .filter(|&index| {
                cluster.slot_of(&stripe_key(&sale.stripes[index as usize])).is_ok_and(|s| master.serves(s))
            })
            .collect();
        let sales: u64 = served.iter().map(|&index| sale.sold[index as usize].load(Ordering::Relaxed)).sum();
        let cpu = after.since(before).cpu_seconds;
        parts.push(MasterPart {
            addr: master.addr.clone(),
            stripes: served,
            sales,
            share: sales as f64 / sold.max(1) as f64,
            cpu_us_per_sale: cpu * 1e6 / sold.max(1) as f64,
        });
    }
    Ok(summary(stripes, sold, seconds, &sale, parts))
}

fn summary(stripes: u32, sold: u64, seconds: f64, sale: &Sale, masters: Vec<MasterPart>) -> HotSkuRun {
    let cpu_us: f64 = masters.iter().map(|m| m.cpu_us_per_sale).sum();
    let busiest_us = masters.iter().map(|m| m.cpu_us_per_sale).fold(0.0, f64::max);
    let transfers = sale.transfers.load(Ordering::Relaxed);
    HotSkuRun {
        stripes,
        sold,
        seconds,
        sales_per_s: sold as f64 / seconds.max(1e-9),
        redis_cpu_us_per_sale: cpu_us,
        max_master_share: masters.iter().map(|m| m.share).fold(0.0, f64::max),
        transfers,
        transfers_per_s: transfers as f64 / seconds.max(1e-9),
        retries: sale.retries.load(Ordering::Relaxed),
        capacity_sales_per_s: if busiest_us > 0.0 { 1e6 / busiest_us } else { 0.0 },
        masters,
    }
}

/// The meta key of a stripe, whose slot is the stripe's.
fn stripe_key(stripe: &SkuId) -> String {
    format!("seckill:{{{stripe}}}:meta")
}

/// A SKU name whose stripes sit on as many different masters as there can be: stripe names
/// are fixed (`s`, `s/1`, …), so where a cluster puts them depends on the name; in production
/// an operator moves the stripes' slots instead (`redis-cli --cluster reshard`).
fn place(cluster: &RedisCluster, stripes: u32) -> anyhow::Result<SkuId> {
    let masters = cluster.masters()?;
    let wanted = (stripes as usize).min(masters.len());
    for attempt in 0..10_000u32 {
        let sku = SkuId::new(&format!("hot{stripes}-{}-{attempt}", std::process::id()))?;
        let mut used = Vec::new();
        for index in 0..stripes {
            let slot = cluster.slot_of(&stripe_key(&sku.stripe(index)))?;
            if let Some(at) = masters.iter().position(|m| m.serves(slot)) {
                if !used.contains(&at) {
                    used.push(at);
                }
            }
        }
        if used.len() >= wanted {
            return Ok(sku);
        }
    }
    anyhow::bail!("no SKU name in 10,000 puts {stripes} stripes on {wanted} masters")
}

/// One caller: buyers in turn, each to its stripe, confirmed a batch per stripe at a time.
async fn sell(ledger: Arc<RedisLedger>, sale: Arc<Sale>, caller: usize, batch: usize) -> anyhow::Result<()> {
    let stripes = sale.stripes.len() as u32;
    let seller = Seller::new(NodeId::new(&format!("bench{caller}"))?, 1);
    let mut pending: Vec<Vec<Purchase>> = vec![Vec::new(); stripes as usize];
    while !sale.done.load(Ordering::Relaxed) {
        let buyer = sale.next_buyer.fetch_add(1, Ordering::Relaxed);
        let user = UserId::new(&format!("u{buyer}"))?;
        let stripe = protocol::stripe_for(&user, stripes) as usize;
        if sale.left[stripe].load(Ordering::Relaxed) == 0 {
            // Dry while others may have units: a node answers this buyer "retry" from memory.
            // Paced, so callers meeting only dry stripes leave the cores to Redis.
            if sale.retries.fetch_add(1, Ordering::Relaxed) % 64 == 63 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            continue;
        }
        let key = IdempotencyKey::new(&format!("k{buyer}"))?;
        pending[stripe].push(Purchase { key, user, qty: 1, token: None, order_id: None });
        if pending[stripe].len() < batch {
            continue;
        }
        let purchases = std::mem::take(&mut pending[stripe]);
        let outcome = ledger.confirm(&sale.stripes[stripe], &seller, &purchases).await?;
        let sold = outcome.verdicts.iter().filter(|v| matches!(v, Verdict::Fresh(Decision::Purchased(_)))).count();
        sale.sold[stripe].fetch_add(sold as u64, Ordering::Relaxed);
        sale.left[stripe].store(outcome.remaining, Ordering::Relaxed);
    }
    Ok(())
}

/// Until every unit is sold: moves half the richest stripe's units into a stripe the callers
/// found dry (round robin over the dry ones), as the coordinator does; returns when the SKU is
/// sold out.
async fn rebalance(ledger: &RedisLedger, sale: &Sale, units: u64) -> anyhow::Result<()> {
    let mut transfer_id = 0u64;
    let mut next_dry = 0usize;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut remaining = Vec::new();
        for stripe in &sale.stripes {
            remaining.push(ledger.status(stripe).await?.remaining);
        }
        if remaining.iter().all(|left| *left == 0) {
            let sold: u64 = sale.sold.iter().map(|sold| sold.load(Ordering::Relaxed)).sum();
            anyhow::ensure!(sold <= units, "sold {sold} of {units}: an oversell");
            return Ok(());
        }
        let dry: Vec<usize> = (0..remaining.len()).filter(|&at| remaining[at] == 0).collect();
        let Some((richest, &most)) = remaining.iter().enumerate().max_by_key(|(_, left)| **left) else { continue };
        if dry.is_empty() {
            continue;
        }
        let into = dry[next_dry % dry.len()];
        next_dry += 1;
        transfer_id += 1;
        let moved = ledger.transfer_out(&sale.stripes[richest], transfer_id, most.div_ceil(2)).await?;
        ledger.transfer_in(&sale.stripes[into], transfer_id, moved).await?;
        sale.left[richest].store(remaining[richest].saturating_sub(moved), Ordering::Relaxed);
        sale.left[into].store(moved, Ordering::Relaxed);
        sale.transfers.fetch_add(1, Ordering::Relaxed);
    }
}

/// The ledger's books after the sale: every stripe sold out, the stripes' sales add up to
/// the units (no oversell, no undersell) and to what the callers were told, and every unit
/// taken out of a stripe went into another.
async fn check_books(ledger: &RedisLedger, sale: &Sale, units: u64) -> anyhow::Result<u64> {
    let (mut sold, mut moved_out, mut moved_in) = (0, 0, 0);
    for (stripe, told) in sale.stripes.iter().zip(&sale.sold) {
        let status = ledger.status(stripe).await?;
        anyhow::ensure!(status.remaining == 0, "{stripe} ended with {} unsold", status.remaining);
        anyhow::ensure!(
            status.sold == told.load(Ordering::Relaxed),
            "{stripe}: the ledger sold {}, the callers were told {}",
            status.sold,
            told.load(Ordering::Relaxed)
        );
        sold += status.sold;
        moved_out += status.transferred_out;
        moved_in += status.transferred_in;
    }
    anyhow::ensure!(moved_out == moved_in, "{moved_out} units left stripes, {moved_in} arrived");
    anyhow::ensure!(sold == units, "sold {sold} of {units}");
    Ok(sold)
}
