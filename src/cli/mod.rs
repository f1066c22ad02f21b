//! The `seckill` command line: one module per subcommand group, each parsing its arguments,
//! calling one function of the library and printing the answer. One output rule for every
//! command: a table (or a line) for a person on stdout, exactly one JSON object with `--json`;
//! logs and progress bars go to stderr.
//!
//! - `serve`: `up`, `node`, `coordinator`, `orders`, `paysim` (run a part until stopped).
//! - `fleet`: `fleet up|down`, `lb-config`. `admin`: `admin …`. `reconcile`: `reconcile`.
//! - `bench`: `bench …`. `dev`: `demo`, `load`, `nemesis`.

mod admin;
mod bench;
mod dev;
mod fleet;
mod reconcile;
mod serve;

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::source::ConfigSource;
use crate::config::Buffer;
use crate::logging::Audience;

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
    Up(serve::UpArgs),
    /// Run one coordinator member of the config until Ctrl-C or SIGTERM.
    Coordinator(serve::MemberArgs),
    /// Run one node of the config until Ctrl-C or SIGTERM; then drain and hand the lease back.
    Node(serve::NodeArgs),
    /// Run the order service of the config until Ctrl-C or SIGTERM: order events become orders,
    /// unpaid orders expire and their units sell again, and the order API answers.
    Orders(serve::OrdersArgs),
    /// Run the sandbox payment provider until Ctrl-C or SIGTERM: a small Stripe-like API
    /// (create, pay, query, refund) whose successes are notified to the order service signed,
    /// with fault knobs (docs/payments.md). Loopback only; it takes no real money.
    Paysim(serve::PaysimArgs),
    /// Check the ledger's books against the order store, per SKU; exits 1 on a mismatch.
    Reconcile(reconcile::ReconcileArgs),
    /// Start or stop a whole fleet as processes on this machine: Redis, coordinator, nodes, nginx.
    Fleet {
        #[command(subcommand)]
        action: fleet::FleetCommand,
    },
    /// Print a load-balancer config for the fleet of the config.
    LbConfig(fleet::LbConfigArgs),
    /// Benchmark the cluster against the Redis-only approach.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// Send a flash sale's buyers at running nodes or a load balancer and print what came back.
    Load(dev::LoadArgs),
    /// Run a complete flash sale in process and print what happened.
    Demo(dev::DemoArgs),
    /// Break a real fleet on purpose: randomized fault schedules, a recorded history, a checker
    /// for every promise (docs/reliability.md). Exits non-zero on any violation.
    Nemesis(dev::NemesisArgs),
    /// Operate a running coordinator: see the cluster, change SKUs, edit the blacklist.
    ///
    /// The token comes from SECKILL_ADMIN_TOKEN or --token-file, never from the command line
    /// (where `ps` shows it).
    Admin {
        #[command(flatten)]
        target: admin::AdminTarget,
        #[command(subcommand)]
        action: admin::AdminCommand,
    },
}

/// Runs the command line. Errors print as one line of causes, `error: what failed: why`, with
/// no backtrace: they are for the person who typed the command, and each says what to fix.
pub fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init(args.verbose, args.command.audience());
    // Bars are for a person at a terminal: not when output is piped, logged, or JSON for a script.
    if !args.command.json() && std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        testkit::progress::enable();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match args.command {
            Command::Up(args) => serve::up(args).await,
            Command::Coordinator(args) => serve::member(args).await,
            Command::Node(args) => serve::node(args).await,
            Command::Orders(args) => serve::orders(args).await,
            Command::Paysim(args) => serve::paysim(args).await,
            Command::Reconcile(args) => reconcile::run(args).await,
            Command::Fleet { action } => fleet::run(action).await,
            Command::LbConfig(args) => fleet::lb_config(args),
            Command::Bench { what } => bench::run(what).await,
            Command::Load(args) => dev::load(args).await,
            Command::Demo(args) => dev::demo(args).await,
            Command::Nemesis(args) => dev::nemesis(args).await,
            Command::Admin { target, action } => admin::run(target, action).await,
        }
    })
}

impl Command {
    /// Whether the command runs servers someone operates, or reports on a run it made itself.
    fn audience(&self) -> Audience {
        match self {
            Command::Demo(args) if args.scenario.name == crate::dev::scenario::PAYMENTS => Audience::FaultReport,
            Command::Demo(_) | Command::Bench { .. } | Command::Load(_) | Command::Nemesis(_) => Audience::Report,
            _ => Audience::Operator,
        }
    }

    /// The command prints JSON for a script (so no progress bars).
    fn json(&self) -> bool {
        match self {
            Command::Load(args) => args.json,
            Command::Demo(args) => args.json,
            Command::Nemesis(args) => args.json,
            Command::Reconcile(args) => args.json,
            Command::Admin { target, .. } => target.json,
            Command::Bench { what } => what.json(),
            _ => false,
        }
    }
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
