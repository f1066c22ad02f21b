//! Where the fleet's blacklist lives: a versioned set in Redis (nodes and coordinator members of
//! a Redis deployment share it), or in process memory when the ledger is embedded and every node
//! runs in one process.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::Script;

use super::Entry;
use crate::redis_call::bounded;

static ADD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/blacklist_add.lua")));
static REMOVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/blacklist_remove.lua")));
static LOAD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/blacklist_load.lua")));

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("blacklist store unavailable: {0}")]
    Unavailable(String),
    #[error("blacklist store holds something unreadable: {0}")]
    Corrupt(String),
}

/// The whole list at one version; `None` remaining = until removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub version: u64,
    pub entries: Vec<(Entry, Option<Duration>)>,
}

#[async_trait::async_trait]
pub trait BlacklistStore: Send + Sync + 'static {
    /// Lists `entry` for `ttl` (`None`: until removed); a longer existing ban is kept.
    async fn add(&self, entry: &Entry, ttl: Option<Duration>) -> Result<u64, StoreError>;
    /// Whether it was listed.
    async fn remove(&self, entry: &Entry) -> Result<bool, StoreError>;
    /// Changes with every add and remove; nodes reload when it moves.
    async fn version(&self) -> Result<u64, StoreError>;
    async fn load(&self) -> Result<Snapshot, StoreError>;
}

/// The blacklist in one process, for the embedded ledger.
#[derive(Default)]
pub struct MemoryBlacklistStore {
    state: Mutex<(u64, HashMap<Entry, Option<Instant>>)>,
}

#[async_trait::async_trait]
impl BlacklistStore for MemoryBlacklistStore {
    async fn add(&self, entry: &Entry, ttl: Option<Duration>) -> Result<u64, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let until = ttl.map(|ttl| Instant::now() + ttl);
        let keep = match (state.1.get(entry), until) {
            (Some(None), _) => None,
            (Some(Some(existing)), Some(new)) => Some((*existing).max(new)),
            (_, new) => new,
        };
        state.1.insert(entry.clone(), keep);
        state.0 += 1;
        Ok(state.0)
    }

    async fn remove(&self, entry: &Entry) -> Result<bool, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let removed = state.1.remove(entry).is_some();
        if removed {
            state.0 += 1;
        }
        Ok(removed)
    }

    async fn version(&self) -> Result<u64, StoreError> {
        Ok(self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).0)
    }

    async fn load(&self) -> Result<Snapshot, StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        state.1.retain(|_, until| until.is_none_or(|until| until > now));
        let entries = state.1.iter().map(|(entry, until)| (entry.clone(), until.map(|u| u - now))).collect();
        Ok(Snapshot { version: state.0, entries })
    }
}

/// The blacklist in Redis: `prefix:{blacklist}:entries` (sorted set, expiry as score) and
/// `prefix:{blacklist}:version`; one hash tag, so both sit in one slot of a Redis Cluster.
pub struct RedisBlacklistStore<C> {
    connection: C,
    entries_key: String,
    version_key: String,
    timeout: Duration,
}

impl<C> RedisBlacklistStore<C> {
    /// `C` is any multiplexed, cheaply cloned Redis handle: one server or a Redis Cluster.
    pub fn new(connection: C, key_prefix: &str, timeout: Duration) -> Self {
        Self {
            connection,
            entries_key: format!("{key_prefix}:{{blacklist}}:entries"),
            version_key: format!("{key_prefix}:{{blacklist}}:version"),
            timeout,
        }
    }

    async fn call<T>(&self, call: impl std::future::Future<Output = redis::RedisResult<T>>) -> Result<T, StoreError> {
        bounded(self.timeout, call).await.map_err(StoreError::Unavailable)
    }
}

#[async_trait::async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> BlacklistStore for RedisBlacklistStore<C> {
    async fn add(&self, entry: &Entry, ttl: Option<Duration>) -> Result<u64, StoreError> {
        let mut connection = self.connection.clone();
        let ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis().max(1) as u64);
        let mut invocation = ADD.key(&self.entries_key);
        invocation.key(&self.version_key).arg(entry.to_string()).arg(ttl_ms);
        self.call(invocation.invoke_async(&mut connection)).await
    }

    async fn remove(&self, entry: &Entry) -> Result<bool, StoreError> {
        let mut connection = self.connection.clone();
        let mut invocation = REMOVE.key(&self.entries_key);
        invocation.key(&self.version_key).arg(entry.to_string());
        let removed: i64 = self.call(invocation.invoke_async(&mut connection)).await?;
        Ok(removed == 1)
    }

    async fn version(&self) -> Result<u64, StoreError> {
        let mut connection = self.connection.clone();
        let version: Option<u64> =
            self.call(redis::cmd("GET").arg(&self.version_key).query_async(&mut connection)).await?;
        Ok(version.unwrap_or(0))
    }

    async fn load(&self) -> Result<Snapshot, StoreError> {
        let mut connection = self.connection.clone();
        let mut invocation = LOAD.key(&self.entries_key);
        invocation.key(&self.version_key);
        let reply: Vec<redis::Value> = self.call(invocation.invoke_async(&mut connection)).await?;
        let corrupt = |what: &str| StoreError::Corrupt(what.to_string());
        let int = |value: &redis::Value| match value {
            redis::Value::Int(n) => Ok(*n),
            _ => Err(corrupt("a non-integer where a number belongs")),
        };
        let (version, pairs) = reply.split_first().ok_or_else(|| corrupt("an empty reply"))?;
        let version = u64::try_from(int(version)?).map_err(|_| corrupt("a negative version"))?;
        let mut entries = Vec::with_capacity(pairs.len() / 2);
        for pair in pairs.chunks(2) {
            let [member, remaining] = pair else { return Err(corrupt("an odd reply")) };
            let member: String = redis::from_redis_value(member.clone()).map_err(|e| corrupt(&e.to_string()))?;
            let entry: Entry = member.parse().map_err(|e: String| corrupt(&e))?;
            let remaining = int(remaining)?;
            entries.push((entry, u64::try_from(remaining).ok().map(Duration::from_millis)));
        }
        Ok(Snapshot { version, entries })
    }
}
