//! `[ledger]`: where the global count lives (embedded, or Redis alone, under Sentinel or as a
//! Cluster), how the nodes reach it and what a decision has survived when a buyer hears it.

use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[ledger]`. Its `Debug` hides the URL's password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerSection {
    /// `embedded`, a `redis://` URL, `redis+cluster://host:port,host:port,…` naming seed
    /// nodes of a Redis Cluster, or `redis+sentinel://host:port,host:port,…/master-name`
    /// naming the sentinels that watch a master.
    pub url: String,
    pub connections: usize,
    pub call_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub idempotency_ttl_s: u64,
    /// How long the ledger keeps each sale's record, against which an unpaid order's release is
    /// checked: a SKU's pay timeout plus the longest order-service outage the fleet survives
    /// with every unpaid unit still coming back (at least [`ORDER_OUTAGE_SURVIVED_MIN_S`]).
    pub sale_record_ttl_s: u64,
    pub key_prefix: String,
    /// Submit tokens one SKU issues per token TTL; bounds their memory in Redis (see
    /// `ledger::TOKEN_ISSUE_MAX_DEFAULT`).
    pub token_issue_max: u64,
    /// `none`, `fsync` or `replica`: what a decision has survived when the buyer hears it
    /// (`ledger::Durability` says exactly).
    pub durability: String,
    /// `durability = "replica"`: replicas that must acknowledge every write (default 1).
    pub replicas: Option<u32>,
    /// `durability = "replica"`: longest the ledger waits for them, per write (default
    /// [`REPLICA_TIMEOUT_MS_DEFAULT`]); below `call_timeout_ms`, which covers write and wait.
    pub replica_timeout_ms: Option<u64>,
}

/// The shortest order-service outage a config must let the fleet survive: `sale_record_ttl_s`
/// is refused below every SKU's `pay_timeout_s` plus this.
pub const ORDER_OUTAGE_SURVIVED_MIN_S: u64 = 60 * 60;

/// How long a write waits for its replicas by default: a replica on the same network
/// acknowledges within a millisecond or two, so 100 ms means it is lagging or gone, and leaves
/// room within the default 500 ms call timeout for the write itself.
pub const REPLICA_TIMEOUT_MS_DEFAULT: u64 = 100;

impl LedgerSection {
    /// The durability the section names; `validate` has checked it.
    pub fn durability(&self) -> Result<ledger::Durability, ConfigError> {
        let set_without_replica = self.replicas.is_some() || self.replica_timeout_ms.is_some();
        match self.durability.as_str() {
            "none" | "fsync" if set_without_replica => {
                Err(invalid("ledger.replicas", "replicas and replica_timeout_ms need durability = \"replica\""))
            }
            "none" => Ok(ledger::Durability::None),
            "fsync" => Ok(ledger::Durability::Fsync),
            "replica" => {
                let replicas = self.replicas.unwrap_or(1);
                let timeout_ms = self.replica_timeout_ms.unwrap_or(REPLICA_TIMEOUT_MS_DEFAULT);
                if replicas == 0 {
                    return Err(invalid(
                        "ledger.replicas",
                        "must be at least 1 (durability = \"none\" waits for none)",
                    ));
                }
                if timeout_ms == 0 || timeout_ms >= self.call_timeout_ms {
                    return Err(invalid(
                        "ledger.replica_timeout_ms",
                        "must be above zero and below call_timeout_ms, which covers the write and its wait",
                    ));
                }
                Ok(ledger::Durability::Replica { replicas, timeout: Duration::from_millis(timeout_ms) })
            }
            other => Err(invalid("ledger.durability", format!("{other:?} is not \"none\", \"fsync\" or \"replica\""))),
        }
    }
}

impl std::fmt::Debug for LedgerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerSection")
            .field("url", &ledger::redact_url(&self.url))
            .field("connections", &self.connections)
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("idempotency_ttl_s", &self.idempotency_ttl_s)
            .field("sale_record_ttl_s", &self.sale_record_ttl_s)
            .field("key_prefix", &self.key_prefix)
            .field("token_issue_max", &self.token_issue_max)
            .field("durability", &self.durability)
            .field("replicas", &self.replicas)
            .field("replica_timeout_ms", &self.replica_timeout_ms)
            .finish()
    }
}

impl Default for LedgerSection {
    fn default() -> Self {
        let redis = ledger::RedisLedgerConfig::new("embedded");
        Self {
            url: "embedded".into(),
            connections: redis.connections,
            call_timeout_ms: redis.call_timeout.as_millis() as u64,
            connect_timeout_ms: redis.connect_timeout.as_millis() as u64,
            idempotency_ttl_s: redis.idempotency_ttl.as_secs(),
            sale_record_ttl_s: redis.sale_record_ttl.as_secs(),
            key_prefix: redis.key_prefix,
            token_issue_max: redis.token_issue_max,
            durability: redis.durability.name().into(),
            replicas: None,
            replica_timeout_ms: None,
        }
    }
}

impl LedgerSection {
    /// Every rule of the section on its own; the rules that tie it to other sections (sale
    /// records against pay timeouts, the node's confirm timeout) are checked where both are.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.url != "embedded" {
            let schemes = ["redis://", ledger::CLUSTER_SCHEME, ledger::SENTINEL_SCHEME];
            if !schemes.iter().any(|scheme| self.url.starts_with(scheme)) {
                return Err(invalid(
                    "ledger.url",
                    format!(
                        "{:?} is neither \"embedded\", a redis:// URL, a redis+cluster://host:port,host:port URL nor \
                         a redis+sentinel://host:port,host:port/master-name URL",
                        ledger::redact_url(&self.url)
                    ),
                ));
            }
            ledger::RedisTarget::parse(&self.url).map_err(|reason| invalid("ledger.url", reason))?;
        }
        if self.connections == 0 || self.connections > 64 {
            return Err(invalid("ledger.connections", "must be between 1 and 64"));
        }
        if self.call_timeout_ms == 0 || self.connect_timeout_ms == 0 || self.idempotency_ttl_s == 0 {
            return Err(invalid("ledger", "timeouts and idempotency_ttl_s must be above zero"));
        }
        if self.durability()? != ledger::Durability::None && self.url == "embedded" {
            return Err(invalid(
                "ledger.durability",
                "the embedded ledger lives in process memory; only durability = \"none\" describes it",
            ));
        }
        if self.token_issue_max == 0 {
            return Err(invalid("ledger.token_issue_max", "must be above zero"));
        }
        Ok(())
    }
}
