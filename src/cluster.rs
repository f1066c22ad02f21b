//! Starts a whole cluster in one process: the ledger, its SKUs and every node on its own port.
//! `seckill up`, `seckill demo` and the integration tests all start clusters through here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ledger::{Created, EmbeddedLedger, Ledger, RedisLedger, RedisLedgerConfig};
use node::{Clock, Gate, Node, OpenGate, Shutdown, SystemClock};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::{Cluster, LedgerSection};

/// Builds the ledger the config names.
pub fn build_ledger(section: &LedgerSection) -> anyhow::Result<Arc<dyn Ledger>> {
    let ttl = Duration::from_secs(section.idempotency_ttl_s);
    if section.url == "embedded" {
        return Ok(Arc::new(EmbeddedLedger::new(ttl)));
    }
    let mut config = RedisLedgerConfig::new(section.url.clone());
    config.connections = section.connections;
    config.call_timeout = Duration::from_millis(section.call_timeout_ms);
    config.connect_timeout = Duration::from_millis(section.connect_timeout_ms);
    config.idempotency_ttl = ttl;
    config.key_prefix = section.key_prefix.clone();
    Ok(Arc::new(RedisLedger::connect(config)?))
}

/// What a cluster is started with besides its config; tests swap these.
pub struct Options {
    pub gate: Arc<dyn Gate>,
    pub clock: Arc<dyn Clock>,
}

impl Default for Options {
    fn default() -> Self {
        Self { gate: Arc::new(OpenGate), clock: Arc::new(SystemClock) }
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
    /// Stops accepting, drains in-flight requests and waits for the server to finish.
    pub async fn stop(self) {
        self.shutdown.trigger();
        let _ = self.server.await;
    }
}

/// A started cluster.
pub struct RunningCluster {
    pub nodes: Vec<RunningNode>,
    pub ledger: Arc<dyn Ledger>,
}

impl RunningCluster {
    /// Creates every SKU that has no ledger yet (an existing one is left as it is, with a
    /// warning if its total differs), then binds and starts every node.
    pub async fn start(cluster: &Cluster, ledger: Arc<dyn Ledger>, options: Options) -> anyhow::Result<RunningCluster> {
        for sku in &cluster.skus {
            match ledger
                .create_sku(&Cluster::ledger_spec(sku))
                .await
                .with_context(|| format!("creating SKU {}", sku.id))?
            {
                Created::New(_) => tracing::info!(sku = %sku.id, total = sku.total, "created the SKU's ledger"),
                Created::Existing(status) if status.total != sku.total => tracing::warn!(
                    sku = %sku.id,
                    configured = sku.total,
                    ledger_total = status.total,
                    "the SKU's ledger already exists with another total; it was left unchanged (restock explicitly to add units)"
                ),
                Created::Existing(status) => {
                    tracing::info!(sku = %sku.id, sold = status.sold, "resuming the SKU's existing ledger")
                }
            }
        }
        let mut nodes = Vec::with_capacity(cluster.nodes.len());
        for (config, listen) in &cluster.nodes {
            let listener = TcpListener::bind(listen)
                .await
                .with_context(|| format!("node {} cannot listen on {listen}", config.id))?;
            let addr = listener.local_addr()?;
            let shutdown = Shutdown::new();
            let node = Node::start(
                config.clone(),
                cluster.sku_configs_for(&config.id),
                ledger.clone(),
                options.clock.clone(),
                options.gate.clone(),
                shutdown.clone(),
            );
            let server = tokio::spawn(node::serve(node.clone(), listener));
            tracing::info!(node = %config.id, %addr, "node serving");
            nodes.push(RunningNode { node, addr, shutdown, server });
        }
        Ok(RunningCluster { nodes, ledger })
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
                "nodes not ready after {timeout:?}: is the ledger reachable?"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}
