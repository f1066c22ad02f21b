//! What a node and a coordinator member run of the safeguards, built from the validated
//! `[safeguards]` and `[ledger]` sections: the node's gate, the blacklist store and the Redis
//! handle they share. Nothing here reads or checks configuration.

use std::sync::Arc;
use std::time::Duration;

use ledger::{RedisConnection, RedisLedgerConfig};
use node::{Gate, SafeguardGate};
use safeguards::blacklist::{AutoBan, BlacklistStore, MemoryBlacklistStore, RedisBlacklistStore};
use safeguards::ratelimit::{ClusterLimiter, FleetLimit, LimitSettings, RateLimiter};

use crate::config::{LedgerSection, Safeguards};

/// The blacklist store the config implies: Redis next to a Redis ledger, else process memory
/// (then every node and member sharing it must run in this process).
/// `redis` is [`redis_connection`]'s handle, shared with the gate.
pub fn blacklist_store(ledger: &LedgerSection, redis: Option<RedisConnection>) -> Arc<dyn BlacklistStore> {
    match redis {
        Some(connection) => {
            let timeout = Duration::from_millis(ledger.call_timeout_ms);
            Arc::new(RedisBlacklistStore::new(connection, &ledger.key_prefix, timeout))
        }
        None => Arc::new(MemoryBlacklistStore::default()),
    }
}

/// The gate a node runs: `None` when the safeguards are disabled.
pub fn build_gate(
    safeguards: &Safeguards,
    ledger: &LedgerSection,
    store: Arc<dyn BlacklistStore>,
    redis: Option<RedisConnection>,
) -> Option<Arc<dyn Gate>> {
    if !safeguards.enabled {
        return None;
    }
    let limiter = RateLimiter::new(safeguards.defaults.clone(), safeguards.per_sku.clone());
    let fleet_wide = |limits: &LimitSettings| limits.cluster_per_user.is_some() || limits.cluster_per_ip.is_some();
    let fleet_wide_configured = fleet_wide(&safeguards.defaults) || safeguards.per_sku.values().any(fleet_wide);
    let fleet: Option<Arc<dyn FleetLimit>> = match redis {
        Some(connection) if fleet_wide_configured => {
            let timeout = Duration::from_millis(ledger.call_timeout_ms);
            Some(Arc::new(ClusterLimiter::new(connection, &ledger.key_prefix, timeout)))
        }
        _ => None,
    };
    let auto_ban = safeguards.auto_ban.map(AutoBan::new);
    let gate: Arc<dyn Gate> = SafeguardGate::start(
        limiter,
        fleet,
        store,
        safeguards.blacklist_sync,
        auto_ban,
        safeguards.ipv6_prefix,
        safeguards.token_rate_per_address,
    );
    Some(gate)
}

/// A handle on the ledger's Redis (one server or a cluster) for the safeguards' own keys;
/// `None` with the embedded ledger. Lazy: nothing connects until the first call.
pub fn redis_connection(ledger: &LedgerSection) -> anyhow::Result<Option<RedisConnection>> {
    if ledger.url == "embedded" {
        return Ok(None);
    }
    let mut config = RedisLedgerConfig::new(ledger.url.clone());
    config.connect_timeout = Duration::from_millis(ledger.connect_timeout_ms);
    config.call_timeout = Duration::from_millis(ledger.call_timeout_ms);
    Ok(Some(RedisConnection::open(&config)?))
}
