//! `seckill fleet up|down`, `seckill lb-config` and `seckill lb-sync`: a fleet as processes on
//! this machine, and the load balancer in front of it.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};

use super::ConfigArg;
use crate::config::source::ConfigSource;

#[derive(clap::Args)]
pub struct LbConfigArgs {
    kind: LoadBalancer,
    #[command(flatten)]
    config: ConfigArg,
    /// Where the load balancer listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
}

#[derive(clap::Args)]
pub struct LbSyncArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// The nginx config to keep writing; its folder is nginx's prefix (logs, pid, caches).
    #[arg(long, value_name = "PATH")]
    nginx_conf: PathBuf,
    /// Where nginx listens.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// How often the live nodes are read from the coordinator.
    #[arg(long, default_value_t = 1_000, value_name = "MS")]
    every_ms: u64,
    /// Run nginx as this process's child (one process for a container); without it, reload an
    /// nginx running already on the same config with `nginx -s reload`.
    #[arg(long)]
    run_nginx: bool,
    /// Write the config once for the live nodes, reload, and exit.
    #[arg(long, conflicts_with = "run_nginx")]
    once: bool,
    /// With --run-nginx as root: the user nginx's workers run as [default: nginx's, nobody]
    #[arg(long, value_name = "USER")]
    nginx_user: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LoadBalancer {
    Nginx,
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// Start everything; logs and pids go under the run directory.
    ///
    /// Secrets not given (cluster and admin tokens, Redis and PostgreSQL passwords, the payment
    /// secret) are drawn once and kept in RUN_DIR/secrets/VARIABLE (0600); pass `--run-dir` to
    /// `admin`, `reconcile`, `node` … to use them.
    Up {
        /// The cluster config, and the run directory [default: run]
        #[command(flatten)]
        config: ConfigArg,
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
    /// Stop one process of the fleet (a node, a member, the order service, nginx, Redis, the
    /// sandbox) and start it again as `up` did, with its arguments and secrets; waits for a node
    /// to be ready. The pid file follows; a pid reused by another process is never signalled.
    Restart {
        /// The process's name, as in RUN_DIR/pids (a node's or member's id, `orders`, `nginx`,
        /// `redis`, `paysim`)
        name: String,
        #[arg(long, default_value = "run")]
        run_dir: PathBuf,
    },
}

pub async fn run(action: FleetCommand) -> anyhow::Result<()> {
    match action {
        FleetCommand::Up { config, listen } => {
            // Not `config.source()`: `up` keeps the run directory's secrets, it does not read
            // them as an operator's.
            let run_dir = config.run_dir.unwrap_or_else(|| PathBuf::from("run"));
            crate::fleet::up(&ConfigSource::resolve(config.config), &run_dir, listen).await?;
            println!(
                "fleet up: send purchases to http://{listen}/v1/purchase (logs in {})",
                run_dir.join("logs").display()
            );
        }
        FleetCommand::Down { run_dir } => {
            crate::fleet::down(&run_dir)?;
            println!("fleet down");
        }
        FleetCommand::Restart { name, run_dir } => {
            let pid = crate::fleet::restart(&run_dir, &name).await?;
            println!("fleet restart: {name} runs again as pid {pid}");
        }
    }
    Ok(())
}

pub async fn lb_sync(args: LbSyncArgs) -> anyhow::Result<()> {
    let cluster = args.config.source().load()?;
    crate::cluster::require_cluster_token(&cluster)?;
    let client = crate::cluster::coordinator_client(&cluster, "lb-sync")?.ok_or_else(|| {
        anyhow::anyhow!("lb-sync follows the coordinator's live nodes: the config has no [coordinator] (use lb-config)")
    })?;
    let options = crate::lb::sync::SyncOptions {
        listen: args.listen,
        conf: args.nginx_conf,
        every: std::time::Duration::from_millis(args.every_ms.max(100)),
        run_nginx: args.run_nginx,
        once: args.once,
        nginx_user: args.nginx_user,
    };
    crate::lb::sync::run(&cluster, &client, &options).await
}

pub fn lb_config(args: LbConfigArgs) -> anyhow::Result<()> {
    match args.kind {
        LoadBalancer::Nginx => {
            let cluster = args.config.source().load()?;
            print!("{}", crate::lb::nginx_config(&cluster, args.listen, &crate::lb::listed_upstreams(&cluster)))
        }
    }
    Ok(())
}
