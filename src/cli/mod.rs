//! The `seckill` command line: one module per subcommand group, each parsing its arguments,
//! calling one function of the library and printing the answer. One output rule for every
//! command: a table (or a line) for a person on stdout, exactly one JSON object with `--json`;
//! logs and progress bars go to stderr.
//!
//! - `serve`: `up`, `node`, `coordinator`, `orders` (run a part until stopped).
//! - `fleet`: `fleet up|down`, `lb-config`, `lb-sync`. `admin`: `admin …`. `reconcile`: `reconcile`.
//!   `healthcheck`: one probe, for a container's health check.
//! - `lab/` (feature `lab`, on by default): `bench …`, `demo`, `load`, `nemesis`, `paysim`.

mod admin;
mod fleet;
mod healthcheck;
#[cfg(feature = "lab")]
mod lab;
mod reconcile;
mod serve;

#[cfg(feature = "lab")]
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

/// `--config` and `--run-dir`, shared by every command that reads a cluster config.
#[derive(clap::Args)]
struct ConfigArg {
    /// The cluster config [default: ./cluster.toml if present, else the built-in copy]
    #[arg(long, value_name = "PATH", global = true)]
    config: Option<PathBuf>,
    /// The run directory of the `seckill fleet up` this command works with: a secret set
    /// neither as VARIABLE nor as VARIABLE_FILE is read from DIR/secrets/VARIABLE, where `fleet
    /// up` keeps the ones it drew (cluster and admin tokens, passwords, the payment secret)
    #[arg(long, value_name = "DIR", global = true)]
    run_dir: Option<PathBuf>,
}

impl ConfigArg {
    /// The config to load; from now on, secrets missing from the environment are read from
    /// `--run-dir`'s secrets.
    fn source(self) -> ConfigSource {
        if let Some(run_dir) = &self.run_dir {
            protocol::env_secret::use_secrets_dir(run_dir);
        }
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
    /// Check the ledger's books against the order store, per SKU; exits 1 on a mismatch.
    Reconcile(reconcile::ReconcileArgs),
    /// Start or stop a whole fleet as processes on this machine: Redis, coordinator, nodes, nginx.
    Fleet {
        #[command(subcommand)]
        action: fleet::FleetCommand,
    },
    /// Print a load-balancer config for the fleet of the config.
    LbConfig(fleet::LbConfigArgs),
    /// Keep nginx's config following the coordinator's live nodes, reloading nginx when they
    /// change (with --run-nginx, as nginx's parent).
    LbSync(fleet::LbSyncArgs),
    /// Exit 0 if a process answers its probe with 2xx, 1 otherwise: a container's health check
    /// (the image has no curl).
    Healthcheck(healthcheck::HealthcheckArgs),
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
    #[cfg(feature = "lab")]
    #[command(flatten)]
    Lab(lab::LabCommand),
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
    #[cfg(feature = "lab")]
    if !args.command.json() && std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        // Bars are drawn only by the lab's long runs; the server build has none.
        testkit::progress::enable();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match args.command {
            Command::Up(args) => serve::up(args).await,
            Command::Coordinator(args) => serve::member(args).await,
            Command::Node(args) => serve::node(args).await,
            Command::Orders(args) => serve::orders(args).await,
            Command::Reconcile(args) => reconcile::run(args).await,
            Command::Fleet { action } => fleet::run(action).await,
            Command::LbConfig(args) => fleet::lb_config(args),
            Command::LbSync(args) => fleet::lb_sync(args).await,
            Command::Healthcheck(args) => healthcheck::run(args).await,
            Command::Admin { target, action } => admin::run(target, action).await,
            #[cfg(feature = "lab")]
            Command::Lab(command) => command.run().await,
        }
    })
}

impl Command {
    /// Whether the command runs servers someone operates, or reports on a run it made itself.
    fn audience(&self) -> Audience {
        match self {
            #[cfg(feature = "lab")]
            Command::Lab(command) => command.audience(),
            _ => Audience::Operator,
        }
    }

    /// The command prints JSON for a script (so no progress bars).
    #[cfg(feature = "lab")]
    fn json(&self) -> bool {
        match self {
            Command::Reconcile(args) => args.json,
            Command::Admin { target, .. } => target.json,
            #[cfg(feature = "lab")]
            Command::Lab(command) => command.json(),
            _ => false,
        }
    }
}

fn parse_instant(text: &str) -> Result<u64, String> {
    text.parse().or_else(|_| protocol::terms::sale_time::parse(text))
}

fn parse_buffer(text: &str) -> Result<Buffer, String> {
    Buffer::parse(text).ok_or_else(|| format!("{text:?} is neither a unit count nor a percentage like 10%"))
}
