//! What the confirm script costs Redis per sale, and how many sales of one SKU one Redis
//! confirms per second, batched: a private `redis-server` (AOF, `appendfsync everysec`, as the
//! engine benchmark runs it), one SKU with stock that never runs out, and `--concurrency`
//! callers confirming batches of distinct buyers and keys flat out for `--seconds` per phase.
//!
//! With `--baseline OLD.lua` (say `git show main:ledger/src/lua/confirm.lua > /tmp/old.lua`) it
//! runs that text too, under the same keys and arguments, alternating with the current script
//! phase by phase (order swapped every round), so both see the same machine: on a shared,
//! noisy machine only ratios from one run mean much. `--baseline` may come more than once, each
//! text named by its file name. `--baseline` texts take the arguments of the scripts before
//! 2026-11 (three key names per purchase); `--baseline-current-shape FILE` runs a text that
//! takes the current script's (five arguments per purchase, no key names), say one that does
//! only the per-sale writes, to see how far the current script is from them.
//!
//! Every run also measures `confirm_floor.lua`, only the writes a batch of sales cannot avoid,
//! and reports the current script as a ratio to it (`current / this` on the floor's line).
//!
//! Per phase: sales/s, Redis CPU per sale (`INFO cpu`, user + sys, so networking and AOF
//! included) and script time per sale (`INFO commandstats`, EVALSHA's usec over sales).
//!
//! `cargo run --release -p seckill-ledger --features suite --example confirm_cost -- --baseline /tmp/old.lua`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ledger::{
    ArgumentShape, CatalogueLedger, Decision, IdempotencyKey, LedgerReads, NodeId, Purchase, RedisLedger,
    RedisLedgerConfig, Seller, SkuId, SkuTerms, UserId, Verdict,
};
use redis::Script;
use testkit::redis::RedisServer;

/// Stock of the measured SKU: more than any run sells, so every purchase is a sale.
const STOCK: u64 = 1_000_000_000_000;

struct Options {
    /// Script files, each with the argument shape it takes.
    baselines: Vec<(String, ArgumentShape)>,
    seconds: f64,
    rounds: usize,
    batches: Vec<usize>,
    concurrency: usize,
    per_user_limit: u32,
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options {
        baselines: Vec::new(),
        seconds: 3.0,
        rounds: 3,
        batches: vec![1, 64, 256],
        concurrency: 4,
        per_user_limit: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--baseline" => options.baselines.push((value()?, ArgumentShape::KeysPerPurchase)),
            "--baseline-current-shape" => options.baselines.push((value()?, ArgumentShape::Current)),
            "--seconds" => options.seconds = value()?.parse()?,
            "--rounds" => options.rounds = value()?.parse()?,
            "--batches" => {
                options.batches = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--concurrency" => options.concurrency = value()?.parse()?,
            "--limit" => options.per_user_limit = value()?.parse()?,
            other => bail!("unknown flag {other}; see the doc comment of examples/confirm_cost.rs"),
        }
    }
    if options.batches.iter().any(|b| *b == 0 || *b > ledger::BATCH_MAX) {
        bail!("batch sizes go from 1 to {}", ledger::BATCH_MAX);
    }
    Ok(options)
}

/// Redis's counters at one moment.
struct Counters {
    cpu_seconds: f64,
    evalsha_usec: f64,
}

fn counters(redis: &RedisServer) -> anyhow::Result<Counters> {
    let cpu: String = redis.query(redis::cmd("INFO").arg("cpu"))?;
    let stats: String = redis.query(redis::cmd("INFO").arg("commandstats"))?;
    let field = |text: &str, name: &str| -> f64 {
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok()).unwrap_or(0.0)
    };
    let evalsha_usec = stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:")?.split("usec=").nth(1)?.split(',').next()?.parse().ok())
        .unwrap_or(0.0);
    Ok(Counters { cpu_seconds: field(&cpu, "used_cpu_sys") + field(&cpu, "used_cpu_user"), evalsha_usec })
}

/// One phase's result.
#[derive(Clone, Copy)]
struct Phase {
    sales_per_second: f64,
    cpu_us_per_sale: f64,
    script_us_per_sale: f64,
    /// Redis CPU over wall time: near 1.0, Redis is the bottleneck; well below, the callers are.
    redis_busy: f64,
}

async fn phase(
    redis: &RedisServer,
    ledger: &Arc<RedisLedger>,
    script: &Arc<Script>,
    shape: ArgumentShape,
    batch: usize,
    options: &Options,
) -> anyhow::Result<Phase> {
    // A fresh keyspace per phase: no phase pays for the memory or the hash sizes of another.
    let _: () = redis.query(redis::cmd("FLUSHALL").arg("SYNC"))?;
    let sku = SkuId::new("cost")?;
    let terms = SkuTerms { per_user_limit: options.per_user_limit, ..SkuTerms::new(STOCK) };
    ledger.create_sku(&sku, &terms).await?;
    let seller = Seller::new(NodeId::new("n1")?, 1);
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let before = counters(redis)?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..options.concurrency)
        .map(|_| {
            let (ledger, script, sku, seller) = (ledger.clone(), script.clone(), sku.clone(), seller.clone());
            let (next, stop) = (next.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sold = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                    let purchases = (first..first + batch as u64)
                        .map(|n| {
                            Ok(Purchase {
                                key: IdempotencyKey::new(&format!("k{n}"))?,
                                user: UserId::new(&format!("u{n}"))?,
                                qty: 1,
                                token: None,
                                order_id: None,
                            })
                        })
                        .collect::<Result<Vec<_>, ledger::InvalidId>>()?;
                    let outcome = ledger.confirm_by(&script, shape, &sku, &seller, &purchases).await?;
                    for verdict in &outcome.verdicts {
                        if !matches!(verdict, Verdict::Fresh(Decision::Purchased(_))) {
                            bail!("every purchase must sell, got {verdict:?}");
                        }
                    }
                    sold += batch as u64;
                }
                anyhow::Ok(sold)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(options.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut sold = 0;
    for task in tasks {
        sold += task.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    let after = counters(redis)?;
    let status = ledger.status(&sku).await?;
    if status.sold != sold {
        bail!("the ledger counts {} sold, the callers {sold}", status.sold);
    }
    let cpu = after.cpu_seconds - before.cpu_seconds;
    Ok(Phase {
        sales_per_second: sold as f64 / wall,
        cpu_us_per_sale: cpu * 1e6 / sold as f64,
        script_us_per_sale: (after.evalsha_usec - before.evalsha_usec) / sold as f64,
        redis_busy: cpu / wall,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The scripts a run measures: the current one, the floor, and each `--baseline`, each named.
fn scripts(options: &Options) -> anyhow::Result<Vec<(String, Arc<Script>, ArgumentShape)>> {
    let current = Arc::new(Script::new(include_str!("../src/lua/confirm.lua")));
    // The floor runs in every run: the current script's cost means most as a ratio to the work
    // no batch can avoid (`confirm_floor.lua`), measured on the same machine at the same time.
    let floor = Arc::new(Script::new(include_str!("confirm_floor.lua")));
    let mut scripts = vec![
        ("current".to_string(), current, ArgumentShape::Current),
        ("floor".to_string(), floor, ArgumentShape::Current),
    ];
    for (path, shape) in &options.baselines {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        let name = std::path::Path::new(path).file_name().map_or(path.clone(), |name| name.to_string_lossy().into());
        scripts.push((name, Arc::new(Script::new(&text)), *shape));
    }
    Ok(scripts)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let options = options()?;
    let redis = RedisServer::start_with("everysec").context("a private redis-server")?;
    let mut config = RedisLedgerConfig::new(redis.url());
    config.call_timeout = Duration::from_secs(5);
    let ledger = Arc::new(RedisLedger::connect(config)?);
    let scripts = scripts(&options)?;
    let width = scripts.iter().map(|(name, _, _)| name.len()).max().unwrap_or(0);
    println!(
        "{} s per phase, {} rounds, {} callers, per-user limit {}",
        options.seconds, options.rounds, options.concurrency, options.per_user_limit
    );
    println!(
        "{:>6} {:>width$} {:>5} {:>11} {:>12} {:>15} {:>10}",
        "batch", "script", "round", "sales/s", "cpu µs/sale", "script µs/sale", "redis busy"
    );
    let mut results: BTreeMap<(usize, &str), Vec<Phase>> = BTreeMap::new();
    for round in 0..options.rounds {
        for &batch in &options.batches {
            let mut order: Vec<_> = scripts.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for (name, script, shape) in order {
                let result = phase(&redis, &ledger, script, *shape, batch, &options).await?;
                println!(
                    "{batch:>6} {name:>width$} {round:>5} {:>11.0} {:>12.2} {:>15.2} {:>10.2}",
                    result.sales_per_second, result.cpu_us_per_sale, result.script_us_per_sale, result.redis_busy
                );
                results.entry((batch, name.as_str())).or_default().push(result);
            }
        }
    }
    // Ratios pair each round's phases, which ran back to back: the machine's load drifts
    // between rounds far more than within one.
    println!("\nmedians over rounds; a ratio is the median of each round's current / baseline");
    for &batch in &options.batches {
        let current = &results[&(batch, "current")];
        let column = |phases: &[Phase], of: fn(&Phase) -> f64| median(phases.iter().map(of).collect());
        let ratio = |baseline: &[Phase], of: fn(&Phase) -> f64| {
            median(current.iter().zip(baseline).map(|(now, then)| of(now) / of(then)).collect())
        };
        let sales_per_second: fn(&Phase) -> f64 = |p| p.sales_per_second;
        let cpu_us_per_sale: fn(&Phase) -> f64 = |p| p.cpu_us_per_sale;
        let script_us_per_sale: fn(&Phase) -> f64 = |p| p.script_us_per_sale;
        for (name, _, _) in &scripts {
            let phases = &results[&(batch, name.as_str())];
            print!(
                "batch {batch:>3} {name:>width$}: {:>8.0} sales/s, {:>6.2} µs cpu/sale, {:>6.2} µs script/sale",
                column(phases, sales_per_second),
                column(phases, cpu_us_per_sale),
                column(phases, script_us_per_sale)
            );
            if name != "current" {
                print!(
                    "; current / this: sales/s {:.2}x, cpu/sale {:.2}x, script/sale {:.2}x",
                    ratio(phases, sales_per_second),
                    ratio(phases, cpu_us_per_sale),
                    ratio(phases, script_us_per_sale)
                );
            }
            println!();
        }
    }
    Ok(())
}
