//! The accept loop: bounded connections, header (and so idle), body and write timeouts,
//! graceful drain.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use safeguards::write_deadline::WriteDeadline;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::pipeline::Node;

/// Longest wait for in-flight requests once shutdown begins; they need at most one ledger call,
/// so a few seconds is generous.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `node` on `listener` until the node's shutdown fires, then stops accepting and lets
/// in-flight requests finish (up to [`DRAIN_MAX`]).
pub async fn serve(node: Node, listener: TcpListener) {
    let shutdown = node.shutdown_signal().clone();
    let limits = node.config().http.clone();
    let connections = Arc::new(Semaphore::new(limits.connections_max));
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
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_MAX, graceful.shutdown()).await.is_err() {
        tracing::warn!(node = %node.id(), "connections still open after {DRAIN_MAX:?}; closing them");
    }
}
