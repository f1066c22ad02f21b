//! The commands that run a part of the product until Ctrl-C or SIGTERM: `up` (every node in
//! one process), `node`, `coordinator`, `orders` and the sandbox payment provider `paysim`.

use std::time::Duration;

use anyhow::Context;

use super::{parse_probability, ConfigArg};
use crate::cluster::{build_ledger, Options, RunningCluster};

#[derive(clap::Args)]
pub struct UpArgs {
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct MemberArgs {
    /// The member's name in [coordinator] members.
    #[arg(long)]
    id: String,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct NodeArgs {
    /// The node's id in [[nodes]].
    #[arg(long)]
    id: String,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct OrdersArgs {
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct PaysimArgs {
    /// Where its API listens: a loopback address (port 0 picks a free one; the line
    /// `paysim on http://ADDR` on stdout names it).
    #[arg(long, default_value = "127.0.0.1:8095")]
    listen: std::net::SocketAddr,
    /// The environment variable holding the secret callbacks are signed with: the order
    /// service's payment secret.
    #[arg(long, value_name = "NAME", default_value = crate::config::PAYMENT_SECRET_ENV)]
    secret_env: String,
    /// Seeds every fault's draws, so the same requests meet the same faults [default:
    /// random, printed]
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    faults: PaysimFaults,
}

/// The sandbox provider's faults at start; `PUT /v1/faults` changes them while it runs.
#[derive(clap::Args)]
pub struct PaysimFaults {
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

pub async fn member(args: MemberArgs) -> anyhow::Result<()> {
    let (name, config) = (&args.id, args.config.source());
    let cluster = config.load()?;
    crate::cluster::require_cluster_token(&cluster)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let redis = crate::guard::redis_connection(&cluster.ledger)?;
    let blacklist = crate::guard::blacklist_store(&cluster.ledger, redis);
    let member = crate::cluster::start_member(&cluster, name, ledger, blacklist).await?;
    println!("coordinator member {name} running (config: {config})");
    stop_requested().await?;
    member.stop().await;
    Ok(())
}

pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let (id, config) = (&args.id, args.config.source());
    let cluster = config.load()?;
    crate::cluster::require_cluster_token(&cluster)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let id = ledger::NodeId::new(id)?;
    if cluster.coordinator.is_none() {
        crate::cluster::create_skus(&cluster, &*ledger).await?;
    }
    let node = crate::cluster::start_node(&cluster, &id, ledger, &Options::default()).await?;
    println!("node {id} on http://{} (config: {config})", node.addr);
    stop_requested().await?;
    tracing::info!("stopping: draining in-flight requests, then leaving the group");
    node.stop().await;
    Ok(())
}

pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let config = args.config.source();
    let cluster = config.load()?;
    println!("config: {config}");
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = crate::order_service::open_store(&cluster).await?;
    let running = RunningCluster::start(&cluster, ledger.clone(), Options::default()).await?;
    let orders = crate::order_service::start(&cluster, ledger, store).await?;
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

pub async fn orders(args: OrdersArgs) -> anyhow::Result<()> {
    let config = args.config.source();
    let cluster = config.load()?;
    anyhow::ensure!(
        cluster.ledger.url != "embedded",
        "ledger.url = \"embedded\" lives inside another process; `seckill orders` needs the Redis ledger the nodes use \
         (or run `seckill up`, which starts the order service beside its nodes)"
    );
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = crate::order_service::open_store(&cluster).await?;
    let orders = crate::order_service::start(&cluster, ledger, store).await?;
    match orders.addr {
        Some(addr) => println!("orders on http://{addr} (config: {config})"),
        None => println!("orders running, no API ([orders] listen is not set) (config: {config})"),
    }
    stop_requested().await?;
    orders.stop().await;
    Ok(())
}

pub async fn paysim(args: PaysimArgs) -> anyhow::Result<()> {
    let (listen, secret_env, seed, faults) =
        (args.listen, &args.secret_env, args.seed, paysim::Faults::from(args.faults));
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

pub(super) async fn stop_requested() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
