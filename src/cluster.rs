//! Starts clusters in one process: the ledger, the coordinator members and the nodes, each on
//! its own port. `seckill up`, `seckill demo`, `seckill node`, `seckill coordinator` and the
//! integration tests all start their parts through here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use auth::Authenticator;
use coordinator::Member;
use ledger::{Created, EmbeddedLedger, Ledger, NodeId, RedisLedger, RedisLedgerConfig};
use node::{Clock, CoordinatorLink, Gate, Node, NodeOptions, OpenGate, Shutdown, SystemClock};
use protocol::CoordinatorClient;
use safeguards::blacklist::BlacklistStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::{Cluster, LedgerSection, NodePlace};
use crate::guard;

/// Builds the ledger the config names and checks that its Redis keeps what `durability`
/// promises (`fsync`: `CONFIG GET` on the server), so a misconfigured Redis stops the start.
pub async fn build_ledger(section: &LedgerSection) -> anyhow::Result<Arc<dyn Ledger>> {
    let ttl = Duration::from_secs(section.idempotency_ttl_s);
    if section.url == "embedded" {
        let ledger = EmbeddedLedger::new(ttl)
            .with_sale_record_ttl(Duration::from_secs(section.sale_record_ttl_s))
            .with_token_issue_max(section.token_issue_max);
        return Ok(Arc::new(ledger));
    }
    let ledger = RedisLedger::connect(redis_ledger_config(section)?)?;
    ledger.check_durability().await.map_err(|e| with_password_hint(e.into(), &section.url))?;
    Ok(Arc::new(ledger))
}

/// A Redis that wants a password the URL does not carry says NOAUTH: name where the password
/// comes from.
fn with_password_hint(error: anyhow::Error, url: &str) -> anyhow::Error {
    let (_, password) = crate::config::credentials_of(url);
    let refused = ["NOAUTH", "WRONGPASS", "invalid password", "Authentication required"];
    let text = format!("{error:#}");
    if password.is_empty() && refused.iter().any(|word| text.contains(word)) {
        let hint = protocol::env_secret::where_to_find(crate::config::REDIS_PASSWORD_ENV);
        return error.context(format!("the ledger's Redis wants a password: {hint}"));
    }
    error
}

/// Every setting of a Redis `[ledger]`, durability included: each handle on the ledger is
/// built from this, so none reads or writes with weaker promises than the config makes.
pub fn redis_ledger_config(section: &LedgerSection) -> anyhow::Result<RedisLedgerConfig> {
    let mut config = RedisLedgerConfig::new(section.url.clone());
    config.connections = section.connections;
    config.call_timeout = Duration::from_millis(section.call_timeout_ms);
    config.connect_timeout = Duration::from_millis(section.connect_timeout_ms);
    config.idempotency_ttl = Duration::from_secs(section.idempotency_ttl_s);
    config.sale_record_ttl = Duration::from_secs(section.sale_record_ttl_s);
    config.key_prefix = section.key_prefix.clone();
    config.token_issue_max = section.token_issue_max;
    config.durability = section.durability()?;
    Ok(config)
}

/// What a cluster is started with besides its config; tests swap these.
#[derive(Clone)]
pub struct Options {
    /// `None`: the gate `[safeguards]` describes.
    pub gate: Option<Arc<dyn Gate>>,
    pub clock: Arc<dyn Clock>,
    /// Where the blacklist lives; `None`: the store the ledger implies (Redis, or memory shared
    /// by everything [`RunningCluster::start`] starts).
    pub blacklist: Option<Arc<dyn BlacklistStore>>,
    /// `None`: the one `[auth]` describes, built once per [`RunningCluster`] (its cache and
    /// JWKS watch are shared by the nodes of one process).
    pub authenticator: Option<Authenticator>,
}

impl Default for Options {
    fn default() -> Self {
        Self { gate: None, clock: Arc::new(SystemClock), blacklist: None, authenticator: None }
    }
}

/// A node serving on its port.
pub struct RunningNode {
    pub node: Node,
    pub addr: SocketAddr,
    shutdown: Shutdown,
    server: JoinHandle<()>,
}

impl RunningNode {
    /// Stops accepting, drains in-flight requests, then hands the lease back so the coordinator
    /// reallocates the unsold allotment at once.
    pub async fn stop(self) {
        self.shutdown.trigger();
        let _ = self.server.await;
        self.node.leave().await;
    }

    /// Dies without a goodbye: no drain, no leave, heartbeats stop. The coordinator finds out
    /// when the lease runs out.
    pub fn crash(self) {
        self.server.abort();
        self.shutdown.trigger();
    }
}

/// Connections a node's kernel queue holds before it drops SYNs. A flash crowd opens its
/// connections at once (a waiting room's event streams, one per buyer); tokio's default of 1,024
/// dropped hundreds of SYNs under `bench crowd --waiting-room`, each a 1 s TCP retransmit for its
/// buyer. The kernel caps it at `net.core.somaxconn` (4,096 on current Linux).
const NODE_BACKLOG: u32 = 4096;

fn bind_node(listen: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if listen.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // As std's and tokio's bind do: a restarted node takes its port back at once.
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    socket.listen(NODE_BACKLOG)
}

/// A client of the config's coordinator group, if it has one, presenting the cluster token and,
/// under `[coordinator.tls]`, the certificate named after `process` (`{name}` in its paths).
pub fn coordinator_client(cluster: &Cluster, process: &str) -> anyhow::Result<Option<Arc<CoordinatorClient>>> {
    let Some(group) = &cluster.coordinator else { return Ok(None) };
    let tls = match &group.tls {
        Some(files) => Some(files.for_process(process).load().context("coordinator.tls")?),
        None => None,
    };
    let members = group.members.iter().map(|m| m.addr.to_string()).collect();
    Ok(Some(Arc::new(CoordinatorClient::new(members, group.cluster.token().clone()).with_tls(tls))))
}

/// Starts one node of `cluster` where its `[[nodes]]` entry says (or, under a coordinator, one
/// not listed, on the joining node's defaults).
pub async fn start_node(
    cluster: &Cluster,
    id: &NodeId,
    ledger: Arc<dyn Ledger>,
    options: &Options,
) -> anyhow::Result<RunningNode> {
    let (config, place) = cluster.node_config(id, None, None)?;
    start_node_at(cluster, config, &place, ledger, options).await
}

/// Starts a node: binds `place.listen`, registers with the coordinator if the cluster has one
/// (reached at `place.advertise`), serves.
pub async fn start_node_at(
    cluster: &Cluster,
    config: node::NodeConfig,
    place: &NodePlace,
    ledger: Arc<dyn Ledger>,
    options: &Options,
) -> anyhow::Result<RunningNode> {
    let (id, listen) = (&config.id, place.listen);
    let listener = bind_node(listen).with_context(|| format!("node {id} cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let client = coordinator_client(cluster, id.as_str())?;
    let coordinator = cluster.coordinator.as_ref().zip(client).map(|(group, client)| CoordinatorLink {
        client,
        advertise: place.advertised(addr),
        heartbeat: group.heartbeat,
        lease: group.lease,
        fence_margin: group.fence_margin,
    });
    let gate = match &options.gate {
        Some(gate) => gate.clone(),
        None => {
            let redis = guard::redis_connection(&cluster.ledger)?;
            let store = match &options.blacklist {
                Some(store) => store.clone(),
                None => guard::blacklist_store(&cluster.ledger, redis.clone()),
            };
            guard::build_gate(&cluster.safeguards, &cluster.ledger, store, redis).unwrap_or_else(|| Arc::new(OpenGate))
        }
    };
    let authenticator = match &options.authenticator {
        Some(authenticator) => authenticator.clone(),
        None => authenticator(cluster)?,
    };
    let node_options = NodeOptions { clock: options.clock.clone(), gate, coordinator, authenticator };
    let shutdown = Shutdown::new();
    let skus = cluster.sku_configs_for(id);
    let node = Node::start(config, skus, ledger, node_options, shutdown.clone());
    let server = tokio::spawn(node::serve(node.clone(), listener));
    tracing::debug!(node = %node.id(), %addr, "node serving");
    Ok(RunningNode { node, addr, shutdown, server })
}

/// The authenticator `[auth]` describes. Under `mode = "none"` a listener on an address other
/// than loopback gets a warning: anyone who reaches it can buy as anyone.
pub fn authenticator(cluster: &Cluster) -> anyhow::Result<Authenticator> {
    let authenticator = Authenticator::from_settings(&cluster.auth)?;
    if !authenticator.is_on() {
        let exposed = cluster.nodes.iter().map(|(_, place)| place.listen).chain(cluster.orders.listen);
        if let Some(listen) = exposed.into_iter().find(|listen| !listen.ip().is_loopback()) {
            tracing::warn!(
                %listen,
                "[auth] mode = \"none\" on a non-loopback address: buyers are whoever the request body says; \
                 set [auth] mode = \"jwt\" or \"gateway\" before real buyers reach it (SECURITY.md)"
            );
        }
    }
    Ok(authenticator)
}

/// For a process that talks to other processes (`seckill coordinator`, `seckill node`): the
/// cluster token must be configured, since a token drawn here would match nobody else's.
pub fn require_cluster_token(cluster: &Cluster) -> anyhow::Result<()> {
    match &cluster.coordinator {
        Some(group) if group.cluster.is_generated() => anyhow::bail!(
            "no cluster token: {} (or set [coordinator] cluster_token); every member, node and order service \
             holds the same one, and members refuse /raft and /api calls without it",
            protocol::env_secret::where_to_find(crate::config::CLUSTER_TOKEN_ENV)
        ),
        _ => Ok(()),
    }
}

/// Starts one coordinator member of `cluster`.
pub async fn start_member(
    cluster: &Cluster,
    name: &str,
    ledger: Arc<dyn Ledger>,
    blacklist: Arc<dyn BlacklistStore>,
) -> anyhow::Result<Member> {
    let group = cluster.coordinator.as_ref().context("the config has no [coordinator] section")?;
    let member = group
        .members
        .iter()
        .find(|m| m.name == name)
        .with_context(|| format!("no coordinator member {name} in the config"))?;
    let listener = TcpListener::bind(member.listen)
        .await
        .with_context(|| format!("member {name} cannot listen on {}", member.listen))?;
    // The process's recorder (installed on first use) serves both nodes and members.
    let metrics = node::prometheus().cloned();
    Ok(Member::start(group.clone(), name, listener, ledger, cluster.sku_plans(), metrics, blacklist).await?)
}

/// Creates every SKU that has no ledger yet; an existing one is left as it is (with a warning if
/// its total or `require_token` differs). Without a coordinator this is done at start; with one, the leader does it.
///
/// A striped SKU (`stripes = K`) is K ledgers, `s`, `s/1`, …, each created with its stripe's
/// terms (`SkuTerms::stripe_terms`): the nodes sell each stripe as a SKU of its own.
pub async fn create_skus(cluster: &Cluster, ledger: &dyn Ledger) -> anyhow::Result<()> {
    let stripes = cluster
        .skus
        .iter()
        .flat_map(|sku| (0..).zip(sku.terms.stripe_terms()).map(|(index, terms)| (sku.id.stripe(index), terms)));
    for (id, terms) in stripes {
        match ledger.create_sku(&id, &terms).await.with_context(|| format!("creating SKU {id}"))? {
            Created::New(_) => tracing::info!(sku = %id, total = terms.total, "created the SKU's ledger"),
            Created::Existing(status) if status.total != terms.total => tracing::warn!(
                sku = %id,
                configured = terms.total,
                ledger_total = status.total,
                "the SKU's ledger already exists with another total; it was left unchanged (restock explicitly to add units)"
            ),
            Created::Existing(status) if status.require_token != terms.requires_token() => tracing::warn!(
                sku = %id,
                configured = terms.requires_token(),
                ledger_requires = status.require_token,
                "the SKU's ledger already exists with another require_token; the ledger's setting is the one enforced"
            ),
            Created::Existing(status) => {
                tracing::info!(sku = %id, sold = status.sold, "resuming the SKU's existing ledger")
            }
        }
    }
    Ok(())
}

/// A whole cluster started in this process.
pub struct RunningCluster {
    pub members: Vec<Member>,
    pub nodes: Vec<RunningNode>,
    pub ledger: Arc<dyn Ledger>,
}

impl RunningCluster {
    /// Starts the coordinator members (if configured), then every node.
    pub async fn start(cluster: &Cluster, ledger: Arc<dyn Ledger>, options: Options) -> anyhow::Result<RunningCluster> {
        let blacklist = match &options.blacklist {
            Some(store) => store.clone(),
            None => guard::blacklist_store(&cluster.ledger, guard::redis_connection(&cluster.ledger)?),
        };
        let authenticator = match &options.authenticator {
            Some(authenticator) => authenticator.clone(),
            None => authenticator(cluster)?,
        };
        let options = Options { blacklist: Some(blacklist.clone()), authenticator: Some(authenticator), ..options };
        let mut members = Vec::new();
        match &cluster.coordinator {
            None => create_skus(cluster, &*ledger).await?,
            Some(group) => {
                for member in &group.members {
                    members.push(start_member(cluster, &member.name, ledger.clone(), blacklist.clone()).await?);
                }
            }
        }
        let mut nodes = Vec::with_capacity(cluster.nodes.len());
        for (config, _) in &cluster.nodes {
            nodes.push(start_node(cluster, &config.id, ledger.clone(), &options).await?);
        }
        Ok(RunningCluster { members, nodes, ledger })
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// Waits until every node reports ready, or fails after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.nodes.iter().all(|n| n.node.is_ready()) {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "nodes not ready after {timeout:?}: is the ledger reachable (and the coordinator up)?"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
        for member in self.members {
            member.stop().await;
        }
    }
}
