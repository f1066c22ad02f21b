//! What a node is told at start: who it is, how to sell, and which SKUs with what allotment.
//! `cluster.toml` is parsed and validated by the CLI; by the time these values exist they are
//! known to be consistent.

use std::time::Duration;

use protocol::{NodeId, SkuId, SkuTerms};
use safeguards::connections::ConnectionsPerAddress;

/// How purchases are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The design: a request must win a unit of the local allotment before it reaches the
    /// ledger, and local winners are confirmed in batches.
    Allotment,
    /// The baseline it is measured against: no allotment, no sold-out flag, no batching; every
    /// purchase is one ledger call.
    LedgerOnly,
}

/// A node's own settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    pub mode: Mode,
    /// Longest a request waits for its confirmation before it is answered 503. Keep it above the
    /// ledger's call timeout, so the answer usually carries the ledger's verdict.
    pub confirm_timeout: Duration,
    /// Local winners waiting for the confirmer, per SKU. When full, new winners get 503 at once:
    /// a slow ledger turns into backpressure, not memory growth.
    pub confirm_queue_max: usize,
    /// How often the cached ledger figures (stock page, sold-out flag) are refreshed.
    pub status_refresh: Duration,
    /// How far apart a quiet SKU's refreshes may grow: each refresh that finds its figures and
    /// local units unchanged doubles the pause, up to this (a sold-out or idle SKU then costs
    /// Redis close to nothing); any change brings it back to `status_refresh`. At or below
    /// `status_refresh`: every period.
    pub status_refresh_quiet_max: Duration,
    /// Least time between two starts of a catch-up read of one SKU's order stream, which a
    /// refusal from memory after the sale ended waits for: a sold-out answer takes up to this
    /// much longer, and a node reads a sold-out SKU's stream at most once per gap however many
    /// buyers press. Zero: back to back. At most [`SOLD_OUT_READ_GAP_MAX`].
    pub sold_out_read_gap: Duration,
    pub http: HttpLimits,
    /// Load balancers whose `X-Forwarded-For` names the client; from anyone else the socket
    /// address is the client.
    pub trusted_proxies: safeguards::client_ip::TrustedProxies,
    /// Where the order-id generator keeps its high-water files; `None`: the ledger numbers
    /// orders `<sku>-<seq>`.
    pub order_ids_dir: Option<std::path::PathBuf>,
    /// The Snowflake worker id without a coordinator (with one, the coordinator leases it).
    pub worker_id: u16,
    /// When the ledger path fails fast (`breaker`).
    pub breaker: BreakerSettings,
    /// How long the ledger keeps an idempotency record (`[ledger] idempotency_ttl_s`): the
    /// node forgets a sold key after it too, so a key reused later is a new purchase here as
    /// it is at the ledger.
    pub idempotency_ttl: Duration,
    /// Signs and checks waiting-room tickets; every node of a fleet must hold the same key (the
    /// wiring derives it from the cluster token). `None`: a key of this process alone.
    pub ticket_key: Option<crate::ticket::TicketKey>,
}

impl NodeConfig {
    pub fn new(id: NodeId) -> Self {
        Self {
            id,
            mode: Mode::Allotment,
            confirm_timeout: Duration::from_secs(2),
            confirm_queue_max: 4096,
            status_refresh: Duration::from_millis(250),
            status_refresh_quiet_max: Duration::from_secs(2),
            sold_out_read_gap: SOLD_OUT_READ_GAP_DEFAULT,
            http: HttpLimits::default(),
            trusted_proxies: Default::default(),
            order_ids_dir: None,
            worker_id: 0,
            breaker: BreakerSettings::default(),
            idempotency_ttl: ledger::IDEMPOTENCY_TTL_DEFAULT,
            ticket_key: None,
        }
    }
}

/// A sold-out answer waits up to this for the next read of the order stream.
pub const SOLD_OUT_READ_GAP_DEFAULT: Duration = Duration::from_millis(2);
/// Far below the half second a refusal may wait for a read before it is answered 503.
pub const SOLD_OUT_READ_GAP_MAX: Duration = Duration::from_millis(100);

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failed ledger calls that open the breaker. Several, so one slow call (a
    /// reconnect, a GC pause on the Redis host) does not turn buyers away.
    pub failures_max: u32,
    /// How long the breaker stays open before it lets one probe through; also the `Retry-After`
    /// of the purchases it refuses, and how long a probe may stay unanswered before another is
    /// let through (a probe whose request never reached the ledger must not hold the breaker
    /// half-open for good).
    pub cool_down: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        // Five calls is five batches failing in a row, a second or more of failure at the
        // default 500 ms call timeout; one second of cool-down matches the `Retry-After` unit.
        Self { failures_max: 5, cool_down: Duration::from_secs(1) }
    }
}

/// Connections one client address may hold on a node by default: a browser opens at most 6 per
/// host, so this leaves room for an office or a carrier's NAT full of buyers, while it takes 40
/// addresses (or IPv6 blocks) to fill the default 10,000 slots.
pub const CONNECTIONS_PER_ADDRESS_DEFAULT: usize = 256;

/// Bounds on what one client can make the HTTP server hold.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Largest request body; a purchase is well under 1 KiB.
    pub body_bytes_max: usize,
    /// Open connections at once; more wait in the kernel's accept queue.
    pub connections_max: usize,
    /// Open connections one client address may hold (IPv6: one block); a new connection past
    /// it is closed at once, so one host cannot take every slot. Loopback and the node's
    /// `trusted_proxies` are exempt: behind a load balancer every connection is the balancer's
    /// (see `safeguards::connections`).
    pub connections_per_address: ConnectionsPerAddress,
    /// Time to receive a request's headers, and the idle time allowed between keep-alive
    /// requests: a slowloris connection is closed after this.
    pub header_timeout: Duration,
    /// Time to receive a request's body once its headers are in.
    pub body_timeout: Duration,
    /// Longest a write may wait for the client to read: a client that pipelines requests and
    /// never reads the answers is cut off after this instead of holding its slot.
    pub write_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            body_bytes_max: 16 * 1024,
            connections_max: 10_000,
            connections_per_address: ConnectionsPerAddress::new(CONNECTIONS_PER_ADDRESS_DEFAULT),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// A SKU as this node sells it: the terms the group agreed and the units this node starts with.
#[derive(Debug, Clone)]
pub struct SkuConfig {
    pub sku: SkuId,
    pub terms: SkuTerms,
    /// Units this node starts with: its share of the total plus its buffer (0 under a
    /// coordinator, which grants units by heartbeat instead).
    pub allotment: u64,
}

impl SkuConfig {
    pub fn new(sku: SkuId, terms: SkuTerms, allotment: u64) -> Self {
        Self { sku, terms, allotment }
    }
}
