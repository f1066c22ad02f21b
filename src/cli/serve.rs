//! The commands that run a part of the product until Ctrl-C or SIGTERM: `up` (every node in
//! one process), `node`, `coordinator` and `orders`.

use std::time::Duration;

use anyhow::Context;

use super::ConfigArg;
use crate::cluster::{build_ledger, Options, RunningCluster};
use crate::shutdown::stop_requested;

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
    /// The node's id: its [[nodes]] entry, or, under a [coordinator], any id, for a node that
    /// joins at run time [default: this host's name, as orchestrators name containers and pods]
    #[arg(long)]
    id: Option<String>,
    /// What to bind [default: the [[nodes]] entry's listen, else 0.0.0.0:8080]
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// host:port the fleet reaches this node at (a DNS name is fine) [default: the entry's
    /// advertise; else listen, or, on a wildcard, this host's name and the port]
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(clap::Args)]
pub struct OrdersArgs {
    /// This service's name in the order streams' consumer group: unique per process, the same
    /// across its restarts [default: [orders] consumer]
    #[arg(long, value_name = "NAME")]
    consumer: Option<String>,
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
    let traces = crate::traces::start(&cluster.telemetry, "seckill-coordinator", name)?;
    let member = crate::cluster::start_member(&cluster, name, ledger, blacklist).await?;
    println!("coordinator member {name} running (config: {config})");
    stop_requested().await?;
    member.stop().await;
    traces.stop().await;
    Ok(())
}

pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let config = args.config.source();
    let cluster = config.load()?;
    crate::cluster::require_cluster_token(&cluster)?;
    let id = match args.id {
        Some(id) => ledger::NodeId::new(&id)?,
        None => crate::host::own_name()
            .and_then(|name| Ok(ledger::NodeId::new(&name)?))
            .context("no --id, and this host's name cannot be a node id: pass --id")?,
    };
    let (node_config, mut place) = cluster.node_config(&id, args.listen, args.advertise.as_deref())?;
    if place.advertise.is_none() && place.listen.ip().is_unspecified() && !cluster.nodes.iter().any(|(n, _)| n.id == id)
    {
        // Bound on every interface and listed nowhere: the fleet finds it by this host's name,
        // which an orchestrator's DNS resolves (a container's hostname is its network alias).
        place.advertise = Some(format!("{}:{}", crate::host::own_name()?, place.listen.port()));
    }
    let traces = crate::traces::start(&cluster.telemetry, "seckill-node", id.as_str())?;
    let ledger = build_ledger(&cluster.ledger).await?;
    if cluster.coordinator.is_none() {
        crate::cluster::create_skus(&cluster, &*ledger).await?;
    }
    let node = crate::cluster::start_node_at(&cluster, node_config, &place, ledger, &Options::default()).await?;
    println!("node {id} on http://{} (advertised as {}) (config: {config})", node.addr, place.advertised(node.addr));
    stop_requested().await?;
    tracing::info!("stopping: draining in-flight requests, then leaving the group");
    node.stop().await;
    traces.stop().await;
    Ok(())
}

pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let config = args.config.source();
    let cluster = config.load()?;
    println!("config: {config}");
    // One process holds every role: its spans say which by their names.
    let traces = crate::traces::start(&cluster.telemetry, "seckill-up", &crate::host::own_name().unwrap_or_default())?;
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
    traces.stop().await;
    Ok(())
}

pub async fn orders(args: OrdersArgs) -> anyhow::Result<()> {
    let config = args.config.source();
    let mut cluster = config.load()?;
    if let Some(consumer) = args.consumer {
        cluster.orders.consumer = consumer;
        cluster.orders.validate()?;
    }
    anyhow::ensure!(
        cluster.ledger.url != "embedded",
        "ledger.url = \"embedded\" lives inside another process; `seckill orders` needs the Redis ledger the nodes use \
         (or run `seckill up`, which starts the order service beside its nodes)"
    );
    let traces = crate::traces::start(&cluster.telemetry, "seckill-orders", &cluster.orders.consumer)?;
    let ledger = build_ledger(&cluster.ledger).await?;
    let store = crate::order_service::open_store(&cluster).await?;
    let orders = crate::order_service::start(&cluster, ledger, store).await?;
    match orders.addr {
        Some(addr) => println!("orders on http://{addr} (config: {config})"),
        None => println!("orders running, no API ([orders] listen is not set) (config: {config})"),
    }
    stop_requested().await?;
    orders.stop().await;
    traces.stop().await;
    Ok(())
}
