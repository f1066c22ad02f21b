//! The commands that run a part of the product until Ctrl-C or SIGTERM: `up` (every node in
//! one process), `node`, `coordinator` and `orders`.

use std::time::Duration;

use super::ConfigArg;
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

pub(crate) async fn stop_requested() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
