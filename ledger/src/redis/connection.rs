//! [`RedisConnection`]: one handle on the ledger's Redis, whichever [`RedisTarget`] the URL
//! names (one server, a cluster's masters, or the master the sentinels name), opened with the
//! ledger's timeouts. Every kind multiplexes calls and reconnects on its own.

use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, Pipeline, RedisFuture, Value};

use super::config::RedisLedgerConfig;
use super::failure::unavailable;
use super::redact::scrub;
use super::sentinel::SentinelConnection;
use super::target::{ClusterSeeds, RedisTarget};
use crate::*;

/// How many times the cluster client retries one call after a redirect (MOVED/ASK), a busy
/// slot (TRYAGAIN) or a dropped socket. One redirect plus one reconnect fits; the call's own
/// deadline (`call_timeout`) bounds the total anyway.
const CLUSTER_RETRIES_MAX: u32 = 3;

/// Shortest and longest pause before a cluster retry, in milliseconds. redis-rs defaults to
/// 1.28 s at least, longer than a whole call may take; these match the single-server
/// reconnect delays.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 10;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 100;

/// One handle on Redis. Every kind multiplex concurrent calls over their sockets and reconnect
/// on their own; cloning shares the sockets.
#[derive(Clone)]
pub enum RedisConnection {
    Single(ConnectionManager),
    /// Routes each command to the master owning its first key's slot, follows MOVED/ASK, and
    /// refreshes the slot map when the cluster changes.
    Cluster(ClusterConnection),
    /// The master the sentinels name, found again after a failover.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(con) => con.req_packed_command(cmd),
            RedisConnection::Cluster(con) => con.req_packed_command(cmd),
            RedisConnection::Sentinel(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
            RedisConnection::Sentinel(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(con) => con.get_db(),
            RedisConnection::Cluster(con) => con.get_db(),
            RedisConnection::Sentinel(con) => con.get_db(),
        }
    }
}

impl RedisConnection {
    /// One handle on the Redis (or Redis Cluster) at `config.url`, with the ledger's timeouts,
    /// for other users of the same Redis (the node's rate limits and blacklist). Connects lazily.
    pub fn open(config: &RedisLedgerConfig) -> Result<Self, LedgerError> {
        let mut one = Self::open_many(config, 1)?;
        one.pop().ok_or_else(|| LedgerError::Unavailable("no connection".into()))
    }

    pub(super) fn open_many(config: &RedisLedgerConfig, count: usize) -> Result<Vec<Self>, LedgerError> {
        let bad_url = |e: String| LedgerError::Unavailable(format!("bad Redis URL: {e}"));
        match RedisTarget::parse(&config.url).map_err(bad_url)? {
            RedisTarget::Single(url) => Self::single(&url, config, count),
            RedisTarget::Cluster(seeds) => Self::cluster(&seeds, config, count),
            RedisTarget::Sentinel(seeds) => (0..count)
                .map(|_| {
                    SentinelConnection::new(&seeds, config.connect_timeout, config.call_timeout)
                        .map(RedisConnection::Sentinel)
                        .map_err(|e| LedgerError::Unavailable(scrub(&e.to_string(), &config.url)))
                })
                .collect(),
        }
    }

    fn single(url: &str, config: &RedisLedgerConfig, count: usize) -> Result<Vec<RedisConnection>, LedgerError> {
        let client = ::redis::Client::open(url).map_err(|e| unavailable(&e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.call_timeout))
            // Reconnect attempts happen inside a call; one quick retry keeps a call within its
            // timeout, and the next call tries again anyway.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        (0..count)
            .map(|_| {
                ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                    .map(RedisConnection::Single)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unavailable(&e))
    }

    fn cluster(
        seeds: &ClusterSeeds,
        config: &RedisLedgerConfig,
        count: usize,
    ) -> Result<Vec<RedisConnection>, LedgerError> {
        let client = ClusterClientBuilder::new(seeds.urls())
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.call_timeout)
            // Redirects and retries included, a call ends within the same deadline as on one
            // server.
            .overall_response_timeout(Some(config.call_timeout))
            .retries(CLUSTER_RETRIES_MAX)
            .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS)
            .build()
            .map_err(|e| unavailable(&e))?;
        // The per-connection config replaces the builder's timeouts, so it repeats them.
        let connection_config = ClusterConfig::new()
            .set_connection_timeout(config.connect_timeout)
            .set_response_timeout(config.call_timeout);
        // "Pending": the connection is made in the background, so building the ledger never
        // waits for (or fails on) a cluster that is still starting.
        Ok((0..count)
            .map(|_| {
                RedisConnection::Cluster(client.get_pending_async_connection_with_config(connection_config.clone()))
            })
            .collect())
    }
}
