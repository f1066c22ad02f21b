//! `[node_settings]` and `[[nodes]]`: how every node sells, and the nodes the config lists. A
//! node need not be listed: one that joins at run time (`seckill node --id ID`) takes the same
//! settings, and the coordinator leases it a worker id and grants it stock.

use std::net::SocketAddr;
use std::time::Duration;

use ::safeguards::connections::ConnectionsPerAddress;
use node::{BreakerSettings, HttpLimits, Mode, NodeConfig};
use protocol::NodeId;
use serde::Deserialize;

use super::{address, invalid, ConfigError, LedgerSection, Safeguards};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    pub confirm_timeout_ms: u64,
    pub confirm_queue_max: usize,
    pub status_refresh_ms: u64,
    /// How far apart a quiet SKU's refreshes may grow (see `NodeConfig`).
    pub status_refresh_quiet_max_ms: u64,
    /// Least time between a node's reads of a sold-out SKU's order stream (see `NodeConfig`).
    pub sold_out_read_gap_ms: u64,
    pub body_bytes_max: usize,
    pub connections_max: usize,
    /// Open connections per client address (IPv6: per `[safeguards] ipv6_prefix` block); 0 = no
    /// bound. Loopback and `[safeguards] trusted_proxies` are exempt.
    pub connections_per_address: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub write_timeout_ms: u64,
    /// Where each node keeps its order-id high-water files; absent: the ledger numbers orders.
    pub order_ids_dir: Option<std::path::PathBuf>,
    /// Consecutive failed ledger calls after which a node's circuit breaker opens.
    pub breaker_failures_max: u32,
    /// How long an open breaker answers 503 at once before it lets one probe through.
    pub breaker_cool_down_ms: u64,
}

impl Default for NodeSection {
    fn default() -> Self {
        let node = NodeConfig::new(NodeId::new("defaults").expect("valid id"));
        Self {
            confirm_timeout_ms: node.confirm_timeout.as_millis() as u64,
            confirm_queue_max: node.confirm_queue_max,
            status_refresh_ms: node.status_refresh.as_millis() as u64,
            status_refresh_quiet_max_ms: node.status_refresh_quiet_max.as_millis() as u64,
            sold_out_read_gap_ms: node.sold_out_read_gap.as_millis() as u64,
            body_bytes_max: node.http.body_bytes_max,
            connections_max: node.http.connections_max,
            connections_per_address: node.http.connections_per_address.max,
            header_timeout_ms: node.http.header_timeout.as_millis() as u64,
            body_timeout_ms: node.http.body_timeout.as_millis() as u64,
            write_timeout_ms: node.http.write_timeout.as_millis() as u64,
            order_ids_dir: None,
            breaker_failures_max: node.breaker.failures_max,
            breaker_cool_down_ms: node.breaker.cool_down.as_millis() as u64,
        }
    }
}

/// One `[[nodes]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub id: NodeId,
    /// What the node binds, e.g. `0.0.0.0:8080`.
    pub listen: SocketAddr,
    /// `host:port` others reach it at (a DNS name is fine); absent: `listen`, a wildcard there
    /// read as loopback.
    pub advertise: Option<String>,
}

/// Where a node binds and where the fleet reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlace {
    pub listen: SocketAddr,
    /// Checked `host:port`; `None`: the address the node bound, as `address::reachable` reads
    /// it (so `listen` port 0 advertises the port the kernel picked).
    pub advertise: Option<String>,
}

impl NodePlace {
    /// What the node registers and nginx proxies to, once it has bound `bound`.
    pub fn advertised(&self, bound: SocketAddr) -> String {
        self.advertise.clone().unwrap_or_else(|| address::reachable(bound).to_string())
    }
}

impl NodeSection {
    pub fn validate(&self, ledger: &LedgerSection) -> Result<(), ConfigError> {
        if self.confirm_timeout_ms <= ledger.call_timeout_ms {
            return Err(invalid(
                "node_settings.confirm_timeout_ms",
                "must exceed ledger.call_timeout_ms, or requests give up before the ledger answers",
            ));
        }
        if self.confirm_queue_max == 0 || self.connections_max == 0 || self.body_bytes_max < 256 {
            return Err(invalid(
                "node_settings",
                "confirm_queue_max and connections_max must be above zero, body_bytes_max at least 256",
            ));
        }
        if u128::from(self.sold_out_read_gap_ms) > node::SOLD_OUT_READ_GAP_MAX.as_millis() {
            return Err(invalid(
                "node_settings.sold_out_read_gap_ms",
                format!(
                    "must be at most {} (a sold-out answer waits up to this for a read of the order stream)",
                    node::SOLD_OUT_READ_GAP_MAX.as_millis()
                ),
            ));
        }
        if self.breaker_failures_max == 0 || self.breaker_cool_down_ms == 0 {
            return Err(invalid("node_settings", "breaker_failures_max and breaker_cool_down_ms must be above zero"));
        }
        Ok(())
    }
}

/// The validated sections every node's settings come from.
pub struct NodeSections<'a> {
    pub mode: Mode,
    pub settings: &'a NodeSection,
    pub ledger: &'a LedgerSection,
    pub safeguards: &'a Safeguards,
    pub ticket_key: node::TicketKey,
}

/// The settings of a node not named yet: every listed node's, and a joining node's, are this
/// with its id (and, listed, its worker id) set.
impl From<NodeSections<'_>> for NodeConfig {
    fn from(sections: NodeSections<'_>) -> NodeConfig {
        let NodeSections { mode, settings, ledger, safeguards, ticket_key } = sections;
        let template_id = NodeId::new("template").expect("a valid id");
        NodeConfig {
            mode,
            confirm_timeout: Duration::from_millis(settings.confirm_timeout_ms),
            confirm_queue_max: settings.confirm_queue_max,
            status_refresh: Duration::from_millis(settings.status_refresh_ms.max(10)),
            status_refresh_quiet_max: Duration::from_millis(settings.status_refresh_quiet_max_ms),
            sold_out_read_gap: Duration::from_millis(settings.sold_out_read_gap_ms),
            http: HttpLimits {
                body_bytes_max: settings.body_bytes_max,
                connections_max: settings.connections_max,
                connections_per_address: ConnectionsPerAddress {
                    ipv6_prefix: safeguards.ipv6_prefix,
                    ..ConnectionsPerAddress::new(settings.connections_per_address)
                },
                header_timeout: Duration::from_millis(settings.header_timeout_ms.max(1)),
                body_timeout: Duration::from_millis(settings.body_timeout_ms.max(1)),
                write_timeout: Duration::from_millis(settings.write_timeout_ms.max(1)),
            },
            trusted_proxies: safeguards.trusted_proxies.clone(),
            order_ids_dir: settings.order_ids_dir.clone(),
            breaker: BreakerSettings {
                failures_max: settings.breaker_failures_max,
                cool_down: Duration::from_millis(settings.breaker_cool_down_ms),
            },
            idempotency_ttl: Duration::from_secs(ledger.idempotency_ttl_s),
            ticket_key: Some(ticket_key),
            ..NodeConfig::new(template_id)
        }
    }
}
