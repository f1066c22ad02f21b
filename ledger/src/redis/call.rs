//! One call to Redis: under the call deadline, its failure classified ([`LedgerError`]), and
//! under [`Durability::Replica`] sent behind the SKU's fence and followed by `WAIT` in the same
//! pipeline; then its reply read.

use std::time::Duration;

use ::redis::{Cmd, FromRedisValue, Pipeline, RedisError, ScriptInvocation, ServerErrorKind, Value};

use super::connection::RedisConnection;
use super::failure::classify;
use super::RedisLedger;
use crate::*;

impl RedisLedger {
    /// Runs one Redis call under the configured deadline and maps its failure.
    pub(super) async fn call<T>(
        &self,
        sku: Option<&SkuId>,
        fut: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, LedgerError> {
        match tokio::time::timeout(self.config.call_timeout, fut).await {
            Err(_) => Err(LedgerError::Unavailable(format!("no answer within {:?}", self.config.call_timeout))),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e, sku)),
        }
    }

    /// Runs one write script. Under [`Durability::Replica`] it goes out [`fenced`](Self::fenced),
    /// so the answer waits for the replicas; the deadline covers script and wait together.
    pub(super) async fn write<T: FromRedisValue>(
        &self,
        sku: &SkuId,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LedgerError> {
        let mut con = self.connection();
        let Durability::Replica { replicas, timeout } = self.config.durability else {
            return self.call(Some(sku), invocation.invoke_async(&mut con)).await;
        };
        let mut script = ::redis::pipe();
        script.invoke_script(invocation);
        let (mut replies, mut replicated) = self.fenced(sku, &mut con, &script, replicas, timeout).await?;
        if matches!(replies.first(), Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript)) {
            // First use of the script on this server (or after SCRIPT FLUSH / a restart): load
            // it, then run the pipeline again. Nothing was written by the refused EVALSHA.
            let _sha: String = self.call(Some(sku), invocation.load_async(&mut con)).await?;
            (replies, replicated) = self.fenced(sku, &mut con, &script, replicas, timeout).await?;
        }
        let value = only_reply(replies, sku)?;
        replicated?;
        Ok(value)
    }

    /// Runs one read whose answer somebody acts on (order events a node replays from, entries
    /// the order consumer turns into orders). Under [`Durability::Replica`] it goes out
    /// [`fenced`](Self::fenced): what the master has and the replicas lack may still be undone by
    /// a failover, so it is not handed out until they have it.
    pub(super) async fn read<T: FromRedisValue>(&self, sku: &SkuId, command: &Cmd) -> Result<T, LedgerError> {
        let mut con = self.connection();
        let Durability::Replica { replicas, timeout } = self.config.durability else {
            return self.call(Some(sku), command.query_async(&mut con)).await;
        };
        let mut read = ::redis::pipe();
        read.add_command(command.clone());
        let (replies, replicated) = self.fenced(sku, &mut con, &read, replicas, timeout).await?;
        let value = only_reply(replies, sku)?;
        replicated?;
        Ok(value)
    }

    /// Sends `commands`, then a write to the SKU's fence key, then `WAIT replicas timeout`, in
    /// one pipeline: one buffer on one socket, so Redis runs them back to back for one client,
    /// on the master of the SKU's slot on a cluster (see the module docs). Returns the
    /// commands' replies (errors kept, for the caller to tell apart) and whether enough
    /// replicas acknowledged.
    ///
    /// Why the fence: `WAIT` waits for the replication offset of the client's last command (on
    /// Redis 7.0, any command; where only a client's own writes set it, the last write that
    /// propagated). A script that only replays a stored decision writes nothing, and a read
    /// writes nothing, yet both hand out what another client wrote, which the replicas may lack.
    /// The fence is a write after them, so whichever rule the server follows, `WAIT` covers
    /// everything they saw. It also meets `min-replicas-to-write`: a master left without
    /// replicas refuses it, and so the read.
    async fn fenced(
        &self,
        sku: &SkuId,
        con: &mut RedisConnection,
        commands: &Pipeline,
        replicas: u32,
        timeout: Duration,
    ) -> Result<(Vec<Value>, Result<(), LedgerError>), LedgerError> {
        let mut pipe = commands.clone();
        pipe.ignore_errors().cmd("INCR").arg(self.keys(sku).fence);
        pipe.cmd("WAIT").arg(replicas).arg(timeout.as_millis() as u64);
        let mut replies: Vec<Value> = self.call(Some(sku), pipe.query_async(con)).await?;
        let (Some(acked), Some(fence)) = (replies.pop(), replies.pop()) else {
            return Err(LedgerError::Corrupt("a fenced pipeline returned too few replies".into()));
        };
        let replicated = match (fence, acked) {
            (Value::ServerError(e), _) => Err(LedgerError::Unavailable(format!("the replication fence failed: {e:?}"))),
            (_, Value::ServerError(e)) => Err(LedgerError::Unavailable(format!("WAIT failed: {e:?}"))),
            (Value::Int(_), Value::Int(acked)) => {
                let acked = u64::try_from(acked).unwrap_or(0);
                if acked < u64::from(replicas) {
                    Err(LedgerError::NotReplicated { acked, wanted: u64::from(replicas) })
                } else {
                    Ok(())
                }
            }
            (fence, acked) => Err(LedgerError::Corrupt(format!("the fence answered {fence:?}, WAIT {acked:?}"))),
        };
        Ok((replies, replicated))
    }

    /// How long a read may block on the server: the call deadline less what a fenced read's
    /// `WAIT` may take after it, halved so the answer has time to come back.
    pub(super) fn block_max(&self) -> Duration {
        let wait = match self.config.durability {
            Durability::Replica { timeout, .. } => timeout,
            _ => Duration::ZERO,
        };
        self.config.call_timeout.saturating_sub(wait) / 2
    }
}

/// The one reply of a one-command pipeline, read as `T`; a server error is classified.
pub(super) fn only_reply<T: FromRedisValue>(replies: Vec<Value>, sku: &SkuId) -> Result<T, LedgerError> {
    let [reply] = <[Value; 1]>::try_from(replies)
        .map_err(|replies| LedgerError::Corrupt(format!("one command returned {} replies", replies.len())))?;
    match reply {
        Value::ServerError(e) => Err(classify(&RedisError::from(e), Some(sku))),
        value => T::from_redis_value(value).map_err(|e| LedgerError::Corrupt(format!("unreadable reply: {e}"))),
    }
}

/// A count in a reply or in `meta`, or [`LedgerError::Corrupt`] naming it.
pub(super) fn parse_count(text: Option<&String>, what: &str) -> Result<u64, LedgerError> {
    text.and_then(|t| t.parse().ok()).ok_or_else(|| LedgerError::Corrupt(format!("unreadable {what}")))
}
