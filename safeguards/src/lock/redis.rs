//! Locks on Redis: each call is one Lua script (`lua/*.lua`), so taking, re-entering, releasing
//! and extending are each one atomic step on the server.
//!
//! Keys for lock `n` under prefix `p` (the `{n}` hash tag keeps both in one cluster slot, so the
//! scripts run unchanged on Redis Cluster):
//! - `p:lock:{n}`        hash `{owner, fence, h:<hold>...}` with the lock's ttl. The moral
//!   equivalent of `SET NX PX`: created only when absent, with its expiry, in one step; a hash
//!   so that the fence and the holds expire with the owner.
//! - `p:lock:{n}:fence`  the fencing counter; never expires, so fences never repeat while
//!   Redis keeps its data.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::Script;

use super::*;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/extend.lua")));

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisLockConfig {
    /// `redis://host:port[/db]`; the ledger's Redis is fine, the keys do not collide.
    pub url: String,
    /// First part of every key, so several deployments can share one Redis.
    pub key_prefix: String,
    /// Upper bound on one call, reconnect included.
    pub call_timeout: Duration,
    /// Upper bound on opening a connection.
    pub connect_timeout: Duration,
}

impl RedisLockConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: "seckill".into(),
            call_timeout: CALL_TIMEOUT_DEFAULT,
            connect_timeout: CALL_TIMEOUT_DEFAULT,
        }
    }
}

/// The Redis lock backend. One multiplexed connection that reconnects on its own: lock calls
/// are a few per second, never on the purchase path.
pub struct RedisLockBackend {
    connection: ConnectionManager,
    config: RedisLockConfig,
}

impl RedisLockBackend {
    /// Connects lazily: calls fail with [`LockError::Unavailable`] until Redis answers.
    pub fn connect(config: RedisLockConfig) -> Result<RedisLockBackend, LockError> {
        let client = ::redis::Client::open(config.url.as_str())
            .map_err(|e| LockError::Unavailable(format!("bad Redis URL {}: {e}", config.url)))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.call_timeout))
            // One quick reconnect inside a call keeps it within its deadline; the next call
            // tries again anyway.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let connection = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| LockError::Unavailable(e.to_string()))?;
        Ok(RedisLockBackend { connection, config })
    }

    /// The lock's key and its fencing counter's key.
    pub fn keys(&self, name: &LockName) -> (String, String) {
        let lock = format!("{}:lock:{{{name}}}", self.config.key_prefix);
        let fence = format!("{lock}:fence");
        (lock, fence)
    }

    async fn run<T: ::redis::FromRedisValue>(&self, invocation: ::redis::ScriptInvocation<'_>) -> Result<T, LockError> {
        let mut connection = self.connection.clone();
        let limit = self.config.call_timeout;
        match tokio::time::timeout(limit, invocation.invoke_async(&mut connection)).await {
            Err(_) => Err(LockError::Unavailable(format!("no answer within {limit:?}"))),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.to_string().contains("SECKILL_HOLDS_MAX") => {
                Err(LockError::Invalid("this owner already holds the lock LOCK_HOLDS_MAX times"))
            }
            Ok(Err(e)) => Err(LockError::Unavailable(e.to_string())),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

#[async_trait::async_trait]
impl LockBackend for RedisLockBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        hold: HoldId,
        ttl: Duration,
    ) -> Result<Acquisition, LockError> {
        check_ttl(ttl)?;
        let (lock, fence) = self.keys(name);
        let mut invocation = ACQUIRE.key(&lock);
        invocation.key(&fence).arg(owner.as_str()).arg(hold.0).arg(millis(ttl)).arg(LOCK_HOLDS_MAX);
        let reply: Vec<i64> = self.run(invocation).await?;
        match reply[..] {
            [1, fence, holds] if fence > 0 && holds > 0 => {
                Ok(Acquisition::Acquired { fence: FencingToken(fence as u64), holds: holds as u32 })
            }
            // PTTL is -1 for a key without expiry, which the scripts never leave; wait a ttl.
            [0, pttl, 0] => {
                let retry_after = u64::try_from(pttl).map_or(ttl, Duration::from_millis);
                Ok(Acquisition::Held { retry_after })
            }
            _ => Err(LockError::Corrupt(format!("acquire.lua returned {reply:?}"))),
        }
    }

    async fn release(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        hold: HoldId,
    ) -> Result<Release, LockError> {
        let (lock, _) = self.keys(name);
        let mut invocation = RELEASE.key(&lock);
        invocation.arg(owner.as_str()).arg(fence.0).arg(hold.0);
        match self.run::<i64>(invocation).await? {
            -1 => Ok(Release::NotHeld),
            left if left >= 0 => Ok(Release::Released { holds_left: left as u32 }),
            other => Err(LockError::Corrupt(format!("release.lua returned {other}"))),
        }
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        fence: FencingToken,
        ttl: Duration,
    ) -> Result<Extension, LockError> {
        check_ttl(ttl)?;
        let (lock, _) = self.keys(name);
        let mut invocation = EXTEND.key(&lock);
        invocation.arg(owner.as_str()).arg(fence.0).arg(millis(ttl));
        match self.run::<i64>(invocation).await? {
            1 => Ok(Extension::Extended),
            0 => Ok(Extension::NotHeld),
            other => Err(LockError::Corrupt(format!("extend.lua returned {other}"))),
        }
    }
}
