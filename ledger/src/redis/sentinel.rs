//! The ledger behind Redis Sentinel: a `redis+sentinel://host:port,host:port,…/master-name` URL
//! names sentinels and the name they monitor a master under. [`SentinelConnection`] asks the
//! sentinels for the master, keeps one multiplexed connection to it, and asks again when that
//! connection shows it no longer reaches the master, so a node follows a failover without a
//! restart. The URL itself is parsed into [`SentinelSeeds`] by `target.rs`, with the other
//! ledger URLs.
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
use ::redis::sentinel::{SentinelClient, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use super::target::SentinelSeeds;

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
