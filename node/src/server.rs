//! The accept loop: bounded connections, in all and per client address, header (and so idle),
//! body and write timeouts, graceful drain.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use safeguards::connections::OpenConnections;
use safeguards::write_deadline::WriteDeadline;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::pipeline::Node;

/// Longest wait for in-flight requests once shutdown begins; they need at most one ledger call,
/// so a few seconds is generous.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// At most one warning this often about connections closed for their address's bound: a flood
/// must not turn into a flood of log lines, but a load balancer missing from `trusted_proxies`
/// must be visible in the log, not only in a counter.
const SHED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Serves `node` on `listener` until the node's shutdown fires, then stops accepting and lets
/// in-flight requests finish (up to [`DRAIN_MAX`]).
pub async fn serve(node: Node, listener: TcpListener) {
    let shutdown = node.shutdown_signal().clone();
    let limits = node.config().http.clone();
    let connections = Arc::new(Semaphore::new(limits.connections_max));
    // The node's load balancers speak for many clients each: only the total bounds them.
    let mut per_address = limits.connections_per_address.clone();
    per_address.exempt = per_address.exempt.union(&node.config().trusted_proxies);
    let per_address = OpenConnections::new(per_address);
    let shed =
        metrics::counter!("seckill_connections_shed_total", "node" => node.id().to_string(), "reason" => "per_address");
    let mut warned_at: Option<Instant> = None;
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.wait() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(node = %node.id(), "accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
            () = shutdown.wait() => break,
        };
        // Closed before a byte is read: answering 503 would mean reading the request first,
        // holding a task and a buffer for up to the header timeout for exactly the client that
        // already holds too much; a reset says as clearly that nothing was decided, so a retry
        // with the same key is safe. The slot permit goes back with this iteration.
        let Some(address_slot) = per_address.admit(peer.ip()) else {
            shed.increment(1);
            if warned_at.is_none_or(|at| at.elapsed() >= SHED_WARNING_EVERY) {
                warned_at = Some(Instant::now());
                tracing::warn!(
                    node = %node.id(),
                    "closed a connection from {}: it already holds {} (node_settings.connections_per_address); a load balancer belongs in [safeguards] trusted_proxies",
                    peer.ip(),
                    per_address.bound().max,
                );
            }
            continue;
        };
        // Responses are small and latency-bound; Nagle would hold them back.
        let _ = stream.set_nodelay(true);
        let service_node = node.clone();
        let service = service_fn(move |request| {
            let node = service_node.clone();
            async move { Ok::<_, Infallible>(crate::http::handle(&node, request, peer).await) }
        });
        let stream = WriteDeadline::new(stream, limits.write_timeout);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection from {peer} ended: {e}");
            }
            drop(permit);
            drop(address_slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_MAX, graceful.shutdown()).await.is_err() {
        tracing::warn!(node = %node.id(), "connections still open after {DRAIN_MAX:?}; closing them");
    }
}
