//! `seckill bench idle`: what a fleet costs Redis when nobody buys. Half the SKUs are sold out
//! first, half never sell; then, for the measured window, the nodes and the coordinator only
//! keep their figures fresh. Those background reads must follow the sale: a sold-out or idle
//! SKU should cost Redis close to nothing (target: an idle fleet of 3 nodes and 10 SKUs under
//! 1% of a Redis core).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;
use testkit::load::{self, LoadPlan};
use testkit::redis::RedisWork;

use crate::cluster::{build_ledger, Options, RunningCluster};
use crate::config::Cluster;
use crate::dev::scenario::Scenario;

/// Units per SKU: enough that a sale spreads over every node.
const UNITS: u64 = 300;

/// After the sales, before the window: long enough for every background reader to reach its
/// quiet pace, so the window measures the steady state.
const SETTLE: Duration = Duration::from_secs(5);

/// How long Redis alone is measured, for the floor.
const FLOOR_WINDOW: Duration = Duration::from_secs(10);

/// Rounds of buyers a SKU gets to sell out.
const SALE_ROUNDS_MAX: u64 = 10;

#[derive(Debug, Serialize)]
pub struct IdleCost {
    pub nodes: usize,
    pub skus: usize,
    pub sold_out_skus: usize,
    pub seconds: f64,
    pub redis_commands_per_s: f64,
    /// Redis CPU (user + sys) over the window, as a share of one core.
    pub redis_core_share: f64,
    /// The same for Redis alone before the fleet started (its own timers): the floor.
    pub redis_alone_core_share: f64,
}

impl IdleCost {
    pub fn render(&self) -> String {
        format!(
            "{} nodes, {} SKUs ({} sold out, {} never sold), idle for {:.0} s:\n\
             Redis ran {:.1} commands/s and used {:.3}% of one core ({:.3}% alone, before the fleet)\n",
            self.nodes,
            self.skus,
            self.sold_out_skus,
            self.skus - self.sold_out_skus,
            self.seconds,
            self.redis_commands_per_s,
            100.0 * self.redis_core_share,
            100.0 * self.redis_alone_core_share
        )
    }
}

pub async fn measure(scenario: Scenario, redis_url: &str, skus: usize, seconds: f64) -> anyhow::Result<IdleCost> {
    anyhow::ensure!((1..=1000).contains(&skus), "--skus is from 1 to 1000");
    anyhow::ensure!(seconds.is_finite() && seconds >= 1.0, "--seconds must be at least 1");
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let names: Vec<String> = (1..=skus).map(|at| format!("idle-{run_id}-{at}")).collect();
    let data_dir = std::env::temp_dir().join(format!("seckill-idle-{}-{run_id}", std::process::id()));
    let coordinator = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let stocked = Scenario { stock: UNITS, ..scenario };
    let mut text = stocked.cluster_toml_with_buffer(&names[0], redis_url, coordinator, &data_dir, Default::default());
    for name in &names[1..] {
        text.push_str(&format!("\n[[skus]]\nid = \"{name}\"\ntotal = {UNITS}\nper_user_limit = 1\nqty_max = 1\n"));
    }
    let cluster = Cluster::parse(&text).context("the idle fleet's config")?;
    let steps = testkit::progress::steps(4, "bench idle");
    steps.set_message("Redis alone");
    let alone = idle_core_share(redis_url, FLOOR_WINDOW.min(Duration::from_secs_f64(seconds))).await?;
    steps.inc(1);
    let ledger = build_ledger(&cluster.ledger).await?;
    let running = RunningCluster::start(&cluster, ledger, Options::default()).await?;
    running.wait_ready(Duration::from_secs(10)).await?;
    steps.set_message("selling out half the SKUs");
    let sold_out = &names[..skus / 2];
    for (at, name) in sold_out.iter().enumerate() {
        crate::dev::demo::wait_for_allotments(&running, &ledger::SkuId::new(name)?, 1).await?;
        sell_out(&running, name, at as u64).await?;
    }
    steps.inc(1);
    steps.set_message("settling");
    tokio::time::sleep(SETTLE).await;
    steps.inc(1);
    steps.set_message(format!("idle for {seconds:.0} s"));
    let before = RedisWork::read(redis_url)?;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let work = RedisWork::read(redis_url)?.since(before);
    let elapsed = started.elapsed().as_secs_f64();
    debug_assert!(elapsed >= seconds, "the window lasts at least what was asked");
    steps.finish_and_clear();
    running.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(IdleCost {
        nodes: scenario.nodes,
        skus,
        sold_out_skus: sold_out.len(),
        seconds: elapsed,
        redis_commands_per_s: work.commands as f64 / elapsed,
        redis_core_share: work.cpu_seconds / elapsed,
        redis_alone_core_share: alone,
    })
}

/// Redis's CPU over `window` as a share of one core, with nothing of ours connected.
async fn idle_core_share(redis_url: &str, window: Duration) -> anyhow::Result<f64> {
    let before = RedisWork::read(redis_url)?;
    let started = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let work = RedisWork::read(redis_url)?.since(before);
    Ok(work.cpu_seconds / started.elapsed().as_secs_f64())
}

/// Sells every unit of `sku`, in more rounds if a round ends before the coordinator's last
/// top-ups reach the nodes.
async fn sell_out(running: &RunningCluster, sku: &str, seed: u64) -> anyhow::Result<()> {
    let id = ledger::SkuId::new(sku)?;
    for round in 0..SALE_ROUNDS_MAX {
        let plan = LoadPlan {
            targets: running.addrs(),
            sku: sku.to_string(),
            purchases: UNITS * 4,
            // Fresh buyers every round: each may buy one unit.
            users: UNITS * 4 * SALE_ROUNDS_MAX,
            concurrency: 16,
            retries_max: 3,
            retry_pause: Duration::from_millis(20),
            seed: seed * SALE_ROUNDS_MAX + round,
            rate_per_s: None,
            bearer: None,
        };
        load::run(plan).await?;
        if running.ledger.status(&id).await?.remaining == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("{sku} was not sold out after {SALE_ROUNDS_MAX} rounds of buyers")
}
