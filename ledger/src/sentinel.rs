//! The ledger behind Redis Sentinel: a `redis+sentinel://host:port,host:port,…/master-name` URL
//! names sentinels and the name they monitor a master under. [`SentinelConnection`] asks the
//! sentinels for the master, keeps one multiplexed connection to it, and asks again when that
//! connection shows it no longer reaches the master, so a node follows a failover without a
//! restart.
//!
//! **Following the master.** A connection is dropped (and the next call asks the sentinels) when
//! a call fails for reachability (refused, reset, timed out) or answers `READONLY`: after a
//! failover the old master, once back, is turned into a replica by the sentinels, and a write
//! that still reaches it is refused, never stored. redis-rs' lookup (`SentinelClient`) checks
//! that the server a sentinel names calls itself master (`ROLE`) before connecting to it, so a
//! sentinel that has not yet seen the failover cannot hand out a replica either.
//!
//! **What callers see.** From the master's death until the sentinels promote a replica (their
//! `down-after-milliseconds` plus an election), every call fails with
//! [`LedgerError::Unavailable`](crate::LedgerError::Unavailable): the node answers 503 and its
//! breaker may open. Nothing is retried here; the caller's retry with the same idempotency key
//! replays or decides the purchase on the new master.
//!
//! **Credentials.** Those in the URL are the master's (and its replicas'), as in a `redis://`
//! URL; the sentinels are asked without a password.
//!
//! Non-goals: reading from replicas, sentinel passwords, TLS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

/// The scheme of a Redis Sentinel URL. Not a redis-rs scheme: redis-rs takes sentinels as a
/// list of `redis://` URLs plus a master name, which no single URL of its own names.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// Sentinels and the name of the master they watch, parsed from a `redis+sentinel://` URL. Its
/// `Debug` hides the credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSeeds {
    /// `user:password` (or `:password`) for the master and its replicas, as written in the URL.
    credentials: Option<String>,
    /// `host:port` of each sentinel, in the order given.
    pub addrs: Vec<String>,
    /// The name the sentinels know the master by (`sentinel monitor <name> …`).
    pub master_name: String,
}

impl std::fmt::Debug for SentinelSeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSeeds")
            .field("credentials", &self.credentials.as_ref().map(|_| "***"))
            .field("addrs", &self.addrs)
            .field("master_name", &self.master_name)
            .finish()
    }
}

impl SentinelSeeds {
    /// Parses what follows [`SENTINEL_SCHEME`]; `shown` is the whole URL, redacted, for messages.
    pub(crate) fn parse(rest: &str, shown: &str) -> Result<SentinelSeeds, String> {
        let Some((authority, master_name)) = rest.rsplit_once('/') else {
            return Err(format!("{shown:?}: a sentinel URL ends with /master-name (host:port,host:port,…/mymaster)"));
        };
        let valid_name = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if master_name.is_empty() || !master_name.chars().all(valid_name) {
            return Err(format!(
                "{shown:?}: the master name after the last / must be letters, digits, '-', '_' or '.' (a database \
                 number and options are not supported)"
            ));
        }
        // Credentials may hold any character but `@` only percent-encoded, so the last `@`
        // ends them.
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials.to_string()), hosts),
            None => (None, authority),
        };
        if hosts.contains(['/', '?']) {
            return Err(format!("{shown:?}: a sentinel URL lists sentinels as host:port,host:port,… only"));
        }
        let addrs = crate::redis::parse_addrs(hosts, shown, "sentinel")?;
        let seeds = SentinelSeeds { credentials, addrs, master_name: master_name.to_string() };
        for url in seeds.sentinel_urls() {
            url.as_str()
                .into_connection_info()
                .map_err(|e| format!("{shown:?}: sentinel {url:?} is not usable: {e}"))?;
        }
        seeds.master_info().map_err(|e| {
            format!(
                "{shown:?}: the credentials are not usable: {}",
                crate::redis::scrub(&e.to_string(), &seeds.master_url("h:1"))
            )
        })?;
        Ok(seeds)
    }

    /// Whether the URL carries credentials for the master.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// The sentinels as `redis://` URLs, without credentials (see the module docs).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.addrs.iter().map(|addr| format!("redis://{addr}")).collect()
    }

    /// A `redis://` URL for the data node at `addr` (a master or replica the sentinels name),
    /// with the URL's credentials.
    pub fn master_url(&self, addr: &str) -> String {
        match &self.credentials {
            Some(credentials) => format!("redis://{credentials}@{addr}"),
            None => format!("redis://{addr}"),
        }
    }

    /// How to log in to the master: the URL's credentials, parsed as redis-rs parses them in a
    /// `redis://` URL (percent-decoding included).
    pub fn master_info(&self) -> RedisResult<SentinelNodeConnectionInfo> {
        let info = self.master_url("localhost:1").as_str().into_connection_info()?;
        Ok(SentinelNodeConnectionInfo::default().set_redis_connection_info(info.redis_settings().clone()))
    }
}

/// A connection to whichever server the sentinels call master (see the module docs). Cloning
/// shares the connection and the lookup.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// The sentinels and the master's name. A tokio mutex because a lookup awaits the
    /// sentinels; one lookup at a time is enough, and calls that waited for it reuse its answer.
    lookup: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master last found. A std mutex: held only to clone or replace the
    /// handle, never across an await.
    master: Mutex<Option<Master>>,
    /// Numbers each connection made, so a failed call drops only the connection it used, not a
    /// fresh one another call made meanwhile.
    connections_made: AtomicU64,
    /// Timeouts of the connection to the master.
    connection_config: AsyncConnectionConfig,
    /// Upper bound on one lookup: asking the sentinels, checking the master's role, connecting.
    lookup_timeout: Duration,
}

#[derive(Clone)]
struct Master {
    generation: u64,
    con: MultiplexedConnection,
}

impl SentinelConnection {
    /// Connects lazily: nothing is asked until the first call.
    pub fn new(seeds: &SentinelSeeds, connect_timeout: Duration, call_timeout: Duration) -> RedisResult<Self> {
        let client = SentinelClient::build(
            seeds.sentinel_urls(),
            seeds.master_name.clone(),
            Some(seeds.master_info()?),
            SentinelServerType::Master,
        )?;
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(call_timeout));
        Ok(SentinelConnection {
            shared: Arc::new(Shared {
                lookup: tokio::sync::Mutex::new(client),
                master: Mutex::new(None),
                connections_made: AtomicU64::new(0),
                connection_config,
                lookup_timeout: connect_timeout,
            }),
        })
    }

    fn current(&self) -> Option<Master> {
        self.shared.master.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The connection to the master, asking the sentinels for it if there is none.
    async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.current() {
            return Ok(master);
        }
        let mut lookup = self.shared.lookup.lock().await;
        // Another call may have found the master while this one waited for the lookup.
        if let Some(master) = self.current() {
            return Ok(master);
        }
        let found = tokio::time::timeout(
            self.shared.lookup_timeout,
            lookup.get_async_connection_with_config(&self.shared.connection_config),
        )
        .await;
        let con = match found {
            Ok(con) => con?,
            Err(_) => {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "no master found through the sentinels in time",
                    format!("{:?}", self.shared.lookup_timeout),
                )))
            }
        };
        // Relaxed: the number only tells connections apart; the mutex orders the handle itself.
        let generation = self.shared.connections_made.fetch_add(1, Ordering::Relaxed);
        let master = Master { generation, con };
        *self.shared.master.lock().unwrap_or_else(PoisonError::into_inner) = Some(master.clone());
        Ok(master)
    }

    /// Drops the connection `generation` if it is still the current one: the next call asks
    /// the sentinels again.
    fn forget(&self, generation: u64) {
        let mut master = self.shared.master.lock().unwrap_or_else(PoisonError::into_inner);
        if master.as_ref().is_some_and(|m| m.generation == generation) {
            *master = None;
        }
    }

    /// Whether the server the connection reaches should no longer be called master.
    fn lost_master(e: &RedisError) -> bool {
        e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
            || matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown))
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut master = self.master().await?;
            let reply = master.con.req_packed_command(cmd).await;
            if matches!(&reply, Err(e) if Self::lost_master(e)) {
                self.forget(master.generation);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut master = self.master().await?;
            let replies = master.con.req_packed_commands(pipeline, offset, count).await;
            // A pipeline that keeps errors in its replies (the ledger's write + WAIT) shows a
            // demoted master only there.
            let demoted = |replies: &Vec<Value>| {
                replies.iter().any(|reply| {
                    matches!(reply, Value::ServerError(e)
                        if matches!(e.kind(), Some(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)))
                })
            };
            match &replies {
                Err(e) if Self::lost_master(e) => self.forget(master.generation),
                Ok(replies) if demoted(replies) => self.forget(master.generation),
                _ => {}
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_sentinels_and_a_master() {
        let seeds = SentinelSeeds::parse("u:p@a:1,b:2/mymaster", "shown").unwrap();
        assert_eq!(seeds.sentinel_urls(), ["redis://a:1", "redis://b:2"]);
        assert_eq!(seeds.master_name, "mymaster");
        assert_eq!(seeds.master_url("m:3"), "redis://u:p@m:3");
        for bad in ["a:1", "a:1/", "a:1/my master", "a:1/m?x=1", "a:1,b/m", "a:0/m", ":1/m", "a:1/m/0"] {
            assert!(SentinelSeeds::parse(bad, "shown").is_err(), "{bad} must be refused");
        }
    }
}
