//! The accept loop the node, the order API and the sandbox payment provider share: bounded
//! connections, in all and per client address, a header (and so idle) timeout, a write timeout,
//! and a graceful drain. One loop, so a fix to how a flood is shed reaches every server at once.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::connections::{ConnectionsPerAddress, OpenConnections};
use crate::write_deadline::WriteDeadline;

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// At most one warning this often about connections closed for their address's bound: a flood
/// must not turn into a flood of log lines, but a load balancer missing from `trusted_proxies`
/// must be visible in the log, not only in a counter.
const SHED_WARNING_EVERY: Duration = Duration::from_secs(10);

/// What a server admits, and how long it waits for whom.
pub struct AcceptLimits {
    /// Open connections at once; more wait in the kernel's accept queue.
    pub connections_max: usize,
    /// Open connections one client address may hold; `None` bounds only the total.
    pub per_address: Option<PerAddress>,
    /// A request's headers must arrive within this; an idle keep-alive connection closes after it.
    pub header_timeout: Duration,
    /// Longest a write may wait for the client to read: a client that pipelines requests and
    /// never reads the answers is cut off after this instead of holding its slot.
    pub write_timeout: Duration,
    /// Longest wait for in-flight requests once the server stops.
    pub drain_max: Duration,
}

/// The per-address bound, with what an operator needs when it sheds.
pub struct PerAddress {
    pub bound: ConnectionsPerAddress,
    /// Counts connections closed for their address's bound.
    pub shed: metrics::Counter,
    /// The setting that raises the bound, named in the warning (e.g.
    /// `[orders] connections_per_address`).
    pub setting: &'static str,
}

/// Serves `listener` until `stop` resolves, answering each request with `handle`, then stops
/// accepting and lets in-flight requests finish (up to `limits.drain_max`). `server` names the
/// server in its log lines. Returns whether every connection closed within the drain.
pub async fn serve<H, F, B>(
    server: &str,
    listener: TcpListener,
    limits: AcceptLimits,
    stop: impl Future<Output = ()>,
    handle: H,
) -> bool
where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    // Any body: most answers are one `Full` buffer, a node's event streams are not.
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // One allocation for the name the connections' log lines share, not one per connection.
    let name: Arc<str> = Arc::from(server);
    let connections = Arc::new(Semaphore::new(limits.connections_max));
    let mut per_address = limits.per_address.map(|bound| Shedder::new(server, bound));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    tokio::pin!(stop);
    loop {
        let Some((permit, stream, peer)) = accept_next(server, &listener, &connections, stop.as_mut()).await else {
            break;
        };
        // Closed before a byte is read: answering 503 would mean reading the request first,
        // holding a task and a buffer for up to the header timeout for exactly the client that
        // already holds too much; a reset says as clearly that nothing was decided, so a retry
        // with the same key is safe. The slot permit goes back with this iteration.
        let address_slot = match per_address.as_mut() {
            Some(shedder) => match shedder.admit(peer) {
                Some(slot) => Some(slot),
                None => continue,
            },
            None => None,
        };
        // Responses are small and latency-bound; Nagle would hold them back.
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let service = service_fn(move |request| {
            let answer = handle(request, peer);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let stream = WriteDeadline::new(stream, limits.write_timeout);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let server = name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("{server}: connection from {peer} ended: {e}");
            }
            drop(permit);
            drop(address_slot);
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.drain_max, graceful.shutdown()).await.is_ok();
    if !drained {
        tracing::warn!("{server}: connections still open after {:?}; closing them", limits.drain_max);
    }
    drained
}

/// Waits for a free connection slot, then for the next connection; `None` once `stop`
/// resolves. A failed `accept` (e.g. out of file descriptors) is logged and retried after a
/// pause, so the loop does not spin.
async fn accept_next<S: Future<Output = ()>>(
    server: &str,
    listener: &TcpListener,
    connections: &Arc<Semaphore>,
    mut stop: Pin<&mut S>,
) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
    let permit = tokio::select! {
        permit = connections.clone().acquire_owned() => permit.ok()?,
        () = stop.as_mut() => return None,
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => return Some((permit, stream, peer)),
                Err(e) => {
                    tracing::warn!("{server}: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                }
            },
            () = stop.as_mut() => return None,
        }
    }
}

/// The per-address bound at the accept loop, and its rate-limited warning.
struct Shedder {
    server: String,
    open: Arc<OpenConnections>,
    shed: metrics::Counter,
    setting: &'static str,
    warned_at: Option<Instant>,
}

impl Shedder {
    fn new(server: &str, per_address: PerAddress) -> Shedder {
        Shedder {
            server: server.to_string(),
            open: OpenConnections::new(per_address.bound),
            shed: per_address.shed,
            setting: per_address.setting,
            warned_at: None,
        }
    }

    fn admit(&mut self, peer: SocketAddr) -> Option<crate::connections::ConnectionSlot> {
        let slot = self.open.admit(peer.ip());
        if slot.is_none() {
            self.shed.increment(1);
            if self.warned_at.is_none_or(|at| at.elapsed() >= SHED_WARNING_EVERY) {
                self.warned_at = Some(Instant::now());
                tracing::warn!(
                    "{}: closed a connection from {}: it already holds {} ({}); a load balancer belongs in [safeguards] trusted_proxies",
                    self.server,
                    peer.ip(),
                    self.open.bound().max,
                    self.setting,
                );
            }
        }
        slot
    }
}
