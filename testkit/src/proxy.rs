//! A fault-injecting TCP proxy for one upstream: the link a fault test cuts, slows or makes
//! one-way without touching the processes at either end.
//!
//! **Role.** The nemesis (and any test) puts one [`Proxy`] between a process and each server it
//! reaches (a node and Redis, a node and each coordinator member) and switches its [`Fault`] at
//! run time through the proxy or a [`ProxyHandle`], from the test process itself: there is no
//! network control plane.
//!
//! **Faults, and what the ends see.**
//! - [`Fault::Pass`]: bytes flow both ways.
//! - [`Fault::Delay`]: every chunk is forwarded that long after it arrived, in each direction
//!   (latency; throughput is not capped).
//! - [`Fault::Drop`]: every open connection is closed, and new ones are accepted and closed at
//!   once: the ends see resets and refused requests, as when a process or a firewall drops them.
//! - [`Fault::Blackhole`]: nothing is forwarded either way and nothing is answered; connections
//!   stay open. New connections are accepted but not sent on until the fault ends.
//! - [`Fault::OneWay`]: only the named direction flows: with [`Direction::ToServer`] the
//!   server gets every request and acts on it, but its answers never arrive.
//!
//! Held bytes are never lost: what a blocked direction has not forwarded is delivered, in order,
//! when it flows again, as TCP retransmits after a partition heals. So a stream protocol (Redis'
//! RESP, HTTP/1) never desynchronizes: a client that gave up on an answer gets it late, which
//! is what a real partition does, not a corrupted stream.
//!
//! **Rewrites.** A proxy may replace byte strings in what the server sends back, each by one of
//! the same length (so `Content-Length` stays right): the nemesis uses it so that a coordinator
//! follower's "the leader is at REAL-ADDRESS" names the node's proxy to that leader instead,
//! and a node that follows the hint stays behind its proxies. A chunk that ends with the start
//! of a pattern is held back until the next read, or [`REWRITE_IDLE`] without one.
//!
//! **Bounds.** At most [`ProxyOptions::connections_max`] connections at once (further ones wait
//! in the listen backlog); per direction of a connection, at most [`QUEUE_CHUNKS`] chunks of
//! [`CHUNK_BYTES`] read and not yet forwarded. Past that the proxy stops reading, so the
//! kernel's buffers, not ours, hold what the sender keeps sending. Loopback only: the proxy
//! listens on 127.0.0.1, on a port the kernel picks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

/// Connections one proxy serves at once unless told otherwise: a node opens a handful per
/// upstream (two ledger connections, the safeguards' one, one per coordinator call), and
/// reconnects during a fault, which the permits of closed connections cover.
pub const CONNECTIONS_MAX: usize = 256;

/// One read per direction per connection; a larger write is forwarded in several chunks.
pub const CHUNK_BYTES: usize = 16 * 1024;

/// Chunks read but not yet forwarded, per direction of a connection: a delayed or blocked
/// link holds at most this many; then the reader stops and TCP pushes back on the sender.
pub const QUEUE_CHUNKS: usize = 64;

/// Longest the proxy waits for the upstream to accept a connection; the client's own timeout
/// is usually shorter, and it then sees the connection close.
const CONNECT_MAX: Duration = Duration::from_secs(2);

/// How long a chunk ending with the start of a rewrite pattern waits for the rest. A server
/// writes a whole small answer at once, so a pattern split across reads arrives together.
pub const REWRITE_IDLE: Duration = Duration::from_millis(5);

/// The direction bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Client to server: requests.
    ToServer,
    /// Server to client: answers.
    ToClient,
}

/// What the link does now. See the module docs for what each end sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Pass,
    /// Each chunk waits this long, in each direction.
    Delay(Duration),
    Drop,
    Blackhole,
    /// Only this direction flows; the other is held.
    OneWay(Direction),
}

impl Fault {
    /// Whether bytes travelling `direction` are forwarded now.
    fn flows(self, direction: Direction) -> bool {
        match self {
            Fault::Pass | Fault::Delay(_) => true,
            Fault::Drop | Fault::Blackhole => false,
            Fault::OneWay(open) => open == direction,
        }
    }
}

/// How a proxy is built.
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    pub connections_max: usize,
    /// `(from, to)` pairs of equal length, replaced in what the server sends back.
    pub rewrites: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self { connections_max: CONNECTIONS_MAX, rewrites: Vec::new() }
    }
}

/// Switches a proxy's fault from anywhere in the test process; cheap to clone.
#[derive(Clone)]
pub struct ProxyHandle {
    fault: Arc<watch::Sender<Fault>>,
    active: Arc<AtomicUsize>,
}

impl ProxyHandle {
    /// Applies `fault` to every open connection and every later one.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Connections open through the proxy now.
    pub fn connections(&self) -> usize {
        // Relaxed: a figure for display and tests; nothing is ordered by it.
        self.active.load(Ordering::Relaxed)
    }
}

/// A proxy listening on a loopback port of its own, forwarding to one upstream until dropped.
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    handle: ProxyHandle,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A passing proxy to `upstream` with the default options.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        Self::start_with(upstream, ProxyOptions::default()).await
    }

    pub async fn start_with(upstream: SocketAddr, options: ProxyOptions) -> std::io::Result<Proxy> {
        Self::on(TcpListener::bind("127.0.0.1:0").await?, upstream, options)
    }

    /// A proxy on a listener the caller bound (to know its address before building the
    /// rewrites that name it).
    pub fn on(listener: TcpListener, upstream: SocketAddr, options: ProxyOptions) -> std::io::Result<Proxy> {
        for (from, to) in &options.rewrites {
            if from.len() != to.len() || from.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a rewrite must replace a non-empty string by one of the same length",
                ));
            }
        }
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(Fault::Pass);
        let handle = ProxyHandle { fault: Arc::new(fault), active: Arc::new(AtomicUsize::new(0)) };
        let accept = tokio::spawn(accept_loop(listener, upstream, options, handle.clone()));
        Ok(Proxy { addr, upstream, handle, accept })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }

    pub fn set(&self, fault: Fault) {
        self.handle.set(fault);
    }

    pub fn fault(&self) -> Fault {
        self.handle.fault()
    }

    pub fn connections(&self) -> usize {
        self.handle.connections()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection task watches the fault and ends on `Drop`.
        self.handle.set(Fault::Drop);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, options: ProxyOptions, handle: ProxyHandle) {
    let permits = Arc::new(Semaphore::new(options.connections_max.max(1)));
    let rewrites: Arc<[(Vec<u8>, Vec<u8>)]> = options.rewrites.into();
    loop {
        // A permit before accepting: past the bound, connections wait in the backlog.
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or the like: wait rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let fault = handle.fault.subscribe();
        if *fault.borrow() == Fault::Drop {
            drop(client);
            continue;
        }
        let active = handle.active.clone();
        let rewrites = rewrites.clone();
        tokio::spawn(async move {
            // Relaxed: a display counter (see `connections`).
            active.fetch_add(1, Ordering::Relaxed);
            connection(client, upstream, fault, rewrites).await;
            active.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// Serves one client connection until either end closes it or the link is dropped.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut fault: watch::Receiver<Fault>,
    rewrites: Arc<[(Vec<u8>, Vec<u8>)]>,
) {
    let mut dropped = fault.clone();
    let serve = async move {
        // A blackholed link holds a new connection unanswered; the upstream hears of it only
        // once the link flows again.
        let open = matches!(
            fault.wait_for(|f| f.flows(Direction::ToServer) || *f == Fault::Drop).await,
            Ok(f) if *f != Fault::Drop
        );
        if !open {
            return;
        }
        let Ok(Ok(server)) = tokio::time::timeout(CONNECT_MAX, TcpStream::connect(upstream)).await else { return };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let requests = pump(client_read, server_write, Direction::ToServer, fault.clone(), None);
        let rewriter = (!rewrites.is_empty()).then(|| Rewriter::new(rewrites));
        let answers = pump(server_read, client_write, Direction::ToClient, fault, rewriter);
        tokio::join!(requests, answers);
    };
    tokio::select! {
        () = serve => {}
        // Dropping the pumps closes both sockets.
        _ = dropped.wait_for(|f| *f == Fault::Drop) => {}
    }
}

/// Copies `from` to `to`: a reader queues what arrives, stamped with its arrival, and a writer
/// forwards it once `direction` flows and the link's delay has passed since that arrival (a
/// delay is latency, not a cap on throughput). At the sender's end of stream the writer shuts
/// `to` down for writing (a half-close is passed on).
async fn pump(
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    direction: Direction,
    fault: watch::Receiver<Fault>,
    rewriter: Option<Rewriter>,
) {
    let (queue, queued) = mpsc::channel(QUEUE_CHUNKS);
    let _ = tokio::join!(read_side(from, queue, rewriter), write_side(to, queued, direction, fault));
}

/// A chunk and when it arrived; `None` marks the end of the stream.
type Chunk = Option<(Instant, Bytes)>;

async fn read_side(
    mut from: OwnedReadHalf,
    queue: mpsc::Sender<Chunk>,
    mut rewriter: Option<Rewriter>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let waiting = rewriter.as_ref().is_some_and(Rewriter::is_holding);
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            () = tokio::time::sleep(REWRITE_IDLE), if waiting => {
                let rest = rewriter.as_mut().map(Rewriter::finish).unwrap_or_default();
                if queue.send(Some((Instant::now(), Bytes::from(rest)))).await.is_err() {
                    return Ok(());
                }
                continue;
            }
        };
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                let _ = queue.send(None).await;
                return Err(e);
            }
        };
        if read == 0 {
            if let Some(rest) = rewriter.as_mut().map(Rewriter::finish).filter(|rest| !rest.is_empty()) {
                let _ = queue.send(Some((Instant::now(), Bytes::from(rest)))).await;
            }
            let _ = queue.send(None).await;
            return Ok(());
        }
        let chunk = match rewriter.as_mut() {
            Some(rewriter) => Bytes::from(rewriter.feed(&buf[..read])),
            None => Bytes::copy_from_slice(&buf[..read]),
        };
        // A full queue blocks here: the sender then meets TCP's own back-pressure.
        if !chunk.is_empty() && queue.send(Some((Instant::now(), chunk))).await.is_err() {
            return Ok(());
        }
    }
}

async fn write_side(
    mut to: OwnedWriteHalf,
    mut queued: mpsc::Receiver<Chunk>,
    direction: Direction,
    mut fault: watch::Receiver<Fault>,
) -> std::io::Result<()> {
    while let Some(chunk) = queued.recv().await {
        let Some((arrived, chunk)) = chunk else {
            let _ = to.shutdown().await;
            return Ok(());
        };
        if let Fault::Delay(delay) = flowing(&mut fault, direction).await? {
            tokio::time::sleep_until((arrived + delay).into()).await;
        }
        // The link may have been cut while the chunk waited out its delay.
        flowing(&mut fault, direction).await?;
        to.write_all(&chunk).await?;
    }
    Ok(())
}

/// Waits until `direction` flows and returns the link's state then; an error once the link
/// is dropped.
async fn flowing(fault: &mut watch::Receiver<Fault>, direction: Direction) -> std::io::Result<Fault> {
    let now = match fault.wait_for(|f| f.flows(direction) || *f == Fault::Drop).await {
        Ok(f) => *f,
        Err(_) => Fault::Drop,
    };
    if now == Fault::Drop {
        return Err(std::io::ErrorKind::ConnectionAborted.into());
    }
    Ok(now)
}

/// Replaces equal-length byte strings in a stream cut into arbitrary chunks: a tail that could
/// be the start of a pattern is kept until the next chunk decides it.
struct Rewriter {
    pairs: Arc<[(Vec<u8>, Vec<u8>)]>,
    carry: Vec<u8>,
}

impl Rewriter {
    fn new(pairs: Arc<[(Vec<u8>, Vec<u8>)]>) -> Self {
        Self { pairs, carry: Vec::new() }
    }

    fn is_holding(&self) -> bool {
        !self.carry.is_empty()
    }

    /// The bytes ready to go after `chunk`: the carry and the chunk, rewritten, minus a new
    /// carry (a proper prefix of some pattern at the very end).
    fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(chunk);
        let mut at = 0;
        // Bytes before this were written by a replacement and are never matched again.
        let mut rewritten_to = 0;
        while at < data.len() {
            let Some((from, to)) = self.pairs.iter().find(|(from, _)| data[at..].starts_with(from)) else {
                at += 1;
                continue;
            };
            data[at..at + from.len()].copy_from_slice(to);
            at += from.len();
            rewritten_to = at;
        }
        let keep = self.partial_tail(&data[rewritten_to..]);
        self.carry = data.split_off(data.len() - keep);
        data
    }

    /// Whatever was held back, as it is: the stream ended or went quiet.
    fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.carry)
    }

    /// Length of the longest tail of `data` that is a proper prefix of some pattern.
    fn partial_tail(&self, data: &[u8]) -> usize {
        let longest = self.pairs.iter().map(|(from, _)| from.len().saturating_sub(1)).max().unwrap_or(0);
        (1..=longest.min(data.len()))
            .rev()
            .find(|&n| {
                let tail = &data[data.len() - n..];
                self.pairs.iter().any(|(from, _)| from.len() > n && from.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A real echo server on a free loopback port; also counts the bytes it received.
    async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let counter = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                counter.fetch_add(n, Ordering::SeqCst);
                                if stream.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    async fn connect(proxy: &Proxy) -> TcpStream {
        TcpStream::connect(proxy.addr()).await.unwrap()
    }

    /// Sends `message` and reads the echo, failing after `within`.
    async fn round_trip(stream: &mut TcpStream, message: &[u8], within: Duration) -> std::io::Result<Vec<u8>> {
        stream.write_all(message).await?;
        let mut answer = vec![0u8; message.len()];
        match tokio::time::timeout(within, stream.read_exact(&mut answer)).await {
            Ok(read) => read.map(|_| answer),
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    async fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn pass_forwards_both_ways() {
        let (upstream, _) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut stream = connect(&proxy).await;
        assert_eq!(round_trip(&mut stream, b"hello", Duration::from_secs(5)).await.unwrap(), b"hello");
        assert_eq!(proxy.connections(), 1);
    }

    #[tokio::test]
    async fn delay_adds_its_time_in_each_direction() {
        let (upstream, _) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        proxy.set(Fault::Delay(Duration::from_millis(100)));
        let mut stream = connect(&proxy).await;
        let started = Instant::now();
        assert_eq!(round_trip(&mut stream, b"slow", Duration::from_secs(5)).await.unwrap(), b"slow");
        assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn delay_is_latency_not_a_cap_on_throughput() {
        let (upstream, _) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        proxy.set(Fault::Delay(Duration::from_millis(200)));
        let mut stream = connect(&proxy).await;
        let started = Instant::now();
        for _ in 0..10 {
            stream.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut echoed = [0u8; 10];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed)).await.unwrap().unwrap();
        // Ten chunks of 400 ms round trips, sent 20 ms apart: about 0.6 s, not 10 × 0.4 s.
        assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn drop_closes_open_connections_and_refuses_new_ones_until_healed() {
        let (upstream, _) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut open = connect(&proxy).await;
        round_trip(&mut open, b"x", Duration::from_secs(5)).await.unwrap();
        proxy.set(Fault::Drop);
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await.unwrap();
        assert!(matches!(closed, Ok(0) | Err(_)), "the open connection was closed: {closed:?}");
        let mut fresh = connect(&proxy).await;
        assert!(round_trip(&mut fresh, b"y", Duration::from_secs(5)).await.is_err());
        proxy.set(Fault::Pass);
        let mut healed = connect(&proxy).await;
        assert_eq!(round_trip(&mut healed, b"z", Duration::from_secs(5)).await.unwrap(), b"z");
    }

    #[tokio::test]
    async fn blackhole_answers_nothing_and_delivers_the_held_bytes_when_healed() {
        let (upstream, received) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut open = connect(&proxy).await;
        round_trip(&mut open, b"a", Duration::from_secs(5)).await.unwrap();
        proxy.set(Fault::Blackhole);
        let err = round_trip(&mut open, b"bb", Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(received.load(Ordering::SeqCst), 1, "the server got nothing while blackholed");
        // A connection opened during the fault is accepted but goes nowhere.
        let mut fresh = connect(&proxy).await;
        assert!(round_trip(&mut fresh, b"c", Duration::from_millis(200)).await.is_err());
        proxy.set(Fault::Pass);
        let mut late = [0u8; 2];
        tokio::time::timeout(Duration::from_secs(5), open.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"bb", "held bytes arrive in order once healed");
        let mut late = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), fresh.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"c");
    }

    #[tokio::test]
    async fn one_way_lets_requests_reach_the_server_but_holds_its_answers() {
        let (upstream, received) = echo_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut open = connect(&proxy).await;
        proxy.set(Fault::OneWay(Direction::ToServer));
        assert!(round_trip(&mut open, b"req", Duration::from_millis(300)).await.is_err());
        poll_until("the server receiving the request", || received.load(Ordering::SeqCst) == 3).await;
        proxy.set(Fault::Pass);
        let mut late = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), open.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"req");
        // The other way round: nothing reaches the server.
        proxy.set(Fault::OneWay(Direction::ToClient));
        assert!(round_trip(&mut open, b"more", Duration::from_millis(300)).await.is_err());
        assert_eq!(received.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn connections_beyond_the_bound_wait_until_one_closes() {
        let (upstream, _) = echo_server().await;
        let options = ProxyOptions { connections_max: 2, ..ProxyOptions::default() };
        let proxy = Proxy::start_with(upstream, options).await.unwrap();
        let mut first = connect(&proxy).await;
        let mut second = connect(&proxy).await;
        round_trip(&mut first, b"1", Duration::from_secs(5)).await.unwrap();
        round_trip(&mut second, b"2", Duration::from_secs(5)).await.unwrap();
        let mut third = connect(&proxy).await;
        assert!(round_trip(&mut third, b"3", Duration::from_millis(300)).await.is_err(), "served past the bound");
        drop(first);
        let mut late = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), third.read_exact(&mut late)).await.unwrap().unwrap();
        assert_eq!(&late, b"3");
        assert_eq!(proxy.connections(), 2);
    }

    #[tokio::test]
    async fn answers_are_rewritten_and_a_lookalike_tail_still_arrives() {
        let (upstream, _) = echo_server().await;
        let options = ProxyOptions {
            rewrites: vec![(b"127.0.0.1:41234".to_vec(), b"127.0.0.1:50001".to_vec())],
            ..ProxyOptions::default()
        };
        let proxy = Proxy::start_with(upstream, options).await.unwrap();
        let mut stream = connect(&proxy).await;
        stream.write_all(b"{\"leader\":\"127.0.0.1:41234\"}").await.unwrap();
        let expected = b"{\"leader\":\"127.0.0.1:50001\"}";
        let mut answer = vec![0u8; expected.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut answer)).await.unwrap().unwrap();
        assert_eq!(answer, expected);
        // A tail that only looks like the start of a pattern still arrives.
        stream.write_all(b"ends with 12").await.unwrap();
        let mut tail = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut tail)).await.unwrap().unwrap();
        assert_eq!(&tail, b"ends with 12");
    }

    #[test]
    fn rewriter_keeps_only_a_possible_pattern_start() {
        let mut rewriter = Rewriter::new(vec![(b"abc".to_vec(), b"xyz".to_vec())].into());
        assert_eq!(rewriter.feed(b"1ab"), b"1");
        assert_eq!(rewriter.feed(b"c2a"), b"xyz2");
        assert_eq!(rewriter.feed(b"x"), b"ax");
        assert_eq!(rewriter.feed(b"abcabc"), b"xyzxyz");
        assert_eq!(rewriter.feed(b"a"), b"");
        assert_eq!(rewriter.finish(), b"a");
        // What a replacement wrote is not held as the start of another match.
        let mut rewriter = Rewriter::new(vec![(b"ab".to_vec(), b"ba".to_vec())].into());
        assert_eq!(rewriter.feed(b"xab"), b"xba");
    }

    #[tokio::test]
    async fn unequal_rewrites_are_refused() {
        let options = ProxyOptions { rewrites: vec![(b"ab".to_vec(), b"abc".to_vec())], ..ProxyOptions::default() };
        assert!(Proxy::start_with("127.0.0.1:9".parse().unwrap(), options).await.is_err());
    }
}
