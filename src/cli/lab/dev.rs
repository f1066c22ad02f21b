//! `seckill demo`, `seckill load` and `seckill nemesis`: a sale run in process, a sale's buyers
//! sent at running nodes, and a real fleet broken on purpose.

use std::path::PathBuf;
use std::time::Duration;

use super::print_report;
use crate::cli::ConfigArg;
use crate::dev::buyer_auth::BuyerAuth;
use crate::dev::scenario::Scenario;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// A named scenario: small, failover, standard, standard-failover, orders or payments
    /// (docs/scenarios.md).
    #[arg(long, default_value = "small")]
    pub(super) scenario: Scenario,
    /// Use Redis at this URL as the ledger instead of the embedded one.
    #[arg(long)]
    redis: Option<String>,
    /// `--scenario orders` or `payments`: keep orders in PostgreSQL at this URL instead of
    /// SQLite in memory.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// How buyers prove who they are: `none` (the body's user is believed), or `[auth] mode =
    /// "jwt"` with a token per buyer, HS256 or ES256 (keys drawn for the run).
    #[arg(long, value_enum, default_value = "none")]
    auth: BuyerAuth,
    /// Split the sale's SKU into this many stripes (`stripes` in its `[[skus]]`): a buyer
    /// buys on the stripe its user id hashes to, and the coordinator moves units between them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    stripes: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Where to send purchases (a load balancer, or nodes, round-robin), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    target: Vec<std::net::SocketAddr>,
    #[arg(long)]
    sku: String,
    /// Purchase attempts (distinct Idempotency-Keys); retries of 503s come on top.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Distinct users the attempts are spread over.
    #[arg(long, default_value_t = 2_000)]
    users: u64,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Attempts per second, open loop (latency from each attempt's intended time); without
    /// it, closed loop: as fast as answers come.
    #[arg(long)]
    rate: Option<u64>,
    #[arg(long)]
    pub(super) json: bool,
    /// The fleet's config: under `[auth] mode = "jwt"` each buyer presents a token signed
    /// with the secret `hs256_secret_env` names, as the shop's identity provider would.
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct NemesisArgs {
    /// Seed of the first schedule; schedule i uses seed + i, so `--seed S --schedules 1`
    /// replays schedule S alone [default: random, printed]
    #[arg(long)]
    seed: Option<u64>,
    /// Schedules to run, each on a fresh fleet.
    #[arg(long, default_value_t = 100)]
    schedules: usize,
    /// Nodes in each fleet (with 3 coordinator members and the ledger's Redis).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Length of each schedule's fault phase, in seconds; then everything heals.
    #[arg(long, default_value_t = 14)]
    duration_s: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Write each schedule's history, samples, ledger and (on a violation) logs here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run the ledger on Redis Sentinel (a master, a replica, three sentinels) with
    /// `durability = "replica"`; Redis kills become master failovers.
    #[arg(long, conflicts_with = "redis_cluster")]
    sentinel: bool,
    /// Run the ledger on a Redis Cluster (three masters with a replica each) with
    /// `durability = "replica"`; Redis faults hit the SKU's master, kills become failovers.
    #[arg(long)]
    redis_cluster: bool,
    /// Buyers unverified (`[auth] mode = "none"`); by default every buyer presents a JWT of
    /// its own (`mode = "jwt"`, HS256, a secret drawn per schedule).
    #[arg(long)]
    auth_none: bool,
    /// Split each SKU of the run into this many stripes (`stripes` in its `[[skus]]` and in the
    /// admin API's create), and judge the stripes' books one by one and as one SKU.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    stripes: u32,
    /// Sell a third SKU only through a waiting room, to waiters of its own, and judge the
    /// room's rules: no ticket used twice, no admission beyond the rule, the line's order kept,
    /// no waiter left waiting after sold out.
    #[arg(long)]
    waiting_room: bool,
    /// Run the schedules on the Compose fleet of deploy/ (containers on their own network,
    /// brought up once for the run), with container and network faults: kill, pause, network
    /// disconnect, a node replaced by a fresh container. Needs a Docker daemon; run from the
    /// repository (or give --repo).
    #[arg(long, conflicts_with_all = ["sentinel", "redis_cluster", "stripes", "waiting_room"])]
    docker: bool,
    /// With --docker: the repository whose deploy/ is brought up.
    #[arg(long, value_name = "DIR", default_value = ".")]
    repo: PathBuf,
    /// With --docker: the server binary (built --no-default-features) for the images [default:
    /// deploy/build-images compiles one]
    #[arg(long, value_name = "PATH")]
    server_binary: Option<PathBuf>,
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let DemoArgs { scenario, redis, postgres, auth: buyer_auth, stripes, json } = args;
    let (redis, postgres) = (redis.as_deref(), postgres.as_deref());
    let lifecycle = [crate::dev::scenario::ORDERS, crate::dev::scenario::PAYMENTS].contains(&scenario.name);
    if lifecycle {
        anyhow::ensure!(buyer_auth == BuyerAuth::None, "--auth goes with the sale scenarios, not {}", scenario.name);
    }
    if scenario.name == crate::dev::scenario::ORDERS {
        let report = crate::dev::demo::orders::run(scenario, redis, postgres).await?;
        print_report(json, &report, |report| report.render())?;
        anyhow::ensure!(report.ok(), "the order lifecycle broke an invariant");
        return Ok(());
    }
    if scenario.name == crate::dev::scenario::PAYMENTS {
        let report = crate::dev::demo::payments::run(scenario, redis, postgres).await?;
        print_report(json, &report, |report| report.render())?;
        anyhow::ensure!(report.ok(), "payments broke a promise: {}", report.problems.join("; "));
        return Ok(());
    }
    anyhow::ensure!(postgres.is_none(), "--postgres goes with --scenario orders or payments");
    let report = crate::dev::demo::run(scenario, redis, buyer_auth, stripes).await?;
    print_report(json, &report, |report| report.render())?;
    anyhow::ensure!(
        report.oversell == 0 && report.undersell == 0 && report.duplicates == 0,
        "the sale broke an invariant"
    );
    Ok(())
}

async fn run_nemesis(options: &nemesis::Options, json: bool) -> anyhow::Result<()> {
    let (seed, schedules) = (options.seed, options.schedules);
    eprintln!("nemesis: seed {seed} ({schedules} schedules; replay with --seed {seed})");
    let report = nemesis::run(options, |_| {}).await?;
    verdict(&report, json)
}

/// Prints a run's report (a table, or JSON) and fails on any schedule not run or not clean.
fn verdict(report: &nemesis::report::RunReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", report.render());
    }
    let failing = report.failing_seeds(&[]);
    let not_run: Vec<u64> = report.errors.iter().map(|e| e.seed).collect();
    anyhow::ensure!(not_run.is_empty(), "schedules with seeds {not_run:?} could not run");
    anyhow::ensure!(failing.is_empty(), "violations in the schedules with seeds {failing:?}");
    Ok(())
}

async fn run_docker_nemesis(options: &nemesis::docker::DockerOptions, json: bool) -> anyhow::Result<()> {
    let (seed, schedules) = (options.seed, options.schedules);
    eprintln!("nemesis --docker: seed {seed} ({schedules} schedules on one Compose fleet; replay with --seed {seed})");
    let report = nemesis::docker::run(options, |one| {
        let violations = one.schedule.violations.len();
        eprintln!("nemesis --docker: {}: {} faults, {violations} violations", one.plan, one.schedule.faults.len());
    })
    .await?;
    verdict(&report, json)
}

pub async fn load(args: LoadArgs) -> anyhow::Result<()> {
    let LoadArgs { target, sku, requests, users, concurrency, rate, json, config } = args;
    let bearer = crate::dev::buyer_auth::load_minter(&config.source().load()?.auth)?;
    let plan = testkit::load::LoadPlan {
        targets: target,
        sku,
        purchases: requests,
        users,
        concurrency,
        retries_max: 5,
        retry_pause: Duration::from_millis(20),
        seed: fastrand::u64(..),
        rate_per_s: rate,
        bearer,
    };
    let report = testkit::load::run(plan).await?;
    if json {
        let summary = serde_json::json!({
            "requests": report.requests,
            "purchased": report.count("purchased"),
            "rps": requests_per_s(&report).round(),
            "p50_ms": report.latency_ms(0.5),
            "p99_ms": report.latency_ms(0.99),
            "p999_ms": report.latency_ms(0.999),
            "elapsed_s": report.elapsed.as_secs_f64(),
            "all_answered_s": report.all_answered.as_secs_f64(),
            "last_sale_s": report.last_sale.map(|d| d.as_secs_f64()),
            "late_sends": report.late_sends,
            "outcomes": report.outcomes,
        });
        println!("{summary}");
    } else {
        println!("{}", render_load(&report));
    }
    Ok(())
}

fn requests_per_s(report: &testkit::load::LoadReport) -> f64 {
    report.requests as f64 / report.elapsed.as_secs_f64()
}

/// The load run for a person, in the shape of the demo's report.
fn render_load(report: &testkit::load::LoadReport) -> String {
    let outcomes: Vec<String> = report.outcomes.iter().map(|(outcome, n)| format!("{outcome}={n}")).collect();
    let last_sale = report.last_sale.map_or("none".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
    format!(
        "requests      {} (retries included)\n\
         purchased     {}\n\
         throughput    {:.0} req/s over {:.2} s\n\
         latency       p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms\n\
         answered      all by {:.2} s, last sale at {last_sale}\n\
         late sends    {}\n\
         outcomes      {}",
        report.requests,
        report.count("purchased"),
        requests_per_s(report),
        report.elapsed.as_secs_f64(),
        report.latency_ms(0.5),
        report.latency_ms(0.99),
        report.latency_ms(0.999),
        report.all_answered.as_secs_f64(),
        report.late_sends,
        outcomes.join(" "),
    )
}

pub async fn nemesis(args: NemesisArgs) -> anyhow::Result<()> {
    let NemesisArgs {
        seed,
        schedules,
        nodes,
        duration_s,
        json,
        out,
        sentinel,
        redis_cluster,
        auth_none,
        stripes,
        waiting_room,
        docker,
        repo,
        server_binary,
    } = args;
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    if docker {
        let options = nemesis::docker::DockerOptions {
            repo,
            server_binary,
            // This very binary holds the lab: the sandbox the fleet's lab image runs.
            lab_binary: Some(std::env::current_exe()?),
            seed,
            schedules,
            nodes,
            fault_phase: Duration::from_secs(duration_s),
            out,
        };
        return run_docker_nemesis(&options, json).await;
    }
    let redis = match (sentinel, redis_cluster) {
        (true, _) => nemesis::RedisLayout::Sentinel,
        (_, true) => nemesis::RedisLayout::Cluster,
        _ => nemesis::RedisLayout::Single,
    };
    let options = nemesis::Options {
        exe: std::env::current_exe()?,
        seed,
        schedules,
        nodes,
        fault_phase: Duration::from_secs(duration_s),
        out,
        redis,
        verified_buyers: !auth_none,
        stripes,
        waiting_room,
    };
    run_nemesis(&options, json).await
}
