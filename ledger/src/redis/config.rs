//! [`RedisLedgerConfig`]: how to reach the ledger's Redis, how long to wait for it, and what
//! the ledger keeps there and for how long.

use std::time::Duration;

use super::redact::redact_url;
use crate::*;

/// How to reach Redis and how long to wait for it.
#[derive(Clone)]
pub struct RedisLedgerConfig {
    /// `redis://host:port[/db]` for one server, `redis+cluster://host:port,host:port,…` for
    /// the seed nodes of a Redis Cluster, or `redis+sentinel://host:port,…/master-name` for
    /// the sentinels watching a master (see [`RedisTarget`]).
    pub url: String,
    /// Multiplexed connections to spread calls over; one connection already pipelines, more
    /// help only when a single socket's read loop becomes the bottleneck. On a cluster each
    /// one is a cluster client holding one multiplexed socket per master.
    pub connections: usize,
    /// Upper bound on one call, reconnect included. A sale whose confirmation outlives it is
    /// answered 503 and decided by the client's retry, so keep it well under client timeouts.
    pub call_timeout: Duration,
    /// Upper bound on opening a connection.
    pub connect_timeout: Duration,
    /// How long a stored decision answers retries.
    pub idempotency_ttl: Duration,
    /// How long a sale's record is kept, against which its release is checked (see
    /// [`crate::SALE_RECORD_TTL_DEFAULT`]).
    pub sale_record_ttl: Duration,
    /// First part of every key, so several sales can share one Redis.
    pub key_prefix: String,
    /// Submit tokens one SKU issues per window of one token TTL (see
    /// [`crate::TOKEN_ISSUE_MAX_DEFAULT`], which says what memory this bounds).
    pub token_issue_max: u64,
    /// What a decision has survived when the ledger answers it ([`Durability`]). `Fsync` is
    /// checked by [`RedisLedger::check_durability`]; `Replica` waits after every write script.
    pub durability: Durability,
}

impl RedisLedgerConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            connections: 2,
            call_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            idempotency_ttl: IDEMPOTENCY_TTL_DEFAULT,
            sale_record_ttl: crate::SALE_RECORD_TTL_DEFAULT,
            key_prefix: "seckill".into(),
            token_issue_max: crate::TOKEN_ISSUE_MAX_DEFAULT,
            durability: Durability::None,
        }
    }
}

impl std::fmt::Debug for RedisLedgerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedgerConfig")
            .field("url", &redact_url(&self.url))
            .field("connections", &self.connections)
            .field("call_timeout", &self.call_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("idempotency_ttl", &self.idempotency_ttl)
            .field("sale_record_ttl", &self.sale_record_ttl)
            .field("key_prefix", &self.key_prefix)
            .field("token_issue_max", &self.token_issue_max)
            .field("durability", &self.durability)
            .finish()
    }
}
