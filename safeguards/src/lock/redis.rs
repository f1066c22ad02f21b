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

use ::redis::aio::ConnectionLike;
use ::redis::Script;

use super::*;
use crate::redis_call::bounded;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/extend.lua")));

/// The Redis lock backend, over any multiplexed, cheaply cloned Redis handle (one server or a
/// Redis Cluster; the ledger's `RedisConnection` is meant). Lock calls are a few per second,
/// never on the purchase path.
pub struct RedisLockBackend<C> {
    connection: C,
    /// First part of every key, so several deployments can share one Redis.
    key_prefix: String,
    /// Upper bound on one call, reconnect included.
    call_timeout: Duration,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisLockBackend<C> {
    pub fn new(connection: C, key_prefix: &str, call_timeout: Duration) -> Self {
        Self { connection, key_prefix: key_prefix.to_string(), call_timeout }
    }

    /// The lock's key and its fencing counter's key.
    pub fn keys(&self, name: &LockName) -> (String, String) {
        let lock = format!("{}:lock:{{{name}}}", self.key_prefix);
        let fence = format!("{lock}:fence");
        (lock, fence)
    }

    async fn run<T: ::redis::FromRedisValue>(&self, invocation: ::redis::ScriptInvocation<'_>) -> Result<T, LockError> {
        let mut connection = self.connection.clone();
        match bounded(self.call_timeout, invocation.invoke_async(&mut connection)).await {
            Ok(value) => Ok(value),
            Err(e) if e.contains("SECKILL_HOLDS_MAX") => Err(LockError::holds_max()),
            Err(e) => Err(LockError::Unavailable(e)),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

#[async_trait::async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> LockBackend for RedisLockBackend<C> {
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
