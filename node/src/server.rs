//! The node's HTTP server: the node's limits and handler on the accept loop every seckill server
//! shares (`safeguards::accept`: bounded connections, in all and per client address, header,
//! body and write timeouts, graceful drain).

use std::time::Duration;

use safeguards::accept::{AcceptLimits, PerAddress};
use tokio::net::TcpListener;

use crate::pipeline::Node;

/// Longest wait for in-flight requests once shutdown begins; they need at most one ledger call,
/// so a few seconds is generous.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Serves `node` on `listener` until the node's shutdown fires, then stops accepting and lets
/// in-flight requests finish (up to [`DRAIN_MAX`]).
pub async fn serve(node: Node, listener: TcpListener) {
    let limits = node.config().http.clone();
    // The node's load balancers speak for many clients each: only the total bounds them.
    let mut per_address = limits.connections_per_address.clone();
    per_address.exempt = per_address.exempt.union(&node.config().trusted_proxies);
    let shed =
        metrics::counter!("seckill_connections_shed_total", "node" => node.id().to_string(), "reason" => "per_address");
    let limits = AcceptLimits {
        connections_max: limits.connections_max,
        per_address: Some(PerAddress { bound: per_address, shed, setting: "node_settings.connections_per_address" }),
        header_timeout: limits.header_timeout,
        write_timeout: limits.write_timeout,
        drain_max: DRAIN_MAX,
    };
    let shutdown = node.shutdown_signal().clone();
    let server = format!("node {}", node.id());
    let handler = node.clone();
    let handle = move |request, peer| {
        let node = handler.clone();
        async move { crate::http::handle_any(&node, request, peer).await }
    };
    safeguards::accept::serve(&server, listener, limits, async move { shutdown.wait().await }, handle).await;
}
