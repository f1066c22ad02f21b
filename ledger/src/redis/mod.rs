//! The ledger on Redis: the Lua scripts in `lua/` do every write, so each operation is one
//! atomic step on the server, and Redis persistence (AOF) is what makes sales durable.
//! [`RedisLedger`] keeps every client's contract ([`SalesLedger`], [`CatalogueLedger`],
//! [`OrderFeed`]) on one Redis, a Redis Cluster, or the master Redis Sentinel names
//! ([`RedisTarget`]). How a SKU's keys are laid out is in `keys.rs`.
//!
//! **Redis Cluster.** A `redis+cluster://host:port,host:port,…` URL names seed nodes of a
//! cluster; the client learns the slot map from them, sends each call to the master that owns
//! the slot of its first key and follows MOVED/ASK. Every key one call touches carries the same
//! `{s}` tag, so every script, pipeline and XRANGE runs on one node and never meets CROSSSLOT.
//! Replicas are not read from: a stale read of `meta` would be harmless for display, but the
//! order stream feeds replays, and one code path for reads is simpler to reason about.
//!
//! With replicas and [`Durability::Replica`], `WAIT` is per shard: redis-rs (1.8) routes a
//! pipeline as a whole, by its first command that names a key, so the script and the keyless
//! `WAIT` after it go to the master of the SKU's slot, in one write on that node's one
//! multiplexed connection (alone, `WAIT` would be fanned out to every master); a MOVED or ASK
//! in any reply sends the whole pipeline again to the new owner, so they stay together across
//! a failover. `WAIT` counts that master's replicas only: a stalled replica refuses its shard's
//! writes and no other's (`tests/cluster/redis_cluster_replicas.rs`).
//!
//! **Redis Sentinel.** A `redis+sentinel://host:port,…/master-name` URL names sentinels; the
//! ledger asks them for the master and follows it across a failover (`sentinel.rs`).
//!
//! **Layout.** One file per concern. This file declares [`RedisLedger`], which the others
//! extend, and answers [`LedgerReads`] by handing each read to the file that owns it. Imports
//! point down this list, never up (each entry names what it uses):
//!
//! - `sales`: [`SalesLedger`], submit tokens and confirming batches. Uses `scripts`, `call`.
//! - `catalogue`: [`CatalogueLedger`], create, restock, pricing, close, epochs; and the SKU's
//!   status. Uses `scripts`, `call`.
//! - `feed`: [`OrderFeed`], the order stream's consumer groups. Uses `stream`.
//! - `releases`: giving an order's units back, and the release log. Uses `scripts`, `stream`.
//! - `stream`: reading a SKU's streams by sequence number (order events, releases).
//! - `fsync`: the start-up check of [`Durability::Fsync`]. Uses `cluster`, `connection`,
//!   `config`, `redact`.
//! - `cluster`: `ping`, and reaching each master of a cluster by address. Uses `connection`.
//! - `call`: one call: its deadline, the replica fence and `WAIT`, reading its reply. Uses
//!   `connection`, `failure`.
//! - `keys`: the key layout of a SKU.
//! - `scripts`: the Lua scripts, sent by their SHA.
//! - `connection`: [`RedisConnection`], one handle on a server, a cluster or the master the
//!   sentinels name. Uses `config`, `target`, `sentinel`, `failure`, `redact`.
//! - `sentinel`: [`SentinelConnection`], following the master the sentinels name. Uses `target`.
//! - `config`: [`RedisLedgerConfig`]. Uses `redact`.
//! - `target`: [`RedisTarget`], what a ledger URL names. Uses `redact`.
//! - `failure`: what a Redis error means to the caller.
//! - `redact`: passwords kept out of messages.
//!
//! Outside `redis/`, these files use the crate root (the traits, types and constants) and
//! `durability` (what [`Durability::Fsync`] needs); nothing outside uses them but through the
//! re-exports below.

mod call;
mod catalogue;
mod cluster;
mod config;
mod connection;
mod failure;
mod feed;
mod fsync;
mod keys;
#[cfg(feature = "suite")]
mod older_scripts;
mod redact;
mod releases;
mod room;
mod sales;
mod scripts;
mod sentinel;
mod stream;
mod target;

use std::sync::atomic::{AtomicUsize, Ordering};

pub use self::config::RedisLedgerConfig;
pub use self::connection::RedisConnection;
#[cfg(feature = "suite")]
pub use self::older_scripts::ArgumentShape;
pub use self::redact::redact_url;
pub use self::sentinel::SentinelConnection;
pub use self::target::{ClusterSeeds, RedisTarget, SentinelSeeds, CLUSTER_SCHEME, SENTINEL_SCHEME};
use crate::*;

/// The Redis ledger. Cheap to share: connections are multiplexed and reconnect on their own.
pub struct RedisLedger {
    connections: Vec<RedisConnection>,
    next_connection: AtomicUsize,
    config: RedisLedgerConfig,
}

impl RedisLedger {
    /// Connects lazily: the ledger can be built while Redis is still starting, and calls fail
    /// with [`LedgerError::Unavailable`] until it answers. A cluster client that could not reach
    /// any seed at first tries the seeds again on the next call.
    pub fn connect(config: RedisLedgerConfig) -> Result<Self, LedgerError> {
        let connections = RedisConnection::open_many(&config, config.connections.max(1))?;
        Ok(Self { connections, next_connection: AtomicUsize::new(0), config })
    }

    fn connection(&self) -> RedisConnection {
        // Relaxed: the counter only spreads load; no other memory depends on its value.
        let at = self.next_connection.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[at].clone()
    }
}

#[async_trait::async_trait]
impl LedgerReads for RedisLedger {
    async fn status(&self, sku: &SkuId) -> Result<SkuStatus, LedgerError> {
        self.read_status(sku).await
    }

    /// An entry that is not an order event (a corrupt write, or one planted by hand) is skipped
    /// with a warning instead of failing the page: nodes page through this stream to replay
    /// retries, and one bad entry must not stop them at it for good. The order consumer reads
    /// the same entry through its group and dead-letters it, where an operator sees it. Pages
    /// are filled past skipped entries, so a page shorter than `limit` still means the end.
    async fn orders(&self, sku: &SkuId, after: u64, limit: usize) -> Result<Vec<OrderEvent>, LedgerError> {
        self.order_events(sku, after, limit).await
    }

    /// On a cluster, succeeds only if every master answers: a ledger with one master down
    /// cannot sell the SKUs in its slots.
    async fn ping(&self) -> Result<(), LedgerError> {
        self.ping_servers().await
    }

    async fn room_figures(&self, sku: &SkuId) -> Result<Option<RoomFigures>, LedgerError> {
        self.read_room(sku).await
    }
}
