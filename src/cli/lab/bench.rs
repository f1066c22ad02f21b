//! `seckill bench …`: which benchmark to run and on which Redis; the measuring is in
//! [`crate::dev::bench`].

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

use super::print_report;
use crate::cli::parse_buffer;
use crate::dev::demo::Approach;
use crate::dev::scenario::Scenario;

#[derive(clap::Args)]
pub struct BenchCommon {
    /// A named scenario: small, failover, standard or standard-failover (docs/scenarios.md).
    #[arg(long, default_value = "standard")]
    scenario: Scenario,
    /// Redis to use; without it a private redis-server is started on a free port.
    #[arg(long)]
    redis: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// One run of a scenario with one approach; prints the sale report.
    Run {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value = "cluster")]
        approach: Approach,
        #[arg(long)]
        concurrency: Option<usize>,
        /// Override the SKU's buffer: units per node (`50`) or a share of each node's share
        /// (`"10%"`).
        #[arg(long, value_parser = parse_buffer)]
        buffer: Option<crate::config::Buffer>,
    },
    /// Both approaches at several concurrency levels; writes an SVG chart.
    Sweep {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
        levels: Vec<usize>,
        /// Where to write the chart.
        #[arg(long, default_value = "bench-sweep.svg")]
        svg: PathBuf,
    },
    /// The same sale with the safeguards off and all on, alternating over rounds: their cost.
    Safeguards {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// What verifying buyers costs: `[auth] mode = "none"`, jwt with HS256 and jwt with ES256
    /// from a JWKS file, alternating over rounds; every buyer presents a token of its own.
    Auth {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// What each `[ledger] durability` costs: none, fsync and replica alternating over rounds,
    /// each on the private Redis it needs (`--redis` is not used).
    Durability {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// What the order pipeline costs the purchase path and whether it keeps up: the same sale
    /// without an order service, with one on SQLite and with one on PostgreSQL, alternating.
    Orders {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// A PostgreSQL to keep the orders in [default: a private server, started here].
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
    },
    /// The flash crowd open loop: both approaches offered multiples of Redis-only's saturation
    /// rate, latency from each press's intended time; writes an SVG chart. With
    /// `--waiting-room`, the cluster alone with the SKU behind a waiting room: every buyer joins,
    /// listens to its place on an event stream and buys with its ticket once admitted.
    Crowd {
        #[command(flatten)]
        common: BenchCommon,
        /// Offered rates, as multiples of Redis-only's saturation rate measured first
        /// [default: 0.5,1,2,4; with --waiting-room 1,2,4,8]
        #[arg(long, value_delimiter = ',')]
        rates: Option<Vec<f64>>,
        /// Seconds buyers keep arriving at each rate [default: 10; with --waiting-room, what
        /// gives the largest rate --waiters-max waiters]
        #[arg(long, conflicts_with = "waiters_max")]
        arrival_s: Option<f64>,
        /// Buyers the generator keeps in flight at most (with --waiting-room: joins); an
        /// open-loop run needs enough that presses are not held back by answers still outstanding.
        #[arg(long, default_value_t = 512)]
        concurrency: usize,
        /// Where to write the chart [default: bench-crowd.svg; with --waiting-room
        /// bench-room-crowd.svg]
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Sell through a waiting room (cluster only): p50/p99/p999 of joins and purchases, every
        /// unit sold, when each waiter still in line heard "sold out", admissions/s.
        #[arg(long)]
        waiting_room: bool,
        /// With --waiting-room: the SKU's units [default: half the smallest rate's waiters].
        #[arg(long, requires = "waiting_room")]
        units: Option<u64>,
        /// With --waiting-room: the room's admissions per second [default: the units over 2 s].
        #[arg(long, requires = "waiting_room")]
        admit_per_s: Option<u32>,
        /// With --waiting-room: waiters at the largest rate, each holding an event stream
        /// [default: 12000, or what the open-files limit holds]
        #[arg(long, requires = "waiting_room")]
        waiters_max: Option<u64>,
    },
    /// The path most of a flash crowd takes: a sold-out SKU answered from memory, against the
    /// bare HTTP stack's ceiling, alternating over rounds.
    SoldOut {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// What an idle fleet costs Redis: half its SKUs sold out, half never sold, nobody buying;
    /// Redis commands/s and its share of a core over the window.
    Idle {
        #[command(flatten)]
        common: BenchCommon,
        /// SKUs in the catalogue.
        #[arg(long, default_value_t = 10)]
        skus: usize,
        /// Seconds measured.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
    },
    /// What tracing costs a sale: the same sale with tracing off and on at a sampling ratio,
    /// alternating, its spans exported to a collector the benchmark runs.
    Traces {
        #[command(flatten)]
        common: BenchCommon,
        /// Pairs of sales (off, on).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// The share of requests traced with tracing on.
        #[arg(long, default_value_t = crate::config::SAMPLE_RATIO_DEFAULT)]
        ratio: f64,
    },
    /// Two builds' `bench compare`, alternating round by round in one run: whether a change
    /// costs throughput, judged against the bare HTTP stack each run measures beside it.
    Binaries {
        /// The build before the change.
        #[arg(long, value_name = "PATH")]
        old: PathBuf,
        /// The build after it.
        #[arg(long, value_name = "PATH")]
        new: PathBuf,
        #[arg(long, default_value = "standard")]
        scenario: Scenario,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// What the coordinator group costs as the fleet grows: three real members, simulated nodes
    /// that only register and heartbeat; raft writes, fsyncs, leader CPU, heartbeat latency and
    /// the time to reallocate a dead node, per fleet size.
    Coordinator {
        /// Fleet sizes to run, one after the other (2..=1000 each).
        #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
        nodes: Vec<usize>,
        /// Seconds of steady state measured per size.
        #[arg(long, default_value_t = 10.0)]
        steady_s: f64,
        /// The `seckill` binary the members run [default: this one]: another build's
        /// coordinator, measured by the same harness.
        #[arg(long, value_name = "PATH")]
        member_exe: Option<PathBuf>,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One hot SKU through the ledger on a private three-master Redis Cluster, unstriped and
    /// striped: Redis CPU per sale on each master, each master's share of the sales, transfers
    /// between stripes, and the SKU's capacity computed from the busiest master's CPU.
    HotSku {
        /// Stripe counts to run, one after the other.
        #[arg(long, value_delimiter = ',', default_value = "1,3")]
        stripes: Vec<u32>,
        /// Units of the SKU per run; every one must sell.
        #[arg(long, default_value_t = 300_000)]
        units: u64,
        /// Concurrent callers confirming batches.
        #[arg(long, default_value_t = 4)]
        callers: usize,
        /// Purchases per confirm.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Cluster vs Redis-only, alternating over rounds, with the HTTP ceiling, the engine without
    /// HTTP and the capacity model, all measured in the same run.
    Compare {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long)]
        concurrency: Option<usize>,
    },
}

/// Errors print as one line of causes, `error: what failed: why`, with no backtrace: they are
/// for the person who typed the command, and each says what to fix.
impl BenchCommand {
    /// The options of every benchmark that runs a sale; the coordinator's runs none.
    fn common(&self) -> Option<&BenchCommon> {
        match self {
            BenchCommand::Run { common, .. }
            | BenchCommand::Compare { common, .. }
            | BenchCommand::Crowd { common, .. }
            | BenchCommand::Durability { common, .. }
            | BenchCommand::Orders { common, .. }
            | BenchCommand::Sweep { common, .. }
            | BenchCommand::Safeguards { common, .. }
            | BenchCommand::Auth { common, .. }
            | BenchCommand::SoldOut { common, .. }
            | BenchCommand::Idle { common, .. }
            | BenchCommand::Traces { common, .. } => Some(common),
            BenchCommand::Coordinator { .. } | BenchCommand::HotSku { .. } | BenchCommand::Binaries { .. } => None,
        }
    }

    pub(super) fn json(&self) -> bool {
        match self {
            BenchCommand::Coordinator { json, .. }
            | BenchCommand::HotSku { json, .. }
            | BenchCommand::Binaries { json, .. } => *json,
            other => other.common().is_some_and(|common| common.json),
        }
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one arm per benchmark, each its options passed on: the dispatch reads as one table"
)]
pub async fn run(what: BenchCommand) -> anyhow::Result<()> {
    if let BenchCommand::Coordinator { nodes, steady_s, member_exe, json } = what {
        let member_exe = match member_exe {
            Some(path) => path,
            None => std::env::current_exe()?,
        };
        let plan = crate::dev::bench::coordinator::CoordinatorPlan { sizes: nodes, steady_s, member_exe };
        let bench = crate::dev::bench::coordinator::run(&plan).await?;
        print_report(json, &bench, |report| report.render())?;
        return Ok(());
    }
    if let BenchCommand::Binaries { old, new, scenario, rounds, json } = what {
        let bench =
            tokio::task::spawn_blocking(move || crate::dev::bench::binaries::run(&old, &new, scenario.name, rounds))
                .await??;
        print_report(json, &bench, |report| report.render())?;
        return Ok(());
    }
    if let BenchCommand::HotSku { stripes, units, callers, batch, json } = what {
        let plan = crate::dev::bench::hot_sku::HotSkuPlan { stripes, units, callers, batch };
        let bench = crate::dev::bench::hot_sku::run(&plan).await?;
        print_report(json, &bench, |report| report.render())?;
        return Ok(());
    }
    let Some(common) = what.common() else { return Ok(()) };
    let (scenario, redis, json) = (common.scenario, &common.redis, common.json);
    // A private Redis unless one is named: the benchmark never touches someone else's data.
    let private = match redis {
        Some(_) => None,
        None => Some(testkit::redis::RedisServer::start_with("everysec")?),
    };
    let url = redis.clone().or_else(|| private.as_ref().map(|r| r.url())).context("no Redis")?;
    match what {
        BenchCommand::Run { approach, concurrency, buffer, .. } => {
            let setup = crate::dev::demo::SaleSetup {
                concurrency,
                buffer,
                ..crate::dev::demo::SaleSetup::new(scenario, approach, Some(&url))
            };
            let report = crate::dev::demo::run_sale(setup).await?;
            print_report(json, &report, |report| report.render())?;
        }
        BenchCommand::Sweep { levels, svg, .. } => {
            let sweep = crate::dev::bench::sweep(scenario, &url, &levels).await?;
            std::fs::write(&svg, sweep.svg()).with_context(|| format!("writing {}", svg.display()))?;
            if json {
                println!("{}", serde_json::to_string(&sweep)?);
            }
            println!("chart written to {}", svg.display());
        }
        BenchCommand::Durability { rounds, .. } => {
            anyhow::ensure!(
                redis.is_none(),
                "bench durability starts the Redis servers each mode needs (a replica, appendfsync always); drop --redis"
            );
            let cost = crate::dev::bench::durability::measure(scenario, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Orders { rounds, postgres, .. } => {
            let cost = crate::dev::bench::orders::measure(scenario, rounds, &url, postgres.as_deref()).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Crowd {
            rates,
            arrival_s,
            concurrency,
            svg,
            waiting_room: true,
            units,
            admit_per_s,
            waiters_max,
            ..
        } => {
            use crate::dev::bench::room_crowd;
            let plan = room_crowd::RoomCrowdPlan {
                scenario,
                multipliers: rates.unwrap_or_else(|| room_crowd::DEFAULT_RATES.to_vec()),
                arrival_s,
                waiters_max,
                units,
                admit_per_s,
                concurrency,
            };
            let crowd = room_crowd::run(&plan, &url).await?;
            let svg = svg.unwrap_or_else(|| PathBuf::from("bench-room-crowd.svg"));
            std::fs::write(&svg, crowd.svg()).with_context(|| format!("writing {}", svg.display()))?;
            if json {
                println!("{}", serde_json::to_string(&crowd)?);
            } else {
                println!("{}\nchart written to {}", crowd.render(), svg.display());
            }
        }
        BenchCommand::Crowd { rates, arrival_s, concurrency, svg, .. } => {
            let plan = crate::dev::bench::crowd::CrowdPlan {
                scenario,
                multipliers: rates.unwrap_or_else(|| vec![0.5, 1.0, 2.0, 4.0]),
                arrival_s: arrival_s.unwrap_or(10.0),
                concurrency,
            };
            let crowd = crate::dev::bench::crowd::run(&plan, &url).await?;
            let svg = svg.unwrap_or_else(|| PathBuf::from("bench-crowd.svg"));
            std::fs::write(&svg, crowd.svg()).with_context(|| format!("writing {}", svg.display()))?;
            if json {
                println!("{}", serde_json::to_string(&crowd)?);
            } else {
                println!("{}\nchart written to {}", crowd.render(), svg.display());
            }
        }
        BenchCommand::Safeguards { rounds, .. } => {
            let cost = crate::dev::bench::safeguards::measure(scenario, &url, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Auth { rounds, .. } => {
            let cost = crate::dev::bench::auth::measure(scenario, &url, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Coordinator { .. } | BenchCommand::HotSku { .. } | BenchCommand::Binaries { .. } => {}
        BenchCommand::SoldOut { rounds, .. } => {
            let path = crate::dev::bench::sold_out::measure(scenario, &url, rounds).await?;
            print_report(json, &path, |report| report.render())?;
        }
        BenchCommand::Idle { skus, seconds, .. } => {
            let cost = crate::dev::bench::idle::measure(scenario, &url, skus, seconds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Traces { rounds, ratio, .. } => {
            anyhow::ensure!((0.0..=1.0).contains(&ratio), "--ratio must be between 0 and 1, got {ratio}");
            let cost = crate::dev::bench::traces::measure(scenario, &url, rounds, ratio).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Compare { rounds, concurrency, .. } => {
            let comparison = crate::dev::bench::compare(scenario, &url, rounds, concurrency).await?;
            print_report(json, &comparison, |report| report.render())?;
        }
    }
    Ok(())
}
