//! The fleet-wide per-user limit: one Lua call on Redis per check (`lua/gcra.lua`).
//!
//! It costs a round trip, so the node runs it last, only for a request that passed every
//! in-memory check and is about to take a unit; sold-out bursts never reach it. When Redis does
//! not answer in time the request is admitted: the limit guards against abuse, the ledger guards
//! the stock, and a rate limiter that fails closed would turn a Redis hiccup into an outage.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Script;

use super::gcra::Rate;
use crate::redis_call::bounded;

static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/gcra.lua")));

/// What a fleet-wide check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterVerdict {
    Admit,
    Limited(Duration),
    /// Redis did not answer; the request was let through.
    Unchecked,
}

/// The fleet-wide check as the node's gate holds it, whatever connection backs it.
#[async_trait::async_trait]
pub trait FleetLimit: Send + Sync + 'static {
    /// `subject` is `user:<id>` or `ip:<address>`.
    async fn check(&self, sku: &str, subject: &str, rate: Rate) -> ClusterVerdict;
}

/// `C` is any multiplexed, cheaply cloned Redis handle: one server or a Redis Cluster.
pub struct ClusterLimiter<C> {
    connection: C,
    key_prefix: String,
    timeout: Duration,
}

impl<C> ClusterLimiter<C> {
    /// `connection` is shared with whatever else the node keeps on that Redis; keys go under
    /// `key_prefix:ratelimit:`.
    pub fn new(connection: C, key_prefix: &str, timeout: Duration) -> Self {
        Self { connection, key_prefix: key_prefix.to_string(), timeout }
    }
}

#[async_trait::async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> FleetLimit for ClusterLimiter<C> {
    /// Checks one request of `subject` on `sku` against `rate`. The key's hash tag is the
    /// subject, so on Redis Cluster one user's (one address's) limits live on one shard.
    async fn check(&self, sku: &str, subject: &str, rate: Rate) -> ClusterVerdict {
        let interval_us = (1e6 / rate.per_s.max(1e-6)).round().max(1.0) as u64;
        let tolerance_us = interval_us.saturating_mul(u64::from(rate.burst.max(1)));
        let key = format!("{}:ratelimit:{{{subject}}}:{sku}", self.key_prefix);
        let mut connection = self.connection.clone();
        let mut invocation = GCRA.key(key);
        invocation.arg(interval_us).arg(tolerance_us);
        let call = invocation.invoke_async::<u64>(&mut connection);
        match bounded(self.timeout, call).await {
            Ok(0) => ClusterVerdict::Admit,
            Ok(wait_us) => ClusterVerdict::Limited(Duration::from_micros(wait_us)),
            Err(e) => {
                tracing::warn!("fleet-wide rate limit unchecked: {e}");
                ClusterVerdict::Unchecked
            }
        }
    }
}
