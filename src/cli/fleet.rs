//! `seckill fleet up|down` and `seckill lb-config`: a fleet as processes on this machine, and
//! the load balancer in front of it.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};

use super::ConfigArg;

#[derive(clap::Args)]
pub struct LbConfigArgs {
    kind: LoadBalancer,
    #[command(flatten)]
    config: ConfigArg,
    /// Where the load balancer listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
}

#[derive(Clone, Copy, ValueEnum)]
enum LoadBalancer {
    Nginx,
}

#[derive(Subcommand)]
pub enum FleetCommand {
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

pub async fn run(action: FleetCommand) -> anyhow::Result<()> {
    match action {
        FleetCommand::Up { config, run_dir, listen } => {
            crate::fleet::up(&config.source(), &run_dir, listen).await?;
            println!(
                "fleet up: send purchases to http://{listen}/v1/purchase (logs in {})",
                run_dir.join("logs").display()
            );
        }
        FleetCommand::Down { run_dir } => {
            crate::fleet::down(&run_dir)?;
            println!("fleet down");
        }
    }
    Ok(())
}

pub fn lb_config(args: LbConfigArgs) -> anyhow::Result<()> {
    match args.kind {
        LoadBalancer::Nginx => print!("{}", crate::lb::nginx_config(&args.config.source().load()?, args.listen)),
    }
    Ok(())
}
