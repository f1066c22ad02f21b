//! The `seckill` command. Parses arguments and hands over to the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use seckill::admin_cli::{self, AdminClient, Call, MemberOp};
use seckill::cluster::{build_ledger, Options, RunningCluster};
use seckill::config::Buffer;
use seckill::config_source::ConfigSource;
use seckill::demo::Approach;
use seckill::logging::Audience;
use seckill::scenario::Scenario;

#[derive(Parser)]
#[command(name = "seckill", version, about = "Flash-sale inventory cluster")]
#[command(after_help = "Logs go to stderr: warnings, and what an operator acts on. -v shows seckill's debug \
    logs, -vv everyone's; RUST_LOG overrides both.\n\
    --config: without it, ./cluster.toml if there is one, else the built-in copy of the repository's cluster.toml.")]
struct Args {
    /// More logs: -v seckill's debug logs, -vv every crate's.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// `--config`, shared by every command that reads a cluster config.
#[derive(clap::Args)]
struct ConfigArg {
    /// The cluster config [default: ./cluster.toml if present, else the built-in copy]
    #[arg(long, value_name = "PATH", global = true)]
    config: Option<PathBuf>,
}

impl ConfigArg {
    fn source(self) -> ConfigSource {
        ConfigSource::resolve(self.config)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run every node of the config in this process until Ctrl-C.
    Up {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run one coordinator member of the config until Ctrl-C or SIGTERM.
    Coordinator {
        /// The member's name in [coordinator] members.
        #[arg(long)]
        id: String,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run one node of the config until Ctrl-C or SIGTERM; then drain and hand the lease back.
    Node {
        /// The node's id in [[nodes]].
        #[arg(long)]
        id: String,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run the order service of the config until Ctrl-C or SIGTERM: order events become orders,
    /// unpaid orders expire and their units sell again, and the order API answers.
    Orders {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run the sandbox payment provider until Ctrl-C or SIGTERM: a small Stripe-like API
    /// (create, pay, query, refund) whose successes are notified to the order service signed,
    /// with fault knobs (docs/payments.md). Loopback only; it takes no real money.
    Paysim {
        /// Where its API listens: a loopback address (port 0 picks a free one; the line
        /// `paysim on http://ADDR` on stdout names it).
        #[arg(long, default_value = "127.0.0.1:8095")]
        listen: std::net::SocketAddr,
        /// The environment variable holding the secret callbacks are signed with: the order
        /// service's payment secret.
        #[arg(long, value_name = "NAME", default_value = seckill::config::PAYMENT_SECRET_ENV)]
        secret_env: String,
        /// Seeds every fault's draws, so the same requests meet the same faults [default:
        /// random, printed]
        #[arg(long)]
        seed: Option<u64>,
        #[command(flatten)]
        faults: PaysimFaults,
    },
    /// Check the ledger's books against the order store, per SKU; exits 1 on a mismatch.
    Reconcile {
        #[command(flatten)]
        config: ConfigArg,
        /// Only this SKU [default: every SKU of the config].
        #[arg(long)]
        sku: Option<String>,
        /// Replay order events missing from the store and complete interrupted releases, then
        /// check again.
        #[arg(long)]
        repair: bool,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Start or stop a whole fleet as processes on this machine: Redis, coordinator, nodes, nginx.
    Fleet {
        #[command(subcommand)]
        action: FleetCommand,
    },
    /// Print a load-balancer config for the fleet of the config.
    LbConfig {
        kind: LoadBalancer,
        #[command(flatten)]
        config: ConfigArg,
        /// Where the load balancer listens.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
    /// Benchmark the cluster against the Redis-only approach.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Send a flash sale's buyers at running nodes or a load balancer and print what came back.
    Load {
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
        json: bool,
        /// The fleet's config: under `[auth] mode = "jwt"` each buyer presents a token signed
        /// with the secret `hs256_secret_env` names, as the shop's identity provider would.
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run a complete flash sale in process and print what happened.
    Demo {
        /// A named scenario: small, failover, standard or standard-failover (docs/scenarios.md).
        #[arg(long, default_value = "small")]
        scenario: Scenario,
        /// Use Redis at this URL as the ledger instead of the embedded one.
        #[arg(long)]
        redis: Option<String>,
        /// `--scenario orders`: keep orders in PostgreSQL at this URL instead of SQLite in memory.
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
        /// How buyers prove who they are: `none` (the body's user is believed), or `[auth] mode =
        /// "jwt"` with a token per buyer, HS256 or ES256 (keys drawn for the run).
        #[arg(long, value_enum, default_value = "none")]
        auth: seckill::buyer_auth::BuyerAuth,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Break a real fleet on purpose: randomized fault schedules, a recorded history, a checker
    /// for every promise (docs/reliability.md). Exits non-zero on any violation.
    Nemesis {
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
        json: bool,
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
    },
    /// Operate a running coordinator: see the cluster, change SKUs, edit the blacklist.
    ///
    /// The token comes from SECKILL_ADMIN_TOKEN or --token-file, never from the command line
    /// (where `ps` shows it).
    Admin {
        #[command(flatten)]
        target: AdminTarget,
        #[command(subcommand)]
        action: AdminCommand,
    },
}

/// The sandbox provider's faults at start; `PUT /v1/faults` changes them while it runs.
#[derive(clap::Args)]
struct PaysimFaults {
    /// Wait this long after a payment succeeds before notifying it.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    callback_delay_ms: u64,
    /// Chance that a success is notified twice.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    duplicate_p: f64,
    /// Chance that a success is never notified (only a query finds it).
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    drop_p: f64,
    /// Hold notifications and send each batch (--reorder-window-ms) in reverse order.
    #[arg(long)]
    reorder: bool,
    /// Under --reorder, a batch is what arrives within this long of its first notification.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    reorder_window_ms: u64,
    /// Chance that a buyer's "succeed" is declined.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    decline_p: f64,
    /// Chance that a create, query, refund or close answers 503 and does nothing.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    unavailable_p: f64,
    /// Chance that a create, refund or close is done but answered 503 (a lost answer).
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_probability)]
    answer_lost_p: f64,
}

impl From<PaysimFaults> for paysim::Faults {
    fn from(knobs: PaysimFaults) -> Self {
        paysim::Faults {
            callback_delay_ms: knobs.callback_delay_ms,
            duplicate_p: knobs.duplicate_p,
            drop_p: knobs.drop_p,
            reorder: knobs.reorder,
            reorder_window_ms: knobs.reorder_window_ms,
            decline_p: knobs.decline_p,
            unavailable_p: knobs.unavailable_p,
            answer_lost_p: knobs.answer_lost_p,
        }
    }
}

/// Where admin calls go and how they authenticate.
#[derive(clap::Args)]
struct AdminTarget {
    /// Coordinator members, comma-separated host:port [default: [coordinator] members of the
    /// config]. Writes reaching a follower are sent on to the leader it names.
    #[arg(long, value_delimiter = ',', value_parser = admin_cli::parse_member, global = true)]
    coordinator: Vec<String>,
    #[command(flatten)]
    config: ConfigArg,
    /// A file holding the admin token (instead of SECKILL_ADMIN_TOKEN).
    #[arg(long, value_name = "PATH", global = true)]
    token_file: Option<PathBuf>,
    /// Print the coordinator's JSON answer instead of a summary.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Leader, nodes (live, epoch, worker id, grants) and every SKU's figures.
    Cluster,
    /// Create a SKU: its ledger, then its terms in raft; live nodes start selling it.
    Create {
        #[arg(value_parser = admin_cli::parse_sku)]
        sku: String,
        /// Units on sale.
        #[arg(long)]
        total: u64,
        /// Units one user may buy in total; 0 = no limit [server default: 0]
        #[arg(long)]
        per_user_limit: Option<u32>,
        /// Most units in one order [server default: 1]
        #[arg(long)]
        qty_max: Option<u32>,
        /// Extra units per node: a count (50) or a share of its share (10%) [server default: 10%]
        #[arg(long, value_parser = parse_buffer)]
        buffer: Option<Buffer>,
        /// Sale start: a date-time with an offset (2026-11-22T10:00:00+08:00) or Unix ms.
        #[arg(long, value_parser = parse_instant)]
        starts_at: Option<u64>,
        /// Sale end, as `--starts-at`.
        #[arg(long, value_parser = parse_instant)]
        ends_at: Option<u64>,
        /// Every purchase must bring a one-time submit token.
        #[arg(long)]
        require_token: bool,
        /// Seconds a submit token stays usable [server default: 300]
        #[arg(long)]
        token_ttl_s: Option<u64>,
        /// Price of one unit in the currency's minor unit (cents); 0 makes it a giveaway.
        #[arg(long)]
        price: u64,
        /// ISO 4217 code of the price's currency [default: USD]
        #[arg(long)]
        currency: Option<String>,
        /// Seconds a buyer has to pay before the order expires and its units sell again
        /// [default: 900]
        #[arg(long)]
        pay_timeout: Option<u64>,
    },
    /// Raise a SKU's total to TOTAL (sending it again adds nothing); with --price, --currency or
    /// --pay-timeout, sales from now on are priced so (orders already sold keep their terms).
    Restock {
        #[arg(value_parser = admin_cli::parse_sku)]
        sku: String,
        /// The new total, at least the current one.
        #[arg(long)]
        total: u64,
        /// Price of one unit in minor units, for sales from now on.
        #[arg(long)]
        price: Option<u64>,
        /// ISO 4217 code of the price's currency, for sales from now on.
        #[arg(long)]
        currency: Option<String>,
        /// Seconds to pay, for orders sold from now on.
        #[arg(long)]
        pay_timeout: Option<u64>,
    },
    /// Close a SKU: every later purchase is answered `ended`.
    Close {
        #[arg(value_parser = admin_cli::parse_sku)]
        sku: String,
    },
    /// Change the buffer the leader keeps on top of a SKU's remaining stock.
    SetBuffer {
        #[arg(value_parser = admin_cli::parse_sku)]
        sku: String,
        /// A count (50) or a percentage (25%).
        #[arg(value_parser = parse_buffer)]
        buffer: Buffer,
    },
    /// List, add or remove blocked users and addresses (fleet-wide).
    Blacklist {
        #[command(subcommand)]
        action: BlacklistCommand,
    },
    /// Replace a coordinator member that lost its disk: `remove` it, restart it on its empty
    /// data directory, `add-learner` (returns once it caught up), then `promote`.
    Member {
        #[arg(value_enum)]
        op: MemberOp,
        /// The member's name in [coordinator] members.
        member: String,
    },
}

#[derive(Subcommand)]
enum BlacklistCommand {
    /// Every entry, with the time it has left.
    List,
    /// Block user:<id> or ip:<address> on every node.
    Add {
        #[arg(value_parser = admin_cli::parse_entry)]
        entry: String,
        /// Seconds until the entry lapses [default: until removed]
        #[arg(long)]
        ttl_s: Option<u64>,
    },
    /// Unblock user:<id> or ip:<address>.
    Remove {
        #[arg(value_parser = admin_cli::parse_entry)]
        entry: String,
    },
}

/// Load balancers `lb-config` can write a config for.
#[derive(Clone, Copy, ValueEnum)]
enum LoadBalancer {
    Nginx,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Start everything; logs and pids go under the run directory.
    Up {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long, default_value = "run")]
        run_dir: PathBuf,
        /// Where nginx listens: send purchases here.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
    },
    /// Stop what `up` started: nodes first (they hand their leases back), then the coordinator,
    /// nginx and Redis.
    Down {
        #[arg(long, default_value = "run")]
        run_dir: PathBuf,
    },
}

/// What every bench command takes.
#[derive(clap::Args)]
struct BenchCommon {
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
enum BenchCommand {
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
        buffer: Option<seckill::config::Buffer>,
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
    /// rate, latency from each press's intended time; writes an SVG chart.
    Crowd {
        #[command(flatten)]
        common: BenchCommon,
        /// Offered rates, as multiples of Redis-only's saturation rate measured first.
        #[arg(long, value_delimiter = ',', default_value = "0.5,1,2,4")]
        rates: Vec<f64>,
        /// Seconds buyers keep arriving at each rate.
        #[arg(long, default_value_t = 10.0)]
        arrival_s: f64,
        /// Buyers the generator keeps in flight at most; an open-loop run needs enough that
        /// presses are not held back by answers still outstanding.
        #[arg(long, default_value_t = 512)]
        concurrency: usize,
        /// Where to write the chart.
        #[arg(long, default_value = "bench-crowd.svg")]
        svg: PathBuf,
    },
    /// The path most of a flash crowd takes: a sold-out SKU answered from memory, against the
    /// bare HTTP stack's ceiling, alternating over rounds.
    SoldOut {
        #[command(flatten)]
        common: BenchCommon,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
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
fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    seckill::logging::init(args.verbose, args.command.audience());
    // Bars are for a person at a terminal: not when output is piped, logged, or JSON for a script.
    if !args.command.json() && std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        testkit::progress::enable();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match args.command {
            Command::Up { config } => up(config.source()).await,
            Command::Coordinator { id, config } => run_member(&id, config.source()).await,
            Command::Node { id, config } => run_node(&id, config.source()).await,
            Command::Orders { config } => run_orders(config.source()).await,
            Command::Paysim { listen, secret_env, seed, faults } => {
                run_paysim(listen, &secret_env, seed, faults.into()).await
            }
            Command::Reconcile { config, sku, repair, json } => reconcile(config.source(), sku, repair, json).await,
            Command::Admin { target, action } => admin(target, action).await,
            Command::Load { target, sku, requests, users, concurrency, rate, json, config } => {
                let bearer = seckill::buyer_auth::load_minter(&config.source().load()?.auth)?;
                let plan = testkit::load::LoadPlan {
                    targets: target,
                    sku,
                    purchases: requests,
                    users,
                    concurrency,
                    retries_max: 5,
                    retry_pause: std::time::Duration::from_millis(20),
                    seed: fastrand::u64(..),
                    rate_per_s: rate,
                    bearer,
                };
                let report = testkit::load::run(plan).await?;
                let summary = serde_json::json!({
                    "requests": report.requests,
                    "purchased": report.count("purchased"),
                    "rps": (report.requests as f64 / report.elapsed.as_secs_f64()).round(),
                    "p50_ms": report.latency_ms(0.5),
                    "p99_ms": report.latency_ms(0.99),
                    "p999_ms": report.latency_ms(0.999),
                    "elapsed_s": report.elapsed.as_secs_f64(),
                    "all_answered_s": report.all_answered.as_secs_f64(),
                    "last_sale_s": report.last_sale.map(|d| d.as_secs_f64()),
                    "late_sends": report.late_sends,
                    "outcomes": report.outcomes,
                });
                if json {
                    println!("{summary}");
                } else {
                    println!("{}", serde_json::to_string_pretty(&summary)?);
                }
                Ok(())
            }
            Command::Demo { scenario, redis, postgres, auth, json } => {
                run_demo(scenario, redis.as_deref(), postgres.as_deref(), auth, json).await
            }
            Command::Nemesis { seed, schedules, nodes, duration_s, json, out, sentinel, redis_cluster, auth_none } => {
                let redis = match (sentinel, redis_cluster) {
                    (true, _) => nemesis::RedisLayout::Sentinel,
                    (_, true) => nemesis::RedisLayout::Cluster,
                    _ => nemesis::RedisLayout::Single,
                };
                let seed = seed.unwrap_or_else(|| fastrand::u64(..));
                let options = nemesis::Options {
                    exe: std::env::current_exe()?,
                    seed,
                    schedules,
                    nodes,
                    fault_phase: Duration::from_secs(duration_s),
                    out,
                    redis,
                    verified_buyers: !auth_none,
                };
                run_nemesis(&options, json).await
            }
            Command::Bench { what } => bench(what).await,
            Command::Fleet { action: FleetCommand::Up { config, run_dir, listen } } => {
                seckill::fleet::up(&config.source(), &run_dir, listen).await?;
                println!(
                    "fleet up: send purchases to http://{listen}/v1/purchase (logs in {})",
                    run_dir.join("logs").display()
                );
                Ok(())
            }
            Command::Fleet { action: FleetCommand::Down { run_dir } } => {
                seckill::fleet::down(&run_dir)?;
                println!("fleet down");
                Ok(())
            }
            Command::LbConfig { kind: LoadBalancer::Nginx, config, listen } => {
                print!("{}", seckill::lb::nginx_config(&config.source().load()?, listen));
                Ok(())
            }
        }
    })
}

impl Command {
    /// Whether the command runs servers someone operates, or reports on a run it made itself.
    fn audience(&self) -> Audience {
        match self {
            Command::Demo { .. } | Command::Bench { .. } | Command::Load { .. } | Command::Nemesis { .. } => {
                Audience::Report
            }
            _ => Audience::Operator,
        }
    }

    /// The command prints JSON for a script (so no progress bars).
    fn json(&self) -> bool {
        match self {
            Command::Load { json, .. }
            | Command::Demo { json, .. }
            | Command::Nemesis { json, .. }
            | Command::Reconcile { json, .. } => *json,
            Command::Admin { target, .. } => target.json,
            Command::Bench { what } => what.json(),
            _ => false,
        }
    }
}

async fn run_member(name: &str, config: ConfigSource) -> anyhow::Result<()> {
    let cluster = config.load()?;
    seckill::cluster::require_cluster_token(&cluster)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let redis = seckill::guard::redis_connection(&cluster.ledger)?;
    let blacklist = seckill::guard::blacklist_store(&cluster.ledger, redis);
    let member = seckill::cluster::start_member(&cluster, name, ledger, blacklist).await?;
    println!("coordinator member {name} running (config: {config})");
    stop_requested().await?;
    member.stop().await;
    Ok(())
}

async fn run_node(id: &str, config: ConfigSource) -> anyhow::Result<()> {
    let cluster = config.load()?;
    seckill::cluster::require_cluster_token(&cluster)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let id = ledger::NodeId::new(id)?;
    if cluster.coordinator.is_none() {
        seckill::cluster::create_skus(&cluster, &*ledger).await?;
    }
    let node = seckill::cluster::start_node(&cluster, &id, ledger, &Options::default()).await?;
    println!("node {id} on http://{} (config: {config})", node.addr);
    stop_requested().await?;
    tracing::info!("stopping: draining in-flight requests, then leaving the group");
    node.stop().await;
    Ok(())
}

async fn up(config: ConfigSource) -> anyhow::Result<()> {
    let cluster = config.load()?;
    println!("config: {config}");
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = seckill::order_service::open_store(&cluster).await?;
    let running = RunningCluster::start(&cluster, ledger.clone(), Options::default()).await?;
    let orders = seckill::order_service::start(&cluster, ledger, store).await?;
    if let Err(e) = running.wait_ready(Duration::from_secs(10)).await {
        tracing::warn!("{e}");
    }
    for node in &running.nodes {
        println!("node {} on http://{}", node.node.id(), node.addr);
    }
    if let Some(addr) = orders.addr {
        println!("orders on http://{addr}");
    }
    println!("press Ctrl-C to stop");
    stop_requested().await?;
    tracing::info!("stopping: draining in-flight requests");
    running.stop().await;
    orders.stop().await;
    Ok(())
}

async fn run_orders(config: ConfigSource) -> anyhow::Result<()> {
    let cluster = config.load()?;
    anyhow::ensure!(
        cluster.ledger.url != "embedded",
        "ledger.url = \"embedded\" lives inside another process; `seckill orders` needs the Redis ledger the nodes use \
         (or run `seckill up`, which starts the order service beside its nodes)"
    );
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = seckill::order_service::open_store(&cluster).await?;
    let orders = seckill::order_service::start(&cluster, ledger, store).await?;
    match orders.addr {
        Some(addr) => println!("orders on http://{addr} (config: {config})"),
        None => println!("orders running, no API ([orders] listen is not set) (config: {config})"),
    }
    stop_requested().await?;
    orders.stop().await;
    Ok(())
}

async fn run_paysim(
    listen: std::net::SocketAddr,
    secret_env: &str,
    seed: Option<u64>,
    faults: paysim::Faults,
) -> anyhow::Result<()> {
    let secret = std::env::var(secret_env).ok().filter(|secret| !secret.is_empty()).with_context(|| {
        format!("{secret_env} is not set: it holds the secret payment callbacks are signed with (the order service's)")
    })?;
    anyhow::ensure!(
        secret.len() >= paysim::SECRET_BYTES_MIN,
        "{secret_env} must be at least {} characters",
        paysim::SECRET_BYTES_MIN
    );
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    let config = paysim::Config { secret: secret.into_bytes().into(), faults, seed };
    let sandbox = paysim::Paysim::start(listen, config).await?;
    tracing::info!(faults = ?sandbox.faults(), "sandbox payment provider running");
    println!("paysim on http://{} (seed {seed})", sandbox.addr);
    stop_requested().await?;
    sandbox.stop().await;
    Ok(())
}

async fn reconcile(config: ConfigSource, sku: Option<String>, repair: bool, json: bool) -> anyhow::Result<()> {
    let cluster = config.load()?;
    anyhow::ensure!(
        cluster.ledger.url != "embedded",
        "ledger.url = \"embedded\" lives inside another process; reconcile reads the Redis ledger the nodes use"
    );
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = seckill::order_service::open_store(&cluster).await?;
    let catalogue = seckill::order_service::current_catalogue(&cluster).await?;
    let skus: Vec<_> = match &sku {
        Some(sku) => {
            let id = ledger::SkuId::new(sku)?;
            let terms = catalogue.get(&id).cloned().with_context(|| {
                format!("--sku {sku}: neither in the config's [[skus]] nor in the coordinator's catalogue")
            })?;
            vec![(id, terms)]
        }
        None => catalogue.into_iter().collect(),
    };
    let mut repairs = serde_json::Map::new();
    let mut payments_redriven = None;
    if repair {
        for (id, terms) in &skus {
            let repaired = orders::reconcile::repair(&*ledger, &*store, id, terms).await.map_err(anyhow::Error::msg)?;
            repairs.insert(id.to_string(), serde_json::to_value(&repaired)?);
            if !json {
                println!(
                    "{id}: replayed {} order events, completed {} releases, {} not repairable",
                    repaired.replayed, repaired.released, repaired.unrepairable
                );
            }
        }
        let redriven = seckill::order_service::redrive_payments(&cluster, ledger.clone(), store.clone()).await?;
        if let (Some(redriven), false) = (&redriven, json) {
            println!(
                "payments: asked the provider again about {} payments and {} refunds: {} found paid, {} orders \
                 expired, {} refunded, {} still open{}",
                redriven.checks,
                redriven.refunds,
                redriven.found_by_query,
                redriven.expired,
                redriven.refunded,
                redriven.still_open,
                if redriven.busy { " (a sweeper held the lock: nothing asked; run it again)" } else { "" }
            );
        }
        payments_redriven = redriven;
    }
    let mut reports = Vec::new();
    for (id, _) in &skus {
        reports.push(orders::reconcile::check(&*ledger, &*store, id).await.map_err(anyhow::Error::msg)?);
    }
    let ok = reports.iter().all(orders::reconcile::SkuReport::ok);
    if json {
        let answer =
            serde_json::json!({ "ok": ok, "repaired": repairs, "payments": payments_redriven, "skus": reports });
        println!("{answer}");
    } else {
        print!("{}", orders::reconcile::table(&reports));
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM, the signal service managers stop processes with.
async fn stop_requested() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

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
            | BenchCommand::SoldOut { common, .. } => Some(common),
            BenchCommand::Coordinator { .. } => None,
        }
    }

    fn json(&self) -> bool {
        match self {
            BenchCommand::Coordinator { json, .. } => *json,
            other => other.common().is_some_and(|common| common.json),
        }
    }
}

async fn bench(what: BenchCommand) -> anyhow::Result<()> {
    if let BenchCommand::Coordinator { nodes, steady_s, member_exe, json } = what {
        let member_exe = match member_exe {
            Some(path) => path,
            None => std::env::current_exe()?,
        };
        let plan = seckill::bench_coordinator::CoordinatorPlan { sizes: nodes, steady_s, member_exe };
        let bench = seckill::bench_coordinator::run(&plan).await?;
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
            let setup = seckill::demo::SaleSetup {
                concurrency,
                buffer,
                ..seckill::demo::SaleSetup::new(scenario, approach, Some(&url))
            };
            let report = seckill::demo::run_sale(setup).await?;
            print_report(json, &report, |report| report.render())?;
        }
        BenchCommand::Sweep { levels, svg, .. } => {
            let sweep = seckill::bench::sweep(scenario, &url, &levels).await?;
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
            let cost = seckill::bench_durability::measure(scenario, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Orders { rounds, postgres, .. } => {
            let cost = seckill::bench_orders::measure(scenario, rounds, &url, postgres.as_deref()).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Crowd { rates, arrival_s, concurrency, svg, .. } => {
            let plan = seckill::bench_crowd::CrowdPlan { scenario, multipliers: rates, arrival_s, concurrency };
            let crowd = seckill::bench_crowd::run(&plan, &url).await?;
            std::fs::write(&svg, crowd.svg()).with_context(|| format!("writing {}", svg.display()))?;
            if json {
                println!("{}", serde_json::to_string(&crowd)?);
            } else {
                println!("{}\nchart written to {}", crowd.render(), svg.display());
            }
        }
        BenchCommand::Safeguards { rounds, .. } => {
            let cost = seckill::bench_safeguards::measure(scenario, &url, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Auth { rounds, .. } => {
            let cost = seckill::bench_auth::measure(scenario, &url, rounds).await?;
            print_report(json, &cost, |report| report.render())?;
        }
        BenchCommand::Coordinator { .. } => {}
        BenchCommand::SoldOut { rounds, .. } => {
            let path = seckill::bench_sold_out::measure(scenario, &url, rounds).await?;
            print_report(json, &path, |report| report.render())?;
        }
        BenchCommand::Compare { rounds, concurrency, .. } => {
            let comparison = seckill::bench::compare(scenario, &url, rounds, concurrency).await?;
            print_report(json, &comparison, |report| report.render())?;
        }
    }
    Ok(())
}

/// Prints a benchmark's or demo's report: one JSON object for a script, the table otherwise.
fn print_report<T: serde::Serialize>(json: bool, report: &T, render: impl FnOnce(&T) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", render(report));
    }
    Ok(())
}

fn parse_instant(text: &str) -> Result<u64, String> {
    text.parse().or_else(|_| protocol::terms::sale_time::parse(text))
}

fn parse_probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text:?} is not a probability from 0 to 1")),
    }
}

fn parse_buffer(text: &str) -> Result<Buffer, String> {
    Buffer::parse(text).ok_or_else(|| format!("{text:?} is neither a unit count nor a percentage like 10%"))
}

async fn run_demo(
    scenario: Scenario,
    redis: Option<&str>,
    postgres: Option<&str>,
    buyer_auth: seckill::buyer_auth::BuyerAuth,
    json: bool,
) -> anyhow::Result<()> {
    if scenario.name == seckill::scenario::ORDERS {
        anyhow::ensure!(
            buyer_auth == seckill::buyer_auth::BuyerAuth::None,
            "--auth goes with the sale scenarios, not orders"
        );
        let report = seckill::demo_orders::run(scenario, redis, postgres).await?;
        print_report(json, &report, |report| report.render())?;
        anyhow::ensure!(report.ok(), "the order lifecycle broke an invariant");
        return Ok(());
    }
    anyhow::ensure!(postgres.is_none(), "--postgres goes with --scenario orders");
    let report = seckill::demo::run(scenario, redis, buyer_auth).await?;
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
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render());
    }
    let failing = report.failing_seeds(&[]);
    let not_run: Vec<u64> = report.errors.iter().map(|e| e.seed).collect();
    anyhow::ensure!(not_run.is_empty(), "schedules with seeds {not_run:?} could not run");
    anyhow::ensure!(failing.is_empty(), "violations in the schedules with seeds {failing:?}");
    Ok(())
}

async fn admin(target: AdminTarget, action: AdminCommand) -> anyhow::Result<()> {
    let call = match action {
        AdminCommand::Cluster => Call::Cluster,
        AdminCommand::Create {
            sku,
            total,
            per_user_limit,
            qty_max,
            buffer,
            starts_at,
            ends_at,
            require_token,
            token_ttl_s,
            price,
            currency,
            pay_timeout,
        } => {
            let defaults = protocol::SkuTerms::new(total);
            let terms = protocol::SkuTerms {
                per_user_limit: per_user_limit.unwrap_or(defaults.per_user_limit),
                qty_max: qty_max.unwrap_or(defaults.qty_max),
                buffer: buffer.unwrap_or(defaults.buffer),
                starts_at_ms: starts_at,
                ends_at_ms: ends_at,
                require_token,
                token_ttl_s: token_ttl_s.unwrap_or(defaults.token_ttl_s),
                price,
                currency: currency.unwrap_or_else(|| defaults.currency.clone()),
                pay_timeout_s: pay_timeout.unwrap_or(defaults.pay_timeout_s),
                ..defaults
            };
            // The same rules the server applies, checked before anything is sent.
            terms
                .validate()
                .map_err(|invalid| anyhow::anyhow!("--{}: {}", invalid.field.replace('_', "-"), invalid.reason))?;
            Call::Create { sku, terms }
        }
        AdminCommand::Member { op, member } => Call::Member { member, op },
        AdminCommand::Restock { sku, total, price, currency, pay_timeout } => Call::Restock {
            sku,
            total,
            pricing: admin_cli::PricingChange { price, currency, pay_timeout_s: pay_timeout },
        },
        AdminCommand::Close { sku } => Call::Close { sku },
        AdminCommand::SetBuffer { sku, buffer } => Call::SetBuffer { sku, buffer },
        AdminCommand::Blacklist { action: BlacklistCommand::List } => Call::BlacklistList,
        AdminCommand::Blacklist { action: BlacklistCommand::Add { entry, ttl_s } } => {
            Call::BlacklistAdd { entry, ttl_s }
        }
        AdminCommand::Blacklist { action: BlacklistCommand::Remove { entry } } => Call::BlacklistRemove { entry },
    };
    let token = admin_cli::token(target.token_file.as_deref())?;
    let members = if target.coordinator.is_empty() {
        let source = target.config.source();
        let cluster = source.load()?;
        let group = cluster.coordinator.with_context(|| {
            format!("{source} has no [coordinator] section: pass --coordinator host:port or --config PATH")
        })?;
        group.members.iter().map(|member| member.addr.to_string()).collect()
    } else {
        target.coordinator
    };
    let reply = AdminClient::new(members, &token)?.call(&call).await?;
    if target.json {
        println!("{}", reply.body);
    }
    let reply = reply.success()?;
    if !target.json {
        println!("{}", admin_cli::render(&call, &reply));
    }
    Ok(())
}
